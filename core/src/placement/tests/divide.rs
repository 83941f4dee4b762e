//! Webster/Sainte-Laguë and the capacity division, on their own and through a decision.

use proptest::prelude::*;

use super::*;
use crate::placement::divide::{Party, Room, aggregate, by_capacity, webster};

fn parties(weights: &[u64]) -> Vec<Party> {
    weights
        .iter()
        .enumerate()
        .map(|(i, &weight)| Party {
            weight,
            cap: u64::MAX,
            tie: i as u64,
        })
        .collect()
}

/// The definition: one seat at a time to the largest w/(2s+1), ties to fewer seats, then
/// tie, then index.
fn naive(parties: &[Party], total: u64) -> Vec<u64> {
    let mut seats = vec![0u64; parties.len()];
    for _ in 0..total {
        let best = (0..parties.len())
            .filter(|&i| parties[i].weight > 0 && seats[i] < parties[i].cap)
            .max_by(|&a, &b| {
                let pa = u128::from(parties[a].weight) * u128::from(2 * seats[b] + 1);
                let pb = u128::from(parties[b].weight) * u128::from(2 * seats[a] + 1);
                pa.cmp(&pb)
                    .then(seats[b].cmp(&seats[a]))
                    .then(parties[b].tie.cmp(&parties[a].tie))
                    .then(b.cmp(&a))
            });
        match best {
            Some(i) => seats[i] += 1,
            None => break,
        }
    }
    seats
}

struct Case {
    name: &'static str,
    weights: &'static [u64],
    total: u64,
    expect: &'static [u64],
}

#[test]
fn webster_cases() {
    let cases = [
        Case {
            name: "the issue: 9 replicas at 1:2 give 3/6",
            weights: &[1, 2],
            total: 9,
            expect: &[3, 6],
        },
        Case {
            name: "the issue: 10 at 1:2 give 3/7",
            weights: &[1, 2],
            total: 10,
            expect: &[3, 7],
        },
        Case {
            name: "the issue: 11 at 1:2 give 4/7",
            weights: &[1, 2],
            total: 11,
            expect: &[4, 7],
        },
        Case {
            name: "Sainte-Laguë's classic example (Wikipedia, Karmada's webstermethod_test): 8 seats",
            weights: &[100_000, 80_000, 30_000, 20_000],
            total: 8,
            expect: &[3, 3, 1, 1],
        },
        Case {
            name: "the classic example after 5 seats",
            weights: &[100_000, 80_000, 30_000, 20_000],
            total: 5,
            expect: &[2, 2, 1, 0],
        },
        Case {
            name: "Karmada's ExampleAllocateWebsterSeats: 1200/900/400, 4 seats; the 400 tie goes to fewer seats",
            weights: &[1200, 900, 400],
            total: 4,
            expect: &[2, 1, 1],
        },
        Case {
            name: "a zero weight takes nothing",
            weights: &[0, 1, 1],
            total: 4,
            expect: &[0, 2, 2],
        },
        Case {
            name: "equal weights, one seat: the smaller tie wins",
            weights: &[5, 5],
            total: 1,
            expect: &[1, 0],
        },
        Case {
            name: "no seats",
            weights: &[1, 2],
            total: 0,
            expect: &[0, 0],
        },
        Case {
            name: "many seats, one heavy party",
            weights: &[1, 1000],
            total: 1001,
            expect: &[1, 1000],
        },
    ];
    for c in cases {
        let ps = parties(c.weights);
        assert_eq!(webster(&ps, c.total), c.expect, "{}", c.name);
        assert_eq!(naive(&ps, c.total), c.expect, "{} (naive)", c.name);
    }
}

#[test]
fn webster_respects_caps() {
    let ps = vec![
        Party {
            weight: 1,
            cap: 1,
            tie: 0,
        },
        Party {
            weight: 100,
            cap: 100,
            tie: 1,
        },
    ];
    assert_eq!(webster(&ps, 101), vec![1, 100]);
    assert_eq!(
        webster(&ps, 500),
        vec![1, 100],
        "not enough room: everyone full"
    );
}

#[test]
fn ties_follow_a_per_object_order_of_cluster_names() {
    // Three equal clusters, 4 replicas: one gets 2; which one depends on the object, and is
    // the same every time for the same object.
    let world = World::new(&["a", "b", "c"]).policy(vec![], weights(&[]));
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..12 {
        let w = world.clone().deployment(&format!("web-{i}"), Some(4));
        let d1 = w.decide(&mut Placer::new(), 0, &format!("web-{i}"));
        let d2 = w.decide(&mut Placer::new(), 0, &format!("web-{i}"));
        assert_eq!(d1, d2, "stable");
        assert_eq!(counts(&d1).iter().map(|c| c.1).sum::<u32>(), 4);
        let two = counts(&d1)
            .into_iter()
            .find(|c| c.1 == 2)
            .expect("one has 2")
            .0;
        seen.insert(two.to_owned());
    }
    assert!(
        seen.len() > 1,
        "the tie does not always go to the same cluster: {seen:?}"
    );
}

