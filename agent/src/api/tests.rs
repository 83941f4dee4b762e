use http_body_util::BodyExt;
use meridian_controllers::agents::{MAX_QUEUED_BYTES, Respond, TunnelBody};
use meridian_core::ClusterId;

use super::*;

#[test]
fn the_agent_carries_api_requests_and_nothing_that_opens_a_connection_into_the_member() {
    let carried = [
        (
            "GET",
            "/api/v1/namespaces/shop/services?labelSelector=a%3Db",
        ),
        ("GET", "/apis/apps/v1/namespaces/shop/deployments/web"),
        (
            "PATCH",
            "/apis/apps/v1/namespaces/shop/deployments/web/status",
        ),
        ("DELETE", "/api/v1/namespaces/proxy"),
        ("GET", "/api/v1/namespaces/shop/pods/exec"),
        (
            "POST",
            "/apis/multicluster.x-k8s.io/v1alpha1/namespaces/shop/serviceimports",
        ),
        ("GET", "/apis"),
        ("GET", "/apis/apps"),
        ("GET", "/version"),
        ("GET", "/api/v1/nodes"),
    ];
    for (method, path) in carried {
        assert_eq!(refusal(method, path), None, "{method} {path}");
    }
    let refused = [
        (
            "POST",
            "/api/v1/namespaces/shop/pods/web/exec?command=sh",
            "exec",
        ),
        ("GET", "/api/v1/namespaces/shop/pods/web/attach", "attach"),
        (
            "POST",
            "/api/v1/namespaces/shop/pods/web/portforward",
            "portforward",
        ),
        ("GET", "/api/v1/nodes/n1/proxy/metrics", "proxy"),
        (
            "GET",
            "/api/v1/namespaces/shop/services/web:80/proxy/",
            "proxy",
        ),
        ("GET", "/metrics", "only API paths"),
        ("GET", "/api/v1/namespaces/../secrets", "no path like"),
        ("GET", "/api/v1/namespaces/%2e%2e/secrets", "no path like"),
        ("GET", "/api//v1", "no path like"),
        ("CONNECT", "/api/v1", "no CONNECT"),
    ];
    for (method, path, why) in refused {
        let refusal = refusal(method, path).unwrap_or_default();
        assert!(refusal.contains(why), "{method} {path}: {refusal:?}");
    }
}

fn api_call(body: &str) -> (ApiCall, TunnelBody) {
    let (respond, answer) = Respond::channel(&ClusterId::new("edge-1"));
    let mut headers = HeaderMap::new();
    headers.insert("authorization", "Bearer hub-secret".parse().unwrap());
    headers.insert("content-type", "application/json".parse().unwrap());
    headers.insert("impersonate-user", "alice".parse().unwrap());
    let call = ApiCall {
        method: http::Method::POST,
        path: "/api/v1/namespaces/shop/configmaps?fieldManager=meridian".into(),
        headers,
        body: Bytes::from(body.to_string()),
        respond,
    };
    (call, answer)
}

fn data(id: u64, bytes: &[u8], end: bool) -> ApiResponse {
    ApiResponse {
        id,
        data: bytes.to_vec(),
        end,
        ..ApiResponse::default()
    }
}

#[test]
fn a_request_goes_down_without_the_hubs_credentials_and_its_head_without_connection_headers() {
    let mut pending = Pending::default();
    let (call, _answer) = api_call("{}");
    let request = pending.start(call);
    assert_eq!((request.id, request.method.as_str()), (1, "POST"));
    assert_eq!(
        request.path,
        "/api/v1/namespaces/shop/configmaps?fieldManager=meridian"
    );
    assert_eq!(request.body, b"{}");
    let names: Vec<&str> = request.headers.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, ["content-type", "impersonate-user"]);
    assert_eq!(pending.start(api_call("").0).id, 2);

    let head = ApiResponse {
        id: 1,
        status: 201,
        headers: vec![
            Header {
                name: "content-type".into(),
                value: b"application/json".to_vec(),
            },
            Header {
                name: "connection".into(),
                value: b"close".to_vec(),
            },
        ],
        ..ApiResponse::default()
    };
    match parts(head).as_slice() {
        [ResponsePart::Head { status, headers }] => {
            assert_eq!(*status, 201);
            assert_eq!(headers.len(), 1);
            assert_eq!(headers["content-type"], "application/json");
        }
        other => panic!("{other:?}"),
    }
    let broke = ApiResponse {
        error: "reset".into(),
        ..data(1, b"{", true)
    };
    assert_eq!(
        parts(broke),
        [
            ResponsePart::Data(Bytes::from_static(b"{")),
            ResponsePart::End(Err("reset".into()))
        ]
    );
}

#[tokio::test]
async fn an_answer_reaches_its_caller_in_parts_and_ends_its_request() {
    let mut pending = Pending::default();
    let (call, answer) = api_call("{}");
    let id = pending.start(call).id;
    assert_eq!(pending.answer(data(id, b"hello ", false)), None);
    assert_eq!(pending.answer(data(id, b"world", true)), None);
    assert!(pending.is_empty(), "an ended request is forgotten");
    assert_eq!(pending.answer(data(id, b"late", true)), None);
    let body = answer.collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"hello world");
}

#[tokio::test]
async fn a_caller_that_went_or_fell_too_far_behind_has_its_request_cancelled_on_the_agent() {
    let mut pending = Pending::default();
    let (call, answer) = api_call("");
    let gone = pending.start(call).id;
    drop(answer);
    let cancel = pending
        .answer(data(gone, b"event", false))
        .expect("a cancel");
    assert_eq!((cancel.id, cancel.cancel), (gone, true));
    assert!(pending.is_empty());

    let (call, answer) = api_call("");
    let slow = pending.start(call).id;
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..(MAX_QUEUED_BYTES >> 20) {
        assert_eq!(pending.answer(data(slow, &chunk, false)), None);
    }
    let cancel = pending.answer(data(slow, &chunk, false)).expect("a cancel");
    assert_eq!((cancel.id, cancel.cancel), (slow, true));
    let err = answer.collect().await.unwrap_err().to_string();
    assert!(err.contains("fell more than"), "{err}");
}
