//! What one change costs the fleet's placement at fleet size: `Fleet::publish` (build, place,
//! stamp — what the store runs per change) after one change, beside the same round deciding
//! every template (`Placer::deciding_everything`, what every round cost before placement was
//! incremental).
//!
//! The fleet: CLUSTERS members (10 regions, a `group` label per 100) and TEMPLATES
//! Deployments in groups of 1,000, each group placed by its own policy: group 0 Duplicated
//! onto 100 members per 100 templates (the issue's "1,000 Duplicated onto 100 members each"),
//! groups 1–4 divided by static weights over 200 members, the rest divided by available
//! capacity over 100 members (their room is shared: a change there can reach the other
//! capacity divisions on the same members).
//!
//! ```text
//!   cargo bench -p meridian-core --bench placement_rounds
//!   PLACEMENT_CLUSTERS=1000 PLACEMENT_TEMPLATES=10000 PLACEMENT_RUNS=5 (the defaults)
//!   PLACEMENT_ONLY_EDITS=1   static-weights edits only, the reference run once (to profile
//!                            one kind of round: perf record on the bench binary);
//!                            =capacity: capacity-divided edits only
//! ```
//!
//! Prints, per kind of change, the median of RUNS publishes (ms), the templates the round
//! decided, and the ratio to deciding everything; and the process's RSS once the fleet is
//! placed. Budget (issue 38): one template edit → its placement decided in ≤ 10 ms.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_core::fleet::{Event, Fleet};
use meridian_core::placement::{
    Division, Inputs, NoPrograms, PlacementPolicy, Placer, ReplicaScheduling, Template,
    TemplateSelector,
};
use meridian_core::testing::{deployment, placing, pods_free, tier};
use meridian_core::{
    ClusterSet, ClusterSpec, LabelSelector, Locality, Policy, Snapshot, WeightRule,
};

const BUDGET_MS: f64 = 10.0;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn name(i: usize) -> String {
    format!("c{i:04}")
}

fn spec(i: usize) -> ClusterSpec {
    let mut spec = ClusterSpec::named(&name(i));
    spec.locality = Locality {
        region: Some(format!("r{}", i % 10)),
        zone: Some(format!("r{}-z{}", i % 10, i % 3)),
    };
    spec.labels.insert("group".into(), format!("g{}", i / 100));
    spec
}

/// Template `i`: group `i / 1000`, replicas 1–6.
fn template(i: usize) -> Template {
    let mut t = deployment(&format!("t{i:05}"), Some(1 + (i % 6) as u32));
    Arc::make_mut(&mut t.labels).insert("group".into(), format!("{}", i / 1000));
    t
}

/// The policy of template group `g`, over its members.
fn policy(g: usize, clusters: usize) -> Policy {
    let window = |start: usize, len: usize| -> Vec<String> {
        (start..start + len).map(|i| name(i % clusters)).collect()
    };
    let (members, replicas) = match g {
        0 => (Vec::new(), ReplicaScheduling::Duplicated),
        1..=4 => {
            let members = window(g * 200, 200);
            let rules = members
                .iter()
                .enumerate()
                .map(|(k, n)| WeightRule {
                    clusters: ClusterSet {
                        names: vec![n.clone()],
                        selector: None,
                    },
                    weight: 1 + (k % 3) as u32,
                })
                .collect();
            (
                members,
                ReplicaScheduling::Divided(Division::Weights(rules)),
            )
        }
        _ => (
            window(g * 100, 100),
            ReplicaScheduling::Divided(Division::AvailableCapacity),
        ),
    };
    let tiers = if members.is_empty() {
        Vec::new()
    } else {
        let refs: Vec<&str> = members.iter().map(String::as_str).collect();
        vec![tier("home", &refs)]
    };
    let placement = PlacementPolicy {
        replicas,
        ..PlacementPolicy::default()
    };
    let mut p = placing(&format!("p{g}"), g as i64, tiers, placement);
    p.templates = vec![TemplateSelector {
        kind: Some("Deployment".into()),
        selector: Some(LabelSelector {
            match_labels: BTreeMap::from([("group".into(), g.to_string())]),
            match_expressions: Vec::new(),
        }),
        ..TemplateSelector::default()
    }];
    p
}

