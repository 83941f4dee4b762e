use std::path::Path;
use std::sync::Arc;

use meridian_core::model::ObjectKey;
use meridian_core::placement::{
    Decision, MapOverrider, OverrideOperator, OverrideRule, Overriders, PlacedReason,
};
use serde_json::json;

use super::*;
use crate::template::summarize;

/// A Deployment as a hub API server returns it: status, server-set metadata, the
/// last-applied annotation.
fn hub_deployment() -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "namespace": "shop",
            "name": "web",
            "uid": "1234",
            "resourceVersion": "99",
            "generation": 7,
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "selfLink": "/apis/apps/v1/namespaces/shop/deployments/web",
            "managedFields": [{"manager": "kubectl"}],
            "ownerReferences": [{"kind": "Thing", "name": "owner"}],
            "labels": {"app": "web"},
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{...}",
                "team": "shop"
            }
        },
        "spec": {
            "replicas": 9,
            "template": {"spec": {"containers": [{"name": "web", "image": "nginx:1.25"}]}}
        },
        "status": {"readyReplicas": 9}
    })
}

fn placed(cluster: &str, replicas: Option<u32>, overrides: &[(&str, usize)]) -> Placed {
    Placed {
        cluster: ClusterId::new(cluster),
        replicas,
        reason: PlacedReason::Weight(1),
        overrides: overrides
            .iter()
            .map(|(p, i)| (ObjectKey::new("shop", p), *i))
            .collect(),
    }
}

fn label_policy(name: &str, operator: OverrideOperator, labels: &[(&str, &str)]) -> OverridePolicy {
    OverridePolicy {
        key: ObjectKey::new("shop", name),
        selectors: Vec::new(),
        rules: vec![OverrideRule {
            targets: None,
            overriders: Overriders {
                labels: vec![MapOverrider {
                    operator,
                    values: labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                }],
                ..Default::default()
            },
        }],
    }
}

#[test]
fn manifest_cleans_sets_replicas_and_marks() {
    let t = summarize(hub_deployment()).unwrap();
    let out = manifest(&t, &placed("eu-1", Some(3), &[]), &[]).unwrap();
    assert_eq!(
        out,
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "namespace": "shop",
                "name": "web",
                "labels": {"app": "web", "app.kubernetes.io/managed-by": "meridian"},
                "annotations": {
                    "team": "shop",
                    "meridian.io/template": "apps/v1/Deployment/shop/web",
                    "meridian.io/template-generation": "7"
                }
            },
            "spec": {
                "replicas": 3,
                "template": {"spec": {"containers": [{"name": "web", "image": "nginx:1.25"}]}}
            }
        })
    );
    // The template itself is untouched.
    assert_eq!(*t.body, hub_deployment());
}

#[test]
fn replica_field_per_kind() {
    let job = json!({"apiVersion": "batch/v1", "kind": "Job",
                     "metadata": {"namespace": "shop", "name": "j"}});
    let t = summarize(job).unwrap();
    let out = manifest(&t, &placed("eu-1", Some(4), &[]), &[]).unwrap();
    assert_eq!(out["spec"], json!({"parallelism": 4}));

    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"namespace": "shop", "name": "c"}, "data": {"a": "1"}});
    let t = summarize(cm).unwrap();
    let out = manifest(&t, &placed("eu-1", None, &[]), &[]).unwrap();
    assert_eq!(out.get("spec"), None);
    assert_eq!(out["data"], json!({"a": "1"}));
    assert_eq!(
        out["metadata"]["annotations"]["meridian.io/template-generation"],
        "0"
    );

    let t = summarize(hub_deployment()).unwrap();
    let out = manifest(&t, &placed("eu-1", None, &[]), &[]).unwrap();
    assert_eq!(
        out["spec"]["replicas"], 9,
        "no replicas decided: the template's stay"
    );
}

