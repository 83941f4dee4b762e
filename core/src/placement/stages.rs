//! Staged rollouts (`placement.rollout`): a template edit reaches the members stage by stage,
//! and a stage's traffic leaves before its copies change. One stage at a time:
//!
//! ```text
//!  Approval   the stage says `approval: Required` ─► waits for `rollout approve`
//!  Draining   (traffic: Drain) the stage's clusters leave the traffic decision of the
//!             Services the policy governs, endpoints kept; `drainSeconds` for caches to
//!             expire. Refused (Paused) if a client would keep no cluster with traffic
//!  Applying   the stage's clusters get the new generation; done when every copy there is
//!             ready at it. Copies not ready after `progressDeadlineSeconds` are failures
//!  Restoring  traffic comes back: at once, or stepping up over `rampSeconds`
//!  Verifying  `waitSeconds` with every copy still ready and the gate (a Prometheus query)
//!             holding; then the next stage, or Done
//! ```
//!
//! More failures in a stage than its `maxFailures` (a copy not ready in time, the gate
//! failing) pause the rollout, or roll it back with `onFailure: Rollback`: the clusters of
//! the stages reached get the previous generation again, then their traffic returns. An
//! operator can pause, resume, approve and abort (abort rolls back the stages reached).
//!
//! Pure and deterministic: the caller reports what the members hold ([`Observed`]), the
//! operator's commands and `now`; [`Progress`] is the whole state, small enough to keep on
//! the hub, so a new leader resumes the same stage without re-applying the finished ones.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::model::ClusterId;
use crate::selector::ClusterSet;

/// `placement.rollout` of a policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Strategy {
    pub stages: Vec<StageSpec>,
    pub traffic: TrafficDuring,
    /// How long a drained stage waits before its copies change: DNS caches and open
    /// connections move first.
    pub drain_seconds: u64,
    /// Traffic returns to a stage over this long (0: at once).
    pub ramp_seconds: u64,
    /// A copy not ready at the new generation this long after it was written is a failure.
    pub progress_deadline_seconds: u64,
    pub on_failure: OnFailure,
    /// The health gate a stage must hold while it verifies.
    pub analysis: Option<Analysis>,
    /// What the policy's annotations say (a GitOps tool's pause, approvals and abort).
    pub control: Control,
}

/// The rollout commands a policy's annotations hold, as a state rather than events:
/// `meridian.io/rollout-paused: "true"` holds every rollout of the policy paused while set,
/// `meridian.io/rollout-approved: "canary,rest"` approves the stages of those names, and
/// `meridian.io/rollout-abort: "7"` aborts the rollout of template generation 7.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Control {
    pub paused: bool,
    pub approved: BTreeSet<String>,
    pub abort: Option<i64>,
}

/// Why a rollout the annotation pauses is paused (how `resume` by annotation knows it).
pub const PAUSED_BY_ANNOTATION: &str =
    "paused by the policy's annotation meridian.io/rollout-paused";

impl Control {
    /// The commands that bring `progress` in line with the annotations.
    pub fn commands(&self, progress: &Progress, stages: &[PlannedStage]) -> Vec<Command> {
        let mut out = Vec::new();
        if progress.finished() {
            return out;
        }
        if self.abort == Some(progress.generation) && progress.phase != Phase::RollingBack {
            out.push(Command::Abort);
            return out;
        }
        let stage_name = stages.get(progress.stage).map(|s| s.name.as_str());
        let base = stage_name.map(|n| n.split(" (").next().unwrap_or(n));
        if base.is_some_and(|n| self.approved.contains(n))
            && !progress.approved.contains(&progress.stage)
        {
            out.push(Command::Approve);
        }
        match (&progress.paused, self.paused) {
            (None, true) => out.push(Command::PauseBy(PAUSED_BY_ANNOTATION)),
            (Some(why), false) if why == PAUSED_BY_ANNOTATION => out.push(Command::Resume),
            _ => {}
        }
        out
    }
}

