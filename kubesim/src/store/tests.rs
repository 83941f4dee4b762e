use serde_json::json;

use super::*;

const NOW: &str = "2026-01-01T00:00:00Z";

fn who(manager: &str) -> Writer<'_> {
    Writer {
        manager,
        force: true,
        now: NOW,
    }
}

struct Fixture {
    store: Store,
    namespaces: Arc<ResourceType>,
    deployments: Arc<ResourceType>,
}

fn fixture(window: usize) -> Fixture {
    let store = Store::new(1, window);
    let namespaces = store.registry.get("", "v1", "namespaces").unwrap();
    let deployments = store.registry.get("apps", "v1", "deployments").unwrap();
    let mut f = Fixture {
        store,
        namespaces,
        deployments,
    };
    let namespaces = f.namespaces.clone();
    let ns = Target {
        resource: &namespaces,
        namespace: None,
        name: "shop",
        subresource: None,
    };
    f.store
        .create(&ns, json!({"metadata": {"name": "shop"}}), &who("test"))
        .unwrap();
    f
}

fn web_target<'a>(d: &'a Arc<ResourceType>, subresource: Option<&'static str>) -> Target<'a> {
    Target {
        resource: d,
        namespace: Some("shop"),
        name: "web",
        subresource,
    }
}

impl Fixture {
    fn apply(&mut self, body: Value) -> Result<Written> {
        let t = Target {
            resource: &self.deployments.clone(),
            namespace: Some("shop"),
            name: "web",
            subresource: None,
        };
        let bytes = serde_json::to_vec(&body).unwrap();
        self.store
            .patch(&t, PatchKind::Apply, &bytes, &who("meridian"))
    }
}

fn web(replicas: i64) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"replicas": replicas, "template": {"metadata": {"annotations": {"bench.meridian.io/rev": "1"}}}}})
}

#[test]
fn a_namespaced_object_needs_its_namespace() {
    let mut f = fixture(100);
    let d = f.deployments.clone();
    let t = Target {
        namespace: Some("nowhere"),
        ..web_target(&d, None)
    };
    let mut body = web(1);
    body["metadata"]["namespace"] = json!("nowhere");
    let err = f.store.create(&t, body, &who("test")).unwrap_err();
    assert_eq!((err.code, err.reason), (404, "NotFound"));
    assert_eq!(err.message, "namespaces \"nowhere\" not found");
}

#[test]
fn create_then_create_again_is_already_exists() {
    let mut f = fixture(100);
    let d = f.deployments.clone();
    let t = web_target(&d, None);
    let made = f.store.create(&t, web(1), &who("test")).unwrap();
    assert_eq!(made.object["metadata"]["generation"], 1);
    assert!(made.object["metadata"]["uid"].is_string());
    let err = f.store.create(&t, web(1), &who("test")).unwrap_err();
    assert_eq!((err.code, err.reason), (409, "AlreadyExists"));
}

#[test]
fn apply_creates_then_an_unchanged_apply_writes_nothing() {
    let mut f = fixture(100);
    let first = f.apply(web(2)).unwrap();
    assert!(first.changed);
    let rv = f.store.resource_version();
    let again = f.apply(web(2)).unwrap();
    assert!(!again.changed, "a no-op apply keeps the resourceVersion");
    assert_eq!(f.store.resource_version(), rv);
    let changed = f.apply(web(3)).unwrap();
    assert_eq!(changed.object["metadata"]["generation"], 2);
}

#[test]
fn status_is_written_only_through_its_subresource() {
    let mut f = fixture(100);
    f.apply(web(2)).unwrap();
    let mut with_status = web(2);
    with_status["status"] = json!({"readyReplicas": 9});
    let d = f.deployments.clone();
    let main = web_target(&d, None);
    let out = f
        .store
        .update(&main, with_status.clone(), &who("kubectl"))
        .unwrap();
    assert!(
        out.object.get("status").is_none(),
        "status ignored on the main resource"
    );
    let status = web_target(&d, Some("status"));
    with_status["spec"]["replicas"] = json!(50);
    let out = f
        .store
        .update(&status, with_status, &who("kubectl"))
        .unwrap();
    assert_eq!(out.object["status"]["readyReplicas"], 9);
    assert_eq!(
        out.object["spec"]["replicas"], 2,
        "spec ignored through /status"
    );
    assert_eq!(out.object["metadata"]["generation"], 1);
}

#[test]
fn a_stale_resource_version_is_a_conflict() {
    let mut f = fixture(100);
    let made = f.apply(web(2)).unwrap();
    let mut stale = (*made.object).clone();
    stale["metadata"]["resourceVersion"] = json!("1");
    let d = f.deployments.clone();
    let t = web_target(&d, None);
    let err = f.store.update(&t, stale, &who("kubectl")).unwrap_err();
    assert_eq!((err.code, err.reason), (409, "Conflict"));
}

