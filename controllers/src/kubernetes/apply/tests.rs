//! The applier against an API server in the test process: which requests it sends, and what it
//! makes of the answers.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::watch;

use super::*;
use crate::kubernetes::mock::{ApiServer, Seen, status};

fn applier(client: Client) -> Applier {
    Applier::new(client, Leadership::always("test"), ClusterId::new("m1"))
}

fn deployment() -> (ObjectId, Value) {
    let id = ObjectId::new("apps/v1", "Deployment", Some("shop"), "web");
    let body = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"replicas": 2},
    });
    (id, body)
}

#[tokio::test]
async fn apply_is_a_forced_server_side_apply_to_the_path_discovery_names() {
    let (client, server) = ApiServer::start(|_| None);
    let applier = applier(client);
    let (id, body) = deployment();
    let written = applier
        .apply(&id, &body, ApplyOptions::force())
        .await
        .unwrap();
    // Cluster-scoped: no namespace in the path, even when the id names one.
    let role = ObjectId::new(
        "rbac.authorization.k8s.io/v1",
        "ClusterRole",
        Some("ignored"),
        "reader",
    );
    let role_body = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "reader"}});
    applier
        .apply(&role, &role_body, ApplyOptions::default())
        .await
        .unwrap();
    let service = ObjectId::new("v1", "Service", Some("shop"), "web");
    applier
        .apply(
            &service,
            &json!({"apiVersion": "v1", "kind": "Service"}),
            ApplyOptions::force(),
        )
        .await
        .unwrap();
    // The same kind again: discovery is not asked twice.
    applier
        .apply(&id, &body, ApplyOptions::force())
        .await
        .unwrap();

    let sent = server.patches();
    let paths: Vec<&str> = sent.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/apis/apps/v1/namespaces/shop/deployments/web",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles/reader",
            "/api/v1/namespaces/shop/services/web",
            "/apis/apps/v1/namespaces/shop/deployments/web",
        ]
    );
    for r in &sent {
        assert_eq!(r.param("fieldManager"), Some("meridian"), "{r:?}");
        assert_eq!(
            r.content_type.as_deref(),
            Some("application/apply-patch+yaml"),
            "{r:?}"
        );
    }
    assert_eq!(sent[0].param("force"), Some("true"));
    assert_eq!(sent[1].param("force"), None, "not forced unless asked");
    assert_eq!(sent[0].body, body, "the body goes out as given");
    // What comes back is what the API stored.
    assert_eq!(written.metadata.uid.as_deref(), Some("uid-web"));
    assert_eq!(written.metadata.resource_version.as_deref(), Some("1"));
    let discovery: Vec<String> = server
        .requests()
        .iter()
        .filter(|r| r.is_discovery())
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(
        discovery,
        [
            "/apis/apps/v1",
            "/apis/rbac.authorization.k8s.io/v1",
            "/api/v1"
        ]
    );
}

#[tokio::test]
async fn apply_status_writes_the_status_subresource() {
    let (client, server) = ApiServer::start(|_| None);
    let id = ObjectId::new(
        "multicluster.x-k8s.io/v1alpha1",
        "ServiceImport",
        Some("shop"),
        "payments",
    );
    let body = json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceImport", "status": {"clusters": [{"cluster": "m1"}]}});
    applier(client)
        .apply_status(&id, &body, ApplyOptions::force())
        .await
        .unwrap();
    let sent = server.patches();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].path,
        "/apis/multicluster.x-k8s.io/v1alpha1/namespaces/shop/serviceimports/payments/status"
    );
    assert_eq!(sent[0].param("fieldManager"), Some("meridian"));
    assert_eq!(sent[0].body["status"], body["status"]);
}

#[tokio::test]
async fn an_unknown_kind_is_unknown_and_nothing_is_patched() {
    let (client, server) = ApiServer::start(|_| None);
    let applier = applier(client);
    // A group the server serves, without that kind; and a group it does not serve at all.
    for (api_version, kind) in [("apps/v1", "Widget"), ("example.com/v1", "Widget")] {
        let id = ObjectId::new(api_version, kind, Some("shop"), "w");
        let err = applier
            .apply(&id, &json!({}), ApplyOptions::force())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::UnknownKind { api_version: a, kind: k } if a == api_version && k == kind),
            "{err:?}"
        );
        assert!(!err.is_transport());
    }
    assert!(server.calls().is_empty(), "{:?}", server.calls());
    // Unknown kinds are asked again: a CRD may be installed since.
    let id = ObjectId::new("apps/v1", "Widget", Some("shop"), "w");
    let _ = applier.apply(&id, &json!({}), ApplyOptions::force()).await;
    assert_eq!(
        server
            .requests()
            .iter()
            .filter(|r| r.path == "/apis/apps/v1")
            .count(),
        2
    );
}

