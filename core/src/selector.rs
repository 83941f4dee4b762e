//! Which clusters a policy, a tier, a weight or a Tenant names: by name or by labels. Below
//! both halves of the scheduling core (traffic and placement read the same sets).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use crate::model::ClusterSpec;

/// A Kubernetes label selector: every `matchLabels` pair and every expression must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    pub values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl LabelSelector {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator {
                    Operator::In => value.is_some_and(|v| r.values.contains(v)),
                    Operator::NotIn => value.is_none_or(|v| !r.values.contains(v)),
                    Operator::Exists => value.is_some(),
                    Operator::DoesNotExist => value.is_none(),
                }
            })
    }
}

/// Clusters by name or by labels (either matches).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ClusterSet {
    pub names: Vec<String>,
    pub selector: Option<LabelSelector>,
}

impl ClusterSet {
    pub fn contains(&self, cluster: &ClusterSpec) -> bool {
        self.names.iter().any(|n| n == cluster.id.as_str())
            || self
                .selector
                .as_ref()
                .is_some_and(|s| s.matches(&cluster.labels))
    }
}

/// One of `placement.clusterAffinities`: a named, ordered tier.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AffinityTier {
    /// Shared with every decision that names this tier.
    pub name: Arc<str>,
    pub clusters: ClusterSet,
}

/// One of `traffic.weights`: the first rule that contains a cluster gives its weight.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WeightRule {
    pub clusters: ClusterSet,
    pub weight: u32,
}
