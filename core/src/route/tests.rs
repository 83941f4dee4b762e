use super::*;

/// The fleet of these cases: shop/payments (8080, 9090), shop/payments-canary (8080),
/// billing/ledger (7000).
fn ports_of(key: &ObjectKey) -> Option<Vec<u16>> {
    match (&*key.namespace, &*key.name) {
        ("shop", "payments") => Some(vec![8080, 9090]),
        ("shop", "payments-canary") => Some(vec![8080]),
        ("billing", "ledger") => Some(vec![7000]),
        _ => None,
    }
}

fn service_parent(ns: &str, name: &str, port: Option<u16>) -> ParentRef {
    ParentRef {
        group: String::new(),
        kind: "Service".into(),
        namespace: ns.into(),
        name: name.into(),
        port,
    }
}

fn backend(ns: &str, name: &str, port: Option<u16>, weight: u32) -> BackendRef {
    BackendRef {
        group: String::new(),
        kind: "Service".into(),
        namespace: ns.into(),
        name: name.into(),
        port,
        weight,
    }
}

fn rule(matches: Vec<Match>, backends: Vec<BackendRef>) -> Rule {
    Rule {
        name: None,
        matches,
        backends,
        timeout: None,
        retry: None,
        filters: Vec::new(),
    }
}

fn route(name: &str, created: Option<i64>, rules: Vec<Rule>) -> Route {
    Route {
        kind: RouteKind::Http,
        key: ObjectKey::new("shop", name),
        created,
        generation: None,
        parents: vec![service_parent("shop", "payments", Some(8080))],
        rules,
        source: Source::Api,
    }
}

fn path(p: PathMatch) -> Match {
    Match {
        path: Some(p),
        ..Match::default()
    }
}

fn header(name: &str, value: &str) -> ValueMatch {
    ValueMatch {
        name: name.into(),
        value: value.into(),
        regex: false,
    }
}

fn to_payments() -> Vec<BackendRef> {
    vec![backend("shop", "payments", Some(8080), 1)]
}

fn payments_8080(table: &RouteTable) -> Vec<(String, usize)> {
    table
        .for_port(&ObjectKey::new("shop", "payments"), 8080)
        .map(|a| {
            a.iter()
                .map(|a| (a.route.name.to_string(), a.rule))
                .collect()
        })
        .unwrap_or_default()
}

fn status<'a>(table: &'a RouteTable, name: &str) -> &'a ParentStatus {
    &table.statuses[&(RouteKind::Http, ObjectKey::new("shop", name))].parents[0]
}

#[test]
fn precedence_exact_then_longest_prefix_then_method_headers_query_then_age() {
    let routes = [
        route(
            "a",
            Some(10),
            vec![
                rule(vec![path(PathMatch::Prefix("/".into()))], to_payments()),
                rule(vec![path(PathMatch::Prefix("/pay".into()))], to_payments()),
                rule(
                    vec![path(PathMatch::Exact("/pay/now".into()))],
                    to_payments(),
                ),
                rule(
                    vec![Match {
                        headers: vec![header("x-canary", "1")],
                        ..path(PathMatch::Prefix("/pay".into()))
                    }],
                    to_payments(),
                ),
                rule(
                    vec![Match {
                        method: Some("POST".into()),
                        ..path(PathMatch::Prefix("/pay".into()))
                    }],
                    to_payments(),
                ),
                rule(vec![path(PathMatch::Regex("/p.*".into()))], to_payments()),
            ],
        ),
        // Younger: loses the tie with a's catch-all.
        route("b", Some(20), vec![rule(vec![], to_payments())]),
        // Older: wins it.
        route("c", Some(5), vec![rule(vec![], to_payments())]),
    ];
    let table = RouteTable::resolve(&routes, &[], ports_of);
    assert_eq!(
        payments_8080(&table),
        [
            ("a".into(), 2),
            ("a".into(), 4),
            ("a".into(), 3),
            ("a".into(), 1),
            ("c".into(), 0),
            ("a".into(), 0),
            ("b".into(), 0),
            ("a".into(), 5),
        ]
    );
    assert!(table.problems.is_empty(), "{:?}", table.problems);
}

#[test]
fn a_route_without_a_port_attaches_to_every_port_of_its_service() {
    let mut r = route("all", None, vec![rule(vec![], to_payments())]);
    r.parents = vec![service_parent("shop", "payments", None)];
    let table = RouteTable::resolve(&[r], &[], ports_of);
    let parents: Vec<_> = table
        .parents()
        .map(|(k, p, _)| (k.to_string(), p))
        .collect();
    assert_eq!(
        parents,
        [
            ("shop/payments".into(), 8080),
            ("shop/payments".into(), 9090)
        ]
    );
}

