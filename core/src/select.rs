//! The scheduling core for traffic (DESIGN §3): for one service and one client cluster, which
//! clusters receive traffic, in which priority tiers, with which weights. DNS and xDS both call
//! [`select`]; neither reorders clusters on its own.
//!
//! ```text
//!  backends ─► filter (withdrawn, NoExecute, outside the policy's tiers, weight 0,
//!                      no ready endpoints, other network w/o gateway)
//!           ─► tier   (Locality: own cluster, same zone, same region, rest; Tiers: the policy's
//!                      clusterAffinities in order; Weighted: one tier; then clusters still
//!                      failing back, then PreferNoSchedule)
//!           ─► weigh  (the policy's weights, else ready endpoints)
//!           ─► spill  (a tier below minHealthyEndpoints merges into the next)
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::model::TaintEffect;
use crate::policy::{AffinityTier, WeightRule};
use crate::snapshot::{Backend, ClusterView, ServiceView, Snapshot};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum Mode {
    /// The client's cluster, then the same zone, then the same region, then the rest.
    #[default]
    Locality,
    /// The policy's `clusterAffinities`, in order; clusters in none get no traffic.
    Tiers,
    /// One tier of every cluster, split by the policy's weights.
    Weighted,
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
    /// The ClusterSchedulingPolicy (`namespace/name`) this comes from; None for the default.
    pub source: Option<String>,
    pub mode: Mode,
    /// `placement.clusterAffinities`: the tiers of `Mode::Tiers`.
    pub affinities: Vec<AffinityTier>,
    /// `traffic.weights`: the first rule containing a cluster gives its weight (0: no traffic).
    pub weights: Vec<WeightRule>,
    /// A tier with fewer ready endpoints than this merges into the next one.
    pub min_healthy_endpoints: u32,
    /// Overrides the cluster's `withdrawAfterSeconds`.
    pub withdraw_after_seconds: Option<u64>,
    /// A cluster that recovered (came back from Unreachable, or got ready endpoints again)
    /// takes its place again only after this long; until then it sits in a last tier.
    pub failback_after_seconds: u64,
    pub tolerations: Vec<Toleration>,
    pub ttl: Option<u32>,
    pub max_answers: Option<u32>,
}

