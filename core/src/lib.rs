//! meridian-core: the pure, synchronous heart of meridian.
//!
//! ```text
//!  sources (controllers/) ──fleet::Event──► Fleet: the one writer, deciding what each event changes
//!    objects ──apply/delete/reset──► Index ────┐
//!    heartbeats, watch health ─────► Registry ─┼─► Snapshot::rebuild ─► (src/ publishes on a
//!    hub policies ─────────────────► Policies ─┘     versioned, immutable   tokio watch)
//!    problems (problem::Problem) ─────────────────► Snapshot::problems, ::warnings
//!  DNS and xDS: select(snapshot, service, client cluster, now) ─► Selection (tiers, weights)
//! ```
//!
//! No tokio, no kube, no sockets: everything here is tested with plain `#[test]`s and a fake
//! clock (`Instant`s passed in).

pub mod fleet;
pub mod index;
pub mod model;
pub mod policy;
pub mod problem;
pub mod registry;
pub mod select;
pub mod snapshot;
#[cfg(test)]
mod testing;

pub use index::{Dirty, Index, IndexSizes, Kind, Object};
pub use model::*;
pub use policy::{
    AffinityTier, ClusterSet, LabelSelector, Mode, Operator, Policies, Policy, Requirement,
    ServiceSelector, Toleration, TrafficPolicy, WeightRule,
};
pub use problem::{ObjectRef, Origin, Problem, Source, Subject};
pub use registry::{Health, MemberHealth, Registry, Transition};
pub use select::{
    Client, FilterReason, Member, Selection, Target, Tier, TierReason, select, select_for,
};
pub use snapshot::{Backend, ClusterView, Conflict, ServiceView, Snapshot};
