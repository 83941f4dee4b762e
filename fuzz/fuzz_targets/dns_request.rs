//! One UDP datagram in, the reply out, through both request paths of `meridian_dns::Dns`:
//! `handle_udp` (hot path + answer cache, asked twice so the second ask can hit the cache) and
//! `answer_bytes` (the full path without the cache), against a Snapshot shaped like
//! examples/quickstart.
//!
//! Every reply must echo the query ID, parse again, and fit the UDP size limit; the cached
//! path must give the uncached path's answer (byte for byte, except that rotation may reorder
//! a multi-record answer). Before the input itself, a "sibling" of it is sent from another
//! address of the same client cluster: same question, other ID, other letter case, other
//! header/EDNS bits the cache key ignores. Its cached reply is then what the input gets on a
//! hit, so a cache key that leaves out something the answer depends on fails on one input.
//!
//! The first input byte (also the high byte of the ID) picks the source address.

#![no_main]

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use hickory_proto::op::{Message, MessageType};
use ipnet::IpNet;
use libfuzzer_sys::fuzz_target;
use meridian_core::{
    ClusterId, ClusterObjects, ClusterSpec, Endpoint, Export, Gateway, Import, Index, Locality, ObjectKey, Port,
    Policies, Protocol, Registry, Service, Slice, Snapshot,
};
use meridian_dns::{Dns, DnsConfig};
use tokio::sync::watch;

struct Fixture {
    dns: Arc<Dns>,
    /// Kept so the watch channel stays open.
    _snapshots: watch::Sender<Arc<Snapshot>>,
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(fixture);

/// `MERIDIAN_FUZZ_PRINT=1` prints every reply (to look at what seeds or a crash get back).
static PRINT: LazyLock<bool> = LazyLock::new(|| std::env::var_os("MERIDIAN_FUZZ_PRINT").is_some());

const fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

const fn v6(a: u16, b: u16, c: u16, h: u16) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(a, b, c, 0, 0, 0, 0, h))
}

