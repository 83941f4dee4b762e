//! Placement: the scheduling core for workloads. For every resource template a
//! ClusterSchedulingPolicy selects, which member clusters run it and with how many replicas —
//! decided from the same cluster view, label selectors, affinity tiers and tolerations that
//! steer its traffic ([`crate::select`]).
//!
//! ```text
//!  templates, policies, cluster views (health, taints), capacities, previous decisions, now
//!    ─► filter  (failed over: Unreachable past placement.failover.afterSeconds, or failing
//!                back; NoSchedule / NoExecute taints not tolerated, NoExecute past its
//!                tolerationSeconds; outside every affinity tier; no free capacity)
//!    ─► tier    (the first clusterAffinities tier with feasible clusters — and, dividing by
//!                capacity, enough of it; the next feasible tier keeps the standby replicas)
//!    ─► spread  (spreadByField cluster | region | zone, minGroups ≤ groups ≤ maxGroups)
//!    ─► divide  (Duplicated; Divided by static weights: Webster/Sainte-Laguë; by available
//!                capacity, steady; Aggregated: as few clusters as fit)
//!    ─► overrides (which OverridePolicy rules apply per cluster, in the order they apply;
//!                meridian-federation applies them to the template's JSON)
//!  dependencies (ConfigMaps, Secrets, ServiceAccounts, PVCs a placed pod template names)
//!    follow the clusters of the workloads that name them, unless a policy places them.
//! ```
//!
//! Where each step lives: `filter` (once per round and policy: the filter of every cluster,
//! tier membership, static weights, the failover and tolerationSeconds clocks), `decide`
//! (per template: tiers with PreferNoSchedule as a tier's last resort, standby, assembling
//! placed/excluded, overrides, dependencies), `spread`, `divide` (Webster with caps, steady
//! capacity division, Aggregated). Each module's `//!` states the rules it decides.
//!
//! Pure and deterministic: the same input and the same `now` give the same decisions. The
//! memory a decision needs across calls (the previous split, when a taint was first seen,
//! which clusters were failed over) is kept by [`Placer`], never read from a clock.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::model::{ClusterId, ObjectKey};
use crate::policy::Policy;
use crate::snapshot::view::ClusterView;

/// Maps keyed by template: a round looks each template up several times, and SipHash over
/// a key's four strings was a tenth of a round at 10,000 templates. Keyed per process, as
/// SipHash is.
pub(crate) type KeyMap<V> = std::collections::HashMap<TemplateKey, V, ahash::RandomState>;

mod changed;
mod decide;
mod divide;
mod filter;
mod rollout;
pub mod room;
pub mod score;
mod selection;
pub mod spec;
mod spread;
pub mod stages;
#[cfg(test)]
mod tests;

pub use decide::{Placer, decide, override_rules};
pub use rollout::{Drain, Held, Rollout, Step, Write};
pub use score::{
    ClusterScore, DataLocality, FailurePolicy, Judgement, NoPrograms, Plugin, PluginScore,
    PreferredAffinity, Program, ProgramReport, Programs, Runner, Scores, Scoring, Script, Verdict,
    Webhook, WorkloadTerm,
};
pub use selection::Conflict;
pub use spec::*;

/// Rounds in a row the fleet places by itself, with nothing changed, while a round is not
/// [`Placements::settled`]: decisions that keep moving wait for the next change instead of
/// spinning.
pub const SETTLING_ROUNDS: u8 = 3;

/// What decides placement besides its inputs: what earlier rounds remembered (failover
/// clocks, previous splits) and the programs it asks. The fleet keeps its own; a what-if
/// decides again from a copy of it, given beside the snapshot it imagines from (a snapshot
/// carries decisions, not the decider).
#[derive(Clone, Debug, Default)]
pub struct Decider {
    pub placer: Arc<Placer>,
    pub programs: Runner,
}

/// One cluster's state, as placement sees it: the traffic decision's cluster view (health,
/// taints, failover clocks) and the cluster's capacity, when known.
#[derive(Clone, Copy, Debug)]
pub struct ClusterInput<'a> {
    pub view: &'a ClusterView,
    pub capacity: Option<&'a Capacity>,
}

