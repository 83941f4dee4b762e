use super::*;

use crate::index::Object;
use crate::model::{ClusterSpec, Endpoint, Export, Import, Protocol};
use crate::policy::Policies;
use crate::testing::{FleetBuilder, http_ep, ip, port, secs, svc};
use ipnet::IpNet;

// ---- builders ----

fn ep_multi(addrs: &[&str]) -> Endpoint {
    Endpoint {
        addresses: addrs.iter().map(|a| ip(a)).collect(),
        ..http_ep(addrs[0], true)
    }
}

fn web(snapshot: &Snapshot) -> &ServiceView {
    snapshot.service("shop", "web").expect("shop/web is served")
}

/// The names of the clusters with a backend, in backend order.
fn backend_names<'a>(snapshot: &'a Snapshot, view: &ServiceView) -> Vec<&'a str> {
    view.backends
        .iter()
        .map(|b| snapshot.clusters[b.cluster].spec.id.as_str())
        .collect()
}

fn addresses(backend: &Backend) -> Vec<IpAddr> {
    backend
        .endpoints()
        .flat_map(|e| e.addresses.iter().copied())
        .collect()
}

// ---- which services are served ----

#[test]
fn only_exported_services_are_served() {
    let mut fleet = FleetBuilder::with_members(&["a"]);
    fleet.version = 7;
    fleet.export("a", "web", svc(false, &[("http", 80)]), 1);
    fleet.slice("a", "web-1", "web", vec![http_ep("10.0.0.1", true)]);
    // A Service without a ServiceExport.
    fleet.apply(
        "a",
        Object::Service(
            ObjectKey::new("shop", "private"),
            svc(false, &[("http", 80)]),
        ),
    );
    fleet.slice("a", "private-1", "private", vec![http_ep("10.0.0.2", true)]);
    // A ServiceExport without its Service.
    fleet.apply(
        "a",
        Object::Export(
            ObjectKey::new("other", "orphan"),
            Export {
                created: 1,
                ..Export::default()
            },
        ),
    );

    let snap = fleet.snapshot();
    assert_eq!(snap.version, 7);
    assert!(snap.service("shop", "web").is_some());
    assert!(snap.service("shop", "private").is_none(), "not exported");
    assert!(
        snap.service("other", "orphan").is_none(),
        "exported without a Service"
    );
    assert!(!snap.has_namespace("other"));
    assert!(snap.has_namespace("shop"));
    assert!(snap.has_services());
    assert_eq!(snap.service_count(), 1);
    assert!(
        snap.problems.is_empty(),
        "a missing Service is not a problem yet: {:?}",
        snap.problems
    );
}

#[test]
fn services_are_listed_by_namespace_and_name() {
    let mut fleet = FleetBuilder::with_members(&["a"]);
    for (ns, name) in [("zeta", "a"), ("alpha", "z"), ("alpha", "b"), ("mid", "x")] {
        fleet.apply(
            "a",
            Object::Service(ObjectKey::new(ns, name), svc(false, &[("http", 80)])),
        );
        fleet.apply(
            "a",
            Object::Export(
                ObjectKey::new(ns, name),
                Export {
                    created: 1,
                    ..Export::default()
                },
            ),
        );
    }
    let snap = fleet.snapshot();
    let listed: Vec<String> = snap.services().map(|v| v.key.to_string()).collect();
    assert_eq!(listed, ["alpha/b", "alpha/z", "mid/x", "zeta/a"]);
    assert_eq!(snap.service_count(), 4);
}

#[test]
fn an_empty_snapshot_serves_nothing_and_is_not_synced() {
    let snap = Snapshot::empty();
    assert!(!snap.synced);
    assert!(!snap.has_services());
    assert_eq!(snap.service_count(), 0);
    assert_eq!(snap.client_cluster(ip("10.0.0.1")), None);
}

#[test]
fn an_external_name_export_is_a_problem_and_not_served_from_that_cluster() {
    let mut fleet = FleetBuilder::with_members(&["a", "b"]);
    let mut external = svc(false, &[]);
    external.external_name = true;
    fleet.export("a", "web", external, 1);
    fleet.export("b", "web", svc(false, &[("http", 80)]), 2);
    fleet.slice("b", "web-1", "web", vec![http_ep("10.1.0.1", true)]);
    let mut only_external = svc(false, &[]);
    only_external.external_name = true;
    fleet.export("b", "ext", only_external, 1);

    let snap = fleet.snapshot();
    let view = web(&snap);
    assert_eq!(backend_names(&snap, view), ["b"]);
    assert_eq!(
        view.ports,
        [port("http", 80)],
        "the ExternalName export does not decide, though older"
    );
    assert!(view.conflicts.is_empty());
    assert!(snap.service("shop", "ext").is_none());

    let mut problems = snap.problems.clone();
    problems.sort_by(|x, y| x.origin.cmp(&y.origin));
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert_eq!(problems[0].origin, Origin::Member(ClusterId::new("a")));
    assert_eq!(problems[0].subject.to_string(), "ServiceExport shop/web");
    assert_eq!(problems[1].origin, Origin::Member(ClusterId::new("b")));
    assert_eq!(problems[1].subject.to_string(), "ServiceExport shop/ext");
    assert!(problems.iter().all(|p| p.reason.contains("ExternalName")));
}

