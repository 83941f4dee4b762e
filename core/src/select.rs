//! The scheduling core for traffic (DESIGN §3): for one service and one client cluster, which
//! clusters receive traffic, in which priority tiers, with which weights. DNS and xDS both call
//! [`select`]; neither reorders clusters on its own.
//!
//! ```text
//!  backends ─► filter (withdrawn, NoExecute, no ready endpoints, other network w/o gateway)
//!           ─► tier   (Locality: own cluster, same zone, same region, rest; PreferNoSchedule last)
//!           ─► weigh  (ready endpoints)
//!           ─► spill  (a tier below minHealthyEndpoints merges into the next)
//! ```

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::model::TaintEffect;
use crate::snapshot::{ClusterView, ServiceView, Snapshot};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum Mode {
    /// The client's cluster, then the same zone, then the same region, then the rest.
    #[default]
    Locality,
}

/// A toleration of a cluster taint (`effect: None` tolerates every effect of that key).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Toleration {
    pub key: String,
    pub effect: Option<TaintEffect>,
}

/// The traffic part of a ClusterSchedulingPolicy; the default applies to services no policy
/// selects.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TrafficPolicy {
    pub mode: Mode,
    /// A tier with fewer ready endpoints than this merges into the next one.
    pub min_healthy_endpoints: u32,
    /// Overrides the cluster's `withdrawAfterSeconds`.
    pub withdraw_after_seconds: Option<u64>,
    pub tolerations: Vec<Toleration>,
    pub ttl: Option<u32>,
    pub max_answers: Option<u32>,
}

impl Default for TrafficPolicy {
    fn default() -> Self {
        Self {
            mode: Mode::Locality,
            min_healthy_endpoints: 1,
            withdraw_after_seconds: None,
            tolerations: Vec::new(),
            ttl: None,
            max_answers: None,
        }
    }
}

impl TrafficPolicy {
    fn tolerates(&self, key: &str, effect: TaintEffect) -> bool {
        self.tolerations
            .iter()
            .any(|t| t.key == key && t.effect.is_none_or(|e| e == effect))
    }
}

/// Why a cluster gets no traffic for a service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", content = "detail")]
pub enum FilterReason {
    /// Unreachable past its withdraw time.
    Withdrawn,
    /// Carries a `NoExecute` taint the policy does not tolerate.
    NoExecuteTaint(String),
    NoReadyEndpoints,
    /// On another network than the client, without an east-west gateway.
    OtherNetworkNoGateway,
}

