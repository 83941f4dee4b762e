use super::*;

use crate::testing::{ep, ip, svc};

use std::sync::Arc;

fn key(ns: &str, name: &str) -> ObjectKey {
    ObjectKey::new(ns, name)
}

fn id(name: &str) -> ClusterId {
    ClusterId::new(name)
}

fn slice(service: &str, ips: &[&str]) -> Slice {
    Slice {
        service: Arc::from(service),
        endpoints: ips.iter().map(|a| ep(ip(a), true)).collect(),
    }
}

fn export(created: i64) -> Export {
    Export {
        created,
        ..Export::default()
    }
}

fn import(ip: &str) -> Import {
    Import {
        ips: vec![ip.parse().expect("ip")],
        headless: false,
    }
}

/// One object of each kind, in two versions (`v1` and a different `v2`), for table-driven cases.
fn objects_of(kind: Kind) -> (Object, Object) {
    let k = key("shop", "web");
    match kind {
        Kind::Service => (
            Object::Service(k.clone(), svc(false, &[("http", 80)])),
            Object::Service(k, svc(false, &[("http", 8080)])),
        ),
        Kind::Export => (
            Object::Export(k.clone(), export(1)),
            Object::Export(k, export(2)),
        ),
        Kind::Slice => (
            Object::Slice(key("shop", "web-abc"), slice("web", &["10.0.0.1"])),
            Object::Slice(
                key("shop", "web-abc"),
                slice("web", &["10.0.0.1", "10.0.0.2"]),
            ),
        ),
        Kind::Import => (
            Object::Import(k.clone(), import("10.96.0.1")),
            Object::Import(k, import("10.96.0.2")),
        ),
    }
}

fn key_of(object: &Object) -> ObjectKey {
    match object {
        Object::Service(k, _)
        | Object::Export(k, _)
        | Object::Slice(k, _)
        | Object::Import(k, _) => k.clone(),
    }
}

/// The count `sizes()` reports for one kind.
fn count_of(sizes: IndexSizes, kind: Kind) -> usize {
    match kind {
        Kind::Service => sizes.services,
        Kind::Export => sizes.exports,
        Kind::Slice => sizes.slices,
        Kind::Import => sizes.imports,
    }
}

const KINDS: [Kind; 4] = [Kind::Service, Kind::Export, Kind::Slice, Kind::Import];

#[test]
fn apply_and_delete_report_changes_for_every_kind() {
    for kind in KINDS {
        let mut index = Index::new();
        let c = id("eu-1");
        let (v1, v2) = objects_of(kind);
        let k = key_of(&v1);

        assert!(
            index.apply(&c, v1.clone()),
            "{kind:?}: a new object is a change"
        );
        assert!(
            !index.apply(&c, v1.clone()),
            "{kind:?}: the same object again is no change"
        );
        assert_eq!(count_of(index.sizes(), kind), 1, "{kind:?}");
        assert!(
            index.apply(&c, v2),
            "{kind:?}: a different version is a change"
        );
        assert_eq!(
            count_of(index.sizes(), kind),
            1,
            "{kind:?}: replaced, not added"
        );
        assert!(
            index.apply(&c, v1),
            "{kind:?}: back to the first version is a change"
        );

        // A delete of another kind with the same key leaves this one alone.
        for other in KINDS.into_iter().filter(|o| *o != kind) {
            assert!(!index.delete(&c, other, &k), "{kind:?} vs {other:?}");
        }
        assert!(!index.delete(&c, kind, &key("shop", "absent")), "{kind:?}");
        assert!(
            !index.delete(&id("other"), kind, &k),
            "{kind:?}: unknown cluster"
        );
        assert!(index.delete(&c, kind, &k), "{kind:?}: it was there");
        assert!(!index.delete(&c, kind, &k), "{kind:?}: already gone");
        assert_eq!(count_of(index.sizes(), kind), 0, "{kind:?}");
    }
}

#[test]
fn objects_are_keyed_by_cluster() {
    let mut index = Index::new();
    let (a, b) = (id("a"), id("b"));
    let (v1, _) = objects_of(Kind::Service);
    assert!(index.apply(&a, v1.clone()));
    assert!(
        index.apply(&b, v1),
        "the same object in another cluster is another object"
    );
    assert_eq!(index.sizes().services, 2);
    assert!(index.delete(&a, Kind::Service, &key("shop", "web")));
    assert_eq!(index.sizes().services, 1);
    assert!(
        index.has_cluster(&a),
        "deleting objects does not forget the cluster"
    );
}

