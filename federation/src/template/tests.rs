use serde_json::json;

use super::*;

/// A Deployment with one container, for tests to change.
fn deployment(replicas: Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"namespace": "shop", "name": "web", "labels": {"app": "web"}, "generation": 4},
        "spec": {
            "replicas": replicas,
            "template": {"spec": {"containers": [{"name": "web", "image": "nginx"}]}}
        }
    })
}

fn object(api_version: &str, kind: &str, spec: Value) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"namespace": "shop", "name": "x"},
        "spec": spec,
    })
}

fn err(body: Value) -> String {
    summarize(body).unwrap_err().to_string()
}

fn key(kind: &str, name: &str) -> TemplateKey {
    TemplateKey::new("v1", kind, "shop", name)
}

#[test]
fn key_labels_generation_and_body() {
    let body = deployment(json!(3));
    let t = summarize(body.clone()).unwrap();
    assert_eq!(
        t.key,
        TemplateKey::new("apps/v1", "Deployment", "shop", "web")
    );
    assert_eq!(t.key.to_string(), "apps/v1/Deployment/shop/web");
    assert_eq!(*t.labels, BTreeMap::from([("app".into(), "web".into())]));
    assert_eq!(t.generation, 4);
    assert_eq!(t.replicas, Some(3));
    assert_eq!(*t.body, body);
}

#[test]
fn generation_defaults_to_zero() {
    let t = summarize(object("v1", "ConfigMap", json!(null))).unwrap();
    assert_eq!(t.generation, 0);
    assert!(t.labels.is_empty());
    assert_eq!(t.replicas, None);
    assert_eq!(t.requests, Resources::default());
    assert!(t.dependencies.is_empty());
}

#[test]
fn bad_objects_name_the_field() {
    struct Case {
        name: &'static str,
        pointer: &'static str,
        value: Value,
        expect: &'static str,
    }
    let cases = [
        Case {
            name: "no apiVersion",
            pointer: "/apiVersion",
            value: json!(null),
            expect: "missing apiVersion",
        },
        Case {
            name: "no kind",
            pointer: "/kind",
            value: json!(""),
            expect: "missing kind",
        },
        Case {
            name: "no name",
            pointer: "/metadata/name",
            value: json!(null),
            expect: "missing metadata.name",
        },
        Case {
            name: "no namespace",
            pointer: "/metadata/namespace",
            value: json!(null),
            expect: "a template needs a namespace",
        },
        Case {
            name: "empty namespace",
            pointer: "/metadata/namespace",
            value: json!(""),
            expect: "a template needs a namespace",
        },
        Case {
            name: "name not a string",
            pointer: "/metadata/name",
            value: json!(7),
            expect: "metadata.name is not a string",
        },
        Case {
            name: "label not a string",
            pointer: "/metadata/labels",
            value: json!({"tier": 1}),
            expect: "metadata.labels.tier is not a string",
        },
        Case {
            name: "negative replicas",
            pointer: "/spec/replicas",
            value: json!(-1),
            expect: "spec.replicas must be a non-negative integer",
        },
        Case {
            name: "fractional replicas",
            pointer: "/spec/replicas",
            value: json!(1.5),
            expect: "spec.replicas must be a non-negative integer",
        },
        Case {
            name: "replicas as a string",
            pointer: "/spec/replicas",
            value: json!("3"),
            expect: "spec.replicas must be a non-negative integer",
        },
        Case {
            name: "replicas past u32",
            pointer: "/spec/replicas",
            value: json!(5_000_000_000u64),
            expect: "spec.replicas must be a non-negative integer",
        },
        Case {
            name: "containers not a list",
            pointer: "/spec/template/spec/containers",
            value: json!({"name": "web"}),
            expect: "spec.template.spec.containers is not a list",
        },
        Case {
            name: "pod spec not a map",
            pointer: "/spec/template/spec",
            value: json!([]),
            expect: "spec.template.spec is not a map",
        },
    ];
    for case in cases {
        let mut body = deployment(json!(2));
        let (parent, last) = case.pointer.rsplit_once('/').unwrap();
        body.pointer_mut(parent).unwrap()[last] = case.value;
        let got = err(body);
        assert!(got.contains(case.expect), "{}: {got}", case.name);
    }
}

