//! One round of placement ([`Placer::place`]) and the decision for one template.
//!
//! ```text
//!  Fleet::new      clusters in name order, region/zone ids, memory observed (health, taints)
//!  Plan::new       once per policy that places something: the filter of every cluster,
//!                  tier membership, static weights, deadlines (failover, failback, taints)
//!  per template:   governing policy (the oldest that places it) ─► judge (required
//!                  workload terms, programs, scores) ─► tiers ─► spread ─► divide
//!                  ─► overrides ─► Decision (placed / excluded in name order)
//!  dependencies:   templates no policy places follow the workloads that name them
//! ```
//!
//! **Tiers.** The first tier whose feasible clusters can take the template is used: a tier
//! can when, after spread, it keeps at least one cluster, satisfies every `minGroups` and —
//! dividing by capacity or Aggregated — its clusters have room for all the replicas. Inside
//! a tier, clusters with an untolerated `PreferNoSchedule` taint are a last resort: they are
//! used only when the tier's other clusters alone cannot take the template. A cluster may sit
//! in several tiers (Karmada's ClusterAffinities: a later tier may widen an earlier one).
//!
//! **Standby.** With `standby: n`, the next tier after the one used that can take `n`
//! replicas, leaving out the clusters already placed, keeps `n` (divided the same way;
//! Duplicated: `n` in each cluster; an object without replicas: a whole copy in each, so what
//! the standby runs finds its Service and ConfigMaps there). When the first tier has nothing
//! feasible (its clusters failed over, say), the next one is simply the tier used and runs
//! the full count — the take-over — and the standby moves one tier further, if there is one.
//! A policy without affinities has one tier, so no standby.
//!
//! **Division.** An object without replicas is placed whole in every selected cluster.
//! Duplicated: every selected cluster runs `spec.replicas`. Weights: Webster/Sainte-Laguë
//! ([`super::divide`]). By capacity: each cluster's room for this template is
//! [`super::Capacity::room_for`] — the Nodes' allocatable less every pod there but the
//! template's own (they would be replaced), less the replicas of the templates decided before
//! it this round that are not running yet ([`Assumed`]); a replica decided for the template
//! itself is never room, so no round can over-commit a cluster. The first decision
//! divides in proportion to that room, later ones are steady — a scale-up keeps the previous
//! split and divides the increment (and the replicas of clusters that dropped out, so the
//! total is kept) by the room left; a scale-down shrinks the previous split proportionally;
//! a newly feasible cluster gets nothing until replicas need a home — except after a
//! failback, when the split is divided afresh. Aggregated: as few clusters as fit, the
//! roomiest first, steady by preferring the clusters that hold replicas. `spec.replicas: 0`
//! divided: every selected cluster is placed with 0. A selected cluster the division gives
//! no replica is excluded (`NoReplicas`).
//!
//! **Unschedulable.** When no tier can take the template — or it cannot be judged now (a
//! program pending, a script failed, a webhook with failurePolicy Fail failed) — `placed`
//! keeps the last scheduled decision's placements (nothing is removed for want of a better
//! place), and `excluded` explains every cluster.
//!
//! **Dependencies.** A template no policy places, that placed workloads name in their
//! `dependencies`, is placed whole in the union of their clusters (one level: what a
//! dependency names does not follow it). Its decision has no policy and no excluded list.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::model::{ClusterId, ClusterSpec, ObjectKey};
use crate::policy::Policy;

use super::changed::{Dirt, Reads, Seen, SeenTemplate, ThisRound};
use super::divide::{self, Fnv, Party, Room};
use super::filter::{ClusterMemory, Fleet, Plan, earliest};
use super::score::{self, ClusterScore, Facts, Neighbours, PluginScore, ProgramReport, Scores};
use super::selection::{Conflict, Selection};
use super::spread::spread;
use super::{
    ClusterInput, Decision, Division, Excluded, FailurePolicy, Inputs, Judgement, KeyMap, Outcome,
    OverridePolicy, Placed, PlacedReason, PlacementFilter, Placements, Plugin, Program, Programs,
    ReplicaScheduling, Resources, Template, TemplateKey, Workload,
};

/// The memory placement keeps between rounds: the only state a decision depends on besides
/// its inputs and `now`.
#[derive(Debug, Default)]
pub struct Placer {
    /// Per template, the last scheduled decision: the previous split for steady division,
    /// and what stays placed when the template becomes unschedulable.
    /// Shared with the copies what-if decides from (a copy per round clones pointers).
    previous: PreviousMap,
    /// Per cluster: since when it is Healthy, when it was seen not Healthy, when each of its
    /// NoExecute taints was first seen.
    clusters: HashMap<ClusterId, ClusterMemory>,
    /// Per policy, the clusters it failed over and has not yet failed back.
    failed_over: HashMap<ObjectKey, BTreeSet<ClusterId>>,
    /// The room templates held at the end of the last round that knew it: the next round
    /// starts from it when no capacity changed (see [`Self::carried_room`]).
    room: Option<Assumed>,
    /// Per policy, the clusters the last decision it made left out: the next decision that
    /// leaves out the same ones for the same reasons holds this list too.
    excluded: HashMap<ObjectKey, Arc<[Excluded]>>,
    /// What the last round decided from and decided: the templates this round need not
    /// decide again ([`super::changed`]).
    seen: Seen,
    /// Which policies place each template.
    selection: Selection,
    /// Decides every template every round (what incremental rounds are checked against).
    everything: bool,
}

/// A copy decides as the original would, but from scratch in its first round (what it has
/// seen is not copied: a what-if's copy imagines other inputs, and deciding them all once is
/// what it asks for anyway).
impl Clone for Placer {
    fn clone(&self) -> Self {
        Self {
            previous: self.previous.clone(),
            clusters: self.clusters.clone(),
            failed_over: self.failed_over.clone(),
            excluded: self.excluded.clone(),
            room: None,
            seen: Seen::default(),
            selection: Selection::default(),
            everything: self.everything,
        }
    }
}

/// The previous decisions, by template: a persistent map, since every round hands a copy of
/// the placer's memory to what-if (`Fleet`'s decider) and copying a hash map of 10,000 was a
/// twentieth of a round that decides one template.
type PreviousMap = rpds::HashTrieMapSync<TemplateKey, Arc<Previous>, ahash::RandomState>;

#[derive(Clone, Debug)]
struct Previous {
    placed: Vec<Placed>,
    /// The tier it ran in (None: a policy without affinities).
    tier: Option<Arc<str>>,
    /// Clusters the decision excluded as FailedOver or FailingBack: when one of them is
    /// feasible again, capacity is divided afresh (the policy's split returns).
    failed_over: Vec<ClusterId>,
    /// Since when an earlier tier than `tier` could take the template again (capacity
    /// divisions): it returns there `failbackAfterSeconds` later.
    room_back_since: Option<Instant>,
    /// It went to `tier` while an earlier tier had a cluster whose capacity was not known
    /// yet (members report Nodes at their own pace, at start-up): not a move worth
    /// hysteresis, so it returns as soon as the earlier tier can take it.
    blind: bool,
}

/// What deciding one template leaves for the next round besides the decision.
#[derive(Default)]
struct Memo {
    failed_over: Vec<ClusterId>,
    room_back_since: Option<Instant>,
    blind: bool,
    /// When the decision changes with time alone (the template returns to an earlier tier).
    deadline: Option<Instant>,
}

/// A follower of its policy's workloads, decided after them.
struct Follower<'t, 'p> {
    template: &'t Template,
    index: usize,
    governing: usize,
    plan: &'p Plan<'p>,
    leaders: &'p [&'t Template],
}

impl Placer {
    pub fn new() -> Self {
        Self::default()
    }

    /// A placer that decides every template every round, however little changed: what an
    /// incremental round must agree with (tests and benchmarks compare the two).
    pub fn deciding_everything() -> Self {
        Self {
            everything: true,
            ..Self::default()
        }
    }

