//! MemberState fed with synthetic watch-event streams, as kube-rs' watcher produces them.

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::Event;
use serde_json::json;

use super::*;
use crate::crd::{ServiceExportObject, ServiceImport};

fn service(name: &str, port: u16) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"ports": [{"name": "http", "port": port, "protocol": "TCP"}]}
    }))
    .unwrap()
}

fn external(name: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"type": "ExternalName", "externalName": "example.com", "ports": [{"port": 80}]}
    }))
    .unwrap()
}

fn bad_port(name: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"ports": [{"name": "http", "port": 70000}]}
    }))
    .unwrap()
}

fn slice(name: &str, service: &str, ips: &[&str]) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": ips.iter().map(|ip| json!({"addresses": [ip]})).collect::<Vec<_>>(),
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
    }))
    .unwrap()
}

fn export(name: &str) -> ServiceExportObject {
    serde_json::from_value(json!({
        "apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
        "metadata": {"name": name, "namespace": "shop"}
    }))
    .unwrap()
}

fn node(name: &str, cpu: &str, memory: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "status": {"capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
                   "allocatable": {"cpu": "1500m", "memory": memory}}
    }))
    .unwrap()
}

/// Lists every kind once with the given objects.
fn listed(
    services: Vec<Service>,
    slices: Vec<EndpointSlice>,
    exports: Vec<ServiceExportObject>,
) -> MemberState {
    let mut s = MemberState::new(ClusterId::new("m1"));
    list_all(&mut s, services, slices, exports);
    s
}

fn list_all(
    s: &mut MemberState,
    services: Vec<Service>,
    slices: Vec<EndpointSlice>,
    exports: Vec<ServiceExportObject>,
) {
    s.apply(MemberEvent::Service(Event::Init));
    for x in services {
        s.apply(MemberEvent::Service(Event::InitApply(x)));
    }
    s.apply(MemberEvent::Service(Event::InitDone));
    s.apply(MemberEvent::Slice(Event::Init));
    for x in slices {
        s.apply(MemberEvent::Slice(Event::InitApply(x)));
    }
    s.apply(MemberEvent::Slice(Event::InitDone));
    s.apply(MemberEvent::Export(Event::Init));
    for x in exports {
        s.apply(MemberEvent::Export(Event::InitApply(x)));
    }
    s.apply(MemberEvent::Export(Event::InitDone));
    s.apply(MemberEvent::Import(Event::<ServiceImport>::Init));
    s.apply(MemberEvent::Import(Event::InitDone));
}

fn reset_objects(event: Option<SourceEvent>) -> ClusterObjects {
    match event {
        Some(SourceEvent::Reset { objects, .. }) => objects,
        other => panic!("expected a Reset, got {other:?}"),
    }
}

fn changes(event: Option<SourceEvent>) -> (Vec<Change>, Vec<Problem>) {
    match event {
        Some(SourceEvent::Changes {
            changes, problems, ..
        }) => (changes, problems),
        other => panic!("expected Changes, got {other:?}"),
    }
}

#[test]
fn nothing_is_sent_until_every_kind_has_listed_then_one_reset() {
    let mut s = MemberState::new(ClusterId::new("m1"));
    s.apply(MemberEvent::Service(Event::Init));
    s.apply(MemberEvent::Service(Event::InitApply(service("pay", 80))));
    assert!(
        s.take_event().is_none(),
        "a relist in progress is never sent"
    );
    s.apply(MemberEvent::Service(Event::InitDone));
    assert!(s.take_event().is_none(), "other kinds have not listed yet");
    list_all(
        &mut s,
        vec![service("pay", 80)],
        vec![slice("pay-1", "pay", &["10.0.0.1"])],
        vec![export("pay")],
    );
    let objects = reset_objects(s.take_event());
    assert_eq!(objects.services.len(), 1);
    assert_eq!(objects.slices.len(), 1);
    assert_eq!(objects.exports.len(), 1);
    assert!(s.take_event().is_none(), "nothing more to send");
}

#[test]
fn events_after_the_list_are_incremental_changes() {
    let mut s = listed(vec![service("pay", 80)], vec![], vec![export("pay")]);
    reset_objects(s.take_event());
    s.apply(MemberEvent::Slice(Event::Apply(slice(
        "pay-1",
        "pay",
        &["10.0.0.1"],
    ))));
    s.apply(MemberEvent::Slice(Event::Apply(slice(
        "pay-1",
        "pay",
        &["10.0.0.1"],
    ))));
    let (c, _) = changes(s.take_event());
    assert_eq!(c.len(), 1, "an unchanged re-apply is no change: {c:?}");
    assert!(
        matches!(&c[0], Change::Upsert(Object::Slice(k, sl)) if &*k.name == "pay-1" && sl.endpoints.len() == 1)
    );
    s.apply(MemberEvent::Export(Event::Delete(export("pay"))));
    let (c, _) = changes(s.take_event());
    assert!(matches!(&c[..], [Change::Delete(Kind::Export, k)] if &*k.name == "pay"));
}

