//! ClusterSchedulingPolicy as the scheduling core sees it: which services a
//! policy governs, its cluster tiers and weights, and which policy wins for a service.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::model::{ClusterId, ClusterSpec, ObjectKey, Taint, TaintEffect};
use crate::placement::spec::{PlacementPolicy, Template, TemplateSelector};
pub use crate::selector::{
    AffinityTier, ClusterSet, LabelSelector, Operator, Requirement, WeightRule,
};

/// One of `resourceSelectors`: Services in the policy's namespace, by name or by the labels
/// of their (oldest) ServiceExport.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ServiceSelector {
    pub name: Option<String>,
    pub selector: Option<LabelSelector>,
}

/// A ClusterSchedulingPolicy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Policy {
    pub key: ObjectKey,
    /// `creationTimestamp` in seconds; the oldest policy wins a service.
    pub created: i64,
    /// The Services it governs for traffic.
    pub selectors: Vec<ServiceSelector>,
    /// The resource templates it places (selectors naming a `kind`).
    pub templates: Vec<TemplateSelector>,
    pub traffic: Arc<TrafficPolicy>,
    /// How it places templates; None: Duplicated into every feasible cluster of the first
    /// feasible tier.
    pub placement: Option<Arc<PlacementPolicy>>,
}

impl Policy {
    /// Whether this policy places template `t` (a template of its own namespace that one of
    /// its template selectors matches).
    pub fn places(&self, t: &Template) -> bool {
        *t.key.namespace == *self.key.namespace && self.templates.iter().any(|s| s.matches(t))
    }

    /// Whether this policy governs `service`, whose oldest export carries `labels`.
    pub fn selects(&self, service: &ObjectKey, labels: &BTreeMap<String, String>) -> bool {
        service.namespace == self.key.namespace
            && self.selectors.iter().any(|s| {
                s.name.as_deref().is_none_or(|n| n == &*service.name)
                    && s.selector.as_ref().is_none_or(|sel| sel.matches(labels))
                    && (s.name.is_some() || s.selector.is_some())
            })
    }
}

/// Every policy, oldest first, and the default for services none selects.
#[derive(Clone, Debug, Default)]
pub struct Policies {
    pub default: Arc<TrafficPolicy>,
    ordered: Vec<Policy>,
}

/// The policy that governs a service, and the younger ones that also select it.
pub struct Governing<'a> {
    pub traffic: &'a Arc<TrafficPolicy>,
    pub losers: Vec<&'a Policy>,
}

impl Policies {
    pub fn new(default: Arc<TrafficPolicy>, mut policies: Vec<Policy>) -> Self {
        policies.sort_by(|a, b| (a.created, &a.key).cmp(&(b.created, &b.key)));
        Self {
            default,
            ordered: policies,
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Policy> {
        self.ordered.iter()
    }

    /// Every policy, oldest first.
    pub fn as_slice(&self) -> &[Policy] {
        &self.ordered
    }

    /// Same default and same policies (by content).
    pub fn same_as(&self, other: &Policies) -> bool {
        self.default == other.default && self.ordered == other.ordered
    }

    /// The oldest selecting policy wins (creationTimestamp, then name).
    pub fn governing(
        &self,
        service: &ObjectKey,
        labels: &BTreeMap<String, String>,
    ) -> Governing<'_> {
        let mut selecting = self.ordered.iter().filter(|p| p.selects(service, labels));
        match selecting.next() {
            Some(winner) => Governing {
                traffic: &winner.traffic,
                losers: selecting.collect(),
            },
            None => Governing {
                traffic: &self.default,
                losers: Vec::new(),
            },
        }
    }
}

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

/// A toleration of cluster taints, with Kubernetes' matching rules: `Exists` matches any value
/// of the key (and, with an empty key, every taint), `Equal` only the same value; `effect:
/// None` matches every effect.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Toleration {
    pub key: String,
    pub operator: TolerationOperator,
    pub value: Option<String>,
    pub effect: Option<TaintEffect>,
    /// How long a `NoExecute` taint is tolerated (placement only): after that the cluster is
    /// dropped and its replicas move. None: for ever.
    pub seconds: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum TolerationOperator {
    Equal,
    Exists,
}

impl Toleration {
    /// Tolerates every taint with `key` (any value) of `effect`, or of every effect.
    pub fn exists(key: impl Into<String>, effect: Option<TaintEffect>) -> Self {
        Self {
            key: key.into(),
            operator: TolerationOperator::Exists,
            value: None,
            effect,
            seconds: None,
        }
    }

    pub fn matches(&self, taint: &Taint) -> bool {
        let key_and_value = match self.operator {
            TolerationOperator::Exists => self.key.is_empty() || self.key == taint.key,
            TolerationOperator::Equal => {
                self.key == taint.key
                    && self.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
            }
        };
        key_and_value && self.effect.is_none_or(|e| e == taint.effect)
    }
}

/// The first toleration in `tolerations` that matches `taint`.
pub fn toleration_for<'t>(tolerations: &'t [Toleration], taint: &Taint) -> Option<&'t Toleration> {
    tolerations.iter().find(|t| t.matches(taint))
}

