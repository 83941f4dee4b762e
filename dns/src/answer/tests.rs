//! Table-driven tests of the answer function, one case per DESIGN §4 rule, over a small
//! fleet built through meridian-core's public API (no sockets).

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Instant;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::opt::{ClientSubnet, EdnsOption};
use hickory_proto::rr::{Name, RecordType};
use hickory_server::net::xfer::Protocol;
use hickory_server::server::Request;
use meridian_core::{
    ClusterObjects, ClusterSpec, Endpoint, Export, Gateway, Import, Index, ObjectKey, Port,
    Protocol as P, Registry, Service, Slice, Snapshot,
};

use super::*;
use crate::config::{DnsConfig, Style, ZoneConfig};

fn ep(ip: &str, host: Option<&str>, ready: bool, terminating: bool) -> Endpoint {
    Endpoint {
        addresses: vec![ip.parse().unwrap()],
        hostname: host.map(str::to_string),
        ready,
        serving: ready,
        terminating,
        zone: None,
        ports: Arc::from(vec![port("http", 8080)]),
    }
}

fn port(name: &str, n: u16) -> Port {
    Port {
        name: Some(name.into()),
        port: n,
        protocol: P::Tcp,
        app_protocol: None,
    }
}

fn service(headless: bool) -> Service {
    Service {
        headless,
        external_name: false,
        publish_not_ready: false,
        ports: vec![port("http", 80)],
        cluster_ips: vec![],
    }
}

fn cluster(name: &str, region: &str, cidr: &str, network: &str) -> ClusterSpec {
    let mut spec = ClusterSpec::named(name);
    spec.locality.region = Some(region.into());
    spec.locality.zone = Some(format!("{name}a"));
    spec.dns_client_cidrs = vec![cidr.parse().unwrap()];
    spec.network = Some(network.into());
    spec
}

/// eu-1, eu-2 (region eu, network n1), us-1 (region us, network n2, gateway).
/// shop/web: all three. shop/db: headless in eu-1. shop/empty: exported, nothing ready.
/// eu-2 imports shop/web with ClusterSetIP 10.96.0.10.
fn fleet() -> Snapshot {
    let now = Instant::now();
    let mut registry = Registry::new();
    let mut us = cluster("us-1", "us", "10.3.0.0/16", "n2");
    us.gateway = Some(Gateway {
        address: "192.0.2.100".parse().unwrap(),
        port: 15443,
    });
    for spec in [
        cluster("eu-1", "eu", "10.1.0.0/16", "n1"),
        cluster("eu-2", "eu", "10.2.0.0/16", "n1"),
        us,
    ] {
        let id = spec.id.clone();
        registry.upsert(spec, now);
        registry.heartbeat_ok(&id, now);
    }
    let web = ObjectKey::new("shop", "web");
    let mut index = Index::new();
    for (name, octet) in [("eu-1", 1), ("eu-2", 2), ("us-1", 3)] {
        let mut objects = ClusterObjects::default();
        objects.services.push((web.clone(), service(false)));
        objects.exports.push((
            web.clone(),
            Export {
                created: octet,
                ..Export::default()
            },
        ));
        objects.slices.push((
            ObjectKey::new("shop", format!("web-{octet}")),
            Slice {
                service: Arc::from("web"),
                endpoints: vec![
                    ep(&format!("10.{octet}.0.1"), None, true, false),
                    ep(&format!("10.{octet}.0.2"), None, true, false),
                    ep(&format!("10.{octet}.0.3"), None, false, false),
                    ep(&format!("10.{octet}.0.4"), None, true, true),
                ],
            },
        ));
        if name == "eu-1" {
            let db = ObjectKey::new("shop", "db");
            objects.services.push((db.clone(), service(true)));
            objects.exports.push((
                db.clone(),
                Export {
                    created: 0,
                    ..Export::default()
                },
            ));
            objects.slices.push((
                ObjectKey::new("shop", "db-x"),
                Slice {
                    service: Arc::from("db"),
                    endpoints: vec![
                        ep("10.1.1.1", Some("db-0"), true, false),
                        ep("fd00::1", Some("db-6"), true, false),
                    ],
                },
            ));
            let empty = ObjectKey::new("shop", "empty");
            objects.services.push((empty.clone(), service(true)));
            objects.exports.push((
                empty.clone(),
                Export {
                    created: 0,
                    ..Export::default()
                },
            ));
        }
        if name == "eu-2" {
            objects.imports.push((
                web.clone(),
                Import {
                    ips: vec!["10.96.0.10".parse().unwrap()],
                    headless: false,
                },
            ));
        }
        index.reset(&meridian_core::ClusterId::new(name), objects);
    }
    Snapshot::build(7, &index, &registry, &meridian_core::Policies::default())
}

