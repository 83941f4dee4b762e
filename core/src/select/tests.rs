use super::*;

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use proptest::prelude::*;

use TierReason::{ClientCluster, Everyone, Remote, SameRegion, SameZone};

use crate::index::{Index, Object};
use crate::model::{
    ClusterId, ClusterSpec, Endpoint, Export, Gateway, Locality, ObjectKey, Slice, Taint,
};
use crate::policy::{Policies, Toleration};
use crate::registry::Registry;
use crate::testing::{FleetBuilder, cluster, ep, on_network, secs, svc, tainted};

// ---- builders ----

fn run(snap: &Snapshot, client: Option<&str>, now: Instant) -> Selection {
    let view = snap.service("shop", "web").expect("shop/web is served");
    let client = client.map(|c| snap.cluster_index(c).expect("client is a member"));
    select(snap, view, client, now)
}

type Layout<'a> = Vec<(Vec<TierReason>, Vec<(&'a str, u32)>)>;

/// Tiers as `(reasons, [(cluster, weight)])`, for readable assertions.
fn layout<'a>(snap: &'a Snapshot, selection: &Selection) -> Layout<'a> {
    selection
        .tiers
        .iter()
        .map(|t| {
            let members = t
                .members
                .iter()
                .map(|m| (snap.clusters[m.cluster].spec.id.as_str(), m.weight))
                .collect();
            (t.reasons.clone(), members)
        })
        .collect()
}

fn filtered<'a>(snap: &'a Snapshot, selection: &Selection) -> Vec<(&'a str, FilterReason)> {
    selection
        .filtered
        .iter()
        .map(|f| (snap.clusters[f.cluster].spec.id.as_str(), f.reason.clone()))
        .collect()
}

fn member<'a>(snap: &Snapshot, selection: &'a Selection, name: &str) -> &'a Member {
    let idx = snap.cluster_index(name).expect("member");
    selection
        .tiers
        .iter()
        .flat_map(|t| &t.members)
        .find(|m| m.cluster == idx)
        .unwrap_or_else(|| panic!("{name} is in no tier"))
}

// ---- tiers ----

fn locality_fleet() -> FleetBuilder {
    let mut fleet = FleetBuilder::new();
    fleet
        .add(cluster("eu-1a", "eu", "eu-1"), 2)
        .add(cluster("eu-1b", "eu", "eu-1"), 3)
        .add(cluster("eu-2", "eu", "eu-2"), 1)
        .add(cluster("us-1", "us", "us-1"), 4)
        .add(ClusterSpec::named("nowhere"), 1);
    fleet
}

#[test]
fn locality_tiers_are_client_cluster_zone_region_rest() {
    let fleet = locality_fleet();
    let snap = fleet.snapshot();
    let sel = run(&snap, Some("eu-1a"), fleet.t0);
    assert_eq!(
        layout(&snap, &sel),
        vec![
            (vec![ClientCluster], vec![("eu-1a", 2)]),
            (vec![SameZone], vec![("eu-1b", 3)]),
            (vec![SameRegion], vec![("eu-2", 1)]),
            (vec![Remote], vec![("us-1", 4), ("nowhere", 1)]),
        ]
    );
    assert_eq!(sel.spills, 0);
    assert!(sel.filtered.is_empty());
    assert_eq!(
        sel.tiers.iter().map(|t| t.ready).collect::<Vec<_>>(),
        [2, 3, 1, 5]
    );
}

#[test]
fn a_client_without_locality_has_its_own_cluster_then_the_rest() {
    let fleet = locality_fleet();
    let snap = fleet.snapshot();
    let sel = run(&snap, Some("nowhere"), fleet.t0);
    assert_eq!(
        layout(&snap, &sel),
        vec![
            (vec![ClientCluster], vec![("nowhere", 1)]),
            (
                vec![Remote],
                vec![("us-1", 4), ("eu-1b", 3), ("eu-1a", 2), ("eu-2", 1)]
            ),
        ]
    );
}

#[test]
fn an_unknown_client_gets_one_tier_of_everyone() {
    let fleet = locality_fleet();
    let snap = fleet.snapshot();
    let everyone = vec![(
        vec![Everyone],
        vec![
            ("us-1", 4),
            ("eu-1b", 3),
            ("eu-1a", 2),
            ("eu-2", 1),
            ("nowhere", 1),
        ],
    )];
    let view = snap.service("shop", "web").unwrap();

    let unknown_ip = snap.client_cluster("203.0.113.9".parse().unwrap());
    assert_eq!(unknown_ip, None);
    for client in [unknown_ip, Some(snap.clusters.len() + 3)] {
        let sel = select(&snap, view, client, fleet.t0);
        assert_eq!(layout(&snap, &sel), everyone, "client {client:?}");
        assert_eq!(sel.tiers[0].ready, 11);
    }
}

#[test]
fn members_point_at_their_backend_and_cluster() {
    // b is left out of the service (headless-ness conflict), so backend and cluster indices differ.
    let mut fleet = FleetBuilder::new();
    fleet.add(cluster("a", "eu", "eu-1"), 1);
    fleet.add_service(
        cluster("b", "eu", "eu-1"),
        svc(true, &[("http", 80)]),
        vec![ep("10.1.0.1".parse().unwrap(), true)],
    );
    fleet.add(cluster("c", "eu", "eu-1"), 2);
    let snap = fleet.snapshot();
    let view = snap.service("shop", "web").unwrap();
    assert_eq!(view.backends.len(), 2);

    let sel = run(&snap, None, fleet.t0);
    for m in sel.tiers.iter().flat_map(|t| &t.members) {
        assert_eq!(view.backends[m.backend].cluster, m.cluster);
    }
    let c = member(&snap, &sel, "c");
    assert_eq!((c.backend, c.cluster), (1, 2));
}

// ---- filters ----

#[test]
fn withdrawn_clusters_are_filtered_and_unreachable_ones_still_served() {
    let mut fleet = FleetBuilder::new();
    fleet
        .add(cluster("a", "eu", "eu-1"), 1)
        .add(
            ClusterSpec {
                health: crate::model::HealthTimings {
                    withdraw_after_seconds: 600,
                    ..Default::default()
                },
                ..cluster("stale", "eu", "eu-1")
            },
            1,
        )
        .add(
            ClusterSpec {
                health: crate::model::HealthTimings {
                    withdraw_after_seconds: 60,
                    ..Default::default()
                },
                ..cluster("gone", "eu", "eu-1")
            },
            1,
        )
        .heartbeat_failed("stale", 1)
        .heartbeat_failed("gone", 1)
        .tick(15)
        .tick(75);
    let snap = fleet.snapshot();
    assert!(snap.clusters[snap.cluster_index("gone").unwrap()].withdrawn);

    let sel = run(&snap, Some("a"), fleet.at(75));
    assert_eq!(filtered(&snap, &sel), [("gone", FilterReason::Withdrawn)]);
    assert_eq!(
        layout(&snap, &sel),
        vec![
            (vec![ClientCluster], vec![("a", 1)]),
            (vec![SameZone], vec![("stale", 1)])
        ]
    );
}

