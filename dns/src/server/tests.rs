//! The UDP hot path's cache against the full path, for clients in clusters, in geo ranges
//! and unknown: an answer cached for one place is never replayed to another.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RData, RecordType};
use meridian_core::ClusterSpec;
use meridian_core::testing::{FleetBuilder, cluster, geo_table, http_ep, svc};

use super::*;

/// eu-1 (DNS clients 127.0.1.0/24 and 10.0.0.0/8) and us-1 (127.0.3.0/24) serving shop/web;
/// geo ranges 203.0.113.0/24 → us, 198.51.100.0/24 → eu, and 10.7.0.0/16 → us inside eu-1's /8.
fn fleet() -> Snapshot {
    let mut fleet = FleetBuilder::new();
    let with = |spec: ClusterSpec, cidrs: &[&str]| ClusterSpec {
        dns_client_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
        ..spec
    };
    fleet
        .add(
            with(
                cluster("eu-1", "eu", "eu-1a"),
                &["127.0.1.0/24", "10.0.0.0/8"],
            ),
            2,
        )
        .add(with(cluster("us-1", "us", "us-1a"), &["127.0.3.0/24"]), 3);
    let mut snap = fleet.snapshot();
    snap.geo = geo_table(&[
        ("203.0.113.0/24", "us", ""),
        ("198.51.100.0/24", "eu", ""),
        ("10.7.0.0/16", "us", ""),
    ]);
    snap
}

/// A server with an empty cache over the test fleet.
fn dns() -> Arc<Dns> {
    let (_tx, rx) = watch::channel(Arc::new(fleet()));
    Dns::new(DnsConfig::default(), 1, rx, &mut Registry::default())
}

fn query(id: u16) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(
        Name::from_ascii("web.shop.global.").unwrap(),
        RecordType::A,
    ));
    m.to_vec().unwrap()
}

fn ask(dns: &Dns, from: &str, id: u16) -> Vec<u8> {
    let src = SocketAddr::new(from.parse().unwrap(), 5353);
    let mut out = Vec::new();
    assert!(
        dns.handle_udp(&query(id), src, &mut out),
        "{from}: no reply"
    );
    out
}

fn addresses(reply: &[u8]) -> BTreeSet<IpAddr> {
    Message::from_vec(reply)
        .unwrap()
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            _ => None,
        })
        .collect()
}

/// The ready addresses of `cluster`'s part of shop/web.
fn of(snap: &Snapshot, cluster: &str) -> BTreeSet<IpAddr> {
    let view = snap.service("shop", "web").unwrap();
    let backend = view
        .backend_of(snap.cluster_index(cluster).unwrap())
        .unwrap();
    backend
        .answerable()
        .flat_map(|e| e.addresses.iter().copied())
        .collect()
}

#[test]
fn a_cached_answer_is_replayed_only_to_clients_of_the_same_place() {
    let snap = fleet();
    let (eu, us) = (of(&snap, "eu-1"), of(&snap, "us-1"));
    let everyone: BTreeSet<IpAddr> = eu.union(&us).copied().collect();
    let askers = [
        ("203.0.113.5", &us, "a geo client in us: us-1"),
        ("127.0.1.9", &eu, "a client in eu-1: its own cluster"),
        ("192.0.2.1", &everyone, "an unknown client: everyone"),
        ("198.51.100.7", &eu, "a geo client in eu: eu-1"),
        (
            "10.7.1.1",
            &us,
            "a geo /16 inside eu-1's /8: the longer prefix, us",
        ),
        ("10.8.1.1", &eu, "eu-1's /8 alone"),
        ("127.0.3.4", &us, "a client in us-1"),
    ];
    const ROUNDS: u16 = 5;
    // Each order of first askers: whoever fills an entry, the others never get it.
    for order in [askers.to_vec(), askers.iter().rev().copied().collect()] {
        let dns = dns();
        let mut places = std::collections::HashSet::new();
        for round in 0..ROUNDS {
            for (i, (from, expected, why)) in order.iter().enumerate() {
                let id = round * 100 + i as u16;
                let reply = ask(&dns, from, id);
                assert_eq!(
                    &addresses(&reply),
                    *expected,
                    "round {round}, {from}: {why}"
                );
                if places.insert(snap.locate(from.parse().unwrap())) {
                    // The first answer for a place is the full path's, byte for byte (later
                    // ones rotate).
                    assert_eq!(reply, ask(&self::dns(), from, id), "{from}: bytes differ");
                }
            }
        }
        // Five places (geo us, eu-1, unknown, geo eu, us-1) with 3 + 2 + 5 + 2 + 3 rotations:
        // at most that many misses, every other query a hit.
        let queries = u64::from(ROUNDS) * order.len() as u64;
        assert!(
            dns.metrics.cache_hits.get() >= queries - 15,
            "hits: {} of {queries}",
            dns.metrics.cache_hits.get()
        );
    }
}

