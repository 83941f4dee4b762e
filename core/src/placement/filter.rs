//! The filter step, computed once per round and policy (not per template): what the fleet
//! looks like in name order, what placement remembers of each cluster between rounds, and for
//! every policy which clusters it filters out and why, which tiers hold which clusters, and
//! each cluster's static weight.
//!
//! Per cluster, in this order (the first that applies is the reason):
//! 0. **retiring**: its MemberCluster is being deleted → `Retiring`, whatever the policy
//!    tolerates (the member is let go only once meridian's copies have left it).
//! 1. **failover** (only with `placement.failover.afterSeconds`): Unreachable for at least
//!    that long → `FailedOver`; a cluster once failed over for a policy stays out as
//!    `FailingBack` until it has been `Healthy` without a break for `failbackAfterSeconds`
//!    (a flap — Degraded or Unreachable again, even for less than `afterSeconds` — restarts
//!    the window). Without failover configured an Unreachable cluster keeps its replicas.
//! 2. **NoSchedule** taints the policy does not tolerate.
//! 3. **NoExecute** taints it does not tolerate, or tolerates with `tolerationSeconds` that
//!    have run out since placement first saw the taint (forgotten when the taint goes).
//! 4. **affinity**: with `clusterAffinities`, a cluster in none of them. Placement always
//!    reads the tiers (they are `placement.clusterAffinities`), whatever the traffic mode.
//! 5. **weight 0** under static weights (the first rule containing the cluster gives its
//!    weight; a cluster no rule contains weighs 1).
//!
//! `PreferNoSchedule` taints filter nothing here: they are remembered per cluster and used
//! by the tier step (such clusters are a tier's last resort).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::model::{ClusterId, ClusterSpec, Taint, TaintEffect};
use crate::policy::{Policy, toleration_for};
use crate::registry::Health;
use crate::selector::{ClusterSet, LabelSelector, WeightRule};

use super::{ClusterInput, Division, PlacementFilter, PlacementPolicy, ReplicaScheduling};

/// What placement remembers of one cluster between rounds.
#[derive(Clone, Debug, Default)]
pub(super) struct ClusterMemory {
    /// Since when it has been Healthy without a break, as far as placement saw (failback
    /// counts from here).
    healthy_since: Option<Instant>,
    /// The last round that saw it not Healthy: a recovery reported after it is exact.
    last_unhealthy: Option<Instant>,
    /// Its NoExecute taints and when placement first saw each (tolerationSeconds count from
    /// here).
    no_execute: Vec<(Taint, Instant)>,
}

impl ClusterMemory {
    /// Takes in this round's view of the cluster.
    pub(super) fn observe(&mut self, cluster: &ClusterInput<'_>, now: Instant) {
        let view = cluster.view;
        if view.health == Health::Healthy {
            let recovered = view.recovered_at.filter(|&r| r <= now);
            let start =
                self.healthy_since
                    .unwrap_or_else(|| match (recovered, self.last_unhealthy) {
                        (Some(r), Some(seen)) if r > seen => r,
                        (Some(r), None) => r,
                        _ => now,
                    });
            // A flap between two rounds shows as a later recovery: the window restarts.
            self.healthy_since = Some(recovered.map_or(start, |r| r.max(start)));
        } else {
            self.healthy_since = None;
            self.last_unhealthy = Some(now);
        }
        let old = std::mem::take(&mut self.no_execute);
        self.no_execute = view
            .spec
            .taints
            .iter()
            .filter(|t| t.effect == TaintEffect::NoExecute)
            .map(|t| {
                let seen = old.iter().find(|(o, _)| o == t).map_or(now, |(_, at)| *at);
                (t.clone(), seen)
            })
            .collect();
    }

    fn taint_seen(&self, taint: &Taint) -> Option<Instant> {
        self.no_execute
            .iter()
            .find(|(t, _)| t == taint)
            .map(|(_, at)| *at)
    }
}

/// The round's clusters in name order, with what spread groups them by.
pub(super) struct Fleet<'a> {
    pub clusters: Vec<ClusterInput<'a>>,
    /// Per cluster, its region as an index into the sorted distinct regions (so comparing
    /// ids compares names); None without the label.
    pub regions: Vec<Option<u32>>,
    pub zones: Vec<Option<u32>>,
    /// Per cluster, how many other clusters share its region (0 without one).
    pub region_peers: Vec<usize>,
    /// Per cluster, what placement remembers of it (after this round's observation).
    pub memory: Vec<ClusterMemory>,
    /// The round's clock.
    pub now: Instant,
}