/// Everything one round of placement decides from.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    pub templates: &'a [Template],
    /// Oldest first: the oldest policy selecting a template places it.
    pub policies: &'a [Policy],
    pub overrides: &'a [OverridePolicy],
    pub clusters: &'a [ClusterInput<'a>],
    /// Runs the policies' scripts and scoring webhooks.
    pub programs: &'a dyn Programs,
}

/// Why a cluster runs no copy of a template.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", content = "detail")]
pub enum PlacementFilter {
    /// Its MemberCluster is being deleted.
    Retiring,
    /// Unreachable for longer than `placement.failover.afterSeconds`.
    FailedOver { unreachable_seconds: u64 },
    /// Healthy again after a failover, but not yet for `failbackAfterSeconds`.
    FailingBack { remaining_seconds: u64 },
    /// A `NoSchedule` taint the policy does not tolerate (key).
    NoScheduleTaint(String),
    /// A `NoExecute` taint the policy does not tolerate, or tolerated for less time than it
    /// has been there (key).
    NoExecuteTaint(String),
    /// In none of the policy's `clusterAffinities`.
    NotInAffinities,
    /// In a later tier than the one used (its name).
    LaterTier(Arc<str>),
    /// Dividing by capacity, and no replica of the template fits.
    NoCapacity,
    /// Capacity is needed and the cluster reports none.
    CapacityUnknown,
    /// Left out by a spread constraint's `maxGroups`.
    SpreadMaxGroups,
    /// Breaks required `workloadAffinity` term `term` (index): no matching workload runs in
    /// its topology domain.
    WorkloadAffinity { term: usize },
    /// Breaks required `workloadAntiAffinity` term `term`: a matching workload runs in its
    /// topology domain.
    WorkloadAntiAffinity { term: usize },
    /// A program's filter verdict.
    Rejected { program: String, reason: String },
    /// The static weights give it 0.
    WeightZero,
    /// A `PreferNoSchedule` taint the policy does not tolerate (key), and the tier's other
    /// clusters sufficed: such clusters are a tier's last resort.
    PreferNoScheduleTaint(String),
    /// A spread constraint groups by this field and the cluster has no such label.
    NoSpreadLabel(SpreadBy),
    /// In a tier (None: the one tier of a policy without affinities) that could not take the
    /// template, and why (no feasible cluster, too little capacity, too few spread groups).
    TierUnusable {
        tier: Option<Arc<str>>,
        /// Shared by every cluster of the tier.
        why: Arc<str>,
    },
    /// Feasible, but given no replica: fewer replicas than clusters, Aggregated did not need
    /// it, or a scale-down by capacity kept to the clusters already running the template.
    NoReplicas,
    /// A replica-less template follows its policy's workloads, and none runs here.
    WorkloadsElsewhere,
}

/// Why a placed cluster holds what it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", content = "detail")]
pub enum PlacedReason {
    /// The object has no replicas: a whole copy.
    Whole,
    /// Duplicated: every cluster runs `spec.replicas`.
    Duplicated,
    /// Its static weight.
    Weight(u32),
    /// Its free replicas when divided by available capacity.
    Capacity { free: u64 },
    /// Aggregated: one of the fewest clusters that fit.
    Aggregated { free: u64 },
    /// Keeps the standby replicas in the tier after the one running.
    Standby,
    /// A dependency of these placed workloads.
    Dependency(Vec<TemplateKey>),
    /// A replica-less template of the policy, where these workloads of the policy (same
    /// namespace) were placed.
    Follows(Vec<TemplateKey>),
}

/// One cluster a template is placed in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Placed {
    pub cluster: ClusterId,
    /// None for an object placed whole.
    pub replicas: Option<u32>,
    pub reason: PlacedReason,
    /// The override rules that apply here, in the order they apply: `(policy, rule index)`.
    pub overrides: Vec<(ObjectKey, usize)>,
}

