//! What-if: the syntax of assumptions, hand-made scenarios with known answers, and the
//! property that an assumption gives exactly the decisions of a fleet where it came true.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::fleet::{Event, Fleet};
use crate::model::{ClusterObjects, ClusterSpec, Export, HealthTimings, Slice};
use crate::placement::{Decision, Division, PlacementPolicy, ReplicaScheduling, Template};
use crate::policy::{Mode, ServiceSelector, Toleration, TrafficPolicy};
use crate::testing::{cluster, deployment, ep, pods_free, secs, svc, tier};

// ---- syntax ----

#[test]
fn assumptions_parse_in_every_form_and_print_back() {
    let cases = [
        (
            "eu-1=Unreachable",
            Assumption::Health(id("eu-1"), Health::Unreachable),
        ),
        (
            "eu-1=healthy",
            Assumption::Health(id("eu-1"), Health::Healthy),
        ),
        (
            "eu-1=Degraded",
            Assumption::Health(id("eu-1"), Health::Degraded),
        ),
        (
            "eu-1:taint=maint:NoExecute",
            Assumption::Taint(id("eu-1"), taint("maint", None, TaintEffect::NoExecute)),
        ),
        (
            "eu-1:taint=maint=friday:PreferNoSchedule",
            Assumption::Taint(
                id("eu-1"),
                taint("maint", Some("friday"), TaintEffect::PreferNoSchedule),
            ),
        ),
        (
            "eu-1:untaint=maint",
            Assumption::Untaint(id("eu-1"), "maint".into()),
        ),
    ];
    for (text, want) in cases {
        let got: Assumption = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(got, want, "{text}");
        let again: Assumption = got.to_string().parse().expect("prints as it parses");
        assert_eq!(again, want, "{text} round trip");
    }
}

#[test]
fn malformed_assumptions_say_what_is_expected() {
    for text in [
        "eu-1",
        "eu-1=Down",
        "=Unreachable",
        "eu-1:taint=maint",
        "eu-1:paint=x:NoExecute",
        ":untaint=x",
        "eu-1:untaint=",
    ] {
        let err = text.parse::<Assumption>().expect_err(text);
        assert!(matches!(err, WhatIfError::Syntax(_)), "{text}: {err}");
        assert!(
            err.to_string().contains("CLUSTER=Unreachable"),
            "{text}: {err}"
        );
    }
    let err = "eu-1:taint=maint:Sometimes"
        .parse::<Assumption>()
        .expect_err("effect");
    assert_eq!(err, WhatIfError::Effect("Sometimes".into()));
}

#[test]
fn an_unknown_cluster_is_refused_naming_the_members() {
    let base = Demo::quickstart().publish();
    let scenario = scenario(&["mars-1=Unreachable"]);
    let err = simulate(&base, &Decider::default(), &scenario, t(0)).expect_err("unknown cluster");
    assert_eq!(
        err.to_string(),
        "no member cluster \"mars-1\" (members: eu-1, eu-2, us-1)"
    );
}

// ---- a fleet with known answers ----

/// A fleet driven as the store drives it: events applied, snapshots built and placed, the
/// clock ticked at every deadline.
struct Driven {
    fleet: Fleet,
    prev: Snapshot,
    /// What decided `prev`.
    decider: Decider,
}

impl Driven {
    fn new(t0: Instant) -> Self {
        Self {
            fleet: Fleet::new(t0, Duration::from_secs(30)),
            prev: Snapshot::empty(),
            decider: Decider::default(),
        }
    }

    /// Builds and places the next snapshot at `now`, as the store does.
    fn publish_at(&mut self, now: Instant) {
        let published = self.fleet.publish(&self.prev, now);
        self.prev = published.snapshot;
        self.decider = published.decider;
    }

    fn apply(&mut self, event: Event, now: Instant) {
        self.fleet.apply(event, now);
        self.publish_at(now);
    }