#[test]
fn static_weights_through_a_decision() {
    let world = World::new(&["eu-1", "us-1", "us-2"])
        .policy(
            vec![],
            weights(&[(&["eu-1"], 1), (&["us-1"], 2), (&["us-2"], 0)]),
        )
        .deployment("web", Some(9));
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert!(d.is_scheduled());
    assert_eq!(counts(&d), vec![("eu-1", 3), ("us-1", 6)]);
    assert_eq!(d.placed[1].reason, PlacedReason::Weight(2));
    assert_eq!(excluded(&d), vec![("us-2", PlacementFilter::WeightZero)]);
}

#[test]
fn weights_all_zero_are_unschedulable() {
    let world = World::new(&["a", "b"])
        .policy(vec![], weights(&[(&["a", "b"], 0)]))
        .deployment("web", Some(3));
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert!(matches!(d.outcome, Outcome::Unschedulable { .. }), "{d:?}");
    assert!(d.placed.is_empty());
    assert_eq!(reason_of(&d, "a"), PlacementFilter::WeightZero);
}

#[test]
fn fewer_replicas_than_clusters_leave_some_without() {
    let world = World::new(&["a", "b", "c"])
        .policy(vec![], weights(&[]))
        .deployment("web", Some(2));
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(d.placed.len(), 2);
    assert_eq!(d.excluded.len(), 1);
    assert_eq!(d.excluded[0].reason, PlacementFilter::NoReplicas);
}

fn rooms(avail: &[u64], base: &[u64]) -> Vec<Room> {
    avail
        .iter()
        .zip(base)
        .enumerate()
        .map(|(i, (&avail, &base))| Room {
            avail,
            base,
            tie: i as u64,
            rank: 0,
        })
        .collect()
}

#[test]
fn capacity_division_is_proportional_then_steady() {
    // Fresh: in proportion to room.
    assert_eq!(by_capacity(&rooms(&[10, 30], &[0, 0]), 8, true), vec![2, 6]);
    // Steady scale-up: the previous split stays, the increment goes by room left.
    assert_eq!(
        by_capacity(&rooms(&[10, 30], &[5, 3]), 12, false),
        vec![6, 6]
    );
    // Steady scale-down: the previous split shrinks proportionally, nobody grows.
    assert_eq!(
        by_capacity(&rooms(&[10, 30], &[6, 6]), 6, false),
        vec![3, 3]
    );
    assert_eq!(
        by_capacity(&rooms(&[10, 30], &[6, 2]), 4, false),
        vec![3, 1]
    );
    // Fresh ignores the previous split.
    assert_eq!(by_capacity(&rooms(&[10, 30], &[6, 2]), 8, true), vec![2, 6]);
}

#[test]
fn aggregated_uses_the_fewest_clusters_roomiest_first() {
    assert_eq!(
        aggregate(&rooms(&[4, 10, 6], &[0, 0, 0]), 12, true),
        vec![1, 2]
    );
    assert_eq!(aggregate(&rooms(&[4, 10, 6], &[0, 0, 0]), 9, true), vec![1]);
    // Steady: the holders first, and only them when they hold enough.
    assert_eq!(
        aggregate(&rooms(&[4, 10, 6], &[3, 0, 0]), 3, false),
        vec![0]
    );
    assert_eq!(
        aggregate(&rooms(&[4, 10, 6], &[3, 0, 0]), 12, false),
        vec![0, 1]
    );
}

