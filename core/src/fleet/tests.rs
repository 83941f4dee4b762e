use std::net::IpAddr;
use std::sync::Arc;

use super::*;
use crate::model::{Export, HealthTimings, Slice};
use crate::policy::ServiceSelector;
use crate::policy::TrafficPolicy;
use crate::problem::{ObjectRef, Origin, Subject};
use crate::registry::Health;
use crate::testing::{ep, secs, svc};

// ---- builders ----

const DEADLINE: Duration = Duration::from_secs(30);

/// A fleet started at `t0` with the default 30 s sync deadline.
fn fleet() -> (Fleet, Instant) {
    let t0 = Instant::now();
    (Fleet::new(t0, DEADLINE), t0)
}

fn id(name: &str) -> ClusterId {
    ClusterId::new(name)
}

/// A member unreachable after 15 s of silence and withdrawn 120 s later.
fn spec(name: &str) -> ClusterSpec {
    ClusterSpec {
        health: HealthTimings {
            heartbeat_seconds: 5,
            unreachable_after_seconds: 15,
            withdraw_after_seconds: 120,
        },
        ..ClusterSpec::named(name)
    }
}

fn members(names: &[&str]) -> Event {
    hub(names, vec![], vec![], vec![])
}

fn hub(
    names: &[&str],
    policies: Vec<Policy>,
    problems: Vec<Problem>,
    warnings: Vec<Problem>,
) -> Event {
    Event::Members {
        specs: names.iter().map(|n| spec(n)).collect(),
        policies,
        problems,
        warnings,
    }
}

fn heartbeat(cluster: &str) -> Event {
    Event::Heartbeat {
        cluster: id(cluster),
        result: Ok(()),
    }
}

fn heartbeat_failed(cluster: &str, reason: &str) -> Event {
    Event::Heartbeat {
        cluster: id(cluster),
        result: Err(reason.into()),
    }
}

/// `shop/<name>` exported with one ready endpoint at `address`.
fn exported(name: &str, address: &str) -> ClusterObjects {
    let key = ObjectKey::new("shop", name);
    let address: IpAddr = address.parse().expect("ip");
    ClusterObjects {
        services: vec![(key.clone(), svc(false, &[("http", 80)]))],
        exports: vec![(
            key.clone(),
            Export {
                created: 0,
                labels: Default::default(),
            },
        )],
        slices: vec![(
            ObjectKey::new("shop", format!("{name}-1")),
            Slice {
                service: Arc::from(name),
                endpoints: vec![ep(address, true)],
            },
        )],
        imports: vec![],
    }
}

fn reset(cluster: &str, objects: ClusterObjects, problems: Vec<Problem>) -> Event {
    Event::Reset {
        cluster: id(cluster),
        objects,
        problems,
        warnings: vec![],
    }
}

fn file_problem(origin: Origin, file: &str, reason: &str) -> Problem {
    Problem::in_file(origin, file, Subject::Input("document 1".into()), reason)
}

/// A policy governing `shop/web`.
fn policy(name: &str) -> Policy {
    Policy {
        key: ObjectKey::new("shop", name),
        created: 0,
        selectors: vec![ServiceSelector {
            name: Some("web".into()),
            selector: None,
        }],
        templates: Vec::new(),
        traffic: Arc::new(TrafficPolicy {
            source: Some(format!("shop/{name}")),
            ..TrafficPolicy::default()
        }),
        placement: None,
    }
}

/// Builds a snapshot after `prev` at `now`.
fn build(fleet: &mut Fleet, prev: &Snapshot, now: Instant) -> Built {
    fleet.build_snapshot(prev, now)
}

// ---- sync gating ----

#[test]
fn nothing_is_synced_before_the_hub_is_read_even_past_the_deadline() {
    let (mut fleet, t0) = fleet();
    assert!(!fleet.synced(t0));
    assert!(!fleet.synced(t0 + secs(3600)), "the member list is unknown");
    let outcome = fleet.apply(members(&[]), t0 + secs(40));
    assert!(outcome.changed, "the first hub read publishes");
    assert!(fleet.synced(t0 + secs(40)));
}