// ---- how long cached answers hold ----

/// A fleet whose snapshots are published as the store publishes them (rebuilt from what
/// changed, restamped against the previous one), and a server reading them.
struct Churn {
    fleet: FleetBuilder,
    tx: watch::Sender<Arc<Snapshot>>,
    dns: Arc<Dns>,
    version: u64,
}

impl Churn {
    /// eu-1 exports shop/web (10.0.0.1) and shop/api (10.0.1.1).
    fn new() -> Self {
        let mut fleet = FleetBuilder::with_members(&["eu-1"]);
        for (name, address) in [("web", "10.0.0.1"), ("api", "10.0.1.1")] {
            fleet
                .export("eu-1", name, svc(false, &[("http", 80)]), 1)
                .slice("eu-1", name, name, vec![http_ep(address, true)]);
        }
        let (tx, rx) = watch::channel(Arc::new(Snapshot::empty()));
        let dns = Dns::new(DnsConfig::default(), 1, rx, &mut Registry::default());
        let mut churn = Self {
            fleet,
            tx,
            dns,
            version: 0,
        };
        churn.publish(true);
        churn
    }

    /// Publishes what changed; `restamp: false` publishes as a test or a what-if would.
    fn publish(&mut self, restamp: bool) {
        self.version += 1;
        let prev = self.tx.borrow().clone();
        let mut next = Snapshot::rebuild(
            &prev,
            &self.fleet.index.take_dirty(),
            self.version,
            &self.fleet.index,
            &self.fleet.registry,
            &Default::default(),
            self.fleet.t0,
        );
        if restamp {
            next.restamp(&prev, self.fleet.t0);
        }
        self.tx.send_replace(Arc::new(next));
    }

    fn set(&mut self, name: &str, address: &str) {
        self.fleet
            .slice("eu-1", name, name, vec![http_ep(address, true)]);
    }

    /// The addresses and rcode `name.shop.global A` gets, and whether it came from the cache.
    fn ask(&self, name: &str) -> (Vec<String>, ResponseCode, bool) {
        let hits = self.dns.metrics.cache_hits.get();
        let mut m = Message::new(7, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(
            Name::from_ascii(format!("{name}.shop.global.")).unwrap(),
            RecordType::A,
        ));
        let mut out = Vec::new();
        let src = SocketAddr::new("192.0.2.1".parse().unwrap(), 5353);
        assert!(self.dns.handle_udp(&m.to_vec().unwrap(), src, &mut out));
        let reply = Message::from_vec(&out).unwrap();
        let addresses = addresses(&out).iter().map(IpAddr::to_string).collect();
        let hit = self.dns.metrics.cache_hits.get() > hits;
        (addresses, reply.metadata.response_code, hit)
    }
}

#[test]
fn a_change_to_one_service_keeps_every_other_services_cached_answers() {
    let mut churn = Churn::new();
    for name in ["web", "api", "cart"] {
        churn.ask(name);
    }
    assert!(churn.ask("api").2, "api is cached");
    for (round, address) in ["10.0.0.2", "10.0.0.3", "10.0.0.4"].into_iter().enumerate() {
        churn.set("web", address);
        churn.publish(true);
        assert_eq!(
            churn.ask("web"),
            (vec![address.to_string()], ResponseCode::NoError, false),
            "round {round}: web's new address, decided afresh"
        );
        assert_eq!(
            churn.ask("api"),
            (vec!["10.0.1.1".to_string()], ResponseCode::NoError, true),
            "round {round}: api did not change and stays cached"
        );
        assert_eq!(
            churn.ask("cart"),
            (vec![], ResponseCode::NXDomain, true),
            "round {round}: no service came or went, the NXDOMAIN holds"
        );
    }
}

