//! The rules one by one: tiers and taints, NoExecute and tolerationSeconds, failover and
//! failback, standby, spread, overrides, dependencies, unschedulable.

use super::*;
use crate::model::ObjectKey;
use crate::placement::TemplateSelector;
use crate::registry::Health;
use crate::testing::{config_map, tier, unreachable};

use PlacementFilter::{
    FailedOver, FailingBack, LaterTier, NoExecuteTaint, NoScheduleTaint, NotInAffinities,
    PreferNoScheduleTaint, SpreadMaxGroups,
};

fn eu_us() -> Vec<AffinityTier> {
    vec![tier("eu", &["eu-1", "eu-2"]), tier("us", &["us-1"])]
}

fn duplicated() -> PlacementPolicy {
    PlacementPolicy::default()
}

#[test]
fn no_policy_no_decision() {
    let mut world = World::new(&["a"]).deployment("web", Some(1));
    world.templates.push(config_map("cfg"));
    assert!(world.place(&mut Placer::new(), 0).decisions.is_empty());
}

#[test]
fn the_oldest_placing_policy_governs() {
    let mut world = World::new(&["a", "b"]).deployment("web", Some(2));
    world.policies = vec![
        placing("old", 1, vec![tier("only-a", &["a"])], duplicated()),
        placing("young", 2, vec![tier("only-b", &["b"])], duplicated()),
    ];
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(d.policy, Some(ObjectKey::new("shop", "old")));
    assert_eq!(split(&d), vec![("a", Some(2))]);
    assert_eq!(d.tier.as_deref(), Some("only-a"));
}

struct TaintCase {
    name: &'static str,
    taints: &'static [(&'static str, TaintEffect)],
    tolerate: &'static [(&'static str, TaintEffect)],
    tier: &'static str,
    placed: &'static [&'static str],
    excluded: Vec<(&'static str, PlacementFilter)>,
}

#[test]
fn tiers_with_taints() {
    use TaintEffect::{NoExecute, NoSchedule, PreferNoSchedule};
    let cases = [
        TaintCase {
            name: "untainted: the first tier, the next is later",
            taints: &[],
            tolerate: &[],
            tier: "eu",
            placed: &["eu-1", "eu-2"],
            excluded: vec![("ap-1", NotInAffinities), ("us-1", LaterTier("us".into()))],
        },
        TaintCase {
            name: "NoSchedule and NoExecute empty the first tier: the second is used",
            taints: &[("eu-1", NoSchedule), ("eu-2", NoExecute)],
            tolerate: &[],
            tier: "us",
            placed: &["us-1"],
            excluded: vec![
                ("ap-1", NotInAffinities),
                ("eu-1", NoScheduleTaint("t".into())),
                ("eu-2", NoExecuteTaint("t".into())),
            ],
        },
        TaintCase {
            name: "a tolerated NoSchedule taint keeps the first tier",
            taints: &[("eu-1", NoSchedule), ("eu-2", NoExecute)],
            tolerate: &[("t", NoSchedule)],
            tier: "eu",
            placed: &["eu-1"],
            excluded: vec![
                ("ap-1", NotInAffinities),
                ("eu-2", NoExecuteTaint("t".into())),
                ("us-1", LaterTier("us".into())),
            ],
        },
        TaintCase {
            name: "PreferNoSchedule: the tier's others suffice",
            taints: &[("eu-1", PreferNoSchedule)],
            tolerate: &[],
            tier: "eu",
            placed: &["eu-2"],
            excluded: vec![
                ("ap-1", NotInAffinities),
                ("eu-1", PreferNoScheduleTaint("t".into())),
                ("us-1", LaterTier("us".into())),
            ],
        },
        TaintCase {
            name: "PreferNoSchedule is the tier's last resort",
            taints: &[("eu-1", PreferNoSchedule), ("eu-2", NoExecute)],
            tolerate: &[],
            tier: "eu",
            placed: &["eu-1"],
            excluded: vec![
                ("ap-1", NotInAffinities),
                ("eu-2", NoExecuteTaint("t".into())),
                ("us-1", LaterTier("us".into())),
            ],
        },
    ];
    for c in cases {
        let mut world = World::new(&["eu-1", "eu-2", "us-1", "ap-1"])
            .policy(eu_us(), duplicated())
            .deployment("web", Some(2));
        for (cluster, effect) in c.taints {
            world.spec(cluster).taints.push(taint("t", *effect));
        }
        world.tolerate(
            c.tolerate
                .iter()
                .map(|(k, e)| Toleration::exists(*k, Some(*e)))
                .collect(),
        );
        let d = world.decide(&mut Placer::new(), 0, "web");
        assert!(d.is_scheduled(), "{}: {d:?}", c.name);
        assert_eq!(d.tier.as_deref(), Some(c.tier), "{}", c.name);
        let placed: Vec<&str> = d.placed.iter().map(|p| p.cluster.as_str()).collect();
        assert_eq!(placed, c.placed, "{}", c.name);
        assert!(
            d.placed.iter().all(|p| p.replicas == Some(2)),
            "{}: duplicated",
            c.name
        );
        assert_eq!(excluded(&d), c.excluded, "{}", c.name);
    }
}