    /// Runs the clock to `at`, publishing at every deadline on the way and at `at`.
    fn run_until(&mut self, at: Instant) {
        while let Some(next) = self.fleet.next_deadline().filter(|&d| d < at) {
            self.fleet.tick(next);
            self.publish_at(next);
        }
        self.fleet.tick(at);
        self.publish_at(at);
    }

    fn members(&mut self, specs: Vec<ClusterSpec>, policies: Vec<Policy>, now: Instant) {
        self.apply(hub_read(specs, policies), now);
    }

    /// `cluster` reports `objects`, a good heartbeat and room for `free_pods` (not published).
    fn join(&mut self, cluster: &ClusterId, objects: ClusterObjects, free_pods: u64, now: Instant) {
        for event in [
            Event::Reset {
                cluster: cluster.clone(),
                objects,
                problems: vec![],
                warnings: vec![],
            },
            Event::Heartbeat {
                cluster: cluster.clone(),
                result: Ok(()),
            },
            Event::Capacity {
                cluster: cluster.clone(),
                capacity: Some(pods_free(free_pods)),
            },
        ] {
            self.fleet.apply(event, now);
        }
    }

    fn publish(self) -> Snapshot {
        self.prev
    }
}

/// eu-1 and eu-2 in region eu, us-1 in us, each exporting shop/payments with two ready
/// endpoints and a client CIDR; shop/orders only in us-1. Members are withdrawn 60 s after
/// they turn Unreachable, which they do as soon as a heartbeat fails.
struct Demo;

/// A hub read with these members and policies, and no problems.
fn hub_read(specs: Vec<ClusterSpec>, policies: Vec<Policy>) -> Event {
    Event::Members {
        specs,
        policies,
        problems: vec![],
        warnings: vec![],
    }
}

fn t(s: u64) -> Instant {
    epoch() + secs(s)
}

fn epoch() -> Instant {
    use std::sync::OnceLock;
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn id(name: &str) -> ClusterId {
    ClusterId::new(name)
}

fn taint(key: &str, value: Option<&str>, effect: TaintEffect) -> Taint {
    Taint {
        key: key.into(),
        value: value.map(Into::into),
        effect,
    }
}

fn scenario(assumptions: &[&str]) -> Scenario {
    Scenario {
        assumptions: assumptions
            .iter()
            .map(|a| a.parse().expect("assumption"))
            .collect(),
        after: None,
    }
}

fn timings(withdraw_after_seconds: u64) -> HealthTimings {
    HealthTimings {
        heartbeat_seconds: 5,
        unreachable_after_seconds: 0,
        withdraw_after_seconds,
    }
}

fn exported(service: &str, first: u8, ready: u8) -> ClusterObjects {
    let key = ObjectKey::new("shop", service);
    ClusterObjects {
        services: vec![(key.clone(), svc(false, &[("http", 80)]))],
        exports: vec![(key, Export::default())],
        slices: vec![(
            ObjectKey::new("shop", format!("{service}-{first}")),
            Slice {
                service: Arc::from(service),
                endpoints: (0..ready)
                    .map(|i| ep(IpAddr::V4(Ipv4Addr::new(10, first, 0, i)), true))
                    .collect(),
            },
        )],
        imports: vec![],
    }
}

fn merged(mut a: ClusterObjects, b: ClusterObjects) -> ClusterObjects {
    a.services.extend(b.services);
    a.exports.extend(b.exports);
    a.slices.extend(b.slices);
    a
}

impl Demo {
    fn quickstart() -> Driven {
        let specs = ["eu-1", "eu-2", "us-1"]
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let (region, _) = name.split_once('-').expect("region-n");
                let mut spec = cluster(name, region, name);
                spec.health = timings(60);
                spec.dns_client_cidrs =
                    vec![format!("127.0.{}.0/24", i + 1).parse().expect("cidr")];
                spec
            })
            .collect();
        Self::with(specs, Vec::new(), Vec::new())
    }

    fn with(specs: Vec<ClusterSpec>, policies: Vec<Policy>, templates: Vec<Template>) -> Driven {
        let t0 = t(0);
        let mut demo = Driven::new(t0);
        let names: Vec<ClusterId> = specs.iter().map(|s| s.id.clone()).collect();
        demo.fleet.apply(hub_read(specs, policies), t0);
        for (i, name) in names.iter().enumerate() {
            let n = u8::try_from(i).expect("few clusters");
            let mut objects = exported("payments", 10 * n + 1, 2);
            if name.as_str() == "us-1" {
                objects = merged(objects, exported("orders", 10 * n + 2, 1));
            }
            demo.join(name, objects, 10, t0);
        }
        demo.fleet.apply(
            Event::Templates {
                templates,
                overrides: vec![],
            },
            t0,
        );
        demo.publish_at(t0);
        demo
    }
}

