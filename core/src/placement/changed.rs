//! What changed since the last round, so that a round decides again only the templates whose
//! inputs changed: one edit among 10,000 templates costs one decision, not 10,000.
//!
//! [`Seen`] is what the last round decided from and what it decided. A round compares its
//! inputs with it ([`Seen::dirt`]) and decides a template again when:
//! - it is new, or the template, its governing policy or an OverridePolicy selecting it (before
//!   or after the change) changed, or a deadline of its own (a return to an earlier tier) passed;
//! - its policy's plan changed for a cluster the policy can use (unfiltered in this round or the
//!   last): a filter, a tier, a weight; or such a cluster's spec, health or clocks changed;
//! - it divides by capacity, and a usable cluster's capacity, or the room other templates hold
//!   there, changed — in the last round (what it saw then of the templates after it) or earlier
//!   in this one (what it sees now of those before it);
//! - its policy scores clusters or runs programs and a usable cluster's capacity changed; a
//!   policy that runs programs decides every round (their answers arrive between rounds);
//! - its policy reads where other workloads run, and a template or a placement changed;
//! - it follows its policy's workloads in its namespace, and one of them moved or their set
//!   changed.
//!
//! A cluster filtered out both times whose reason alone changed (a taint on a cluster outside
//! the affinities, say) changes only the `excluded` reason of the policy's other decisions:
//! those are patched, not decided. A round whose cluster set changed, or any cluster's region or
//! zone (spread groups and scores count every cluster), decides everything. The property test
//! `incremental_placement_equals_deciding_everything` checks that a placer deciding this way
//! and one deciding everything give the same decisions after every step of random changes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use crate::model::{ClusterId, ClusterSpec, ObjectKey};
use crate::policy::Policy;
use crate::registry::Health;

use super::filter::{ClusterPlan, Fleet, Plan, TierPlan};
use super::{
    Capacity, ClusterInput, Decision, Inputs, OverridePolicy, Placed, PlacementFilter,
    PlacementPolicy, Template,
};
use super::{KeyMap, Resources, TemplateKey};

/// What the last round decided from, and what it decided.
#[derive(Clone, Debug, Default)]
pub(super) struct Seen {
    /// A round has been seen: the first decides everything.
    ready: bool,
    /// In name order.
    clusters: Vec<SeenCluster>,
    policies: HashMap<ObjectKey, SeenPolicy>,
    /// By key.
    overrides: Vec<OverridePolicy>,
    templates: KeyMap<SeenTemplate>,
    /// The number of the last round (each template remembers the last round that saw it).
    round: u64,
    /// Per cluster position: the room templates hold there changed last round.
    held: Vec<bool>,
    /// Where some template runs changed last round.
    placed: bool,
}

/// What placement reads of a cluster (not its endpoint count, which changes all the time).
#[derive(Clone, Debug, PartialEq)]
struct SeenCluster {
    spec: ClusterSpec,
    health: Health,
    withdrawn: bool,
    unreachable_since: Option<Instant>,
    recovered_at: Option<Instant>,
    capacity: Option<Capacity>,
}

impl SeenCluster {
    fn of(c: &ClusterInput<'_>) -> Self {
        Self {
            spec: c.view.spec.clone(),
            health: c.view.health,
            withdrawn: c.view.withdrawn,
            unreachable_since: c.view.unreachable_since,
            recovered_at: c.view.recovered_at,
            capacity: c.capacity.cloned(),
        }
    }

    /// Whether `c` reads the same apart from its capacity.
    fn same_view(&self, c: &ClusterInput<'_>) -> bool {
        let v = c.view;
        self.health == v.health
            && self.withdrawn == v.withdrawn
            && self.unreachable_since == v.unreachable_since
            && self.recovered_at == v.recovered_at
            && self.spec == v.spec
    }
}

#[derive(Clone, Debug)]
struct SeenPolicy {
    policy: Policy,
    placement: Arc<PlacementPolicy>,
    clusters: Arc<[ClusterPlan]>,
    tiers: Arc<[TierPlan]>,
    deadline: Option<Instant>,
    timeless: bool,
}

