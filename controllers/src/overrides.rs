//! OverridePolicy → the placement core's `OverridePolicy`, with validation: a policy with any
//! problem is not used (an override applied half would render objects nobody asked for), and
//! every problem names the field.

use meridian_core as core;
use meridian_core::placement::{
    ArgsOverrider, EnvOverrider, ImageComponent, ImageOverrider, JsonPatch, MapOverrider,
    OverrideOperator, OverrideRule, Overriders,
};

use crate::convert::key_of;
use crate::crd::{
    ImageComponentSpec, MapOverriderSpec, OverrideOperatorSpec, OverridePolicy, OverridersSpec,
};
use crate::policy::{cluster_set, label_selector};

pub fn override_policy(op: &OverridePolicy) -> Result<core::OverridePolicy, Vec<String>> {
    let key = key_of(&op.metadata).map_err(|e| vec![e.to_string()])?;
    let mut problems = Vec::new();
    let selectors = op
        .spec
        .resource_selectors
        .iter()
        .enumerate()
        .map(|(i, s)| core::TemplateSelector {
            api_version: s.api_version.clone(),
            kind: s.kind.clone(),
            name: s.name.clone(),
            selector: s.label_selector.as_ref().and_then(|l| {
                label_selector(
                    l,
                    &format!("spec.resourceSelectors[{i}].labelSelector"),
                    &mut problems,
                )
            }),
        })
        .collect();
    if op.spec.resource_selectors.is_empty() {
        problems.push("spec.resourceSelectors: at least one selector is required".into());
    }
    if op.spec.override_rules.is_empty() {
        problems.push("spec.overrideRules: at least one rule is required".into());
    }
    let mut rules = Vec::new();
    for (i, r) in op.spec.override_rules.iter().enumerate() {
        let at = format!("spec.overrideRules[{i}]");
        let targets = r.target_clusters.as_ref().and_then(|t| {
            cluster_set(
                &t.cluster_names,
                t.label_selector.as_ref(),
                &format!("{at}.targetClusters"),
                &mut problems,
            )
        });
        let overriders = overriders(&r.overriders, &format!("{at}.overriders"), &mut problems);
        rules.push(OverrideRule {
            targets,
            overriders,
        });
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(core::OverridePolicy {
        key,
        selectors,
        rules,
    })
}

fn overriders(o: &OverridersSpec, at: &str, problems: &mut Vec<String>) -> Overriders {
    let image = o
        .image
        .iter()
        .enumerate()
        .filter_map(|(i, img)| {
            let operator = operator(img.operator);
            if operator != OverrideOperator::Remove && img.value.is_empty() {
                problems.push(format!("{at}.image[{i}]: {:?} needs a value", img.operator));
                return None;
            }
            Some(ImageOverrider {
                container_names: img.container_names.clone(),
                component: match img.component {
                    ImageComponentSpec::Registry => ImageComponent::Registry,
                    ImageComponentSpec::Repository => ImageComponent::Repository,
                    ImageComponentSpec::Tag => ImageComponent::Tag,
                },
                operator,
                value: img.value.clone(),
            })
        })
        .collect();
    let args = |field: &str, list: &[crate::crd::ArgsOverriderSpec], problems: &mut Vec<String>| {
        list.iter()
            .enumerate()
            .filter_map(|(i, a)| {
                let operator = operator(a.operator);
                if operator == OverrideOperator::Replace {
                    problems.push(format!(
                        "{at}.{field}[{i}]: operator replace is not supported (add or remove)"
                    ));
                    return None;
                }
                Some(ArgsOverrider {
                    container_name: a.container_name.clone(),
                    operator,
                    values: a.value.clone(),
                })
            })
            .collect()
    };
    let command = args("command", &o.command, problems);
    let arguments = args("args", &o.args, problems);
    let env = o
        .env
        .iter()
        .enumerate()
        .filter_map(|(i, e)| {
            let operator = operator(e.operator);
            if operator != OverrideOperator::Remove && e.value.is_none() {
                problems.push(format!("{at}.env[{i}]: {:?} needs a value", e.operator));
                return None;
            }
            Some(EnvOverrider {
                container_name: e.container_name.clone(),
                operator,
                name: e.name.clone(),
                value: e.value.clone(),
            })
        })
        .collect();
    let json_patch = o
        .json_patch
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            let at = format!("{at}.jsonPatch[{i}]");
            json_patch(p, &at, problems)
        })
        .collect();
    Overriders {
        image,
        command,
        args: arguments,
        env,
        labels: map_overrider(o.labels.as_ref()),
        annotations: map_overrider(o.annotations.as_ref()),
        json_patch,
    }
}

