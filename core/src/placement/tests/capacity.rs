//! Capacity accounting, as the cases that found it wrong: a decided replica is
//! never room, a template's own running pods are, and the templates of one round never both
//! take the last of it.

use super::*;
use crate::testing::{capacity, running, tier};

/// The federation example: eu-1 (2 CPU) and eu-2 (1 CPU) first, us-1 (8 CPU) after; `web`
/// by available capacity, 500m per replica.
fn eu_first(cpus: [u64; 3], per_millis: u64, replicas: u32) -> World {
    let mut world = World::new(&["eu-1", "eu-2", "us-1"])
        .policy(
            vec![tier("eu", &["eu-1", "eu-2"]), tier("us", &["us-1"])],
            divided(Division::AvailableCapacity),
        )
        .deployment("web", Some(replicas));
    for (at, cpu) in cpus.into_iter().enumerate() {
        world.capacities[at] = Some(capacity(cpu * 1000, 64 << 10, 0, 0));
    }
    world.template("web").requests.cpu_millis = per_millis;
    world
}

/// Every cluster holds no more replicas than its capacity fits.
fn within_capacity(world: &World, d: &Decision) {
    let per = world.templates[0].requests;
    for p in &d.placed {
        let at = world
            .views
            .iter()
            .position(|v| v.spec.id == p.cluster)
            .expect("a cluster of the world");
        let fits = world.capacities[at]
            .as_ref()
            .expect("capacity")
            .free_replicas(&per);
        assert!(
            u64::from(p.replicas.unwrap_or(0)) <= fits,
            "{} holds {:?} where {fits} fit: {d:?}",
            p.cluster,
            p.replicas
        );
    }
}

struct Step {
    replicas: u32,
    expect: &'static [(&'static str, u32)],
}

struct Case {
    name: &'static str,
    cpus: [u64; 3],
    per_millis: u64,
    steps: &'static [Step],
}

#[test]
fn a_decided_replica_is_never_free_room() {
    let cases = [
        Case {
            name: "the 2-CPU/500m member: 4 fit in eu-1, 2 in eu-2; 7 and 8 go to the US",
            cpus: [2, 1, 8],
            per_millis: 500,
            steps: &[
                Step {
                    replicas: 6,
                    expect: &[("eu-1", 4), ("eu-2", 2)],
                },
                Step {
                    replicas: 7,
                    expect: &[("us-1", 7)],
                },
                Step {
                    replicas: 8,
                    expect: &[("us-1", 8)],
                },
            ],
        },
        Case {
            name: "3-CPU and 1-CPU members, 1-CPU replicas: 4 fit, 5 to 7 go to the next tier",
            cpus: [3, 1, 8],
            per_millis: 1000,
            steps: &[
                Step {
                    replicas: 4,
                    expect: &[("eu-1", 3), ("eu-2", 1)],
                },
                Step {
                    replicas: 5,
                    expect: &[("us-1", 5)],
                },
                Step {
                    replicas: 6,
                    expect: &[("us-1", 6)],
                },
                Step {
                    replicas: 7,
                    expect: &[("us-1", 7)],
                },
            ],
        },
    ];
    for case in cases {
        let mut world = eu_first(case.cpus, case.per_millis, case.steps[0].replicas);
        let mut placer = Placer::new();
        for (i, step) in case.steps.iter().enumerate() {
            world.replicas("web", step.replicas);
            let served = world.decide(&mut placer, i as u64, "web");
            assert_eq!(
                counts(&served),
                step.expect,
                "{}: {} replicas",
                case.name,
                step.replicas
            );
            within_capacity(&world, &served);
            let rendered = world.decide(&mut Placer::new(), i as u64, "web");
            assert_eq!(
                counts(&served),
                counts(&rendered),
                "{}: serve and render at {} replicas",
                case.name,
                step.replicas
            );
        }
    }
}

