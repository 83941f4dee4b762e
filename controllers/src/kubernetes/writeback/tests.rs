//! What meridian writes into members, computed from snapshots built from converted objects.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use meridian_core::ClusterObjects;
use meridian_core::testing::{FleetBuilder, cluster, on_network, with_gateway};
use serde_json::json;

use super::*;
use crate::convert;

struct Member<'a> {
    name: &'a str,
    region: &'a str,
    network: &'a str,
    gateway: Option<&'a str>,
    /// (service, headless, port, ready addresses)
    services: Vec<(&'a str, bool, u16, Vec<&'a str>)>,
}

fn objects(services: &[(&str, bool, u16, Vec<&str>)]) -> ClusterObjects {
    let mut o = ClusterObjects::default();
    for (name, headless, port, addresses) in services {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"clusterIP": if *headless { "None" } else { "10.96.0.10" },
                     "ports": [{"name": "http", "port": port}]}
        }))
        .unwrap();
        o.services.push(convert::service(&svc).unwrap());
        let es: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}-1"), "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "endpoints": addresses.iter().map(|a| json!({"addresses": [a]})).collect::<Vec<_>>(),
            "ports": [{"name": "http", "port": 8080}]
        }))
        .unwrap();
        let (key, slice, _) = convert::slice(&es, convert::Validation::Kubernetes).unwrap();
        o.slices.push((key, slice));
        let meta = serde_json::from_value(json!({"name": name, "namespace": "shop"})).unwrap();
        o.exports.push(convert::export(&meta).unwrap());
    }
    o
}

fn snapshot(members: &[Member<'_>]) -> Snapshot {
    let mut fleet = FleetBuilder::new();
    for m in members {
        let zone = format!("{}-{}", m.region, m.name);
        let spec = on_network(cluster(m.name, m.region, &zone), m.network, false);
        fleet
            .member(match m.gateway {
                Some(address) => with_gateway(spec, address),
                None => spec,
            })
            .reset(m.name, objects(&m.services));
    }
    fleet.snapshot()
}

fn member<'a>(
    name: &'a str,
    region: &'a str,
    network: &'a str,
    gateway: Option<&'a str>,
    services: Vec<(&'a str, bool, u16, Vec<&'a str>)>,
) -> Member<'a> {
    Member {
        name,
        region,
        network,
        gateway,
        services,
    }
}

fn fleet() -> Snapshot {
    snapshot(&[
        member(
            "m1",
            "eu",
            "net1",
            Some("192.0.2.1"),
            vec![("payments", false, 80, vec!["10.1.0.1", "10.1.0.2"])],
        ),
        member("m2", "eu", "net1", None, vec![]),
        member(
            "m3",
            "us",
            "net2",
            Some("192.0.2.3"),
            vec![("payments", false, 80, vec!["10.3.0.1"])],
        ),
        member("m4", "ap", "net2", None, vec![]),
    ])
}

fn shop() -> BTreeSet<String> {
    ["shop".to_string()].into()
}

fn of_kind(d: &[Desired], kind: WrittenKind) -> Vec<&Desired> {
    d.iter().filter(|d| d.kind == kind).collect()
}

fn addresses(slice: &Desired) -> Vec<String> {
    let mut out: Vec<String> = slice.body["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|e| {
            e["addresses"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_string())
        })
        .collect();
    out.sort();
    out
}

fn source(slice: &Desired) -> String {
    slice.body["metadata"]["labels"]["multicluster.kubernetes.io/source-cluster"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn a_member_gets_an_import_a_derived_service_and_the_slices_its_clients_are_sent_to() {
    let snap = fleet();
    let m2 = snap.cluster_index("m2").unwrap();
    let desired = desired_objects(&snap, m2, &shop(), Instant::now());
    let imports = of_kind(&desired, WrittenKind::ServiceImport);
    assert_eq!(imports.len(), 1);
    let si = &imports[0].body;
    assert_eq!(si["spec"]["type"], "ClusterSetIP");
    assert_eq!(
        si["spec"]["ports"],
        json!([{"name": "http", "port": 80, "protocol": "TCP"}])
    );
    assert_eq!(
        si["status"]["clusters"],
        json!([{"cluster": "m1"}, {"cluster": "m3"}])
    );
    assert_eq!(
        si["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "meridian"
    );
    let services = of_kind(&desired, WrittenKind::Service);
    assert_eq!(services.len(), 1);
    assert_eq!(services[0].id.name, "derived-payments");
    assert!(services[0].body["spec"].get("selector").is_none());
    // m2's clients go to m1 first (same region), as DNS answers them: one slice, from m1.
    let slices = of_kind(&desired, WrittenKind::EndpointSlice);
    assert_eq!(slices.len(), 1);
    let labels = &slices[0].body["metadata"]["labels"];
    assert_eq!(labels["kubernetes.io/service-name"], "derived-payments");
    assert_eq!(
        labels["multicluster.kubernetes.io/service-name"],
        "payments"
    );
    assert_eq!(
        labels["endpointslice.kubernetes.io/managed-by"],
        "meridian.io"
    );
    assert_eq!(source(slices[0]), "m1");
    assert_eq!(addresses(slices[0]), ["10.1.0.1", "10.1.0.2"]);
    assert_eq!(
        slices[0].body["ports"],
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}])
    );
}

