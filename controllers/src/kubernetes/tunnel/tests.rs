use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;

use super::routes::Registration;
use super::*;
use super::{AgentStream, Connection};

const BEAT: Duration = Duration::from_secs(5);

fn connection() -> Connection {
    Connection {
        peer: "127.0.0.1:1".into(),
        certificate_expires: None,
    }
}

/// A registered member with one open stream: its routes, the stream, and the registration
/// (kept, or the route goes).
async fn one_stream(cluster: &ClusterId) -> (AgentRoutes, AgentStream, Registration) {
    let routes = AgentRoutes::default();
    let registration = routes.register(cluster, BEAT);
    let stream = routes.open(cluster, connection()).await.unwrap();
    (routes, stream, registration)
}

fn config_map_json(name: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "shop", "resourceVersion": "7"},
        "data": {"k": "v"},
    }))
    .unwrap()
}

/// What the tunnel said, through kube's error.
fn tunnel_error(e: kube::Error) -> String {
    match e {
        kube::Error::Service(inner) => inner.to_string(),
        other => panic!("not the tunnel's error: {other:?}"),
    }
}

/// The head of a JSON answer.
fn head(call: &ApiCall, status: u16) {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    call.respond
        .send(ResponsePart::Head { status, headers })
        .unwrap();
}

fn answer(call: &ApiCall, status: u16, body: &[u8], chunk: usize) {
    head(call, status);
    for part in body.chunks(chunk) {
        let data = Bytes::copy_from_slice(part);
        call.respond.send(ResponsePart::Data(data)).unwrap();
    }
    call.respond.send(ResponsePart::End(Ok(()))).unwrap();
}

#[tokio::test]
async fn a_request_goes_down_the_newest_stream_and_its_answer_comes_back_in_parts() {
    let edge = ClusterId::new("edge-1");
    let (routes, mut stream, _registration) = one_stream(&edge).await;
    let agent = tokio::spawn(async move {
        let get = stream.calls.recv().await.unwrap();
        assert_eq!(get.method, http::Method::GET);
        assert_eq!(get.path, "/api/v1/namespaces/shop/configmaps/cart");
        answer(&get, 200, &config_map_json("cart"), 7);
        let create = stream.calls.recv().await.unwrap();
        assert_eq!(create.method, http::Method::POST);
        assert!(
            create
                .path
                .starts_with("/api/v1/namespaces/shop/configmaps?"),
            "{}",
            create.path
        );
        let sent: serde_json::Value = serde_json::from_slice(&create.body).unwrap();
        assert_eq!(sent["metadata"]["name"], "new");
        answer(&create, 201, &config_map_json("new"), 4096);
    });
    let api: Api<ConfigMap> = Api::namespaced(Tunnel::new(routes, edge).client(), "shop");
    let got = api.get("cart").await.unwrap();
    assert_eq!(got.data.unwrap()["k"], "v");
    let mut new = ConfigMap::default();
    new.metadata.name = Some("new".into());
    let made = api.create(&PostParams::default(), &new).await.unwrap();
    assert_eq!(made.metadata.resource_version.as_deref(), Some("7"));
    agent.await.unwrap();
}

#[tokio::test]
async fn with_no_stream_a_request_fails_at_once_and_a_member_api_error_passes_through() {
    let edge = ClusterId::new("edge-1");
    let routes = AgentRoutes::default();
    let _registration = routes.register(&edge, BEAT);
    let api: Api<ConfigMap> =
        Api::namespaced(Tunnel::new(routes.clone(), edge.clone()).client(), "shop");
    let err = tunnel_error(api.get("cart").await.unwrap_err());
    assert!(
        err.contains("no agent is connected for member edge-1"),
        "{err}"
    );

    let mut stream = routes.open(&edge, connection()).await.unwrap();
    let agent = tokio::spawn(async move {
        let call = stream.calls.recv().await.unwrap();
        let status = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "configmaps \"cart\" is forbidden: User \"agent\" cannot get",
            "reason": "Forbidden", "code": 403,
        });
        answer(&call, 403, &serde_json::to_vec(&status).unwrap(), 4096);
        stream
    });
    match api.get("cart").await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403),
        other => panic!("expected the member's 403, got {other:?}"),
    }
    agent.await.unwrap();
}

#[tokio::test]
async fn a_stream_that_ends_mid_answer_fails_the_request_it_carried() {
    let edge = ClusterId::new("edge-1");
    let (routes, mut stream, _registration) = one_stream(&edge).await;
    let agent = tokio::spawn(async move {
        let call = stream.calls.recv().await.unwrap();
        head(&call, 200);
        call.respond
            .send(ResponsePart::Data(Bytes::from_static(b"{\"kind\":")))
            .unwrap();
        // The stream goes, and with it the answer's sender.
        drop((call, stream));
    });
    let api: Api<ConfigMap> = Api::namespaced(Tunnel::new(routes, edge).client(), "shop");
    let err = tunnel_error(api.get("cart").await.unwrap_err());
    assert!(err.contains("ended before the answer did"), "{err}");
    agent.await.unwrap();
}

#[tokio::test]
async fn a_fenced_tunnel_sends_nothing_once_this_replica_may_not_write() {
    let edge = ClusterId::new("edge-1");
    let (routes, mut stream, _registration) = one_stream(&edge).await;
    let (until, rx) = watch::channel(None);
    let fenced = Tunnel::new(routes, edge).fenced(Leadership::following(rx));
    let api: Api<ConfigMap> = Api::namespaced(fenced.client(), "shop");
    let err = tunnel_error(api.get("cart").await.unwrap_err());
    assert!(err.contains("may not write member edge-1"), "{err}");
    assert!(stream.calls.try_recv().is_err(), "nothing went down");
    until.send_replace(Some(std::time::Instant::now() + Duration::from_secs(60)));
    let agent = tokio::spawn(async move {
        let call = stream.calls.recv().await.unwrap();
        answer(&call, 200, &config_map_json("cart"), 4096);
    });
    api.get("cart").await.unwrap();
    agent.await.unwrap();
}
