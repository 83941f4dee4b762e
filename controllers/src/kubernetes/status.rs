//! MemberCluster status on a Kubernetes hub, written by each member's writer (its holder when
//! writes are sharded, the leader otherwise): health, lastHeartbeat,
//! kubernetesVersion, capacity and allocatable (summed from Nodes), exportedServices, endpoints
//! and conditions. A status is written when it changed, and at least every
//! [`REFRESH`] so `lastHeartbeat` stays current.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use meridian_core::{ClusterId, ClusterView, Health, Snapshot};
use serde_json::json;
use tokio::sync::watch;
use tracing::{debug, warn};

use super::apply::{Applier, ObjectId};
use super::leader::Leadership;
use super::profiles::Profiles;
use super::reconcile::{Round, Wake};
use super::{Facts, MEMBER_CLUSTER, MemberFacts};
use crate::crd::MemberClusterStatus;

const REFRESH: Duration = Duration::from_secs(10);

/// The status of one member, as meridian sees it now. `conditions` carry no transition time;
/// it is added when written (and kept while a condition holds).
pub fn member_status(
    snapshot: &Snapshot,
    index: usize,
    view: &ClusterView,
    facts: &MemberFacts,
) -> MemberClusterStatus {
    let exported = snapshot
        .services()
        .filter(|s| s.backend_of(index).is_some())
        .count();
    let ready = view.health == Health::Healthy;
    let reason = view.reason.clone().unwrap_or_default();
    let condition = |type_: &str, status: bool, why: &str, message: String| Condition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: why.into(),
        message,
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
        observed_generation: None,
    };
    MemberClusterStatus {
        health: Some(view.health.as_str().to_string()),
        last_heartbeat: facts.last_heartbeat.map(rfc3339),
        kubernetes_version: facts.kubernetes_version.clone(),
        capacity: facts.capacity.clone(),
        allocatable: facts.allocatable.clone(),
        exported_services: Some(exported as u32),
        endpoints: Some(view.endpoints as u32),
        conditions: vec![
            condition(
                "Ready",
                ready,
                view.health.as_str(),
                if ready { String::new() } else { reason },
            ),
            condition(
                "Withdrawn",
                view.withdrawn,
                if view.withdrawn {
                    "UnreachableTooLong"
                } else {
                    "Serving"
                },
                if view.withdrawn {
                    "endpoints are withdrawn from DNS and xDS".into()
                } else {
                    String::new()
                },
            ),
        ],
    }
}

fn rfc3339(t: SystemTime) -> String {
    Timestamp::try_from(t).map_or_else(|_| String::new(), |t| t.to_string())
}

/// What was last written for one member.
struct Written {
    status: MemberClusterStatus,
    at: Instant,
}

/// Writes the statuses of the members this replica may write, until the snapshot channel
/// closes. `hub` writes only: the hub's fenced writer client.
pub async fn run(
    hub: Client,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    fleet: Facts,
    leadership: Leadership,
    namespace: String,
) {
    // Each request asks for the member it is about.
    let applier = Applier::new(hub, leadership.for_shard(), ClusterId::new("hub"));
    let mut written: BTreeMap<String, Written> = BTreeMap::new();
    let mut profiles = Profiles::new(namespace);
    let mut wake = Wake::new(snapshots, &fleet, Duration::from_secs(1)).without_debounce();
    while let Some(Round { snapshot, facts }) = wake.next(None).await {
        for (index, view) in snapshot.clusters.iter().enumerate() {
            let name = view.spec.id.as_str();
            if !leadership.may_write_to(&view.spec.id) {
                // A new term (or holder) writes the member's status once.
                written.remove(name);
                profiles.forget(name);
                continue;
            }
            let member_facts = facts.get(&view.spec.id).cloned().unwrap_or_default();
            profiles.write(&applier, view, &member_facts).await;
            let mut status = member_status(&snapshot, index, view, &member_facts);
            let previous = written.get(name);
            keep_transition_times(
                &mut status.conditions,
                previous.map(|w| w.status.conditions.as_slice()),
            );
            let due = match previous {
                None => true,
                Some(w) => !same_but_heartbeat(&w.status, &status) || w.at.elapsed() >= REFRESH,
            };
            if !due || !leadership.may_write_to(&view.spec.id) {
                continue;
            }
            let id = ObjectId::new(MEMBER_CLUSTER.0, MEMBER_CLUSTER.1, None, name);
            match applier
                .merge_patch_status(&id, &json!({ "status": status }))
                .await
            {
                Ok(_) => {
                    debug!(cluster = name, health = ?status.health, "member status written");
                    written.insert(
                        name.to_string(),
                        Written {
                            status,
                            at: Instant::now(),
                        },
                    );
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => warn!(cluster = name, error = %e, "cannot write member status"),
            }
        }
        written.retain(|name, _| snapshot.cluster_index(name).is_some());
        let members = snapshot
            .clusters
            .iter()
            .map(|c| c.spec.id.to_string())
            .collect();
        profiles.remove_gone(&applier, &leadership, members).await;
    }
}

/// Conditions keep their `lastTransitionTime` while their status holds; a change gets now.
pub(super) fn keep_transition_times(conditions: &mut [Condition], previous: Option<&[Condition]>) {
    let now = Time(Timestamp::now());
    for c in conditions {
        let before = previous.and_then(|p| p.iter().find(|o| o.type_ == c.type_));
        c.last_transition_time = match before {
            Some(b) if b.status == c.status => b.last_transition_time.clone(),
            _ => now.clone(),
        };
    }
}

fn same_but_heartbeat(a: &MemberClusterStatus, b: &MemberClusterStatus) -> bool {
    let strip = |s: &MemberClusterStatus| MemberClusterStatus {
        last_heartbeat: None,
        ..s.clone()
    };
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests;