#[test]
fn taints_and_tolerations() {
    use TaintEffect::{NoExecute, NoSchedule, PreferNoSchedule};
    #[derive(Debug, PartialEq)]
    enum Expect {
        /// Served in its locality tier.
        Normal,
        /// Served in a last tier of its own.
        Last,
        Filtered,
    }
    let tol = |key: &str, effect: Option<TaintEffect>| Toleration::exists(key, effect);
    let cases = [
        (NoExecute, vec![], Expect::Filtered),
        (NoExecute, vec![tol("dedicated", None)], Expect::Normal),
        (
            NoExecute,
            vec![tol("dedicated", Some(NoExecute))],
            Expect::Normal,
        ),
        (
            NoExecute,
            vec![tol("dedicated", Some(NoSchedule))],
            Expect::Filtered,
        ),
        (
            NoExecute,
            vec![tol("dedicated", Some(PreferNoSchedule))],
            Expect::Filtered,
        ),
        (NoExecute, vec![tol("other", None)], Expect::Filtered),
        (PreferNoSchedule, vec![], Expect::Last),
        (
            PreferNoSchedule,
            vec![tol("dedicated", None)],
            Expect::Normal,
        ),
        (
            PreferNoSchedule,
            vec![tol("dedicated", Some(PreferNoSchedule))],
            Expect::Normal,
        ),
        (
            PreferNoSchedule,
            vec![tol("dedicated", Some(NoExecute))],
            Expect::Last,
        ),
        (PreferNoSchedule, vec![tol("other", None)], Expect::Last),
        (NoSchedule, vec![], Expect::Normal),
        (
            NoSchedule,
            vec![tol("dedicated", Some(NoExecute))],
            Expect::Normal,
        ),
    ];
    for (effect, tolerations, expect) in cases {
        let case = format!("{effect:?} with {tolerations:?}");
        let mut fleet = FleetBuilder::new();
        fleet
            .add(cluster("client", "eu", "eu-1"), 1)
            .add(
                tainted(cluster("tainted", "eu", "eu-1"), "dedicated", effect),
                2,
            )
            .add(cluster("remote", "us", "us-1"), 1);
        let snap = fleet.snapshot_with(TrafficPolicy {
            tolerations,
            ..TrafficPolicy::default()
        });
        let sel = run(&snap, Some("client"), fleet.t0);
        let expected = match expect {
            Expect::Normal => vec![
                (vec![ClientCluster], vec![("client", 1)]),
                (vec![SameZone], vec![("tainted", 2)]),
                (vec![Remote], vec![("remote", 1)]),
            ],
            Expect::Last => vec![
                (vec![ClientCluster], vec![("client", 1)]),
                (vec![Remote], vec![("remote", 1)]),
                (vec![TierReason::PreferNoSchedule], vec![("tainted", 2)]),
            ],
            Expect::Filtered => vec![
                (vec![ClientCluster], vec![("client", 1)]),
                (vec![Remote], vec![("remote", 1)]),
            ],
        };
        assert_eq!(layout(&snap, &sel), expected, "{case}");
        let expected_filtered = match expect {
            Expect::Filtered => vec![("tainted", FilterReason::NoExecuteTaint("dedicated".into()))],
            _ => vec![],
        };
        assert_eq!(filtered(&snap, &sel), expected_filtered, "{case}");
    }
}

#[test]
fn prefer_no_schedule_goes_last_even_for_the_clients_own_cluster() {
    let mut fleet = FleetBuilder::new();
    fleet
        .add(
            tainted(
                cluster("a", "eu", "eu-1"),
                "spot",
                TaintEffect::PreferNoSchedule,
            ),
            5,
        )
        .add(cluster("b", "eu", "eu-1"), 1)
        .add(
            tainted(
                cluster("c", "us", "us-1"),
                "spot",
                TaintEffect::PreferNoSchedule,
            ),
            2,
        );
    let snap = fleet.snapshot();
    let last = (vec![TierReason::PreferNoSchedule], vec![("a", 5), ("c", 2)]);

    let sel = run(&snap, Some("a"), fleet.t0);
    assert_eq!(
        layout(&snap, &sel),
        vec![(vec![SameZone], vec![("b", 1)]), last.clone()]
    );

    let sel = run(&snap, None, fleet.t0);
    assert_eq!(
        layout(&snap, &sel),
        vec![(vec![Everyone], vec![("b", 1)]), last]
    );
}

#[test]
fn clusters_without_ready_endpoints_are_filtered() {
    let mut fleet = FleetBuilder::new();
    let mut published = svc(false, &[("http", 80)]);
    published.publish_not_ready = true;
    let terminating = Endpoint {
        terminating: true,
        ..ep("10.4.0.1".parse().unwrap(), true)
    };
    fleet
        .add_endpoints(cluster("mixed", "eu", "eu-1"), 3, 2)
        .add_endpoints(cluster("starting", "eu", "eu-1"), 0, 2)
        .add_service(
            cluster("published", "eu", "eu-1"),
            published,
            vec![
                ep("10.2.0.1".parse().unwrap(), false),
                ep("10.2.0.2".parse().unwrap(), false),
            ],
        )
        .add_service(
            cluster("draining", "eu", "eu-1"),
            svc(false, &[("http", 80)]),
            vec![terminating],
        )
        .add_service(
            cluster("empty", "eu", "eu-1"),
            svc(false, &[("http", 80)]),
            vec![],
        );
    let snap = fleet.snapshot();
    let sel = run(&snap, None, fleet.t0);
    assert_eq!(
        layout(&snap, &sel),
        vec![(vec![Everyone], vec![("mixed", 3), ("published", 2)])]
    );
    let mut out = filtered(&snap, &sel);
    out.sort_by_key(|(name, _)| *name);
    assert_eq!(
        out,
        [
            ("draining", FilterReason::NoReadyEndpoints),
            ("empty", FilterReason::NoReadyEndpoints),
            ("starting", FilterReason::NoReadyEndpoints),
        ]
    );
}

#[test]
fn weights_are_ready_endpoints() {
    let mut fleet = FleetBuilder::new();
    fleet
        .add_endpoints(cluster("a", "eu", "eu-1"), 1, 4)
        .add_endpoints(cluster("b", "eu", "eu-1"), 7, 0)
        .add_endpoints(cluster("c", "eu", "eu-1"), 3, 3);
    let snap = fleet.snapshot();
    let sel = run(&snap, None, fleet.t0);
    assert_eq!(
        layout(&snap, &sel),
        vec![(vec![Everyone], vec![("b", 7), ("c", 3), ("a", 1)])]
    );
    for m in &sel.tiers[0].members {
        assert_eq!(m.weight, m.ready);
        assert!(m.weight > 0);
    }
    assert_eq!(sel.tiers[0].ready, 11);
}

#[test]
fn other_networks_need_a_gateway() {
    let mut fleet = FleetBuilder::new();
    fleet
        .add(
            on_network(cluster("client", "eu", "eu-1"), "net-1", false),
            1,
        )
        .add(on_network(cluster("same", "eu", "eu-1"), "net-1", false), 1)
        .add(on_network(cluster("far", "eu", "eu-1"), "net-2", false), 1)
        .add(on_network(cluster("gw", "eu", "eu-1"), "net-2", true), 1)
        .add(cluster("plain", "eu", "eu-1"), 1);
    let snap = fleet.snapshot();

    let sel = run(&snap, Some("client"), fleet.t0);
    let mut out = filtered(&snap, &sel);
    out.sort_by_key(|(name, _)| *name);
    assert_eq!(
        out,
        [
            ("far", FilterReason::OtherNetworkNoGateway),
            ("plain", FilterReason::OtherNetworkNoGateway),
        ]
    );
    assert!(!member(&snap, &sel, "client").via_gateway());
    assert!(!member(&snap, &sel, "same").via_gateway());
    assert!(member(&snap, &sel, "gw").via_gateway());
    assert_eq!(
        layout(&snap, &sel),
        vec![
            (vec![ClientCluster], vec![("client", 1)]),
            (vec![SameZone], vec![("gw", 1), ("same", 1)]),
        ]
    );

    // An unknown client is answered with endpoint addresses: no gateways, nothing filtered.
    let sel = run(&snap, None, fleet.t0);
    assert!(sel.filtered.is_empty());
    assert_eq!(sel.tiers.len(), 1);
    assert_eq!(sel.tiers[0].members.len(), 5);
    assert!(sel.tiers[0].members.iter().all(|m| !m.via_gateway()));
}

