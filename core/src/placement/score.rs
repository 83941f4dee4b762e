//! The score step: after the filter, every candidate cluster of a template gets a score in
//! [0, 100] from each plugin its policy weighs, and one combined score (the weighted mean, in
//! hundredths, so 0..=10000) that orders the clusters of a tier.
//!
//! Built-in plugins (pure, from the round's inputs):
//! - `ResourceBalance`: 100 × the share of CPU and memory left free once one more replica is
//!   placed (requests over allocatable, from Nodes and Pods) and — with ResourceQuotas in the
//!   template's namespace — of the tightest quota's CPU and memory, averaged. No capacity: no
//!   score.
//! - `Cost`: the hourly price of one replica — its CPU and memory requests at the cluster's
//!   `cpuCoreHour` and `memoryGiBHour`, spot capacity (`spotRatio`) counted at
//!   [`SPOT_PRICE_SHARE`] of that — plus egress: `egressGiB` × the template's
//!   `meridian.io/egress-gib-hour` (default [`DEFAULT_EGRESS_GIB_HOUR`]) × the share of the
//!   fleet's other clusters outside the candidate's region (their clients' traffic crosses
//!   regions to reach it). The cheapest candidate scores 100, the dearest 0, linearly between;
//!   a cluster without `spec.cost` has no score.
//! - `DataLocality`: clusters holding the data (`placement.dataLocality`: names, a label
//!   selector, or a template annotation listing cluster names and `region=`/`zone=` entries)
//!   100, the same region as one of them 50, the rest 0. Data location unknown: no score.
//! - `WorkloadAffinity`: the preferred `workloadAffinity` / `workloadAntiAffinity` terms: each
//!   term's weight counts for (affinity) or against (anti-affinity) a cluster whose topology
//!   domain (cluster, region, zone) runs a matching template; normalised to [0, 100] over the
//!   terms' weights, 50 when no term applies either way.
//! - `ClusterAffinity`: `preferredClusterAffinities`: the share of their weights whose cluster
//!   set contains the cluster.
//! - `TaintToleration`: 0 with a `PreferNoSchedule` taint the policy does not tolerate, else
//!   100 (such clusters stay a tier's last resort as well, whatever the weights).
//! - `Webhook`, `Script`: the scores a program gave ([`Programs`]); a program may also filter.
//!
//! A plugin with no score for a cluster (no data) counts as [`NEUTRAL`] for it, so missing data
//! neither wins nor loses a cluster its place. With no `scoring` list, every plugin the policy
//! configures weighs 1 (DataLocality with `dataLocality`, WorkloadAffinity with preferred terms,
//! ClusterAffinity with preferred affinities, Webhook with webhooks, Script with a script) and
//! ResourceBalance, Cost and TaintToleration weigh 0: they read fleet-wide data, and a policy
//! that asks for nothing keeps the order it had.
//!
//! Scores order, never overrule: they pick the groups `maxGroups` keeps (the unscored order —
//! free replicas, static weights — decides among equal scores, and alone when every candidate
//! scores the same), the clusters Aggregated fills first (after those already holding replicas,
//! so it stays steady), and break division ties (before the per-object name order). A score is
//! never room: capacity checks count free replicas. Required workload terms and the programs'
//! filter verdicts filter ([`super::PlacementFilter`]), on a scale-down too; the plugins score
//! the candidates the filters left (Cost's cheapest is the cheapest of those).

use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use crate::model::{ClusterId, TaintEffect};
use crate::policy::toleration_for;

use super::ClusterInput;
pub use super::spec::{
    DataLocality, FailurePolicy, Plugin, PreferredAffinity, Program, Scoring, Script, Webhook,
    WorkloadTerm,
};
use super::spec::{Resources, SpreadBy, Template, TemplateKey};

/// What a plugin without data for a cluster counts as.
pub const NEUTRAL: u32 = 50;
/// The share of the on-demand price spot capacity costs (spot is typically 60–90 % cheaper).
pub const SPOT_PRICE_SHARE: f64 = 0.3;
/// The egress a replica is assumed to send per hour without `meridian.io/egress-gib-hour`.
pub const DEFAULT_EGRESS_GIB_HOUR: f64 = 0.0;
/// The template annotation giving a replica's egress in GiB per hour.
pub const EGRESS_ANNOTATION: &str = "meridian.io/egress-gib-hour";

