//! Kubernetes sources and writers.
//!
//! ```text
//!  hub API ──hub::run──► MemberClusters, ClusterSchedulingPolicies ──► SourceEvent::Members
//!     │                      └─ one member::run per `spec.source.kubernetes` member
//!     │                              └─ watches + /readyz ──► Reset | Changes | Heartbeat | WatchHealth
//!     ├── leader::start (Lease) ──► Leadership: the leader writes what is hub-wide
//!     └── shard::run (a Lease per replica, a claim per member) ──► Leadership::sharded: each
//!            member's writes are its holder's (every member the leader's when not sharded)
//!         every member writer runs reconcile's loop (Wake, Slots: one applier per
//!         connection, leadership per member, back-off, resync) and says what a member holds:
//!            status::run     MemberCluster status on the hub           (per member)
//!            writeback::run  ServiceExport conditions, ServiceImports, (per member)
//!                            derived Services and EndpointSlices in the members
//!            propagate::run  placed objects in the members; Placements (the leader: a
//!                            and template status on the hub             rollout spans members)
//!            tenants::run    the namespaces Tenants name, in the members (per member)
//!            route_status::run  HTTPRoute and GRPCRoute status on the hub (the leader)
//!                 └─ every write into a cluster: apply::Applier (server-side apply, discovery
//!                    cache, fingerprints in apply::Written, leadership before each request)
//! ```
//! Every replica watches and serves; [`Facts`] is what the member sources learnt that the
//! writers need (clients, versions, capacity, namespaces).

pub mod apply;
pub mod connect;
pub mod diagnose;
pub mod fence;
pub mod hub;
pub mod join;
pub mod leader;
pub mod member;
#[cfg(test)]
mod mock;
pub mod profiles;
pub mod propagate;
pub mod rbac;
pub mod reconcile;
pub mod route_status;
mod secrets;
pub mod shard;
mod start;
pub mod state;
pub mod status;
pub mod templates;
pub mod tenants;
pub mod transport;
pub mod tunnel;
pub mod writeback;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use kube::Client;

use leader::Leadership;
use meridian_core::{ClusterId, ObjectKey};
use meridian_federation::render;

use parking_lot::Mutex;
pub use propagate::PropagationView;
pub use start::{HubSettings, StartError, StartedHub, Writers, start_hub, start_writers};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The label on everything meridian writes into a member (the one rendered copies carry);
/// meridian never touches an object without it. Watches of what members hold leave out
/// what meridian wrote itself ([`MANAGED_BY_SELECTOR_EXCLUDED`]).
pub const MANAGED_BY: (&str, &str) = (render::MANAGED_BY_LABEL, render::MANAGED_BY);
pub use meridian_federation::render::{MANAGED_BY_SELECTOR, MANAGED_BY_SELECTOR_EXCLUDED};
/// A member's Services and EndpointSlices leave out the derived ones meridian writes (each
/// names the service it derives from), not everything meridian writes: a Service placed from
/// a hub template is the member's own service, exported like any other.
pub const DERIVED_EXCLUDED: &str = "!multicluster.kubernetes.io/service-name";
/// The apiVersion and kind of the hub's MemberClusters (their status and meridian's
/// finalizer are written by the member's writer).
pub(crate) const MEMBER_CLUSTER: (&str, &str) = ("meridian.io/v1alpha1", "MemberCluster");

/// `name` if it fits in 63 characters (a DNS label, a label value), else a prefix of it and
/// a hash of `seed`: distinct seeds keep distinct names.
pub(crate) fn bounded_name(name: &str, seed: &str) -> String {
    if name.len() <= 63 {
        return name.to_string();
    }
    let hash = format!("{:016x}", name_hash(seed));
    let prefix = name[..63 - 17].trim_end_matches(['-', '.']);
    format!("{prefix}-{hash}")
}

/// A hash of a name, stable across runs of one build (names derived from it must not move).
pub(crate) fn name_hash(seed: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    seed.hash(&mut h);
    h.finish()
}

