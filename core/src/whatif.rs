//! What-if: the decisions of a fleet that does not exist yet. Traffic and placement are pure
//! functions of a [`Snapshot`] (which carries the policies and capacities it was decided
//! with) and, for placement, of the [`Decider`] that decided it (its memory and programs,
//! given beside the snapshot), so a scenario — a member unreachable, tainted or gone, a policy
//! edited — is a snapshot derived from the published one, decided again by the same code.
//! Nothing here writes or publishes anything.
//!
//! ```text
//!  published Snapshot ─► imagine(scenario) ─► clusters edited (health, taints, removed and
//!                        │                    renumbered), services re-governed by the edited
//!                        │                    policies, placement decided again from a copy of
//!                        │                    its memory (a round now, a round at `at`)
//!                        └► imagine(nothing)  the same fleet at the same instant: the baseline
//!  simulate: baseline vs imagined, at `at` ─► per service and client cluster, the tiers (DNS
//!            answers the first, EDS priorities are the tiers); per template, the replicas per
//!            cluster; totals
//! ```
//!
//! **When.** Both fleets are compared at one instant `at`, by default once every timer a
//! scenario starts has run out (withdraw, failover, failback, `tolerationSeconds`): what the
//! fleet settles into, which is what an operator asks about ("if eu-1 goes down, where does
//! its traffic go?"). A member assumed Unreachable is unreachable from `now`; a member assumed
//! Healthy again recovered at `now`. `after` picks an earlier instant (a member unreachable for
//! 30 s is not withdrawn yet). The baseline is evaluated at the same instant, so windows
//! already running in the real fleet close in both and are not reported as changes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use thiserror::Error;

use crate::fleet::placed_workloads;
use crate::model::{ClusterId, ObjectKey, Taint, TaintEffect};
use crate::placement::{Decider, Inputs, Outcome, TemplateKey};
use crate::policy::{Policies, Policy};
use crate::registry::Health;
use crate::select::{FilterReason, Selection, select};
use crate::snapshot::{ClusterView, ServiceView, Snapshot};

/// One thing assumed about the fleet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Assumption {
    /// `eu-1=Unreachable`: the member's health from now on.
    Health(ClusterId, Health),
    /// `eu-1:taint=maint:NoExecute` (or `key=value:Effect`): a taint added to the member.
    Taint(ClusterId, Taint),
    /// `eu-1:untaint=maint`: every taint with this key removed.
    Untaint(ClusterId, String),
    /// `--assume-remove us-1`: the member leaves the hub.
    Remove(ClusterId),
    /// `--assume-policy FILE`: the policy replaces the one with its name (keeping that one's
    /// age, which decides what it wins), or joins the others.
    Policy(Policy),
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum WhatIfError {
    #[error(
        "{0:?}: expected CLUSTER=Unreachable|Degraded|Healthy, CLUSTER:taint=KEY[=VALUE]:EFFECT or CLUSTER:untaint=KEY"
    )]
    Syntax(String),
    #[error("{0:?}: a taint's effect is NoSchedule, PreferNoSchedule or NoExecute")]
    Effect(String),
    #[error("no member cluster {cluster:?} (members: {members})")]
    UnknownCluster { cluster: String, members: String },
}

impl FromStr for Assumption {
    type Err = WhatIfError;