/// A client that cannot use gateways (proxyless gRPC) in cluster `name`.
fn proxyless<'a>(snap: &'a Snapshot, name: &str) -> Client<'a> {
    Client::in_cluster(snap, snap.cluster_index(name)).without_gateways()
}

#[test]
fn a_proxyless_client_spills_past_a_tier_that_only_a_gateway_filled() {
    // The client's zone holds one same-network endpoint and a gateway cluster: with
    // minHealthyEndpoints 2 a gateway-capable client stays in the zone; a proxyless one cannot
    // use the gateway, so its zone tier is short and spills into the region, as DNS does for a
    // client that sees only what it can reach.
    let mut fleet = FleetBuilder::new();
    fleet
        .add(
            on_network(cluster("client", "eu", "eu-1"), "net-1", false),
            1,
        )
        .add(on_network(cluster("gw", "eu", "eu-1"), "net-2", true), 3)
        .add(
            on_network(cluster("region", "eu", "eu-2"), "net-1", false),
            2,
        );
    let snap = fleet.snapshot_with(with_min(2));
    let view = snap.service("shop", "web").unwrap();

    let envoy = select_for(
        &snap,
        view,
        &Client::in_cluster(&snap, snap.cluster_index("client")),
        fleet.t0,
    );
    assert_eq!(
        layout(&snap, &envoy),
        vec![
            (
                vec![ClientCluster, SameZone],
                vec![("gw", 3), ("client", 1)]
            ),
            (vec![SameRegion], vec![("region", 2)]),
        ]
    );

    let grpc = select_for(&snap, view, &proxyless(&snap, "client"), fleet.t0);
    assert_eq!(
        filtered(&snap, &grpc),
        [("gw", FilterReason::GatewayUnusable)]
    );
    assert_eq!(
        layout(&snap, &grpc),
        vec![(
            vec![ClientCluster, SameRegion],
            vec![("region", 2), ("client", 1)]
        )],
        "the gateway member is gone before tiers are counted, so the short tier spills"
    );
    assert!(
        grpc.tiers
            .iter()
            .flat_map(|t| &t.members)
            .all(|m| !m.via_gateway())
    );
}

#[test]
fn a_proxyless_client_without_a_reachable_cluster_gets_no_tier() {
    let mut fleet = FleetBuilder::new();
    fleet
        .add(
            on_network(cluster("client", "eu", "eu-1"), "net-1", false),
            0,
        )
        .add(on_network(cluster("gw", "eu", "eu-1"), "net-2", true), 2);
    let snap = fleet.snapshot();
    let view = snap.service("shop", "web").unwrap();
    let grpc = select_for(&snap, view, &proxyless(&snap, "client"), fleet.t0);
    assert!(grpc.tiers.is_empty(), "no empty priority is left behind");
}

/// `shop/web` in clusters `a` (10.0.0.1, 10.0.0.2), `b` (10.0.0.2, 10.0.0.3) and
/// `c` (10.0.0.2): 10.0.0.2 is reported three times.
fn overlapping_fleet() -> FleetBuilder {
    let addr = |last: u8| IpAddr::V4(Ipv4Addr::new(10, 0, 0, last));
    let web = || svc(false, &[("http", 80)]);
    let mut fleet = FleetBuilder::new();
    fleet
        .add_service(
            cluster("a", "eu", "eu-1"),
            web(),
            vec![ep(addr(1), true), ep(addr(2), true)],
        )
        .add_service(
            cluster("b", "eu", "eu-1"),
            web(),
            vec![ep(addr(2), true), ep(addr(3), true)],
        )
        .add_service(cluster("c", "us", "us-1"), web(), vec![ep(addr(2), true)]);
    fleet
}

fn answerable_addresses(view: &ServiceView, selection: &Selection) -> Vec<Vec<IpAddr>> {
    selection
        .tiers
        .iter()
        .map(|t| {
            let mut addrs: Vec<IpAddr> = t
                .members
                .iter()
                .flat_map(|m| selection.answerable_of(view, m))
                .flat_map(|e| e.addresses.iter().copied())
                .collect();
            addrs.sort();
            addrs
        })
        .collect()
}

#[test]
fn an_address_two_clusters_report_is_answered_once_by_the_first() {
    let fleet = overlapping_fleet();
    let snap = fleet.snapshot();
    let view = snap.service("shop", "web").unwrap();
    assert_eq!(
        view.shared_addresses,
        ["10.0.0.2".parse::<IpAddr>().unwrap()]
    );

    // From a: a's own cluster owns 10.0.0.2; b keeps 10.0.0.3 (weight 1 now); c is left
    // with nothing and is filtered, naming the cluster that answers for it.
    let sel = run(&snap, Some("a"), fleet.t0);
    assert_eq!(
        layout(&snap, &sel),
        vec![
            (vec![ClientCluster], vec![("a", 2)]),
            (vec![SameZone], vec![("b", 1)]),
        ]
    );
    assert_eq!(
        filtered(&snap, &sel),
        [("c", FilterReason::DuplicateAddresses(ClusterId::new("a")))]
    );
    assert_eq!(
        sel.tiers[1].ready, 1,
        "spill counts what is left, not the duplicates"
    );
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(
        answerable_addresses(view, &sel),
        [vec![ip("10.0.0.1"), ip("10.0.0.2")], vec![ip("10.0.0.3")]]
    );

    // From b, b comes first and owns it instead.
    let sel = run(&snap, Some("b"), fleet.t0);
    assert_eq!(
        answerable_addresses(view, &sel),
        [vec![ip("10.0.0.2"), ip("10.0.0.3")], vec![ip("10.0.0.1")]]
    );

    // Every address appears once over all tiers, for every client.
    for client in [None, Some("a"), Some("b"), Some("c")] {
        let sel = run(&snap, client, fleet.t0);
        let all: Vec<IpAddr> = answerable_addresses(view, &sel).concat();
        let unique: HashSet<IpAddr> = all.iter().copied().collect();
        assert_eq!(all.len(), unique.len(), "client {client:?}: {all:?}");
        assert_eq!(unique.len(), 3, "client {client:?}: nothing is lost");
    }
}

