//! Builds that reuse the previous one give exactly what a build from scratch gives.

use std::sync::Arc;
use std::time::Duration;

use meridian_core::testing::{FleetBuilder, cluster, http_ep, on_network, service_route, svc};
use meridian_core::{ClusterId, ClusterSpec, ObjectKey, Policies, Snapshot};

use super::*;

/// Members a, b (region eu, network n1) and c (us, n2), each with a gateway, each exporting
/// `shop/web`, `shop/db` and `shop/api` with three ready endpoints; and the last snapshot
/// published.
struct Fleet {
    members: FleetBuilder,
    prev: Snapshot,
}

/// A member in `region` (zone `<region>-<name>`) on `network`, with a gateway.
fn spec(name: &str, region: &str, network: &str) -> ClusterSpec {
    on_network(
        cluster(name, region, &format!("{region}-{name}")),
        network,
        true,
    )
}

impl Fleet {
    fn new() -> Self {
        let mut members = FleetBuilder::new();
        for (name, region, net) in [("a", "eu", "n1"), ("b", "eu", "n1"), ("c", "us", "n2")] {
            members.member(spec(name, region, net));
        }
        members.version = 0;
        let mut fleet = Self {
            members,
            prev: Snapshot::empty(),
        };
        for (i, svc) in ["web", "db", "api"].iter().enumerate() {
            for cluster in ["a", "b", "c"] {
                fleet.export(cluster, svc, 3, i as u8);
            }
        }
        fleet
    }

    /// `shop/<name>` (port `http` 8080) exported by `cluster` with `ready` ready endpoints at
    /// `10.<cluster's first byte>.<seed>.<i>`.
    fn export(&mut self, cluster: &str, name: &str, ready: u8, seed: u8) {
        let c = cluster.as_bytes()[0];
        let endpoints = (0..ready)
            .map(|i| http_ep(&format!("10.{c}.{seed}.{i}"), true))
            .collect();
        self.members
            .export(cluster, name, svc(false, &[("http", 8080)]), 1)
            .slice(cluster, &format!("{name}-x"), name, endpoints);
    }

    /// The next version, rebuilt from the previous one; returned as a copy rebuilt from it
    /// with nothing dirty.
    fn publish(&mut self) -> Snapshot {
        let m = &mut self.members;
        m.version += 1;
        let policies = Policies::default();
        let dirty = m.index.take_dirty();
        let next = Snapshot::rebuild(
            &self.prev,
            &dirty,
            m.version,
            &m.index,
            &m.registry,
            &policies,
            m.t0,
        );
        let copy = Snapshot::rebuild(
            &next,
            &Default::default(),
            m.version,
            &m.index,
            &m.registry,
            &policies,
            m.t0,
        );
        self.prev = next;
        copy
    }

    /// `shop/web` in a changes its endpoints and `shop/api` is unexported everywhere.
    fn change_web_and_unexport_api(&mut self) {
        self.export("a", "web", 1, 9);
        for c in ["a", "b", "c"] {
            self.members.index.delete(
                &ClusterId::new(c),
                meridian_core::Kind::Export,
                &ObjectKey::new("shop", "api"),
            );
        }
    }
}

/// The first resource of `kind` whose name mentions `service`.
fn resource_of(r: &Resources, kind: Kind, service: &str) -> Option<Arc<Resource>> {
    r.of(kind)
        .values()
        .find(|x| x.name.contains(service))
        .cloned()
}

fn versions(r: &Resources) -> Vec<(Kind, String, String)> {
    Kind::ALL
        .into_iter()
        .flat_map(|k| {
            r.of(k)
                .values()
                .map(move |res| (k, res.name.to_string(), res.version.clone()))
        })
        .collect()
}

fn groups() -> Vec<Group> {
    let g = |cluster: &str, role| Group {
        cluster: Some(cluster.into()),
        network: None,
        role,
    };
    vec![
        g("a", Role::Envoy),
        g("a", Role::Proxyless),
        g("c", Role::Envoy),
        g("c", Role::EastWestGateway),
    ]
}