#[test]
fn synced_waits_until_every_member_has_synced_or_failed_once() {
    let (mut fleet, t0) = fleet();
    fleet.apply(members(&["eu-1", "us-1"]), t0);
    assert!(!fleet.synced(t0));
    assert!(fleet.apply(heartbeat("eu-1"), t0 + secs(1)).changed);
    assert!(!fleet.synced(t0 + secs(1)), "us-1 has not been heard from");
    let snapshot = build(&mut fleet, &Snapshot::empty(), t0 + secs(1)).snapshot;
    assert!(!snapshot.synced, "DNS answers SERVFAIL");
    let outcome = fleet.apply(heartbeat_failed("us-1", "connection refused"), t0 + secs(2));
    assert!(outcome.changed, "the last member settling publishes");
    assert!(
        fleet.synced(t0 + secs(2)),
        "a failure settles as well as a success"
    );
    assert!(build(&mut fleet, &snapshot, t0 + secs(2)).snapshot.synced);
}

#[test]
fn the_sync_deadline_ends_the_wait_for_a_silent_member_once() {
    let (mut fleet, t0) = fleet();
    fleet.apply(members(&["eu-1", "silent"]), t0);
    fleet.apply(heartbeat("eu-1"), t0);
    assert_eq!(fleet.next_deadline(), Some(t0 + secs(15)), "silent's grace");
    // silent goes Unreachable at 15 s; that transition is a change of its own.
    let outcome = fleet.tick(t0 + secs(15));
    assert_eq!(outcome.transitions[0].to, Health::Unreachable);
    assert!(!fleet.synced(t0 + secs(15)), "Unreachable is not settled");
    assert_eq!(fleet.next_deadline(), Some(t0 + DEADLINE));
    assert!(!fleet.tick(t0 + secs(29)).changed);
    let outcome = fleet.tick(t0 + DEADLINE);
    assert!(outcome.changed, "the deadline publishes a synced snapshot");
    assert!(fleet.synced(t0 + DEADLINE));
    assert!(
        build(&mut fleet, &Snapshot::empty(), t0 + DEADLINE)
            .snapshot
            .synced
    );
    assert!(
        !fleet.tick(t0 + DEADLINE + secs(1)).changed,
        "passing the deadline publishes once, not on every tick"
    );
    assert_ne!(
        fleet.next_deadline(),
        Some(t0 + DEADLINE),
        "nothing waits on a deadline that has passed"
    );
}

#[test]
fn the_sync_deadline_is_configurable() {
    let t0 = Instant::now();
    let mut fleet = Fleet::new(t0, secs(5));
    fleet.apply(members(&["silent"]), t0);
    assert!(!fleet.synced(t0 + secs(4)));
    assert!(fleet.tick(t0 + secs(5)).changed);
    assert!(fleet.synced(t0 + secs(5)));
}

// ---- members ----

#[test]
fn a_removed_member_takes_its_objects_and_problems_with_it() {
    let (mut fleet, t0) = fleet();
    fleet.apply(members(&["eu-1", "us-1"]), t0);
    let bad = file_problem(
        Origin::Member(id("eu-1")),
        "/c/eu-1/x.yaml",
        "malformed YAML",
    );
    fleet.apply(reset("eu-1", exported("web", "10.0.0.1"), vec![bad]), t0);
    fleet.apply(reset("us-1", exported("db", "10.0.1.1"), vec![]), t0);
    let before = build(&mut fleet, &Snapshot::empty(), t0).snapshot;
    assert!(before.service("shop", "web").is_some());
    assert_eq!(before.problems.len(), 1);

    let outcome = fleet.apply(members(&["us-1"]), t0 + secs(1));
    assert!(outcome.changed);
    assert_eq!(outcome.removed, [id("eu-1")]);
    let after = build(&mut fleet, &before, t0 + secs(1));
    assert!(after.full, "services refer to clusters by position");
    let after = after.snapshot;
    assert!(after.service("shop", "web").is_none());
    assert!(after.service("shop", "db").is_some());
    assert!(after.cluster_index("eu-1").is_none());
    assert!(after.problems.is_empty(), "{:?}", after.problems);
    assert!(!fleet.index().has_cluster(&id("eu-1")));
}

#[test]
fn an_event_for_a_member_the_hub_does_not_list_is_ignored() {
    let (mut fleet, t0) = fleet();
    fleet.apply(members(&["eu-1"]), t0);
    let ghost_problem = file_problem(Origin::Member(id("ghost")), "/x.yaml", "bad");
    let outcome = fleet.apply(
        reset("ghost", exported("web", "10.0.0.1"), vec![ghost_problem]),
        t0,
    );
    assert_eq!(outcome, Outcome::default());
    let outcome = fleet.apply(
        Event::Changes {
            cluster: id("ghost"),
            changes: vec![],
            problems: vec![],
        },
        t0,
    );
    assert_eq!(outcome, Outcome::default());
    assert_eq!(fleet.apply(heartbeat("ghost"), t0), Outcome::default());
    let snapshot = build(&mut fleet, &Snapshot::empty(), t0).snapshot;
    assert!(!snapshot.has_services());
    assert!(snapshot.problems.is_empty());
    assert!(!fleet.index().has_cluster(&id("ghost")));
}

