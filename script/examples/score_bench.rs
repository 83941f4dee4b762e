//! Times decisions of a Lua filter and cost score over 255 clusters:
//!
//! ```text
//! cargo run --release -p meridian-script --example score_bench [decisions]
//! ```
//!
//! Three figures: steady (the clusters did not change since the last decision, so their tables
//! are reused: the decisions of one placement round), endpoints (every cluster's endpoint
//! count changed since the last decision, written into its table in place) and relabel (every
//! cluster got a new label, so every table is built again: the worst case). Each as wall-clock
//! time and, on Linux, as this thread's time on a CPU (other processes on the machine inflate
//! the first, not the second).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_core::placement::{ClusterInput, Judgement, Program, Programs, Script};
use meridian_core::testing::{cluster, deployment, healthy, pods_free};
use meridian_core::{Capacity, ClusterView, Cost};
use meridian_script::ScriptRunner;

const CLUSTERS: usize = 255;

/// Keeps every healthy, untainted cluster of the workload's tier or of none (all of them
/// here, so score runs 255 times), and scores by the hourly price of one replica, spot
/// capacity counted at 30 %, nothing where the replicas do not fit.
const SCRIPT: &str = r#"
function filter(cluster, workload)
  if cluster.health == "Unreachable" then return false, "unreachable" end
  for _, t in ipairs(cluster.taints) do
    if t.effect == "NoSchedule" then return false, "tainted " .. t.key end
  end
  local tier = cluster.labels.tier
  if tier ~= nil and tier ~= workload.labels.tier then
    return false, "tier " .. tier
  end
  return true
end

function score(cluster, workload)
  local cost = cluster.cost
  if cost == nil then return 50 end
  local free = cluster.capacity and cluster.capacity.pods or 0
  if free < (workload.replicas or 1) then return 0 end
  local r = workload.requests
  local hourly = r.cpu_millis / 1000 * cost.cpu_core_hour * (1 - 0.7 * cost.spot_ratio)
    + r.memory_bytes / 2^30 * cost.memory_gib_hour
  return math.max(0, math.min(100, 100 - hourly * 1000))
end
"#;

fn fleet() -> Vec<(ClusterView, Option<Capacity>)> {
    (0..CLUSTERS)
        .map(|i| {
            let region = ["eu", "us", "ap", "sa"][i % 4];
            let mut spec = cluster(
                &format!("cluster-{i:03}"),
                region,
                &format!("{region}-{}", i % 3),
            );
            spec.labels.insert("tier".into(), "gold".into());
            spec.labels.insert("env".into(), "prod".into());
            spec.labels.insert("team".into(), format!("team-{}", i % 7));
            spec.cost = Some(Cost::new(
                0.02 + i as f64 * 0.0001,
                0.003,
                0.01,
                (i % 5) as f64 / 10.0,
            ));
            (healthy(spec), Some(pods_free(100)))
        })
        .collect()
}

/// This thread's time on a CPU (Linux: `/proc/thread-self/schedstat`), so that other
/// processes competing for the cores do not inflate the figure; None elsewhere.
fn on_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let nanos = stat.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

/// What changes in every cluster before each decision.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Change {
    Nothing,
    Endpoints,
    Labels,
}

/// Wall-clock and on-CPU time of `decisions` decisions.
fn time(
    runner: &ScriptRunner,
    program: &Program,
    members: &mut [(ClusterView, Option<Capacity>)],
    decisions: u32,
    change: Change,
) -> (Duration, Option<Duration>) {
    let mut template = deployment("web", Some(3));
    std::sync::Arc::make_mut(&mut template.labels).insert("tier".into(), "gold".into());
    let mut total = Duration::ZERO;
    let mut cpu = on_cpu().map(|_| Duration::ZERO);
    for d in 0..decisions {
        for (view, _) in members.iter_mut() {
            match change {
                Change::Nothing => {}
                Change::Endpoints => view.endpoints += 1,
                Change::Labels => {
                    view.spec.labels.insert("build".into(), d.to_string());
                }
            }
        }
        let inputs: Vec<ClusterInput<'_>> = members
            .iter()
            .map(|(view, capacity)| ClusterInput {
                view,
                capacity: capacity.as_ref(),
            })
            .collect();
        let (start, start_cpu) = (Instant::now(), on_cpu());
        let judgement = black_box(runner.judge(program, &template, &inputs));
        total += start.elapsed();
        if let (Some(c), Some(s), Some(e)) = (cpu.as_mut(), start_cpu, on_cpu()) {
            *c += e.saturating_sub(s);
        }
        match judgement {
            Judgement::Answered(v)
                if v.len() == CLUSTERS && v.iter().all(|v| v.score.is_some()) => {}
            other => panic!("unexpected judgement: {other:?}"),
        }
    }
    (total, cpu)
}

fn report(what: &str, decisions: u32, (total, cpu): (Duration, Option<Duration>)) {
    let per = total.as_secs_f64() / f64::from(decisions);
    println!(
        "{what:>9}: {decisions} decisions over {CLUSTERS} clusters in {:.3} s: {:.0} decisions/s, \
         {:.1} µs per decision, {:.2} µs per cluster",
        total.as_secs_f64(),
        1.0 / per,
        per * 1e6,
        per * 1e6 / CLUSTERS as f64
    );
    if let Some(cpu) = cpu {
        let per = cpu.as_secs_f64() / f64::from(decisions);
        println!(
            "{:>9}  on CPU: {:.0} decisions/s, {:.1} µs per decision",
            "",
            1.0 / per,
            per * 1e6
        );
    }
}

fn main() {
    let decisions: u32 = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(5000);
    let runner = ScriptRunner::default();
    let program = Program::Script(Arc::new(Script { lua: SCRIPT.into() }));
    let mut members = fleet();
    // The first decision compiles the script and builds every cluster's table.
    let (first, _) = time(&runner, &program, &mut members, 1, Change::Nothing);
    println!(
        "first decision (compile + cluster tables): {:.1} µs",
        first.as_secs_f64() * 1e6
    );
    let steady = time(&runner, &program, &mut members, decisions, Change::Nothing);
    report("steady", decisions, steady);
    let endpoints = time(
        &runner,
        &program,
        &mut members,
        decisions,
        Change::Endpoints,
    );
    report("endpoints", decisions, endpoints);
    let relabel = time(
        &runner,
        &program,
        &mut members,
        decisions / 5,
        Change::Labels,
    );
    report("relabel", decisions / 5, relabel);
}
