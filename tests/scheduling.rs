//! Property tests of one scheduling decision as both front ends serve it: random fleets of
//! 3–8 clusters exporting `shop/web` and a random ClusterSchedulingPolicy, asked through the
//! DNS answer function (`Answerer::respond`) and the xDS builder (`resources::build`) for the
//! same client cluster at the same instant.
//!
//! ```text
//!  GenCase ─► Registry + Index (+ rebuilds that date recoveries) ─► Snapshot
//!          ─► select()                          Selection (tiers, filtered, weights)
//!          ─► Answerer::respond(web.shop.global A / _http._tcp SRV, src in C's CIDR)
//!          ─► resources::build(Group{cluster: C, Envoy}) ─► ClusterLoadAssignment
//! ```
//!
//! Each property runs 512 cases and counts what the generator produced, so it cannot pass
//! vacuously (filtered clusters of every reason, spills, several tiers, failback, gateways,
//! maxAnswers caps, every mode, proxyless nodes that cannot use a gateway, an address that
//! several clusters report).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Instant;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use hickory_server::net::xfer::Protocol;
use hickory_server::server::Request;
use meridian_core::testing::{ep, secs, svc};
use meridian_core::{
    AffinityTier, Client, ClusterId, ClusterSet, ClusterSpec, Export, FilterReason, Gateway, Index,
    LabelSelector, Locality, Mode, Object, ObjectKey, Operator, Policies, Policy, Registry,
    Requirement, Selection, ServiceSelector, Slice, Snapshot, Taint, TaintEffect, TierReason,
    Toleration, TrafficPolicy, WeightRule, select, select_for,
};
use meridian_dns::{Answerer, DnsConfig, Response, Transport, wire};
use meridian_xds::{Group, Kind, Role, resources};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use prost::Message as _;
use xds_api::pb::envoy::config::core::v3::{HealthStatus, address};
use xds_api::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};

/// Every decision is taken at `t0 + NOW` seconds.
const NOW: u64 = 200;
const CASES: u32 = 512;
const A_NAME: &str = "web.shop.global.";
const SRV_NAME: &str = "_http._tcp.web.shop.global.";
const EDS_NAME: &str = "web.shop.global:80";
/// A DNS client inside no cluster's dnsClientCIDRs.
const OUTSIDER: IpAddr = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 9));

// ---- the generated input ----

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GenHealth {
    Healthy,
    /// Heartbeats fail from t0+1: Unreachable since t0+16, within its own withdraw time.
    Unreachable,
    /// Unreachable since t0+16 and withdrawn at t0+76 (its own withdrawAfterSeconds: 60).
    Withdrawn,
    /// Withdrawn as above, then healthy again from `t0 + .0` (failback counts from there).
    Recovered(u64),
}

#[derive(Clone)]
struct GenCluster {
    region: Option<u8>,
    zone: Option<u8>,
    /// 0: the unnamed network.
    network: u8,
    gateway: bool,
    /// Label `tier`: gold, silver, bronze.
    tier: u8,
    /// Label `env: prod`.
    prod: bool,
    taints: Vec<(u8, TaintEffect)>,
    health: GenHealth,
    /// One single-address endpoint each: ready or not.
    endpoints: Vec<bool>,
    /// The slice had no ready endpoint until `t0 + .0` (failback from no ready endpoints).
    ready_since: Option<u64>,
    /// Its first endpoint has the address `SHARED`, which other clusters may report too.
    shares: bool,
}

const TIERS: [&str; 3] = ["gold", "silver", "bronze"];

impl fmt::Debug for GenCluster {
    /// One line per cluster, so a shrunk case reads as a table.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ready = self.endpoints.iter().filter(|r| **r).count();
        write!(
            f,
            "region={:?} zone={:?} net={} gw={} tier={}{} taints={:?} {:?} endpoints={}ready/{}not{}{}",
            self.region,
            self.zone,
            self.network,
            self.gateway,
            TIERS[usize::from(self.tier)],
            if self.prod { " env=prod" } else { "" },
            self.taints,
            self.health,
            ready,
            self.endpoints.len() - ready,
            self.ready_since
                .map(|t| format!(" ready_since=t0+{t}"))
                .unwrap_or_default(),
            if self.shares { " shares" } else { "" },
        )
    }
}

#[derive(Clone, Debug)]
struct GenPolicy {
    mode: Mode,
    affinities: Vec<ClusterSet>,
    weights: Vec<(ClusterSet, u32)>,
    min_healthy: u32,
    tolerations: Vec<(u8, Option<TaintEffect>)>,
    withdraw_after: Option<u64>,
    failback_after: u64,
    max_answers: Option<u32>,
    ttl: Option<u32>,
    /// As a ClusterSchedulingPolicy selecting `shop/web` by name, else as the default policy.
    explicit: bool,
}

#[derive(Clone, Debug)]
struct GenCase {
    clusters: Vec<GenCluster>,
    policy: GenPolicy,
    /// Taken modulo the number of clusters.
    client: usize,
    rotation: usize,
}

impl GenCase {
    fn client(&self) -> usize {
        self.client % self.clusters.len()
    }
}

fn effect() -> impl Strategy<Value = TaintEffect> {
    prop_oneof![
        Just(TaintEffect::NoSchedule),
        Just(TaintEffect::PreferNoSchedule),
        Just(TaintEffect::NoExecute),
    ]
}

