use std::time::Duration as StdDuration;

use meridian_core::ObjectKey;
use meridian_core::route::{Match, RouteKind};

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