/// `rollout.analysis`: a Prometheus instant query that holds while every sample it returns is
/// at most `threshold` (an error rate, a latency) — no sample at all holds too, as an error
/// rate with no errors has none. `$clusters` in the query stands for the stage's clusters as
/// a regular expression (`m2|m3`), for `{cluster=~"$clusters"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Analysis {
    pub prometheus_url: String,
    pub query: String,
    pub threshold: Threshold,
}

/// A finite number (a policy's threshold), comparable as a whole.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Threshold(pub f64);

impl Eq for Threshold {}

impl Analysis {
    /// The query for a stage of `clusters`.
    pub fn query_for(&self, clusters: &[ClusterId]) -> String {
        let alternatives: Vec<String> = clusters
            .iter()
            .map(|c| crate::regex_literal(c.as_str()))
            .collect();
        self.query.replace("$clusters", &alternatives.join("|"))
    }

    /// The gate's verdict on the samples a query returned. NaN (a ratio over no requests)
    /// says nothing and is left out.
    pub fn judge(&self, samples: &[f64]) -> Gate {
        if samples
            .iter()
            .filter(|v| !v.is_nan())
            .all(|v| *v <= self.threshold.0)
        {
            Gate::Holds
        } else {
            Gate::Fails
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum TrafficDuring {
    /// A stage's clusters leave the traffic decision while their copies change.
    #[default]
    Drain,
    /// Traffic stays (the copies' own readiness is all that guards it).
    Keep,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum OnFailure {
    #[default]
    Pause,
    Rollback,
}

/// One stage as the policy writes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StageSpec {
    pub name: String,
    pub clusters: StageClusters,
    /// Once the stage is ready and its traffic back, how long it must stay so (and the gate
    /// hold) before the next stage starts.
    pub wait_seconds: u64,
    pub approval_required: bool,
    /// Failures tolerated in the stage before the rollout pauses or rolls back.
    pub max_failures: u32,
}

/// Which placed clusters a stage takes. Each cluster is in the first stage that takes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum StageClusters {
    /// By name or by labels, as a tier names them.
    Set(ClusterSet),
    /// Every cluster no earlier stage took, in batches of at most this many (a count, or a
    /// percent of them rounded up): one planned stage per batch.
    Rest { max_unavailable: Amount },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Amount {
    Count(u32),
    Percent(u32),
}

/// A stage resolved against the clusters the template is placed in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedStage {
    /// The spec's name; a batch of `Rest` adds ` (k/n)`.
    pub name: String,
    pub clusters: Vec<ClusterId>,
    /// The index of the spec it came from (its wait, approval and failure bound).
    pub spec: usize,
}

/// The stages in order, each placed cluster in exactly one; stages that take no cluster are
/// left out. A cluster no stage takes goes in a last stage of its own, "unstaged".
pub fn plan(
    strategy: &Strategy,
    placed: &BTreeMap<ClusterId, BTreeMap<String, String>>,
) -> Vec<PlannedStage> {
    let mut left: BTreeSet<&ClusterId> = placed.keys().collect();
    let mut planned = Vec::new();
    for (index, spec) in strategy.stages.iter().enumerate() {
        let taken: Vec<ClusterId> = match &spec.clusters {
            StageClusters::Set(set) => left
                .iter()
                .filter(|c| {
                    set.names.iter().any(|n| n == c.as_str())
                        || set
                            .selector
                            .as_ref()
                            .is_some_and(|s| s.matches(&placed[**c]))
                })
                .map(|c| (*c).clone())
                .collect(),
            StageClusters::Rest { max_unavailable } => {
                let rest: Vec<ClusterId> = left.iter().map(|c| (*c).clone()).collect();
                let batch = batch_size(*max_unavailable, rest.len());
                let batches = rest.len().div_ceil(batch);
                for (k, chunk) in rest.chunks(batch).enumerate() {
                    planned.push(PlannedStage {
                        name: if batches > 1 {
                            format!("{} ({}/{batches})", spec.name, k + 1)
                        } else {
                            spec.name.clone()
                        },
                        clusters: chunk.to_vec(),
                        spec: index,
                    });
                }
                left.clear();
                continue;
            }
        };
        for c in &taken {
            left.remove(c);
        }
        if !taken.is_empty() {
            planned.push(PlannedStage {
                name: spec.name.clone(),
                clusters: taken,
                spec: index,
            });
        }
    }
    if !left.is_empty() {
        planned.push(PlannedStage {
            name: "unstaged".into(),
            clusters: left.into_iter().cloned().collect(),
            spec: usize::MAX,
        });
    }
    planned
}

fn batch_size(amount: Amount, of: usize) -> usize {
    let n = match amount {
        Amount::Count(n) => n as usize,
        Amount::Percent(p) => (of * p as usize).div_ceil(100),
    };
    n.max(1)
}

/// Where a rollout is. Serialized onto the hub (policy status or the state dir).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// The template generation being rolled out, and the one it replaces (equal when only
    /// the override rules a member receives changed).
    pub generation: i64,
    pub previous: i64,
    /// The planned stage being worked on (== the number of stages: every stage done).
    pub stage: usize,
    pub phase: Phase,
    /// When `phase` began, in seconds on the caller's clock (persisted: a new leader keeps the
    /// waits already served).
    pub since: u64,
    /// Failures counted in the current stage.
    pub failures: u32,
    /// The stages an operator approved.
    pub approved: BTreeSet<usize>,
    /// Why the rollout stopped, while it is Paused.
    pub paused: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Phase {
    Approval,
    Draining,
    Applying,
    Restoring,
    Verifying,
    /// The stages reached get the previous generation again.
    RollingBack,
    Done,
    RolledBack,
}

impl Progress {
    pub fn start(generation: i64, previous: i64, now: u64) -> Self {
        Self {
            generation,
            previous,
            stage: 0,
            phase: Phase::Approval,
            since: now,
            failures: 0,
            approved: BTreeSet::new(),
            paused: None,
        }
    }

    pub fn finished(&self) -> bool {
        matches!(self.phase, Phase::Done | Phase::RolledBack)
    }
}

/// Which of a rollout's two revisions a copy is, or must be: the one rolling out, or the one
/// it replaces. A revision is what a member receives — the template's generation and the
/// override rules applied there — so an OverridePolicy edit rolls out like a template edit;
/// the caller tells them apart, the machine only needs to know which side a copy is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Revision {
    New,
    Previous,
}

/// What the members and the gate say at this instant.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// The revision each cluster's copy is ready at (absent: not ready, at neither, or no
    /// copy).
    pub ready_at: BTreeMap<ClusterId, Revision>,
    /// The gate's verdict over the current stage (None: no gate configured).
    pub gate: Option<Gate>,
    /// For each group of clients, the clusters that carry its traffic now: a stage may not
    /// drain the last of them.
    pub serving: BTreeMap<String, BTreeSet<ClusterId>>,
    /// The clusters the published traffic decision holds out now (None: it follows the
    /// actions at once). A stage's wait to drain counts from when all of it is out, and its
    /// traffic is back only once none of it is.
    pub drained: Option<BTreeSet<ClusterId>>,
}

