use proptest::prelude::*;
use serde_json::json;

use super::*;

/// A Deployment as meridian applies it.
fn applied() -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "namespace": "shop",
            "name": "web",
            "labels": {"app": "web", "app.kubernetes.io/managed-by": "meridian"},
            "annotations": {"meridian.io/template-generation": "7"}
        },
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [
                    {"name": "web", "image": "nginx:1.25",
                     "ports": [{"containerPort": 8080}],
                     "env": [{"name": "MODE", "value": "prod"}, {"name": "EMPTY", "value": ""}],
                     "resources": {"requests": {"cpu": "1000m", "memory": "1024Mi"},
                                   "limits": {"cpu": 2}}},
                    {"name": "proxy", "image": "envoy:v1", "args": ["--log", "info"]}
                ]}
            }
        }
    })
}

/// The same Deployment as the member returns it: server metadata, defaults, quantities
/// rewritten, another manager's label and sidecar, and a status.
fn live() -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "namespace": "shop",
            "name": "web",
            "uid": "abc",
            "resourceVersion": "42",
            "generation": 2,
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "managedFields": [{"manager": "meridian"}],
            "labels": {
                "app": "web",
                "app.kubernetes.io/managed-by": "meridian",
                "team": "added-by-someone-else"
            },
            "annotations": {
                "meridian.io/template-generation": "7",
                "deployment.kubernetes.io/revision": "2"
            }
        },
        "spec": {
            "replicas": 3,
            "revisionHistoryLimit": 10,
            "progressDeadlineSeconds": 600,
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "restartPolicy": "Always",
                    "dnsPolicy": "ClusterFirst",
                    "containers": [
                        {"name": "proxy", "image": "envoy:v1", "args": ["--log", "info"],
                         "imagePullPolicy": "IfNotPresent"},
                        {"name": "istio-proxy", "image": "istio/proxyv2"},
                        {"name": "web", "image": "nginx:1.25",
                         "imagePullPolicy": "IfNotPresent",
                         "terminationMessagePath": "/dev/termination-log",
                         "terminationMessagePolicy": "File",
                         "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                         "env": [{"name": "MODE", "value": "prod"}, {"name": "EMPTY"}],
                         "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                       "limits": {"cpu": "2"}}}
                    ]
                }
            }
        },
        "status": {"replicas": 3, "readyReplicas": 3}
    })
}

/// `live()` changed at `pointer`.
fn live_with(pointer: &str, value: Value) -> Value {
    let mut live = live();
    *live.pointer_mut(pointer).unwrap() = value;
    live
}

/// `live()` without the field at `pointer`.
fn live_without(pointer: &str) -> Value {
    let mut live = live();
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let key = &key.replace("~1", "/");
    match live.pointer_mut(parent).unwrap() {
        Value::Object(m) => {
            m.remove(key).unwrap();
        }
        Value::Array(a) => {
            a.remove(key.parse().unwrap());
        }
        _ => panic!("{parent} holds no {key}"),
    }
    live
}

#[test]
fn defaults_server_metadata_and_other_managers_are_not_drift() {
    assert_eq!(drifted(&applied(), &live()), Vec::<String>::new());
}

#[test]
fn an_object_is_contained_in_itself() {
    assert!(drifted(&applied(), &applied()).is_empty());
    assert!(drifted(&live(), &live()).is_empty());
}

struct Case {
    name: &'static str,
    live: Value,
    expect: &'static [&'static str],
}

