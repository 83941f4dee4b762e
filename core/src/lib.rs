//! meridian-core: the pure, synchronous heart of meridian.
//!
//! ```text
//!  source events (fleet::Event), converted by controllers/, applied by the one writer, Fleet:
//!    member objects ────── apply / delete / reset(cluster) ─► Index ─────┐ (Dirty: services
//!    hub members ───────── upsert / remove ─────────────────► Registry ──┤  that changed)
//!    heartbeats, watches ─ heartbeat_*, watch_status, tick ──┘           │
//!    hub policies ──────── Policies::new ───────────────────► Policies ──┤
//!    problems (problem::Problem) ────────────────────────────────────────┤
//!    geo ranges (geo::GeoTable, one Arc shared by every snapshot) ────────┤
//!    tenants (tenant::Tenants, shared likewise) ─────────────────────────┤
//!    routes (route::RouteTable: HTTPRoutes, GRPCRoutes resolved) ─────────┤
//!                                                                        ▼
//!                        Snapshot::build / Snapshot::rebuild(prev, dirty) ─► Snapshot
//!                        (immutable, versioned; src/ publishes it on a tokio watch)
//!
//!  Snapshot::locate(ip) ─► ClientPlace (a cluster, a geo locality: geo::locate's rule)
//!  select(snapshot, service, client cluster, now)        ─► Selection: tiers in priority
//!  select_for(…, &Client{cluster, network, gateways}, now)   order, weighted members — each
//!    asked by DNS answers, xDS builders, write-back, explain  resolved to its endpoints or its
//!                                                             gateway — and the filtered
//!                                                             clusters and why
//! ```
//!
//! No tokio, no kube, no sockets: everything here is tested with plain `#[test]`s and a fake
//! clock (`Instant`s passed in). The one writer is [`fleet::Fleet`]; the binary's
//! `src/store.rs` only feeds it events from a channel and publishes the snapshots it builds.

pub mod admission;
pub mod agent;
pub mod checks;
pub mod fleet;
pub mod geo;
pub mod index;
pub mod model;
pub mod placement;
pub mod policy;
pub mod prefix;
pub mod problem;
pub mod registry;
pub mod route;
pub mod select;
pub mod selector;
pub mod shard;
pub mod snapshot;
pub mod tenant;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod whatif;

pub use geo::{ClientPlace, GeoBuilder, GeoConflict, GeoTable};
pub use index::{Dirty, Index, IndexSizes, Kind, Object};
pub use model::*;
pub use placement::stages;
pub use placement::{
    Capacity, ConflictResolution, Division, OverridePolicy, PlacementPolicy, Placements,
    Propagation, PurgeMode, Quota, ReplicaScheduling, Resources, SpreadBy, SpreadConstraint,
    Template, TemplateKey, TemplateSelector, Workload,
};
pub use policy::{
    AffinityTier, ClusterSet, Drain, FailurePercentage, LabelSelector, Mode, Operator,
    OutlierDetection, Policies, Policy, Requirement, ServiceSelector, Toleration,
    TolerationOperator, TrafficPolicy, WeightRule, toleration_for,
};
pub use problem::{ObjectRef, Origin, Problem, Source, Subject};
pub use registry::{Health, MemberHealth, Registry, Transition};
pub use select::{
    Client, FilterReason, Member, Selection, Tier, TierReason, Via, select, select_for,
};
pub use snapshot::{Backend, ClusterView, Conflict, ServiceView, Snapshot, Stamp};
pub use tenant::{Tenant, TenantNamespaces, Tenants};

/// `text` as a regular expression (RE2's syntax, which Envoy, gRPC and Prometheus read)
/// matching only itself: every character but ASCII letters, digits, `-` and `_` escaped.
pub fn regex_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if !c.is_ascii_alphanumeric() && c != '-' && c != '_' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