#[test]
fn heartbeats_drive_health_transitions() {
    let (mut fleet, t0) = fleet();
    fleet.apply(members(&["eu-1"]), t0);
    let outcome = fleet.apply(heartbeat("eu-1"), t0);
    let t = &outcome.transitions[0];
    assert_eq!((t.from, t.to), (Health::Degraded, Health::Healthy));
    assert!(
        fleet
            .apply(heartbeat("eu-1"), t0 + secs(5))
            .transitions
            .is_empty()
    );

    let outcome = fleet.apply(heartbeat_failed("eu-1", "directory missing"), t0 + secs(6));
    assert_eq!(outcome.transitions[0].to, Health::Degraded);
    assert_eq!(
        outcome.transitions[0].reason.as_deref(),
        Some("directory missing"),
        "the log line says why"
    );
    assert_eq!(fleet.next_deadline(), Some(t0 + secs(20)));
    let outcome = fleet.tick(t0 + secs(20));
    assert_eq!(outcome.transitions[0].to, Health::Unreachable);
    assert!(outcome.changed);
    let outcome = fleet.tick(t0 + secs(140));
    assert!(outcome.transitions[0].withdrawn && !outcome.transitions[0].was_withdrawn);
    let outcome = fleet.apply(heartbeat("eu-1"), t0 + secs(141));
    let t = &outcome.transitions[0];
    assert_eq!(
        (t.to, t.withdrawn, t.was_withdrawn),
        (Health::Healthy, false, true)
    );
}

#[test]
fn a_failing_watch_is_a_transition() {
    let (mut fleet, t0) = fleet();
    fleet.apply(members(&["eu-1"]), t0);
    fleet.apply(heartbeat("eu-1"), t0);
    let failing = Event::WatchHealth {
        cluster: id("eu-1"),
        failure: Some("watch stalled".into()),
    };
    let outcome = fleet.apply(failing, t0);
    assert!(outcome.changed);
    assert_eq!(outcome.transitions[0].to, Health::Degraded);
    let recovered = Event::WatchHealth {
        cluster: id("eu-1"),
        failure: None,
    };
    assert_eq!(
        fleet.apply(recovered, t0).transitions[0].to,
        Health::Healthy
    );
}

// ---- policies ----

#[test]
fn a_policy_change_merges_every_service_once() {
    let (mut fleet, t0) = fleet();
    fleet.apply(members(&["eu-1"]), t0);
    fleet.apply(heartbeat("eu-1"), t0);
    fleet.apply(reset("eu-1", exported("web", "10.0.0.1"), vec![]), t0);
    let first = build(&mut fleet, &Snapshot::empty(), t0).snapshot;

    let outcome = fleet.apply(hub(&["eu-1"], vec![policy("p")], vec![], vec![]), t0);
    assert_eq!(outcome.policies_changed, Some(1));
    assert!(outcome.changed);
    let built = build(&mut fleet, &first, t0);
    assert!(built.full, "every service may be governed differently now");
    assert_eq!(
        built
            .snapshot
            .service("shop", "web")
            .unwrap()
            .policy
            .source
            .as_deref(),
        Some("shop/p")
    );

    let again = fleet.apply(hub(&["eu-1"], vec![policy("p")], vec![], vec![]), t0);
    assert_eq!(
        again.policies_changed, None,
        "the same policies are no change"
    );
    assert!(!again.changed);
    fleet.apply(reset("eu-1", exported("web", "10.0.0.2"), vec![]), t0);
    let next = build(&mut fleet, &built.snapshot, t0);
    assert!(!next.full, "the full merge happened once");
    assert_eq!(next.services_changed, 1);
    assert!(next.snapshot.version > built.snapshot.version);
}

// ---- problems ----