fn change<'s>(
    sim: &'s Simulation,
    service: &str,
    client: Option<&str>,
) -> Option<&'s ClientChange> {
    sim.services
        .iter()
        .find(|s| s.service == service)?
        .clients
        .iter()
        .find(|c| {
            c.clients
                .iter()
                .any(|c| c.as_ref().map(ClusterId::as_str) == client)
        })
}

/// The clusters DNS answers from (none when the service is not served).
fn first_tier(route: Option<&Route>) -> Vec<&str> {
    route
        .map(|r| r.first_tier().into_iter().map(ClusterId::as_str).collect())
        .unwrap_or_default()
}

#[test]
fn an_outage_moves_its_clients_to_the_next_cluster_of_their_region() {
    let base = Demo::quickstart().publish();
    let Simulated {
        simulation: sim,
        imagined,
        ..
    } = simulate(
        &base,
        &Decider::default(),
        &scenario(&["eu-1=Unreachable"]),
        t(0),
    )
    .expect("simulate");
    assert_eq!(
        sim.after_seconds, 121,
        "withdraw after 60 s, doubled, plus a second"
    );
    assert!(imagined.clusters[0].withdrawn);

    let eu1 = change(&sim, "shop/payments", Some("eu-1")).expect("eu-1's clients change");
    assert_eq!(first_tier(Some(&eu1.before)), ["eu-1"]);
    assert_eq!(first_tier(eu1.after.as_ref()), ["eu-2"]);
    // The client of no cluster answered from every cluster loses eu-1 from its one tier.
    let nobody = change(&sim, "shop/payments", None).expect("unknown clients change");
    assert_eq!(first_tier(Some(&nobody.before)), ["eu-1", "eu-2", "us-1"]);
    assert_eq!(first_tier(nobody.after.as_ref()), ["eu-2", "us-1"]);
    // eu-2's and us-1's clients keep their first tier; their later priorities lose eu-1.
    for client in ["eu-2", "us-1"] {
        let c = change(&sim, "shop/payments", Some(client)).expect("lower tiers change");
        assert_eq!(first_tier(Some(&c.before)), [client]);
        assert_eq!(first_tier(c.after.as_ref()), [client]);
        let clusters = |r: &Route| r.tiers.iter().flatten().count();
        assert_eq!(
            (
                clusters(&c.before),
                clusters(c.after.as_ref().expect("served"))
            ),
            (3, 2),
            "{client}"
        );
    }
    assert!(
        sim.services.iter().all(|s| s.service != "shop/orders"),
        "orders does not span eu-1"
    );
    assert_eq!(sim.totals.services_changed, 1);
    assert_eq!(sim.totals.first_tier_changed, 1);
    assert_eq!(sim.totals.clients_changed, 4);
    // Of the eu clients' payments traffic, eu-1 had half (its own clients) and eu-2 takes it.
    let share = |cluster: &str| {
        sim.totals
            .shares
            .iter()
            .find(|s| s.region == "eu" && s.cluster.as_str() == cluster)
            .map(|s| (s.before_percent, s.after_percent))
    };
    assert_eq!(share("eu-1"), Some((50.0, 0.0)));
    assert_eq!(share("eu-2"), Some((50.0, 100.0)));
    assert_eq!(share("us-1"), None, "us-1's eu share does not move");
}

