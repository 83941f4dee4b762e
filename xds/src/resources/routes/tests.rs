use std::time::Duration as StdDuration;

use meridian_core::ObjectKey;
use meridian_core::route::{Actions, Match, RouteKind};

use super::*;

const FAILING: &str = "payments.shop.global:9090/unresolved-backends";

fn attached(matches: Match, backends: Vec<(&str, u32)>) -> Attached {
    Attached {
        kind: RouteKind::Http,
        route: ObjectKey::new("shop", "r"),
        rule: 1,
        rule_name: None,
        matches,
        backends: backends
            .into_iter()
            .map(|(name, weight)| Backend {
                service: ObjectKey::new("shop", name),
                port: 9090,
                weight,
            })
            .collect(),
        failing: 0,
        timeout: None,
        retry: None,
        actions: Default::default(),
    }
}

/// A route's weighted clusters: (name, weight).
fn weighted(r: &xroute::Route) -> Vec<(&str, u32)> {
    let route_action::ClusterSpecifier::WeightedClusters(w) = cluster_of(r) else {
        panic!("not weighted: {r:?}");
    };
    w.clusters
        .iter()
        .map(|c| (c.name.as_str(), c.weight.as_ref().unwrap().value))
        .collect()
}

fn cluster_of(r: &xroute::Route) -> &route_action::ClusterSpecifier {
    match &r.action {
        Some(xroute::route::Action::Route(a)) => a.cluster_specifier.as_ref().unwrap(),
        other => panic!("not a route action: {other:?}"),
    }
}

#[test]
fn each_match_kind_becomes_its_envoy_matcher() {
    let m = Match {
        path: Some(PathMatch::Regex("/pay/.*".into())),
        headers: vec![ValueMatch {
            name: "X-Canary".into(),
            value: "1".into(),
            regex: false,
        }],
        query: vec![ValueMatch {
            name: "v".into(),
            value: "[0-9]+".into(),
            regex: true,
        }],
        method: Some("POST".into()),
    };
    let r = route(&attached(m, vec![("payments", 1)]), FAILING);
    assert_eq!(r.name, "HTTPRoute/shop/r/rule-1");
    let rm = r.r#match.unwrap();
    assert_eq!(
        rm.path_specifier,
        Some(route_match::PathSpecifier::SafeRegex(regex("/pay/.*")))
    );
    // Header names are lower case on the wire (HTTP/2, gRPC metadata).
    assert_eq!(rm.headers[0].name, "x-canary");
    assert_eq!(
        rm.headers[0].header_match_specifier,
        Some(header_matcher::HeaderMatchSpecifier::ExactMatch("1".into()))
    );
    assert_eq!(rm.headers[1].name, ":method");
    assert_eq!(rm.query_parameters[0].name, "v");
    for (path, want) in [
        (None, route_match::PathSpecifier::Prefix("/".into())),
        (
            Some(PathMatch::Exact("/a".into())),
            route_match::PathSpecifier::Path("/a".into()),
        ),
        (
            Some(PathMatch::Prefix("/a".into())),
            route_match::PathSpecifier::Prefix("/a".into()),
        ),
    ] {
        let m = Match {
            path,
            ..Match::default()
        };
        assert_eq!(route_match_of(&m).path_specifier, Some(want));
    }
}

#[test]
fn weights_name_the_backends_own_clusters_and_zero_weights_are_left_out() {
    let r = route(
        &attached(
            Match::default(),
            vec![("payments", 90), ("payments-v2", 10), ("off", 0)],
        ),
        FAILING,
    );
    let got = weighted(&r);
    assert_eq!(
        got,
        [
            ("payments.shop.global:9090", 90),
            ("payments-v2.shop.global:9090", 10)
        ]
    );
    // One backend: the cluster itself.
    let r = route(&attached(Match::default(), vec![("payments", 5)]), FAILING);
    assert_eq!(
        cluster_of(&r),
        &route_action::ClusterSpecifier::Cluster("payments.shop.global:9090".into())
    );
}

#[test]
fn unresolved_backends_keep_their_share_on_the_cluster_without_endpoints() {
    let mut a = attached(Match::default(), vec![("payments", 3)]);
    a.failing = 1;
    let r = route(&a, FAILING);
    let got = weighted(&r);
    assert_eq!(got, [("payments.shop.global:9090", 3), (FAILING, 1)]);
    assert_eq!(a.failing_percent(), 25.0);
    assert!(sends_to_failing(&[a]));
}