impl Observed {
    fn all_drained(&self, clusters: &[ClusterId]) -> bool {
        self.drained
            .as_ref()
            .is_none_or(|d| clusters.iter().all(|c| d.contains(c)))
    }

    fn none_drained(&self, clusters: &[ClusterId]) -> bool {
        self.drained
            .as_ref()
            .is_none_or(|d| !clusters.iter().any(|c| d.contains(c)))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    Holds,
    Fails,
    /// No verdict yet (the query has not answered): the wait goes on.
    Pending,
}

/// What an operator asked since the last step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Approve,
    Pause,
    /// A pause that says who asked (the annotation's, which only its removal lifts).
    PauseBy(&'static str),
    Resume,
    Abort,
}

/// What the writer and the traffic decision do at this instant.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Actions {
    /// The revision each cluster's copy must be (absent: left as it is — a stage not
    /// reached keeps the previous revision it holds).
    pub revision: BTreeMap<ClusterId, Revision>,
    /// Clusters out of the traffic decision of the governed Services.
    pub drained: BTreeSet<ClusterId>,
    /// Clusters whose traffic is coming back, at this percent of their weight.
    pub ramping: BTreeMap<ClusterId, u32>,
}

/// One step of the machine: the progress after `commands` and `observed` at `now`, and what
/// must hold meanwhile. Steps until nothing changes, so one call settles what can be settled
/// at this instant.
pub fn step(
    strategy: &Strategy,
    stages: &[PlannedStage],
    progress: &Progress,
    commands: &[Command],
    observed: &Observed,
    now: u64,
) -> (Progress, Actions) {
    let mut p = progress.clone();
    for command in commands {
        obey(&mut p, *command, now);
    }
    // Each transition moves forward (stage, phase order), so this ends; a failure ends the
    // step, so one observation counts once.
    loop {
        let next = advance(strategy, stages, &p, observed, now);
        let counted = next.failures > p.failures;
        if next == p {
            break;
        }
        p = next;
        if counted {
            break;
        }
    }
    let actions = actions(strategy, stages, &p, now);
    (p, actions)
}

