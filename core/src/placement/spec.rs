//! What placement is asked to do: templates and their keys, resources and capacity, the
//! placement part of a ClusterSchedulingPolicy, propagation settings and OverridePolicies.
//! Plain data, below the policy and the snapshot that carry it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use crate::model::ObjectKey;
use crate::selector::{ClusterSet, LabelSelector, WeightRule};

// ---- scoring: which plugins weigh, and the programs a policy runs ----

/// One scoring plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Plugin {
    ResourceBalance,
    Cost,
    DataLocality,
    WorkloadAffinity,
    ClusterAffinity,
    TaintToleration,
    Webhook,
    Script,
}

impl Plugin {
    pub const ALL: [Plugin; 8] = [
        Plugin::ResourceBalance,
        Plugin::Cost,
        Plugin::DataLocality,
        Plugin::WorkloadAffinity,
        Plugin::ClusterAffinity,
        Plugin::TaintToleration,
        Plugin::Webhook,
        Plugin::Script,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Plugin::ResourceBalance => "ResourceBalance",
            Plugin::Cost => "Cost",
            Plugin::DataLocality => "DataLocality",
            Plugin::WorkloadAffinity => "WorkloadAffinity",
            Plugin::ClusterAffinity => "ClusterAffinity",
            Plugin::TaintToleration => "TaintToleration",
            Plugin::Webhook => "Webhook",
            Plugin::Script => "Script",
        }
    }

    pub fn parse(name: &str) -> Option<Plugin> {
        Plugin::ALL.into_iter().find(|p| p.name() == name)
    }
}

impl fmt::Display for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a template's data is (`placement.dataLocality`); any of the three may be given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DataLocality {
    pub cluster_names: Vec<String>,
    pub selector: Option<LabelSelector>,
    /// A template annotation (e.g. `meridian.io/data-location`) whose value lists cluster
    /// names, `region=<r>` and `zone=<z>`, comma-separated.
    pub from_annotation: Option<String>,
}

/// One `workloadAffinity` / `workloadAntiAffinity` term: templates of the policy's namespace
/// whose labels `selector` matches, compared by `topology`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WorkloadTerm {
    pub selector: LabelSelector,
    pub topology: SpreadBy,
    /// Required terms filter; preferred ones (`Some(weight)`) score.
    pub preferred: Option<u32>,
}

/// One of `preferredClusterAffinities`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PreferredAffinity {
    pub clusters: ClusterSet,
    pub weight: u32,
}

/// What a webhook's failure (timeout, refused, malformed or out-of-range answer) does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub enum FailurePolicy {
    /// Decided by the other scores, as if the webhook were not there.
    #[default]
    Ignore,
    /// The template is unschedulable with the reason (and keeps its last placement).
    Fail,
}

/// One of `placement.webhooks`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Webhook {
    pub url: String,
    /// PEM; None: the system roots.
    #[serde(skip)]
    pub ca_bundle: Option<String>,
    pub timeout_millis: u64,
    pub failure_policy: FailurePolicy,
}

/// `placement.script`: a Lua chunk defining `filter(cluster, workload)` and/or
/// `score(cluster, workload)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Script {
    pub lua: Arc<str>,
}

/// A program a policy runs for each decision, outside the pure core ([`Programs`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Program {
    Webhook(Arc<Webhook>),
    Script(Arc<Script>),
}

impl Program {
    pub fn plugin(&self) -> Plugin {
        match self {
            Program::Webhook(_) => Plugin::Webhook,
            Program::Script(_) => Plugin::Script,
        }
    }
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Program::Webhook(w) => write!(f, "webhook {}", w.url),
            Program::Script(_) => f.write_str("script"),
        }
    }
}

/// A policy's scoring: the weights and what the plugins read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Scoring {
    /// `placement.scoring[]`, as given; empty: the defaults ([`Scoring::weight`]).
    pub weights: Vec<(Plugin, u32)>,
    pub data_locality: Option<DataLocality>,
    pub workload_affinity: Vec<WorkloadTerm>,
    pub workload_anti_affinity: Vec<WorkloadTerm>,
    pub preferred_affinities: Vec<PreferredAffinity>,
    pub webhooks: Vec<Arc<Webhook>>,
    pub script: Option<Arc<Script>>,
}