#[test]
fn replica_fields_per_kind() {
    struct Case {
        name: &'static str,
        api_version: &'static str,
        kind: &'static str,
        spec: Value,
        replicas: Option<u32>,
    }
    let case = |name, api_version, kind, spec, replicas| Case {
        name,
        api_version,
        kind,
        spec,
        replicas,
    };
    let cases = [
        case(
            "Deployment",
            "apps/v1",
            "Deployment",
            json!({"replicas": 3}),
            Some(3),
        ),
        case(
            "Deployment defaults to 1",
            "apps/v1",
            "Deployment",
            json!({}),
            Some(1),
        ),
        case(
            "Deployment scaled to 0",
            "apps/v1",
            "Deployment",
            json!({"replicas": 0}),
            Some(0),
        ),
        case(
            "StatefulSet",
            "apps/v1",
            "StatefulSet",
            json!({"replicas": 5}),
            Some(5),
        ),
        case(
            "ReplicaSet",
            "apps/v1",
            "ReplicaSet",
            json!({"replicas": 2}),
            Some(2),
        ),
        case(
            "Job parallelism",
            "batch/v1",
            "Job",
            json!({"parallelism": 4, "completions": 9}),
            Some(4),
        ),
        case("Job defaults to 1", "batch/v1", "Job", json!({}), Some(1)),
        case(
            "DaemonSet is whole",
            "apps/v1",
            "DaemonSet",
            json!({"replicas": 3}),
            None,
        ),
        case("CronJob is whole", "batch/v1", "CronJob", json!({}), None),
        case("Service is whole", "v1", "Service", json!({}), None),
        case(
            "a custom Deployment is whole",
            "example.com/v1",
            "Deployment",
            json!({"replicas": 3}),
            None,
        ),
        case(
            "no spec at all",
            "apps/v1",
            "Deployment",
            json!(null),
            Some(1),
        ),
    ];
    for c in cases {
        let t = summarize(object(c.api_version, c.kind, c.spec)).unwrap();
        assert_eq!(t.replicas, c.replicas, "{}", c.name);
    }
    assert_eq!(
        replica_pointer("apps/v1", "Deployment"),
        Some("/spec/replicas")
    );
    assert_eq!(
        replica_pointer("batch/v1", "Job"),
        Some("/spec/parallelism")
    );
    assert_eq!(replica_pointer("v1", "Pod"), None);
}

#[test]
fn job_parallelism_errors_name_parallelism() {
    let got = err(object("batch/v1", "Job", json!({"parallelism": -2})));
    assert!(got.contains("spec.parallelism"), "{got}");
}

#[test]
fn pod_spec_pointers() {
    assert_eq!(
        pod_spec_pointer("apps/v1", "DaemonSet"),
        Some("/spec/template/spec")
    );
    assert_eq!(
        pod_spec_pointer("batch/v1", "CronJob"),
        Some("/spec/jobTemplate/spec/template/spec")
    );
    assert_eq!(pod_spec_pointer("v1", "Pod"), Some("/spec"));
    assert_eq!(pod_spec_pointer("v1", "ConfigMap"), None);
    assert_eq!(pod_spec_pointer("example.com/v1", "Pod"), None);
}

