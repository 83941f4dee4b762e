//! A full round of 10,000 templates over 255 clusters (static weights, capacity division,
//! spread). Ignored: run it in release, `cargo test --release -p meridian-core -- --ignored
//! full_round`; the budget (DESIGN §8) is checked by `bench/`, this only bounds it loosely.

use std::time::Instant as Clock;

use super::*;
use crate::testing::tier;

#[test]
#[ignore = "timing: run in release"]
fn full_round_of_10000_templates_over_255_clusters() {
    let names: Vec<String> = (0..255)
        .map(|i| format!("{}-{i:03}", ["eu", "us", "ap"][i % 3]))
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut world = World::new(&refs).pods(&(0..255).map(|i| 50 + i % 17).collect::<Vec<u64>>());
    let eu: Vec<&str> = refs
        .iter()
        .copied()
        .filter(|n| n.starts_with("eu"))
        .collect();
    let rest: Vec<&str> = refs
        .iter()
        .copied()
        .filter(|n| !n.starts_with("eu"))
        .collect();
    let tiers = vec![tier("eu", &eu), tier("rest", &rest)];
    let spread = vec![SpreadConstraint {
        by: SpreadBy::Cluster,
        min_groups: 2,
        max_groups: Some(20),
    }];
    let kinds = [
        weights(&[(&eu[..10], 3)]),
        divided(Division::AvailableCapacity),
        PlacementPolicy {
            spread,
            ..divided(Division::AvailableCapacity)
        },
    ];
    world.policies = kinds
        .into_iter()
        .enumerate()
        .map(|(i, placement)| {
            let mut p = placing(&format!("p{i}"), i as i64, tiers.clone(), placement);
            p.templates[0].selector = Some(crate::policy::LabelSelector {
                match_labels: [("policy".to_owned(), format!("p{i}"))].into(),
                match_expressions: vec![],
            });
            p
        })
        .collect();
    world.templates = (0..10_000)
        .map(|i| {
            let mut t = deployment(&format!("app-{i}"), Some(3 + (i % 20)));
            t.labels.insert("policy".into(), format!("p{}", i % 3));
            t
        })
        .collect();
    let mut placer = Placer::new();
    let first = Clock::now();
    let round = world.place(&mut placer, 0);
    let cold = first.elapsed();
    let again = Clock::now();
    let steady = world.place(&mut placer, 1);
    let warm = again.elapsed();
    assert_eq!(round.decisions.len(), 10_000);
    assert!(round.decisions.values().all(Decision::is_scheduled));
    assert_eq!(steady.decisions.len(), 10_000);
    println!(
        "10,000 templates × 255 clusters: first round {cold:?}, steady round {warm:?} \
         ({:?} per template)",
        warm / 10_000
    );
    assert!(
        warm.as_secs_f64() < 5.0,
        "far outside the 1 s budget: {warm:?}"
    );
}
