//! `meridian_gateway_*`: requests by route, cluster and code, their latency, and the members
//! an aggregated request had to leave out.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// member, every, hub
    pub route: &'static str,
    pub cluster: String,
    pub code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    pub cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone)]
pub struct GatewayMetrics {
    pub requests: Family<RequestLabels, Counter>,
    /// Until the response head is sent (a watch's stream is not counted).
    pub seconds: Family<RouteLabels, Histogram>,
    /// A member left out of an aggregated list or watch (down, failed, or refused).
    pub partial: Family<ClusterLabels, Counter>,
    pub unauthenticated: Counter,
    /// Requests of a tenant's user outside its clusters or namespaces (403 at the gateway).
    pub tenant_refused: Counter,
    pub watches: Gauge,
    /// Watches open to members for fleet watches: one per member a fleet watch holds.
    pub member_watches: Gauge,
    /// Merged lists whose body ended with an error because a member failed after the head
    /// (and its Warnings) went out.
    pub lists_cut: Family<ClusterLabels, Counter>,
    /// Upgraded connections (exec, attach, port-forward) open through the gateway.
    pub tunnels: Gauge,
    /// Key set refreshes after the first read, by result (ok, failed).
    pub jwks_refreshes: Family<ResultLabels, Counter>,
}

impl GatewayMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self {
            requests: Family::default(),
            seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0005, 2.0, 16))
            }),
            partial: Family::default(),
            unauthenticated: Counter::default(),
            tenant_refused: Counter::default(),
            watches: Gauge::default(),
            member_watches: Gauge::default(),
            lists_cut: Family::default(),
            tunnels: Gauge::default(),
            jwks_refreshes: Family::default(),
        };
        registry.register(
            "requests",
            "Gateway requests by route, cluster and code",
            m.requests.clone(),
        );
        registry.register(
            "request_seconds",
            "Gateway time to the response head by route",
            m.seconds.clone(),
        );
        registry.register(
            "partial",
            "Members left out of an aggregated list or watch (down, failed or refused)",
            m.partial.clone(),
        );
        registry.register(
            "unauthenticated",
            "Requests refused with 401",
            m.unauthenticated.clone(),
        );
        registry.register(
            "tenant_refused",
            "Requests of a tenant's user refused with 403 at the gateway (outside its clusters or namespaces, or a cluster-scoped write)",
            m.tenant_refused.clone(),
        );
        registry.register(
            "watches",
            "Watches open through the gateway",
            m.watches.clone(),
        );
        registry.register(
            "member_watches",
            "Watches open to members for watches through /clusters/* (one per member each holds)",
            m.member_watches.clone(),
        );
        registry.register(
            "lists_cut",
            "Lists through /clusters/* ended with an error after their head was sent, by the member that failed",
            m.lists_cut.clone(),
        );
        registry.register(
            "tunnels",
            "Upgraded connections (exec, attach, port-forward) open through the gateway",
            m.tunnels.clone(),
        );
        registry.register(
            "jwks_refreshes",
            "Refreshes of the issuer's key set by result (a failed one keeps the keys held)",
            m.jwks_refreshes.clone(),
        );
        m
    }
}
