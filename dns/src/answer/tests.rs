//! Table-driven tests of the answer function, one case per answer rule, over a small
//! fleet built through meridian-core's public API (no sockets).

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::opt::{ClientSubnet, EdnsOption};
use hickory_proto::rr::{Name, RecordType};
use hickory_server::net::xfer::Protocol;
use hickory_server::server::Request;
use meridian_core::testing::{FleetBuilder, cluster, http_ep, ip, on_network, svc, with_gateway};
use meridian_core::{ClusterId, ClusterSpec, Endpoint, Import, Object, ObjectKey, Snapshot};

use super::*;
use crate::config::{DnsConfig, Style, ZoneConfig};

/// A member in `region` (zone `<name>a`) on `network`, whose DNS clients come from `cidr`.
fn member(name: &str, region: &str, cidr: &str, network: &str) -> ClusterSpec {
    ClusterSpec {
        dns_client_cidrs: vec![cidr.parse().unwrap()],
        ..on_network(cluster(name, region, &format!("{name}a")), network, false)
    }
}

/// `http_ep` with a hostname.
fn named(host: &str, address: &str) -> Endpoint {
    Endpoint {
        hostname: Some(host.into()),
        ..http_ep(address, true)
    }
}

/// eu-1, eu-2 (region eu, network n1), us-1 (region us, network n2, gateway).
/// shop/web: all three. shop/db: headless in eu-1. shop/empty: exported, nothing ready.
/// eu-2 imports shop/web with ClusterSetIP 10.96.0.10.
fn fleet() -> Snapshot {
    let mut fleet = FleetBuilder::new();
    fleet
        .member(member("eu-1", "eu", "10.1.0.0/16", "n1"))
        .member(member("eu-2", "eu", "10.2.0.0/16", "n1"))
        .member(with_gateway(
            member("us-1", "us", "10.3.0.0/16", "n2"),
            "192.0.2.100",
        ));
    for (name, octet) in [("eu-1", 1), ("eu-2", 2), ("us-1", 3)] {
        let at = |host: u8| format!("10.{octet}.0.{host}");
        fleet
            .export(name, "web", svc(false, &[("http", 80)]), octet)
            .slice(
                name,
                &format!("web-{octet}"),
                "web",
                vec![
                    http_ep(&at(1), true),
                    http_ep(&at(2), true),
                    http_ep(&at(3), false),
                    Endpoint {
                        terminating: true,
                        ..http_ep(&at(4), true)
                    },
                ],
            );
    }
    fleet
        .export("eu-1", "db", svc(true, &[("http", 80)]), 0)
        .slice(
            "eu-1",
            "db-x",
            "db",
            vec![named("db-0", "10.1.1.1"), named("db-6", "fd00::1")],
        )
        .export("eu-1", "empty", svc(true, &[("http", 80)]), 0)
        .apply(
            "eu-2",
            Object::Import(
                ObjectKey::new("shop", "web"),
                Import {
                    ips: vec![ip("10.96.0.10")],
                    headless: false,
                },
            ),
        );
    fleet.version = 7;
    fleet.snapshot()
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

/// One question of the table and the answer it must get.
struct Case {
    /// What the case shows; it opens every assertion message.
    name: &'static str,
    /// The name asked for.
    host: &'static str,
    qtype: RecordType,
    /// The client's source address.
    from: &'static str,
    rcode: ResponseCode,
    /// rdata of the answer section, in any order.
    answers: &'static [&'static str],
}

impl Default for Case {
    /// An A question from outside every member that must be answered NOERROR without records.
    fn default() -> Self {
        Self {
            name: "",
            host: "",
            qtype: RecordType::A,
            from: ANYONE,
            rcode: ResponseCode::NoError,
            answers: &[],
        }
    }
}

impl Case {
    /// A negative answer carries the SOA.
    fn soa(&self) -> bool {
        self.answers.is_empty()
            && matches!(self.rcode, ResponseCode::NoError | ResponseCode::NXDomain)
    }
}