#[test]
fn a_ready_endpoint_is_not_shadowed_by_a_not_ready_one() {
    let addr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9));
    let web = || svc(false, &[("http", 80)]);
    let mut fleet = FleetBuilder::new();
    fleet
        .add_service(
            cluster("a", "eu", "eu-1"),
            web(),
            vec![ep(addr, false), ep("10.0.0.1".parse().unwrap(), true)],
        )
        .add_service(cluster("b", "eu", "eu-1"), web(), vec![ep(addr, true)]);
    let snap = fleet.snapshot();
    let view = snap.service("shop", "web").unwrap();
    let sel = run(&snap, Some("a"), fleet.t0);
    let b = member(&snap, &sel, "b");
    assert_eq!(
        sel.answerable_of(view, b).count(),
        1,
        "b's ready copy is kept"
    );
    let a = member(&snap, &sel, "a");
    assert!(
        sel.endpoints_of(view, a)
            .all(|e| !e.addresses.contains(&addr)),
        "a's not-ready copy of the same address is left out"
    );
}

#[test]
fn the_first_filter_that_applies_is_reported() {
    let mut fleet = FleetBuilder::new();
    fleet
        .add(
            on_network(cluster("client", "eu", "eu-1"), "net-1", false),
            1,
        )
        .add_endpoints(
            tainted(
                on_network(
                    ClusterSpec {
                        health: crate::model::HealthTimings {
                            withdraw_after_seconds: 0,
                            ..Default::default()
                        },
                        ..cluster("all", "eu", "eu-1")
                    },
                    "net-2",
                    false,
                ),
                "k",
                TaintEffect::NoExecute,
            ),
            0,
            1,
        )
        .add_endpoints(
            tainted(
                on_network(cluster("taint", "eu", "eu-1"), "net-2", false),
                "k",
                TaintEffect::NoExecute,
            ),
            0,
            1,
        )
        .add_endpoints(
            on_network(cluster("empty", "eu", "eu-1"), "net-2", false),
            0,
            1,
        )
        .heartbeat_failed("all", 1)
        .tick(15);
    let snap = fleet.snapshot();
    let sel = run(&snap, Some("client"), fleet.at(15));
    let mut out = filtered(&snap, &sel);
    out.sort_by_key(|(name, _)| *name);
    assert_eq!(
        out,
        [
            ("all", FilterReason::Withdrawn),
            ("empty", FilterReason::NoReadyEndpoints),
            ("taint", FilterReason::NoExecuteTaint("k".into())),
        ]
    );
}

// ---- spill ----

fn spill_fleet() -> FleetBuilder {
    let mut fleet = FleetBuilder::new();
    fleet
        .add(cluster("a", "eu", "eu-1"), 1)
        .add(cluster("b", "eu", "eu-1"), 1)
        .add(cluster("c", "eu", "eu-2"), 2)
        .add(cluster("d", "us", "us-1"), 5)
        .add(
            tainted(
                cluster("p", "us", "us-2"),
                "spot",
                TaintEffect::PreferNoSchedule,
            ),
            1,
        );
    fleet
}

fn with_min(min_healthy_endpoints: u32) -> TrafficPolicy {
    TrafficPolicy {
        min_healthy_endpoints,
        ..TrafficPolicy::default()
    }
}

#[test]
fn a_tier_below_min_healthy_endpoints_spills_into_the_next() {
    let fleet = spill_fleet();
    let snap = fleet.snapshot_with(with_min(3));
    let sel = run(&snap, Some("a"), fleet.t0);
    assert_eq!(
        layout(&snap, &sel),
        vec![
            (
                vec![ClientCluster, SameZone, SameRegion],
                vec![("c", 2), ("a", 1), ("b", 1)]
            ),
            (vec![Remote], vec![("d", 5)]),
            (vec![TierReason::PreferNoSchedule], vec![("p", 1)]),
        ],
        "each cluster keeps its own weight; the last tier stays even below the minimum"
    );
    assert_eq!(sel.spills, 2);
    assert_eq!(
        sel.tiers.iter().map(|t| t.ready).collect::<Vec<_>>(),
        [4, 5, 1]
    );
}

#[test]
fn spill_cases() {
    // (min_healthy_endpoints, tier reasons, spills)
    let cases: [(u32, Vec<Vec<TierReason>>, u32); 6] = [
        (
            0,
            vec![
                vec![ClientCluster],
                vec![SameZone],
                vec![SameRegion],
                vec![Remote],
                vec![TierReason::PreferNoSchedule],
            ],
            0,
        ),
        (
            1,
            vec![
                vec![ClientCluster],
                vec![SameZone],
                vec![SameRegion],
                vec![Remote],
                vec![TierReason::PreferNoSchedule],
            ],
            0,
        ),
        (
            2,
            vec![
                vec![ClientCluster, SameZone],
                vec![SameRegion],
                vec![Remote],
                vec![TierReason::PreferNoSchedule],
            ],
            1,
        ),
        (
            4,
            vec![
                vec![ClientCluster, SameZone, SameRegion],
                vec![Remote],
                vec![TierReason::PreferNoSchedule],
            ],
            2,
        ),
        (
            6,
            vec![
                vec![ClientCluster, SameZone, SameRegion, Remote],
                vec![TierReason::PreferNoSchedule],
            ],
            3,
        ),
        (
            100,
            vec![vec![
                ClientCluster,
                SameZone,
                SameRegion,
                Remote,
                TierReason::PreferNoSchedule,
            ]],
            4,
        ),
    ];
    let fleet = spill_fleet();
    for (min, reasons, spills) in cases {
        let snap = fleet.snapshot_with(with_min(min));
        let sel = run(&snap, Some("a"), fleet.t0);
        let got: Vec<Vec<TierReason>> = sel.tiers.iter().map(|t| t.reasons.clone()).collect();
        assert_eq!(got, reasons, "min {min}");
        assert_eq!(sel.spills, spills, "min {min}");
        assert_eq!(
            sel.tiers.iter().map(|t| t.members.len()).sum::<usize>(),
            5,
            "min {min}"
        );
    }
}

#[test]
fn an_unknown_client_spills_everyone_into_prefer_no_schedule() {
    let fleet = spill_fleet();
    let snap = fleet.snapshot_with(with_min(20));
    let sel = run(&snap, None, fleet.t0);
    assert_eq!(
        layout(&snap, &sel),
        vec![(
            vec![Everyone, TierReason::PreferNoSchedule],
            vec![("d", 5), ("c", 2), ("a", 1), ("b", 1), ("p", 1)]
        )]
    );
    assert_eq!(sel.spills, 1);
}

// ---- policy withdraw override ----

/// `b` becomes Unreachable at t0+15 (its own withdrawAfterSeconds: 120).
fn unreachable_fleet() -> FleetBuilder {
    let mut fleet = FleetBuilder::new();
    fleet
        .add(cluster("a", "eu", "eu-1"), 1)
        .add(cluster("b", "eu", "eu-1"), 1)
        .heartbeat_failed("b", 1)
        .tick(15);
    fleet
}

fn with_withdraw(after: Option<u64>) -> TrafficPolicy {
    TrafficPolicy {
        withdraw_after_seconds: after,
        ..TrafficPolicy::default()
    }
}

fn b_is_withdrawn(snap: &Snapshot, now: Instant) -> bool {
    let sel = run(snap, Some("a"), now);
    let b = snap.cluster_index("b").unwrap();
    let withdrawn = sel
        .filtered
        .iter()
        .any(|f| f.cluster == b && f.reason == FilterReason::Withdrawn);
    let served = sel
        .tiers
        .iter()
        .flat_map(|t| &t.members)
        .any(|m| m.cluster == b);
    assert_ne!(withdrawn, served);
    withdrawn
}

