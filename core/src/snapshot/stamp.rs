//! How long answers decided about one service stay valid, so that caches at the edges (DNS
//! answer bytes) keep them across snapshots until something that decides them changes, and a
//! change to one service evicts nothing of any other.
//!
//! Every [`ServiceView`] carries a [`Stamp`]. A snapshot the store is about to publish is
//! [`Snapshot::restamp`]ed against the previous one: the stamp of every service whose answers
//! may differ in the new snapshot is retired at the new version, and the new snapshot gets a
//! view with a fresh stamp for it. An answer made from a view holds for every snapshot version
//! below its stamp's retirement, so a reader still on the previous snapshot keeps its hits
//! until the new one is published. What may change a service's answers:
//!
//! ```text
//!  its own view re-merged (endpoints, ports, exports, imports, governing policy)  ─► that service
//!  a backend cluster's health, withdrawal, unreachable-since or recovery time       ─► services it backs
//!  where its policy's workloads are placed (traffic goes there first)                ─► that policy's services
//!  a failback or withdraw window of its policy ending                               ─► that service
//!  any cluster's spec (labels, locality, network, gateway, taints: a client's tiers),
//!  the set of clusters, the geo ranges, or a full re-merge                          ─► every service
//! ```
//!
//! Which names exist (negative answers, empty non-terminals) changes less often still:
//! [`Snapshot::names_version`] is the version that last added or removed a service, so an
//! NXDOMAIN for a name that has just appeared dies with the snapshot that made it appear. A
//! snapshot nobody restamped (tests, a what-if) says so (`stamped: false`), and caches then
//! keep answers for its version only.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use crate::model::ObjectKey;

use super::Snapshot;
use super::view::{ClusterView, ServiceView};

/// Which views a build merged anew (their stamps are fresh already).
#[derive(Clone, Debug, Default)]
pub(crate) enum Remerged {
    /// Every service (a build from scratch).
    #[default]
    All,
    /// Only these; every other view is the previous snapshot's.
    Services(Vec<ObjectKey>),
}

impl Snapshot {
    /// Retires the stamps of `prev` (the snapshot published before this one) whose answers may
    /// differ in this one, and gives those services fresh stamps here (see the module docs).
    /// Called once, by whoever publishes, right before publishing: it changes what `prev`'s
    /// readers' caches keep, which a snapshot that is never published (a what-if) must not do.
    /// `now` is this snapshot's time (failback and withdraw windows are measured against it).
    pub fn restamp(&mut self, prev: &Snapshot, now: Instant) {
        let since = prev.stamped.then_some(prev.stamped_at).flatten();
        self.stamped = true;
        self.stamped_at = Some(now);
        let remerged = std::mem::take(&mut self.remerged);
        let keys = match remerged {
            Remerged::Services(keys) if !self.changes_everything(prev) => keys,
            _ => {
                for view in prev.all_services() {
                    view.stamp.retire(self.version);
                }
                self.renew(|view| prev.shares(view));
                self.names_version = self.version;
                return;
            }
        };
        let mut names_changed = false;
        for key in &keys {
            let before = prev.service(&key.namespace, &key.name);
            if let Some(view) = before {
                view.stamp.retire(self.version);
            }
            names_changed |= before.is_some() != self.service(&key.namespace, &key.name).is_some();
        }
        self.names_version = if names_changed {
            self.version
        } else {
            prev.names_version
        };
        let moved: Vec<bool> = self
            .clusters
            .iter()
            .zip(&prev.clusters)
            .map(|(now, before)| !same_state(now, before))
            .collect();
        let placed_elsewhere = self.policies_placed_elsewhere(prev);
        let any_moved = moved.iter().any(|m| *m);
        let remerged: HashSet<&ObjectKey> = keys.iter().collect();
        let clusters = &self.clusters;
        let stale = |view: &Arc<ServiceView>| {
            if remerged.contains(&view.key) {
                return false;
            }
            let policy = &view.policy;
            (any_moved && view.backends.iter().any(|b| moved[b.cluster]))
                || policy
                    .source
                    .as_deref()
                    .is_some_and(|p| placed_elsewhere.contains(p))
                || since.is_some_and(|since| {
                    service_deadline(clusters, view, since).is_some_and(|d| d <= now)
                })
        };
        // Only timed services have deadlines: without a cluster or placement change, they are
        // the only ones that may be stale.
        let renewed = if any_moved || !placed_elsewhere.is_empty() {
            self.collect_renewals(self.all_services(), stale)
        } else if since.is_some() {
            self.collect_renewals(self.timed_services(), stale)
        } else {
            Vec::new()
        };
        let mut changed = keys;
        changed.extend(renewed.iter().map(|view| view.key.clone()));
        self.replace_views(renewed);
        self.changed = Some((prev.version, changed.into()));
    }

