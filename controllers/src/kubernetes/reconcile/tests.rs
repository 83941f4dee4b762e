//! The loop every member writer shares, with members whose clients talk to an API server in
//! the test process.

use std::collections::BTreeSet;

use meridian_core::testing::FleetBuilder;
use tokio::sync::watch;

use super::*;
use crate::kubernetes::leader::Held;
use crate::kubernetes::mock::ApiServer;

/// A writer's memory of a member: what it wrote, and whether it was told to forget.
#[derive(Debug, Default)]
struct Remembered {
    written: BTreeSet<String>,
    forgotten: u32,
}

impl MemberState for Remembered {
    fn stopped_writing(&mut self) {
        self.written.clear();
        self.forgotten += 1;
    }
}

fn id(name: &str) -> ClusterId {
    ClusterId::new(name)
}

/// Facts of members connected to one API server, each on connection `connection`.
fn connected(
    server_client: &kube::Client,
    members: &[(&str, u64)],
) -> BTreeMap<ClusterId, MemberFacts> {
    members
        .iter()
        .map(|(name, connection)| {
            let facts = MemberFacts {
                client: Some(server_client.clone()),
                connection: *connection,
                listed: true,
                ..MemberFacts::default()
            };
            (id(name), facts)
        })
        .collect()
}

fn sync_all(
    slots: &mut Slots<Remembered>,
    facts: &BTreeMap<ClusterId, MemberFacts>,
    l: &Leadership,
) {
    sync(
        slots,
        facts,
        l,
        Duration::from_secs(60),
        |_, _, _| true,
        |_| Remembered::default(),
    );
}

#[tokio::test]
async fn a_new_connection_starts_a_member_afresh() {
    let (client, _server) = ApiServer::start(|_| None);
    let leadership = Leadership::always("test");
    let mut slots = Slots::new();
    sync_all(
        &mut slots,
        &connected(&client, &[("m1", 1), ("m2", 1)]),
        &leadership,
    );
    for slot in slots.values_mut() {
        slot.written.insert("web".into());
        slot.backoff.failed(Instant::now());
    }
    // m1's source reconnected: its slot, applier and memory are new; m2's are kept.
    sync_all(
        &mut slots,
        &connected(&client, &[("m1", 2), ("m2", 1)]),
        &leadership,
    );
    let m1 = &slots[&id("m1")];
    assert_eq!((m1.connection, m1.written.len()), (2, 0));
    assert_eq!(m1.backoff, Backoff::default());
    let m2 = &slots[&id("m2")];
    assert_eq!((m2.connection, m2.written.len()), (1, 1));
    assert_eq!(m2.backoff.failures(), 1);
}

#[tokio::test]
async fn a_member_that_left_or_lost_its_client_loses_its_slot() {
    let (client, _server) = ApiServer::start(|_| None);
    let leadership = Leadership::always("test");
    let mut slots = Slots::new();
    let mut facts = connected(&client, &[("m1", 1), ("m2", 1), ("m3", 1)]);
    sync_all(&mut slots, &facts, &leadership);
    assert_eq!(slots.len(), 3);
    facts.remove(&id("m1"));
    facts.get_mut(&id("m2")).unwrap().client = None;
    sync_all(&mut slots, &facts, &leadership);
    assert_eq!(slots.keys().collect::<Vec<_>>(), [&id("m3")]);
}

#[tokio::test]
async fn only_members_the_writer_wants_get_a_slot_and_each_applier_asks_for_its_member() {
    let (client, _server) = ApiServer::start(|_| None);
    // Sharded: this replica holds m1 only.
    let (_held_tx, held) = watch::channel(Arc::new(Held {
        until: Some(Instant::now() + Duration::from_secs(60)),
        members: [id("m1")].into(),
    }));
    let leadership = Leadership::always("test").sharded(held);
    let mut slots = Slots::new();
    let facts = connected(&client, &[("m1", 1), ("m2", 1)]);
    sync(
        &mut slots,
        &facts,
        &leadership,
        Duration::from_secs(60),
        |_, _, writing| writing,
        |_| Remembered::default(),
    );
    assert_eq!(slots.keys().collect::<Vec<_>>(), [&id("m1")]);
    assert!(slots[&id("m1")].writing);
    assert_eq!(slots[&id("m1")].applier.cluster(), &id("m1"));
    // A writer that keeps every member (to watch it) has m2 too, not written by this replica.
    sync_all(&mut slots, &facts, &leadership);
    assert!(!slots[&id("m2")].writing);
}

