//! The cost of one scheduling decision: `meridian_core::select` for one service exported from
//! 10, 100 and 255 clusters, with no result cache (DNS and xDS call it per answer / per build).
//!
//! Every call asks for another client cluster and calls alternate between two snapshots built
//! from separate indexes, so neither a snapshot nor a client's clusters stay hot by accident.
//! Policies: `locality` (the default: client cluster, zone, region, rest) and `tiers` (mode
//! Tiers with a label and a name affinity, weight rules by label and by name, a
//! minHealthyEndpoints that spills, failback and a withdraw override, so every step of the
//! pipeline has work).
//!
//! ```text
//!   cargo bench -p meridian-core --bench select                  # ns/call, median of rounds
//!   target/release/deps/select-* --callgrind CLUSTERS POLICY CALLS
//!       (under valgrind --tool=callgrind --toggle-collect='*measured_loop*': Ir / CALLS is
//!        instructions per call, fleet building and warm-up excluded)
//! ```
//!
//! Knobs (environment): SELECT_ROUNDS (default 5), SELECT_CALLS (calls per round, default
//! 1,000,000), SELECT_SIZES (default "10,100,255").

use std::collections::BTreeMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_core::testing::{FleetBuilder, ep, port, svc};
use meridian_core::{
    AffinityTier, ClusterSet, ClusterSpec, Endpoint, Gateway, LabelSelector, Locality, Mode,
    ServiceView, Snapshot, Taint, TaintEffect, TrafficPolicy, WeightRule, select,
};

/// The budget from the issue: one decision for a service in 10 clusters.
const BUDGET_NS_10: f64 = 1000.0;

fn spec(i: usize) -> ClusterSpec {
    let mut spec = ClusterSpec::named(&format!("c{i:03}"));
    let region = i % 4;
    spec.locality = Locality {
        region: Some(format!("r{region}")),
        zone: Some(format!("r{region}-z{}", (i / 4) % 3)),
    };
    spec.labels
        .insert("topology.kubernetes.io/region".into(), format!("r{region}"));
    spec.labels
        .insert("tier".into(), ["gold", "silver", "bronze"][i % 3].into());
    spec.network = Some(if i % 3 == 2 { "net-b" } else { "net-a" }.into());
    spec.gateway = (i % 5 != 4).then(|| Gateway {
        address: IpAddr::V4(Ipv4Addr::new(192, 0, 2, i as u8)),
        port: 15443,
    });
    if i % 7 == 6 {
        spec.taints.push(Taint {
            key: "spot".into(),
            value: None,
            effect: TaintEffect::PreferNoSchedule,
        });
    }
    if i % 11 == 10 {
        spec.taints.push(Taint {
            key: "maintenance".into(),
            value: None,
            effect: TaintEffect::NoExecute,
        });
    }
    spec
}

fn policy(name: &str, clusters: usize) -> TrafficPolicy {
    match name {
        "locality" => TrafficPolicy::default(),
        "tiers" => {
            let names = |from: usize, to: usize| ClusterSet {
                names: (from..to.min(clusters))
                    .map(|i| format!("c{i:03}"))
                    .collect(),
                selector: None,
            };
            let labels = |key: &str, value: &str| ClusterSet {
                names: Vec::new(),
                selector: Some(LabelSelector {
                    match_labels: BTreeMap::from([(key.to_owned(), value.to_owned())]),
                    match_expressions: Vec::new(),
                }),
            };
            TrafficPolicy {
                source: Some("shop/web-tiers".into()),
                mode: Mode::Tiers,
                affinities: vec![
                    AffinityTier {
                        name: "home".into(),
                        clusters: labels("topology.kubernetes.io/region", "r0"),
                    },
                    AffinityTier {
                        name: "named".into(),
                        clusters: names(0, 8),
                    },
                    AffinityTier {
                        name: "gold".into(),
                        clusters: labels("tier", "gold"),
                    },
                ],
                weights: vec![
                    WeightRule {
                        clusters: names(3, 5),
                        weight: 0,
                    },
                    WeightRule {
                        clusters: labels("tier", "silver"),
                        weight: 5,
                    },
                ],
                min_healthy_endpoints: 8,
                withdraw_after_seconds: Some(300),
                failback_after_seconds: 30,
                ..TrafficPolicy::default()
            }
        }
        other => panic!("unknown policy {other:?} (locality, tiers)"),
    }
}

/// A snapshot of `clusters` members exporting `shop/web` with `ready` ready endpoints and one
/// not ready each (a few exports have none ready).
fn snapshot(clusters: usize, ready: u8, policy: &TrafficPolicy, version: u64) -> Snapshot {
    let mut fleet = FleetBuilder::new();
    for i in 0..clusters {
        let ready = if i % 13 == 12 { 0 } else { ready };
        let endpoints = (0..=ready)
            .map(|j| Endpoint {
                ports: Arc::from(vec![port("http", 80)]),
                ..ep(
                    IpAddr::V4(Ipv4Addr::new(10, (i >> 8) as u8, i as u8, j)),
                    j < ready,
                )
            })
            .collect();
        fleet.add_service(spec(i), svc(false, &[("http", 80)]), endpoints);
    }
    fleet.version = version;
    fleet.snapshot_with(policy.clone())
}

