//! Staged rollouts in the writer (`placement.rollout`): core's stage machine
//! ([`stages::step`]) driven from what the members hold, and what it allows turned into
//! which body each copy gets.
//!
//! ```text
//!  a template governed by a rollout (a dependency: by its workloads' policy), whose copies
//!  hold another revision than they would receive now (a revision: the template generation,
//!  its body's digest when it has none, and the digest of the override rules applied there,
//!  so an OverridePolicy or ConfigMap edit is staged like a template edit)
//!    ─► Progress::start(new, old) and the stages planned over the placed clusters whose copy
//!       changes (kept: clusters placed later get the new revision at once, having no copy
//!       to protect)
//!  every pass: Observed (which revision each copy is ready at, the clusters the published
//!    decision drains, who serves whom) + the operators' commands ─► stages::step
//!    ─► per placed cluster holding a copy: the new body, the previous body and override
//!       rules (a rollback), or nothing (a stage not reached: its copy stays as it is, drift
//!       repair included)
//!    ─► per policy, the clusters drained: written into its status, read back by every
//!       replica's hub source into the traffic decision (`Event::Drained`)
//! ```
//!
//! The progress is written into the policy's status with its conditions, so a new leader
//! resumes the same stage (`resume`). The previous revision's body and override rules are
//! kept in memory only: a rollback after a restart leaves the copies as they are and says so.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use meridian_core::placement::{Decision, OverridePolicy, TemplateKey};
use meridian_core::stages::{
    self, Actions, Command, Gate as Verdict, Observed, Phase, PlannedStage, Progress, Revision,
};
use meridian_core::{ClusterId, ObjectKey, Snapshot, Template};
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::{Value, json};
use tracing::info;

use super::analysis::Analyses;
use crate::crd::{RolloutStageStatus, RolloutStatus, TemplateRolloutStatus};
use crate::metrics::{PolicyLabels, PropagationMetrics, RolloutLabels};

/// What a member receives of a template: its generation, the digest of its body when it
/// has no generation (a ConfigMap, a Secret: `render::TEMPLATE_DIGEST_ANNOTATION`), and the
/// digest of the override rules applied there (`Placed::overrides_digest`; None: no rule
/// applies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Received {
    pub(super) generation: i64,
    pub(super) body: Option<u64>,
    pub(super) overrides: Option<u64>,
}

/// What a copy holds, for the stage machine: what it was written from (None: no copy, or
/// one meridian cannot date) and whether it runs ready at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct HeldAt {
    pub(super) received: Option<Received>,
    pub(super) ready: bool,
}

/// The body a copy is rendered from and the override rules it is rendered with.
#[derive(Clone, Debug)]
pub(super) struct Source {
    pub(super) template: Template,
    pub(super) overrides: Arc<[OverridePolicy]>,
}

/// The source of one copy this pass.
#[derive(Clone, Copy, Debug)]
pub(super) enum Write<'t> {
    /// The template and override rules as they are now.
    Current,
    /// The revision a rollback restores.
    Previous(&'t Source),
}

/// How one template's copies are written this pass.
#[derive(Debug, Default)]
pub(super) struct Gate {
    /// Clusters whose copy stays as it is.
    pub(super) hold: BTreeSet<ClusterId>,
    /// Clusters that get the previous revision again (a rollback), and what it was.
    pub(super) previous: Option<(Source, BTreeSet<ClusterId>)>,
    /// Clusters whose previous body is not known here: left as they are, with this reason.
    pub(super) unknown_previous: BTreeSet<ClusterId>,
}

impl Gate {
    /// What `cluster`'s copy is rendered from, or None when it is held.
    pub(super) fn write_for(&self, cluster: &ClusterId) -> Result<Option<Write<'_>>, String> {
        if self.unknown_previous.contains(cluster) {
            return Err("rolling back, but this replica does not hold the previous \
                        revision's body and override rules (it restarted mid-rollout): left \
                        as it is"
                .into());
        }
        if self.hold.contains(cluster) {
            return Ok(None);
        }
        match &self.previous {
            Some((source, at)) if at.contains(cluster) => Ok(Some(Write::Previous(source))),
            _ => Ok(Some(Write::Current)),
        }
    }
}

