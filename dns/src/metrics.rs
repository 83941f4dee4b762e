//! DNS metrics, registered under `meridian_dns_`. Per-query counting is one atomic increment:
//! label sets are resolved once per (zone, type, rcode, transport) and kept.

use std::sync::OnceLock;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::answer::Transport;

const TYPES: [&str; 10] = [
    "A", "AAAA", "SRV", "SOA", "NS", "TXT", "ANY", "AXFR", "IXFR", "other",
];
const RCODES: [&str; 8] = [
    "NOERROR", "NXDOMAIN", "SERVFAIL", "REFUSED", "FORMERR", "NOTIMP", "BADVERS", "other",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueryLabels {
    zone: String,
    qtype: &'static str,
    rcode: &'static str,
    transport: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Debug)]
pub struct DnsMetrics {
    zones: Vec<String>,
    queries: Family<QueryLabels, Counter>,
    slots: Vec<OnceLock<Counter>>,
    pub cache_hits: Counter,
    pub cache_misses: Counter,
    /// Misses the fast encoder answered (`answer::fast`); the others took the full path.
    pub quick_answers: Counter,
    dropped: Family<ReasonLabels, Counter>,
    /// TCP connections meridian closed, by reason: the listener's metrics count its own
    /// deadlines; these are the protocol's (a query not whole in time, a reply not taken,
    /// an impossible length prefix).
    tcp_closed: Family<ReasonLabels, Counter>,
    transfers_refused: Counter,
}

/// Identifies one query counter; cached answers remember theirs.
pub type CounterSlot = usize;

impl DnsMetrics {
    /// `zones` are the configured zone names, in configuration order.
    pub fn new(zones: Vec<String>, registry: &mut Registry) -> Self {
        let metrics = Self {
            slots: (0..(zones.len() + 1) * TYPES.len() * RCODES.len() * 2)
                .map(|_| OnceLock::new())
                .collect(),
            zones,
            queries: Family::default(),
            cache_hits: Counter::default(),
            cache_misses: Counter::default(),
            quick_answers: Counter::default(),
            dropped: Family::default(),
            tcp_closed: Family::default(),
            transfers_refused: Counter::default(),
        };
        registry.register(
            "queries",
            "DNS queries answered, by zone, type, rcode and transport",
            metrics.queries.clone(),
        );
        registry.register(
            "answer_cache_hits",
            "UDP queries answered from cached bytes",
            metrics.cache_hits.clone(),
        );
        registry.register(
            "answer_cache_misses",
            "UDP queries that had to be answered in full",
            metrics.cache_misses.clone(),
        );
        registry.register(
            "answer_quick",
            "UDP cache misses answered by the fast encoder (address questions and NXDOMAIN); the other misses take the full path",
            metrics.quick_answers.clone(),
        );
        registry.register(
            "dropped",
            "Requests not answered at all, by reason",
            metrics.dropped.clone(),
        );
        registry.register(
            "transfers_refused",
            "Zone transfers answered REFUSED because MAX_TRANSFERS (4) were in progress for 5 s",
            metrics.transfers_refused.clone(),
        );
        registry.register(
            "tcp_closed",
            "TCP DNS connections closed by meridian, by reason (idle: no whole query within dns.tcpIdleTimeoutSeconds; write_timeout: a reply not taken; tcp_message_*: an impossible length prefix)",
            metrics.tcp_closed.clone(),
        );
        metrics
    }

    pub fn slot(
        &self,
        zone: Option<usize>,
        qtype: Option<RecordType>,
        rcode: ResponseCode,
        transport: Transport,
    ) -> CounterSlot {
        let z = zone.map_or(self.zones.len(), |z| z.min(self.zones.len()));
        let t = match qtype {
            Some(RecordType::A) => 0,
            Some(RecordType::AAAA) => 1,
            Some(RecordType::SRV) => 2,
            Some(RecordType::SOA) => 3,
            Some(RecordType::NS) => 4,
            Some(RecordType::TXT) => 5,
            Some(RecordType::ANY) => 6,
            Some(RecordType::AXFR) => 7,
            Some(RecordType::IXFR) => 8,
            _ => 9,
        };
        let r = match rcode {
            ResponseCode::NoError => 0,
            ResponseCode::NXDomain => 1,
            ResponseCode::ServFail => 2,
            ResponseCode::Refused => 3,
            ResponseCode::FormErr => 4,
            ResponseCode::NotImp => 5,
            ResponseCode::BADVERS => 6,
            _ => 7,
        };
        ((z * TYPES.len() + t) * RCODES.len() + r) * 2 + usize::from(transport == Transport::Tcp)
    }

    pub fn count(&self, slot: CounterSlot) {
        let Some(cell) = self.slots.get(slot) else {
            return;
        };
        cell.get_or_init(|| {
            let transport = slot % 2;
            let r = (slot / 2) % RCODES.len();
            let t = (slot / 2 / RCODES.len()) % TYPES.len();
            let z = slot / 2 / RCODES.len() / TYPES.len();
            self.queries
                .get_or_create(&QueryLabels {
                    zone: self.zones.get(z).cloned().unwrap_or_else(|| "none".into()),
                    qtype: TYPES[t],
                    rcode: RCODES[r],
                    transport: if transport == 1 { "tcp" } else { "udp" },
                })
                .clone()
        })
        .inc();
    }

    pub fn dropped(&self, reason: &'static str) {
        self.dropped.get_or_create(&ReasonLabels { reason }).inc();
    }

    pub fn transfer_refused(&self) {
        self.transfers_refused.inc();
    }

    pub fn tcp_closed(&self, reason: &'static str) {
        self.tcp_closed
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }
}