#[test]
fn merge_and_json_patches() {
    let mut f = fixture(100);
    f.apply(web(2)).unwrap();
    let d = f.deployments.clone();
    let t = web_target(&d, None);
    let merged = f
        .store
        .patch(
            &t,
            PatchKind::Merge,
            br#"{"metadata":{"labels":{"a":"b"}},"spec":{"paused":true}}"#,
            &who("kubectl"),
        )
        .unwrap();
    assert_eq!(merged.object["metadata"]["labels"]["a"], "b");
    assert_eq!(merged.object["spec"]["paused"], true);
    let patched = f
        .store
        .patch(
            &t,
            PatchKind::Json,
            br#"[{"op":"replace","path":"/spec/replicas","value":7}]"#,
            &who("kubectl"),
        )
        .unwrap();
    assert_eq!(patched.object["spec"]["replicas"], 7);
    let err = f
        .store
        .patch(
            &t,
            PatchKind::Json,
            br#"[{"op":"test","path":"/spec/replicas","value":1}]"#,
            &who("kubectl"),
        )
        .unwrap_err();
    assert_eq!(err.code, 422);
}

#[test]
fn finalizers_hold_a_deletion_until_removed() {
    let mut f = fixture(100);
    let mut body = web(1);
    body["metadata"]["finalizers"] = json!(["example.com/hold"]);
    f.apply(body).unwrap();
    let d = f.deployments.clone();
    let t = web_target(&d, None);
    let held = f.store.delete(&t, (None, None), NOW).unwrap();
    assert!(held.object["metadata"]["deletionTimestamp"].is_string());
    assert!(f.store.get(&t).is_ok(), "kept while finalizers remain");
    f.store
        .patch(
            &t,
            PatchKind::Merge,
            br#"{"metadata":{"finalizers":null}}"#,
            &who("ctrl"),
        )
        .unwrap();
    assert_eq!(f.store.get(&t).unwrap_err().code, 404);
}

#[test]
fn watches_resume_from_a_resource_version_until_it_leaves_the_window() {
    let mut f = fixture(3);
    let start = f.store.resource_version();
    for n in 1..=2 {
        f.apply(web(n)).unwrap();
    }
    let d = f.deployments.clone();
    let events = f.store.events_since(start, &d).unwrap();
    assert_eq!(
        events.iter().map(|e| e.kind).collect::<Vec<_>>(),
        [EventKind::Added, EventKind::Modified]
    );
    assert!(events[0].line.ends_with(b"\n"));
    for n in 3..=5 {
        f.apply(web(n)).unwrap();
    }
    let err = f.store.events_since(start, &d).unwrap_err();
    assert_eq!((err.code, err.reason), (410, "Expired"));
    let now = f.store.resource_version();
    assert!(f.store.events_since(now, &d).unwrap().is_empty());
    f.store.expire();
    assert_eq!(f.store.events_since(now - 1, &d).unwrap_err().code, 410);
    assert!(
        f.store.events_since(now, &d).is_ok(),
        "the current version still watches"
    );
}

#[test]
fn lists_page_with_continue_tokens_and_filter_by_labels() {
    let mut f = fixture(100);
    let d = f.deployments.clone();
    for n in 0..5 {
        let name = format!("d{n}");
        let t = Target {
            resource: &d,
            namespace: Some("shop"),
            name: &name,
            subresource: None,
        };
        let mut body = web(1);
        body["metadata"]["name"] = json!(name);
        body["metadata"]["labels"] = json!({"even": (n % 2 == 0).to_string()});
        f.store.create(&t, body, &who("test")).unwrap();
    }
    let all = Filter::default();
    let first = f.store.list(&d, &all, Some(2), None).unwrap();
    assert_eq!(first.items.len(), 2);
    let second = f
        .store
        .list(&d, &all, Some(2), first.continue_.as_deref())
        .unwrap();
    let item: Value = serde_json::from_slice(&second.items[0]).unwrap();
    assert_eq!(item["metadata"]["name"], "d2");
    let third = f
        .store
        .list(&d, &all, Some(2), second.continue_.as_deref())
        .unwrap();
    assert_eq!(third.items.len(), 1);
    assert!(third.continue_.is_none());
    let even = Filter {
        labels: LabelSelector::parse("even=true").unwrap(),
        ..Filter::default()
    };
    assert_eq!(f.store.list(&d, &even, None, None).unwrap().items.len(), 3);
}

#[test]
fn workloads_are_made_ready_once_per_generation() {
    let mut f = fixture(100);
    f.apply(web(3)).unwrap();
    let d = f.deployments.clone();
    let t = web_target(&d, None);
    let ready = f.store.make_ready(&t, NOW).unwrap();
    assert_eq!(ready.object["status"]["readyReplicas"], 3);
    assert_eq!(ready.object["status"]["observedGeneration"], 1);
    assert!(f.store.make_ready(&t, NOW).is_none());
}

#[test]
fn services_get_a_cluster_ip() {
    let mut f = fixture(100);
    let svc = f.store.registry.get("", "v1", "services").unwrap();
    let t = Target {
        resource: &svc,
        namespace: Some("shop"),
        name: "web",
        subresource: None,
    };
    let made = f
        .store
        .create(
            &t,
            json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}),
            &who("test"),
        )
        .unwrap();
    assert!(
        made.object["spec"]["clusterIP"]
            .as_str()
            .unwrap()
            .starts_with("10.96.")
    );
}
