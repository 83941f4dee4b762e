//! Listener metrics, registered under `meridian_listener_`. The `listener` label is one of
//! meridian's own listener names (admin, xds, dns_tcp), never anything a client chooses.
//! Also the decision counters both serving crates (DNS, xDS) register under their own
//! prefixes ([`DecisionMetrics`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    pub listener: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub listener: &'static str,
    /// emfile, enfile, enobufs, enomem, other (accept errors); handshake, idle (timeouts).
    pub kind: &'static str,
}

/// Shared by every listener; each one's series carry its name.
#[derive(Debug, Clone, Default)]
pub struct ListenerMetrics {
    pub accept_errors: Family<KindLabels, Counter>,
    pub rejected: Family<ListenerLabels, Counter>,
    pub timeouts: Family<KindLabels, Counter>,
    pub connections: Family<ListenerLabels, Gauge>,
    pub max_connections: Family<ListenerLabels, Gauge>,
    pub accepting: Family<ListenerLabels, Gauge>,
}

impl ListenerMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "accept_errors",
            "accept(2) failures by listener and kind (emfile: meridian is out of file descriptors); the listener backs off and keeps accepting",
            m.accept_errors.clone(),
        );
        registry.register(
            "rejected_connections",
            "Connections closed at once because the listener was at its maxConnections",
            m.rejected.clone(),
        );
        registry.register(
            "timeouts",
            "Connections closed for sending too little at first (handshake) or nothing for too long (idle)",
            m.timeouts.clone(),
        );
        registry.register(
            "connections",
            "Connections holding a place under the listener's bound (an evicted one gives its place back at once)",
            m.connections.clone(),
        );
        registry.register(
            "max_connections",
            "The connection bound of each listener (computed from the descriptor limit unless set)",
            m.max_connections.clone(),
        );
        registry.register(
            "accepting",
            "1 while the listener accepts connections, 0 while accept(2) keeps failing (see accept_errors)",
            m.accepting.clone(),
        );
        m
    }

    pub(crate) fn labels(listener: &'static str) -> ListenerLabels {
        ListenerLabels { listener }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabels {
    pub first_tier: &'static str,
}

/// The scheduling decisions a serving path made (DNS answers, xDS assignments), registered
/// by each under its own prefix with the same three series; `what` says what the decisions
/// were made for, in the help text.
#[derive(Debug, Clone, Default)]
pub struct DecisionMetrics {
    by_first_tier: Family<TierLabels, Counter>,
    spills: Counter,
    failing_back: Counter,
}

impl DecisionMetrics {
    pub fn new(registry: &mut Registry, what: &str) -> Self {
        let m = Self::default();
        registry.register(
            "decisions",
            format!("Scheduling decisions {what}, by the tier traffic goes to first"),
            m.by_first_tier.clone(),
        );
        registry.register(
            "spills",
            "Tiers merged into the next for lack of healthy endpoints, over those decisions",
            m.spills.clone(),
        );
        registry.register(
            "failing_back",
            "Clusters held back in a FailingBack tier, over those decisions",
            m.failing_back.clone(),
        );
        m
    }

    /// `decisions` decisions whose traffic goes first to `first_tier`.
    pub fn decided(&self, first_tier: &'static str, decisions: u64) {
        self.by_first_tier
            .get_or_create(&TierLabels { first_tier })
            .inc_by(decisions);
    }

    /// The tiers decisions merged into the next (`spills`) and the clusters they held back
    /// (`failing_back`).
    pub fn merged(&self, spills: u64, failing_back: u64) {
        self.spills.inc_by(spills);
        self.failing_back.inc_by(failing_back);
    }
}
