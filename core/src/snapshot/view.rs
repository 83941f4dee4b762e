//! What the edges read of a snapshot: each member's view, and each exported service merged
//! across clusters with the stamp that says until when answers decided from it hold (see
//! `stamp.rs`). Below placement and the snapshot, which both carry these views.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde::Serialize;

use crate::model::{ClusterId, ClusterSpec, Endpoint, Port, ServiceKey, Slice};
use crate::policy::TrafficPolicy;
use crate::registry::Health;

/// A member as DNS and xDS see it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterView {
    pub spec: ClusterSpec,
    pub health: Health,
    pub withdrawn: bool,
    #[serde(skip)]
    pub unreachable_since: Option<Instant>,
    /// When it last came back from Unreachable (failback counts from here).
    #[serde(skip)]
    pub recovered_at: Option<Instant>,
    pub reason: Option<String>,
    pub endpoints: usize,
}

/// One cluster's part of an exported service.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Backend {
    /// Index into `Snapshot::clusters`.
    pub cluster: usize,
    /// The cluster's slices of the service, shared with the Index (a rebuild copies pointers),
    /// with no address in two of them: every endpoint, including not-ready and terminating
    /// ones (xDS maps them to health).
    pub slices: Vec<Arc<Slice>>,
    /// Endpoints DNS may answer and traffic may use (`Endpoint::is_answerable`).
    pub ready: u32,
    /// This cluster's `publishNotReadyAddresses`.
    pub publish_not_ready: bool,
    /// The service ports this cluster serves (those agreeing with the service's definition).
    pub ports: Vec<Port>,
    /// When it last went from no ready endpoint to some (failback counts from here).
    #[serde(skip)]
    pub recovered_at: Option<Instant>,
}

impl Backend {
    /// Every endpoint of the cluster's slices.
    pub fn endpoints(&self) -> impl Iterator<Item = &Endpoint> {
        self.slices.iter().flat_map(|s| s.endpoints.iter())
    }

    pub fn answerable(&self) -> impl Iterator<Item = &Endpoint> {
        self.endpoints()
            .filter(|e| e.is_answerable(self.publish_not_ready))
    }
}

/// Why a cluster's export is not (fully) used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Conflict {
    pub cluster: ClusterId,
    pub reason: String,
    /// Left out entirely (its headless-ness disagrees with the oldest export's); otherwise
    /// it serves the ports that agree.
    pub excluded: bool,
}

/// An exported service merged across clusters.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceView {
    pub key: ServiceKey,
    pub headless: bool,
    /// The ports of the oldest export.
    pub ports: Vec<Port>,
    /// One per exporting cluster, ordered by cluster index.
    pub backends: Vec<Backend>,
    /// ClusterSetIPs: `(cluster index, ServiceImport spec.ips)` for clusters that imported it.
    pub imports: Vec<(usize, Vec<IpAddr>)>,
    pub conflicts: Vec<Conflict>,
    pub policy: Arc<TrafficPolicy>,
    /// The oldest export's labels: what policies select the service by (kept so a what-if
    /// policy edit can find the services it would govern).
    #[serde(skip)]
    pub labels: BTreeMap<String, String>,
    /// Addresses that more than one backend reports, sorted: the decision answers each of
    /// them once (`select`), and skips that work for the many services where this is empty.
    pub shared_addresses: Vec<IpAddr>,
    /// Until when answers decided from this view hold (`stamp.rs`).
    #[serde(skip)]
    pub stamp: Arc<Stamp>,
}

impl ServiceView {
    pub fn has_shared_addresses(&self) -> bool {
        !self.shared_addresses.is_empty()
    }

    pub fn is_shared_address(&self, address: &IpAddr) -> bool {
        self.shared_addresses.binary_search(address).is_ok()
    }

    pub fn backend_of(&self, cluster: usize) -> Option<&Backend> {
        self.backends.iter().find(|b| b.cluster == cluster)
    }

    pub fn import_of(&self, cluster: usize) -> Option<&[IpAddr]> {
        self.imports
            .iter()
            .find(|(c, _)| *c == cluster)
            .map(|(_, ips)| ips.as_slice())
    }
}

/// One service's answers: valid for every snapshot version below `retired_at`.
pub struct Stamp {
    retired_at: AtomicU64,
}

impl Default for Stamp {
    fn default() -> Self {
        Self {
            retired_at: AtomicU64::new(u64::MAX),
        }
    }
}

impl fmt::Debug for Stamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.retired_at.load(Ordering::Relaxed) {
            u64::MAX => f.write_str("Stamp(current)"),
            v => write!(f, "Stamp(retired at {v})"),
        }
    }
}

impl Stamp {
    /// Whether answers made with this stamp are still those of snapshot `version`.
    pub fn holds_at(&self, version: u64) -> bool {
        version < self.retired_at.load(Ordering::Relaxed)
    }

    pub(super) fn retire(&self, version: u64) {
        self.retired_at.fetch_min(version, Ordering::Relaxed);
    }
}