fn full_list() -> ClusterObjects {
    ClusterObjects {
        services: vec![
            (key("shop", "web"), svc(false, &[("http", 80)])),
            (key("shop", "db"), svc(true, &[("pg", 5432)])),
        ],
        exports: vec![(key("shop", "web"), export(10))],
        slices: vec![
            (
                key("shop", "web-1"),
                slice("web", &["10.0.0.1", "10.0.0.2"]),
            ),
            (key("shop", "web-2"), slice("web", &["10.0.0.3"])),
        ],
        imports: vec![(key("shop", "web"), import("10.96.0.10"))],
    }
}

#[test]
fn reset_returns_false_when_nothing_changed() {
    let mut index = Index::new();
    let c = id("eu-1");
    assert!(index.reset(&c, full_list()), "first list of a cluster");
    assert!(!index.reset(&c, full_list()), "the same list again");

    // The same content in another order is no change either.
    let mut shuffled = full_list();
    shuffled.services.reverse();
    shuffled.slices.reverse();
    assert!(!index.reset(&c, shuffled));

    // Built up with apply, then relisted with the same content: no change.
    let mut built = Index::new();
    let list = full_list();
    for (k, v) in list.services {
        built.apply(&c, Object::Service(k, v));
    }
    for (k, v) in list.exports {
        built.apply(&c, Object::Export(k, v));
    }
    for (k, v) in list.slices {
        built.apply(&c, Object::Slice(k, v));
    }
    for (k, v) in list.imports {
        built.apply(&c, Object::Import(k, v));
    }
    assert!(!built.reset(&c, full_list()));
}

#[test]
fn reset_reports_a_change_in_any_kind() {
    type Edit = fn(&mut ClusterObjects);
    let cases: [(&str, Edit); 6] = [
        ("service changed", |o| o.services[0].1.headless = true),
        ("export removed", |o| o.exports.clear()),
        ("slice endpoint not ready", |o| {
            o.slices[0].1.endpoints[0].ready = false
        }),
        ("slice added", |o| {
            o.slices
                .push((key("shop", "web-3"), slice("web", &["10.0.0.9"])))
        }),
        ("import ips changed", |o| {
            o.imports[0].1 = import("10.96.0.11")
        }),
        ("everything gone", |o| *o = ClusterObjects::default()),
    ];
    for (name, edit) in cases {
        let mut index = Index::new();
        let c = id("eu-1");
        index.reset(&c, full_list());
        let mut next = full_list();
        edit(&mut next);
        assert!(index.reset(&c, next), "{name}");
    }
}

#[test]
fn reset_replaces_a_clusters_slice_in_one_step() {
    let mut index = Index::new();
    let (c, other) = (id("eu-1"), id("us-1"));
    index.apply(
        &c,
        Object::Service(key("shop", "stale"), svc(false, &[("http", 80)])),
    );
    index.apply(&c, Object::Export(key("shop", "stale"), export(1)));
    index.apply(
        &c,
        Object::Slice(key("shop", "stale-1"), slice("stale", &["10.9.9.9"])),
    );
    index.apply(
        &other,
        Object::Service(key("shop", "web"), svc(false, &[("http", 80)])),
    );
    index.apply(
        &other,
        Object::Slice(key("shop", "web-1"), slice("web", &["10.1.0.1"])),
    );

    assert!(index.reset(&c, full_list()));

    let state = &index.clusters[&c];
    assert!(
        !state.services.contains_key(&key("shop", "stale")),
        "objects missing from the list are gone"
    );
    assert!(!state.exports.contains_key(&key("shop", "stale")));
    assert!(!state.slices().contains_key(&key("shop", "stale-1")));
    assert_eq!(state.services.len(), 2);
    assert_eq!(state.exports.len(), 1);
    assert_eq!(state.slices().len(), 2);
    assert_eq!(state.imports.len(), 1);
    assert_eq!(index.endpoints_of(&c), 3);

    // Another cluster's objects are untouched.
    assert_eq!(index.clusters[&other].services.len(), 1);
    assert_eq!(index.endpoints_of(&other), 1);
}

#[test]
fn reset_of_an_unknown_cluster_adds_it() {
    let mut index = Index::new();
    let c = id("new");
    assert!(index.reset(&c, ClusterObjects::default()));
    assert!(index.has_cluster(&c));
    assert!(!index.reset(&c, ClusterObjects::default()));
    assert_eq!(index.sizes().clusters, 1);
}

#[test]
fn sizes_count_every_kind_over_every_cluster() {
    let mut index = Index::new();
    assert_eq!(index.sizes(), IndexSizes::default());
    index.reset(&id("a"), full_list());
    index.reset(&id("b"), full_list());
    index.apply(
        &id("c"),
        Object::Slice(key("shop", "web-1"), slice("web", &["10.2.0.1"])),
    );
    assert_eq!(
        index.sizes(),
        IndexSizes {
            clusters: 3,
            services: 4,
            exports: 2,
            slices: 5,
            endpoints: 7,
            imports: 2,
        }
    );
    assert!(index.remove_cluster(&id("a")));
    assert!(!index.remove_cluster(&id("a")));
    assert!(!index.has_cluster(&id("a")));
    assert_eq!(
        index.sizes(),
        IndexSizes {
            clusters: 2,
            services: 2,
            exports: 1,
            slices: 3,
            endpoints: 4,
            imports: 1,
        }
    );
}

