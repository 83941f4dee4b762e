//! The Kubernetes hub source against an API server in the test process: what it lists
//! becomes the hub model, and the store hears of it.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::*;
use crate::kubernetes::mock::{ApiServer, Seen, status};

const MEMBERS: &str = "/apis/meridian.io/v1alpha1/memberclusters";
const POLICIES: &str = "/apis/meridian.io/v1alpha1/clusterschedulingpolicies";

fn list(kind: &str, items: Vec<Value>) -> (u16, Value) {
    (
        200,
        json!({"apiVersion": "meridian.io/v1alpha1", "kind": format!("{kind}List"),
               "metadata": {"resourceVersion": "10"}, "items": items}),
    )
}

fn member(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "meridian.io/v1alpha1", "kind": "MemberCluster",
           "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "3"},
           "spec": spec})
}

/// Lists what the hub holds; every watch is told its resourceVersion expired (410), so the
/// source relists after its back-off, as against an API server that compacted.
fn hub(r: &Seen) -> Option<(u16, Value)> {
    if r.method != "GET" {
        return None;
    }
    if r.param("watch").is_some() {
        return Some(status(410, "Expired", "too old resource version"));
    }
    Some(match r.path.as_str() {
        MEMBERS => list(
            "MemberCluster",
            vec![
                member(
                    "eu-1",
                    json!({"source": {"directory": {"path": "/nonexistent/eu-1"}}}),
                ),
                // Two sources: the API took it (the CRD cannot say "exactly one"), meridian
                // does not.
                member(
                    "broken",
                    json!({"source": {"directory": {"path": "/a"}, "agent": {}}}),
                ),
            ],
        ),
        POLICIES => list(
            "ClusterSchedulingPolicy",
            vec![json!({
                "apiVersion": "meridian.io/v1alpha1", "kind": "ClusterSchedulingPolicy",
                "metadata": {"name": "web", "namespace": "shop", "uid": "uid-web",
                             "resourceVersion": "4"},
                "spec": {"resourceSelectors": [{"kind": "Service", "name": "web"}]},
            })],
        ),
        "/api" => (200, json!({"kind": "APIVersions", "versions": ["v1"]})),
        "/apis" => (
            200,
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}),
        ),
        // OverridePolicies and Tenants are not served by this hub's CRDs.
        _ => status(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ),
    })
}

#[tokio::test]
async fn what_the_hub_lists_becomes_the_member_list_and_the_policies_with_problems_named() {
    let (client, server) = ApiServer::start(hub);
    let (tx, mut rx) = mpsc::channel(64);
    let task = tokio::spawn(run(client, Sources::new(tx)));
    let members = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match rx.recv().await {
                Some(SourceEvent::Members {
                    specs,
                    policies,
                    problems,
                    ..
                }) => break (specs, policies, problems),
                Some(_) => continue,
                None => panic!("the hub source stopped"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        let seen: Vec<String> = server
            .calls()
            .iter()
            .map(|r| format!("{} {} {:?}", r.method, r.path, r.query))
            .collect();
        panic!("no member list within 10 s; the hub was asked: {seen:#?}")
    });
    let (specs, policies, problems) = members;
    let names: Vec<&str> = specs.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(names, ["eu-1"]);
    assert_eq!(policies.len(), 1);
    assert_eq!(
        policies[0].key,
        meridian_core::ObjectKey::new("shop", "web")
    );
    assert_eq!(problems.len(), 1, "{problems:?}");
    let problem = problems[0].to_string();
    assert!(
        problem.contains("broken") && problem.contains("exactly one of"),
        "{problem}"
    );
    task.abort();
}

#[test]
fn a_route_kind_the_hub_cannot_list_is_taken_as_none_and_said_once() {
    let mut routes = RouteLists::default();
    let not_found = || {
        watcher::Error::WatchError(Box::new(kube::core::Status::failure(
            "the server could not find the requested resource",
            "NotFound",
        )))
    };
    assert!(!routes.listed());
    assert_eq!(
        routes.unavailable(Watched::HttpRoutes, &not_found()),
        Some(true)
    );
    // Again: still the hub's lack of the kind, not a failing hub, and said only once.
    assert_eq!(
        routes.unavailable(Watched::HttpRoutes, &not_found()),
        Some(false)
    );
    assert_eq!(routes.unavailable(Watched::Tenants, &not_found()), None);
    routes.unavailable(Watched::GrpcRoutes, &not_found());
    assert!(
        !routes.listed(),
        "ReferenceGrants neither listed nor unavailable yet"
    );
    routes.unavailable(Watched::Grants, &not_found());
    assert!(routes.listed());
}