    /// The templates the last round saw more than one policy select.
    pub fn conflicts(&self) -> impl Iterator<Item = Conflict<'_>> {
        self.selection.conflicts()
    }

    /// One round: a decision for every template a policy selects, and for the dependencies
    /// of the workloads placed. Only the templates whose inputs changed since the last round
    /// are decided again ([`super::changed`]); the others keep their decision (the same `Arc`).
    pub fn place(&mut self, inputs: Inputs<'_>, now: Instant) -> Placements {
        let fleet = Fleet::new(inputs.clusters, &mut self.clusters, now);
        let governing = self.selection.governing(inputs.templates, inputs.policies);
        let views_changed = self.seen.views_changed(&fleet);
        let fleet_same = !self.everything
            && views_changed
                .as_ref()
                .is_some_and(|changed| !changed.contains(&true));
        let plans = self.plans(inputs.policies, &governing, &fleet, fleet_same, now);
        let mut dirt = self.seen.dirt(
            &fleet,
            &inputs,
            &plans,
            &governing,
            views_changed.as_deref(),
            self.everything,
        );
        let (round, mut seen) = self.seen.next_round();
        let overrides = Overrides::new(inputs.overrides);
        // Carried over from the last round, or built when a capacity division is first decided
        // (from the previous decisions, which by then hold this round's for the templates
        // decided before it).
        let mut assumed = if dirt.all {
            Some(Assumed::new(
                &fleet,
                inputs.templates,
                &governing,
                &self.previous,
            ))
        } else {
            self.carried_room(&dirt, &fleet, inputs.templates, &governing, &seen)
        };
        let no_room = Assumed(Vec::new());
        let leaders = leaders(inputs.templates, &governing);
        let mut followers = Vec::new();
        let mut decided = 0;
        let mut visited = 0;
        for i in workload_terms_last(inputs.templates, &governing, &plans) {
            let t = &inputs.templates[i];
            let Some((g, plan)) = governing[i].and_then(|g| Some((g, plans[g].as_ref()?))) else {
                continue;
            };
            visited += 1;
            if let Some(led) = leaders.of(t, governing[i]) {
                followers.push(Follower {
                    template: t,
                    index: i,
                    governing: g,
                    plan,
                    leaders: led,
                });
                continue;
            }
            let reads = Reads {
                index: i,
                governing: g,
                room: Split::of(plan, t.replicas).by_capacity(),
                workloads: plan.placement.scoring.reads_workloads(),
                // Without replicas it follows the workloads of its group when there are some:
                // the group's changes may make it a follower.
                follows: t.replicas.is_none(),
            };
            if !dirt.must_decide(t, &reads, seen.get(&t.key), now) {
                let old = seen.get_mut(&t.key).expect("a template kept was seen");
                self.keep(&dirt, g, plan, &fleet, old);
                old.round = round;
                continue;
            }
            let neighbours = if reads.workloads {
                let at = |placed: &[Placed]| -> Vec<usize> {
                    placed
                        .iter()
                        .filter_map(|p| fleet.position(&p.cluster))
                        .collect()
                };
                let scoring = &plan.placement.scoring;
                let this_round = ThisRound::of(&seen, round);
                score::neighbours(scoring, &t.key, inputs.templates, &facts(&fleet), |k| {
                    this_round
                        .get(k)
                        .map(|d| at(&d.placed))
                        .or_else(|| self.previous.get(k).map(|p| at(&p.placed)))
                })
            } else {
                Neighbours::default()
            };
            if reads.room && assumed.is_none() {
                assumed = Some(Assumed::new(
                    &fleet,
                    inputs.templates,
                    &governing,
                    &self.previous,
                ));
            }
            let prev = self.previous.get(&t.key).map(|p| &**p);
            if let (Some(assumed), Some(prev)) = (assumed.as_mut(), prev) {
                assumed.release(&fleet, t, &prev.placed);
            }
            let judge = Judge {
                neighbours: &neighbours,
                programs: inputs.programs,
            };
            let room = assumed.as_ref().unwrap_or(&no_room);
            decided += 1;
            let last_excluded = self.excluded.get(&plan.policy.key);
            let (decision, memo) = decide_template(
                &fleet,
                plan,
                t,
                prev,
                &overrides,
                &judge,
                room,
                last_excluded,
            );
            if let Some(assumed) = assumed.as_mut() {
                assumed.hold(&fleet, t, &decision.placed);
            }
            let old = seen.remove(&t.key);
            let entry = self.record(
                &mut dirt,
                &fleet,
                t,
                Some(g),
                plan.policy,
                decision,
                memo,
                old,
            );
            seen.insert(t.key.clone(), entry.seen_in(round));
        }
        for f in followers {
            let reads = Reads {
                index: f.index,
                governing: f.governing,
                room: false,
                workloads: false,
                follows: true,
            };
            let t = f.template;
            if !dirt.must_decide(t, &reads, seen.get(&t.key), now) {
                let old = seen.get_mut(&t.key).expect("a template kept was seen");
                self.keep(&dirt, f.governing, f.plan, &fleet, old);
                old.round = round;
                continue;
            }
            let prev = self.previous.get(&t.key).map(|p| &**p);
            decided += 1;
            let this_round = ThisRound::of(&seen, round);
            let decision = follow(&fleet, f.plan, t, f.leaders, prev, &this_round, &overrides);
            // A follower holds no room, but it may have held some as a workload last round
            // (the room carried to the next round must not keep it).
            if let (Some(assumed), Some(prev)) = (assumed.as_mut(), prev) {
                assumed.release(&fleet, t, &prev.placed);
                assumed.hold(&fleet, t, &decision.placed);
            }
            let old = seen.remove(&t.key);
            let entry = self.record(
                &mut dirt,
                &fleet,
                t,
                Some(f.governing),
                f.plan.policy,
                decision,
                Memo::default(),
                old,
            );
            seen.insert(t.key.clone(), entry.seen_in(round));
        }
        // Only when some template seen last round is gone (or a dependency, seen later).
        if seen.len() > visited {
            self.forget_previous(&ThisRound::of(&seen, round));
        }
        let this_round = ThisRound::of(&seen, round);
        let dependencies =
            follow_dependencies(&inputs, &governing, &fleet, &overrides, &this_round);
        let dependencies: Vec<(&Template, Arc<Decision>)> = dependencies
            .into_iter()
            .map(|(t, decision)| {
                let decision = match seen.get(&t.key) {
                    Some(old) if *old.decision == decision => old.decision.clone(),
                    _ => Arc::new(decision),
                };
                (t, decision)
            })
            .collect();
        for (t, decision) in dependencies {
            visited += 1;
            let entry = SeenTemplate::new(t, None, decision, None, false);
            seen.insert(t.key.clone(), entry.seen_in(round));
        }
        if seen.len() > visited {
            seen.retain(|_, s| s.round == round);
        }
        self.room = assumed;
        let mut next_deadline = None;
        for plan in plans.iter().flatten() {
            next_deadline = earliest(next_deadline, plan.deadline);
        }
        for entry in seen.values() {
            next_deadline = earliest(next_deadline, entry.deadline);
        }
        // Templates mostly come in key order (hubs list them by kind and name): collected in
        // their order, the sort finds long sorted runs instead of comparing keys at random.
        let decisions: BTreeMap<TemplateKey, Arc<Decision>> = inputs
            .templates
            .iter()
            .filter_map(|t| Some((t.key.clone(), seen.get(&t.key)?.decision.clone())))
            .collect();
        self.seen
            .remember(&fleet, inputs.overrides, &plans, seen, dirt);
        let propagation = inputs
            .policies
            .iter()
            .zip(&governing_used(&governing, inputs.policies.len()))
            .filter(|(_, used)| **used)
            .filter_map(|(p, _)| Some((p.key.clone(), p.placement.as_ref()?.propagation.clone())))
            .collect();
        Placements {
            decisions,
            propagation,
            next_deadline,
            decided,
            settled: self.seen.settled(),
        }
    }

    /// Forgets the previous decisions of the templates this round did not place.
    fn forget_previous(&mut self, this_round: &ThisRound<'_>) {
        let gone: Vec<TemplateKey> = self
            .previous
            .keys()
            .filter(|k| this_round.get(k).is_none())
            .cloned()
            .collect();
        for key in &gone {
            self.previous.remove_mut(key);
        }
    }

    /// The room the last round ended with, brought up to this round's templates (what
    /// [`Assumed::new`] would build, without reading every template's previous decision: at
    /// 10,000 templates and 100,000 copies that was most of a round deciding one capacity
    /// division). None when the last round did not track it or a capacity changed: what a
    /// template holds in a cluster depends on the pods of it already running there.
    fn carried_room(
        &mut self,
        dirt: &Dirt,
        fleet: &Fleet<'_>,
        templates: &[Template],
        governing: &[Option<usize>],
        seen: &KeyMap<SeenTemplate>,
    ) -> Option<Assumed> {
        let mut room = self.room.take().filter(|_| !dirt.capacity_changed)?;
        for (i, t) in templates
            .iter()
            .enumerate()
            .filter(|(i, _)| dirt.changed(*i))
        {
            let Some(prev) = self.previous.get(&t.key) else {
                continue;
            };
            if let Some(old) = seen.get(&t.key).filter(|old| old.governed()) {
                room.release(fleet, old.template(), &prev.placed);
            }
            if governing[i].is_some() {
                room.hold(fleet, t, &prev.placed);
            }
        }
        for key in &dirt.gone {
            let old = seen.get(key).filter(|old| old.governed());
            if let (Some(old), Some(prev)) = (old, self.previous.get(key)) {
                room.release(fleet, old.template(), &prev.placed);
            }
        }
        Some(room)
    }

    /// A template's last decision, kept in place: it was seen (a template never seen is
    /// decided), its excluded reasons brought up to date.
    fn keep(
        &mut self,
        dirt: &Dirt,
        g: usize,
        plan: &Plan<'_>,
        fleet: &Fleet<'_>,
        old: &mut SeenTemplate,
    ) {
        if !dirt.relabels(g) {
            // Most rounds: the decision is not even read (at 10,000 templates, reading each
            // one's cost more than the rest of keeping it).
            return;
        }
        let before = old.decision.excluded.clone();
        old.decision = dirt.patched(g, plan, fleet, old.decision.clone());
        if !Arc::ptr_eq(&before, &old.decision.excluded) {
            let mut excluded = old.decision.excluded.clone();
            share_excluded(&mut self.excluded, &plan.policy.key, &mut excluded);
            Arc::make_mut(&mut old.decision).excluded = excluded;
        }
    }

    /// Takes in a decision made this round: what it changed, the template's memory, and the
    /// last decision's `Arc` when nothing changed.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        dirt: &mut Dirt,
        fleet: &Fleet<'_>,
        t: &Template,
        governing: Option<usize>,
        policy: &Policy,
        mut decision: Decision,
        memo: Memo,
        old: Option<SeenTemplate>,
    ) -> SeenTemplate {
        share_excluded(&mut self.excluded, &policy.key, &mut decision.excluded);
        dirt.decided(fleet, t, governing, &decision, old.as_ref());
        let deadline = memo.deadline;
        let unsettled = decision.is_scheduled() && remember(&mut self.previous, &decision, memo);
        let decision = match old {
            Some(old) if *old.decision == decision => old.decision,
            _ => Arc::new(decision),
        };
        SeenTemplate::new(t, Some(policy), decision, deadline, unsettled)
    }

    /// A plan for each policy that places a template this round; forgets the failover
    /// memory of the others.
    fn plans<'p>(
        &mut self,
        policies: &'p [Policy],
        governing: &[Option<usize>],
        fleet: &Fleet<'_>,
        fleet_same: bool,
        now: Instant,
    ) -> Vec<Option<Plan<'p>>> {
        let used = governing_used(governing, policies.len());
        let live: HashSet<&ObjectKey> = policies
            .iter()
            .zip(&used)
            .filter(|(_, u)| **u)
            .map(|(p, _)| &p.key)
            .collect();
        self.failed_over.retain(|k, _| live.contains(k));
        self.excluded.retain(|k, _| live.contains(k));
        policies
            .iter()
            .zip(&used)
            .map(|(p, u)| {
                u.then(|| {
                    if let Some(plan) = self.seen.reusable_plan(p, fleet_same, now) {
                        return plan;
                    }
                    let memory = self.failed_over.entry(p.key.clone()).or_default();
                    Plan::new(p, fleet, memory, now)
                })
            })
            .collect()
    }
}

