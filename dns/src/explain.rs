//! "What would meridian answer, and why?" — the same answer function, asked on behalf of a
//! client in a given cluster, with the scheduling decision behind it spelled out.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use hickory_server::net::xfer::Protocol;
use hickory_server::server::Request;
use meridian_core::{ClientPlace, FilterReason, Locality, Snapshot, TierReason, select_for};
use serde::Serialize;

use crate::answer::{Answerer, Client, Transport};

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub name: String,
    pub qtype: String,
    pub client_cluster: Option<String>,
    /// The geo locality of a client asked about by address that no cluster claims.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_geo: Option<Locality>,
    pub rcode: String,
    /// The rcode's mnemonic as dig prints it (`NOERROR`, `NXDOMAIN`, …).
    pub status: String,
    pub answers: Vec<String>,
    pub authority: Vec<String>,
    pub additionals: Vec<String>,
    pub decision: Option<Decision>,
}

/// The scheduling core's decision for the service the name belongs to.
#[derive(Debug, Serialize)]
pub struct Decision {
    pub service: String,
    pub headless: bool,
    pub tiers: Vec<TierView>,
    pub filtered: Vec<FilteredView>,
    pub spills: u32,
    pub conflicts: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct TierView {
    pub priority: usize,
    pub reasons: Vec<TierReason>,
    pub ready: u32,
    pub clusters: Vec<MemberView>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberView {
    pub cluster: String,
    pub weight: u32,
    pub ready: u32,
    pub via_gateway: bool,
}

#[derive(Debug, Serialize)]
pub struct FilteredView {
    pub cluster: String,
    #[serde(flatten)]
    pub reason: FilterReason,
}

#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("invalid name {0:?}: {1}")]
    Name(String, String),
    #[error("unknown record type {0:?}")]
    Type(String),
    #[error("unknown cluster {0:?}")]
    Cluster(String),
}

/// Explains what a client in `from_cluster` (or an unknown client) would be answered.
pub fn explain(
    answerer: &Answerer,
    snap: &Snapshot,
    name: &str,
    qtype: &str,
    from_cluster: Option<&str>,
) -> Result<Explanation, ExplainError> {
    explain_at(answerer, snap, name, qtype, from_cluster, Instant::now())
}

/// [`explain`] at `now` (a what-if asks its imagined fleet at a later instant).
pub fn explain_at(
    answerer: &Answerer,
    snap: &Snapshot,
    name: &str,
    qtype: &str,
    from_cluster: Option<&str>,
    now: Instant,
) -> Result<Explanation, ExplainError> {
    let place = match from_cluster {
        Some(c) => Some(ClientPlace::Cluster(
            snap.cluster_index(c)
                .ok_or_else(|| ExplainError::Cluster(c.into()))?,
        )),
        None => None,
    };
    explain_place(answerer, snap, name, qtype, place, now)
}

/// Explains what a client at `address` (a source address or an EDNS Client Subnet) would be
/// answered: in the cluster whose CIDRs hold it, in a geo range's locality, or unknown.
pub fn explain_from_address(
    answerer: &Answerer,
    snap: &Snapshot,
    name: &str,
    qtype: &str,
    address: IpAddr,
) -> Result<Explanation, ExplainError> {
    explain_place(
        answerer,
        snap,
        name,
        qtype,
        snap.locate(address),
        Instant::now(),
    )
}

fn explain_place(
    answerer: &Answerer,
    snap: &Snapshot,
    name: &str,
    qtype: &str,
    place: Option<ClientPlace>,
    now: Instant,
) -> Result<Explanation, ExplainError> {
    let mut qname =
        Name::from_ascii(name).map_err(|e| ExplainError::Name(name.into(), e.to_string()))?;
    qname.set_fqdn(true);
    let rtype: RecordType = qtype
        .to_ascii_uppercase()
        .parse()
        .map_err(|_| ExplainError::Type(qtype.into()))?;
    let mut message = Message::new(0, MessageType::Query, OpCode::Query);
    message.add_query(Query::query(qname.clone(), rtype));
    let bytes = message
        .to_vec()
        .map_err(|e| ExplainError::Name(name.into(), e.to_string()))?;
    let src = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let request = Request::from_bytes(bytes, (src, 0).into(), Protocol::Tcp)
        .map_err(|e| ExplainError::Name(name.into(), e.to_string()))?;
    let client = Client { place, ecs: None };
    let resp = answerer.respond_as(snap, &request, client, src, Transport::Tcp, 0, now);
    let decision = answerer.service_of(&qname).and_then(|(ns, svc)| {
        let view = snap.service(&ns, &svc)?;
        let sel = select_for(snap, view, &meridian_core::Client::at(snap, place), now);
        let cluster_name = |i: usize| {
            snap.clusters
                .get(i)
                .map(|c| c.spec.id.to_string())
                .unwrap_or_default()
        };
        Some(Decision {
            service: format!("{ns}/{svc}"),
            headless: view.headless,
            tiers: sel
                .tiers
                .iter()
                .enumerate()
                .map(|(priority, t)| TierView {
                    priority,
                    reasons: t.reasons.clone(),
                    ready: t.ready,
                    clusters: t
                        .members
                        .iter()
                        .map(|m| MemberView {
                            cluster: cluster_name(m.cluster),
                            weight: m.weight,
                            ready: m.ready,
                            via_gateway: m.via_gateway(),
                        })
                        .collect(),
                })
                .collect(),
            filtered: sel
                .filtered
                .iter()
                .map(|f| FilteredView {
                    cluster: cluster_name(f.cluster),
                    reason: f.reason.clone(),
                })
                .collect(),
            spills: sel.spills,
            conflicts: view
                .conflicts
                .iter()
                .map(|c| format!("{}: {}", c.cluster, c.reason))
                .collect(),
        })
    });
    let show =
        |records: &[hickory_proto::rr::Record]| records.iter().map(ToString::to_string).collect();
    Ok(Explanation {
        name: qname.to_string(),
        qtype: rtype.to_string(),
        client_cluster: place
            .and_then(ClientPlace::cluster)
            .and_then(|c| snap.clusters.get(c))
            .map(|c| c.spec.id.to_string()),
        client_geo: match place {
            Some(ClientPlace::Geo(g)) => snap.geo.locality(g).cloned(),
            _ => None,
        },
        rcode: resp.metadata.response_code.to_string(),
        status: mnemonic(resp.metadata.response_code),
        answers: show(&resp.answers),
        authority: show(&resp.authorities),
        additionals: show(&resp.additionals),
        decision,
    })
}

/// The RFC 1035/6895 mnemonic of an rcode, as dig's `status:` prints it.
fn mnemonic(code: hickory_proto::op::ResponseCode) -> String {
    use hickory_proto::op::ResponseCode as R;
    match code {
        R::NoError => "NOERROR".into(),
        R::FormErr => "FORMERR".into(),
        R::ServFail => "SERVFAIL".into(),
        R::NXDomain => "NXDOMAIN".into(),
        R::NotImp => "NOTIMP".into(),
        R::Refused => "REFUSED".into(),
        other => format!("RCODE{}", u16::from(other)),
    }
}