#[tokio::test]
async fn a_replica_that_does_not_lead_sends_no_request_at_all() {
    let (client, server) = ApiServer::start(|_| None);
    let (_tx, until) = watch::channel(None);
    let applier = Applier::new(client, Leadership::following(until), ClusterId::new("m1"));
    let (id, body) = deployment();
    let refused = [
        applier.apply(&id, &body, ApplyOptions::force()).await.err(),
        applier
            .apply_status(&id, &body, ApplyOptions::force())
            .await
            .err(),
        applier.delete(&id).await.err(),
    ];
    for err in refused {
        assert!(matches!(err, Some(Error::NotLeader)), "{err:?}");
    }
    assert!(server.requests().is_empty(), "{:?}", server.requests());
}

#[tokio::test]
async fn leadership_is_asked_before_each_request() {
    let (client, server) = ApiServer::start(|_| None);
    let (tx, until) = watch::channel(Some(Instant::now() + Duration::from_secs(60)));
    let applier = Applier::new(client, Leadership::following(until), ClusterId::new("m1"));
    let (id, body) = deployment();
    applier
        .apply(&id, &body, ApplyOptions::force())
        .await
        .unwrap();
    tx.send_replace(None);
    let err = applier
        .apply(&id, &body, ApplyOptions::force())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotLeader), "{err:?}");
    assert_eq!(server.patches().len(), 1);
}

#[tokio::test]
async fn a_refusal_keeps_the_api_servers_code_reason_and_message() {
    let message = r#"Deployment.apps "web" is invalid: spec.replicas: Invalid value: -1: must be greater than or equal to 0"#;
    let (client, _server) = ApiServer::start(move |r| match r.path.as_str() {
        "/apis/apps/v1/namespaces/shop/deployments/web" => Some(status(422, "Invalid", message)),
        "/apis/apps/v1/namespaces/shop/deployments/taken" => {
            Some(status(409, "Conflict", "conflict"))
        }
        "/apis/apps/v1/namespaces/shop/deployments/secret" => {
            Some(status(403, "Forbidden", "forbidden"))
        }
        _ => None,
    });
    let applier = applier(client);
    let (id, body) = deployment();
    let err = applier
        .apply(&id, &body, ApplyOptions::force())
        .await
        .unwrap_err();
    match &err {
        Error::Api {
            id: got,
            code,
            reason,
            message: m,
        } => {
            assert_eq!(**got, id);
            assert_eq!(*code, 422);
            assert_eq!(reason, "Invalid");
            assert_eq!(m, message);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(err.code(), Some(422));
    assert!(err.is_invalid() && !err.is_conflict() && !err.is_forbidden());
    assert!(!err.is_transport());
    assert!(err.to_string().contains(message), "{err}");

    let named = |name: &str| ObjectId::new("apps/v1", "Deployment", Some("shop"), name);
    let err = applier
        .apply(&named("taken"), &body, ApplyOptions::default())
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err:?}");
    let err = applier
        .apply(&named("secret"), &body, ApplyOptions::force())
        .await
        .unwrap_err();
    assert!(err.is_forbidden(), "{err:?}");
}

#[tokio::test]
async fn a_namespaced_kind_without_a_namespace_is_refused_before_sending() {
    let (client, server) = ApiServer::start(|_| None);
    let id = ObjectId::new("apps/v1", "Deployment", None, "web");
    let err = applier(client)
        .apply(&id, &json!({}), ApplyOptions::force())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NamespaceRequired { .. }), "{err:?}");
    assert!(server.calls().is_empty());
}

#[tokio::test]
async fn deleting_what_is_gone_is_ok() {
    let (client, server) = ApiServer::start(|r| match r.method.as_str() {
        "DELETE" => Some(status(
            404,
            "NotFound",
            r#"deployments.apps "web" not found"#,
        )),
        _ => None,
    });
    let (id, _) = deployment();
    applier(client).delete(&id).await.unwrap();
    let calls = server.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].method, "DELETE");
    assert_eq!(
        calls[0].path,
        "/apis/apps/v1/namespaces/shop/deployments/web"
    );
    // Dependents go to the garbage collector; nothing waits on them.
    assert_eq!(calls[0].body["propagationPolicy"], "Background");
}

#[tokio::test]
async fn a_refused_delete_is_an_error() {
    let (client, _server) = ApiServer::start(|r| match r.method.as_str() {
        "DELETE" => Some(status(403, "Forbidden", "no")),
        _ => None,
    });
    let (id, _) = deployment();
    let err = applier(client).delete(&id).await.unwrap_err();
    assert!(err.is_forbidden(), "{err:?}");
}

#[tokio::test]
async fn get_finds_the_object_or_none() {
    let (client, _server) = ApiServer::start(|r| match r.path.as_str() {
        "/api/v1/namespaces/shop/configmaps/present" => Some((
            200,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "present", "namespace": "shop", "uid": "u1"}, "data": {"a": "b"}}),
        )),
        _ => None,
    });
    let applier = applier(client);
    let present = ObjectId::new("v1", "ConfigMap", Some("shop"), "present");
    let object = applier.get(&present).await.unwrap().unwrap();
    assert_eq!(object.metadata.uid.as_deref(), Some("u1"));
    assert_eq!(object.data["data"]["a"], "b");
    let missing = ObjectId::new("v1", "ConfigMap", Some("shop"), "missing");
    assert!(applier.get(&missing).await.unwrap().is_none());
}