#[test]
fn before_the_withdraw_time_an_unreachable_member_still_serves() {
    let base = Demo::quickstart().publish();
    let mut early = scenario(&["eu-1=Unreachable"]);
    early.after = Some(secs(30));
    let Simulated {
        simulation: sim,
        imagined,
        ..
    } = simulate(&base, &Decider::default(), &early, t(0)).expect("simulate");
    assert_eq!(sim.after_seconds, 30);
    assert!(!imagined.clusters[0].withdrawn);
    assert!(
        sim.services.is_empty(),
        "nothing moves yet: {:?}",
        sim.services
    );
}

#[test]
fn removing_a_member_renumbers_the_fleet_and_drops_what_only_it_served() {
    let base = Demo::quickstart().publish();
    let Simulated {
        simulation: sim,
        imagined,
        ..
    } = simulate(
        &base,
        &Decider::default(),
        &scenario(&[]).with(Assumption::Remove(id("us-1"))),
        t(0),
    )
    .expect("simulate");
    assert_eq!(imagined.clusters.len(), 2);
    assert!(imagined.service("shop", "orders").is_none());
    let orders = sim
        .services
        .iter()
        .find(|s| s.service == "shop/orders")
        .expect("orders");
    assert!(orders.clients.iter().all(|c| c.after.is_none()));
    assert!(
        sim.notes
            .iter()
            .any(|n| n.contains("clients in us-1 are not compared"))
    );
    // The imagined fleet answers by the new numbering: eu-2's clients are still eu-2's.
    let eu2 = imagined.client_cluster("127.0.2.9".parse().expect("ip"));
    assert_eq!(
        eu2.map(|c| imagined.clusters[c].spec.id.as_str()),
        Some("eu-2")
    );
    assert_eq!(
        imagined.client_cluster("127.0.3.9".parse().expect("ip")),
        None
    );
}

#[test]
fn a_policy_edit_changes_the_services_it_would_govern() {
    let base = Demo::quickstart().publish();
    let weighted = Policy {
        key: ObjectKey::new("shop", "spread"),
        created: 0,
        selectors: vec![ServiceSelector {
            name: Some("payments".into()),
            selector: None,
        }],
        templates: vec![],
        traffic: Arc::new(TrafficPolicy {
            source: Some("shop/spread".into()),
            mode: Mode::Weighted,
            ..TrafficPolicy::default()
        }),
        placement: None,
    };
    let Simulated {
        simulation: sim, ..
    } = simulate(
        &base,
        &Decider::default(),
        &scenario(&[]).with(Assumption::Policy(weighted)),
        t(0),
    )
    .expect("simulate");
    let eu1 = change(&sim, "shop/payments", Some("eu-1")).expect("changes");
    assert_eq!(first_tier(eu1.after.as_ref()), ["eu-1", "eu-2", "us-1"]);
    assert!(
        sim.services.iter().all(|s| s.service != "shop/orders"),
        "not selected"
    );
}