fn json_patch(
    p: &crate::crd::JsonPatchSpec,
    at: &str,
    problems: &mut Vec<String>,
) -> Option<JsonPatch> {
    let needs_value = matches!(p.op.as_str(), "add" | "replace" | "test");
    let needs_from = matches!(p.op.as_str(), "move" | "copy");
    if !needs_value && !needs_from && p.op != "remove" {
        problems.push(format!(
            "{at}: unknown op {:?} (add, remove, replace, move, copy, test)",
            p.op
        ));
        return None;
    }
    if !(p.path.is_empty() || p.path.starts_with('/')) {
        problems.push(format!(
            "{at}: path {:?} is not a JSON pointer (it starts with /)",
            p.path
        ));
        return None;
    }
    if needs_value && p.value.is_none() {
        problems.push(format!("{at}: op {} needs a value", p.op));
        return None;
    }
    if needs_from && p.from.is_none() {
        problems.push(format!("{at}: op {} needs from", p.op));
        return None;
    }
    Some(JsonPatch {
        op: p.op.clone(),
        path: p.path.clone(),
        from: p.from.clone(),
        value: p.value.clone(),
    })
}

fn map_overrider(m: Option<&MapOverriderSpec>) -> Vec<MapOverrider> {
    m.map(|m| MapOverrider {
        operator: operator(m.operator),
        values: m.value.clone(),
    })
    .into_iter()
    .collect()
}

fn operator(o: OverrideOperatorSpec) -> OverrideOperator {
    match o {
        OverrideOperatorSpec::Add => OverrideOperator::Add,
        OverrideOperatorSpec::Remove => OverrideOperator::Remove,
        OverrideOperatorSpec::Replace => OverrideOperator::Replace,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::manifest::{Loaded, Manifest, parse_str};

    fn read(spec: &str) -> Result<core::OverridePolicy, Vec<String>> {
        let mut out = Loaded::default();
        let yaml = format!(
            "apiVersion: meridian.io/v1alpha1\nkind: OverridePolicy\nmetadata: {{name: o, namespace: shop}}\nspec:\n{spec}"
        );
        parse_str(Path::new("o.yaml"), &yaml, &mut out);
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        match &out.manifests[..] {
            [(_, Manifest::OverridePolicy(p))] => override_policy(p),
            other => panic!("one policy expected, got {}", other.len()),
        }
    }

    #[test]
    fn rules_convert_in_their_order() {
        let p = read("  resourceSelectors: [{kind: Deployment}]\n  overrideRules:\n    - targetClusters: {clusterNames: [us-1]}\n      overriders:\n        image: [{component: Registry, operator: replace, value: mirror.example.com}]\n        labels: {operator: add, value: {tier: gold}}\n        jsonPatch: [{op: add, path: /metadata/annotations/x, value: y}]\n").unwrap();
        assert_eq!(p.key.to_string(), "shop/o");
        let rule = &p.rules[0];
        assert_eq!(rule.targets.as_ref().unwrap().names, ["us-1"]);
        assert_eq!(rule.overriders.image[0].value, "mirror.example.com");
        assert_eq!(rule.overriders.labels[0].values["tier"], "gold");
        assert_eq!(rule.overriders.json_patch[0].op, "add");
    }

    #[test]
    fn every_problem_is_named() {
        let problems = read("  resourceSelectors: []\n  overrideRules:\n    - overriders:\n        image: [{component: Tag, operator: add}]\n        args: [{containerName: web, operator: replace, value: [x]}]\n        env: [{containerName: web, operator: add, name: A}]\n        jsonPatch: [{op: frobnicate, path: /a}, {op: add, path: a, value: 1}, {op: replace, path: /a}, {op: move, path: /a}]\n").unwrap_err();
        let all = problems.join("\n");
        for needle in [
            "spec.resourceSelectors: at least one selector is required",
            "overriders.image[0]: Add needs a value",
            "overriders.args[0]: operator replace is not supported",
            "overriders.env[0]: Add needs a value",
            "jsonPatch[0]: unknown op \"frobnicate\"",
            "jsonPatch[1]: path \"a\" is not a JSON pointer",
            "jsonPatch[2]: op replace needs a value",
            "jsonPatch[3]: op move needs from",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
        }
    }
}
