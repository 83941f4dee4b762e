//! The one writer's task: feeds source events to the [`Fleet`] (which decides what they
//! change), wakes at the fleet's deadlines, logs and counts what happened, and publishes each
//! new snapshot on the watch channel. The fleet is owned by this task, so nothing is ever
//! locked across an `.await`.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use meridian_controllers::SourceEvent;
use meridian_core::fleet::{Fleet, Outcome};
use meridian_core::whatif::Base;
use meridian_core::{ClusterId, Health, Snapshot, Transition};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry as Metrics;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, info_span, warn};

/// Runs `f` (a placement round: up to hundreds of milliseconds for 10,000 templates) without
/// holding a runtime worker that xDS and the admin server need, where the runtime allows it.
fn off_the_runtime<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// How long the task sleeps when the fleet waits for nothing but the next event.
const IDLE: Duration = Duration::from_secs(3600);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabels {
    cluster: String,
    to: &'static str,
}

#[derive(Clone, Debug)]
struct StoreMetrics {
    transitions: Family<TransitionLabels, Counter>,
    withdrawals: Family<TransitionLabels, Counter>,
    snapshots: Counter,
    /// How long building a snapshot takes: every change pays it before DNS sees the change.
    build_seconds: Histogram,
    /// How long one round of placement decisions takes (every template decided again).
    placement_seconds: Histogram,
    placements: Family<PlacementLabels, Gauge>,
    placed_replicas: Family<ClusterLabels, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PlacementLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    cluster: String,
}

impl Default for StoreMetrics {
    fn default() -> Self {
        Self {
            transitions: Family::default(),
            withdrawals: Family::default(),
            snapshots: Counter::default(),
            build_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            placement_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            placements: Family::default(),
            placed_replicas: Family::default(),
        }
    }
}

pub struct Store {
    /// Every decision about events, health, readiness and problems; this task only feeds it.
    fleet: Fleet,
    /// Where DNS, xDS, the writers and the admin server take the latest snapshot from.
    publish: watch::Sender<Arc<Snapshot>>,
    /// The same snapshot with what decided its placements, for what-ifs.
    whatif: watch::Sender<Arc<Base>>,
    /// Counted here, not in the fleet: core knows nothing of Prometheus.
    metrics: StoreMetrics,
    heartbeats: Heartbeats,
    /// The members this replica cannot reach, whether or not other replicas confirm it: what
    /// the shard task reports to them.
    unreachable_here: watch::Sender<Arc<BTreeSet<ClusterId>>>,
}

/// When each member last answered a heartbeat, in wall-clock time, for the status page. Kept
/// beside the snapshot, not in it: a heartbeat that changes nothing must not publish one.
#[derive(Clone, Debug, Default)]
pub struct Heartbeats(Arc<parking_lot::Mutex<HashMap<ClusterId, SystemTime>>>);

impl Heartbeats {
    fn record(&self, cluster: &ClusterId, at: SystemTime) {
        self.0.lock().insert(cluster.clone(), at);
    }

    fn forget(&self, cluster: &ClusterId) {
        self.0.lock().remove(cluster);
    }

    /// The last good heartbeat of `cluster`, if it ever answered one.
    pub fn last(&self, cluster: &ClusterId) -> Option<SystemTime> {
        self.0.lock().get(cluster).copied()
    }
}

impl Store {
    pub fn new(
        fleet: Fleet,
        publish: watch::Sender<Arc<Snapshot>>,
        whatif: watch::Sender<Arc<Base>>,
        heartbeats: Heartbeats,
        metrics: &mut Metrics,
    ) -> Self {
        let m = StoreMetrics::default();
        metrics.register(
            "registry_transitions",
            "Member health transitions, by cluster and new state",
            m.transitions.clone(),
        );
        metrics.register(
            "registry_withdrawals",
            "Members withdrawn from DNS and xDS (to=withdrawn) or restored (to=restored)",
            m.withdrawals.clone(),
        );
        metrics.register(
            "snapshot_build_seconds",
            "Time to build a snapshot from the index and the registry",
            m.build_seconds.clone(),
        );
        metrics.register(
            "placement_decision_seconds",
            "Time to decide the placement of every template again",
            m.placement_seconds.clone(),
        );
        metrics.register(
            "placements",
            "Placement decisions, by result (scheduled or unschedulable)",
            m.placements.clone(),
        );
        metrics.register(
            "placed_replicas",
            "Replicas placed in each cluster, all templates together",
            m.placed_replicas.clone(),
        );
        metrics.register(
            "snapshots_published",
            "Snapshots published to DNS",
            m.snapshots.clone(),
        );
        Self {
            fleet,
            publish,
            whatif,
            metrics: m,
            heartbeats,
            unreachable_here: watch::channel(Arc::default()).0,
        }
    }

    /// Follows the members this replica cannot reach (see `Registry`'s `unreachable_here`).
    pub fn unreachable_here(&self) -> watch::Receiver<Arc<BTreeSet<ClusterId>>> {
        self.unreachable_here.subscribe()
    }

    /// Applies events until every source is gone.
    pub async fn run(mut self, mut events: mpsc::Receiver<SourceEvent>) {
        loop {
            let deadline = self.next_deadline(Instant::now());
            let changed = tokio::select! {
                event = events.recv() => {
                    let Some(event) = event else { break };
                    let mut changed = self.apply(event);
                    // Drain what queued up meanwhile, so a burst publishes once.
                    while let Ok(event) = events.try_recv() {
                        changed |= self.apply(event);
                    }
                    changed
                }
                _ = tokio::time::sleep_until(deadline.into()) => {
                    let outcome = self.fleet.tick(Instant::now());
                    self.report(outcome)
                }
            };
            if changed {
                self.publish_snapshot();
            }
            self.publish_unreachable_here();
        }
    }