/// One template as the last round decided it.
#[derive(Clone, Debug)]
pub(super) struct SeenTemplate {
    template: Template,
    /// The policy that placed it (None: a dependency, or placed by none).
    governing: Option<ObjectKey>,
    pub decision: Arc<Decision>,
    /// When its decision changes with time alone.
    pub deadline: Option<Instant>,
    /// Deciding it changed its memory (the previous split, tier, failover or return clocks):
    /// the next round decides it again, from that memory.
    unsettled: bool,
    /// The last round that saw it: the map is kept from round to round and updated in place
    /// (moving 10,000 entries into a new map was a good part of a round that decides one).
    pub round: u64,
}

/// What this round must decide again, and what it learns as it decides.
pub(super) struct Dirt {
    /// Everything (the first round, the cluster set changed, or a placer deciding everything).
    pub all: bool,
    /// Some cluster's capacity changed.
    pub capacity_changed: bool,
    /// Templates seen last round that are gone.
    pub gone: Vec<TemplateKey>,
    /// Per policy (its index this round): every template it places.
    policy: Vec<bool>,
    /// Per policy: capacity changed in a cluster it can use.
    capacity: Vec<bool>,
    /// Per policy: cluster positions whose filter only changed its reason.
    relabel: Vec<Vec<usize>>,
    /// Per policy: the cluster positions it can use (unfiltered now or last round).
    usable: Vec<Vec<usize>>,
    /// Per policy: whether `held` touches a usable cluster, as of `held_version`.
    held_hits: Vec<Option<(u64, bool)>>,
    /// OverridePolicies added, removed or changed (both versions of a changed one).
    overrides: Vec<OverridePolicy>,
    /// Per cluster position: the room templates hold there changed last round or earlier in
    /// this one.
    held: Vec<bool>,
    /// Changed this round (next round's `Seen::held`).
    held_now: Vec<bool>,
    /// Bumped when `held` gains a position.
    held_version: u64,
    /// Where some template runs changed last round.
    placed_last: bool,
    /// … or earlier in this round.
    placed_now: bool,
    /// A template was added, removed or changed.
    templates_changed: bool,
    /// Per template (its index this round): new, or changed itself or its policy.
    changed: Vec<bool>,
    /// `(policy, namespace)` groups whose workloads moved or changed: followers decide again.
    groups: HashSet<(usize, Arc<str>)>,
}

/// What one template reads, for [`Dirt::must_decide`].
pub(super) struct Reads {
    /// Its index in the round's templates.
    pub index: usize,
    /// Its policy's index this round.
    pub governing: usize,
    /// It divides by capacity.
    pub room: bool,
    /// Its policy reads where other workloads run.
    pub workloads: bool,
    /// It follows its policy's workloads in its namespace.
    pub follows: bool,
}

