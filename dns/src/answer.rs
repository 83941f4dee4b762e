//! The answer function: one request and one Snapshot in, one response out. Pure and
//! synchronous; UDP misses and hickory-server's TCP handler both call it (a UDP cache hit
//! replays bytes it produced), so the paths can only differ in how bytes travel, never in what
//! is answered. What a name resolves to is the scheduling core's decision
//! (`meridian_core::select`: tiers, and per member its endpoints or its gateway); this module
//! only turns it into records.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use hickory_proto::op::{Edns, Metadata, OpCode, ResponseCode};
use hickory_proto::rr::rdata::opt::{ClientSubnet, EdnsCode, EdnsOption};
use hickory_proto::rr::rdata::{A, AAAA, HINFO, NS, SOA, SRV, TXT};
use hickory_proto::rr::{DNSClass, LowerName, Name, RData, Record, RecordType};
use hickory_server::zone_handler::MessageRequest;
use meridian_core::{
    ClientPlace, Endpoint, FilterReason, Member, Selection, ServiceView, Snapshot, Stamp,
    select_for,
};

use crate::config::{DnsConfig, Style, ZoneConfig};
use crate::names::{self, Named};

/// The EDNS payload size meridian advertises and the ceiling it honours (DNS flag day 2020).
pub const EDNS_PAYLOAD: u16 = 1232;
/// Records per message in a zone transfer.
const AXFR_CHUNK: usize = 256;
/// Distinct rotations of one answer kept in the cache.
const MAX_ROTATIONS: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// A response before encoding.
#[derive(Clone, Debug)]
pub struct Response {
    pub metadata: Metadata,
    pub answers: Vec<Record>,
    pub authorities: Vec<Record>,
    pub additionals: Vec<Record>,
    pub edns: Option<Edns>,
    /// The same question from the same client cluster gets the same bytes (for this snapshot
    /// and rotation), so the UDP hot path may cache them.
    pub cacheable: bool,
    /// How many rotations of this answer exist (1: the order never changes).
    pub rotations: usize,
    /// Which configured zone answered (for metrics).
    pub zone: Option<usize>,
    /// Further messages of a zone transfer (TCP only).
    pub continuation: Vec<Vec<Record>>,
    /// What a cacheable answer was decided from: how long the cache may keep it.
    pub depends: Depends,
    /// Whether the reply repeats the question. Not for malformed questions (more than one,
    /// or a compression pointer, which in a question can only point into the header).
    pub echo_question: bool,
}

impl Response {
    fn new(req: &MessageRequest) -> Self {
        Self {
            metadata: Metadata::response_from_request(&req.metadata),
            answers: Vec::new(),
            authorities: Vec::new(),
            additionals: Vec::new(),
            edns: None,
            cacheable: true,
            rotations: 1,
            zone: None,
            continuation: Vec::new(),
            depends: Depends::Snapshot,
            echo_question: true,
        }
    }

    fn rcode(mut self, code: ResponseCode) -> Self {
        self.metadata.response_code = code;
        self
    }
}

/// What an answer was decided from, so a cache keeps it exactly as long as that holds.
#[derive(Clone, Debug)]
pub enum Depends {
    /// The whole snapshot: the apex SOA (its serial), anything not tied to one service.
    Snapshot,
    /// Only which names exist: a name that is no service's (NXDOMAIN, empty non-terminals).
    Names,
    /// One service's decision: its view, the clusters it spans, its policy, the time.
    Service(Arc<Stamp>),
}

struct Zone {
    cfg: ZoneConfig,
    text: String,
    apex: Name,
    /// The apex in wire format, lower-case, with its root label (`answer::fast`).
    apex_wire: Box<[u8]>,
    ns_name: Name,
    soa_rname: Name,
    labels: usize,
}

/// What a name holds.
enum Found {
    NxDomain,
    /// Answers (empty: NODATA) and additional records.
    Records {
        answers: Vec<Record>,
        additionals: Vec<Record>,
        rotations: usize,
    },
}

impl Found {
    fn nodata() -> Self {
        Found::Records {
            answers: Vec::new(),
            additionals: Vec::new(),
            rotations: 1,
        }
    }

    fn answers(answers: Vec<Record>) -> Self {
        Found::Records {
            answers,
            additionals: Vec::new(),
            rotations: 1,
        }
    }
}

/// One question's context, threaded through the lookups.
#[derive(Clone, Copy)]
struct Ask<'a> {
    snap: &'a Snapshot,
    zone: &'a Zone,
    client: Option<ClientPlace>,
    rotation: usize,
    now: Instant,
}

/// The client as the answer function sees it.
#[derive(Clone, Copy, Debug)]
pub struct Client {
    /// Its cluster, or its geo locality when it is outside the fleet (`Snapshot::locate`).
    pub place: Option<ClientPlace>,
    /// The ECS option to echo, with its scope set.
    pub ecs: Option<ClientSubnet>,
}

pub struct Answerer {
    cfg: Arc<DnsConfig>,
    zones: Vec<Zone>,
    serial_base: u32,
    /// Counts the decisions behind answers, when the server wires it.
    decisions: Option<DecisionMetrics>,
}