/// One template's rollout.
#[derive(Clone, Debug)]
pub(super) struct Staging {
    pub(super) policy: ObjectKey,
    pub(super) progress: Progress,
    pub(super) stages: Vec<PlannedStage>,
    /// The body and override rules of the revision replaced, when this replica saw them.
    pub(super) previous: Option<Source>,
    /// What each placed cluster receives at the revision rolling out: something else for a
    /// cluster is another edit.
    target: BTreeMap<ClusterId, Received>,
    pub(super) actions: Actions,
    /// The stage waits for `rollout approve`.
    awaiting_approval: bool,
    /// What the health gate's query last said.
    gate: Option<String>,
    /// When the current stage started (for the stage duration metric).
    stage_started: Instant,
}

impl Staging {
    fn new(
        policy: ObjectKey,
        progress: Progress,
        stages: Vec<PlannedStage>,
        previous: Option<Source>,
        target: BTreeMap<ClusterId, Received>,
        now: Instant,
    ) -> Self {
        Self {
            policy,
            progress,
            stages,
            previous,
            target,
            actions: Actions::default(),
            awaiting_approval: false,
            gate: None,
            stage_started: now,
        }
    }

    /// Whether this rollout is of what the clusters receive now: the template's generation
    /// (a rollout resumed from the status may be of an older one), and in every cluster it
    /// planned the same revision (a cluster placed since gets its copy at once).
    fn rolls_out(&self, generation: i64, receives: &BTreeMap<ClusterId, Received>) -> bool {
        self.progress.generation == generation
            && self
                .target
                .iter()
                .all(|(cluster, target)| receives.get(cluster).is_none_or(|r| r == target))
    }

    /// Keeps what a step decided: logs a change, times a stage that ended, and notes whether
    /// the stage now waits for an approval.
    fn record(
        &mut self,
        key: &TemplateKey,
        strategy: &stages::Strategy,
        progress: Progress,
        actions: Actions,
        now: Instant,
        metrics: &PropagationMetrics,
    ) {
        let stage_ended = progress.stage != self.progress.stage
            || (progress.finished() && !self.progress.finished());
        if stage_ended {
            metrics.rollout_stage_seconds.observe(
                now.saturating_duration_since(self.stage_started)
                    .as_secs_f64(),
            );
            self.stage_started = now;
        }
        if progress != self.progress {
            info!(template = %key, stage = progress.stage, phase = ?progress.phase,
                  paused = progress.paused.as_deref().unwrap_or(""), "staged rollout");
        }
        self.awaiting_approval = progress.phase == Phase::Approval
            && progress.paused.is_none()
            && !progress.approved.contains(&progress.stage)
            && self
                .stages
                .get(progress.stage)
                .and_then(|st| strategy.stages.get(st.spec))
                .is_some_and(|spec| spec.approval_required);
        self.progress = progress;
        self.actions = actions;
    }
}

/// The health gate's verdict for `staging`'s stage: asked while it verifies, Pending
/// elsewhere (what made a rollout pause or roll back stays said).
fn ask_gate(
    analyses: &mut Analyses,
    staging: &mut Staging,
    key: &TemplateKey,
    analysis: &stages::Analysis,
    now: Instant,
) -> Verdict {
    let p = &staging.progress;
    if p.phase == Phase::Verifying && p.paused.is_none() {
        let clusters = staging
            .stages
            .get(p.stage)
            .map_or(&[][..], |s| s.clusters.as_slice());
        let verdict = analyses.verdict(key, analysis, (p.generation, p.stage), clusters, now);
        staging.gate = analyses.said(key, analysis);
        return verdict;
    }
    analyses.forget(key);
    if p.paused.is_none() && !matches!(p.phase, Phase::RollingBack | Phase::RolledBack) {
        staging.gate = None;
    }
    Verdict::Pending
}