#[test]
fn changes_to_what_meridian_set_are_drift() {
    let web = "/spec/template/spec/containers/2";
    let cases = [
        Case {
            name: "a changed image",
            live: live_with(&format!("{web}/image"), json!("nginx:1.27")),
            expect: &["/spec/template/spec/containers/0/image"],
        },
        Case {
            name: "a changed replica count",
            live: live_with("/spec/replicas", json!(5)),
            expect: &["/spec/replicas"],
        },
        Case {
            name: "a removed replica count",
            live: live_without("/spec/replicas"),
            expect: &["/spec/replicas"],
        },
        Case {
            name: "a removed env var",
            live: live_without(&format!("{web}/env/0")),
            expect: &["/spec/template/spec/containers/0/env/0"],
        },
        Case {
            name: "a changed env value",
            live: live_with(&format!("{web}/env/0/value"), json!("dev")),
            expect: &["/spec/template/spec/containers/0/env/0/value"],
        },
        Case {
            name: "a changed label meridian set (the pointer escapes the /)",
            live: live_with(
                "/metadata/labels/app.kubernetes.io~1managed-by",
                json!("helm"),
            ),
            expect: &["/metadata/labels/app.kubernetes.io~1managed-by"],
        },
        Case {
            name: "a removed annotation meridian set",
            live: live_without("/metadata/annotations/meridian.io~1template-generation"),
            expect: &["/metadata/annotations/meridian.io~1template-generation"],
        },
        Case {
            name: "a removed container",
            live: live_without("/spec/template/spec/containers/0"),
            expect: &["/spec/template/spec/containers/1"],
        },
        Case {
            name: "a changed request",
            live: live_with(&format!("{web}/resources/requests/memory"), json!("1G")),
            expect: &["/spec/template/spec/containers/0/resources/requests/memory"],
        },
        Case {
            name: "a changed port",
            live: live_with(&format!("{web}/ports/0/containerPort"), json!(9090)),
            expect: &["/spec/template/spec/containers/0/ports/0"],
        },
        Case {
            name: "the port's protocol changed",
            live: live_with(&format!("{web}/ports/0/protocol"), json!("UDP")),
            expect: &["/spec/template/spec/containers/0/ports/0"],
        },
        Case {
            name: "an atomic list changed length",
            live: live_with("/spec/template/spec/containers/0/args", json!(["--log"])),
            expect: &["/spec/template/spec/containers/1/args"],
        },
        Case {
            name: "an atomic list changed an element",
            live: live_with(
                "/spec/template/spec/containers/0/args",
                json!(["--log", "debug"]),
            ),
            expect: &["/spec/template/spec/containers/1/args/1"],
        },
        Case {
            name: "a map became a scalar",
            live: live_with("/spec/selector", json!("app=web")),
            expect: &["/spec/selector"],
        },
        Case {
            name: "two changes, sorted",
            live: {
                let mut l = live_with("/spec/replicas", json!(1));
                l["metadata"]["labels"]["app"] = json!("shop");
                l
            },
            expect: &["/metadata/labels/app", "/spec/replicas"],
        },
    ];
    for case in cases {
        assert_eq!(
            drifted(&applied(), &case.live),
            case.expect,
            "{}",
            case.name
        );
    }
}

#[test]
fn every_path_resolves_in_desired() {
    let live = json!({"spec": {"template": {"spec": {"containers": []}}}});
    let desired = applied();
    let drift = drifted(&desired, &live);
    assert!(!drift.is_empty());
    for path in drift {
        assert!(desired.pointer(&path).is_some(), "{path}");
    }
}

#[test]
fn reordered_named_lists_are_not_drift() {
    let desired = json!({"spec": {"volumes": [{"name": "a", "emptyDir": {}}, {"name": "b"}]}});
    let live = json!({"spec": {"volumes": [{"name": "b"}, {"name": "a", "emptyDir": {}}]}});
    assert!(drifted(&desired, &live).is_empty());
}

#[test]
fn unnamed_ports_match_by_port_and_protocol() {
    let desired = json!({"spec": {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53}]}});
    let live = json!({"spec": {"ports": [
        {"port": 53, "protocol": "TCP", "targetPort": 53},
        {"port": 53, "protocol": "UDP", "targetPort": 53}
    ]}});
    assert!(drifted(&desired, &live).is_empty());
    let live = json!({"spec": {"ports": [{"port": 53, "protocol": "TCP"}]}});
    assert_eq!(drifted(&desired, &live), ["/spec/ports/0"]);
}

