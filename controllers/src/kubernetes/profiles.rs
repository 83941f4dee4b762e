//! ClusterProfiles (KEP-4322, `sigs.k8s.io/cluster-inventory-api` v1alpha1) on a Kubernetes
//! hub: one per MemberCluster in meridian's namespace, so Argo CD, MultiKueue and
//! multicluster-runtime consumers see meridian's inventory. Written beside each member's
//! MemberCluster status (`status::run`, by the member's writer), only when the hub serves the
//! ClusterProfile CRD (asked again every [`RECHECK`] while it does not), and only when what a
//! profile says changed; the leader deletes the profiles of members that left.
//!
//! What a profile says: `ControlPlaneHealthy` (the member's health) and `Joined` (it has
//! synced) conditions, the Kubernetes version, properties for the cluster name, region, zone,
//! network and allocatable CPU and memory, and an access provider `meridian` with the API
//! server (and its CA) meridian reaches the member at — none for an agent member, whose API
//! the hub never dials.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use meridian_core::{ClusterView, Health};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use super::MemberFacts;
use super::apply::{self, Applier, ApplyOptions, ObjectId};
use super::leader::Leadership;
use super::status::keep_transition_times;

pub const API_VERSION: &str = "multicluster.x-k8s.io/v1alpha1";
pub const KIND: &str = "ClusterProfile";
/// The cluster manager's name in `spec.clusterManager` and the `x-k8s.io/cluster-manager` label.
pub const CLUSTER_MANAGER: &str = "meridian";
const CLUSTER_MANAGER_LABEL: &str = "x-k8s.io/cluster-manager";
/// How long a hub without the CRD is left alone before it is asked again.
const RECHECK: Duration = Duration::from_secs(60);

/// The parts of a profile meridian decides, before transition times are kept.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub conditions: Vec<Condition>,
    pub status: Value,
}

fn condition(type_: &str, status: bool, reason: &str, message: String) -> Condition {
    Condition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }
}

/// What `view`'s profile says now.
pub fn profile(view: &ClusterView, facts: &MemberFacts) -> Profile {
    let healthy = view.health == Health::Healthy;
    let joined = facts.last_heartbeat.is_some();
    let conditions = vec![
        condition(
            "ControlPlaneHealthy",
            healthy,
            view.health.as_str(),
            if healthy {
                String::new()
            } else {
                view.reason.clone().unwrap_or_default()
            },
        ),
        condition(
            "Joined",
            joined,
            if joined { "Synced" } else { "NotYetSynced" },
            String::new(),
        ),
    ];
    let spec = &view.spec;
    let mut properties: Vec<(&str, String)> = vec![
        // KEP-2149's well-known property: the cluster's name in its ClusterSet.
        ("cluster.clusterset.k8s.io", spec.id.to_string()),
        (
            "meridian.io/region",
            spec.locality.region.clone().unwrap_or_default(),
        ),
        (
            "meridian.io/zone",
            spec.locality.zone.clone().unwrap_or_default(),
        ),
        (
            "meridian.io/network",
            spec.network.clone().unwrap_or_default(),
        ),
        ("meridian.io/health", view.health.as_str().to_owned()),
    ];
    for resource in ["cpu", "memory"] {
        if let Some(quantity) = facts.allocatable.get(resource) {
            properties.push((
                if resource == "cpu" {
                    "meridian.io/allocatable-cpu"
                } else {
                    "meridian.io/allocatable-memory"
                },
                quantity.clone(),
            ));
        }
    }
    let properties: Vec<Value> = properties
        .into_iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(name, value)| json!({"name": name, "value": value}))
        .collect();
    let access: Vec<Value> = facts
        .writer
        .as_ref()
        .and_then(|w| w.server())
        .map(|(server, ca_pem)| {
            let mut cluster = json!({"server": server});
            if let Some(pem) = ca_pem {
                let data = base64::engine::general_purpose::STANDARD.encode(pem);
                cluster["certificate-authority-data"] = json!(data);
            }
            json!({"name": CLUSTER_MANAGER, "cluster": cluster})
        })
        .into_iter()
        .collect();
    let mut status = json!({"properties": properties, "accessProviders": access});
    if let Some(version) = &facts.kubernetes_version {
        status["version"] = json!({"kubernetes": version});
    }
    Profile { conditions, status }
}

/// Writes the profiles: remembers what was written and whether the hub serves the kind.
pub struct Profiles {
    namespace: String,
    written: BTreeMap<String, Profile>,
    /// When the hub last said it serves no ClusterProfile (None: it does, or not asked yet).
    absent_since: Option<Instant>,
    /// The members of the last round, to see one leave.
    members: BTreeSet<String>,
    cleaned: bool,
}

impl Profiles {
    pub fn new(namespace: String) -> Self {
        Self {
            namespace,
            written: BTreeMap::new(),
            absent_since: None,
            members: BTreeSet::new(),
            cleaned: false,
        }
    }

    fn available(&self) -> bool {
        self.absent_since.is_none_or(|at| at.elapsed() >= RECHECK)
    }

    fn id(&self, name: &str) -> ObjectId {
        ObjectId::new(API_VERSION, KIND, Some(&self.namespace), name)
    }