/// An operator's command for every rollout of a policy.
pub(super) type Commands = Arc<Mutex<Vec<(ObjectKey, Command)>>>;

/// The writer's rollouts.
#[derive(Default)]
pub(super) struct Staged {
    rollouts: BTreeMap<TemplateKey, Staging>,
    /// The last body and override rules seen of each template a rollout governs: the
    /// previous revision of the next edit.
    bodies: BTreeMap<TemplateKey, Source>,
    /// Progress read from the policies' status at the start of a term, taken up when the
    /// template is next looked at.
    resumable: BTreeMap<TemplateKey, (ObjectKey, Progress, Vec<PlannedStage>)>,
    /// The health gates' queries.
    analyses: Analyses,
}

/// Unix seconds: progress is kept on the hub, so its clock must mean the same to the next
/// leader.
pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Staged {
    /// Forgets what a term learnt (a new term resumes from the hub).
    pub(super) fn forget(&mut self) {
        self.rollouts.clear();
        self.resumable.clear();
    }

    /// A rollout is under way and not paused: its waits end with time alone.
    pub(super) fn running(&self) -> bool {
        self.rollouts
            .values()
            .any(|s| !s.progress.finished() && s.progress.paused.is_none())
    }

    pub(super) fn rollouts(&self) -> &BTreeMap<TemplateKey, Staging> {
        &self.rollouts
    }

    /// The progress a policy's status holds, to take up where the last leader was.
    pub(super) fn resume(&mut self, policy: &ObjectKey, status: &RolloutStatus) {
        for t in &status.templates {
            let Some(key) = template_key(&policy.namespace, &t.template) else {
                continue;
            };
            let Some(progress) = progress_of(t) else {
                continue;
            };
            let stages = t
                .stages
                .iter()
                .map(|s| PlannedStage {
                    name: s.name.clone(),
                    clusters: s.clusters.iter().map(ClusterId::new).collect(),
                    spec: usize::MAX,
                })
                .collect();
            self.resumable
                .insert(key, (policy.clone(), progress, stages));
        }
    }

    /// Steps `key`'s rollout (starting one when its copies hold another revision than they
    /// would receive now) and says how its copies are written. None: the template is not
    /// staged. `policy_key` places it (for a dependency, the policy of the workloads it
    /// follows); `body_print` is its body's digest when it has no generation.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gate(
        &mut self,
        snapshot: &Snapshot,
        (policy_key, decision): (&ObjectKey, &Decision),
        (template, body_print): (&Template, Option<u64>),
        held: &BTreeMap<ClusterId, HeldAt>,
        commands: &[Command],
        now: Instant,
        metrics: &PropagationMetrics,
    ) -> Option<Gate> {
        let policy = snapshot.policies.iter().find(|p| &p.key == policy_key)?;
        let strategy = policy.placement.as_ref()?.rollout.as_ref()?;
        let key = &template.key;
        let previous_source = self.bodies.insert(
            key.clone(),
            Source {
                template: template.clone(),
                overrides: snapshot.overrides.clone(),
            },
        );
        let receives: BTreeMap<ClusterId, Received> = decision
            .placed
            .iter()
            .map(|p| {
                let received = Received {
                    generation: template.generation,
                    body: body_print,
                    overrides: p.overrides_digest(&snapshot.overrides),
                };
                (p.cluster.clone(), received)
            })
            .collect();
        self.take_up_resumed(key, strategy, &receives, now);
        let started = self.start_if_edited(
            snapshot,
            (policy_key, strategy),
            decision,
            template,
            (held, &receives),
            previous_source,
            now,
        );
        if !started {
            return None;
        }
        let staging = self.rollouts.get_mut(key)?;
        let gate = strategy
            .analysis
            .as_ref()
            .map(|a| ask_gate(&mut self.analyses, staging, key, a, now));
        // An operator's commands, then what the policy's annotations hold.
        let mut commands = commands.to_vec();
        commands.extend(
            strategy
                .control
                .commands(&staging.progress, &staging.stages),
        );
        // Who serves whom is read only where the machine reads it, before a stage drains: not
        // on every pass of an hour-long wait for an approval (or a pause) no command ends.
        let p = &staging.progress;
        let waits_for_a_command = p.paused.is_some() || staging.awaiting_approval;
        let may_drain =
            p.phase == Phase::Approval && (!waits_for_a_command || !commands.is_empty());
        let observed = Observed {
            ready_at: held
                .iter()
                .filter(|(_, h)| h.ready)
                .filter_map(|(c, h)| Some((c.clone(), revision_of(h.received?, c, &receives))))
                .collect(),
            gate,
            serving: if may_drain {
                meridian_core::whatif::rollout::serving(snapshot, &policy_key.to_string(), now)
            } else {
                BTreeMap::new()
            },
            drained: Some(policy.traffic.drained.clone()),
        };
        let (progress, actions) = stages::step(
            strategy,
            &staging.stages,
            &staging.progress,
            &commands,
            &observed,
            unix_now(),
        );
        staging.record(key, strategy, progress, actions, now, metrics);
        Some(gate_of(staging, held, &receives))
    }

    /// A rollout the policy's status held at the term's start, taken up if none runs here
    /// (rolling out what the clusters receive now).
    fn take_up_resumed(
        &mut self,
        key: &TemplateKey,
        strategy: &stages::Strategy,
        receives: &BTreeMap<ClusterId, Received>,
        now: Instant,
    ) {
        let Some((from, progress, mut stages)) = self.resumable.remove(key) else {
            return;
        };
        if self.rollouts.contains_key(key) {
            return;
        }
        for s in &mut stages {
            s.spec = spec_index(strategy, &s.name);
        }
        info!(template = %key, stage = progress.stage, phase = ?progress.phase,
              "resuming a staged rollout from the policy's status");
        let target = receives.clone();
        self.rollouts.insert(
            key.clone(),
            Staging::new(from, progress, stages, None, target, now),
        );
    }

    /// Starts a rollout when what the clusters receive now is not what is rolling out and
    /// some copy holds another revision; false when there is nothing to stage (a first
    /// placement, or every copy at what its cluster receives already).
    #[allow(clippy::too_many_arguments)]
    fn start_if_edited(
        &mut self,
        snapshot: &Snapshot,
        (policy_key, strategy): (&ObjectKey, &stages::Strategy),
        decision: &Decision,
        template: &Template,
        (held, receives): (&BTreeMap<ClusterId, HeldAt>, &BTreeMap<ClusterId, Received>),
        previous_source: Option<Source>,
        now: Instant,
    ) -> bool {
        let key = &template.key;
        if self
            .rollouts
            .get(key)
            .is_some_and(|s| s.rolls_out(template.generation, receives))
        {
            return true;
        }
        let behind = held
            .iter()
            .filter_map(|(c, h)| h.received.filter(|r| receives.get(c) != Some(r)))
            .map(|r| r.generation)
            .min();
        let Some(old) = behind else {
            self.rollouts.remove(key);
            return false;
        };
        // An edit during a rollout rolls on from the revision the first one replaced.
        let (previous, previous_source) = match self.rollouts.remove(key) {
            Some(s) if !s.progress.finished() => (s.progress.previous, s.previous),
            _ => (
                old,
                previous_source.filter(|b| b.template.generation == old),
            ),
        };
        // Staged: the clusters whose copy changes. One an override edit leaves as it is keeps
        // its traffic and its copy.
        let placed = decision
            .placed
            .iter()
            .filter(|p| {
                let held = held.get(&p.cluster).and_then(|h| h.received);
                held.is_some_and(|r| receives.get(&p.cluster) != Some(&r))
            })
            .map(|p| {
                let labels = snapshot
                    .cluster_view(&p.cluster)
                    .map(|v| v.spec.labels.clone())
                    .unwrap_or_default();
                (p.cluster.clone(), labels)
            })
            .collect();
        let stages = stages::plan(strategy, &placed);
        info!(template = %key, generation = template.generation, previous,
              stages = stages.len(), "a staged rollout starts");
        let progress = Progress::start(template.generation, previous, unix_now());
        let staging = Staging::new(
            policy_key.clone(),
            progress,
            stages,
            previous_source,
            receives.clone(),
            now,
        );
        self.rollouts.insert(key.clone(), staging);
        true
    }

    /// Rollouts of templates no longer placed by a staged policy are forgotten.
    pub(super) fn retain(&mut self, placed: impl Fn(&TemplateKey) -> bool) {
        self.rollouts.retain(|k, _| placed(k));
        self.bodies.retain(|k, _| placed(k));
        self.analyses.retain(&placed);
    }

    /// The rollouts of `policy`'s templates (None: it has none this term).
    fn of_policy(&self, policy: &ObjectKey) -> Option<Vec<(&TemplateKey, &Staging)>> {
        let mine: Vec<(&TemplateKey, &Staging)> = self
            .rollouts
            .iter()
            .filter(|(_, s)| &s.policy == policy)
            .collect();
        (!mine.is_empty()).then_some(mine)
    }

    /// `status.rollout` of `policy` (None: it has no rollout this term).
    pub(super) fn status_of(&self, policy: &ObjectKey) -> Option<Value> {
        let mine = self.of_policy(policy)?;
        let drained: BTreeSet<&ClusterId> =
            mine.iter().flat_map(|(_, s)| &s.actions.drained).collect();
        // A cluster two templates bring back takes the smaller share.
        let mut ramping: BTreeMap<String, u32> = BTreeMap::new();
        for (cluster, percent) in mine.iter().flat_map(|(_, s)| &s.actions.ramping) {
            let share = ramping.entry(cluster.to_string()).or_insert(*percent);
            *share = (*share).min(*percent);
        }
        ramping.retain(|c, p| *p < 100 && !drained.iter().any(|d| d.as_str() == c));
        let status = RolloutStatus {
            drained: drained.iter().map(|c| c.to_string()).collect(),
            ramping,
            templates: mine
                .iter()
                .map(|(k, s)| status_of_template(k, &s.progress, &s.stages))
                .collect(),
        };
        serde_json::to_value(status).ok()
    }

    /// The `Rollout` condition of `policy`: (status, reason, message).
    pub(super) fn condition_of(&self, policy: &ObjectKey) -> Option<(bool, &'static str, String)> {
        let mine = self.of_policy(policy)?;
        let said: Vec<String> = mine.iter().map(|(k, s)| words(k, s)).collect();
        let (ok, reason) = if mine.iter().any(|(_, s)| s.progress.paused.is_some()) {
            (false, "Paused")
        } else if mine
            .iter()
            .any(|(_, s)| s.progress.phase == Phase::RolledBack)
        {
            (false, "RolledBack")
        } else if mine.iter().all(|(_, s)| s.progress.finished()) {
            (true, "Complete")
        } else if mine.iter().any(|(_, s)| s.awaiting_approval) {
            (true, "AwaitingApproval")
        } else {
            (true, "Progressing")
        };
        Some((ok, reason, super::policies::listed(&said, "; ")))
    }

    /// The rollout gauges: per policy, its rollouts in each phase and whether one is paused.
    pub(super) fn export(&self, metrics: &PropagationMetrics) {
        metrics.rollout_phase.clear();
        metrics.rollout_paused.clear();
        for s in self.rollouts.values() {
            let policy = s.policy.to_string();
            metrics
                .rollout_phase
                .get_or_create(&RolloutLabels {
                    policy: policy.clone(),
                    phase: phase_label(s.progress.phase),
                })
                .inc();
            let paused = metrics
                .rollout_paused
                .get_or_create(&PolicyLabels { policy });
            if s.progress.paused.is_some() {
                paused.set(1);
            }
        }
    }

    /// What `/debug/rollouts` shows.
    pub(super) fn views(&self) -> Vec<RolloutView> {
        self.rollouts
            .iter()
            .map(|(k, s)| RolloutView {
                policy: s.policy.to_string(),
                template: k.to_string(),
                generation: s.progress.generation,
                previous: s.progress.previous,
                stage: s.progress.stage,
                stages: s
                    .stages
                    .iter()
                    .map(|st| json!({"name": st.name, "clusters": st.clusters}))
                    .collect(),
                phase: s.progress.phase,
                since: s.progress.since,
                failures: s.progress.failures,
                paused: s.progress.paused.clone(),
                awaiting_approval: s.awaiting_approval,
                previous_body_known: s.previous.is_some(),
                gate: s.gate.clone(),
                actions: s.actions.clone(),
                summary: words(k, s),
            })
            .collect()
    }
}

