//! The fleet both DNS targets answer from: a Snapshot shaped like examples/quickstart (see
//! fuzz/README.md), and the client source addresses the first input byte picks from.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use ipnet::IpNet;
use meridian_core::{
    ClusterId, ClusterObjects, ClusterSpec, Endpoint, Export, Gateway, GeoBuilder, Import, Index, Locality,
    ObjectKey, Port, Policies, Protocol, Registry, Service, Slice, Snapshot,
};
use meridian_dns::{Dns, DnsConfig};
use tokio::sync::watch;

pub struct Fixture {
    pub dns: Arc<Dns>,
    /// Kept so the watch channel stays open.
    _snapshots: watch::Sender<Arc<Snapshot>>,
}

pub static FIXTURE: LazyLock<Fixture> = LazyLock::new(fixture);

const fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

const fn v6(a: u16, b: u16, c: u16, h: u16) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(a, b, c, 0, 0, 0, 0, h))
}

/// (source, another address of the same client cluster — or of no cluster, like the source).
pub const SOURCES: [(IpAddr, IpAddr); 10] = [
    (v4(127, 0, 1, 1), v4(127, 0, 1, 200)),       // eu-1
    (v4(127, 0, 2, 1), v4(127, 0, 2, 99)),        // eu-2
    (v4(127, 0, 3, 1), v4(127, 0, 3, 7)),         // us-1 (network n2, behind a gateway)
    (v4(127, 0, 0, 1), v4(127, 0, 0, 2)),         // no cluster
    (v4(10, 9, 8, 7), v4(192, 0, 2, 1)),          // no cluster
    (v6(0, 0, 0, 1), v6(0x2001, 0xdb8, 0, 1)),    // no cluster, IPv6
    (v6(0xfd00, 2, 0, 5), v6(0xfd00, 2, 0, 6)),   // eu-2 by its IPv6 dnsClientCIDR
    (v4(127, 0, 9, 1), v4(127, 0, 9, 2)),         // claimed by eu-1 and us-1 alike: a tie, no cluster
    (v4(203, 0, 113, 5), v4(203, 0, 113, 200)),   // outside the fleet, a geo range in region us
    (v4(198, 51, 100, 7), v4(198, 51, 100, 70)),  // outside the fleet, a geo range in zone eu-1a
];

fn net(s: &str) -> IpNet {
    s.parse().expect("valid CIDR")
}

fn port(name: &str, port: u16, protocol: Protocol) -> Port {
    Port {
        name: Some(name.into()),
        port,
        protocol,
        app_protocol: None,
    }
}

fn endpoint(addr: IpAddr, hostname: Option<&str>, zone: Option<&str>, ports: &Arc<[Port]>) -> Endpoint {
    Endpoint {
        addresses: vec![addr],
        hostname: hostname.map(Into::into),
        ready: true,
        serving: true,
        terminating: false,
        zone: zone.map(Into::into),
        ports: ports.clone(),
    }
}

fn service(headless: bool, ports: Vec<Port>) -> Service {
    Service {
        headless,
        external_name: false,
        publish_not_ready: false,
        ports,
        cluster_ips: Vec::new(),
    }
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new("shop", name)
}

fn slice(service: &str, endpoints: Vec<Endpoint>) -> Slice {
    Slice {
        service: Arc::from(service),
        endpoints,
    }
}

fn member(id: &str, zone: &str, region: &str, network: &str, cidrs: &[&str]) -> ClusterSpec {
    let mut spec = ClusterSpec::named(id);
    spec.labels = BTreeMap::from([
        ("topology.kubernetes.io/region".to_string(), region.to_string()),
        ("topology.kubernetes.io/zone".to_string(), zone.to_string()),
    ]);
    spec.locality = Locality {
        region: Some(region.into()),
        zone: Some(zone.into()),
    };
    spec.network = Some(network.into());
    spec.dns_client_cidrs = cidrs.iter().map(|c| net(c)).collect();
    spec
}