#[test]
fn hub_and_member_problems_and_warnings_appear_and_clear() {
    let (mut fleet, t0) = fleet();
    let hub_problem = file_problem(Origin::Hub, "/hub/extra.yaml", "unknown field(s)");
    let hub_warning = file_problem(Origin::Hub, "/hub/cm.yaml", "not a kind meridian reads");
    let outcome = fleet.apply(
        hub(
            &["eu-1"],
            vec![],
            vec![hub_problem.clone()],
            vec![hub_warning.clone()],
        ),
        t0,
    );
    assert!(outcome.changed);
    let member_problem = Problem::in_api(
        Origin::Member(id("eu-1")),
        ObjectRef::namespaced("Service", &ObjectKey::new("shop", "web")),
        "port 70000 is out of range",
    );
    let member_warning = file_problem(
        Origin::Member(id("eu-1")),
        "/c/eu-1/a.yaml",
        "unknown field(s) ignored",
    );
    let outcome = fleet.apply(
        Event::Reset {
            cluster: id("eu-1"),
            objects: ClusterObjects::default(),
            problems: vec![member_problem.clone()],
            warnings: vec![member_warning.clone()],
        },
        t0,
    );
    assert!(outcome.changed, "the first list of a member");
    let snapshot = build(&mut fleet, &Snapshot::empty(), t0).snapshot;
    assert_eq!(snapshot.problems, [hub_problem, member_problem.clone()]);
    assert_eq!(snapshot.warnings, [hub_warning, member_warning]);

    let same = Event::Changes {
        cluster: id("eu-1"),
        changes: vec![],
        problems: vec![member_problem],
    };
    assert!(
        !fleet.apply(same, t0).changed,
        "the same problems are no change"
    );
    let fixed = Event::Changes {
        cluster: id("eu-1"),
        changes: vec![],
        problems: vec![],
    };
    assert!(
        fleet.apply(fixed, t0).changed,
        "a problem fixed alone publishes"
    );
    assert!(fleet.apply(members(&["eu-1"]), t0).changed);
    let snapshot = build(&mut fleet, &snapshot, t0).snapshot;
    assert!(snapshot.problems.is_empty(), "{:?}", snapshot.problems);
    assert_eq!(snapshot.warnings.len(), 1, "the member's warning stays");
}

#[test]
fn merge_problems_come_first_and_are_rebuilt_with_their_service() {
    let (mut fleet, t0) = fleet();
    fleet.apply(members(&["eu-1"]), t0);
    let mut objects = exported("ext", "10.0.0.1");
    objects.services[0].1.external_name = true;
    let hub_problem = file_problem(Origin::Hub, "/hub/x.yaml", "bad");
    fleet.apply(hub(&["eu-1"], vec![], vec![hub_problem], vec![]), t0);
    fleet.apply(reset("eu-1", objects, vec![]), t0);
    let snapshot = build(&mut fleet, &Snapshot::empty(), t0).snapshot;
    assert_eq!(snapshot.problems.len(), 2);
    assert_eq!(snapshot.problems[0].source, crate::problem::Source::Merge);
    assert!(
        snapshot.problems[0]
            .subject
            .is("ServiceExport", &ObjectKey::new("shop", "ext"))
    );
    assert!(snapshot.problems[0].origin.is_member(&id("eu-1")));
    fleet.apply(reset("eu-1", exported("ext", "10.0.0.1"), vec![]), t0);
    let snapshot = build(&mut fleet, &snapshot, t0).snapshot;
    assert_eq!(snapshot.problems.len(), 1, "{:?}", snapshot.problems);
}

// ---- traffic follows placement ----

/// `shop/p` governs `shop/web` and places every Deployment of `shop` in its first tier
/// (eu-2), the next one (eu-1) only when eu-2 cannot take it.
fn placing_web() -> Policy {
    use crate::placement::{PlacementPolicy, TemplateSelector};
    use crate::policy::Mode;
    use crate::testing::tier;
    Policy {
        templates: vec![TemplateSelector {
            kind: Some("Deployment".into()),
            ..TemplateSelector::default()
        }],
        traffic: Arc::new(TrafficPolicy {
            source: Some("shop/p".into()),
            mode: Mode::Locality,
            affinities: vec![tier("first", &["eu-2"]), tier("then", &["eu-1"])],
            ..TrafficPolicy::default()
        }),
        placement: Some(Arc::new(PlacementPolicy::default())),
        ..policy("p")
    }
}

