//! The stage machine as named cases on a fake clock: three members m1 (canary), m2, m3.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::selector::LabelSelector;

fn id(name: &str) -> ClusterId {
    ClusterId::new(name)
}

fn ids(names: &[&str]) -> BTreeSet<ClusterId> {
    names.iter().map(|n| id(n)).collect()
}

fn names(names: &[&str]) -> StageClusters {
    StageClusters::Set(ClusterSet {
        names: names.iter().map(|n| n.to_string()).collect(),
        selector: None,
    })
}

fn stage(name: &str, clusters: StageClusters) -> StageSpec {
    StageSpec {
        name: name.into(),
        clusters,
        wait_seconds: 0,
        approval_required: false,
        max_failures: 0,
    }
}

/// Canary m1, then the rest at once.
fn strategy() -> Strategy {
    Strategy {
        stages: vec![
            StageSpec {
                wait_seconds: 60,
                ..stage("canary", names(&["m1"]))
            },
            stage(
                "rest",
                StageClusters::Rest {
                    max_unavailable: Amount::Percent(100),
                },
            ),
        ],
        traffic: TrafficDuring::Drain,
        drain_seconds: 10,
        ramp_seconds: 0,
        progress_deadline_seconds: 300,
        on_failure: OnFailure::Pause,
        analysis: None,
        control: Control::default(),
    }
}

fn placed(names: &[(&str, &str)]) -> BTreeMap<ClusterId, BTreeMap<String, String>> {
    names
        .iter()
        .map(|(n, region)| {
            (
                id(n),
                BTreeMap::from([("region".to_string(), region.to_string())]),
            )
        })
        .collect()
}

/// A rollout of generation 2 over generation 1, driven one instant at a time.
struct Run {
    strategy: Strategy,
    stages: Vec<PlannedStage>,
    progress: Progress,
    observed: Observed,
    now: u64,
}

impl Run {
    fn new(strategy: Strategy) -> Self {
        let stages = plan(
            &strategy,
            &placed(&[("m1", "eu"), ("m2", "eu"), ("m3", "us")]),
        );
        let mut observed = Observed::default();
        for c in ["m1", "m2", "m3"] {
            observed.ready_at.insert(id(c), Revision::Previous);
        }
        // eu's clients are served by m1 and m2, us's by m3 and m1.
        observed.serving.insert("eu".into(), ids(&["m1", "m2"]));
        observed.serving.insert("us".into(), ids(&["m3", "m1"]));
        Self {
            strategy,
            stages,
            progress: Progress::start(2, 1, 1000),
            observed,
            now: 1000,
        }
    }

    /// `seconds` later, with these commands: the actions that hold then.
    fn at(&mut self, seconds: u64, commands: &[Command]) -> Actions {
        self.now += seconds;
        let (progress, actions) = step(
            &self.strategy,
            &self.stages,
            &self.progress,
            commands,
            &self.observed,
            self.now,
        );
        self.progress = progress;
        actions
    }

    /// The members converge on what the last actions asked for.
    fn members_apply(&mut self, actions: &Actions) {
        for (c, revision) in &actions.revision {
            self.observed.ready_at.insert(c.clone(), *revision);
        }
    }

    fn phase(&self) -> (usize, Phase) {
        (self.progress.stage, self.progress.phase)
    }
}

/// The generation each copy must be: 2 is the new revision, 1 the previous.
fn generations(a: &Actions) -> Vec<(String, i64)> {
    a.revision
        .iter()
        .map(|(c, r)| (c.to_string(), if *r == Revision::New { 2 } else { 1 }))
        .collect()
}