impl Seen {
    /// What this round must decide again, comparing its inputs with the last round's
    /// (`views_changed`: [`Self::views_changed`]).
    pub(super) fn dirt(
        &self,
        fleet: &Fleet<'_>,
        inputs: &Inputs<'_>,
        plans: &[Option<Plan<'_>>],
        governing: &[Option<usize>],
        views_changed: Option<&[bool]>,
        everything: bool,
    ) -> Dirt {
        let policies = inputs.policies;
        let n = fleet.len();
        let same_localities = || {
            self.clusters
                .iter()
                .zip(&fleet.clusters)
                .all(|(s, c)| s.spec.locality == c.view.spec.locality)
        };
        // Everything: in the first round, for a placer deciding everything, or when the cluster
        // set (`views_changed` is None) or a cluster's region or zone changed.
        let (all, view_changed) = match views_changed {
            Some(changed) if !everything && self.ready && same_localities() => (false, changed),
            _ => (true, &[][..]),
        };
        let mut dirt = Dirt {
            all,
            capacity_changed: all,
            gone: Vec::new(),
            policy: vec![all; policies.len()],
            capacity: vec![false; policies.len()],
            relabel: vec![Vec::new(); policies.len()],
            usable: vec![Vec::new(); policies.len()],
            held_hits: vec![None; policies.len()],
            overrides: Vec::new(),
            held: if all {
                vec![false; n]
            } else {
                self.held.clone()
            },
            held_now: vec![false; n],
            held_version: 0,
            placed_last: self.placed,
            placed_now: false,
            templates_changed: false,
            changed: Vec::new(),
            groups: HashSet::new(),
        };
        if all {
            return dirt;
        }
        let capacity_changed: Vec<bool> = self
            .clusters
            .iter()
            .zip(&fleet.clusters)
            .map(|(s, c)| s.capacity.as_ref() != c.capacity)
            .collect();
        dirt.capacity_changed = capacity_changed.contains(&true);
        for (g, plan) in plans.iter().enumerate() {
            let Some(plan) = plan else { continue };
            dirt.compare_plan(g, plan, self.policies.get(&plan.policy.key));
            let usable = &dirt.usable[g];
            if usable.iter().any(|&p| view_changed[p]) {
                dirt.policy[g] = true;
            }
            if usable.iter().any(|&p| capacity_changed[p]) {
                dirt.capacity[g] = true;
                let scoring = &plan.placement.scoring;
                dirt.policy[g] |= scoring.scores() || scoring.reads_workloads();
            }
            dirt.policy[g] |= !plan.placement.scoring.programs().is_empty();
        }
        dirt.overrides = changed_overrides(&self.overrides, inputs.overrides);
        dirt.compare_templates(self, fleet, inputs.templates, policies, governing);
        dirt
    }

    /// Per cluster position, whether placement reads it differently from the last round
    /// (apart from its capacity); None when the cluster set itself changed.
    pub(super) fn views_changed(&self, fleet: &Fleet<'_>) -> Option<Vec<bool>> {
        let same_set = self.clusters.len() == fleet.len()
            && self
                .clusters
                .iter()
                .zip(&fleet.clusters)
                .all(|(s, c)| s.spec.id == c.view.spec.id);
        same_set.then(|| {
            self.clusters
                .iter()
                .zip(&fleet.clusters)
                .map(|(s, c)| !s.same_view(c))
                .collect()
        })
    }

    /// The last round's plan of `policy`, when this round would make the same one: the same
    /// policy over the same cluster views (`fleet_same`), before the plan's deadline, and no
    /// filter in it that changes with time ([`Plan::timeless`]). Building a plan reads every
    /// cluster (1,000 per policy), the most of a round that decides one template.
    pub(super) fn reusable_plan<'p>(
        &self,
        policy: &'p Policy,
        fleet_same: bool,
        now: Instant,
    ) -> Option<Plan<'p>> {
        let seen = self.policies.get(&policy.key)?;
        let same = fleet_same
            && seen.timeless
            && seen.deadline.is_none_or(|d| now < d)
            && seen.policy == *policy;
        same.then(|| Plan {
            policy,
            placement: seen.placement.clone(),
            clusters: seen.clusters.clone(),
            tiers: seen.tiers.clone(),
            deadline: seen.deadline,
        })
    }

    /// Whether the next round, with nothing changed, would decide nothing.
    pub(super) fn settled(&self) -> bool {
        !self.placed
            && !self.held.iter().any(|h| *h)
            && !self.templates.values().any(|t| t.unsettled)
    }

    /// Keeps what this round decided from and decided, for the next round.
    pub(super) fn remember(
        &mut self,
        fleet: &Fleet<'_>,
        overrides: &[OverridePolicy],
        plans: &[Option<Plan<'_>>],
        templates: KeyMap<SeenTemplate>,
        dirt: Dirt,
    ) {
        self.ready = true;
        if self.clusters.len() != fleet.len() {
            self.clusters = fleet.clusters.iter().map(SeenCluster::of).collect();
        } else {
            for (s, c) in self.clusters.iter_mut().zip(&fleet.clusters) {
                if !s.same_view(c) || s.capacity.as_ref() != c.capacity {
                    *s = SeenCluster::of(c);
                }
            }
        }
        self.policies
            .retain(|k, _| plans.iter().flatten().any(|plan| plan.policy.key == *k));
        for plan in plans.iter().flatten() {
            let seen = SeenPolicy {
                policy: plan.policy.clone(),
                placement: plan.placement.clone(),
                clusters: plan.clusters.clone(),
                tiers: plan.tiers.clone(),
                deadline: plan.deadline,
                timeless: plan.timeless(),
            };
            self.policies.insert(plan.policy.key.clone(), seen);
        }
        let sorted = by_key(overrides);
        if self.overrides.len() != sorted.len()
            || self.overrides.iter().zip(&sorted).any(|(a, b)| a != *b)
        {
            self.overrides = sorted.into_iter().cloned().collect();
        }
        self.templates = templates;
        self.held = dirt.held_now;
        self.placed = dirt.placed_now;
    }

    /// Starts a round: its number, and the last round's templates, to update in place.
    pub(super) fn next_round(&mut self) -> (u64, KeyMap<SeenTemplate>) {
        self.round += 1;
        (self.round, std::mem::take(&mut self.templates))
    }
}