fn obey(p: &mut Progress, command: Command, now: u64) {
    match command {
        Command::Approve => {
            p.approved.insert(p.stage);
        }
        Command::Pause if !p.finished() => p.paused = Some("paused by an operator".into()),
        Command::PauseBy(who) if !p.finished() => p.paused = Some(who.into()),
        // A failure pause starts the stage's failure count afresh.
        Command::Resume if p.paused.take().is_some() => {
            p.failures = 0;
            p.since = now;
        }
        Command::Abort if !p.finished() && p.phase != Phase::RollingBack => {
            p.paused = None;
            enter(p, Phase::RollingBack, now);
        }
        _ => {}
    }
}

fn enter(p: &mut Progress, phase: Phase, now: u64) {
    p.phase = phase;
    p.since = now;
}

fn advance(
    strategy: &Strategy,
    stages: &[PlannedStage],
    p: &Progress,
    o: &Observed,
    now: u64,
) -> Progress {
    let mut p = p.clone();
    if p.paused.is_some() || p.finished() {
        return p;
    }
    if p.phase == Phase::RollingBack {
        let reached = reached(stages, &p);
        if reached
            .iter()
            .all(|c| o.ready_at.get(*c) == Some(&Revision::Previous))
        {
            enter(&mut p, Phase::RolledBack, now);
        }
        return p;
    }
    let Some(stage) = stages.get(p.stage) else {
        enter(&mut p, Phase::Done, now);
        return p;
    };
    let spec = strategy.stages.get(stage.spec);
    let elapsed = now.saturating_sub(p.since);
    let all_ready = stage
        .clusters
        .iter()
        .all(|c| o.ready_at.get(c) == Some(&Revision::New));
    match p.phase {
        Phase::Approval => {
            if spec.is_some_and(|s| s.approval_required) && !p.approved.contains(&p.stage) {
                return p;
            }
            if strategy.traffic == TrafficDuring::Keep {
                enter(&mut p, Phase::Applying, now);
            } else if let Some(client) = left_without_traffic(stage, o) {
                p.paused = Some(format!(
                    "stage {:?} would drain every cluster with traffic for clients {client}",
                    stage.name
                ));
            } else {
                enter(&mut p, Phase::Draining, now);
            }
        }
        Phase::Draining => {
            if !o.all_drained(&stage.clusters) {
                p.since = now;
            } else if elapsed >= strategy.drain_seconds {
                enter(&mut p, Phase::Applying, now);
            }
        }
        Phase::Applying => {
            if all_ready {
                let next = if strategy.traffic == TrafficDuring::Drain {
                    Phase::Restoring
                } else {
                    Phase::Verifying
                };
                enter(&mut p, next, now);
            } else if elapsed >= strategy.progress_deadline_seconds {
                let late = stage
                    .clusters
                    .iter()
                    .filter(|c| o.ready_at.get(*c) != Some(&Revision::New))
                    .count();
                fail(
                    strategy,
                    spec,
                    &mut p,
                    late as u32,
                    "not ready at the new generation in time",
                    now,
                );
            }
        }
        Phase::Restoring => {
            if elapsed >= strategy.ramp_seconds && o.none_drained(&stage.clusters) {
                enter(&mut p, Phase::Verifying, now);
            }
        }
        Phase::Verifying => {
            let wait = spec.map_or(0, |s| s.wait_seconds);
            if !all_ready {
                fail(strategy, spec, &mut p, 1, "a copy stopped being ready", now);
                // Within the bound the stage waits for readiness again, out of traffic.
                if p.paused.is_none() && p.phase == Phase::Verifying {
                    enter(&mut p, Phase::Applying, now);
                }
            } else if o.gate == Some(Gate::Fails) {
                fail(strategy, spec, &mut p, 1, "the gate failed", now);
            } else if elapsed >= wait && o.gate != Some(Gate::Pending) {
                p.stage += 1;
                p.failures = 0;
                enter(&mut p, Phase::Approval, now);
            }
        }
        Phase::RollingBack | Phase::Done | Phase::RolledBack => {}
    }
    p
}