#[test]
fn a_member_on_another_network_reaches_remote_endpoints_through_the_gateway() {
    let snap = fleet();
    // m4 (net2, region ap, no endpoints): one tier of everyone; m1 sits on net1, so m4's
    // clients reach it through m1's gateway, and m3 (net2) directly.
    let m4 = snap.cluster_index("m4").unwrap();
    let desired = desired_objects(&snap, m4, &shop(), Instant::now());
    let mut seen: Vec<(String, Vec<String>, u64)> = of_kind(&desired, WrittenKind::EndpointSlice)
        .iter()
        .map(|s| {
            (
                source(s),
                addresses(s),
                s.body["ports"][0]["port"].as_u64().unwrap(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("m1".into(), vec!["192.0.2.1".to_string()], 15443),
            ("m3".into(), vec!["10.3.0.1".to_string()], 8080)
        ]
    );
}

#[test]
fn nothing_is_written_where_the_namespace_does_not_exist() {
    let snap = fleet();
    let m2 = snap.cluster_index("m2").unwrap();
    assert!(desired_objects(&snap, m2, &BTreeSet::new(), Instant::now()).is_empty());
}

#[test]
fn a_headless_service_gets_a_headless_import_and_nothing_derived() {
    let snap = snapshot(&[member(
        "m1",
        "eu",
        "net1",
        None,
        vec![("db", true, 5432, vec!["10.1.0.5"])],
    )]);
    let desired = desired_objects(&snap, 0, &shop(), Instant::now());
    assert_eq!(desired.len(), 1, "{desired:?}");
    assert_eq!(desired[0].body["spec"]["type"], "Headless");
}

#[test]
fn export_conditions_say_valid_conflict_or_why_not() {
    let snap = snapshot(&[
        member(
            "m1",
            "eu",
            "net1",
            None,
            vec![("payments", false, 80, vec!["10.1.0.1"])],
        ),
        member(
            "m2",
            "eu",
            "net1",
            None,
            vec![("payments", false, 8443, vec!["10.2.0.1"])],
        ),
    ]);
    let exports: BTreeSet<ObjectKey> = [
        ObjectKey::new("shop", "payments"),
        ObjectKey::new("shop", "ghost"),
    ]
    .into();
    let m1 = export_conditions(&snap, 0, &exports);
    let m2 = export_conditions(&snap, 1, &exports);
    let find = |c: &[ExportConditions], name: &str| {
        c.iter().find(|c| &*c.key.name == name).cloned().unwrap()
    };
    assert!(find(&m1, "payments").valid.0, "{m1:?}");
    assert!(!find(&m1, "payments").conflict.0, "{m1:?}");
    // Both were created at the same instant: the cluster name breaks the tie, m1 is oldest.
    assert!(find(&m2, "payments").valid.0);
    assert!(find(&m2, "payments").conflict.0, "{m2:?}");
    assert!(find(&m2, "payments").conflict.2.contains("port"), "{m2:?}");
    assert!(!find(&m1, "ghost").valid.0);
    assert_eq!(find(&m1, "ghost").valid.1, "ServiceNotFound");
}

#[test]
fn derived_names_are_dns_labels() {
    assert_eq!(derived_name("payments"), "derived-payments");
    let long = "a".repeat(63);
    let name = derived_name(&long);
    assert!(name.len() <= 63, "{name}");
    assert!(convert::is_dns_label(&name), "{name}");
    assert_eq!(name, derived_name(&long), "stable");
    assert_ne!(name, derived_name(&"a".repeat(62)), "distinct");
}

#[test]
fn a_large_cluster_is_split_into_slices_of_at_most_a_hundred() {
    let ips: Vec<String> = (0..250)
        .map(|i| format!("10.1.{}.{}", i / 200, i % 200 + 1))
        .collect();
    let snap = snapshot(&[
        member(
            "m1",
            "eu",
            "net1",
            None,
            vec![("big", false, 80, ips.iter().map(String::as_str).collect())],
        ),
        member("m2", "eu", "net1", None, vec![]),
    ]);
    let desired = desired_objects(&snap, 1, &shop(), Instant::now());
    let slices = of_kind(&desired, WrittenKind::EndpointSlice);
    let mut sizes: Vec<usize> = slices.iter().map(|s| addresses(s).len()).collect();
    sizes.sort();
    assert_eq!(sizes, [50, 100, 100]);
    let mut all: Vec<String> = slices.iter().flat_map(|s| addresses(s)).collect();
    all.sort();
    let mut want = ips.clone();
    want.sort();
    assert_eq!(all, want);
    let names: BTreeSet<&str> = slices.iter().map(|s| s.id.name.as_str()).collect();
    assert_eq!(names.len(), 3, "distinct names: {names:?}");
    assert!(names.iter().all(|n| convert::is_dns_label(n)), "{names:?}");
}

// The write-back against an API server in the test process.

use std::time::Duration;

use tokio::sync::watch as leadership_watch;

use crate::kubernetes::mock::{ApiServer, Reply, Seen, Store, status};

fn writes(client: kube::Client, leadership: Leadership) -> Slot<MemberWrites> {
    Slot::writing(
        Applier::new(client, leadership, ClusterId::new("m2")),
        RESYNC,
        MemberWrites::new(),
    )
}

/// An API server in the test process that keeps what is written (so a drift check finds
/// what meridian wrote where it left it); `respond` answers first where it says Some.
fn member_server(
    respond: impl FnMut(&Seen) -> Option<Reply> + Send + 'static,
) -> (kube::Client, ApiServer, Arc<parking_lot::Mutex<Store>>) {
    let store = Arc::new(parking_lot::Mutex::new(Store::default()));
    let (client, server) = ApiServer::stateful(store.clone(), respond);
    (client, server, store)
}

/// A pass over everything, checking for drift afterwards when a check is due (the first
/// pass, or one after a failed pass), as `MemberWrites::plan` decides.
async fn full_pass(
    state: &mut Slot<MemberWrites>,
    desired: Vec<Desired>,
    conditions: Vec<ExportConditions>,
) -> Result<(), apply::Error> {
    let pass = Pass::full(state.resync.due());
    reconcile_member(state, desired, conditions, &pass).await
}

/// What a pass over `keys` writes into member `member` of `snap` (as `run` decides it).
fn desired_for(snap: &Snapshot, member: usize, keys: &BTreeSet<ObjectKey>) -> Vec<Desired> {
    desired_objects_in(
        snap,
        member,
        &shop(),
        Instant::now(),
        &Scope::Services(keys.clone()),
    )
}

/// A pass over `keys` only, with no drift check.
fn scoped(keys: BTreeSet<ObjectKey>) -> Pass {
    Pass {
        objects: Scope::Services(keys.clone()),
        conditions: Scope::Services(keys),
        check_drift: false,
    }
}

const DERIVED: &str = "/api/v1/namespaces/shop/services/derived-payments";
const IMPORT: &str = "/apis/multicluster.x-k8s.io/v1alpha1/namespaces/shop/serviceimports/payments";

/// Answers a derived Service's apply with a ClusterIP and a UID, as the API server allocates.
fn allocating(r: &Seen) -> Option<(u16, Value)> {
    (r.method == "PATCH" && r.path == DERIVED).then(|| {
        let mut svc = r.body.clone();
        svc["spec"]["clusterIP"] = json!("10.96.5.5");
        svc["metadata"]["uid"] = json!("derived-uid");
        (200, svc)
    })
}

fn m2_desired() -> Vec<Desired> {
    let snap = fleet();
    let m2 = snap.cluster_index("m2").unwrap();
    desired_objects(&snap, m2, &shop(), Instant::now())
}

#[tokio::test]
async fn derived_services_go_first_and_fill_the_import_and_the_slices() {
    let (client, server, _) = member_server(allocating);
    let mut state = writes(client, Leadership::always("test"));
    full_pass(&mut state, m2_desired(), vec![]).await.unwrap();
    let sent = server.patches();
    let paths: Vec<&str> = sent.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths.len(), 4, "{paths:?}");
    assert_eq!(paths[0], DERIVED);
    assert_eq!(paths[1], IMPORT);
    assert_eq!(
        paths[2],
        format!("{IMPORT}/status"),
        "status is a request of its own"
    );
    assert!(
        paths[3].starts_with("/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices/"),
        "{paths:?}"
    );
    for r in &sent {
        assert_eq!(r.param("fieldManager"), Some("meridian"));
        assert_eq!(r.param("force"), Some("true"));
    }
    // The ClusterIP and UID come from what the API returned for the derived Service.
    assert_eq!(sent[1].body["spec"]["ips"], json!(["10.96.5.5"]));
    assert_eq!(
        sent[2].body["status"]["clusters"],
        json!([{"cluster": "m1"}, {"cluster": "m3"}])
    );
    assert_eq!(
        sent[3].body["metadata"]["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Service", "name": "derived-payments", "uid": "derived-uid"}])
    );
    // A first pass checks for drift: it lists all three kinds in every namespace (what
    // carries meridian's label), and the member's ServiceExports.
    let lists: BTreeSet<(String, Option<String>)> = server
        .calls()
        .iter()
        .filter(|r| r.method == "GET")
        .map(|r| (r.path.clone(), r.param("labelSelector").map(str::to_string)))
        .collect();
    let managed = Some("app.kubernetes.io/managed-by=meridian".to_string());
    assert_eq!(
        lists,
        [
            ("/api/v1/services", managed.clone()),
            ("/apis/discovery.k8s.io/v1/endpointslices", managed.clone()),
            (
                "/apis/multicluster.x-k8s.io/v1alpha1/serviceimports",
                managed.clone()
            ),
            (
                "/apis/multicluster.x-k8s.io/v1alpha1/serviceexports",
                Some(String::new())
            ),
        ]
        .map(|(p, s)| (p.to_string(), s))
        .into()
    );
    assert!(state.state.drifted.is_empty() && !state.state.conditions_drifted);

    // Nothing changed: nothing is sent, not even discovery again.
    let before = server.requests().len();
    full_pass(&mut state, m2_desired(), vec![]).await.unwrap();
    assert_eq!(
        server.requests().len(),
        before,
        "{:?}",
        &server.requests()[before..]
    );
}