// ---- readiness ----

#[test]
fn backend_ready_follows_endpoint_conditions_and_publish_not_ready() {
    struct Case {
        name: &'static str,
        ready: bool,
        serving: bool,
        terminating: bool,
        publish_not_ready: bool,
        answerable: bool,
    }
    #[rustfmt::skip]
    let cases = [
        Case { name: "ready", ready: true, serving: true, terminating: false, publish_not_ready: false, answerable: true },
        Case { name: "not ready", ready: false, serving: false, terminating: false, publish_not_ready: false, answerable: false },
        Case { name: "not ready, published", ready: false, serving: false, terminating: false, publish_not_ready: true, answerable: true },
        Case { name: "ready but terminating", ready: true, serving: true, terminating: true, publish_not_ready: false, answerable: false },
        Case { name: "serving and terminating", ready: false, serving: true, terminating: true, publish_not_ready: false, answerable: false },
        Case { name: "terminating, published", ready: false, serving: true, terminating: true, publish_not_ready: true, answerable: false },
        Case { name: "ready and published", ready: true, serving: true, terminating: false, publish_not_ready: true, answerable: true },
    ];
    for case in cases {
        let mut fleet = FleetBuilder::with_members(&["a"]);
        let mut service = svc(false, &[("http", 80)]);
        service.publish_not_ready = case.publish_not_ready;
        fleet.export("a", "web", service, 1);
        let endpoint = Endpoint {
            ready: case.ready,
            serving: case.serving,
            terminating: case.terminating,
            ..http_ep("10.0.0.1", true)
        };
        // One always-ready endpoint next to it, so the backend is never empty.
        fleet.slice(
            "a",
            "web-1",
            "web",
            vec![endpoint, http_ep("10.0.0.2", true)],
        );

        let snap = fleet.snapshot();
        let backend = &web(&snap).backends[0];
        assert_eq!(
            backend.endpoints().count(),
            2,
            "{}: every endpoint is kept for xDS",
            case.name
        );
        assert_eq!(
            backend.publish_not_ready, case.publish_not_ready,
            "{}",
            case.name
        );
        assert_eq!(
            backend.ready,
            1 + u32::from(case.answerable),
            "{}",
            case.name
        );
        let answered: Vec<IpAddr> = backend
            .answerable()
            .flat_map(|e| e.addresses.clone())
            .collect();
        let mut expected = Vec::new();
        if case.answerable {
            expected.push(ip("10.0.0.1"));
        }
        expected.push(ip("10.0.0.2"));
        assert_eq!(answered, expected, "{}", case.name);
    }
}

#[test]
fn publish_not_ready_is_per_cluster() {
    let mut fleet = FleetBuilder::with_members(&["a", "b"]);
    let mut published = svc(false, &[("http", 80)]);
    published.publish_not_ready = true;
    fleet.export("a", "web", published, 1);
    fleet.export("b", "web", svc(false, &[("http", 80)]), 2);
    fleet.slice("a", "web-1", "web", vec![http_ep("10.0.0.1", false)]);
    fleet.slice("b", "web-1", "web", vec![http_ep("10.1.0.1", false)]);

    let snap = fleet.snapshot();
    let view = web(&snap);
    assert!(
        view.conflicts.is_empty(),
        "publishNotReadyAddresses is no MCS property"
    );
    assert_eq!(view.backends[0].ready, 1);
    assert_eq!(view.backends[1].ready, 0);
}

#[test]
fn dual_stack_endpoints_are_kept_with_both_families() {
    let mut fleet = FleetBuilder::with_members(&["a"]);
    fleet.export("a", "web", svc(false, &[("http", 80)]), 1);
    // One slice per address family, as Kubernetes writes them, and one endpoint carrying both.
    fleet.slice(
        "a",
        "web-v4",
        "web",
        vec![http_ep("10.0.0.1", true), http_ep("10.0.0.2", false)],
    );
    fleet.slice(
        "a",
        "web-v6",
        "web",
        vec![http_ep("fd00::1", true), http_ep("fd00::2", false)],
    );
    fleet.slice(
        "a",
        "web-x",
        "web",
        vec![ep_multi(&["10.0.0.3", "fd00::3"])],
    );

    let snap = fleet.snapshot();
    let backend = &web(&snap).backends[0];
    assert_eq!(
        addresses(backend),
        [
            "10.0.0.1", "10.0.0.2", "fd00::1", "fd00::2", "10.0.0.3", "fd00::3"
        ]
        .map(ip)
    );
    assert_eq!(
        backend.endpoints().nth(4).unwrap().addresses,
        [ip("10.0.0.3"), ip("fd00::3")]
    );
    assert_eq!(backend.ready, 3);
    let answered: Vec<IpAddr> = backend
        .answerable()
        .flat_map(|e| e.addresses.clone())
        .collect();
    assert_eq!(
        answered,
        ["10.0.0.1", "fd00::1", "10.0.0.3", "fd00::3"].map(ip)
    );
    assert_eq!(snap.clusters[0].endpoints, 5);
}

