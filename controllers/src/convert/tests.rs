use super::*;
use k8s_openapi::api::discovery::v1::{Endpoint as K8sEndpoint, EndpointConditions};

fn slice_with(address_type: &str, endpoints: Vec<K8sEndpoint>) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some("web-1".into()),
            namespace: Some("shop".into()),
            labels: Some([(SERVICE_NAME_LABEL.to_string(), "web".to_string())].into()),
            ..Default::default()
        },
        address_type: address_type.into(),
        endpoints,
        ports: None,
    }
}

fn endpoint(addresses: &[&str], ready: Option<bool>, terminating: Option<bool>) -> K8sEndpoint {
    K8sEndpoint {
        addresses: addresses.iter().map(|a| a.to_string()).collect(),
        conditions: Some(EndpointConditions {
            ready,
            serving: None,
            terminating,
        }),
        ..Default::default()
    }
}

#[test]
fn endpoint_conditions_follow_kubernetes_defaults() {
    let s = slice_with(
        "IPv4",
        vec![
            endpoint(&["10.0.0.1"], None, None),
            endpoint(&["10.0.0.2"], Some(false), None),
            endpoint(&["10.0.0.3"], Some(true), Some(true)),
        ],
    );
    let (key, slice, problems) = slice(&s).unwrap();
    assert!(problems.is_empty());
    assert_eq!(key, ObjectKey::new("shop", "web-1"));
    assert_eq!(&*slice.service, "web");
    let flags: Vec<(bool, bool)> = slice
        .endpoints
        .iter()
        .map(|e| (e.ready, e.terminating))
        .collect();
    assert_eq!(flags, [(true, false), (false, false), (true, true)]);
}

#[test]
fn invalid_addresses_leave_out_only_their_endpoint() {
    let s = slice_with(
        "IPv4",
        vec![
            endpoint(&["10.0.0.1"], None, None),
            endpoint(&["10.0.0.999"], None, None),
            endpoint(&["fd00::1"], None, None),
            endpoint(&[], None, None),
        ],
    );
    let (_, slice, problems) = slice(&s).unwrap();
    assert_eq!(slice.endpoints.len(), 1);
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(
        problems[0].contains("\"10.0.0.999\" is not an IP address"),
        "{}",
        problems[0]
    );
    assert!(
        problems[1].contains("does not match addressType IPv4"),
        "{}",
        problems[1]
    );
}

#[test]
fn slices_need_the_service_label_and_a_known_address_type() {
    let mut s = slice_with("IPv4", vec![]);
    s.metadata.labels = None;
    assert!(
        slice(&s)
            .unwrap_err()
            .to_string()
            .contains(SERVICE_NAME_LABEL)
    );
    assert!(
        slice(&slice_with("FQDN", vec![]))
            .unwrap_err()
            .to_string()
            .contains("FQDN")
    );
    assert!(
        slice(&slice_with("IPv5", vec![]))
            .unwrap_err()
            .to_string()
            .contains("unknown addressType")
    );
}

#[test]
fn services_headless_external_name_and_ports() {
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db", "namespace": "shop"},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": true, "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]}
    }))
    .unwrap();
    let (_, s) = service(&svc).unwrap();
    assert!(s.headless && s.publish_not_ready && !s.external_name);
    assert_eq!(s.ports[1].protocol, core::Protocol::Udp);
    assert_eq!(s.ports[1].name, None);
    let ext: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "x"}, "spec": {"type": "ExternalName", "externalName": "example.com"}
    }))
    .unwrap();
    let (key, s) = service(&ext).unwrap();
    assert!(s.external_name);
    assert_eq!(key, ObjectKey::new("default", "x"));
    let bad: Service = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "x"}, "spec": {"ports": [{"port": 70000}]}}),
    )
    .unwrap();
    assert!(
        service(&bad)
            .unwrap_err()
            .to_string()
            .contains("out of range")
    );
}

#[test]
fn member_clusters_are_validated_with_every_problem_listed() {
    let mc: MemberCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "meridian.io/v1alpha1", "kind": "MemberCluster",
        "metadata": {"name": "Bad_Name"},
        "spec": {
            "source": {"directory": {"path": "a"}, "agent": {}},
            "network": {"dnsClientCIDRs": ["10.0.0.0/33"]},
            "gateway": {"address": "nowhere", "port": 1}
        }
    }))
    .unwrap();
    let problems = member_cluster(&mc, Path::new("/hub")).unwrap_err();
    assert_eq!(problems.len(), 4, "{problems:?}");
    let mc: MemberCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "meridian.io/v1alpha1", "kind": "MemberCluster",
        "metadata": {"name": "eu-1", "labels": {REGION_LABEL: "eu", ZONE_LABEL: "eu-1a"}},
        "spec": {
            "source": {"directory": {"path": "../clusters/eu-1"}},
            "network": {"name": "n1", "dnsClientCIDRs": ["127.0.1.0/24"]},
            "health": {"withdrawAfterSeconds": 7}
        }
    }))
    .unwrap();
    let (spec, source) = member_cluster(&mc, Path::new("/srv/fleet/hub")).unwrap();
    assert_eq!(
        source,
        MemberSource::Directory(PathBuf::from("/srv/fleet/clusters/eu-1"))
    );
    assert_eq!(spec.locality.region.as_deref(), Some("eu"));
    assert_eq!(spec.health.withdraw_after_seconds, 7);
    assert_eq!(spec.health.unreachable_after_seconds, 15);
}
