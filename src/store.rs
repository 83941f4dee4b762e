//! The one writer: applies source events to the Index and the Registry, rebuilds the Snapshot
//! when something changed, and publishes it on the watch channel. The Index is never locked
//! across an `.await`; it is owned by this task.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_controllers::{Change, ManifestError, SourceEvent};
use meridian_core::{ClusterId, Index, Policies, Problem, Registry, Snapshot, Transition};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry as Metrics;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

/// After this long, DNS answers even if some member has neither synced nor failed yet.
const SYNC_DEADLINE: Duration = Duration::from_secs(30);

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
    index: Index,
    registry: Registry,
    version: u64,
    /// The hub has been read once: until then the member list is unknown, so nothing is synced.
    hub_read: bool,
    started: Instant,
    policies: Policies,
    /// The policies changed since the last snapshot: every service is merged again.
    policies_changed: bool,
    /// When a decision changes with no event (a failback or withdraw window ends).
    decision_deadline: Option<Instant>,
    hub_problems: Vec<ManifestError>,
    member_problems: BTreeMap<ClusterId, Vec<ManifestError>>,
    member_warnings: BTreeMap<ClusterId, Vec<ManifestError>>,
    publish: watch::Sender<Arc<Snapshot>>,
    metrics: StoreMetrics,
}