#[test]
fn a_shorter_policy_withdraw_time_withdraws_earlier() {
    let fleet = unreachable_fleet();
    let snap = fleet.snapshot_with(with_withdraw(Some(30)));
    assert_eq!(snap.clusters[1].unreachable_since, Some(fleet.at(15)));
    assert!(!snap.clusters[1].withdrawn);
    assert!(!b_is_withdrawn(&snap, fleet.at(44)));
    assert!(b_is_withdrawn(&snap, fleet.at(45)));
    // The cluster's own setting, from the same snapshot, would still serve it.
    let default = fleet.snapshot();
    assert!(!b_is_withdrawn(&default, fleet.at(45)));
}

#[test]
fn a_longer_policy_withdraw_time_keeps_serving_stale_endpoints() {
    let mut fleet = unreachable_fleet();
    fleet.tick(135);
    let default = fleet.snapshot();
    assert!(default.clusters[1].withdrawn, "past the cluster's 120 s");
    assert!(b_is_withdrawn(&default, fleet.at(135)));

    let snap = fleet.snapshot_with(with_withdraw(Some(300)));
    assert!(!b_is_withdrawn(&snap, fleet.at(135)));
    assert!(!b_is_withdrawn(&snap, fleet.at(314)));
    assert!(b_is_withdrawn(&snap, fleet.at(315)));
}

#[test]
fn a_policy_withdraw_time_does_not_touch_reachable_clusters() {
    let mut fleet = FleetBuilder::new();
    fleet
        .add(cluster("a", "eu", "eu-1"), 1)
        .add(cluster("b", "eu", "eu-1"), 1)
        .heartbeat_failed("b", 1);
    let snap = fleet.snapshot_with(with_withdraw(Some(0)));
    assert_eq!(snap.clusters[1].health, crate::registry::Health::Degraded);
    assert!(!b_is_withdrawn(&snap, fleet.at(10)));
}

// ---- property: random fleets ----

#[derive(Clone, Copy, Debug)]
enum GenHealth {
    Healthy,
    /// Heartbeats answer, a watch is stalled.
    Degraded,
    /// Heartbeats fail; Unreachable but within its withdraw time.
    Unreachable,
    /// Unreachable past its withdraw time.
    Withdrawn,
    /// Never heard from.
    Silent,
}

#[derive(Clone, Debug)]
struct GenCluster {
    region: u8,
    zone: u8,
    /// 0: no network name.
    network: u8,
    gateway: bool,
    taint: Option<(u8, TaintEffect)>,
    health: GenHealth,
    /// `(ready, terminating)` per endpoint.
    endpoints: Vec<(bool, bool)>,
    publish_not_ready: bool,
    exported: bool,
    headless: bool,
}

#[derive(Clone, Debug)]
struct GenFleet {
    clusters: Vec<GenCluster>,
    /// May point past the members: an unknown client.
    client: Option<usize>,
    min_healthy: u32,
    toleration: Option<(u8, Option<TaintEffect>)>,
    withdraw_after: Option<u64>,
    now: u64,
}

fn effect() -> impl Strategy<Value = TaintEffect> {
    prop_oneof![
        Just(TaintEffect::NoSchedule),
        Just(TaintEffect::PreferNoSchedule),
        Just(TaintEffect::NoExecute),
    ]
}

fn gen_cluster() -> impl Strategy<Value = GenCluster> {
    let health = prop_oneof![
        3 => Just(GenHealth::Healthy),
        1 => Just(GenHealth::Degraded),
        1 => Just(GenHealth::Unreachable),
        1 => Just(GenHealth::Withdrawn),
        1 => Just(GenHealth::Silent),
    ];
    (
        (0u8..3, 0u8..2, 0u8..3, any::<bool>()),
        proptest::option::weighted(0.4, (0u8..2, effect())),
        health,
        proptest::collection::vec(
            (prop::bool::weighted(0.7), prop::bool::weighted(0.15)),
            0..6,
        ),
        (
            any::<bool>(),
            prop::bool::weighted(0.9),
            prop::bool::weighted(0.15),
        ),
    )
        .prop_map(
            |(
                (region, zone, network, gateway),
                taint,
                health,
                endpoints,
                (publish_not_ready, exported, headless),
            )| {
                GenCluster {
                    region,
                    zone,
                    network,
                    gateway,
                    taint,
                    health,
                    endpoints,
                    publish_not_ready,
                    exported,
                    headless,
                }
            },
        )
}

fn gen_fleet() -> impl Strategy<Value = GenFleet> {
    (
        proptest::collection::vec(gen_cluster(), 2..=8),
        proptest::option::of(0usize..10),
        0u32..8,
        proptest::option::of((0u8..2, proptest::option::of(effect()))),
        proptest::option::of(0u64..300),
        0u64..400,
    )
        .prop_map(
            |(clusters, client, min_healthy, toleration, withdraw_after, now)| GenFleet {
                clusters,
                client,
                min_healthy,
                toleration,
                withdraw_after,
                now,
            },
        )
}

fn gen_name(i: usize) -> String {
    format!("c{i}")
}

/// Builds the Index and Registry for a generated fleet; the clock ends at `t0 + 100 s`.
fn build_fleet(g: &GenFleet, t0: Instant) -> (Index, Registry) {
    let mut index = Index::new();
    let mut registry = Registry::new();
    for (i, c) in g.clusters.iter().enumerate() {
        let mut spec = ClusterSpec::named(&gen_name(i));
        spec.locality = Locality {
            region: Some(format!("r{}", c.region)),
            zone: Some(format!("r{}-z{}", c.region, c.zone)),
        };
        spec.network = (c.network > 0).then(|| format!("net-{}", c.network));
        spec.gateway = c.gateway.then(|| Gateway {
            address: IpAddr::V4(Ipv4Addr::new(192, 0, 2, i as u8)),
            port: 15443,
        });
        spec.taints = c
            .taint
            .iter()
            .map(|&(key, effect)| Taint {
                key: format!("k{key}"),
                value: None,
                effect,
            })
            .collect();
        spec.health.withdraw_after_seconds = match c.health {
            GenHealth::Withdrawn => 60,
            _ => 100_000,
        };
        let id = spec.id.clone();
        registry.upsert(spec, t0);
        match c.health {
            GenHealth::Healthy => {
                registry.heartbeat_ok(&id, t0);
            }
            GenHealth::Degraded => {
                registry.heartbeat_ok(&id, t0);
                registry.watch_status(&id, t0, Some("watch stalled".into()));
            }
            GenHealth::Unreachable | GenHealth::Withdrawn => {
                registry.heartbeat_ok(&id, t0);
                registry.heartbeat_failed(&id, t0 + secs(1), "connection refused");
            }
            GenHealth::Silent => {}
        }

        let key = ObjectKey::new("shop", "web");
        let mut service = svc(c.headless, &[("http", 80)]);
        service.publish_not_ready = c.publish_not_ready;
        index.apply(&id, Object::Service(key.clone(), service));
        if c.exported {
            index.apply(
                &id,
                Object::Export(
                    key,
                    Export {
                        created: i as i64,
                        ..Export::default()
                    },
                ),
            );
        }
        let endpoints = c
            .endpoints
            .iter()
            .enumerate()
            .map(|(j, &(ready, terminating))| Endpoint {
                terminating,
                ..ep(IpAddr::V4(Ipv4Addr::new(10, i as u8, 0, j as u8)), ready)
            })
            .collect();
        index.apply(
            &id,
            Object::Slice(
                ObjectKey::new("shop", "web-1"),
                Slice {
                    service: Arc::from("web"),
                    endpoints,
                },
            ),
        );
    }
    registry.tick(t0 + secs(20));
    registry.tick(t0 + secs(100));
    (index, registry)
}