    fn from_str(text: &str) -> Result<Self, WhatIfError> {
        let syntax = || WhatIfError::Syntax(text.to_owned());
        if let Some((cluster, rest)) = text.split_once(':') {
            let cluster = non_empty(cluster).ok_or_else(syntax)?;
            if let Some(taint) = rest.strip_prefix("taint=") {
                let (key_value, effect) = taint.rsplit_once(':').ok_or_else(syntax)?;
                let (key, value) = match key_value.split_once('=') {
                    Some((k, v)) => (k, Some(v.to_owned())),
                    None => (key_value, None),
                };
                let effect = match effect {
                    "NoSchedule" => TaintEffect::NoSchedule,
                    "PreferNoSchedule" => TaintEffect::PreferNoSchedule,
                    "NoExecute" => TaintEffect::NoExecute,
                    other => return Err(WhatIfError::Effect(other.to_owned())),
                };
                let key = non_empty(key).ok_or_else(syntax)?;
                return Ok(Assumption::Taint(
                    cluster,
                    Taint {
                        key: key.to_string(),
                        value,
                        effect,
                    },
                ));
            }
            if let Some(key) = rest.strip_prefix("untaint=") {
                let key = non_empty(key).ok_or_else(syntax)?;
                return Ok(Assumption::Untaint(cluster, key.to_string()));
            }
            return Err(syntax());
        }
        let (cluster, health) = text.split_once('=').ok_or_else(syntax)?;
        let cluster = non_empty(cluster).ok_or_else(syntax)?;
        let health = [Health::Healthy, Health::Degraded, Health::Unreachable]
            .into_iter()
            .find(|h| h.as_str().eq_ignore_ascii_case(health))
            .ok_or_else(syntax)?;
        Ok(Assumption::Health(cluster, health))
    }
}

fn non_empty(s: &str) -> Option<ClusterId> {
    let s = s.trim();
    (!s.is_empty()).then(|| ClusterId::new(s))
}

impl fmt::Display for Assumption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Assumption::Health(c, h) => write!(f, "{c}={}", h.as_str()),
            Assumption::Taint(c, t) => match &t.value {
                Some(v) => write!(f, "{c}:taint={}={v}:{:?}", t.key, t.effect),
                None => write!(f, "{c}:taint={}:{:?}", t.key, t.effect),
            },
            Assumption::Untaint(c, key) => write!(f, "{c}:untaint={key}"),
            Assumption::Remove(c) => write!(f, "{c} removed"),
            Assumption::Policy(p) => write!(f, "policy {} as given", p.key),
        }
    }
}

impl Assumption {
    fn cluster(&self) -> Option<&ClusterId> {
        match self {
            Assumption::Health(c, _)
            | Assumption::Taint(c, _)
            | Assumption::Untaint(c, _)
            | Assumption::Remove(c) => Some(c),
            Assumption::Policy(_) => None,
        }
    }
}

/// What to assume, and when to look.
#[derive(Clone, Debug, Default)]
pub struct Scenario {
    pub assumptions: Vec<Assumption>,
    /// How long after now to compare; None: once every timer has run out ([`settle_after`]).
    pub after: Option<Duration>,
}

/// A published snapshot and what decided it: what a what-if starts from.
#[derive(Clone, Debug, Default)]
pub struct Base {
    pub snapshot: Arc<Snapshot>,
    pub decider: Decider,
}

/// A fleet as it would be, and the instant its decisions are asked at.
#[derive(Debug)]
pub struct Imagined {
    pub snapshot: Snapshot,
    pub at: Instant,
}

/// The fleet under `scenario`, decided at the scenario's instant, by a copy of `decider`
/// (what decided `base`).
pub fn imagine(
    base: &Snapshot,
    decider: &Decider,
    scenario: &Scenario,
    now: Instant,
) -> Result<Imagined, WhatIfError> {
    check_clusters(base, &scenario.assumptions)?;
    let policies = edited_policies(&base.policies, &scenario.assumptions);
    let at = now
        + scenario
            .after
            .unwrap_or_else(|| settle_after(base, &policies));
    let snapshot = derive(
        base,
        decider,
        &scenario.assumptions,
        Arc::new(policies),
        now,
        at,
    );
    Ok(Imagined { snapshot, at })
}