#[test]
fn plan_takes_each_cluster_once_in_stage_order_and_batches_the_rest() {
    let mut s = strategy();
    s.stages.insert(
        1,
        stage(
            "eu",
            StageClusters::Set(ClusterSet {
                names: Vec::new(),
                selector: Some(LabelSelector {
                    match_labels: BTreeMap::from([("region".into(), "eu".into())]),
                    ..Default::default()
                }),
            }),
        ),
    );
    s.stages[2].clusters = StageClusters::Rest {
        max_unavailable: Amount::Count(2),
    };
    let fleet = placed(&[
        ("m1", "eu"),
        ("m2", "eu"),
        ("m3", "us"),
        ("m4", "us"),
        ("m5", "us"),
    ]);
    let stages = plan(&s, &fleet);
    let shown: Vec<(String, Vec<String>)> = stages
        .iter()
        .map(|st| {
            (
                st.name.clone(),
                st.clusters.iter().map(|c| c.to_string()).collect(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        vec![
            ("canary".into(), vec!["m1".into()]),
            ("eu".into(), vec!["m2".into()]),
            ("rest (1/2)".into(), vec!["m3".into(), "m4".into()]),
            ("rest (2/2)".into(), vec!["m5".into()]),
        ]
    );
    // A cluster no stage takes is not forgotten: it goes last.
    s.stages.truncate(1);
    let stages = plan(&s, &fleet);
    assert_eq!(stages.last().unwrap().name, "unstaged");
    assert_eq!(stages.last().unwrap().clusters.len(), 4);
}

#[test]
fn a_stage_drains_then_changes_then_gets_its_traffic_back_then_waits() {
    let mut r = Run::new(strategy());
    // Start: m1's traffic leaves, nothing is written yet.
    let a = r.at(0, &[]);
    assert_eq!(r.phase(), (0, Phase::Draining));
    assert_eq!(a.drained, ids(&["m1"]));
    assert!(a.revision.is_empty(), "{a:?}");
    // Within drainSeconds nothing changes.
    assert_eq!(r.at(9, &[]).revision.len(), 0);
    // Then m1 gets generation 2, still drained until it is ready at it.
    let a = r.at(1, &[]);
    assert_eq!(r.phase(), (0, Phase::Applying));
    assert_eq!(generations(&a), vec![("m1".into(), 2)]);
    assert_eq!(a.drained, ids(&["m1"]));
    r.members_apply(&a);
    // Ready: traffic back at once (no ramp), then waitSeconds (60) before the next stage.
    let a = r.at(1, &[]);
    assert_eq!(r.phase(), (0, Phase::Verifying));
    assert!(a.drained.is_empty());
    r.at(59, &[]);
    assert_eq!(r.phase(), (0, Phase::Verifying));
    // The rest: m2 and m3 drained together, m1 keeps generation 2.
    let a = r.at(1, &[]);
    assert_eq!(r.phase(), (1, Phase::Draining));
    assert_eq!(a.drained, ids(&["m2", "m3"]));
    assert_eq!(generations(&a), vec![("m1".into(), 2)]);
    let a = r.at(10, &[]);
    assert_eq!(
        generations(&a),
        vec![("m1".into(), 2), ("m2".into(), 2), ("m3".into(), 2)]
    );
    r.members_apply(&a);
    let a = r.at(1, &[]);
    assert_eq!(r.phase(), (2, Phase::Done));
    assert!(a.drained.is_empty() && a.revision.len() == 3);
}

#[test]
fn an_approval_holds_its_stage_until_approved() {
    let mut s = strategy();
    s.stages[1].approval_required = true;
    s.stages[0].wait_seconds = 0;
    let mut r = Run::new(s);
    r.at(0, &[]);
    let a = r.at(10, &[]);
    r.members_apply(&a);
    r.at(1, &[]);
    assert_eq!(r.phase(), (1, Phase::Approval));
    // An hour later it still waits, and nothing of stage 2 is drained or written.
    let a = r.at(3600, &[]);
    assert_eq!(r.phase(), (1, Phase::Approval));
    assert!(a.drained.is_empty() && generations(&a) == vec![("m1".into(), 2)]);
    r.at(1, &[Command::Approve]);
    assert_eq!(r.phase(), (1, Phase::Draining));
}

#[test]
fn keep_traffic_changes_copies_without_draining() {
    let mut s = strategy();
    s.traffic = TrafficDuring::Keep;
    let mut r = Run::new(s);
    let a = r.at(0, &[]);
    assert_eq!(r.phase(), (0, Phase::Applying));
    assert!(a.drained.is_empty());
    assert_eq!(generations(&a), vec![("m1".into(), 2)]);
    r.members_apply(&a);
    r.at(1, &[]);
    assert_eq!(r.phase(), (0, Phase::Verifying));
}

#[test]
fn traffic_ramps_back_over_ramp_seconds() {
    let mut s = strategy();
    s.ramp_seconds = 100;
    let mut r = Run::new(s);
    r.at(0, &[]);
    let a = r.at(10, &[]);
    r.members_apply(&a);
    let a = r.at(1, &[]);
    assert_eq!(r.phase(), (0, Phase::Restoring));
    assert_eq!(a.ramping, BTreeMap::from([(id("m1"), 1)]));
    assert_eq!(r.at(25, &[]).ramping, BTreeMap::from([(id("m1"), 25)]));
    assert_eq!(r.at(50, &[]).ramping, BTreeMap::from([(id("m1"), 75)]));
    let a = r.at(25, &[]);
    assert_eq!(r.phase(), (0, Phase::Verifying));
    assert!(a.ramping.is_empty() && a.drained.is_empty());
}

#[test]
fn a_copy_late_past_the_deadline_pauses_the_rollout_and_says_why() {
    let mut r = Run::new(strategy());
    r.at(0, &[]);
    r.at(10, &[]);
    // m1 never becomes ready at generation 2.
    let a = r.at(299, &[]);
    assert_eq!(r.phase(), (0, Phase::Applying));
    assert_eq!(a.drained, ids(&["m1"]), "a late copy stays drained");
    let a = r.at(1, &[]);
    let why = r.progress.paused.clone().expect("paused");
    assert!(
        why.contains("not ready at the new generation in time") && why.contains("at most 0"),
        "{why}"
    );
    // Paused: nothing moves, m1 stays out of traffic, generation 2 stays written there.
    assert_eq!(a.drained, ids(&["m1"]));
    r.at(3600, &[]);
    assert_eq!(r.phase(), (0, Phase::Applying));
    // Fixed in the member, then resumed: on it goes.
    r.observed.ready_at.insert(id("m1"), Revision::New);
    r.at(1, &[Command::Resume]);
    assert_eq!(r.phase(), (0, Phase::Verifying));
    assert_eq!(r.progress.paused, None);
}

#[test]
fn failures_within_max_failures_get_another_deadline() {
    let mut s = strategy();
    s.stages[0].max_failures = 1;
    let mut r = Run::new(s);
    r.at(0, &[]);
    r.at(10, &[]);
    r.at(300, &[]);
    assert_eq!(
        (r.progress.failures, r.progress.paused.is_some()),
        (1, false)
    );
    r.at(299, &[]);
    assert_eq!(r.progress.failures, 1, "one observation counts once");
    r.at(1, &[]);
    assert!(r.progress.paused.is_some());
}

#[test]
fn a_failing_gate_with_rollback_returns_the_stages_reached_to_the_previous_generation() {
    let mut s = strategy();
    s.on_failure = OnFailure::Rollback;
    let mut r = Run::new(s);
    r.observed.gate = Some(Gate::Pending);
    r.at(0, &[]);
    let a = r.at(10, &[]);
    r.members_apply(&a);
    r.at(1, &[]);
    assert_eq!(r.phase(), (0, Phase::Verifying));
    // A pending gate holds the stage past its wait.
    r.at(120, &[]);
    assert_eq!(r.phase(), (0, Phase::Verifying));
    r.observed.gate = Some(Gate::Fails);
    let a = r.at(1, &[]);
    assert_eq!(r.phase(), (0, Phase::RollingBack));
    assert_eq!(generations(&a), vec![("m1".into(), 1)]);
    assert_eq!(
        a.drained,
        ids(&["m1"]),
        "out of traffic until it is back at generation 1"
    );
    r.members_apply(&a);
    let a = r.at(1, &[]);
    assert_eq!(r.phase(), (0, Phase::RolledBack));
    assert!(a.drained.is_empty());
    assert_eq!(generations(&a), vec![("m1".into(), 1)]);
    // m2 and m3 were never touched.
    assert_eq!(r.observed.ready_at[&id("m2")], Revision::Previous);
}

#[test]
fn abort_rolls_back_and_pause_freezes_until_resume() {
    let mut r = Run::new(strategy());
    r.at(0, &[]);
    r.at(1, &[Command::Pause]);
    let a = r.at(100, &[]);
    assert_eq!(
        r.phase(),
        (0, Phase::Draining),
        "paused: the drain wait does not end"
    );
    assert!(a.revision.is_empty());
    r.at(1, &[Command::Resume]);
    let a = r.at(10, &[]);
    assert_eq!(r.phase(), (0, Phase::Applying));
    r.members_apply(&a);
    let a = r.at(1, &[Command::Abort]);
    assert_eq!(r.phase(), (0, Phase::RollingBack));
    assert_eq!(generations(&a), vec![("m1".into(), 1)]);
    r.members_apply(&a);
    r.at(1, &[]);
    assert_eq!(r.phase(), (0, Phase::RolledBack));
    // A finished rollout ignores further commands.
    r.at(1, &[Command::Pause, Command::Abort]);
    assert_eq!(
        (r.phase(), r.progress.paused.clone()),
        ((0, Phase::RolledBack), None)
    );
}

#[test]
fn a_stage_that_would_drain_every_cluster_of_a_client_pauses_and_says_so() {
    let mut r = Run::new(strategy());
    // us's clients have only m1.
    r.observed.serving.insert("us".into(), ids(&["m1"]));
    let a = r.at(0, &[]);
    assert_eq!(r.phase(), (0, Phase::Approval));
    assert!(a.drained.is_empty() && a.revision.is_empty());
    let why = r.progress.paused.clone().expect("paused");
    assert_eq!(
        why,
        "stage \"canary\" would drain every cluster with traffic for clients us"
    );
    // m3 serves us again: resume, and the stage drains.
    r.observed.serving.insert("us".into(), ids(&["m1", "m3"]));
    r.at(1, &[Command::Resume]);
    assert_eq!(r.phase(), (0, Phase::Draining));
}

#[test]
fn a_new_leader_resumes_from_the_kept_progress_without_rewriting_finished_stages() {
    let mut r = Run::new(strategy());
    r.at(0, &[]);
    let a = r.at(10, &[]);
    r.members_apply(&a);
    r.at(1, &[]);
    r.at(60, &[]);
    assert_eq!(r.phase(), (1, Phase::Draining));
    // The progress as the hub keeps it, read by another replica later.
    let kept = r.progress.clone();
    let mut next = Run::new(strategy());
    next.observed = r.observed.clone();
    next.progress = kept;
    next.now = r.now;
    let a = next.at(5, &[]);
    assert_eq!(
        next.phase(),
        (1, Phase::Draining),
        "the drain already served counts"
    );
    assert_eq!(
        generations(&a),
        vec![("m1".into(), 2)],
        "m1 is already at 2: nothing new"
    );
    next.at(5, &[]);
    assert_eq!(next.phase(), (1, Phase::Applying));
}

#[test]
fn a_copy_that_stops_being_ready_while_verifying_leaves_traffic_until_ready_again() {
    let mut s = strategy();
    s.stages[0].max_failures = 1;
    let mut r = Run::new(s);
    r.at(0, &[]);
    let a = r.at(10, &[]);
    r.members_apply(&a);
    r.at(1, &[]);
    assert_eq!(r.phase(), (0, Phase::Verifying));
    r.observed.ready_at.remove(&id("m1"));
    let a = r.at(30, &[]);
    assert_eq!((r.phase(), r.progress.failures), ((0, Phase::Applying), 1));
    assert_eq!(a.drained, ids(&["m1"]));
    // Ready again: traffic back, and the whole wait starts over.
    r.observed.ready_at.insert(id("m1"), Revision::New);
    let a = r.at(1, &[]);
    assert_eq!(r.phase(), (0, Phase::Verifying));
    assert!(a.drained.is_empty());
    r.at(59, &[]);
    assert_eq!(r.phase(), (0, Phase::Verifying));
    // A second time is past maxFailures: paused, and said why.
    r.observed.ready_at.remove(&id("m1"));
    r.at(1, &[]);
    let why = r.progress.paused.clone().expect("paused");
    assert!(
        why.contains("a copy stopped being ready (2 failure(s), at most 1)"),
        "{why}"
    );
}

#[test]
fn the_drain_wait_counts_from_when_the_published_decision_drains() {
    let mut r = Run::new(strategy());
    r.observed.drained = Some(BTreeSet::new());
    let a = r.at(0, &[]);
    assert_eq!(a.drained, ids(&["m1"]));
    // The published decision has not caught up: however long, m1's copy is not written.
    let a = r.at(30, &[]);
    assert_eq!(r.phase(), (0, Phase::Draining));
    assert!(a.revision.is_empty());
    // Drained from now: drainSeconds (10) more.
    r.observed.drained = Some(ids(&["m1"]));
    assert!(r.at(9, &[]).revision.is_empty());
    let a = r.at(1, &[]);
    assert_eq!(generations(&a), vec![("m1".into(), 2)]);
    r.members_apply(&a);
    // Ready: traffic asked back, but the stage waits until the decision has it back.
    let a = r.at(1, &[]);
    assert!(a.drained.is_empty());
    assert_eq!(r.phase(), (0, Phase::Restoring));
    r.observed.drained = Some(BTreeSet::new());
    r.at(1, &[]);
    assert_eq!(r.phase(), (0, Phase::Verifying));
}

#[test]
fn the_gate_query_names_the_stage_and_holds_while_no_sample_is_over_the_threshold() {
    let a = Analysis {
        prometheus_url: "http://127.0.0.1:9090".into(),
        query: r#"sum by (cluster) (rate(errors_total{cluster=~"$clusters"}[1m]))"#.into(),
        threshold: Threshold(0.5),
    };
    assert_eq!(
        a.query_for(&[id("m2"), id("eu.west")]),
        r#"sum by (cluster) (rate(errors_total{cluster=~"m2|eu\.west"}[1m]))"#
    );
    assert_eq!(a.judge(&[]), Gate::Holds, "no errors, no series");
    assert_eq!(a.judge(&[0.1, 0.5]), Gate::Holds);
    assert_eq!(a.judge(&[0.1, 0.6]), Gate::Fails);
    assert_eq!(
        a.judge(&[f64::NAN]),
        Gate::Holds,
        "a ratio over no requests"
    );
}

#[test]
fn annotations_pause_while_set_approve_stages_by_name_and_abort_a_generation() {
    let mut s = strategy();
    s.stages[1].approval_required = true;
    let mut r = Run::new(s);
    let control = Control {
        paused: true,
        ..Control::default()
    };
    let cmds = control.commands(&r.progress, &r.stages);
    assert_eq!(cmds, [Command::PauseBy(PAUSED_BY_ANNOTATION)]);
    r.at(0, &cmds);
    assert_eq!(r.progress.paused.as_deref(), Some(PAUSED_BY_ANNOTATION));
    // Still set: nothing more to say. Removed: resumed. An operator's pause is not lifted by it.
    assert!(control.commands(&r.progress, &r.stages).is_empty());
    let cmds = Control::default().commands(&r.progress, &r.stages);
    assert_eq!(cmds, [Command::Resume]);
    r.at(0, &cmds);
    r.at(0, &[Command::Pause]);
    assert!(
        Control::default()
            .commands(&r.progress, &r.stages)
            .is_empty()
    );
    r.at(0, &[Command::Resume]);
    // Canary through, then "rest" waits until the annotation names it.
    let a = r.at(10, &[]);
    r.members_apply(&a);
    r.at(1, &[]);
    r.at(60, &[]);
    assert_eq!(r.phase(), (1, Phase::Approval));
    let approving = Control {
        approved: ["rest".to_string()].into(),
        ..Control::default()
    };
    let cmds = approving.commands(&r.progress, &r.stages);
    assert_eq!(cmds, [Command::Approve]);
    r.at(0, &cmds);
    assert_eq!(r.phase(), (1, Phase::Draining));
    // An abort names the generation: another generation's abort does nothing.
    let other = Control {
        abort: Some(1),
        ..Control::default()
    };
    assert!(other.commands(&r.progress, &r.stages).is_empty());
    let this = Control {
        abort: Some(2),
        ..Control::default()
    };
    r.at(0, &this.commands(&r.progress, &r.stages));
    assert_eq!(r.phase(), (1, Phase::RollingBack));
    assert!(this.commands(&r.progress, &r.stages).is_empty());
}
