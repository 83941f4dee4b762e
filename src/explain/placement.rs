//! `meridian explain Deployment/web -n shop` and `/debug/explain?kind=…`: a template's
//! placement decision step by step and, when the same policy governs Services, the traffic
//! decision of each beside it — the two halves of one ClusterSchedulingPolicy.

use std::collections::BTreeMap;

use anyhow::{Result, anyhow};
use meridian_controllers::kubernetes::propagate::TemplateView;
use meridian_core::Snapshot;
use meridian_core::placement::room::{self, Room};
use meridian_core::placement::{
    Decision, Judgement, Outcome, PlacedReason, PlacementFilter, Scores, SpreadBy, TemplateKey,
    score,
};
use meridian_dns::Answerer;
use meridian_xds::Xds;
use serde_json::{Value, json};

/// The placement (and traffic) explanation of template `kind` `namespace/name`; `kind` is
/// matched case-insensitively (`deployment`, `Deployment`). With what each member holds of
/// it, when this replica propagates.
pub fn explain_template(
    answerer: &Answerer,
    xds: &Xds,
    seen: super::Seen<'_>,
    propagation: &BTreeMap<TemplateKey, TemplateView>,
    (kind, namespace, name): (&str, &str, &str),
    from_cluster: Option<&str>,
) -> Result<Value> {
    let snap = seen.snap;
    let template = snap
        .templates
        .iter()
        .find(|t| {
            t.key.kind.eq_ignore_ascii_case(kind)
                && &*t.key.namespace == namespace
                && &*t.key.name == name
        })
        .ok_or_else(|| anyhow!("no resource template {kind} {namespace}/{name} on the hub"))?;
    let Some(decision) = snap.placements.decisions.get(&template.key) else {
        return Ok(json!({
            "template": template.key.to_string(),
            "placement": null,
            "traffic": [],
            "words": [format!("{}: no ClusterSchedulingPolicy places it, and no placed workload depends on it", template.key)],
        }));
    };
    let mut words = placement_words(decision);
    let rooms = room::rooms(
        &snap.capacities,
        &snap.templates,
        &snap.placements.decisions,
        Some(template),
    );
    if template.replicas.is_some() {
        words.extend(rooms.iter().map(room_words));
    }
    let held = propagation.get(&template.key);
    if let Some(view) = held {
        words.extend(propagation_words(view));
    }
    let mut traffic = Vec::new();
    if let Some(policy) = &decision.policy {
        let source = policy.to_string();
        for view in snap
            .services()
            .filter(|v| v.policy.source.as_deref() == Some(source.as_str()))
        {
            let service = format!("{}/{}", view.key.namespace, view.key.name);
            let half = super::explain(answerer, xds, seen, &service, from_cluster)?;
            words.push(format!("traffic of Service {service} (the same policy):"));
            words.extend(
                half["words"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|w| w.as_str().map(|w| format!("  {w}"))),
            );
            traffic.push(half);
        }
    }
    Ok(json!({
        "template": template.key.to_string(),
        "placement": decision,
        "capacity": rooms,
        "propagation": held,
        "traffic": traffic,
        "words": words,
    }))
}

/// Which rule moves a drained cluster's traffic: a fault takes it away at once,
/// a planned move only once the placed clusters can answer (make before break).
fn traffic_rule(reason: Option<&PlacementFilter>) -> &'static str {
    match reason {
        Some(
            PlacementFilter::FailedOver { .. }
            | PlacementFilter::NoExecuteTaint(_)
            | PlacementFilter::Retiring,
        ) => "a fault: its traffic left it at once",
        _ => {
            "a planned move: it keeps its traffic only while no placed cluster has ready endpoints (make before break)"
        }
    }
}

/// A member's room for the template: what fits, and the accounting behind it.
fn room_words(r: &Room) -> String {
    let cpu = |res: &meridian_core::Resources| format!("{}m CPU", res.cpu_millis);
    let memory = |res: &meridian_core::Resources| format!("{} MiB", res.memory_bytes >> 20);
    format!(
        "capacity of {}: room for {} replica(s) of it; allocatable {}, {}; used by pods {}, {}; assumed for other decisions {}, {}",
        r.cluster,
        r.replicas_free.unwrap_or_default(),
        cpu(&r.allocatable),
        memory(&r.allocatable),
        cpu(&r.used),
        memory(&r.used),
        cpu(&r.assumed),
        memory(&r.assumed),
    )
}