/// How long until every timer a scenario can start has run out: the longest withdraw,
/// failover, failback and toleration time of any policy or member, plus a second.
pub fn settle_after(base: &Snapshot, policies: &Policies) -> Duration {
    let members = base
        .clusters
        .iter()
        .map(|c| c.spec.health.withdraw_after_seconds);
    let traffic = policies
        .iter()
        .map(|p| &p.traffic)
        .chain(std::iter::once(&policies.default))
        .flat_map(|t| {
            let tolerations = t.tolerations.iter().filter_map(|t| t.seconds);
            [
                t.withdraw_after_seconds.unwrap_or(0),
                t.failback_after_seconds,
            ]
            .into_iter()
            .chain(tolerations)
        });
    let placement = policies
        .iter()
        .filter_map(|p| p.placement.as_deref())
        .flat_map(|p| {
            [
                p.failover_after_seconds.unwrap_or(0),
                p.failback_after_seconds,
            ]
        });
    let longest = members.chain(traffic).chain(placement).max().unwrap_or(0);
    // A failover then a failback can follow one another: both windows, end to end.
    Duration::from_secs(longest.saturating_mul(2).saturating_add(1))
}

fn check_clusters(base: &Snapshot, assumptions: &[Assumption]) -> Result<(), WhatIfError> {
    for cluster in assumptions.iter().filter_map(Assumption::cluster) {
        if base.cluster_by_id(cluster).is_none() {
            let members: Vec<&str> = base.clusters.iter().map(|c| c.spec.id.as_str()).collect();
            return Err(WhatIfError::UnknownCluster {
                cluster: cluster.to_string(),
                members: members.join(", "),
            });
        }
    }
    Ok(())
}

/// The policies with every assumed one in place of its namesake (keeping its age) or added.
fn edited_policies(base: &Policies, assumptions: &[Assumption]) -> Policies {
    let mut list: Vec<Policy> = base.as_slice().to_vec();
    for assumed in assumptions {
        let Assumption::Policy(policy) = assumed else {
            continue;
        };
        match list.iter_mut().find(|p| p.key == policy.key) {
            Some(existing) => {
                *existing = Policy {
                    created: existing.created,
                    ..policy.clone()
                }
            }
            None => list.push(policy.clone()),
        }
    }
    Policies::new(base.default.clone(), list)
}

/// The snapshot of the fleet under `assumptions` (none: the baseline), placed at `at`.
fn derive(
    base: &Snapshot,
    decider: &Decider,
    assumptions: &[Assumption],
    policies: Arc<Policies>,
    now: Instant,
    at: Instant,
) -> Snapshot {
    let removed: BTreeSet<&ClusterId> = assumptions
        .iter()
        .filter_map(|a| match a {
            Assumption::Remove(c) => Some(c),
            _ => None,
        })
        .collect();
    let mut clusters: Vec<ClusterView> = Vec::with_capacity(base.clusters.len());
    // Old cluster index → new one (None: removed).
    let mut renumber: Vec<Option<usize>> = Vec::with_capacity(base.clusters.len());
    for view in &base.clusters {
        if removed.contains(&view.spec.id) {
            renumber.push(None);
            continue;
        }
        let id = &view.spec.id;
        let mut view = view.clone();
        for assumed in assumptions.iter().filter(|a| a.cluster() == Some(id)) {
            apply_to_cluster(&mut view, assumed, now);
        }
        // Members already unreachable are withdrawn on their own clock, assumed or not.
        if let Some(since) = view.unreachable_since {
            let withdraw = Duration::from_secs(view.spec.health.withdraw_after_seconds);
            view.withdrawn = at.saturating_duration_since(since) >= withdraw;
        }
        renumber.push(Some(clusters.len()));
        clusters.push(view);
    }
    let mut snapshot = Snapshot::default();
    snapshot.version = base.version;
    snapshot.synced = base.synced;
    snapshot.problems = base.problems.clone();
    snapshot.warnings = base.warnings.clone();
    snapshot.sizes = base.sizes;
    snapshot.geo = base.geo.clone();
    snapshot.templates = base.templates.clone();
    snapshot.overrides = base.overrides.clone();
    snapshot.capacities = Arc::new(
        base.capacities
            .iter()
            .filter(|(id, _)| !removed.contains(id))
            .map(|(id, c)| (id.clone(), c.clone()))
            .collect(),
    );
    snapshot.set_clusters(clusters);
    let renumbered = !removed.is_empty();
    for view in base.services() {
        if let Some(view) = derive_service(view, &policies, renumbered.then_some(&renumber[..])) {
            snapshot.insert_service(view);
        }
    }
    let changed_now = renumbered
        || !policies.same_as(&base.policies)
        || snapshot
            .clusters
            .iter()
            .zip(
                base.clusters
                    .iter()
                    .filter(|c| !removed.contains(&c.spec.id)),
            )
            .any(|(imagined, was)| !same_state(imagined, was));
    snapshot.policies = policies;
    place(base, decider, &mut snapshot, changed_now, now, at);
    snapshot
}

