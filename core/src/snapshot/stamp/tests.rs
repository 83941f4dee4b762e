//! Restamping: which services' answers a new snapshot retires, and that nothing else is.

use std::collections::HashMap;
use std::time::Duration;

use super::*;
use crate::model::{ClusterId, ClusterSpec};
use crate::policy::{Policies, TrafficPolicy};
use crate::snapshot::view::Stamp;
use crate::testing::{FleetBuilder, geo_table, http_ep, svc};

/// Publishes snapshots of a fleet as the store does: rebuild what the Index marked dirty, then
/// restamp against the one published before.
struct Publisher {
    fleet: FleetBuilder,
    policies: Policies,
    published: Arc<Snapshot>,
    version: u64,
}

impl Publisher {
    /// Members `a`, `b` and `c`; `web` exported from `a` and `b`, `api` from `c` only.
    fn new(policy: TrafficPolicy) -> Self {
        let mut fleet = FleetBuilder::with_members(&["a", "b", "c"]);
        for (cluster, name, address) in [
            ("a", "web", "10.0.0.1"),
            ("b", "web", "10.0.1.1"),
            ("c", "api", "10.0.2.1"),
        ] {
            fleet
                .export(cluster, name, svc(false, &[("http", 80)]), 1)
                .slice(
                    cluster,
                    &format!("{name}-{cluster}"),
                    name,
                    vec![http_ep(address, true)],
                );
        }
        let mut publisher = Self {
            fleet,
            policies: Policies::new(Arc::new(policy), vec![]),
            published: Arc::new(Snapshot::empty()),
            version: 0,
        };
        publisher.publish(0);
        publisher
    }

    fn next(&mut self, after: u64) -> Snapshot {
        self.version += 1;
        let dirty = self.fleet.index.take_dirty();
        let mut next = Snapshot::rebuild(
            &self.published,
            &dirty,
            self.version,
            &self.fleet.index,
            &self.fleet.registry,
            &self.policies,
            self.fleet.at(after),
        );
        next.workloads = self.published.workloads.clone();
        next.geo = self.published.geo.clone();
        next
    }

    fn publish(&mut self, after: u64) -> Arc<Snapshot> {
        let next = self.next(after);
        self.publish_built(next, after)
    }

    fn publish_built(&mut self, mut next: Snapshot, after: u64) -> Arc<Snapshot> {
        next.restamp(&self.published, self.fleet.at(after));
        self.published = Arc::new(next);
        self.published.clone()
    }

    fn stamp(&self, name: &str) -> Arc<Stamp> {
        self.published
            .service("shop", name)
            .unwrap_or_else(|| panic!("shop/{name} is served"))
            .stamp
            .clone()
    }

    fn move_endpoint(&mut self, cluster: &str, name: &str, address: &str) {
        self.fleet.slice(
            cluster,
            &format!("{name}-{cluster}"),
            name,
            vec![http_ep(address, true)],
        );
    }
}