/// Why a tier holds the clusters it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum TierReason {
    ClientCluster,
    SameZone,
    SameRegion,
    Remote,
    /// The client's cluster is unknown: every cluster in one tier.
    Everyone,
    /// Clusters with a `PreferNoSchedule` taint, last.
    PreferNoSchedule,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Member {
    /// Index into `ServiceView::backends`.
    pub backend: usize,
    /// Index into `Snapshot::clusters`.
    pub cluster: usize,
    /// Always positive.
    pub weight: u32,
    pub ready: u32,
    /// The client sits on another network: it is answered by the cluster's gateway.
    pub via_gateway: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Tier {
    /// The reasons of the locality tiers merged into this one (more than one after a spill).
    pub reasons: Vec<TierReason>,
    pub members: Vec<Member>,
    pub ready: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Filtered {
    pub cluster: usize,
    pub reason: FilterReason,
}

/// The decision for one service and one client: tiers in priority order (index = priority).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Selection {
    pub tiers: Vec<Tier>,
    pub filtered: Vec<Filtered>,
    /// How many tiers were merged into the next one for lack of healthy endpoints.
    pub spills: u32,
}

/// Decides where traffic for `service` from a client in `client` (if known) goes; the client
/// is on its cluster's network.
pub fn select(
    snapshot: &Snapshot,
    service: &ServiceView,
    client: Option<usize>,
    now: Instant,
) -> Selection {
    let network = client
        .and_then(|c| snapshot.clusters.get(c))
        .map(|c| c.spec.network.as_deref());
    select_on_network(snapshot, service, client, network, now)
}

/// [`select`] for a client that names its network itself (an xDS node's `NETWORK`).
/// `network`: None when unknown (no cluster is then behind a gateway), else the client's
/// network (itself None for the unnamed network).
pub fn select_on_network(
    snapshot: &Snapshot,
    service: &ServiceView,
    client: Option<usize>,
    network: Option<Option<&str>>,
    now: Instant,
) -> Selection {
    let policy = &service.policy;
    let client_view = client.and_then(|c| snapshot.clusters.get(c));
    let mut selection = Selection::default();
    let mut buckets: [(TierReason, Vec<Member>); 6] = [
        (TierReason::ClientCluster, Vec::new()),
        (TierReason::SameZone, Vec::new()),
        (TierReason::SameRegion, Vec::new()),
        (TierReason::Remote, Vec::new()),
        (TierReason::Everyone, Vec::new()),
        (TierReason::PreferNoSchedule, Vec::new()),
    ];
    for (i, backend) in service.backends.iter().enumerate() {
        let Some(cluster) = snapshot.clusters.get(backend.cluster) else {
            continue;
        };
        let via_gateway = network.is_some_and(|n| n != cluster.spec.network.as_deref());
        if let Some(reason) = filter(cluster, backend.ready, via_gateway, policy, now) {
            selection.filtered.push(Filtered {
                cluster: backend.cluster,
                reason,
            });
            continue;
        }
        let member = Member {
            backend: i,
            cluster: backend.cluster,
            weight: backend.ready.max(1),
            ready: backend.ready,
            via_gateway,
        };
        let bucket = if prefers_no_schedule(cluster, policy) {
            5
        } else {
            match (client, client_view) {
                (Some(c), Some(cv)) => locality_bucket(c, cv, backend.cluster, cluster),
                _ => 4,
            }
        };
        buckets[bucket].1.push(member);
    }
    spill_into_tiers(&mut selection, buckets, policy.min_healthy_endpoints);
    selection
}

fn filter(
    cluster: &ClusterView,
    ready: u32,
    via_gateway: bool,
    policy: &TrafficPolicy,
    now: Instant,
) -> Option<FilterReason> {
    if is_withdrawn(cluster, policy, now) {
        return Some(FilterReason::Withdrawn);
    }
    if let Some(taint) = cluster
        .spec
        .taints
        .iter()
        .find(|t| t.effect == TaintEffect::NoExecute && !policy.tolerates(&t.key, t.effect))
    {
        return Some(FilterReason::NoExecuteTaint(taint.key.clone()));
    }
    if ready == 0 {
        return Some(FilterReason::NoReadyEndpoints);
    }
    if via_gateway && cluster.spec.gateway.is_none() {
        return Some(FilterReason::OtherNetworkNoGateway);
    }
    None
}

fn is_withdrawn(cluster: &ClusterView, policy: &TrafficPolicy, now: Instant) -> bool {
    match (policy.withdraw_after_seconds, cluster.unreachable_since) {
        (Some(after), Some(since)) => {
            now.saturating_duration_since(since) >= Duration::from_secs(after)
        }
        _ => cluster.withdrawn,
    }
}

fn prefers_no_schedule(cluster: &ClusterView, policy: &TrafficPolicy) -> bool {
    cluster
        .spec
        .taints
        .iter()
        .any(|t| t.effect == TaintEffect::PreferNoSchedule && !policy.tolerates(&t.key, t.effect))
}

fn locality_bucket(client: usize, cv: &ClusterView, idx: usize, cluster: &ClusterView) -> usize {
    let (mine, theirs) = (&cv.spec.locality, &cluster.spec.locality);
    if idx == client {
        0
    } else if mine.zone.is_some() && mine.zone == theirs.zone {
        1
    } else if mine.region.is_some() && mine.region == theirs.region {
        2
    } else {
        3
    }
}

/// Turns non-empty buckets into tiers, merging a tier with fewer than `min_healthy` ready
/// endpoints into the next one (each cluster keeps its own weight).
fn spill_into_tiers(
    selection: &mut Selection,
    buckets: [(TierReason, Vec<Member>); 6],
    min_healthy: u32,
) {
    let mut pending: Option<Tier> = None;
    let non_empty: Vec<_> = buckets.into_iter().filter(|(_, m)| !m.is_empty()).collect();
    let last = non_empty.len().saturating_sub(1);
    for (i, (reason, members)) in non_empty.into_iter().enumerate() {
        let tier = pending.get_or_insert_with(|| Tier {
            reasons: Vec::new(),
            members: Vec::new(),
            ready: 0,
        });
        tier.reasons.push(reason);
        tier.ready += members.iter().map(|m| m.ready).sum::<u32>();
        tier.members.extend(members);
        if tier.ready >= min_healthy || i == last {
            let mut tier = pending.take().expect("pending tier");
            tier.members
                .sort_by(|a, b| b.weight.cmp(&a.weight).then(a.cluster.cmp(&b.cluster)));
            selection.tiers.push(tier);
        } else {
            selection.spills += 1;
        }
    }
}

#[cfg(test)]
mod tests;