#[test]
fn a_cluster_the_policy_does_not_place_the_workload_in_takes_traffic_last() {
    use crate::select::{TierReason, select};
    use crate::testing::deployment;
    let (mut fleet, t0) = fleet();
    fleet.apply(
        hub(&["eu-1", "eu-2"], vec![placing_web()], vec![], vec![]),
        t0,
    );
    for (cluster, address) in [("eu-1", "10.0.0.1"), ("eu-2", "10.0.0.2")] {
        fleet.apply(heartbeat(cluster), t0);
        fleet.apply(reset(cluster, exported("web", address), vec![]), t0);
    }
    fleet.apply(
        Event::Templates {
            templates: vec![deployment("web", Some(3))],
            overrides: Vec::new(),
        },
        t0,
    );
    let mut snapshot = build(&mut fleet, &Snapshot::empty(), t0).snapshot;
    fleet.place(&Snapshot::empty(), &mut snapshot, t0);
    let eu1 = snapshot.cluster_index("eu-1").unwrap();
    let eu2 = snapshot.cluster_index("eu-2").unwrap();
    assert_eq!(
        snapshot.workloads_of(&placing_web().traffic),
        Some(&[eu2][..])
    );
    let web = snapshot.service("shop", "web").unwrap().clone();
    // A client in eu-1, the workload placed in eu-2 only: eu-2 first although eu-1 is the
    // client's own cluster; eu-1's copy (draining) only after it.
    let selection = select(&snapshot, &web, Some(eu1), t0);
    let tiers: Vec<(Vec<TierReason>, Vec<usize>)> = selection
        .tiers
        .iter()
        .map(|t| {
            (
                t.reasons.clone(),
                t.members.iter().map(|m| m.cluster).collect(),
            )
        })
        .collect();
    assert_eq!(tiers.len(), 2, "{tiers:?}");
    assert_eq!(tiers[0].1, vec![eu2]);
    assert_eq!(tiers[1], (vec![TierReason::NotPlaced], vec![eu1]));
}

#[test]
fn a_template_two_policies_select_is_placed_by_the_older_and_the_younger_is_a_conflict() {
    use crate::testing::deployment;
    let (mut fleet, t0) = fleet();
    let younger = Policy {
        key: ObjectKey::new("shop", "q"),
        created: 10,
        ..placing_web()
    };
    fleet.apply(
        hub(
            &["eu-1", "eu-2"],
            vec![younger, placing_web()],
            vec![],
            vec![],
        ),
        t0,
    );
    fleet.apply(
        Event::Templates {
            templates: vec![deployment("web", Some(3))],
            overrides: Vec::new(),
        },
        t0,
    );
    let mut snapshot = build(&mut fleet, &Snapshot::empty(), t0).snapshot;
    fleet.place(&Snapshot::empty(), &mut snapshot, t0);
    let decision = snapshot.placements.decisions.values().next().unwrap();
    assert_eq!(decision.policy, Some(ObjectKey::new("shop", "p")));
    let conflicts: Vec<&Problem> = snapshot
        .problems
        .iter()
        .filter(|p| p.reason.starts_with("Conflict"))
        .collect();
    assert_eq!(conflicts.len(), 1, "{:?}", snapshot.problems);
    assert!(
        conflicts[0]
            .subject
            .is("ClusterSchedulingPolicy", &ObjectKey::new("shop", "q"))
    );
    assert!(
        conflicts[0].reason.contains("older policy shop/p"),
        "{}",
        conflicts[0].reason
    );
}

// ---- geo ranges ----

#[test]
fn geo_ranges_publish_once_and_every_snapshot_shares_the_table() {
    let (mut fleet, t0) = fleet();
    fleet.apply(members(&["eu-1"]), t0);
    fleet.apply(reset("eu-1", exported("web", "10.0.0.1"), vec![]), t0);
    let first = build(&mut fleet, &Snapshot::empty(), t0).snapshot;
    assert!(first.geo.is_empty());

    let table = crate::testing::geo_table(&[("203.0.113.0/24", "eu", "")]);
    let problem = file_problem(Origin::Geo, "/etc/geo.csv", "line 3: no region");
    let geo = |problems: Vec<Problem>| Event::Geo {
        table: table.clone(),
        problems,
    };
    assert!(fleet.apply(geo(vec![problem.clone()]), t0).changed);
    let second = build(&mut fleet, &first, t0).snapshot;
    assert!(Arc::ptr_eq(&second.geo, &table));
    assert!(second.problems.contains(&problem));
    // Services are not merged again for geo: they are shared with the previous snapshot.
    assert!(Arc::ptr_eq(
        first.service("shop", "web").unwrap(),
        second.service("shop", "web").unwrap()
    ));

    // The same ranges and problems again (a file touched, not changed): nothing to publish.
    let same = Arc::new((*table).clone());
    let again = Event::Geo {
        table: same,
        problems: vec![problem],
    };
    assert!(!fleet.apply(again, t0).changed);
    // An unrelated change keeps sharing the one table.
    fleet.apply(reset("eu-1", exported("web", "10.0.0.2"), vec![]), t0);
    let third = build(&mut fleet, &second, t0).snapshot;
    assert_eq!(*third.geo, *table);
    assert!(Arc::ptr_eq(&third.geo, &fleet.geo));

    // The problems going away is a change.
    assert!(fleet.apply(geo(vec![]), t0).changed);
    let fourth = build(&mut fleet, &third, t0).snapshot;
    assert!(fourth.problems.iter().all(|p| p.origin != Origin::Geo));
}