/// What a member source knows that the writers need.
#[derive(Clone, Default)]
pub struct MemberFacts {
    pub client: Option<Client>,
    /// What the member's fenced writer client is made from (see `fence`).
    pub writer: Option<connect::Writer>,
    /// Which client: every client a source sets gets a number no other client had, so a
    /// writer knows to rebuild what it built on the last one (a `Client` has no identity).
    pub connection: u64,
    pub kubernetes_version: Option<String>,
    pub last_heartbeat: Option<SystemTime>,
    pub capacity: BTreeMap<String, String>,
    pub allocatable: BTreeMap<String, String>,
    pub namespaces: BTreeSet<String>,
    /// The same namespaces with their labels (what a Tenant's namespaceSelector picks by).
    pub namespace_labels: BTreeMap<String, BTreeMap<String, String>>,
    pub exports: BTreeSet<ObjectKey>,
    /// Every kind has listed once.
    pub listed: bool,
    /// The member left the hub: the leader deletes what it wrote there, then forgets it.
    pub retired: bool,
    /// The member's agent, for an agent member (`source: {agent: {}}`) once one connected.
    pub agent: Option<crate::agents::AgentFacts>,
}

impl MemberFacts {
    /// The applier of this member's current client, writing through its fenced writer client
    /// (`fence`) while `permit` allows (scoped by the caller: `Leadership::for_member` for the
    /// member's holder, unscoped for the leader); None before the source connected.
    pub fn applier(&self, permit: Leadership, cluster: &ClusterId) -> Option<apply::Applier> {
        let applier = apply::Applier::new(self.client.clone()?, permit, cluster.clone());
        Some(match &self.writer {
            Some(writer) => applier.fenced_by(writer),
            None => applier,
        })
    }

    /// The source connected (again).
    pub fn connect(&mut self, connected: connect::Connected) {
        static CONNECTIONS: AtomicU64 = AtomicU64::new(1);
        self.client = Some(connected.client);
        self.writer = Some(connected.writer);
        self.connection = CONNECTIONS.fetch_add(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for MemberFacts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberFacts")
            .field("connected", &self.client.is_some())
            .field("kubernetes_version", &self.kubernetes_version)
            .field("listed", &self.listed)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Facts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Facts").finish_non_exhaustive()
    }
}

/// The facts of every Kubernetes member, shared between sources and writers; `changed` ticks
/// on every update so writers can wait for one.
#[derive(Clone)]
pub struct Facts {
    members: Arc<Mutex<BTreeMap<ClusterId, MemberFacts>>>,
    changed: watch::Sender<u64>,
}

impl Default for Facts {
    fn default() -> Self {
        Self {
            members: Arc::default(),
            changed: watch::channel(0).0,
        }
    }
}

impl Facts {
    pub fn update(&self, cluster: &ClusterId, f: impl FnOnce(&mut MemberFacts)) {
        f(self.members.lock().entry(cluster.clone()).or_default());
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    pub fn get<T>(&self, cluster: &ClusterId, f: impl FnOnce(&MemberFacts) -> T) -> T {
        let members = self.members.lock();
        match members.get(cluster) {
            Some(facts) => f(facts),
            None => f(&MemberFacts::default()),
        }
    }

    /// The member left the hub. Its client stays until the writer has cleaned up after it.
    pub fn retire(&self, cluster: &ClusterId) {
        let mut members = self.members.lock();
        match members.get_mut(cluster) {
            Some(f) if f.client.is_some() => f.retired = true,
            _ => {
                members.remove(cluster);
            }
        }
        drop(members);
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    pub fn remove(&self, cluster: &ClusterId) {
        self.members.lock().remove(cluster);
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A copy of every member's facts.
    pub fn all(&self) -> BTreeMap<ClusterId, MemberFacts> {
        self.members.lock().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

/// Aborts a task when dropped, so a member's helper tasks end with it.
pub struct AbortOnDrop<T>(pub JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