#[test]
fn weights_split_between_fleet_services() {
    let r = route(
        "split",
        None,
        vec![rule(
            vec![],
            vec![
                backend("shop", "payments", Some(8080), 90),
                backend("shop", "payments-canary", None, 10),
            ],
        )],
    );
    let table = RouteTable::resolve(&[r], &[], ports_of);
    let attached = &table
        .for_port(&ObjectKey::new("shop", "payments"), 8080)
        .unwrap()[0];
    assert_eq!(
        attached.backends,
        [
            Backend {
                service: ObjectKey::new("shop", "payments"),
                port: 8080,
                weight: 90
            },
            // One port: the backend needs none named.
            Backend {
                service: ObjectKey::new("shop", "payments-canary"),
                port: 8080,
                weight: 10
            },
        ]
    );
    assert!(!attached.fails());
    assert_eq!(status(&table, "split").accepted, Condition::yes("Accepted"));
    assert_eq!(
        status(&table, "split").resolved_refs,
        Condition::yes("ResolvedRefs")
    );
}

#[test]
fn an_unresolved_backend_keeps_its_share_which_fails() {
    let r = route(
        "half",
        None,
        vec![rule(
            vec![],
            vec![
                backend("shop", "payments", Some(8080), 3),
                backend("shop", "nowhere", Some(8080), 1),
            ],
        )],
    );
    let table = RouteTable::resolve(&[r], &[], ports_of);
    let attached = &table
        .for_port(&ObjectKey::new("shop", "payments"), 8080)
        .unwrap()[0];
    assert_eq!(attached.backends.len(), 1);
    assert_eq!(attached.failing, 1);
    assert!(!attached.fails());
    assert_eq!(attached.failing_percent(), 25.0);
    assert_eq!(
        status(&table, "half").resolved_refs.reason,
        "BackendNotFound"
    );
}

#[test]
fn a_route_edit_reroutes_its_parent_service_only() {
    let split = |canary: u32| {
        let mut r = route(
            "split",
            None,
            vec![rule(
                vec![],
                vec![
                    backend("shop", "payments", Some(8080), 100 - canary),
                    backend("shop", "payments-canary", None, canary),
                ],
            )],
        );
        r.parents.push(service_parent("billing", "ledger", None));
        r
    };
    let ledger = |weight: u32| {
        let mut r = route(
            "to-ledger",
            None,
            vec![rule(
                vec![],
                vec![backend("billing", "ledger", None, weight)],
            )],
        );
        r.key = ObjectKey::new("billing", "to-ledger");
        r.parents = vec![service_parent("billing", "ledger", None)];
        r
    };
    let table = |routes: &[Route]| RouteTable::resolve(routes, &[], ports_of);
    let before = table(&[split(10), ledger(1)]);
    assert!(
        before
            .services_rerouted(&table(&[split(10), ledger(1)]))
            .is_empty()
    );
    assert_eq!(
        before.services_rerouted(&table(&[split(20), ledger(1)])),
        [ObjectKey::new("shop", "payments")]
    );
    // A route gone: its parents too.
    assert_eq!(
        before.services_rerouted(&table(&[split(10)])),
        [ObjectKey::new("billing", "ledger")]
    );
    assert_eq!(
        table(&[]).services_rerouted(&before),
        [
            ObjectKey::new("billing", "ledger"),
            ObjectKey::new("shop", "payments")
        ]
    );
}

#[test]
fn every_weight_zero_fails_the_match() {
    let r = route(
        "zero",
        None,
        vec![rule(
            vec![],
            vec![backend("shop", "payments", Some(8080), 0)],
        )],
    );
    let table = RouteTable::resolve(&[r], &[], ports_of);
    assert!(
        table
            .for_port(&ObjectKey::new("shop", "payments"), 8080)
            .unwrap()[0]
            .fails()
    );
}