/// Group 0 goes Duplicated onto 100 members per 100 templates: one policy per 100.
fn duplicated_policies(clusters: usize) -> Vec<Policy> {
    (0..10)
        .map(|k| {
            let members: Vec<String> = (k * 100..k * 100 + 100)
                .map(|i| name(i % clusters))
                .collect();
            let refs: Vec<&str> = members.iter().map(String::as_str).collect();
            let mut p = placing(
                &format!("dup{k}"),
                -(k as i64) - 1,
                vec![tier("home", &refs)],
                PlacementPolicy::default(),
            );
            p.templates = vec![TemplateSelector {
                kind: Some("Deployment".into()),
                selector: Some(LabelSelector {
                    match_labels: BTreeMap::from([
                        ("group".into(), "0".into()),
                        ("dup".into(), k.to_string()),
                    ]),
                    match_expressions: Vec::new(),
                }),
                ..TemplateSelector::default()
            }];
            p
        })
        .collect()
}

struct World {
    fleet: Fleet,
    last: Arc<Snapshot>,
    templates: Vec<Template>,
    clusters: usize,
    now: Instant,
}

impl World {
    fn new(clusters: usize, templates: usize) -> Self {
        let now = Instant::now();
        let mut fleet = Fleet::new(now, Duration::from_secs(1));
        let groups = templates.div_ceil(1000);
        let mut policies = duplicated_policies(clusters);
        policies.extend((1..groups).map(|g| policy(g, clusters)));
        fleet.apply(
            Event::Members {
                specs: (0..clusters).map(spec).collect(),
                policies,
                problems: Vec::new(),
                warnings: Vec::new(),
            },
            now,
        );
        for i in 0..clusters {
            let id = meridian_core::ClusterId::new(name(i));
            fleet.apply(
                Event::Heartbeat {
                    cluster: id.clone(),
                    result: Ok(()),
                },
                now,
            );
            fleet.apply(
                Event::Capacity {
                    cluster: id,
                    capacity: Some(pods_free(400)),
                },
                now,
            );
        }
        let templates: Vec<Template> = (0..templates)
            .map(|i| {
                let mut t = template(i);
                if i < 1000 {
                    Arc::make_mut(&mut t.labels).insert("dup".into(), (i / 100).to_string());
                }
                t
            })
            .collect();
        fleet.apply(
            Event::Templates {
                templates: templates.clone(),
                overrides: Vec::new(),
            },
            now,
        );
        let mut world = Self {
            fleet,
            last: Arc::new(Snapshot::empty()),
            templates,
            clusters,
            now,
        };
        world.publish();
        world.settle();
        world
    }

    /// One publish, as the store runs it: (elapsed, templates decided).
    fn publish(&mut self) -> (Duration, usize) {
        self.now += Duration::from_millis(1);
        let started = Instant::now();
        // As the store does: the clock first (a settling round is due at once).
        self.fleet.tick(self.now);
        let published = self.fleet.publish(&self.last, self.now);
        let took = started.elapsed();
        let decided = if published.placement.is_some() {
            published.snapshot.placements.decided
        } else {
            0
        };
        self.last = Arc::new(published.snapshot);
        (took, decided)
    }

    /// The settling rounds the fleet runs by itself after a change (`Placements::settled`):
    /// (rounds, time, templates decided).
    fn settle(&mut self) -> (usize, Duration, usize) {
        let (mut rounds, mut took, mut decided) = (0, Duration::ZERO, 0);
        while self
            .fleet
            .next_deadline()
            .is_some_and(|d| d <= self.now + Duration::from_millis(1))
        {
            let (t, d) = self.publish();
            rounds += 1;
            took += t;
            decided += d;
        }
        (rounds, took, decided)
    }

    fn edit_template(&mut self, i: usize, run: usize) {
        let t = &mut self.templates[i];
        t.replicas = Some(1 + ((run + i) % 7) as u32);
        self.fleet.apply(
            Event::Templates {
                templates: self.templates.clone(),
                overrides: Vec::new(),
            },
            self.now,
        );
    }