fn gen_cluster() -> impl Strategy<Value = GenCluster> {
    let health = prop_oneof![
        5 => Just(GenHealth::Healthy),
        1 => Just(GenHealth::Unreachable),
        1 => Just(GenHealth::Withdrawn),
        2 => (77u64..=NOW).prop_map(GenHealth::Recovered),
    ];
    (
        (
            proptest::option::weighted(0.9, 0u8..3),
            proptest::option::weighted(0.9, 0u8..2),
            prop_oneof![2 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)],
            prop::bool::weighted(0.6),
        ),
        (0u8..3, any::<bool>()),
        prop_oneof![
            6 => Just(Vec::new()),
            3 => proptest::collection::vec((0u8..3, effect()), 1),
            1 => proptest::collection::vec((0u8..3, effect()), 2),
        ]
        .prop_map(|mut t| {
            t.sort_by_key(|(k, e)| (*k, *e as u8));
            t.dedup();
            t
        }),
        health,
        proptest::collection::vec(prop::bool::weighted(0.75), 0..=5),
        proptest::option::weighted(0.25, 1u64..=NOW),
        prop::bool::weighted(0.5),
    )
        .prop_map(
            |(
                (region, zone, network, gateway),
                (tier, prod),
                taints,
                health,
                endpoints,
                ready_since,
                shares,
            )| GenCluster {
                region,
                zone: region.and(zone),
                network,
                gateway,
                tier,
                prod,
                taints,
                health,
                endpoints,
                ready_since,
                shares,
            },
        )
}

fn label_selector() -> impl Strategy<Value = LabelSelector> {
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let expr = |key: &str, operator: Operator, values: &[&str]| LabelSelector {
        match_labels: BTreeMap::new(),
        match_expressions: vec![Requirement {
            key: key.to_owned(),
            operator,
            values: values.iter().map(|v| (*v).to_owned()).collect(),
        }],
    };
    prop_oneof![
        (0usize..3).prop_map(move |t| LabelSelector {
            match_labels: labels(&[("tier", TIERS[t])]),
            match_expressions: Vec::new(),
        }),
        (0u8..3).prop_map(move |r| LabelSelector {
            match_labels: labels(&[("topology.kubernetes.io/region", &format!("r{r}"))]),
            match_expressions: Vec::new(),
        }),
        (0usize..3, 0usize..3).prop_map(move |(a, b)| expr(
            "tier",
            Operator::In,
            &[TIERS[a], TIERS[b]]
        )),
        (0usize..3).prop_map(move |t| expr("tier", Operator::NotIn, &[TIERS[t]])),
        Just(expr("env", Operator::Exists, &[])),
        Just(expr("env", Operator::DoesNotExist, &[])),
    ]
}

/// Clusters by names (some of them possibly not members) and/or labels; never empty.
fn cluster_set() -> impl Strategy<Value = ClusterSet> {
    prop_oneof![
        proptest::collection::btree_set(0u8..9, 1..=3).prop_map(|names| ClusterSet {
            names: names.into_iter().map(|i| format!("c{i}")).collect(),
            selector: None,
        }),
        label_selector().prop_map(|s| ClusterSet {
            names: Vec::new(),
            selector: Some(s),
        }),
        (
            proptest::collection::btree_set(0u8..9, 1..=2),
            label_selector()
        )
            .prop_map(|(names, s)| ClusterSet {
                names: names.into_iter().map(|i| format!("c{i}")).collect(),
                selector: Some(s),
            }),
    ]
}

/// Weights as ClusterSchedulingPolicy allows them (any u32); `huge` adds weights up to
/// u32::MAX, which only the weight property uses.
fn weight(huge: bool) -> BoxedStrategy<u32> {
    if huge {
        prop_oneof![
            3 => Just(0u32),
            5 => 1u32..=10,
            1 => 11u32..=1000,
            2 => prop_oneof![Just(u32::MAX), 1_000_000u32..=u32::MAX],
        ]
        .boxed()
    } else {
        prop_oneof![3 => Just(0u32), 6 => 1u32..=10, 1 => 11u32..=1000].boxed()
    }
}

fn gen_policy(huge_weights: bool) -> impl Strategy<Value = GenPolicy> {
    let mode = prop_oneof![
        Just(Mode::Locality),
        Just(Mode::Tiers),
        Just(Mode::Weighted)
    ];
    (
        mode,
        proptest::collection::vec(cluster_set(), 1..=3),
        proptest::collection::vec((cluster_set(), weight(huge_weights)), 0..=3),
        prop_oneof![2 => Just(1u32), 2 => 2u32..=4, 2 => 5u32..=12],
        proptest::collection::vec((0u8..3, proptest::option::of(effect())), 0..=2),
        proptest::option::weighted(0.3, 0u64..400),
        prop_oneof![1 => Just(0u64), 2 => 1u64..=150],
        (
            proptest::option::weighted(0.6, 1u32..=5),
            proptest::option::of(1u32..=60),
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                mode,
                affinities,
                weights,
                min_healthy,
                tolerations,
                withdraw_after,
                failback_after,
                (max_answers, ttl, explicit),
            )| GenPolicy {
                mode,
                affinities,
                weights,
                min_healthy,
                tolerations,
                withdraw_after,
                failback_after,
                max_answers,
                ttl,
                explicit,
            },
        )
}

fn gen_case(huge_weights: bool) -> impl Strategy<Value = GenCase> {
    (
        proptest::collection::vec(gen_cluster(), 3..=8),
        gen_policy(huge_weights),
        0usize..8,
        0usize..32,
    )
        .prop_map(|(clusters, policy, client, rotation)| GenCase {
            clusters,
            policy,
            client,
            rotation,
        })
}

// ---- building the snapshot through the public API ----

fn name(i: usize) -> String {
    format!("c{i}")
}

/// The address every cluster that `shares` gives its first endpoint.
const SHARED: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 99));

/// Endpoint `j` of cluster `i`.
fn endpoint_ip(g: &GenCase, i: usize, j: usize) -> IpAddr {
    endpoint_address(i, &g.clusters[i], j)
}

fn endpoint_address(i: usize, c: &GenCluster, j: usize) -> IpAddr {
    if c.shares && j == 0 {
        SHARED
    } else {
        IpAddr::V4(Ipv4Addr::new(10, i as u8 + 1, 0, j as u8 + 1))
    }
}