#[tokio::test]
async fn list_managed_reads_metadata_in_every_namespace_page_by_page() {
    let (client, server) = ApiServer::start(|r| {
        if r.path == "/apis/discovery.k8s.io/v1/endpointslices" {
            let (items, next) = match r.param("continue") {
                None => (
                    json!([{"metadata": {"name": "s2", "namespace": "b"}}]),
                    "t1",
                ),
                Some(_) => (json!([{"metadata": {"name": "s1", "namespace": "a"}}]), ""),
            };
            return Some((
                200,
                json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": {"continue": next}, "items": items}),
            ));
        }
        if r.path == "/api/v1/namespaces" {
            return Some((
                200,
                json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": {}, "items": [{"metadata": {"name": "shop"}}]}),
            ));
        }
        None
    });
    let applier = applier(client);
    let slices = applier
        .list_managed(
            "discovery.k8s.io/v1",
            "EndpointSlice",
            "app.kubernetes.io/managed-by=meridian",
        )
        .await
        .unwrap();
    assert_eq!(
        slices,
        [
            ObjectId::new("discovery.k8s.io/v1", "EndpointSlice", Some("a"), "s1"),
            ObjectId::new("discovery.k8s.io/v1", "EndpointSlice", Some("b"), "s2"),
        ]
    );
    let lists: Vec<Seen> = server
        .calls()
        .into_iter()
        .filter(|r| r.path.ends_with("endpointslices"))
        .collect();
    assert_eq!(lists.len(), 2, "two pages");
    assert_eq!(
        lists[0].param("labelSelector"),
        Some("app.kubernetes.io/managed-by=meridian")
    );
    assert_eq!(lists[1].param("continue"), Some("t1"));
    assert_eq!(
        applier
            .list_managed("v1", "Namespace", "x=y")
            .await
            .unwrap(),
        [ObjectId::new("v1", "Namespace", None, "shop")]
    );
}

#[test]
fn written_says_unchanged_only_for_the_body_it_recorded() {
    let (id, body) = deployment();
    let mut written = Written::default();
    assert!(!written.unchanged(&id, &body), "nothing recorded yet");
    written.record(&id, &body);
    assert!(written.unchanged(&id, &body));
    let mut changed = body.clone();
    changed["spec"]["replicas"] = json!(3);
    assert!(!written.unchanged(&id, &changed));
    // 2 and 2.0 are different bodies to the API server.
    changed["spec"]["replicas"] = json!(2.0);
    assert!(!written.unchanged(&id, &changed));
    let other = ObjectId::new("apps/v1", "Deployment", Some("shop"), "api");
    assert!(!written.unchanged(&other, &body), "per object");
    assert_eq!(written.ids().collect::<Vec<_>>(), [&id]);
    written.forget(&id);
    assert!(!written.unchanged(&id, &body));
    written.record(&id, &body);
    written.clear();
    assert!(!written.contains(&id));
}

#[test]
fn a_fingerprint_does_not_depend_on_key_order() {
    let a: Value = serde_json::from_str(r#"{"a": 1, "b": {"x": [1, 2], "y": null}}"#).unwrap();
    let b: Value = serde_json::from_str(r#"{"b": {"y": null, "x": [1, 2]}, "a": 1}"#).unwrap();
    assert_eq!(fingerprint(&a), fingerprint(&b));
    let c: Value = serde_json::from_str(r#"{"a": 1, "b": {"x": [2, 1], "y": null}}"#).unwrap();
    assert_ne!(fingerprint(&a), fingerprint(&c), "list order counts");
}

#[test]
fn label_managed_adds_meridians_label_and_the_extra_ones() {
    let mut body = json!({"metadata": {"name": "web", "labels": {"app": "web"}}});
    label_managed(&mut body, &[("meridian.io/template", "shop.web")]);
    assert_eq!(
        body["metadata"]["labels"],
        json!({"app": "web", "app.kubernetes.io/managed-by": "meridian", "meridian.io/template": "shop.web"})
    );
    let mut bare = json!({"kind": "ConfigMap", "metadata": {"labels": null}});
    label_managed(&mut bare, &[]);
    assert_eq!(
        bare["metadata"]["labels"],
        json!({"app.kubernetes.io/managed-by": "meridian"})
    );
    let mut none = json!({"kind": "ConfigMap"});
    label_managed(&mut none, &[]);
    assert_eq!(
        none["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "meridian"
    );
    let mut not_an_object = json!([1]);
    label_managed(&mut not_an_object, &[]);
    assert_eq!(not_an_object, json!([1]));
}

#[test]
fn object_ids_read_from_manifests_and_print_kind_namespace_name() {
    let (id, body) = deployment();
    assert_eq!(ObjectId::of(&body), Some(id.clone()));
    assert_eq!(id.to_string(), "Deployment/shop/web");
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "reader"}});
    assert_eq!(
        ObjectId::of(&role).unwrap().to_string(),
        "ClusterRole/reader"
    );
    assert_eq!(ObjectId::of(&json!({"kind": "ConfigMap"})), None);
}
