//! `simulate --rollout POLICY`: the plan of a policy's staged rollout before it starts — the
//! stages in order ([`stages::plan`] over the clusters the policy places in), which clusters
//! each drains, the share of the governed Services' traffic each client region keeps on each
//! cluster at every step, and the clients a step would leave with nothing but drained
//! clusters (where the rollout would pause).
//!
//! A drained cluster leaves the governed Services' traffic the way a withdrawn member does
//! (its endpoints stay registered): the plan decides those Services with the stage's
//! clusters withdrawn. A client with no cluster left is where the rollout would pause.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::model::ClusterId;
use crate::placement::stages::{self, StageSpec, TrafficDuring};
use crate::select::select;
use crate::snapshot::{ServiceView, Snapshot};

use super::{Decider, Route, WhatIfError, derive};

/// The whole plan.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutPlan {
    pub policy: String,
    pub traffic: TrafficDuring,
    pub drain_seconds: u64,
    pub ramp_seconds: u64,
    /// The governed Services the shares are over.
    pub services: Vec<String>,
    /// Each region's share per cluster as traffic goes today.
    pub before: Vec<RegionShare>,
    pub steps: Vec<Step>,
}

/// One stage of the plan.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    pub stage: String,
    pub clusters: Vec<ClusterId>,
    pub wait_seconds: u64,
    pub approval_required: bool,
    /// Out of the governed Services' traffic while the stage's copies change (empty with
    /// `traffic: Keep`).
    pub drained: Vec<ClusterId>,
    /// Each region's share per cluster while the stage is drained.
    pub shares: Vec<RegionShare>,
    /// Clients that would be left with no cluster with traffic: the rollout pauses here.
    pub stranded: Vec<String>,
    /// With `rampSeconds`: the shares while the stage's traffic comes back, at a quarter, a
    /// half and three quarters of its clusters' share.
    pub ramp: Vec<RampStep>,
}

/// A point of a stage's ramp: its clusters take `percent` of their share.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RampStep {
    pub percent: u32,
    pub shares: Vec<RegionShare>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RegionShare {
    pub region: String,
    pub cluster: ClusterId,
    pub percent: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("no ClusterSchedulingPolicy {0:?} (namespace/name)")]
    NoPolicy(String),
    #[error("{0} has no placement.rollout: its template edits reach every member at once")]
    NoRollout(String),
    #[error(transparent)]
    WhatIf(#[from] WhatIfError),
}

/// The plan of `policy`'s rollout on the fleet as it is at `now`.
pub fn rollout_plan(
    base: &Snapshot,
    decider: &Decider,
    policy: &str,
    now: Instant,
) -> Result<RolloutPlan, PlanError> {
    let found = base
        .policies
        .iter()
        .find(|p| p.key.to_string() == policy)
        .ok_or_else(|| PlanError::NoPolicy(policy.to_owned()))?;
    let strategy = found
        .placement
        .as_ref()
        .and_then(|p| p.rollout.clone())
        .ok_or_else(|| PlanError::NoRollout(policy.to_owned()))?;
    let mut fleet = derive(base, decider, &[], Arc::clone(&base.policies), now, now);
    let placed_at: Vec<usize> = fleet.workloads.get(policy).cloned().unwrap_or_default();
    let placed = placed_at
        .iter()
        .map(|&i| {
            let spec = &fleet.clusters[i].spec;
            (spec.id.clone(), spec.labels.clone())
        })
        .collect();
    let planned = stages::plan(&strategy, &placed);
    // Withdrawing a cluster below changes cluster views only: the services are taken once.
    let services: Vec<Arc<ServiceView>> = fleet
        .services()
        .filter(|s| s.policy.source.as_deref() == Some(policy))
        .cloned()
        .collect();
    let before = shares(&fleet, &services, &[], now).0;
    let mut steps = Vec::new();
    for stage in &planned {
        let spec: Option<&StageSpec> = strategy.stages.get(stage.spec);
        let drained: Vec<ClusterId> = match strategy.traffic {
            TrafficDuring::Drain => stage.clusters.clone(),
            TrafficDuring::Keep => Vec::new(),
        };
        let indices: Vec<usize> = drained
            .iter()
            .filter_map(|c| fleet.cluster_by_id(c))
            .collect();
        let was: Vec<bool> = indices
            .iter()
            .map(|&i| fleet.clusters[i].withdrawn)
            .collect();
        for &i in &indices {
            fleet.clusters[i].withdrawn = true;
        }
        let (shares, stranded) = shares(&fleet, &services, &drained, now);
        for (&i, was) in indices.iter().zip(was) {
            fleet.clusters[i].withdrawn = was;
        }
        let ramp = if strategy.ramp_seconds > 0 && !drained.is_empty() {
            ramp_steps(&fleet, &services, &drained, now)
        } else {
            Vec::new()
        };
        steps.push(Step {
            stage: stage.name.clone(),
            clusters: stage.clusters.clone(),
            wait_seconds: spec.map_or(0, |s| s.wait_seconds),
            approval_required: spec.is_some_and(|s| s.approval_required),
            drained,
            shares,
            stranded,
            ramp,
        });
    }
    Ok(RolloutPlan {
        policy: policy.to_owned(),
        traffic: strategy.traffic,
        drain_seconds: strategy.drain_seconds,
        ramp_seconds: strategy.ramp_seconds,
        services: services.iter().map(|s| s.key.to_string()).collect(),
        before,
        steps,
    })
}