    fn capacity(&mut self, cluster: usize, run: usize) {
        self.fleet.apply(
            Event::Capacity {
                cluster: meridian_core::ClusterId::new(name(cluster % self.clusters)),
                capacity: Some(pods_free(400 + run as u64 + 1)),
            },
            self.now,
        );
    }

    /// The same round, deciding every template: what each publish cost before.
    fn decide_everything(&self) -> Duration {
        let snapshot = &self.last;
        let clusters = snapshot.cluster_inputs();
        let inputs = Inputs {
            templates: &snapshot.templates,
            policies: snapshot.policies.as_slice(),
            overrides: &snapshot.overrides,
            clusters: &clusters,
            programs: &NoPrograms,
        };
        let mut placer = Placer::deciding_everything();
        placer.place(inputs, self.now);
        let started = Instant::now();
        placer.place(inputs, self.now);
        started.elapsed()
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn main() {
    let clusters = env("PLACEMENT_CLUSTERS", 1000);
    let templates = env("PLACEMENT_TEMPLATES", 10_000);
    let runs = env("PLACEMENT_RUNS", 5).max(1);
    let built = Instant::now();
    let mut w = World::new(clusters, templates);
    println!(
        "fleet: {clusters} members, {templates} templates ({} placed copies); set up and settled in {:.1} s; RSS {:.0} MiB",
        w.last
            .placements
            .decisions
            .values()
            .map(|d| d.placed.len())
            .sum::<usize>(),
        built.elapsed().as_secs_f64(),
        rss_mib()
    );
    let only_edits = std::env::var_os("PLACEMENT_ONLY_EDITS").is_some();
    let reference_runs = if only_edits { 1 } else { runs };
    let everything = median((0..reference_runs).map(|_| w.decide_everything()).collect());
    println!(
        "deciding every template (the reference): {:.1} ms",
        everything.as_secs_f64() * 1e3
    );
    println!(
        "{:<46} {:>10} {:>9} {:>12} {:>8}",
        "change", "publish ms", "decided", "vs every", "budget"
    );
    let report = |what: &str, w: &mut World, change: &dyn Fn(&mut World, usize)| {
        let mut took = Vec::new();
        let mut decided = Vec::new();
        let mut settling = Vec::new();
        for run in 0..runs {
            change(w, run);
            let (t, d) = w.publish();
            took.push(t);
            decided.push(d);
            settling.push(w.settle());
        }
        let t = median(took);
        decided.sort_unstable();
        let ms = t.as_secs_f64() * 1e3;
        settling.sort();
        let (rounds, settle_took, settle_decided) = settling[settling.len() / 2];
        println!(
            "{what:<46} {ms:>10.2} {:>9} {:>11.3}× {:>8}   then {rounds} settling round(s): {:.2} ms, {settle_decided} decided",
            decided[decided.len() / 2],
            t.as_secs_f64() / everything.as_secs_f64(),
            if ms <= BUDGET_MS { "ok" } else { "over" },
            settle_took.as_secs_f64() * 1e3,
        );
    };
    if only_edits {
        // For profiling one kind of round: static-weights (or capacity-divided) edits only.
        let capacity = std::env::var("PLACEMENT_ONLY_EDITS").is_ok_and(|v| v == "capacity");
        let (what, i) = if capacity {
            ("edit one capacity-divided template", templates - 3)
        } else {
            ("edit one static-weights template", 1017)
        };
        report(what, &mut w, &|w, run| w.edit_template(i, run));
        return;
    }
    report("nothing changed (a tick)", &mut w, &|_, _| {});
    report("edit one Duplicated template", &mut w, &|w, run| {
        w.edit_template(17, run)
    });
    if templates > 1000 {
        report("edit one static-weights template", &mut w, &|w, run| {
            w.edit_template(1017, run)
        });
    }
    if templates > 5000 {
        report("edit one capacity-divided template", &mut w, &|w, run| {
            w.edit_template(templates - 3, run)
        });
    }
    report("one member's capacity changes", &mut w, &|w, run| {
        w.capacity(977, run)
    });
    println!("RSS after the rounds: {:.0} MiB", rss_mib());
}