/// The Deployment of a realistic shop: two containers, an init container, a sidecar, volumes
/// of every kind, env and envFrom references.
fn realistic() -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"namespace": "shop", "name": "web"},
        "spec": {
            "replicas": 6,
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "serviceAccountName": "web",
                    "imagePullSecrets": [{"name": "regcred"}, {"name": "regcred"}],
                    "initContainers": [
                        {"name": "migrate", "image": "migrate:1",
                         "resources": {"requests": {"cpu": "2", "memory": "64Mi"}},
                         "envFrom": [{"secretRef": {"name": "db"}}]},
                        {"name": "proxy", "image": "envoy:1", "restartPolicy": "Always",
                         "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}}}
                    ],
                    "containers": [
                        {"name": "web", "image": "registry.example.com/shop/web:1.2",
                         "resources": {"requests": {"cpu": "500m", "memory": "128Mi"},
                                       "limits": {"cpu": "1", "memory": "256Mi", "nvidia.com/gpu": 1}},
                         "env": [
                            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "web-config", "key": "mode"}}},
                            {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
                            {"name": "PLAIN", "value": "x"},
                            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                         ],
                         "envFrom": [{"configMapRef": {"name": "shared"}}]},
                        {"name": "metrics", "image": "exporter:2",
                         "resources": {"limits": {"cpu": "250m", "memory": "1G"}}}
                    ],
                    "ephemeralContainers": [
                        {"name": "debug", "image": "busybox", "envFrom": [{"configMapRef": {"name": "debug"}}]}
                    ],
                    "volumes": [
                        {"name": "config", "configMap": {"name": "web-config"}},
                        {"name": "tls", "secret": {"secretName": "web-tls"}},
                        {"name": "data", "persistentVolumeClaim": {"claimName": "web-data"}},
                        {"name": "all", "projected": {"sources": [
                            {"configMap": {"name": "extra"}},
                            {"secret": {"name": "token"}},
                            {"serviceAccountToken": {"path": "token"}}
                        ]}},
                        {"name": "scratch", "emptyDir": {}}
                    ]
                }
            }
        }
    })
}

#[test]
fn dependencies_of_a_realistic_deployment() {
    let t = summarize(realistic()).unwrap();
    assert_eq!(
        t.dependencies,
        vec![
            key("ConfigMap", "debug"),
            key("ConfigMap", "extra"),
            key("ConfigMap", "shared"),
            key("ConfigMap", "web-config"),
            key("PersistentVolumeClaim", "web-data"),
            key("Secret", "db"),
            key("Secret", "regcred"),
            key("Secret", "token"),
            key("Secret", "web-tls"),
            key("ServiceAccount", "web"),
        ]
    );
}

#[test]
fn requests_of_a_realistic_deployment() {
    let t = summarize(realistic()).unwrap();
    // Containers: 500m + 250m (from the limit) + the 100m sidecar = 850m, below the 2-core
    // migration (listed before the sidecar, so it runs alone). Memory: 128Mi + 1G + 32Mi
    // beats 64Mi. The GPU comes from the limit.
    assert_eq!(
        t.requests,
        Resources {
            cpu_millis: 2000,
            memory_bytes: (128 << 20) + 1_000_000_000 + (32 << 20),
            gpus: 1,
            pods: 1,
        }
    );
}

#[test]
fn default_service_account_is_not_a_dependency() {
    let mut body = realistic();
    body["spec"]["template"]["spec"]["serviceAccountName"] = json!("default");
    let t = summarize(body).unwrap();
    assert!(!t.dependencies.iter().any(|k| &*k.kind == "ServiceAccount"));
}

