use std::time::{Duration, Instant};

use super::*;

const LEASE: Duration = Duration::from_secs(15);

fn members(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("member-{i:03}")).collect()
}

fn assignment<'a>(members: &'a [String], replicas: &[&'a str]) -> BTreeMap<&'a str, &'a str> {
    members
        .iter()
        .map(|m| (m.as_str(), owner(m, replicas.iter().copied()).unwrap()))
        .collect()
}

#[test]
fn the_score_is_the_same_for_the_same_pair_and_differs_between_pairs() {
    assert_eq!(score("m1", "a"), score("m1", "a"));
    assert_ne!(score("m1", "a"), score("m1", "b"));
    assert_ne!(score("m1", "a"), score("m2", "a"));
    // The separator keeps ("ab", "c") and ("a", "bc") apart.
    assert_ne!(score("ab", "c"), score("a", "bc"));
    // Pinned (computed apart from this code): replicas of different builds must agree on
    // every owner, so the function can never change.
    assert_eq!(score("payments", "meridian-0"), 0xca51_e280_260e_442b);
    assert_eq!(owner("x", []), None);
}

#[test]
fn members_spread_evenly_over_the_replicas() {
    let ms = members(3000);
    let replicas = ["meridian-0", "meridian-1", "meridian-2"];
    let a = assignment(&ms, &replicas);
    for r in replicas {
        let n = a.values().filter(|o| **o == r).count();
        assert!((800..1200).contains(&n), "{r} owns {n} of 3000");
    }
}

#[test]
fn adding_a_replica_moves_about_one_in_n_and_only_to_it() {
    let ms = members(3000);
    let before = assignment(&ms, &["a", "b", "c"]);
    let after = assignment(&ms, &["a", "b", "c", "d"]);
    let moved: Vec<_> = ms
        .iter()
        .filter(|m| before[m.as_str()] != after[m.as_str()])
        .collect();
    assert!(
        moved.iter().all(|m| after[m.as_str()] == "d"),
        "a member moved between old replicas"
    );
    assert!(
        (600..900).contains(&moved.len()),
        "{} of 3000 moved (expected about 750)",
        moved.len()
    );
}

#[test]
fn removing_a_replica_moves_only_its_members() {
    let ms = members(1000);
    let before = assignment(&ms, &["a", "b", "c"]);
    let after = assignment(&ms, &["a", "c"]);
    for m in &ms {
        if before[m.as_str()] != "b" {
            assert_eq!(
                before[m.as_str()],
                after[m.as_str()],
                "{m} moved though its owner stayed"
            );
        }
    }
}

#[test]
fn a_peer_is_live_while_it_renews_and_dead_a_lease_duration_after_its_last_renewal() {
    let t0 = Instant::now();
    let mut peers = Peers::default();
    peers.observe("b", "r1", Report::default(), t0);
    assert_eq!(peers.live("a", t0, LEASE), ["a", "b"]);
    // Renewed: the clock starts again.
    peers.observe("b", "r2", Report::default(), t0 + Duration::from_secs(10));
    assert_eq!(
        peers.live("a", t0 + Duration::from_secs(20), LEASE),
        ["a", "b"]
    );
    // The same renewal seen again does not make it younger.
    peers.observe("b", "r2", Report::default(), t0 + Duration::from_secs(24));
    assert_eq!(peers.live("a", t0 + Duration::from_secs(25), LEASE), ["a"]);
    assert_eq!(
        peers.silent_for("b", t0 + Duration::from_secs(25)),
        Some(Duration::from_secs(15))
    );
    assert_eq!(peers.silent_for("z", t0), None);
    // A Lease that is gone is forgotten at once.
    peers.observe("c", "r1", Report::default(), t0);
    peers.retain(&BTreeSet::from(["b".to_string()]));
    assert_eq!(peers.live("a", t0, LEASE), ["a", "b"]);
}

#[test]
fn a_replica_takes_a_free_member_it_owns_and_waits_for_one_it_does_not() {
    let live = ["a", "b"];
    let m = ms_owned_by("a", &live);
    assert_eq!(step("a", &m, None, &live, false), Step::Take);
    assert_eq!(
        step("b", &m, None, &live, false),
        Step::Wait { holder: None }
    );
}