#[test]
fn a_cross_namespace_backend_needs_a_reference_grant() {
    let r = route(
        "ledger",
        None,
        vec![rule(vec![], vec![backend("billing", "ledger", None, 1)])],
    );
    let table = RouteTable::resolve(std::slice::from_ref(&r), &[], ports_of);
    let refs = &status(&table, "ledger").resolved_refs;
    assert_eq!(refs.reason, "RefNotPermitted");
    assert!(
        refs.message
            .contains("no ReferenceGrant in namespace billing")
    );
    // Still accepted: the rule is there, with no backend left, so its requests fail.
    assert!(status(&table, "ledger").accepted.status);
    let attached = table
        .for_port(&ObjectKey::new("shop", "payments"), 8080)
        .unwrap();
    assert!(attached[0].backends.is_empty() && attached[0].fails());
    assert_eq!(table.problems.len(), 1);
    assert!(
        table.problems[0]
            .reason
            .contains("ResolvedRefs=False (RefNotPermitted)"),
        "{}",
        table.problems[0].reason
    );

    let grant = |from_kind: &str, from_ns: &str, to_name: Option<&str>| ReferenceGrant {
        key: ObjectKey::new("billing", "let-shop-in"),
        from: vec![GrantFrom {
            group: GATEWAY_GROUP.into(),
            kind: from_kind.into(),
            namespace: from_ns.into(),
        }],
        to: vec![GrantTo {
            group: String::new(),
            kind: "Service".into(),
            name: to_name.map(str::to_owned),
        }],
    };
    for (case, g, permitted) in [
        ("every Service", grant("HTTPRoute", "shop", None), true),
        (
            "this Service",
            grant("HTTPRoute", "shop", Some("ledger")),
            true,
        ),
        (
            "another Service",
            grant("HTTPRoute", "shop", Some("other")),
            false,
        ),
        ("another namespace", grant("HTTPRoute", "web", None), false),
        ("another kind", grant("GRPCRoute", "shop", None), false),
    ] {
        let table = RouteTable::resolve(std::slice::from_ref(&r), &[g], ports_of);
        assert_eq!(
            status(&table, "ledger").resolved_refs.status,
            permitted,
            "{case}"
        );
    }
}

#[test]
fn backends_that_do_not_resolve_say_why() {
    let import = |name: &str| BackendRef {
        group: MCS_GROUP.into(),
        kind: "ServiceImport".into(),
        ..backend("shop", name, Some(8080), 1)
    };
    for (case, b, reason, says) in [
        (
            "a ServiceImport nobody exports",
            import("nowhere"),
            "BackendNotFound",
            "no member cluster exports shop/nowhere",
        ),
        (
            "a port the service lacks",
            backend("shop", "payments", Some(1), 1),
            "BackendNotFound",
            "has no port 1",
        ),
        (
            "no port on a two-port service",
            backend("shop", "payments", None, 1),
            "BackendNotFound",
            "has 2 ports; name one",
        ),
        (
            "a kind that is no service",
            BackendRef {
                group: "apps".into(),
                kind: "Deployment".into(),
                ..backend("shop", "payments", Some(8080), 1)
            },
            "InvalidKind",
            "neither a Service nor a ServiceImport",
        ),
    ] {
        let r = route("r", None, vec![rule(vec![], vec![b])]);
        let table = RouteTable::resolve(&[r], &[], ports_of);
        let refs = &status(&table, "r").resolved_refs;
        assert_eq!(refs.reason, reason, "{case}");
        assert!(refs.message.contains(says), "{case}: {}", refs.message);
    }
    // A ServiceImport that exists resolves as the fleet service.
    let r = route("r", None, vec![rule(vec![], vec![import("payments")])]);
    let table = RouteTable::resolve(&[r], &[], ports_of);
    assert!(status(&table, "r").resolved_refs.status);
}

#[test]
fn parents_that_cannot_take_the_route_reject_it_and_it_alone() {
    let good = route("good", None, vec![rule(vec![], to_payments())]);
    let with_parent = |name: &str, parent: ParentRef| Route {
        parents: vec![parent],
        ..route(name, None, vec![rule(vec![], to_payments())])
    };
    let mut filtered = route("filtered", None, vec![rule(vec![], to_payments())]);
    filtered.rules[0].filters = vec![Filter::Unsupported("ExtensionRef".into())];
    let regex = route(
        "regex",
        None,
        vec![rule(
            vec![path(PathMatch::Regex("/(unclosed".into()))],
            to_payments(),
        )],
    );
    let routes = [
        good,
        with_parent("missing", service_parent("shop", "nowhere", None)),
        with_parent("port", service_parent("shop", "payments", Some(1))),
        with_parent("consumer", service_parent("billing", "ledger", None)),
        filtered,
        regex,
    ];
    let table = RouteTable::resolve(&routes, &[], ports_of);
    for (name, reason, says) in [
        (
            "missing",
            "NoMatchingParent",
            "no member cluster exports Service shop/nowhere",
        ),
        ("port", "NoMatchingParent", "has no port 1"),
        ("consumer", "UnsupportedValue", "consumer route"),
        (
            "filtered",
            "UnsupportedValue",
            "filter ExtensionRef is not supported",
        ),
        ("regex", "UnsupportedValue", "invalid regular expression"),
    ] {
        let accepted = &status(&table, name).accepted;
        assert_eq!(accepted.reason, reason, "{name}");
        assert!(
            accepted.message.contains(says),
            "{name}: {}",
            accepted.message
        );
    }
    assert_eq!(payments_8080(&table), [("good".into(), 0)]);
    assert_eq!(table.problems.len(), 5);
}