// ---- MCS conflict resolution ----

#[test]
fn the_oldest_export_decides_headlessness_and_a_disagreeing_cluster_is_excluded() {
    let mut fleet = FleetBuilder::with_members(&["a", "b", "c"]);
    fleet.export("a", "web", svc(false, &[("http", 80)]), 100);
    fleet.export("b", "web", svc(true, &[("http", 80)]), 50);
    fleet.export("c", "web", svc(true, &[("http", 80)]), 200);
    for c in ["a", "b", "c"] {
        fleet.slice(c, "web-1", "web", vec![http_ep("10.0.0.1", true)]);
    }

    let snap = fleet.snapshot();
    let view = web(&snap);
    assert!(view.headless, "b exported first");
    assert_eq!(backend_names(&snap, view), ["b", "c"]);
    assert_eq!(view.conflicts.len(), 1);
    let conflict = &view.conflicts[0];
    assert_eq!(conflict.cluster, ClusterId::new("a"));
    assert!(conflict.excluded);
    assert!(conflict.reason.contains("headless"), "{}", conflict.reason);
}

#[test]
fn an_export_time_tie_is_broken_by_cluster_name() {
    let mut fleet = FleetBuilder::with_members(&["a", "b"]);
    fleet.export("b", "web", svc(false, &[("http", 80)]), 100);
    fleet.export("a", "web", svc(true, &[("grpc", 9090)]), 100);

    let snap = fleet.snapshot();
    let view = web(&snap);
    assert!(view.headless, "a sorts before b");
    assert_eq!(view.ports, [port("grpc", 9090)]);
    assert_eq!(backend_names(&snap, view), ["a"]);
    assert_eq!(view.conflicts.len(), 1);
    assert_eq!(view.conflicts[0].cluster, ClusterId::new("b"));
    assert!(view.conflicts[0].excluded);
}

#[test]
fn a_cluster_disagreeing_on_ports_keeps_the_agreeing_ones() {
    let mut fleet = FleetBuilder::with_members(&["a", "b", "c", "d", "e"]);
    let oldest = [("http", 80), ("grpc", 9090)];
    fleet.export("a", "web", svc(false, &oldest), 1);
    // Same ports in another order: agrees.
    fleet.export("b", "web", svc(false, &[("grpc", 9090), ("http", 80)]), 2);
    // One port changed.
    fleet.export(
        "c",
        "web",
        svc(false, &[("http", 80), ("metrics", 9100)]),
        3,
    );
    // A subset.
    fleet.export("d", "web", svc(false, &[("http", 80)]), 4);
    // Nothing agrees.
    fleet.export("e", "web", svc(false, &[("http", 8080)]), 5);

    let snap = fleet.snapshot();
    let view = web(&snap);
    assert!(!view.headless);
    assert_eq!(view.ports, [port("http", 80), port("grpc", 9090)]);
    assert_eq!(
        backend_names(&snap, view),
        ["a", "b", "c", "d", "e"],
        "port conflicts exclude nobody"
    );
    let ports_of = |name: &str| {
        view.backend_of(snap.cluster_index(name).unwrap())
            .unwrap()
            .ports
            .clone()
    };
    assert_eq!(ports_of("a"), [port("http", 80), port("grpc", 9090)]);
    assert_eq!(ports_of("b"), [port("grpc", 9090), port("http", 80)]);
    assert_eq!(ports_of("c"), [port("http", 80)]);
    assert_eq!(ports_of("d"), [port("http", 80)]);
    assert!(ports_of("e").is_empty());

    let conflicted: Vec<&str> = view.conflicts.iter().map(|c| c.cluster.as_str()).collect();
    assert_eq!(conflicted, ["c", "d", "e"]);
    assert!(view.conflicts.iter().all(|c| !c.excluded));
}

#[test]
fn a_port_differing_only_in_protocol_disagrees() {
    let mut fleet = FleetBuilder::with_members(&["a", "b"]);
    fleet.export("a", "web", svc(false, &[("dns", 53)]), 1);
    let mut udp = svc(false, &[("dns", 53)]);
    udp.ports[0].protocol = Protocol::Udp;
    fleet.export("b", "web", udp, 2);

    let snap = fleet.snapshot();
    let view = web(&snap);
    assert!(view.backends[1].ports.is_empty());
    assert_eq!(view.conflicts.len(), 1);
    assert!(!view.conflicts[0].excluded);
}