/// Which of `names` kept the stamp they had in `before` (answers cached then still hold).
fn kept(before: &[(&'static str, Arc<Stamp>)], now: &Snapshot) -> Vec<&'static str> {
    before
        .iter()
        .filter(|(_, stamp)| stamp.holds_at(now.version))
        .map(|(name, _)| *name)
        .collect()
}

fn stamps(p: &Publisher) -> Vec<(&'static str, Arc<Stamp>)> {
    ["web", "api"]
        .into_iter()
        .map(|n| (n, p.stamp(n)))
        .collect()
}

#[test]
fn a_changed_service_retires_its_own_answers_only() {
    let mut p = Publisher::new(TrafficPolicy::default());
    let before = stamps(&p);
    let names_before = p.published.names_version;
    p.move_endpoint("a", "web", "10.0.0.9");
    let now = p.publish(1);
    assert_eq!(kept(&before, &now), ["api"]);
    assert!(
        before[0].1.holds_at(now.version - 1),
        "the previous snapshot's readers keep theirs"
    );
    assert!(
        p.stamp("web").holds_at(now.version),
        "the new view's answers hold"
    );
    assert!(Arc::ptr_eq(&p.stamp("api"), &before[1].1));
    assert_eq!(now.names_version, names_before, "no name came or went");
    assert!(now.stamped);
}

#[test]
fn a_snapshot_without_changes_keeps_every_answer() {
    let mut p = Publisher::new(TrafficPolicy::default());
    let before = stamps(&p);
    let now = p.publish(1);
    assert_eq!(kept(&before, &now), ["web", "api"]);
}

#[test]
fn names_move_only_when_a_service_comes_or_goes() {
    let mut p = Publisher::new(TrafficPolicy::default());
    let before = stamps(&p);
    p.fleet
        .export("c", "cart", svc(false, &[("http", 80)]), 2)
        .slice("c", "cart-c", "cart", vec![http_ep("10.0.2.7", true)]);
    let now = p.publish(1);
    assert_eq!(
        now.names_version, now.version,
        "an NXDOMAIN for cart must go"
    );
    assert_eq!(kept(&before, &now), ["web", "api"]);

    let names = now.names_version;
    p.move_endpoint("c", "cart", "10.0.2.8");
    let now = p.publish(2);
    assert_eq!(now.names_version, names);

    let cart = p.stamp("cart");
    p.fleet.index.delete(
        &ClusterId::new("c"),
        crate::index::Kind::Export,
        &ObjectKey::new("shop", "cart"),
    );
    let now = p.publish(3);
    assert!(now.service("shop", "cart").is_none());
    assert_eq!(now.names_version, now.version);
    assert!(!cart.holds_at(now.version));
}

#[test]
fn a_backend_cluster_changing_health_retires_the_services_it_backs() {
    let mut p = Publisher::new(TrafficPolicy::default());
    let before = stamps(&p);
    p.fleet.heartbeat_failed("a", 1).tick(20);
    let now = p.publish(20);
    assert_eq!(now.clusters[0].health, crate::registry::Health::Unreachable);
    assert_eq!(
        kept(&before, &now),
        ["api"],
        "c backs api only, a backs web"
    );
    assert!(
        p.stamp("web").holds_at(now.version),
        "web answers again with a fresh stamp"
    );
}

#[test]
fn a_cluster_spec_change_retires_every_answer() {
    let mut p = Publisher::new(TrafficPolicy::default());
    let before = stamps(&p);
    let mut spec = ClusterSpec::named("c");
    spec.labels.insert("tier".into(), "gold".into());
    p.fleet.registry.upsert(spec, p.fleet.at(1));
    let now = p.publish(1);
    assert!(
        kept(&before, &now).is_empty(),
        "a client's own locality decides its tiers"
    );
    assert_eq!(now.names_version, now.version);
    assert!(p.stamp("web").holds_at(now.version));
}

#[test]
fn other_geo_ranges_retire_every_answer() {
    let mut p = Publisher::new(TrafficPolicy::default());
    let before = stamps(&p);
    let mut next = p.next(1);
    next.geo = geo_table(&[("192.0.2.0/24", "eu", "eu-1")]);
    let now = p.publish_built(next, 1);
    assert!(kept(&before, &now).is_empty());
    // The same ranges again (another Arc, equal contents) change nothing.
    let before = stamps(&p);
    let mut next = p.next(2);
    next.geo = geo_table(&[("192.0.2.0/24", "eu", "eu-1")]);
    let now = p.publish_built(next, 2);
    assert_eq!(kept(&before, &now), ["web", "api"]);
}

#[test]
fn workloads_placed_elsewhere_retire_their_policys_services() {
    let policy = TrafficPolicy {
        source: Some("shop/p".into()),
        ..TrafficPolicy::default()
    };
    let mut p = Publisher::new(policy);
    let before = stamps(&p);
    let mut next = p.next(1);
    next.workloads = Arc::new(HashMap::from([("shop/other".to_string(), vec![0])]));
    let now = p.publish_built(next, 1);
    assert_eq!(
        kept(&before, &now),
        ["web", "api"],
        "another policy's workloads"
    );

    let before = stamps(&p);
    let mut next = p.next(2);
    next.workloads = Arc::new(HashMap::from([
        ("shop/other".to_string(), vec![0]),
        ("shop/p".to_string(), vec![1]),
    ]));
    let now = p.publish_built(next, 2);
    assert!(
        kept(&before, &now).is_empty(),
        "traffic now goes to b first"
    );
}

#[test]
fn a_withdraw_window_ending_retires_the_service_when_it_ends() {
    let policy = TrafficPolicy {
        withdraw_after_seconds: Some(60),
        ..TrafficPolicy::default()
    };
    let mut p = Publisher::new(policy);
    p.fleet.heartbeat_failed("a", 1).tick(20);
    let unreachable = p.publish(20);
    let since = unreachable.clusters[0]
        .unreachable_since
        .expect("a is unreachable");
    let deadline = since + Duration::from_secs(60);
    assert_eq!(unreachable.next_deadline(p.fleet.at(20)), Some(deadline));
    let before = stamps(&p);
    let now = p.publish(30);
    assert_eq!(
        kept(&before, &now),
        ["web", "api"],
        "the window is still open"
    );
    let after = deadline.duration_since(p.fleet.t0).as_secs() + 1;
    let before = stamps(&p);
    let now = p.publish(after);
    assert_eq!(
        kept(&before, &now),
        ["api"],
        "web's decision changed with time alone"
    );
}

#[test]
fn a_snapshot_nobody_restamps_retires_nothing() {
    let mut p = Publisher::new(TrafficPolicy::default());
    let before = stamps(&p);
    p.move_endpoint("a", "web", "10.0.0.9");
    let what_if = p.next(1);
    assert!(!what_if.stamped);
    assert_eq!(what_if.names_version, what_if.version);
    assert_eq!(kept(&before, &what_if), ["web", "api"]);
}

#[test]
fn the_first_published_snapshot_after_an_unstamped_one_renews_everything() {
    let mut p = Publisher::new(TrafficPolicy::default());
    // What `Publisher::new` published came after the empty snapshot: stamped, names new.
    assert!(p.published.stamped);
    assert_eq!(p.published.names_version, p.published.version);
    let unstamped = p.next(1);
    let shared = unstamped.service("shop", "web").unwrap().stamp.clone();
    p.published = Arc::new(unstamped);
    let now = p.publish(2);
    assert!(
        !shared.holds_at(now.version),
        "shared with a snapshot nobody restamped"
    );
    assert!(p.stamp("web").holds_at(now.version));
}