impl Answerer {
    /// `serial_base` is added to the snapshot version to make the SOA serial, so serials keep
    /// increasing across restarts (the wiring passes the start time).
    pub fn new(cfg: DnsConfig, serial_base: u32) -> Self {
        let zones = cfg
            .zones
            .iter()
            .map(|z| {
                let apex = Name::from(&z.name);
                let child = |l: &str| {
                    Name::from_ascii(l)
                        .and_then(|n| n.append_domain(&apex))
                        .unwrap_or_else(|_| apex.clone())
                };
                Zone {
                    cfg: z.clone(),
                    text: apex.to_string(),
                    ns_name: child("ns"),
                    soa_rname: child("hostmaster"),
                    labels: usize::from(apex.num_labels()),
                    apex_wire: wire_name(&apex),
                    apex,
                }
            })
            .collect();
        Self {
            cfg: Arc::new(cfg),
            zones,
            serial_base,
            decisions: None,
        }
    }

    /// Counts every decision made while answering in `metrics`.
    pub fn with_decision_metrics(mut self, metrics: DecisionMetrics) -> Self {
        self.decisions = Some(metrics);
        self
    }

    fn decide(
        &self,
        snap: &Snapshot,
        view: &ServiceView,
        client: Option<ClientPlace>,
        now: Instant,
    ) -> meridian_core::Selection {
        let selection = select(snap, view, client, now);
        if let Some(m) = &self.decisions {
            m.record(&selection);
        }
        selection
    }

    pub fn config(&self) -> &DnsConfig {
        &self.cfg
    }

    /// The zone's apex as text, for metric labels.
    pub fn zone_name(&self, zone: usize) -> &str {
        self.zones.get(zone).map_or("", |z| z.text.as_str())
    }

    /// Where the client is (its cluster, a geo locality, or unknown): EDNS Client Subnet when
    /// present (its scope is echoed), else the source address.
    pub fn client(&self, snap: &Snapshot, req: &MessageRequest, src: IpAddr) -> Client {
        let ecs = req
            .edns
            .as_ref()
            .and_then(|e| match e.option(EdnsCode::Subnet) {
                Some(EdnsOption::Subnet(cs)) => Some(*cs),
                _ => None,
            });
        match ecs {
            Some(cs) if cs.source_prefix() > 0 => Client {
                place: snap.locate(cs.addr()),
                ecs: Some(ClientSubnet::new(
                    cs.addr(),
                    cs.source_prefix(),
                    cs.source_prefix(),
                )),
            },
            Some(cs) => Client {
                place: snap.locate(src),
                ecs: Some(ClientSubnet::new(cs.addr(), 0, 0)),
            },
            None => Client {
                place: snap.locate(src),
                ecs: None,
            },
        }
    }

    /// Answers one request.
    pub fn respond(
        &self,
        snap: &Snapshot,
        req: &MessageRequest,
        src: IpAddr,
        transport: Transport,
        rotation: usize,
        now: Instant,
    ) -> Response {
        let client = self.client(snap, req, src);
        self.respond_as(snap, req, client, src, transport, rotation, now)
    }

    /// Answers one request as if it came from `client` (used by `respond` and to explain).
    #[allow(clippy::too_many_arguments)]
    pub fn respond_as(
        &self,
        snap: &Snapshot,
        req: &MessageRequest,
        client: Client,
        src: IpAddr,
        transport: Transport,
        rotation: usize,
        now: Instant,
    ) -> Response {
        let mut resp = Response::new(req);
        // Whatever the answer, it repeats only a sane question: exactly one, without a
        // compression pointer (in a question it can only point into the header).
        let question = match req.queries.queries() {
            [query] if !has_compression_pointer(req.queries.as_bytes()) => Some(query),
            _ => {
                resp.echo_question = false;
                None
            }
        };
        if let Some(edns) = &req.edns {
            let mut out = Edns::new();
            out.set_max_payload(EDNS_PAYLOAD);
            out.set_version(0);
            if let Some(ecs) = client.ecs {
                out.options_mut().insert(EdnsOption::Subnet(ecs));
                resp.cacheable = false;
            }
            resp.edns = Some(out);
            if edns.version() > 0 {
                return resp.rcode(ResponseCode::BADVERS);
            }
        }
        if req.metadata.op_code != OpCode::Query {
            return resp.rcode(ResponseCode::NotImp);
        }
        let Some(query) = question else {
            return resp.rcode(ResponseCode::FormErr);
        };
        if query.query_class() != DNSClass::IN {
            return resp.rcode(ResponseCode::Refused);
        }
        let Some((zi, zone)) = self.zone_of(query.name()) else {
            return resp.rcode(ResponseCode::Refused);
        };
        resp.zone = Some(zi);
        resp.metadata.authoritative = true;
        if !snap.synced {
            return resp.rcode(ResponseCode::ServFail);
        }
        let qtype = query.query_type();
        if matches!(qtype, RecordType::AXFR | RecordType::IXFR) {
            resp.cacheable = false;
            return self.transfer(resp, snap, zone, src, transport, now);
        }
        let name = Name::from(query.name());
        let labels = relative_labels(&name, zone.labels);
        let Some(labels) = labels else {
            return self.negative(resp, snap, zone, ResponseCode::NXDomain);
        };
        let target = names::parse(&labels, zone.cfg.style, zone.cfg.namespace.as_deref());
        if target == Named::WhoAmI {
            return self.whoami(resp, snap, zone, &name, qtype, (client, src));
        }
        resp.depends = depends_of(snap, &target);
        let lookup_type = if qtype == RecordType::ANY {
            RecordType::A
        } else {
            qtype
        };
        let ask = Ask {
            snap,
            zone,
            client: client.place,
            rotation,
            now,
        };
        let found = self.lookup(ask, &name, target, lookup_type);
        match found {
            Found::NxDomain => self.negative(resp, snap, zone, ResponseCode::NXDomain),
            Found::Records { .. } if qtype == RecordType::ANY => {
                // RFC 8482: a name that exists answers ANY with one synthesised HINFO.
                resp.answers.push(Record::from_rdata(
                    name,
                    self.cfg.ttl,
                    RData::HINFO(HINFO::new("RFC8482".into(), String::new())),
                ));
                resp
            }
            Found::Records { answers, .. } if answers.is_empty() => {
                self.negative(resp, snap, zone, ResponseCode::NoError)
            }
            Found::Records {
                answers,
                additionals,
                rotations,
            } => {
                resp.answers = answers;
                resp.additionals = additionals;
                resp.rotations = rotations;
                resp
            }
        }
    }