// ---- endpoints of a service ----

#[test]
fn duplicate_addresses_across_slices_are_served_once() {
    let mut fleet = FleetBuilder::with_members(&["a"]);
    fleet.export("a", "web", svc(false, &[("http", 80)]), 1);
    fleet.slice(
        "a",
        "web-1",
        "web",
        vec![http_ep("10.0.0.1", true), http_ep("10.0.0.2", true)],
    );
    // The slice controller moved 10.0.0.2 and has not yet removed it from web-1.
    fleet.slice(
        "a",
        "web-2",
        "web",
        vec![http_ep("10.0.0.2", true), http_ep("10.0.0.3", true)],
    );

    let snap = fleet.snapshot();
    let backend = &web(&snap).backends[0];
    assert_eq!(
        addresses(backend),
        ["10.0.0.1", "10.0.0.2", "10.0.0.3"].map(ip)
    );
    assert_eq!(backend.ready, 3);
}

#[test]
fn a_dropped_duplicate_does_not_hide_its_other_addresses() {
    let mut fleet = FleetBuilder::with_members(&["a"]);
    fleet.export("a", "web", svc(false, &[("http", 80)]), 1);
    fleet.slice("a", "web-1", "web", vec![http_ep("10.0.0.1", true)]);
    // Overlaps web-1 on 10.0.0.1, so it is left out ...
    fleet.slice(
        "a",
        "web-2",
        "web",
        vec![ep_multi(&["10.0.0.2", "10.0.0.1"])],
    );
    // ... which must not make 10.0.0.2 a duplicate here.
    fleet.slice("a", "web-3", "web", vec![http_ep("10.0.0.2", true)]);
    // An endpoint naming one address twice is still one endpoint.
    fleet.slice(
        "a",
        "web-4",
        "web",
        vec![ep_multi(&["10.0.0.4", "10.0.0.4"])],
    );

    let snap = fleet.snapshot();
    let backend = &web(&snap).backends[0];
    assert_eq!(
        addresses(backend),
        ["10.0.0.1", "10.0.0.2", "10.0.0.4", "10.0.0.4"].map(ip)
    );
    assert_eq!(backend.endpoints().count(), 3);
    assert_eq!(backend.ready, 3);
}

#[test]
fn slices_of_other_services_are_not_mixed_in() {
    let mut fleet = FleetBuilder::with_members(&["a"]);
    fleet.export("a", "web", svc(false, &[("http", 80)]), 1);
    fleet.export("a", "api", svc(false, &[("http", 80)]), 1);
    fleet.slice("a", "web-1", "web", vec![http_ep("10.0.0.1", true)]);
    fleet.slice("a", "api-1", "api", vec![http_ep("10.0.0.2", true)]);
    // A slice named like web's but belonging to api.
    fleet.slice("a", "web-api", "api", vec![http_ep("10.0.0.3", true)]);
    // A slice of a service called web in another namespace.
    fleet.apply(
        "a",
        Object::Slice(
            ObjectKey::new("other", "web-1"),
            Slice {
                service: Arc::from("web"),
                endpoints: vec![http_ep("10.0.0.4", true)],
            },
        ),
    );

    let snap = fleet.snapshot();
    assert_eq!(addresses(&web(&snap).backends[0]), [ip("10.0.0.1")]);
    let api = snap.service("shop", "api").unwrap();
    assert_eq!(
        addresses(&api.backends[0]),
        ["10.0.0.2", "10.0.0.3"].map(ip)
    );
}

#[test]
fn an_exporting_cluster_without_slices_has_an_empty_backend() {
    let mut fleet = FleetBuilder::with_members(&["a"]);
    fleet.export("a", "web", svc(false, &[("http", 80)]), 1);
    let snap = fleet.snapshot();
    let backend = &web(&snap).backends[0];
    assert!(backend.endpoints().next().is_none());
    assert_eq!(backend.ready, 0);
}