#[tokio::test]
async fn a_member_this_replica_stops_writing_forgets_what_it_wrote_and_starts_over() {
    let (client, _server) = ApiServer::start(|_| None);
    let (until_tx, until) = watch::channel(Some(Instant::now() + Duration::from_secs(60)));
    let leadership = Leadership::following(until);
    let mut slots = Slots::new();
    let facts = connected(&client, &[("m1", 1)]);
    sync_all(&mut slots, &facts, &leadership);
    let slot = slots.get_mut(&id("m1")).unwrap();
    assert!(slot.writing);
    slot.written.insert("web".into());
    slot.backoff.failed(Instant::now());
    slot.resync.done(Instant::now());
    // Leadership lapses: the member is forgotten once, not at every round.
    until_tx.send_replace(None);
    sync_all(&mut slots, &facts, &leadership);
    sync_all(&mut slots, &facts, &leadership);
    let slot = &slots[&id("m1")];
    assert!(!slot.writing);
    assert_eq!((slot.written.len(), slot.forgotten), (0, 1));
    assert_eq!(slot.backoff, Backoff::default());
    assert!(slot.resync.due(), "the next term checks for drift first");
    // Leadership back: written again, from nothing.
    until_tx.send_replace(Some(Instant::now() + Duration::from_secs(60)));
    sync_all(&mut slots, &facts, &leadership);
    assert!(slots[&id("m1")].writing);
    assert_eq!(slots[&id("m1")].forgotten, 1);
}

#[test]
fn a_member_whose_rounds_keep_failing_is_tried_again_less_and_less_often() {
    let delays: Vec<u64> = [1, 2, 3, 4, 5, 6, 40, u32::MAX]
        .into_iter()
        .map(|n| retry_delay(n).as_millis() as u64)
        .collect();
    assert_eq!(delays, [500, 1000, 2000, 4000, 8000, 10000, 10000, 10000]);
}

#[test]
fn a_failing_member_waits_out_its_back_off_and_a_success_ends_it() {
    let mut backoff = Backoff::default();
    let t0 = Instant::now();
    assert!(!backoff.waits(t0));
    backoff.failed(t0);
    backoff.failed(t0);
    assert_eq!(backoff.failures(), 2);
    assert!(backoff.waits(t0 + Duration::from_millis(999)));
    assert!(!backoff.waits(t0 + Duration::from_millis(1000)));
    backoff.succeeded();
    assert!(!backoff.waits(t0));
    assert_eq!(backoff.failures(), 0);
}

#[test]
fn a_resync_falls_due_after_its_period_and_at_once_after_a_reset() {
    let mut resync = Resync::every(Duration::from_secs(3600));
    assert!(resync.due(), "a new member is checked first");
    resync.done(Instant::now());
    assert!(!resync.due());
    resync.reset();
    assert!(resync.due());
}

#[tokio::test]
async fn a_round_follows_a_new_snapshot_or_facts_and_the_wake_ends_with_the_snapshots() {
    let snap = |version: u64| {
        let mut s = FleetBuilder::with_members(&["m1"]).snapshot();
        s.version = version;
        Arc::new(s)
    };
    let (tx, rx) = watch::channel(snap(1));
    let fleet = Facts::default();
    let notify = Arc::new(Notify::new());
    let mut wake = Wake::new(rx, &fleet, Duration::from_secs(3600))
        .notified_by(notify.clone())
        .without_debounce();
    // The first tick of the interval is at once.
    let round = wake.next(None).await.unwrap();
    assert_eq!(round.snapshot.version, 1);
    tx.send_replace(snap(2));
    let round = wake.next(None).await.unwrap();
    assert_eq!(round.snapshot.version, 2);
    fleet.update(&id("m1"), |f| f.listed = true);
    let round = wake.next(None).await.unwrap();
    assert!(round.facts[&id("m1")].listed);
    notify.notify_one();
    assert!(wake.next(None).await.is_some());
    let round = wake
        .next(Some(Instant::now() + Duration::from_millis(10)))
        .await;
    assert!(round.is_some(), "a deadline wakes a round");
    drop(tx);
    assert!(wake.next(None).await.is_none());
}