fn answerer(max_answers: u32) -> Answerer {
    let cfg = DnsConfig {
        zones: vec![
            ZoneConfig::new("global.", Style::Global, None).unwrap(),
            ZoneConfig::new("clusterset.local.", Style::Clusterset, None).unwrap(),
            ZoneConfig::new("g.svc.cluster.local.", Style::Global, Some("shop".into())).unwrap(),
        ],
        max_answers,
        allow_transfer: vec!["10.9.0.0/16".parse().unwrap()],
        ns_address: Some("127.0.0.1".parse().unwrap()),
        ..DnsConfig::default()
    };
    Answerer::new(cfg, 1000)
}

fn request(name: &str, qtype: RecordType, edns: Option<Edns>, op: OpCode) -> Request {
    let mut m = Message::new(42, MessageType::Query, op);
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    if let Some(e) = edns {
        m.set_edns(e);
    }
    Request::from_bytes(
        m.to_vec().unwrap(),
        (Ipv4Addr::LOCALHOST, 5353).into(),
        Protocol::Udp,
    )
    .unwrap()
}

struct Case {
    name: &'static str,
    qtype: RecordType,
    from: &'static str,
    rcode: ResponseCode,
    /// rdata of the answer section, sorted.
    answers: &'static [&'static str],
    /// A negative answer carries the SOA.
    soa: bool,
}

const EU1: &str = "10.1.9.9";
const EU2: &str = "10.2.9.9";
const US1: &str = "10.3.9.9";
const ANYONE: &str = "192.0.2.1";

fn case(
    name: &'static str,
    qtype: RecordType,
    from: &'static str,
    rcode: ResponseCode,
    answers: &'static [&'static str],
) -> Case {
    Case {
        name,
        qtype,
        from,
        rcode,
        answers,
        soa: answers.is_empty() && matches!(rcode, ResponseCode::NoError | ResponseCode::NXDomain),
    }
}

fn run(answerer: &Answerer, snap: &Snapshot, c: &Case) -> Response {
    let req = request(c.name, c.qtype, None, OpCode::Query);
    answerer.respond(
        snap,
        &req,
        c.from.parse().unwrap(),
        Transport::Tcp,
        0,
        Instant::now(),
    )
}