#[test]
fn gateway_parents_are_left_to_their_implementation_with_a_warning() {
    let mut r = route("gw", None, vec![rule(vec![], to_payments())]);
    r.parents = vec![ParentRef {
        group: GATEWAY_GROUP.into(),
        kind: "Gateway".into(),
        ..service_parent("shop", "edge", None)
    }];
    let table = RouteTable::resolve(&[r], &[], ports_of);
    assert!(table.statuses.is_empty() && table.problems.is_empty());
    assert_eq!(table.warnings.len(), 1);
    assert!(
        table.warnings[0]
            .reason
            .contains("Gateways are not served yet")
    );
}

#[test]
fn a_long_regex_is_refused_before_it_is_compiled() {
    let long = "a".repeat(MAX_REGEX_BYTES + 1);
    assert!(check_regex(&long).unwrap_err().contains("at most 1024"));
    assert!(check_regex("/greeter\\.[A-Z].*").is_ok());
}

#[test]
fn the_table_is_stale_when_a_service_it_named_appears_leaves_or_changes_ports() {
    let r = route(
        "r",
        None,
        vec![rule(vec![], vec![backend("shop", "later", Some(1), 1)])],
    );
    let table = RouteTable::resolve(&[r], &[], ports_of);
    let payments = ObjectKey::new("shop", "payments");
    let later = ObjectKey::new("shop", "later");
    // The parent as it was: its endpoints may change, the table holds.
    assert!(!table.stale(&payments, Some(vec![8080, 9090])));
    assert!(table.stale(&payments, Some(vec![8080])));
    assert!(table.stale(&payments, None));
    // The backend that did not exist appears.
    assert!(!table.stale(&later, None));
    assert!(table.stale(&later, Some(vec![1])));
    // A service no route names never matters.
    assert!(!table.stale(&ObjectKey::new("shop", "other"), Some(vec![80])));
}

fn edits(set: &[(&str, &str)], remove: &[&str]) -> HeaderEdits {
    HeaderEdits {
        set: set
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        add: Vec::new(),
        remove: remove.iter().map(|n| n.to_string()).collect(),
    }
}

fn redirect(path: Option<PathModifier>) -> Filter {
    Filter::RequestRedirect(Redirect {
        scheme: Some("https".into()),
        hostname: None,
        path,
        port: None,
        status: 301,
    })
}

fn with_filters(
    name: &str,
    matches: Vec<Match>,
    backends: Vec<BackendRef>,
    filters: Vec<Filter>,
) -> Route {
    let mut r = route(name, None, vec![rule(matches, backends)]);
    r.rules[0].filters = filters;
    r
}

#[test]
fn filters_act_on_every_match_of_their_rule_and_a_mirror_is_a_fleet_service() {
    let mirror = Filter::RequestMirror(Mirror {
        backend: backend("shop", "payments-canary", None, 1),
        fraction: Some((1, 4)),
    });
    let r = with_filters(
        "edited",
        vec![
            path(PathMatch::Prefix("/api".into())),
            path(PathMatch::Prefix("/v2".into())),
        ],
        to_payments(),
        vec![
            Filter::RequestHeaderModifier(edits(&[("x-fleet", "meridian")], &["x-debug"])),
            Filter::ResponseHeaderModifier(edits(&[], &["server"])),
            Filter::UrlRewrite(Rewrite {
                hostname: Some("payments.internal".into()),
                path: Some(PathModifier::ReplacePrefixMatch("/".into())),
            }),
            mirror,
        ],
    );
    let table = RouteTable::resolve(&[r], &[], ports_of);
    let s = status(&table, "edited");
    assert!(s.accepted.status && s.resolved_refs.status, "{s:?}");
    let attached = table
        .for_port(&ObjectKey::new("shop", "payments"), 8080)
        .unwrap();
    assert_eq!(attached.len(), 2);
    for a in attached.iter() {
        assert_eq!(
            a.actions.request_headers,
            edits(&[("x-fleet", "meridian")], &["x-debug"])
        );
        assert_eq!(a.actions.response_headers.remove, ["server"]);
        assert_eq!(
            a.actions.rewrite.as_ref().unwrap().path,
            Some(PathModifier::ReplacePrefixMatch("/".into()))
        );
        assert_eq!(
            a.actions.mirrors,
            [MirrorTo {
                backend: Backend {
                    service: ObjectKey::new("shop", "payments-canary"),
                    port: 8080,
                    weight: 1,
                },
                fraction: Some((1, 4)),
            }]
        );
        assert!(!a.fails());
    }
}

