//! CRD types: meridian's own `meridian.io/v1alpha1` kinds, and the MCS kinds
//! (`multicluster.x-k8s.io/v1alpha1` ServiceExport and ServiceImport) as the MCS API defines them.
//! The CRDs of meridian's kinds are generated from these types ([`meridian_crds_yaml`]); the MCS
//! CRDs are the upstream ones, in `deploy/crds/`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A member cluster: the Cluster Registry record on the hub.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "meridian.io",
    version = "v1alpha1",
    kind = "MemberCluster",
    status = "MemberClusterStatus",
    shortname = "mc",
    printcolumn(name = "Health", type_ = "string", json_path = ".status.health"),
    printcolumn(name = "Endpoints", type_ = "integer", json_path = ".status.endpoints"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    validation = "[has(self.spec.source.kubernetes), has(self.spec.source.directory), has(self.spec.source.agent)].filter(x, x).size() == 1"
)]
#[serde(rename_all = "camelCase")]
pub struct MemberClusterSpec {
    /// Where the member's objects come from: exactly one of `kubernetes`, `directory`, `agent`.
    pub source: SourceSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewaySpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<TaintSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthSpec>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directory: Option<DirectorySource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentSource>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretKeyRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<KubeconfigRef>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeconfigRef {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DirectorySource {
    /// Relative paths resolve against the manifest that names them.
    pub path: String,
    /// Where meridian keeps the objects placed in this member rendered (one file each, as
    /// `meridian render` writes them); relative to the manifest that names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub render_path: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct AgentSource {}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, rename = "podCIDRs", skip_serializing_if = "Vec::is_empty")]
    pub pod_cidrs: Vec<String>,
    #[serde(
        default,
        rename = "dnsClientCIDRs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub dns_client_cidrs: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct GatewaySpec {
    pub address: String,
    pub port: u16,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct TaintSpec {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub effect: TaintEffectSpec,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TaintEffectSpec {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CostSpec {
    /// The price of one CPU core for an hour, in the fleet's one currency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_core_hour: Option<f64>,
    /// The price of one GiB of memory for an hour.
    #[serde(
        default,
        rename = "memoryGiBHour",
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_gib_hour: Option<f64>,
    /// The price of one GiB sent out of the cluster.
    #[serde(default, rename = "egressGiB", skip_serializing_if = "Option::is_none")]
    pub egress_gib: Option<f64>,
    /// The share of the cluster's capacity that is spot (0 to 1), priced lower.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot_ratio: Option<f64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreachable_after_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withdraw_after_seconds: Option<u64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberClusterStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocatable: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exported_services: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// MCS ServiceExport: marks the Service of the same name for export. Its spec is empty.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "multicluster.x-k8s.io",
    version = "v1alpha1",
    kind = "ServiceExport",
    namespaced,
    status = "ServiceExportStatus"
)]
pub struct ServiceExportSpec {}

/// A ServiceExport as the API serves it, usually with no `spec` at all (which the derived
/// [`ServiceExport`] requires): what the member watches read.
#[derive(kube::Resource, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[resource(inherit = "ServiceExport")]
pub struct ServiceExportObject {
    pub metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    #[serde(default)]
    pub spec: ServiceExportSpec,
    #[serde(default)]
    pub status: Option<ServiceExportStatus>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ServiceExportStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// MCS ServiceImport: the fleet-wide view of a service, as seen from one member.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "multicluster.x-k8s.io",
    version = "v1alpha1",
    kind = "ServiceImport",
    namespaced,
    status = "ServiceImportStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceImportSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    #[serde(rename = "type")]
    pub type_: ServiceImportType,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ServiceImportPort>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity_config: Option<serde_json::Value>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ServiceImportType {
    #[default]
    ClusterSetIP,
    Headless,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceImportPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
    pub port: i32,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ServiceImportStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<ClusterStatus>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct ClusterStatus {
    pub cluster: String,
}

/// One policy for where a service's traffic (and, with the federation layer, its workloads)
/// goes. Namespaced: it governs Services of its own namespace.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "meridian.io",
    version = "v1alpha1",
    kind = "ClusterSchedulingPolicy",
    namespaced,
    status = "ClusterSchedulingPolicyStatus",
    shortname = "csp"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSchedulingPolicySpec {
    /// The Services this policy governs (by name or by the labels of their ServiceExport).
    pub resource_selectors: Vec<ResourceSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic: Option<TrafficSpec>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Only `Service` is governed for traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelectorSpec>,
}

/// A Kubernetes label selector.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelectorSpec {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelRequirementSpec>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelRequirementSpec {
    pub key: String,
    /// In, NotIn, Exists or DoesNotExist.
    pub operator: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementSpec {
    /// Ordered tiers: "prefer EU, fall back to US".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_affinities: Vec<ClusterAffinitySpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<TolerationSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spread_constraints: Vec<SpreadConstraintSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_scheduling: Option<ReplicaSchedulingSpec>,
    /// An Unreachable cluster is dropped from placement after this long; its replicas move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverSpec>,
    /// A cluster failed over is placed again once Healthy for this long (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failback_after_seconds: Option<u64>,
    /// An object in a member that meridian did not create: left alone with a Conflict
    /// condition (Abort, the default), or adopted (Overwrite).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflict_resolution: Option<ConflictResolutionSpec>,
    /// When the copy in a cluster placement dropped is deleted: once its replacements are
    /// ready or gracePeriodSeconds passed (Graceful, the default), at once, or never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purge_mode: Option<PurgeModeSpec>,
    /// The longest a dropped (or shrinking) copy waits for its replacement (default 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period_seconds: Option<u64>,
    /// Deleting or unselecting a template leaves what meridian placed in the members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preserve_resources_on_deletion: Option<bool>,
    /// JSON pointers (e.g. `/spec/template/metadata/annotations/x`) the member owns once the
    /// object exists there; `/spec/replicas` of a workload an HPA in the member scales is
    /// always retained.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retain: Vec<String>,
    /// Plugin weights for ordering candidates (ResourceBalance, Cost, DataLocality,
    /// WorkloadAffinity, ClusterAffinity, TaintToleration, Webhook, Script). Without it every
    /// plugin this placement configures weighs 1, the others 0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scoring: Vec<ScoringSpec>,
    /// Where the template's data is: such clusters score 100, their region 50.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_locality: Option<DataLocalitySpec>,
    /// Run next to other workloads (templates of this namespace matching the selector).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workload_affinity: Vec<WorkloadTermSpec>,
    /// Run apart from other workloads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workload_anti_affinity: Vec<WorkloadTermSpec>,
    /// Soft cluster preferences, scored by weight (the tiers stay `clusterAffinities`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preferred_cluster_affinities: Vec<PreferredClusterAffinitySpec>,
    /// Scoring webhooks: a JSON POST per decision, answering scores and filter verdicts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub webhooks: Vec<ScoringWebhookSpec>,
    /// A Lua policy defining `filter(cluster, workload)` and/or `score(cluster, workload)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<ScriptSpec>,
    /// Template edits stage by stage, traffic first. Planned and shown by `meridian simulate
    /// --rollout`; this meridian still applies an edit to every member at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutSpec>,
}

/// `placement.rollout`: the stages a template edit goes through.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    pub stages: Vec<RolloutStageSpec>,
    /// Drain (default): a stage's clusters leave the traffic of the Services this policy
    /// governs while their copies change. Keep: traffic stays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic: Option<RolloutTrafficSpec>,
    /// How long a drained stage waits before its copies change (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_seconds: Option<u64>,
    /// Traffic returns to a stage over this long (default 0: at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ramp_seconds: Option<u64>,
    /// A copy not ready at the new generation this long after it was written is a failure
    /// (default 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_deadline_seconds: Option<u64>,
    /// Past a stage's maxFailures: Pause (default) or Rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<RolloutOnFailureSpec>,
    /// A health gate: while a stage verifies, this Prometheus query is asked every few
    /// seconds, and every sample must be at most `threshold`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<RolloutAnalysisSpec>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutAnalysisSpec {
    /// Prometheus's base URL (http://prometheus.monitoring:9090; https with the system roots).
    #[serde(rename = "prometheusURL")]
    pub prometheus_url: String,
    /// An instant query (PromQL); `$clusters` stands for the stage's clusters as a regular
    /// expression, e.g. `sum by (cluster) (rate(http_errors_total{cluster=~"$clusters"}[1m]))`.
    pub query: String,
    /// The gate holds while no sample is above this (a query returning nothing holds).
    pub threshold: f64,
}

/// One stage: clusters by name or labels, the clusters of one of the policy's
/// `clusterAffinities` (`tier`), or the rest in batches.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStageSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelectorSpec>,
    /// The clusters of the policy's `clusterAffinities` entry of this name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// The clusters no earlier stage took, this many at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable_clusters: Option<u32>,
    /// The clusters no earlier stage took, this percent of them at a time (rounded up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable_percent: Option<u32>,
    /// Once ready with its traffic back, how long the stage must stay so (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_seconds: Option<u64>,
    /// Required: the stage starts only once approved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<RolloutApprovalSpec>,
    /// Failures tolerated before onFailure (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_failures: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RolloutTrafficSpec {
    Drain,
    Keep,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RolloutOnFailureSpec {
    Pause,
    Rollback,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RolloutApprovalSpec {
    Required,
    None,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScoringSpec {
    pub plugin: String,
    pub weight: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataLocalitySpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelectorSpec>,
    /// A template annotation listing cluster names and `region=`/`zone=` entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_annotation: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadTermSpec {
    /// Selects other templates (workloads) of the policy's namespace by their labels.
    pub label_selector: LabelSelectorSpec,
    pub topology: SpreadByFieldSpec,
    /// A hard term: filters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<bool>,
    /// A soft term, scored with this weight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreferredClusterAffinitySpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelectorSpec>,
    pub weight: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScoringWebhookSpec {
    /// `https://…` (or `http://` to loopback only).
    pub url: String,
    /// PEM certificates the webhook's server certificate must chain to (default: system roots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,
    /// Default 1000, at most 30000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_millis: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<FailurePolicySpec>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum FailurePolicySpec {
    Ignore,
    Fail,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScriptSpec {
    pub lua: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ConflictResolutionSpec {
    Abort,
    Overwrite,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PurgeModeSpec {
    Graceful,
    Immediately,
    Never,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterAffinitySpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelectorSpec>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TolerationSpec {
    /// Empty with `operator: Exists` tolerates every taint.
    #[serde(default)]
    pub key: String,
    /// Equal or Exists; defaults to Equal when a value is given, else Exists (so a
    /// toleration naming only a key tolerates every value of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<TolerationOperatorSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Empty tolerates every effect of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<TaintEffectSpec>,
    /// How long a NoExecute taint is tolerated by placement; then the cluster's replicas move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toleration_seconds: Option<u64>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TolerationOperatorSpec {
    Equal,
    Exists,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpreadConstraintSpec {
    pub spread_by_field: SpreadByFieldSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_groups: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_groups: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SpreadByFieldSpec {
    Cluster,
    Region,
    Zone,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaSchedulingSpec {
    #[serde(rename = "type", default)]
    pub type_: ReplicaSchedulingTypeSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub division_preference: Option<DivisionPreferenceSpec>,
    /// Static weights (Divided, Weighted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weights: Vec<WeightSpec>,
    /// `AvailableCapacity`: divide in proportion to each cluster's free replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic: Option<DynamicWeightSpec>,
    /// Warm replicas kept in the next tier while the first one runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<StandbySpec>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ReplicaSchedulingTypeSpec {
    #[default]
    Duplicated,
    Divided,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DivisionPreferenceSpec {
    Weighted,
    Aggregated,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DynamicWeightSpec {
    AvailableCapacity,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct StandbySpec {
    pub replicas: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailoverSpec {
    pub after_seconds: u64,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum TrafficModeSpec {
    #[default]
    Locality,
    Tiers,
    Weighted,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrafficSpec {
    /// Locality unless set; a policy keeping standby replicas sends traffic by its tiers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<TrafficModeSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_healthy_endpoints: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weights: Vec<WeightSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withdraw: Option<WithdrawSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failback_after_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<PolicyDnsSpec>,
    /// How xDS clients eject failing endpoints (Envoy counts consecutive errors; gRPC honours
    /// the failure percentage only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<OutlierDetectionSpec>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutlierDetectionSpec {
    /// Consecutive errors (5xx) that eject an endpoint; 0 turns the count off. Default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_errors: Option<u32>,
    /// Consecutive 502, 503 or 504 that eject an endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_gateway_errors: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_percentage: Option<FailurePercentageSpec>,
    /// Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_seconds: Option<u32>,
    /// Default 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_ejection_seconds: Option<u32>,
    /// Default 50.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ejection_percent: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailurePercentageSpec {
    /// Percent of an endpoint's requests in an interval that, failing, eject it.
    pub threshold: u32,
    /// Default 5 (Envoy's and gRPC's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_hosts: Option<u32>,
    /// Default 50 (Envoy's and gRPC's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_volume: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WeightSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelectorSpec>,
    /// 0 sends no traffic to these clusters.
    pub weight: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WithdrawSpec {
    pub after_seconds: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyDnsSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_answers: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ClusterSchedulingPolicyStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The staged rollouts of the templates it places (`placement.rollout`), written by the
    /// leader: where each stands, and which clusters are out of the policy's traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// Clusters held out of the traffic of the Services this policy governs while their
    /// copies change (every replica's DNS and xDS read it here).
    #[serde(default)]
    pub drained: Vec<String>,
    /// Clusters coming back into that traffic (`rampSeconds`), with the percent of their
    /// share they take now.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ramping: BTreeMap<String, u32>,
    #[serde(default)]
    pub templates: Vec<TemplateRolloutStatus>,
}

/// One template's rollout, enough for a new leader to resume it at the same stage.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateRolloutStatus {
    /// `apiVersion/kind/name` of the template (in the policy's namespace).
    pub template: String,
    /// The template generation rolled out, and the one it replaces.
    pub generation: i64,
    pub previous: i64,
    /// The stages in order, each with its clusters.
    #[serde(default)]
    pub stages: Vec<RolloutStageStatus>,
    /// The index of the stage worked on (the number of stages once every one is done).
    pub stage: u32,
    /// Approval, Draining, Applying, Restoring, Verifying, RollingBack, Done or RolledBack.
    pub phase: String,
    /// When the phase began (Unix seconds).
    pub since: u64,
    #[serde(default)]
    pub failures: u32,
    /// The stages an operator approved (indices).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approved: Vec<u32>,
    /// Why the rollout stopped, while it is paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct RolloutStageStatus {
    pub name: String,
    pub clusters: Vec<String>,
}

/// Per-cluster changes to the templates it selects, applied when they are placed.
/// Namespaced: it selects templates of its own namespace.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "meridian.io",
    version = "v1alpha1",
    kind = "OverridePolicy",
    namespaced,
    status = "ClusterSchedulingPolicyStatus",
    shortname = "op"
)]
#[serde(rename_all = "camelCase")]
pub struct OverridePolicySpec {
    pub resource_selectors: Vec<ResourceSelector>,
    pub override_rules: Vec<OverrideRuleSpec>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OverrideRuleSpec {
    /// Every cluster when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_clusters: Option<TargetClustersSpec>,
    pub overriders: OverridersSpec,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetClustersSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelectorSpec>,
}

/// Applied in this order: image, command, args, env, labels, annotations, jsonPatch.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OverridersSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image: Vec<ImageOverriderSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<ArgsOverriderSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<ArgsOverriderSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvOverriderSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<MapOverriderSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<MapOverriderSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub json_patch: Vec<JsonPatchSpec>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ImageComponentSpec {
    Registry,
    Repository,
    Tag,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OverrideOperatorSpec {
    Add,
    Remove,
    Replace,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageOverriderSpec {
    /// Every container when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub container_names: Vec<String>,
    pub component: ImageComponentSpec,
    pub operator: OverrideOperatorSpec,
    #[serde(default)]
    pub value: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArgsOverriderSpec {
    pub container_name: String,
    pub operator: OverrideOperatorSpec,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub value: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvOverriderSpec {
    pub container_name: String,
    pub operator: OverrideOperatorSpec,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MapOverriderSpec {
    pub operator: OverrideOperatorSpec,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub value: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct JsonPatchSpec {
    pub op: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
    pub value: Option<serde_json::Value>,
}

/// What meridian decided for one resource template and what the members did with it: one per
/// template, in the template's namespace, written by the leader. The spec names
/// the template and the decision; the status is each member's copy.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "meridian.io",
    version = "v1alpha1",
    kind = "Placement",
    namespaced,
    status = "PlacementRecordStatus",
    shortname = "mpl",
    printcolumn = r#"{"name":"Kind","type":"string","jsonPath":".spec.template.kind"}"#,
    printcolumn = r#"{"name":"Template","type":"string","jsonPath":".spec.template.name"}"#,
    printcolumn = r#"{"name":"Outcome","type":"string","jsonPath":".spec.outcome"}"#,
    printcolumn = r#"{"name":"Clusters","type":"string","jsonPath":".spec.summary"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PlacementRecordSpec {
    pub template: TemplateRefSpec,
    /// The ClusterSchedulingPolicy that placed it (`namespace/name`); none for a dependency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Scheduled, or Unschedulable with the reason.
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// `cluster=replicas` of every placed cluster, for `kubectl get`.
    #[serde(default)]
    pub summary: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<PlacedClusterSpec>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateRefSpec {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    /// The template's metadata.generation the decision was made from.
    #[serde(default)]
    pub generation: i64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacedClusterSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    /// Why it holds what it holds (Weight, Duplicated, Capacity, Standby, ...).
    pub reason: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementRecordStatus {
    /// Each member's copy, in cluster name order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<MemberCopyStatus>,
    /// Copies kept while their replacements get ready (or for good, purgeMode Never).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evictions: Vec<EvictionStatus>,
    /// Applied (every placed copy written), Ready (every copy ready), Conflict.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberCopyStatus {
    pub name: String,
    /// The member's health as the registry sees it.
    pub health: String,
    /// Written from the current decision and template generation.
    pub applied: bool,
    /// Why the last write failed (the API's message), or why nothing is written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The replica count written (a shrink held back shows the count it keeps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_replicas: Option<i64>,
    /// The copy counts as ready (its member observed it and runs its replicas ready).
    pub ready: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvictionStatus {
    pub cluster: String,
    /// Why placement dropped the cluster (FailedOver, NoExecuteTaint, ...).
    pub reason: String,
    pub waited_seconds: u64,
    /// purgeMode Never: kept for good, no longer updated.
    #[serde(default)]
    pub orphaned: bool,
}

/// Who is bounded to which namespaces of which clusters through the gateway.
/// Cluster-scoped. Its named namespaces are created in each of its clusters.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "meridian.io",
    version = "v1alpha1",
    kind = "Tenant",
    shortname = "tn",
    printcolumn = r#"{"name":"Namespaces","type":"string","jsonPath":".spec.namespaces"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = "!(has(self.spec.namespaces) && has(self.spec.namespaceSelector))"
)]
#[serde(rename_all = "camelCase")]
pub struct TenantSpec {
    pub subjects: TenantSubjectsSpec,
    /// Created (labelled as meridian's, with the Tenant's labels) in each of its clusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<Vec<String>>,
    /// Instead of `namespaces`: the namespaces of its clusters with these labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelectorSpec>,
    pub clusters: TargetClustersSpec,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantSubjectsSpec {
    /// User names as the gateway sees them (with the OIDC usernamePrefix).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    /// Group names as the gateway sees them (with the OIDC groupsPrefix).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

/// The CustomResourceDefinitions of meridian's own kinds, generated from the types above.
pub fn meridian_crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![
        MemberCluster::crd(),
        ClusterSchedulingPolicy::crd(),
        OverridePolicy::crd(),
        Placement::crd(),
        Tenant::crd(),
    ]
}

/// [`meridian_crds`] as a multi-document YAML stream (what `meridian crds` prints).
pub fn meridian_crds_yaml() -> Result<String, serde_yaml_ng::Error> {
    let mut out = String::new();
    for crd in meridian_crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&crd)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn deploy_crds_are_the_generated_ones() {
        let on_disk = include_str!("../../deploy/crds/meridian.io.yaml");
        let body = on_disk.split_once('\n').map_or("", |(_, rest)| rest);
        assert_eq!(
            body,
            super::meridian_crds_yaml().unwrap(),
            "deploy/crds/meridian.io.yaml is stale: regenerate it with `meridian crds`"
        );
    }
}