#[test]
fn imports_are_recorded_per_cluster() {
    let mut fleet = FleetBuilder::with_members(&["a", "b", "c", "d"]);
    fleet.export("a", "web", svc(false, &[("http", 80)]), 1);
    fleet.export("b", "web", svc(false, &[("http", 80)]), 2);
    let import = |ips: &[&str], headless: bool| Import {
        ips: ips.iter().map(|i| ip(i)).collect(),
        headless,
    };
    let web_key = ObjectKey::new("shop", "web");
    fleet.apply(
        "d",
        Object::Import(
            web_key.clone(),
            import(&["10.96.0.40", "fd00:96::40"], false),
        ),
    );
    fleet.apply(
        "a",
        Object::Import(web_key.clone(), import(&["10.96.0.10"], false)),
    );
    // A headless import has no ClusterSetIP; an import with no IPs yet has none either.
    fleet.apply("b", Object::Import(web_key.clone(), import(&[], true)));
    fleet.apply("c", Object::Import(web_key, import(&[], false)));
    // An import of a service nobody exports.
    fleet.apply(
        "a",
        Object::Import(
            ObjectKey::new("shop", "gone"),
            import(&["10.96.0.99"], false),
        ),
    );

    let snap = fleet.snapshot();
    let view = web(&snap);
    let [a, b, c, d] = ["a", "b", "c", "d"].map(|n| snap.cluster_index(n).unwrap());
    assert_eq!(
        view.imports,
        [
            (a, vec![ip("10.96.0.10")]),
            (d, vec![ip("10.96.0.40"), ip("fd00:96::40")])
        ],
        "ordered by cluster, whether or not the importer exports"
    );
    assert_eq!(view.import_of(a), Some(&[ip("10.96.0.10")][..]));
    assert_eq!(view.import_of(b), None);
    assert_eq!(view.import_of(c), None);
    assert!(snap.service("shop", "gone").is_none());
}

// ---- clusters ----

#[test]
fn objects_of_a_cluster_not_in_the_registry_are_ignored() {
    let mut fleet = FleetBuilder::with_members(&["a"]);
    for c in ["a", "ghost"] {
        fleet.export(c, "web", svc(false, &[("http", 80)]), 1);
        fleet.slice(c, "web-1", "web", vec![http_ep("10.0.0.1", true)]);
        fleet.apply(
            c,
            Object::Import(
                ObjectKey::new("shop", "web"),
                Import {
                    ips: vec![ip("10.96.0.1")],
                    headless: false,
                },
            ),
        );
    }
    // The ghost's export is older and would otherwise decide headless-ness.
    fleet.export("ghost", "web", svc(true, &[("http", 80)]), 0);
    fleet.export("ghost", "solo", svc(false, &[("http", 80)]), 1);

    let snap = fleet.snapshot();
    assert_eq!(snap.clusters.len(), 1);
    assert_eq!(snap.cluster_index("ghost"), None);
    assert_eq!(snap.cluster_by_id(&ClusterId::new("ghost")), None);
    let view = web(&snap);
    assert!(!view.headless);
    assert_eq!(backend_names(&snap, view), ["a"]);
    assert!(view.conflicts.is_empty());
    assert_eq!(view.imports.len(), 1);
    assert!(snap.service("shop", "solo").is_none());
}