/// The same health, health history and taints: what placement reads of a member (not
/// `withdrawn`, which only traffic reads, and which the imagined fleet dates at `at`).
fn same_state(a: &ClusterView, b: &ClusterView) -> bool {
    a.health == b.health
        && a.unreachable_since == b.unreachable_since
        && a.recovered_at == b.recovered_at
        && a.spec.taints == b.spec.taints
}

/// One assumption about one member, on its view.
fn apply_to_cluster(view: &mut ClusterView, assumed: &Assumption, now: Instant) {
    match assumed {
        Assumption::Health(_, Health::Unreachable) => {
            view.unreachable_since.get_or_insert(now);
            view.health = Health::Unreachable;
            view.reason = Some("assumed unreachable".into());
        }
        Assumption::Health(_, health) => {
            if view.health == Health::Unreachable {
                view.recovered_at = Some(now);
            }
            view.health = *health;
            view.withdrawn = false;
            view.unreachable_since = None;
            view.reason =
                (*health != Health::Healthy).then(|| format!("assumed {}", health.as_str()));
        }
        Assumption::Taint(_, taint) => {
            view.spec
                .taints
                .retain(|t| t.key != taint.key || t.effect != taint.effect);
            view.spec.taints.push(taint.clone());
        }
        Assumption::Untaint(_, key) => view.spec.taints.retain(|t| &t.key != key),
        Assumption::Remove(_) | Assumption::Policy(_) => {}
    }
}

/// A service as the imagined fleet merges it: governed by the edited policies, its clusters
/// renumbered (and the removed ones' parts gone); the same `Arc` when nothing changed. None
/// when no cluster exports it any more.
fn derive_service(
    view: &Arc<ServiceView>,
    policies: &Policies,
    renumber: Option<&[Option<usize>]>,
) -> Option<Arc<ServiceView>> {
    let key = ObjectKey {
        namespace: view.key.namespace.clone(),
        name: view.key.name.clone(),
    };
    let policy = policies.governing(&key, &view.labels).traffic;
    let same_policy = Arc::ptr_eq(policy, &view.policy) || **policy == *view.policy;
    if same_policy && renumber.is_none() {
        return Some(Arc::clone(view));
    }
    let mut derived = ServiceView::clone(view);
    derived.policy = Arc::clone(policy);
    if let Some(renumber) = renumber {
        derived.backends.retain_mut(|b| match renumber[b.cluster] {
            Some(new) => {
                b.cluster = new;
                true
            }
            None => false,
        });
        derived
            .imports
            .retain_mut(|(cluster, _)| match renumber[*cluster] {
                Some(new) => {
                    *cluster = new;
                    true
                }
                None => false,
            });
        if derived.backends.is_empty() {
            return None;
        }
    }
    Some(Arc::new(derived))
}