/// Counts failures; past the stage's bound the rollout pauses or rolls back. Under it, the
/// phase starts over (a late copy gets another deadline; a gate is asked again).
fn fail(
    strategy: &Strategy,
    spec: Option<&StageSpec>,
    p: &mut Progress,
    count: u32,
    why: &str,
    now: u64,
) {
    p.failures += count;
    let bound = spec.map_or(0, |s| s.max_failures);
    if p.failures <= bound {
        p.since = now;
        return;
    }
    match strategy.on_failure {
        OnFailure::Pause => {
            p.paused = Some(format!(
                "stage {}: {why} ({} failure(s), at most {bound})",
                p.stage + 1,
                p.failures
            ))
        }
        OnFailure::Rollback => enter(p, Phase::RollingBack, now),
    }
}

/// A client group whose every serving cluster is in `stage` (named by its key).
fn left_without_traffic<'a>(stage: &PlannedStage, o: &'a Observed) -> Option<&'a str> {
    o.serving
        .iter()
        .find(|(_, clusters)| {
            !clusters.is_empty() && clusters.iter().all(|c| stage.clusters.contains(c))
        })
        .map(|(client, _)| client.as_str())
}

/// The clusters of the stages the rollout reached (changed or changing).
fn reached<'a>(stages: &'a [PlannedStage], p: &Progress) -> Vec<&'a ClusterId> {
    let upto = (p.stage + 1).min(stages.len());
    stages[..upto].iter().flat_map(|s| &s.clusters).collect()
}

fn actions(strategy: &Strategy, stages: &[PlannedStage], p: &Progress, now: u64) -> Actions {
    let mut a = Actions::default();
    if p.phase == Phase::RollingBack || p.phase == Phase::RolledBack {
        for c in reached(stages, p) {
            a.revision.insert(c.clone(), Revision::Previous);
            // Traffic comes back to a cluster once it is at the previous generation again:
            // while rolling back, the stage that was drained stays drained.
            if p.phase == Phase::RollingBack
                && stages.get(p.stage).is_some_and(|s| s.clusters.contains(c))
                && strategy.traffic == TrafficDuring::Drain
            {
                a.drained.insert(c.clone());
            }
        }
        return a;
    }
    for (i, stage) in stages.iter().enumerate() {
        let current = i == p.stage;
        let done = i < p.stage || p.phase == Phase::Done;
        let applying = current
            && matches!(
                p.phase,
                Phase::Applying | Phase::Restoring | Phase::Verifying
            );
        for c in &stage.clusters {
            if done || applying {
                a.revision.insert(c.clone(), Revision::New);
            }
            if current
                && matches!(p.phase, Phase::Draining | Phase::Applying)
                && strategy.traffic == TrafficDuring::Drain
            {
                a.drained.insert(c.clone());
            }
            if current && p.phase == Phase::Restoring && strategy.ramp_seconds > 0 {
                let share = now.saturating_sub(p.since) * 100 / strategy.ramp_seconds;
                a.ramping.insert(c.clone(), (share as u32).clamp(1, 100));
            }
        }
    }
    a
}

#[cfg(test)]
mod tests;