#[test]
fn reusing_the_previous_build_equals_building_from_scratch() {
    let mut fleet = Fleet::new();
    let now = fleet.members.t0;
    let s1 = fleet.publish();
    for group in groups() {
        let first = build_from(&s1, &group, now, None);
        // One service changes in one cluster: only its resources are rebuilt.
        let mut f = Fleet::new();
        let s1b = f.publish();
        let base = build_from(&s1b, &group, now, None);
        // … and one service is unexported everywhere: its resources go.
        f.change_web_and_unexport_api();
        let s2 = f.publish();
        let reused = build_from(&s2, &group, now, Some(&base));
        let fresh = build(&s2, &group, now);
        assert_eq!(versions(&reused), versions(&fresh), "{group}");
        assert!(
            !versions(&reused).iter().any(|v| v.1.contains("api")),
            "{group}: an unexported service is gone"
        );
        let db = |r: &Resources, kind: Kind| resource_of(r, kind, "db").expect("db resources");
        assert!(
            Arc::ptr_eq(&db(&reused, Kind::Endpoint), &db(&base, Kind::Endpoint)),
            "{group}: an unchanged service is reused, not re-encoded"
        );
        assert_eq!(versions(&first), versions(&base));
    }
}

#[test]
fn a_cluster_change_rebuilds_everything() {
    let mut fleet = Fleet::new();
    let now = fleet.members.t0;
    let s1 = fleet.publish();
    let group = groups()[0].clone();
    let base = build_from(&s1, &group, now, None);
    // b stops answering heartbeats: its health changes, no service view does.
    fleet.members.registry.heartbeat_failed(
        &ClusterId::new("b"),
        now + Duration::from_secs(1),
        "down",
    );
    fleet.members.registry.tick(now + Duration::from_secs(30));
    fleet.members.registry.tick(now + Duration::from_secs(3600));
    let s2 = fleet.publish();
    let reused = build_from(&s2, &group, now + Duration::from_secs(3600), Some(&base));
    let fresh = build(&s2, &group, now + Duration::from_secs(3600));
    assert_eq!(versions(&reused), versions(&fresh));
    assert_ne!(versions(&reused), versions(&base), "b was withdrawn");
}

#[test]
fn a_restamped_snapshot_renews_only_the_services_it_names_and_equals_building_from_scratch() {
    for group in groups() {
        let mut f = Fleet::new();
        let now = f.members.t0;
        let policies = Policies::default();
        let s1 = f.members.publish_after(&Snapshot::empty(), &policies);
        let base = build_from(&s1, &group, now, None);
        f.change_web_and_unexport_api();
        let s2 = f.members.publish_after(&s1, &policies);
        let mut changed = s2.changed_since(s1.version).expect("restamped").to_vec();
        changed.sort();
        assert_eq!(
            changed,
            [ObjectKey::new("shop", "api"), ObjectKey::new("shop", "web")]
        );
        assert!(s2.changed_since(s1.version + 1).is_none());
        let reused = build_from(&s2, &group, now, Some(&base));
        assert_eq!(
            versions(&reused),
            versions(&build(&s2, &group, now)),
            "{group}"
        );
        let endpoints = |r: &Resources, service: &str| resource_of(r, Kind::Endpoint, service);
        assert!(endpoints(&reused, "api").is_none(), "{group}: api is gone");
        assert!(
            Arc::ptr_eq(
                &endpoints(&reused, "db").unwrap(),
                &endpoints(&base, "db").unwrap()
            ),
            "{group}: an unchanged service is reused, not re-encoded"
        );
    }
}

/// A route table: HTTPRoute `shop/<parent>-split` sends `shop/<parent>` to itself and to
/// `shop/<other>` by `weights`.
fn split_routes(snapshot: &Snapshot, splits: &[(&str, &str, u32)]) -> Arc<RouteTable> {
    let routes: Vec<_> = splits
        .iter()
        .map(|(parent, other, weight)| {
            let name = format!("{parent}-split");
            service_route(
                &name,
                parent,
                &[(parent, 8080, 100 - weight), (other, 8080, *weight)],
            )
        })
        .collect();
    let ports = |key: &ObjectKey| {
        snapshot
            .service(&key.namespace, &key.name)
            .map(|s| s.ports.iter().map(|p| p.port).collect())
    };
    Arc::new(RouteTable::resolve(&routes, &[], ports))
}