#[test]
fn capacity_steady_scale_up_and_down_through_decisions() {
    let mut world = World::new(&["a", "b", "c"])
        .pods(&[10, 20, 30])
        .policy(vec![], divided(Division::AvailableCapacity))
        .deployment("web", Some(12));
    let mut placer = Placer::new();
    let d = world.decide(&mut placer, 0, "web");
    assert_eq!(
        counts(&d),
        vec![("a", 2), ("b", 4), ("c", 6)],
        "fresh: 1:2:3"
    );
    assert_eq!(d.placed[0].reason, PlacedReason::Capacity { free: 10 });
    // The pods now run there: the clusters report less free room (live accounting).
    world.capacities = vec![
        Some(crate::testing::pods_free(8)),
        Some(crate::testing::pods_free(16)),
        Some(crate::testing::pods_free(24)),
    ];
    let again = world.decide(&mut placer, 1, "web");
    assert_eq!(
        counts(&again),
        counts(&d),
        "steady: same inputs, same split"
    );
    // Scale up by 6: the split stays, the 6 go by room left (8:16:24).
    world.replicas("web", 18);
    let up = world.decide(&mut placer, 2, "web");
    assert_eq!(counts(&up), vec![("a", 3), ("b", 6), ("c", 9)]);
    // Scale down to 6: proportional shrink, nobody grows.
    world.replicas("web", 6);
    let down = world.decide(&mut placer, 3, "web");
    assert_eq!(counts(&down), vec![("a", 1), ("b", 2), ("c", 3)]);
    // A newly feasible cluster gets nothing until replicas need a home.
    let mut bigger = world.clone();
    bigger.views.push(healthy(cluster("d", "d", "d")));
    bigger.capacities.push(Some(crate::testing::pods_free(100)));
    let still = bigger.decide(&mut placer, 4, "web");
    assert_eq!(counts(&still), vec![("a", 1), ("b", 2), ("c", 3)]);
    assert_eq!(reason_of(&still, "d"), PlacementFilter::NoReplicas);
}

#[test]
fn capacity_unknown_or_full_is_excluded_and_too_little_is_unschedulable() {
    let mut world = World::new(&["a", "b", "c"])
        .pods(&[3, 0, 4])
        .policy(vec![], divided(Division::AvailableCapacity))
        .deployment("web", Some(6));
    world.capacities[0] = None;
    let d = world.decide(&mut Placer::new(), 0, "web");
    let Outcome::Unschedulable { reason } = &d.outcome else {
        panic!("4 free for 6: {d:?}");
    };
    assert_eq!(reason, "needs 6 replicas, 4 free (c: 4)");
    assert_eq!(
        excluded(&d),
        vec![
            ("a", PlacementFilter::CapacityUnknown),
            ("b", PlacementFilter::NoCapacity),
            (
                "c",
                PlacementFilter::TierUnusable {
                    tier: None,
                    why: Arc::from("needs 6 replicas, 4 free (c: 4)")
                }
            ),
        ]
    );
    world.replicas("web", 4);
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(counts(&d), vec![("c", 4)]);
}

#[test]
fn aggregated_through_decisions() {
    let mut world = World::new(&["a", "b", "c"])
        .pods(&[4, 12, 6])
        .policy(vec![], divided(Division::Aggregated))
        .deployment("web", Some(15));
    let mut placer = Placer::new();
    let d = world.decide(&mut placer, 0, "web");
    assert_eq!(counts(&d), vec![("b", 10), ("c", 5)], "b and c fit 15, 2:1");
    assert_eq!(reason_of(&d, "a"), PlacementFilter::NoReplicas);
    assert_eq!(d.placed[0].reason, PlacedReason::Aggregated { free: 12 });
    // Scale down: only the holders, shrunk in proportion.
    world.replicas("web", 6);
    let down = world.decide(&mut placer, 1, "web");
    assert_eq!(counts(&down), vec![("b", 4), ("c", 2)]);
    // Scale up: the holders keep theirs and have room for the rest, so a stays out.
    world.replicas("web", 18);
    let up = world.decide(&mut placer, 2, "web");
    assert_eq!(up.placed.len(), 2, "{up:?}");
    assert!(up.placed.iter().all(|p| p.cluster.as_str() != "a"));
    assert_eq!(counts(&up).iter().map(|c| c.1).sum::<u32>(), 18);
    assert!(
        counts(&up)
            .iter()
            .zip(counts(&down))
            .all(|(u, d)| u.1 >= d.1)
    );
    // A fresh placer picks the single roomiest cluster when it fits.
    world.replicas("web", 12);
    assert_eq!(
        counts(&world.decide(&mut Placer::new(), 0, "web")),
        vec![("b", 12)]
    );
}

proptest! {
    #[test]
    fn webster_matches_its_definition(
        weights in prop::collection::vec(0u64..50, 1..8),
        caps in prop::collection::vec(0u64..40, 8),
        total in 0u64..120,
    ) {
        let ps: Vec<Party> = weights
            .iter()
            .zip(&caps)
            .enumerate()
            .map(|(i, (&weight, &cap))| Party { weight, cap: if cap > 30 { u64::MAX } else { cap }, tie: (i as u64 * 7919) % 13 })
            .collect();
        prop_assert_eq!(webster(&ps, total), naive(&ps, total));
    }

    #[test]
    fn webster_is_house_monotone(weights in prop::collection::vec(1u64..50, 1..8), total in 1u64..120) {
        let ps = parties(&weights);
        let more = webster(&ps, total);
        let less = webster(&ps, total - 1);
        prop_assert!(less.iter().zip(&more).all(|(l, m)| l <= m));
    }
}
