//! `meridian_agent_*` on the hub: joins and renewals by result, streams open, streams refused
//! by reason.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// admitted, refused (the token or request), failed (the hub's store)
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// no_certificate, not_an_agent, impersonation, bad_event, not_a_member
    pub reason: &'static str,
}

#[derive(Clone, Default)]
pub struct AgentMetrics {
    pub joins: Family<ResultLabels, Counter>,
    pub renewals: Family<ResultLabels, Counter>,
    pub streams: Gauge,
    pub refused: Family<ReasonLabels, Counter>,
}

impl AgentMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "joins",
            "Agent joins by result (admitted; refused: the token or request; failed: the hub's store)",
            m.joins.clone(),
        );
        registry.register(
            "renewals",
            "Agent certificate renewals by result",
            m.renewals.clone(),
        );
        registry.register(
            "streams",
            "Agent streams open (delivering to their member)",
            m.streams.clone(),
        );
        registry.register(
            "streams_refused",
            "Agent streams refused by reason (no certificate, not an agent's, speaking for another cluster, a bad event, no such agent member)",
            m.refused.clone(),
        );
        m
    }

    pub(crate) fn join(&self, result: &'static str) {
        self.joins.get_or_create(&ResultLabels { result }).inc();
    }

    pub(crate) fn renewal(&self, result: &'static str) {
        self.renewals.get_or_create(&ResultLabels { result }).inc();
    }

    pub(crate) fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&ReasonLabels { reason }).inc();
    }
}
