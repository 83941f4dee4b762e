use serde_json::json;

use super::*;

fn desired() -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "annotations": {"team": "shop"}},
        "spec": {
            "replicas": 3,
            "template": {"spec": {"containers": [{"name": "web", "image": "nginx:1.25"}]}}
        }
    })
}

fn paths(paths: &[&str]) -> Vec<String> {
    paths.iter().map(|p| p.to_string()).collect()
}

const MERIDIAN: &str = "meridian";

/// managedFields with one entry.
fn managed(manager: &str, operation: &str, subresource: Option<&str>, fields: Value) -> Value {
    let mut entry = json!({"manager": manager, "operation": operation, "fieldsType": "FieldsV1", "fieldsV1": fields});
    if let Some(s) = subresource {
        entry["subresource"] = json!(s);
    }
    json!([entry])
}

#[test]
fn retained_replicas_leave_the_body_and_nothing_is_handed_over_that_meridian_does_not_own() {
    let replicas = json!({"f:spec": {"f:replicas": {}}});
    let unowned = [
        json!({"spec": {"replicas": 7}}),
        json!({"spec": {"replicas": 7}, "metadata": {"managedFields":
            managed("kube-controller-manager", "Update", None, replicas.clone())}}),
        json!({"spec": {"replicas": 7}, "metadata": {"managedFields":
            managed(MERIDIAN, "Apply", Some("status"), replicas.clone())}}),
        json!({"spec": {"replicas": 7}, "metadata": {"managedFields":
            managed(MERIDIAN, "Apply", None, json!({"f:spec": {"f:paused": {}}}))}}),
    ];
    for live in unowned {
        let mut d = desired();
        let handover = retain(&mut d, Some(&live), &paths(&[HPA_RETAINED]), MERIDIAN).unwrap();
        assert!(d["spec"].get("replicas").is_none(), "{d}");
        assert_eq!(d["spec"]["template"], desired()["spec"]["template"]);
        assert_eq!(handover, None, "{live}");
    }
}

#[test]
fn retained_fields_meridian_owns_are_handed_over_at_their_live_values() {
    let live = json!({
        "spec": {"replicas": 7},
        "metadata": {
            "labels": {"owner/team": "member"},
            "managedFields": managed(MERIDIAN, "Apply", None, json!({
                "f:spec": {"f:replicas": {}},
                "f:metadata": {"f:labels": {"f:owner/team": {}}},
            })),
        },
    });
    let mut d = desired();
    let handover = retain(
        &mut d,
        Some(&live),
        &paths(&[HPA_RETAINED, "/metadata/labels/owner~1team"]),
        MERIDIAN,
    )
    .unwrap();
    assert!(d["spec"].get("replicas").is_none(), "{d}");
    assert_eq!(
        handover,
        Some(json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"owner/team": "member"}},
            "spec": {"replicas": 7},
        }))
    );
}

#[test]
fn a_field_live_lacks_is_removed_from_desired() {
    let live = json!({"spec": {"template": {}}, "metadata": {"annotations": {"team": null}}});
    let mut d = desired();
    retain(
        &mut d,
        Some(&live),
        &paths(&[
            "/spec/replicas",
            "/metadata/annotations/team",
            "/spec/paused",
        ]),
        MERIDIAN,
    )
    .unwrap();
    assert!(d["spec"].get("replicas").is_none(), "{d}");
    assert_eq!(d["metadata"]["annotations"], json!({}));
    assert!(d["spec"].get("paused").is_none());
}

#[test]
fn live_none_leaves_desired_as_it_is() {
    let mut d = desired();
    retain(
        &mut d,
        None,
        &paths(&[HPA_RETAINED, "/spec/clusterIP"]),
        MERIDIAN,
    )
    .unwrap();
    assert_eq!(d, desired());
}

#[test]
fn list_elements_are_retained_by_index() {
    let live = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "web", "image": "nginx:1.27"}
    ]}}}});
    let mut d = desired();
    let image = "/spec/template/spec/containers/0/image";
    retain(&mut d, Some(&live), &paths(&[image]), MERIDIAN).unwrap();
    assert_eq!(d.pointer(image).unwrap(), "nginx:1.27");
}

#[test]
fn invalid_pointers_are_errors_naming_the_path() {
    for bad in ["spec/replicas", "", "/spec/a~2b", "/spec/trailing~"] {
        let mut d = desired();
        let err = retain(&mut d, None, &paths(&["/spec/replicas", bad]), MERIDIAN).unwrap_err();
        assert!(
            matches!(&err, RetainError::Pointer { path, .. } if path == bad),
            "{bad}: {err:?}"
        );
        assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        assert_eq!(d, desired(), "{bad}");
    }
}

#[test]
fn a_path_desired_cannot_hold_is_an_error_and_changes_nothing() {
    let live = json!({
        "spec": {"replicas": 1, "template": {"spec": {"containers": [{}, {"image": "x"}]}}},
        "metadata": {"name": {"odd": true}, "managedFields": managed(MERIDIAN, "Apply", None,
            json!({"f:metadata": {"f:name": {"f:odd": {}}}}))}
    });
    // Through a list desired lacks an element of; a handover that cannot hold the field.
    for bad in [
        "/spec/template/spec/containers/1/image",
        "/metadata/name/odd",
    ] {
        let mut d = desired();
        let err = retain(&mut d, Some(&live), &paths(&[HPA_RETAINED, bad]), MERIDIAN).unwrap_err();
        assert!(
            matches!(&err, RetainError::Unreachable { path, .. } if path == bad),
            "{err:?}"
        );
        assert_eq!(d, desired(), "{bad}");
    }
}

#[test]
fn hpa_targets_of_v2_and_v1() {
    let v2 = json!({
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "web"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "minReplicas": 2,
            "maxReplicas": 10
        }
    });
    assert_eq!(
        hpa_targets(&v2),
        Some(("apps/v1".into(), "Deployment".into(), "web".into()))
    );
    let v1 = json!({
        "apiVersion": "autoscaling/v1",
        "kind": "HorizontalPodAutoscaler",
        "spec": {"scaleTargetRef": {"kind": "StatefulSet", "name": "db"}}
    });
    assert_eq!(
        hpa_targets(&v1),
        Some(("".into(), "StatefulSet".into(), "db".into()))
    );
}

#[test]
fn malformed_hpas_have_no_target() {
    let hpa = |spec: Value| json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "spec": spec});
    let cases = [
        (
            "no spec",
            json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler"}),
        ),
        ("no scaleTargetRef", hpa(json!({"maxReplicas": 3}))),
        (
            "no name",
            hpa(json!({"scaleTargetRef": {"kind": "Deployment"}})),
        ),
        (
            "empty kind",
            hpa(json!({"scaleTargetRef": {"kind": "", "name": "web"}})),
        ),
        (
            "apiVersion not a string",
            hpa(json!({"scaleTargetRef": {"apiVersion": 2, "kind": "Deployment", "name": "web"}})),
        ),
        (
            "not an HPA",
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                   "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}}}),
        ),
    ];
    for (name, object) in cases {
        assert_eq!(hpa_targets(&object), None, "{name}");
    }
}

#[test]
fn indexes_follow_rfc_6901() {
    assert_eq!(index("0"), Some(0));
    assert_eq!(index("12"), Some(12));
    for bad in ["", "01", "-", "+1", "1a"] {
        assert_eq!(index(bad), None, "{bad}");
    }
}