/// The order templates are decided in: those whose policy has workload (anti-)affinity
/// terms last, so they see where this round put the others (in template order otherwise).
fn workload_terms_last(
    templates: &[Template],
    governing: &[Option<usize>],
    plans: &[Option<Plan<'_>>],
) -> Vec<usize> {
    let reads = |i: usize| {
        governing[i]
            .and_then(|g| plans[g].as_ref())
            .is_some_and(|p| p.placement.scoring.reads_workloads())
    };
    let mut order: Vec<usize> = (0..templates.len()).collect();
    order.sort_by_key(|&i| reads(i));
    order
}

/// Per policy and namespace, the templates with replicas it places there: the workloads the
/// policy's replica-less templates in that namespace (its Service, ConfigMaps, PDB …) follow.
struct Leaders<'t>(HashMap<(usize, Arc<str>), Vec<&'t Template>>);

fn leaders<'t>(templates: &'t [Template], governing: &[Option<usize>]) -> Leaders<'t> {
    let mut by: HashMap<(usize, Arc<str>), Vec<&'t Template>> = HashMap::new();
    for (t, g) in templates.iter().zip(governing) {
        if let (Some(g), Some(_)) = (g, t.replicas) {
            by.entry((*g, t.key.namespace.clone())).or_default().push(t);
        }
    }
    Leaders(by)
}

impl<'t> Leaders<'t> {
    /// The workloads `t` follows: none for a template with replicas, or whose policy places
    /// no workload in its namespace (it then goes by the tiers).
    fn of(&self, t: &Template, governing: Option<usize>) -> Option<&[&'t Template]> {
        if t.replicas.is_some() || self.0.is_empty() {
            return None;
        }
        self.0
            .get(&(governing?, t.key.namespace.clone()))
            .map(Vec::as_slice)
    }
}

/// A replica-less template placed whole where the workloads it follows were placed this round
/// (running or standby: what they run finds its Service and ConfigMaps there), in their tier;
/// unschedulable, keeping its last placement, while they are placed nowhere.
fn follow(
    fleet: &Fleet<'_>,
    plan: &Plan<'_>,
    t: &Template,
    leaders: &[&Template],
    prev: Option<&Previous>,
    decisions: &ThisRound<'_>,
    overrides: &Overrides<'_>,
) -> Decision {
    let mut at: BTreeMap<&ClusterId, Vec<TemplateKey>> = BTreeMap::new();
    let mut tier = None;
    for leader in leaders {
        let Some(d) = decisions.get(&leader.key) else {
            continue;
        };
        if tier.is_none() {
            tier.clone_from(&d.tier);
        }
        for placed in &d.placed {
            at.entry(&placed.cluster)
                .or_default()
                .push(leader.key.clone());
        }
    }
    let applicable = overrides.applicable(t);
    let placed: Vec<Placed> = at
        .iter()
        .map(|(&cluster, workloads)| Placed {
            overrides: applicable.rules_for(
                fleet
                    .position(cluster)
                    .map(|p| &fleet.clusters[p].view.spec),
            ),
            cluster: cluster.clone(),
            replicas: None,
            reason: PlacedReason::Follows(workloads.clone()),
        })
        .collect();
    let excluded = (0..fleet.len())
        .filter(|&p| !at.contains_key(fleet.id(p)))
        .map(|p| Excluded {
            cluster: fleet.id(p).clone(),
            reason: plan.clusters[p]
                .filter
                .clone()
                .unwrap_or(PlacementFilter::WorkloadsElsewhere),
        })
        .collect();
    let (outcome, placed) = if placed.is_empty() {
        let names: Vec<String> = leaders
            .iter()
            .map(|l| format!("{}/{}", l.key.kind, l.key.name))
            .collect();
        let reason = format!("follows {}, placed nowhere", names.join(", "));
        let kept = prev.map(|p| p.placed.clone()).unwrap_or_default();
        (Outcome::Unschedulable { reason }, kept)
    } else {
        (Outcome::Scheduled, placed)
    };
    Decision {
        template: t.key.clone(),
        policy: Some(plan.policy.key.clone()),
        outcome,
        tier,
        standby_tier: None,
        placed,
        excluded,
        scores: None,
    }
}

/// Which of `count` policies govern a template.
fn governing_used(governing: &[Option<usize>], count: usize) -> Vec<bool> {
    let mut used = vec![false; count];
    for g in governing.iter().flatten() {
        used[*g] = true;
    }
    used
}

/// Per cluster position, the requests of the replicas placed there beyond the pods they
/// already run: room no other template can take, so two templates never both take the last
/// of it. A round starts from every template's previous decision — what is
/// placed keeps its room against newcomers — and swaps each template's share for its new
/// decision as it is decided ([`Self::release`] then [`Self::hold`]); a template's own
/// replicas are never room against itself.
#[derive(Clone, Debug)]
struct Assumed(Vec<Resources>);

impl Assumed {
    /// What the previous decisions of the templates a policy still places hold.
    fn new(
        fleet: &Fleet<'_>,
        templates: &[Template],
        governing: &[Option<usize>],
        previous: &PreviousMap,
    ) -> Self {
        let mut assumed = Self(vec![Resources::default(); fleet.len()]);
        if previous.is_empty() {
            return assumed;
        }
        for (t, _) in templates.iter().zip(governing).filter(|(_, g)| g.is_some()) {
            if let Some(prev) = previous.get(&t.key) {
                assumed.hold(fleet, t, &prev.placed);
            }
        }
        assumed
    }

    /// Holds what `placed` puts of `t` in each cluster.
    fn hold(&mut self, fleet: &Fleet<'_>, t: &Template, placed: &[Placed]) {
        for (p, held) in Self::share(fleet, t, placed) {
            self.0[p] = self.0[p].saturating_add(held);
        }
    }

    /// Gives back what [`Self::hold`] held for the same `t` and `placed`.
    fn release(&mut self, fleet: &Fleet<'_>, t: &Template, placed: &[Placed]) {
        for (p, held) in Self::share(fleet, t, placed) {
            self.0[p] = self.0[p].saturating_sub(held);
        }
    }

    /// Per cluster `placed` names, its replicas' requests less the pods of `t` already there.
    fn share<'p>(
        fleet: &'p Fleet<'_>,
        t: &'p Template,
        placed: &'p [Placed],
    ) -> impl Iterator<Item = (usize, Resources)> + 'p {
        let counts = t.requests != Resources::default();
        let workload = counts.then(|| Workload::of(&t.key));
        placed.iter().filter_map(move |placed| {
            let workload = workload.as_ref()?;
            let replicas = u64::from(placed.replicas.unwrap_or(0));
            let p = fleet.position(&placed.cluster).filter(|_| replicas > 0)?;
            let running = fleet.clusters[p]
                .capacity
                .map(|c| c.held_by(workload))
                .unwrap_or_default();
            Some((p, t.requests.times(replicas).saturating_sub(running)))
        })
    }
}