/// What each member holds of the template, and what the rollout waits for.
fn propagation_words(view: &TemplateView) -> Vec<String> {
    let mut words = Vec::new();
    for (cluster, copy) in &view.copies {
        let replicas = copy
            .replicas
            .map_or(String::new(), |r| format!(" {r} replicas,"));
        let ready = match (copy.ready, copy.ready_replicas) {
            (true, _) => "ready".to_string(),
            (false, Some(n)) => format!("not ready ({n} ready)"),
            (false, None) => "not ready".to_string(),
        };
        let state = match &copy.error {
            Some(e) => format!("not applied: {e}"),
            None if copy.applied => format!("applied,{replicas} {ready}"),
            None => format!("not yet applied,{replicas} {ready}"),
        };
        words.push(format!("{cluster} holds: {state}"));
    }
    for w in view.step.writes.iter().filter(|w| w.held_back) {
        words.push(format!(
            "{}: keeps {} replicas until the clusters that grow are ready",
            w.cluster,
            w.replicas.unwrap_or_default()
        ));
    }
    for d in &view.step.draining {
        let why = d
            .reason
            .as_ref()
            .map_or("no longer placed".to_string(), excluded_words);
        words.push(if d.orphaned {
            format!("{}: draining for good (purgeMode Never): {why}", d.cluster)
        } else {
            format!(
                "{}: draining for {} s ({why}): deleted once its replacements are ready or the grace period ends; {}",
                d.cluster,
                d.waited_seconds,
                traffic_rule(d.reason.as_ref())
            )
        });
    }
    for c in &view.conflicts {
        words.push(format!(
            "{c}: an object of that name exists and is not meridian's: left alone (conflictResolution Abort)"
        ));
    }
    words
}

fn placement_words(d: &Decision) -> Vec<String> {
    let mut words = vec![format!(
        "{}: {}{}",
        d.template,
        match &d.policy {
            Some(p) => format!("placed by ClusterSchedulingPolicy {p}"),
            None => "a dependency: it follows the workloads that use it".into(),
        },
        d.tier
            .as_ref()
            .map(|t| format!(", tier {t:?}"))
            .unwrap_or_default()
    )];
    if let Outcome::Unschedulable { reason } = &d.outcome {
        words.push(format!(
            "unschedulable: {reason}{}",
            if d.placed.is_empty() {
                ""
            } else {
                " (its last placement is kept)"
            }
        ));
    }
    if let Some(t) = &d.standby_tier {
        words.push(format!("standby replicas kept in tier {t:?}"));
    }
    for p in &d.placed {
        let replicas = p
            .replicas
            .map_or("a whole copy".to_owned(), |r| format!("{r} replica(s)"));
        let overrides = if p.overrides.is_empty() {
            String::new()
        } else {
            let list: Vec<String> = p
                .overrides
                .iter()
                .map(|(policy, rule)| format!("{policy} rule {rule}"))
                .collect();
            format!("; overrides {}", list.join(", "))
        };
        words.push(format!(
            "placed: {} — {replicas} ({}){overrides}",
            p.cluster,
            placed_words(&p.reason)
        ));
    }
    for e in d.excluded.iter() {
        words.push(format!(
            "excluded: {} — {}",
            e.cluster,
            excluded_words(&e.reason)
        ));
    }
    if let Some(scores) = &d.scores {
        words.extend(score_words(scores));
    }
    words
}

fn placed_words(reason: &PlacedReason) -> String {
    match reason {
        PlacedReason::Whole => "the object has no replicas".into(),
        PlacedReason::Duplicated => "Duplicated: every cluster runs them all".into(),
        PlacedReason::Weight(w) => format!("static weight {w}"),
        PlacedReason::Capacity { free } => format!("by available capacity, {free} free"),
        PlacedReason::Aggregated { free } => format!("Aggregated, {free} free"),
        PlacedReason::Standby => "standby".into(),
        PlacedReason::Dependency(of) => format!("used by {}", keys(of)),
        PlacedReason::Follows(of) => format!("follows {}", keys(of)),
    }
}

fn keys(of: &[TemplateKey]) -> String {
    of.iter()
        .map(|k| format!("{} {}/{}", k.kind, k.namespace, k.name))
        .collect::<Vec<_>>()
        .join(", ")
}