    /// The service a name is about (`namespace`, `name`), if any.
    pub fn service_of(&self, name: &Name) -> Option<(String, String)> {
        let lower = LowerName::new(name);
        let (_, zone) = self.zone_of(&lower)?;
        let name = Name::from(&lower);
        let labels = relative_labels(&name, zone.labels)?;
        names::parse(&labels, zone.cfg.style, zone.cfg.namespace.as_deref())
            .service()
            .map(|(ns, svc)| (ns.to_string(), svc.to_string()))
    }

    /// Whether a service's names exist for this client: in the clusterset style a headless
    /// service with no ready endpoint does not exist (MCS DNS), nor does anything below it.
    fn service_exists(ask: Ask<'_>, view: &ServiceView) -> bool {
        ask.zone.cfg.style != Style::Clusterset
            || !view.headless
            || exists_in(ask.zone, view, &select(ask.snap, view, ask.client, ask.now))
    }

    fn zone_of(&self, name: &LowerName) -> Option<(usize, &Zone)> {
        self.zones
            .iter()
            .enumerate()
            .filter(|(_, z)| z.cfg.name.zone_of(name))
            .max_by_key(|(_, z)| z.labels)
    }

    fn negative(
        &self,
        mut resp: Response,
        snap: &Snapshot,
        zone: &Zone,
        code: ResponseCode,
    ) -> Response {
        resp.authorities.push(self.soa(snap, zone));
        resp.rcode(code)
    }

    /// The SOA serial of a snapshot: it grows with every snapshot and across restarts.
    fn serial(&self, snap: &Snapshot) -> u32 {
        self.serial_base.wrapping_add(snap.version as u32)
    }

    fn soa(&self, snap: &Snapshot, zone: &Zone) -> Record {
        let serial = self.serial(snap);
        Record::from_rdata(
            zone.apex.clone(),
            self.cfg.ttl,
            RData::SOA(SOA::new(
                zone.ns_name.clone(),
                zone.soa_rname.clone(),
                serial,
                60,
                10,
                3600,
                self.cfg.ttl,
            )),
        )
    }

    /// The probe's answer: the cluster (or the place outside the fleet) meridian takes the
    /// asker for, and the address it judged by. Never cached: it is about one source.
    fn whoami(
        &self,
        mut resp: Response,
        snap: &Snapshot,
        zone: &Zone,
        name: &Name,
        qtype: RecordType,
        (client, src): (Client, IpAddr),
    ) -> Response {
        resp.cacheable = false;
        if !matches!(qtype, RecordType::TXT | RecordType::ANY) {
            return self.negative(resp, snap, zone, ResponseCode::NoError);
        }
        let cluster = client
            .place
            .and_then(ClientPlace::cluster)
            .and_then(|i| snap.clusters.get(i))
            .map_or("", |c| c.spec.id.as_str());
        let judged = match client.ecs {
            Some(ecs) => format!("{}/{}", ecs.addr(), ecs.source_prefix()),
            None => src.to_string(),
        };
        let text = format!("cluster={cluster} source={judged}");
        resp.answers.push(Record::from_rdata(
            name.clone(),
            0,
            RData::TXT(TXT::new(vec![text])),
        ));
        resp
    }