    fn publish_unreachable_here(&self) {
        // Only the shard task listens: unsharded, there is nothing to work out per batch.
        if self.unreachable_here.receiver_count() == 0 {
            return;
        }
        let now: BTreeSet<ClusterId> = self
            .fleet
            .registry()
            .members()
            .filter(|(_, h)| h.unreachable_here)
            .map(|(spec, _)| spec.id.clone())
            .collect();
        self.unreachable_here.send_if_modified(|was| {
            let changed = **was != now;
            if changed {
                *was = Arc::new(now);
            }
            changed
        });
    }

    fn next_deadline(&self, now: Instant) -> Instant {
        let deadline = self.fleet.next_deadline().unwrap_or(now + IDLE);
        // A deadline already due is acted on at once, but never in a busy loop.
        deadline.max(now + Duration::from_millis(1))
    }

    /// Returns whether the snapshot must be rebuilt.
    fn apply(&mut self, event: SourceEvent) -> bool {
        if let SourceEvent::Heartbeat {
            cluster,
            result: Ok(()),
        } = &event
        {
            self.heartbeats.record(cluster, SystemTime::now());
        }
        let outcome = self.fleet.apply(event, Instant::now());
        self.report(outcome)
    }

    /// Logs and counts what the fleet did; returns whether the snapshot must be rebuilt.
    fn report(&self, outcome: Outcome) -> bool {
        if let Some(policies) = outcome.policies_changed {
            info!(policies, "scheduling policies changed");
        }
        for id in &outcome.removed {
            info!(cluster = %id, "member removed from the hub");
            self.heartbeats.forget(id);
        }
        for t in &outcome.transitions {
            self.report_transition(t);
        }
        outcome.changed
    }

    fn report_transition(&self, t: &Transition) {
        let reason = t.reason.as_deref().unwrap_or("");
        // A new member's health is not known until it syncs or fails: its first word is a
        // change from Unknown, whatever placeholder it started with.
        let from = if t.first { "Unknown" } else { t.from.as_str() };
        if t.from != t.to || t.first {
            if t.to == Health::Healthy {
                let was = t
                    .recovered_from
                    .as_deref()
                    .map(|why| format!("{why} (for {}s)", t.lasted.as_secs()));
                info!(cluster = %t.cluster, from, to = t.to.as_str(), recovered_from = was.as_deref(), "member health changed");
            } else {
                warn!(cluster = %t.cluster, from, to = t.to.as_str(), reason, "member health changed");
            }
            self.metrics
                .transitions
                .get_or_create(&TransitionLabels {
                    cluster: t.cluster.to_string(),
                    to: t.to.as_str(),
                })
                .inc();
        }
        if t.from == t.to && !t.first && t.withdrawn == t.was_withdrawn {
            info!(cluster = %t.cluster, health = t.to.as_str(), reason, "member seen from this replica");
        }
        if t.withdrawn != t.was_withdrawn {
            let to = if t.withdrawn { "withdrawn" } else { "restored" };
            warn!(cluster = %t.cluster, reason, "member endpoints {to}");
            self.metrics
                .withdrawals
                .get_or_create(&TransitionLabels {
                    cluster: t.cluster.to_string(),
                    to,
                })
                .inc();
        }
    }

    /// The placement gauges, set from a round's decisions.
    fn count_placements(&self, snapshot: &Snapshot) {
        let decisions = snapshot.placements.decisions.values();
        let scheduled = decisions.clone().filter(|d| d.is_scheduled()).count();
        let total = snapshot.placements.decisions.len();
        let m = &self.metrics;
        m.placements
            .get_or_create(&PlacementLabels {
                result: "scheduled",
            })
            .set(scheduled as i64);
        m.placements
            .get_or_create(&PlacementLabels {
                result: "unschedulable",
            })
            .set((total - scheduled) as i64);
        m.placed_replicas.clear();
        for c in &snapshot.clusters {
            m.placed_replicas
                .get_or_create(&ClusterLabels {
                    cluster: c.spec.id.to_string(),
                })
                .set(0);
        }
        for d in decisions {
            for p in &d.placed {
                m.placed_replicas
                    .get_or_create(&ClusterLabels {
                        cluster: p.cluster.to_string(),
                    })
                    .inc_by(i64::from(p.replicas.unwrap_or(0)));
            }
        }
    }

    fn publish_snapshot(&mut self) {
        let span = info_span!(
            "snapshot.build",
            version = tracing::field::Empty,
            services_changed = tracing::field::Empty,
            full = tracing::field::Empty,
        )
        .entered();
        let started = Instant::now();
        let prev = self.publish.borrow().clone();
        // Placement can take a while on a large fleet: not on a runtime thread.
        let published = off_the_runtime(|| self.fleet.publish(&prev, started));
        self.metrics
            .build_seconds
            .observe(published.build.as_secs_f64());
        span.record("version", published.snapshot.version);
        span.record("services_changed", published.services_changed);
        span.record("full", published.full);
        if let Some(took) = published.placement {
            self.metrics.placement_seconds.observe(took.as_secs_f64());
            self.count_placements(&published.snapshot);
            debug!(
                templates = published.snapshot.placements.decisions.len(),
                took_ms = took.as_secs_f64() * 1000.0,
                "placement decided"
            );
        }
        debug!(
            version = published.snapshot.version,
            took_ms = published.build.as_secs_f64() * 1000.0,
            services_changed = published.services_changed,
            full = published.full,
            "snapshot built"
        );
        self.metrics.snapshots.inc();
        let snapshot = Arc::new(published.snapshot);
        self.publish.send_replace(snapshot.clone());
        self.whatif.send_replace(Arc::new(Base {
            snapshot,
            decider: published.decider,
        }));
    }
}