#[tokio::test]
async fn one_refused_object_does_not_hold_up_the_others() {
    let (client, server, _) = member_server(|r| {
        if r.method == "PATCH" && r.path == IMPORT {
            return Some(status(
                422,
                "Invalid",
                "ServiceImport.multicluster.x-k8s.io \"payments\" is invalid: spec.ports: Required value",
            ));
        }
        allocating(r)
    });
    let mut state = writes(client, Leadership::always("test"));
    let err = full_pass(&mut state, m2_desired(), vec![])
        .await
        .unwrap_err();
    assert!(err.is_invalid(), "{err:?}");
    assert!(
        err.to_string().contains("spec.ports: Required value"),
        "{err}"
    );
    let paths: Vec<String> = server.patches().into_iter().map(|r| r.path).collect();
    assert!(!paths.contains(&format!("{IMPORT}/status")), "{paths:?}");
    assert!(
        paths.iter().any(|p| p.contains("/endpointslices/")),
        "the slices are still written: {paths:?}"
    );
    // The next pass writes again what was refused; what was written stays as written (a
    // drift check after the first complete pass finds any change made meanwhile).
    let before = server.patches().len();
    let _ = full_pass(&mut state, m2_desired(), vec![]).await;
    let again: Vec<String> = server.patches()[before..]
        .iter()
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(again, [IMPORT], "{again:?}");
}