    fn lookup(&self, ask: Ask<'_>, name: &Name, target: Named<'_>, qtype: RecordType) -> Found {
        let Ask {
            snap,
            zone,
            client,
            now,
            ..
        } = ask;
        let ttl = self.cfg.ttl;
        match target {
            Named::Unknown => Found::NxDomain,
            // Answered before any lookup (`whoami`): it depends on the source, not the fleet.
            Named::WhoAmI => Found::nodata(),
            Named::Apex => Found::answers(match qtype {
                RecordType::SOA => vec![self.soa(snap, zone)],
                RecordType::NS => vec![Record::from_rdata(
                    name.clone(),
                    ttl,
                    RData::NS(NS(zone.ns_name.clone())),
                )],
                _ => Vec::new(),
            }),
            Named::DnsVersion => Found::answers(match qtype {
                RecordType::TXT => vec![Record::from_rdata(
                    name.clone(),
                    ttl,
                    RData::TXT(TXT::new(vec!["1.0.0".into()])),
                )],
                _ => Vec::new(),
            }),
            Named::ServicesRoot if snap.has_services() => Found::nodata(),
            Named::ServicesRoot => Found::NxDomain,
            Named::Namespace { ns } if snap.has_namespace(ns) => Found::nodata(),
            Named::Namespace { ns: "ns" } => Found::answers(
                self.cfg
                    .ns_address
                    .and_then(|ip| address_record(name, ttl, ip, qtype))
                    .into_iter()
                    .collect(),
            ),
            Named::Namespace { .. } => Found::NxDomain,
            Named::Service { ns, svc } => {
                let Some(view) = snap.service(ns, svc) else {
                    return Found::NxDomain;
                };
                let sel = self.decide(snap, view, client, now);
                if !exists_in(zone, view, &sel) {
                    return Found::NxDomain;
                }
                if !is_address(qtype) {
                    return Found::nodata();
                }
                let ttl = view.policy.ttl.unwrap_or(ttl);
                let (addrs, rotations) = self.service_addresses(ask, view, &sel, qtype);
                Found::Records {
                    answers: addrs
                        .into_iter()
                        .filter_map(|ip| address_record(name, ttl, ip, qtype))
                        .collect(),
                    additionals: Vec::new(),
                    rotations,
                }
            }
            Named::Cluster { ns, svc, cluster } => {
                let Some(view) = snap.service(ns, svc) else {
                    return Found::NxDomain;
                };
                let Some(ci) = snap.cluster_index(cluster) else {
                    return Found::NxDomain;
                };
                if view.backend_of(ci).is_none() {
                    return Found::NxDomain;
                }
                // What the decision resolved this cluster to for this client: a cluster it
                // filters out (withdrawn, drained by a taint, outside the policy's tiers,
                // weight 0, unreachable network) is not named either.
                let sel = select(snap, view, client, now);
                let member = sel.member_of(ci);
                let ttl = view.policy.ttl.unwrap_or(ttl);
                if zone.cfg.style == Style::Clusterset {
                    // Per-cluster names exist only above headless hostnames (the MCS spec
                    // forbids them for ClusterSetIP services), and as the SRV target of a
                    // cluster reached through its gateway.
                    let Some(member) = member.filter(|_| view.headless) else {
                        return Found::NxDomain;
                    };
                    return Found::answers(
                        member
                            .gateway()
                            .and_then(|(address, _)| address_record(name, ttl, address, qtype))
                            .into_iter()
                            .collect(),
                    );
                }
                let Some(member) = member.filter(|_| is_address(qtype)) else {
                    return Found::nodata();
                };
                Found::answers(
                    member_addresses(view, &sel, member)
                        .filter_map(|ip| address_record(name, ttl, ip, qtype))
                        .collect(),
                )
            }
            Named::Endpoint {
                ns,
                svc,
                cluster,
                host,
            } => {
                let Some(view) = snap.service(ns, svc) else {
                    return Found::NxDomain;
                };
                if zone.cfg.style == Style::Clusterset && !view.headless {
                    return Found::NxDomain;
                }
                let Some(ci) = snap.cluster_index(cluster) else {
                    return Found::NxDomain;
                };
                let Some(backend) = view.backend_of(ci) else {
                    return Found::NxDomain;
                };
                if endpoint_names_held_back(&select(snap, view, client, now), ci) {
                    return Found::NxDomain;
                }
                let Some(ep) = backend.answerable().find(|e| endpoint_label(e) == host) else {
                    return Found::NxDomain;
                };
                let ttl = view.policy.ttl.unwrap_or(ttl);
                Found::answers(
                    ep.addresses
                        .iter()
                        .filter_map(|ip| address_record(name, ttl, *ip, qtype))
                        .collect(),
                )
            }
            Named::SrvProto { ns, svc, proto } => match snap.service(ns, svc) {
                Some(view)
                    if Self::service_exists(ask, view)
                        && view
                            .ports
                            .iter()
                            .any(|p| p.name.is_some() && p.protocol.srv_label() == proto) =>
                {
                    Found::nodata()
                }
                _ => Found::NxDomain,
            },
            Named::Srv {
                ns,
                svc,
                port,
                proto,
            } => {
                let Some(view) = snap.service(ns, svc) else {
                    return Found::NxDomain;
                };
                let selection = (zone.cfg.style == Style::Global || view.headless)
                    .then(|| self.decide(snap, view, client, now));
                if selection
                    .as_ref()
                    .is_some_and(|sel| !exists_in(zone, view, sel))
                {
                    return Found::NxDomain;
                }
                let Some(sport) = view
                    .ports
                    .iter()
                    .find(|p| p.name.as_deref() == Some(port) && p.protocol.srv_label() == proto)
                else {
                    return Found::NxDomain;
                };
                if qtype != RecordType::SRV {
                    return Found::nodata();
                }
                match selection {
                    Some(sel) => self.srv_records(ask, name, view, sport, &sel),
                    None => self.cluster_set_ip_srv(ask, name, view, sport),
                }
            }
        }
    }