/// The traffic part of a ClusterSchedulingPolicy; the default applies to services no policy
/// selects.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
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
    /// Clusters a staged rollout holds out of this policy's traffic while their copies
    /// change (from the policy's status on the hub; endpoints stay registered).
    pub drained: BTreeSet<ClusterId>,
    /// Clusters a staged rollout is bringing back into this policy's traffic, with the
    /// percent of their share they take now (1–99; from the policy's status on the hub).
    pub ramping: BTreeMap<ClusterId, u32>,
    /// How xDS clients eject failing endpoints of the governed services.
    pub outlier: OutlierDetection,
}

/// What a staged rollout does to a policy's traffic, as its status on the hub says: the
/// clusters held out, and those coming back with the percent of their share they take.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Drain {
    pub drained: BTreeSet<ClusterId>,
    pub ramping: BTreeMap<ClusterId, u32>,
}

/// Passive health checking by xDS clients (`traffic.outlierDetection`): which errors eject an
/// endpoint, and for how long. Envoy counts consecutive errors; gRPC honours only the failure
/// percentage (gRFC A50), so a policy for proxyless clients sets that.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OutlierDetection {
    /// Consecutive 5xx (or gRPC errors through Envoy) that eject an endpoint; None: not counted.
    pub consecutive_errors: Option<u32>,
    /// Consecutive 502, 503 or 504 that eject an endpoint; None: not counted.
    pub consecutive_gateway_errors: Option<u32>,
    /// An endpoint failing at least this share of its requests in an interval is ejected.
    pub failure_percentage: Option<FailurePercentage>,
    pub interval_seconds: u32,
    pub base_ejection_seconds: u32,
    /// At most this share of a cluster's endpoints is ejected at once.
    pub max_ejection_percent: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FailurePercentage {
    pub threshold: u32,
    /// Only when a cluster has at least this many endpoints.
    pub minimum_hosts: u32,
    /// Only endpoints with at least this many requests in the interval.
    pub request_volume: u32,
}

impl Default for OutlierDetection {
    /// What meridian sent before policies could say: 5 consecutive errors, a 10 s interval,
    /// 30 s ejections, at most half the endpoints.
    fn default() -> Self {
        Self {
            consecutive_errors: Some(5),
            consecutive_gateway_errors: None,
            failure_percentage: None,
            interval_seconds: 10,
            base_ejection_seconds: 30,
            max_ejection_percent: 50,
        }
    }
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
            drained: BTreeSet::new(),
            ramping: BTreeMap::new(),
            outlier: OutlierDetection::default(),
        }
    }
}

impl TrafficPolicy {
    /// Traffic tolerates a taint any toleration matches; `tolerationSeconds` bounds placement
    /// only (the replicas that move take their endpoints with them).
    pub fn tolerates(&self, taint: &Taint) -> bool {
        toleration_for(&self.tolerations, taint).is_some()
    }

    /// The weight a rule gives this cluster, if any rule contains it.
    pub fn weight_of(&self, cluster: &ClusterSpec) -> Option<u32> {
        self.weights
            .iter()
            .find(|w| w.clusters.contains(cluster))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, operator: Operator, values: &[&str]) -> LabelSelector {
        LabelSelector {
            match_labels: BTreeMap::new(),
            match_expressions: vec![Requirement {
                key: key.into(),
                operator,
                values: values.iter().map(|s| s.to_string()).collect(),
            }],
        }
    }

    #[test]
    fn label_selectors_follow_kubernetes() {
        let eu = labels(&[("region", "eu"), ("tier", "gold")]);
        let bare = labels(&[]);
        let all = LabelSelector::default();
        assert!(
            all.matches(&eu) && all.matches(&bare),
            "an empty selector matches everything"
        );
        let ml = LabelSelector {
            match_labels: labels(&[("region", "eu")]),
            match_expressions: vec![],
        };
        assert!(ml.matches(&eu) && !ml.matches(&bare));
        assert!(expr("region", Operator::In, &["eu", "us"]).matches(&eu));
        assert!(!expr("region", Operator::In, &["us"]).matches(&eu));
        assert!(!expr("region", Operator::In, &["eu"]).matches(&bare));
        assert!(expr("region", Operator::NotIn, &["us"]).matches(&eu));
        assert!(expr("region", Operator::NotIn, &["us"]).matches(&bare));
        assert!(expr("tier", Operator::Exists, &[]).matches(&eu));
        assert!(!expr("tier", Operator::Exists, &[]).matches(&bare));
        assert!(expr("tier", Operator::DoesNotExist, &[]).matches(&bare));
    }

    #[test]
    fn a_policy_selects_services_of_its_namespace_by_name_or_labels() {
        let by_name = ServiceSelector {
            name: Some("web".into()),
            selector: None,
        };
        let by_label = ServiceSelector {
            name: None,
            selector: Some(LabelSelector {
                match_labels: labels(&[("team", "pay")]),
                match_expressions: vec![],
            }),
        };
        let p = Policy {
            key: ObjectKey::new("shop", "p"),
            created: 0,
            selectors: vec![by_name, by_label],
            templates: Vec::new(),
            traffic: Arc::new(TrafficPolicy::default()),
            placement: None,
        };
        assert!(p.selects(&ObjectKey::new("shop", "web"), &labels(&[])));
        assert!(p.selects(&ObjectKey::new("shop", "api"), &labels(&[("team", "pay")])));
        assert!(!p.selects(&ObjectKey::new("shop", "api"), &labels(&[])));
        assert!(
            !p.selects(&ObjectKey::new("other", "web"), &labels(&[])),
            "namespaced"
        );
    }
}