/// The shares while `clusters` come back at a quarter, a half and three quarters of their
/// share (the decision as `traffic.ramping` makes it).
fn ramp_steps(
    fleet: &Snapshot,
    services: &[Arc<ServiceView>],
    clusters: &[ClusterId],
    now: Instant,
) -> Vec<RampStep> {
    [25, 50, 75]
        .into_iter()
        .map(|percent| {
            let ramped: Vec<Arc<ServiceView>> = services
                .iter()
                .map(|s| {
                    let mut view = (**s).clone();
                    let policy = Arc::make_mut(&mut view.policy);
                    for c in clusters {
                        policy.ramping.insert(c.clone(), percent);
                    }
                    Arc::new(view)
                })
                .collect();
            RampStep {
                percent,
                shares: shares(fleet, &ramped, &[], now).0,
            }
        })
        .collect()
}

/// What a running rollout of `policy` observes of traffic ([`stages::Observed::serving`]):
/// per governed Service and client cluster (`<cluster> of <namespace/service>`), every
/// cluster that carries some of its traffic now, in any tier. A client with none today is
/// left out: draining cannot take from it what it does not have.
pub fn serving(
    snapshot: &Snapshot,
    policy: &str,
    now: Instant,
) -> BTreeMap<String, BTreeSet<ClusterId>> {
    let mut out = BTreeMap::new();
    for service in snapshot
        .services()
        .filter(|s| s.policy.source.as_deref() == Some(policy))
    {
        for (client, view) in snapshot.clusters.iter().enumerate() {
            let selection = select(snapshot, service, Some(client), now);
            let clusters: BTreeSet<ClusterId> = selection
                .tiers
                .iter()
                .flat_map(|t| &t.members)
                .map(|m| snapshot.clusters[m.cluster].spec.id.clone())
                .collect();
            if !clusters.is_empty() {
                out.insert(format!("{} of {}", view.spec.id, service.key), clusters);
            }
        }
    }
    out
}

/// The first-tier share per (client region, cluster), averaged over every (service, client
/// cluster) pair of the region; and the pairs left with no cluster at all.
fn shares(
    fleet: &Snapshot,
    services: &[Arc<ServiceView>],
    drained: &[ClusterId],
    now: Instant,
) -> (Vec<RegionShare>, Vec<String>) {
    let mut sums: BTreeMap<(String, ClusterId), f64> = BTreeMap::new();
    let mut pairs: BTreeMap<String, u32> = BTreeMap::new();
    let mut stranded = Vec::new();
    for service in services {
        for (client, view) in fleet.clusters.iter().enumerate() {
            let region = view.spec.locality.region.clone().unwrap_or_default();
            let route = Route::of(fleet, &select(fleet, service, Some(client), now));
            *pairs.entry(region.clone()).or_default() += 1;
            if !drained.is_empty() && route.tiers.is_empty() {
                stranded.push(format!(
                    "clients in {} of {} would have no cluster left with traffic",
                    view.spec.id, service.key
                ));
            }
            for (cluster, share) in route.first_tier_shares() {
                *sums.entry((region.clone(), cluster.clone())).or_default() += share;
            }
        }
    }
    let shares = sums
        .into_iter()
        .map(|((region, cluster), sum)| {
            let percent = 100.0 * sum / f64::from(pairs[&region]);
            RegionShare {
                region,
                cluster,
                percent: (percent * 10.0).round() / 10.0,
            }
        })
        .collect();
    (shares, stranded)
}
