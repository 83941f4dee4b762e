//! Builds that reuse the previous one give exactly what a build from scratch gives.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_core::{
    ClusterId, ClusterSpec, Endpoint, Export, Index, Locality, Object, ObjectKey, Port, Protocol,
    Registry, Service, Slice, Snapshot,
};

use super::*;

struct Fleet {
    t0: Instant,
    index: Index,
    registry: Registry,
    policy: meridian_core::Policies,
    prev: Snapshot,
    version: u64,
}

fn spec(name: &str, region: &str, network: &str) -> ClusterSpec {
    let mut spec = ClusterSpec::named(name);
    spec.locality = Locality {
        region: Some(region.into()),
        zone: Some(format!("{region}-{name}")),
    };
    spec.network = Some(network.into());
    spec.gateway = Some(meridian_core::Gateway {
        address: format!("192.0.2.{}", name.len()).parse().unwrap(),
        port: 15443,
    });
    spec
}

impl Fleet {
    fn new() -> Self {
        let t0 = Instant::now();
        let mut registry = Registry::new();
        for (name, region, net) in [("a", "eu", "n1"), ("b", "eu", "n1"), ("c", "us", "n2")] {
            registry.upsert(spec(name, region, net), t0);
            registry.heartbeat_ok(&ClusterId::new(name), t0);
        }
        let mut fleet = Self {
            t0,
            index: Index::new(),
            registry,
            policy: meridian_core::Policies::default(),
            prev: Snapshot::empty(),
            version: 0,
        };
        for (i, svc) in ["web", "db", "api"].iter().enumerate() {
            for cluster in ["a", "b", "c"] {
                fleet.export(cluster, svc, 3, i as u8);
            }
        }
        fleet
    }

    fn export(&mut self, cluster: &str, svc: &str, ready: usize, seed: u8) {
        let id = ClusterId::new(cluster);
        let key = ObjectKey::new("shop", svc);
        let port = Port {
            name: Some("http".into()),
            port: 8080,
            protocol: Protocol::Tcp,
            app_protocol: None,
        };
        self.index.apply(
            &id,
            Object::Service(
                key.clone(),
                Service {
                    headless: false,
                    external_name: false,
                    publish_not_ready: false,
                    ports: vec![port.clone()],
                    cluster_ips: vec![],
                },
            ),
        );
        self.index.apply(
            &id,
            Object::Export(
                key.clone(),
                Export {
                    created: 1,
                    ..Export::default()
                },
            ),
        );
        let c = cluster.as_bytes()[0];
        let endpoints = (0..ready)
            .map(|i| Endpoint {
                addresses: vec![IpAddr::from([10, c, seed, i as u8])],
                hostname: None,
                ready: true,
                serving: true,
                terminating: false,
                zone: None,
                ports: Arc::from(vec![port.clone()]),
            })
            .collect();
        self.index.apply(
            &id,
            Object::Slice(
                ObjectKey::new("shop", format!("{svc}-x")),
                Slice {
                    service: Arc::from(svc),
                    endpoints,
                },
            ),
        );
    }

    fn publish(&mut self) -> Snapshot {
        self.version += 1;
        let dirty = self.index.take_dirty();
        let next = Snapshot::rebuild(
            &self.prev,
            &dirty,
            self.version,
            &self.index,
            &self.registry,
            &self.policy,
            self.t0,
        );
        let copy = Snapshot::rebuild(
            &next,
            &Default::default(),
            self.version,
            &self.index,
            &self.registry,
            &self.policy,
            self.t0,
        );
        self.prev = next;
        copy
    }
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
    let now = fleet.t0;
    let s1 = fleet.publish();
    for group in groups() {
        let first = build_from(&s1, &group, now, None);
        // One service changes in one cluster: only its resources are rebuilt.
        let mut f = Fleet::new();
        let s1b = f.publish();
        let base = build_from(&s1b, &group, now, None);
        f.export("a", "web", 1, 9);
        // … and one service is unexported everywhere: its resources go.
        for c in ["a", "b", "c"] {
            f.index.delete(
                &ClusterId::new(c),
                meridian_core::Kind::Export,
                &ObjectKey::new("shop", "api"),
            );
        }
        let s2 = f.publish();
        let reused = build_from(&s2, &group, now, Some(&base));
        let fresh = build(&s2, &group, now);
        assert_eq!(versions(&reused), versions(&fresh), "{group}");
        assert!(
            !versions(&reused).iter().any(|v| v.1.contains("api")),
            "{group}: an unexported service is gone"
        );
        let db = |r: &Resources, kind: Kind| {
            r.of(kind)
                .values()
                .find(|x| x.name.contains("db"))
                .cloned()
                .expect("db resources")
        };
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
    let now = fleet.t0;
    let s1 = fleet.publish();
    let group = groups()[0].clone();
    let base = build_from(&s1, &group, now, None);
    // b stops answering heartbeats: its health changes, no service view does.
    fleet
        .registry
        .heartbeat_failed(&ClusterId::new("b"), now + Duration::from_secs(1), "down");
    fleet.registry.tick(now + Duration::from_secs(30));
    fleet.registry.tick(now + Duration::from_secs(3600));
    let s2 = fleet.publish();
    let reused = build_from(&s2, &group, now + Duration::from_secs(3600), Some(&base));
    let fresh = build(&s2, &group, now + Duration::from_secs(3600));
    assert_eq!(versions(&reused), versions(&fresh));
    assert_ne!(versions(&reused), versions(&base), "b was withdrawn");
}
