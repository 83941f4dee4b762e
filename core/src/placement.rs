//! Placement: the scheduling core for workloads (DESIGN §9). For every resource template a
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
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::model::{ClusterId, ObjectKey};
use crate::policy::{ClusterSet, LabelSelector, Policy, WeightRule};
use crate::snapshot::ClusterView;

mod decide;
mod divide;
mod filter;
mod rollout;
pub mod room;
pub mod score;
mod spread;
#[cfg(test)]
mod tests;

pub use decide::{Placer, decide};
pub use rollout::{Drain, Held, Rollout, Step, Write};
pub use score::{
    ClusterScore, DataLocality, FailurePolicy, Judgement, NoPrograms, Plugin, PluginScore,
    PreferredAffinity, Program, ProgramReport, Programs, Runner, Scores, Scoring, Script, Verdict,
    Webhook, WorkloadTerm,
};

/// A template's identity; displayed as `<apiVersion>/<Kind>/<namespace>/<name>` (the
/// `meridian.io/template` annotation of what is rendered from it).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateKey {
    pub api_version: Arc<str>,
    pub kind: Arc<str>,
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

impl TemplateKey {
    pub fn new(api_version: &str, kind: &str, namespace: &str, name: &str) -> Self {
        Self {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The API group (`""` for the core group of `v1`).
    pub fn group(&self) -> &str {
        self.api_version.rsplit_once('/').map_or("", |(g, _)| g)
    }

    pub fn object_key(&self) -> ObjectKey {
        ObjectKey {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

impl fmt::Display for TemplateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.api_version, self.kind, self.namespace, self.name
        )
    }
}

impl fmt::Debug for TemplateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Amounts of the resources placement divides by. A pod's requests, or a cluster's
/// allocatable and requested sums.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    /// `nvidia.com/gpu`.
    pub gpus: u64,
    pub pods: u64,
}

impl Resources {
    pub fn saturating_sub(self, other: Resources) -> Resources {
        Resources {
            cpu_millis: self.cpu_millis.saturating_sub(other.cpu_millis),
            memory_bytes: self.memory_bytes.saturating_sub(other.memory_bytes),
            gpus: self.gpus.saturating_sub(other.gpus),
            pods: self.pods.saturating_sub(other.pods),
        }
    }

    /// `n` pods' worth of these requests.
    pub fn times(self, n: u64) -> Resources {
        Resources {
            cpu_millis: self.cpu_millis.saturating_mul(n),
            memory_bytes: self.memory_bytes.saturating_mul(n),
            gpus: self.gpus.saturating_mul(n),
            pods: self.pods.saturating_mul(n),
        }
    }

    pub fn saturating_add(self, other: Resources) -> Resources {
        Resources {
            cpu_millis: self.cpu_millis.saturating_add(other.cpu_millis),
            memory_bytes: self.memory_bytes.saturating_add(other.memory_bytes),
            gpus: self.gpus.saturating_add(other.gpus),
            pods: self.pods.saturating_add(other.pods),
        }
    }
}

/// What a cluster can still run: its Nodes' allocatable, and the requests of the pods bound
/// to them (in all, and per workload they belong to); and how much of their ResourceQuotas
/// each namespace uses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Capacity {
    pub allocatable: Resources,
    pub requested: Resources,
    /// The part of `requested` each workload's pods hold (a pod's controlling Deployment,
    /// StatefulSet, ReplicaSet, Job or DaemonSet): a template's own pods would be replaced,
    /// not added, so they count as room for it. Shared until one changes.
    #[serde(
        skip_serializing_if = "BTreeMap::is_empty",
        serialize_with = "workloads_as_list"
    )]
    pub workloads: Arc<BTreeMap<Workload, Resources>>,
    /// ResourceQuotas by namespace (every quota of a namespace binds); shared until one changes.
    pub quotas: Arc<BTreeMap<String, Vec<Quota>>>,
}

/// The workload a pod belongs to: its namespace and its controller's kind and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Workload {
    pub namespace: Arc<str>,
    pub kind: Arc<str>,
    pub name: Arc<str>,
}

impl Workload {
    /// The workload a template's copies are (its pods' controller in the member).
    pub fn of(t: &TemplateKey) -> Self {
        Self {
            namespace: t.namespace.clone(),
            kind: t.kind.clone(),
            name: t.name.clone(),
        }
    }
}

fn workloads_as_list<S: serde::Serializer>(
    workloads: &Arc<BTreeMap<Workload, Resources>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Entry<'a> {
        #[serde(flatten)]
        workload: &'a Workload,
        requests: &'a Resources,
    }
    s.collect_seq(
        workloads
            .iter()
            .map(|(workload, requests)| Entry { workload, requests }),
    )
}

/// One ResourceQuota: what it allows (`hard`) and what is used. CPU and memory are the
/// quota's `requests.cpu` / `cpu` and `requests.memory` / `memory`; 0 in `hard`: not limited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Quota {
    pub hard: Resources,
    pub used: Resources,
}