#[test]
fn a_redirect_sends_nothing_and_does_not_fail() {
    let r = with_filters("moved", vec![], vec![], vec![redirect(None)]);
    let table = RouteTable::resolve(&[r], &[], ports_of);
    assert!(status(&table, "moved").accepted.status);
    let a = &table
        .for_port(&ObjectKey::new("shop", "payments"), 8080)
        .unwrap()[0];
    assert_eq!(a.actions.redirect.as_ref().map(|r| r.status), Some(301));
    assert!(!a.fails());
    assert_eq!(a.failing_percent(), 0.0);
}

#[test]
fn filters_the_spec_forbids_together_reject_their_route_alone() {
    let prefix = || vec![path(PathMatch::Prefix("/api".into()))];
    let rewrite = |p: PathModifier| {
        Filter::UrlRewrite(Rewrite {
            hostname: None,
            path: Some(p),
        })
    };
    let headers = || Filter::RequestHeaderModifier(edits(&[("a", "b")], &[]));
    let cases = [
        (
            with_filters(
                "redirect-and-backends",
                vec![],
                to_payments(),
                vec![redirect(None)],
            ),
            "cannot have backendRefs",
        ),
        (
            with_filters(
                "redirect-and-rewrite",
                prefix(),
                vec![],
                vec![
                    redirect(None),
                    rewrite(PathModifier::ReplaceFullPath("/x".into())),
                ],
            ),
            "RequestRedirect and URLRewrite cannot be used on the same rule",
        ),
        (
            with_filters("twice", vec![], to_payments(), vec![headers(), headers()]),
            "RequestHeaderModifier appears twice",
        ),
        (
            with_filters(
                "prefix-on-exact",
                vec![path(PathMatch::Exact("/api".into()))],
                to_payments(),
                vec![rewrite(PathModifier::ReplacePrefixMatch("/v2".into()))],
            ),
            "ReplacePrefixMatch needs every match of its rule to be a PathPrefix match",
        ),
        (
            with_filters(
                "redirect-prefix-on-regex",
                vec![path(PathMatch::Regex("/a.*".into()))],
                vec![],
                vec![redirect(Some(PathModifier::ReplacePrefixMatch(
                    "/b".into(),
                )))],
            ),
            "ReplacePrefixMatch needs",
        ),
        (
            with_filters(
                "extension",
                vec![],
                to_payments(),
                vec![Filter::Unsupported("ExtensionRef".into())],
            ),
            "filter ExtensionRef is not supported by meridian",
        ),
    ];
    let good = with_filters("good", prefix(), to_payments(), vec![headers()]);
    let mut routes: Vec<Route> = cases.iter().map(|(r, _)| r.clone()).collect();
    routes.push(good);
    let table = RouteTable::resolve(&routes, &[], ports_of);
    for (r, says) in &cases {
        let accepted = &status(&table, &r.key.name).accepted;
        assert_eq!(accepted.reason, "UnsupportedValue", "{}", r.key.name);
        assert!(
            accepted.message.contains(says),
            "{}: {}",
            r.key.name,
            accepted.message
        );
    }
    assert_eq!(payments_8080(&table), [("good".into(), 0)]);
}

#[test]
fn a_mirror_that_does_not_resolve_is_left_out_and_said() {
    let r = with_filters(
        "mirrored",
        vec![],
        to_payments(),
        vec![Filter::RequestMirror(Mirror {
            backend: backend("shop", "nowhere", Some(80), 1),
            fraction: None,
        })],
    );
    let table = RouteTable::resolve(&[r], &[], ports_of);
    let s = status(&table, "mirrored");
    assert!(s.accepted.status);
    assert_eq!(s.resolved_refs.reason, "BackendNotFound");
    assert!(
        s.resolved_refs.message.starts_with("mirror backend"),
        "{}",
        s.resolved_refs.message
    );
    let a = &table
        .for_port(&ObjectKey::new("shop", "payments"), 8080)
        .unwrap()[0];
    assert!(a.actions.mirrors.is_empty());
    assert_eq!(
        a.backends.len(),
        1,
        "the requests themselves still go where the rule says"
    );
}