#[test]
fn overrides_cannot_remove_meridians_marks() {
    let t = summarize(hub_deployment()).unwrap();
    let policies = [
        label_policy(
            "hostile",
            OverrideOperator::Add,
            &[("app.kubernetes.io/managed-by", "argo")],
        ),
        label_policy("region", OverrideOperator::Add, &[("region", "eu")]),
    ];
    let out = manifest(
        &t,
        &placed("eu-1", Some(3), &[("hostile", 0), ("region", 0)]),
        &policies,
    )
    .unwrap();
    assert_eq!(
        out["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "meridian"
    );
    assert_eq!(out["metadata"]["labels"]["region"], "eu");
}

#[test]
fn a_copy_says_which_override_rules_it_received() {
    let t = summarize(hub_deployment()).unwrap();
    let digest = |policies: &[OverridePolicy], rules: &[(&str, usize)]| {
        let out = manifest(&t, &placed("eu-1", Some(3), rules), policies).unwrap();
        out["metadata"]["annotations"]
            .get(OVERRIDES_ANNOTATION)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let eu = [label_policy(
        "region",
        OverrideOperator::Add,
        &[("region", "eu")],
    )];
    let us = [label_policy(
        "region",
        OverrideOperator::Add,
        &[("region", "us")],
    )];
    assert_eq!(digest(&eu, &[]), None, "no rule applies: no digest");
    let first = digest(&eu, &[("region", 0)]).expect("a digest");
    assert_eq!(first.len(), 16, "{first}");
    assert_eq!(digest(&eu, &[("region", 0)]), Some(first.clone()), "stable");
    assert_ne!(
        digest(&us, &[("region", 0)]),
        Some(first),
        "another change, another digest"
    );
}

#[test]
fn override_errors_name_the_cluster_and_policy() {
    let t = summarize(hub_deployment()).unwrap();
    let policies = [label_policy(
        "p",
        OverrideOperator::Replace,
        &[("absent", "x")],
    )];
    let err = manifest(&t, &placed("us-1", Some(3), &[("p", 0)]), &policies).unwrap_err();
    assert_eq!(
        describe(&err),
        "the overrides for cluster us-1 cannot apply: override policy shop/p rule 0: \
         overriders.labels[0] cannot apply: no key \"absent\" to replace"
    );
}

#[test]
fn paths() {
    let eu = ClusterId::new("eu-1");
    let object = |kind: &str, ns: Option<&str>, name: &str| {
        let mut o = json!({"kind": kind, "metadata": {"name": name}});
        if let Some(ns) = ns {
            o["metadata"]["namespace"] = json!(ns);
        }
        o
    };
    assert_eq!(
        path(&eu, &object("Deployment", Some("shop"), "web")).unwrap(),
        Path::new("eu-1/shop/Deployment.web.yaml")
    );
    assert_eq!(
        path(&eu, &object("ClusterRole", None, "system:controller:x")).unwrap(),
        Path::new("eu-1/_cluster/ClusterRole.system:controller:x.yaml")
    );
    assert_eq!(
        path(&eu, &object("ConfigMap", Some("shop"), "web.v1.config")).unwrap(),
        Path::new("eu-1/shop/ConfigMap.web.v1.config.yaml")
    );

    let refused = [
        (
            "name with a slash",
            eu.clone(),
            object("ConfigMap", Some("shop"), "../../etc/passwd"),
        ),
        (
            "name ..",
            eu.clone(),
            object("ConfigMap", Some("shop"), ".."),
        ),
        ("name .", eu.clone(), object("ConfigMap", Some("shop"), ".")),
        (
            "backslash",
            eu.clone(),
            object("ConfigMap", Some("shop"), "a\\b"),
        ),
        (
            "newline",
            eu.clone(),
            object("ConfigMap", Some("shop"), "a\nb"),
        ),
        (
            "namespace ..",
            eu.clone(),
            object("ConfigMap", Some(".."), "a"),
        ),
        (
            "namespace with a slash",
            eu.clone(),
            object("ConfigMap", Some("a/b"), "a"),
        ),
        (
            "namespace _cluster",
            eu.clone(),
            object("ConfigMap", Some("_cluster"), "a"),
        ),
        (
            "kind with a slash",
            eu.clone(),
            object("a/../b", Some("shop"), "a"),
        ),
        (
            "kind with a dot",
            eu.clone(),
            object("Config.Map", Some("shop"), "a"),
        ),
        (
            "cluster ..",
            ClusterId::new(".."),
            object("ConfigMap", Some("shop"), "a"),
        ),
        (
            "cluster with a slash",
            ClusterId::new("a/b"),
            object("ConfigMap", Some("shop"), "a"),
        ),
        (
            "no name",
            eu.clone(),
            json!({"kind": "ConfigMap", "metadata": {}}),
        ),
        ("no kind", eu.clone(), json!({"metadata": {"name": "a"}})),
    ];
    for (name, cluster, object) in refused {
        assert!(
            path(&cluster, &object).is_err(),
            "{name}: {:?}",
            path(&cluster, &object)
        );
    }
    let err = path(&eu, &object("ConfigMap", Some("shop"), "a/b")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "metadata.name \"a/b\" cannot be a path component: contains a path separator"
    );
}

#[test]
fn yaml_is_sorted_and_deterministic() {
    let a = json!({"spec": {"b": 1, "a": [{"z": 1, "y": "2"}]}, "kind": "X", "apiVersion": "v1",
                   "metadata": {"name": "n", "annotations": {"g": "7", "flag": "true", "empty": ""}}});
    let mut b = Map::new();
    b.insert("metadata".into(), a["metadata"].clone());
    b.insert("apiVersion".into(), a["apiVersion"].clone());
    b.insert("kind".into(), a["kind"].clone());
    b.insert("spec".into(), json!({"a": [{"y": "2", "z": 1}], "b": 1}));
    let yaml = to_yaml(&a);
    assert_eq!(yaml, to_yaml(&Value::Object(b)));
    assert_eq!(
        yaml,
        "apiVersion: v1\n\
         kind: X\n\
         metadata:\n  annotations:\n    empty: ''\n    flag: 'true'\n    g: '7'\n  name: n\n\
         spec:\n  a:\n  - y: '2'\n    z: 1\n  b: 1\n"
    );
    // It reads back as the same object (strings that look like numbers stay strings).
    let back: Value = serde_yaml_ng::from_str(&yaml).unwrap();
    assert_eq!(back, a);
}

fn decision(template: &Template, outcome: Outcome, placed: Vec<Placed>) -> Decision {
    Decision {
        template: template.key.clone(),
        policy: Some(ObjectKey::new("shop", "eu-first")),
        outcome,
        tier: Some(Arc::from("eu")),
        standby_tier: None,
        placed,
        excluded: Arc::default(),
        scores: None,
    }
}

#[test]
fn render_all_files_and_problems() {
    let web = summarize(hub_deployment()).unwrap();
    let config = summarize(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"namespace": "shop", "name": "web-config"}, "data": {"k": "v"}}))
    .unwrap();
    let ghost = summarize(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"namespace": "shop", "name": "ghost"}}))
    .unwrap();
    let policies = [label_policy(
        "bad",
        OverrideOperator::Replace,
        &[("absent", "x")],
    )];
    let mut placements = Placements::default();
    for d in [
        decision(
            &web,
            Outcome::Scheduled,
            vec![
                placed("eu-1", Some(3), &[]),
                placed("eu-2", Some(6), &[]),
                placed("us-1", Some(0), &[("bad", 0)]),
            ],
        ),
        decision(
            &config,
            Outcome::Unschedulable {
                reason: "no cluster has room".into(),
            },
            vec![placed("eu-1", None, &[])],
        ),
        decision(&ghost, Outcome::Scheduled, vec![placed("eu-1", None, &[])]),
    ] {
        placements.decisions.insert(d.template.clone(), Arc::new(d));
    }
    let rendered = render_all(&placements, &[web.clone(), config.clone()], &policies);
    let paths: Vec<&Path> = rendered.files.keys().map(PathBuf::as_path).collect();
    assert_eq!(
        paths,
        [
            Path::new("eu-1/shop/ConfigMap.web-config.yaml"),
            Path::new("eu-1/shop/Deployment.web.yaml"),
            Path::new("eu-2/shop/Deployment.web.yaml"),
        ]
    );
    let eu2: Value =
        serde_yaml_ng::from_str(&rendered.files[Path::new("eu-2/shop/Deployment.web.yaml")])
            .unwrap();
    assert_eq!(eu2["spec"]["replicas"], 6);

    assert_eq!(
        rendered.problems,
        vec![
            RenderProblem {
                template: web.key.clone(),
                cluster: Some(ClusterId::new("us-1")),
                reason:
                    "the overrides for cluster us-1 cannot apply: override policy shop/bad rule 0: \
                         overriders.labels[0] cannot apply: no key \"absent\" to replace"
                        .into(),
            },
            RenderProblem {
                template: config.key.clone(),
                cluster: None,
                reason: "unschedulable: no cluster has room".into(),
            },
            RenderProblem {
                template: ghost.key.clone(),
                cluster: None,
                reason: "no template of that key to render".into(),
            },
        ]
    );
}