#[test]
fn an_nxdomain_is_not_replayed_once_the_name_appears() {
    let mut churn = Churn::new();
    churn.ask("web");
    assert_eq!(churn.ask("cart").1, ResponseCode::NXDomain);
    assert!(churn.ask("cart").2, "the NXDOMAIN is cached");
    churn
        .fleet
        .export("eu-1", "cart", svc(false, &[("http", 80)]), 2)
        .slice("eu-1", "cart", "cart", vec![http_ep("10.0.2.1", true)]);
    churn.publish(true);
    assert_eq!(
        churn.ask("cart"),
        (vec!["10.0.2.1".to_string()], ResponseCode::NoError, false)
    );
    assert!(churn.ask("web").2, "web's answer outlives cart's arrival");
}

#[test]
fn a_snapshot_nobody_restamped_holds_answers_for_its_version_only() {
    let mut churn = Churn::new();
    churn.ask("api");
    churn.ask("web");
    churn.set("web", "10.0.0.9");
    churn.publish(false);
    assert_eq!(churn.ask("web").0, ["10.0.0.9"]);
    assert!(!churn.ask("api").2, "a new unstamped version keeps nothing");
    assert!(churn.ask("api").2, "within one version, answers are cached");
}

/// shop/web in eu-1 (2 addresses) and us-1 (3); shop/dual in eu-1 with an IPv4 and an IPv6
/// endpoint; shop/db, headless, in us-1.
fn quick_fleet() -> Snapshot {
    let mut fleet = FleetBuilder::new();
    let eu = ClusterSpec {
        dns_client_cidrs: vec!["127.0.1.0/24".parse().unwrap()],
        ..cluster("eu-1", "eu", "eu-1a")
    };
    let us = ClusterSpec {
        dns_client_cidrs: vec!["127.0.3.0/24".parse().unwrap()],
        ..cluster("us-1", "us", "us-1a")
    };
    fleet.add(eu, 2).add(us, 3);
    fleet
        .export("eu-1", "dual", svc(false, &[("http", 80)]), 0)
        .slice(
            "eu-1",
            "dual-1",
            "dual",
            vec![http_ep("10.9.0.1", true), http_ep("fd00::9", true)],
        )
        .export("us-1", "db", svc(true, &[("tcp", 5432)]), 0)
        .slice("us-1", "db-1", "db", vec![http_ep("10.8.0.1", true)])
        .export("eu-1", "wide", svc(false, &[("http", 80)]), 0)
        .slice(
            "eu-1",
            "wide-1",
            "wide",
            (1..=6)
                .map(|i| http_ep(&format!("10.7.0.{i}"), true))
                .collect(),
        );
    fleet.snapshot()
}