/// payments in one cluster: two ready endpoints and one terminating, as in the quickstart.
fn payments(objects: &mut ClusterObjects, created: i64, third_octet: u8, zone: &str) {
    let ports = vec![port("http", 8080, Protocol::Tcp), port("grpc", 9090, Protocol::Tcp)];
    let slice_ports: Arc<[Port]> = ports.clone().into();
    objects.services.push((key("payments"), service(false, ports)));
    objects.exports.push((key("payments"), Export { created, ..Export::default() }));
    let mut terminating = endpoint(v4(127, 1, third_octet, 3), None, Some(zone), &slice_ports);
    terminating.ready = false;
    terminating.terminating = true;
    objects.slices.push((
        key("payments-abc12"),
        slice(
            "payments",
            vec![
                endpoint(v4(127, 1, third_octet, 1), None, Some(zone), &slice_ports),
                endpoint(v4(127, 1, third_octet, 2), None, Some(zone), &slice_ports),
                terminating,
            ],
        ),
    ));
}

fn db(objects: &mut ClusterObjects, slice_name: &str, endpoints: &[(&str, IpAddr)]) {
    let ports = vec![port("postgres", 5432, Protocol::Tcp)];
    let slice_ports: Arc<[Port]> = ports.clone().into();
    objects.services.push((key("db"), service(true, ports)));
    objects.exports.push((key("db"), Export { created: 0, ..Export::default() }));
    objects.slices.push((
        key(slice_name),
        slice("db", endpoints.iter().map(|(h, a)| endpoint(*a, Some(h), None, &slice_ports)).collect()),
    ));
}

