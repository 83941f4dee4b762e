//! The status of a Kubernetes hub's HTTPRoutes and GRPCRoutes, written by the leader: for each
//! parent Service a route names, one entry of `status.parents` with meridian's controllerName
//! and the `Accepted` and `ResolvedRefs` conditions core decided (`route::RouteTable`). Other
//! controllers' entries are kept: the list is read, meridian's entries replaced, and written
//! back with the read's resourceVersion (a conflict is tried again). A route is written when
//! its entries change, and meridian's entries leave a route that no longer names a Service.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use meridian_core::route::{ParentStatus, RouteKind, RouteStatus, RouteTable};
use meridian_core::{ClusterId, ObjectKey, Snapshot};
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{debug, warn};

use super::apply::{Applier, ObjectId};
use super::leader::Leadership;
use super::status::keep_transition_times;
use crate::metrics::RouteMetrics;

/// The `controllerName` of meridian's entries (and of the GatewayClasses it will serve).
pub const CONTROLLER_NAME: &str = "meridian.io/gateway-controller";
const API_VERSION: &str = "gateway.networking.k8s.io/v1";
/// How soon the writer looks again without a new snapshot (a failed write, a new term).
const AGAIN: Duration = Duration::from_secs(2);

/// meridian's entries of one route's `status.parents`.
type Entries = Vec<Entry>;

#[derive(Clone, Debug, PartialEq)]
struct Entry {
    parent: Value,
    conditions: Vec<Condition>,
}

/// The entries a route's status should hold, one per parent (conditions without times).
fn entries_of(status: &RouteStatus) -> Entries {
    status
        .parents
        .iter()
        .map(|p| entry(p, status.observed_generation))
        .collect()
}

fn entry(p: &ParentStatus, generation: Option<i64>) -> Entry {
    let condition = |type_: &str, c: &meridian_core::route::Condition| Condition {
        type_: type_.into(),
        status: if c.status { "True" } else { "False" }.into(),
        reason: c.reason.into(),
        message: c.message.clone(),
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
        observed_generation: generation,
    };
    let mut parent = json!({
        "group": p.parent.group,
        "kind": p.parent.kind,
        "namespace": p.parent.namespace,
        "name": p.parent.name,
    });
    if let Some(port) = p.parent.port {
        parent["port"] = json!(port);
    }
    Entry {
        parent,
        conditions: vec![
            condition("Accepted", &p.accepted),
            condition("ResolvedRefs", &p.resolved_refs),
        ],
    }
}

/// `status.parents` with meridian's entries replaced by `ours`, the others kept in order.
fn merged_parents(current: Option<&Value>, ours: &Entries) -> Vec<Value> {
    let mut parents: Vec<Value> = current
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|p| p["controllerName"] != CONTROLLER_NAME)
        .cloned()
        .collect();
    parents.extend(ours.iter().map(|e| {
        json!({
            "parentRef": e.parent,
            "controllerName": CONTROLLER_NAME,
            "conditions": e.conditions,
        })
    }));
    parents
}

/// Writes the routes' status until the snapshot channel closes. `hub`: the hub's fenced
/// writer client (hub-wide writes: the leader's).
pub async fn run(
    hub: Client,
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    leadership: Leadership,
    metrics: RouteMetrics,
) {
    let applier = Applier::new(hub, leadership.clone(), ClusterId::new("hub"));
    // What was last written per route (with condition times), so unchanged routes cost nothing.
    let mut written: BTreeMap<(RouteKind, ObjectKey), Entries> = BTreeMap::new();
    // The table last written in full: most snapshots (endpoint changes) share it.
    let mut done: Option<Arc<RouteTable>> = None;
    loop {
        // Woken by a snapshot, or after a while anyway: a failed write is tried again, and a
        // replica that just became leader writes without waiting for a change.
        if let Ok(Err(_)) = tokio::time::timeout(AGAIN, snapshots.changed()).await {
            return;
        }
        if !leadership.is_leader() {
            // A new term writes every route once.
            written.clear();
            done = None;
            continue;
        }
        let snapshot = snapshots.borrow_and_update().clone();
        if done
            .as_ref()
            .is_some_and(|t| Arc::ptr_eq(t, &snapshot.routes))
        {
            continue;
        }
        let all_written = write_changed(&applier, &snapshot, &mut written, &metrics).await;
        done = all_written.then(|| snapshot.routes.clone());
    }
}

/// Writes every route whose entries differ from what was written; false if a write failed.
async fn write_changed(
    applier: &Applier,
    snapshot: &Snapshot,
    written: &mut BTreeMap<(RouteKind, ObjectKey), Entries>,
    metrics: &RouteMetrics,
) -> bool {
    let mut all_written = true;
    let desired: BTreeMap<_, _> = snapshot
        .routes
        .statuses
        .iter()
        .filter(|(_, s)| s.from_api)
        .map(|(k, s)| (k.clone(), entries_of(s)))
        .collect();
    let gone: Vec<_> = written
        .keys()
        .filter(|k| !desired.contains_key(k))
        .cloned()
        .collect();
    for key in gone {
        let result = write(applier, &key, &Vec::new()).await;
        metrics.record(key.0.name(), result.is_ok());
        match result {
            Ok(()) => {
                written.remove(&key);
            }
            Err(()) => all_written = false,
        }
    }
    for (key, mut entries) in desired {
        let before = written.get(&key);
        for e in entries.iter_mut() {
            let previous = before
                .into_iter()
                .flatten()
                .find(|b| b.parent == e.parent)
                .map(|b| b.conditions.as_slice());
            keep_transition_times(&mut e.conditions, previous);
        }
        if before == Some(&entries) {
            continue;
        }
        let result = write(applier, &key, &entries).await;
        metrics.record(key.0.name(), result.is_ok());
        match result {
            Ok(()) => {
                written.insert(key, entries);
            }
            Err(()) => all_written = false,
        }
    }
    all_written
}

/// Reads one route and writes its `status.parents` with meridian's entries set to `ours`.
async fn write(
    applier: &Applier,
    (kind, key): &(RouteKind, ObjectKey),
    ours: &Entries,
) -> Result<(), ()> {
    let id = ObjectId::new(API_VERSION, kind.name(), Some(&key.namespace), &key.name);
    let current = match applier.get(&id).await {
        Ok(Some(object)) => object,
        // Gone: nothing to write.
        Ok(None) => return Ok(()),
        Err(e) => {
            warn!(route = %key, kind = %kind, error = %e, "cannot read the route to write its status");
            return Err(());
        }
    };
    let parents = merged_parents(current.data.pointer("/status/parents"), ours);
    let patch = json!({
        "metadata": {"resourceVersion": current.metadata.resource_version},
        "status": {"parents": parents},
    });
    match applier.merge_patch_status(&id, &patch).await {
        Ok(_) => {
            debug!(route = %key, kind = %kind, parents = ours.len(), "route status written");
            Ok(())
        }
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => {
            warn!(route = %key, kind = %kind, error = %e, "cannot write the route's status; trying again");
            Err(())
        }
    }
}

#[cfg(test)]
mod tests;