    /// What a service name answers A or AAAA with for this client (addresses of the asked
    /// family), in rotation `ask.rotation`, and how many rotations the answer has.
    fn service_addresses(
        &self,
        ask: Ask<'_>,
        view: &ServiceView,
        sel: &Selection,
        qtype: RecordType,
    ) -> (Vec<IpAddr>, usize) {
        let answer = self.service_answer(ask, view, sel, qtype);
        (
            answer.rotation(ask.rotation % answer.rotations),
            answer.rotations,
        )
    }

    /// Every rotation of a service name's A or AAAA answer for this client, decided once.
    /// MCS: a client cluster that imports a ClusterSetIP service gets the import's addresses.
    fn service_answer(
        &self,
        ask: Ask<'_>,
        view: &ServiceView,
        sel: &Selection,
        qtype: RecordType,
    ) -> Rotations {
        let import = ask
            .client
            .and_then(ClientPlace::cluster)
            .and_then(|c| view.import_of(c));
        if let (Style::Clusterset, false, Some(ips)) = (ask.zone.cfg.style, view.headless, import) {
            let v4 = qtype == RecordType::A;
            let addrs: Vec<IpAddr> = ips
                .iter()
                .copied()
                .filter(|ip| ip.is_ipv4() == v4)
                .collect();
            return Rotations {
                weighted: Weighted {
                    groups: vec![(1, addrs.len())],
                    addrs,
                },
                rotations: 1,
                cap: 0,
            };
        }
        let weighted = first_tier_addresses(view, sel, qtype);
        Rotations {
            rotations: weighted.addrs.len().clamp(1, MAX_ROTATIONS),
            weighted,
            cap: view.policy.max_answers.unwrap_or(self.cfg.max_answers) as usize,
        }
    }

    /// MCS: a ClusterSetIP service's SRV points at the service name itself.
    fn cluster_set_ip_srv(
        &self,
        ask: Ask<'_>,
        name: &Name,
        view: &ServiceView,
        sport: &meridian_core::Port,
    ) -> Found {
        let ttl = view.policy.ttl.unwrap_or(self.cfg.ttl);
        let service_name = service_name(ask.zone, view);
        let answers = vec![Record::from_rdata(
            name.clone(),
            ttl,
            RData::SRV(SRV::new(0, 100, sport.port, service_name.clone())),
        )];
        let mut additionals = Vec::new();
        for qtype in [RecordType::A, RecordType::AAAA] {
            let target = names::Named::Service {
                ns: &view.key.namespace,
                svc: &view.key.name,
            };
            if let Found::Records { answers, .. } = self.lookup(ask, &service_name, target, qtype) {
                additionals.extend(answers);
            }
        }
        Found::Records {
            answers,
            additionals,
            rotations: 1,
        }
    }

    /// One SRV record per endpoint (or gateway) over every tier of the decision.
    fn srv_records(
        &self,
        ask: Ask<'_>,
        name: &Name,
        view: &ServiceView,
        sport: &meridian_core::Port,
        sel: &Selection,
    ) -> Found {
        let snap = ask.snap;
        let ttl = view.policy.ttl.unwrap_or(self.cfg.ttl);
        let service_name = service_name(ask.zone, view);
        let mut answers = Vec::new();
        let mut additionals = Vec::new();
        for (priority, tier) in sel.tiers.iter().enumerate() {
            let priority = u16::try_from(priority).unwrap_or(u16::MAX);
            let shares = srv_weights(tier);
            for (member, share) in tier.members.iter().zip(shares) {
                let cluster = &snap.clusters[member.cluster];
                let cluster_name = child_name(&[cluster.spec.id.as_str()], &service_name);
                if let Some((address, port)) = member.gateway() {
                    answers.push(Record::from_rdata(
                        name.clone(),
                        ttl,
                        RData::SRV(SRV::new(priority, share, port, cluster_name.clone())),
                    ));
                    additionals.extend(address_record(
                        &cluster_name,
                        ttl,
                        address,
                        any_family(address),
                    ));
                    continue;
                }
                for ep in sel.answerable_of(view, member) {
                    let target = child_name(
                        &[&endpoint_label(ep), cluster.spec.id.as_str()],
                        &service_name,
                    );
                    let port = ep.target_port(sport);
                    answers.push(Record::from_rdata(
                        name.clone(),
                        ttl,
                        RData::SRV(SRV::new(priority, share, port, target.clone())),
                    ));
                    additionals.extend(
                        ep.addresses
                            .iter()
                            .filter_map(|ip| address_record(&target, ttl, *ip, any_family(*ip))),
                    );
                }
            }
        }
        let cap = view.policy.max_answers.unwrap_or(self.cfg.max_answers) as usize;
        if cap > 0 && answers.len() > cap {
            answers.truncate(cap);
        }
        Found::Records {
            answers,
            additionals,
            rotations: 1,
        }
    }