/// A program's answer for one candidate.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// Some(reason): the program filters the cluster out.
    pub rejected: Option<String>,
    /// Its score, in [0, 100]; None: the program gave none.
    pub score: Option<u32>,
}

/// What a program answered for one decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "answer", content = "detail", rename_all = "snake_case")]
pub enum Judgement {
    /// One verdict per candidate, in the candidates' order.
    Answered(Vec<Verdict>),
    /// Asked, not answered yet (a webhook call in flight): the template waits, keeping its last
    /// placement, and is decided again when the answer comes.
    Pending,
    /// The program failed: a script's error (with its line), a webhook's timeout or malformed
    /// answer.
    Failed(String),
}

/// Runs the programs of policies: scripts and scoring webhooks live outside the pure core
/// (meridian-script, the webhook client in meridian-controllers); the decision asks them for
/// their verdicts on the candidates it has left after filtering.
pub trait Programs: Send + Sync + fmt::Debug {
    fn judge(
        &self,
        program: &Program,
        template: &Template,
        candidates: &[ClusterInput<'_>],
    ) -> Judgement;
}

/// The [`Programs`] a fleet (and every snapshot, for what-ifs) runs; none by default.
#[derive(Clone, Debug)]
pub struct Runner(pub Arc<dyn Programs>);

impl Default for Runner {
    fn default() -> Self {
        Self(Arc::new(NoPrograms))
    }
}

/// No programs can run (e.g. an offline render): every program fails with that reason.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoPrograms;

impl Programs for NoPrograms {
    fn judge(&self, program: &Program, _: &Template, _: &[ClusterInput<'_>]) -> Judgement {
        Judgement::Failed(format!("no {} runner in this process", program.plugin()))
    }
}

/// One plugin's part of a cluster's score.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PluginScore {
    pub plugin: Plugin,
    pub weight: u32,
    /// None: no data for this cluster (counted as [`NEUTRAL`]).
    pub score: Option<u32>,
}

/// A candidate's scores, for explain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClusterScore {
    pub cluster: ClusterId,
    /// The weighted mean in hundredths of a point (0..=10000).
    pub total: u32,
    pub plugins: Vec<PluginScore>,
}

/// What a program said for one decision, for explain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProgramReport {
    pub program: String,
    pub judgement: Judgement,
}

/// A decision's scoring, for explain: every candidate best first, and what each program
/// answered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Scores {
    /// The best [`REPORTED`] candidates, best first (every decision of a large fleet keeps
    /// this, so it is bounded).
    pub order: Vec<ClusterScore>,
    /// How many candidates were scored in all.
    pub candidates: usize,
    pub programs: Vec<ProgramReport>,
}

/// How many of a decision's scored candidates its report keeps.
pub const REPORTED: usize = 32;

/// Where other workloads run, for workload (anti-)affinity: per term (in the policy's order),
/// the topology domains (indexed by domain id) where a workload it selects runs.
#[derive(Default)]
pub(super) struct Neighbours {
    affinity: Vec<Vec<bool>>,
    anti_affinity: Vec<Vec<bool>>,
}

/// Everything the built-in plugins read of the fleet, per cluster position.
pub(super) struct Facts<'f> {
    pub clusters: &'f [ClusterInput<'f>],
    pub regions: &'f [Option<u32>],
    pub zones: &'f [Option<u32>],
    /// Per cluster, how many other clusters share its region (0 without one).
    pub region_peers: &'f [usize],
}

impl Facts<'_> {
    fn domain(&self, by: SpreadBy, p: usize) -> Option<u32> {
        match by {
            SpreadBy::Cluster => u32::try_from(p).ok(),
            SpreadBy::Region => self.regions[p],
            SpreadBy::Zone => self.zones[p],
        }
    }
}

