//! Incremental rounds against rounds that decide everything: after every step of a random
//! sequence of changes — templates, replicas, labels, health, taints, capacity, policies,
//! overrides, the clock — both placers give the same decisions and the same next deadline.

use proptest::prelude::*;

use super::*;
use crate::registry::Health;
use crate::testing::{config_map, pods_free, tier};

/// One change between rounds; indices are taken modulo what exists.
#[derive(Clone, Debug)]
enum Change {
    Replicas(usize, Option<u32>),
    AddTemplate(Option<u32>),
    RemoveTemplate(usize),
    TemplateLabel(usize, u8),
    Health(usize, u8),
    Taint(usize, u8),
    Free(usize, Option<u64>),
    ClusterLabel(usize, u8),
    Region(usize, u8),
    Scheduling(u8),
    Override(u8),
    Tiers(u8),
    Nothing,
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        3 => (0usize..8, prop::option::weighted(0.85, 0u32..12)).prop_map(|(i, r)| Change::Replicas(i, r)),
        1 => prop::option::weighted(0.8, 0u32..8).prop_map(Change::AddTemplate),
        1 => (0usize..8).prop_map(Change::RemoveTemplate),
        1 => (0usize..8, 0u8..3).prop_map(|(i, l)| Change::TemplateLabel(i, l)),
        2 => (0usize..6, 0u8..3).prop_map(|(c, h)| Change::Health(c, h)),
        2 => (0usize..6, 0u8..5).prop_map(|(c, t)| Change::Taint(c, t)),
        3 => (0usize..6, prop::option::weighted(0.9, 0u64..12)).prop_map(|(c, f)| Change::Free(c, f)),
        1 => (0usize..6, 0u8..3).prop_map(|(c, l)| Change::ClusterLabel(c, l)),
        1 => (0usize..6, 0u8..3).prop_map(|(c, r)| Change::Region(c, r)),
        1 => (0u8..4).prop_map(Change::Scheduling),
        1 => (0u8..4).prop_map(Change::Override),
        1 => (0u8..4).prop_map(Change::Tiers),
        2 => Just(Change::Nothing),
    ]
}

