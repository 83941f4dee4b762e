//! The scheduling core for traffic: for one service and one client, which clusters
//! receive traffic, in which priority tiers, with which weights, and what each of them resolves
//! to for that client — its own endpoints or its east-west gateway ([`Via`]). DNS, xDS,
//! write-back and explain all read this one result; none of them filters, reorders or
//! deduplicates on its own.
//!
//! ```text
//!  backends ─► filter (withdrawn, NoExecute, outside the policy's tiers, weight 0,
//!                      no ready endpoints, other network w/o gateway or with a client that
//!                      cannot use one)
//!           ─► target (own endpoints, or the gateway for a client on another network)
//!           ─► tier   (Locality: own cluster, same zone, same region, rest — a client in no
//!                      cluster that a geo range places starts at same zone; Tiers: the policy's
//!                      clusterAffinities in order; Weighted: one tier; then clusters still
//!                      failing back, then PreferNoSchedule, then clusters where the
//!                      policy that also places the service's workloads no longer places
//!                      them: a drained copy takes traffic only when nothing else can)
//!           ─► weigh  (the policy's weights, else ready endpoints)
//!           ─► dedup  (an address two clusters report belongs to the one that comes first;
//!                      a cluster left with none is filtered)
//!           ─► spill  (a tier below minHealthyEndpoints merges into the next)
//! ```

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::geo::ClientPlace;
use crate::model::{ClusterId, Endpoint, Locality, TaintEffect};
use crate::policy::{Mode, TrafficPolicy};
use crate::snapshot::{Backend, ClusterView, ServiceView, Snapshot};

/// Why a cluster gets no traffic for a service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", content = "detail")]
pub enum FilterReason {
    /// Unreachable past its withdraw time.
    Withdrawn,
    /// A staged rollout holds it out of the policy's traffic while its copies change.
    Draining,
    /// Carries a `NoExecute` taint the policy does not tolerate.
    NoExecuteTaint(String),
    NoReadyEndpoints,
    /// On another network than the client, without an east-west gateway.
    OtherNetworkNoGateway,
    /// On another network than the client, which cannot use its gateway (a proxyless gRPC
    /// client cannot send the SNI the gateway routes by).
    GatewayUnusable,
    /// Every address it has ready is also reported by this cluster, which comes first.
    DuplicateAddresses(ClusterId),
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
    /// Clusters with a `PreferNoSchedule` taint.
    PreferNoSchedule,
    /// Last: the governing policy places the service's workloads, and not in these clusters
    /// (a copy draining after a failover, a taint or a policy edit).
    NotPlaced,
}