#[tokio::test]
async fn leadership_lapsing_between_an_import_and_its_status_stops_the_pass() {
    let (tx, until) = leadership_watch::channel(Some(Instant::now() + Duration::from_secs(60)));
    let (client, server) = ApiServer::start(move |r| {
        if r.method == "PATCH" && r.path == IMPORT {
            tx.send_replace(None);
        }
        allocating(r)
    });
    let mut state = writes(client, Leadership::following(until));
    full_pass(&mut state, m2_desired(), vec![]).await.unwrap();
    let paths: Vec<String> = server.patches().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, [DERIVED, IMPORT], "nothing after the lapse");
    // The term's first pass lists what the member holds (to learn what is applied) before
    // it writes; after the lapse, no list and no delete.
    let calls = server.calls();
    let first_write = calls.iter().position(|r| r.method == "PATCH").unwrap();
    assert!(
        calls[..first_write]
            .iter()
            .all(|r| r.method == "GET" && r.param("labelSelector").is_some()),
        "{calls:?}"
    );
    assert!(
        calls[first_write..].iter().all(|r| r.method == "PATCH"),
        "no list, no delete"
    );
}

#[tokio::test]
async fn what_is_no_longer_wanted_is_deleted_slices_first() {
    // The member also holds a slice meridian wrote before this process started.
    let left_over = "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices/left-over";
    let store = Arc::new(parking_lot::Mutex::new(Store::with([(
        left_over.to_string(),
        json!({"metadata": {"name": "left-over", "namespace": "shop"}}),
    )])));
    let (client, server) = ApiServer::stateful(store, allocating);
    let mut state = writes(client, Leadership::always("test"));
    full_pass(&mut state, m2_desired(), vec![]).await.unwrap();
    let deleted = |server: &ApiServer| -> Vec<String> {
        server
            .calls()
            .into_iter()
            .filter(|r| r.method == "DELETE")
            .map(|r| r.path)
            .collect()
    };
    assert_eq!(
        deleted(&server),
        ["/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices/left-over"]
    );
    // The service is no longer exported: everything written for it goes, slices first.
    full_pass(&mut state, vec![], vec![]).await.unwrap();
    let gone = deleted(&server);
    assert_eq!(gone.len(), 4, "{gone:?}");
    assert!(gone[1].contains("/endpointslices/"), "{gone:?}");
    assert_eq!(gone[2], IMPORT);
    assert_eq!(gone[3], DERIVED);
    assert!(state.state.derived.is_empty());
    assert_eq!(state.state.objects.ids().count(), 0);
}

