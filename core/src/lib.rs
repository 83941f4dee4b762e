//! meridian-core: the pure, synchronous heart of meridian.
//!
//! ```text
//!  source events, converted by controllers/
//!    member objects ────── apply / delete / reset(cluster) ─► Index ─────┐ (Dirty: services
//!    hub members ───────── upsert / remove ─────────────────► Registry ──┤  that changed)
//!    heartbeats, watches ─ heartbeat_*, watch_status, tick ──┘           │
//!    hub policies ──────── Policies::new ───────────────────► Policies ──┤
//!                                                                        ▼
//!                        Snapshot::build / Snapshot::rebuild(prev, dirty) ─► Snapshot
//!                        (immutable, versioned; src/ publishes it on a tokio watch)
//!
//!  select(snapshot, service, client cluster, now)           ─► Selection: tiers in priority
//!  select_on_network(…, client network, now)                   order, weighted members, and
//!    asked by DNS answers, xDS builders, write-back, explain   the filtered clusters and why
//! ```
//!
//! No tokio, no kube, no sockets: everything here is tested with plain `#[test]`s and a fake
//! clock (`Instant`s passed in). The one writer that feeds the Index and the Registry and
//! publishes snapshots lives in the binary (`src/store.rs`).

pub mod index;
pub mod model;
pub mod policy;
pub mod registry;
pub mod select;
pub mod snapshot;
#[cfg(test)]
mod testing;

pub use index::{Dirty, Index, IndexSizes, Kind, Object};
pub use model::*;
pub use policy::{
    AffinityTier, ClusterSet, LabelSelector, Operator, Policies, Policy, Requirement,
    ServiceSelector, WeightRule,
};
pub use registry::{Health, MemberHealth, Registry, Transition};
pub use select::{
    FilterReason, Member, Mode, Selection, Tier, TierReason, Toleration, TrafficPolicy, select,
    select_on_network,
};
pub use snapshot::{Backend, ClusterView, Conflict, Problem, ServiceView, Snapshot};