#[test]
fn endpoints_of_counts_one_clusters_endpoints() {
    let mut index = Index::new();
    let (a, b) = (id("a"), id("b"));
    assert_eq!(index.endpoints_of(&a), 0, "unknown cluster");
    index.apply(
        &a,
        Object::Slice(
            key("shop", "web-1"),
            slice("web", &["10.0.0.1", "10.0.0.2"]),
        ),
    );
    index.apply(
        &a,
        Object::Slice(key("shop", "api-1"), slice("api", &["10.0.0.3"])),
    );
    index.apply(
        &b,
        Object::Slice(key("shop", "web-1"), slice("web", &["10.1.0.1"])),
    );
    assert_eq!(index.endpoints_of(&a), 3);
    assert_eq!(index.endpoints_of(&b), 1);

    // Not-ready endpoints are held too (xDS needs them); replacing a slice replaces its count.
    let mut not_ready = slice("web", &["10.0.0.1"]);
    not_ready.endpoints.push(ep(ip("10.0.0.7"), false));
    index.apply(&a, Object::Slice(key("shop", "web-1"), not_ready));
    assert_eq!(index.endpoints_of(&a), 3);

    index.delete(&a, Kind::Slice, &key("shop", "api-1"));
    assert_eq!(index.endpoints_of(&a), 2);
    index.remove_cluster(&a);
    assert_eq!(index.endpoints_of(&a), 0);
}

/// The endpoint count and the service → slices lookup, recomputed from the slices themselves.
fn recounted(state: &ClusterState) -> (usize, BTreeMap<ObjectKey, BTreeSet<ObjectKey>>) {
    let mut by_service: BTreeMap<ObjectKey, BTreeSet<ObjectKey>> = BTreeMap::new();
    for (k, s) in state.slices() {
        by_service
            .entry(service_of(k, s))
            .or_default()
            .insert(k.clone());
    }
    let endpoints = state.slices().values().map(|s| s.endpoints.len()).sum();
    (endpoints, by_service)
}

fn kept(state: &ClusterState) -> (usize, BTreeMap<ObjectKey, BTreeSet<ObjectKey>>) {
    let by_service = state
        .slices_of
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    (state.endpoints, by_service)
}

#[test]
fn endpoint_counts_and_slices_by_service_follow_every_change() {
    let c = id("c1");
    let mut index = Index::new();
    /// One change to cluster `c` of the Index.
    type Step = fn(&mut Index, &ClusterId);
    let steps: Vec<Step> = vec![
        |i, c| {
            i.apply(
                c,
                Object::Slice(key("shop", "web-a"), slice("web", &["10.0.0.1"])),
            );
        },
        // Grows in place.
        |i, c| {
            i.apply(
                c,
                Object::Slice(
                    key("shop", "web-a"),
                    slice("web", &["10.0.0.1", "10.0.0.2"]),
                ),
            );
        },
        |i, c| {
            i.apply(
                c,
                Object::Slice(key("shop", "web-b"), slice("web", &["10.0.0.3"])),
            );
        },
        // Relabelled to another service: leaves web's set, joins api's.
        |i, c| {
            i.apply(
                c,
                Object::Slice(key("shop", "web-a"), slice("api", &["10.0.0.9"])),
            );
        },
        |i, c| {
            i.delete(c, Kind::Slice, &key("shop", "web-b"));
        },
        |i, c| {
            i.reset(
                c,
                ClusterObjects {
                    slices: vec![
                        (key("shop", "x-1"), slice("x", &["10.1.0.1", "10.1.0.2"])),
                        (key("shop", "x-2"), slice("x", &["10.1.0.3"])),
                    ],
                    ..ClusterObjects::default()
                },
            );
        },
        |i, c| {
            i.delete(c, Kind::Slice, &key("shop", "x-1"));
        },
    ];
    for (n, step) in steps.iter().enumerate() {
        step(&mut index, &c);
        let state = &index.clusters[&c];
        assert_eq!(kept(state), recounted(state), "after step {n}");
        assert_eq!(index.sizes().endpoints, state.endpoints, "after step {n}");
        assert_eq!(index.endpoints_of(&c), state.endpoints, "after step {n}");
    }
    let state = &index.clusters[&c];
    let x: Vec<_> = state
        .slices_of(&key("shop", "x"))
        .map(|(k, _)| k.clone())
        .collect();
    assert_eq!(x, vec![key("shop", "x-2")]);
    assert_eq!(state.endpoints, 1);
}