/// Placement decided again on the imagined fleet, continuing from the base's memory, in the
/// rounds the fleet itself would run: one when the assumptions start, if they change anything
/// placement reads (`changed_now`), then one whenever a decision changes with time alone (a
/// window ends, a member is withdrawn), up to `at`. Without any, the base's decisions stand.
fn place(
    base: &Snapshot,
    decider: &Decider,
    snapshot: &mut Snapshot,
    changed_now: bool,
    now: Instant,
    at: Instant,
) {
    snapshot.placements = Arc::clone(&base.placements);
    if !base.templates.is_empty() {
        let withdrawals: Vec<Instant> = snapshot
            .clusters
            .iter()
            .filter_map(|c| {
                let since = c.unreachable_since?;
                Some(since + Duration::from_secs(c.spec.health.withdraw_after_seconds))
            })
            .collect();
        let mut placer: Option<crate::placement::Placer> = None;
        let mut decided: Option<crate::placement::Placements> = None;
        let clusters = snapshot.cluster_inputs();
        let inputs = Inputs {
            templates: &snapshot.templates,
            policies: snapshot.policies.as_slice(),
            overrides: &snapshot.overrides,
            clusters: &clusters,
            programs: &*decider.programs.0,
        };
        let round = |t: Instant, placer: &mut Option<crate::placement::Placer>| {
            placer
                .get_or_insert_with(|| (*decider.placer).clone())
                .place(inputs, t)
        };
        // As the fleet does: after a round that did not settle, up to SETTLING_ROUNDS more at
        // once.
        let settle = |t: Instant,
                      decided: &mut Option<crate::placement::Placements>,
                      placer: &mut Option<crate::placement::Placer>| {
            for _ in 0..crate::placement::SETTLING_ROUNDS {
                if decided.as_ref().is_none_or(|d| d.settled) {
                    break;
                }
                *decided = Some(round(t, placer));
            }
        };
        if changed_now {
            decided = Some(round(now, &mut placer));
            settle(now, &mut decided, &mut placer);
        }
        let mut t = now;
        loop {
            let deadline = decided.as_ref().unwrap_or(&base.placements).next_deadline;
            let next = withdrawals
                .iter()
                .copied()
                .chain(deadline)
                .filter(|&d| d > t && d <= at)
                .min();
            let Some(next) = next else { break };
            decided = Some(round(next, &mut placer));
            settle(next, &mut decided, &mut placer);
            t = next;
        }
        if let Some(decided) = decided {
            snapshot.placements = Arc::new(decided);
        }
    }
    snapshot.workloads = Arc::new(placed_workloads(snapshot));
}

/// Where one client's traffic for one service goes, by cluster name (so two fleets whose
/// clusters are numbered differently compare).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    /// In priority order: DNS answers from the first, EDS priorities are these.
    pub tiers: Vec<Vec<RouteMember>>,
    /// Clusters that get none of it, and why.
    pub filtered: Vec<(ClusterId, FilterReason)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteMember {
    pub cluster: ClusterId,
    pub weight: u32,
    pub ready: u32,
    pub via_gateway: bool,
}

impl Route {
    fn of(snapshot: &Snapshot, selection: &Selection) -> Self {
        let id = |c: usize| snapshot.clusters[c].spec.id.clone();
        Self {
            tiers: selection
                .tiers
                .iter()
                .map(|t| {
                    t.members
                        .iter()
                        .map(|m| RouteMember {
                            cluster: id(m.cluster),
                            weight: m.weight,
                            ready: m.ready,
                            via_gateway: m.via_gateway(),
                        })
                        .collect()
                })
                .collect(),
            filtered: selection
                .filtered
                .iter()
                .map(|f| (id(f.cluster), f.reason.clone()))
                .collect(),
        }
    }

    /// The clusters DNS answers from.
    pub fn first_tier(&self) -> BTreeSet<&ClusterId> {
        self.tiers
            .first()
            .into_iter()
            .flatten()
            .map(|m| &m.cluster)
            .collect()
    }