const EU1: &str = "10.1.9.9";
const EU2: &str = "10.2.9.9";
const US1: &str = "10.3.9.9";
const ANYONE: &str = "192.0.2.1";

/// A question outside the table, for tests that look at the response themselves.
fn question(host: &'static str, qtype: RecordType, from: &'static str) -> Case {
    Case {
        name: host,
        host,
        qtype,
        from,
        ..Case::default()
    }
}

fn run(answerer: &Answerer, snap: &Snapshot, c: &Case) -> Response {
    let req = request(c.host, c.qtype, None, OpCode::Query);
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
        Case {
            name: "success: A from a member is its own cluster's ready, non-terminating endpoints",
            host: "web.shop.global.",
            qtype: A,
            from: EU1,
            answers: &["10.1.0.1", "10.1.0.2"],
            ..Case::default()
        },
        Case {
            name: "success: A from another member is that member's own endpoints",
            host: "web.shop.global.",
            qtype: A,
            from: US1,
            answers: &["10.3.0.1", "10.3.0.2"],
            ..Case::default()
        },
        Case {
            name: "success: A from outside every member is every cluster's ready endpoints",
            host: "web.shop.global.",
            qtype: A,
            from: ANYONE,
            answers: &[
                "10.1.0.1", "10.1.0.2", "10.2.0.1", "10.2.0.2", "10.3.0.1", "10.3.0.2",
            ],
            ..Case::default()
        },
        Case {
            name: "success: names match whatever their case",
            host: "WEB.Shop.GLOBAL.",
            qtype: A,
            from: EU2,
            answers: &["10.2.0.1", "10.2.0.2"],
            ..Case::default()
        },
        Case {
            name: "nodata: AAAA of a service with IPv4 endpoints only",
            host: "web.shop.global.",
            qtype: AAAA,
            from: EU1,
            ..Case::default()
        },
        Case {
            name: "nodata: TXT of a service",
            host: "web.shop.global.",
            qtype: TXT,
            from: EU1,
            ..Case::default()
        },
        // <cluster>.<svc>.<ns>.global: that cluster only; another network gets the gateway.
        Case {
            name: "success: <cluster>.<svc> on the client's network is that cluster's endpoints",
            host: "eu-2.web.shop.global.",
            qtype: A,
            from: EU1,
            answers: &["10.2.0.1", "10.2.0.2"],
            ..Case::default()
        },
        Case {
            name: "success: <cluster>.<svc> on another network is that cluster's gateway",
            host: "us-1.web.shop.global.",
            qtype: A,
            from: EU1,
            answers: &["192.0.2.100"],
            ..Case::default()
        },
        Case {
            name: "success: <cluster>.<svc> from outside every member is that cluster's endpoints",
            host: "us-1.web.shop.global.",
            qtype: A,
            from: ANYONE,
            answers: &["10.3.0.1", "10.3.0.2"],
            ..Case::default()
        },
        Case {
            name: "nxdomain: <cluster>.<svc> of no member",
            host: "mars.web.shop.global.",
            qtype: A,
            from: EU1,
            rcode: NXDomain,
            ..Case::default()
        },
        // <hostname>.<cluster>.<svc>.<ns>.global and a-b-c-d names.
        Case {
            name: "success: <hostname>.<cluster>.<svc> is that endpoint",
            host: "db-0.eu-1.db.shop.global.",
            qtype: A,
            from: ANYONE,
            answers: &["10.1.1.1"],
            ..Case::default()
        },
        Case {
            name: "success: AAAA of a hostname with an IPv6 address",
            host: "db-6.eu-1.db.shop.global.",
            qtype: AAAA,
            from: ANYONE,
            answers: &["fd00::1"],
            ..Case::default()
        },
        Case {
            name: "nodata: A of a hostname with an IPv6 address only",
            host: "db-6.eu-1.db.shop.global.",
            qtype: A,
            from: ANYONE,
            ..Case::default()
        },
        Case {
            name: "nxdomain: a hostname no endpoint has",
            host: "db-9.eu-1.db.shop.global.",
            qtype: A,
            from: ANYONE,
            rcode: NXDomain,
            ..Case::default()
        },
        Case {
            name: "success: an a-b-c-d name is that ready endpoint",
            host: "10-1-0-1.eu-1.web.shop.global.",
            qtype: A,
            from: ANYONE,
            answers: &["10.1.0.1"],
            ..Case::default()
        },
        Case {
            name: "nxdomain: an a-b-c-d name of a not ready endpoint",
            host: "10-1-0-3.eu-1.web.shop.global.",
            qtype: A,
            from: ANYONE,
            rcode: NXDomain,
            ..Case::default()
        },
        // SRV over all tiers: priority = tier, gateway for another network.
        Case {
            name: "success: SRV over every tier, priority = tier, another network via its gateway",
            host: "_http._tcp.web.shop.global.",
            qtype: SRV,
            from: EU1,
            answers: &[
                "0 100 8080 10-1-0-1.eu-1.web.shop.global.",
                "0 100 8080 10-1-0-2.eu-1.web.shop.global.",
                "1 100 8080 10-2-0-1.eu-2.web.shop.global.",
                "1 100 8080 10-2-0-2.eu-2.web.shop.global.",
                "2 200 15443 us-1.web.shop.global.",
            ],
            ..Case::default()
        },
        Case {
            name: "nxdomain: SRV for a protocol the port does not speak",
            host: "_http._udp.web.shop.global.",
            qtype: SRV,
            from: EU1,
            rcode: NXDomain,
            ..Case::default()
        },
        Case {
            name: "nxdomain: SRV for a port the service does not have",
            host: "_grpc._tcp.web.shop.global.",
            qtype: SRV,
            from: EU1,
            rcode: NXDomain,
            ..Case::default()
        },
        Case {
            name: "nodata: A of an SRV name",
            host: "_http._tcp.web.shop.global.",
            qtype: A,
            from: EU1,
            ..Case::default()
        },
        // Empty non-terminals are NODATA; absent names NXDOMAIN.
        Case {
            name: "nodata: a namespace is an empty non-terminal",
            host: "shop.global.",
            qtype: A,
            from: EU1,
            ..Case::default()
        },
        Case {
            name: "nodata: _<proto>.<svc> is an empty non-terminal",
            host: "_tcp.web.shop.global.",
            qtype: A,
            from: EU1,
            ..Case::default()
        },
        Case {
            name: "nxdomain: a service nobody exports",
            host: "nope.shop.global.",
            qtype: A,
            from: EU1,
            rcode: NXDomain,
            ..Case::default()
        },
        Case {
            name: "nxdomain: a namespace nobody exports from",
            host: "web.nope.global.",
            qtype: A,
            from: EU1,
            rcode: NXDomain,
            ..Case::default()
        },
        Case {
            name: "nxdomain: more labels than any name form has",
            host: "a.b.c.d.e.global.",
            qtype: A,
            from: EU1,
            rcode: NXDomain,
            ..Case::default()
        },
        // Exported with nothing ready: NODATA (global), NXDOMAIN for headless (clusterset).
        Case {
            name: "nodata: an export with nothing ready (global)",
            host: "empty.shop.global.",
            qtype: A,
            from: EU1,
            ..Case::default()
        },
        Case {
            name: "nxdomain: a headless export with nothing ready (clusterset)",
            host: "empty.shop.svc.clusterset.local.",
            qtype: A,
            from: EU1,
            rcode: NXDomain,
            ..Case::default()
        },
        // Apex.
        Case {
            name: "success: NS at the apex",
            host: "global.",
            qtype: NS,
            from: EU1,
            answers: &["ns.global."],
            ..Case::default()
        },
        Case {
            name: "success: A of the name server",
            host: "ns.global.",
            qtype: A,
            from: EU1,
            answers: &["127.0.0.1"],
            ..Case::default()
        },
        // clusterset: the ClusterSetIP of the client's cluster, else endpoints.
        Case {
            name: "success: clusterset A from an importing member is its ClusterSetIP",
            host: "web.shop.svc.clusterset.local.",
            qtype: A,
            from: EU2,
            answers: &["10.96.0.10"],
            ..Case::default()
        },
        Case {
            name: "success: clusterset A from a member without the import is the endpoints",
            host: "web.shop.svc.clusterset.local.",
            qtype: A,
            from: EU1,
            answers: &["10.1.0.1", "10.1.0.2"],
            ..Case::default()
        },
        Case {
            name: "nxdomain: clusterset <cluster>.<svc> of a service with a ClusterSetIP",
            host: "eu-1.web.shop.svc.clusterset.local.",
            qtype: A,
            from: EU1,
            rcode: NXDomain,
            ..Case::default()
        },
        Case {
            name: "success: clusterset A of a headless service is its endpoints",
            host: "db.shop.svc.clusterset.local.",
            qtype: A,
            from: ANYONE,
            answers: &["10.1.1.1"],
            ..Case::default()
        },
        Case {
            name: "nodata: clusterset <cluster>.<svc> of a headless service (empty non-terminal)",
            host: "eu-1.db.shop.svc.clusterset.local.",
            qtype: A,
            from: ANYONE,
            ..Case::default()
        },
        Case {
            name: "success: clusterset <hostname>.<cluster>.<svc> is that endpoint",
            host: "db-0.eu-1.db.shop.svc.clusterset.local.",
            qtype: A,
            from: ANYONE,
            answers: &["10.1.1.1"],
            ..Case::default()
        },
        Case {
            name: "success: clusterset SRV is the service name on the service port",
            host: "_http._tcp.web.shop.svc.clusterset.local.",
            qtype: SRV,
            from: EU2,
            answers: &["0 100 80 web.shop.svc.clusterset.local."],
            ..Case::default()
        },
        Case {
            name: "success: the probe name says the cluster the source maps to (global)",
            host: "_meridian-whoami.global.",
            qtype: TXT,
            from: EU1,
            answers: &["cluster=eu-1 source=10.1.9.9"],
            ..Case::default()
        },
        Case {
            name: "success: the probe name, from no cluster (clusterset)",
            host: "_meridian-whoami.clusterset.local.",
            qtype: TXT,
            from: ANYONE,
            answers: &["cluster= source=192.0.2.1"],
            ..Case::default()
        },
        Case {
            name: "nodata: the probe name has no address",
            host: "_meridian-whoami.global.",
            qtype: A,
            from: EU1,
            ..Case::default()
        },
        Case {
            name: "success: dns-version TXT",
            host: "dns-version.clusterset.local.",
            qtype: TXT,
            from: ANYONE,
            answers: &["1.0.0"],
            ..Case::default()
        },
        Case {
            name: "nodata: svc.clusterset.local is an empty non-terminal",
            host: "svc.clusterset.local.",
            qtype: A,
            from: ANYONE,
            ..Case::default()
        },
        Case {
            name: "nodata: a clusterset namespace is an empty non-terminal",
            host: "shop.svc.clusterset.local.",
            qtype: A,
            from: ANYONE,
            ..Case::default()
        },
        Case {
            name: "nxdomain: pod names are not served",
            host: "web.shop.pod.clusterset.local.",
            qtype: A,
            from: ANYONE,
            rcode: NXDomain,
            ..Case::default()
        },
        // A zone with a fixed namespace.
        Case {
            name: "success: a zone with a fixed namespace takes <svc> alone",
            host: "web.g.svc.cluster.local.",
            qtype: A,
            from: EU1,
            answers: &["10.1.0.1", "10.1.0.2"],
            ..Case::default()
        },
        // Outside our zones.
        Case {
            name: "refused: a name outside our zones",
            host: "example.com.",
            qtype: A,
            from: EU1,
            rcode: Refused,
            ..Case::default()
        },
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
        let what = format!("{}: {} {} from {}", c.name, c.host, c.qtype, c.from);
        assert_eq!(resp.metadata.response_code, c.rcode, "{what}");
        assert_eq!(got, want, "{what}");
        let has_soa = resp.authorities.iter().any(|r| r.record_type() == SOA);
        assert_eq!(has_soa, c.soa(), "{what}: SOA in authority");
        if c.rcode != Refused {
            assert!(resp.metadata.authoritative, "{what}: AA");
        }
        assert!(!resp.metadata.recursion_available, "{what}: RA");
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
            &question("_http._tcp.web.shop.global.", RecordType::SRV, from),
        );
        assert!(!resp.answers.is_empty());
        for srv in &resp.answers {
            let hickory_proto::rr::RData::SRV(srv) = &srv.data else {
                panic!("not SRV")
            };
            let target = srv.target.to_string();
            let name: &'static str = Box::leak(target.into_boxed_str());
            let r = run(&a, &snap, &question(name, RecordType::A, from));
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
    let resp = run(&a, &snap, &question("global.", RecordType::SOA, EU1));
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
    let groups = || Weighted {
        addrs: ["10.1.0.1", "10.1.0.2", "10.2.0.1", "10.3.0.1"]
            .map(ip)
            .to_vec(),
        groups: vec![(70, 2), (15, 1), (15, 1)],
    };
    let rotations = |cap| Rotations {
        weighted: groups(),
        rotations: 16,
        cap,
    };
    let firsts: Vec<IpAddr> = (0..16).map(|r| rotations(0).rotation(r)[0]).collect();
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
    assert!((0..16).all(|r| rotations(0).rotation(r).len() == 4));
    // All starts in one pass are each rotation's own; a cap keeps the first addresses.
    let all = rotations(0);
    for (r, start) in all.starts(16).into_iter().enumerate() {
        let (tail, head) = all.from(start);
        assert_eq!([tail, head].concat(), all.rotation(r), "rotation {r}");
        let capped = rotations(3);
        let (tail, head) = capped.from(start);
        assert_eq!(
            [tail, head].concat(),
            all.rotation(r)[..3],
            "rotation {r}, cap 3"
        );
    }
}

