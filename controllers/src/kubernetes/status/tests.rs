//! The MemberCluster status writer, against an API server in the test process.

use meridian_core::testing::FleetBuilder;
use tokio::sync::watch as channel;

use super::*;
use crate::kubernetes::mock::{ApiServer, Seen, status};

const M1_STATUS: &str = "/apis/meridian.io/v1alpha1/memberclusters/m1/status";

async fn wait_for(server: &ApiServer, n: usize) -> Vec<Seen> {
    for _ in 0..150 {
        let seen = server.patches();
        if seen.len() >= n {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.patches()
}

fn fleet_of_m1() -> Arc<Snapshot> {
    Arc::new(FleetBuilder::with_members(&["m1"]).snapshot())
}

#[tokio::test]
async fn a_members_status_is_merge_patched_and_not_again_while_it_holds() {
    let (client, server) = ApiServer::start(|_| None);
    let (_tx, snapshots) = channel::channel(fleet_of_m1());
    let task = tokio::spawn(run(
        client,
        snapshots,
        Facts::default(),
        Leadership::always("test"),
        "meridian-system".into(),
    ));
    let sent = wait_for(&server, 1).await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].path, M1_STATUS);
    assert_eq!(
        sent[0].content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(sent[0].body["status"]["health"], "Healthy");
    // The writer wakes every second; the status holds, and a refresh is ten seconds away.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(server.patches().len(), 1);
    task.abort();
}

#[tokio::test]
async fn a_replica_that_does_not_hold_a_member_writes_no_status_and_a_missing_one_is_no_error() {
    let (client, server) = ApiServer::start(|_| None);
    let (_tx, snapshots) = channel::channel(fleet_of_m1());
    let (_until_tx, until) = channel::channel(None);
    let task = tokio::spawn(run(
        client,
        snapshots,
        Facts::default(),
        Leadership::following(until),
        "meridian-system".into(),
    ));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(server.patches().is_empty());
    task.abort();

    // A MemberCluster deleted meanwhile (404) is tried again at the next change, not logged
    // as a failure: the writer keeps going.
    let (client, server) =
        ApiServer::start(|r| (r.method == "PATCH").then(|| status(404, "NotFound", "gone")));
    let (tx, snapshots) = channel::channel(fleet_of_m1());
    let task = tokio::spawn(run(
        client,
        snapshots,
        Facts::default(),
        Leadership::always("test"),
        "meridian-system".into(),
    ));
    wait_for(&server, 1).await;
    tx.send_replace(fleet_of_m1());
    let sent = wait_for(&server, 2).await;
    assert!(sent.len() >= 2, "written again after a 404: {sent:?}");
    task.abort();
}