impl Store {
    pub fn new(publish: watch::Sender<Arc<Snapshot>>, metrics: &mut Metrics) -> Self {
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
            index: Index::new(),
            registry: Registry::new(),
            version: 0,
            hub_read: false,
            started: Instant::now(),
            policies: Policies::default(),
            policies_changed: false,
            decision_deadline: None,
            hub_problems: Vec::new(),
            member_problems: BTreeMap::new(),
            member_warnings: BTreeMap::new(),
            publish,
            metrics: m,
        }
    }

    /// Applies events until every source is gone.
    pub async fn run(mut self, mut events: mpsc::Receiver<SourceEvent>) {
        loop {
            let deadline = self.next_deadline();
            let changed = tokio::select! {
                event = events.recv() => {
                    let Some(event) = event else { break };
                    let mut changed = self.apply(event, Instant::now());
                    // Drain what queued up meanwhile, so a burst publishes once.
                    while let Ok(event) = events.try_recv() {
                        changed |= self.apply(event, Instant::now());
                    }
                    changed
                }
                _ = tokio::time::sleep_until(deadline.into()) => {
                    let now = Instant::now();
                    let transitions = self.registry.tick(now);
                    self.report(&transitions);
                    let decisions_due = self.decision_deadline.is_some_and(|d| d <= now);
                    !transitions.is_empty() || self.sync_deadline_passed(now) || decisions_due
                }
            };
            if changed {
                self.publish_snapshot();
            }
        }
    }

    fn next_deadline(&self) -> Instant {
        let mut deadline = self
            .registry
            .next_deadline()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        if !self.synced(Instant::now()) {
            deadline = deadline.min(self.started + SYNC_DEADLINE);
        }
        if let Some(d) = self.decision_deadline {
            deadline = deadline.min(d);
        }
        deadline.max(Instant::now() + Duration::from_millis(1))
    }

    fn sync_deadline_passed(&self, now: Instant) -> bool {
        now >= self.started + SYNC_DEADLINE && !self.registry.all_settled()
    }

    fn synced(&self, now: Instant) -> bool {
        self.hub_read && (self.registry.all_settled() || now >= self.started + SYNC_DEADLINE)
    }

    /// Returns whether the snapshot must be rebuilt.
    pub fn apply(&mut self, event: SourceEvent, now: Instant) -> bool {
        match event {
            SourceEvent::Members {
                specs,
                policies,
                problems,
            } => {
                let first = !self.hub_read;
                let policies = Policies::new(self.policies.default.clone(), policies);
                let policies_changed = !self.policies.same_as(&policies);
                if policies_changed {
                    info!(
                        policies = policies.iter().count(),
                        "scheduling policies changed"
                    );
                    self.policies = policies;
                    self.policies_changed = true;
                }
                self.hub_read = true;
                let problems_changed = self.hub_problems != problems;
                self.hub_problems = problems;
                let wanted: Vec<ClusterId> = specs.iter().map(|s| s.id.clone()).collect();
                let gone: Vec<ClusterId> = self
                    .registry
                    .ids()
                    .filter(|id| !wanted.contains(id))
                    .cloned()
                    .collect();
                let mut changed = first || problems_changed || policies_changed;
                for id in gone {
                    info!(cluster = %id, "member removed from the hub");
                    self.registry.remove(&id);
                    self.index.remove_cluster(&id);
                    self.member_problems.remove(&id);
                    self.member_warnings.remove(&id);
                    changed = true;
                }
                for spec in specs {
                    changed |= self.registry.upsert(spec, now);
                }
                changed
            }
            SourceEvent::Reset {
                cluster,
                objects,
                problems,
                warnings,
            } => {
                if self.registry.spec(&cluster).is_none() {
                    return false;
                }
                let problems_changed = self.member_problems.get(&cluster) != Some(&problems)
                    || self.member_warnings.get(&cluster) != Some(&warnings);
                self.member_problems.insert(cluster.clone(), problems);
                self.member_warnings.insert(cluster.clone(), warnings);
                // Both, always: the problem list alone changing must publish too.
                self.index.reset(&cluster, objects) | problems_changed
            }
            SourceEvent::Changes {
                cluster,
                changes,
                problems,
            } => {
                if self.registry.spec(&cluster).is_none() {
                    return false;
                }
                let problems_changed = self.member_problems.get(&cluster) != Some(&problems);
                self.member_problems.insert(cluster.clone(), problems);
                let mut changed = problems_changed;
                for change in changes {
                    changed |= match change {
                        Change::Upsert(object) => self.index.apply(&cluster, object),
                        Change::Delete(kind, key) => self.index.delete(&cluster, kind, &key),
                    };
                }
                changed
            }
            SourceEvent::WatchHealth { cluster, failure } => {
                let transitions: Vec<Transition> = self
                    .registry
                    .watch_status(&cluster, now, failure)
                    .into_iter()
                    .collect();
                self.report(&transitions);
                !transitions.is_empty()
            }
            SourceEvent::Heartbeat { cluster, result } => {
                let was_settled = self.registry.all_settled();
                let transition = match result {
                    Ok(()) => self.registry.heartbeat_ok(&cluster, now),
                    Err(reason) => self.registry.heartbeat_failed(&cluster, now, reason),
                };
                let transitions: Vec<Transition> = transition.into_iter().collect();
                self.report(&transitions);
                !transitions.is_empty() || was_settled != self.registry.all_settled()
            }
        }
    }

    fn report(&self, transitions: &[Transition]) {
        for t in transitions {
            let reason = t.reason.as_deref().unwrap_or("");
            if t.from != t.to {
                if t.to == meridian_core::Health::Healthy {
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
    }

    fn publish_snapshot(&mut self) {
        self.version += 1;
        let started = Instant::now();
        let mut dirty = self.index.take_dirty();
        dirty.all |= std::mem::take(&mut self.policies_changed);
        let prev = self.publish.borrow().clone();
        let mut snapshot = Snapshot::rebuild(
            &prev,
            &dirty,
            self.version,
            &self.index,
            &self.registry,
            &self.policies,
            started,
        );
        self.decision_deadline = snapshot.next_deadline(started);
        let took = started.elapsed();
        self.metrics.build_seconds.observe(took.as_secs_f64());
        debug!(
            version = self.version,
            took_ms = took.as_secs_f64() * 1000.0,
            services_changed = dirty.services.len(),
            full = dirty.all,
            "snapshot built"
        );
        snapshot.synced = self.synced(Instant::now());
        let hub = ClusterId::new("hub");
        let hub_problems = self.hub_problems.iter().map(|p| problem(&hub, p));
        snapshot
            .problems
            .extend(hub_problems.chain(per_cluster(&self.member_problems)));
        snapshot.warnings.extend(per_cluster(&self.member_warnings));
        self.metrics.snapshots.inc();
        self.publish.send_replace(Arc::new(snapshot));
    }
}

fn problem(cluster: &ClusterId, p: &ManifestError) -> Problem {
    Problem {
        cluster: cluster.clone(),
        object: format!("{}: {}", p.file.display(), p.object),
        reason: p.reason.clone(),
    }
}

fn per_cluster(
    by_cluster: &BTreeMap<ClusterId, Vec<ManifestError>>,
) -> impl Iterator<Item = Problem> + '_ {
    by_cluster
        .iter()
        .flat_map(|(c, ps)| ps.iter().map(move |p| problem(c, p)))
}