/// The quickstart fleet (examples/quickstart), plus a few things it lacks: an IPv6
/// dnsClientCIDR, a CIDR two clusters claim, a UDP SRV port, an exported ExternalName service,
/// and `big`, whose A, AAAA and SRV answers need EDNS or truncation.
fn snapshot() -> Snapshot {
    let now = Instant::now();
    let mut registry = Registry::new();
    let mut eu1 = member("eu-1", "eu-1a", "eu", "n1", &["127.0.1.0/24", "127.0.9.0/24"]);
    eu1.pod_cidrs = vec![net("10.1.0.0/16")];
    let eu2 = member("eu-2", "eu-2a", "eu", "n1", &["127.0.2.0/24", "fd00:2::/64"]);
    let mut us1 = member("us-1", "us-1a", "us", "n2", &["127.0.3.0/24", "127.0.9.0/24"]);
    us1.gateway = Some(Gateway {
        address: v4(127, 0, 3, 100),
        port: 15443,
    });
    let mut index = Index::new();

    // eu-1: payments, db (headless, two hostnames), big (many endpoints, dual-stack slices).
    let mut objects = ClusterObjects::default();
    payments(&mut objects, 1_767_225_600, 1, "eu-1a");
    db(&mut objects, "db-x1", &[("db-0", v4(127, 1, 1, 11)), ("db-1", v4(127, 1, 1, 12))]);
    let big_ports = vec![port("http", 80, Protocol::Tcp), port("dns", 53, Protocol::Udp)];
    let big_slice_ports: Arc<[Port]> = big_ports.clone().into();
    objects.services.push((key("big"), service(false, big_ports)));
    objects.exports.push((key("big"), Export { created: 5, ..Export::default() }));
    objects.slices.push((
        key("big-v4"),
        slice("big", (1..=40).map(|i| endpoint(v4(127, 1, 4, i), None, None, &big_slice_ports)).collect()),
    ));
    objects.slices.push((
        key("big-v6"),
        slice(
            "big",
            (1..=40u16).map(|i| endpoint(v6(0xfd00, 1, 4, i), None, None, &big_slice_ports)).collect(),
        ),
    ));
    // huge: 5,000 endpoints, so an A answer over TCP passes 65,535 bytes and is truncated at
    // a whole record (issue 43: it kept part of one after the records it counted).
    let huge_ports: Arc<[Port]> = vec![port("http", 80, Protocol::Tcp)].into();
    objects.services.push((key("huge"), service(false, vec![port("http", 80, Protocol::Tcp)])));
    objects.exports.push((key("huge"), Export { created: 6, ..Export::default() }));
    for s in 0..5u8 {
        objects.slices.push((
            key(&format!("huge-{s}")),
            slice(
                "huge",
                (0..1000u16)
                    .map(|i| endpoint(v4(127, 5 + s, (i >> 8) as u8, (i & 255) as u8), None, None, &huge_ports))
                    .collect(),
            ),
        ));
    }
    index.reset(&eu1.id, objects);

    // eu-2: payments, cart (dual-stack), and a ServiceImport of payments (ClusterSetIP).
    let mut objects = ClusterObjects::default();
    payments(&mut objects, 1_767_312_000, 2, "eu-2a");
    let cart_ports: Arc<[Port]> = vec![port("http", 8080, Protocol::Tcp)].into();
    objects.services.push((
        key("cart"),
        Service {
            cluster_ips: vec![v4(10, 96, 0, 20), v6(0xfd00, 0x96, 0, 20)],
            ..service(false, vec![port("http", 80, Protocol::Tcp)])
        },
    ));
    objects.exports.push((key("cart"), Export { created: 0, ..Export::default() }));
    objects
        .slices
        .push((key("cart-v4"), slice("cart", vec![endpoint(v4(127, 1, 2, 21), None, None, &cart_ports)])));
    objects.slices.push((
        key("cart-v6"),
        slice("cart", vec![endpoint(v6(0xfd00, 1, 2, 0x21), None, None, &cart_ports)]),
    ));
    objects.imports.push((
        key("payments"),
        Import {
            ips: vec![v4(10, 96, 200, 10)],
            headless: false,
        },
    ));
    index.reset(&eu2.id, objects);

    // us-1: payments, db (one hostname), a Service that is not exported, an ExternalName export.
    let mut objects = ClusterObjects::default();
    payments(&mut objects, 1_767_398_400, 3, "us-1a");
    db(&mut objects, "db-y1", &[("db-0", v4(127, 1, 3, 11))]);
    objects.services.push((key("internal"), service(false, vec![port("http", 80, Protocol::Tcp)])));
    objects.services.push((
        key("legacy"),
        Service {
            external_name: true,
            ..service(false, Vec::new())
        },
    ));
    objects.exports.push((key("legacy"), Export { created: 0, ..Export::default() }));
    index.reset(&us1.id, objects);

    for spec in [eu1, eu2, us1] {
        let id: ClusterId = spec.id.clone();
        registry.upsert(spec, now);
        registry.heartbeat_ok(&id, now);
    }
    let mut snap = Snapshot::build(1, &index, &registry, &Policies::default());
    // Geo ranges for clients outside the fleet, so the cache key is fuzzed with geo places.
    let mut geo = GeoBuilder::default();
    let locality = |region: &str, zone: Option<&str>| Locality {
        region: Some(region.into()),
        zone: zone.map(str::to_string),
    };
    geo.add(net("203.0.113.0/24"), &locality("us", None), 0);
    geo.add(net("198.51.100.0/24"), &locality("eu", Some("eu-1a")), 1);
    // Nothing that holds 127.0.0.1 or the tied 127.0.9.0/24: those stay unknown clients.
    let (geo, conflicts) = geo.finish();
    assert!(conflicts.is_empty());
    snap.geo = Arc::new(geo);
    assert!(snap.synced);
    assert_eq!(snap.service_count(), 5, "payments, db, big, huge, cart");
    snap
}

fn fixture() -> Fixture {
    let (tx, rx) = watch::channel(Arc::new(snapshot()));
    let cfg = DnsConfig {
        // As examples/quickstart/meridian.yaml: listen 127.0.0.1, allowTransfer 127.0.0.0/8.
        allow_transfer: vec![net("127.0.0.0/8")],
        ns_address: Some(v4(127, 0, 0, 1)),
        ..DnsConfig::default()
    };
    let mut metrics = prometheus_client::registry::Registry::default();
    let dns = Dns::new(cfg, 1_000, rx, &mut metrics);
    Fixture { dns, _snapshots: tx }
}