/// Keeps a scheduled decision as the template's previous one (cloned only when it changed);
/// returns whether what the next decision reads of it changed (the next round then decides
/// the template again).
fn remember(previous: &mut PreviousMap, decision: &Decision, memo: Memo) -> bool {
    match previous.get_mut(&decision.template) {
        Some(prev) => {
            // What the next decision reads of this one: where, how many, standby or not (not
            // the numbers a reason carries).
            let read = |placed: &[Placed]| -> Vec<(ClusterId, Option<u32>, bool)> {
                placed
                    .iter()
                    .map(|p| {
                        (
                            p.cluster.clone(),
                            p.replicas,
                            p.reason == PlacedReason::Standby,
                        )
                    })
                    .collect()
            };
            let unsettled = read(&prev.placed) != read(&decision.placed)
                || prev.tier != decision.tier
                || prev.failed_over != memo.failed_over
                || prev.room_back_since != memo.room_back_since
                || prev.blind != memo.blind;
            if !unsettled && prev.placed == decision.placed {
                return false;
            }
            let prev = Arc::make_mut(prev);
            if prev.placed != decision.placed {
                prev.placed.clone_from(&decision.placed);
            }
            prev.tier.clone_from(&decision.tier);
            prev.failed_over = memo.failed_over;
            prev.room_back_since = memo.room_back_since;
            prev.blind = memo.blind;
            unsettled
        }
        None => {
            previous.insert_mut(
                decision.template.clone(),
                Arc::new(Previous {
                    placed: decision.placed.clone(),
                    tier: decision.tier.clone(),
                    failed_over: memo.failed_over,
                    room_back_since: memo.room_back_since,
                    blind: memo.blind,
                }),
            );
            true
        }
    }
}

/// Decides one template with a fresh [`Placer`] (no memory of earlier rounds): the whole
/// round is decided, so a dependency finds its workloads. For explaining one template;
/// [`Placer::place`] decides many at once.
pub fn decide(inputs: Inputs<'_>, template: &TemplateKey, now: Instant) -> Option<Decision> {
    Placer::new()
        .place(inputs, now)
        .decisions
        .remove(template)
        .map(Arc::unwrap_or_clone)
}

/// How a template's replicas are shared out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Split {
    /// No replicas: a whole copy in each selected cluster.
    Whole,
    Duplicated(u32),
    Weights(u32),
    Capacity(u32),
    Aggregated(u32),
}

impl Split {
    fn of(plan: &Plan<'_>, replicas: Option<u32>) -> Self {
        let Some(r) = replicas else {
            return Split::Whole;
        };
        match &plan.placement.replicas {
            ReplicaScheduling::Duplicated => Split::Duplicated(r),
            ReplicaScheduling::Divided(Division::Weights(_)) => Split::Weights(r),
            ReplicaScheduling::Divided(Division::AvailableCapacity) => Split::Capacity(r),
            ReplicaScheduling::Divided(Division::Aggregated) => Split::Aggregated(r),
        }
    }

    fn with(self, replicas: u32) -> Self {
        match self {
            Split::Whole => Split::Whole,
            Split::Duplicated(_) => Split::Duplicated(replicas),
            Split::Weights(_) => Split::Weights(replicas),
            Split::Capacity(_) => Split::Capacity(replicas),
            Split::Aggregated(_) => Split::Aggregated(replicas),
        }
    }

    fn by_capacity(self) -> bool {
        matches!(self, Split::Capacity(_) | Split::Aggregated(_))
    }

    fn replicas(self) -> u64 {
        match self {
            Split::Whole => 0,
            Split::Duplicated(r)
            | Split::Weights(r)
            | Split::Capacity(r)
            | Split::Aggregated(r) => u64::from(r),
        }
    }
}

/// Everything the decision of one template reads besides the plan.
struct Ctx<'f, 'a> {
    fleet: &'f Fleet<'a>,
    /// Per cluster position, the template's room (capacity divisions only; None: unknown).
    avail: Vec<Option<u64>>,
    /// Per cluster position, the template's replicas there last time: (running, standby).
    prev: Vec<(u64, u64)>,
    object: Fnv,
    /// What the template's own filters and the scores say (empty for a policy that neither
    /// scores nor filters per template).
    judged: Judged,
}

impl Ctx<'_, '_> {
    /// The division tie order: the better score first when the policy scores, then the
    /// per-object name order.
    fn tie(&self, p: usize) -> u64 {
        let names = divide::tie_key(self.object, self.fleet.id(p).as_str());
        match self.judged.score.get(p) {
            Some(&s) => (u64::from(10_000 - s.min(10_000)) << 48) | (names >> 16),
            None => names,
        }
    }

    /// The cluster's combined score (0 unscored).
    fn rank(&self, p: usize) -> u64 {
        self.judged.score.get(p).map_or(0, |&s| u64::from(s))
    }

    fn rejected(&self, p: usize) -> Option<&PlacementFilter> {
        self.judged.rejected.get(p).and_then(Option::as_ref)
    }
}

/// What a decision asks outside its plan: where other workloads run, and the programs.
pub(super) struct Judge<'j> {
    neighbours: &'j Neighbours,
    programs: &'j dyn Programs,
}

/// The template's own filters and scores, per cluster position (both empty when the policy
/// has none).
#[derive(Default)]
struct Judged {
    rejected: Vec<Option<PlacementFilter>>,
    /// Combined scores in hundredths; empty when the policy scores nothing.
    score: Vec<u32>,
    report: Option<Box<Scores>>,
}

/// What one tier gives a template: the clusters selected, and those it left out and why.
struct Choice {
    kept: Vec<usize>,
    dropped: Vec<(usize, PlacementFilter)>,
}

/// The decision for `t` under `plan`, and the clusters it leaves out as failed over.
#[allow(clippy::too_many_arguments)]
fn decide_template(
    fleet: &Fleet<'_>,
    plan: &Plan<'_>,
    t: &Template,
    prev: Option<&Previous>,
    overrides: &Overrides<'_>,
    judge: &Judge<'_>,
    assumed: &Assumed,
    last_excluded: Option<&Arc<[Excluded]>>,
) -> (Decision, Memo) {
    let split = Split::of(plan, t.replicas);
    let mut ctx = context(fleet, t, prev, split, assumed);
    let n = fleet.len();
    let failed_over: Vec<ClusterId> = (0..n)
        .filter(|&p| {
            matches!(
                plan.clusters[p].filter,
                Some(PlacementFilter::FailedOver { .. } | PlacementFilter::FailingBack { .. })
            )
        })
        .map(|p| fleet.id(p).clone())
        .collect();
    let mut memo = Memo {
        failed_over,
        ..Memo::default()
    };
    match judge_template(fleet, plan, t, judge) {
        Ok(judged) => ctx.judged = judged,
        Err(why) => {
            // No tier was tried: each is unusable for that one reason, which then explains
            // every cluster the plan keeps (not "given no replica").
            let waiting = vec![Some(Arc::<str>::from(why.as_str())); plan.tiers.len()];
            let mut decision = unschedulable(fleet, plan, t, prev, vec![None; n], &waiting);
            decision.outcome = Outcome::Unschedulable { reason: why };
            return (decision, memo);
        }
    }
    let mut reasons: Vec<Option<PlacementFilter>> = vec![None; n];
    let mut tier_errors: Vec<Option<Arc<str>>> = vec![None; plan.tiers.len()];
    let no_exclusions = vec![false; n];
    let fresh = prev.is_none_or(|p| {
        p.failed_over.iter().any(|c| {
            fleet
                .position(c)
                .is_some_and(|p| plan.clusters[p].filter.is_none())
        })
    });
    let mut used = match prev.filter(|_| !fresh) {
        Some(prev) => stay(&ctx, plan, prev, split, &mut tier_errors, &mut memo),
        None => None,
    };
    for (ti, error) in tier_errors.iter_mut().enumerate() {
        if used.is_some() {
            break;
        }
        match try_tier(&ctx, plan, ti, split, &no_exclusions) {
            Ok(choice) => used = Some((ti, choice)),
            Err((why, dropped)) => {
                record(&mut reasons, dropped, false);
                *error = Some(Arc::from(why));
            }
        }
    }
    let Some((ti, choice)) = used else {
        let mut decision = unschedulable(fleet, plan, t, prev, reasons, &tier_errors);
        decision.scores = ctx.judged.report.take();
        return (decision, memo);
    };
    memo.blind = split.by_capacity()
        && plan.tiers[..ti]
            .iter()
            .any(|tier| tier.feasible.iter().any(|&p| ctx.avail[p].is_none()));
    let mut assigned: Vec<Option<(Option<u32>, PlacedReason)>> = vec![None; n];
    record(&mut reasons, choice.dropped, true);
    divide_into(
        &ctx,
        plan,
        split,
        &choice.kept,
        fresh,
        false,
        &mut assigned,
        &mut reasons,
    );
    let standby_tier = standby(&ctx, plan, t, ti, split, fresh, &mut assigned, &mut reasons);
    let chosen = Chosen {
        assigned,
        reasons,
        tier_errors: &tier_errors,
    };
    let (placed, excluded) = assemble(fleet, plan, t, overrides, chosen, last_excluded);
    let decision = Decision {
        template: t.key.clone(),
        policy: Some(plan.policy.key.clone()),
        outcome: Outcome::Scheduled,
        tier: plan.tiers[ti].name.clone(),
        standby_tier: standby_tier.and_then(|s| plan.tiers[s].name.clone()),
        placed,
        excluded,
        scores: ctx.judged.report.take(),
    };
    (decision, memo)
}