#[test]
fn every_name_form() {
    use RecordType::*;
    use ResponseCode::*;
    let snap = fleet();
    let a = answerer(0);
    let cases = [
        // <svc>.<ns>.global: first tier for the client's cluster; ready, non-terminating only.
        case(
            "web.shop.global.",
            A,
            EU1,
            NoError,
            &["10.1.0.1", "10.1.0.2"],
        ),
        case(
            "web.shop.global.",
            A,
            US1,
            NoError,
            &["10.3.0.1", "10.3.0.2"],
        ),
        case(
            "web.shop.global.",
            A,
            ANYONE,
            NoError,
            &[
                "10.1.0.1", "10.1.0.2", "10.2.0.1", "10.2.0.2", "10.3.0.1", "10.3.0.2",
            ],
        ),
        case(
            "WEB.Shop.GLOBAL.",
            A,
            EU2,
            NoError,
            &["10.2.0.1", "10.2.0.2"],
        ),
        case("web.shop.global.", AAAA, EU1, NoError, &[]),
        case("web.shop.global.", TXT, EU1, NoError, &[]),
        // <cluster>.<svc>.<ns>.global: that cluster only; another network gets the gateway.
        case(
            "eu-2.web.shop.global.",
            A,
            EU1,
            NoError,
            &["10.2.0.1", "10.2.0.2"],
        ),
        case("us-1.web.shop.global.", A, EU1, NoError, &["192.0.2.100"]),
        case(
            "us-1.web.shop.global.",
            A,
            ANYONE,
            NoError,
            &["10.3.0.1", "10.3.0.2"],
        ),
        case("mars.web.shop.global.", A, EU1, NXDomain, &[]),
        // <hostname>.<cluster>.<svc>.<ns>.global and a-b-c-d names.
        case(
            "db-0.eu-1.db.shop.global.",
            A,
            ANYONE,
            NoError,
            &["10.1.1.1"],
        ),
        case(
            "db-6.eu-1.db.shop.global.",
            AAAA,
            ANYONE,
            NoError,
            &["fd00::1"],
        ),
        case("db-6.eu-1.db.shop.global.", A, ANYONE, NoError, &[]),
        case("db-9.eu-1.db.shop.global.", A, ANYONE, NXDomain, &[]),
        case(
            "10-1-0-1.eu-1.web.shop.global.",
            A,
            ANYONE,
            NoError,
            &["10.1.0.1"],
        ),
        case("10-1-0-3.eu-1.web.shop.global.", A, ANYONE, NXDomain, &[]),
        // SRV over all tiers: priority = tier, gateway for another network.
        case(
            "_http._tcp.web.shop.global.",
            SRV,
            EU1,
            NoError,
            &[
                "0 100 8080 10-1-0-1.eu-1.web.shop.global.",
                "0 100 8080 10-1-0-2.eu-1.web.shop.global.",
                "1 100 8080 10-2-0-1.eu-2.web.shop.global.",
                "1 100 8080 10-2-0-2.eu-2.web.shop.global.",
                "2 200 15443 us-1.web.shop.global.",
            ],
        ),
        case("_http._udp.web.shop.global.", SRV, EU1, NXDomain, &[]),
        case("_grpc._tcp.web.shop.global.", SRV, EU1, NXDomain, &[]),
        case("_http._tcp.web.shop.global.", A, EU1, NoError, &[]),
        // Empty non-terminals are NODATA; absent names NXDOMAIN.
        case("shop.global.", A, EU1, NoError, &[]),
        case("_tcp.web.shop.global.", A, EU1, NoError, &[]),
        case("nope.shop.global.", A, EU1, NXDomain, &[]),
        case("web.nope.global.", A, EU1, NXDomain, &[]),
        case("a.b.c.d.e.global.", A, EU1, NXDomain, &[]),
        // Exported with nothing ready: NODATA (global), NXDOMAIN for headless (clusterset).
        case("empty.shop.global.", A, EU1, NoError, &[]),
        case("empty.shop.svc.clusterset.local.", A, EU1, NXDomain, &[]),
        // Apex.
        case("global.", NS, EU1, NoError, &["ns.global."]),
        case("ns.global.", A, EU1, NoError, &["127.0.0.1"]),
        // clusterset: the ClusterSetIP of the client's cluster, else endpoints.
        case(
            "web.shop.svc.clusterset.local.",
            A,
            EU2,
            NoError,
            &["10.96.0.10"],
        ),
        case(
            "web.shop.svc.clusterset.local.",
            A,
            EU1,
            NoError,
            &["10.1.0.1", "10.1.0.2"],
        ),
        case("eu-1.web.shop.svc.clusterset.local.", A, EU1, NXDomain, &[]),
        case(
            "db.shop.svc.clusterset.local.",
            A,
            ANYONE,
            NoError,
            &["10.1.1.1"],
        ),
        case(
            "eu-1.db.shop.svc.clusterset.local.",
            A,
            ANYONE,
            NoError,
            &[],
        ),
        case(
            "db-0.eu-1.db.shop.svc.clusterset.local.",
            A,
            ANYONE,
            NoError,
            &["10.1.1.1"],
        ),
        case(
            "_http._tcp.web.shop.svc.clusterset.local.",
            SRV,
            EU2,
            NoError,
            &["0 100 80 web.shop.svc.clusterset.local."],
        ),
        case(
            "dns-version.clusterset.local.",
            TXT,
            ANYONE,
            NoError,
            &["1.0.0"],
        ),
        case("svc.clusterset.local.", A, ANYONE, NoError, &[]),
        case("shop.svc.clusterset.local.", A, ANYONE, NoError, &[]),
        case("web.shop.pod.clusterset.local.", A, ANYONE, NXDomain, &[]),
        // A zone with a fixed namespace.
        case(
            "web.g.svc.cluster.local.",
            A,
            EU1,
            NoError,
            &["10.1.0.1", "10.1.0.2"],
        ),
        // Outside our zones.
        case("example.com.", A, EU1, Refused, &[]),
    ];
    for c in &cases {
        let resp = run(&a, &snap, c);
        let mut got: Vec<String> = resp
            .answers
            .iter()
            .map(|r| r.data.to_string().trim_matches('"').to_string())
            .collect();
        got.sort();
        let mut want: Vec<String> = c.answers.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(
            resp.metadata.response_code, c.rcode,
            "{} {} from {}",
            c.name, c.qtype, c.from
        );
        assert_eq!(got, want, "{} {} from {}", c.name, c.qtype, c.from);
        let has_soa = resp.authorities.iter().any(|r| r.record_type() == SOA);
        assert_eq!(has_soa, c.soa, "{} {}: SOA in authority", c.name, c.qtype);
        if c.rcode != Refused {
            assert!(resp.metadata.authoritative, "{}: AA", c.name);
        }
        assert!(!resp.metadata.recursion_available, "{}: RA", c.name);
    }
}