#[test]
fn no_backend_with_a_weight_answers_500() {
    for backends in [vec![], vec![("payments", 0)]] {
        let r = route(&attached(Match::default(), backends), FAILING);
        assert!(matches!(
            r.action,
            Some(xroute::route::Action::DirectResponse(
                xroute::DirectResponseAction { status: 500, .. }
            ))
        ));
        // All of it fails at the route: no cluster without endpoints is needed.
        let mut a = attached(Match::default(), vec![]);
        a.failing = 1;
        assert!(!sends_to_failing(&[a]));
    }
}

#[test]
fn timeouts_and_retries_in_envoys_and_grpcs_terms() {
    let mut a = attached(Match::default(), vec![("payments", 1)]);
    a.timeout = Some(StdDuration::from_millis(200));
    a.retry = Some(Retry {
        attempts: 3,
        codes: vec![503, 500, 504],
        backoff: None,
    });
    let Some(xroute::route::Action::Route(action)) = route(&a, FAILING).action else {
        panic!("not a route action");
    };
    let ms = Duration {
        seconds: 0,
        nanos: 200_000_000,
    };
    assert_eq!(action.timeout, Some(ms));
    assert_eq!(
        action.max_stream_duration.unwrap().max_stream_duration,
        Some(ms)
    );
    let retry = action.retry_policy.unwrap();
    assert_eq!(
        retry.retry_on,
        "unavailable,internal,retriable-status-codes"
    );
    assert_eq!(retry.num_retries.unwrap().value, 3);
    assert_eq!(retry.retriable_status_codes, [503, 500, 504]);
    assert_eq!(
        retry.retry_back_off.unwrap().base_interval,
        Some(Duration {
            seconds: 0,
            nanos: 25_000_000
        })
    );
}

fn prefix(p: &str) -> Match {
    Match {
        path: Some(PathMatch::Prefix(p.into())),
        ..Match::default()
    }
}

fn rewrite_of(r: &xroute::Route) -> (&str, &str) {
    let Some(xroute::route::Action::Route(a)) = &r.action else {
        panic!("not a route action: {r:?}");
    };
    let rw = a.regex_rewrite.as_ref().expect("a regex rewrite");
    (
        rw.pattern.as_ref().unwrap().regex.as_str(),
        rw.substitution.as_str(),
    )
}

/// What Envoy does with a regex rewrite (RE2 replaces the first match; `\1` a group).
fn apply(pattern: &str, substitution: &str, path: &str) -> String {
    let re = regex::Regex::new(pattern).unwrap();
    re.replace(path, substitution.replace("\\1", "${1}"))
        .into_owned()
}

#[test]
fn header_modifiers_set_add_and_remove_both_ways() {
    let mut a = attached(Match::default(), vec![("payments", 1)]);
    a.actions = Actions {
        request_headers: HeaderEdits {
            set: vec![("x-fleet".into(), "meridian".into())],
            add: vec![("x-seen".into(), "1".into())],
            remove: vec!["x-debug".into()],
        },
        response_headers: HeaderEdits {
            remove: vec!["server".into()],
            ..HeaderEdits::default()
        },
        ..Actions::default()
    };
    let r = &routes(&[a], FAILING)[0];
    let added: Vec<(&str, &str, i32)> = r
        .request_headers_to_add
        .iter()
        .map(|o| {
            let h = o.header.as_ref().unwrap();
            (h.key.as_str(), h.value.as_str(), o.append_action)
        })
        .collect();
    use header_value_option::HeaderAppendAction::{AppendIfExistsOrAdd, OverwriteIfExistsOrAdd};
    assert_eq!(
        added,
        [
            ("x-fleet", "meridian", OverwriteIfExistsOrAdd as i32),
            ("x-seen", "1", AppendIfExistsOrAdd as i32)
        ]
    );
    assert_eq!(r.request_headers_to_remove, ["x-debug"]);
    assert!(r.response_headers_to_add.is_empty());
    assert_eq!(r.response_headers_to_remove, ["server"]);
}