/// A query with the given flags and, with `payload`, an OPT record.
fn raw_query(name: &str, qtype: RecordType, rd: bool, cd: bool, payload: Option<u16>) -> Vec<u8> {
    let mut m = Message::new(0x4242, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    if let Some(payload) = payload {
        let mut edns = hickory_proto::op::Edns::new();
        edns.set_max_payload(payload);
        m.edns = Some(edns);
    }
    let mut raw = m.to_vec().unwrap();
    raw[2] = (raw[2] & !0x01) | u8::from(rd);
    raw[3] = (raw[3] & !0x10) | if cd { 0x10 } else { 0 };
    raw
}

#[test]
fn a_quick_miss_gives_the_full_paths_bytes() {
    let snap = Arc::new(quick_fleet());
    // (name, whether the fast encoder covers it)
    let names = [
        ("web.shop.global.", true),
        ("WeB.sHoP.GLOBAL.", true),
        ("dual.shop.global.", true),
        ("web.shop.svc.clusterset.local.", true),
        ("db.shop.svc.clusterset.local.", true),
        ("nothere.shop.global.", true),
        ("nothere.shop.svc.clusterset.local.", true),
        ("a.b.global.", true),
        // A cluster's name, a name too deep for a service, the apex: the full path.
        ("eu-1.web.shop.global.", false),
        ("a.b.c.d.e.global.", false),
        ("global.", false),
    ];
    let mut quick = 0;
    for (name, covered) in names {
        for qtype in [RecordType::A, RecordType::AAAA, RecordType::SRV] {
            for payload in [None, Some(512), Some(4096)] {
                for (rd, cd) in [(true, false), (false, true)] {
                    for from in ["127.0.1.9", "127.0.3.4", "192.0.2.1"] {
                        let (_tx, rx) = watch::channel(snap.clone());
                        let dns = Dns::new(DnsConfig::default(), 1, rx, &mut Registry::default());
                        let raw = raw_query(name, qtype, rd, cd, payload);
                        let src = SocketAddr::new(from.parse().unwrap(), 5353);
                        let mut out = Vec::new();
                        assert!(dns.handle_udp(&raw, src, &mut out));
                        let full = dns.answer_bytes(&raw, src.ip()).unwrap();
                        let what =
                            format!("{name} {qtype} edns {payload:?} rd {rd} cd {cd} from {from}");
                        assert_eq!(out, full, "{what}: the quick and the full path differ");
                        let was_quick = dns.metrics.quick_answers.get() == 1;
                        let expected = covered && qtype != RecordType::SRV;
                        assert_eq!(was_quick, expected, "{what}: answered quick?");
                        quick += u64::from(was_quick);
                        // The next askers get the other rotations, which the quick miss made
                        // too: each the full path's bytes for that rotation.
                        for rotation in 1..=4 {
                            let mut hit = Vec::new();
                            assert!(dns.handle_udp(&raw, src, &mut hit));
                            let mut full = Vec::new();
                            dns.answer_full(
                                &snap,
                                &raw,
                                src.ip(),
                                Transport::Udp,
                                rotation,
                                &mut full,
                            )
                            .unwrap();
                            assert_eq!(hit, full, "{what}: rotation {rotation} differs");
                        }
                        if was_quick {
                            // Up to EAGER_ROTATIONS rotations, the first miss made them all;
                            // beyond, each of the five asked was a miss of its own.
                            let answers = usize::from(u16::from_be_bytes([full[6], full[7]]));
                            let misses = if answers <= crate::answer::fast::EAGER_ROTATIONS {
                                1
                            } else {
                                answers.min(5)
                            };
                            assert_eq!(dns.metrics.cache_misses.get(), misses as u64, "{what}");
                        }
                    }
                }
            }
        }
    }
    assert_eq!(quick, 8 * 2 * 3 * 2 * 3);
}

#[test]
fn a_name_with_many_rotations_caches_each_as_it_is_asked() {
    let snap = Arc::new(quick_fleet());
    let (_tx, rx) = watch::channel(snap.clone());
    let dns = Dns::new(DnsConfig::default(), 1, rx, &mut Registry::default());
    let raw = raw_query("wide.shop.global.", RecordType::A, true, false, Some(1232));
    let src = SocketAddr::new("127.0.1.9".parse().unwrap(), 5353);
    let rotations = 6;
    assert!(rotations > crate::answer::fast::EAGER_ROTATIONS);
    // Each rotation is a miss the first time it is asked (only it is encoded and kept), and
    // the full path's bytes for that rotation; the second round hits every one.
    for round in 0..2 {
        for rotation in 0..rotations {
            let mut out = Vec::new();
            assert!(dns.handle_udp(&raw, src, &mut out));
            let mut full = Vec::new();
            dns.answer_full(&snap, &raw, src.ip(), Transport::Udp, rotation, &mut full)
                .unwrap();
            assert_eq!(out, full, "round {round} rotation {rotation}");
        }
    }
    assert_eq!(dns.metrics.cache_misses.get(), rotations as u64);
    assert_eq!(dns.metrics.quick_answers.get(), rotations as u64);
    assert_eq!(dns.metrics.cache_hits.get(), rotations as u64);
}