impl Scoring {
    /// The weight of `plugin`: as listed, else the default (module docs).
    pub fn weight(&self, plugin: Plugin) -> u32 {
        if !self.weights.is_empty() {
            return self
                .weights
                .iter()
                .find(|(p, _)| *p == plugin)
                .map_or(0, |(_, w)| *w);
        }
        let configured = match plugin {
            Plugin::ResourceBalance | Plugin::Cost | Plugin::TaintToleration => false,
            Plugin::DataLocality => self.data_locality.is_some(),
            Plugin::WorkloadAffinity => self
                .workload_affinity
                .iter()
                .chain(&self.workload_anti_affinity)
                .any(|t| t.preferred.is_some()),
            Plugin::ClusterAffinity => !self.preferred_affinities.is_empty(),
            Plugin::Webhook => !self.webhooks.is_empty(),
            Plugin::Script => self.script.is_some(),
        };
        u32::from(configured)
    }

    /// Whether any plugin weighs anything: without, the decision is the unscored one.
    pub fn scores(&self) -> bool {
        Plugin::ALL.into_iter().any(|p| self.weight(p) > 0)
    }

    /// The programs to ask, in the order they run: the webhooks as listed, then the script.
    pub fn programs(&self) -> Vec<Program> {
        self.webhooks
            .iter()
            .cloned()
            .map(Program::Webhook)
            .chain(self.script.iter().cloned().map(Program::Script))
            .collect()
    }

    /// Whether the decision needs to know where other templates run.
    pub fn reads_workloads(&self) -> bool {
        !self.workload_affinity.is_empty() || !self.workload_anti_affinity.is_empty()
    }
}

// ---- templates, capacity, placement and overrides ----

/// A template's identity; displayed as `<apiVersion>/<Kind>/<namespace>/<name>` (the
/// `meridian.io/template` annotation of what is rendered from it).
///
/// One shared allocation with its hash worked out once: a placement round looks up, clones
/// and compares every template's key several times, and four strings to hash and four
/// reference counts to touch per key were most of a round at 10,000 templates.
#[derive(Clone)]
pub struct TemplateKey(Arc<KeyParts>);

/// The parts of a [`TemplateKey`] (read through it: `key.name`).
#[derive(PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyParts {
    pub api_version: Arc<str>,
    pub kind: Arc<str>,
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    /// The parts hashed with this process's keys (last: it orders nothing).
    #[serde(skip)]
    hash: u64,
}

impl std::ops::Deref for TemplateKey {
    type Target = KeyParts;
    fn deref(&self) -> &KeyParts {
        &self.0
    }
}

impl PartialEq for TemplateKey {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || *self.0 == *other.0
    }
}

impl Eq for TemplateKey {}

impl PartialOrd for TemplateKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TemplateKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        if Arc::ptr_eq(&self.0, &other.0) {
            return std::cmp::Ordering::Equal;
        }
        self.0.cmp(&other.0)
    }
}

impl std::hash::Hash for TemplateKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.hash);
    }
}

impl Serialize for TemplateKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl TemplateKey {
    pub fn new(api_version: &str, kind: &str, namespace: &str, name: &str) -> Self {
        Self::of(
            api_version.into(),
            kind.into(),
            namespace.into(),
            name.into(),
        )
    }

    /// A key from parts already shared (kinds and namespaces repeat across templates).
    pub fn of(api_version: Arc<str>, kind: Arc<str>, namespace: Arc<str>, name: Arc<str>) -> Self {
        use std::hash::BuildHasher;
        // Keyed per process (a hub's names cannot be chosen to collide), the same in every
        // key of this process.
        static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
            std::sync::OnceLock::new();
        let hash = KEYS.get_or_init(Default::default).hash_one((
            &*api_version,
            &*kind,
            &*namespace,
            &*name,
        ));
        Self(Arc::new(KeyParts {
            api_version,
            kind,
            namespace,
            name,
            hash,
        }))
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

    /// How many replicas of `workload` requesting `per` fit in all: the Nodes'
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
    pub labels: Arc<BTreeMap<String, String>>,
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
    /// How what placement decided reaches the members.
    pub propagation: Propagation,
    /// How candidates are scored and what else filters them (workload terms, programs).
    pub scoring: Scoring,
    /// `placement.rollout`: the stages a template edit goes through (None: all at once).
    pub rollout: Option<super::stages::Strategy>,
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
            rollout: None,
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