#[tokio::test]
async fn export_conditions_go_to_the_export_status_and_a_missing_export_is_no_error() {
    let snap = fleet();
    let m1 = snap.cluster_index("m1").unwrap();
    let exports: BTreeSet<ObjectKey> = [
        ObjectKey::new("shop", "payments"),
        ObjectKey::new("shop", "ghost"),
    ]
    .into();
    let conditions = export_conditions(&snap, m1, &exports);
    let export = "/apis/multicluster.x-k8s.io/v1alpha1/namespaces/shop/serviceexports";
    let ghost = format!("{export}/ghost/status");
    let (client, server, _) = member_server(move |r| {
        (r.path == ghost).then(|| status(404, "NotFound", "serviceexports \"ghost\" not found"))
    });
    let mut state = writes(client, Leadership::always("test"));
    full_pass(&mut state, vec![], conditions.clone())
        .await
        .unwrap();
    let sent = server.patches();
    let payments = sent
        .iter()
        .find(|r| r.path == format!("{export}/payments/status"))
        .unwrap();
    let valid = &payments.body["status"]["conditions"][0];
    assert_eq!(valid["type"], "Valid");
    assert_eq!(valid["status"], "True");
    assert_eq!(valid["reason"], "Exported");
    assert!(valid["lastTransitionTime"].is_string(), "{valid}");
    assert_eq!(payments.body["status"]["conditions"][1]["type"], "Conflict");
    assert_eq!(sent.len(), 2, "both exports: {sent:?}");
    // Unchanged conditions are not written again, though the time would differ.
    full_pass(&mut state, vec![], conditions.clone())
        .await
        .unwrap();
    assert_eq!(server.patches().len(), 2);
    // Nor by a new term, which reads them from the member (the missing export is tried
    // again: the member may have it now).
    let mut next = writes(state.applier.client().clone(), Leadership::always("test"));
    full_pass(&mut next, vec![], conditions).await.unwrap();
    let again: Vec<String> = server.patches()[2..]
        .iter()
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(again, [format!("{export}/ghost/status")]);
}

/// m1 exports payments and orders; m2 exports nothing. Built as the store builds and
/// publishes: each snapshot re-merges what changed since the one before and is restamped
/// against it.
struct Published {
    fleet: FleetBuilder,
    last: Snapshot,
}

impl Published {
    fn new() -> Self {
        let mut fleet = FleetBuilder::new();
        fleet
            .member(on_network(cluster("m1", "eu", "eu-m1"), "net1", false))
            .reset(
                "m1",
                objects(&[
                    ("payments", false, 80, vec!["10.1.0.1"]),
                    ("orders", false, 80, vec!["10.1.0.7"]),
                ]),
            )
            .member(on_network(cluster("m2", "eu", "eu-m2"), "net1", false));
        let mut last = fleet.snapshot();
        last.restamp(&Snapshot::empty(), fleet.t0);
        fleet.index.take_dirty();
        Self { fleet, last }
    }

    /// The next snapshot after m1 lists `services` instead.
    fn relist(&mut self, services: &[(&str, bool, u16, Vec<&str>)]) -> Snapshot {
        self.fleet.reset("m1", objects(services));
        let dirty = self.fleet.index.take_dirty();
        let policies = meridian_core::Policies::new(Arc::default(), vec![]);
        let mut next = Snapshot::rebuild(
            &self.last,
            &dirty,
            self.last.version + 1,
            &self.fleet.index,
            &self.fleet.registry,
            &policies,
            self.fleet.t0,
        );
        next.restamp(&self.last, self.fleet.t0);
        std::mem::replace(&mut self.last, next)
    }
}