/// Two snapshots of the same fleet (different endpoint counts, separate allocations) and the
/// service's view in each.
struct Bench {
    clusters: usize,
    snaps: [Snapshot; 2],
    now: Instant,
}

impl Bench {
    fn new(clusters: usize, policy_name: &str) -> Self {
        let policy = policy(policy_name, clusters);
        let snaps = [
            snapshot(clusters, 3, &policy, 1),
            snapshot(clusters, 5, &policy, 2),
        ];
        Self {
            clusters,
            snaps,
            now: Instant::now() + Duration::from_secs(60),
        }
    }

    fn views(&self) -> [&ServiceView; 2] {
        [0, 1].map(|i| {
            &**self.snaps[i]
                .service("shop", "web")
                .expect("shop/web is served")
        })
    }
}

/// `calls` decisions; call k asks snapshot k % 2 for a client that changes on every call.
/// Returns a checksum of the selections so nothing is optimised away.
#[inline(never)]
fn measured_loop(bench: &Bench, views: [&ServiceView; 2], calls: u64) -> u64 {
    let n = bench.clusters as u64;
    let mut sum = 0u64;
    for k in 0..calls {
        let which = (k & 1) as usize;
        let client = ((k >> 1) * 7 + which as u64 * 3) % n;
        let selection = select(
            black_box(&bench.snaps[which]),
            black_box(views[which]),
            black_box(Some(client as usize)),
            bench.now,
        );
        sum = sum.wrapping_add(selection.tiers.len() as u64 + selection.filtered.len() as u64);
        black_box(&selection);
    }
    sum
}

#[inline(never)]
fn warm_up(bench: &Bench, views: [&ServiceView; 2], calls: u64) -> u64 {
    let mut sum = 0;
    for k in 0..calls {
        let which = (k & 1) as usize;
        let client = (k % bench.clusters as u64) as usize;
        sum += select(&bench.snaps[which], views[which], Some(client), bench.now)
            .tiers
            .len() as u64;
    }
    sum
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Under callgrind: one configuration, `calls` decisions inside `measured_loop` only.
fn callgrind(args: &[String]) {
    let [clusters, policy, calls] = args else {
        panic!("usage: select --callgrind CLUSTERS POLICY CALLS");
    };
    let clusters: usize = clusters.parse().expect("CLUSTERS");
    let calls: u64 = calls.parse().expect("CALLS");
    let bench = Bench::new(clusters, policy);
    let views = bench.views();
    black_box(warm_up(&bench, views, 2 * clusters as u64));
    let sum = measured_loop(&bench, views, calls);
    println!("callgrind clusters={clusters} policy={policy} calls={calls} checksum={sum}");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(at) = args.iter().position(|a| a == "--callgrind") {
        callgrind(&args[at + 1..]);
        return;
    }
    let rounds = env_or("SELECT_ROUNDS", 5).max(1);
    let calls = env_or("SELECT_CALLS", 1_000_000).max(1);
    let sizes: Vec<usize> = std::env::var("SELECT_SIZES")
        .unwrap_or_else(|_| "10,100,255".into())
        .split(',')
        .map(|s| s.trim().parse().expect("SELECT_SIZES: numbers"))
        .collect();
    println!(
        "select(): one service, client cluster varying per call, two snapshots alternating, \
         no cache; median of {rounds} rounds of {calls} calls"
    );
    println!(
        "{:>8} {:>9} {:>12} {:>12} {:>12} {:>7} {:>8}",
        "clusters", "policy", "ns/call", "min", "max", "tiers", "filtered"
    );
    let mut verdict = None;
    for &clusters in &sizes {
        for policy in ["locality", "tiers"] {
            let bench = Bench::new(clusters, policy);
            let views = bench.views();
            black_box(warm_up(&bench, views, calls / 10 + 2 * clusters as u64));
            let mut per_call = Vec::new();
            for _ in 0..rounds {
                let start = Instant::now();
                black_box(measured_loop(&bench, views, calls));
                per_call.push(start.elapsed().as_nanos() as f64 / calls as f64);
            }
            // What one decision looks like (client 0, first snapshot), for the record.
            let sample = select(&bench.snaps[0], views[0], Some(0), bench.now);
            let ns = median(per_call.clone());
            println!(
                "{:>8} {:>9} {:>12.1} {:>12.1} {:>12.1} {:>7} {:>8}",
                clusters,
                policy,
                ns,
                per_call.iter().copied().fold(f64::INFINITY, f64::min),
                per_call.iter().copied().fold(0.0, f64::max),
                sample.tiers.len(),
                sample.filtered.len(),
            );
            if clusters == 10 {
                let worst: f64 = verdict.map_or(ns, |v: f64| v.max(ns));
                verdict = Some(worst);
            }
        }
    }
    if let Some(ns) = verdict {
        let ok = ns < BUDGET_NS_10;
        println!(
            "budget: < {BUDGET_NS_10:.0} ns/call for 10 clusters: {ns:.1} ns (slowest policy) — {}",
            if ok { "within" } else { "OVER BUDGET" }
        );
    }
}