#[test]
fn forty_replicas_in_24_cpus_are_unschedulable_and_keep_the_last_placement() {
    let mut world = World::new(&["a", "b", "c"])
        .policy(vec![], divided(Division::AvailableCapacity))
        .deployment("web", Some(20));
    for at in 0..3 {
        world.capacities[at] = Some(capacity(8000, 64 << 10, 0, 0));
    }
    world.template("web").requests.cpu_millis = 1000;
    let mut placer = Placer::new();
    let d = world.decide(&mut placer, 0, "web");
    assert_eq!(counts(&d).iter().map(|c| c.1).sum::<u32>(), 20);
    within_capacity(&world, &d);
    world.replicas("web", 40);
    let d = world.decide(&mut placer, 1, "web");
    assert_eq!(
        d.outcome,
        Outcome::Unschedulable {
            reason: "needs 40 replicas, 24 free (a: 8, b: 8, c: 8)".into()
        }
    );
    assert_eq!(
        counts(&d).iter().map(|c| c.1).sum::<u32>(),
        20,
        "the 20 stay"
    );
}

#[test]
fn own_running_pods_are_room_for_their_template_only() {
    // eu-1 runs web's 4 pods (its 2 CPU all requested): web still fits 4 there, and a
    // scale-up to 5 adds one in eu-2; `api`, another template, finds eu-1 full.
    let mut world = eu_first([2, 1, 8], 500, 4);
    let web = world.template("web").clone();
    world.capacities[0] = world.capacities[0].take().map(|c| running(c, &web, 4));
    let mut placer = Placer::new();
    let d = world.decide(&mut placer, 0, "web");
    assert_eq!(
        counts(&d),
        vec![("eu-1", 3), ("eu-2", 1)],
        "4 by room (4:2)"
    );
    world.replicas("web", 5);
    let d = world.decide(&mut placer, 1, "web");
    assert_eq!(
        counts(&d),
        vec![("eu-1", 4), ("eu-2", 1)],
        "the one more by room left (1:1)"
    );
    world.replicas("web", 6);
    let d = world.decide(&mut placer, 2, "web");
    assert_eq!(counts(&d), vec![("eu-1", 4), ("eu-2", 2)]);
    world.replicas("web", 7);
    let d = world.decide(&mut placer, 3, "web");
    assert_eq!(
        counts(&d),
        vec![("us-1", 7)],
        "its own 4 pods are not room for 7"
    );

    let mut other = eu_first([2, 1, 8], 500, 2);
    other.templates[0].key = TemplateKey::new("apps/v1", "Deployment", "shop", "api");
    other.capacities[0] = other.capacities[0].take().map(|c| running(c, &web, 4));
    let d = other.decide(&mut Placer::new(), 0, "api");
    assert_eq!(
        counts(&d),
        vec![("eu-2", 2)],
        "web's pods are not room for api"
    );
    assert_eq!(reason_of(&d, "eu-1"), PlacementFilter::NoCapacity);
}

#[test]
fn two_templates_of_one_round_never_both_take_the_last_room() {
    // Room for 4 in a; `api` (decided first: templates in name order) takes 3 of it, so
    // `web` cannot fit its 3 there and goes to b — in one round, and the next.
    let mut world = World::new(&["a", "b"])
        .policy(
            vec![tier("first", &["a"]), tier("then", &["b"])],
            divided(Division::AvailableCapacity),
        )
        .deployment("api", Some(3))
        .deployment("web", Some(3));
    world.capacities = vec![
        Some(crate::testing::pods_free(4)),
        Some(crate::testing::pods_free(10)),
    ];
    let mut placer = Placer::new();
    for round in 0..3 {
        let placements = world.place(&mut placer, round);
        let of = |name: &str| {
            placements
                .decisions
                .values()
                .find(|d| &*d.template.name == name)
                .map(|d| {
                    counts(d)
                        .into_iter()
                        .map(|(c, n)| (c.to_owned(), n))
                        .collect::<Vec<_>>()
                })
                .expect("decided")
        };
        assert_eq!(of("api"), vec![("a".to_owned(), 3)], "round {round}");
        assert_eq!(of("web"), vec![("b".to_owned(), 3)], "round {round}");
    }
}