/// The template's own filters — required workload terms, the programs' verdicts — and the
/// scores of the candidates left (clusters the plan does not filter out). Err: the template
/// cannot be decided now (a script failed, a webhook with failurePolicy Fail failed, or an
/// answer is still pending), with the reason.
fn judge_template(
    fleet: &Fleet<'_>,
    plan: &Plan<'_>,
    t: &Template,
    judge: &Judge<'_>,
) -> Result<Judged, String> {
    let scoring = &plan.placement.scoring;
    let programs = scoring.programs();
    if !scoring.scores() && !scoring.reads_workloads() && programs.is_empty() {
        return Ok(Judged::default());
    }
    let facts = facts(fleet);
    let mut rejected: Vec<Option<PlacementFilter>> = vec![None; fleet.len()];
    let mut candidates: Vec<usize> = Vec::new();
    for (p, c) in plan.clusters.iter().enumerate() {
        if c.filter.is_some() || c.first_tier.is_none() {
            continue;
        }
        match score::required_unmet(scoring, &facts, p, judge.neighbours) {
            Some(why) => rejected[p] = Some(why),
            None => candidates.push(p),
        }
    }
    let asked = ask_programs(fleet, t, judge.programs, &programs, &candidates)?;
    for (p, why) in asked.rejected {
        rejected[p] = Some(why);
    }
    // What is left is what the plugins score: Cost's cheapest is the cheapest of these.
    let left: Vec<usize> = candidates
        .into_iter()
        .filter(|&p| rejected[p].is_none())
        .collect();
    let order = score_left(plan, &facts, t, &left, &asked.given, judge.neighbours);
    let mut score = vec![0u32; fleet.len()];
    for (&p, c) in left.iter().zip(&order) {
        score[p] = c.total;
    }
    let mut order = order;
    order.sort_by(|a, b| {
        b.total
            .cmp(&a.total)
            .then_with(|| a.cluster.cmp(&b.cluster))
    });
    Ok(Judged {
        rejected,
        score: if scoring.scores() { score } else { Vec::new() },
        // Decision::scores: for a policy that scores or runs programs only.
        report: (scoring.scores() || !programs.is_empty()).then(|| {
            let candidates = order.len();
            let mut order = order;
            order.truncate(score::REPORTED);
            Box::new(Scores {
                order,
                candidates,
                programs: asked.reports,
            })
        }),
    })
}

/// What the programs said about a template's candidates.
struct Asked {
    /// The candidates a program rejected (the last program's reason when several did).
    rejected: Vec<(usize, PlacementFilter)>,
    /// Per program plugin, per cluster position: the sum and count of the scores given.
    given: BTreeMap<Plugin, HashMap<usize, (u64, u64)>>,
    reports: Vec<ProgramReport>,
}

/// Asks each program about `candidates`; Err when one is pending or failed and its failure
/// is not ignored.
fn ask_programs(
    fleet: &Fleet<'_>,
    t: &Template,
    runner: &dyn Programs,
    programs: &[Program],
    candidates: &[usize],
) -> Result<Asked, String> {
    let mut asked = Asked {
        rejected: Vec::new(),
        given: BTreeMap::new(),
        reports: Vec::with_capacity(programs.len()),
    };
    let inputs: Vec<ClusterInput<'_>> = candidates.iter().map(|&p| fleet.clusters[p]).collect();
    for program in programs {
        let judgement = checked(runner.judge(program, t, &inputs), &inputs);
        match &judgement {
            Judgement::Answered(verdicts) => {
                let sums = asked.given.entry(program.plugin()).or_default();
                for (&p, v) in candidates.iter().zip(verdicts) {
                    if let Some(reason) = &v.rejected {
                        let why = PlacementFilter::Rejected {
                            program: program.to_string(),
                            reason: reason.clone(),
                        };
                        asked.rejected.push((p, why));
                    }
                    if let Some(s) = v.score {
                        let sum = sums.entry(p).or_default();
                        *sum = (sum.0 + u64::from(s), sum.1 + 1);
                    }
                }
            }
            Judgement::Pending => return Err(format!("waiting for the {program}")),
            Judgement::Failed(why) => match program {
                Program::Script(_) => return Err(format!("script: {why}")),
                Program::Webhook(w) if w.failure_policy == FailurePolicy::Fail => {
                    return Err(format!("{program} failed (failurePolicy Fail): {why}"));
                }
                // Ignored: as if the webhook were not there (its plugin has no data).
                Program::Webhook(_) => {}
            },
        }
        asked.reports.push(ProgramReport {
            program: program.to_string(),
            judgement,
        });
    }
    Ok(asked)
}

/// Each plugin's score of the clusters `left` and their combination, in `left`'s order.
fn score_left(
    plan: &Plan<'_>,
    facts: &Facts<'_>,
    t: &Template,
    left: &[usize],
    given: &BTreeMap<Plugin, HashMap<usize, (u64, u64)>>,
    neighbours: &Neighbours,
) -> Vec<ClusterScore> {
    let scoring = &plan.placement.scoring;
    let tolerations = &plan.policy.traffic.tolerations;
    let builtin = score::builtin(scoring, tolerations, facts, t, left, neighbours);
    let weighed: Vec<(Plugin, u32)> = Plugin::ALL
        .into_iter()
        .map(|plugin| (plugin, scoring.weight(plugin)))
        .filter(|(_, weight)| *weight > 0)
        .collect();
    left.iter()
        .enumerate()
        .map(|(i, &p)| {
            let plugins: Vec<PluginScore> = weighed
                .iter()
                .map(|&(plugin, weight)| {
                    let score = match plugin {
                        // The mean of what the programs of this kind gave.
                        Plugin::Webhook | Plugin::Script => given
                            .get(&plugin)
                            .and_then(|sums| sums.get(&p))
                            .map(|&(sum, count)| u32::try_from(sum / count).unwrap_or(100)),
                        _ => builtin
                            .iter()
                            .find(|(b, _)| *b == plugin)
                            .and_then(|(_, scores)| scores[i]),
                    };
                    PluginScore {
                        plugin,
                        weight,
                        score,
                    }
                })
                .collect();
            ClusterScore {
                cluster: facts.clusters[p].view.spec.id.clone(),
                total: score::combine(&plugins),
                plugins,
            }
        })
        .collect()
}

/// What the built-in plugins read of the round's fleet.
fn facts<'f>(fleet: &'f Fleet<'_>) -> Facts<'f> {
    Facts {
        clusters: &fleet.clusters,
        regions: &fleet.regions,
        zones: &fleet.zones,
        region_peers: &fleet.region_peers,
    }
}