fn excluded_words(reason: &PlacementFilter) -> String {
    match reason {
        PlacementFilter::Retiring => "its MemberCluster is being deleted (retiring)".into(),
        PlacementFilter::FailedOver {
            unreachable_seconds,
        } => format!("failed over: Unreachable for {unreachable_seconds} s"),
        PlacementFilter::FailingBack { remaining_seconds } => {
            format!("healthy again; fails back in {remaining_seconds} s")
        }
        PlacementFilter::NoScheduleTaint(k) => format!("NoSchedule taint {k:?} not tolerated"),
        PlacementFilter::NoExecuteTaint(k) => {
            format!("NoExecute taint {k:?} not tolerated (or past its tolerationSeconds)")
        }
        PlacementFilter::NotInAffinities => "in none of the policy's clusterAffinities".into(),
        PlacementFilter::LaterTier(t) => format!("in a later tier ({t:?})"),
        PlacementFilter::NoCapacity => "no free capacity for one replica".into(),
        PlacementFilter::CapacityUnknown => "reports no capacity (no Nodes)".into(),
        PlacementFilter::SpreadMaxGroups => "left out by a spread constraint's maxGroups".into(),
        PlacementFilter::WeightZero => "static weight 0".into(),
        PlacementFilter::PreferNoScheduleTaint(k) => {
            format!("PreferNoSchedule taint {k:?}: a last resort, not needed")
        }
        PlacementFilter::NoSpreadLabel(by) => format!(
            "no {} label to spread by",
            match by {
                SpreadBy::Cluster => "cluster",
                SpreadBy::Region => "topology.kubernetes.io/region",
                SpreadBy::Zone => "topology.kubernetes.io/zone",
            }
        ),
        PlacementFilter::TierUnusable { tier, why } => format!(
            "its tier {} could not take it: {why}",
            tier.as_deref()
                .map_or("(all clusters)".into(), |t| format!("{t:?}"))
        ),
        PlacementFilter::NoReplicas => "feasible, but the division gave it none".into(),
        PlacementFilter::WorkloadsElsewhere => "none of the workloads it follows runs here".into(),
        PlacementFilter::WorkloadAffinity { term } => format!(
            "required workloadAffinity[{term}]: no matching workload runs in its topology domain"
        ),
        PlacementFilter::WorkloadAntiAffinity { term } => format!(
            "required workloadAntiAffinity[{term}]: a matching workload runs in its topology domain"
        ),
        PlacementFilter::Rejected { program, reason } => {
            format!("filtered out by the {program}: {reason}")
        }
    }
}

/// What each program answered, then every candidate best first with each plugin's score.
fn score_words(scores: &Scores) -> Vec<String> {
    let mut words = Vec::new();
    for r in &scores.programs {
        words.push(match &r.judgement {
            Judgement::Answered(verdicts) => {
                let rejected = verdicts.iter().filter(|v| v.rejected.is_some()).count();
                let scored = verdicts.iter().filter(|v| v.score.is_some()).count();
                format!(
                    "{}: answered for {} clusters ({scored} scored, {rejected} filtered out)",
                    r.program,
                    verdicts.len()
                )
            }
            Judgement::Pending => format!("{}: no answer yet", r.program),
            Judgement::Failed(why) => format!(
                "{}: failed, ignored (failurePolicy Ignore): {why}",
                r.program
            ),
        });
    }
    for (rank, c) in scores.order.iter().enumerate() {
        let parts: Vec<String> = c
            .plugins
            .iter()
            .map(|p| match p.score {
                Some(s) => format!("{} {s}×{}", p.plugin, p.weight),
                None => format!("{} (no data: {})×{}", p.plugin, score::NEUTRAL, p.weight),
            })
            .collect();
        words.push(format!(
            "score #{}: {} {}.{:02} = {}",
            rank + 1,
            c.cluster,
            c.total / 100,
            c.total % 100,
            parts.join(" + ")
        ));
    }
    if scores.candidates > scores.order.len() {
        words.push(format!(
            "… and {} more candidates (the best {} are kept)",
            scores.candidates - scores.order.len(),
            scores.order.len()
        ));
    }
    words
}

/// Every decision, for `/debug/placements`.
pub fn placements_json(
    snap: &Snapshot,
    propagation: &BTreeMap<TemplateKey, TemplateView>,
) -> Value {
    let decisions: Vec<&Decision> = snap.placements.decisions.values().map(|d| &**d).collect();
    let held: Vec<Value> = propagation
        .iter()
        .map(|(k, v)| json!({"template": k, "copies": v.copies, "step": v.step, "conflicts": v.conflicts}))
        .collect();
    json!({
        "version": snap.version,
        "templates": snap.templates.len(),
        "decisions": decisions,
        "propagation": held,
    })
}