impl Capacity {
    /// How many more replicas requesting `per` (each one pod) fit: the smallest over the
    /// resources `per` asks for, and over pods.
    pub fn free_replicas(&self, per: &Resources) -> u64 {
        replicas_in(self.allocatable.saturating_sub(self.requested), per)
    }

    /// The requests `workload`'s pods hold here (none when it runs no pod here).
    pub fn held_by(&self, workload: &Workload) -> Resources {
        self.workloads.get(workload).copied().unwrap_or_default()
    }

    /// How many replicas of `workload` requesting `per` fit in all (DESIGN §14): the Nodes'
    /// allocatable, less the requests of every pod there but the workload's own (they would
    /// be replaced, not added), less `assumed` (replicas of other workloads decided and not
    /// yet running as pods). A replica decided for `workload` itself is never room.
    pub fn room_for(&self, workload: &Workload, per: &Resources, assumed: Resources) -> u64 {
        let others = self.requested.saturating_sub(self.held_by(workload));
        let free = self
            .allocatable
            .saturating_sub(others)
            .saturating_sub(assumed);
        replicas_in(free, per)
    }
}

/// How many pods requesting `per` fit in `free`: the smallest over the resources `per` asks
/// for, and over pods.
fn replicas_in(free: Resources, per: &Resources) -> u64 {
    let fits = |free: u64, want: u64| free.checked_div(want).unwrap_or(u64::MAX);
    fits(free.cpu_millis, per.cpu_millis)
        .min(fits(free.memory_bytes, per.memory_bytes))
        .min(fits(free.gpus, per.gpus))
        .min(fits(free.pods, per.pods.max(1)))
}

/// A resource template: a namespaced hub object placed into member clusters, summarised by
/// meridian-federation from its JSON (which travels along, untouched, in `body`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Template {
    pub key: TemplateKey,
    pub labels: BTreeMap<String, String>,
    /// `metadata.generation` (0 when the hub does not set one, as in a directory).
    pub generation: i64,
    /// The replica count of a kind that carries one (Deployment, StatefulSet, ReplicaSet:
    /// `spec.replicas`; Job: `spec.parallelism`); None: the object is placed whole.
    pub replicas: Option<u32>,
    /// What one replica's pod requests (pods = 1 for a workload).
    pub requests: Resources,
    /// ConfigMaps, Secrets, ServiceAccounts and PVCs its pod template names.
    pub dependencies: Vec<TemplateKey>,
    /// The object as the hub holds it.
    #[serde(skip)]
    pub body: Arc<serde_json::Value>,
}

/// One of a policy's `resourceSelectors` for templates: every field given must match.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateSelector {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub name: Option<String>,
    pub selector: Option<LabelSelector>,
}

impl TemplateSelector {
    pub fn matches(&self, t: &Template) -> bool {
        self.api_version
            .as_deref()
            .is_none_or(|v| v == &*t.key.api_version)
            && self.kind.as_deref().is_none_or(|k| k == &*t.key.kind)
            && self.name.as_deref().is_none_or(|n| n == &*t.key.name)
            && self.selector.as_ref().is_none_or(|s| s.matches(&t.labels))
    }

    /// How specific the selector is, for OverridePolicy precedence: by name, by labels, all.
    pub fn specificity(&self) -> Specificity {
        if self.name.is_some() {
            Specificity::Name
        } else if self.selector.is_some() {
            Specificity::LabelSelector
        } else {
            Specificity::All
        }
    }
}

/// Ordered least to most specific: the more specific override is applied last and wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Specificity {
    All,
    LabelSelector,
    Name,
}

/// `placement.spreadConstraints[].spreadByField`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum SpreadBy {
    Cluster,
    /// `topology.kubernetes.io/region` of the cluster.
    Region,
    /// `topology.kubernetes.io/zone` of the cluster.
    Zone,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpreadConstraint {
    pub by: SpreadBy,
    pub min_groups: u32,
    pub max_groups: Option<u32>,
}

/// How `Divided` shares the replicas out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Division {
    /// Static weights: the first rule containing a cluster gives its weight (none: 1;
    /// weight 0 takes none), divided by Webster/Sainte-Laguë.
    Weights(Vec<WeightRule>),
    /// In proportion to each cluster's free replicas, steady on scale-up and scale-down.
    AvailableCapacity,
    /// As few clusters as fit, the roomiest first.
    Aggregated,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum ReplicaScheduling {
    /// Every selected cluster runs `spec.replicas`.
    Duplicated,
    Divided(Division),
}