#[test]
fn a_relist_replaces_the_member_in_one_step_and_drops_what_was_deleted_meanwhile() {
    let mut s = listed(
        vec![service("pay", 80), service("cart", 80)],
        vec![
            slice("pay-1", "pay", &["10.0.0.1"]),
            slice("cart-1", "cart", &["10.0.0.2"]),
        ],
        vec![export("pay"), export("cart")],
    );
    reset_objects(s.take_event());
    // The watch broke; "cart" was deleted while it was down; the relist (after a 410 Gone) comes
    // in pieces: nothing is sent before it is complete, so there is never an empty answer.
    s.apply(MemberEvent::Slice(Event::Init));
    s.apply(MemberEvent::Slice(Event::InitApply(slice(
        "pay-1",
        "pay",
        &["10.0.0.1", "10.0.0.3"],
    ))));
    assert!(s.take_event().is_none());
    s.apply(MemberEvent::Slice(Event::InitDone));
    let objects = reset_objects(s.take_event());
    assert_eq!(
        objects.slices.len(),
        1,
        "the slice deleted during the disconnect is gone"
    );
    assert_eq!(objects.slices[0].1.endpoints.len(), 2);
    assert_eq!(objects.services.len(), 2, "other kinds keep what they had");
}

#[test]
fn after_relist_all_the_old_objects_serve_until_every_kind_has_listed_again() {
    let mut s = listed(
        vec![service("pay", 80)],
        vec![slice("pay-1", "pay", &["10.0.0.1"])],
        vec![export("pay")],
    );
    reset_objects(s.take_event());
    s.relist_all();
    s.apply(MemberEvent::Service(Event::Init));
    s.apply(MemberEvent::Service(Event::InitDone));
    assert!(
        s.take_event().is_none(),
        "held until every kind has listed again"
    );
    list_all(&mut s, vec![], vec![], vec![]);
    let objects = reset_objects(s.take_event());
    assert!(objects.services.is_empty() && objects.slices.is_empty() && objects.exports.is_empty());
}

#[test]
fn a_bad_object_is_a_problem_that_goes_when_it_is_fixed() {
    let mut s = listed(vec![bad_port("pay")], vec![], vec![]);
    match s.take_event() {
        Some(SourceEvent::Reset {
            objects, problems, ..
        }) => {
            assert!(objects.services.is_empty());
            assert_eq!(problems.len(), 1);
            assert_eq!(problems[0].subject.to_string(), "Service shop/pay");
            assert!(
                problems[0].reason.contains("70000"),
                "{}",
                problems[0].reason
            );
            assert_eq!(problems[0].location(), "m1 API: Service shop/pay");
        }
        other => panic!("{other:?}"),
    }
    s.apply(MemberEvent::Service(Event::Apply(service("pay", 80))));
    let (c, problems) = changes(s.take_event());
    assert_eq!(c.len(), 1);
    assert!(problems.is_empty());
    // Broken again: the good version leaves the index, the problem comes back.
    s.apply(MemberEvent::Service(Event::Apply(bad_port("pay"))));
    let (c, problems) = changes(s.take_event());
    assert!(matches!(&c[..], [Change::Delete(Kind::Service, _)]));
    assert_eq!(problems.len(), 1);
    // An ExternalName service converts (the merge refuses to export it, with its reason).
    s.apply(MemberEvent::Service(Event::Apply(external("ext"))));
    let (c, _) = changes(s.take_event());
    assert!(matches!(&c[..], [Change::Upsert(Object::Service(_, svc))] if svc.external_name));
}

