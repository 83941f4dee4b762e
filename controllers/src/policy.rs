//! ClusterSchedulingPolicy → the scheduling core's `Policy`, with validation: every problem is
//! reported with what is wrong, and a policy with any problem is not used at all (a half-read
//! policy could send traffic somewhere its author never meant).

use std::sync::Arc;

use meridian_core as core;

use crate::convert::{created_secs, key_of, taint_effect};
use crate::crd::{ClusterSchedulingPolicy, LabelSelectorSpec, TrafficModeSpec};

pub fn scheduling_policy(csp: &ClusterSchedulingPolicy) -> Result<core::Policy, Vec<String>> {
    let mut problems = Vec::new();
    let key = key_of(&csp.metadata).map_err(|e| vec![e.to_string()])?;
    let spec = &csp.spec;
    let selectors = service_selectors(csp, &mut problems);
    let placement = spec.placement.clone().unwrap_or_default();
    let traffic = spec.traffic.clone().unwrap_or_default();
    let mut affinities = Vec::new();
    for (i, a) in placement.cluster_affinities.iter().enumerate() {
        let at = format!("placement.clusterAffinities[{i}]");
        if a.name.is_empty() {
            problems.push(format!("{at}: name is required"));
        }
        if placement.cluster_affinities[..i]
            .iter()
            .any(|b| b.name == a.name)
        {
            problems.push(format!("{at}: the name {:?} is used twice", a.name));
        }
        if let Some(clusters) = cluster_set(
            &a.cluster_names,
            a.label_selector.as_ref(),
            &at,
            &mut problems,
        ) {
            affinities.push(core::AffinityTier {
                name: a.name.as_str().into(),
                clusters,
            });
        }
    }
    let mode = match traffic.mode {
        TrafficModeSpec::Locality => core::Mode::Locality,
        TrafficModeSpec::Tiers => core::Mode::Tiers,
        TrafficModeSpec::Weighted => core::Mode::Weighted,
    };
    if mode == core::Mode::Tiers && placement.cluster_affinities.is_empty() {
        problems.push("traffic.mode Tiers needs placement.clusterAffinities".into());
    }
    let mut weights = Vec::new();
    for (i, w) in traffic.weights.iter().enumerate() {
        let at = format!("traffic.weights[{i}]");
        if let Some(clusters) = cluster_set(
            &w.cluster_names,
            w.label_selector.as_ref(),
            &at,
            &mut problems,
        ) {
            weights.push(core::WeightRule {
                clusters,
                weight: w.weight,
            });
        }
    }
    if traffic.min_healthy_endpoints == Some(0) {
        problems.push("traffic.minHealthyEndpoints must be at least 1".into());
    }
    if let Some(dns) = &traffic.dns
        && dns.ttl == Some(0)
    {
        problems.push("traffic.dns.ttl must be at least 1 (0 defeats every cache)".into());
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let dns = traffic.dns.unwrap_or_default();
    Ok(core::Policy {
        created: created_secs(&csp.metadata),
        selectors,
        templates: Vec::new(),
        placement: None,
        traffic: Arc::new(core::TrafficPolicy {
            source: Some(key.to_string()),
            mode,
            affinities,
            weights,
            min_healthy_endpoints: traffic.min_healthy_endpoints.unwrap_or(1),
            withdraw_after_seconds: traffic.withdraw.map(|w| w.after_seconds),
            failback_after_seconds: traffic.failback_after_seconds.unwrap_or(0),
            tolerations: placement
                .tolerations
                .iter()
                .map(|t| core::Toleration::exists(t.key.clone(), t.effect.map(taint_effect)))
                .collect(),
            ttl: dns.ttl,
            max_answers: dns.max_answers,
        }),
        key,
    })
}

/// The Service selectors; selectors of other kinds (workload templates) are placement's.
fn service_selectors(
    csp: &ClusterSchedulingPolicy,
    problems: &mut Vec<String>,
) -> Vec<core::ServiceSelector> {
    let mut out = Vec::new();
    if csp.spec.resource_selectors.is_empty() {
        problems.push("spec.resourceSelectors: at least one selector is required".into());
    }
    for (i, s) in csp.spec.resource_selectors.iter().enumerate() {
        let at = format!("spec.resourceSelectors[{i}]");
        if s.kind.as_deref().is_some_and(|k| k != "Service") {
            continue;
        }
        if s.name.is_none() && s.label_selector.is_none() {
            problems.push(format!("{at}: name or labelSelector is required"));
            continue;
        }
        out.push(core::ServiceSelector {
            name: s.name.clone(),
            selector: s
                .label_selector
                .as_ref()
                .and_then(|l| label_selector(l, &format!("{at}.labelSelector"), problems)),
        });
    }
    out
}

fn cluster_set(
    names: &[String],
    selector: Option<&LabelSelectorSpec>,
    at: &str,
    problems: &mut Vec<String>,
) -> Option<core::ClusterSet> {
    if names.is_empty() && selector.is_none() {
        problems.push(format!("{at}: clusterNames or labelSelector is required"));
        return None;
    }
    Some(core::ClusterSet {
        names: names.to_vec(),
        selector: match selector {
            Some(s) => Some(label_selector(s, &format!("{at}.labelSelector"), problems)?),
            None => None,
        },
    })
}

fn label_selector(
    s: &LabelSelectorSpec,
    at: &str,
    problems: &mut Vec<String>,
) -> Option<core::LabelSelector> {
    let mut expressions = Vec::new();
    for (i, r) in s.match_expressions.iter().enumerate() {
        let operator = match r.operator.as_str() {
            "In" => core::Operator::In,
            "NotIn" => core::Operator::NotIn,
            "Exists" => core::Operator::Exists,
            "DoesNotExist" => core::Operator::DoesNotExist,
            other => {
                problems.push(format!(
                    "{at}.matchExpressions[{i}]: unknown operator {other:?} (In, NotIn, Exists, DoesNotExist)"
                ));
                return None;
            }
        };
        let needs_values = matches!(operator, core::Operator::In | core::Operator::NotIn);
        if needs_values == r.values.is_empty() {
            problems.push(format!(
                "{at}.matchExpressions[{i}]: {} {}",
                r.operator,
                if needs_values {
                    "needs values"
                } else {
                    "takes no values"
                }
            ));
            return None;
        }
        expressions.push(core::Requirement {
            key: r.key.clone(),
            operator,
            values: r.values.clone(),
        });
    }
    Some(core::LabelSelector {
        match_labels: s.match_labels.clone(),
        match_expressions: expressions,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::manifest::{Loaded, Manifest, parse_str};

    fn read(yaml: &str) -> Result<core::Policy, Vec<String>> {
        let mut out = Loaded::default();
        parse_str(Path::new("p.yaml"), yaml, &mut out);
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        match &out.manifests[..] {
            [(_, Manifest::ClusterSchedulingPolicy(p))] => scheduling_policy(p),
            other => panic!("one policy expected, got {}", other.len()),
        }
    }

    const HEAD: &str = "apiVersion: meridian.io/v1alpha1\nkind: ClusterSchedulingPolicy\nmetadata: {name: p, namespace: shop, creationTimestamp: \"2026-01-01T00:00:00Z\"}\n";

    #[test]
    fn a_full_policy_converts() {
        let p = read(&format!(
            "{HEAD}spec:\n  resourceSelectors: [{{kind: Service, name: web}}, {{labelSelector: {{matchExpressions: [{{key: team, operator: In, values: [pay]}}]}}}}]\n  placement:\n    clusterAffinities: [{{name: eu, labelSelector: {{matchLabels: {{region: eu}}}}}}, {{name: us, clusterNames: [us-1]}}]\n    tolerations: [{{key: maintenance, effect: NoExecute}}]\n  traffic: {{mode: Tiers, minHealthyEndpoints: 2, weights: [{{clusterNames: [us-1], weight: 0}}], withdraw: {{afterSeconds: 30}}, failbackAfterSeconds: 60, dns: {{ttl: 7, maxAnswers: 2}}}}\n"
        ))
        .unwrap();
        assert_eq!(p.key.to_string(), "shop/p");
        assert_eq!(p.created, 1_767_225_600);
        assert_eq!(p.selectors.len(), 2);
        let t = &p.traffic;
        assert_eq!(t.source.as_deref(), Some("shop/p"));
        assert_eq!(t.mode, core::Mode::Tiers);
        assert_eq!(
            t.affinities.iter().map(|a| &*a.name).collect::<Vec<_>>(),
            ["eu", "us"]
        );
        assert_eq!(t.weights[0].weight, 0);
        assert_eq!(
            (
                t.min_healthy_endpoints,
                t.withdraw_after_seconds,
                t.failback_after_seconds,
                t.ttl,
                t.max_answers
            ),
            (2, Some(30), 60, Some(7), Some(2))
        );
        assert_eq!(t.tolerations[0].effect, Some(core::TaintEffect::NoExecute));
    }

    #[test]
    fn every_problem_is_named() {
        let problems = read(&format!(
            "{HEAD}spec:\n  resourceSelectors: [{{kind: Service}}]\n  placement:\n    clusterAffinities: [{{name: a}}, {{name: a, labelSelector: {{matchExpressions: [{{key: k, operator: Near}}]}}}}]\n  traffic: {{mode: Weighted, minHealthyEndpoints: 0, weights: [{{weight: 3}}], dns: {{ttl: 0}}}}\n"
        ))
        .unwrap_err();
        let all = problems.join("\n");
        for needle in [
            "spec.resourceSelectors[0]: name or labelSelector is required",
            "placement.clusterAffinities[0]: clusterNames or labelSelector is required",
            "placement.clusterAffinities[1]: the name \"a\" is used twice",
            "unknown operator \"Near\"",
            "traffic.weights[0]: clusterNames or labelSelector is required",
            "traffic.minHealthyEndpoints must be at least 1",
            "traffic.dns.ttl must be at least 1",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
        }
        let problems = read(&format!(
            "{HEAD}spec:\n  resourceSelectors: [{{name: web}}]\n  traffic: {{mode: Tiers}}\n"
        ))
        .unwrap_err();
        assert_eq!(
            problems,
            ["traffic.mode Tiers needs placement.clusterAffinities"]
        );
    }
}