#[test]
fn a_workload_fails_over_and_its_replicas_are_counted() {
    let placing = Policy {
        key: ObjectKey::new("shop", "eu-first"),
        created: 0,
        selectors: vec![],
        templates: vec![crate::placement::TemplateSelector {
            kind: Some("Deployment".into()),
            ..Default::default()
        }],
        traffic: Arc::new(TrafficPolicy {
            source: Some("shop/eu-first".into()),
            affinities: vec![tier("eu", &["eu-1", "eu-2"]), tier("us", &["us-1"])],
            ..TrafficPolicy::default()
        }),
        placement: Some(Arc::new(PlacementPolicy {
            replicas: ReplicaScheduling::Divided(Division::AvailableCapacity),
            failover_after_seconds: Some(30),
            failback_after_seconds: 60,
            ..PlacementPolicy::default()
        })),
    };
    let demo = Demo::with(
        Demo::quickstart()
            .publish()
            .clusters
            .iter()
            .map(|c| c.spec.clone())
            .collect(),
        vec![placing],
        vec![deployment("web", Some(6))],
    );
    let base = demo.publish();
    let before = &base
        .placements
        .decisions
        .values()
        .next()
        .expect("decided")
        .placed;
    assert_eq!(replicas(before), [("eu-1", 3), ("eu-2", 3)]);
    let Simulated {
        simulation: sim,
        imagined,
        ..
    } = simulate(
        &base,
        &Decider::default(),
        &scenario(&["eu-2=Unreachable"]),
        t(0),
    )
    .expect("simulate");
    let web = &sim.workloads[0];
    assert_eq!(web.evicted, [(id("eu-2"), 3)]);
    assert_eq!(web.started, [(id("eu-1"), 3)]);
    assert_eq!(sim.totals.replicas_moved, 3);
    let after = &imagined
        .placements
        .decisions
        .values()
        .next()
        .expect("decided")
        .placed;
    assert_eq!(replicas(after), [("eu-1", 6)]);
}

fn replicas(placed: &[crate::placement::Placed]) -> Vec<(&str, u32)> {
    placed
        .iter()
        .map(|p| (p.cluster.as_str(), p.replicas.unwrap_or(0)))
        .collect()
}

#[test]
fn windows_already_open_close_in_the_baseline_too() {
    // us-1 recovered at 0 with a failback window of 100 s on orders' policy: at the settle
    // instant both fleets have it back, so an eu-1 outage lists no orders change.
    let mut demo = Demo::quickstart();
    demo.apply(
        Event::Heartbeat {
            cluster: id("eu-1"),
            result: Err("down".into()),
        },
        t(0),
    );
    demo.apply(
        Event::Heartbeat {
            cluster: id("eu-1"),
            result: Ok(()),
        },
        t(1),
    );
    let base = demo.publish();
    let Simulated {
        simulation: sim, ..
    } = simulate(
        &base,
        &Decider::default(),
        &scenario(&["us-1:taint=x:PreferNoSchedule"]),
        t(1),
    )
    .expect("simulate");
    assert!(
        sim.services.iter().all(|s| s
            .clients
            .iter()
            .flat_map(|c| &c.clients)
            .all(|c| c.as_ref().map(ClusterId::as_str) != Some("eu-1"))),
        "eu-1's own recovery is not a change of the scenario: {:?}",
        sim.services
    );
}

trait With {
    fn with(self, a: Assumption) -> Self;
}

impl With for Scenario {
    fn with(mut self, a: Assumption) -> Self {
        self.assumptions.push(a);
        self
    }
}

// ---- the property: assumed equals real ----

#[derive(Clone, Debug)]
struct Shape {
    /// Per cluster: region, network (0: unnamed), a gateway, withdraw time (× 30 s), a taint
    /// (0 none, 1 PreferNoSchedule, 2 NoExecute, 3 NoSchedule), unreachable in the base,
    /// free pods.
    clusters: Vec<(u8, u8, bool, u8, u8, bool, u8)>,
    /// Per service, the clusters exporting it (bitmask) and ready endpoints (0..3).
    services: Vec<(u8, u8)>,
    /// The policy governing `s0` (and placing Deployments): mode, failback, withdraw, tolerate
    /// the taint, failover.
    mode: u8,
    failback: u8,
    withdraw: Option<u8>,
    tolerate: bool,
    capacity: bool,
    replicas: Vec<u32>,
    /// (kind, cluster) of each assumption, applied in order.
    assumptions: Vec<(u8, u8)>,
    after: Option<u16>,
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        prop::collection::vec(
            (
                0u8..3,
                0u8..2,
                any::<bool>(),
                0u8..3,
                0u8..4,
                prop::bool::weighted(0.2),
                0u8..8,
            ),
            2..6,
        ),
        prop::collection::vec((1u8..=63, 0u8..3), 1..4),
        (
            0u8..3,
            0u8..3,
            prop::option::of(0u8..3),
            any::<bool>(),
            any::<bool>(),
        ),
        prop::collection::vec(0u32..9, 0..3),
        prop::collection::vec((0u8..9, 0u8..6), 1..4),
        prop::option::weighted(0.5, 0u16..400),
    )
        .prop_map(
            |(
                clusters,
                services,
                (mode, failback, withdraw, tolerate, capacity),
                replicas,
                assumptions,
                after,
            )| Shape {
                clusters,
                services,
                mode,
                failback,
                withdraw,
                tolerate,
                capacity,
                replicas,
                assumptions,
                after,
            },
        )
}