/// One rollout as `/debug/rollouts` and `meridian rollout status` show it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutView {
    pub policy: String,
    pub template: String,
    pub generation: i64,
    pub previous: i64,
    pub stage: usize,
    pub stages: Vec<Value>,
    pub phase: Phase,
    pub since: u64,
    pub failures: u32,
    pub paused: Option<String>,
    pub awaiting_approval: bool,
    pub previous_body_known: bool,
    /// What the health gate's query last said.
    pub gate: Option<String>,
    pub actions: Actions,
    pub summary: String,
}

fn phase_label(phase: Phase) -> &'static str {
    match phase {
        Phase::Approval => "approval",
        Phase::Draining => "draining",
        Phase::Applying => "applying",
        Phase::Restoring => "restoring",
        Phase::Verifying => "verifying",
        Phase::RollingBack => "rolling_back",
        Phase::Done => "done",
        Phase::RolledBack => "rolled_back",
    }
}

/// One line: where the rollout of `key` stands.
fn words(key: &TemplateKey, s: &Staging) -> String {
    let p = &s.progress;
    let stage = s
        .stages
        .get(p.stage)
        .map(|st| format!("stage {}/{} {:?}", p.stage + 1, s.stages.len(), st.name));
    let what = if p.generation == 0 {
        format!("{key} (no generation) new content")
    } else if p.generation == p.previous {
        format!("{key} override rules at generation {}", p.generation)
    } else {
        format!("{key} generation {} over {}", p.generation, p.previous)
    };
    let at = format!(
        "{what}: {}",
        stage.unwrap_or_else(|| "every stage done".into())
    );
    let at = match &s.gate {
        Some(gate) => format!("{at} ({gate})"),
        None => at,
    };
    match (&p.paused, p.phase) {
        (Some(why), _) => format!("{at}, paused: {why}"),
        (None, Phase::Approval) if s.awaiting_approval => {
            format!("{at}, waiting for `meridian rollout approve`")
        }
        (None, phase) => format!("{at}, {phase:?}"),
    }
}