impl SeenTemplate {
    pub(super) fn new(
        template: &Template,
        governing: Option<&Policy>,
        decision: Arc<Decision>,
        deadline: Option<Instant>,
        unsettled: bool,
    ) -> Self {
        Self {
            template: template.clone(),
            governing: governing.map(|p| p.key.clone()),
            decision,
            deadline,
            unsettled,
            round: 0,
        }
    }

    /// The template as that round saw it.
    pub(super) fn template(&self) -> &Template {
        &self.template
    }

    /// A policy placed it (it was not a dependency).
    pub(super) fn governed(&self) -> bool {
        self.governing.is_some()
    }

    /// The entry as seen in round `round`.
    pub(super) fn seen_in(self, round: u64) -> Self {
        Self { round, ..self }
    }
}

/// The decisions made or kept so far in round `round`: the templates it has seen.
pub(super) struct ThisRound<'a> {
    templates: &'a KeyMap<SeenTemplate>,
    round: u64,
}

impl<'a> ThisRound<'a> {
    pub(super) fn of(templates: &'a KeyMap<SeenTemplate>, round: u64) -> Self {
        Self { templates, round }
    }

    pub(super) fn get(&self, key: &TemplateKey) -> Option<&'a Arc<Decision>> {
        self.templates
            .get(key)
            .filter(|s| s.round == self.round)
            .map(|s| &s.decision)
    }
}

impl Dirt {
    /// Compares the plan of policy `g` with the last round's: which clusters it can use, and
    /// whether its templates must be decided again or only their reasons patched.
    fn compare_plan(&mut self, g: usize, plan: &Plan<'_>, seen: Option<&SeenPolicy>) {
        let Some(seen) = seen.filter(|s| s.policy == *plan.policy) else {
            self.policy[g] = true;
            self.usable[g] = (0..plan.clusters.len())
                .filter(|&p| plan.clusters[p].filter.is_none())
                .collect();
            return;
        };
        if Arc::ptr_eq(&seen.clusters, &plan.clusters) && Arc::ptr_eq(&seen.tiers, &plan.tiers) {
            // The last round's plan, reused: nothing to compare.
            self.usable[g] = (0..plan.clusters.len())
                .filter(|&p| plan.clusters[p].filter.is_none())
                .collect();
            return;
        }
        let tiers_same = seen.tiers.len() == plan.tiers.len()
            && seen
                .tiers
                .iter()
                .zip(plan.tiers.iter())
                .all(|(a, b)| a.feasible == b.feasible);
        self.policy[g] |= !tiers_same;
        for (p, (old, new)) in seen.clusters.iter().zip(plan.clusters.iter()).enumerate() {
            if old.filter.is_none() || new.filter.is_none() {
                self.usable[g].push(p);
            }
            if old == new {
                continue;
            }
            if reason_only(old, new) {
                self.relabel[g].push(p);
            } else {
                self.policy[g] = true;
            }
        }
    }