impl<'a> Fleet<'a> {
    /// Sorts `clusters` by name (a second cluster of the same name is ignored) and updates
    /// each one's memory; forgets clusters that are gone.
    pub(super) fn new(
        clusters: &[ClusterInput<'a>],
        memory: &mut HashMap<ClusterId, ClusterMemory>,
        now: Instant,
    ) -> Self {
        let mut sorted: Vec<ClusterInput<'a>> = clusters.to_vec();
        sorted.sort_by(|a, b| a.view.spec.id.cmp(&b.view.spec.id));
        sorted.dedup_by(|a, b| a.view.spec.id == b.view.spec.id);
        memory.retain(|id, _| sorted.binary_search_by(|c| c.view.spec.id.cmp(id)).is_ok());
        let remembered = sorted
            .iter()
            .map(|c| {
                let m = memory.entry(c.view.spec.id.clone()).or_default();
                m.observe(c, now);
                m.clone()
            })
            .collect();
        let regions = intern(&sorted, |c| c.view.spec.locality.region.as_deref());
        let zones = intern(&sorted, |c| c.view.spec.locality.zone.as_deref());
        let region_peers = peers(&regions);
        Self {
            clusters: sorted,
            regions,
            zones,
            region_peers,
            memory: remembered,
            now,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.clusters.len()
    }

    pub(super) fn id(&self, pos: usize) -> &ClusterId {
        &self.clusters[pos].view.spec.id
    }

    /// The position of `id`, if it is in this round.
    pub(super) fn position(&self, id: &ClusterId) -> Option<usize> {
        self.clusters
            .binary_search_by(|c| c.view.spec.id.cmp(id))
            .ok()
    }
}

/// Per cluster, how many others share its (interned) group.
fn peers(groups: &[Option<u32>]) -> Vec<usize> {
    let mut sizes = vec![0usize; groups.len()];
    for g in groups.iter().flatten() {
        sizes[*g as usize] += 1;
    }
    groups
        .iter()
        .map(|g| g.map_or(0, |g| sizes[g as usize] - 1))
        .collect()
}

fn intern<'a>(
    clusters: &[ClusterInput<'a>],
    label: impl Fn(&ClusterInput<'a>) -> Option<&'a str>,
) -> Vec<Option<u32>> {
    let names: BTreeSet<&str> = clusters.iter().filter_map(&label).collect();
    let names: Vec<&str> = names.into_iter().collect();
    clusters
        .iter()
        .map(|c| {
            label(c).map(|l| {
                u32::try_from(names.binary_search(&l).expect("interned")).expect("few labels")
            })
        })
        .collect()
}

/// One cluster as one policy sees it.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct ClusterPlan {
    /// Why the policy filters it out, whatever the template.
    pub filter: Option<PlacementFilter>,
    /// The first tier that contains it (0 without tiers).
    pub first_tier: Option<usize>,
    /// An untolerated PreferNoSchedule taint (its key): the tier's last resort.
    pub prefer_no: Option<String>,
    /// Its static weight (1 unless static weights say otherwise).
    pub weight: u32,
}

/// One tier of a policy: every cluster in it, and those of them not filtered out.
#[derive(Clone, Debug)]
pub(super) struct TierPlan {
    /// None for the one tier of a policy without affinities.
    pub name: Option<Arc<str>>,
    /// Positions of its unfiltered clusters, in name order.
    pub feasible: Vec<usize>,
}

/// A policy, prepared once per round for all the templates it places.
pub(super) struct Plan<'p> {
    pub policy: &'p Policy,
    pub placement: Arc<PlacementPolicy>,
    /// Shared with the next round's plan when nothing it reads changed (see
    /// [`Plan::timeless`]).
    pub clusters: Arc<[ClusterPlan]>,
    pub tiers: Arc<[TierPlan]>,
    /// When one of this plan's filters changes with time alone.
    pub deadline: Option<Instant>,
}

impl<'p> Plan<'p> {
    /// Prepares `policy` for this round; `failed_over` is the policy's memory of clusters it
    /// failed over and has not failed back, updated here.
    pub(super) fn new(
        policy: &'p Policy,
        fleet: &Fleet<'_>,
        failed_over: &mut BTreeSet<ClusterId>,
        now: Instant,
    ) -> Self {
        let placement = policy
            .placement
            .clone()
            .unwrap_or_else(|| Arc::new(PlacementPolicy::default()));
        let affinities = &policy.traffic.affinities;
        let n = fleet.len();
        let members: Vec<Vec<bool>> = if affinities.is_empty() {
            vec![vec![true; n]]
        } else {
            affinities
                .iter()
                .map(|t| {
                    let set = Members::of(&t.clusters);
                    (0..n)
                        .map(|p| set.contains(&fleet.clusters[p].view.spec))
                        .collect()
                })
                .collect()
        };
        let weights = Weights::of(&placement.replicas);
        let mut deadline = None;
        let mut still_failed = BTreeSet::new();
        let clusters: Vec<ClusterPlan> = (0..n)
            .map(|p| {
                let first_tier = members.iter().position(|m| m[p]);
                let mut cp = cluster_plan(policy, &weights, fleet, p, first_tier, now);
                let failover = failover_filter(
                    &placement,
                    &fleet.clusters[p],
                    &fleet.memory[p],
                    failed_over.contains(fleet.id(p)),
                    now,
                );
                if failover.failed_over {
                    still_failed.insert(fleet.id(p).clone());
                }
                deadline = earliest(deadline, failover.deadline);
                deadline = earliest(deadline, cp.1);
                if failover.filter.is_some() {
                    cp.0.filter = failover.filter;
                }
                if fleet.clusters[p].view.spec.retiring {
                    cp.0.filter = Some(PlacementFilter::Retiring);
                }
                cp.0
            })
            .collect();
        *failed_over = still_failed;
        let names: Vec<Option<Arc<str>>> = if affinities.is_empty() {
            vec![None]
        } else {
            affinities
                .iter()
                .map(|t| Some(Arc::clone(&t.name)))
                .collect()
        };
        let tiers = names
            .into_iter()
            .zip(&members)
            .map(|(name, m)| TierPlan {
                name,
                feasible: (0..n)
                    .filter(|&p| m[p] && clusters[p].filter.is_none())
                    .collect(),
            })
            .collect();
        Self {
            policy,
            placement,
            clusters: clusters.into(),
            tiers,
            deadline,
        }
    }