/// Which side of a rollout a copy holding `held` in `cluster` is on: new when it is what the
/// cluster receives now, else the revision it replaces.
fn revision_of(
    held: Received,
    cluster: &ClusterId,
    receives: &BTreeMap<ClusterId, Received>,
) -> Revision {
    if receives.get(cluster) == Some(&held) {
        Revision::New
    } else {
        Revision::Previous
    }
}

/// How the copies of a staged template are written, from the machine's actions and what the
/// members hold.
fn gate_of(
    s: &Staging,
    held: &BTreeMap<ClusterId, HeldAt>,
    receives: &BTreeMap<ClusterId, Received>,
) -> Gate {
    let mut gate = Gate::default();
    let mut previous = BTreeSet::new();
    for (cluster, h) in held {
        // No copy yet (or one meridian cannot date): a first copy has nothing to protect.
        let Some(received) = h.received else {
            continue;
        };
        match s.actions.revision.get(cluster) {
            Some(Revision::New) => {}
            Some(Revision::Previous) => {
                if s.previous.is_some() {
                    previous.insert(cluster.clone());
                } else if revision_of(received, cluster, receives) == Revision::New {
                    gate.unknown_previous.insert(cluster.clone());
                } else {
                    gate.hold.insert(cluster.clone());
                }
            }
            None => {
                gate.hold.insert(cluster.clone());
            }
        }
    }
    if !previous.is_empty()
        && let Some(source) = &s.previous
    {
        gate.previous = Some((source.clone(), previous));
    }
    gate
}