    /// Each first-tier cluster's share of the weight.
    fn first_tier_shares(&self) -> impl Iterator<Item = (&ClusterId, f64)> {
        let first = self.tiers.first().map(Vec::as_slice).unwrap_or_default();
        let total: u64 = first.iter().map(|m| u64::from(m.weight)).sum();
        first
            .iter()
            .map(move |m| (&m.cluster, m.weight as f64 / total.max(1) as f64))
    }
}

/// A client whose route changes.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientChange {
    /// The clients whose route changes this way: their clusters (None for a client in no
    /// cluster), in cluster order. Clients of one region and network mostly change alike, so
    /// a fleet of hundreds of clusters gives a few groups per service, not hundreds.
    pub clients: Vec<Option<ClusterId>>,
    pub before: Route,
    /// None: the service is not served any more (its last exporting cluster left).
    pub after: Option<Route>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceChange {
    /// `namespace/name`.
    pub service: String,
    pub clients: Vec<ClientChange>,
}

/// Replicas (None: a whole copy) per cluster.
pub type Spread = Vec<(ClusterId, Option<u32>)>;

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadChange {
    pub template: String,
    pub before: Spread,
    pub after: Spread,
    /// "scheduled" or the reason it could not be.
    pub outcome_before: String,
    pub outcome_after: String,
    /// Replicas that leave each cluster (evicted there, to start elsewhere).
    pub evicted: Vec<(ClusterId, u32)>,
    /// Replicas that start in each cluster.
    pub started: Vec<(ClusterId, u32)>,
}

/// A cluster's share of one region's clients' traffic to the services that change.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Share {
    /// The clients' region ("" for clusters without one).
    pub region: String,
    pub cluster: ClusterId,
    pub before_percent: f64,
    pub after_percent: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    pub services_changed: usize,
    /// Services where some client's first tier (what DNS answers) is another set of clusters.
    pub first_tier_changed: usize,
    pub clients_changed: usize,
    pub workloads_changed: usize,
    pub replicas_moved: u32,
    /// Where a region's clients' first-tier traffic shifts by at least half a point.
    pub shares: Vec<Share>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Simulation {
    pub assumptions: Vec<String>,
    /// The instant compared, in seconds after now.
    pub after_seconds: u64,
    pub services: Vec<ServiceChange>,
    pub workloads: Vec<WorkloadChange>,
    pub totals: Totals,
    /// What the comparison leaves out, in words.
    pub notes: Vec<String>,
}

/// A simulation and the two fleets it compared.
#[derive(Debug)]
pub struct Simulated {
    pub simulation: Simulation,
    /// The fleet as it is, at `at`.
    pub baseline: Snapshot,
    /// The fleet as assumed, at `at`.
    pub imagined: Snapshot,
    pub at: Instant,
    /// `at` is when every timer has run out (no `after` was given).
    pub settled: bool,
}

/// The baseline and the scenario at one instant, and what differs between them.
pub fn simulate(
    base: &Snapshot,
    decider: &Decider,
    scenario: &Scenario,
    now: Instant,
) -> Result<Simulated, WhatIfError> {
    let imagined = imagine(base, decider, scenario, now)?;
    let at = imagined.at;
    let baseline = derive(base, decider, &[], Arc::clone(&base.policies), now, at);
    let touched: BTreeSet<&ClusterId> = scenario
        .assumptions
        .iter()
        .filter_map(Assumption::cluster)
        .collect();
    let (services, shares) = service_changes(&baseline, &imagined.snapshot, &touched, at);
    let workloads = workload_changes(&baseline, &imagined.snapshot);
    let mut notes = Vec::new();
    for removed in scenario.assumptions.iter().filter_map(|a| match a {
        Assumption::Remove(c) => Some(c),
        _ => None,
    }) {
        notes.push(format!(
            "clients in {removed} are not compared: it leaves the fleet (its addresses become clients of no cluster)"
        ));
    }
    let totals = Totals {
        services_changed: services.len(),
        first_tier_changed: services
            .iter()
            .filter(|s| {
                s.clients
                    .iter()
                    .any(|c| Some(c.before.first_tier()) != c.after.as_ref().map(Route::first_tier))
            })
            .count(),
        clients_changed: services
            .iter()
            .flat_map(|s| &s.clients)
            .map(|c| c.clients.len())
            .sum(),
        workloads_changed: workloads.len(),
        replicas_moved: workloads
            .iter()
            .flat_map(|w| &w.evicted)
            .map(|(_, n)| n)
            .sum(),
        shares,
    };
    let simulation = Simulation {
        assumptions: scenario
            .assumptions
            .iter()
            .map(ToString::to_string)
            .collect(),
        after_seconds: at.saturating_duration_since(now).as_secs(),
        services,
        workloads,
        totals,
        notes,
    };
    Ok(Simulated {
        simulation,
        baseline,
        imagined: imagined.snapshot,
        at,
        settled: scenario.after.is_none(),
    })
}