impl Default for TrafficPolicy {
    fn default() -> Self {
        Self {
            source: None,
            mode: Mode::Locality,
            affinities: Vec::new(),
            weights: Vec::new(),
            min_healthy_endpoints: 1,
            withdraw_after_seconds: None,
            failback_after_seconds: 0,
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

    /// The weight a rule gives this cluster, if any rule contains it.
    fn weight_of(&self, cluster: &ClusterView) -> Option<u32> {
        self.weights
            .iter()
            .find(|w| w.clusters.contains(&cluster.spec))
            .map(|w| w.weight)
    }

    /// Whether this policy's decisions change with time alone (withdraw overrides and
    /// failback windows), so that results computed earlier cannot be reused as they are.
    pub fn depends_on_time(&self) -> bool {
        self.withdraw_after_seconds.is_some() || self.failback_after_seconds > 0
    }

    /// When a cluster that recovered at `at` is used again.
    pub fn failback_done(&self, at: Instant) -> Instant {
        at + Duration::from_secs(self.failback_after_seconds)
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
    /// In none of the policy's `clusterAffinities` (mode Tiers).
    NotInAffinities,
    /// The policy gives it weight 0.
    WeightZero,
}

/// Why a tier holds the clusters it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum TierReason {
    ClientCluster,
    SameZone,
    SameRegion,
    Remote,
    /// The client's cluster is unknown: every cluster in one tier.
    Everyone,
    /// One of the policy's `clusterAffinities`, by name.
    Affinity(Arc<str>),
    /// Mode Weighted: every cluster.
    Weighted,
    /// Clusters that recovered less than `failbackAfterSeconds` ago.
    FailingBack,
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

impl TierReason {
    /// A short, bounded label (metrics): affinity tiers are not told apart by name.
    pub fn label(&self) -> &'static str {
        match self {
            TierReason::ClientCluster => "client_cluster",
            TierReason::SameZone => "same_zone",
            TierReason::SameRegion => "same_region",
            TierReason::Remote => "remote",
            TierReason::Everyone => "everyone",
            TierReason::Affinity(_) => "affinity",
            TierReason::Weighted => "weighted",
            TierReason::FailingBack => "failing_back",
            TierReason::PreferNoSchedule => "prefer_no_schedule",
        }
    }
}

impl Selection {
    /// Where traffic goes first, as a metrics label ("none" when nowhere).
    pub fn first_tier_label(&self) -> &'static str {
        self.tiers
            .first()
            .and_then(|t| t.reasons.first())
            .map_or("none", TierReason::label)
    }

    /// Clusters held back in a FailingBack tier.
    pub fn failing_back(&self) -> usize {
        self.tiers
            .iter()
            .filter(|t| t.reasons.contains(&TierReason::FailingBack))
            .map(|t| t.members.len())
            .sum()
    }
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
    let reasons = tier_reasons(policy, client_view.is_some());
    // (tier index, member): one allocation for the whole decision, sorted into tiers below.
    let mut placed: Vec<(usize, Member)> = Vec::with_capacity(service.backends.len());
    for (i, backend) in service.backends.iter().enumerate() {
        let Some(cluster) = snapshot.clusters.get(backend.cluster) else {
            continue;
        };
        let via_gateway = network.is_some_and(|n| n != cluster.spec.network.as_deref());
        let affinity = match policy.mode {
            Mode::Tiers => policy
                .affinities
                .iter()
                .position(|t| t.clusters.contains(&cluster.spec)),
            _ => None,
        };
        let weight = policy.weight_of(cluster);
        let reason = filter(cluster, backend.ready, via_gateway, policy, now).or(
            match (policy.mode, affinity, weight) {
                (Mode::Tiers, None, _) => Some(FilterReason::NotInAffinities),
                (_, _, Some(0)) => Some(FilterReason::WeightZero),
                _ => None,
            },
        );
        if let Some(reason) = reason {
            selection.filtered.push(Filtered {
                cluster: backend.cluster,
                reason,
            });
            continue;
        }
        let member = Member {
            backend: i,
            cluster: backend.cluster,
            weight: weight.unwrap_or(backend.ready).max(1),
            ready: backend.ready,
            via_gateway,
        };
        let last = reasons.len() - 1;
        let bucket = if prefers_no_schedule(cluster, policy) {
            last
        } else if failing_back(cluster, backend, policy, now) {
            last - 1
        } else {
            match (policy.mode, client, client_view) {
                (Mode::Tiers, _, _) => affinity.expect("filtered above"),
                (Mode::Weighted, _, _) => 0,
                (Mode::Locality, Some(c), Some(cv)) => {
                    locality_bucket(c, cv, backend.cluster, cluster)
                }
                (Mode::Locality, _, _) => 0,
            }
        };
        placed.push((bucket, member));
    }
    placed.sort_by_key(|(bucket, _)| *bucket);
    spill_into_tiers(
        &mut selection,
        &reasons,
        &placed,
        policy.min_healthy_endpoints,
    );
    selection
}

/// The tiers a member can land in, in priority order; the last two are always FailingBack
/// and PreferNoSchedule.
fn tier_reasons(policy: &TrafficPolicy, client_known: bool) -> Vec<TierReason> {
    let mut reasons: Vec<TierReason> = match policy.mode {
        Mode::Locality if client_known => vec![
            TierReason::ClientCluster,
            TierReason::SameZone,
            TierReason::SameRegion,
            TierReason::Remote,
        ],
        Mode::Locality => vec![TierReason::Everyone],
        Mode::Tiers => policy
            .affinities
            .iter()
            .map(|t| TierReason::Affinity(Arc::clone(&t.name)))
            .collect(),
        Mode::Weighted => vec![TierReason::Weighted],
    };
    reasons.push(TierReason::FailingBack);
    reasons.push(TierReason::PreferNoSchedule);
    reasons
}

/// DESIGN §3 failback: a cluster that came back (from Unreachable, or to having ready
/// endpoints) waits `failbackAfterSeconds` before it takes its tier again.
fn failing_back(
    cluster: &ClusterView,
    backend: &Backend,
    policy: &TrafficPolicy,
    now: Instant,
) -> bool {
    policy.failback_after_seconds > 0
        && [cluster.recovered_at, backend.recovered_at]
            .into_iter()
            .flatten()
            .any(|at| now < policy.failback_done(at))
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
    reasons: &[TierReason],
    placed: &[(usize, Member)],
    min_healthy: u32,
) {
    let mut pending: Option<Tier> = None;
    let mut runs = placed.chunk_by(|a, b| a.0 == b.0).peekable();
    while let Some(run) = runs.next() {
        let is_last = runs.peek().is_none();
        let tier = pending.get_or_insert_with(|| Tier {
            reasons: Vec::with_capacity(1),
            members: Vec::with_capacity(run.len()),
            ready: 0,
        });
        tier.reasons.push(reasons[run[0].0].clone());
        tier.ready += run.iter().map(|(_, m)| m.ready).sum::<u32>();
        tier.members.extend(run.iter().map(|(_, m)| m.clone()));
        if tier.ready >= min_healthy || is_last {
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