/// The spec a planned stage came from, by name (a batch of the rest is `name (k/n)`).
fn spec_index(strategy: &stages::Strategy, name: &str) -> usize {
    let base = name.split(" (").next().unwrap_or(name);
    strategy
        .stages
        .iter()
        .position(|s| s.name == base)
        .unwrap_or(usize::MAX)
}

/// `apiVersion/kind/name` (the policy's namespace is the template's).
fn template_ref(key: &TemplateKey) -> String {
    format!("{}/{}/{}", key.api_version, key.kind, key.name)
}

fn template_key(namespace: &str, reference: &str) -> Option<TemplateKey> {
    let (rest, name) = reference.rsplit_once('/')?;
    let (api_version, kind) = rest.rsplit_once('/')?;
    Some(TemplateKey::new(api_version, kind, namespace, name))
}

fn status_of_template(
    key: &TemplateKey,
    p: &Progress,
    stages: &[PlannedStage],
) -> TemplateRolloutStatus {
    TemplateRolloutStatus {
        template: template_ref(key),
        generation: p.generation,
        previous: p.previous,
        stages: stages
            .iter()
            .map(|s| RolloutStageStatus {
                name: s.name.clone(),
                clusters: s.clusters.iter().map(|c| c.to_string()).collect(),
            })
            .collect(),
        stage: p.stage as u32,
        phase: format!("{:?}", p.phase),
        since: p.since,
        failures: p.failures,
        approved: p.approved.iter().map(|s| *s as u32).collect(),
        paused: p.paused.clone(),
    }
}