#[test]
fn changed_services_are_those_whose_views_were_renewed_or_went() {
    let mut p = Published::new();
    let first = p.relist(&[
        ("payments", false, 80, vec!["10.1.0.1"]),
        ("orders", false, 80, vec!["10.1.0.8"]),
    ]);
    assert_eq!(
        changed_services(&first, &p.last),
        Some([ObjectKey::new("shop", "orders")].into()),
        "orders' endpoint moved; payments is untouched"
    );
    let second = p.relist(&[("payments", false, 80, vec!["10.1.0.1"])]);
    assert_eq!(
        changed_services(&second, &p.last),
        Some([ObjectKey::new("shop", "orders")].into()),
        "orders is no longer exported"
    );
    assert_eq!(changed_services(&second, &second), Some(BTreeSet::new()));
    // A snapshot nobody restamped cannot say what changed.
    assert_eq!(changed_services(&fleet(), &p.last), None);
}

#[tokio::test]
async fn a_pass_over_changed_services_writes_and_deletes_only_theirs() {
    let mut p = Published::new();
    let (client, server, _) = member_server(|_| None);
    let mut state = writes(client, Leadership::always("test"));
    let m2 = p.last.cluster_index("m2").unwrap();
    let first = desired_objects(&p.last, m2, &shop(), Instant::now());
    full_pass(&mut state, first, vec![]).await.unwrap();
    let before = server.calls().len();

    // orders' endpoint moves: only orders' slice is written again.
    let was = p.relist(&[
        ("payments", false, 80, vec!["10.1.0.1"]),
        ("orders", false, 80, vec!["10.1.0.8"]),
    ]);
    let keys = changed_services(&was, &p.last).unwrap();
    let desired = desired_for(&p.last, m2, &keys);
    assert!(
        desired.iter().all(|d| d.service.name.as_ref() == "orders"),
        "{desired:?}"
    );
    reconcile_member(&mut state, desired, vec![], &scoped(keys))
        .await
        .unwrap();
    let sent: Vec<Seen> = server.calls()[before..].to_vec();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(
        sent[0].path.contains("/endpointslices/derived-orders-"),
        "{sent:?}"
    );
    let before = server.calls().len();

    // orders goes: its three objects are deleted, payments' stay.
    let was = p.relist(&[("payments", false, 80, vec!["10.1.0.1"])]);
    let keys = changed_services(&was, &p.last).unwrap();
    let desired = desired_for(&p.last, m2, &keys);
    assert!(desired.is_empty(), "{desired:?}");
    reconcile_member(&mut state, desired, vec![], &scoped(keys))
        .await
        .unwrap();
    let sent: Vec<Seen> = server.calls()[before..].to_vec();
    assert!(sent.iter().all(|r| r.method == "DELETE"), "{sent:?}");
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert!(sent.iter().all(|r| r.path.contains("orders")), "{sent:?}");
    assert_eq!(
        state.state.by_service.keys().cloned().collect::<Vec<_>>(),
        [ObjectKey::new("shop", "payments")]
    );
}

#[tokio::test]
async fn a_drift_check_writes_again_only_what_someone_else_changed_or_deleted() {
    let p = Published::new();
    let (client, server, store) = member_server(|_| None);
    let mut state = writes(client, Leadership::always("test"));
    let m2 = p.last.cluster_index("m2").unwrap();
    let all = desired_objects(&p.last, m2, &shop(), Instant::now());
    full_pass(&mut state, all, vec![]).await.unwrap();
    let orders_slice = server
        .patches()
        .into_iter()
        .map(|r| r.path)
        .find(|p| p.contains("/endpointslices/derived-orders-"))
        .unwrap();
    // Someone empties orders' slice, deletes payments' import and leaves an object with
    // meridian's label that meridian did not write.
    store
        .lock()
        .touch(&orders_slice, |o| o["endpoints"] = json!([]));
    store.lock().remove(IMPORT);
    let stray = "/api/v1/namespaces/shop/services/derived-gone";
    store.lock().put(
        stray,
        json!({"metadata": {"name": "derived-gone", "namespace": "shop"}}),
    );

    let before = server.calls().len();
    let check = Pass {
        check_drift: true,
        ..scoped(BTreeSet::new())
    };
    reconcile_member(&mut state, vec![], vec![], &check)
        .await
        .unwrap();
    let sent: Vec<Seen> = server.calls()[before..].to_vec();
    assert!(
        sent.iter()
            .all(|r| r.method == "GET" || (r.method == "DELETE" && r.path == stray)),
        "a check lists, and deletes only the stray: {sent:?}"
    );
    assert_eq!(sent.iter().filter(|r| r.method == "GET").count(), 4);
    assert!(store.lock().get(stray).is_none());
    assert_eq!(
        state.state.drifted,
        [
            ObjectKey::new("shop", "orders"),
            ObjectKey::new("shop", "payments")
        ]
        .into()
    );

    // The next pass (its scope holds the drifted services) writes exactly what drifted.
    let keys = std::mem::take(&mut state.state.drifted);
    let desired = desired_for(&p.last, m2, &keys);
    let before = server.patches().len();
    reconcile_member(&mut state, desired, vec![], &scoped(keys))
        .await
        .unwrap();
    let written: BTreeSet<String> = server.patches()[before..]
        .iter()
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(
        written,
        [
            IMPORT.to_string(),
            format!("{IMPORT}/status"),
            orders_slice.clone()
        ]
        .into()
    );
    assert_eq!(
        store.lock().get(&orders_slice).unwrap()["endpoints"][0]["addresses"],
        json!(["10.1.0.7"])
    );
}