    /// AXFR / IXFR (always a full transfer): only over TCP, only to `dns.allowTransfer`.
    fn transfer(
        &self,
        mut resp: Response,
        snap: &Snapshot,
        zone: &Zone,
        src: IpAddr,
        transport: Transport,
        now: Instant,
    ) -> Response {
        if transport == Transport::Udp {
            return resp.rcode(ResponseCode::NotImp);
        }
        if !self.cfg.allow_transfer.iter().any(|net| net.contains(&src)) {
            return resp.rcode(ResponseCode::Refused);
        }
        let soa = self.soa(snap, zone);
        let mut records = vec![soa.clone()];
        records.push(Record::from_rdata(
            zone.apex.clone(),
            self.cfg.ttl,
            RData::NS(NS(zone.ns_name.clone())),
        ));
        if zone.cfg.style == Style::Clusterset {
            let name = child_name(&["dns-version"], &zone.apex);
            records.extend(self.records_at(snap, zone, &name, &[RecordType::TXT], now));
        }
        for view in snap.services() {
            if zone
                .cfg
                .namespace
                .as_deref()
                .is_some_and(|ns| ns != &*view.key.namespace)
            {
                continue;
            }
            let svc_name = service_name(zone, view);
            records.extend(self.records_at(
                snap,
                zone,
                &svc_name,
                &[RecordType::A, RecordType::AAAA],
                now,
            ));
            for port in view.ports.iter().filter(|p| p.name.is_some()) {
                let srv = child_name(
                    &[
                        &format!("_{}", port.name.as_deref().unwrap_or_default()),
                        &format!("_{}", port.protocol.srv_label()),
                    ],
                    &svc_name,
                );
                records.extend(self.records_at(snap, zone, &srv, &[RecordType::SRV], now));
            }
            // One decision per service, not one per endpoint name: a transfer is linear in
            // the records it holds.
            let selection = select(snap, view, None, now);
            for backend in &view.backends {
                let cluster = &snap.clusters[backend.cluster];
                let cname = child_name(&[cluster.spec.id.as_str()], &svc_name);
                records.extend(self.records_at(
                    snap,
                    zone,
                    &cname,
                    &[RecordType::A, RecordType::AAAA],
                    now,
                ));
                if zone.cfg.style == Style::Clusterset && !view.headless
                    || endpoint_names_held_back(&selection, backend.cluster)
                {
                    continue;
                }
                let ttl = view.policy.ttl.unwrap_or(self.cfg.ttl);
                let mut seen = HashSet::new();
                for ep in backend.answerable() {
                    let label = endpoint_label(ep);
                    if !seen.insert(label.clone()) {
                        continue; // the name answers the first endpoint with that label
                    }
                    let ename = child_name(&[&label], &cname);
                    for qtype in [RecordType::A, RecordType::AAAA] {
                        records.extend(
                            ep.addresses
                                .iter()
                                .filter_map(|ip| address_record(&ename, ttl, *ip, qtype)),
                        );
                    }
                }
            }
        }
        records.push(soa);
        let mut chunks: Vec<Vec<Record>> =
            records.chunks(AXFR_CHUNK).map(<[Record]>::to_vec).collect();
        resp.answers = chunks.remove(0);
        resp.continuation = chunks;
        resp
    }

    /// The records a name holds for an unknown client (what a zone transfer shows).
    fn records_at(
        &self,
        snap: &Snapshot,
        zone: &Zone,
        name: &Name,
        types: &[RecordType],
        now: Instant,
    ) -> Vec<Record> {
        let Some(labels) = relative_labels(name, zone.labels) else {
            return Vec::new();
        };
        let target = names::parse(&labels, zone.cfg.style, zone.cfg.namespace.as_deref());
        types
            .iter()
            .flat_map(|t| {
                match self.lookup(
                    Ask {
                        snap,
                        zone,
                        client: None,
                        rotation: 0,
                        now,
                    },
                    name,
                    target,
                    *t,
                ) {
                    Found::Records { answers, .. } => answers,
                    Found::NxDomain => Vec::new(),
                }
            })
            .collect()
    }
}

/// Whether the first name in wire-format `bytes` uses a compression pointer.
/// What the answer about `target` is decided from: a name below an exported service is that
/// service's business; any other name but the apex only depends on which names exist.
fn depends_of(snap: &Snapshot, target: &Named<'_>) -> Depends {
    match target.service() {
        Some((ns, svc)) => snap
            .service(ns, svc)
            .map_or(Depends::Names, |view| Depends::Service(view.stamp.clone())),
        None if *target == Named::Apex => Depends::Snapshot,
        None => Depends::Names,
    }
}