/// A program's answer, with a wrong count of verdicts or an out-of-range score turned into a
/// failure.
fn checked(judgement: Judgement, candidates: &[ClusterInput<'_>]) -> Judgement {
    let Judgement::Answered(verdicts) = &judgement else {
        return judgement;
    };
    if verdicts.len() != candidates.len() {
        return Judgement::Failed(format!(
            "{} verdicts for {} candidate clusters",
            verdicts.len(),
            candidates.len()
        ));
    }
    for (v, c) in verdicts.iter().zip(candidates) {
        if let Some(s) = v.score.filter(|&s| s > 100) {
            return Judgement::Failed(format!(
                "score {s} for cluster {} is outside [0, 100]",
                c.view.spec.id
            ));
        }
    }
    judgement
}

/// The per-template context: the object's tie-break seed, and for capacity divisions each
/// cluster's room and previous replicas.
fn context<'f, 'a>(
    fleet: &'f Fleet<'a>,
    t: &Template,
    prev: Option<&Previous>,
    split: Split,
    assumed: &Assumed,
) -> Ctx<'f, 'a> {
    let object = Fnv::new()
        .str(&t.key.api_version)
        .str(&t.key.kind)
        .str(&t.key.namespace)
        .str(&t.key.name);
    let n = fleet.len();
    let mut before = vec![(0u64, 0u64); n];
    if split.by_capacity()
        && let Some(prev) = prev
    {
        // Both in name order: one merge walk.
        let mut p = 0;
        for placed in &prev.placed {
            while p < n && fleet.id(p) < &placed.cluster {
                p += 1;
            }
            if p == n || fleet.id(p) != &placed.cluster {
                continue;
            }
            let r = u64::from(placed.replicas.unwrap_or(0));
            if placed.reason == PlacedReason::Standby {
                before[p].1 += r;
            } else {
                before[p].0 += r;
            }
        }
    }
    let avail = if split.by_capacity() {
        let workload = Workload::of(&t.key);
        (0..n)
            .map(|p| {
                let capacity = fleet.clusters[p].capacity?;
                Some(capacity.room_for(&workload, &t.requests, assumed.0[p]))
            })
            .collect()
    } else {
        Vec::new()
    };
    Ctx {
        fleet,
        avail,
        prev: before,
        object,
        judged: Judged::default(),
    }
}

/// Whether a capacity division stays in the later tier it runs in (see the module docs,
/// "Returning"): a scale-down stays on the clusters that run it while no earlier tier can
/// take it; once one can, the template returns after `failbackAfterSeconds` of that being
/// so (at once without it), staying until then — the earlier tier's clusters say why.
fn stay(
    ctx: &Ctx<'_, '_>,
    plan: &Plan<'_>,
    prev: &Previous,
    split: Split,
    tier_errors: &mut [Option<Arc<str>>],
    memo: &mut Memo,
) -> Option<(usize, Choice)> {
    if !split.by_capacity() {
        return None;
    }
    let ti = plan.tiers.iter().position(|t| t.name == prev.tier)?;
    let none = vec![false; ctx.fleet.len()];
    let back = (0..ti).find(|&e| try_tier(ctx, plan, e, split, &none).is_ok());
    if prev.blind {
        // Decided without knowing the earlier tiers' room: it returns as soon as one can take
        // it, and until then a scale-down still moves nothing.
        return match back {
            Some(_) => None,
            None => stay_on_scale_down(ctx, plan, split, ti),
        };
    }
    let Some(back) = back else {
        return stay_on_scale_down(ctx, plan, split, ti);
    };
    let window = Duration::from_secs(plan.placement.failback_after_seconds);
    let since = prev.room_back_since.unwrap_or(ctx.fleet.now);
    if ctx.fleet.now >= since + window {
        return None;
    }
    let kept = stay_on_scale_down(ctx, plan, split, ti)
        .or_else(|| Some((ti, try_tier(ctx, plan, ti, split, &none).ok()?)))?;
    memo.room_back_since = Some(since);
    memo.deadline = Some(since + window);
    tier_errors[back] = Some(Arc::from(format!(
        "has room again: the template returns after failbackAfterSeconds ({} s)",
        window.as_secs()
    )));
    Some(kept)
}

/// A scale-down divided by capacity stays on the clusters that run the template, when they
/// are still feasible, hold at least the new count and satisfy the spread constraints: a
/// scale-down moves nothing (an earlier tier that now has room is not taken — it would grow
/// clusters on a scale-down). Returns the tier and the clusters kept.
fn stay_on_scale_down(
    ctx: &Ctx<'_, '_>,
    plan: &Plan<'_>,
    split: Split,
    ti: usize,
) -> Option<(usize, Choice)> {
    let before: u64 = ctx.prev.iter().map(|r| r.0).sum();
    if split.replicas() >= before {
        return None;
    }
    // The template's own filters (workload terms, programs) hold on a scale-down too.
    let mut rejected = Vec::new();
    let mut held = Vec::new();
    let mut roomy = Vec::new();
    for &p in &plan.tiers[ti].feasible {
        if let Some(why) = ctx.rejected(p) {
            rejected.push((p, why.clone()));
        } else if ctx.avail[p].is_some_and(|a| a > 0) {
            if ctx.prev[p].0 > 0 {
                held.push(p);
            } else {
                roomy.push(p);
            }
        }
    }
    let room = |p: usize| ctx.avail[p].unwrap_or(0);
    // When the holders alone are too few groups for the spread constraints, the clusters
    // the previous decision selected with no replica (Aggregated, say) come back the same
    // way: beside the holders, which the spread prefers, given nothing by the division.
    let spread = spread(ctx.fleet, &plan.placement.spread, &held, room)
        .or_else(|_| {
            let holder = |p: usize| ctx.prev[p].0 > 0;
            let prefer_holders = |p: usize| (u64::from(holder(p)) << 62) | room(p).min(1 << 61);
            let candidates: Vec<usize> = held.iter().chain(&roomy).copied().collect();
            spread(
                ctx.fleet,
                &plan.placement.spread,
                &candidates,
                prefer_holders,
            )
        })
        .ok()?;
    let fits = |p: usize| ctx.prev[p].0.min(ctx.avail[p].unwrap_or(0));
    let kept: u64 = spread.kept.iter().map(|&p| fits(p)).sum();
    let mut dropped = spread.dropped;
    dropped.extend(rejected);
    let choice = Choice {
        kept: spread.kept,
        dropped,
    };
    (kept >= split.replicas() && !choice.kept.is_empty()).then_some((ti, choice))
}

/// Writes `dropped` into `reasons`: over what is there (`overwrite`), or only where nothing
/// is yet.
fn record(
    reasons: &mut [Option<PlacementFilter>],
    dropped: Vec<(usize, PlacementFilter)>,
    overwrite: bool,
) {
    for (p, why) in dropped {
        if overwrite || reasons[p].is_none() {
            reasons[p] = Some(why);
        }
    }
}

type TierError = (String, Vec<(usize, PlacementFilter)>);

/// Whether tier `ti` can take the template (see the module docs), leaving out `excluded`.
fn try_tier(
    ctx: &Ctx<'_, '_>,
    plan: &Plan<'_>,
    ti: usize,
    split: Split,
    excluded: &[bool],
) -> Result<Choice, TierError> {
    let mut dropped = Vec::new();
    let mut members: Vec<usize> = Vec::with_capacity(plan.tiers[ti].feasible.len());
    for &p in &plan.tiers[ti].feasible {
        if excluded[p] {
            continue;
        }
        if let Some(why) = ctx.rejected(p) {
            dropped.push((p, why.clone()));
            continue;
        }
        if split.by_capacity() {
            match ctx.avail[p] {
                None => dropped.push((p, PlacementFilter::CapacityUnknown)),
                Some(0) => dropped.push((p, PlacementFilter::NoCapacity)),
                Some(_) => members.push(p),
            }
        } else {
            members.push(p);
        }
    }
    if members.is_empty() {
        let why = if dropped.is_empty() {
            "no feasible cluster".to_owned()
        } else {
            none_left(ctx.fleet, split, &dropped)
        };
        return Err((why, dropped));
    }
    let preferred: Vec<usize> = members
        .iter()
        .copied()
        .filter(|&p| plan.clusters[p].prefer_no.is_none())
        .collect();
    if !preferred.is_empty()
        && preferred.len() < members.len()
        && let Ok(mut choice) = finish(ctx, plan, split, &preferred)
    {
        for &p in &members {
            if let Some(key) = &plan.clusters[p].prefer_no {
                choice
                    .dropped
                    .push((p, PlacementFilter::PreferNoScheduleTaint(key.clone())));
            }
        }
        choice.dropped.extend(dropped);
        return Ok(choice);
    }
    match finish(ctx, plan, split, &members) {
        Ok(mut choice) => {
            choice.dropped.extend(dropped);
            Ok(choice)
        }
        Err((why, more)) => {
            dropped.extend(more);
            Err((why, dropped))
        }
    }
}

/// Why a tier whose feasible clusters the template's own filters (or, dividing by
/// capacity, their room) all took is unusable: each filter with the clusters it took, so
/// the reason says what to change — not "no room" when a workload term or a program took
/// them.
fn none_left(fleet: &Fleet<'_>, split: Split, dropped: &[(usize, PlacementFilter)]) -> String {
    let no_room = |why: &PlacementFilter| {
        matches!(
            why,
            PlacementFilter::NoCapacity | PlacementFilter::CapacityUnknown
        )
    };
    if dropped.iter().all(|(_, why)| no_room(why)) {
        return format!(
            "needs {} replicas, no feasible cluster has room ({} without capacity)",
            split.replicas(),
            dropped.len()
        );
    }
    // (filter, its clusters) in the order first met; `dropped` is in name order.
    let mut by_filter: Vec<(&PlacementFilter, Vec<&str>)> = Vec::new();
    for (p, why) in dropped {
        let id = fleet.id(*p).as_str();
        match by_filter.iter_mut().find(|(w, _)| *w == why) {
            Some((_, clusters)) => clusters.push(id),
            None => by_filter.push((why, vec![id])),
        }
    }
    let parts: Vec<String> = by_filter
        .iter()
        .map(|(why, clusters)| {
            let clusters = clusters.join(", ");
            match why {
                PlacementFilter::WorkloadAffinity { term } => {
                    format!("workloadAffinity term {term} excludes {clusters}")
                }
                PlacementFilter::WorkloadAntiAffinity { term } => {
                    format!("workloadAntiAffinity term {term} excludes {clusters}")
                }
                PlacementFilter::Rejected { program, reason } => {
                    format!("the {program} rejects {clusters}: {reason}")
                }
                PlacementFilter::NoCapacity => format!("no room in {clusters}"),
                PlacementFilter::CapacityUnknown => format!("no capacity known for {clusters}"),
                other => format!("{other:?} excludes {clusters}"),
            }
        })
        .collect();
    format!("no feasible cluster left ({})", parts.join("; "))
}

/// Spread and the capacity check over `members`.
fn finish(
    ctx: &Ctx<'_, '_>,
    plan: &Plan<'_>,
    split: Split,
    members: &[usize],
) -> Result<Choice, TierError> {
    let room = |p: usize| ctx.avail[p].unwrap_or(0);
    let score = spread_score(ctx, plan, split, members);
    let spread = spread(ctx.fleet, &plan.placement.spread, members, &score)
        .map_err(|why| (why, Vec::new()))?;
    if spread.kept.is_empty() {
        return Err(("no feasible cluster".to_owned(), spread.dropped));
    }
    // Room is free replicas, whatever orders the clusters: a score is no capacity.
    if split.by_capacity() {
        let free: u64 = spread.kept.iter().map(|&p| room(p)).sum();
        if free < split.replicas() {
            let each: Vec<String> = spread
                .kept
                .iter()
                .map(|&p| format!("{}: {}", ctx.fleet.id(p), room(p)))
                .collect();
            let why = format!(
                "needs {} replicas, {free} free ({})",
                split.replicas(),
                each.join(", ")
            );
            return Err((why, spread.dropped));
        }
    }
    Ok(Choice {
        kept: spread.kept,
        dropped: spread.dropped,
    })
}

/// What spread ranks `members` by for `maxGroups`. Unscored: free replicas when dividing by
/// capacity, the static weight under weights, else one per cluster. Scored: the combined
/// score first and the unscored measure among equal scores — in one `u64` (scores ≤ 10 000
/// above bit 32), as spread sums it per group. When every member scores the same (no plugin
/// has data, an ignored webhook failed), the scores say nothing and the unscored order
/// stands: missing data is neutral, it must not replace capacity by a count of clusters.
fn spread_score<'c>(
    ctx: &'c Ctx<'_, '_>,
    plan: &'c Plan<'_>,
    split: Split,
    members: &[usize],
) -> impl Fn(usize) -> u64 + 'c {
    let plain = move |p: usize| match split {
        Split::Capacity(_) | Split::Aggregated(_) => ctx.avail[p].unwrap_or(0),
        Split::Weights(_) => u64::from(plan.clusters[p].weight),
        _ => 1,
    };
    let first = members.first().map(|&p| ctx.rank(p));
    let scored =
        !ctx.judged.score.is_empty() && members.iter().any(|&p| Some(ctx.rank(p)) != first);
    move |p: usize| {
        if scored {
            (ctx.rank(p) << 32) | plain(p).min(u64::from(u32::MAX))
        } else {
            plain(p)
        }
    }
}