#[tokio::test]
async fn a_pass_writes_the_services_that_changed_and_every_condition_when_exports_changed() {
    let mut p = Published::new();
    let (client, _server, _) = member_server(|_| None);
    let mut state = writes(client, Leadership::always("test"));
    let payments = ObjectKey::new("shop", "payments");
    let orders = ObjectKey::new("shop", "orders");
    let exports: BTreeSet<ObjectKey> = [payments.clone()].into();
    let was = p.relist(&[
        ("payments", false, 80, vec!["10.1.0.1"]),
        ("orders", false, 80, vec!["10.1.0.8"]),
    ]);
    state.state.settled = Some(Settled {
        snapshot: Arc::new(was),
        namespaces: shop(),
        exports: exports.clone(),
    });
    state.resync.done(Instant::now());
    let next = &p.last;
    let plan = |state: &mut Slot<MemberWrites>,
                namespaces: &BTreeSet<String>,
                exports: &BTreeSet<ObjectKey>,
                timed: &[ObjectKey]| {
        state.plan(&mut Changes::new(next), namespaces, exports, timed.iter())
    };
    let set = |keys: &[&ObjectKey]| keys.iter().map(|k| (*k).clone()).collect::<BTreeSet<_>>();
    let only = |keys: &[&ObjectKey]| Scope::Services(set(keys));

    assert_eq!(
        plan(&mut state, &shop(), &exports, &[]),
        scoped(set(&[&orders]))
    );
    // A new export: every condition, still only orders' objects.
    let both: BTreeSet<ObjectKey> = [payments.clone(), orders.clone()].into();
    let pass = plan(&mut state, &shop(), &both, &[]);
    assert_eq!(
        (pass.objects, pass.conditions),
        (only(&[&orders]), Scope::Full)
    );
    // What drifted and what depends on time are written with what changed, once.
    state.state.drifted.insert(payments.clone());
    let timed = ObjectKey::new("shop", "timed");
    let pass = plan(&mut state, &shop(), &exports, std::slice::from_ref(&timed));
    assert_eq!(pass.objects, only(&[&orders, &payments, &timed]));
    assert_eq!(
        plan(&mut state, &shop(), &exports, &[]).objects,
        only(&[&orders])
    );
    // A drift check is due: it comes with a scoped pass, not a full one.
    state.resync.reset();
    let pass = plan(&mut state, &shop(), &exports, &[]);
    assert!(pass.check_drift);
    assert_eq!(pass.objects, only(&[&orders]));
    // The member's namespaces changed: everything.
    let more: BTreeSet<String> = ["shop".to_string(), "more".to_string()].into();
    assert_eq!(plan(&mut state, &more, &exports, &[]), Pass::full(true));
}

// The whole loop (`run`: kubernetes::reconcile's Wake and slots) on the mock.

/// Facts of member m2 on `client`, as a source that listed everything publishes them.
fn m2_facts(facts: &Facts, client: kube::Client) {
    facts.update(&ClusterId::new("m2"), |f| {
        f.client = Some(client);
        f.connection = 7;
        f.listed = true;
        f.namespaces = shop();
    });
}

/// The write-back of a fleet that does not change (while the sender returned lives),
/// leading, over `facts`.
fn spawn_run(
    facts: &Facts,
) -> (
    tokio::sync::watch::Sender<Arc<Snapshot>>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, snapshots) = tokio::sync::watch::channel(Arc::new(fleet()));
    let metrics = WritebackMetrics::new(&mut prometheus_client::registry::Registry::default());
    let task = tokio::spawn(run(
        snapshots,
        facts.clone(),
        Leadership::always("test"),
        metrics,
        RESYNC,
    ));
    (tx, task)
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..250 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what} did not happen within 5 s");
}