    /// Writes `view`'s profile when it changed since this replica last wrote it.
    pub async fn write(&mut self, applier: &Applier, view: &ClusterView, facts: &MemberFacts) {
        if !self.available() {
            return;
        }
        let name = view.spec.id.as_str();
        let mut now = profile(view, facts);
        keep_transition_times(
            &mut now.conditions,
            self.written.get(name).map(|p| p.conditions.as_slice()),
        );
        if self.written.get(name) == Some(&now) {
            return;
        }
        let id = self.id(name);
        let body = json!({
            "apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": name, "namespace": self.namespace, "labels": {
                super::MANAGED_BY.0: super::MANAGED_BY.1,
                CLUSTER_MANAGER_LABEL: CLUSTER_MANAGER,
            }},
            "spec": {"displayName": name, "clusterManager": {"name": CLUSTER_MANAGER}},
        });
        let mut status = now.status.clone();
        status["conditions"] = json!(now.conditions);
        let written = match applier.apply(&id, &body, ApplyOptions::force()).await {
            Ok(_) => {
                applier
                    .merge_patch_status(&id, &json!({ "status": status }))
                    .await
            }
            Err(e) => Err(e),
        };
        match written {
            Ok(_) => {
                if self.absent_since.take().is_some() {
                    info!("the hub serves ClusterProfiles: writing one per member");
                }
                debug!(cluster = name, "cluster profile written");
                self.written.insert(name.to_owned(), now);
            }
            Err(apply::Error::UnknownKind { .. }) => {
                if self.absent_since.is_none() {
                    info!(
                        "the hub serves no ClusterProfile (sigs.k8s.io/cluster-inventory-api's CRD): none written"
                    );
                }
                self.absent_since = Some(Instant::now());
            }
            Err(e) => warn!(cluster = name, error = %e, "cannot write the cluster profile"),
        }
    }

    /// A member this replica no longer writes: its next writer writes its profile once.
    pub fn forget(&mut self, name: &str) {
        self.written.remove(name);
    }

    /// The leader deletes the profiles meridian made for members that are gone: on its first
    /// round (what an earlier run left), and whenever a member leaves.
    pub async fn remove_gone(
        &mut self,
        applier: &Applier,
        leadership: &Leadership,
        members: BTreeSet<String>,
    ) {
        self.written.retain(|name, _| members.contains(name));
        let someone_left = self.members.iter().any(|m| !members.contains(m));
        self.members = members;
        if !leadership.may_write() || self.absent_since.is_some() || (self.cleaned && !someone_left)
        {
            return;
        }
        let selector = format!("{CLUSTER_MANAGER_LABEL}={CLUSTER_MANAGER}");
        let listed = match applier.list_managed(API_VERSION, KIND, &selector).await {
            Ok(listed) => listed,
            Err(apply::Error::UnknownKind { .. }) => return,
            Err(e) => {
                warn!(error = %e, "cannot list the cluster profiles");
                return;
            }
        };
        self.cleaned = true;
        for id in listed {
            let ours = id.namespace.as_deref() == Some(self.namespace.as_str());
            if !ours || self.members.contains(&id.name) {
                continue;
            }
            match applier.delete(&id).await {
                Ok(()) => {
                    info!(cluster = %id.name, "cluster profile of a member that left deleted")
                }
                Err(e) => warn!(cluster = %id.name, error = %e, "cannot delete a cluster profile"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use meridian_core::testing::FleetBuilder;

    use super::*;

    #[test]
    fn a_profile_says_health_joining_version_place_and_capacity() {
        let snapshot = FleetBuilder::with_members(&["m1"]).snapshot();
        let view = &snapshot.clusters[0];
        let mut facts = MemberFacts::default();
        let new = profile(view, &facts);
        let status_of = |p: &Profile, t: &str| {
            p.conditions
                .iter()
                .find(|c| c.type_ == t)
                .map(|c| (c.status.clone(), c.reason.clone()))
        };
        assert_eq!(
            status_of(&new, "Joined"),
            Some(("False".into(), "NotYetSynced".into()))
        );
        facts.last_heartbeat = Some(std::time::SystemTime::now());
        facts.kubernetes_version = Some("v1.34.1".into());
        facts.allocatable.insert("cpu".into(), "8".into());
        let joined = profile(view, &facts);
        assert_eq!(
            status_of(&joined, "Joined"),
            Some(("True".into(), "Synced".into()))
        );
        assert_eq!(
            status_of(&joined, "ControlPlaneHealthy").map(|s| s.1),
            Some(view.health.as_str().to_owned())
        );
        assert_eq!(joined.status["version"]["kubernetes"], "v1.34.1");
        let properties = joined.status["properties"].as_array().unwrap();
        let value = |name: &str| {
            properties
                .iter()
                .find(|p| p["name"] == name)
                .map(|p| p["value"].clone())
        };
        assert_eq!(value("cluster.clusterset.k8s.io"), Some(json!("m1")));
        assert_eq!(value("meridian.io/allocatable-cpu"), Some(json!("8")));
        // Empty values are left out (the CRD wants at least one character).
        assert!(properties.iter().all(|p| p["value"] != ""));
        // No writer of its own (an agent member, or not connected): no access provider.
        assert_eq!(joined.status["accessProviders"], json!([]));
    }
}