fn gen_policy(g: &GenFleet) -> TrafficPolicy {
    TrafficPolicy {
        min_healthy_endpoints: g.min_healthy,
        withdraw_after_seconds: g.withdraw_after,
        tolerations: g
            .toleration
            .iter()
            .map(|&(key, effect)| Toleration::exists(format!("k{key}"), effect))
            .collect(),
        ..TrafficPolicy::default()
    }
}

fn select_in(g: &GenFleet, t0: Instant) -> Option<(Snapshot, Selection)> {
    let (index, registry) = build_fleet(g, t0);
    let snap = Snapshot::build(
        1,
        &index,
        &registry,
        &Policies::new(Arc::new(gen_policy(g)), vec![]),
    );
    let view = snap.service("shop", "web")?.clone();
    let selection = select(&snap, &view, g.client, t0 + secs(100 + g.now));
    Some((snap, selection))
}

/// The invariants of `select` for one generated fleet.
fn check_invariants(g: &GenFleet) -> Result<(), TestCaseError> {
    let t0 = Instant::now();
    let Some((snap, sel)) = select_in(g, t0) else {
        // Nobody exports the service.
        prop_assert!(g.clusters.iter().all(|c| !c.exported));
        return Ok(());
    };
    let view = snap.service("shop", "web").unwrap();
    let now = t0 + secs(100 + g.now);
    let client_known = g.client.is_some_and(|c| c < g.clusters.len());
    let policy = gen_policy(g);

    let filtered: HashSet<usize> = sel.filtered.iter().map(|f| f.cluster).collect();
    prop_assert_eq!(
        filtered.len(),
        sel.filtered.len(),
        "a cluster is filtered once"
    );
    let mut seen = HashSet::new();
    for tier in &sel.tiers {
        prop_assert!(!tier.reasons.is_empty());
        prop_assert!(!tier.members.is_empty());
        prop_assert_eq!(
            tier.ready,
            tier.members.iter().map(|m| m.ready).sum::<u32>()
        );
        for m in &tier.members {
            prop_assert!(
                !filtered.contains(&m.cluster),
                "filtered cluster {} in a tier",
                m.cluster
            );
            prop_assert!(m.weight > 0);
            prop_assert!(m.ready > 0);
            prop_assert!(
                seen.insert(m.backend),
                "backend {} appears twice",
                m.backend
            );
            prop_assert_eq!(view.backends[m.backend].cluster, m.cluster);

            // Independent checks against the generated input.
            let c = &g.clusters[m.cluster];
            let cv = &snap.clusters[m.cluster];
            let untolerated_no_execute = c.taint.is_some_and(|(key, effect)| {
                effect == TaintEffect::NoExecute
                    && !policy
                        .tolerations
                        .iter()
                        .any(|t| t.key == format!("k{key}") && t.effect.is_none_or(|e| e == effect))
            });
            prop_assert!(!untolerated_no_execute);
            if g.withdraw_after.is_none() {
                prop_assert!(!matches!(c.health, GenHealth::Withdrawn));
            } else if let (Some(after), Some(since)) = (g.withdraw_after, cv.unreachable_since) {
                prop_assert!(now.saturating_duration_since(since) < secs(after));
            }
            if client_known {
                prop_assert_eq!(
                    m.via_gateway(),
                    cv.spec.network != snap.clusters[g.client.unwrap()].spec.network
                );
            } else {
                prop_assert!(
                    !m.via_gateway(),
                    "an unknown client never goes via a gateway"
                );
            }
            if m.via_gateway() {
                prop_assert!(c.gateway);
            }
        }
    }
    prop_assert_eq!(
        seen.len() + filtered.len(),
        view.backends.len(),
        "every backend is placed or filtered"
    );
    if !client_known {
        prop_assert!(sel.tiers.len() <= 2);
    }

    // Deterministic: the same snapshot again, and a snapshot rebuilt from the same input.
    prop_assert_eq!(&select(&snap, view, g.client, now), &sel);
    let (_, again) = select_in(g, t0).unwrap();
    prop_assert_eq!(&again, &sel);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn selection_invariants_hold_for_random_fleets(g in gen_fleet()) {
        check_invariants(&g)?;
    }
}

// ---- policies: modes, weights, failback ----

mod policies {
    use super::*;
    use crate::policy::{
        AffinityTier, ClusterSet, LabelSelector, Policy, ServiceSelector, WeightRule,
    };

    fn region(r: &str) -> ClusterSet {
        ClusterSet {
            names: vec![],
            selector: Some(LabelSelector {
                match_labels: [("region".to_owned(), r.to_owned())].into(),
                match_expressions: vec![],
            }),
        }
    }

    fn names(n: &[&str]) -> ClusterSet {
        ClusterSet {
            names: n.iter().map(|s| s.to_string()).collect(),
            selector: None,
        }
    }

    fn labelled(name: &str, r: &str) -> ClusterSpec {
        let mut spec = cluster(name, r, &format!("{r}-{name}"));
        spec.labels.insert("region".into(), r.into());
        spec
    }

    /// eu-1 (2 ready), eu-2 (1), us-1 (4), ap-1 (3).
    fn world() -> FleetBuilder {
        let mut fleet = FleetBuilder::new();
        fleet
            .add(labelled("eu-1", "eu"), 2)
            .add(labelled("eu-2", "eu"), 1)
            .add(labelled("us-1", "us"), 4)
            .add(labelled("ap-1", "ap"), 3);
        fleet
    }

    fn tiers(min: u32) -> TrafficPolicy {
        TrafficPolicy {
            mode: Mode::Tiers,
            affinities: vec![
                AffinityTier {
                    name: "eu".into(),
                    clusters: region("eu"),
                },
                AffinityTier {
                    name: "us".into(),
                    clusters: names(&["us-1"]),
                },
            ],
            min_healthy_endpoints: min,
            ..TrafficPolicy::default()
        }
    }

    fn affinity(name: &str) -> TierReason {
        TierReason::Affinity(name.into())
    }

    #[test]
    fn tiers_follow_the_affinities_in_order_whoever_asks() {
        let fleet = world();
        let snap = fleet.snapshot_with(tiers(1));
        for client in [Some("ap-1"), Some("us-1"), None] {
            let sel = run(&snap, client, fleet.t0);
            assert_eq!(
                layout(&snap, &sel),
                vec![
                    (vec![affinity("eu")], vec![("eu-1", 2), ("eu-2", 1)]),
                    (vec![affinity("us")], vec![("us-1", 4)]),
                ],
                "client {client:?}"
            );
            assert_eq!(
                filtered(&snap, &sel),
                [("ap-1", FilterReason::NotInAffinities)]
            );
        }
    }

    #[test]
    fn a_tier_below_min_healthy_spills_into_the_next() {
        let fleet = world();
        // eu has 3 ready endpoints: enough for 3, not for 4.
        let snap = fleet.snapshot_with(tiers(3));
        assert_eq!(run(&snap, None, fleet.t0).tiers.len(), 2);
        let snap = fleet.snapshot_with(tiers(4));
        let sel = run(&snap, None, fleet.t0);
        assert_eq!(
            layout(&snap, &sel),
            vec![(
                vec![affinity("eu"), affinity("us")],
                vec![("us-1", 4), ("eu-1", 2), ("eu-2", 1)]
            )]
        );
        assert_eq!(sel.spills, 1);
    }

