//! The one writer's task: feeds source events to the [`Fleet`] (which decides what they
//! change), wakes at the fleet's deadlines, logs and counts what happened, and publishes each
//! new snapshot on the watch channel. The fleet is owned by this task, so nothing is ever
//! locked across an `.await`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_controllers::SourceEvent;
use meridian_core::fleet::{Fleet, Outcome};
use meridian_core::{Health, Snapshot, Transition};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry as Metrics;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

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
}

impl Default for StoreMetrics {
    fn default() -> Self {
        Self {
            transitions: Family::default(),
            withdrawals: Family::default(),
            snapshots: Counter::default(),
            build_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
        }
    }
}

pub struct Store {
    /// Every decision about events, health, readiness and problems; this task only feeds it.
    fleet: Fleet,
    /// Where DNS, xDS, the writers and the admin server take the latest snapshot from.
    publish: watch::Sender<Arc<Snapshot>>,
    /// Counted here, not in the fleet: core knows nothing of Prometheus.
    metrics: StoreMetrics,
}

impl Store {
    pub fn new(fleet: Fleet, publish: watch::Sender<Arc<Snapshot>>, metrics: &mut Metrics) -> Self {
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
            "snapshots_published",
            "Snapshots published to DNS",
            m.snapshots.clone(),
        );
        Self {
            fleet,
            publish,
            metrics: m,
        }
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
        }
    }

    fn next_deadline(&self, now: Instant) -> Instant {
        let deadline = self.fleet.next_deadline().unwrap_or(now + IDLE);
        // A deadline already due is acted on at once, but never in a busy loop.
        deadline.max(now + Duration::from_millis(1))
    }

    /// Returns whether the snapshot must be rebuilt.
    fn apply(&mut self, event: SourceEvent) -> bool {
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
        }
        for t in &outcome.transitions {
            self.report_transition(t);
        }
        outcome.changed
    }

    fn report_transition(&self, t: &Transition) {
        let reason = t.reason.as_deref().unwrap_or("");
        if t.from != t.to {
            if t.to == Health::Healthy {
                info!(cluster = %t.cluster, from = t.from.as_str(), to = t.to.as_str(), "member health changed");
            } else {
                warn!(cluster = %t.cluster, from = t.from.as_str(), to = t.to.as_str(), reason, "member health changed");
            }
            self.metrics
                .transitions
                .get_or_create(&TransitionLabels {
                    cluster: t.cluster.to_string(),
                    to: t.to.as_str(),
                })
                .inc();
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

    fn publish_snapshot(&mut self) {
        let started = Instant::now();
        let prev = self.publish.borrow().clone();
        let built = self.fleet.build_snapshot(&prev, started);
        let took = started.elapsed();
        self.metrics.build_seconds.observe(took.as_secs_f64());
        debug!(
            version = built.snapshot.version,
            took_ms = took.as_secs_f64() * 1000.0,
            services_changed = built.services_changed,
            full = built.full,
            "snapshot built"
        );
        self.metrics.snapshots.inc();
        self.publish.send_replace(Arc::new(built.snapshot));
    }
}