#[test]
fn a_later_tier_may_widen_an_earlier_one() {
    // Karmada's ClusterAffinities: [eu], then [eu, us]; eu lacks room, the second tier
    // uses both regions.
    let world = World::new(&["eu-1", "us-1"])
        .pods(&[3, 3])
        .policy(
            vec![tier("eu", &["eu-1"]), tier("eu+us", &["eu-1", "us-1"])],
            divided(Division::AvailableCapacity),
        )
        .deployment("web", Some(5));
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(d.tier.as_deref(), Some("eu+us"));
    assert_eq!(counts(&d).iter().map(|c| c.1).sum::<u32>(), 5);
    assert_eq!(d.placed.len(), 2);
}

#[test]
fn no_capacity_in_any_tier_is_unschedulable_with_the_numbers() {
    let world = World::new(&["eu-1", "eu-2", "us-1"])
        .pods(&[1, 2, 4])
        .policy(eu_us(), divided(Division::AvailableCapacity))
        .deployment("web", Some(5));
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(
        d.outcome,
        Outcome::Unschedulable {
            reason: "tier eu: needs 5 replicas, 3 free (eu-1: 1, eu-2: 2); \
                     tier us: needs 5 replicas, 4 free (us-1: 4)"
                .into()
        }
    );
    assert!(d.placed.is_empty(), "nothing placed before");
    assert_eq!(d.excluded.len(), 3);
}

#[test]
fn no_execute_with_and_without_toleration_seconds() {
    let mut world = World::new(&["a", "b"])
        .policy(vec![], duplicated())
        .deployment("web", Some(1));
    world
        .spec("b")
        .taints
        .push(taint("maint", TaintEffect::NoExecute));
    // Not tolerated: out at once.
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(reason_of(&d, "b"), NoExecuteTaint("maint".into()));
    // Tolerated for ever.
    world.tolerate(vec![Toleration::exists(
        "maint",
        Some(TaintEffect::NoExecute),
    )]);
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(split(&d), vec![("a", Some(1)), ("b", Some(1))]);
    // Tolerated for 60 s from when placement first saw the taint (t = 10).
    world.tolerate(vec![Toleration {
        seconds: Some(60),
        ..Toleration::exists("maint", Some(TaintEffect::NoExecute))
    }]);
    let mut placer = Placer::new();
    let round = world.place(&mut placer, 10);
    assert_eq!(
        round.next_deadline,
        Some(world.at(70)),
        "wake when it runs out"
    );
    let at = |placer: &mut Placer, s| world.decide(placer, s, "web");
    assert_eq!(at(&mut placer, 69).placed.len(), 2, "still tolerated");
    assert_eq!(
        reason_of(&at(&mut placer, 70), "b"),
        NoExecuteTaint("maint".into())
    );
    // The taint goes: forgotten; it comes back: the 60 s count again.
    let tainted = world.clone();
    world.spec("b").taints.clear();
    assert_eq!(world.decide(&mut placer, 80, "web").placed.len(), 2);
    let world = tainted;
    assert_eq!(world.decide(&mut placer, 90, "web").placed.len(), 2);
    assert_eq!(world.decide(&mut placer, 149, "web").placed.len(), 2);
    assert_eq!(
        reason_of(&world.decide(&mut placer, 150, "web"), "b"),
        NoExecuteTaint("maint".into())
    );
}