/// The plugins' scores of `candidates` (positions) for template `t`: per plugin with a
/// weight, one score per candidate.
pub(super) fn builtin(
    scoring: &Scoring,
    tolerations: &[crate::policy::Toleration],
    facts: &Facts<'_>,
    t: &Template,
    candidates: &[usize],
    neighbours: &Neighbours,
) -> Vec<(Plugin, Vec<Option<u32>>)> {
    let mut out = Vec::new();
    for plugin in Plugin::ALL {
        if scoring.weight(plugin) == 0 {
            continue;
        }
        let scores = match plugin {
            Plugin::ResourceBalance => candidates
                .iter()
                .map(|&p| {
                    resource_balance(facts.clusters[p].capacity, &t.key.namespace, &t.requests)
                })
                .collect(),
            Plugin::Cost => cost(facts, t, candidates),
            Plugin::DataLocality => match &scoring.data_locality {
                Some(d) => data_locality(d, facts, t, candidates),
                None => vec![None; candidates.len()],
            },
            Plugin::WorkloadAffinity => candidates
                .iter()
                .map(|&p| workload_preference(scoring, facts, p, neighbours))
                .collect(),
            Plugin::ClusterAffinity => candidates
                .iter()
                .map(|&p| preferred_affinity(&scoring.preferred_affinities, facts, p))
                .collect(),
            Plugin::TaintToleration => candidates
                .iter()
                .map(|&p| Some(taint_toleration(tolerations, &facts.clusters[p])))
                .collect(),
            // Filled in from the programs' verdicts.
            Plugin::Webhook | Plugin::Script => continue,
        };
        out.push((plugin, scores));
    }
    out
}

/// The weighted mean of `parts` in hundredths (missing scores count as [`NEUTRAL`]).
pub(super) fn combine(parts: &[PluginScore]) -> u32 {
    let total: u64 = parts.iter().map(|s| u64::from(s.weight)).sum();
    if total == 0 {
        return 0;
    }
    let sum: u64 = parts
        .iter()
        .map(|s| u64::from(s.weight) * u64::from(s.score.unwrap_or(NEUTRAL).min(100)) * 100)
        .sum();
    u32::try_from(sum / total).unwrap_or(10_000)
}

/// The free share of CPU and memory after one more replica, of the cluster and of the
/// namespace's quotas, in points.
pub fn resource_balance(
    capacity: Option<&super::Capacity>,
    namespace: &str,
    per: &Resources,
) -> Option<u32> {
    let c = capacity?;
    let mut shares = Vec::with_capacity(4);
    shares.extend(free_share(
        c.allocatable.cpu_millis,
        c.requested.cpu_millis,
        per.cpu_millis,
    ));
    shares.extend(free_share(
        c.allocatable.memory_bytes,
        c.requested.memory_bytes,
        per.memory_bytes,
    ));
    if let Some(quotas) = c.quotas.get(namespace) {
        // Every quota of the namespace binds: the tightest one counts, per resource.
        let tightest = |share: fn(&super::Quota, &Resources) -> Option<f64>| {
            quotas
                .iter()
                .filter_map(|q| share(q, per))
                .min_by(f64::total_cmp)
        };
        shares.extend(tightest(|q, per| {
            free_share(q.hard.cpu_millis, q.used.cpu_millis, per.cpu_millis)
        }));
        shares.extend(tightest(|q, per| {
            free_share(q.hard.memory_bytes, q.used.memory_bytes, per.memory_bytes)
        }));
    }
    if shares.is_empty() {
        return None;
    }
    let mean = shares.iter().sum::<f64>() / shares.len() as f64;
    Some(to_points(mean))
}

/// The share of `total` left once `used` and `want` are taken (None: `total` is 0, nothing
/// to share).
fn free_share(total: u64, used: u64, want: u64) -> Option<f64> {
    (total > 0).then(|| total.saturating_sub(used.saturating_add(want)) as f64 / total as f64)
}

fn to_points(share: f64) -> u32 {
    (share.clamp(0.0, 1.0) * 100.0).round() as u32
}

