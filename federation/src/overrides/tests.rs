use std::collections::BTreeMap;

use meridian_core::model::ClusterId;
use meridian_core::placement::{ImageComponent, OverrideRule, PlacedReason};
use proptest::prelude::*;
use serde_json::json;

use super::OverrideOperator::{Add, Remove, Replace};
use super::*;
use crate::describe;

fn deployment() -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"namespace": "shop", "name": "web", "labels": {"app": "web"}},
        "spec": {
            "replicas": 3,
            "template": {"spec": {
                "initContainers": [{"name": "migrate", "image": "migrate:1"}],
                "containers": [
                    {"name": "web", "image": "docker.io/library/nginx:1.25",
                     "command": ["nginx"], "args": ["-g", "daemon off;", "-g"],
                     "env": [{"name": "MODE", "value": "prod"},
                             {"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db", "key": "url"}}}]},
                    {"name": "proxy", "image": "localhost:5000/envoy:v1"}
                ]
            }}
        }
    })
}

fn images(body: &Value) -> Vec<String> {
    let spec = &body["spec"]["template"]["spec"];
    ["initContainers", "containers"]
        .iter()
        .flat_map(|k| spec[k].as_array().unwrap().iter())
        .map(|c| c["image"].as_str().unwrap().to_string())
        .collect()
}

fn web(body: &Value) -> &Value {
    &body["spec"]["template"]["spec"]["containers"][0]
}

fn image(
    names: &[&str],
    component: ImageComponent,
    operator: OverrideOperator,
    value: &str,
) -> ImageOverrider {
    ImageOverrider {
        container_names: names.iter().map(|s| s.to_string()).collect(),
        component,
        operator,
        value: value.into(),
    }
}

fn args_o(container: &str, operator: OverrideOperator, values: &[&str]) -> ArgsOverrider {
    ArgsOverrider {
        container_name: container.into(),
        operator,
        values: values.iter().map(|s| s.to_string()).collect(),
    }
}

fn env_o(
    container: &str,
    operator: OverrideOperator,
    name: &str,
    value: Option<&str>,
) -> EnvOverrider {
    EnvOverrider {
        container_name: container.into(),
        operator,
        name: name.into(),
        value: value.map(str::to_string),
    }
}

fn map_o(operator: OverrideOperator, values: &[(&str, &str)]) -> MapOverrider {
    MapOverrider {
        operator,
        values: values
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn patch(op: &str, path: &str, from: Option<&str>, value: Option<Value>) -> JsonPatch {
    JsonPatch {
        op: op.into(),
        path: path.into(),
        from: from.map(str::to_string),
        value,
    }
}

/// Applies `rule`, asserting the body is unchanged when it fails.
fn run(body: &Value, rule: &Overriders) -> Result<Value, String> {
    let mut out = body.clone();
    match apply(&mut out, rule) {
        Ok(()) => Ok(out),
        Err(e) => {
            assert_eq!(&out, body, "changed on error: {}", describe(&e));
            Err(describe(&e))
        }
    }
}

#[test]
fn image_every_container() {
    let rule = Overriders {
        image: vec![image(
            &[],
            ImageComponent::Registry,
            Replace,
            "mirror.example.com",
        )],
        ..Default::default()
    };
    let out = run(&deployment(), &rule).unwrap();
    assert_eq!(
        images(&out),
        [
            "mirror.example.com/migrate:1",
            "mirror.example.com/library/nginx:1.25",
            "mirror.example.com/envoy:v1"
        ]
    );
}

#[test]
fn image_named_containers_only() {
    let rule = Overriders {
        image: vec![
            image(&["proxy"], ImageComponent::Tag, Replace, "v2"),
            image(&["web", "migrate"], ImageComponent::Registry, Remove, ""),
        ],
        ..Default::default()
    };
    let out = run(&deployment(), &rule).unwrap();
    assert_eq!(
        images(&out),
        ["migrate:1", "library/nginx:1.25", "localhost:5000/envoy:v2"]
    );
}

#[test]
fn image_errors() {
    let missing = Overriders {
        image: vec![
            image(&[], ImageComponent::Tag, Replace, "ok"),
            image(&["web", "nope"], ImageComponent::Tag, Replace, "v2"),
        ],
        ..Default::default()
    };
    assert_eq!(
        run(&deployment(), &missing).unwrap_err(),
        "overriders.image[1] cannot apply: no container named \"nope\""
    );
    let invalid = Overriders {
        image: vec![image(&["web"], ImageComponent::Repository, Remove, "")],
        ..Default::default()
    };
    let err = run(&deployment(), &invalid).unwrap_err();
    assert!(err.contains("image of container \"web\""), "{err}");
    assert!(err.contains("cannot remove the repository"), "{err}");
}

#[test]
fn container_overriders_skip_kinds_without_pods() {
    let service =
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {}});
    let rule = Overriders {
        image: vec![image(&["web"], ImageComponent::Tag, Replace, "v2")],
        command: vec![args_o("web", Add, &["x"])],
        env: vec![env_o("web", Replace, "MODE", Some("x"))],
        ..Default::default()
    };
    assert_eq!(run(&service, &rule).unwrap(), service);
}

