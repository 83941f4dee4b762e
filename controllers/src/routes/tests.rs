use super::*;
use meridian_core::route::{Filter, HeaderEdits, PathModifier, Redirect, Rewrite};

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

#[test]
fn filters_convert_as_the_spec_writes_them() {
    let route = http(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: demo}
spec:
  parentRefs: [{kind: Service, group: '', name: greeter}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /api}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{name: X-Fleet, value: meridian}]
        add: [{name: x-seen, value: '1'}]
        remove: [X-Debug]
    - type: ResponseHeaderModifier
      responseHeaderModifier: {remove: [server]}
    - type: URLRewrite
      urlRewrite: {hostname: Payments.Internal, path: {type: ReplacePrefixMatch, replacePrefixMatch: /v2}}
    - type: RequestMirror
      requestMirror: {backendRef: {name: shadow, port: 80}, percent: 10}
    - type: RequestMirror
      requestMirror: {backendRef: {name: shadow2, port: 80}, fraction: {numerator: 1, denominator: 3}}
    backendRefs: [{name: greeter, port: 50051}]
  - filters:
    - type: RequestRedirect
      requestRedirect: {scheme: https, port: 8443, statusCode: 301, path: {type: ReplaceFullPath, replaceFullPath: /moved}}
  - filters: [{type: ExtensionRef, extensionRef: {group: example.com, kind: Thing, name: x}}]
    backendRefs: [{name: greeter, port: 50051, filters: [{type: RequestHeaderModifier, requestHeaderModifier: {remove: [a]}}]}]
"#,
    )
    .unwrap();
    let f = &route.rules[0].filters;
    assert_eq!(
        f[0],
        Filter::RequestHeaderModifier(HeaderEdits {
            set: vec![("x-fleet".into(), "meridian".into())],
            add: vec![("x-seen".into(), "1".into())],
            remove: vec!["x-debug".into()],
        })
    );
    assert!(matches!(&f[1], Filter::ResponseHeaderModifier(e) if e.remove == ["server"]));
    assert_eq!(
        f[2],
        Filter::UrlRewrite(Rewrite {
            hostname: Some("payments.internal".into()),
            path: Some(PathModifier::ReplacePrefixMatch("/v2".into())),
        })
    );
    assert!(
        matches!(&f[3], Filter::RequestMirror(m) if m.fraction == Some((10, 100)) && &*m.backend.name == "shadow" && &*m.backend.namespace == "demo")
    );
    assert!(matches!(&f[4], Filter::RequestMirror(m) if m.fraction == Some((1, 3))));
    assert_eq!(
        route.rules[1].filters,
        [Filter::RequestRedirect(Redirect {
            scheme: Some("https".into()),
            hostname: None,
            path: Some(PathModifier::ReplaceFullPath("/moved".into())),
            port: Some(8443),
            status: 301,
        })]
    );
    assert_eq!(
        route.rules[2].filters,
        [
            Filter::Unsupported("ExtensionRef".into()),
            Filter::Unsupported("RequestHeaderModifier on backendRef greeter".into()),
        ]
    );
}

#[test]
fn filters_the_api_would_refuse_are_errors_that_name_them() {
    for (filter, says) in [
        (
            "{type: RequestRedirect, requestRedirect: {statusCode: 307}}",
            "statusCode 307 is neither 301 nor 302",
        ),
        (
            "{type: RequestRedirect, requestRedirect: {scheme: ftp}}",
            "scheme \"ftp\" is neither http nor https",
        ),
        (
            "{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: 'bad name', value: x}]}}",
            "\"bad name\" is not a header name",
        ),
        (
            "{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: a, value: x}, {name: A, value: y}]}}",
            "header A named twice in set",
        ),
        (
            "{type: RequestHeaderModifier}",
            "needs the field requestHeaderModifier",
        ),
        (
            "{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath}}}",
            "needs replaceFullPath",
        ),
        (
            "{type: URLRewrite, urlRewrite: {hostname: 'a_b'}}",
            "is not a hostname",
        ),
        (
            "{type: RequestMirror, requestMirror: {backendRef: {name: s}, percent: 150}}",
            "percent 150 is outside 0-100",
        ),
        ("{type: Teleport}", "unknown filter type \"Teleport\""),
    ] {
        let yaml = format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r}}\nspec: {{rules: [{{filters: [{filter}]}}]}}\n"
        );
        let e = http(&yaml).unwrap_err();
        assert!(e.contains("filters[0]"), "{filter}: {e}");
        assert!(e.contains(says), "{filter}: {e}");
    }
    let grpc_rewrite = "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: r}\n\
        spec: {rules: [{filters: [{type: URLRewrite, urlRewrite: {hostname: a}}]}]}\n";
    let e = grpc(grpc_rewrite).unwrap_err();
    assert!(e.contains("a GRPCRoute's filters are"), "{e}");
}