    #[test]
    fn a_cluster_a_rollout_drains_leaves_the_answer_and_its_client_goes_to_the_next_nearest() {
        let fleet = world();
        let snap = fleet.snapshot_with(TrafficPolicy {
            drained: [ClusterId::new("eu-1")].into(),
            ..TrafficPolicy::default()
        });
        let sel = run(&snap, Some("eu-1"), fleet.t0);
        assert_eq!(filtered(&snap, &sel), [("eu-1", FilterReason::Draining)]);
        let first: Vec<&str> = layout(&snap, &sel)[0].1.iter().map(|(c, _)| *c).collect();
        assert_eq!(
            first,
            ["eu-2"],
            "the same region's other cluster takes eu-1's clients"
        );
    }

    #[test]
    fn a_cluster_a_rollout_brings_back_takes_its_share_and_the_next_tier_the_rest() {
        let fleet = locality_fleet();
        let ramping = |percent: u32| {
            fleet.snapshot_with(TrafficPolicy {
                ramping: [(ClusterId::new("eu-1a"), percent)].into(),
                ..TrafficPolicy::default()
            })
        };
        // A quarter back: eu-1a keeps 25 % of its clients' traffic, the same zone the rest.
        let snap = ramping(25);
        let sel = run(&snap, Some("eu-1a"), fleet.t0);
        assert_eq!(
            layout(&snap, &sel),
            vec![
                (
                    vec![ClientCluster, SameZone],
                    vec![("eu-1b", 7500), ("eu-1a", 2500)]
                ),
                (vec![SameRegion], vec![("eu-2", 1)]),
                (vec![Remote], vec![("us-1", 4), ("nowhere", 1)]),
            ]
        );
        assert_eq!(sel.tiers[0].ready, 5);
        // For a client whose tier holds eu-1a beside others, those others take the rest:
        // eu-1a 2 × 25 %, eu-1b 3, of 5.
        let sel = run(&snap, Some("eu-2"), fleet.t0);
        assert_eq!(
            layout(&snap, &sel)[1],
            (vec![SameRegion], vec![("eu-1b", 6000), ("eu-1a", 1000)])
        );
        // All the way back: as if it never left.
        let snap = ramping(100);
        let sel = run(&snap, Some("eu-1a"), fleet.t0);
        assert_eq!(
            layout(&snap, &sel)[0],
            (vec![ClientCluster], vec![("eu-1a", 2)])
        );
    }

    #[test]
    fn a_cluster_ramping_with_nowhere_else_to_go_keeps_its_traffic() {
        let mut fleet = FleetBuilder::new();
        fleet.add(cluster("eu-1a", "eu", "eu-1"), 2);
        let snap = fleet.snapshot_with(TrafficPolicy {
            ramping: [(ClusterId::new("eu-1a"), 10)].into(),
            ..TrafficPolicy::default()
        });
        let sel = run(&snap, Some("eu-1a"), fleet.t0);
        assert_eq!(
            layout(&snap, &sel),
            vec![(vec![ClientCluster], vec![("eu-1a", 2)])]
        );
    }

    #[test]
    fn weighted_mode_is_one_tier_split_by_the_rules_and_zero_means_none() {
        let fleet = world();
        let snap = fleet.snapshot_with(TrafficPolicy {
            mode: Mode::Weighted,
            weights: vec![
                WeightRule {
                    clusters: names(&["us-1"]),
                    weight: 70,
                },
                WeightRule {
                    clusters: region("eu"),
                    weight: 15,
                },
                WeightRule {
                    clusters: names(&["ap-1"]),
                    weight: 0,
                },
            ],
            ..TrafficPolicy::default()
        });
        let sel = run(&snap, Some("ap-1"), fleet.t0);
        assert_eq!(
            layout(&snap, &sel),
            vec![(
                vec![TierReason::Weighted],
                vec![("us-1", 70), ("eu-1", 15), ("eu-2", 15)]
            )]
        );
        assert_eq!(filtered(&snap, &sel), [("ap-1", FilterReason::WeightZero)]);
    }

    #[test]
    fn weights_apply_inside_locality_tiers_too_and_unmatched_clusters_weigh_their_endpoints() {
        let fleet = world();
        let snap = fleet.snapshot_with(TrafficPolicy {
            weights: vec![WeightRule {
                clusters: names(&["eu-2"]),
                weight: 9,
            }],
            ..TrafficPolicy::default()
        });
        let sel = run(&snap, Some("eu-1"), fleet.t0);
        assert_eq!(
            layout(&snap, &sel),
            vec![
                (vec![ClientCluster], vec![("eu-1", 2)]),
                (vec![SameRegion], vec![("eu-2", 9)]),
                (vec![Remote], vec![("us-1", 4), ("ap-1", 3)]),
            ]
        );
    }

    #[test]
    fn a_cluster_back_from_unreachable_waits_out_the_failback_window() {
        let mut fleet = world();
        fleet.heartbeat_failed("eu-1", 1).tick(20);
        fleet
            .registry
            .heartbeat_ok(&ClusterId::new("eu-1"), fleet.at(30));
        let policy = TrafficPolicy {
            failback_after_seconds: 60,
            ..tiers(1)
        };
        let snap = fleet.snapshot_with(policy.clone());
        let during = run(&snap, None, fleet.at(31));
        assert_eq!(
            layout(&snap, &during),
            vec![
                (vec![affinity("eu")], vec![("eu-2", 1)]),
                (vec![affinity("us")], vec![("us-1", 4)]),
                (vec![TierReason::FailingBack], vec![("eu-1", 2)]),
            ]
        );
        assert_eq!(snap.next_deadline(fleet.at(31)), Some(fleet.at(90)));
        let after = run(&snap, None, fleet.at(90));
        assert_eq!(
            layout(&snap, &after)[0],
            (vec![affinity("eu")], vec![("eu-1", 2), ("eu-2", 1)])
        );
        // Without a failback window it is used at once.
        let snap = fleet.snapshot_with(tiers(1));
        assert_eq!(run(&snap, None, fleet.at(31)).tiers[0].members.len(), 2);
        assert_eq!(snap.next_deadline(fleet.at(31)), None);
    }

    #[test]
    fn endpoints_that_come_back_wait_out_the_failback_window() {
        let mut fleet = world();
        let policies = Policies::new(
            Arc::new(TrafficPolicy {
                failback_after_seconds: 10,
                ..tiers(1)
            }),
            vec![],
        );
        let s1 = Snapshot::build(1, &fleet.index, &fleet.registry, &policies);
        let rebuild = |fleet: &mut FleetBuilder, prev: &Snapshot, version, ready: u8, at| {
            let eps = (0..ready)
                .map(|i| ep(IpAddr::V4(Ipv4Addr::new(10, 0, 0, i)), true))
                .collect();
            fleet.index.apply(
                &ClusterId::new("eu-1"),
                Object::Slice(
                    ObjectKey::new("shop", "web-1"),
                    Slice {
                        service: Arc::from("web"),
                        endpoints: eps,
                    },
                ),
            );
            let dirty = fleet.index.take_dirty();
            Snapshot::rebuild(
                prev,
                &dirty,
                version,
                &fleet.index,
                &fleet.registry,
                &policies,
                at,
            )
        };
        let t = fleet.at(100);
        let s2 = rebuild(&mut fleet, &s1, 2, 0, t);
        let s3 = rebuild(&mut fleet, &s2, 3, 2, t + secs(5));
        let sel = run(&s3, None, t + secs(6));
        assert_eq!(sel.tiers.last().unwrap().reasons, [TierReason::FailingBack]);
        assert_eq!(s3.next_deadline(t + secs(6)), Some(t + secs(15)));
        let sel = run(&s3, None, t + secs(15));
        assert_eq!(layout(&s3, &sel)[0].1, [("eu-1", 2), ("eu-2", 1)]);
    }