/// Divides `split` over `kept` into `assigned` (standby: the standby role's replicas);
/// clusters left with none get `NoReplicas`.
#[allow(clippy::too_many_arguments)]
fn divide_into(
    ctx: &Ctx<'_, '_>,
    plan: &Plan<'_>,
    split: Split,
    kept: &[usize],
    fresh: bool,
    standby: bool,
    assigned: &mut [Option<(Option<u32>, PlacedReason)>],
    reasons: &mut [Option<PlacementFilter>],
) {
    let reason = |why: PlacedReason| if standby { PlacedReason::Standby } else { why };
    let to_u32 = |s: u64| u32::try_from(s).unwrap_or(u32::MAX);
    let mut give = |p: usize, replicas: Option<u32>, why: PlacedReason| {
        if replicas == Some(0) && split.replicas() > 0 {
            reasons[p] = Some(PlacementFilter::NoReplicas);
        } else {
            assigned[p] = Some((replicas, reason(why)));
        }
    };
    match split {
        Split::Whole => kept
            .iter()
            .for_each(|&p| give(p, None, PlacedReason::Whole)),
        Split::Duplicated(r) => kept
            .iter()
            .for_each(|&p| give(p, Some(r), PlacedReason::Duplicated)),
        Split::Weights(r) => {
            let parties: Vec<Party> = kept
                .iter()
                .map(|&p| Party {
                    weight: u64::from(plan.clusters[p].weight),
                    cap: u64::MAX,
                    tie: ctx.tie(p),
                })
                .collect();
            let seats = divide::webster(&parties, u64::from(r));
            for (&p, s) in kept.iter().zip(seats) {
                give(
                    p,
                    Some(to_u32(s)),
                    PlacedReason::Weight(plan.clusters[p].weight),
                );
            }
        }
        Split::Capacity(r) | Split::Aggregated(r) => {
            let rooms: Vec<Room> = kept
                .iter()
                .map(|&p| {
                    let avail = ctx.avail[p].unwrap_or(0);
                    let before = if standby {
                        ctx.prev[p].1
                    } else {
                        ctx.prev[p].0
                    };
                    // A cluster whose room shrank keeps no more than fits now.
                    Room {
                        avail,
                        base: before.min(avail),
                        tie: ctx.tie(p),
                        rank: ctx.rank(p),
                    }
                })
                .collect();
            let chosen: Vec<usize> = if matches!(split, Split::Aggregated(_)) && r > 0 {
                let mut c = divide::aggregate(&rooms, u64::from(r), fresh);
                c.sort_unstable();
                c
            } else {
                (0..kept.len()).collect()
            };
            let sub: Vec<Room> = chosen.iter().map(|&i| rooms[i]).collect();
            let seats = divide::by_capacity(&sub, u64::from(r), fresh);
            let mut got = vec![0u64; kept.len()];
            for (&i, s) in chosen.iter().zip(seats) {
                got[i] = s;
            }
            for (i, &p) in kept.iter().enumerate() {
                let free = rooms[i].avail;
                let why = match split {
                    Split::Aggregated(_) => PlacedReason::Aggregated { free },
                    _ => PlacedReason::Capacity { free },
                };
                give(p, Some(to_u32(got[i])), why);
            }
        }
    }
}

/// Places the standby replicas in the first tier after `used` that can take them; returns
/// that tier.
#[allow(clippy::too_many_arguments)]
fn standby(
    ctx: &Ctx<'_, '_>,
    plan: &Plan<'_>,
    t: &Template,
    used: usize,
    split: Split,
    fresh: bool,
    assigned: &mut [Option<(Option<u32>, PlacedReason)>],
    reasons: &mut [Option<PlacementFilter>],
) -> Option<usize> {
    let n = plan.placement.standby.filter(|&n| n > 0)?;
    let split = if t.replicas.is_some() {
        split.with(n)
    } else {
        split
    };
    let taken: Vec<bool> = assigned.iter().map(Option::is_some).collect();
    for ti in used + 1..plan.tiers.len() {
        if let Ok(choice) = try_tier(ctx, plan, ti, split, &taken) {
            for (p, why) in choice.dropped {
                if reasons[p].is_none() && assigned[p].is_none() {
                    reasons[p] = Some(why);
                }
            }
            divide_into(
                ctx,
                plan,
                split,
                &choice.kept,
                fresh,
                true,
                assigned,
                reasons,
            );
            return Some(ti);
        }
    }
    None
}

/// `placed` and `excluded` in name order; a cluster with no recorded reason is explained
/// by where its first tier stands relative to the tiers tried.
fn assemble(
    fleet: &Fleet<'_>,
    plan: &Plan<'_>,
    t: &Template,
    overrides: &Overrides<'_>,
    chosen: Chosen<'_>,
    last_excluded: Option<&Arc<[Excluded]>>,
) -> (Vec<Placed>, Arc<[Excluded]>) {
    let applicable = overrides.applicable(t);
    let Chosen {
        assigned,
        reasons,
        tier_errors,
    } = chosen;
    let mut placed = Vec::with_capacity(assigned.iter().filter(|a| a.is_some()).count());
    let mut excluded = ExcludedList::new(last_excluded, fleet.len() - placed.capacity());
    for (p, (got, why)) in assigned.into_iter().zip(reasons).enumerate() {
        if let Some((replicas, reason)) = got {
            let overrides = applicable.rules_for(Some(&fleet.clusters[p].view.spec));
            placed.push(Placed {
                cluster: fleet.id(p).clone(),
                replicas,
                reason,
                overrides,
            });
            continue;
        }
        let reason = match (&plan.clusters[p].filter, why) {
            (Some(filter), _) => Cow::Borrowed(filter),
            (None, Some(why)) => Cow::Owned(why),
            (None, None) => Cow::Owned(by_position(plan, p, tier_errors)),
        };
        excluded.push(fleet.id(p), reason);
    }
    (placed, excluded.finish())
}