#[test]
fn a_redirect_answers_instead_of_a_cluster() {
    let mut a = attached(prefix("/old"), vec![]);
    a.actions.redirect = Some(Redirect {
        scheme: Some("https".into()),
        hostname: Some("new.example.com".into()),
        path: Some(PathModifier::ReplacePrefixMatch("/new".into())),
        port: Some(8443),
        status: 301,
    });
    let r = &routes(&[a], FAILING)[0];
    let Some(xroute::route::Action::Redirect(d)) = &r.action else {
        panic!("not a redirect: {r:?}");
    };
    assert_eq!(d.host_redirect, "new.example.com");
    assert_eq!(d.port_redirect, 8443);
    assert_eq!(
        d.response_code,
        redirect_action::RedirectResponseCode::MovedPermanently as i32
    );
    assert_eq!(
        d.scheme_rewrite_specifier,
        Some(redirect_action::SchemeRewriteSpecifier::SchemeRedirect(
            "https".into()
        ))
    );
    let Some(redirect_action::PathRewriteSpecifier::RegexRewrite(rw)) = &d.path_rewrite_specifier
    else {
        panic!("no path rewrite: {d:?}");
    };
    let pattern = &rw.pattern.as_ref().unwrap().regex;
    assert_eq!(apply(pattern, &rw.substitution, "/old/a"), "/new/a");
}

#[test]
fn a_prefix_replacement_replaces_whole_segments_as_the_spec_says() {
    // The spec's own examples (HTTPPathModifier): prefix /foo replaced by /xyz or by /.
    for (matched, with, path, want) in [
        ("/foo", "/xyz", "/foo", "/xyz"),
        ("/foo", "/xyz", "/foo/", "/xyz/"),
        ("/foo", "/xyz", "/foo/bar", "/xyz/bar"),
        ("/foo/", "/xyz", "/foo/bar", "/xyz/bar"),
        ("/foo", "/xyz/", "/foo/bar", "/xyz/bar"),
        ("/foo", "/", "/foo", "/"),
        ("/foo", "/", "/foo/bar", "/bar"),
        ("/", "/xyz", "/bar", "/xyz/bar"),
        ("/a.b", "/c", "/a.b/d", "/c/d"),
    ] {
        let mut a = attached(prefix(matched), vec![("payments", 1)]);
        a.actions.rewrite = Some(Rewrite {
            hostname: None,
            path: Some(PathModifier::ReplacePrefixMatch(with.into())),
        });
        let r = &routes(&[a], FAILING)[0];
        let (pattern, substitution) = rewrite_of(r);
        assert_eq!(
            apply(pattern, substitution, path),
            want,
            "{matched} → {with} on {path} ({pattern} → {substitution})"
        );
    }
    let mut a = attached(prefix("/a.b"), vec![("payments", 1)]);
    a.actions.rewrite = Some(Rewrite {
        hostname: None,
        path: Some(PathModifier::ReplacePrefixMatch("/c".into())),
    });
    let r = &routes(&[a], FAILING)[0];
    let (pattern, substitution) = rewrite_of(r);
    assert_eq!(
        apply(pattern, substitution, "/axb/d"),
        "/axb/d",
        "a dot is a dot"
    );
}

#[test]
fn a_full_path_rewrite_and_a_host_rewrite() {
    let mut a = attached(prefix("/api"), vec![("payments", 1)]);
    a.actions.rewrite = Some(Rewrite {
        hostname: Some("payments.internal".into()),
        path: Some(PathModifier::ReplaceFullPath("/v2/all".into())),
    });
    let r = &routes(&[a], FAILING)[0];
    let (pattern, substitution) = rewrite_of(r);
    assert_eq!(apply(pattern, substitution, "/api/x/y"), "/v2/all");
    let Some(xroute::route::Action::Route(action)) = &r.action else {
        panic!();
    };
    assert_eq!(
        action.host_rewrite_specifier,
        Some(route_action::HostRewriteSpecifier::HostRewriteLiteral(
            "payments.internal".into()
        ))
    );
}

#[test]
fn mirrors_name_their_backends_clusters_and_the_share_in_millionths() {
    let mut a = attached(Match::default(), vec![("payments", 1)]);
    a.actions.mirrors = vec![
        MirrorTo {
            backend: Backend {
                service: ObjectKey::new("shop", "shadow"),
                port: 80,
                weight: 1,
            },
            fraction: Some((1, 3)),
        },
        MirrorTo {
            backend: Backend {
                service: ObjectKey::new("shop", "all"),
                port: 80,
                weight: 1,
            },
            fraction: None,
        },
    ];
    let r = &routes(&[a], FAILING)[0];
    let Some(xroute::route::Action::Route(action)) = &r.action else {
        panic!();
    };
    let mirrors: Vec<(&str, Option<u32>)> = action
        .request_mirror_policies
        .iter()
        .map(|m| {
            (
                m.cluster.as_str(),
                m.runtime_fraction
                    .as_ref()
                    .map(|f| f.default_value.as_ref().unwrap().numerator),
            )
        })
        .collect();
    assert_eq!(
        mirrors,
        [
            ("shadow.shop.global:80", Some(333_333)),
            ("all.shop.global:80", None)
        ]
    );
}