    /// Templates added, removed or changed: the workload groups and rooms they touch.
    fn compare_templates(
        &mut self,
        seen: &Seen,
        fleet: &Fleet<'_>,
        templates: &[Template],
        policies: &[Policy],
        governing: &[Option<usize>],
    ) {
        self.changed = vec![false; templates.len()];
        let mut found = 0;
        for (i, (t, g)) in templates.iter().zip(governing).enumerate() {
            let key = g.map(|g| &policies[g].key);
            let old = seen.templates.get(&t.key);
            found += usize::from(old.is_some());
            if old.is_some_and(|o| o.template == *t && o.governing.as_ref() == key) {
                continue;
            }
            self.changed[i] = true;
            self.templates_changed = true;
            let Some(old) = old else {
                if let (Some(g), Some(_)) = (g, t.replicas) {
                    self.groups.insert((*g, t.key.namespace.clone()));
                }
                continue;
            };
            // An edit that keeps its policy, requests and kind of division changes what others
            // read only if its decision moves (`decided` sees that).
            let same_policy = old.governing.as_ref() == key;
            if !same_policy || old.template.requests != t.requests {
                self.forget(fleet, policies, old);
            }
            if let (true, Some(g)) = (same_policy, g)
                && old.template.replicas.is_some() != t.replicas.is_some()
            {
                self.groups.insert((*g, t.key.namespace.clone()));
            }
        }
        if found == seen.templates.len() {
            return; // none was removed
        }
        let current: HashSet<&TemplateKey> = templates.iter().map(|t| &t.key).collect();
        for (key, old) in &seen.templates {
            if !current.contains(key) {
                self.templates_changed = true;
                self.forget(fleet, policies, old);
                self.gone.push(key.clone());
            }
        }
    }

    /// A template's last decision no longer stands as it was: the room it held is given
    /// back, and the workloads of its group changed.
    fn forget(&mut self, fleet: &Fleet<'_>, policies: &[Policy], old: &SeenTemplate) {
        self.placed_now = true;
        self.hold_changed(fleet, old.template.requests, &old.decision.placed);
        let position = old
            .governing
            .as_ref()
            .and_then(|k| policies.iter().position(|p| p.key == *k));
        if let (Some(g), Some(_)) = (position, old.template.replicas) {
            self.groups.insert((g, old.template.key.namespace.clone()));
        }
    }

    /// Marks the clusters where `placed` holds room for replicas of `requests`.
    fn hold_changed(&mut self, fleet: &Fleet<'_>, requests: Resources, placed: &[Placed]) {
        if requests == Resources::default() {
            return;
        }
        for placed in placed.iter().filter(|p| p.replicas.unwrap_or(0) > 0) {
            if let Some(p) = fleet.position(&placed.cluster) {
                self.held_now[p] = true;
                if !self.held[p] {
                    self.held[p] = true;
                    self.held_version += 1;
                }
            }
        }
    }

    /// Whether a template governed by a policy must be decided again this round.
    pub(super) fn must_decide(
        &mut self,
        t: &Template,
        reads: &Reads,
        seen: Option<&SeenTemplate>,
        now: Instant,
    ) -> bool {
        let g = reads.governing;
        let Some(seen) = seen else { return true };
        if self.all
            || self.changed[reads.index]
            || seen.unsettled
            || self.policy[g]
            || seen.deadline.is_some_and(|d| d <= now)
            || self.overrides.iter().any(|o| o.selects(t).is_some())
        {
            return true;
        }
        if reads.room && (self.capacity[g] || self.held_in_usable(g)) {
            return true;
        }
        if reads.workloads && (self.templates_changed || self.placed_last || self.placed_now) {
            return true;
        }
        reads.follows && self.groups.contains(&(g, t.key.namespace.clone()))
    }

    /// Whether template `i` (its index this round) is new, or changed itself or its policy.
    pub(super) fn changed(&self, i: usize) -> bool {
        self.changed.get(i).copied().unwrap_or(self.all)
    }

    fn held_in_usable(&mut self, g: usize) -> bool {
        if let Some((version, hit)) = self.held_hits[g]
            && version == self.held_version
        {
            return hit;
        }
        let hit = self.usable[g].iter().any(|&p| self.held[p]);
        self.held_hits[g] = Some((self.held_version, hit));
        hit
    }