#[tokio::test]
async fn a_running_write_back_writes_a_member_and_cleans_up_and_forgets_one_that_left_the_hub() {
    let store = Arc::new(parking_lot::Mutex::new(Store::default()));
    let (client, server) = ApiServer::stateful(store.clone(), allocating);
    let facts = Facts::default();
    m2_facts(&facts, client);
    let (_snapshots, task) = spawn_run(&facts);
    until("the derived Service and the import written", || {
        let s = store.lock();
        s.get(DERIVED).is_some() && s.get(IMPORT).is_some()
    })
    .await;
    // The member leaves the hub: the leader deletes what meridian wrote there, then the
    // member's facts go.
    facts.retire(&ClusterId::new("m2"));
    until("everything meridian wrote deleted", || {
        let s = store.lock();
        s.get(DERIVED).is_none() && s.get(IMPORT).is_none()
    })
    .await;
    until("the member forgotten", || {
        !facts.all().contains_key(&ClusterId::new("m2"))
    })
    .await;
    let deletes = server
        .calls()
        .into_iter()
        .filter(|r| r.method == "DELETE")
        .count();
    assert!(
        deletes >= 3,
        "a slice, the import and the derived Service: {deletes}"
    );
    task.abort();
}

#[tokio::test]
async fn a_running_write_back_backs_off_a_member_that_refuses_and_writes_a_new_connection_afresh() {
    // The first connection refuses every write (its RBAC, say).
    let (refusing, refused) = ApiServer::start(|r| {
        (r.method == "PATCH").then(|| status(403, "Forbidden", "patch is forbidden"))
    });
    let facts = Facts::default();
    m2_facts(&facts, refusing);
    let (_snapshots, task) = spawn_run(&facts);
    until("a refused write", || !refused.patches().is_empty()).await;
    // Woken again and again (new facts), it does not ask the refusing member at every
    // wake: the back-off (0.5 s, then 1 s) holds it off.
    for _ in 0..10 {
        facts.update(&ClusterId::new("m2"), |_| {});
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rounds = refused
        .patches()
        .iter()
        .filter(|r| r.path == DERIVED)
        .count();
    assert!(
        rounds <= 3,
        "the derived Service asked {rounds} times in about a second"
    );
    // The source reconnects: a new connection is a new applier, written at once.
    let store = Arc::new(parking_lot::Mutex::new(Store::default()));
    let (client, _server) = ApiServer::stateful(store.clone(), allocating);
    facts.update(&ClusterId::new("m2"), |f| {
        f.client = Some(client);
        f.connection = 8;
    });
    until("written through the new connection", || {
        store.lock().get(IMPORT).is_some()
    })
    .await;
    task.abort();
}

#[tokio::test]
async fn a_new_term_learns_what_the_member_holds_and_writes_only_what_is_not_right() {
    let (client, server, _) = member_server(allocating);
    let mut first = writes(client.clone(), Leadership::always("test"));
    full_pass(&mut first, m2_desired(), vec![]).await.unwrap();
    let written = server.patches().len();
    assert_eq!(written, 4, "the first term writes everything");
    for r in server
        .patches()
        .iter()
        .filter(|r| !r.path.ends_with("/status"))
    {
        let print = &r.body["metadata"]["annotations"][APPLIED_ANNOTATION];
        assert!(print.is_string(), "{} carries its applied print", r.path);
    }

    // A new term (a new leader, a restart): nothing is written, and the import and slices
    // still carry the derived Service's ClusterIP and UID (learned from the member).
    let mut second = writes(client.clone(), Leadership::always("test"));
    full_pass(&mut second, m2_desired(), vec![]).await.unwrap();
    assert_eq!(
        server.patches().len(),
        written,
        "{:?}",
        &server.patches()[written..]
    );
    let derived = &second.state.derived[&("shop".to_string(), "derived-payments".to_string())];
    assert_eq!(
        derived,
        &(
            Some("10.96.5.5".to_string()),
            Some("derived-uid".to_string())
        )
    );

    // A third term whose desired import differs (a cluster gone): only the import and its
    // status are written.
    let mut third = writes(client, Leadership::always("test"));
    let mut desired = m2_desired();
    for d in desired
        .iter_mut()
        .filter(|d| d.kind == WrittenKind::ServiceImport)
    {
        d.body["status"]["clusters"] = json!([{"cluster": "m1"}]);
    }
    full_pass(&mut third, desired, vec![]).await.unwrap();
    let paths: Vec<String> = server.patches()[written..]
        .iter()
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(paths, [IMPORT.to_string(), format!("{IMPORT}/status")]);
}