fn gateway_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(192, 0, 2, 10 + i as u8))
}

/// A DNS client inside cluster `i`'s dnsClientCIDRs (172.16.i.0/24).
fn client_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(172, 16, i as u8, 53))
}

/// Every address of cluster `i` that could ever be emitted: its endpoints and its gateway
/// (not `SHARED`, which another cluster may emit for itself).
fn addresses_of(g: &GenCase, i: usize) -> BTreeSet<IpAddr> {
    (0..g.clusters[i].endpoints.len())
        .map(|j| endpoint_ip(g, i, j))
        .chain([gateway_ip(i)])
        .filter(|ip| *ip != SHARED)
        .collect()
}

fn spec(i: usize, c: &GenCluster) -> ClusterSpec {
    let mut spec = ClusterSpec::named(&name(i));
    spec.locality = Locality {
        region: c.region.map(|r| format!("r{r}")),
        zone: c.zone.map(|z| format!("r{}-z{z}", c.region.unwrap_or(9))),
    };
    spec.labels
        .insert("tier".into(), TIERS[usize::from(c.tier)].into());
    if let Some(r) = c.region {
        spec.labels
            .insert("topology.kubernetes.io/region".into(), format!("r{r}"));
    }
    if c.prod {
        spec.labels.insert("env".into(), "prod".into());
    }
    spec.network = (c.network > 0).then(|| format!("net-{}", c.network));
    spec.gateway = c.gateway.then(|| Gateway {
        address: gateway_ip(i),
        port: 15443,
    });
    spec.dns_client_cidrs = vec![format!("172.16.{i}.0/24").parse().unwrap()];
    spec.taints = c
        .taints
        .iter()
        .map(|&(key, effect)| Taint {
            key: format!("k{key}"),
            value: None,
            effect,
        })
        .collect();
    spec.health.unreachable_after_seconds = 15;
    spec.health.withdraw_after_seconds = match c.health {
        GenHealth::Healthy | GenHealth::Unreachable => 100_000,
        GenHealth::Withdrawn | GenHealth::Recovered(_) => 60,
    };
    spec
}

fn traffic_policy(p: &GenPolicy) -> TrafficPolicy {
    TrafficPolicy {
        source: p.explicit.then(|| "shop/web-first".to_owned()),
        mode: p.mode,
        affinities: p
            .affinities
            .iter()
            .enumerate()
            .map(|(i, clusters)| AffinityTier {
                name: format!("a{i}").into(),
                clusters: clusters.clone(),
            })
            .collect(),
        weights: p
            .weights
            .iter()
            .map(|(clusters, weight)| WeightRule {
                clusters: clusters.clone(),
                weight: *weight,
            })
            .collect(),
        min_healthy_endpoints: p.min_healthy,
        withdraw_after_seconds: p.withdraw_after,
        failback_after_seconds: p.failback_after,
        tolerations: p
            .tolerations
            .iter()
            .map(|&(key, effect)| Toleration::exists(format!("k{key}"), effect))
            .collect(),
        ttl: p.ttl,
        max_answers: p.max_answers,
        drained: Default::default(),
        ramping: Default::default(),
        outlier: Default::default(),
    }
}

fn policies(p: &GenPolicy) -> Policies {
    let traffic = Arc::new(traffic_policy(p));
    if !p.explicit {
        return Policies::new(traffic, Vec::new());
    }
    Policies::new(
        Arc::new(TrafficPolicy::default()),
        vec![Policy {
            key: ObjectKey::new("shop", "web-first"),
            created: 1,
            selectors: vec![ServiceSelector {
                name: Some("web".into()),
                selector: None,
            }],
            templates: Vec::new(),
            traffic,
            placement: None,
        }],
    )
}

fn slice(i: usize, c: &GenCluster, all_not_ready: bool) -> Slice {
    Slice {
        service: Arc::from("web"),
        endpoints: c
            .endpoints
            .iter()
            .enumerate()
            .map(|(j, &ready)| ep(endpoint_address(i, c, j), ready && !all_not_ready))
            .collect(),
    }
}

/// The snapshot of a generated fleet as the store would publish it at `t0 + NOW`: a first
/// build, then one rebuild per slice that got ready endpoints back (dating its recovery).
fn snapshot(g: &GenCase, t0: Instant) -> Snapshot {
    let mut registry = Registry::new();
    let mut index = Index::new();
    let key = ObjectKey::new("shop", "web");
    let slice_key = ObjectKey::new("shop", "web-1");
    for (i, c) in g.clusters.iter().enumerate() {
        let id = ClusterId::new(name(i));
        registry.upsert(spec(i, c), t0);
        registry.heartbeat_ok(&id, t0);
        if c.health != GenHealth::Healthy {
            registry.heartbeat_failed(&id, t0 + secs(1), "connection refused");
        }
        index.apply(
            &id,
            Object::Service(key.clone(), svc(false, &[("http", 80)])),
        );
        index.apply(
            &id,
            Object::Export(
                key.clone(),
                Export {
                    created: i as i64,
                    ..Export::default()
                },
            ),
        );
        index.apply(
            &id,
            Object::Slice(slice_key.clone(), slice(i, c, c.ready_since.is_some())),
        );
    }
    registry.tick(t0 + secs(16));
    registry.tick(t0 + secs(76));
    let mut recoveries: Vec<(u64, usize)> = g
        .clusters
        .iter()
        .enumerate()
        .filter_map(|(i, c)| match c.health {
            GenHealth::Recovered(at) => Some((at, i)),
            _ => None,
        })
        .collect();
    recoveries.sort_unstable();
    for (at, i) in recoveries {
        registry.heartbeat_ok(&ClusterId::new(name(i)), t0 + secs(at));
    }

    let policies = policies(&g.policy);
    let mut version = 1;
    let mut snap = Snapshot::build(version, &index, &registry, &policies);
    index.take_dirty();
    let mut ready_again: Vec<(u64, usize)> = g
        .clusters
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.ready_since.map(|at| (at, i)))
        .collect();
    ready_again.sort_unstable();
    for (at, i) in ready_again {
        let id = ClusterId::new(name(i));
        index.apply(
            &id,
            Object::Slice(slice_key.clone(), slice(i, &g.clusters[i], false)),
        );
        version += 1;
        let dirty = index.take_dirty();
        snap = Snapshot::rebuild(
            &snap,
            &dirty,
            version,
            &index,
            &registry,
            &policies,
            t0 + secs(at),
        );
    }
    snap
}