#[test]
fn a_live_holder_keeps_its_member_until_it_releases_it_the_drain_handshake() {
    // "a" holds m; "c" joins and owns m now.
    let m = ms_owned_by("c", &["a", "b", "c"]);
    assert_eq!(
        owner(&m, ["a", "b"]),
        Some("a"),
        "the fixture needs a member a owned before"
    );
    let live = ["a", "b", "c"];
    // c waits while a's claim stands and a lives.
    assert_eq!(
        step("c", &m, Some("a"), &live, false),
        Step::Wait {
            holder: Some("a".into())
        }
    );
    // a sees c and releases.
    assert_eq!(step("a", &m, Some("a"), &live, true), Step::Release);
    // Cleared: c takes it.
    assert_eq!(step("c", &m, None, &live, false), Step::Take);
    assert_eq!(step("c", &m, Some("c"), &live, true), Step::Keep);
}

#[test]
fn a_claim_of_a_dead_replica_goes_to_the_owner_among_the_living() {
    let m = ms_owned_by("a", &["a", "b", "c"]);
    let live = ["b", "c"]; // a's Lease expired on our clock
    let heir = owner(&m, live).unwrap();
    let other = if heir == "b" { "c" } else { "b" };
    assert_eq!(step(heir, &m, Some("a"), &live, false), Step::Take);
    assert_eq!(
        step(other, &m, Some("a"), &live, false),
        Step::Wait {
            holder: Some("a".into())
        }
    );
}

#[test]
fn after_its_lease_lapsed_a_replica_wins_its_own_claim_again_before_writing() {
    let live = ["a", "b"];
    let m = ms_owned_by("a", &live);
    assert_eq!(step("a", &m, Some("a"), &live, true), Step::Keep);
    assert_eq!(step("a", &m, Some("a"), &live, false), Step::Take);
    // Someone took it meanwhile: a waits.
    assert_eq!(
        step("a", &m, Some("b"), &live, false),
        Step::Wait {
            holder: Some("b".into())
        }
    );
}

fn ms_owned_by(replica: &str, live: &[&str]) -> String {
    members(200)
        .into_iter()
        .find(|m| {
            owner(m, live.iter().copied()) == Some(replica)
                && (live.len() < 3 || owner(m, live[..2].iter().copied()) == Some(live[0]))
        })
        .expect("some member is owned by the replica")
}

fn report(unreachable: &[&str]) -> Report {
    Report {
        unreachable: unreachable.iter().map(|s| s.to_string()).collect(),
    }
}

#[test]
fn a_member_is_confirmed_unreachable_by_a_majority_of_the_live_replicas() {
    let me = report(&["m1"]);
    let pending = Confirmation::Pending;
    let confirm =
        |member, mine, peers: &[Report], fresh| confirm(member, mine, peers, fresh, pending);
    // Alone: today's behaviour.
    assert_eq!(confirm("m1", &me, &[], true), Confirmation::Confirmed);
    // One of three: our route, not the member.
    let others = [report(&[]), report(&[])];
    assert_eq!(
        confirm("m1", &me, &others, true),
        Confirmation::Minority {
            unreachable: 1,
            live: 3
        }
    );
    // Two of three: confirmed.
    let others = [report(&["m1"]), report(&[])];
    assert_eq!(confirm("m1", &me, &others, true), Confirmation::Confirmed);
    // One of two is no majority.
    assert_eq!(
        confirm("m1", &me, &[report(&[])], true),
        Confirmation::Minority {
            unreachable: 1,
            live: 2
        }
    );
    // Cut off from the hub: never on our own view...
    assert_eq!(confirm("m1", &me, &[], false), Confirmation::HubUnreadable);
    // ... but what the majority confirmed stays confirmed.
    assert_eq!(
        super::confirm("m1", &me, [], false, Confirmation::Confirmed),
        Confirmation::Confirmed
    );
    assert!(
        Confirmation::HubUnreadable
            .why_served()
            .unwrap()
            .contains("hub")
    );
    assert_eq!(Confirmation::Confirmed.why_served(), None);
}