impl Placed {
    /// A stable digest of what the override rules that apply here change (None: no rule
    /// applies). A copy carries it, so an edit of an OverridePolicy that changes what a
    /// member receives is told apart from one that changes nothing there — the copy's
    /// revision is its template generation and this digest.
    pub fn overrides_digest(&self, policies: &[OverridePolicy]) -> Option<u64> {
        if self.overrides.is_empty() {
            return None;
        }
        let mut hash = divide::Fnv::new();
        for (key, index) in &self.overrides {
            let rule = policies
                .iter()
                .find(|p| &p.key == key)
                .and_then(|p| p.rules.get(*index));
            // Serializing a plain struct cannot fail; an unknown rule hashes as its name
            // (the render refuses it anyway).
            let changes = rule.and_then(|r| serde_json::to_vec(&r.overriders).ok());
            hash = hash
                .str(&key.to_string())
                .bytes(changes.as_deref().unwrap_or_default())
                .bytes(&[0]);
        }
        Some(hash.finish())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Excluded {
    pub cluster: ClusterId,
    pub reason: PlacementFilter,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Outcome {
    Scheduled,
    /// Nowhere to run it; `reason` carries the numbers (free replicas per cluster, groups).
    Unschedulable {
        reason: String,
    },
}

/// The decision for one template.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub template: TemplateKey,
    /// The ClusterSchedulingPolicy that placed it; None for a dependency following workloads.
    pub policy: Option<ObjectKey>,
    pub outcome: Outcome,
    /// The `clusterAffinities` tier used; None without tiers.
    pub tier: Option<Arc<str>>,
    /// The tier holding the standby replicas, when the policy keeps some.
    pub standby_tier: Option<Arc<str>>,
    /// Placed clusters in name order.
    pub placed: Vec<Placed>,
    /// The clusters left out, in name order, and why. The decisions of one policy mostly
    /// leave out the same clusters for the same reasons: those hold one list (at 1,000
    /// members × 10,000 templates, a list each was 1 GiB).
    pub excluded: Arc<[Excluded]>,
    /// How the candidates scored (a policy that scores or runs programs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scores: Option<Box<Scores>>,
}

impl Placements {
    /// How the copies of a decision reach the members: its policy's settings (a dependency,
    /// placed by no policy, takes the defaults).
    pub fn propagation_of(&self, decision: &Decision) -> Propagation {
        decision
            .policy
            .as_ref()
            .and_then(|p| self.propagation.get(p))
            .cloned()
            .unwrap_or_default()
    }

    /// Something placed in `cluster` lives in `namespace` (so the namespace must stay).
    pub fn places_in(&self, cluster: &ClusterId, namespace: &str) -> bool {
        self.decisions
            .values()
            .any(|d| *d.template.namespace == *namespace && d.replicas_in(cluster).is_some())
    }
}

impl Decision {
    pub fn replicas_in(&self, cluster: &ClusterId) -> Option<&Placed> {
        self.placed.iter().find(|p| &p.cluster == cluster)
    }

    pub fn is_scheduled(&self) -> bool {
        matches!(self.outcome, Outcome::Scheduled)
    }
    /// The workloads a replica-less template follows (none: it is placed on its own).
    pub fn follows(&self) -> Vec<&TemplateKey> {
        let mut leaders: Vec<&TemplateKey> = self
            .placed
            .iter()
            .filter_map(|p| match &p.reason {
                PlacedReason::Follows(of) => Some(of),
                _ => None,
            })
            .flatten()
            .collect();
        leaders.sort();
        leaders.dedup();
        leaders
    }
}

/// Every decision of one round, by template, and when a decision changes with time alone
/// (a failover, failback or tolerationSeconds window ends).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Placements {
    /// Shared with the last round's where nothing changed (the same `Arc`).
    pub decisions: BTreeMap<TemplateKey, Arc<Decision>>,
    /// The propagation settings of every policy that placed something this round.
    pub propagation: BTreeMap<ObjectKey, Propagation>,
    #[serde(skip)]
    pub next_deadline: Option<Instant>,
    /// How many templates this round decided (the others kept the last round's decision).
    #[serde(skip)]
    pub decided: usize,
    /// Whether a round with no change would decide nothing: false while a decision just made
    /// moved replicas others read (their room, where workloads run) or changed its own memory.
    /// The fleet then places once more at once, so the decisions settle now rather than at
    /// the next change.
    #[serde(skip)]
    pub settled: bool,
}
