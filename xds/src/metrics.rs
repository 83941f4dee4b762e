//! xDS metrics, registered under `meridian_xds_`.

use meridian_listen::metrics::DecisionMetrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamLabels {
    pub protocol: &'static str,
    /// A fleet cluster name, or "unknown": nodes choose CLUSTER_ID freely, so only names
    /// the fleet knows become label values.
    pub cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabels {
    /// CDS, EDS, LDS or RDS.
    pub resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UnsupportedLabels {
    /// A well-known type URL meridian does not serve, or "other" (see
    /// `stream::unsupported_label`): clients cannot grow the label set.
    pub type_url: &'static str,
}

#[derive(Debug)]
pub struct XdsMetrics {
    pub decisions: DecisionMetrics,
    pub streams: Family<StreamLabels, Gauge>,
    pub subscriptions: Family<TypeLabels, Gauge>,
    pub pushes: Family<TypeLabels, Counter>,
    pub acks: Family<TypeLabels, Counter>,
    pub nacks: Family<TypeLabels, Counter>,
    pub stale_nonces: Family<TypeLabels, Counter>,
    pub push_to_ack: Histogram,
    pub stream_errors: Family<ReasonLabels, Counter>,
    pub unsupported_types: Family<UnsupportedLabels, Counter>,
    pub view_builds: Counter,
    pub view_build_seconds: Histogram,
    pub admission_waits: Counter,
    pub admission_waiting: Gauge,
}

impl XdsMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self {
            decisions: DecisionMetrics::new(registry, "made building assignments"),
            streams: Family::default(),
            subscriptions: Family::default(),
            pushes: Family::default(),
            acks: Family::default(),
            nacks: Family::default(),
            stale_nonces: Family::default(),
            // 1 ms … ~16 s
            push_to_ack: Histogram::new([
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 16.0,
            ]),
            stream_errors: Family::default(),
            unsupported_types: Family::default(),
            view_builds: Counter::default(),
            view_build_seconds: Histogram::new([
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
            admission_waits: Counter::default(),
            admission_waiting: Gauge::default(),
        };
        registry.register(
            "streams",
            "Connected ADS streams by protocol (sotw, delta) and cluster",
            m.streams.clone(),
        );
        registry.register(
            "subscriptions",
            "Connected streams that subscribe to each resource type",
            m.subscriptions.clone(),
        );
        registry.register(
            "pushes",
            "Discovery responses sent, by type",
            m.pushes.clone(),
        );
        registry.register("acks", "ACKs received, by type", m.acks.clone());
        registry.register(
            "nacks",
            "NACKs received, by type (the last error per node is on /debug/xds)",
            m.nacks.clone(),
        );
        registry.register(
            "stale_nonces",
            "Requests ignored for a nonce that is not the last one sent",
            m.stale_nonces.clone(),
        );
        registry.register(
            "push_to_ack_seconds",
            "Time from sending a response to its ACK",
            m.push_to_ack.clone(),
        );
        registry.register(
            "stream_errors",
            "Streams ended by the server, by reason",
            m.stream_errors.clone(),
        );
        registry.register(
            "unsupported_type_requests",
            "Requests for a type meridian does not serve (ignored; the stream stays open), by type URL",
            m.unsupported_types.clone(),
        );
        registry.register(
            "view_builds",
            "Resource sets built (one per node group and snapshot version)",
            m.view_builds.clone(),
        );
        registry.register(
            "view_build_seconds",
            "Time to build one node group's resources for one snapshot",
            m.view_build_seconds.clone(),
        );
        registry.register(
            "admission_waits",
            "New streams that waited for admission (reconnect storms)",
            m.admission_waits.clone(),
        );
        registry.register(
            "admission_waiting",
            "New streams waiting for admission now",
            m.admission_waiting.clone(),
        );
        m
    }
}