#[test]
fn two_templates_on_one_path_is_a_problem_not_an_overwrite() {
    let apps = summarize(hub_deployment()).unwrap();
    let mut custom = hub_deployment();
    custom["apiVersion"] = json!("example.com/v1");
    let custom = summarize(custom).unwrap();
    let mut placements = Placements::default();
    for t in [&apps, &custom] {
        let d = decision(t, Outcome::Scheduled, vec![placed("eu-1", None, &[])]);
        placements.decisions.insert(d.template.clone(), Arc::new(d));
    }
    let rendered = render_all(&placements, &[apps.clone(), custom.clone()], &[]);
    assert_eq!(rendered.files.len(), 1);
    let kept = &rendered.files[Path::new("eu-1/shop/Deployment.web.yaml")];
    assert!(kept.contains("apiVersion: apps/v1"), "{kept}");
    assert_eq!(rendered.problems.len(), 1);
    assert_eq!(rendered.problems[0].template, custom.key);
    assert_eq!(
        rendered.problems[0].reason,
        "eu-1/shop/Deployment.web.yaml is already rendered from another template"
    );
}

#[test]
fn what_the_hub_assigned_is_not_rendered() {
    let service = |cluster_ip: &str| {
        summarize(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": cluster_ip, "clusterIPs": [cluster_ip], "ports": [{"port": 80}]}
        }))
        .unwrap()
    };
    let out = manifest(&service("10.96.0.7"), &placed("eu-1", None, &[]), &[]).unwrap();
    assert_eq!(out["spec"], json!({"ports": [{"port": 80}]}));
    // Headless stays headless.
    let out = manifest(&service("None"), &placed("eu-1", None, &[]), &[]).unwrap();
    assert_eq!(out["spec"]["clusterIP"], "None");

    let job = summarize(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "migrate", "namespace": "shop"},
        "spec": {
            "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "abc"}},
            "template": {"metadata": {"labels": {"job-name": "migrate", "controller-uid": "abc",
                                                  "batch.kubernetes.io/controller-uid": "abc"}},
                         "spec": {"containers": [{"name": "m", "image": "m:1"}], "restartPolicy": "Never"}}
        }
    }))
    .unwrap();
    let out = manifest(&job, &placed("eu-1", Some(1), &[]), &[]).unwrap();
    assert!(out["spec"].get("selector").is_none(), "{out}");
    assert_eq!(
        out["spec"]["template"]["metadata"]["labels"],
        json!({"job-name": "migrate"})
    );

    let pvc = summarize(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": "shop"},
        "spec": {"volumeName": "pv-hub-1", "accessModes": ["ReadWriteOnce"]}
    }))
    .unwrap();
    let out = manifest(&pvc, &placed("eu-1", None, &[]), &[]).unwrap();
    assert_eq!(out["spec"], json!({"accessModes": ["ReadWriteOnce"]}));
}