#[test]
fn srv_targets_resolve() {
    let snap = fleet();
    let a = answerer(0);
    for from in [EU1, US1, ANYONE] {
        let resp = run(
            &a,
            &snap,
            &case(
                "_http._tcp.web.shop.global.",
                RecordType::SRV,
                from,
                ResponseCode::NoError,
                &[],
            ),
        );
        assert!(!resp.answers.is_empty());
        for srv in &resp.answers {
            let hickory_proto::rr::RData::SRV(srv) = &srv.data else {
                panic!("not SRV")
            };
            let target = srv.target.to_string();
            let name: &'static str = Box::leak(target.into_boxed_str());
            let r = run(
                &a,
                &snap,
                &case(name, RecordType::A, from, ResponseCode::NoError, &[]),
            );
            assert_eq!(r.answers.len(), 1, "{name} from {from}");
            let in_additional = resp
                .additionals
                .iter()
                .any(|x| x.name.to_string() == name && x.data == r.answers[0].data);
            assert!(in_additional, "{name}: address in the additional section");
        }
    }
}

#[test]
fn soa_minimum_is_the_ttl_and_serial_follows_the_snapshot() {
    let snap = fleet();
    let a = answerer(0);
    let resp = run(
        &a,
        &snap,
        &case("global.", RecordType::SOA, EU1, ResponseCode::NoError, &[]),
    );
    let hickory_proto::rr::RData::SOA(soa) = &resp.answers[0].data else {
        panic!("not SOA")
    };
    assert_eq!(soa.minimum, 5);
    assert_eq!(soa.serial, 1007);
}

#[test]
fn max_answers_caps_and_rotation_changes_the_order() {
    let snap = fleet();
    let capped = answerer(1);
    let req = request("web.shop.global.", RecordType::A, None, OpCode::Query);
    let src: IpAddr = ANYONE.parse().unwrap();
    let resp = capped.respond(&snap, &req, src, Transport::Udp, 0, Instant::now());
    assert_eq!(resp.answers.len(), 1);
    let a = answerer(0);
    let r0 = a.respond(&snap, &req, src, Transport::Udp, 0, Instant::now());
    assert_eq!(r0.rotations, 6);
    // Weights are ready endpoints here: over a full cycle every address comes first once.
    let firsts: HashSet<String> = (0..6)
        .map(|r| {
            let resp = a.respond(&snap, &req, src, Transport::Udp, r, Instant::now());
            assert_eq!(resp.answers.len(), 6);
            resp.answers[0].data.to_string()
        })
        .collect();
    assert_eq!(firsts.len(), 6, "{firsts:?}");
}

#[test]
fn rotations_start_at_clusters_in_proportion_to_their_weights() {
    let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
    let groups = vec![
        (70, vec![ip("10.1.0.1"), ip("10.1.0.2")]),
        (15, vec![ip("10.2.0.1")]),
        (15, vec![ip("10.3.0.1")]),
    ];
    let firsts: Vec<IpAddr> = (0..16)
        .map(|r| weighted_rotation(&groups, r, 16)[0])
        .collect();
    let count = |prefix: &str| {
        firsts
            .iter()
            .filter(|a| a.to_string().starts_with(prefix))
            .count()
    };
    // 16 × 70 % = 11.2 and 16 × 15 % = 2.4: each within one of its share.
    for (prefix, share) in [("10.1.", 11.2), ("10.2.", 2.4), ("10.3.", 2.4)] {
        assert!(
            (count(prefix) as f64 - share).abs() < 1.0,
            "{prefix}: {firsts:?}"
        );
    }
    // The heavy cluster's two addresses take turns.
    let first = firsts.iter().filter(|a| **a == ip("10.1.0.1")).count();
    assert!(first.abs_diff(count("10.1.") - first) <= 1, "{firsts:?}");
    // Every rotation still holds every address.
    assert!((0..16).all(|r| weighted_rotation(&groups, r, 16).len() == 4));
}

