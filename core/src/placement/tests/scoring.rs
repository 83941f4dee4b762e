//! The score step: each plugin on fixtures, how they combine, how scores change decisions,
//! required workload terms, and the programs (a fake runner with canned answers).

use std::sync::Mutex;

use super::*;
use crate::model::Cost;
use crate::placement::score::{NEUTRAL, combine, relative_cheapness, resource_balance};
use crate::testing::{annotated, capacity, match_labels, tier};

// ---------------------------------------------------------------------------------------
// A fake program runner and readable views of the scores.

/// What the fake runner answers one program.
#[derive(Clone, Debug)]
enum Answer {
    /// Per cluster name; clusters not named get `Verdict::default()` (no score, kept).
    Verdicts(Vec<(&'static str, Verdict)>),
    Pending,
    Failed(&'static str),
    /// Exactly this, whatever the candidates (wrong counts, out-of-range scores).
    Raw(Judgement),
}

/// A [`Programs`] answering each program (by its display name) from a canned [`Answer`],
/// and recording the candidates it was asked about.
#[derive(Debug, Default)]
struct Canned {
    answers: Mutex<Vec<(String, Answer)>>,
    asked: Mutex<Vec<(String, Vec<String>)>>,
}

impl Canned {
    fn new(answers: Vec<(&str, Answer)>) -> Arc<Self> {
        Arc::new(Self {
            answers: Mutex::new(
                answers
                    .into_iter()
                    .map(|(p, a)| (p.to_owned(), a))
                    .collect(),
            ),
            asked: Mutex::default(),
        })
    }

    /// Answers `program` with `answer` from now on.
    fn set(&self, program: &str, answer: Answer) {
        let mut answers = self.answers.lock().expect("answers");
        answers.retain(|(p, _)| p != program);
        answers.push((program.to_owned(), answer));
    }

    /// The candidates of every question so far, by program.
    fn asked(&self) -> Vec<(String, Vec<String>)> {
        self.asked.lock().expect("asked").clone()
    }
}

impl Programs for Canned {
    fn judge(&self, program: &Program, _: &Template, candidates: &[ClusterInput<'_>]) -> Judgement {
        let name = program.to_string();
        let names: Vec<String> = candidates
            .iter()
            .map(|c| c.view.spec.id.as_str().to_owned())
            .collect();
        self.asked
            .lock()
            .expect("asked")
            .push((name.clone(), names.clone()));
        let answers = self.answers.lock().expect("answers");
        let answer = answers
            .iter()
            .find(|(p, _)| *p == name)
            .map(|(_, a)| a.clone())
            .unwrap_or_else(|| panic!("no canned answer for {name}"));
        match answer {
            Answer::Verdicts(by_name) => Judgement::Answered(
                names
                    .iter()
                    .map(|n| {
                        by_name
                            .iter()
                            .find(|(c, _)| c == n)
                            .map(|(_, v)| v.clone())
                            .unwrap_or_default()
                    })
                    .collect(),
            ),
            Answer::Pending => Judgement::Pending,
            Answer::Failed(why) => Judgement::Failed(why.to_owned()),
            Answer::Raw(j) => j,
        }
    }
}

fn scored(s: u32) -> Verdict {
    Verdict {
        rejected: None,
        score: Some(s),
    }
}

fn rejected(why: &str) -> Verdict {
    Verdict {
        rejected: Some(why.to_owned()),
        score: None,
    }
}

const HOOK: &str = "https://score.example/v1";

fn webhook(failure_policy: FailurePolicy) -> Arc<Webhook> {
    Arc::new(Webhook {
        url: HOOK.to_owned(),
        ca_bundle: None,
        timeout_millis: 500,
        failure_policy,
    })
}

fn script() -> Arc<Script> {
    Arc::new(Script {
        lua: "function score(c, w) return 50 end".into(),
    })
}

/// Only `plugin`, weighing 1.
fn only(plugin: Plugin) -> Scoring {
    Scoring {
        weights: vec![(plugin, 1)],
        ..Scoring::default()
    }
}

/// Duplicated with `scoring`.
fn duplicated(scoring: Scoring) -> PlacementPolicy {
    PlacementPolicy {
        scoring,
        ..PlacementPolicy::default()
    }
}

fn with(placement: PlacementPolicy, scoring: Scoring) -> PlacementPolicy {
    PlacementPolicy {
        scoring,
        ..placement
    }
}

fn spread_by(by: SpreadBy, max: u32) -> Vec<SpreadConstraint> {
    vec![SpreadConstraint {
        by,
        min_groups: 1,
        max_groups: Some(max),
    }]
}

/// Preferred cluster affinities: each `(clusters, weight)`.
fn prefer(terms: &[(&[&str], u32)]) -> Vec<PreferredAffinity> {
    terms
        .iter()
        .map(|(names, weight)| PreferredAffinity {
            clusters: ClusterSet {
                names: names.iter().map(|n| n.to_string()).collect(),
                selector: None,
            },
            weight: *weight,
        })
        .collect()
}

fn report(d: &Decision) -> &Scores {
    d.scores
        .as_deref()
        .unwrap_or_else(|| panic!("no scores: {d:?}"))
}

/// `plugin`'s score of every candidate, in name order.
fn plugin_scores(d: &Decision, plugin: Plugin) -> Vec<(&str, Option<u32>)> {
    let mut scores: Vec<_> = report(d)
        .order
        .iter()
        .map(|c| {
            let part = c
                .plugins
                .iter()
                .find(|s| s.plugin == plugin)
                .unwrap_or_else(|| panic!("{plugin} not scored: {c:?}"));
            (c.cluster.as_str(), part.score)
        })
        .collect();
    scores.sort();
    scores
}

/// `(cluster, combined score)`, best first.
fn ranking(d: &Decision) -> Vec<(&str, u32)> {
    report(d)
        .order
        .iter()
        .map(|c| (c.cluster.as_str(), c.total))
        .collect()
}

fn placed(d: &Decision) -> Vec<&str> {
    d.placed.iter().map(|p| p.cluster.as_str()).collect()
}

fn unschedulable_reason(d: &Decision) -> &str {
    match &d.outcome {
        Outcome::Unschedulable { reason } => reason,
        Outcome::Scheduled => panic!("scheduled: {d:?}"),
    }
}

/// Labels `app: <app>` on template `name`.
fn label(world: &mut World, name: &str, app: &str) {
    std::sync::Arc::make_mut(&mut world.template(name).labels).insert("app".into(), app.into());
}

// ---------------------------------------------------------------------------------------
// Each plugin.

struct BalanceCase {
    name: &'static str,
    capacity: Option<Capacity>,
    expect: Option<u32>,
}

/// `capacity` with ResourceQuotas in `namespace`: `(hard cpu millis, hard memory MiB, used cpu
/// millis, used memory MiB)` each.
fn with_quotas(mut c: Capacity, namespace: &str, quotas: &[(u64, u64, u64, u64)]) -> Capacity {
    let list = quotas
        .iter()
        .map(|&(cpu, mem, used_cpu, used_mem)| Quota {
            hard: Resources {
                cpu_millis: cpu,
                memory_bytes: mem << 20,
                ..Resources::default()
            },
            used: Resources {
                cpu_millis: used_cpu,
                memory_bytes: used_mem << 20,
                ..Resources::default()
            },
        })
        .collect();
    c.quotas = Arc::new(BTreeMap::from([(namespace.to_owned(), list)]));
    c
}

#[test]
fn resource_balance_is_the_free_share_after_one_more_replica() {
    // One replica requests 100m and 128 MiB.
    let per = deployment("web", Some(1)).requests;
    let cases = [
        BalanceCase {
            name: "no capacity reported: no data",
            capacity: None,
            expect: None,
        },
        BalanceCase {
            name: "nothing allocatable: no data",
            capacity: Some(Capacity::default()),
            expect: None,
        },
        BalanceCase {
            name: "a quarter used: cpu 72.5 %, memory 73.4 % free after the replica",
            capacity: Some(capacity(4000, 8192, 1000, 2048)),
            expect: Some(73),
        },
        BalanceCase {
            name: "empty and small: cpu 90 %, memory 87.5 %",
            capacity: Some(capacity(1000, 1024, 0, 0)),
            expect: Some(89),
        },
        BalanceCase {
            name: "full: 0, never below",
            capacity: Some(capacity(4000, 8192, 4000, 8192)),
            expect: Some(0),
        },
        BalanceCase {
            name: "over-committed: 0",
            capacity: Some(capacity(1000, 1024, 5000, 4096)),
            expect: Some(0),
        },
        BalanceCase {
            name: "no memory allocatable: cpu alone",
            capacity: Some(capacity(1000, 0, 500, 0)),
            expect: Some(40),
        },
        BalanceCase {
            name: "an empty node, a quota of 1 core and 1 GiB half used in shop: (90 + 87.5 + 40 + 37.5) / 4",
            capacity: Some(with_quotas(
                capacity(1000, 1024, 0, 0),
                "shop",
                &[(1000, 1024, 500, 512)],
            )),
            expect: Some(64),
        },
        BalanceCase {
            name: "the tightest of two quotas binds: cpu 0 % (full), memory 87.5 % of the looser",
            capacity: Some(with_quotas(
                capacity(1000, 1024, 0, 0),
                "shop",
                &[(1000, 0, 1000, 0), (0, 1024, 0, 0)],
            )),
            expect: Some(66),
        },
        BalanceCase {
            name: "a quota of another namespace does not count",
            capacity: Some(with_quotas(
                capacity(1000, 1024, 0, 0),
                "billing",
                &[(1000, 1024, 1000, 1024)],
            )),
            expect: Some(89),
        },
    ];
    for c in cases {
        assert_eq!(
            resource_balance(c.capacity.as_ref(), "shop", &per),
            c.expect,
            "{}",
            c.name
        );
    }
}

#[test]
fn resource_balance_in_a_decision_unknown_is_neutral_and_ties_go_by_name() {
    let world = World::new(&["a", "b", "c", "d"])
        .capacity("a", capacity(4000, 8192, 1000, 2048))
        .capacity("b", capacity(4000, 8192, 1000, 2048))
        .capacity("d", capacity(4000, 8192, 4000, 8192))
        .policy(vec![], duplicated(only(Plugin::ResourceBalance)))
        .deployment("web", Some(1));
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(
        plugin_scores(&d, Plugin::ResourceBalance),
        vec![
            ("a", Some(73)),
            ("b", Some(73)),
            ("c", None),
            ("d", Some(0))
        ]
    );
    assert_eq!(
        ranking(&d),
        vec![("a", 7300), ("b", 7300), ("c", NEUTRAL * 100), ("d", 0)],
        "c reports no capacity: neutral; a and b tie, in name order"
    );
    assert_eq!(
        placed(&d),
        vec!["a", "b", "c", "d"],
        "scores order, never overrule: Duplicated runs everywhere"
    );
}

struct CostCase {
    name: &'static str,
    /// Per cluster of eu-1, eu-2, us-1: `(cpuCoreHour, egressGiB, spotRatio)`; None: no cost.
    costs: [Option<(f64, f64, f64)>; 3],
    /// The template's `meridian.io/egress-gib-hour`.
    egress: Option<&'static str>,
    expect: [Option<u32>; 3],
}

#[test]
fn cost_scores_the_cheapest_100_and_the_dearest_0() {
    let cases = [
        CostCase {
            name: "linear between the cheapest and the dearest",
            costs: [
                Some((0.04, 0.0, 0.0)),
                Some((0.06, 0.0, 0.0)),
                Some((0.08, 0.0, 0.0)),
            ],
            egress: None,
            expect: [Some(100), Some(50), Some(0)],
        },
        CostCase {
            name: "all equal: all cheapest",
            costs: [Some((0.04, 0.0, 0.0)); 3],
            egress: None,
            expect: [Some(100); 3],
        },
        CostCase {
            name: "spot: all-spot us-1 costs 30 % (0.0024), half-spot eu-2 65 % (0.0039)",
            costs: [
                Some((0.04, 0.0, 0.0)),
                Some((0.06, 0.0, 0.5)),
                Some((0.08, 0.0, 1.0)),
            ],
            egress: None,
            expect: [Some(0), Some(6), Some(100)],
        },
        CostCase {
            name: "egress: us-1's clients are all in another region, eu-1's and eu-2's half",
            costs: [Some((0.04, 0.1, 0.0)); 3],
            egress: Some("10"),
            expect: [Some(100), Some(100), Some(0)],
        },
        CostCase {
            name: "egress priced but the template sends none (no annotation)",
            costs: [Some((0.04, 0.1, 0.0)); 3],
            egress: None,
            expect: [Some(100); 3],
        },
        CostCase {
            name: "a malformed egress annotation counts as none",
            costs: [Some((0.04, 0.1, 0.0)); 3],
            egress: Some("-3"),
            expect: [Some(100); 3],
        },
        CostCase {
            name: "egress against compute: us-1 is cheap to run but its traffic crosses regions",
            costs: [
                Some((0.08, 0.01, 0.0)),
                Some((0.08, 0.01, 0.0)),
                Some((0.04, 0.01, 0.0)),
            ],
            // eu: 0.008 + 0.01 × 1 × ½ = 0.013; us: 0.004 + 0.01 = 0.014.
            egress: Some("1"),
            expect: [Some(100), Some(100), Some(0)],
        },
        CostCase {
            name: "a cluster without spec.cost has no score",
            costs: [Some((0.04, 0.0, 0.0)), Some((0.08, 0.0, 0.0)), None],
            egress: None,
            expect: [Some(100), Some(0), None],
        },
        CostCase {
            name: "no cluster has a cost: no data",
            costs: [None; 3],
            egress: None,
            expect: [None; 3],
        },
    ];
    for c in cases {
        let mut world = World::new(&["eu-1", "eu-2", "us-1"])
            .policy(vec![], duplicated(only(Plugin::Cost)))
            .deployment("web", Some(1));
        for (name, cost) in ["eu-1", "eu-2", "us-1"].iter().zip(c.costs) {
            world.spec(name).cost =
                cost.map(|(cpu, egress, spot)| Cost::new(cpu, 0.0, egress, spot));
        }
        if let Some(egress) = c.egress {
            let t = world.template("web");
            *t = annotated(t.clone(), "meridian.io/egress-gib-hour", egress);
        }
        let d = world.decide(&mut Placer::new(), 0, "web");
        let expect: Vec<(&str, Option<u32>)> =
            ["eu-1", "eu-2", "us-1"].into_iter().zip(c.expect).collect();
        assert_eq!(plugin_scores(&d, Plugin::Cost), expect, "{}", c.name);
    }
}

#[test]
fn relative_cheapness_edges() {
    assert_eq!(relative_cheapness(&[]), Vec::<Option<u32>>::new());
    assert_eq!(relative_cheapness(&[None, None]), vec![None, None]);
    assert_eq!(
        relative_cheapness(&[Some(2.0), None]),
        vec![Some(100), None],
        "one known price is the cheapest"
    );
    assert_eq!(
        relative_cheapness(&[Some(1.0), Some(2.0), Some(4.0)]),
        vec![Some(100), Some(67), Some(0)]
    );
}

struct LocalityCase {
    name: &'static str,
    locality: DataLocality,
    /// `meridian.io/data-location` on the template.
    annotation: Option<&'static str>,
    /// Clusters labelled `data: here`.
    labelled: &'static [&'static str],
    expect: [Option<u32>; 4],
}

#[test]
fn data_locality_scores_holders_100_their_region_50() {
    const KEY: &str = "meridian.io/data-location";
    let from_annotation = || DataLocality {
        from_annotation: Some(KEY.into()),
        ..DataLocality::default()
    };
    let cases = [
        LocalityCase {
            name: "by name: eu-1 holds it, eu-2 is in its region",
            locality: DataLocality {
                cluster_names: vec!["eu-1".into()],
                ..DataLocality::default()
            },
            annotation: None,
            labelled: &[],
            expect: [Some(100), Some(50), Some(0), Some(0)],
        },
        LocalityCase {
            name: "by selector",
            locality: DataLocality {
                selector: Some(match_labels(&[("data", "here")])),
                ..DataLocality::default()
            },
            annotation: None,
            labelled: &["us-1"],
            expect: [Some(0), Some(0), Some(100), Some(50)],
        },
        LocalityCase {
            name: "annotation naming a region: all of it holds the data",
            locality: from_annotation(),
            annotation: Some("region=us"),
            labelled: &[],
            expect: [Some(0), Some(0), Some(100), Some(100)],
        },
        LocalityCase {
            name: "annotation with a name and a zone, spaces around the commas",
            locality: from_annotation(),
            annotation: Some("eu-2 , zone=us-2"),
            labelled: &[],
            expect: [Some(50), Some(100), Some(50), Some(100)],
        },
        LocalityCase {
            name: "the annotation configured, the template lacks it: unknown",
            locality: from_annotation(),
            annotation: None,
            labelled: &[],
            expect: [None; 4],
        },
        LocalityCase {
            name: "names a cluster not in the fleet: unknown",
            locality: DataLocality {
                cluster_names: vec!["ap-1".into()],
                ..DataLocality::default()
            },
            annotation: None,
            labelled: &[],
            expect: [None; 4],
        },
        LocalityCase {
            name: "names and annotation together",
            locality: DataLocality {
                cluster_names: vec!["us-2".into()],
                from_annotation: Some(KEY.into()),
                ..DataLocality::default()
            },
            annotation: Some("eu-1"),
            labelled: &[],
            expect: [Some(100), Some(50), Some(50), Some(100)],
        },
    ];
    for c in cases {
        let mut world = World::new(&["eu-1", "eu-2", "us-1", "us-2"])
            .policy(
                vec![],
                duplicated(Scoring {
                    data_locality: Some(c.locality.clone()),
                    ..Scoring::default()
                }),
            )
            .deployment("web", Some(1));
        for name in c.labelled {
            world.spec(name).labels.insert("data".into(), "here".into());
        }
        if let Some(value) = c.annotation {
            let t = world.template("web");
            *t = annotated(t.clone(), KEY, value);
        }
        let d = world.decide(&mut Placer::new(), 0, "web");
        let expect: Vec<(&str, Option<u32>)> = ["eu-1", "eu-2", "us-1", "us-2"]
            .into_iter()
            .zip(c.expect)
            .collect();
        assert_eq!(
            plugin_scores(&d, Plugin::DataLocality),
            expect,
            "{}",
            c.name
        );
    }
}

#[test]
fn cluster_affinity_is_the_share_of_preferred_weights() {
    let world = World::new(&["eu-1", "eu-2", "us-1"])
        .policy(
            vec![],
            duplicated(Scoring {
                preferred_affinities: prefer(&[(&["eu-1"], 3), (&["eu-1", "us-1"], 1)]),
                ..Scoring::default()
            }),
        )
        .deployment("web", Some(1));
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(
        plugin_scores(&d, Plugin::ClusterAffinity),
        vec![("eu-1", Some(100)), ("eu-2", Some(0)), ("us-1", Some(25))]
    );
    assert_eq!(
        ranking(&d),
        vec![("eu-1", 10_000), ("us-1", 2500), ("eu-2", 0)]
    );
}

#[test]
fn taint_toleration_scores_untolerated_prefer_no_schedule_0() {
    let mut world = World::new(&["eu-1", "eu-2", "us-1"])
        .policy(vec![], duplicated(only(Plugin::TaintToleration)))
        .deployment("web", Some(1));
    world
        .spec("eu-1")
        .taints
        .push(taint("busy", TaintEffect::PreferNoSchedule));
    world
        .spec("eu-2")
        .taints
        .push(taint("ok", TaintEffect::PreferNoSchedule));
    world.tolerate(vec![Toleration::exists(
        "ok",
        Some(TaintEffect::PreferNoSchedule),
    )]);
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(
        plugin_scores(&d, Plugin::TaintToleration),
        vec![("eu-1", Some(0)), ("eu-2", Some(100)), ("us-1", Some(100))]
    );
    assert_eq!(
        reason_of(&d, "eu-1"),
        PlacementFilter::PreferNoScheduleTaint("busy".into()),
        "still the tier's last resort"
    );
}

#[test]
fn preferred_workload_terms_count_for_and_against() {
    // db runs in eu-1, cache in us-1; web prefers db's zone (weight 2) and avoids cache's
    // region (weight 1).
    let mut world = World::new(&["eu-1", "eu-2", "us-1"])
        .policy(
            vec![],
            duplicated(Scoring {
                workload_affinity: vec![WorkloadTerm {
                    selector: match_labels(&[("app", "db")]),
                    topology: SpreadBy::Zone,
                    preferred: Some(2),
                }],
                workload_anti_affinity: vec![WorkloadTerm {
                    selector: match_labels(&[("app", "cache")]),
                    topology: SpreadBy::Region,
                    preferred: Some(1),
                }],
                ..Scoring::default()
            }),
        )
        .policy_for(
            "db",
            "db",
            vec![tier("db", &["eu-1"])],
            PlacementPolicy::default(),
        )
        .policy_for(
            "cache",
            "cache",
            vec![tier("cache", &["us-1"])],
            PlacementPolicy::default(),
        )
        .deployment("web", Some(1))
        .deployment("db", Some(1))
        .deployment("cache", Some(1));
    label(&mut world, "db", "db");
    label(&mut world, "cache", "cache");
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(
        plugin_scores(&d, Plugin::WorkloadAffinity),
        vec![
            // +2 of 3: (2 + 3) × 50 / 3.
            ("eu-1", Some(83)),
            // Neither applies.
            ("eu-2", Some(50)),
            // −1 of 3.
            ("us-1", Some(33)),
        ]
    );
}

// ---------------------------------------------------------------------------------------
// Combining the plugins.

struct WeightCase {
    name: &'static str,
    scoring: Scoring,
    /// The plugins that weigh anything.
    expect: &'static [(Plugin, u32)],
}

#[test]
fn default_weights_follow_what_the_policy_configures() {
    let preferred = |weight| WorkloadTerm {
        selector: match_labels(&[("app", "db")]),
        topology: SpreadBy::Zone,
        preferred: weight,
    };
    let cases = [
        WeightCase {
            name: "nothing configured: nothing weighs",
            scoring: Scoring::default(),
            expect: &[],
        },
        WeightCase {
            name: "dataLocality",
            scoring: Scoring {
                data_locality: Some(DataLocality::default()),
                ..Scoring::default()
            },
            expect: &[(Plugin::DataLocality, 1)],
        },
        WeightCase {
            name: "a preferred workload term",
            scoring: Scoring {
                workload_affinity: vec![preferred(Some(5))],
                ..Scoring::default()
            },
            expect: &[(Plugin::WorkloadAffinity, 1)],
        },
        WeightCase {
            name: "a preferred anti-affinity term",
            scoring: Scoring {
                workload_anti_affinity: vec![preferred(Some(5))],
                ..Scoring::default()
            },
            expect: &[(Plugin::WorkloadAffinity, 1)],
        },
        WeightCase {
            name: "required workload terms filter, they do not score",
            scoring: Scoring {
                workload_affinity: vec![preferred(None)],
                workload_anti_affinity: vec![preferred(None)],
                ..Scoring::default()
            },
            expect: &[],
        },
        WeightCase {
            name: "preferred cluster affinities, webhooks and a script",
            scoring: Scoring {
                preferred_affinities: prefer(&[(&["a"], 1)]),
                webhooks: vec![webhook(FailurePolicy::Ignore)],
                script: Some(script()),
                ..Scoring::default()
            },
            expect: &[
                (Plugin::ClusterAffinity, 1),
                (Plugin::Webhook, 1),
                (Plugin::Script, 1),
            ],
        },
        WeightCase {
            name: "a scoring list replaces the defaults: unlisted plugins weigh 0",
            scoring: Scoring {
                weights: vec![(Plugin::Cost, 2), (Plugin::ResourceBalance, 1)],
                data_locality: Some(DataLocality::default()),
                ..Scoring::default()
            },
            expect: &[(Plugin::ResourceBalance, 1), (Plugin::Cost, 2)],
        },
        WeightCase {
            name: "a list of zeros weighs nothing",
            scoring: Scoring {
                weights: vec![(Plugin::Cost, 0)],
                data_locality: Some(DataLocality::default()),
                ..Scoring::default()
            },
            expect: &[],
        },
    ];
    for c in cases {
        let weighs: Vec<(Plugin, u32)> = Plugin::ALL
            .into_iter()
            .map(|p| (p, c.scoring.weight(p)))
            .filter(|(_, w)| *w > 0)
            .collect();
        assert_eq!(weighs, c.expect, "{}", c.name);
        assert_eq!(c.scoring.scores(), !c.expect.is_empty(), "{}", c.name);
    }
}

#[test]
fn combine_is_the_weighted_mean_in_hundredths() {
    let part = |plugin, weight, score| PluginScore {
        plugin,
        weight,
        score,
    };
    let cases: [(&str, Vec<PluginScore>, u32); 6] = [
        ("nothing weighs: 0", vec![], 0),
        (
            "one plugin: its score × 100",
            vec![part(Plugin::Cost, 1, Some(73))],
            7300,
        ),
        (
            "weights: (1 × 100 + 3 × 0) / 4",
            vec![
                part(Plugin::Cost, 1, Some(100)),
                part(Plugin::DataLocality, 3, Some(0)),
            ],
            2500,
        ),
        (
            "hundredths keep what whole points would round away: (33 + 2 × 67) / 3",
            vec![
                part(Plugin::Cost, 1, Some(33)),
                part(Plugin::DataLocality, 2, Some(67)),
            ],
            5566,
        ),
        (
            "no data counts as neutral",
            vec![
                part(Plugin::Cost, 1, None),
                part(Plugin::DataLocality, 1, Some(100)),
            ],
            7500,
        ),
        (
            "a score above 100 counts as 100",
            vec![part(Plugin::Cost, 1, Some(140))],
            10_000,
        ),
    ];
    for (name, parts, expect) in cases {
        assert_eq!(combine(&parts), expect, "{name}");
    }
}

#[test]
fn weights_combine_in_a_decision() {
    // Cost (weight 3) favours eu-1, ClusterAffinity (weight 1) us-1.
    let mut world = World::new(&["eu-1", "eu-2", "us-1"])
        .policy(
            vec![],
            duplicated(Scoring {
                weights: vec![(Plugin::Cost, 3), (Plugin::ClusterAffinity, 1)],
                preferred_affinities: prefer(&[(&["us-1"], 1)]),
                ..Scoring::default()
            }),
        )
        .deployment("web", Some(1));
    for (name, price) in [("eu-1", 0.04), ("eu-2", 0.06), ("us-1", 0.08)] {
        world.spec(name).cost = Some(Cost::new(price, 0.0, 0.0, 0.0));
    }
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(
        ranking(&d),
        vec![("eu-1", 7500), ("eu-2", 3750), ("us-1", 2500)]
    );
    let eu1 = &report(&d).order[0];
    assert_eq!(
        eu1.plugins,
        vec![
            PluginScore {
                plugin: Plugin::Cost,
                weight: 3,
                score: Some(100)
            },
            PluginScore {
                plugin: Plugin::ClusterAffinity,
                weight: 1,
                score: Some(0)
            },
        ]
    );
}

// ---------------------------------------------------------------------------------------
// How scores change decisions.

#[test]
fn max_groups_keeps_the_best_scored_groups() {
    let prefer_us = || Scoring {
        preferred_affinities: prefer(&[(&["us-1"], 2), (&["eu-2"], 1)]),
        ..Scoring::default()
    };
    let world = |spread: Vec<SpreadConstraint>, scoring: Scoring| {
        World::new(&["eu-1", "eu-2", "us-1"])
            .policy(
                vec![],
                PlacementPolicy {
                    spread,
                    scoring,
                    ..PlacementPolicy::default()
                },
            )
            .deployment("web", Some(1))
    };
    let cases = [
        (
            "unscored: clusters in name order",
            spread_by(SpreadBy::Cluster, 2),
            Scoring::default(),
            vec!["eu-1", "eu-2"],
        ),
        (
            "scored: the two best clusters",
            spread_by(SpreadBy::Cluster, 2),
            prefer_us(),
            vec!["eu-2", "us-1"],
        ),
        (
            "unscored: the region with more clusters",
            spread_by(SpreadBy::Region, 1),
            Scoring::default(),
            vec!["eu-1", "eu-2"],
        ),
        (
            "scored: the best-scored region",
            spread_by(SpreadBy::Region, 1),
            Scoring {
                preferred_affinities: prefer(&[(&["us-1"], 1)]),
                ..Scoring::default()
            },
            vec!["us-1"],
        ),
    ];
    for (name, spread, scoring, expect) in cases {
        let d = world(spread, scoring).decide(&mut Placer::new(), 0, "web");
        assert_eq!(placed(&d), expect, "{name}");
        assert!(
            d.excluded
                .iter()
                .all(|e| e.reason == PlacementFilter::SpreadMaxGroups),
            "{name}: {d:?}"
        );
    }
}

#[test]
fn aggregated_fills_the_best_scored_cluster_first_and_stays() {
    let preferring = |cluster: &'static str| Scoring {
        preferred_affinities: prefer(&[(&[cluster], 1)]),
        ..Scoring::default()
    };
    let mut world = World::new(&["a", "b", "c"])
        .pods(&[10, 12, 10])
        .policy(vec![], with(divided(Division::Aggregated), preferring("c")))
        .deployment("web", Some(4));
    let mut placer = Placer::new();
    let d = world.decide(&mut placer, 0, "web");
    assert_eq!(
        counts(&d),
        vec![("c", 4)],
        "the best-scored, not the roomiest (b)"
    );
    // The preference moves to a: the replicas stay where they are.
    world.placement("p").scoring = preferring("a");
    let d = world.decide(&mut placer, 1, "web");
    assert_eq!(counts(&d), vec![("c", 4)], "steady on a later round");
    // A scale-up beyond c's room (10, its own 4 included) adds the best-scored, a.
    world.replicas("web", 20);
    let d = world.decide(&mut placer, 2, "web");
    assert_eq!(counts(&d), vec![("a", 10), ("c", 10)]);
}

#[test]
fn division_ties_go_to_the_higher_score() {
    let preferring = |cluster: &'static str| Scoring {
        preferred_affinities: prefer(&[(&[cluster], 1)]),
        ..Scoring::default()
    };
    for favourite in ["a", "b"] {
        for (name, placement) in [
            ("weights 1:1", divided(Division::Weights(Vec::new()))),
            ("equal capacity", divided(Division::AvailableCapacity)),
        ] {
            let world = World::new(&["a", "b"])
                .pods(&[5, 5])
                .policy(vec![], with(placement, preferring(favourite)))
                .deployment("web", Some(3));
            let d = world.decide(&mut Placer::new(), 0, "web");
            let more = d
                .placed
                .iter()
                .find(|p| p.replicas == Some(2))
                .map(|p| p.cluster.as_str());
            assert_eq!(
                more,
                Some(favourite),
                "{name}, {favourite} preferred: {d:?}"
            );
        }
    }
}

/// Placements to compare scored and unscored decisions on: fleet eu-1, eu-2, us-1 with
/// 1, 1 and 10 free pods.
fn placements() -> Vec<(&'static str, PlacementPolicy, Option<u32>)> {
    vec![
        ("duplicated", PlacementPolicy::default(), Some(2)),
        ("placed whole", PlacementPolicy::default(), None),
        ("weights", weights(&[(&["us-1"], 3)]), Some(7)),
        (
            "capacity, one region",
            PlacementPolicy {
                spread: spread_by(SpreadBy::Region, 1),
                ..divided(Division::AvailableCapacity)
            },
            Some(3),
        ),
        ("aggregated", divided(Division::Aggregated), Some(2)),
        (
            "aggregated, one region",
            PlacementPolicy {
                spread: spread_by(SpreadBy::Region, 1),
                ..divided(Division::Aggregated)
            },
            Some(3),
        ),
        (
            "duplicated, two clusters",
            PlacementPolicy {
                spread: spread_by(SpreadBy::Cluster, 2),
                ..PlacementPolicy::default()
            },
            Some(1),
        ),
    ]
}

fn compare_world(placement: PlacementPolicy, replicas: Option<u32>) -> World {
    let mut world = World::new(&["eu-1", "eu-2", "us-1"])
        .pods(&[1, 1, 10])
        .policy(vec![tier("all", &["eu-1", "eu-2", "us-1"])], placement)
        .deployment("web", replicas);
    world
        .spec("eu-2")
        .labels
        .insert("data".into(), "here".into());
    world
}

#[test]
fn a_policy_that_weighs_nothing_decides_exactly_as_before() {
    let weighs_nothing = Scoring {
        weights: vec![(Plugin::Cost, 0), (Plugin::ClusterAffinity, 0)],
        data_locality: Some(DataLocality {
            cluster_names: vec!["eu-1".into()],
            ..DataLocality::default()
        }),
        preferred_affinities: prefer(&[(&["eu-2"], 5)]),
        ..Scoring::default()
    };
    for (name, placement, replicas) in placements() {
        let plain = compare_world(placement.clone(), replicas);
        let configured = compare_world(with(placement, weighs_nothing.clone()), replicas);
        let mut placer = (Placer::new(), Placer::new());
        for round in 0..2 {
            let before = plain.decide(&mut placer.0, round, "web");
            let after = configured.decide(&mut placer.1, round, "web");
            assert_eq!(after, before, "{name}, round {round}");
            assert!(before.scores.is_none(), "{name}");
        }
    }
}

#[test]
fn scores_without_information_decide_as_unscored() {
    // Cost weighs, but no cluster has a cost: every candidate scores the neutral 50, which
    // orders nothing — capacity and weights still choose.
    for (name, placement, replicas) in placements() {
        let plain = compare_world(placement.clone(), replicas);
        let scored = compare_world(with(placement, only(Plugin::Cost)), replicas);
        let before = plain.decide(&mut Placer::new(), 0, "web");
        let after = scored.decide(&mut Placer::new(), 0, "web");
        assert!(before.is_scheduled(), "{name}: {before:?}");
        assert_eq!(
            (&after.outcome, &after.placed, &after.excluded),
            (&before.outcome, &before.placed, &before.excluded),
            "{name}"
        );
        assert!(
            ranking(&after).iter().all(|(_, s)| *s == NEUTRAL * 100),
            "{name}"
        );
    }
}

#[test]
fn scores_never_stand_in_for_capacity() {
    // Two clusters with 2 free pods each, 10 replicas: no scoring makes room.
    let world = World::new(&["a", "b"])
        .pods(&[2, 2])
        .policy(
            vec![],
            with(
                divided(Division::Aggregated),
                Scoring {
                    preferred_affinities: prefer(&[(&["a"], 1)]),
                    ..Scoring::default()
                },
            ),
        )
        .deployment("web", Some(10));
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(
        unschedulable_reason(&d),
        "needs 10 replicas, 4 free (a: 2, b: 2)"
    );
    // Nor does a score of 0 take room away: one replica fits in b, which scores 0.
    let mut world = world;
    world.replicas("web", 1);
    world.capacities[0] = Some(crate::testing::pods_free(0));
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(counts(&d), vec![("b", 1)], "{d:?}");
}

// ---------------------------------------------------------------------------------------
// Required workload terms.

fn term(app: &str, topology: SpreadBy) -> WorkloadTerm {
    WorkloadTerm {
        selector: match_labels(&[("app", app)]),
        topology,
        preferred: None,
    }
}

/// web (placed by `p` with `scoring`, Duplicated, in `tiers`) and db (`app: db`, placed by
/// its own policy in `db_in`), web listed first.
fn web_and_db(
    clusters: &[&str],
    tiers: Vec<AffinityTier>,
    scoring: Scoring,
    db_in: &[&str],
) -> World {
    let mut world = World::new(clusters)
        .policy(tiers, duplicated(scoring))
        .policy_for(
            "db",
            "db",
            vec![tier("db", db_in)],
            PlacementPolicy::default(),
        )
        .deployment("web", Some(1))
        .deployment("db", Some(1));
    label(&mut world, "db", "db");
    world
}

struct TermCase {
    name: &'static str,
    scoring: Scoring,
    placed: &'static [&'static str],
    excluded: Vec<(&'static str, PlacementFilter)>,
}

#[test]
fn required_workload_terms_filter() {
    use PlacementFilter::{WorkloadAffinity, WorkloadAntiAffinity};
    let cases = [
        TermCase {
            name: "affinity by region: db's region",
            scoring: Scoring {
                workload_affinity: vec![term("db", SpreadBy::Region)],
                ..Scoring::default()
            },
            placed: &["eu-1", "eu-2"],
            excluded: vec![("us-1", WorkloadAffinity { term: 0 })],
        },
        TermCase {
            name: "anti-affinity by zone: anywhere but db's zone",
            scoring: Scoring {
                workload_anti_affinity: vec![term("db", SpreadBy::Zone)],
                ..Scoring::default()
            },
            placed: &["eu-2", "us-1"],
            excluded: vec![("eu-1", WorkloadAntiAffinity { term: 0 })],
        },
        TermCase {
            name: "the term's index counts the preferred terms before it",
            scoring: Scoring {
                workload_affinity: vec![
                    WorkloadTerm {
                        preferred: Some(1),
                        ..term("cache", SpreadBy::Zone)
                    },
                    term("db", SpreadBy::Cluster),
                ],
                ..Scoring::default()
            },
            placed: &["eu-1"],
            excluded: vec![
                ("eu-2", WorkloadAffinity { term: 1 }),
                ("us-1", WorkloadAffinity { term: 1 }),
            ],
        },
        TermCase {
            name: "a selector matching no workload's labels: affinity nowhere, anti-affinity anywhere",
            scoring: Scoring {
                workload_anti_affinity: vec![term("cache", SpreadBy::Cluster)],
                ..Scoring::default()
            },
            placed: &["eu-1", "eu-2", "us-1"],
            excluded: vec![],
        },
        TermCase {
            name: "a template does not repel itself",
            scoring: Scoring {
                workload_anti_affinity: vec![term("web", SpreadBy::Cluster)],
                ..Scoring::default()
            },
            placed: &["eu-1", "eu-2", "us-1"],
            excluded: vec![],
        },
    ];
    for c in cases {
        let scores = c.scoring.scores();
        let mut world = web_and_db(&["eu-1", "eu-2", "us-1"], vec![], c.scoring, &["eu-1"]);
        label(&mut world, "web", "web");
        // Twice: the second round sees where the first put web (and it must not repel
        // itself).
        let mut placer = Placer::new();
        for round in 0..2 {
            let d = world.decide(&mut placer, round, "web");
            assert_eq!(placed(&d), c.placed, "{}, round {round}: {d:?}", c.name);
            assert_eq!(excluded(&d), c.excluded, "{}, round {round}", c.name);
            assert_eq!(
                d.scores.is_some(),
                scores,
                "{}: required terms filter, only preferred ones score",
                c.name
            );
        }
    }
}

#[test]
fn unsatisfiable_anti_affinity_is_unschedulable_naming_the_tiers() {
    let world = web_and_db(
        &["eu-1", "eu-2", "us-1"],
        vec![tier("eu", &["eu-1", "eu-2"]), tier("us", &["us-1"])],
        Scoring {
            workload_anti_affinity: vec![term("db", SpreadBy::Cluster)],
            ..Scoring::default()
        },
        &["eu-1", "eu-2", "us-1"],
    );
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(
        unschedulable_reason(&d),
        "tier eu: no feasible cluster left (workloadAntiAffinity term 0 excludes eu-1, eu-2); \
         tier us: no feasible cluster left (workloadAntiAffinity term 0 excludes us-1)"
    );
    assert!(
        d.excluded
            .iter()
            .all(|e| e.reason == PlacementFilter::WorkloadAntiAffinity { term: 0 }),
        "{d:?}"
    );
}

#[test]
fn workload_terms_are_decided_after_the_others_and_follow_them() {
    // web is listed before db, yet sees where db runs in the same round.
    let mut world = web_and_db(
        &["eu-1", "eu-2", "us-1"],
        vec![],
        Scoring {
            workload_affinity: vec![term("db", SpreadBy::Zone)],
            ..Scoring::default()
        },
        &["eu-1"],
    );
    let mut placer = Placer::new();
    let round = world.place(&mut placer, 0);
    let web = round
        .decisions
        .values()
        .find(|d| &*d.template.name == "web");
    assert_eq!(web.map(|d| placed(d)), Some(vec!["eu-1"]), "{round:?}");
    // db moves to us-1: web follows it in that same round.
    let db = &mut world.policies[0];
    let mut traffic = (*db.traffic).clone();
    traffic.affinities = vec![tier("db", &["us-1"])];
    db.traffic = Arc::new(traffic);
    let round = world.place(&mut placer, 1);
    let placed_of = |name: &str| {
        round
            .decisions
            .values()
            .find(|d| &*d.template.name == name)
            .map(|d| placed(d))
    };
    assert_eq!(placed_of("db"), Some(vec!["us-1"]));
    assert_eq!(placed_of("web"), Some(vec!["us-1"]));
}

// ---------------------------------------------------------------------------------------
// Programs: webhooks and scripts, through a fake runner.

const HOOK_NAME: &str = "webhook https://score.example/v1";

/// eu-1, eu-2, us-1; web Duplicated into the best-scored cluster (spread by cluster,
/// maxGroups 1), with `scoring`; `programs` answer.
fn judged(scoring: Scoring, programs: &Arc<Canned>) -> World {
    let mut world = World::new(&["eu-1", "eu-2", "us-1"])
        .policy(
            vec![],
            PlacementPolicy {
                spread: spread_by(SpreadBy::Cluster, 1),
                scoring,
                ..PlacementPolicy::default()
            },
        )
        .deployment("web", Some(1));
    world.programs = programs.clone();
    world
}

fn hooked(failure_policy: FailurePolicy) -> Scoring {
    Scoring {
        webhooks: vec![webhook(failure_policy)],
        ..Scoring::default()
    }
}

fn usual_verdicts() -> Answer {
    Answer::Verdicts(vec![
        ("eu-1", rejected("too hot")),
        ("eu-2", scored(20)),
        ("us-1", scored(90)),
    ])
}

#[test]
fn answered_verdicts_filter_and_score() {
    let programs = Canned::new(vec![(HOOK_NAME, usual_verdicts())]);
    let world = judged(hooked(FailurePolicy::Ignore), &programs);
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(placed(&d), vec!["us-1"]);
    assert_eq!(
        excluded(&d),
        vec![
            (
                "eu-1",
                PlacementFilter::Rejected {
                    program: HOOK_NAME.into(),
                    reason: "too hot".into()
                }
            ),
            ("eu-2", PlacementFilter::SpreadMaxGroups),
        ]
    );
    assert_eq!(ranking(&d), vec![("us-1", 9000), ("eu-2", 2000)]);
    assert_eq!(
        report(&d).programs,
        vec![ProgramReport {
            program: HOOK_NAME.into(),
            judgement: Judgement::Answered(vec![rejected("too hot"), scored(20), scored(90)]),
        }]
    );
}

#[test]
fn programs_are_asked_about_the_candidates_left_after_the_filters() {
    // us-1 is in no tier, eu-3 has an untolerated NoSchedule taint, db's eu-1 breaks the
    // required anti-affinity: the webhook hears of eu-2 and eu-4 only, in name order.
    let programs = Canned::new(vec![(HOOK_NAME, Answer::Verdicts(vec![]))]);
    let mut world = web_and_db(
        &["eu-1", "eu-2", "eu-3", "eu-4", "us-1"],
        vec![tier("eu", &["eu-1", "eu-2", "eu-3", "eu-4"])],
        Scoring {
            workload_anti_affinity: vec![term("db", SpreadBy::Cluster)],
            ..hooked(FailurePolicy::Ignore)
        },
        &["eu-1"],
    );
    world.programs = programs.clone();
    world
        .spec("eu-3")
        .taints
        .push(taint("t", TaintEffect::NoSchedule));
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(
        programs.asked(),
        vec![(HOOK_NAME.to_owned(), vec!["eu-2".into(), "eu-4".into()])]
    );
    assert_eq!(placed(&d), vec!["eu-2", "eu-4"]);
    assert_eq!(
        ranking(&d),
        vec![("eu-2", NEUTRAL * 100), ("eu-4", NEUTRAL * 100)],
        "answers without scores: no data"
    );
}

#[test]
fn scores_list_every_candidate_best_first_with_each_plugins_score() {
    let programs = Canned::new(vec![
        (HOOK_NAME, usual_verdicts()),
        (
            "script",
            Answer::Verdicts(vec![("eu-2", scored(100)), ("us-1", scored(0))]),
        ),
    ]);
    let scoring = Scoring {
        preferred_affinities: prefer(&[(&["eu-2"], 1)]),
        script: Some(script()),
        ..hooked(FailurePolicy::Ignore)
    };
    let d = judged(scoring, &programs).decide(&mut Placer::new(), 0, "web");
    let part = |plugin, score| PluginScore {
        plugin,
        weight: 1,
        score,
    };
    assert_eq!(
        report(&d).order,
        vec![
            ClusterScore {
                cluster: ClusterId::new("eu-2"),
                // (100 + 20 + 100) / 3
                total: 7333,
                plugins: vec![
                    part(Plugin::ClusterAffinity, Some(100)),
                    part(Plugin::Webhook, Some(20)),
                    part(Plugin::Script, Some(100)),
                ],
            },
            ClusterScore {
                cluster: ClusterId::new("us-1"),
                total: 3000,
                plugins: vec![
                    part(Plugin::ClusterAffinity, Some(0)),
                    part(Plugin::Webhook, Some(90)),
                    part(Plugin::Script, Some(0)),
                ],
            },
        ]
    );
    assert_eq!(placed(&d), vec!["eu-2"]);
    let asked: Vec<String> = programs.asked().into_iter().map(|(p, _)| p).collect();
    assert_eq!(
        asked,
        vec![HOOK_NAME, "script"],
        "webhooks first, then the script"
    );
}

#[test]
fn pending_waits_keeping_the_last_placement() {
    let programs = Canned::new(vec![(HOOK_NAME, usual_verdicts())]);
    let world = judged(hooked(FailurePolicy::Fail), &programs);
    let mut placer = Placer::new();
    let d = world.decide(&mut placer, 0, "web");
    assert_eq!(placed(&d), vec!["us-1"]);
    programs.set(HOOK_NAME, Answer::Pending);
    let d = world.decide(&mut placer, 1, "web");
    assert_eq!(
        unschedulable_reason(&d),
        "waiting for the webhook https://score.example/v1"
    );
    assert_eq!(placed(&d), vec!["us-1"], "the last placement stays");
    for e in d.excluded.iter() {
        assert_eq!(
            e.reason,
            PlacementFilter::TierUnusable {
                tier: None,
                why: "waiting for the webhook https://score.example/v1".into()
            },
            "{}: says why, not that it is given no replica",
            e.cluster
        );
    }
    // The answer comes: decided by it.
    programs.set(
        HOOK_NAME,
        Answer::Verdicts(vec![("eu-2", scored(95)), ("us-1", scored(10))]),
    );
    let d = world.decide(&mut placer, 2, "web");
    assert_eq!(placed(&d), vec!["eu-2"]);
}

struct FailureCase {
    name: &'static str,
    scoring: Scoring,
    program: &'static str,
    answer: Answer,
    /// None: scheduled by the other scores, the report listing the failure (this message).
    unschedulable: Option<&'static str>,
    failure: &'static str,
}

#[test]
fn failures_of_programs() {
    let wrong_count = || {
        Answer::Raw(Judgement::Answered(vec![
            rejected("everything"),
            scored(10),
        ]))
    };
    let out_of_range = || {
        Answer::Raw(Judgement::Answered(vec![
            rejected("eu-1"),
            scored(140),
            scored(10),
        ]))
    };
    let ignore = || Scoring {
        preferred_affinities: prefer(&[(&["eu-2"], 1)]),
        ..hooked(FailurePolicy::Ignore)
    };
    let fail = || Scoring {
        preferred_affinities: prefer(&[(&["eu-2"], 1)]),
        ..hooked(FailurePolicy::Fail)
    };
    let scripted = || Scoring {
        preferred_affinities: prefer(&[(&["eu-2"], 1)]),
        script: Some(script()),
        ..Scoring::default()
    };
    let cases = [
        FailureCase {
            name: "a script's error: unschedulable with its message",
            scoring: scripted(),
            program: "script",
            answer: Answer::Failed("line 3: attempt to index a nil value"),
            unschedulable: Some("script: line 3: attempt to index a nil value"),
            failure: "",
        },
        FailureCase {
            name: "a webhook failing, failurePolicy Ignore: the other scores decide",
            scoring: ignore(),
            program: HOOK_NAME,
            answer: Answer::Failed("timeout after 500ms"),
            unschedulable: None,
            failure: "timeout after 500ms",
        },
        FailureCase {
            name: "a webhook failing, failurePolicy Fail",
            scoring: fail(),
            program: HOOK_NAME,
            answer: Answer::Failed("timeout after 500ms"),
            unschedulable: Some(
                "webhook https://score.example/v1 failed (failurePolicy Fail): timeout after 500ms",
            ),
            failure: "",
        },
        FailureCase {
            name: "too few verdicts are a failure (Ignore): none of them applies",
            scoring: ignore(),
            program: HOOK_NAME,
            answer: wrong_count(),
            unschedulable: None,
            failure: "2 verdicts for 3 candidate clusters",
        },
        FailureCase {
            name: "too few verdicts are a failure (Fail)",
            scoring: fail(),
            program: HOOK_NAME,
            answer: wrong_count(),
            unschedulable: Some(
                "webhook https://score.example/v1 failed (failurePolicy Fail): \
                 2 verdicts for 3 candidate clusters",
            ),
            failure: "",
        },
        FailureCase {
            name: "a score above 100 is a failure (Ignore)",
            scoring: ignore(),
            program: HOOK_NAME,
            answer: out_of_range(),
            unschedulable: None,
            failure: "score 140 for cluster eu-2 is outside [0, 100]",
        },
        FailureCase {
            name: "a script's wrong count",
            scoring: scripted(),
            program: "script",
            answer: wrong_count(),
            unschedulable: Some("script: 2 verdicts for 3 candidate clusters"),
            failure: "",
        },
    ];
    for c in cases {
        let programs = Canned::new(vec![(c.program, usual_verdicts())]);
        let world = judged(c.scoring, &programs);
        let mut placer = Placer::new();
        // A first round answered: eu-2 (the affinity's 100 and the program's 20: 60) beats
        // us-1 (0 and 90: 45).
        let first = world.decide(&mut placer, 0, "web");
        assert_eq!(placed(&first), vec!["eu-2"], "{}", c.name);
        programs.set(c.program, c.answer);
        let d = world.decide(&mut placer, 1, "web");
        match c.unschedulable {
            Some(reason) => {
                assert_eq!(unschedulable_reason(&d), reason, "{}", c.name);
                assert_eq!(
                    placed(&d),
                    vec!["eu-2"],
                    "{}: the last placement stays",
                    c.name
                );
            }
            None => {
                assert!(d.is_scheduled(), "{}: {d:?}", c.name);
                assert_eq!(
                    report(&d).programs,
                    vec![ProgramReport {
                        program: c.program.into(),
                        judgement: Judgement::Failed(c.failure.into()),
                    }],
                    "{}",
                    c.name
                );
                assert_eq!(placed(&d), vec!["eu-2"], "{}: the affinity decides", c.name);
                assert!(
                    !d.excluded
                        .iter()
                        .any(|e| matches!(e.reason, PlacementFilter::Rejected { .. })),
                    "{}: a failed answer rejects nothing: {d:?}",
                    c.name
                );
                assert_eq!(
                    plugin_scores(&d, Plugin::Webhook),
                    vec![("eu-1", None), ("eu-2", None), ("us-1", None)],
                    "{}: no data",
                    c.name
                );
            }
        }
    }
}

#[test]
fn an_ignored_failing_webhook_alone_decides_as_no_webhook() {
    for (name, placement, replicas) in placements() {
        let programs = Canned::new(vec![(HOOK_NAME, Answer::Failed("refused"))]);
        let plain = compare_world(placement.clone(), replicas);
        let mut hooked = compare_world(with(placement, hooked(FailurePolicy::Ignore)), replicas);
        hooked.programs = programs;
        let before = plain.decide(&mut Placer::new(), 0, "web");
        let after = hooked.decide(&mut Placer::new(), 0, "web");
        assert_eq!(
            (&after.outcome, &after.placed, &after.excluded),
            (&before.outcome, &before.placed, &before.excluded),
            "{name}"
        );
    }
}

#[test]
fn cost_is_relative_to_the_candidates_the_programs_left() {
    // The script rejects eu-1, the cheapest: eu-2 is the cheapest candidate left.
    let programs = Canned::new(vec![(
        "script",
        Answer::Verdicts(vec![("eu-1", rejected("no GPUs"))]),
    )]);
    let mut world = judged(
        Scoring {
            weights: vec![(Plugin::Cost, 1)],
            script: Some(script()),
            ..Scoring::default()
        },
        &programs,
    );
    for (name, price) in [("eu-1", 0.02), ("eu-2", 0.04), ("us-1", 0.08)] {
        world.spec(name).cost = Some(Cost::new(price, 0.0, 0.0, 0.0));
    }
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(
        plugin_scores(&d, Plugin::Cost),
        vec![("eu-2", Some(100)), ("us-1", Some(0))]
    );
}

#[test]
fn a_scale_down_leaves_a_cluster_a_program_now_rejects() {
    let programs = Canned::new(vec![(HOOK_NAME, Answer::Verdicts(vec![]))]);
    let mut world = World::new(&["a", "b", "c"])
        .pods(&[5, 5, 5])
        .policy(
            vec![],
            with(
                divided(Division::AvailableCapacity),
                hooked(FailurePolicy::Ignore),
            ),
        )
        .deployment("web", Some(6));
    world.programs = programs.clone();
    let mut placer = Placer::new();
    let d = world.decide(&mut placer, 0, "web");
    assert_eq!(counts(&d), vec![("a", 2), ("b", 2), ("c", 2)]);
    programs.set(
        HOOK_NAME,
        Answer::Verdicts(vec![("a", rejected("draining"))]),
    );
    world.replicas("web", 3);
    let d = world.decide(&mut placer, 1, "web");
    assert_eq!(
        reason_of(&d, "a"),
        PlacementFilter::Rejected {
            program: HOOK_NAME.into(),
            reason: "draining".into()
        },
        "{d:?}"
    );
    assert_eq!(counts(&d).iter().map(|c| c.1).sum::<u32>(), 3);
}

#[test]
fn a_tier_the_programs_and_room_empty_names_both() {
    let programs = Canned::new(vec![(
        HOOK_NAME,
        Answer::Verdicts(vec![("a", rejected("too hot"))]),
    )]);
    let mut world = World::new(&["a", "b", "c"])
        .pods(&[5, 0, 0])
        .policy(
            vec![],
            with(
                divided(Division::AvailableCapacity),
                hooked(FailurePolicy::Ignore),
            ),
        )
        .deployment("web", Some(2));
    world.capacities[2] = None;
    world.programs = programs;
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(
        unschedulable_reason(&d),
        "no feasible cluster left (the webhook https://score.example/v1 rejects a: too hot; \
         no room in b; no capacity known for c)"
    );
}