fn failover_world() -> World {
    World::new(&["eu-1", "eu-2"])
        .policy(
            vec![],
            PlacementPolicy {
                failover_after_seconds: Some(60),
                failback_after_seconds: 30,
                ..weights(&[])
            },
        )
        .deployment("web", Some(4))
}

#[test]
fn failover_and_failback_with_hysteresis() {
    let mut world = failover_world();
    let mut placer = Placer::new();
    let spec = world.spec("eu-1").clone();
    assert_eq!(
        counts(&world.decide(&mut placer, 0, "web")),
        vec![("eu-1", 2), ("eu-2", 2)]
    );
    // Unreachable since t = 10: kept until t = 70.
    *world.view("eu-1") = unreachable(spec.clone(), world.at(10));
    let round = world.place(&mut placer, 30);
    assert_eq!(round.next_deadline, Some(world.at(70)));
    assert_eq!(
        round.decisions.values().next().expect("web").placed.len(),
        2
    );
    let d = world.decide(&mut placer, 70, "web");
    assert_eq!(counts(&d), vec![("eu-2", 4)], "failed over, total kept");
    assert_eq!(
        reason_of(&d, "eu-1"),
        FailedOver {
            unreachable_seconds: 60
        }
    );
    // Healthy again at t = 100: failing back until t = 130 …
    *world.view("eu-1") = ClusterView {
        recovered_at: Some(world.at(100)),
        ..healthy(spec.clone())
    };
    let round = world.place(&mut placer, 100);
    assert_eq!(round.next_deadline, Some(world.at(130)));
    let d = world.decide(&mut placer, 110, "web");
    assert_eq!(
        reason_of(&d, "eu-1"),
        FailingBack {
            remaining_seconds: 20
        }
    );
    // … but it flaps (Degraded at t = 115, Healthy at t = 120): the window restarts.
    world.view("eu-1").health = Health::Degraded;
    let d = world.decide(&mut placer, 115, "web");
    assert_eq!(
        reason_of(&d, "eu-1"),
        FailingBack {
            remaining_seconds: 30
        }
    );
    world.view("eu-1").health = Health::Healthy;
    assert_eq!(
        reason_of(&world.decide(&mut placer, 120, "web"), "eu-1"),
        FailingBack {
            remaining_seconds: 30
        }
    );
    // A short outage (shorter than afterSeconds) restarts it too.
    *world.view("eu-1") = unreachable(spec.clone(), world.at(125));
    assert_eq!(
        reason_of(&world.decide(&mut placer, 126, "web"), "eu-1"),
        FailingBack {
            remaining_seconds: 30
        }
    );
    *world.view("eu-1") = ClusterView {
        recovered_at: Some(world.at(128)),
        ..healthy(spec)
    };
    assert_eq!(
        reason_of(&world.decide(&mut placer, 150, "web"), "eu-1"),
        FailingBack {
            remaining_seconds: 8
        }
    );
    // Healthy from t = 128 for 30 s: back, the policy's split returns.
    let d = world.decide(&mut placer, 158, "web");
    assert_eq!(counts(&d), vec![("eu-1", 2), ("eu-2", 2)]);
}

#[test]
fn without_failover_an_unreachable_cluster_keeps_its_replicas() {
    let mut world = failover_world();
    let mut policy = (*world.policies[0].placement.clone().expect("placement")).clone();
    policy.failover_after_seconds = None;
    world.policies[0].placement = Some(Arc::new(policy));
    let spec = world.spec("eu-1").clone();
    *world.view("eu-1") = unreachable(spec, world.at(0));
    let round = world.place(&mut Placer::new(), 10_000);
    assert_eq!(round.next_deadline, None);
    let d = round.decisions.values().next().expect("web");
    assert_eq!(counts(d), vec![("eu-1", 2), ("eu-2", 2)]);
}