fn name(i: usize) -> String {
    format!("c{i}")
}

fn specs_of(shape: &Shape) -> Vec<ClusterSpec> {
    shape
        .clusters
        .iter()
        .enumerate()
        .map(
            |(i, &(region, network, gateway, withdraw, taint_kind, _, _))| {
                let mut spec = cluster(
                    &name(i),
                    &format!("r{region}"),
                    &format!("z{region}{}", i % 2),
                );
                spec.health = timings(u64::from(withdraw) * 30);
                spec.network = (network > 0).then(|| format!("n{network}"));
                spec.gateway = gateway.then(|| crate::model::Gateway {
                    address: IpAddr::V4(Ipv4Addr::new(192, 0, 2, u8::try_from(i).expect("few"))),
                    port: 15443,
                });
                spec.dns_client_cidrs = vec![format!("127.0.{i}.0/24").parse().expect("cidr")];
                let effect = match taint_kind {
                    1 => Some(TaintEffect::PreferNoSchedule),
                    2 => Some(TaintEffect::NoExecute),
                    3 => Some(TaintEffect::NoSchedule),
                    _ => None,
                };
                spec.taints.extend(effect.map(|e| taint("t", None, e)));
                spec
            },
        )
        .collect()
}

fn policy_of(shape: &Shape, mode_override: Option<u8>) -> Policy {
    let names: Vec<String> = (0..shape.clusters.len()).map(name).collect();
    let half = names.len() / 2;
    let first: Vec<&str> = names[..half.max(1)].iter().map(String::as_str).collect();
    let rest: Vec<&str> = names.iter().map(String::as_str).collect();
    let mode = match mode_override.unwrap_or(shape.mode) {
        0 => Mode::Locality,
        1 => Mode::Tiers,
        _ => Mode::Weighted,
    };
    Policy {
        key: ObjectKey::new("shop", "p"),
        created: 0,
        selectors: vec![ServiceSelector {
            name: Some("s0".into()),
            selector: None,
        }],
        templates: vec![crate::placement::TemplateSelector {
            kind: Some("Deployment".into()),
            ..Default::default()
        }],
        traffic: Arc::new(TrafficPolicy {
            source: Some("shop/p".into()),
            mode,
            affinities: vec![tier("first", &first), tier("all", &rest)],
            failback_after_seconds: u64::from(shape.failback) * 40,
            withdraw_after_seconds: shape.withdraw.map(|w| u64::from(w) * 45),
            tolerations: if shape.tolerate {
                vec![Toleration {
                    seconds: Some(50),
                    ..Toleration::exists("t", None)
                }]
            } else {
                vec![]
            },
            ..TrafficPolicy::default()
        }),
        placement: Some(Arc::new(PlacementPolicy {
            replicas: if shape.capacity {
                ReplicaScheduling::Divided(Division::AvailableCapacity)
            } else {
                ReplicaScheduling::Duplicated
            },
            failover_after_seconds: Some(30),
            failback_after_seconds: 20,
            ..PlacementPolicy::default()
        })),
    }
}