#[test]
fn cron_job_containers_are_found() {
    let cron = json!({
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "r"},
        "spec": {"jobTemplate": {"spec": {"template": {"spec": {
            "containers": [{"name": "report", "image": "report:1"}]}}}}}
    });
    let rule = Overriders {
        image: vec![image(&["report"], ImageComponent::Registry, Add, "ghcr.io")],
        args: vec![args_o("report", Add, &["--daily"])],
        ..Default::default()
    };
    let out = run(&cron, &rule).unwrap();
    let c = &out["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "ghcr.io/report:1");
    assert_eq!(c["args"], json!(["--daily"]));
}

#[test]
fn command_and_args() {
    let rule = Overriders {
        command: vec![args_o("web", Add, &["-c", "/etc/nginx.conf"])],
        args: vec![
            args_o("web", Remove, &["-g", "absent"]),
            args_o("proxy", Add, &["--v=2"]),
        ],
        ..Default::default()
    };
    let out = run(&deployment(), &rule).unwrap();
    assert_eq!(
        web(&out)["command"],
        json!(["nginx", "-c", "/etc/nginx.conf"])
    );
    assert_eq!(
        web(&out)["args"],
        json!(["daemon off;"]),
        "every occurrence removed"
    );
    assert_eq!(
        out["spec"]["template"]["spec"]["containers"][1]["args"],
        json!(["--v=2"])
    );

    let nothing = Overriders {
        command: vec![args_o("proxy", Remove, &["x"])],
        ..Default::default()
    };
    let out = run(&deployment(), &nothing).unwrap();
    assert_eq!(
        out,
        deployment(),
        "removing from an absent command adds no field"
    );

    let replace = Overriders {
        args: vec![args_o("web", Replace, &["x"])],
        ..Default::default()
    };
    assert!(
        run(&deployment(), &replace)
            .unwrap_err()
            .contains("not supported")
    );

    let missing = Overriders {
        command: vec![args_o("nope", Add, &["x"])],
        ..Default::default()
    };
    assert_eq!(
        run(&deployment(), &missing).unwrap_err(),
        "overriders.command[0] cannot apply: no container named \"nope\""
    );
}

#[test]
fn env_table() {
    struct Case {
        name: &'static str,
        o: EnvOverrider,
        expect: Result<Value, &'static str>,
    }
    let cases = [
        Case {
            name: "add a new variable",
            o: env_o("web", Add, "REGION", Some("eu")),
            expect: Ok(json!([{"name": "MODE", "value": "prod"},
                             {"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db", "key": "url"}}},
                             {"name": "REGION", "value": "eu"}])),
        },
        Case {
            name: "add replaces one of that name, valueFrom included",
            o: env_o("web", Add, "DB", Some("sqlite://")),
            expect: Ok(
                json!([{"name": "MODE", "value": "prod"}, {"name": "DB", "value": "sqlite://"}]),
            ),
        },
        Case {
            name: "replace an existing one",
            o: env_o("web", Replace, "MODE", Some("dev")),
            expect: Ok(json!([{"name": "MODE", "value": "dev"},
                             {"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db", "key": "url"}}}])),
        },
        Case {
            name: "remove",
            o: env_o("web", Remove, "MODE", None),
            expect: Ok(
                json!([{"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db", "key": "url"}}}]),
            ),
        },
        Case {
            name: "replace an absent one",
            o: env_o("web", Replace, "NOPE", Some("x")),
            expect: Err(
                "overriders.env[0] cannot apply: container \"web\" has no env \"NOPE\" to replace",
            ),
        },
        Case {
            name: "replace in a container without env",
            o: env_o("proxy", Replace, "NOPE", Some("x")),
            expect: Err(
                "overriders.env[0] cannot apply: container \"proxy\" has no env \"NOPE\" to replace",
            ),
        },
        Case {
            name: "add without a value",
            o: env_o("web", Add, "X", None),
            expect: Err("overriders.env[0] cannot apply: Add needs a value"),
        },
        Case {
            name: "a container that is not there",
            o: env_o("nope", Add, "X", Some("1")),
            expect: Err("overriders.env[0] cannot apply: no container named \"nope\""),
        },
    ];
    for c in cases {
        let rule = Overriders {
            env: vec![c.o],
            ..Default::default()
        };
        let got = run(&deployment(), &rule).map(|out| web(&out)["env"].clone());
        assert_eq!(got, c.expect.map_err(str::to_string), "{}", c.name);
    }
}