/// Weight shares summed per (client region, cluster), and how many (service, client) pairs
/// were summed per region.
#[derive(Default)]
struct ShareSums {
    sums: BTreeMap<(String, ClusterId), (f64, f64)>,
    pairs: BTreeMap<String, u32>,
}

impl ShareSums {
    fn add(&mut self, region: &str, before: Option<&Route>, after: Option<&Route>) {
        *self.pairs.entry(region.to_owned()).or_default() += 1;
        for (cluster, share) in before.into_iter().flat_map(Route::first_tier_shares) {
            self.sums
                .entry((region.to_owned(), cluster.clone()))
                .or_default()
                .0 += share;
        }
        for (cluster, share) in after.into_iter().flat_map(Route::first_tier_shares) {
            self.sums
                .entry((region.to_owned(), cluster.clone()))
                .or_default()
                .1 += share;
        }
    }

    fn shifts(self) -> Vec<Share> {
        self.sums
            .into_iter()
            .filter_map(|((region, cluster), (before, after))| {
                let pairs = f64::from(self.pairs[&region]);
                let (before, after) = (100.0 * before / pairs, 100.0 * after / pairs);
                ((after - before).abs() >= 0.5).then(|| Share {
                    region,
                    cluster,
                    before_percent: (before * 10.0).round() / 10.0,
                    after_percent: (after * 10.0).round() / 10.0,
                })
            })
            .collect()
    }
}

/// Every service whose route changes for some client, and the regional shares over them.
/// A service is compared only when something its decision reads may differ: its policy, a
/// member it spans that the scenario touches, or where its policy places workloads.
fn service_changes(
    baseline: &Snapshot,
    imagined: &Snapshot,
    touched: &BTreeSet<&ClusterId>,
    at: Instant,
) -> (Vec<ServiceChange>, Vec<Share>) {
    let mut changes = Vec::new();
    let mut shares = ShareSums::default();
    // Clients: every cluster of the baseline still in the fleet, and a client of none.
    let clients: Vec<(Option<usize>, Option<usize>)> = baseline
        .clusters
        .iter()
        .enumerate()
        .filter_map(|(i, c)| Some((Some(i), Some(imagined.cluster_by_id(&c.spec.id)?))))
        .chain(std::iter::once((None, None)))
        .collect();
    for before in baseline.services() {
        let after = imagined.service(&before.key.namespace, &before.key.name);
        if !may_differ(baseline, before, imagined, after, touched) {
            continue;
        }
        let mut service = ServiceChange {
            service: format!("{}/{}", before.key.namespace, before.key.name),
            clients: Vec::new(),
        };
        let mut routes = Vec::with_capacity(clients.len());
        for &(b, a) in &clients {
            let route_before = Route::of(baseline, &select(baseline, before, b, at));
            let route_after = after.map(|view| Route::of(imagined, &select(imagined, view, a, at)));
            routes.push((b, route_before, route_after));
        }
        if routes
            .iter()
            .all(|(_, b, a)| a.as_ref().is_some_and(|a| a.tiers == b.tiers))
        {
            continue;
        }
        for (b, route_before, route_after) in routes {
            if let Some(c) = b {
                let region = baseline.clusters[c]
                    .spec
                    .locality
                    .region
                    .as_deref()
                    .unwrap_or("");
                shares.add(region, Some(&route_before), route_after.as_ref());
            }
            if route_after
                .as_ref()
                .is_some_and(|a| a.tiers == route_before.tiers)
            {
                continue;
            }
            let client = b.map(|c| baseline.clusters[c].spec.id.clone());
            match service
                .clients
                .iter_mut()
                .find(|g| g.before == route_before && g.after == route_after)
            {
                Some(group) => group.clients.push(client),
                None => service.clients.push(ClientChange {
                    clients: vec![client],
                    before: route_before,
                    after: route_after,
                }),
            }
        }
        changes.push(service);
    }
    (changes, shares.shifts())
}