/// What a member of a tier resolves to for the client that asked. `Copy`, so a decision's
/// members stay small and cheap to sort (the rare endpoints left out for duplicate addresses
/// are listed once, in `Selection::shadowed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Via {
    /// The cluster's own endpoints, except those with an address a member earlier in the
    /// decision already answers (`Selection::shadowed`; almost always none).
    Endpoints,
    /// The client sits on another network: the cluster's east-west gateway answers for it.
    Gateway { address: IpAddr, port: u16 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Member {
    /// Index into `ServiceView::backends`.
    pub backend: usize,
    /// Index into `Snapshot::clusters`.
    pub cluster: usize,
    /// Always positive.
    pub weight: u32,
    /// Ready endpoints this member stands for (its gateway's, when reached through it).
    pub ready: u32,
    pub target: Via,
}

impl Member {
    /// Whether the client reaches this cluster through its east-west gateway.
    pub fn via_gateway(&self) -> bool {
        matches!(self.target, Via::Gateway { .. })
    }

    /// The gateway's address and port, when the client goes through it.
    pub fn gateway(&self) -> Option<(IpAddr, u16)> {
        match self.target {
            Via::Gateway { address, port } => Some((address, port)),
            Via::Endpoints => None,
        }
    }
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
    /// `(cluster, address)`, sorted: the addresses of endpoints left out of that cluster's
    /// member because a member earlier in the decision answers them. Empty unless the
    /// service has addresses that several clusters report.
    pub shadowed: Vec<(usize, IpAddr)>,
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
            TierReason::NotPlaced => "not_placed",
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

    /// The member standing for `cluster`, in whichever tier it is.
    pub fn member_of(&self, cluster: usize) -> Option<&Member> {
        self.tiers
            .iter()
            .flat_map(|t| &t.members)
            .find(|m| m.cluster == cluster)
    }

    /// Every endpoint (ready or not) `member` stands for: none through a gateway, else its
    /// backend's, minus the shadowed ones.
    pub fn endpoints_of<'v>(
        &'v self,
        view: &'v ServiceView,
        member: &Member,
    ) -> impl Iterator<Item = &'v Endpoint> + 'v {
        let cluster = member.cluster;
        let start = self.shadowed.partition_point(|(c, _)| *c < cluster);
        let end = self.shadowed.partition_point(|(c, _)| *c <= cluster);
        let shadowed = &self.shadowed[start..end];
        view.backends
            .get(member.backend)
            .filter(|_| !member.via_gateway())
            .into_iter()
            .flat_map(Backend::endpoints)
            .filter(move |e| {
                !e.addresses
                    .iter()
                    .any(|a| shadowed.iter().any(|(_, s)| s == a))
            })
    }

    /// The endpoints of `member` DNS may answer and traffic may use
    /// (`Endpoint::is_answerable`).
    pub fn answerable_of<'v>(
        &'v self,
        view: &'v ServiceView,
        member: &Member,
    ) -> impl Iterator<Item = &'v Endpoint> + 'v {
        let publish_not_ready = view
            .backends
            .get(member.backend)
            .is_some_and(|b| b.publish_not_ready);
        self.endpoints_of(view, member)
            .filter(move |e| e.is_answerable(publish_not_ready))
    }

    /// Why `cluster` gets no traffic, if it does not.
    pub fn filter_reason(&self, cluster: usize) -> Option<&FilterReason> {
        self.filtered
            .iter()
            .find(|f| f.cluster == cluster)
            .map(|f| &f.reason)
    }
}

/// Who asks, as far as the decision depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Client<'a> {
    /// Index into `Snapshot::clusters`, when the client's cluster is known.
    pub cluster: Option<usize>,
    /// None when unknown (no cluster is then behind a gateway), else the client's network
    /// (itself None for the unnamed network).
    pub network: Option<Option<&'a str>>,
    /// Whether the client can reach another network through its east-west gateway: a
    /// proxyless gRPC client cannot send the SNI a gateway routes by.
    pub uses_gateways: bool,
    /// Where a client in no cluster is (a geo range, `crate::geo`): Locality tiers then start
    /// at the clusters of its zone, then of its region. Ignored when `cluster` is known.
    pub locality: Option<&'a Locality>,
}

impl<'a> Client<'a> {
    /// A client in `cluster` (if known), on that cluster's network, that can use gateways.
    pub fn in_cluster(snapshot: &'a Snapshot, cluster: Option<usize>) -> Self {
        Self {
            cluster,
            network: cluster
                .and_then(|c| snapshot.clusters.get(c))
                .map(|c| c.spec.network.as_deref()),
            uses_gateways: true,
            locality: None,
        }
    }

    /// A DNS client where `Snapshot::locate` put it: in a cluster (as [`Client::in_cluster`]),
    /// in a geo locality (no cluster, no network: like an unknown client, but with Locality
    /// tiers from its locality), or unknown.
    pub fn at(snapshot: &'a Snapshot, place: Option<ClientPlace>) -> Self {
        match place {
            Some(ClientPlace::Geo(g)) => Self {
                locality: snapshot.geo.locality(g),
                ..Self::in_cluster(snapshot, None)
            },
            place => Self::in_cluster(snapshot, place.and_then(ClientPlace::cluster)),
        }
    }

    /// The same client, unable to use gateways (proxyless gRPC).
    pub fn without_gateways(self) -> Self {
        Self {
            uses_gateways: false,
            ..self
        }
    }
}