#[test]
fn env_add_creates_the_list_and_remove_of_absent_is_nothing() {
    let rule = Overriders {
        env: vec![
            env_o("proxy", Add, "A", Some("1")),
            env_o("migrate", Remove, "B", None),
        ],
        ..Default::default()
    };
    let out = run(&deployment(), &rule).unwrap();
    let spec = &out["spec"]["template"]["spec"];
    assert_eq!(
        spec["containers"][1]["env"],
        json!([{"name": "A", "value": "1"}])
    );
    assert_eq!(spec["initContainers"][0].get("env"), None);
}

#[test]
fn labels_and_annotations() {
    let rule = Overriders {
        labels: vec![
            map_o(Add, &[("region", "eu"), ("app", "shop-web")]),
            map_o(Remove, &[("absent", ""), ("region", "")]),
            map_o(Replace, &[("app", "web2")]),
        ],
        annotations: vec![map_o(Add, &[("example.com/owner", "team-a")])],
        ..Default::default()
    };
    let out = run(&deployment(), &rule).unwrap();
    assert_eq!(out["metadata"]["labels"], json!({"app": "web2"}));
    assert_eq!(
        out["metadata"]["annotations"],
        json!({"example.com/owner": "team-a"})
    );

    let absent = Overriders {
        annotations: vec![map_o(Replace, &[("nope", "x")])],
        ..Default::default()
    };
    assert_eq!(
        run(&deployment(), &absent).unwrap_err(),
        "overriders.annotations[0] cannot apply: no key \"nope\" to replace"
    );
    let remove_none = Overriders {
        annotations: vec![map_o(Remove, &[("nope", "")])],
        ..Default::default()
    };
    assert_eq!(run(&deployment(), &remove_none).unwrap(), deployment());
}

#[test]
fn json_patch_operations() {
    let rule = Overriders {
        json_patch: vec![
            patch("test", "/spec/replicas", None, Some(json!(3))),
            patch("replace", "/spec/replicas", None, Some(json!(5))),
            patch(
                "add",
                "/spec/template/spec/nodeSelector",
                None,
                Some(json!({"disk": "ssd"})),
            ),
            patch(
                "copy",
                "/metadata/labels/copied",
                Some("/metadata/labels/app"),
                None,
            ),
            patch(
                "move",
                "/metadata/labels/moved",
                Some("/metadata/labels/app"),
                None,
            ),
            patch("remove", "/spec/template/spec/initContainers", None, None),
            patch(
                "add",
                "/spec/template/spec/containers/-",
                None,
                Some(json!({"name": "new", "image": "x"})),
            ),
        ],
        ..Default::default()
    };
    let out = run(&deployment(), &rule).unwrap();
    assert_eq!(out["spec"]["replicas"], 5);
    assert_eq!(
        out["spec"]["template"]["spec"]["nodeSelector"],
        json!({"disk": "ssd"})
    );
    assert_eq!(
        out["metadata"]["labels"],
        json!({"copied": "web", "moved": "web"})
    );
    assert_eq!(out["spec"]["template"]["spec"].get("initContainers"), None);
    assert_eq!(
        out["spec"]["template"]["spec"]["containers"][2]["name"],
        "new"
    );
}