/// One replica's hourly price in `cluster`, in the cost's currency; None without a cost.
pub fn hourly_price(
    facts_cost: Option<&crate::model::Cost>,
    per: &Resources,
    egress_gib_hour: f64,
    remote_share: f64,
) -> Option<f64> {
    let cost = facts_cost?;
    let cores = per.cpu_millis as f64 / 1000.0;
    let gib = per.memory_bytes as f64 / f64::from(1u32 << 30);
    let compute = cores * cost.cpu_core_hour() + gib * cost.memory_gib_hour();
    let compute = compute * (1.0 - cost.spot_ratio() * (1.0 - SPOT_PRICE_SHARE));
    Some(compute + cost.egress_gib() * egress_gib_hour * remote_share)
}

fn cost(facts: &Facts<'_>, t: &Template, candidates: &[usize]) -> Vec<Option<u32>> {
    let egress = annotation(t, EGRESS_ANNOTATION)
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
        .unwrap_or(DEFAULT_EGRESS_GIB_HOUR);
    let others = facts.clusters.len().saturating_sub(1);
    let prices: Vec<Option<f64>> = candidates
        .iter()
        .map(|&p| {
            let share = if others == 0 {
                0.0
            } else {
                (others - facts.region_peers[p]) as f64 / others as f64
            };
            hourly_price(
                facts.clusters[p].view.spec.cost.as_ref(),
                &t.requests,
                egress,
                share,
            )
        })
        .collect();
    relative_cheapness(&prices)
}

/// The cheapest 100, the dearest 0, linear between; all equal: 100.
pub fn relative_cheapness(prices: &[Option<f64>]) -> Vec<Option<u32>> {
    let known = prices.iter().flatten().copied();
    let (lo, hi) = known.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
        (lo.min(p), hi.max(p))
    });
    prices
        .iter()
        .map(|p| {
            p.map(|p| {
                if hi - lo <= f64::EPSILON {
                    100
                } else {
                    to_points((hi - p) / (hi - lo))
                }
            })
        })
        .collect()
}

fn annotation<'t>(t: &'t Template, key: &str) -> Option<&'t str> {
    t.body
        .get("metadata")?
        .get("annotations")?
        .get(key)?
        .as_str()
}

fn data_locality(
    d: &DataLocality,
    facts: &Facts<'_>,
    t: &Template,
    candidates: &[usize],
) -> Vec<Option<u32>> {
    let listed: Option<Vec<&str>> = d
        .from_annotation
        .as_deref()
        .and_then(|key| annotation(t, key))
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect()
        });
    let by_annotation = |p: usize| -> bool {
        let spec = &facts.clusters[p].view.spec;
        listed.as_ref().is_some_and(|entries| {
            entries.iter().any(|e| match e.split_once('=') {
                Some(("region", r)) => spec.locality.region.as_deref() == Some(r),
                Some(("zone", z)) => spec.locality.zone.as_deref() == Some(z),
                _ => *e == spec.id.as_str(),
            })
        })
    };
    let n = facts.clusters.len();
    let holds: Vec<bool> = (0..n)
        .map(|p| {
            let spec = &facts.clusters[p].view.spec;
            d.cluster_names.iter().any(|c| c == spec.id.as_str())
                || d.selector.as_ref().is_some_and(|s| s.matches(&spec.labels))
                || by_annotation(p)
        })
        .collect();
    if !holds.iter().any(|h| *h) {
        return vec![None; candidates.len()];
    }
    // Region ids are interned below the cluster count.
    let mut held_regions = vec![false; n];
    for (p, _) in holds.iter().enumerate().filter(|(_, h)| **h) {
        if let Some(r) = facts.regions[p] {
            held_regions[r as usize] = true;
        }
    }
    candidates
        .iter()
        .map(|&p| {
            let near = facts.regions[p].is_some_and(|r| held_regions[r as usize]);
            Some(match (holds[p], near) {
                (true, _) => 100,
                (false, true) => 50,
                (false, false) => 0,
            })
        })
        .collect()
}

/// Whether cluster `p`'s domain by `term` holds a workload the term selects.
fn term_met(term: &WorkloadTerm, occupied: &[bool], facts: &Facts<'_>, p: usize) -> bool {
    facts
        .domain(term.topology, p)
        .is_some_and(|d| occupied.get(d as usize).copied().unwrap_or(false))
}

