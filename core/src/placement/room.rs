//! What a member has room for, as `explain`, `/debug/clusters` and the status page show it:
//! the same accounting the decision uses — allocatable, used by pods, assumed
//! (replicas decided for other templates and not running yet) and, for one template, the
//! replicas of it that fit.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use super::{Capacity, Decision, Resources, Template, TemplateKey, Workload};
use crate::model::ClusterId;

/// One member's capacity, for one template (or none).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Room {
    pub cluster: ClusterId,
    pub allocatable: Resources,
    /// Requests of every pod the member reports.
    pub used: Resources,
    /// Replicas decided for templates and not yet running as pods (never free room).
    pub assumed: Resources,
    /// With a template: replicas of it that fit, its own pods counted as room.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas_free: Option<u64>,
}

/// Per member with a capacity, what it has room for; with `template`, in replicas of it.
pub fn rooms(
    capacities: &BTreeMap<ClusterId, Capacity>,
    templates: &[Template],
    decisions: &BTreeMap<TemplateKey, Arc<Decision>>,
    template: Option<&Template>,
) -> Vec<Room> {
    capacities
        .iter()
        .map(|(cluster, capacity)| {
            let assumed = |except: Option<&TemplateKey>| {
                assumed_in(cluster, capacity, templates, decisions, except)
            };
            Room {
                cluster: cluster.clone(),
                allocatable: capacity.allocatable,
                used: capacity.requested,
                assumed: assumed(None),
                replicas_free: template.filter(|t| t.replicas.is_some()).map(|t| {
                    let others = assumed(Some(&t.key));
                    capacity.room_for(&Workload::of(&t.key), &t.requests, others)
                }),
            }
        })
        .collect()
}

/// What the decisions put in `cluster` beyond the pods already running there, `except` one
/// template's.
fn assumed_in(
    cluster: &ClusterId,
    capacity: &Capacity,
    templates: &[Template],
    decisions: &BTreeMap<TemplateKey, Arc<Decision>>,
    except: Option<&TemplateKey>,
) -> Resources {
    let mut assumed = Resources::default();
    for t in templates {
        if Some(&t.key) == except || t.requests == Resources::default() {
            continue;
        }
        let Some(decision) = decisions.get(&t.key) else {
            continue;
        };
        let replicas: u64 = decision
            .placed
            .iter()
            .filter(|p| &p.cluster == cluster)
            .map(|p| u64::from(p.replicas.unwrap_or(0)))
            .sum();
        let running = capacity.held_by(&Workload::of(&t.key));
        assumed = assumed.saturating_add(t.requests.times(replicas).saturating_sub(running));
    }
    assumed
}