#[test]
fn numbers_compare_as_numbers() {
    let desired = json!({"spec": {"replicas": 1, "ratio": 0.5}});
    let live = json!({"spec": {"replicas": 1.0, "ratio": 0.5}});
    assert!(drifted(&desired, &live).is_empty());
}

#[test]
fn quantities_compare_by_amount_only_where_the_api_rewrites_them() {
    let desired = json!({
        "metadata": {"labels": {"size": "1000m"}},
        "data": {"limit": "1Gi"},
        "spec": {
            "cpu": "1000m",
            "memory": 1,
            "env": [{"name": "CPU", "value": "1000m"}]
        }
    });
    let live = json!({
        "metadata": {"labels": {"size": "1"}},
        "data": {"limit": "1024Mi"},
        "spec": {
            "cpu": "1",
            "memory": "1",
            "env": [{"name": "CPU", "value": "1"}]
        }
    });
    assert_eq!(
        drifted(&desired, &live),
        ["/data/limit", "/metadata/labels/size", "/spec/env/0/value"]
    );
}

#[test]
fn strings_that_are_not_quantities_compare_as_text() {
    let desired = json!({"spec": {"image": "nginx:1.25", "mode": "fast"}});
    let live = json!({"spec": {"image": "nginx:1.250", "mode": "fast"}});
    assert_eq!(drifted(&desired, &live), ["/spec/image"]);
}

#[test]
fn omitted_zero_values_are_not_drift_outside_metadata() {
    let desired = json!({
        "metadata": {"labels": {"tier": ""}},
        "spec": {"hostNetwork": false, "paused": null, "securityContext": {},
                 "priority": 0, "schedulerName": "", "tolerations": []}
    });
    let live = json!({"metadata": {"labels": {}}, "spec": {}});
    assert_eq!(drifted(&desired, &live), ["/metadata/labels/tier"]);
    let env_label = json!({"metadata": {"labels": {"env": ""}}});
    assert_eq!(
        drifted(&env_label, &json!({"metadata": {"labels": {}}})),
        ["/metadata/labels/env"],
        "a label named env is still a label"
    );
    let live = json!({"metadata": {"labels": {"tier": ""}}, "spec": {"hostNetwork": true}});
    assert_eq!(drifted(&desired, &live), ["/spec/hostNetwork"]);
}

#[test]
fn an_empty_desired_list_claims_no_element() {
    let desired = json!({"spec": {"tolerations": [], "args": ["a"]}});
    let live = json!({"spec": {"tolerations": [{"key": "x"}], "args": ["a"]}});
    assert!(drifted(&desired, &live).is_empty());
}

#[test]
fn status_and_server_metadata_of_desired_are_ignored() {
    let desired = json!({
        "metadata": {"name": "web", "uid": "1", "resourceVersion": "1", "generation": 1,
                     "creationTimestamp": "2024-01-01T00:00:00Z", "managedFields": []},
        "status": {"replicas": 9}
    });
    let live = json!({"metadata": {"name": "web", "uid": "2", "generation": 5}});
    assert!(drifted(&desired, &live).is_empty());
}

#[test]
fn a_missing_live_object_part_is_drift_at_its_root() {
    let desired = json!({"metadata": {"name": "web"}, "spec": {"replicas": 2}});
    assert_eq!(
        drifted(&desired, &json!({"metadata": {"name": "web"}})),
        ["/spec"]
    );
    assert_eq!(drifted(&desired, &json!(null)), ["/metadata/name", "/spec"]);
}

/// The web container's image in `live()`, where it is the third container.
const WEB_IMAGE_LIVE: &str = "/spec/template/spec/containers/2/image";