/// The first required term cluster `p` breaks, as a filter reason.
pub(super) fn required_unmet(
    scoring: &Scoring,
    facts: &Facts<'_>,
    p: usize,
    neighbours: &Neighbours,
) -> Option<super::PlacementFilter> {
    let affinity = &scoring.workload_affinity;
    let anti = &scoring.workload_anti_affinity;
    if let Some(term) = first_required(affinity, &neighbours.affinity, facts, p, false) {
        return Some(super::PlacementFilter::WorkloadAffinity { term });
    }
    first_required(anti, &neighbours.anti_affinity, facts, p, true)
        .map(|term| super::PlacementFilter::WorkloadAntiAffinity { term })
}

/// The index of the first required term whose being met at `p` is `met`.
fn first_required(
    terms: &[WorkloadTerm],
    occupied: &[Vec<bool>],
    facts: &Facts<'_>,
    p: usize,
    met: bool,
) -> Option<usize> {
    terms
        .iter()
        .zip(occupied)
        .position(|(t, o)| t.preferred.is_none() && term_met(t, o, facts, p) == met)
}

fn workload_preference(
    scoring: &Scoring,
    facts: &Facts<'_>,
    p: usize,
    neighbours: &Neighbours,
) -> Option<u32> {
    let mut total = 0i64;
    let mut net = 0i64;
    for (terms, occupied, sign) in [
        (&scoring.workload_affinity, &neighbours.affinity, 1i64),
        (
            &scoring.workload_anti_affinity,
            &neighbours.anti_affinity,
            -1i64,
        ),
    ] {
        for (term, occupied) in terms.iter().zip(occupied) {
            let Some(w) = term.preferred else { continue };
            total += i64::from(w);
            if term_met(term, occupied, facts, p) {
                net += sign * i64::from(w);
            }
        }
    }
    if total == 0 {
        return None;
    }
    // net in [-total, total] → [0, 100], 50 when nothing applies.
    Some(u32::try_from((net + total) * 50 / total).unwrap_or(0))
}

fn preferred_affinity(terms: &[PreferredAffinity], facts: &Facts<'_>, p: usize) -> Option<u32> {
    let total: u64 = terms.iter().map(|t| u64::from(t.weight)).sum();
    if total == 0 {
        return None;
    }
    let spec = &facts.clusters[p].view.spec;
    let met: u64 = terms
        .iter()
        .filter(|t| t.clusters.contains(spec))
        .map(|t| u64::from(t.weight))
        .sum();
    u32::try_from(met * 100 / total).ok()
}

fn taint_toleration(tolerations: &[crate::policy::Toleration], c: &ClusterInput<'_>) -> u32 {
    let untolerated = c.view.spec.taints.iter().any(|t| {
        t.effect == TaintEffect::PreferNoSchedule && toleration_for(tolerations, t).is_none()
    });
    if untolerated { 0 } else { 100 }
}

/// For each of `scoring`'s workload terms, the domains where a workload it selects runs: the
/// other templates with replicas of `t`'s namespace, placed where `placed` says.
pub(super) fn neighbours(
    scoring: &Scoring,
    t: &TemplateKey,
    templates: &[Template],
    facts: &Facts<'_>,
    placed: impl Fn(&TemplateKey) -> Option<Vec<usize>>,
) -> Neighbours {
    let others: Vec<&Template> = templates
        .iter()
        .filter(|o| o.key != *t && o.key.namespace == t.namespace && o.replicas.is_some())
        .collect();
    let occupied = |term: &WorkloadTerm| {
        let mut seen = vec![false; facts.clusters.len()];
        for o in others.iter().filter(|o| term.selector.matches(&o.labels)) {
            for q in placed(&o.key).unwrap_or_default() {
                if let Some(d) = facts.domain(term.topology, q) {
                    seen[d as usize] = true;
                }
            }
        }
        seen
    };
    Neighbours {
        affinity: scoring.workload_affinity.iter().map(occupied).collect(),
        anti_affinity: scoring
            .workload_anti_affinity
            .iter()
            .map(occupied)
            .collect(),
    }
}