#[test]
fn capacity_failover_moves_replicas_and_failback_divides_afresh() {
    let mut world = World::new(&["a", "b"]).pods(&[10, 10]).policy(
        vec![],
        PlacementPolicy {
            failover_after_seconds: Some(60),
            failback_after_seconds: 0,
            ..divided(Division::AvailableCapacity)
        },
    );
    world = world.deployment("web", Some(4));
    let mut placer = Placer::new();
    assert_eq!(
        counts(&world.decide(&mut placer, 0, "web")),
        vec![("a", 2), ("b", 2)]
    );
    let spec = world.spec("a").clone();
    *world.view("a") = unreachable(spec.clone(), world.at(0));
    let d = world.decide(&mut placer, 60, "web");
    assert_eq!(counts(&d), vec![("b", 4)], "a's replicas move to b");
    *world.view("a") = ClusterView {
        recovered_at: Some(world.at(100)),
        ..healthy(spec)
    };
    let d = world.decide(&mut placer, 100, "web");
    assert_eq!(
        counts(&d),
        vec![("a", 2), ("b", 2)],
        "failback: the split returns"
    );
}

fn standby_world(placement: PlacementPolicy) -> World {
    World::new(&["eu-1", "eu-2", "us-1", "us-2", "ap-1"])
        .policy(
            vec![
                tier("eu", &["eu-1", "eu-2"]),
                tier("us", &["us-1", "us-2"]),
                tier("ap", &["ap-1"]),
            ],
            PlacementPolicy {
                standby: Some(2),
                failover_after_seconds: Some(60),
                ..placement
            },
        )
        .deployment("web", Some(6))
}

#[test]
fn active_standby_keeps_warm_replicas_in_the_next_tier_and_takes_over() {
    let mut world = standby_world(weights(&[]));
    let mut placer = Placer::new();
    let d = world.decide(&mut placer, 0, "web");
    assert_eq!(
        counts(&d),
        vec![("eu-1", 3), ("eu-2", 3), ("us-1", 1), ("us-2", 1)]
    );
    assert_eq!(
        (d.tier.as_deref(), d.standby_tier.as_deref()),
        (Some("eu"), Some("us"))
    );
    assert_eq!(d.placed[2].reason, PlacedReason::Standby);
    assert_eq!(reason_of(&d, "ap-1"), LaterTier("ap".into()));
    // Both EU clusters fail over: the US takes over with the full count, AP keeps standby.
    for name in ["eu-1", "eu-2"] {
        let spec = world.spec(name).clone();
        *world.view(name) = unreachable(spec, world.at(0));
    }
    let d = world.decide(&mut placer, 60, "web");
    assert_eq!(counts(&d), vec![("ap-1", 2), ("us-1", 3), ("us-2", 3)]);
    assert_eq!(
        (d.tier.as_deref(), d.standby_tier.as_deref()),
        (Some("us"), Some("ap"))
    );
    assert_eq!(d.placed[0].reason, PlacedReason::Standby);
}

#[test]
fn a_duplicated_standby_runs_its_count_in_each_cluster() {
    let world = standby_world(duplicated());
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(
        counts(&d),
        vec![("eu-1", 6), ("eu-2", 6), ("us-1", 2), ("us-2", 2)]
    );
}

#[test]
fn an_object_without_replicas_goes_whole_to_the_standby_tier_too() {
    let mut world = standby_world(weights(&[]));
    world.templates = vec![deployment("web", None)];
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(
        split(&d),
        vec![
            ("eu-1", None),
            ("eu-2", None),
            ("us-1", None),
            ("us-2", None)
        ]
    );
    assert_eq!(d.placed[0].reason, PlacedReason::Whole);
    assert_eq!(d.placed[3].reason, PlacedReason::Standby);
}

fn spread_world(spread: Vec<SpreadConstraint>) -> World {
    World::new(&["eu-1", "eu-2", "us-1", "ap-1"])
        .policy(
            vec![],
            PlacementPolicy {
                spread,
                ..duplicated()
            },
        )
        .deployment("web", Some(1))
}

fn by(by: SpreadBy, min_groups: u32, max_groups: Option<u32>) -> SpreadConstraint {
    SpreadConstraint {
        by,
        min_groups,
        max_groups,
    }
}