#[test]
fn any_is_answered_with_one_hinfo() {
    let snap = fleet();
    let a = answerer(0);
    let resp = run(
        &a,
        &snap,
        &case(
            "web.shop.global.",
            RecordType::ANY,
            EU1,
            ResponseCode::NoError,
            &[],
        ),
    );
    assert_eq!(resp.answers.len(), 1);
    assert_eq!(resp.answers[0].record_type(), RecordType::HINFO);
    let resp = run(
        &a,
        &snap,
        &case(
            "nope.shop.global.",
            RecordType::ANY,
            EU1,
            ResponseCode::NoError,
            &[],
        ),
    );
    assert_eq!(resp.metadata.response_code, ResponseCode::NXDomain);
}

#[test]
fn servfail_until_synced() {
    let a = answerer(0);
    let resp = run(
        &a,
        &Snapshot::empty(),
        &case(
            "web.shop.global.",
            RecordType::A,
            EU1,
            ResponseCode::NoError,
            &[],
        ),
    );
    assert_eq!(resp.metadata.response_code, ResponseCode::ServFail);
    let resp = run(
        &a,
        &Snapshot::empty(),
        &case(
            "example.com.",
            RecordType::A,
            EU1,
            ResponseCode::NoError,
            &[],
        ),
    );
    assert_eq!(resp.metadata.response_code, ResponseCode::Refused);
}

#[test]
fn edns_rules() {
    let snap = fleet();
    let a = answerer(0);
    let src: IpAddr = ANYONE.parse().unwrap();
    let mut v1 = Edns::new();
    v1.set_version(1);
    let resp = a.respond(
        &snap,
        &request("web.shop.global.", RecordType::A, Some(v1), OpCode::Query),
        src,
        Transport::Udp,
        0,
        Instant::now(),
    );
    assert_eq!(resp.metadata.response_code, ResponseCode::BADVERS);
    assert_eq!(resp.edns.as_ref().unwrap().version(), 0);
    // ECS overrides the source address, and the reply echoes the scope.
    let mut ecs = Edns::new();
    ecs.options_mut()
        .insert(EdnsOption::Subnet(ClientSubnet::new(
            "10.3.7.0".parse().unwrap(),
            24,
            0,
        )));
    let req = request("web.shop.global.", RecordType::A, Some(ecs), OpCode::Query);
    let resp = a.respond(&snap, &req, src, Transport::Udp, 0, Instant::now());
    let mut got: Vec<String> = resp.answers.iter().map(|r| r.data.to_string()).collect();
    got.sort();
    assert_eq!(got, ["10.3.0.1", "10.3.0.2"]);
    assert!(!resp.cacheable);
    match resp
        .edns
        .as_ref()
        .unwrap()
        .option(hickory_proto::rr::rdata::opt::EdnsCode::Subnet)
    {
        Some(EdnsOption::Subnet(cs)) => {
            assert_eq!((cs.source_prefix(), cs.scope_prefix()), (24, 24))
        }
        other => panic!("ECS not echoed: {other:?}"),
    }
}

#[test]
fn opcodes_other_than_query_are_not_implemented() {
    let snap = fleet();
    let a = answerer(0);
    for op in [OpCode::Update, OpCode::Notify, OpCode::Status] {
        let req = request("web.shop.global.", RecordType::A, None, op);
        let resp = a.respond(
            &snap,
            &req,
            ANYONE.parse().unwrap(),
            Transport::Udp,
            0,
            Instant::now(),
        );
        assert_eq!(resp.metadata.response_code, ResponseCode::NotImp, "{op:?}");
    }
}

#[test]
fn axfr_only_over_tcp_to_allowed_clients() {
    let snap = fleet();
    let a = answerer(0);
    let req = request("global.", RecordType::AXFR, None, OpCode::Query);
    let now = Instant::now();
    let refused = a.respond(&snap, &req, ANYONE.parse().unwrap(), Transport::Tcp, 0, now);
    assert_eq!(refused.metadata.response_code, ResponseCode::Refused);
    let udp = a.respond(
        &snap,
        &req,
        "10.9.0.1".parse().unwrap(),
        Transport::Udp,
        0,
        now,
    );
    assert_eq!(udp.metadata.response_code, ResponseCode::NotImp);
    let ok = a.respond(
        &snap,
        &req,
        "10.9.0.1".parse().unwrap(),
        Transport::Tcp,
        0,
        now,
    );
    assert_eq!(ok.metadata.response_code, ResponseCode::NoError);
    let all: Vec<_> = ok
        .answers
        .iter()
        .chain(ok.continuation.iter().flatten())
        .collect();
    assert_eq!(all.first().unwrap().record_type(), RecordType::SOA);
    assert_eq!(all.last().unwrap().record_type(), RecordType::SOA);
    let names: Vec<String> = all.iter().map(|r| r.name.to_string()).collect();
    assert!(names.contains(&"web.shop.global.".to_string()));
    assert!(names.contains(&"db-0.eu-1.db.shop.global.".to_string()));
    assert!(names.contains(&"_http._tcp.web.shop.global.".to_string()));
}

