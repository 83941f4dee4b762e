//! A member's source against an API server in the test process: /readyz, and watch errors
//! told apart by the API's status code.

use k8s_openapi::api::core::v1::{Pod, ResourceQuota, Service};
use serde_json::{Value, json};

use super::*;
use crate::kubernetes::mock::{ApiServer, status};

#[tokio::test]
async fn a_ready_member_answers_ok_and_an_unready_one_names_its_failed_checks() {
    let (client, _server) = ApiServer::start(|r| (r.path == "/readyz").then(|| (200, json!("ok"))));
    assert_eq!(readyz(&client, Duration::from_secs(1)).await, Ok(()));
    let checks = "[+]ping ok\n[-]etcd failed: reason withheld\n[+]log ok\nreadyz check failed";
    let (client, _server) = ApiServer::start(move |r| {
        (r.path == "/readyz").then(|| status(500, "InternalError", checks))
    });
    let (reason, refused) = readyz(&client, Duration::from_secs(1)).await.unwrap_err();
    assert_eq!(reason, "/readyz: 500 [-]etcd failed: reason withheld");
    assert!(!refused);
}

#[tokio::test]
async fn refused_credentials_are_told_apart_from_an_unready_api_server() {
    let (client, _server) = ApiServer::start(|r| {
        (r.path == "/readyz").then(|| status(401, "Unauthorized", "Unauthorized"))
    });
    let (reason, refused) = readyz(&client, Duration::from_secs(1)).await.unwrap_err();
    assert!(refused, "{reason}");
    assert!(
        reason.starts_with("/readyz: credentials refused (401"),
        "{reason}"
    );
}

/// The first error of one kind's watch on a server answering its list with `reply`.
async fn first_error<K>(kind: &'static str, reply: (u16, Value)) -> WatchError
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    let (client, _server) = ApiServer::start(move |r| (r.method == "GET").then(|| reply.clone()));
    let wrap: fn(Event<K>) -> MemberEvent = |_| MemberEvent::Namespace(Event::InitDone);
    let mut stream = watch(
        Api::<K>::all(client),
        watcher::Config::default(),
        wrap,
        kind,
    );
    // The watcher says Init before it lists; the list's refusal comes next.
    while let Some(item) = stream.next().await {
        if let Err(e) = item {
            return e;
        }
    }
    panic!("the watch ended without an error");
}

#[tokio::test]
async fn watch_errors_are_told_apart_by_the_api_status_code() {
    let forbidden = first_error::<Pod>(
        "pods",
        status(
            403,
            "Forbidden",
            "pods is forbidden: User cannot list resource",
        ),
    )
    .await;
    assert_eq!((forbidden.kind, forbidden.code), ("pods", Some(403)));
    assert!(forbidden.is_forbidden() && !forbidden.is_not_served());
    let not_served = first_error::<ResourceQuota>(
        "resourcequotas",
        status(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ),
    )
    .await;
    assert!(not_served.is_not_served() && !not_served.is_forbidden());
    // A message that merely mentions a code is no such refusal (the old substring test took
    // "forbidden" anywhere in it for a 403).
    let unavailable = first_error::<Service>(
        "services",
        status(
            503,
            "ServiceUnavailable",
            "etcd says forbidden 403 410 expired",
        ),
    )
    .await;
    assert_eq!(unavailable.code, Some(503));
    assert!(
        !unavailable.is_forbidden() && !unavailable.is_not_served() && !unavailable.is_expired()
    );
}