fn progress_of(t: &TemplateRolloutStatus) -> Option<Progress> {
    let phase = match t.phase.as_str() {
        "Approval" => Phase::Approval,
        "Draining" => Phase::Draining,
        "Applying" => Phase::Applying,
        "Restoring" => Phase::Restoring,
        "Verifying" => Phase::Verifying,
        "RollingBack" => Phase::RollingBack,
        "Done" => Phase::Done,
        "RolledBack" => Phase::RolledBack,
        _ => return None,
    };
    Some(Progress {
        generation: t.generation,
        previous: t.previous,
        stage: t.stage as usize,
        phase,
        since: t.since,
        failures: t.failures,
        approved: t.approved.iter().map(|s| *s as usize).collect(),
        paused: t.paused.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_survives_the_status_it_is_written_into() {
        let key = TemplateKey::new("apps/v1", "Deployment", "shop", "payments");
        let mut p = Progress::start(3, 2, 1_700_000_000);
        p.stage = 1;
        p.phase = Phase::Verifying;
        p.approved.insert(1);
        p.paused = Some("stage 2: the gate failed".into());
        let stages = vec![PlannedStage {
            name: "canary".into(),
            clusters: vec![ClusterId::new("m1")],
            spec: 0,
        }];
        let status = status_of_template(&key, &p, &stages);
        assert_eq!(status.template, "apps/v1/Deployment/payments");
        assert_eq!(template_key("shop", &status.template), Some(key));
        assert_eq!(progress_of(&status), Some(p));
    }

    fn payments(generation: i64) -> Template {
        Template {
            key: TemplateKey::new("apps/v1", "Deployment", "shop", "payments"),
            labels: Default::default(),
            generation,
            replicas: Some(1),
            requests: Default::default(),
            dependencies: Vec::new(),
            body: Arc::new(json!({})),
        }
    }

    fn staging(generation: i64, previous: i64) -> Staging {
        Staging::new(
            ObjectKey::new("shop", "p"),
            Progress::start(generation, previous, 0),
            Vec::new(),
            None,
            BTreeMap::new(),
            Instant::now(),
        )
    }

    fn at(generation: i64, overrides: Option<u64>) -> HeldAt {
        HeldAt {
            received: Some(Received {
                generation,
                body: None,
                overrides,
            }),
            ready: true,
        }
    }

    fn receive(clusters: &[(&str, i64, Option<u64>)]) -> BTreeMap<ClusterId, Received> {
        clusters
            .iter()
            .map(|(c, generation, overrides)| {
                let received = Received {
                    generation: *generation,
                    body: None,
                    overrides: *overrides,
                };
                (ClusterId::new(c), received)
            })
            .collect()
    }

    #[test]
    fn a_stage_not_reached_is_held_and_a_rollback_without_the_old_body_says_so() {
        let mut s = staging(3, 2);
        let m1 = ClusterId::new("m1");
        s.actions.revision.insert(m1.clone(), Revision::New);
        let receives = receive(&[("m1", 3, None), ("m2", 3, None), ("m3", 3, None)]);
        let held = BTreeMap::from([
            (m1.clone(), at(2, None)),
            (ClusterId::new("m2"), at(2, None)),
            (
                ClusterId::new("m3"),
                HeldAt {
                    received: None,
                    ready: false,
                },
            ),
        ]);
        let gate = gate_of(&s, &held, &receives);
        assert_eq!(gate.hold, [ClusterId::new("m2")].into());
        assert!(matches!(gate.write_for(&m1), Ok(Some(Write::Current))));
        assert!(matches!(
            gate.write_for(&ClusterId::new("m3")),
            Ok(Some(Write::Current))
        ));
        // Rolling back m1 (at 3 now) without the previous body: left as it is, and said.
        s.progress.phase = Phase::RollingBack;
        s.actions.revision.insert(m1.clone(), Revision::Previous);
        let held = BTreeMap::from([(m1.clone(), at(3, None))]);
        let gate = gate_of(&s, &held, &receives);
        let err = gate.write_for(&m1).unwrap_err();
        assert!(err.contains("previous revision's body"), "{err}");
        // With it, m1 gets the previous body.
        s.previous = Some(Source {
            template: payments(2),
            overrides: Arc::from(Vec::new()),
        });
        let gate = gate_of(&s, &held, &receives);
        match gate.write_for(&m1) {
            Ok(Some(Write::Previous(source))) => assert_eq!(source.template.generation, 2),
            other => panic!("m1 gets the previous body, not {other:?}"),
        }
    }

    #[test]
    fn an_override_edit_is_a_new_revision_where_it_changes_what_a_cluster_receives() {
        // Generation 3 everywhere; the override rules m1 receives changed (digest 7 → 8), m2's
        // did not.
        let receives = receive(&[("m1", 3, Some(8)), ("m2", 3, Some(5))]);
        let (m1, m2) = (ClusterId::new("m1"), ClusterId::new("m2"));
        assert_eq!(
            revision_of(at(3, Some(7)).received.unwrap(), &m1, &receives),
            Revision::Previous
        );
        assert_eq!(
            revision_of(at(3, Some(5)).received.unwrap(), &m2, &receives),
            Revision::New
        );
        // A rollout of those digests rolls out what m1 and m2 receive; another digest for m1
        // is another edit; a cluster placed since (m3) is not.
        let mut s = staging(3, 3);
        s.target = receives.clone();
        assert!(s.rolls_out(3, &receives));
        let mut placed_since = receives.clone();
        placed_since.extend(receive(&[("m3", 3, Some(1))]));
        assert!(s.rolls_out(3, &placed_since));
        assert!(!s.rolls_out(3, &receive(&[("m1", 3, Some(9)), ("m2", 3, Some(5))])));
        assert!(!s.rolls_out(4, &receive(&[("m1", 4, Some(8)), ("m2", 4, Some(5))])));
        assert!(words(&payments(3).key, &s).contains("override rules at generation 3"));
        // A body without a generation: its digest tells its edits apart.
        let mut config = receive(&[("m1", 0, None)]);
        config.get_mut(&m1).unwrap().body = Some(1);
        s.target = config.clone();
        s.progress.generation = 0;
        assert!(s.rolls_out(0, &config));
        config.get_mut(&m1).unwrap().body = Some(2);
        assert!(!s.rolls_out(0, &config));
        assert!(words(&payments(3).key, &s).contains("(no generation) new content"));
    }
}