#[test]
fn a_scale_down_into_the_first_tiers_room_returns_there_after_the_failback_window() {
    for window in [0, 300] {
        let mut world = eu_first([2, 1, 8], 500, 8);
        world.placement("p").failback_after_seconds = window;
        let mut placer = Placer::new();
        let d = world.decide(&mut placer, 0, "web");
        assert_eq!(counts(&d), vec![("us-1", 8)]);
        world.replicas("web", 6);
        let round = world.place(&mut placer, 10);
        let d = &round.decisions.values().next().expect("web");
        if window == 0 {
            assert_eq!(
                counts(d),
                vec![("eu-1", 4), ("eu-2", 2)],
                "at once without a window"
            );
            assert_eq!(round.next_deadline, None);
            continue;
        }
        assert_eq!(
            counts(d),
            vec![("us-1", 6)],
            "stays for failbackAfterSeconds"
        );
        assert_eq!(
            round.next_deadline,
            Some(world.at(10 + window)),
            "decided again then"
        );
        assert_eq!(
            reason_of(d, "eu-1"),
            PlacementFilter::TierUnusable {
                tier: Some("eu".into()),
                why: "has room again: the template returns after failbackAfterSeconds (300 s)"
                    .into()
            }
        );
        let d = world.decide(&mut placer, 10 + window - 1, "web");
        assert_eq!(
            counts(&d),
            vec![("us-1", 6)],
            "a later round inside the window"
        );
        let d = world.decide(&mut placer, 10 + window, "web");
        assert_eq!(
            counts(&d),
            vec![("eu-1", 4), ("eu-2", 2)],
            "the window passed: EU first"
        );
        let rendered = world.decide(&mut Placer::new(), 10 + window, "web");
        assert_eq!(
            counts(&d),
            counts(&rendered),
            "serve and render agree once settled"
        );
    }
}

#[test]
fn the_window_restarts_when_the_first_tier_loses_the_room_again() {
    let mut world = eu_first([2, 1, 8], 500, 8);
    world.placement("p").failback_after_seconds = 60;
    let mut placer = Placer::new();
    world.decide(&mut placer, 0, "web");
    world.replicas("web", 6);
    assert_eq!(
        counts(&world.decide(&mut placer, 10, "web")),
        vec![("us-1", 6)]
    );
    // eu-2 loses its room (another workload's pods): EU cannot take 6, the clock stops.
    let full = world.capacities[1].clone();
    world.capacities[1] = Some(capacity(1000, 64 << 10, 1000, 0));
    assert_eq!(
        counts(&world.decide(&mut placer, 40, "web")),
        vec![("us-1", 6)]
    );
    world.capacities[1] = full;
    assert_eq!(
        counts(&world.decide(&mut placer, 80, "web")),
        vec![("us-1", 6)],
        "60 s from 80"
    );
    assert_eq!(
        counts(&world.decide(&mut placer, 140, "web")),
        vec![("eu-1", 4), ("eu-2", 2)]
    );
}

/// One edit of a serving fleet: a replica count, or one cluster's CPUs.
#[derive(Clone, Debug)]
enum Edit {
    Replicas(u32),
    Cpus(usize, u64),
}