#[test]
fn withdrawn_clusters_leave_every_answer() {
    let now = Instant::now();
    let mut registry = Registry::new();
    let mut index = Index::new();
    let key = ObjectKey::new("shop", "web");
    for (name, octet) in [("a", 1u8), ("b", 2)] {
        let mut spec = ClusterSpec::named(name);
        spec.health.unreachable_after_seconds = 1;
        spec.health.withdraw_after_seconds = 1;
        registry.upsert(spec, now);
        registry.heartbeat_ok(&meridian_core::ClusterId::new(name), now);
        let mut o = ClusterObjects::default();
        o.services.push((key.clone(), service(false)));
        o.exports.push((
            key.clone(),
            Export {
                created: 0,
                ..Export::default()
            },
        ));
        o.slices.push((
            ObjectKey::new("shop", name),
            Slice {
                service: Arc::from("web"),
                endpoints: vec![ep(&format!("10.0.0.{octet}"), None, true, false)],
            },
        ));
        index.reset(&meridian_core::ClusterId::new(name), o);
    }
    let b = meridian_core::ClusterId::new("b");
    registry.heartbeat_failed(&b, now, "gone");
    registry.tick(now + std::time::Duration::from_secs(1));
    let snap = Snapshot::build(2, &index, &registry, &meridian_core::Policies::default());
    let a = answerer(0);
    let c = case(
        "web.shop.global.",
        RecordType::A,
        ANYONE,
        ResponseCode::NoError,
        &[],
    );
    assert_eq!(
        run(&a, &snap, &c).answers.len(),
        2,
        "unreachable but not yet withdrawn: still served"
    );
    registry.tick(now + std::time::Duration::from_secs(2));
    let snap = Snapshot::build(3, &index, &registry, &meridian_core::Policies::default());
    let resp = run(&a, &snap, &c);
    assert_eq!(resp.answers.len(), 1);
    assert_eq!(resp.answers[0].data.to_string(), "10.0.0.1");
    let resp = run(
        &a,
        &snap,
        &case(
            "b.web.shop.global.",
            RecordType::A,
            ANYONE,
            ResponseCode::NoError,
            &[],
        ),
    );
    assert!(resp.answers.is_empty());
}

/// A request of `count` copies of one question, with the given opcode.
fn several_questions(op: OpCode, name: &str, qtype: RecordType, count: usize) -> Vec<u8> {
    let mut m = Message::new(9, MessageType::Query, op);
    for _ in 0..count {
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    }
    m.to_vec().unwrap()
}

/// Answers raw request bytes; returns the response and the reply as it would be sent.
fn answer_raw(raw: &[u8]) -> (Response, Message) {
    let req = Request::from_bytes(raw.to_vec(), (Ipv4Addr::LOCALHOST, 1).into(), Protocol::Udp)
        .expect("hickory parses the request");
    let resp = answerer(0).respond(
        &fleet(),
        &req,
        ANYONE.parse().unwrap(),
        Transport::Udp,
        0,
        Instant::now(),
    );
    let reply = Message::from_vec(&crate::wire::encode(&resp, &req.queries, 512)).unwrap();
    (resp, reply)
}

#[test]
fn malformed_questions_get_formerr_without_the_question() {
    let two = several_questions(OpCode::Query, "web.shop.global.", RecordType::A, 2);
    // A question whose name is a compression pointer into the header.
    let pointer = [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 0x02, 0, 1, 0, 1];
    for raw in [&two[..], &pointer[..]] {
        let (resp, reply) = answer_raw(raw);
        assert_eq!(resp.metadata.response_code, ResponseCode::FormErr);
        assert!(!resp.echo_question);
        assert!(reply.queries.is_empty());
    }
}

#[test]
fn an_update_with_several_zones_is_notimp_without_the_question() {
    let (resp, reply) = answer_raw(&several_questions(
        OpCode::Update,
        "global.",
        RecordType::SOA,
        3,
    ));
    assert_eq!(resp.metadata.response_code, ResponseCode::NotImp);
    assert!(reply.queries.is_empty());
}
