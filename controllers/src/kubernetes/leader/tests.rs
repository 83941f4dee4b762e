//! Taking and keeping the Lease, against an API server in the test process.

use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{Value, json};

use super::*;
use crate::kubernetes::mock::{ApiServer, Seen, status};

const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/meridian/leases/meridian";

fn config(identity: &str) -> LeaseConfig {
    LeaseConfig {
        namespace: "meridian".into(),
        name: "meridian".into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(2),
    }
}

fn lease(holder: &str, renewed: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "meridian", "namespace": "meridian", "resourceVersion": "7"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                 "renewTime": renewed, "leaseTransitions": 2},
    })
}

/// The writes the server saw (creates and replaces of the Lease).
fn writes(server: &ApiServer) -> Vec<Seen> {
    server
        .calls()
        .into_iter()
        .filter(|r| r.method == "POST" || r.method == "PUT")
        .collect()
}

/// A server whose Lease is `held` (None: there is none), answering writes as `write` says.
fn lease_server(held: Option<Value>, write: u16) -> (kube::Client, ApiServer) {
    let held = Arc::new(Mutex::new(held));
    ApiServer::start(move |r| match (r.method.as_str(), r.path.as_str()) {
        ("GET", LEASE) => Some(match held.lock().clone() {
            Some(l) => (200, l),
            None => status(
                404,
                "NotFound",
                "leases.coordination.k8s.io \"meridian\" not found",
            ),
        }),
        ("POST", p) if p.ends_with("/leases") => Some((write, r.body.clone())),
        ("PUT", LEASE) if write == 409 => {
            Some(status(409, "Conflict", "the object has been modified"))
        }
        ("PUT", LEASE) => Some((write, r.body.clone())),
        _ => None,
    })
}

#[tokio::test]
async fn a_missing_lease_is_created_and_held() {
    let (client, server) = lease_server(None, 201);
    let api = Api::namespaced(client, "meridian");
    let mut observed = None;
    assert!(
        try_acquire_or_renew(&api, &config("a"), &mut observed, Instant::now())
            .await
            .unwrap()
    );
    let sent = writes(&server);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].body["spec"]["holderIdentity"], "a");
    assert_eq!(sent[0].body["spec"]["leaseDurationSeconds"], 15);
}

#[tokio::test]
async fn a_lease_another_replica_holds_is_taken_only_after_a_whole_duration_unrenewed() {
    let (client, server) = lease_server(Some(lease("b", "2026-01-01T00:00:00.000000Z")), 200);
    let api = Api::namespaced(client, "meridian");
    let mut observed = None;
    let t0 = Instant::now();
    // First sight of b's renewal: ours is the clock that times it.
    assert!(
        !try_acquire_or_renew(&api, &config("a"), &mut observed, t0)
            .await
            .unwrap()
    );
    let almost = t0 + Duration::from_secs(14);
    assert!(
        !try_acquire_or_renew(&api, &config("a"), &mut observed, almost)
            .await
            .unwrap()
    );
    assert!(
        writes(&server).is_empty(),
        "nothing written while b may still renew"
    );
    let expired = t0 + Duration::from_secs(15);
    assert!(
        try_acquire_or_renew(&api, &config("a"), &mut observed, expired)
            .await
            .unwrap()
    );
    let sent = writes(&server);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].body["spec"]["holderIdentity"], "a");
    assert_eq!(sent[0].body["spec"]["leaseTransitions"], 3);
    // The resourceVersion read makes the replace a compare-and-swap.
    assert_eq!(sent[0].body["metadata"]["resourceVersion"], "7");
}

#[tokio::test]
async fn a_replica_renewing_its_own_lease_keeps_it_and_a_concurrent_taker_loses() {
    let (client, _server) = lease_server(Some(lease("a", "2026-01-01T00:00:00.000000Z")), 200);
    let api = Api::namespaced(client, "meridian");
    assert!(
        try_acquire_or_renew(&api, &config("a"), &mut None, Instant::now())
            .await
            .unwrap()
    );
    let (client, _server) = lease_server(Some(lease("", "2026-01-01T00:00:00.000000Z")), 409);
    let api = Api::namespaced(client, "meridian");
    assert!(
        !try_acquire_or_renew(&api, &config("c"), &mut None, Instant::now())
            .await
            .unwrap(),
        "the replica whose replace the API refused (409) does not lead"
    );
}

#[tokio::test]
async fn leadership_follows_the_lease_and_lapses_when_the_api_server_is_gone() {
    let (client, server) = lease_server(None, 201);
    let fast = LeaseConfig {
        renew_deadline: Duration::from_millis(400),
        retry_period: Duration::from_millis(50),
        ..config("a")
    };
    let (leadership, task) = start(client, fast);
    for _ in 0..100 {
        if leadership.is_leader() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(leadership.is_leader());
    assert!(leadership.for_member(&ClusterId::new("m1")).may_write());
    // The API server goes: renewals fail, and the renew deadline ends leadership on this
    // replica's own clock, whatever the writers are doing.
    drop(server);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!leadership.is_leader());
    assert!(!leadership.for_member(&ClusterId::new("m1")).may_write());
    task.abort();
}