fn has_compression_pointer(bytes: &[u8]) -> bool {
    let mut pos = 0;
    while let Some(&len) = bytes.get(pos) {
        if len & 0xC0 != 0 {
            return true;
        }
        if len == 0 {
            return false;
        }
        pos += 1 + usize::from(len);
    }
    false
}

fn exists_in(zone: &Zone, view: &ServiceView, sel: &Selection) -> bool {
    zone.cfg.style != Style::Clusterset || !view.headless || !sel.tiers.is_empty()
}

/// Labels left of the zone apex, leftmost first; `None` if a label is not text.
fn relative_labels(name: &Name, zone_labels: usize) -> Option<Vec<&str>> {
    let n = usize::from(name.num_labels());
    name.iter()
        .take(n.saturating_sub(zone_labels))
        .map(|l| std::str::from_utf8(l).ok())
        .collect()
}

/// A name in wire format, lower-case, uncompressed.
fn wire_name(name: &Name) -> Box<[u8]> {
    let mut wire = Vec::new();
    for label in name.iter() {
        wire.push(label.len() as u8);
        wire.extend(label.iter().map(u8::to_ascii_lowercase));
    }
    wire.push(0);
    wire.into_boxed_slice()
}

fn is_address(qtype: RecordType) -> bool {
    matches!(qtype, RecordType::A | RecordType::AAAA)
}

fn any_family(ip: IpAddr) -> RecordType {
    if ip.is_ipv4() {
        RecordType::A
    } else {
        RecordType::AAAA
    }
}

fn address_record(name: &Name, ttl: u32, ip: IpAddr, qtype: RecordType) -> Option<Record> {
    match (ip, qtype) {
        (IpAddr::V4(v4), RecordType::A) => {
            Some(Record::from_rdata(name.clone(), ttl, RData::A(A(v4))))
        }
        (IpAddr::V6(v6), RecordType::AAAA) => {
            Some(Record::from_rdata(name.clone(), ttl, RData::AAAA(AAAA(v6))))
        }
        _ => None,
    }
}

/// The first tier's addresses of the asked family, cluster after cluster in the tier's order
/// (a cluster on another network: its gateway), with each cluster's weight and how many of the
/// addresses are its. One flat list: this is on every cache miss.
#[derive(Debug, Default)]
struct Weighted {
    addrs: Vec<IpAddr>,
    /// (weight, number of addresses), one per cluster that has any.
    groups: Vec<(u32, usize)>,
}

fn first_tier_addresses(view: &ServiceView, sel: &Selection, qtype: RecordType) -> Weighted {
    let mut weighted = Weighted::default();
    let Some(tier) = sel.tiers.first() else {
        return weighted;
    };
    let want_v4 = qtype == RecordType::A;
    for member in &tier.members {
        let before = weighted.addrs.len();
        weighted
            .addrs
            .extend(member_addresses(view, sel, member).filter(|ip| ip.is_ipv4() == want_v4));
        let n = weighted.addrs.len() - before;
        if n > 0 {
            weighted.groups.push((member.weight, n));
        }
    }
    weighted
}

/// What a member of the decision answers with: its gateway's address, or the addresses of
/// its answerable endpoints.
fn member_addresses<'v>(
    view: &'v ServiceView,
    sel: &'v Selection,
    member: &'v Member,
) -> impl Iterator<Item = IpAddr> + 'v {
    let gateway = member.gateway().map(|(address, _)| address);
    let endpoints = sel
        .answerable_of(view, member)
        .flat_map(|e| e.addresses.iter().copied());
    gateway.into_iter().chain(endpoints)
}

/// An address answer in each of its rotations.
#[derive(Debug)]
struct Rotations {
    weighted: Weighted,
    rotations: usize,
    /// At most this many addresses (0: all).
    cap: usize,
}

impl Rotations {
    /// Rotation `r` (below `rotations`), capped.
    fn rotation(&self, r: usize) -> Vec<IpAddr> {
        let (tail, head) = self.from(self.starts(r + 1)[r]);
        tail.iter().chain(head).copied().collect()
    }

    /// Where each of the first `n` rotations starts in the address list: the rotations' first
    /// addresses are spread over the clusters in proportion to their weights (smooth weighted
    /// round-robin), and over each cluster's addresses in turn. A client that takes the first
    /// address (or a `maxAnswers` cap) so splits traffic by weight, as EDS locality weights do.
    /// One pass for all of them (a miss encodes every rotation of a short answer).
    fn starts(&self, n: usize) -> Vec<usize> {
        let Weighted { addrs, groups } = &self.weighted;
        if addrs.len() < 2 || groups.is_empty() {
            return vec![0; n];
        }
        let total: i64 = groups.iter().map(|(w, _)| i64::from(*w)).sum();
        let offsets: Vec<usize> = (groups.iter())
            .scan(0, |at, (_, len)| {
                let offset = *at;
                *at += len;
                Some(offset)
            })
            .collect();
        // Per cluster: its current credit and how many rotations it started.
        let mut state = vec![(0i64, 0usize); groups.len()];
        (0..n)
            .map(|_| {
                for ((credit, _), (w, _)) in state.iter_mut().zip(groups) {
                    *credit += i64::from(*w);
                }
                let pick = (0..groups.len())
                    .max_by_key(|&i| (state[i].0, std::cmp::Reverse(i)))
                    .expect("groups is not empty");
                state[pick].0 -= total;
                state[pick].1 += 1;
                offsets[pick] + (state[pick].1 - 1) % groups[pick].1
            })
            .collect()
    }