    /// Whether every answer may differ: another set of clusters (services refer to them by
    /// position), another spec for any of them (a client's own locality and network decide its
    /// tiers), or other geo ranges (a client's place).
    fn changes_everything(&self, prev: &Snapshot) -> bool {
        !prev.stamped
            || !self.same_clusters_as(prev)
            || self
                .clusters
                .iter()
                .zip(&prev.clusters)
                .any(|(a, b)| a.spec != b.spec)
            || !(Arc::ptr_eq(&self.geo, &prev.geo) || *self.geo == *prev.geo)
    }

    /// The policies whose workloads run somewhere else now than in `prev`.
    fn policies_placed_elsewhere(&self, prev: &Snapshot) -> HashSet<String> {
        if Arc::ptr_eq(&self.workloads, &prev.workloads) {
            return HashSet::new();
        }
        let mut changed: HashSet<String> = self
            .workloads
            .iter()
            .filter(|(policy, clusters)| prev.workloads.get(*policy) != Some(*clusters))
            .map(|(policy, _)| policy.clone())
            .collect();
        changed.extend(
            prev.workloads
                .keys()
                .filter(|policy| !self.workloads.contains_key(*policy))
                .cloned(),
        );
        changed
    }

    /// Whether `view` is the very view this snapshot holds for its service.
    fn shares(&self, view: &Arc<ServiceView>) -> bool {
        self.service(&view.key.namespace, &view.key.name)
            .is_some_and(|mine| Arc::ptr_eq(mine, view))
    }

    /// Gives every view `stale` picks a fresh stamp, retiring its old one.
    fn renew(&mut self, stale: impl Fn(&Arc<ServiceView>) -> bool) {
        let renewed = self.collect_renewals(self.all_services(), |view| stale(view));
        self.replace_views(renewed);
    }

    fn collect_renewals<'a>(
        &self,
        views: impl Iterator<Item = &'a Arc<ServiceView>>,
        stale: impl Fn(&Arc<ServiceView>) -> bool,
    ) -> Vec<Arc<ServiceView>> {
        views
            .filter(|view| stale(view))
            .map(|view| {
                view.stamp.retire(self.version);
                Arc::new(ServiceView {
                    stamp: Arc::default(),
                    ..ServiceView::clone(view)
                })
            })
            .collect()
    }

    fn replace_views(&mut self, views: Vec<Arc<ServiceView>>) {
        for view in views {
            self.insert_service(view);
        }
    }

    /// Every service, in no particular order.
    pub(crate) fn all_services(&self) -> impl Iterator<Item = &Arc<ServiceView>> {
        self.services.values().flat_map(|by_name| by_name.values())
    }

    /// The services whose policy depends on time (the only ones with deadlines).
    pub(crate) fn timed_services(&self) -> impl Iterator<Item = &Arc<ServiceView>> {
        self.timed
            .iter()
            .filter_map(|key| self.service(&key.namespace, &key.name))
    }
}

/// The same health, withdrawal and clocks (what the traffic decision reads of a backend's
/// cluster besides its spec).
fn same_state(a: &ClusterView, b: &ClusterView) -> bool {
    a.health == b.health
        && a.withdrawn == b.withdrawn
        && a.unreachable_since == b.unreachable_since
        && a.recovered_at == b.recovered_at
}

/// The next instant after `now` at which the decision about `view` changes with no event: a
/// failback window or its policy's withdraw time ending.
pub(crate) fn service_deadline(
    clusters: &[ClusterView],
    view: &ServiceView,
    now: Instant,
) -> Option<Instant> {
    let policy = &view.policy;
    if !policy.depends_on_time() {
        return None;
    }
    let mut next: Option<Instant> = None;
    let mut consider = |t: Instant| {
        if t > now {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
    };
    for backend in &view.backends {
        let Some(cluster) = clusters.get(backend.cluster) else {
            continue;
        };
        if policy.failback_after_seconds > 0 {
            for at in [cluster.recovered_at, backend.recovered_at]
                .into_iter()
                .flatten()
            {
                consider(policy.failback_done(at));
            }
        }
        if let (Some(after), Some(since)) =
            (policy.withdraw_after_seconds, cluster.unreachable_since)
        {
            consider(since + std::time::Duration::from_secs(after));
        }
    }
    next
}

#[cfg(test)]
mod tests;