#[test]
fn json_patch_failures_leave_the_body_alone() {
    let cases = [
        (
            "missing path",
            patch(
                "replace",
                "/spec/strategy/type",
                None,
                Some(json!("Recreate")),
            ),
            "overriders.jsonPatch[1] cannot apply: the patch does not apply",
        ),
        (
            "remove missing",
            patch("remove", "/metadata/annotations", None, None),
            "overriders.jsonPatch[1] cannot apply",
        ),
        (
            "test fails",
            patch("test", "/spec/replicas", None, Some(json!(9))),
            "value did not match",
        ),
        (
            "move from missing",
            patch("move", "/a", Some("/nope"), None),
            "\"from\" path is invalid",
        ),
        (
            "unknown op",
            patch("merge", "/spec", None, Some(json!({}))),
            "overriders.jsonPatch[1] cannot apply: not a valid JSON patch operation",
        ),
        (
            "add without value",
            patch("add", "/spec/x", None, None),
            "not a valid JSON patch operation",
        ),
        (
            "bad pointer",
            patch("add", "spec", None, Some(json!(1))),
            "not a valid JSON patch operation",
        ),
    ];
    for (name, second, expect) in cases {
        let rule = Overriders {
            labels: vec![map_o(Add, &[("before", "patch")])],
            json_patch: vec![
                patch("replace", "/spec/replicas", None, Some(json!(7))),
                second,
            ],
            ..Default::default()
        };
        let err = run(&deployment(), &rule).unwrap_err();
        assert!(err.contains(expect), "{name}: {err}");
    }
}

#[test]
fn fixed_order_inside_a_rule() {
    // The patch tests what the image and labels overriders wrote before it, whatever order
    // the fields are listed in.
    let rule = Overriders {
        json_patch: vec![
            patch("test", "/metadata/labels/region", None, Some(json!("eu"))),
            patch(
                "test",
                "/spec/template/spec/containers/0/image",
                None,
                Some(json!("docker.io/library/nginx:1.26")),
            ),
            patch(
                "test",
                "/spec/template/spec/containers/0/env/0/value",
                None,
                Some(json!("canary")),
            ),
            patch("remove", "/metadata/annotations/note", None, None),
        ],
        annotations: vec![map_o(Add, &[("note", "x")])],
        labels: vec![map_o(Add, &[("region", "eu")])],
        env: vec![env_o("web", Replace, "MODE", Some("canary"))],
        image: vec![image(&["web"], ImageComponent::Tag, Replace, "1.26")],
        ..Default::default()
    };
    let out = run(&deployment(), &rule).unwrap();
    assert_eq!(out["metadata"].get("annotations"), Some(&json!({})));
}

fn policy(name: &str, rules: Vec<Overriders>) -> OverridePolicy {
    OverridePolicy {
        key: ObjectKey::new("shop", name),
        selectors: Vec::new(),
        rules: rules
            .into_iter()
            .map(|overriders| OverrideRule {
                targets: None,
                overriders,
            })
            .collect(),
    }
}

fn placed(overrides: &[(&str, usize)]) -> Placed {
    Placed {
        cluster: ClusterId::new("eu-1"),
        replicas: Some(2),
        reason: PlacedReason::Duplicated,
        overrides: overrides
            .iter()
            .map(|(p, i)| (ObjectKey::new("shop", p), *i))
            .collect(),
    }
}

fn label(value: &str) -> Overriders {
    Overriders {
        labels: vec![map_o(Add, &[("tier", value)])],
        ..Default::default()
    }
}

#[test]
fn later_rules_win() {
    let policies = [
        policy("all", vec![label("all-0"), label("all-1")]),
        policy("named", vec![label("named-0")]),
    ];
    let body = deployment();
    let tier = |order: &[(&str, usize)]| {
        apply_all(&body, &placed(order), &policies).unwrap()["metadata"]["labels"]["tier"].clone()
    };
    assert_eq!(tier(&[("all", 0), ("all", 1), ("named", 0)]), "named-0");
    assert_eq!(tier(&[("named", 0), ("all", 1)]), "all-1");
    assert_eq!(tier(&[("all", 1), ("all", 0)]), "all-0");
    assert_eq!(apply_all(&body, &placed(&[]), &policies).unwrap(), body);
}