// ---- asking DNS and xDS ----

fn request(qname: &str, qtype: RecordType) -> Request {
    let mut m = Message::new(4242, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(Name::from_ascii(qname).unwrap(), qtype));
    Request::from_bytes(
        m.to_vec().unwrap(),
        (Ipv4Addr::LOCALHOST, 5353).into(),
        Protocol::Udp,
    )
    .unwrap()
}

struct Dns {
    resp: Response,
    bytes: Vec<u8>,
}

fn ask(
    answerer: &Answerer,
    snap: &Snapshot,
    qname: &str,
    qtype: RecordType,
    src: IpAddr,
    rotation: usize,
    now: Instant,
) -> Dns {
    let req = request(qname, qtype);
    let resp = answerer.respond(snap, &req, src, Transport::Tcp, rotation, now);
    let bytes = wire::encode(&resp, &req.queries, u16::MAX);
    Dns { resp, bytes }
}

fn a_records(dns: &Dns) -> Vec<IpAddr> {
    dns.resp
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            _ => None,
        })
        .collect()
}

/// `(priority, weight, target)` of every SRV answer.
fn srv_records(dns: &Dns) -> Vec<(u16, u16, Name)> {
    dns.resp
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::SRV(s) => Some((s.priority, s.weight, s.target.clone())),
            _ => None,
        })
        .collect()
}

