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
    let (key, slice, problems) = slice(&s, Validation::Directory).unwrap();
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
    let (_, slice, problems) = slice(&s, Validation::Directory).unwrap();
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
        slice(&s, Validation::Directory)
            .unwrap_err()
            .to_string()
            .contains(SERVICE_NAME_LABEL)
    );
    assert!(
        slice(&slice_with("FQDN", vec![]), Validation::Directory)
            .unwrap_err()
            .to_string()
            .contains("FQDN")
    );
    assert!(
        slice(&slice_with("IPv5", vec![]), Validation::Directory)
            .unwrap_err()
            .to_string()
            .contains("unknown addressType")
    );
}

#[test]
fn services_headless_external_name_and_ports() {
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db", "namespace": "shop"},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": true, "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}, {"name": "dns", "port": 53, "protocol": "UDP"}]}
    }))
    .unwrap();
    let (_, s) = service(&svc).unwrap();
    assert!(s.headless && s.publish_not_ready && !s.external_name);
    assert_eq!(s.ports[1].protocol, core::Protocol::Udp);
    let one_unnamed: Service = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "x"}, "spec": {"ports": [{"port": 53}]}}),
    )
    .unwrap();
    assert_eq!(service(&one_unnamed).unwrap().1.ports[0].name, None);
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

fn svc_json(value: serde_json::Value) -> Service {
    serde_json::from_value(value).unwrap()
}

/// An object case: what it is, and the error it gets (none: it converts).
struct ObjectCase<T> {
    name: &'static str,
    object: T,
    refused_with: Option<&'static str>,
}

fn check_objects<T>(cases: Vec<ObjectCase<T>>, convert: impl Fn(&T) -> Result<(), Error>) {
    for c in cases {
        match (convert(&c.object), c.refused_with) {
            (Ok(()), None) => {}
            (Err(e), Some(phrase)) => {
                assert!(e.to_string().contains(phrase), "{}: {e}", c.name)
            }
            (got, want) => panic!("{}: got {got:?}, expected {want:?}", c.name),
        }
    }
}