#[test]
fn any_is_answered_with_one_hinfo() {
    let snap = fleet();
    let a = answerer(0);
    let resp = run(
        &a,
        &snap,
        &question("web.shop.global.", RecordType::ANY, EU1),
    );
    assert_eq!(resp.answers.len(), 1);
    assert_eq!(resp.answers[0].record_type(), RecordType::HINFO);
    let resp = run(
        &a,
        &snap,
        &question("nope.shop.global.", RecordType::ANY, EU1),
    );
    assert_eq!(resp.metadata.response_code, ResponseCode::NXDomain);
}

#[test]
fn servfail_until_synced() {
    let a = answerer(0);
    let resp = run(
        &a,
        &Snapshot::empty(),
        &question("web.shop.global.", RecordType::A, EU1),
    );
    assert_eq!(resp.metadata.response_code, ResponseCode::ServFail);
    let resp = run(
        &a,
        &Snapshot::empty(),
        &question("example.com.", RecordType::A, EU1),
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
    let mut fleet = FleetBuilder::new();
    for (name, octet) in [("a", 1u8), ("b", 2)] {
        let mut spec = ClusterSpec::named(name);
        spec.health.unreachable_after_seconds = 1;
        spec.health.withdraw_after_seconds = 1;
        fleet
            .member(spec)
            .export(name, "web", svc(false, &[("http", 80)]), 0)
            .slice(
                name,
                name,
                "web",
                vec![http_ep(&format!("10.0.0.{octet}"), true)],
            );
    }
    fleet
        .registry
        .heartbeat_failed(&ClusterId::new("b"), fleet.t0, "gone");
    fleet.tick(1);
    fleet.version = 2;
    let snap = fleet.snapshot();
    let a = answerer(0);
    let c = question("web.shop.global.", RecordType::A, ANYONE);
    assert_eq!(
        run(&a, &snap, &c).answers.len(),
        2,
        "unreachable but not yet withdrawn: still served"
    );
    fleet.tick(2);
    fleet.version = 3;
    let snap = fleet.snapshot();
    let resp = run(&a, &snap, &c);
    assert_eq!(resp.answers.len(), 1);
    assert_eq!(resp.answers[0].data.to_string(), "10.0.0.1");
    let resp = run(
        &a,
        &snap,
        &question("b.web.shop.global.", RecordType::A, ANYONE),
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

#[test]
fn a_client_in_a_geo_range_is_answered_from_its_region_by_ecs_or_source() {
    let mut snap = fleet();
    snap.geo = meridian_core::testing::geo_table(&[
        ("203.0.113.0/24", "us", ""),
        ("198.51.100.0/24", "eu", "eu-2a"),
        // Inside eu-1's /16 and longer: the geo range wins in its half.
        ("10.1.0.0/17", "us", ""),
    ]);
    let a = answerer(0);
    let sorted = |resp: &Response| {
        let mut got: Vec<String> = resp.answers.iter().map(|r| r.data.to_string()).collect();
        got.sort();
        got
    };
    let ecs = |subnet: &str| {
        let mut e = Edns::new();
        e.options_mut().insert(EdnsOption::Subnet(ClientSubnet::new(
            subnet.parse().unwrap(),
            24,
            0,
        )));
        e
    };
    let now = Instant::now();
    let cases: [(&str, Option<&str>, &[&str], &str); 4] = [
        // (source, ECS subnet, first tier, why)
        (
            ANYONE,
            Some("203.0.113.0"),
            &["10.3.0.1", "10.3.0.2"],
            "ECS in the us range: us-1's endpoints (no network: no gateway)",
        ),
        (
            EU1,
            Some("203.0.113.0"),
            &["10.3.0.1", "10.3.0.2"],
            "ECS wins over an eu-1 source",
        ),
        (
            "203.0.113.8",
            None,
            &["10.3.0.1", "10.3.0.2"],
            "the source in the us range",
        ),
        (
            "198.51.100.1",
            None,
            &["10.2.0.1", "10.2.0.2"],
            "the zone eu-2a first: eu-2",
        ),
    ];
    for (from, subnet, expected, why) in &cases {
        let req = request(
            "web.shop.global.",
            RecordType::A,
            subnet.map(ecs),
            OpCode::Query,
        );
        let resp = a.respond(&snap, &req, from.parse().unwrap(), Transport::Udp, 0, now);
        assert_eq!(sorted(&resp), *expected, "{from} {subnet:?}: {why}");
    }
    // The geo /17 inside eu-1's /16 is longer: it wins there, eu-1 in the other half.
    let resp = a.respond(
        &snap,
        &request("web.shop.global.", RecordType::A, None, OpCode::Query),
        "10.1.1.1".parse().unwrap(),
        Transport::Udp,
        0,
        now,
    );
    assert_eq!(sorted(&resp), ["10.3.0.1", "10.3.0.2"]);
    let resp = a.respond(
        &snap,
        &request("web.shop.global.", RecordType::A, None, OpCode::Query),
        "10.1.200.1".parse().unwrap(),
        Transport::Udp,
        0,
        now,
    );
    assert_eq!(sorted(&resp), ["10.1.0.1", "10.1.0.2"]);
}
