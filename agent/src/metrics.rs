//! `meridian_agent_*` on the hub: joins and renewals by result, streams open, streams refused
//! by reason.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// admitted, pending (waiting for `meridian approve`), refused (the token or request),
    /// failed (the hub's store)
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
    /// New streams that waited for the admission rate.
    pub admission_waits: Counter,
    /// Requests for members' APIs sent down agents' streams, and those waiting for (the rest
    /// of) their answers (watches among them).
    pub api_requests: Counter,
    pub api_waiting: Gauge,
}

impl AgentMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "joins",
            "Agent joins by result (admitted; pending: waiting for approval; refused: the token or request; failed: the hub's store)",
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
        registry.register(
            "admission_waits",
            "New agent streams that waited for the admission rate (agent.admissionPerSecond)",
            m.admission_waits.clone(),
        );
        registry.register(
            "api_requests",
            "Requests for agent members' APIs sent down their agents' streams (the hub's writes and watches of those members)",
            m.api_requests.clone(),
        );
        registry.register(
            "api_requests_waiting",
            "Requests for agent members' APIs waiting for (the rest of) their answers, watches included",
            m.api_waiting.clone(),
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

/// What the agent process shows on its own admin server (`meridian agent --admin-listen`):
/// `meridian_agent_*` metrics of the member's side and a `/debug` view.
#[derive(Clone, Default)]
pub struct AgentSide {
    pub connected: Gauge,
    pub events_sent: Counter,
    pub heartbeats_sent: Counter,
    /// The hub's requests for the member's API the agent carried (refused ones included).
    pub api_requests: Counter,
    pub reconnects: Counter,
    /// Streams sent the member's whole state again after falling `STREAM_QUEUE` events
    /// behind (`watch_set.rs`).
    pub resyncs: Counter,
    /// Objects the agent keeps from its watches (what a new stream is given first).
    pub watch_store_objects: Gauge,
    pub renewals: Family<ResultLabels, Counter>,
    /// The certificate's notAfter, seconds since the epoch.
    pub certificate_expiry: Gauge,
    pub view: std::sync::Arc<parking_lot::Mutex<AgentView>>,
}

/// The agent's state for `/debug`.
#[derive(Clone, Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentView {
    pub hub: String,
    pub cluster: String,
    pub connected: bool,
    /// The hub replicas' addresses a stream is open to.
    pub streams: std::collections::BTreeSet<String>,
    /// When the current stream opened, or the last one ended (seconds since the epoch).
    pub since_unix: i64,
    pub certificate_expires_unix: i64,
    pub heartbeat_seconds: u64,
    /// Why the last stream ended or could not open.
    pub last_error: Option<String>,
}

impl AgentView {
    /// The stream to the replica at `address` is no longer open.
    pub(crate) fn stream_ended(&mut self, address: std::net::SocketAddr) {
        self.streams.remove(&address.to_string());
        self.connected = !self.streams.is_empty();
    }
}

impl AgentSide {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "connected",
            "Streams the agent holds to the hub's replicas (one per address the hub's name resolves to)",
            m.connected.clone(),
        );
        registry.register(
            "events_sent",
            "Watch events of the member sent to the hub",
            m.events_sent.clone(),
        );
        registry.register(
            "heartbeats_sent",
            "Heartbeats sent to the hub",
            m.heartbeats_sent.clone(),
        );
        registry.register(
            "api_requests",
            "The hub's requests for the member's API carried by the agent (writes and watches of the hub's writers)",
            m.api_requests.clone(),
        );
        registry.register(
            "reconnects",
            "Streams to the hub that ended or could not open (each followed by a jittered wait)",
            m.reconnects.clone(),
        );
        registry.register(
            "resyncs",
            "Streams to the hub sent the member's whole state again after falling behind the watches",
            m.resyncs.clone(),
        );
        registry.register(
            "watch_store_objects",
            "Objects kept from the member's one set of watches, shared by every stream to the hub",
            m.watch_store_objects.clone(),
        );
        registry.register(
            "renewals",
            "Certificate renewals by result (admitted, refused, failed)",
            m.renewals.clone(),
        );
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "When the agent's certificate expires (seconds since the epoch)",
            m.certificate_expiry.clone(),
        );
        m
    }

    pub(crate) fn renewal(&self, result: &'static str) {
        self.renewals.get_or_create(&ResultLabels { result }).inc();
    }

    pub(crate) fn update(&self, f: impl FnOnce(&mut AgentView)) {
        let mut view = self.view.lock();
        f(&mut view);
        self.connected
            .set(i64::try_from(view.streams.len()).unwrap_or(i64::MAX));
        self.certificate_expiry.set(view.certificate_expires_unix);
    }
}