/// What the division chose, per cluster position: replicas (and why) or why none.
struct Chosen<'a> {
    assigned: Vec<Option<(Option<u32>, PlacedReason)>>,
    reasons: Vec<Option<PlacementFilter>>,
    tier_errors: &'a [Option<Arc<str>>],
}

/// A decision's excluded list, built as the list `last` (the policy's last one) for as long
/// as the two agree: most decisions of a policy leave out the same clusters for the same
/// reasons, and a fresh list of a thousand entries per decision (allocated, filled, copied
/// into its `Arc`) was most of the cost of deciding one template in a big fleet.
struct ExcludedList<'a> {
    last: Option<&'a Arc<[Excluded]>>,
    /// The length of the prefix of `last` this list equals, while it has no entries of its own.
    same: usize,
    own: Option<Vec<Excluded>>,
    capacity: usize,
}

impl<'a> ExcludedList<'a> {
    fn new(last: Option<&'a Arc<[Excluded]>>, capacity: usize) -> Self {
        Self {
            last,
            same: 0,
            own: None,
            capacity,
        }
    }

    fn push(&mut self, cluster: &ClusterId, reason: Cow<'_, PlacementFilter>) {
        let own = match &mut self.own {
            Some(own) => own,
            None => {
                let last: &[Excluded] = self.last.map_or(&[], |l| l);
                if last
                    .get(self.same)
                    .is_some_and(|e| e.cluster == *cluster && e.reason == *reason)
                {
                    self.same += 1;
                    return;
                }
                let mut own = Vec::with_capacity(self.capacity);
                own.extend_from_slice(&last[..self.same]);
                self.own.insert(own)
            }
        };
        own.push(Excluded {
            cluster: cluster.clone(),
            reason: reason.into_owned(),
        });
    }

    fn finish(self) -> Arc<[Excluded]> {
        match (self.own, self.last) {
            (Some(own), _) => own.into(),
            (None, Some(last)) if last.len() == self.same => last.clone(),
            (None, Some(last)) => last[..self.same].into(),
            (None, None) => Arc::default(),
        }
    }
}

/// Why a feasible cluster that nothing else explains holds nothing: its first tier could not
/// take the template, or comes after the tier used (or is the tier used, and the division
/// gave it none).
fn by_position(plan: &Plan<'_>, p: usize, tier_errors: &[Option<Arc<str>>]) -> PlacementFilter {
    let Some(first) = plan.clusters[p].first_tier else {
        return PlacementFilter::NotInAffinities;
    };
    let used = tier_errors.iter().position(Option::is_none);
    match (&tier_errors[first], used) {
        (Some(why), _) => PlacementFilter::TierUnusable {
            tier: plan.tiers[first].name.clone(),
            why: why.clone(),
        },
        (None, Some(used)) if first > used => match &plan.tiers[first].name {
            Some(name) => PlacementFilter::LaterTier(name.clone()),
            None => PlacementFilter::NoReplicas,
        },
        _ => PlacementFilter::NoReplicas,
    }
}

fn unschedulable(
    fleet: &Fleet<'_>,
    plan: &Plan<'_>,
    t: &Template,
    prev: Option<&Previous>,
    reasons: Vec<Option<PlacementFilter>>,
    tier_errors: &[Option<Arc<str>>],
) -> Decision {
    let reason = plan
        .tiers
        .iter()
        .zip(tier_errors)
        .map(|(tier, why)| {
            let why = why.as_deref().unwrap_or("no feasible cluster");
            match &tier.name {
                Some(name) => format!("tier {name}: {why}"),
                None => why.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join("; ");
    let excluded = reasons
        .into_iter()
        .enumerate()
        .map(|(p, why)| Excluded {
            cluster: fleet.id(p).clone(),
            reason: plan.clusters[p]
                .filter
                .clone()
                .or(why)
                .unwrap_or_else(|| by_position(plan, p, tier_errors)),
        })
        .collect();
    Decision {
        template: t.key.clone(),
        policy: Some(plan.policy.key.clone()),
        outcome: Outcome::Unschedulable { reason },
        tier: None,
        standby_tier: None,
        placed: prev.map(|p| p.placed.clone()).unwrap_or_default(),
        excluded,
        scores: None,
    }
}

/// Holds `excluded` as the list the last decision of `policy` left out when the two are
/// equal, else remembers it as that list.
fn share_excluded(
    lists: &mut HashMap<ObjectKey, Arc<[Excluded]>>,
    policy: &ObjectKey,
    excluded: &mut Arc<[Excluded]>,
) {
    match lists.get(policy) {
        Some(last) if Arc::ptr_eq(last, excluded) => {}
        Some(last) if **last == **excluded => *excluded = last.clone(),
        _ => {
            lists.insert(policy.clone(), excluded.clone());
        }
    }
}

/// `(policy, rule index)` of every rule of `policies` that applies to `template` in
/// `cluster`, in the order they apply — what a decision's `Placed::overrides` holds, for
/// other policies than the round's (a rollback renders with the ones it replaced).
pub fn override_rules(
    policies: &[OverridePolicy],
    template: &Template,
    cluster: Option<&ClusterSpec>,
) -> Vec<(ObjectKey, usize)> {
    Overrides::new(policies)
        .applicable(template)
        .rules_for(cluster)
}

/// The round's OverridePolicies, by key.
struct Overrides<'o> {
    sorted: Vec<&'o OverridePolicy>,
}

/// The OverridePolicies selecting one template, in the order they apply: less specific
/// first, then by key.
struct Applicable<'o> {
    policies: Vec<&'o OverridePolicy>,
}

impl<'o> Overrides<'o> {
    fn new(all: &'o [OverridePolicy]) -> Self {
        let mut sorted: Vec<&OverridePolicy> = all.iter().collect();
        sorted.sort_by(|a, b| a.key.cmp(&b.key));
        Self { sorted }
    }

    fn applicable(&self, t: &Template) -> Applicable<'o> {
        let mut selecting: Vec<_> = self
            .sorted
            .iter()
            .filter_map(|o| o.selects(t).map(|s| (s, *o)))
            .collect();
        // Stable: equal specificity keeps key order.
        selecting.sort_by_key(|(s, _)| *s);
        Applicable {
            policies: selecting.into_iter().map(|(_, o)| o).collect(),
        }
    }
}

impl Applicable<'_> {
    /// `(policy, rule index)` of every rule targeting `cluster` (None: a cluster no longer
    /// known, which only rules without targets reach), in the order they apply.
    fn rules_for(&self, cluster: Option<&ClusterSpec>) -> Vec<(ObjectKey, usize)> {
        let mut rules = Vec::new();
        for o in &self.policies {
            for (i, rule) in o.rules.iter().enumerate() {
                let targets = rule
                    .targets
                    .as_ref()
                    .is_none_or(|set| cluster.is_some_and(|c| set.contains(c)));
                if targets {
                    rules.push((o.key.clone(), i));
                }
            }
        }
        rules
    }
}

/// Decisions for the templates no policy places that placed workloads name as dependencies.
fn follow_dependencies<'t>(
    inputs: &Inputs<'t>,
    governing: &[Option<usize>],
    fleet: &Fleet<'_>,
    overrides: &Overrides<'_>,
    decisions: &ThisRound<'_>,
) -> Vec<(&'t Template, Decision)> {
    if inputs.templates.iter().all(|t| t.dependencies.is_empty()) {
        return Vec::new();
    }
    let orphans: HashMap<&TemplateKey, &'t Template> = inputs
        .templates
        .iter()
        .zip(governing)
        .filter(|(_, g)| g.is_none())
        .map(|(t, _)| (&t.key, t))
        .collect();
    let mut following: BTreeMap<&TemplateKey, BTreeMap<ClusterId, Vec<TemplateKey>>> =
        BTreeMap::new();
    for (w, g) in inputs.templates.iter().zip(governing) {
        let Some(decision) = g.and_then(|_| decisions.get(&w.key)) else {
            continue;
        };
        for dep in w.dependencies.iter().filter(|d| orphans.contains_key(d)) {
            let clusters = following.entry(dep).or_default();
            for placed in &decision.placed {
                clusters
                    .entry(placed.cluster.clone())
                    .or_default()
                    .push(w.key.clone());
            }
        }
    }
    let mut followed = Vec::with_capacity(following.len());
    for (dep, clusters) in following {
        let t = orphans[dep];
        let applicable = overrides.applicable(t);
        let placed = clusters
            .into_iter()
            .map(|(cluster, mut workloads)| {
                workloads.sort();
                workloads.dedup();
                let spec = fleet
                    .position(&cluster)
                    .map(|p| &fleet.clusters[p].view.spec);
                Placed {
                    overrides: applicable.rules_for(spec),
                    cluster,
                    replicas: None,
                    reason: PlacedReason::Dependency(workloads),
                }
            })
            .collect();
        let decision = Decision {
            template: dep.clone(),
            policy: None,
            outcome: Outcome::Scheduled,
            tier: None,
            standby_tier: None,
            placed,
            excluded: Arc::default(),
            scores: None,
        };
        followed.push((t, decision));
    }
    followed
}