fn may_differ(
    baseline: &Snapshot,
    before: &ServiceView,
    imagined: &Snapshot,
    after: Option<&Arc<ServiceView>>,
    touched: &BTreeSet<&ClusterId>,
) -> bool {
    let Some(after) = after else {
        return true;
    };
    let spans_touched = before
        .backends
        .iter()
        .any(|b| touched.contains(&baseline.clusters[b.cluster].spec.id));
    let ids = |s: &Snapshot, w: Option<&[usize]>| {
        w.map(|w| {
            w.iter()
                .map(|&c| s.clusters[c].spec.id.clone())
                .collect::<Vec<_>>()
        })
    };
    spans_touched
        || *after.policy != *before.policy
        || ids(baseline, baseline.workloads_of(&before.policy))
            != ids(imagined, imagined.workloads_of(&after.policy))
}

/// Every template whose placement differs, with the replicas that move.
fn workload_changes(baseline: &Snapshot, imagined: &Snapshot) -> Vec<WorkloadChange> {
    let keys: BTreeSet<&TemplateKey> = baseline
        .placements
        .decisions
        .keys()
        .chain(imagined.placements.decisions.keys())
        .collect();
    let spread = |s: &Snapshot, k: &TemplateKey| -> (Spread, String) {
        match s.placements.decisions.get(k) {
            Some(d) => (
                d.placed
                    .iter()
                    .map(|p| (p.cluster.clone(), p.replicas))
                    .collect(),
                match &d.outcome {
                    Outcome::Scheduled => "scheduled".into(),
                    Outcome::Unschedulable { reason } => format!("unschedulable: {reason}"),
                },
            ),
            None => (Vec::new(), "not placed".into()),
        }
    };
    keys.into_iter()
        .filter_map(|key| {
            let (before, outcome_before) = spread(baseline, key);
            let (after, outcome_after) = spread(imagined, key);
            if before == after && outcome_before == outcome_after {
                return None;
            }
            let count = |s: &Spread| -> HashMap<ClusterId, u32> {
                s.iter().map(|(c, r)| (c.clone(), r.unwrap_or(1))).collect()
            };
            let (was, will) = (count(&before), count(&after));
            let moved = |from: &HashMap<ClusterId, u32>, to: &HashMap<ClusterId, u32>| {
                let mut out: Vec<(ClusterId, u32)> = from
                    .iter()
                    .filter_map(|(c, n)| {
                        let left = n.saturating_sub(to.get(c).copied().unwrap_or(0));
                        (left > 0).then(|| (c.clone(), left))
                    })
                    .collect();
                out.sort();
                out
            };
            Some(WorkloadChange {
                template: key.to_string(),
                evicted: moved(&was, &will),
                started: moved(&will, &was),
                before,
                after,
                outcome_before,
                outcome_after,
            })
        })
        .collect()
}

pub mod rollout;

#[cfg(test)]
mod tests;