#[test]
fn volume_claim_templates_are_not_dependencies() {
    let body = object(
        "apps/v1",
        "StatefulSet",
        json!({
            "replicas": 3,
            "volumeClaimTemplates": [{"metadata": {"name": "data"}}],
            "template": {"spec": {
                "containers": [{"name": "db", "image": "postgres",
                                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]
            }}
        }),
    );
    let t = summarize(body).unwrap();
    assert_eq!(t.replicas, Some(3));
    assert!(t.dependencies.is_empty(), "{:?}", t.dependencies);
}

#[test]
fn cron_job_pod_template() {
    let body = object(
        "batch/v1",
        "CronJob",
        json!({
            "schedule": "*/5 * * * *",
            "jobTemplate": {"spec": {"template": {"spec": {
                "containers": [{"name": "report", "image": "report:1",
                                "resources": {"requests": {"cpu": "1.5", "memory": "1Gi"}},
                                "envFrom": [{"configMapRef": {"name": "report"}}]}],
                "volumes": [{"name": "out", "persistentVolumeClaim": {"claimName": "reports"}}]
            }}}}
        }),
    );
    let t = summarize(body).unwrap();
    assert_eq!(t.replicas, None);
    assert_eq!(t.requests.cpu_millis, 1500);
    assert_eq!(t.requests.memory_bytes, 1 << 30);
    assert_eq!(t.requests.pods, 1);
    assert_eq!(
        t.dependencies,
        vec![
            key("ConfigMap", "report"),
            key("PersistentVolumeClaim", "reports")
        ]
    );
}

#[test]
fn pod_spec_is_spec_for_a_pod() {
    let body = object(
        "v1",
        "Pod",
        json!({"containers": [{"name": "a", "image": "a",
                               "resources": {"requests": {"cpu": 2, "memory": 1e3}}}],
               "serviceAccountName": "runner"}),
    );
    let t = summarize(body).unwrap();
    assert_eq!(t.requests.cpu_millis, 2000);
    assert_eq!(t.requests.memory_bytes, 1000);
    assert_eq!(t.dependencies, vec![key("ServiceAccount", "runner")]);
}

#[test]
fn init_containers_after_a_sidecar_run_beside_it() {
    let body = object(
        "v1",
        "Pod",
        json!({
            "initContainers": [
                {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
                {"name": "migrate", "resources": {"requests": {"cpu": "3"}}}
            ],
            "containers": [{"name": "app", "resources": {"requests": {"cpu": "1"}}}]
        }),
    );
    // migrate runs beside the started proxy: 4 cores, more than app + proxy (2).
    assert_eq!(summarize(body).unwrap().requests.cpu_millis, 4000);
}

#[test]
fn init_containers_max_and_overhead() {
    let body = object(
        "apps/v1",
        "DaemonSet",
        json!({"template": {"spec": {
            "overhead": {"cpu": "10m", "memory": "1Mi"},
            "initContainers": [
                {"name": "a", "resources": {"requests": {"cpu": "3"}}},
                {"name": "b", "resources": {"requests": {"memory": "2Gi"}}}
            ],
            "containers": [
                {"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
                {"name": "d", "resources": {"requests": {"cpu": "1", "memory": "512Mi"}}}
            ]
        }}}),
    );
    let t = summarize(body).unwrap();
    assert_eq!(t.replicas, None);
    assert_eq!(t.requests.cpu_millis, 3010);
    assert_eq!(t.requests.memory_bytes, (2 << 30) + (1 << 20));
}

#[test]
fn request_wins_over_limit_per_resource() {
    let mut body = deployment(json!(1));
    body["spec"]["template"]["spec"]["containers"][0]["resources"] = json!({
        "requests": {"cpu": "100m"},
        "limits": {"cpu": "2", "memory": "1Gi"}
    });
    let t = summarize(body).unwrap();
    assert_eq!(t.requests.cpu_millis, 100);
    assert_eq!(t.requests.memory_bytes, 1 << 30);
}

#[test]
fn bad_quantities_name_the_field_path() {
    let mut body = realistic();
    body["spec"]["template"]["spec"]["containers"][1]["resources"]["limits"]["memory"] =
        json!("1GB");
    let e = summarize(body).unwrap_err();
    assert_eq!(
        e.to_string(),
        "spec.template.spec.containers[1].resources.limits.memory is not a valid quantity"
    );
    let source = std::error::Error::source(&e).unwrap().to_string();
    assert!(source.contains("\"1GB\""), "{source}");

    let mut body = realistic();
    body["spec"]["template"]["spec"]["initContainers"][0]["resources"]["requests"]["cpu"] =
        json!(true);
    assert_eq!(
        err(body),
        "spec.template.spec.initContainers[0].resources.requests.cpu is not a quantity"
    );
}