#[test]
fn tenants_ride_on_every_snapshot_without_merging_services_again() {
    let (mut fleet, t0) = fleet();
    fleet.apply(members(&["eu-1"]), t0);
    fleet.apply(reset("eu-1", exported("web", "10.0.0.1"), vec![]), t0);
    let first = build(&mut fleet, &Snapshot::empty(), t0).snapshot;
    assert!(!first.tenants.listed, "not read from the hub yet");

    let tenant = crate::tenant::Tenant {
        name: "shop".into(),
        users: ["ana".to_string()].into(),
        groups: Default::default(),
        namespaces: crate::tenant::TenantNamespaces::Named(["shop".to_string()].into()),
        clusters: crate::policy::ClusterSet {
            names: vec!["eu-1".into()],
            selector: None,
        },
        labels: Default::default(),
    };
    let tenants = Tenants::listed(vec![tenant]);
    assert!(fleet.apply(Event::Tenants(tenants.clone()), t0).changed);
    let second = build(&mut fleet, &first, t0).snapshot;
    assert_eq!(*second.tenants, tenants);
    assert!(Arc::ptr_eq(
        first.service("shop", "web").unwrap(),
        second.service("shop", "web").unwrap()
    ));
    // The same tenants read again: nothing to publish.
    assert!(!fleet.apply(Event::Tenants(tenants), t0).changed);
}

#[test]
fn routes_resolve_when_they_or_a_service_they_name_change_and_not_otherwise() {
    let (mut fleet, t0) = fleet();
    fleet.apply(members(&["eu-1"]), t0);
    fleet.apply(reset("eu-1", exported("web", "10.0.0.1"), vec![]), t0);
    let first = build(&mut fleet, &Snapshot::empty(), t0).snapshot;
    let to_api = crate::testing::service_route("web-to-api", "web", &[("api", 80, 1)]);
    let routes = || Event::Routes {
        routes: vec![to_api.clone()],
        grants: vec![],
    };
    assert!(fleet.apply(routes(), t0).changed);
    let second = build(&mut fleet, &first, t0).snapshot;
    let web = ObjectKey::new("shop", "web");
    assert!(second.routes.for_port(&web, 80).unwrap()[0].fails());
    assert!(
        second
            .problems
            .iter()
            .any(|p| p.reason.contains("BackendNotFound")),
        "{:?}",
        second.problems
    );
    // The same routes again: nothing to publish.
    assert!(!fleet.apply(routes(), t0).changed);

    // The backend appears in a member: the table resolves it.
    let mut objects = exported("web", "10.0.0.1");
    let api = exported("api", "10.0.0.2");
    objects.services.extend(api.services);
    objects.exports.extend(api.exports);
    objects.slices.extend(api.slices);
    fleet.apply(reset("eu-1", objects, vec![]), t0);
    let third = build(&mut fleet, &second, t0).snapshot;
    let attached = &third.routes.for_port(&web, 80).unwrap()[0];
    assert_eq!(attached.backends[0].service, ObjectKey::new("shop", "api"));
    assert!(
        third
            .problems
            .iter()
            .all(|p| !p.reason.contains("BackendNotFound"))
    );

    // An endpoint change of a service no route names keeps the very same table.
    fleet.apply(members(&["eu-1", "eu-2"]), t0);
    fleet.apply(reset("eu-2", exported("other", "10.0.1.1"), vec![]), t0);
    let fourth = build(&mut fleet, &third, t0).snapshot;
    assert!(Arc::ptr_eq(&third.routes, &fourth.routes));
}