/// The placement part of a ClusterSchedulingPolicy. Its tiers and tolerations are the
/// traffic part's (`TrafficPolicy::affinities`, `tolerations`): one list each, read by both.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacementPolicy {
    pub spread: Vec<SpreadConstraint>,
    pub replicas: ReplicaScheduling,
    /// `replicaScheduling.standby.replicas`: kept warm in the next feasible tier while the
    /// first one runs; that tier takes the full count when it takes over.
    pub standby: Option<u32>,
    /// `placement.failover.afterSeconds`: an Unreachable cluster is dropped after this long
    /// (None: never; it keeps its replicas).
    pub failover_after_seconds: Option<u64>,
    /// A cluster failed over is placed again once Healthy for this long.
    pub failback_after_seconds: u64,
    /// How what placement decided reaches the members (DESIGN §10).
    pub propagation: Propagation,
    /// How candidates are scored and what else filters them (workload terms, programs).
    pub scoring: Scoring,
}

impl Default for PlacementPolicy {
    fn default() -> Self {
        Self {
            spread: Vec::new(),
            replicas: ReplicaScheduling::Duplicated,
            standby: None,
            failover_after_seconds: None,
            failback_after_seconds: 0,
            propagation: Propagation::default(),
            scoring: Scoring::default(),
        }
    }
}

/// `conflictResolution`: an object in a member that meridian did not create.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum ConflictResolution {
    /// Left alone; the template gets a `Conflict` condition naming the cluster.
    #[default]
    Abort,
    /// Adopted: applied over, labelled as meridian's.
    Overwrite,
}

/// `failover.purgeMode`: when the copy in a cluster placement dropped is deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum PurgeMode {
    /// Once the copies that replace it are ready, or `gracePeriodSeconds` passed.
    #[default]
    Graceful,
    /// At once.
    Immediately,
    /// Never: the old copy stays, no longer updated.
    Never,
}

/// The propagation settings of a policy that places templates.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Propagation {
    pub conflict_resolution: ConflictResolution,
    pub purge_mode: PurgeMode,
    /// The longest a dropped copy (or a shrinking one) waits for its replacement to be ready.
    pub grace_period_seconds: u64,
    /// Deleting (or unselecting) a template leaves what meridian placed in the members.
    pub preserve_on_deletion: bool,
    /// JSON pointers the member owns once the object exists there (besides `/spec/replicas`
    /// of a workload an HPA in the member scales).
    pub retain: Vec<String>,
}

impl Default for Propagation {
    fn default() -> Self {
        Self {
            conflict_resolution: ConflictResolution::Abort,
            purge_mode: PurgeMode::Graceful,
            grace_period_seconds: 600,
            preserve_on_deletion: false,
            retain: Vec::new(),
        }
    }
}

/// An OverridePolicy (namespaced): per-cluster changes to the templates it selects.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OverridePolicy {
    pub key: ObjectKey,
    pub selectors: Vec<TemplateSelector>,
    pub rules: Vec<OverrideRule>,
}

impl OverridePolicy {
    /// How specifically this policy selects `t` (None: it does not).
    pub fn selects(&self, t: &Template) -> Option<Specificity> {
        if *t.key.namespace != *self.key.namespace {
            return None;
        }
        self.selectors
            .iter()
            .filter(|s| s.matches(t))
            .map(TemplateSelector::specificity)
            .max()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OverrideRule {
    /// None: every cluster.
    pub targets: Option<ClusterSet>,
    pub overriders: Overriders,
}

/// What one rule changes, applied in this field order.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Overriders {
    pub image: Vec<ImageOverrider>,
    pub command: Vec<ArgsOverrider>,
    pub args: Vec<ArgsOverrider>,
    pub env: Vec<EnvOverrider>,
    pub labels: Vec<MapOverrider>,
    pub annotations: Vec<MapOverrider>,
    pub json_patch: Vec<JsonPatch>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ImageComponent {
    Registry,
    Repository,
    Tag,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum OverrideOperator {
    Add,
    Remove,
    Replace,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageOverrider {
    /// None or empty: every container.
    pub container_names: Vec<String>,
    pub component: ImageComponent,
    pub operator: OverrideOperator,
    pub value: String,
}

/// `command` and `args`: add appends, remove drops every listed value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ArgsOverrider {
    pub container_name: String,
    pub operator: OverrideOperator,
    pub values: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvOverrider {
    pub container_name: String,
    pub operator: OverrideOperator,
    pub name: String,
    pub value: Option<String>,
}

/// `labels` and `annotations`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MapOverrider {
    pub operator: OverrideOperator,
    pub values: BTreeMap<String, String>,
}

/// One RFC 6902 operation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JsonPatch {
    /// add, remove, replace, move, copy, test.
    pub op: String,
    pub path: String,
    pub from: Option<String>,
    pub value: Option<serde_json::Value>,
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
    /// The clusters left out, in name order, and why.
    pub excluded: Vec<Excluded>,
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
    pub decisions: BTreeMap<TemplateKey, Decision>,
    /// The propagation settings of every policy that placed something this round.
    pub propagation: BTreeMap<ObjectKey, Propagation>,
    #[serde(skip)]
    pub next_deadline: Option<Instant>,
}
