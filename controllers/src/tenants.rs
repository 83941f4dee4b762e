//! Tenant → the core's `Tenant`, with validation: a Tenant with any problem is not used (its
//! users then reach nothing through the gateway they could not reach before: an invalid
//! Tenant bounds nobody, so the members' RBAC alone decides — it never widens a valid one),
//! and every problem names the field.

use std::collections::BTreeSet;

use meridian_core::tenant::{TENANT_LABEL, TenantNamespaces};
use meridian_core::{LabelSelector, Tenant};

use crate::crd;
use crate::kubernetes::MANAGED_BY;
use crate::policy::{cluster_set, label_selector};
use crate::validate::{NameRule, name};

pub fn tenant(t: &crd::Tenant) -> Result<Tenant, Vec<String>> {
    let mut problems = Vec::new();
    let name = t.metadata.name.clone().unwrap_or_default();
    if name.is_empty() {
        problems.push("metadata.name is required".into());
    }
    let subjects = &t.spec.subjects;
    if subjects.users.is_empty() && subjects.groups.is_empty() {
        problems.push("spec.subjects: at least one user or group is required".into());
    }
    for (at, list) in [("users", &subjects.users), ("groups", &subjects.groups)] {
        if let Some(i) = list.iter().position(String::is_empty) {
            problems.push(format!("spec.subjects.{at}[{i}] is empty"));
        }
    }
    let namespaces = namespaces(&t.spec, &mut problems);
    let clusters = cluster_set(
        &t.spec.clusters.cluster_names,
        t.spec.clusters.label_selector.as_ref(),
        "spec.clusters",
        &mut problems,
    );
    let (Some(namespaces), Some(clusters)) = (namespaces, clusters) else {
        return Err(problems);
    };
    if !problems.is_empty() {
        return Err(problems);
    }
    // meridian's own marks are not the tenant's to set.
    let labels = t
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| *k != TENANT_LABEL && *k != MANAGED_BY.0)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(Tenant {
        name,
        users: subjects.users.iter().cloned().collect(),
        groups: subjects.groups.iter().cloned().collect(),
        namespaces,
        clusters,
        labels,
    })
}

fn namespaces(spec: &crd::TenantSpec, problems: &mut Vec<String>) -> Option<TenantNamespaces> {
    match (&spec.namespaces, &spec.namespace_selector) {
        (Some(_), Some(_)) => {
            problems.push("spec.namespaces and spec.namespaceSelector: one, not both".into());
            None
        }
        (None, None) => {
            problems.push("spec.namespaces or spec.namespaceSelector is required".into());
            None
        }
        (Some(names), None) => {
            let mut out = BTreeSet::new();
            for (i, n) in names.iter().enumerate() {
                match name(NameRule::Dns1123Label, &format!("spec.namespaces[{i}]"), n) {
                    Ok(()) => {
                        out.insert(n.clone());
                    }
                    Err(invalid) => problems.push(invalid.to_string()),
                }
            }
            if names.is_empty() {
                problems.push("spec.namespaces: at least one namespace is required".into());
            }
            Some(TenantNamespaces::Named(out))
        }
        (None, Some(selector)) => {
            let selector: LabelSelector =
                label_selector(selector, "spec.namespaceSelector", problems)?;
            if selector.match_labels.is_empty() && selector.match_expressions.is_empty() {
                problems.push(
                    "spec.namespaceSelector: an empty selector would pick every namespace".into(),
                );
            }
            Some(TenantNamespaces::Selected(selector))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> crd::Tenant {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn a_tenant_converts_with_its_labels_but_not_meridians_marks() {
        let t = tenant(&parse(
            r#"
apiVersion: meridian.io/v1alpha1
kind: Tenant
metadata:
  name: shop
  labels: {team: shop, meridian.io/tenant: forged, app.kubernetes.io/managed-by: someone}
spec:
  subjects: {users: [oidc:ana], groups: [oidc:shop-devs]}
  namespaces: [shop, shop-dev]
  clusters: {clusterNames: [m1, m2]}
"#,
        ))
        .unwrap();
        assert_eq!(t.name, "shop");
        assert!(t.users.contains("oidc:ana") && t.groups.contains("oidc:shop-devs"));
        assert_eq!(
            t.namespaces,
            TenantNamespaces::Named(["shop".to_string(), "shop-dev".to_string()].into())
        );
        assert_eq!(t.clusters.names, ["m1", "m2"]);
        assert_eq!(t.labels, [("team".to_string(), "shop".to_string())].into());
    }

    #[test]
    fn every_problem_of_a_bad_tenant_is_named() {
        let problems = tenant(&parse(
            r#"
apiVersion: meridian.io/v1alpha1
kind: Tenant
metadata: {name: bad}
spec:
  subjects: {}
  namespaces: [Shop, "../x"]
  clusters: {}
"#,
        ))
        .unwrap_err();
        let all = problems.join("\n");
        assert!(
            all.contains("spec.subjects: at least one user or group"),
            "{all}"
        );
        assert!(all.contains("spec.namespaces[0]: \"Shop\""), "{all}");
        assert!(all.contains("spec.namespaces[1]"), "{all}");
        assert!(
            all.contains("spec.clusters: clusterNames or labelSelector is required"),
            "{all}"
        );

        let both = tenant(&parse(
            r#"
apiVersion: meridian.io/v1alpha1
kind: Tenant
metadata: {name: both}
spec:
  subjects: {users: [ana]}
  namespaces: [a]
  namespaceSelector: {matchLabels: {team: a}}
  clusters: {clusterNames: [m1]}
"#,
        ))
        .unwrap_err();
        assert!(both[0].contains("one, not both"), "{both:?}");

        let everything = tenant(&parse(
            r#"
apiVersion: meridian.io/v1alpha1
kind: Tenant
metadata: {name: all}
spec:
  subjects: {users: [ana]}
  namespaceSelector: {}
  clusters: {clusterNames: [m1]}
"#,
        ))
        .unwrap_err();
        assert!(everything[0].contains("empty selector"), "{everything:?}");
    }
}