#[test]
fn a_route_edit_renews_its_parents_resources_only_and_equals_building_from_scratch() {
    for group in groups() {
        let mut f = Fleet::new();
        let now = f.members.t0;
        let policies = Policies::default();
        let mut s1 = f.members.publish_after(&Snapshot::empty(), &policies);
        s1.routes = split_routes(&s1, &[("web", "api", 10), ("db", "api", 50)]);
        let base = build_from(&s1, &group, now, None);
        // The next snapshot changes nothing but web's split.
        let mut s2 = f.members.publish_after(&s1, &policies);
        s2.routes = split_routes(&s2, &[("web", "api", 30), ("db", "api", 50)]);
        let reused = build_from(&s2, &group, now, Some(&base));
        assert_eq!(
            versions(&reused),
            versions(&build(&s2, &group, now)),
            "{group}"
        );
        let route = |r: &Resources, service: &str| resource_of(r, Kind::Route, service);
        if group.role != Role::Proxyless {
            assert!(
                route(&reused, "web").is_none(),
                "{group}: RDS is the proxyless feed's"
            );
            continue;
        }
        assert_ne!(
            route(&reused, "web"),
            route(&base, "web"),
            "web's split changed"
        );
        for (kind, service) in [
            (Kind::Route, "db"),
            (Kind::Cluster, "db"),
            (Kind::Endpoint, "api"),
        ] {
            let (was, now) = (
                resource_of(&base, kind, service),
                resource_of(&reused, kind, service),
            );
            assert!(
                Arc::ptr_eq(&was.unwrap(), &now.unwrap()),
                "{group}: {kind:?} of {service} is reused, not re-encoded"
            );
        }
    }
}

#[test]
fn outlier_detection_is_the_policys_in_envoys_and_grpcs_terms() {
    let today = outlier_detection(&OutlierDetection::default());
    assert_eq!(today.consecutive_5xx, Some(UInt32Value { value: 5 }));
    assert_eq!(today.enforcing_failure_percentage, None);
    assert_eq!(today.max_ejection_percent, Some(UInt32Value { value: 50 }));

    let policy = OutlierDetection {
        consecutive_errors: None,
        consecutive_gateway_errors: Some(3),
        failure_percentage: Some(meridian_core::FailurePercentage {
            threshold: 50,
            minimum_hosts: 2,
            request_volume: 5,
        }),
        interval_seconds: 1,
        base_ejection_seconds: 60,
        max_ejection_percent: 34,
    };
    let o = outlier_detection(&policy);
    // Envoy counts 5 consecutive 5xx unless told not to enforce them.
    assert_eq!(o.consecutive_5xx, None);
    assert_eq!(o.enforcing_consecutive_5xx, Some(UInt32Value { value: 0 }));
    assert_eq!(
        o.consecutive_gateway_failure,
        Some(UInt32Value { value: 3 })
    );
    assert_eq!(
        o.enforcing_consecutive_gateway_failure,
        Some(UInt32Value { value: 100 })
    );
    assert_eq!(
        (
            o.failure_percentage_threshold,
            o.enforcing_failure_percentage,
            o.failure_percentage_minimum_hosts,
            o.failure_percentage_request_volume
        ),
        (
            Some(UInt32Value { value: 50 }),
            Some(UInt32Value { value: 100 }),
            Some(UInt32Value { value: 2 }),
            Some(UInt32Value { value: 5 })
        )
    );
    assert_eq!(o.interval, Some(seconds(1)));
    assert_eq!(o.base_ejection_time, Some(seconds(60)));
    assert_eq!(o.max_ejection_percent, Some(UInt32Value { value: 34 }));
}