#[test]
fn services_are_refused_whole_for_names_the_api_server_refuses() {
    let named = |name: &str, ns: &str| {
        svc_json(serde_json::json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"ports": [{"name": "http", "port": 80}]}
        }))
    };
    let ports = |ports: serde_json::Value| {
        svc_json(serde_json::json!({"metadata": {"name": "web"}, "spec": {"ports": ports}}))
    };
    let cases = vec![
        ObjectCase {
            name: "accept: a DNS-1035 name in a DNS-1123 namespace",
            object: named("web-2", "shop-1"),
            refused_with: None,
        },
        ObjectCase {
            name: "accept: a namespace may start with a digit",
            object: named("web", "1shop"),
            refused_with: None,
        },
        ObjectCase {
            name: "refuse: upper case and underscore",
            object: named("Bad_Name", "shop"),
            refused_with: Some(r#"metadata.name: "Bad_Name" is not a DNS-1035 label"#),
        },
        ObjectCase {
            name: "refuse: a dot (one escaped label in AXFR)",
            object: named("a.b", "shop"),
            refused_with: Some(r#"metadata.name: "a.b" is not a DNS-1035 label"#),
        },
        ObjectCase {
            name: "refuse: a wildcard",
            object: named("*", "shop"),
            refused_with: Some(r#"metadata.name: "*" is not"#),
        },
        ObjectCase {
            name: "refuse: a leading digit (DNS-1123 but not DNS-1035)",
            object: named("1web", "shop"),
            refused_with: Some("DNS-1035"),
        },
        ObjectCase {
            name: "refuse: 64 characters",
            object: named(&"a".repeat(64), "shop"),
            refused_with: Some("must be no more than 63 characters"),
        },
        ObjectCase {
            name: "refuse: a namespace with a dot",
            object: named("web", "sh.op"),
            refused_with: Some(r#"metadata.namespace: "sh.op" is not a DNS-1123 label"#),
        },
        ObjectCase {
            name: "accept: one unnamed port",
            object: ports(serde_json::json!([{"port": 80}])),
            refused_with: None,
        },
        ObjectCase {
            name: "accept: a port name of digits (DNS-1123 label)",
            object: ports(serde_json::json!([{"name": "8080", "port": 80}])),
            refused_with: None,
        },
        ObjectCase {
            name: "refuse: an unnamed port beside another",
            object: ports(serde_json::json!([{"name": "http", "port": 80}, {"port": 81}])),
            refused_with: Some(
                "spec.ports[1].name is required when a Service has more than one port",
            ),
        },
        ObjectCase {
            name: "refuse: a port name with an underscore (a bad SRV label)",
            object: ports(serde_json::json!([{"name": "my_port", "port": 80}])),
            refused_with: Some(r#"spec.ports[0].name: "my_port" is not a DNS-1123 label"#),
        },
        ObjectCase {
            name: "refuse: a port name with a dot",
            object: ports(serde_json::json!([{"name": "a.b", "port": 80}])),
            refused_with: Some("spec.ports[0].name"),
        },
        ObjectCase {
            name: "refuse: the same port name twice",
            object: ports(
                serde_json::json!([{"name": "http", "port": 80}, {"name": "http", "port": 81}]),
            ),
            refused_with: Some(r#"spec.ports[1].name: "http" is a duplicate"#),
        },
    ];
    check_objects(cases, |s| service(s).map(|_| ()));
}

fn named_slice(name: &str, service: &str) -> EndpointSlice {
    let mut s = slice_with("IPv4", vec![endpoint(&["10.0.0.1"], None, None)]);
    s.metadata.name = Some(name.into());
    s.metadata.labels = Some([(SERVICE_NAME_LABEL.to_string(), service.to_string())].into());
    s
}

fn with_ports(names: &[Option<&str>]) -> EndpointSlice {
    let mut s = named_slice("web-1", "web");
    s.ports = Some(
        names
            .iter()
            .enumerate()
            .map(|(i, n)| k8s_openapi::api::discovery::v1::EndpointPort {
                name: n.map(str::to_owned),
                port: Some(8080 + i as i32),
                protocol: Some("TCP".into()),
                app_protocol: None,
            })
            .collect(),
    );
    s
}

#[test]
fn slices_are_refused_whole_for_names_the_api_server_refuses() {
    let cases = vec![
        ObjectCase {
            name: "accept: a dotted name (DNS-1123 subdomain)",
            object: named_slice("web.abc12", "web"),
            refused_with: None,
        },
        ObjectCase {
            name: "refuse: an upper-case slice name",
            object: named_slice("Web-1", "web"),
            refused_with: Some(r#"metadata.name: "Web-1" is not a DNS-1123 subdomain"#),
        },
        ObjectCase {
            name: "refuse: a slice name with a space",
            object: named_slice("web 1", "web"),
            refused_with: Some("DNS-1123 subdomain"),
        },
        ObjectCase {
            name: "refuse: a service label that names no possible Service",
            object: named_slice("web-1", "a.b"),
            refused_with: Some(
                r#"metadata.labels[kubernetes.io/service-name]: "a.b" is not a DNS-1035 label"#,
            ),
        },
        ObjectCase {
            name: "accept: named and one unnamed port",
            object: with_ports(&[Some("http"), None]),
            refused_with: None,
        },
        ObjectCase {
            name: "refuse: a port name with an underscore",
            object: with_ports(&[Some("my_port")]),
            refused_with: Some(r#"ports[0].name: "my_port" is not a DNS-1123 label"#),
        },
        ObjectCase {
            name: "refuse: the same port name twice",
            object: with_ports(&[Some("http"), Some("http")]),
            refused_with: Some(r#"ports[1].name: "http" is a duplicate"#),
        },
        ObjectCase {
            name: "refuse: two unnamed ports (the empty name twice)",
            object: with_ports(&[None, None]),
            refused_with: Some("ports[1].name"),
        },
    ];
    check_objects(cases, |s| slice(s, Validation::Directory).map(|_| ()));
}

fn hosted(address: &str, hostname: Option<&str>) -> K8sEndpoint {
    K8sEndpoint {
        hostname: hostname.map(str::to_owned),
        ..endpoint(&[address], None, None)
    }
}

struct EndpointCase {
    name: &'static str,
    address_type: &'static str,
    endpoint: K8sEndpoint,
    validation: Validation,
    /// The problem's text, in part; none: the endpoint is served.
    left_out_with: Option<&'static str>,
}

#[test]
fn a_refused_endpoint_leaves_out_only_itself_and_names_its_field() {
    use Validation::{Directory, Kubernetes};
    let ep = |a: &str| endpoint(&[a], None, None);
    let cases = vec![
        EndpointCase {
            name: "serve: a private IPv4 address",
            address_type: "IPv4",
            endpoint: ep("10.0.0.7"),
            validation: Kubernetes,
            left_out_with: None,
        },
        EndpointCase {
            name: "serve: loopback in a directory member (the quickstart)",
            address_type: "IPv4",
            endpoint: ep("127.1.1.1"),
            validation: Directory,
            left_out_with: None,
        },
        EndpointCase {
            name: "serve: IPv6 loopback in a directory member",
            address_type: "IPv6",
            endpoint: ep("::1"),
            validation: Directory,
            left_out_with: None,
        },
        EndpointCase {
            name: "leave out: loopback from a Kubernetes API",
            address_type: "IPv4",
            endpoint: ep("127.0.0.1"),
            validation: Kubernetes,
            left_out_with: Some(
                "endpoints[0].addresses[0]: 127.0.0.1 may not be in the loopback range",
            ),
        },
        EndpointCase {
            name: "leave out: unspecified",
            address_type: "IPv4",
            endpoint: ep("0.0.0.0"),
            validation: Directory,
            left_out_with: Some(
                "endpoints[0].addresses[0]: 0.0.0.0 may not be unspecified (0.0.0.0); endpoint left out",
            ),
        },
        EndpointCase {
            name: "leave out: link-local multicast",
            address_type: "IPv4",
            endpoint: ep("224.0.0.1"),
            validation: Directory,
            left_out_with: Some("224.0.0.1 may not be in the link-local multicast range"),
        },
        EndpointCase {
            name: "leave out: broadcast",
            address_type: "IPv4",
            endpoint: ep("255.255.255.255"),
            validation: Directory,
            left_out_with: Some("broadcast"),
        },
        EndpointCase {
            name: "leave out: the cloud metadata address",
            address_type: "IPv4",
            endpoint: ep("169.254.169.254"),
            validation: Directory,
            left_out_with: Some("169.254.169.254 may not be in the link-local range"),
        },
        EndpointCase {
            name: "leave out: IPv6 unspecified",
            address_type: "IPv6",
            endpoint: ep("::"),
            validation: Directory,
            left_out_with: Some(":: may not be unspecified"),
        },
        EndpointCase {
            name: "leave out: IPv6 all-nodes multicast",
            address_type: "IPv6",
            endpoint: ep("ff02::1"),
            validation: Directory,
            left_out_with: Some("ff02::1 may not be in the link-local multicast range"),
        },
        EndpointCase {
            name: "leave out: IPv4-mapped loopback, even in a directory member",
            address_type: "IPv6",
            endpoint: ep("::ffff:127.0.0.1"),
            validation: Directory,
            left_out_with: Some("IPv4-mapped"),
        },
        EndpointCase {
            name: "leave out: an address of the other family",
            address_type: "IPv6",
            endpoint: ep("10.0.0.1"),
            validation: Directory,
            left_out_with: Some("10.0.0.1 does not match addressType IPv6"),
        },
        EndpointCase {
            name: "leave out: no address",
            address_type: "IPv4",
            endpoint: endpoint(&[], None, None),
            validation: Directory,
            left_out_with: Some("endpoints[0].addresses must contain at least 1 address"),
        },
        EndpointCase {
            name: "leave out: one bad address among good ones",
            address_type: "IPv4",
            endpoint: endpoint(&["10.0.0.1", "0.0.0.0"], None, None),
            validation: Directory,
            left_out_with: Some("endpoints[0].addresses[1]: 0.0.0.0"),
        },
        EndpointCase {
            name: "serve: a DNS-1123 hostname",
            address_type: "IPv4",
            endpoint: hosted("10.0.0.1", Some("db-0")),
            validation: Directory,
            left_out_with: None,
        },
        EndpointCase {
            name: "leave out: a 300-character hostname",
            address_type: "IPv4",
            endpoint: hosted("10.0.0.1", Some(&"h".repeat(300))),
            validation: Directory,
            left_out_with: Some("endpoints[0].hostname: \"hhhh"),
        },
        EndpointCase {
            name: "leave out: a hostname with a dot",
            address_type: "IPv4",
            endpoint: hosted("10.0.0.1", Some("a.b")),
            validation: Directory,
            left_out_with: Some(r#"endpoints[0].hostname: "a.b" is not a DNS-1123 label"#),
        },
        EndpointCase {
            name: "leave out: a hostname with a NUL, escaped in the reason",
            address_type: "IPv4",
            endpoint: hosted("10.0.0.1", Some("a\0b")),
            validation: Directory,
            left_out_with: Some(r#"endpoints[0].hostname: "a\0b""#),
        },
        EndpointCase {
            name: "leave out: a hostname with a space",
            address_type: "IPv4",
            endpoint: hosted("10.0.0.1", Some("a b")),
            validation: Directory,
            left_out_with: Some(r#""a b" is not a DNS-1123 label"#),
        },
        EndpointCase {
            name: "leave out: bad address and bad hostname, both named",
            address_type: "IPv4",
            endpoint: hosted("0.0.0.0", Some("A")),
            validation: Directory,
            left_out_with: Some(
                r#"0.0.0.0 may not be unspecified (0.0.0.0); endpoints[0].hostname: "A""#,
            ),
        },
    ];
    for c in cases {
        let good = endpoint(
            &[if c.address_type == "IPv4" {
                "10.9.9.9"
            } else {
                "fd00::9"
            }],
            None,
            None,
        );
        let s = slice_with(c.address_type, vec![c.endpoint, good]);
        let (_, converted, problems) = slice(&s, c.validation).unwrap();
        match c.left_out_with {
            None => {
                assert!(problems.is_empty(), "{}: {problems:?}", c.name);
                assert_eq!(converted.endpoints.len(), 2, "{}", c.name);
            }
            Some(phrase) => {
                assert_eq!(problems.len(), 1, "{}: {problems:?}", c.name);
                assert!(problems[0].contains(phrase), "{}: {}", c.name, problems[0]);
                assert!(!problems[0].contains('\0'), "{}", c.name);
                assert_eq!(
                    converted.endpoints.len(),
                    1,
                    "{}: the rest of the slice serves",
                    c.name
                );
            }
        }
    }
}

#[test]
fn exports_and_imports_must_be_named_as_a_service() {
    let meta = |name: &str, ns: &str| ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.into()),
        ..Default::default()
    };
    let cases = vec![
        ObjectCase {
            name: "accept: a Service name",
            object: meta("web", "shop"),
            refused_with: None,
        },
        ObjectCase {
            name: "refuse: a name no Service can have",
            object: meta("Bad_Name", "shop"),
            refused_with: Some(r#"metadata.name: "Bad_Name" is not a DNS-1035 label"#),
        },
        ObjectCase {
            name: "refuse: a namespace no namespace can have",
            object: meta("web", "Shop"),
            refused_with: Some("metadata.namespace"),
        },
    ];
    check_objects(cases, |m| export(m).map(|_| ()));
    let import_named = |name: &str| -> ServiceImport {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceImport",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"type": "ClusterSetIP", "ips": ["10.96.0.1"], "ports": []}
        }))
        .unwrap()
    };
    let cases = vec![
        ObjectCase {
            name: "accept: a Service name",
            object: import_named("web"),
            refused_with: None,
        },
        ObjectCase {
            name: "refuse: a wildcard",
            object: import_named("*"),
            refused_with: Some(r#"metadata.name: "*" is not a DNS-1035 label"#),
        },
    ];
    check_objects(cases, |si| import(si).map(|_| ()));
}