#[test]
fn apply_all_errors_name_the_policy_and_rule() {
    let bad = Overriders {
        env: vec![env_o("web", Replace, "NOPE", Some("x"))],
        ..Default::default()
    };
    let policies = [
        policy("a", vec![label("a")]),
        policy("b", vec![label("b"), bad]),
    ];
    let body = deployment();
    let err = apply_all(&body, &placed(&[("a", 0), ("b", 1)]), &policies).unwrap_err();
    assert_eq!(
        describe(&err),
        "override policy shop/b rule 1: overriders.env[0] cannot apply: container \"web\" has no env \"NOPE\" to replace"
    );
    assert!(matches!(err, OverrideError::Rule { rule: 1, .. }));
    let err = apply_all(&body, &placed(&[("c", 0)]), &policies).unwrap_err();
    assert_eq!(err.to_string(), "override policy shop/c is not known");
    let err = apply_all(&body, &placed(&[("a", 3)]), &policies).unwrap_err();
    assert_eq!(err.to_string(), "override policy shop/a has no rule 3");
}

fn operator() -> impl Strategy<Value = OverrideOperator> {
    prop_oneof![Just(Add), Just(Remove), Just(Replace)]
}

fn container() -> impl Strategy<Value = String> {
    prop_oneof![Just("web"), Just("proxy"), Just("migrate"), Just("nope")].prop_map(String::from)
}

fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("MODE"),
        Just("app"),
        Just("x"),
        Just("v2"),
        Just("-g"),
        Just("Bad Value")
    ]
    .prop_map(String::from)
}

fn args_overrider() -> impl Strategy<Value = ArgsOverrider> {
    (container(), operator(), prop::collection::vec(word(), 0..3)).prop_map(
        |(container_name, operator, values)| ArgsOverrider {
            container_name,
            operator,
            values,
        },
    )
}

fn map_overrider() -> impl Strategy<Value = MapOverrider> {
    (
        operator(),
        prop::collection::btree_map(word(), word(), 0..3),
    )
        .prop_map(|(operator, values): (_, BTreeMap<_, _>)| MapOverrider { operator, values })
}

fn overriders() -> impl Strategy<Value = Overriders> {
    let component = prop_oneof![
        Just(ImageComponent::Registry),
        Just(ImageComponent::Repository),
        Just(ImageComponent::Tag)
    ];
    let image = (
        prop::collection::vec(container(), 0..2),
        component,
        operator(),
        prop_oneof![Just("mirror.io".to_string()), word()],
    )
        .prop_map(
            |(container_names, component, operator, value)| ImageOverrider {
                container_names,
                component,
                operator,
                value,
            },
        );
    let env = (container(), operator(), word(), prop::option::of(word())).prop_map(
        |(container_name, operator, name, value)| EnvOverrider {
            container_name,
            operator,
            name,
            value,
        },
    );
    let pointer = prop_oneof![
        Just("/spec/replicas"),
        Just("/metadata/labels/app"),
        Just("/spec/missing/deep"),
        Just("/spec/template/spec/containers/0/args/1")
    ];
    let op = prop_oneof![
        Just("add"),
        Just("remove"),
        Just("replace"),
        Just("test"),
        Just("copy")
    ];
    let json_patch = (
        op,
        pointer,
        prop::option::of(Just("/spec/replicas")),
        prop::option::of(Just(json!(3))),
    )
        .prop_map(|(op, path, from, value)| JsonPatch {
            op: op.into(),
            path: path.into(),
            from: from.map(String::from),
            value,
        });
    (
        prop::collection::vec(image, 0..3),
        prop::collection::vec(args_overrider(), 0..2),
        prop::collection::vec(args_overrider(), 0..2),
        prop::collection::vec(env, 0..3),
        prop::collection::vec(map_overrider(), 0..2),
        prop::collection::vec(map_overrider(), 0..2),
        prop::collection::vec(json_patch, 0..3),
    )
        .prop_map(
            |(image, command, args, env, labels, annotations, json_patch)| Overriders {
                image,
                command,
                args,
                env,
                labels,
                annotations,
                json_patch,
            },
        )
}

proptest! {
    /// Whatever a rule holds, it applies whole or not at all.
    #[test]
    fn failing_rules_leave_the_body_unchanged(rule in overriders()) {
        let original = deployment();
        let mut body = original.clone();
        if apply(&mut body, &rule).is_err() {
            prop_assert_eq!(body, original);
        }
    }

    /// A rule ending in a patch that cannot apply never changes the body, whatever came first.
    #[test]
    fn a_failing_patch_undoes_the_whole_rule(mut rule in overriders()) {
        rule.json_patch.push(patch("remove", "/spec/does/not/exist", None, None));
        let original = deployment();
        let mut body = original.clone();
        prop_assert!(apply(&mut body, &rule).is_err());
        prop_assert_eq!(body, original);
    }
}