#[test]
fn cluster_views_carry_health_and_endpoint_counts() {
    let mut fleet = FleetBuilder::new();
    let t0 = fleet.t0;
    let mut b = ClusterSpec::named("b");
    b.health.withdraw_after_seconds = 600;
    let mut c = ClusterSpec::named("c");
    c.health.withdraw_after_seconds = 60;
    for spec in [ClusterSpec::named("a"), b, c, ClusterSpec::named("d")] {
        fleet.join(spec);
    }
    let [a, b, c, d] = ["a", "b", "c", "d"].map(ClusterId::new);
    for id in [&a, &b, &c] {
        fleet.registry.heartbeat_ok(id, t0);
    }
    fleet
        .registry
        .watch_status(&d, t0, Some("watch stalled".into()));
    fleet.registry.heartbeat_ok(&d, t0);
    fleet
        .registry
        .heartbeat_failed(&b, t0 + secs(1), "connection refused");
    fleet
        .registry
        .heartbeat_failed(&c, t0 + secs(1), "connection refused");
    fleet.registry.tick(t0 + secs(15));
    fleet.registry.tick(t0 + secs(75));
    fleet.slice(
        "a",
        "web-1",
        "web",
        vec![http_ep("10.0.0.1", true), http_ep("10.0.0.2", false)],
    );
    fleet.slice("a", "api-1", "api", vec![http_ep("10.0.0.3", true)]);

    let snap = fleet.snapshot();
    let ids: Vec<&str> = snap.clusters.iter().map(|c| c.spec.id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c", "d"]);
    for (i, id) in [&a, &b, &c, &d].into_iter().enumerate() {
        assert_eq!(snap.cluster_by_id(id), Some(i));
        assert_eq!(snap.cluster_index(id.as_str()), Some(i));
    }
    let view = |i: usize| &snap.clusters[i];
    assert_eq!(
        (
            view(0).health,
            view(0).withdrawn,
            view(0).unreachable_since,
            view(0).endpoints
        ),
        (Health::Healthy, false, None, 3)
    );
    assert_eq!(view(1).health, Health::Unreachable);
    assert!(
        !view(1).withdrawn,
        "unreachable but within withdrawAfterSeconds"
    );
    assert_eq!(view(1).unreachable_since, Some(t0 + secs(15)));
    assert_eq!(view(1).reason.as_deref(), Some("connection refused"));
    assert_eq!(view(2).health, Health::Unreachable);
    assert!(view(2).withdrawn);
    assert_eq!(view(2).unreachable_since, Some(t0 + secs(15)));
    assert_eq!(view(3).health, Health::Degraded);
    assert_eq!(view(3).unreachable_since, None);
    assert_eq!(view(3).reason.as_deref(), Some("watch stalled"));
}

#[test]
fn synced_follows_registry_all_settled() {
    let mut fleet = FleetBuilder::new();
    let t0 = fleet.t0;
    assert!(fleet.snapshot().synced, "no members: nothing to wait for");
    fleet.join(ClusterSpec::named("a"));
    fleet.join(ClusterSpec::named("b"));
    assert!(!fleet.snapshot().synced);
    fleet.registry.heartbeat_ok(&ClusterId::new("a"), t0);
    assert!(!fleet.snapshot().synced, "b has neither synced nor failed");
    fleet
        .registry
        .heartbeat_failed(&ClusterId::new("b"), t0, "unreachable");
    assert!(fleet.snapshot().synced, "a failure settles too");
    assert_eq!(fleet.snapshot().synced, fleet.registry.all_settled());
}

#[test]
fn every_service_carries_the_default_policy() {
    let mut fleet = FleetBuilder::with_members(&["a"]);
    fleet.export("a", "web", svc(false, &[("http", 80)]), 1);
    fleet.export("a", "api", svc(false, &[("http", 80)]), 1);
    let policy = Arc::new(TrafficPolicy {
        min_healthy_endpoints: 3,
        ..TrafficPolicy::default()
    });
    let snap = Snapshot::build(
        1,
        &fleet.index,
        &fleet.registry,
        &Policies::new(policy.clone(), vec![]),
    );
    assert!(snap.services().all(|v| Arc::ptr_eq(&v.policy, &policy)));
}

// ---- client table ----

fn net(s: &str) -> IpNet {
    s.parse().expect("cidr")
}

#[test]
fn client_cluster_is_the_longest_prefix_match() {
    let mut fleet = FleetBuilder::new();
    let specs: [(&str, &[&str], &[&str]); 6] = [
        // (name, dnsClientCIDRs, podCIDRs)
        ("a", &["10.0.0.0/8"], &["10.1.0.0/16", "fd00:a::/48"]),
        ("b", &["10.0.0.0/8", "fd00::/16"], &["10.2.0.0/16"]),
        ("c", &["192.168.5.0/24", "fd00::/16"], &["192.168.0.0/16"]),
        ("d", &["192.168.5.0/24"], &[]),
        // Host bits set: matched as the network they name.
        ("e", &[], &["172.20.5.5/16"]),
        // The same network twice in one cluster is no tie.
        ("f", &["100.64.0.0/10"], &["100.64.0.0/10"]),
    ];
    for (name, dns, pods) in specs {
        let mut spec = ClusterSpec::named(name);
        spec.dns_client_cidrs = dns.iter().map(|n| net(n)).collect();
        spec.pod_cidrs = pods.iter().map(|n| net(n)).collect();
        fleet.join(spec);
    }
    let snap = fleet.snapshot();
    let cases: [(&str, Option<&str>); 13] = [
        ("10.1.2.3", Some("a")),    // a's /16 beats the a/b tie at /8
        ("10.2.0.1", Some("b")),    // b's /16 beats the tie at /8
        ("10.3.0.1", None),         // only the tie at /8
        ("192.168.5.7", None), // c and d tie at the longest prefix (/24), c's /16 does not help
        ("192.168.6.1", Some("c")), // only c's /16
        ("172.20.9.9", Some("e")),
        ("172.21.0.1", None),
        ("100.100.0.1", Some("f")),
        ("8.8.8.8", None),
        ("fd00:a::1", Some("a")), // v6: /48 beats the b/c tie at /16
        ("fd00:b::1", None),      // v6 tie
        ("2001:db8::1", None),
        ("::ffff:10.1.2.3", None), // a v6 address never matches a v4 network
    ];
    for (addr, expected) in cases {
        let expected = expected.map(|n| snap.cluster_index(n).unwrap());
        assert_eq!(snap.client_cluster(ip(addr)), expected, "{addr}");
    }
}

// ---- incremental rebuilds ----

mod incremental {
    use proptest::prelude::*;

    use super::*;
    use crate::index::Kind as ObjKind;
    use crate::model::ClusterObjects;

    const CLUSTERS: [&str; 3] = ["a", "b", "c"];
    const NAMES: [&str; 4] = ["web", "db", "api", "cache"];

    /// One change a source can make to the Index.
    #[derive(Clone, Debug)]
    enum Change {
        Service {
            cluster: usize,
            name: usize,
            headless: bool,
            external: bool,
            port: u16,
        },
        Export {
            cluster: usize,
            name: usize,
            created: i64,
        },
        Slice {
            cluster: usize,
            slice: usize,
            service: usize,
            ready: Vec<bool>,
        },
        Import {
            cluster: usize,
            name: usize,
            last_octet: u8,
        },
        Delete {
            cluster: usize,
            kind: u8,
            name: usize,
        },
        /// A relist: the cluster's objects replaced by a few of the above.
        Reset {
            cluster: usize,
            changes: Vec<Change>,
        },
        RemoveCluster {
            cluster: usize,
        },
        /// Publish a snapshot: the incremental one must equal a full build.
        Publish,
    }

    fn leaf() -> impl Strategy<Value = Change> {
        prop_oneof![
            (
                0..3usize,
                0..4usize,
                any::<bool>(),
                prop::bool::weighted(0.1),
                79u16..82
            )
                .prop_map(|(cluster, name, headless, external, port)| {
                    Change::Service {
                        cluster,
                        name,
                        headless,
                        external,
                        port,
                    }
                }),
            (0..3usize, 0..4usize, 0..3i64).prop_map(|(cluster, name, created)| Change::Export {
                cluster,
                name,
                created
            }),
            (
                0..3usize,
                0..5usize,
                0..4usize,
                prop::collection::vec(any::<bool>(), 0..3)
            )
                .prop_map(|(cluster, slice, service, ready)| Change::Slice {
                    cluster,
                    slice,
                    service,
                    ready
                }),
            (0..3usize, 0..4usize, 1..3u8).prop_map(|(cluster, name, last_octet)| Change::Import {
                cluster,
                name,
                last_octet
            }),
            (0..3usize, 0..4u8, 0..5usize).prop_map(|(cluster, kind, name)| Change::Delete {
                cluster,
                kind,
                name
            }),
        ]
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            12 => leaf(),
            4 => (0..3usize, prop::collection::vec(leaf(), 0..4)).prop_map(|(cluster, changes)| Change::Reset { cluster, changes }),
            1 => (0..3usize).prop_map(|cluster| Change::RemoveCluster { cluster }),
            4 => Just(Change::Publish),
        ]
    }

    fn object(change: &Change) -> Option<(usize, Object)> {
        Some(match change {
            Change::Service {
                cluster,
                name,
                headless,
                external,
                port,
            } => {
                let mut s = svc(*headless, &[("http", *port)]);
                s.external_name = *external;
                (
                    *cluster,
                    Object::Service(ObjectKey::new("shop", NAMES[*name]), s),
                )
            }
            Change::Export {
                cluster,
                name,
                created,
            } => (
                *cluster,
                Object::Export(
                    ObjectKey::new("shop", NAMES[*name]),
                    Export {
                        created: *created,
                        ..Export::default()
                    },
                ),
            ),
            Change::Slice {
                cluster,
                slice,
                service,
                ready,
            } => {
                let endpoints = ready
                    .iter()
                    .enumerate()
                    .map(|(i, r)| http_ep(&format!("10.{cluster}.{slice}.{i}"), *r))
                    .collect();
                (
                    *cluster,
                    Object::Slice(
                        ObjectKey::new("shop", format!("s{slice}")),
                        Slice {
                            service: Arc::from(NAMES[*service]),
                            endpoints,
                        },
                    ),
                )
            }
            Change::Import {
                cluster,
                name,
                last_octet,
            } => (
                *cluster,
                Object::Import(
                    ObjectKey::new("shop", NAMES[*name]),
                    Import {
                        ips: vec![ip(&format!("10.96.0.{last_octet}"))],
                        headless: false,
                    },
                ),
            ),
            _ => return None,
        })
    }

    fn delete_target(kind: u8, name: usize) -> (ObjKind, ObjectKey) {
        let kind = [
            ObjKind::Service,
            ObjKind::Export,
            ObjKind::Slice,
            ObjKind::Import,
        ][kind as usize];
        let key = match kind {
            ObjKind::Slice => ObjectKey::new("shop", format!("s{name}")),
            _ => ObjectKey::new("shop", NAMES[name % NAMES.len()]),
        };
        (kind, key)
    }

    fn fingerprint(s: &Snapshot) -> String {
        let services: Vec<_> = s.services().collect();
        format!("{services:?}\n{:?}", s.problems)
    }

    fn run(changes: &[Change]) -> Result<usize, TestCaseError> {
        let mut fleet = FleetBuilder::with_members(&CLUSTERS);
        let policy = Policies::default();
        let mut prev = Snapshot::empty();
        let mut version = 0;
        let mut partial = 0;
        for change in changes.iter().chain([&Change::Publish]) {
            match change {
                Change::Publish => {
                    version += 1;
                    let dirty = fleet.index.take_dirty();
                    partial += usize::from(!dirty.all);
                    let next = Snapshot::rebuild(
                        &prev,
                        &dirty,
                        version,
                        &fleet.index,
                        &fleet.registry,
                        &policy,
                        fleet.t0,
                    );
                    let full = Snapshot::build_after(
                        Some(&prev),
                        version,
                        &fleet.index,
                        &fleet.registry,
                        &policy,
                        fleet.t0,
                    );
                    prop_assert_eq!(fingerprint(&next), fingerprint(&full), "after {:?}", dirty);
                    let mut next = next;
                    next.restamp(&prev, fleet.t0);
                    kept_stamps_hide_no_change(&prev, &next, dirty.all)?;
                    prev = next;
                }
                Change::Delete {
                    cluster,
                    kind,
                    name,
                } => {
                    let (kind, key) = delete_target(*kind, *name);
                    fleet
                        .index
                        .delete(&ClusterId::new(CLUSTERS[*cluster]), kind, &key);
                }
                Change::Reset { cluster, changes } => {
                    // A relist: what the cluster holds now, with a few changes applied.
                    let id = ClusterId::new(CLUSTERS[*cluster]);
                    let mut relisted = Index::new();
                    if let Some(state) = fleet.index.clusters.get(&id) {
                        relisted.clusters.insert(id.clone(), state.clone());
                    }
                    for change in changes {
                        match change {
                            Change::Delete { kind, name, .. } => {
                                let (kind, key) = delete_target(*kind, *name);
                                relisted.delete(&id, kind, &key);
                            }
                            leaf => {
                                if let Some((_, object)) = object(leaf) {
                                    relisted.apply(&id, object);
                                }
                            }
                        }
                    }
                    let state = relisted.clusters.remove(&id).unwrap_or_default();
                    let slices = state
                        .slices()
                        .iter()
                        .map(|(k, v)| (k.clone(), (**v).clone()))
                        .collect();
                    let objects = ClusterObjects {
                        services: state.services.into_iter().collect(),
                        exports: state.exports.into_iter().collect(),
                        slices,
                        imports: state.imports.into_iter().collect(),
                    };
                    fleet.index.reset(&id, objects);
                }
                Change::RemoveCluster { cluster } => {
                    fleet
                        .index
                        .remove_cluster(&ClusterId::new(CLUSTERS[*cluster]));
                }
                leaf => {
                    let (cluster, object) = object(leaf).expect("a leaf change");
                    fleet.apply(CLUSTERS[cluster], object);
                }
            }
        }
        Ok(partial)
    }

    /// What a cache keeps across `prev` → `next` is still right: every service whose stamp
    /// still holds is decided alike for every client (the clusters' states do not change in
    /// these runs, so the same view means the same decisions), and the names version moves
    /// when a service came or went, and otherwise only on a full re-merge.
    fn kept_stamps_hide_no_change(
        prev: &Snapshot,
        next: &Snapshot,
        full: bool,
    ) -> Result<(), TestCaseError> {
        for view in prev.services() {
            if !view.stamp.holds_at(next.version) {
                continue;
            }
            let now = next.service(&view.key.namespace, &view.key.name);
            prop_assert!(now.is_some(), "{} is gone but its stamp holds", view.key);
            let now = now.unwrap();
            prop_assert_eq!(
                format!("{view:?}"),
                format!("{now:?}"),
                "{} changed",
                view.key
            );
            for client in std::iter::once(None).chain((0..next.clusters.len()).map(Some)) {
                let at = Instant::now();
                prop_assert_eq!(
                    format!("{:?}", crate::select::select(prev, view, client, at)),
                    format!("{:?}", crate::select::select(next, now, client, at)),
                    "{} from {:?}",
                    view.key,
                    client
                );
            }
        }
        let keys = |s: &Snapshot| s.services().map(|v| v.key.clone()).collect::<Vec<_>>();
        let names_moved = next.names_version == next.version;
        let names_changed = keys(prev) != keys(next);
        prop_assert!(!names_changed || names_moved, "a service came or went");
        let everything = full || !prev.stamped || !next.same_clusters_as(prev);
        prop_assert!(
            names_changed || !names_moved || everything,
            "names moved for nothing"
        );
        Ok(())
    }

    #[test]
    fn an_incremental_rebuild_equals_a_full_build() {
        let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
            cases: 300,
            ..Default::default()
        });
        let partial = std::cell::Cell::new(0);
        runner
            .run(&prop::collection::vec(change(), 1..60), |changes| {
                partial.set(partial.get() + run(&changes)?);
                Ok(())
            })
            .unwrap();
        // Most publishes must have taken the incremental path, or this proves nothing.
        assert!(
            partial.get() > 1000,
            "only {} incremental rebuilds",
            partial.get()
        );
    }
}
