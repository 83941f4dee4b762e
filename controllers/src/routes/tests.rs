use super::*;

fn grpc(yaml: &str) -> Result<Route, String> {
    let r: GRPCRoute = serde_yaml_ng::from_str(yaml).unwrap();
    grpc_route(&r, Source::Api)
}

fn http(yaml: &str) -> Result<Route, String> {
    let r: HTTPRoute = serde_yaml_ng::from_str(yaml).unwrap();
    http_route(&r, Source::Api)
}

#[test]
fn durations_as_the_gateway_api_writes_them() {
    for (text, want) in [
        ("10s", Some(Duration::from_secs(10))),
        ("500ms", Some(Duration::from_millis(500))),
        ("1h30m", Some(Duration::from_secs(5400))),
        ("1m1s1ms", Some(Duration::from_millis(61_001))),
        ("0s", Some(Duration::ZERO)),
        ("", None),
        ("10", None),
        ("1.5s", None),
        ("123456s", None),
        ("1s1s1s1s1s", None),
        ("-1s", None),
    ] {
        assert_eq!(duration(text).ok(), want, "{text:?}");
    }
}

#[test]
fn grpc_method_matches_become_the_paths_grpc_sends() {
    for (method, want) in [
        (
            "{service: meridian.test.Greeter, method: Hello}",
            Ok(PathMatch::Exact("/meridian.test.Greeter/Hello".into())),
        ),
        (
            "{service: meridian.test.Greeter}",
            Ok(PathMatch::Prefix("/meridian.test.Greeter/".into())),
        ),
        (
            "{method: Hello}",
            Ok(PathMatch::Regex("/[^/]+/Hello".into())),
        ),
        (
            "{type: RegularExpression, service: 'meridian\\..*'}",
            Ok(PathMatch::Regex("/meridian\\..*/[^/]+".into())),
        ),
        ("{}", Err("service or method is required")),
        ("{service: 'a/b'}", Err("an Exact match names")),
        (
            "{type: Prefix, service: a}",
            Err("is not Exact or RegularExpression"),
        ),
    ] {
        let yaml = format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {{name: r, namespace: demo}}\n\
             spec: {{parentRefs: [{{kind: Service, group: '', name: greeter}}], rules: [{{matches: [{{method: {method}}}], backendRefs: [{{name: greeter, port: 50051}}]}}]}}\n"
        );
        match (grpc(&yaml), want) {
            (Ok(route), Ok(path)) => {
                assert_eq!(route.rules[0].matches[0].path, Some(path), "{method}");
                assert_eq!(route.parents[0].kind, "Service");
                assert_eq!(&*route.parents[0].namespace, "demo");
                assert_eq!(route.rules[0].backends[0].weight, 1);
            }
            (Err(e), Err(says)) => assert!(e.contains(says), "{method}: {e}"),
            (got, want) => panic!("{method}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn http_routes_convert_timeouts_retries_and_refuse_what_the_api_refuses() {
    let route = http(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: demo}
spec:
  parentRefs: [{kind: Service, group: '', name: greeter, port: 50051}]
  rules:
  - matches: [{path: {type: Exact, value: /a}, headers: [{name: x-canary, value: '1'}], method: POST}]
    timeouts: {request: 2s}
    retry: {attempts: 3, codes: [503], backoff: 50ms}
    backendRefs:
    - {name: greeter, port: 50051, weight: 90}
    - {kind: ServiceImport, group: multicluster.x-k8s.io, name: g2, namespace: other, weight: 10}
"#,
    )
    .unwrap();
    let rule = &route.rules[0];
    assert_eq!(route.parents[0].port, Some(50051));
    assert_eq!(rule.timeout, Some(Duration::from_secs(2)));
    assert_eq!(
        rule.retry,
        Some(Retry {
            attempts: 3,
            codes: vec![503],
            backoff: Some(Duration::from_millis(50))
        })
    );
    assert_eq!(rule.matches[0].method.as_deref(), Some("POST"));
    assert_eq!(rule.matches[0].headers[0].name, "x-canary");
    assert_eq!(&*rule.backends[1].namespace, "other");
    assert_eq!(rule.backends[1].kind, "ServiceImport");

    let many_rules = format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r}}\nspec: {{rules: [{}]}}\n",
        vec!["{}"; 17].join(",")
    );
    assert!(http(&many_rules).unwrap_err().contains("17 rules"));
    for (spec, says) in [
        (
            "{rules: [{timeouts: {request: soon}}]}",
            "not a Gateway API duration",
        ),
        (
            "{rules: [{retry: {codes: [200]}}]}",
            "not an HTTP error status",
        ),
        (
            "{rules: [{backendRefs: [{name: a, weight: -1}]}]}",
            "outside 0-1000000",
        ),
        ("{parentRefs: [{name: a, port: 70000}]}", "not a port"),
        (
            "{rules: [{matches: [{path: {type: Exact, value: a}}]}]}",
            "must start with /",
        ),
    ] {
        let yaml = format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r}}\nspec: {spec}\n"
        );
        let e = http(&yaml).unwrap_err();
        assert!(e.contains(says), "{spec}: {e}");
    }
}