#[test]
fn a_field_a_webhook_rewrote_is_expected_as_the_member_stored_it() {
    let desired = applied();
    let pinned = "registry.example.com/shop/web@sha256:0123";
    let stored = live_with(WEB_IMAGE_LIVE, json!(pinned));
    assert_eq!(
        drifted(&desired, &stored),
        ["/spec/template/spec/containers/0/image"],
        "the rewrite is drift against the body sent"
    );
    let expected = admitted(&desired, &stored);
    assert_eq!(
        expected.pointer("/spec/template/spec/containers/0/image"),
        Some(&json!(pinned))
    );
    assert!(drifted(&expected, &stored).is_empty());
    // Someone changing the field afterwards is drift again.
    let edited = live_with(WEB_IMAGE_LIVE, json!("evil:1"));
    assert_eq!(
        drifted(&expected, &edited),
        ["/spec/template/spec/containers/0/image"]
    );
    // What did not drift is kept as sent.
    assert_eq!(
        expected.pointer("/spec/replicas"),
        desired.pointer("/spec/replicas")
    );
}

#[test]
fn a_field_or_element_the_member_dropped_is_not_expected() {
    let desired = applied();
    let stored = live_without(WEB_IMAGE_LIVE);
    let expected = admitted(&desired, &stored);
    assert_eq!(
        expected.pointer("/spec/template/spec/containers/0/image"),
        Some(&Value::Null)
    );
    assert!(drifted(&expected, &stored).is_empty());
    let mut no_containers = live();
    no_containers["spec"]["template"]["spec"]["containers"] = json!([]);
    let expected = admitted(&desired, &no_containers);
    assert_eq!(
        expected.pointer("/spec/template/spec/containers"),
        Some(&json!([]))
    );
    assert!(drifted(&expected, &no_containers).is_empty());
}

/// Arbitrary JSON, with objects keyed from a small alphabet so that names and keys collide.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-5i64..5).prop_map(Value::from),
        prop_oneof![Just("a"), Just("1"), Just("1000m"), Just(""), Just("x/y~z")]
            .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        let key = prop_oneof![
            Just("name"),
            Just("port"),
            Just("spec"),
            Just("a/b"),
            Just("env")
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(key.prop_map(String::from), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    /// Whatever the value, it holds itself.
    #[test]
    fn any_value_is_contained_in_itself(v in json_value()) {
        prop_assert_eq!(drifted(&v, &v), Vec::<String>::new());
    }

    /// Every reported path names a value of desired.
    #[test]
    fn paths_resolve_in_desired(desired in json_value(), live in json_value()) {
        for path in drifted(&desired, &live) {
            prop_assert!(desired.pointer(&path).is_some(), "{} in {}", path, desired);
        }
    }

    /// What the member admitted is contained in what it stored, whatever it rewrote.
    #[test]
    fn what_the_member_admitted_holds_in_what_it_stored(desired in json_value(), stored in json_value()) {
        prop_assert_eq!(drifted(&admitted(&desired, &stored), &stored), Vec::<String>::new());
    }

    /// Admitting what the member stored unchanged changes nothing.
    #[test]
    fn an_unrewritten_body_is_admitted_as_it_is(v in json_value(), extra in json_value()) {
        let mut stored = v.clone();
        add_key(&mut stored, &extra);
        prop_assert_eq!(admitted(&v, &stored), v);
    }

    /// Keys another manager adds to live objects are never drift.
    #[test]
    fn extra_live_keys_are_not_drift(v in json_value(), extra in json_value()) {
        let mut live = v.clone();
        add_key(&mut live, &extra);
        prop_assert_eq!(drifted(&v, &live), Vec::<String>::new());
    }
}

/// Adds a key no generated object has to every object in `v`.
fn add_key(v: &mut Value, extra: &Value) {
    match v {
        Value::Object(m) => {
            for child in m.values_mut() {
                add_key(child, extra);
            }
            m.insert("zz-other-manager".into(), extra.clone());
        }
        Value::Array(items) => items.iter_mut().for_each(|c| add_key(c, extra)),
        _ => {}
    }
}