    #[test]
    fn the_oldest_policy_governs_and_the_others_are_reported() {
        let fleet = world();
        let policy = |name: &str, created, mode| Policy {
            key: ObjectKey::new("shop", name),
            created,
            selectors: vec![ServiceSelector {
                name: Some("web".into()),
                selector: None,
            }],
            templates: Vec::new(),
            traffic: Arc::new(TrafficPolicy {
                source: Some(format!("shop/{name}")),
                mode,
                ..tiers(1)
            }),
            placement: None,
        };
        let policies = Policies::new(
            Arc::new(TrafficPolicy::default()),
            vec![
                policy("young", 20, Mode::Weighted),
                policy("old", 10, Mode::Tiers),
            ],
        );
        let snap = Snapshot::build(1, &fleet.index, &fleet.registry, &policies);
        let view = snap.service("shop", "web").unwrap();
        assert_eq!(view.policy.source.as_deref(), Some("shop/old"));
        assert_eq!(snap.problems.len(), 1);
        assert!(snap.problems[0].subject.to_string().contains("shop/young"));
        assert!(
            snap.problems[0].reason.contains("Conflict"),
            "{:?}",
            snap.problems
        );
    }
}

// ---- geo clients (outside the fleet) ----

/// A snapshot where 203.0.113.0/24 is a geo range in `region`/`zone` (`""`: none).
fn geo_snapshot(fleet: &FleetBuilder, policy: TrafficPolicy, region: &str, zone: &str) -> Snapshot {
    let mut snap = fleet.snapshot_with(policy);
    snap.geo = crate::testing::geo_table(&[("203.0.113.0/24", region, zone)]);
    snap
}

/// The decision for a client at 203.0.113.7, which the geo range places.
fn geo_layout<'a>(snap: &'a Snapshot, now: Instant) -> Layout<'a> {
    let place = snap.locate("203.0.113.7".parse().unwrap());
    assert_eq!(place, Some(ClientPlace::Geo(0)));
    let view = snap.service("shop", "web").unwrap();
    layout(snap, &select_for(snap, view, &Client::at(snap, place), now))
}

#[test]
fn a_geo_client_gets_same_zone_then_same_region_then_the_rest() {
    let fleet = locality_fleet();
    assert_eq!(
        geo_layout(
            &geo_snapshot(&fleet, TrafficPolicy::default(), "eu", "eu-1"),
            fleet.t0
        ),
        vec![
            (vec![SameZone], vec![("eu-1b", 3), ("eu-1a", 2)]),
            (vec![SameRegion], vec![("eu-2", 1)]),
            (vec![Remote], vec![("us-1", 4), ("nowhere", 1)]),
        ]
    );
    // A region without a zone: that region first, then the rest.
    assert_eq!(
        geo_layout(
            &geo_snapshot(&fleet, TrafficPolicy::default(), "us", ""),
            fleet.t0
        ),
        vec![
            (vec![SameRegion], vec![("us-1", 4)]),
            (
                vec![Remote],
                vec![("eu-1b", 3), ("eu-1a", 2), ("eu-2", 1), ("nowhere", 1)]
            ),
        ]
    );
    // A region no cluster is in: everyone, as the rest.
    assert_eq!(
        geo_layout(
            &geo_snapshot(&fleet, TrafficPolicy::default(), "ap", ""),
            fleet.t0
        ),
        vec![(
            vec![Remote],
            vec![
                ("us-1", 4),
                ("eu-1b", 3),
                ("eu-1a", 2),
                ("eu-2", 1),
                ("nowhere", 1)
            ]
        )]
    );
}

#[test]
fn a_geo_client_spills_like_any_other() {
    let fleet = locality_fleet();
    let policy = TrafficPolicy {
        min_healthy_endpoints: 2,
        ..TrafficPolicy::default()
    };
    // us-1 alone has 4, enough; eu-2 alone (1) would spill into the rest.
    assert_eq!(
        geo_layout(
            &geo_snapshot(&fleet, policy.clone(), "us", "us-1"),
            fleet.t0
        )[0]
        .1,
        vec![("us-1", 4)]
    );
    let snap = geo_snapshot(&fleet, policy, "eu", "eu-2");
    assert_eq!(geo_layout(&snap, fleet.t0)[0].0, vec![SameZone, SameRegion]);
}

#[test]
fn tiers_and_weighted_modes_ignore_a_geo_locality() {
    let fleet = locality_fleet();
    let tiers = TrafficPolicy {
        mode: Mode::Tiers,
        affinities: vec![
            crate::testing::tier("us", &["us-1"]),
            crate::testing::tier("eu", &["eu-1a", "eu-2"]),
        ],
        ..TrafficPolicy::default()
    };
    let snap = geo_snapshot(&fleet, tiers, "eu", "eu-1");
    let view = snap.service("shop", "web").unwrap();
    let unknown = layout(&snap, &select(&snap, view, None, fleet.t0));
    let geo = geo_layout(&snap, fleet.t0);
    assert_eq!(
        geo, unknown,
        "mode Tiers: a geo client is answered as an unknown one"
    );
    assert_eq!(geo[0].1, vec![("us-1", 4)]);

    let weighted = TrafficPolicy {
        mode: Mode::Weighted,
        ..TrafficPolicy::default()
    };
    assert_eq!(
        geo_layout(&geo_snapshot(&fleet, weighted, "eu", "eu-1"), fleet.t0),
        vec![(
            vec![TierReason::Weighted],
            vec![
                ("us-1", 4),
                ("eu-1b", 3),
                ("eu-1a", 2),
                ("eu-2", 1),
                ("nowhere", 1)
            ]
        )]
    );
}

#[test]
fn a_geo_client_has_no_network_and_never_goes_through_a_gateway() {
    let mut fleet = FleetBuilder::new();
    fleet
        .add(on_network(cluster("eu-1", "eu", "eu-1a"), "n1", true), 2)
        .add(on_network(cluster("us-1", "us", "us-1a"), "n2", true), 3);
    let mut snap = fleet.snapshot();
    snap.geo = crate::testing::geo_table(&[("203.0.113.0/24", "us", "")]);
    let client = Client::at(&snap, snap.locate("203.0.113.1".parse().unwrap()));
    assert_eq!(client.network, None);
    assert_eq!(client.cluster, None);
    let view = snap.service("shop", "web").unwrap();
    let sel = select_for(&snap, view, &client, fleet.t0);
    assert!(
        sel.tiers
            .iter()
            .flat_map(|t| &t.members)
            .all(|m| !m.via_gateway())
    );
    assert_eq!(
        layout(&snap, &sel)[0],
        (vec![SameRegion], vec![("us-1", 3)])
    );
}