#[test]
fn spread_min_and_max_groups() {
    // maxGroups 2 by region: eu (2 clusters) first, then ap before us (name order).
    let d =
        spread_world(vec![by(SpreadBy::Region, 2, Some(2))]).decide(&mut Placer::new(), 0, "web");
    let placed: Vec<&str> = d.placed.iter().map(|p| p.cluster.as_str()).collect();
    assert_eq!(placed, vec!["ap-1", "eu-1", "eu-2"]);
    assert_eq!(excluded(&d), vec![("us-1", SpreadMaxGroups)]);
    // minGroups 4 by region: only 3 regions.
    let d = spread_world(vec![by(SpreadBy::Region, 4, None)]).decide(&mut Placer::new(), 0, "web");
    assert_eq!(
        d.outcome,
        Outcome::Unschedulable {
            reason: "3 region groups feasible, minGroups 4".into()
        }
    );
    // Region 2..2 and at most 2 clusters: one cluster in each of the two regions kept.
    let d = spread_world(vec![
        by(SpreadBy::Cluster, 1, Some(2)),
        by(SpreadBy::Region, 2, Some(2)),
    ])
    .decide(&mut Placer::new(), 0, "web");
    let placed: Vec<&str> = d.placed.iter().map(|p| p.cluster.as_str()).collect();
    assert_eq!(placed, vec!["ap-1", "eu-1"]);
    // A cluster without a region cannot count towards region groups.
    let mut world = spread_world(vec![by(SpreadBy::Region, 1, None)]);
    world.spec("ap-1").locality.region = None;
    let d = world.decide(&mut Placer::new(), 0, "web");
    assert_eq!(
        reason_of(&d, "ap-1"),
        PlacementFilter::NoSpreadLabel(SpreadBy::Region)
    );
    // minGroups > maxGroups can only end unschedulable.
    let d = spread_world(vec![by(SpreadBy::Zone, 3, Some(2))]).decide(&mut Placer::new(), 0, "web");
    assert!(!d.is_scheduled());
}

fn override_policy(name: &str, selector: TemplateSelector, rules: usize) -> OverridePolicy {
    OverridePolicy {
        key: ObjectKey::new("shop", name),
        selectors: vec![selector],
        rules: (0..rules)
            .map(|i| OverrideRule {
                targets: (i == 1).then(|| ClusterSet {
                    names: vec!["eu-1".into()],
                    selector: None,
                }),
                overriders: Overriders::default(),
            })
            .collect(),
    }
}

#[test]
fn overrides_apply_least_specific_first_then_by_name_rules_in_order() {
    let mut world = World::new(&["eu-1", "eu-2"])
        .policy(vec![], duplicated())
        .deployment("web", Some(1));
    std::sync::Arc::make_mut(&mut world.templates[0].labels).insert("app".into(), "web".into());
    let by_name = TemplateSelector {
        name: Some("web".into()),
        ..TemplateSelector::default()
    };
    let by_label = TemplateSelector {
        selector: Some(crate::policy::LabelSelector {
            match_labels: [("app".to_owned(), "web".to_owned())].into(),
            match_expressions: vec![],
        }),
        ..TemplateSelector::default()
    };
    let mut elsewhere = override_policy("other-ns", TemplateSelector::default(), 1);
    elsewhere.key = ObjectKey::new("other", "x");
    world.overrides = vec![
        override_policy("a-name", by_name, 1),
        override_policy("z-all", TemplateSelector::default(), 1),
        override_policy("b-label", by_label, 1),
        override_policy("c-all", TemplateSelector::default(), 2),
        override_policy(
            "unrelated",
            TemplateSelector {
                name: Some("api".into()),
                ..TemplateSelector::default()
            },
            1,
        ),
        elsewhere,
    ];
    let d = world.decide(&mut Placer::new(), 0, "web");
    let key = |n: &str| ObjectKey::new("shop", n);
    assert_eq!(
        d.placed[0].overrides,
        vec![
            (key("c-all"), 0),
            (key("c-all"), 1),
            (key("z-all"), 0),
            (key("b-label"), 0),
            (key("a-name"), 0),
        ],
        "eu-1: every rule, the one targeting eu-1 in its place"
    );
    assert_eq!(
        d.placed[1].overrides,
        vec![
            (key("c-all"), 0),
            (key("z-all"), 0),
            (key("b-label"), 0),
            (key("a-name"), 0)
        ]
    );
}