    /// Whether the same policy over the same cluster views makes this plan again until its
    /// deadline: no filter carries a number that changes with time (how long a cluster has
    /// been unreachable, how long until it fails back), and so no failover is remembered.
    pub(super) fn timeless(&self) -> bool {
        !self.clusters.iter().any(|c| {
            matches!(
                c.filter,
                Some(PlacementFilter::FailedOver { .. } | PlacementFilter::FailingBack { .. })
            )
        })
    }
}

/// The taint, affinity and weight part of a cluster's plan, and when a tolerationSeconds
/// runs out.
fn cluster_plan(
    policy: &Policy,
    weights: &Weights<'_>,
    fleet: &Fleet<'_>,
    p: usize,
    first_tier: Option<usize>,
    now: Instant,
) -> (ClusterPlan, Option<Instant>) {
    let spec = &fleet.clusters[p].view.spec;
    let tolerations = &policy.traffic.tolerations;
    let mut deadline = None;
    let mut filter = None;
    let mut prefer_no = None;
    for taint in &spec.taints {
        let tolerated = toleration_for(tolerations, taint);
        let reason = match (taint.effect, tolerated) {
            (TaintEffect::NoSchedule, None) => {
                Some(PlacementFilter::NoScheduleTaint(taint.key.clone()))
            }
            (TaintEffect::NoExecute, None) => {
                Some(PlacementFilter::NoExecuteTaint(taint.key.clone()))
            }
            (TaintEffect::NoExecute, Some(tol)) => {
                let seen = fleet.memory[p].taint_seen(taint).unwrap_or(now);
                match tol.seconds.map(|s| seen + Duration::from_secs(s)) {
                    Some(until) if until <= now => {
                        Some(PlacementFilter::NoExecuteTaint(taint.key.clone()))
                    }
                    Some(until) => {
                        deadline = earliest(deadline, Some(until));
                        None
                    }
                    None => None,
                }
            }
            (TaintEffect::PreferNoSchedule, None) => {
                prefer_no.get_or_insert_with(|| taint.key.clone());
                None
            }
            _ => None,
        };
        if filter.is_none() {
            filter = reason;
        }
    }
    let weight = weights.of_cluster(spec);
    let filter = filter
        .or_else(|| {
            first_tier
                .is_none()
                .then_some(PlacementFilter::NotInAffinities)
        })
        .or_else(|| (weight == 0).then_some(PlacementFilter::WeightZero));
    let plan = ClusterPlan {
        filter,
        first_tier,
        prefer_no,
        weight,
    };
    (plan, deadline)
}

/// A cluster set prepared for a lookup per cluster: its names hashed (a tier may name
/// hundreds of clusters, and a round asks about every cluster of the fleet).
struct Members<'s> {
    names: HashSet<&'s str>,
    selector: Option<&'s LabelSelector>,
}

