//! meridian-controllers: the edge between Kubernetes and meridian's model, in both directions.
//!
//! ```text
//!  in:  hub dir / hub API ──► directory::run_hub | kubernetes::hub::run ──► SourceEvent::Members
//!                                 └─ members::MemberTasks: one source task per member
//!       member dir ──► directory::run_member ──┐  crd + k8s-openapi types ──► convert::*
//!       member API ──► kubernetes::member::run ┘  (per object; model types only from here on)
//!                                                   ──► SourceEvent (mpsc) ──► the one writer
//!                                                       (src/store.rs: Index, Registry)
//!  out: Snapshot (watch) ──► kubernetes::status::run     MemberCluster status on the hub
//!                        ──► kubernetes::writeback::run  ServiceExport conditions, ServiceImports,
//!                                                        derived Services and EndpointSlices
//!       both only while kubernetes::leader says this replica leads
//! ```
//!
//! Kubernetes object types never leave this crate: sources hand model types to the writer,
//! and the writers read Snapshots. Bad input rejects only itself and is reported with file,
//! object and reason.

pub mod convert;
pub mod crd;
pub mod directory;
pub mod kubernetes;
pub mod manifest;
pub mod members;
pub mod policy;

use meridian_core::{ClusterId, ClusterObjects, ClusterSpec, Kind, Object, ObjectKey};

pub use manifest::ManifestError;

/// What sources tell the wiring. One writer (the store task) applies these to the Index and
/// the Registry, so sources never take a lock.
#[derive(Debug)]
pub enum SourceEvent {
    /// The full list of members on the hub.
    Members {
        specs: Vec<ClusterSpec>,
        /// The ClusterSchedulingPolicies on the hub (those that passed validation).
        policies: Vec<meridian_core::Policy>,
        problems: Vec<ManifestError>,
    },
    /// A member's full object list (a relist): replaces its slice of the Index in one step.
    Reset {
        cluster: ClusterId,
        objects: ClusterObjects,
        /// Objects (or parts of them) that were rejected.
        problems: Vec<ManifestError>,
        /// Objects served with a caveat (e.g. unknown fields ignored).
        warnings: Vec<ManifestError>,
    },
    /// Changes to a member's objects since its last Reset or Changes (a watch event batch).
    Changes {
        cluster: ClusterId,
        changes: Vec<Change>,
        /// The member's rejected objects, all of them (replaces the previous list).
        problems: Vec<ManifestError>,
    },
    /// A heartbeat result: `Err(reason)` when the member could not be reached or read.
    Heartbeat {
        cluster: ClusterId,
        result: Result<(), String>,
    },
    /// A member's watches: `Some(reason)` while one fails or stalls, `None` once all are fine.
    WatchHealth {
        cluster: ClusterId,
        failure: Option<String>,
    },
}

/// One change to one object of a member.
#[derive(Debug, Clone)]
pub enum Change {
    Upsert(Object),
    Delete(Kind, ObjectKey),
}