/// (source, another address of the same client cluster — or of no cluster, like the source).
const SOURCES: [(IpAddr, IpAddr); 8] = [
    (v4(127, 0, 1, 1), v4(127, 0, 1, 200)),       // eu-1
    (v4(127, 0, 2, 1), v4(127, 0, 2, 99)),        // eu-2
    (v4(127, 0, 3, 1), v4(127, 0, 3, 7)),         // us-1 (network n2, behind a gateway)
    (v4(127, 0, 0, 1), v4(127, 0, 0, 2)),         // no cluster
    (v4(10, 9, 8, 7), v4(192, 0, 2, 1)),          // no cluster
    (v6(0, 0, 0, 1), v6(0x2001, 0xdb8, 0, 1)),    // no cluster, IPv6
    (v6(0xfd00, 2, 0, 5), v6(0xfd00, 2, 0, 6)),   // eu-2 by its IPv6 dnsClientCIDR
    (v4(127, 0, 9, 1), v4(127, 0, 9, 2)),         // claimed by eu-1 and us-1 alike: a tie, no cluster
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
    let snap = Snapshot::build(1, &index, &registry, &Policies::default());
    assert!(snap.synced);
    assert_eq!(snap.service_count(), 4, "payments, db, big, cart");
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

/// The UDP size limit a reply to `raw` must fit: 512 without EDNS, else the client's payload
/// clamped to 512..=1232.
fn request_limit(raw: &[u8]) -> usize {
    match Message::from_vec(raw) {
        Ok(m) => m.edns.map_or(512, |e| usize::from(e.max_payload().clamp(512, 1232))),
        Err(_) => 512,
    }
}

/// Checks one reply and returns it parsed.
fn check_reply(what: &str, raw: &[u8], reply: &[u8]) -> Message {
    assert!(reply.len() >= 12, "{what}: reply shorter than a header: {reply:02x?}");
    if raw.len() >= 2 {
        assert_eq!(reply[..2], raw[..2], "{what}: reply ID differs from the query's");
    }
    let limit = request_limit(raw);
    assert!(
        reply.len() <= limit,
        "{what}: reply of {} bytes exceeds the UDP limit of {limit}: {reply:02x?}",
        reply.len()
    );
    let msg = match Message::from_vec(reply) {
        Ok(m) => m,
        Err(e) => panic!("{what}: reply does not parse: {e}: {reply:02x?}"),
    };
    assert_eq!(msg.metadata.message_type, MessageType::Response, "{what}: reply is not a response");
    msg
}

/// Records of a section, order-free.
fn record_set(records: &[hickory_proto::rr::Record]) -> Vec<String> {
    let mut out: Vec<String> = records.iter().map(|r| format!("{r:?}")).collect();
    out.sort();
    out
}

/// `handle_udp`'s reply must be `answer_bytes`' one: the same bytes, or, where a section holds
/// several records, the same header, question, EDNS and records in another order. Rotation
/// reorders A/AAAA answers, and the A/AAAA additionals of a clusterset SRV answer; the cache
/// rotates per question, and `handle_udp`'s uncached path (not a plain query: ECS, trailing
/// bytes, compression...) by a global counter, while `answer_bytes` always uses rotation 0.
fn assert_same_answer(what: &str, cached: &[u8], cached_msg: &Message, uncached: &[u8]) {
    if cached == uncached {
        return;
    }
    let uncached_msg = Message::from_vec(uncached).expect("uncached reply parses (checked before)");
    let several = |m: &Message| [&m.answers, &m.authorities, &m.additionals].iter().any(|s| s.len() > 1);
    let same = several(cached_msg)
        && cached_msg.metadata == uncached_msg.metadata
        && cached_msg.queries == uncached_msg.queries
        && cached_msg.edns == uncached_msg.edns
        && record_set(&cached_msg.answers) == record_set(&uncached_msg.answers)
        && record_set(&cached_msg.authorities) == record_set(&uncached_msg.authorities)
        && record_set(&cached_msg.additionals) == record_set(&uncached_msg.additionals);
    assert!(
        same,
        "{what}: handle_udp and answer_bytes disagree\n handle_udp:   {cached:02x?}\n answer_bytes: {uncached:02x?}\n{cached_msg:#?}\n{uncached_msg:#?}"
    );
}

/// The question name's end, walking labels like the hot path (no compression).
fn name_end(raw: &[u8]) -> Option<usize> {
    let mut pos = 12;
    loop {
        let len = usize::from(*raw.get(pos)?);
        if len == 0 {
            return Some(pos + 1);
        }
        if len > 63 || pos + 1 + len > raw.len() {
            return None;
        }
        pos += 1 + len;
    }
}

/// The same question as `raw` with everything the cache key ignores changed: the ID, the
/// letter case of the name, AA/TC, Z/AD/RA and the request's RCODE bits, and in an OPT record
/// right after a single question, the extended RCODE and the DO/Z flags.
fn sibling(raw: &[u8]) -> Option<Vec<u8>> {
    if raw.len() < 12 {
        return None;
    }
    let mut s = raw.to_vec();
    s[0] ^= 0xA5;
    s[1] ^= 0x5A;
    s[2] ^= 0x06;
    s[3] ^= 0xEF;
    if let Some(end) = name_end(raw) {
        for b in &mut s[12..end] {
            if b.is_ascii_alphabetic() {
                *b ^= 0x20;
            }
        }
        // Label lengths may be letters too (0x41..): undo those.
        let mut pos = 12;
        while pos < end {
            let len = usize::from(raw[pos]);
            s[pos] = raw[pos];
            pos += 1 + len;
        }
        let opt = end + 4;
        if raw[10..12] == [0, 1] && raw.len() >= opt + 11 && raw[opt] == 0 && raw[opt + 1..opt + 3] == [0, 41] {
            s[opt + 5] ^= 0x3C;
            s[opt + 7] ^= 0x80;
            s[opt + 8] ^= 0x01;
        }
    }
    Some(s)
}

fuzz_target!(|data: &[u8]| {
    let fx = &*FIXTURE;
    let sel = usize::from(data.first().copied().unwrap_or(0));
    let (src_ip, twin_ip) = SOURCES[sel % SOURCES.len()];
    let src = SocketAddr::new(src_ip, 5353);

    let uncached = fx.dns.answer_bytes(data, src_ip);
    if let Some(reply) = &uncached {
        let msg = check_reply("answer_bytes", data, reply);
        if *PRINT {
            eprintln!("source {src_ip}, {} bytes:\n{msg}", reply.len());
        }
    } else if *PRINT {
        eprintln!("source {src_ip}: no reply");
    }

    // The same question from another client of the same cluster primes the cache.
    if let Some(sib) = sibling(data) {
        let mut out = vec![0xEE; 7];
        if fx.dns.handle_udp(&sib, SocketAddr::new(twin_ip, 40000), &mut out) {
            check_reply("handle_udp(sibling)", &sib, &out);
        }
    }

    // Asked twice: a miss that fills the cache (unless the sibling did), then a hit.
    let mut out = vec![0xEE; 600];
    for round in ["handle_udp(first)", "handle_udp(second)"] {
        let sent = fx.dns.handle_udp(data, src, &mut out);
        assert_eq!(sent, uncached.is_some(), "{round}: handle_udp and answer_bytes disagree on replying");
        if let Some(uncached) = &uncached {
            let msg = check_reply(round, data, &out);
            assert_same_answer(round, &out, &msg, uncached);
        }
    }
});