impl<'s> Members<'s> {
    fn of(set: &'s ClusterSet) -> Self {
        Self {
            names: set.names.iter().map(String::as_str).collect(),
            selector: set.selector.as_ref(),
        }
    }

    fn contains(&self, cluster: &ClusterSpec) -> bool {
        self.names.contains(cluster.id.as_str())
            || self.selector.is_some_and(|s| s.matches(&cluster.labels))
    }
}

/// Static weights prepared the same way: the first rule containing a cluster gives its
/// weight (1 when none does, or the policy divides otherwise).
struct Weights<'s> {
    rules: &'s [WeightRule],
    /// The first rule naming each cluster.
    by_name: HashMap<&'s str, usize>,
}

impl<'s> Weights<'s> {
    fn of(replicas: &'s ReplicaScheduling) -> Self {
        let rules: &[WeightRule] = match replicas {
            ReplicaScheduling::Divided(Division::Weights(rules)) => rules,
            _ => &[],
        };
        let mut by_name = HashMap::new();
        for (i, rule) in rules.iter().enumerate() {
            for name in &rule.clusters.names {
                by_name.entry(name.as_str()).or_insert(i);
            }
        }
        Self { rules, by_name }
    }

    fn of_cluster(&self, cluster: &ClusterSpec) -> u32 {
        let named = self.by_name.get(cluster.id.as_str()).copied();
        let selected = self.rules[..named.unwrap_or(self.rules.len())]
            .iter()
            .position(|r| {
                r.clusters
                    .selector
                    .as_ref()
                    .is_some_and(|s| s.matches(&cluster.labels))
            });
        selected.or(named).map_or(1, |i| self.rules[i].weight)
    }
}

struct Failover {
    filter: Option<PlacementFilter>,
    /// Whether the cluster counts as failed over (or failing back) after this round.
    failed_over: bool,
    deadline: Option<Instant>,
}

/// Step 1 of the filter for one cluster and policy.
fn failover_filter(
    placement: &PlacementPolicy,
    cluster: &ClusterInput<'_>,
    memory: &ClusterMemory,
    was_failed_over: bool,
    now: Instant,
) -> Failover {
    let none = |deadline| Failover {
        filter: None,
        failed_over: false,
        deadline,
    };
    let Some(after) = placement.failover_after_seconds.map(Duration::from_secs) else {
        return none(None);
    };
    let back = Duration::from_secs(placement.failback_after_seconds);
    let failing_back = |remaining: Duration, deadline| Failover {
        filter: Some(PlacementFilter::FailingBack {
            remaining_seconds: ceil_secs(remaining),
        }),
        failed_over: true,
        deadline,
    };
    let view = cluster.view;
    if view.health == Health::Unreachable {
        let since = view.unreachable_since.unwrap_or(now);
        let down = now.saturating_duration_since(since);
        if down >= after {
            return Failover {
                filter: Some(PlacementFilter::FailedOver {
                    unreachable_seconds: down.as_secs(),
                }),
                failed_over: true,
                deadline: None,
            };
        }
        if was_failed_over {
            return failing_back(back, None);
        }
        return none(Some(since + after));
    }
    if !was_failed_over {
        return none(None);
    }
    match memory.healthy_since {
        Some(since) if view.health == Health::Healthy => {
            let done = since + back;
            if done <= now {
                none(None)
            } else {
                failing_back(done - now, Some(done))
            }
        }
        _ => failing_back(back, None),
    }
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

pub(super) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