/// The fleet of `shape` at 10 s: members joined at 0 with a heartbeat, those unreachable in
/// the base failed at 5 s.
fn world(shape: &Shape, t0: Instant) -> Driven {
    let mut w = Driven::new(t0);
    w.members(specs_of(shape), vec![policy_of(shape, None)], t0);
    for (i, c) in shape.clusters.iter().enumerate() {
        let cluster = id(&name(i));
        let mut objects = ClusterObjects::default();
        for (s, &(mask, ready)) in shape.services.iter().enumerate() {
            if mask & (1 << i) != 0 {
                let n = u8::try_from(i * 8 + s).expect("few");
                objects = merged(objects, exported(&format!("s{s}"), n, ready));
            }
        }
        w.join(&cluster, objects, u64::from(c.6), t0);
    }
    let templates = shape
        .replicas
        .iter()
        .enumerate()
        .map(|(i, r)| deployment(&format!("w{i}"), Some(*r)))
        .collect();
    w.fleet.apply(
        Event::Templates {
            templates,
            overrides: vec![],
        },
        t0,
    );
    w.publish_at(t0);
    for (i, c) in shape.clusters.iter().enumerate() {
        if c.5 {
            w.fleet.apply(
                Event::Heartbeat {
                    cluster: id(&name(i)),
                    result: Err("down".into()),
                },
                t0 + secs(5),
            );
        }
    }
    w.run_until(t0 + secs(10));
    w
}

/// The assumptions of `shape`: at most one health per member (two in one scenario would be
/// a flap, which the fleet sees and a scenario, a state, does not).
fn assumptions(shape: &Shape) -> Vec<Assumption> {
    let mut healths = BTreeSet::new();
    shape
        .assumptions
        .iter()
        .filter(|&&(kind, target)| {
            kind > 3 || healths.insert(usize::from(target) % shape.clusters.len())
        })
        .map(|&(kind, target)| {
            let cluster = id(&name(usize::from(target) % shape.clusters.len()));
            match kind {
                0 | 1 => Assumption::Health(cluster, Health::Unreachable),
                2 => Assumption::Health(cluster, Health::Healthy),
                3 => Assumption::Health(cluster, Health::Degraded),
                4 => Assumption::Taint(cluster, taint("t", None, TaintEffect::NoExecute)),
                5 => Assumption::Taint(
                    cluster,
                    taint("m", Some("v"), TaintEffect::PreferNoSchedule),
                ),
                6 => Assumption::Untaint(cluster, "t".into()),
                7 => Assumption::Remove(cluster),
                _ => Assumption::Policy(policy_of(shape, Some((shape.mode + 1) % 3))),
            }
        })
        .collect()
}

/// Makes `assumed` true in the fleet at `now`: the hub's members and policies as edited,
/// then the heartbeats and watch failures, then one snapshot (as the store publishes a batch).
fn make_true(w: &mut Driven, shape: &Shape, assumed: &[Assumption], now: Instant) {
    let mut specs = specs_of(shape);
    let mut policies = vec![policy_of(shape, None)];
    let mut health = Vec::new();
    for a in assumed {
        match a {
            Assumption::Health(c, h) => health.push((c.clone(), *h)),
            Assumption::Taint(c, taint) => {
                if let Some(spec) = specs.iter_mut().find(|s| &s.id == c) {
                    spec.taints
                        .retain(|t| t.key != taint.key || t.effect != taint.effect);
                    spec.taints.push(taint.clone());
                }
            }
            Assumption::Untaint(c, key) => {
                if let Some(spec) = specs.iter_mut().find(|s| &s.id == c) {
                    spec.taints.retain(|t| &t.key != key);
                }
            }
            Assumption::Remove(c) => specs.retain(|s| &s.id != c),
            Assumption::Policy(p) => policies = vec![p.clone()],
        }
    }
    w.fleet.apply(hub_read(specs, policies), now);
    for (cluster, h) in health {
        let events = match h {
            Health::Unreachable => vec![Event::Heartbeat {
                cluster,
                result: Err("assumed".into()),
            }],
            // Heartbeats answer; a failing watch is what degrades a member that answers.
            Health::Healthy | Health::Degraded => vec![
                Event::Heartbeat {
                    cluster: cluster.clone(),
                    result: Ok(()),
                },
                Event::WatchHealth {
                    cluster,
                    failure: (h == Health::Degraded).then(|| "assumed".into()),
                },
            ],
        };
        for e in events {
            w.fleet.apply(e, now);
        }
    }
    w.publish_at(now);
}