#[test]
fn an_endpoint_the_api_server_would_refuse_is_a_problem_and_the_rest_serves() {
    // Loopback is refused from a Kubernetes API (only directory members may use it), and so
    // is what meridian refuses beyond the API server (broadcast).
    let mut s = listed(
        vec![service("pay", 80)],
        vec![slice(
            "pay-1",
            "pay",
            &["10.0.0.1", "127.0.0.1", "255.255.255.255"],
        )],
        vec![export("pay")],
    );
    match s.take_event() {
        Some(SourceEvent::Reset {
            objects, problems, ..
        }) => {
            let (_, served) = &objects.slices[0];
            let addresses: Vec<String> = served
                .endpoints
                .iter()
                .map(|e| e.addresses[0].to_string())
                .collect();
            assert_eq!(addresses, ["10.0.0.1"]);
            let reasons: Vec<&str> = problems.iter().map(|p| p.reason.as_str()).collect();
            assert_eq!(problems.len(), 2, "{reasons:?}");
            assert_eq!(problems[0].location(), "m1 API: EndpointSlice shop/pay-1");
            assert!(
                reasons[0].starts_with(
                    "endpoints[1].addresses[0]: 127.0.0.1 may not be in the loopback range"
                ),
                "{}",
                reasons[0]
            );
            assert!(reasons[1].contains("broadcast"), "{}", reasons[1]);
        }
        other => panic!("{other:?}"),
    }
    // Fixed: the problems go with the next batch.
    s.apply(MemberEvent::Slice(Event::Apply(slice(
        "pay-1",
        "pay",
        &["10.0.0.1"],
    ))));
    let (c, problems) = changes(s.take_event());
    assert_eq!(c.len(), 1);
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn node_capacity_is_summed_as_quantities() {
    let mut s = MemberState::new(ClusterId::new("m1"));
    s.apply(MemberEvent::Node(Event::Init));
    s.apply(MemberEvent::Node(Event::InitApply(node("a", "2", "4Gi"))));
    s.apply(MemberEvent::Node(Event::InitApply(node(
        "b", "500m", "1Gi",
    ))));
    s.apply(MemberEvent::Node(Event::InitDone));
    let (capacity, allocatable) = s.capacity();
    assert_eq!(capacity["cpu"], "2500m");
    assert_eq!(capacity["memory"], (5u64 << 30).to_string());
    assert_eq!(capacity["pods"], "220");
    assert_eq!(allocatable["cpu"], "3");
    s.apply(MemberEvent::Node(Event::Delete(node("b", "500m", "1Gi"))));
    assert_eq!(s.capacity().0["cpu"], "2");
}

#[test]
fn quantities_parse() {
    assert_eq!(parse_milli("250m"), Some(250));
    assert_eq!(parse_milli("4"), Some(4000));
    assert_eq!(parse_milli("1Ki"), Some(1_024_000));
    assert_eq!(parse_milli("1.5G"), Some(1_500_000_000_000));
    assert_eq!(parse_milli("1e3"), Some(1_000_000));
    assert_eq!(parse_milli("12Zi"), None);
    assert_eq!(format_milli(1500), "1500m");
    assert_eq!(format_milli(2000), "2");
}

fn pod(name: &str, node: &str, cpu: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"nodeName": node,
                 "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]},
        "status": {"phase": "Running"}
    }))
    .unwrap()
}

fn capacity_of(event: Option<SourceEvent>) -> Option<Option<Capacity>> {
    match event {
        Some(SourceEvent::Capacity { capacity, .. }) => Some(capacity),
        None => None,
        other => panic!("expected a Capacity event, got {other:?}"),
    }
}

#[test]
fn capacity_is_allocatable_minus_pod_requests_sent_once_per_change() {
    let mut s = MemberState::new(ClusterId::new("m1"));
    s.apply(MemberEvent::Node(Event::Init));
    s.apply(MemberEvent::Node(Event::InitApply(node("a", "2", "4Gi"))));
    s.apply(MemberEvent::Node(Event::InitDone));
    assert_eq!(
        capacity_of(s.take_capacity()),
        None,
        "nothing before the pods have listed"
    );
    s.apply(MemberEvent::Pod(Event::Init));
    s.apply(MemberEvent::Pod(Event::InitApply(pod("p", "a", "500m"))));
    s.apply(MemberEvent::Pod(Event::InitDone));
    assert_eq!(
        capacity_of(s.take_capacity()),
        None,
        "nothing before the ResourceQuotas have listed"
    );
    s.apply(MemberEvent::Quota(Event::Init));
    s.apply(MemberEvent::Quota(Event::InitApply(quota(
        "shop", "q", "4", "1",
    ))));
    s.apply(MemberEvent::Quota(Event::InitDone));
    let c = capacity_of(s.take_capacity()).unwrap().unwrap();
    let shop = &c.quotas["shop"];
    assert_eq!(
        (shop[0].hard.cpu_millis, shop[0].used.cpu_millis),
        (4000, 1000)
    );
    assert_eq!(c.allocatable.cpu_millis, 1500);
    assert_eq!(c.requested.cpu_millis, 500);
    assert_eq!(c.requested.pods, 1);
    assert_eq!(
        capacity_of(s.take_capacity()),
        None,
        "unchanged: not sent again"
    );
    // A burst of pod events between two heartbeats: one update with the end result.
    for i in 0..5 {
        s.apply(MemberEvent::Pod(Event::Apply(pod(
            &format!("q{i}"),
            "a",
            "100m",
        ))));
    }
    s.apply(MemberEvent::Pod(Event::Delete(pod("q4", "a", "100m"))));
    let c = capacity_of(s.take_capacity()).unwrap().unwrap();
    assert_eq!(c.requested.cpu_millis, 900);
    assert_eq!(capacity_of(s.take_capacity()), None);
    // A quota's use changes: the capacity is sent again.
    s.apply(MemberEvent::Quota(Event::Apply(quota(
        "shop", "q", "4", "3",
    ))));
    let c = capacity_of(s.take_capacity()).unwrap().unwrap();
    assert_eq!(c.quotas["shop"][0].used.cpu_millis, 3000);
}

