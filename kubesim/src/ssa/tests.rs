use serde_json::json;

use super::*;

const MAIN: Scope = Scope::Main {
    status_subresource: true,
};

fn by(manager: &str, force: bool) -> Applier<'_> {
    Applier {
        manager,
        force,
        scope: MAIN,
        subresource: None,
        api_version: "apps/v1",
        now: "2026-01-01T00:00:00Z",
    }
}

fn deployment(spec: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "shop"}, "spec": spec})
}

fn owned(object: &Value, manager: &str) -> BTreeSet<Path> {
    managers(object)
        .into_iter()
        .filter(|m| m.manager == manager)
        .flat_map(|m| m.fields)
        .collect()
}

fn path(p: &str) -> Path {
    p.split('.').map(str::to_owned).collect()
}

#[test]
fn fields_are_leaves_of_maps_with_lists_whole() {
    let body = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "a", "labels": {"l": "1"}},
        "spec": {"replicas": 2, "ports": [{"port": 80}], "empty": {}}, "status": {"ready": 1}});
    let set = fields(&body, MAIN);
    let expect: BTreeSet<Path> = [
        "metadata.labels.l",
        "spec.replicas",
        "spec.ports",
        "spec.empty",
    ]
    .into_iter()
    .map(path)
    .collect();
    assert_eq!(set, expect);
    assert_eq!(fields(&body, Scope::Status), [path("status.ready")].into());
    assert_eq!(
        from_fields_v1(&to_fields_v1(&set)),
        set,
        "fieldsV1 round-trips"
    );
}

#[test]
fn apply_merges_and_records_the_manager() {
    let live = deployment(json!({"replicas": 1, "paused": false}));
    let out = apply(
        &live,
        &deployment(json!({"replicas": 3})),
        &by("meridian", false),
    )
    .unwrap();
    assert_eq!(out["spec"], json!({"replicas": 3, "paused": false}));
    assert_eq!(owned(&out, "meridian"), [path("spec.replicas")].into());
    let entry = &out["metadata"]["managedFields"][0];
    assert_eq!(entry["operation"], "Apply");
    assert_eq!(entry["fieldsType"], "FieldsV1");
    assert_eq!(entry["fieldsV1"], json!({"f:spec": {"f:replicas": {}}}));
}

#[test]
fn a_field_dropped_from_the_next_apply_is_removed_unless_another_manager_owns_it() {
    let live = deployment(json!({}));
    let one = apply(
        &live,
        &deployment(json!({"replicas": 3, "paused": true})),
        &by("meridian", true),
    )
    .unwrap();
    let two = apply(
        &one,
        &deployment(json!({"paused": true})),
        &by("meridian", true),
    )
    .unwrap();
    assert_eq!(
        two["spec"],
        json!({"paused": true}),
        "replicas left with its only owner"
    );

    // The handover: another manager applies the field at its live value first.
    let handed = apply(
        &one,
        &deployment(json!({"replicas": 3})),
        &by("meridian-handover", false),
    )
    .unwrap();
    let three = apply(
        &handed,
        &deployment(json!({"paused": true})),
        &by("meridian", true),
    )
    .unwrap();
    assert_eq!(
        three["spec"]["replicas"], 3,
        "kept: meridian-handover still owns it"
    );
    assert_eq!(owned(&three, "meridian"), [path("spec.paused")].into());
    assert_eq!(
        owned(&three, "meridian-handover"),
        [path("spec.replicas")].into()
    );
}

#[test]
fn an_apply_changing_another_managers_field_conflicts_unless_forced() {
    let live = deployment(json!({}));
    let mine = apply(
        &live,
        &deployment(json!({"replicas": 3})),
        &by("meridian", false),
    )
    .unwrap();
    let err = apply(
        &mine,
        &deployment(json!({"replicas": 5})),
        &by("kubectl", false),
    )
    .unwrap_err();
    assert_eq!(
        err.conflicts,
        vec![("meridian".to_owned(), path("spec.replicas"))]
    );
    assert!(err.to_string().contains("conflict with \"meridian\""));

    // The same value is shared ownership, not a conflict.
    let shared = apply(
        &mine,
        &deployment(json!({"replicas": 3})),
        &by("kubectl", false),
    )
    .unwrap();
    assert_eq!(owned(&shared, "meridian"), [path("spec.replicas")].into());
    assert_eq!(owned(&shared, "kubectl"), [path("spec.replicas")].into());

    // Forced: the field moves.
    let forced = apply(
        &mine,
        &deployment(json!({"replicas": 5})),
        &by("kubectl", true),
    )
    .unwrap();
    assert_eq!(forced["spec"]["replicas"], 5);
    assert!(owned(&forced, "meridian").is_empty());
}

#[test]
fn an_update_takes_the_fields_it_changes() {
    let live = deployment(json!({}));
    let applied = apply(
        &live,
        &deployment(json!({"replicas": 3, "paused": false})),
        &by("meridian", false),
    )
    .unwrap();
    let mut edited = applied.clone();
    edited["spec"]["replicas"] = json!(7);
    record_update(Some(&applied), &mut edited, &by("hpa", false));
    assert_eq!(owned(&edited, "hpa"), [path("spec.replicas")].into());
    assert_eq!(owned(&edited, "meridian"), [path("spec.paused")].into());
    // Now meridian's apply of another value conflicts with the updater (as the API server's).
    let err = apply(
        &edited,
        &deployment(json!({"replicas": 3, "paused": false})),
        &by("meridian", false),
    );
    assert!(err.is_err());
}

#[test]
fn status_scope_applies_only_status() {
    let live =
        json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "a"}, "spec": {"a": 1}});
    let body = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "a"}, "spec": {"a": 2}, "status": {"ok": true}});
    let who = Applier {
        scope: Scope::Status,
        subresource: Some("status"),
        ..by("meridian", true)
    };
    let out = apply(&live, &body, &who).unwrap();
    assert_eq!(out["spec"]["a"], 1);
    assert_eq!(out["status"]["ok"], true);
    assert_eq!(out["metadata"]["managedFields"][0]["subresource"], "status");
}