/// Clusters c0… (regions r0/r1, free pods), policy `p` placing every Deployment of `shop`
/// (capacity division, tiers, failover), policy `q` placing only `w0` Duplicated, templates
/// w0… (w1 names ConfigMap `cm` as a dependency).
fn start(clusters: usize, templates: usize) -> World {
    let names: Vec<String> = (0..clusters).map(|i| format!("c{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut w = World::new(&refs);
    for (i, v) in w.views.iter_mut().enumerate() {
        v.spec.locality.region = Some(format!("r{}", i % 2));
        v.spec.labels.insert("tier".into(), format!("{}", i % 3));
    }
    w.capacities = (0..clusters)
        .map(|i| Some(pods_free(3 + i as u64)))
        .collect();
    let placement = PlacementPolicy {
        replicas: ReplicaScheduling::Divided(Division::AvailableCapacity),
        failover_after_seconds: Some(30),
        failback_after_seconds: 10,
        ..PlacementPolicy::default()
    };
    let tiers = tiers_of(&refs, 1);
    let mut w =
        w.policy(tiers, placement)
            .policy_for("q", "w0", Vec::new(), PlacementPolicy::default());
    for i in 0..templates {
        w = w.deployment(&format!("w{i}"), Some(2 + i as u32));
    }
    if let Some(t) = w.templates.get_mut(1) {
        t.dependencies
            .push(TemplateKey::new("v1", "ConfigMap", "shop", "cm"));
    }
    w.templates.push(config_map("cm"));
    w
}

/// Tiers over the clusters: `kind` 0 none, 1 two tiers (even, then all), 2 one tier of the
/// first half, 3 odd clusters only.
fn tiers_of(names: &[&str], kind: u8) -> Vec<AffinityTier> {
    let pick = |f: &dyn Fn(usize) -> bool| -> Vec<&str> {
        names
            .iter()
            .enumerate()
            .filter(|(i, _)| f(*i))
            .map(|(_, n)| *n)
            .collect()
    };
    match kind {
        0 => Vec::new(),
        1 => vec![
            tier("near", &pick(&|i| i % 2 == 0)),
            tier("far", &pick(&|_| true)),
        ],
        2 => vec![tier("half", &pick(&|i| i < names.len() / 2))],
        _ => vec![tier("odd", &pick(&|i| i % 2 == 1))],
    }
}

fn apply(w: &mut World, change: &Change, at: u64, serial: &mut u32) {
    let clusters = w.views.len();
    let deployments: Vec<usize> = (0..w.templates.len())
        .filter(|&i| &*w.templates[i].key.kind == "Deployment")
        .collect();
    let pick = |i: usize| deployments.get(i % deployments.len().max(1)).copied();
    match change {
        Change::Replicas(i, r) => {
            if let Some(i) = pick(*i) {
                w.templates[i].replicas = *r;
            }
        }
        Change::AddTemplate(r) => {
            *serial += 1;
            w.templates.push(deployment(&format!("n{serial}"), *r));
        }
        Change::RemoveTemplate(i) => {
            if let Some(i) = pick(*i) {
                w.templates.remove(i);
            }
        }
        Change::TemplateLabel(i, l) => {
            if let Some(i) = pick(*i) {
                std::sync::Arc::make_mut(&mut w.templates[i].labels)
                    .insert("app".into(), format!("{l}"));
            }
        }
        Change::Health(c, h) => {
            let v = &mut w.views[c % clusters];
            match h {
                0 => {
                    if v.health != Health::Unreachable {
                        v.unreachable_since = Some(w.t0 + secs(at));
                    }
                    v.health = Health::Unreachable;
                }
                1 => v.health = Health::Degraded,
                _ => {
                    if v.health == Health::Unreachable {
                        v.recovered_at = Some(w.t0 + secs(at));
                    }
                    v.health = Health::Healthy;
                    v.unreachable_since = None;
                }
            }
        }
        Change::Taint(c, t) => {
            let spec = &mut w.views[c % clusters].spec;
            spec.taints.clear();
            let effect = match t {
                0 => Some(TaintEffect::NoSchedule),
                1 => Some(TaintEffect::NoExecute),
                2 => Some(TaintEffect::PreferNoSchedule),
                _ => None,
            };
            if let Some(effect) = effect {
                spec.taints
                    .push(taint(if *t == 3 { "b" } else { "a" }, effect));
            }
        }
        Change::Free(c, f) => w.capacities[c % clusters] = f.map(pods_free),
        Change::ClusterLabel(c, l) => {
            w.views[c % clusters]
                .spec
                .labels
                .insert("tier".into(), format!("{l}"));
        }
        Change::Region(c, r) => {
            w.views[c % clusters].spec.locality.region = Some(format!("r{r}"));
        }
        Change::Scheduling(s) => {
            let placement = w.placement("p");
            placement.replicas = match s {
                0 => ReplicaScheduling::Duplicated,
                1 => ReplicaScheduling::Divided(Division::AvailableCapacity),
                2 => ReplicaScheduling::Divided(Division::Aggregated),
                _ => ReplicaScheduling::Divided(Division::Weights(Vec::new())),
            };
            placement.standby = (*s == 1).then_some(1);
        }
        Change::Override(o) => {
            w.overrides = (0..*o)
                .map(|i| OverridePolicy {
                    key: ObjectKey::new("shop", format!("o{i}")),
                    selectors: vec![TemplateSelector {
                        name: Some(format!("w{}", i + u8::from(at.is_multiple_of(2)))),
                        ..TemplateSelector::default()
                    }],
                    rules: vec![OverrideRule {
                        targets: Some(ClusterSet {
                            names: vec![format!("c{i}")],
                            selector: None,
                        }),
                        overriders: Overriders::default(),
                    }],
                })
                .collect();
        }
        Change::Tiers(kind) => {
            let names: Vec<String> = w.views.iter().map(|v| v.spec.id.to_string()).collect();
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let tiers = tiers_of(&refs, *kind);
            let p = w
                .policies
                .iter_mut()
                .find(|p| &*p.key.name == "p")
                .expect("policy p");
            let mut traffic = (*p.traffic).clone();
            traffic.affinities = tiers;
            p.traffic = Arc::new(traffic);
        }
        Change::Nothing => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn incremental_placement_equals_deciding_everything(
        clusters in 2usize..6,
        templates in 1usize..6,
        steps in prop::collection::vec((change(), 0u64..25), 1..14),
    ) {
        let mut w = start(clusters, templates);
        let mut incremental = Placer::new();
        let mut everything = Placer::deciding_everything();
        let mut at = 0;
        let mut serial = 0;
        let a = w.place(&mut incremental, at);
        let b = w.place(&mut everything, at);
        prop_assert_eq!(&a, &b);
        for (i, (change, wait)) in steps.iter().enumerate() {
            at += wait;
            apply(&mut w, change, at, &mut serial);
            let a = w.place(&mut incremental, at);
            let b = w.place(&mut everything, at);
            prop_assert_eq!(&a.decisions, &b.decisions, "step {} ({:?}) at {}", i, change, at);
            prop_assert_eq!(a.next_deadline, b.next_deadline, "deadline after step {}", i);
        }
    }
}

/// A round with nothing changed decides nothing; an edit of one template decides it and what
/// its change can reach (the capacity divisions after it, sharing its clusters' room).
#[test]
fn a_round_decides_only_what_changed() {
    let mut w = start(4, 5);
    let mut placer = Placer::new();
    let first = w.place(&mut placer, 0);
    // Five Deployments; the ConfigMap w1 names follows it (dependencies are not decided).
    assert_eq!(first.decided, 5);
    // The first round decided each capacity division before it knew the room the later ones
    // hold, and with no previous split: the next round would decide those again, had any
    // moved; here none did, so nothing is decided again.
    let counts: Vec<usize> = (1..4).map(|at| w.place(&mut placer, at).decided).collect();
    assert_eq!(counts, [5, 0, 0]);
    let settled = w.place(&mut placer, 4);
    assert_eq!(settled.decided, 0);
    let again = w.place(&mut placer, 5);
    assert_eq!(again.decided, 0);
    for (key, d) in &settled.decisions {
        assert!(Arc::ptr_eq(d, &again.decisions[key]), "{key} changed");
    }
    // w0 is q's Duplicated template: its replicas hold room in every cluster, so p's capacity
    // divisions there are decided again; its own edit, of a label, reaches nothing else.
    std::sync::Arc::make_mut(&mut w.template("w0").labels).insert("app".into(), "x".into());
    assert_eq!(w.place(&mut placer, 6).decided, 1);
    assert_eq!(w.place(&mut placer, 7).decided, 0);
    // A capacity change in c3 reaches p's capacity divisions (c3 is in its "far" tier), not
    // q's Duplicated w0.
    w.capacities[3] = Some(pods_free(40));
    let after = w.place(&mut placer, 8);
    assert!(
        after.decided >= 1 && after.decided < after.decisions.len(),
        "{}",
        after.decided
    );
    assert!(Arc::ptr_eq(
        &again.decisions[&w.templates[0].key],
        &after.decisions[&w.templates[0].key]
    ));
}

/// The decisions of one policy that leave out the same clusters for the same reasons hold one
/// list (at a thousand members a list each was a gigabyte), also after a change of why one of
/// those clusters is out.
#[test]
fn decisions_leaving_out_the_same_clusters_share_one_list() {
    let mut w = World::new(&["eu-1", "eu-2", "us-1", "us-2"])
        .policy(
            vec![crate::testing::tier("eu", &["eu-1", "eu-2"])],
            PlacementPolicy::default(),
        )
        .deployment("a", Some(2))
        .deployment("b", Some(3))
        .deployment("c", Some(4));
    let mut placer = Placer::new();
    let lists = |round: &Placements| -> Vec<Arc<[Excluded]>> {
        round
            .decisions
            .values()
            .map(|d| d.excluded.clone())
            .collect()
    };
    let first = lists(&w.place(&mut placer, 0));
    assert_eq!(first.len(), 3);
    assert!(first.iter().all(|l| Arc::ptr_eq(l, &first[0])), "{first:?}");
    let out: Vec<&str> = first[0].iter().map(|e| e.cluster.as_str()).collect();
    assert_eq!(out, ["us-1", "us-2"]);

    let spec = w.spec("us-1").clone();
    *w.spec("us-1") = crate::testing::tainted(spec, "k", TaintEffect::NoSchedule);
    let after = lists(&w.place(&mut placer, 1));
    assert!(after.iter().all(|l| Arc::ptr_eq(l, &after[0])), "{after:?}");
    assert_eq!(
        after[0][0].reason,
        PlacementFilter::NoScheduleTaint("k".into())
    );

    // Another taint key: the decisions are kept, only the reason patched.
    w.spec("us-1").taints[0].key = "j".into();
    let round = w.place(&mut placer, 2);
    assert_eq!(round.decided, 0);
    let patched = lists(&round);
    assert!(
        patched.iter().all(|l| Arc::ptr_eq(l, &patched[0])),
        "{patched:?}"
    );
    assert_eq!(
        patched[0][0].reason,
        PlacementFilter::NoScheduleTaint("j".into())
    );
}
