//! Mistakes in the hub's input that no object has on its own, found once the fleet is put
//! together: a policy naming a cluster that is not a member (a warning: it may join later),
//! and a service its policy leaves with no cluster to send traffic to (an error: every
//! query for it would be answered empty).
//!
//! ```text
//!  Policies + the members' specs ─► unknown_clusters ─► warnings ─┐
//!  a service (its exporting clusters) + its policy ─► no_traffic ─► problems ─┴─► Snapshot
//!  (the fleet asks again only for the services a build changed)
//! ```

use std::collections::BTreeSet;

use crate::model::ClusterSpec;
use crate::placement::spec::Template;
use crate::policy::{Mode, Policies, Policy, TrafficPolicy};
use crate::problem::{ObjectRef, Origin, Problem};
use crate::snapshot::{ServiceView, Snapshot};

/// One warning per cluster name a policy's tiers or weights give that no member has.
pub fn unknown_clusters<'a>(
    policies: &Policies,
    members: impl Iterator<Item = &'a ClusterSpec>,
) -> Vec<Problem> {
    let known: BTreeSet<&str> = members.map(|m| m.id.as_str()).collect();
    let mut warnings = Vec::new();
    for policy in policies.iter() {
        let traffic = &policy.traffic;
        let named = traffic
            .affinities
            .iter()
            .flat_map(|t| &t.clusters.names)
            .chain(traffic.weights.iter().flat_map(|w| &w.clusters.names));
        let unknown: BTreeSet<&str> = named
            .map(String::as_str)
            .filter(|n| !known.contains(n))
            .collect();
        for name in unknown {
            warnings.push(Problem::in_merge(
                Origin::Hub,
                ObjectRef::namespaced("ClusterSchedulingPolicy", &policy.key),
                format!("names cluster {name}, which is not a member (it may join later)"),
            ));
        }
    }
    warnings
}

/// A directory hub's policy with `placement.rollout`: its files carry no generation and the
/// directory no rollout progress, so an edit reaches every member at once — said, so nobody
/// counts on stages that do not happen. (A Kubernetes hub stages a template without a
/// generation by its body's digest.)
pub fn rollouts_without_generations(policies: &[Policy], templates: &[Template]) -> Vec<Problem> {
    policies
        .iter()
        .filter(|p| p.placement.as_ref().is_some_and(|p| p.rollout.is_some()))
        .filter(|p| templates.iter().any(|t| t.generation == 0 && p.places(t)))
        .map(|policy| {
            Problem::in_merge(
                Origin::Hub,
                ObjectRef::namespaced("ClusterSchedulingPolicy", &policy.key),
                format!(
                    "placement.rollout stages an edit by the template generation it changes, and templates read from files carry none: an edit reaches every member at once here (a Kubernetes hub stages it; meridian simulate --rollout {} shows the plan)",
                    policy.key
                ),
            )
        })
        .collect()
}

/// The problem of a service whose governing policy gives none of the clusters that export
/// it any traffic: every one at weight 0, or (mode Tiers) in none of its tiers.
pub fn no_traffic(snapshot: &Snapshot, view: &ServiceView) -> Option<Problem> {
    let policy = &view.policy;
    let source = policy.source.as_ref()?;
    if view.backends.is_empty() {
        return None;
    }
    let clusters = view
        .backends
        .iter()
        .map(|b| &snapshot.clusters[b.cluster].spec);
    let why = why_no_traffic(policy, clusters)?;
    Some(Problem::in_merge(
        Origin::Hub,
        ObjectRef::namespaced("Service", &view.key),
        format!("no cluster gets its traffic under ClusterSchedulingPolicy {source}: {why}"),
    ))
}

/// Why none of `clusters` (those exporting a service) can get traffic under `policy`, if so.
fn why_no_traffic<'a>(
    policy: &TrafficPolicy,
    clusters: impl Iterator<Item = &'a ClusterSpec> + Clone,
) -> Option<String> {
    let names = || {
        clusters
            .clone()
            .map(|c| c.id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if clusters.clone().all(|c| policy.weight_of(c) == Some(0)) {
        return Some(format!(
            "every cluster exporting it ({}) has weight 0",
            names()
        ));
    }
    let in_a_tier = |c: &ClusterSpec| policy.affinities.iter().any(|t| t.clusters.contains(c));
    if policy.mode == Mode::Tiers && !clusters.clone().any(in_a_tier) {
        return Some(format!(
            "no cluster exporting it ({}) is in one of its clusterAffinities",
            names()
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::ObjectKey;
    use crate::policy::{AffinityTier, ClusterSet, Policy, WeightRule};

    fn spec(name: &str) -> ClusterSpec {
        ClusterSpec::named(name)
    }

    fn names(names: &[&str]) -> ClusterSet {
        ClusterSet {
            names: names.iter().map(|n| n.to_string()).collect(),
            selector: None,
        }
    }

    fn policy(traffic: TrafficPolicy) -> Policy {
        Policy {
            key: ObjectKey::new("shop", "web"),
            created: 0,
            selectors: vec![],
            templates: vec![],
            traffic: Arc::new(traffic),
            placement: None,
        }
    }

    #[test]
    fn a_policy_naming_a_cluster_that_is_not_a_member_is_a_warning() {
        let traffic = TrafficPolicy {
            affinities: vec![AffinityTier {
                name: "eu".into(),
                clusters: names(&["eu-1", "eu-9"]),
            }],
            weights: vec![WeightRule {
                clusters: names(&["eu-9", "us-7"]),
                weight: 1,
            }],
            ..TrafficPolicy::default()
        };
        let policies = Policies::new(Arc::default(), vec![policy(traffic)]);
        let members = [spec("eu-1"), spec("us-1")];
        let warnings = unknown_clusters(&policies, members.iter());
        let reasons: Vec<String> = warnings.iter().map(ToString::to_string).collect();
        assert_eq!(
            reasons,
            [
                "cluster hub: ClusterSchedulingPolicy shop/web: names cluster eu-9, which is not a member (it may join later)",
                "cluster hub: ClusterSchedulingPolicy shop/web: names cluster us-7, which is not a member (it may join later)",
            ]
        );
    }

    #[test]
    fn a_service_whose_only_cluster_has_weight_zero_gets_no_traffic() {
        let zero = TrafficPolicy {
            mode: Mode::Weighted,
            weights: vec![WeightRule {
                clusters: names(&["eu-1"]),
                weight: 0,
            }],
            ..TrafficPolicy::default()
        };
        let only = [spec("eu-1")];
        assert_eq!(
            why_no_traffic(&zero, only.iter()).as_deref(),
            Some("every cluster exporting it (eu-1) has weight 0")
        );
        let two = [spec("eu-1"), spec("us-1")];
        assert_eq!(
            why_no_traffic(&zero, two.iter()),
            None,
            "us-1 has no rule: it keeps its weight"
        );
        let tiers = TrafficPolicy {
            mode: Mode::Tiers,
            affinities: vec![AffinityTier {
                name: "us".into(),
                clusters: names(&["us-1"]),
            }],
            ..TrafficPolicy::default()
        };
        assert_eq!(
            why_no_traffic(&tiers, only.iter()).as_deref(),
            Some("no cluster exporting it (eu-1) is in one of its clusterAffinities")
        );
        assert_eq!(why_no_traffic(&tiers, two.iter()), None);
    }
}