#[test]
fn quotas_that_cannot_be_listed_count_as_none_and_capacity_is_still_known() {
    let mut s = MemberState::new(ClusterId::new("m1"));
    for e in [
        Event::Init,
        Event::InitApply(node("a", "2", "4Gi")),
        Event::InitDone,
    ] {
        s.apply(MemberEvent::Node(e));
    }
    s.apply(MemberEvent::Pod(Event::Init));
    s.apply(MemberEvent::Pod(Event::InitDone));
    s.quotas_refused("resourcequotas is forbidden: 403".into());
    let c = capacity_of(s.take_capacity()).unwrap().unwrap();
    assert!(c.quotas.is_empty());
    assert_eq!(c.allocatable.cpu_millis, 1500);
}

fn quota(namespace: &str, name: &str, hard_cpu: &str, used_cpu: &str) -> ResourceQuota {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": namespace},
        "status": {"hard": {"requests.cpu": hard_cpu}, "used": {"requests.cpu": used_cpu}}
    }))
    .unwrap()
}

#[test]
fn pods_that_cannot_be_listed_make_capacity_unknown_and_a_problem_only() {
    let mut s = listed(vec![service("a", 80)], vec![], vec![]);
    s.apply(MemberEvent::Node(Event::Init));
    s.apply(MemberEvent::Node(Event::InitApply(node("a", "2", "4Gi"))));
    s.apply(MemberEvent::Node(Event::InitDone));
    assert!(matches!(s.take_event(), Some(SourceEvent::Reset { .. })));
    s.pods_refused("pods is forbidden: 403".into());
    assert_eq!(
        capacity_of(s.take_capacity()),
        Some(None),
        "unknown, not the Nodes' allocatable"
    );
    let (changed, problems) = changes(s.take_event());
    assert!(changed.is_empty());
    assert_eq!(problems.len(), 1);
    assert!(
        problems[0].reason.contains("cannot list Pods"),
        "{problems:?}"
    );
    assert_eq!(s.objects().services.len(), 1, "the other watches serve on");
    // The RBAC is fixed: the pods list, the problem goes, the capacity is known.
    s.apply(MemberEvent::Pod(Event::Init));
    s.apply(MemberEvent::Pod(Event::InitDone));
    s.apply(MemberEvent::Quota(Event::Init));
    s.apply(MemberEvent::Quota(Event::InitDone));
    assert!(capacity_of(s.take_capacity()).unwrap().is_some());
    assert!(changes(s.take_event()).1.is_empty());
}

#[test]
fn a_member_serving_more_than_the_cap_is_kept_at_the_cap_and_says_so() {
    let mut table: Table<u16> = Table::capped(2);
    let port = |s: &Service| {
        Ok::<_, Infallible>(s.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port as u16)
    };
    table.apply(Event::Init, |s: &Service| &s.metadata, port);
    for name in ["a", "b", "c"] {
        table.apply(Event::InitApply(service(name, 80)), |s| &s.metadata, port);
    }
    table.apply(Event::InitDone, |s| &s.metadata, port);
    assert_eq!(table.live.len(), 2);
    assert_eq!(table.left_out(), 1);
    // Known objects still change and go; a new one waits for room.
    table.apply(Event::Apply(service("a", 81)), |s| &s.metadata, port);
    assert_eq!(table.live.values().copied().collect::<Vec<_>>(), [81, 80]);
    table.apply(Event::Apply(service("d", 80)), |s| &s.metadata, port);
    assert_eq!(table.left_out(), 2);
    table.apply(Event::Delete(service("b", 80)), |s| &s.metadata, port);
    table.apply(Event::Apply(service("d", 80)), |s| &s.metadata, port);
    assert!(table.live.contains_key(&ObjectKey::new("shop", "d")));

    let mut s = MemberState::new(ClusterId::new("m1"));
    s.services = Table::capped(1);
    list_all(
        &mut s,
        vec![service("web", 80), service("api", 80)],
        vec![],
        vec![],
    );
    let said: Vec<String> = s.problems().into_iter().map(|p| p.reason).collect();
    assert!(
        said.iter()
            .any(|r| r.contains("more than 1 Services") && r.contains("1 left out")),
        "{said:?}"
    );
}