#[test]
fn dependencies_follow_their_workloads() {
    let mut world = World::new(&["eu-1", "eu-2", "us-1"])
        .policy(eu_us(), weights(&[]))
        .deployment("web", Some(1))
        .deployment("api", Some(1));
    let cfg = config_map("cfg");
    let missing = config_map("missing").key;
    world.templates[0].dependencies = vec![cfg.key.clone(), missing.clone()];
    world.templates[1].dependencies = vec![cfg.key.clone()];
    world.templates.push(cfg.clone());
    world.templates.push(config_map("unused"));
    world.overrides = vec![override_policy("all", TemplateSelector::default(), 1)];
    let round = world.place(&mut Placer::new(), 0);
    assert_eq!(
        round.decisions.len(),
        3,
        "web, api, cfg: not unused, not missing"
    );
    let web = &round.decisions[&world.templates[0].key];
    let api = &round.decisions[&world.templates[1].key];
    let d = &round.decisions[&cfg.key];
    assert_eq!(d.policy, None);
    let mut expect: Vec<&str> = web
        .placed
        .iter()
        .chain(&api.placed)
        .map(|p| p.cluster.as_str())
        .collect();
    expect.sort();
    expect.dedup();
    assert_eq!(
        d.placed
            .iter()
            .map(|p| p.cluster.as_str())
            .collect::<Vec<_>>(),
        expect
    );
    for p in &d.placed {
        assert_eq!(p.replicas, None);
        assert_eq!(p.overrides, vec![(ObjectKey::new("shop", "all"), 0)]);
        let PlacedReason::Dependency(workloads) = &p.reason else {
            panic!("{p:?}");
        };
        assert!(!workloads.is_empty());
    }
    // A dependency its own policy places is not a follower.
    let mut own = world.clone();
    own.policies[0].templates.push(TemplateSelector {
        kind: Some("ConfigMap".into()),
        ..TemplateSelector::default()
    });
    let round = own.place(&mut Placer::new(), 0);
    assert_eq!(
        round.decisions[&cfg.key].policy,
        Some(ObjectKey::new("shop", "p"))
    );
}

#[test]
fn unschedulable_keeps_the_previous_placement() {
    let mut world = World::new(&["a", "b"])
        .pods(&[4, 0])
        .policy(vec![], divided(Division::AvailableCapacity))
        .deployment("web", Some(4));
    let mut placer = Placer::new();
    let d = world.decide(&mut placer, 0, "web");
    assert_eq!(counts(&d), vec![("a", 4)]);
    // The pods run now; scaling to 10 does not fit (a's 4 plus nothing free).
    let web = world.template("web").clone();
    world.capacities[0] = Some(crate::testing::running(
        crate::testing::pods_free(4),
        &web,
        4,
    ));
    world.replicas("web", 10);
    let d = world.decide(&mut placer, 1, "web");
    assert_eq!(
        d.outcome,
        Outcome::Unschedulable {
            reason: "needs 10 replicas, 4 free (a: 4)".into()
        }
    );
    assert_eq!(
        counts(&d),
        vec![("a", 4)],
        "nothing removed for want of a better place"
    );
    assert_eq!(reason_of(&d, "b"), PlacementFilter::NoCapacity);
    // Back to 4: scheduled again, from the same split.
    world.replicas("web", 4);
    assert_eq!(counts(&world.decide(&mut placer, 2, "web")), vec![("a", 4)]);
}

#[test]
fn a_retiring_cluster_is_placed_nothing_whatever_the_policy_tolerates() {
    let mut world = World::new(&["eu-1", "eu-2", "us-1"])
        .policy(eu_us(), duplicated())
        .deployment("web", Some(3));
    // A toleration of every taint does not keep a member that is being deleted.
    world.tolerate(vec![Toleration::exists("", None)]);
    let mut placer = Placer::new();
    let before = world.decide(&mut placer, 0, "web");
    assert_eq!(split(&before), [("eu-1", Some(3)), ("eu-2", Some(3))]);
    world.spec("eu-1").retiring = true;
    let after = world.decide(&mut placer, 1, "web");
    assert_eq!(split(&after), [("eu-2", Some(3))]);
    assert!(
        excluded(&after).contains(&("eu-1", PlacementFilter::Retiring)),
        "{:?}",
        excluded(&after)
    );
    // The whole tier retiring: the next tier takes it.
    world.spec("eu-2").retiring = true;
    let last = world.decide(&mut placer, 2, "web");
    assert_eq!(split(&last), [("us-1", Some(3))]);
}