    /// Takes in a decision made this round: where it moved and what room it holds now.
    pub(super) fn decided(
        &mut self,
        fleet: &Fleet<'_>,
        t: &Template,
        governing: Option<usize>,
        decision: &Decision,
        seen: Option<&SeenTemplate>,
    ) {
        let moved = seen.is_none_or(|s| {
            s.decision.tier != decision.tier || footprint(&s.decision) != footprint(decision)
        });
        if !moved {
            return;
        }
        self.placed_now = true;
        if let Some(seen) = seen {
            self.hold_changed(fleet, seen.template.requests, &seen.decision.placed);
        }
        self.hold_changed(fleet, t.requests, &decision.placed);
        if let (Some(g), Some(_)) = (governing, t.replicas) {
            self.groups.insert((g, t.key.namespace.clone()));
        }
    }

    /// Whether some cluster's filter of policy `g` changed its reason alone: the decisions
    /// kept need [`Self::patched`].
    pub(super) fn relabels(&self, g: usize) -> bool {
        !self.relabel[g].is_empty()
    }

    /// A decision kept from the last round, with the excluded reasons of the clusters whose
    /// filter alone changed brought up to date.
    pub(super) fn patched(
        &self,
        g: usize,
        plan: &Plan<'_>,
        fleet: &Fleet<'_>,
        mut decision: Arc<Decision>,
    ) -> Arc<Decision> {
        for &p in &self.relabel[g] {
            let Some(reason) = &plan.clusters[p].filter else {
                continue;
            };
            let id = fleet.id(p);
            let Ok(i) = decision.excluded.binary_search_by(|e| e.cluster.cmp(id)) else {
                continue;
            };
            if decision.excluded[i].reason != *reason {
                Arc::make_mut(&mut Arc::make_mut(&mut decision).excluded)[i].reason =
                    reason.clone();
            }
        }
        decision
    }
}

/// What others read of a decision: where it runs and how many replicas (not the reasons,
/// which carry numbers such as the room seen).
fn footprint(d: &Decision) -> Vec<(&ClusterId, Option<u32>)> {
    d.placed.iter().map(|p| (&p.cluster, p.replicas)).collect()
}

/// Whether a cluster's plan changed only in why it is filtered out: filtered both times, in
/// the same tiers with the same weight, and not failed over either time (the clusters a
/// decision left out as failed over are remembered with it).
fn reason_only(old: &ClusterPlan, new: &ClusterPlan) -> bool {
    let failover = |f: &Option<PlacementFilter>| {
        matches!(
            f,
            Some(PlacementFilter::FailedOver { .. } | PlacementFilter::FailingBack { .. })
        )
    };
    old.filter.is_some()
        && new.filter.is_some()
        && !failover(&old.filter)
        && !failover(&new.filter)
        && old.first_tier == new.first_tier
        && old.prefer_no == new.prefer_no
        && old.weight == new.weight
}

fn by_key(overrides: &[OverridePolicy]) -> Vec<&OverridePolicy> {
    let mut sorted: Vec<&OverridePolicy> = overrides.iter().collect();
    sorted.sort_by(|a, b| a.key.cmp(&b.key));
    sorted
}

/// The OverridePolicies that differ between the last round (`old`, by key) and this one:
/// both versions of a changed one, so the templates either selects are decided again.
fn changed_overrides(old: &[OverridePolicy], new: &[OverridePolicy]) -> Vec<OverridePolicy> {
    let new = by_key(new);
    let mut changed = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j)) {
            (Some(a), Some(b)) if a.key == b.key => {
                if a != *b {
                    changed.push(a.clone());
                    changed.push((*b).clone());
                }
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a.key < b.key => {
                changed.push(a.clone());
                i += 1;
            }
            (Some(_), Some(b)) | (None, Some(b)) => {
                changed.push((*b).clone());
                j += 1;
            }
            (Some(a), None) => {
                changed.push(a.clone());
                i += 1;
            }
            (None, None) => break,
        }
    }
    changed
}