    /// The answer starting at `start`, wrapped around and capped, as the two slices of the
    /// address list it is made of (no copy).
    fn from(&self, start: usize) -> (&[IpAddr], &[IpAddr]) {
        let addrs = &self.weighted.addrs;
        let start = start.min(addrs.len());
        let (head, tail) = addrs.split_at(start);
        let cap = if self.cap > 0 { self.cap } else { addrs.len() };
        let first = tail.len().min(cap);
        (&tail[..first], &head[..(cap - first).min(head.len())])
    }
}

/// Whether the endpoint names of cluster `ci` answer nothing: a hostname is an explicit
/// address (a StatefulSet member), so the policy's filters apply; the client's network, and
/// another cluster answering the same address for the service name, are its own business.
fn endpoint_names_held_back(selection: &Selection, ci: usize) -> bool {
    selection.filter_reason(ci).is_some_and(|r| {
        !matches!(
            r,
            FilterReason::OtherNetworkNoGateway
                | FilterReason::GatewayUnusable
                | FilterReason::DuplicateAddresses(_)
        )
    })
}

/// The DNS label of an endpoint: its hostname, else its first address with dashes
/// (`10-0-0-1`, `fd00--1`).
pub fn endpoint_label(ep: &Endpoint) -> String {
    match &ep.hostname {
        Some(h) => h.to_ascii_lowercase(),
        None => ep
            .addresses
            .first()
            .map(|a| a.to_string().replace(['.', ':'], "-"))
            .unwrap_or_default(),
    }
}

/// The SRV weight of each record of each member of a tier. A gateway record carries its
/// cluster's weight; an endpoint an equal share of it, so the split between clusters is the
/// one xDS gives. Weights are ×100 (so small shares stay distinct) and scaled down together
/// when the largest would not fit SRV's 16 bits, keeping the proportions; never 0.
fn srv_weights(tier: &meridian_core::Tier) -> Vec<u16> {
    let raw: Vec<u64> = tier
        .members
        .iter()
        .map(|m| {
            let total = u64::from(m.weight) * 100;
            if m.via_gateway() {
                total
            } else {
                total.div_ceil(u64::from(m.ready.max(1)))
            }
        })
        .collect();
    let max = raw.iter().copied().max().unwrap_or(1).max(1);
    let limit = u64::from(u16::MAX);
    raw.into_iter()
        .map(|w| {
            let scaled = if max > limit { w * limit / max } else { w };
            u16::try_from(scaled.max(1)).unwrap_or(u16::MAX)
        })
        .collect()
}

fn child_name(labels: &[&str], parent: &Name) -> Name {
    let mut name = parent.clone();
    for label in labels.iter().rev() {
        if let Ok(child) =
            Name::from_labels([label.as_bytes()]).and_then(|l| l.append_domain(&name))
        {
            name = child;
        }
    }
    name
}

fn service_name(zone: &Zone, view: &ServiceView) -> Name {
    match (zone.cfg.style, &zone.cfg.namespace) {
        (Style::Global, Some(_)) => child_name(&[&view.key.name], &zone.apex),
        (Style::Global, None) => child_name(&[&view.key.name, &view.key.namespace], &zone.apex),
        (Style::Clusterset, _) => {
            child_name(&[&view.key.name, &view.key.namespace, "svc"], &zone.apex)
        }
    }
}

/// The scheduling core's decision for a client wherever `Snapshot::locate` put it (a geo
/// client gets Locality tiers from its locality: the decision stays in core).
fn select(
    snap: &Snapshot,
    view: &ServiceView,
    client: Option<ClientPlace>,
    now: Instant,
) -> Selection {
    select_for(snap, view, &meridian_core::Client::at(snap, client), now)
}

pub(crate) mod fast;

/// Scheduling decisions made while answering (cache misses: hits repeat a decision).
#[derive(Debug, Clone)]
pub struct DecisionMetrics(meridian_listen::metrics::DecisionMetrics);

impl DecisionMetrics {
    pub fn new(registry: &mut prometheus_client::registry::Registry) -> Self {
        Self(meridian_listen::metrics::DecisionMetrics::new(
            registry,
            "for answers",
        ))
    }

    pub fn record(&self, selection: &meridian_core::Selection) {
        self.0.decided(selection.first_tier_label(), 1);
        self.0
            .merged(u64::from(selection.spills), selection.failing_back() as u64);
    }
}

#[cfg(test)]
mod tests;