/// Every route of the two fleets, by service and client cluster name.
fn routes(s: &Snapshot, at: Instant) -> BTreeMap<(String, Option<String>), Route> {
    let mut out = BTreeMap::new();
    for view in s.services() {
        let service = format!("{}/{}", view.key.namespace, view.key.name);
        for client in (0..s.clusters.len()).map(Some).chain([None]) {
            let route = Route::of(s, &select(s, view, client, at));
            let name = client.map(|c| s.clusters[c].spec.id.to_string());
            out.insert((service.clone(), name), route);
        }
    }
    out
}

/// A decision without the numbers that only date the round that decided it (seconds left in
/// a window; the free room a capacity division saw, which a decision kept from an earlier
/// round reports as it was then).
fn comparable(d: &Decision) -> String {
    let placed: Vec<String> = d
        .placed
        .iter()
        .map(|p| {
            let reason = serde_json::to_value(&p.reason).expect("serialises");
            let tag = reason
                .as_object()
                .and_then(|o| o.keys().next().cloned())
                .unwrap_or_else(|| reason.to_string());
            format!("{}:{:?}:{tag}:{:?}", p.cluster, p.replicas, p.overrides)
        })
        .collect();
    let excluded: Vec<String> = d
        .excluded
        .iter()
        .map(|e| {
            let reason = serde_json::to_value(&e.reason).expect("serialises");
            format!("{}:{}", e.cluster, reason["reason"])
        })
        .collect();
    format!(
        "{placed:?} {:?} {:?} {:?} {excluded:?}",
        d.outcome, d.tier, d.standby_tier
    )
}

proptest! {
    #![proptest_config(ProptestConfig {
        rng_seed: proptest::test_runner::RngSeed::Fixed(7),
        ..ProptestConfig::with_cases(256)
    })]

    #[test]
    fn an_assumption_decides_as_the_fleet_where_it_came_true(shape in shape()) {
        let t0 = t(1000);
        let now = t0 + secs(10);
        let assumed = assumptions(&shape);
        let scenario = Scenario {
            assumptions: assumed.clone(),
            after: shape.after.map(|s| secs(u64::from(s))),
        };
        let mut real = world(&shape, t0);
        let Simulated { imagined, at, .. } = simulate(&real.prev, &real.decider, &scenario, now).expect("simulate");
        make_true(&mut real, &shape, &assumed, now);
        real.run_until(at);

        let (want, got) = (routes(&real.prev, at), routes(&imagined, at));
        prop_assert_eq!(want.keys().collect::<Vec<_>>(), got.keys().collect::<Vec<_>>());
        for (key, route) in &want {
            prop_assert_eq!(route, &got[key], "{:?} under {:?}", key, assumed);
        }
        let decisions = |s: &Snapshot| -> BTreeMap<String, String> {
            s.placements.decisions.iter().map(|(k, d)| (k.to_string(), comparable(d))).collect()
        };
        prop_assert_eq!(decisions(&real.prev), decisions(&imagined), "under {:?}", assumed);
    }
}

#[test]
fn settle_time_covers_the_longest_window() {
    let base = Demo::quickstart().publish();
    assert_eq!(settle_after(&base, &base.policies), secs(121));
}