/// Decides where traffic for `service` from a client in `client` (if known) goes; the client
/// is on its cluster's network and can use gateways.
pub fn select(
    snapshot: &Snapshot,
    service: &ServiceView,
    client: Option<usize>,
    now: Instant,
) -> Selection {
    select_for(
        snapshot,
        service,
        &Client::in_cluster(snapshot, client),
        now,
    )
}

/// The decision for any kind of client: [`select`] for a client that names its network itself
/// (an xDS node's `NETWORK`) or cannot use gateways.
pub fn select_for(
    snapshot: &Snapshot,
    service: &ServiceView,
    client: &Client<'_>,
    now: Instant,
) -> Selection {
    let policy = &service.policy;
    let client_view = client.cluster.and_then(|c| snapshot.clusters.get(c));
    // A client outside the fleet placed by a geo range (only when it is in no cluster).
    let geo = client.locality.filter(|_| client_view.is_none());
    let mut selection = Selection::default();
    let reasons = tier_reasons(policy, client_view.is_some(), geo.is_some());
    let workloads = snapshot.workloads_of(policy);
    // (tier index, member): one allocation for the whole decision, sorted into tiers below.
    let mut placed: Vec<(usize, Member)> = Vec::with_capacity(service.backends.len());
    for (i, backend) in service.backends.iter().enumerate() {
        let Some(cluster) = snapshot.clusters.get(backend.cluster) else {
            continue;
        };
        let other_network = client
            .network
            .is_some_and(|n| n != cluster.spec.network.as_deref());
        let affinity = match policy.mode {
            Mode::Tiers => policy
                .affinities
                .iter()
                .position(|t| t.clusters.contains(&cluster.spec)),
            _ => None,
        };
        let weight = policy.weight_of(&cluster.spec);
        let reason =
            filter(cluster, backend.ready, other_network, client, policy, now).or(
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
        let target = match (&cluster.spec.gateway, other_network) {
            (Some(gw), true) => Via::Gateway {
                address: gw.address,
                port: gw.port,
            },
            _ => Via::Endpoints,
        };
        let member = Member {
            backend: i,
            cluster: backend.cluster,
            weight: weight.unwrap_or(backend.ready).max(1),
            ready: backend.ready,
            target,
        };
        let last = reasons.len() - 1;
        let bucket = if workloads.is_some_and(|w| w.binary_search(&backend.cluster).is_err()) {
            last
        } else if prefers_no_schedule(cluster, policy) {
            last - 1
        } else if failing_back(cluster, backend, policy, now) {
            last - 2
        } else {
            match (policy.mode, client.cluster, client_view) {
                (Mode::Tiers, _, _) => affinity.expect("filtered above"),
                (Mode::Weighted, _, _) => 0,
                (Mode::Locality, Some(c), Some(cv)) => {
                    locality_bucket(c, cv, backend.cluster, cluster)
                }
                (Mode::Locality, _, _) => geo.map_or(0, |l| nearness(l, &cluster.spec.locality)),
            }
        };
        placed.push((bucket, member));
    }
    placed.sort_by_key(|(bucket, _)| *bucket);
    if service.has_shared_addresses() {
        resolve_duplicates(snapshot, service, &mut placed, &mut selection);
    }
    spill_into_tiers(
        &mut selection,
        &reasons,
        &placed,
        policy.min_healthy_endpoints,
    );
    ramp_tiers(&mut selection, policy, snapshot);
    selection
}

/// The weights of a tier merged with a ramping one sum to about this much.
const RAMP_SCALE: u128 = 10_000;

/// A staged rollout bringing clusters back (`traffic.ramping`): a cluster takes its percent
/// of the weight it would have. The others of its tier take the rest; when every member of
/// the tier is coming back, the next tier takes it, merged into this one with weights that
/// say so (DNS rotations and EDS locality weights follow them). With no next tier the tier
/// keeps it all: that traffic has nowhere else to go.
fn ramp_tiers(selection: &mut Selection, policy: &TrafficPolicy, snapshot: &Snapshot) {
    if policy.ramping.is_empty() {
        return;
    }
    let percent = |m: &Member| -> u128 {
        let id = &snapshot.clusters[m.cluster].spec.id;
        policy
            .ramping
            .get(id)
            .map_or(100, |p| u128::from((*p).clamp(1, 100)))
    };
    let mut i = 0;
    while i < selection.tiers.len() {
        let tier = &selection.tiers[i];
        // In weight × percent.
        let whole: u128 = tier
            .members
            .iter()
            .map(|m| u128::from(m.weight) * 100)
            .sum();
        let kept: u128 = tier
            .members
            .iter()
            .map(|m| u128::from(m.weight) * percent(m))
            .sum();
        if kept == whole {
            i += 1;
            continue;
        }
        // The others of the tier take the rest; with none, the next tier, merged into this one.
        let merge = tier.members.iter().all(|m| percent(m) < 100);
        if merge && i + 1 == selection.tiers.len() {
            break;
        }
        let next = merge.then(|| selection.tiers.remove(i + 1));
        let tier = &mut selection.tiers[i];
        for m in &mut tier.members {
            m.weight = ramp_weight(u128::from(m.weight) * percent(m), whole);
        }
        if let Some(next) = next {
            let next_whole: u128 = next.members.iter().map(|m| u128::from(m.weight)).sum();
            for mut m in next.members {
                m.weight = ramp_weight((whole - kept) * u128::from(m.weight), whole * next_whole);
                tier.members.push(m);
            }
            tier.reasons.extend(next.reasons);
            tier.ready += next.ready;
        }
        by_weight(&mut tier.members);
        i += 1;
    }
}

/// Heaviest first, then in cluster order: the order a tier lists its members in.
fn by_weight(members: &mut [Member]) {
    members.sort_by(|a, b| b.weight.cmp(&a.weight).then(a.cluster.cmp(&b.cluster)));
}

/// `part / whole` of [`RAMP_SCALE`], at least 1 (a member is never weighed out).
fn ramp_weight(part: u128, whole: u128) -> u32 {
    let w = (part * RAMP_SCALE + whole / 2) / whole.max(1);
    u32::try_from(w.max(1)).unwrap_or(u32::MAX)
}

/// An address two clusters report is answered once, by the member that comes first (tier,
/// then weight, then cluster order): later members lose those endpoints (ready first, then
/// the rest), and a member left without ready endpoints is filtered. Gateways shared by two
/// clusters are answered once the same way. Runs only for services where the snapshot saw
/// such an overlap.
fn resolve_duplicates(
    snapshot: &Snapshot,
    service: &ServiceView,
    placed: &mut Vec<(usize, Member)>,
    selection: &mut Selection,
) {
    let mut owner: HashMap<IpAddr, usize> = HashMap::new();
    let mut gateways: HashMap<(IpAddr, u16), usize> = HashMap::new();
    let mut lost_to: Vec<Option<usize>> = vec![None; placed.len()];
    // The order members claim addresses in: the order of the decision (placed is sorted by
    // tier only; inside a tier, heavier first, then cluster order, as the tiers list them).
    let mut order: Vec<usize> = (0..placed.len()).collect();
    order.sort_by(|&a, &b| {
        let ((ta, ma), (tb, mb)) = (&placed[a], &placed[b]);
        ta.cmp(tb)
            .then(mb.weight.cmp(&ma.weight))
            .then(ma.cluster.cmp(&mb.cluster))
    });
    for ready_pass in [true, false] {
        for &slot in &order {
            let member = &mut placed[slot].1;
            let backend = &service.backends[member.backend];
            let cluster = member.cluster;
            if let Via::Gateway { address, port } = member.target {
                let first = *gateways.entry((address, port)).or_insert(cluster);
                if ready_pass && first != cluster {
                    lost_to[slot] = Some(first);
                    member.ready = 0;
                }
                continue;
            }
            for ep in backend.endpoints() {
                if ep.is_answerable(backend.publish_not_ready) != ready_pass
                    || !ep.addresses.iter().any(|a| service.is_shared_address(a))
                {
                    continue;
                }
                let taken = ep
                    .addresses
                    .iter()
                    .find_map(|a| owner.get(a).copied().filter(|&c| c != cluster));
                if let Some(other) = taken {
                    let shadowed = ep.addresses.iter().map(|a| (cluster, *a));
                    selection.shadowed.extend(shadowed);
                    if ready_pass {
                        member.ready -= 1;
                        lost_to[slot].get_or_insert(other);
                    }
                } else {
                    owner.extend(ep.addresses.iter().map(|a| (*a, cluster)));
                }
            }
        }
    }
    selection.shadowed.sort_unstable();
    let mut slot = 0;
    placed.retain_mut(|(_, member)| {
        let lost = lost_to[slot];
        slot += 1;
        match (member.ready, lost.and_then(|c| snapshot.clusters.get(c))) {
            (0, Some(by)) => {
                selection.filtered.push(Filtered {
                    cluster: member.cluster,
                    reason: FilterReason::DuplicateAddresses(by.spec.id.clone()),
                });
                false
            }
            (ready, Some(_)) => {
                let spec = &snapshot.clusters[member.cluster].spec;
                if service.policy.weight_of(spec).is_none() {
                    member.weight = ready.max(1);
                }
                true
            }
            _ => true,
        }
    });
}

/// The tiers a member can land in, in priority order; the last three are always
/// FailingBack, PreferNoSchedule and NotPlaced.
fn tier_reasons(policy: &TrafficPolicy, client_known: bool, geo: bool) -> Vec<TierReason> {
    let mut reasons: Vec<TierReason> = match policy.mode {
        Mode::Locality if client_known => vec![
            TierReason::ClientCluster,
            TierReason::SameZone,
            TierReason::SameRegion,
            TierReason::Remote,
        ],
        // A geo client has no cluster of its own: its locality's tiers only.
        Mode::Locality if geo => vec![
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
    reasons.push(TierReason::NotPlaced);
    reasons
}

/// Failback: a cluster that came back (from Unreachable, or to having ready
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
    other_network: bool,
    client: &Client<'_>,
    policy: &TrafficPolicy,
    now: Instant,
) -> Option<FilterReason> {
    if is_withdrawn(cluster, policy, now) {
        return Some(FilterReason::Withdrawn);
    }
    if policy.drained.contains(&cluster.spec.id) {
        return Some(FilterReason::Draining);
    }
    if let Some(taint) = cluster
        .spec
        .taints
        .iter()
        .find(|t| t.effect == TaintEffect::NoExecute && !policy.tolerates(t))
    {
        return Some(FilterReason::NoExecuteTaint(taint.key.clone()));
    }
    if ready == 0 {
        return Some(FilterReason::NoReadyEndpoints);
    }
    if other_network && cluster.spec.gateway.is_none() {
        return Some(FilterReason::OtherNetworkNoGateway);
    }
    if other_network && !client.uses_gateways {
        return Some(FilterReason::GatewayUnusable);
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
        .any(|t| t.effect == TaintEffect::PreferNoSchedule && !policy.tolerates(t))
}

fn locality_bucket(client: usize, cv: &ClusterView, idx: usize, cluster: &ClusterView) -> usize {
    if idx == client {
        0
    } else {
        1 + nearness(&cv.spec.locality, &cluster.spec.locality)
    }
}

/// How near `theirs` is to `mine`: 0 same zone, 1 same region, 2 the rest. One rule for a
/// cluster client's locality and a geo client's.
fn nearness(mine: &Locality, theirs: &Locality) -> usize {
    if mine.zone.is_some() && mine.zone == theirs.zone {
        0
    } else if mine.region.is_some() && mine.region == theirs.region {
        1
    } else {
        2
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
        tier.members.extend(run.iter().map(|(_, m)| *m));
        if tier.ready >= min_healthy || is_last {
            let mut tier = pending.take().expect("pending tier");
            by_weight(&mut tier.members);
            selection.tiers.push(tier);
        } else {
            selection.spills += 1;
        }
    }
}

#[cfg(test)]
mod tests;