fn edit() -> impl proptest::strategy::Strategy<Value = Edit> {
    use proptest::prelude::*;
    prop_oneof![
        (0u32..20).prop_map(Edit::Replicas),
        (0usize..3, 0u64..9).prop_map(|(c, n)| Edit::Cpus(c, n)),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// `serve` ≡ `render`: after every edit, once settled past the failback window, the
    /// served placement uses the tier a fresh render uses (the split inside it may differ:
    /// steady division is the one other hysteresis), the same outcome and total, and never
    /// holds more replicas in a cluster than fit there.
    #[test]
    fn serve_settles_where_render_places(
        edits in proptest::collection::vec(edit(), 1..12),
        window in proptest::prop_oneof![proptest::strategy::Just(0u64), proptest::strategy::Just(30)],
    ) {
        let mut world = eu_first([2, 1, 8], 500, 6);
        world.placement("p").failback_after_seconds = window;
        let mut placer = Placer::new();
        let mut at = 0;
        for e in edits {
            match e {
                Edit::Replicas(r) => world.replicas("web", r),
                Edit::Cpus(c, n) => world.capacities[c] = Some(capacity(n * 1000, 64 << 10, 0, 0)),
            }
            at += 1;
            let served = world.decide(&mut placer, at, "web");
            if served.is_scheduled() {
                within_capacity(&world, &served);
            }
            at += window + 1;
            let settled = world.decide(&mut placer, at, "web");
            let rendered = world.decide(&mut Placer::new(), at, "web");
            proptest::prop_assert_eq!(settled.is_scheduled(), rendered.is_scheduled(), "{:?} / {:?}", settled, rendered);
            if rendered.is_scheduled() {
                within_capacity(&world, &settled);
                proptest::prop_assert_eq!(&settled.tier, &rendered.tier, "{:?} / {:?}", settled, rendered);
                let total = |d: &Decision| counts(d).iter().map(|c| c.1).sum::<u32>();
                proptest::prop_assert_eq!(total(&settled), total(&rendered));
            }
        }
    }
}

#[test]
fn a_service_follows_its_deployment_to_the_tier_with_room() {
    let mut world = eu_first([2, 1, 8], 500, 7);
    let mut service = crate::testing::config_map("web");
    service.key = TemplateKey::new("v1", "Service", "shop", "web");
    world.templates.push(service.clone());
    world.policies[0].templates.push(TemplateSelector {
        kind: Some("Service".into()),
        ..TemplateSelector::default()
    });
    let mut placer = Placer::new();
    let round = world.place(&mut placer, 0);
    let d = &round.decisions[&service.key];
    assert_eq!(
        split(d),
        vec![("us-1", None)],
        "where the 7 pods are: {d:?}"
    );
    assert_eq!(d.tier.as_deref(), Some("us"));
    let web = TemplateKey::new("apps/v1", "Deployment", "shop", "web");
    assert_eq!(d.placed[0].reason, PlacedReason::Follows(vec![web.clone()]));
    assert_eq!(reason_of(d, "eu-1"), PlacementFilter::WorkloadsElsewhere);
    // Back to 6: both go to the EU together.
    world.replicas("web", 6);
    let round = world.place(&mut placer, 1);
    assert_eq!(
        split(&round.decisions[&service.key]),
        vec![("eu-1", None), ("eu-2", None)]
    );
    // Unschedulable: the Deployment keeps its placement, and its Service stays beside it.
    world.replicas("web", 100);
    let round = world.place(&mut placer, 2);
    assert!(!round.decisions[&web].is_scheduled());
    let d = &round.decisions[&service.key];
    assert_eq!(
        split(d),
        vec![("eu-1", None), ("eu-2", None)],
        "kept: {d:?}"
    );
    // A fresh round (render) with nowhere for the Deployment: the Service is placed nowhere.
    let round = world.place(&mut Placer::new(), 3);
    let d = &round.decisions[&service.key];
    assert_eq!(
        d.outcome,
        Outcome::Unschedulable {
            reason: "follows Deployment/web, placed nowhere".into()
        }
    );
    assert!(d.placed.is_empty());
}

#[test]
fn a_template_placed_before_the_first_tier_reported_its_capacity_returns_there_at_once() {
    // At start-up members report their Nodes at their own pace: us-1 first. The Deployment
    // goes to the US for want of knowing the EU's room — no move worth failbackAfterSeconds.
    let mut world = eu_first([2, 1, 8], 500, 6);
    world.placement("p").failback_after_seconds = 300;
    let known = world.capacities.clone();
    world.capacities[0] = None;
    world.capacities[1] = None;
    let mut placer = Placer::new();
    let d = world.decide(&mut placer, 0, "web");
    assert_eq!(counts(&d), vec![("us-1", 6)]);
    world.capacities = known;
    let d = world.decide(&mut placer, 1, "web");
    assert_eq!(
        counts(&d),
        vec![("eu-1", 4), ("eu-2", 2)],
        "back to the EU as soon as its room is known, as render places it"
    );
}