fn additional_addresses(dns: &Dns) -> Vec<IpAddr> {
    dns.resp
        .additionals
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

/// The cluster an SRV target names: `[<endpoint>.]<cluster>.web.shop.global.`.
fn srv_target_cluster(target: &Name) -> String {
    let text = target.to_ascii().to_ascii_lowercase();
    let rest = text
        .strip_suffix(".web.shop.global.")
        .unwrap_or_else(|| panic!("SRV target {text} outside web.shop.global"));
    rest.rsplit('.').next().unwrap_or_default().to_owned()
}

fn group(cluster: Option<usize>, role: Role) -> Group {
    Group {
        cluster: cluster.map(name),
        network: None,
        role,
    }
}

struct Eds {
    /// The resource as served: version and encoded body.
    version: String,
    body: Vec<u8>,
    cla: ClusterLoadAssignment,
}

fn eds(snap: &Snapshot, group: &Group, now: Instant) -> Result<Eds, TestCaseError> {
    let built = resources::build(snap, group, now);
    let Some(resource) = built.of(Kind::Endpoint).get(EDS_NAME) else {
        return Err(TestCaseError::fail(format!(
            "no EDS resource {EDS_NAME} for {group:?}: {:?}",
            built.of(Kind::Endpoint).keys().collect::<Vec<_>>()
        )));
    };
    let cla = ClusterLoadAssignment::decode(resource.body.value.as_slice())
        .map_err(|e| TestCaseError::fail(format!("EDS does not decode: {e}")))?;
    Ok(Eds {
        version: resource.version.clone(),
        body: resource.body.value.clone(),
        cla,
    })
}

/// `(priority, address, health)` of every endpoint of an assignment.
fn eds_endpoints(cla: &ClusterLoadAssignment) -> Vec<(u32, IpAddr, i32)> {
    let mut out = Vec::new();
    for locality in &cla.endpoints {
        for e in &locality.lb_endpoints {
            let Some(lb_endpoint::HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                continue;
            };
            let Some(address::Address::SocketAddress(sa)) =
                ep.address.as_ref().and_then(|a| a.address.as_ref())
            else {
                continue;
            };
            let ip: IpAddr = sa.address.parse().expect("EDS address is an IP");
            out.push((locality.priority, ip, e.health_status));
        }
    }
    out
}

fn healthy_at_priority_0(cla: &ClusterLoadAssignment) -> BTreeSet<IpAddr> {
    eds_endpoints(cla)
        .into_iter()
        .filter(|(p, _, h)| *p == 0 && *h == HealthStatus::Healthy as i32)
        .map(|(_, ip, _)| ip)
        .collect()
}

/// One generated case, built and decided.
struct World {
    t0: Instant,
    now: Instant,
    snap: Snapshot,
    answerer: Answerer,
    client: usize,
    /// The decision for a client of `client` that can use gateways (DNS, Envoy).
    selection: Selection,
    /// The decision for a proxyless gRPC node of `client`, which cannot.
    proxyless: Selection,
}

fn world(g: &GenCase) -> Result<World, TestCaseError> {
    let t0 = Instant::now();
    let now = t0 + secs(NOW);
    let snap = snapshot(g, t0);
    prop_assert!(snap.synced, "every member heartbeat once");
    let client = g.client();
    prop_assert_eq!(snap.client_cluster(client_ip(client)), Some(client));
    let view = snap
        .service("shop", "web")
        .ok_or_else(|| TestCaseError::fail("shop/web is not served"))?;
    prop_assert_eq!(
        view.backends.len(),
        g.clusters.len(),
        "every cluster exports"
    );
    let selection = select(&snap, view, Some(client), now);
    let proxyless = select_for(
        &snap,
        view,
        &Client::in_cluster(&snap, Some(client)).without_gateways(),
        now,
    );
    Ok(World {
        t0,
        now,
        snap,
        answerer: Answerer::new(DnsConfig::default(), 0),
        client,
        selection,
        proxyless,
    })
}

// ---- coverage ----

/// What the generator produced, so that a property cannot hold vacuously.
#[derive(Debug, Default)]
struct Coverage {
    cases: u32,
    /// Cases with at least one filtered cluster, and filtered clusters by reason.
    filtered: u32,
    withdrawn: u32,
    no_execute: u32,
    no_ready: u32,
    no_gateway: u32,
    not_in_affinities: u32,
    weight_zero: u32,
    /// Only for clients that cannot use gateways (never DNS's).
    gateway_unusable: u32,
    /// Clusters whose every ready address another cluster answers first.
    duplicates_filtered: u32,
    /// Cases where a member loses `SHARED` to a member before it.
    shadowed: u32,
    /// Cases where the proxyless node's tiers differ from the Envoy node's.
    proxyless_layout_differs: u32,
    spills: u32,
    multi_tier: u32,
    failing_back: u32,
    prefer_no_schedule: u32,
    /// A member reached through a gateway in the first tier / in any tier.
    gateway_first_tier: u32,
    gateway_any_tier: u32,
    /// More priority-0 addresses than maxAnswers (DNS must cut), and the opposite with a cap.
    capped: u32,
    cap_not_reached: u32,
    empty_answer: u32,
    locality: u32,
    tiers: u32,
    weighted: u32,
    /// Members whose policy weight exceeds what fits SRV arithmetic (`weight * 100 > u32`).
    huge_weight_members: u32,
}

impl Coverage {
    fn count(&mut self, g: &GenCase, w: &World) {
        let sel = &w.selection;
        self.cases += 1;
        self.filtered += u32::from(!sel.filtered.is_empty());
        for f in &sel.filtered {
            match f.reason {
                FilterReason::Withdrawn | FilterReason::Draining => self.withdrawn += 1,
                FilterReason::NoExecuteTaint(_) => self.no_execute += 1,
                FilterReason::NoReadyEndpoints => self.no_ready += 1,
                FilterReason::OtherNetworkNoGateway => self.no_gateway += 1,
                FilterReason::NotInAffinities => self.not_in_affinities += 1,
                FilterReason::WeightZero => self.weight_zero += 1,
                FilterReason::GatewayUnusable => self.gateway_unusable += 1,
                FilterReason::DuplicateAddresses(_) => self.duplicates_filtered += 1,
            }
        }
        self.gateway_unusable += w
            .proxyless
            .filtered
            .iter()
            .filter(|f| f.reason == FilterReason::GatewayUnusable)
            .count() as u32;
        self.proxyless_layout_differs +=
            u32::from(tier_clusters(&w.proxyless) != tier_clusters(sel));
        self.shadowed += u32::from(
            sel.tiers
                .iter()
                .flat_map(|t| &t.members)
                .any(|m| sel.shadowed.iter().any(|(c, _)| *c == m.cluster)),
        );
        self.spills += u32::from(sel.spills > 0);
        self.multi_tier += u32::from(sel.tiers.len() > 1);
        let has_reason = |r: TierReason| sel.tiers.iter().any(|t| t.reasons.contains(&r));
        self.failing_back += u32::from(has_reason(TierReason::FailingBack));
        self.prefer_no_schedule += u32::from(has_reason(TierReason::PreferNoSchedule));
        self.gateway_first_tier += u32::from(
            sel.tiers
                .first()
                .is_some_and(|t| t.members.iter().any(|m| m.via_gateway())),
        );
        self.gateway_any_tier += u32::from(
            sel.tiers
                .iter()
                .flat_map(|t| &t.members)
                .any(|m| m.via_gateway()),
        );
        let first: usize = sel.tiers.first().map_or(0, |t| {
            t.members
                .iter()
                .map(|m| if m.via_gateway() { 1 } else { m.ready as usize })
                .sum()
        });
        if let Some(cap) = g.policy.max_answers {
            if first > cap as usize {
                self.capped += 1;
            } else if first > 0 {
                self.cap_not_reached += 1;
            }
        }
        self.empty_answer += u32::from(sel.tiers.is_empty());
        if !sel.tiers.is_empty() {
            match g.policy.mode {
                Mode::Locality => self.locality += 1,
                Mode::Tiers => self.tiers += 1,
                Mode::Weighted => self.weighted += 1,
            }
        }
        self.huge_weight_members += sel
            .tiers
            .iter()
            .flat_map(|t| &t.members)
            .filter(|m| m.weight.checked_mul(100).is_none())
            .count() as u32;
    }

    /// The generator reached every kind of case often enough.
    fn assert_enough(&self) {
        let checks = [
            ("cases", self.cases, CASES),
            ("cases with filtered clusters", self.filtered, 150),
            ("withdrawn", self.withdrawn, 40),
            ("NoExecute", self.no_execute, 40),
            ("no ready endpoints", self.no_ready, 40),
            ("other network, no gateway", self.no_gateway, 40),
            ("not in affinities", self.not_in_affinities, 40),
            ("weight 0", self.weight_zero, 40),
            ("gateway unusable (proxyless)", self.gateway_unusable, 40),
            (
                "all addresses answered by another cluster",
                self.duplicates_filtered,
                5,
            ),
            (
                "some address answered by another cluster",
                self.shadowed,
                25,
            ),
            (
                "proxyless tiers differ from Envoy's",
                self.proxyless_layout_differs,
                30,
            ),
            ("spills", self.spills, 40),
            ("several tiers", self.multi_tier, 50),
            ("failing back", self.failing_back, 30),
            ("prefer no schedule", self.prefer_no_schedule, 30),
            ("gateway in the first tier", self.gateway_first_tier, 30),
            ("gateway in any tier", self.gateway_any_tier, 60),
            ("maxAnswers cuts", self.capped, 40),
            ("maxAnswers not reached", self.cap_not_reached, 20),
            ("nothing to answer", self.empty_answer, 5),
            ("mode Locality", self.locality, 60),
            ("mode Tiers", self.tiers, 40),
            ("mode Weighted", self.weighted, 40),
        ];
        for (what, got, min) in checks {
            assert!(got >= min, "only {got} (< {min}) of {what}: {self:#?}");
        }
    }
}

/// Runs `property` over `CASES` generated cases, counting coverage; panics with the shrunk
/// case on failure.
fn check(
    huge_weights: bool,
    property: impl Fn(&GenCase, &World) -> Result<(), TestCaseError>,
) -> Coverage {
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        // Integration tests have no lib.rs next to them; keep regressions out of the tree.
        failure_persistence: None,
        ..Config::default()
    });
    let coverage = RefCell::new(Coverage::default());
    let result = runner.run(&gen_case(huge_weights), |g| {
        let w = world(&g)?;
        property(&g, &w)?;
        coverage.borrow_mut().count(&g, &w);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let coverage = coverage.into_inner();
    eprintln!("{coverage:?}");
    coverage.assert_enough();
    coverage
}

// ---- properties ----

/// DNS A for `web.shop.global` from a client in C ⊆ the HEALTHY endpoints at EDS priority 0 for
/// an Envoy of C (gateways standing for other networks in both), and equal to them when they
/// fit in maxAnswers. The same holds for a client in no cluster and a node naming none.
fn dns_answers_match_priority_0(g: &GenCase, w: &World) -> Result<(), TestCaseError> {
    let cap = g.policy.max_answers.map(|c| c as usize);
    for (src, cluster) in [(client_ip(w.client), Some(w.client)), (OUTSIDER, None)] {
        let dns = ask(
            &w.answerer,
            &w.snap,
            A_NAME,
            RecordType::A,
            src,
            g.rotation,
            w.now,
        );
        prop_assert_eq!(dns.resp.metadata.response_code, ResponseCode::NoError);
        let answers = a_records(&dns);
        let answered: BTreeSet<IpAddr> = answers.iter().copied().collect();
        prop_assert_eq!(
            answered.len(),
            answers.len(),
            "an address twice in {:?}",
            answers
        );
        let eds = eds(&w.snap, &group(cluster, Role::Envoy), w.now)?;
        let healthy = healthy_at_priority_0(&eds.cla);
        let stray: Vec<_> = answered.difference(&healthy).collect();
        prop_assert!(
            stray.is_empty(),
            "client {:?}: DNS answers {:?} which are not HEALTHY at EDS priority 0 {:?}; tiers {:?}",
            cluster,
            stray,
            healthy,
            w.selection.tiers
        );
        match cap {
            Some(cap) if healthy.len() > cap => prop_assert_eq!(
                answered.len(),
                cap,
                "client {:?}: maxAnswers {} with {} candidates",
                cluster,
                cap,
                healthy.len()
            ),
            _ => prop_assert_eq!(
                &answered,
                &healthy,
                "client {:?}: DNS and EDS priority 0 differ; tiers {:?}",
                cluster,
                w.selection.tiers
            ),
        }
    }
    Ok(())
}

/// No address of a filtered cluster (endpoint or gateway) is emitted: not in DNS A, not in
/// SRV (targets or additional addresses), not at any EDS priority.
fn filtered_clusters_appear_nowhere(g: &GenCase, w: &World) -> Result<(), TestCaseError> {
    let filtered: BTreeSet<usize> = w.selection.filtered.iter().map(|f| f.cluster).collect();
    let members: BTreeSet<usize> = w
        .selection
        .tiers
        .iter()
        .flat_map(|t| &t.members)
        .map(|m| m.cluster)
        .collect();
    prop_assert!(
        filtered.is_disjoint(&members),
        "a cluster both filtered and placed"
    );
    prop_assert_eq!(filtered.len() + members.len(), g.clusters.len());
    let banned: BTreeMap<IpAddr, usize> = filtered
        .iter()
        .flat_map(|&c| addresses_of(g, c).into_iter().map(move |ip| (ip, c)))
        .collect();
    let banned_names: BTreeSet<String> = filtered.iter().map(|&c| name(c)).collect();
    let src = client_ip(w.client);
    for rotation in [g.rotation, g.rotation + 1] {
        let a = ask(
            &w.answerer,
            &w.snap,
            A_NAME,
            RecordType::A,
            src,
            rotation,
            w.now,
        );
        for ip in a_records(&a) {
            prop_assert!(
                !banned.contains_key(&ip),
                "DNS A answers {} of filtered {}",
                ip,
                name(banned[&ip])
            );
        }
    }
    // Nor by its own name: `<cluster>.web.shop.global` answers nothing for a filtered cluster.
    for &c in &filtered {
        let own = ask(
            &w.answerer,
            &w.snap,
            &format!("{}.{A_NAME}", name(c)),
            RecordType::A,
            src,
            0,
            w.now,
        );
        prop_assert!(
            a_records(&own).is_empty(),
            "{}.{} answers {:?} though the decision filters it",
            name(c),
            A_NAME,
            a_records(&own)
        );
    }
    let srv = ask(
        &w.answerer,
        &w.snap,
        SRV_NAME,
        RecordType::SRV,
        src,
        0,
        w.now,
    );
    prop_assert_eq!(srv.resp.metadata.response_code, ResponseCode::NoError);
    for (_, _, target) in srv_records(&srv) {
        let cluster = srv_target_cluster(&target);
        prop_assert!(
            !banned_names.contains(&cluster),
            "SRV target {} in filtered {}",
            target,
            cluster
        );
    }
    for ip in additional_addresses(&srv) {
        prop_assert!(
            !banned.contains_key(&ip),
            "SRV additional {} of filtered {}",
            ip,
            name(banned[&ip])
        );
    }
    let eds = eds(&w.snap, &group(Some(w.client), Role::Envoy), w.now)?;
    for (priority, ip, _) in eds_endpoints(&eds.cla) {
        prop_assert!(
            !banned.contains_key(&ip),
            "EDS priority {} holds {} of filtered {}",
            priority,
            ip,
            name(banned[&ip])
        );
    }
    for locality in &eds.cla.endpoints {
        let sub_zone = locality.locality.as_ref().map(|l| l.sub_zone.clone());
        prop_assert!(
            !sub_zone.as_ref().is_some_and(|s| banned_names.contains(s)),
            "EDS locality of filtered {:?}",
            sub_zone
        );
    }
    Ok(())
}

/// Every weight emitted is positive: Member.weight, SRV weight, EDS locality weight (for an
/// Envoy and a proxyless node of the client's cluster, and for a node naming no cluster); and
/// the locality weights of one EDS priority sum to at most u32::MAX, the xDS API's limit
/// (`LocalityLbEndpoints.load_balancing_weight`; gRPC NACKs an assignment past it).
fn every_weight_is_positive(_: &GenCase, w: &World) -> Result<(), TestCaseError> {
    for tier in &w.selection.tiers {
        for m in &tier.members {
            prop_assert!(m.weight > 0, "member {} has weight 0", name(m.cluster));
        }
    }
    for src in [client_ip(w.client), OUTSIDER] {
        let srv = ask(
            &w.answerer,
            &w.snap,
            SRV_NAME,
            RecordType::SRV,
            src,
            0,
            w.now,
        );
        for (priority, weight, target) in srv_records(&srv) {
            prop_assert!(
                weight > 0,
                "SRV {} priority {} has weight 0",
                target,
                priority
            );
        }
    }
    for group in [
        group(Some(w.client), Role::Envoy),
        group(Some(w.client), Role::Proxyless),
        group(None, Role::Envoy),
    ] {
        let eds = eds(&w.snap, &group, w.now)?;
        let mut sums: BTreeMap<u32, u64> = BTreeMap::new();
        for locality in &eds.cla.endpoints {
            let weight = locality.load_balancing_weight.as_ref().map(|w| w.value);
            *sums.entry(locality.priority).or_default() += u64::from(weight.unwrap_or(0));
            prop_assert!(
                weight.is_some_and(|w| w > 0),
                "{:?}: EDS locality {:?} priority {} has weight {:?}",
                group,
                locality.locality,
                locality.priority,
                weight
            );
        }
        for (priority, sum) in sums {
            prop_assert!(
                sum <= u64::from(u32::MAX),
                "{:?}: the locality weights of EDS priority {} sum to {} > u32::MAX",
                group,
                priority,
                sum
            );
        }
    }
    Ok(())
}

/// The same snapshot, client and clock give byte-identical DNS answers (same rotation) and
/// identical EDS; so does a snapshot built again from the same input.
fn answers_are_deterministic(g: &GenCase, w: &World) -> Result<(), TestCaseError> {
    let again = snapshot(g, w.t0);
    let src = client_ip(w.client);
    let group = group(Some(w.client), Role::Envoy);
    for (qname, qtype) in [(A_NAME, RecordType::A), (SRV_NAME, RecordType::SRV)] {
        let first = ask(&w.answerer, &w.snap, qname, qtype, src, g.rotation, w.now);
        let second = ask(&w.answerer, &w.snap, qname, qtype, src, g.rotation, w.now);
        prop_assert_eq!(
            &first.bytes,
            &second.bytes,
            "{} {}: same snapshot",
            qname,
            qtype
        );
        let rebuilt = ask(&w.answerer, &again, qname, qtype, src, g.rotation, w.now);
        prop_assert_eq!(
            &first.bytes,
            &rebuilt.bytes,
            "{} {}: rebuilt snapshot",
            qname,
            qtype
        );
    }
    let first = eds(&w.snap, &group, w.now)?;
    let second = eds(&w.snap, &group, w.now)?;
    let rebuilt = eds(&again, &group, w.now)?;
    for (what, other) in [("same snapshot", &second), ("rebuilt snapshot", &rebuilt)] {
        prop_assert_eq!(&first.version, &other.version, "EDS version, {}", what);
        prop_assert_eq!(&first.body, &other.body, "EDS bytes, {}", what);
        prop_assert_eq!(&first.cla, &other.cla, "EDS, {}", what);
    }
    let view = again.service("shop", "web").unwrap();
    prop_assert_eq!(&select(&again, view, Some(w.client), w.now), &w.selection);
    Ok(())
}

/// The clusters of each tier, in order.
fn tier_clusters(sel: &Selection) -> Vec<Vec<usize>> {
    sel.tiers
        .iter()
        .map(|t| t.members.iter().map(|m| m.cluster).collect())
        .collect()
}

/// The ready addresses of a decision's first tier, as its members resolve them.
fn first_tier_answerable(w: &World, sel: &Selection) -> BTreeSet<IpAddr> {
    let view = w.snap.service("shop", "web").unwrap();
    sel.tiers
        .first()
        .into_iter()
        .flat_map(|t| &t.members)
        .flat_map(|m| {
            let gateway = m.gateway().map(|(ip, _)| ip);
            let endpoints = sel
                .answerable_of(view, m)
                .filter_map(|e| e.addresses.first().copied());
            gateway.into_iter().chain(endpoints)
        })
        .collect()
}

/// A proxyless gRPC node of C gets exactly the core's decision for a client that cannot use
/// gateways: no gateway address anywhere, one EDS priority per tier (none empty, none
/// skipped), priority 0 = that decision's first tier. Where the DNS/Envoy decision has no
/// gateway member, the proxyless node's assignment is the Envoy node's and DNS answers its
/// priority 0 (within maxAnswers) — one answer for every kind of client.
fn proxyless_nodes_follow_the_same_decision(g: &GenCase, w: &World) -> Result<(), TestCaseError> {
    let gateways: BTreeSet<IpAddr> = (0..g.clusters.len()).map(gateway_ip).collect();
    let grpc = eds(&w.snap, &group(Some(w.client), Role::Proxyless), w.now)?;
    let endpoints = eds_endpoints(&grpc.cla);
    for (priority, ip, _) in &endpoints {
        prop_assert!(
            !gateways.contains(ip),
            "proxyless EDS priority {} holds gateway {}",
            priority,
            ip
        );
    }
    let priorities: BTreeSet<u32> = endpoints.iter().map(|(p, _, _)| *p).collect();
    let expected: BTreeSet<u32> = (0..w.proxyless.tiers.len() as u32).collect();
    prop_assert_eq!(
        &priorities,
        &expected,
        "proxyless EDS priorities vs the decision's tiers {:?}",
        w.proxyless.tiers
    );
    prop_assert_eq!(
        healthy_at_priority_0(&grpc.cla),
        first_tier_answerable(w, &w.proxyless),
        "proxyless priority 0 vs the decision's first tier {:?}",
        w.proxyless.tiers
    );
    let uses_gateway = w
        .selection
        .tiers
        .iter()
        .flat_map(|t| &t.members)
        .any(|m| m.via_gateway());
    if !uses_gateway {
        let envoy = eds(&w.snap, &group(Some(w.client), Role::Envoy), w.now)?;
        prop_assert_eq!(&grpc.cla, &envoy.cla, "no gateway in play: one assignment");
        let dns = ask(
            &w.answerer,
            &w.snap,
            A_NAME,
            RecordType::A,
            client_ip(w.client),
            g.rotation,
            w.now,
        );
        let answered: BTreeSet<IpAddr> = a_records(&dns).into_iter().collect();
        let healthy = healthy_at_priority_0(&grpc.cla);
        match g.policy.max_answers {
            Some(cap) if healthy.len() > cap as usize => {
                prop_assert!(
                    answered.is_subset(&healthy),
                    "DNS {:?} ⊄ {:?}",
                    answered,
                    healthy
                )
            }
            _ => prop_assert_eq!(&answered, &healthy, "DNS vs proxyless priority 0"),
        }
    }
    Ok(())
}

/// `SHARED`, reported by several clusters, is emitted at most once per answer — DNS A, SRV
/// records and their additional addresses, every EDS assignment — and is not lost: whenever
/// a member that resolves to its endpoints has it ready, exactly once.
fn a_shared_address_is_emitted_once(g: &GenCase, w: &World) -> Result<(), TestCaseError> {
    let view = w.snap.service("shop", "web").unwrap();
    let held = |sel: &Selection| {
        sel.tiers.iter().flat_map(|t| &t.members).any(|m| {
            sel.answerable_of(view, m)
                .any(|e| e.addresses.contains(&SHARED))
        })
    };
    let once = |count: usize, held: bool, what: &str| -> Result<(), TestCaseError> {
        prop_assert!(count <= 1, "{}: SHARED {} times", what, count);
        prop_assert!(!held || count == 1, "{}: SHARED lost", what);
        Ok(())
    };
    let count = |ips: &[IpAddr]| ips.iter().filter(|ip| **ip == SHARED).count();
    for (src, cluster) in [(client_ip(w.client), Some(w.client)), (OUTSIDER, None)] {
        let sel = select(&w.snap, view, cluster, w.now);
        let srv = ask(
            &w.answerer,
            &w.snap,
            SRV_NAME,
            RecordType::SRV,
            src,
            0,
            w.now,
        );
        let uncapped = g.policy.max_answers.is_none();
        once(
            count(&additional_addresses(&srv)),
            held(&sel) && uncapped,
            "SRV additionals",
        )?;
        let a = ask(
            &w.answerer,
            &w.snap,
            A_NAME,
            RecordType::A,
            src,
            g.rotation,
            w.now,
        );
        prop_assert!(count(&a_records(&a)) <= 1, "DNS A: SHARED twice");
        for role in [Role::Envoy, Role::Proxyless] {
            if cluster.is_none() && role == Role::Proxyless {
                continue;
            }
            let built = eds(&w.snap, &group(cluster, role), w.now)?;
            let ips: Vec<IpAddr> = eds_endpoints(&built.cla)
                .into_iter()
                .map(|(_, ip, _)| ip)
                .collect();
            let sel = match role {
                Role::Proxyless => &w.proxyless,
                _ => &sel,
            };
            once(count(&ips), held(sel), &format!("EDS {cluster:?} {role:?}"))?;
        }
    }
    Ok(())
}

#[test]
fn proxyless_nodes_get_the_decision_for_clients_without_gateways() {
    check(false, proxyless_nodes_follow_the_same_decision);
}

#[test]
fn an_address_several_clusters_report_is_emitted_once() {
    check(false, a_shared_address_is_emitted_once);
}

#[test]
fn dns_a_answers_are_the_healthy_eds_priority_0_endpoints() {
    check(false, dns_answers_match_priority_0);
}

#[test]
fn filtered_clusters_appear_in_no_answer_and_no_assignment() {
    check(false, filtered_clusters_appear_nowhere);
}

#[test]
fn every_emitted_weight_is_positive() {
    let coverage = check(true, every_weight_is_positive);
    assert!(
        coverage.huge_weight_members >= 20,
        "only {} members with weights past u32::MAX / 100",
        coverage.huge_weight_members
    );
}

#[test]
fn answers_and_assignments_are_deterministic() {
    check(false, answers_are_deterministic);
}
