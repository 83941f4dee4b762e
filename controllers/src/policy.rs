//! ClusterSchedulingPolicy → the scheduling core's `Policy`, with validation: every problem is
//! reported with what is wrong, and a policy with any problem is not used at all (a half-read
//! policy could send traffic somewhere its author never meant).

use std::collections::BTreeMap;
use std::sync::Arc;

use meridian_core as core;

use crate::convert::{created_secs, key_of, taint_effect};
use crate::crd::{
    ClusterAffinitySpec, ClusterSchedulingPolicy, ConflictResolutionSpec, DivisionPreferenceSpec,
    DynamicWeightSpec, FailurePolicySpec, LabelSelectorSpec, PlacementSpec, PurgeModeSpec,
    ReplicaSchedulingSpec, ReplicaSchedulingTypeSpec, RolloutAnalysisSpec, RolloutApprovalSpec,
    RolloutOnFailureSpec, RolloutSpec, RolloutTrafficSpec, SpreadByFieldSpec, SpreadConstraintSpec,
    TolerationOperatorSpec, TolerationSpec, TrafficModeSpec, WorkloadTermSpec,
};

/// The longest a scoring webhook may be given to answer.
const MAX_WEBHOOK_TIMEOUT_MILLIS: u64 = 30_000;
/// A scoring webhook's timeout when the policy gives none.
const DEFAULT_WEBHOOK_TIMEOUT_MILLIS: u64 = 1_000;

pub fn scheduling_policy(csp: &ClusterSchedulingPolicy) -> Result<core::Policy, Vec<String>> {
    let mut problems = Vec::new();
    let key = key_of(&csp.metadata).map_err(|e| vec![e.to_string()])?;
    let spec = &csp.spec;
    let selectors = service_selectors(csp, &mut problems);
    let placement = spec.placement.clone().unwrap_or_default();
    let traffic = spec.traffic.clone().unwrap_or_default();
    let mut affinities = Vec::new();
    for (i, a) in placement.cluster_affinities.iter().enumerate() {
        let at = format!("placement.clusterAffinities[{i}]");
        if a.name.is_empty() {
            problems.push(format!("{at}: name is required"));
        }
        if placement.cluster_affinities[..i]
            .iter()
            .any(|b| b.name == a.name)
        {
            problems.push(format!("{at}: the name {:?} is used twice", a.name));
        }
        if let Some(clusters) = cluster_set(
            &a.cluster_names,
            a.label_selector.as_ref(),
            &at,
            &mut problems,
        ) {
            affinities.push(core::AffinityTier {
                name: a.name.as_str().into(),
                clusters,
            });
        }
    }
    let templates = template_selectors(csp, &mut problems);
    let tolerations = tolerations(&placement.tolerations, &mut problems);
    let mut placement_policy = placement_policy(&placement, &mut problems);
    if let Some(strategy) = placement_policy.as_mut().and_then(|p| p.rollout.as_mut()) {
        strategy.control = rollout_control(csp.metadata.annotations.as_ref(), &mut problems);
    }
    let standby = placement_policy
        .as_ref()
        .is_some_and(|p| p.standby.is_some());
    if standby && placement.cluster_affinities.len() < 2 {
        problems.push(
            "placement.replicaScheduling.standby needs at least two placement.clusterAffinities (the running tier and the standby's)"
                .into(),
        );
    }
    let mode = match traffic.mode {
        None if standby => core::Mode::Tiers,
        None | Some(TrafficModeSpec::Locality) => core::Mode::Locality,
        Some(TrafficModeSpec::Tiers) => core::Mode::Tiers,
        Some(TrafficModeSpec::Weighted) => core::Mode::Weighted,
    };
    if standby && mode != core::Mode::Tiers {
        problems.push(
            "placement.replicaScheduling.standby sends traffic to the standby only after it takes over: traffic.mode must be Tiers (or unset)"
                .into(),
        );
    }
    if mode == core::Mode::Tiers && placement.cluster_affinities.is_empty() {
        problems.push("traffic.mode Tiers needs placement.clusterAffinities".into());
    }
    let weights = weight_rules(&traffic.weights, "traffic.weights", &mut problems);
    if traffic.min_healthy_endpoints == Some(0) {
        problems.push("traffic.minHealthyEndpoints must be at least 1".into());
    }
    if let Some(dns) = &traffic.dns
        && dns.ttl == Some(0)
    {
        problems.push("traffic.dns.ttl must be at least 1 (0 defeats every cache)".into());
    }
    let outlier = outlier_detection(traffic.outlier_detection.as_ref(), &mut problems);
    if !problems.is_empty() {
        return Err(problems);
    }
    let dns = traffic.dns.unwrap_or_default();
    // One policy, both halves: a cluster failed over for placement leaves traffic at the same
    // moment, unless the policy says otherwise.
    let withdraw_after_seconds = traffic
        .withdraw
        .map(|w| w.after_seconds)
        .or(placement.failover.as_ref().map(|f| f.after_seconds));
    Ok(core::Policy {
        created: created_secs(&csp.metadata),
        selectors,
        templates,
        placement: placement_policy.map(Arc::new),
        traffic: Arc::new(core::TrafficPolicy {
            source: Some(key.to_string()),
            mode,
            affinities,
            weights,
            min_healthy_endpoints: traffic.min_healthy_endpoints.unwrap_or(1),
            withdraw_after_seconds,
            failback_after_seconds: traffic.failback_after_seconds.unwrap_or(0),
            tolerations,
            ttl: dns.ttl,
            max_answers: dns.max_answers,
            // The rollouts' drains and ramps come from the status, in their own event.
            drained: Default::default(),
            ramping: Default::default(),
            outlier,
        }),
        key,
    })
}

/// `traffic.outlierDetection`, its defaults filled in (today's, without one).
fn outlier_detection(
    spec: Option<&crate::crd::OutlierDetectionSpec>,
    problems: &mut Vec<String>,
) -> core::OutlierDetection {
    let default = core::OutlierDetection::default();
    let Some(spec) = spec else {
        return default;
    };
    let at = "traffic.outlierDetection";
    let percent = |what: &str, v: u32, problems: &mut Vec<String>| {
        if v > 100 {
            problems.push(format!("{at}.{what} is a percentage (0-100), not {v}"));
        }
        v
    };
    let failure_percentage = spec
        .failure_percentage
        .as_ref()
        .map(|f| core::FailurePercentage {
            threshold: percent("failurePercentage.threshold", f.threshold, problems),
            minimum_hosts: f.minimum_hosts.unwrap_or(5),
            request_volume: f.request_volume.unwrap_or(50),
        });
    let seconds = |what: &str, v: Option<u32>, default: u32, problems: &mut Vec<String>| {
        let v = v.unwrap_or(default);
        if v == 0 {
            problems.push(format!("{at}.{what} must be at least 1"));
        }
        v
    };
    core::OutlierDetection {
        // 0 turns a count off, as Envoy has no "never" of its own.
        consecutive_errors: match spec.consecutive_errors {
            None => default.consecutive_errors,
            Some(0) => None,
            Some(n) => Some(n),
        },
        consecutive_gateway_errors: spec.consecutive_gateway_errors.filter(|n| *n > 0),
        failure_percentage,
        interval_seconds: seconds(
            "intervalSeconds",
            spec.interval_seconds,
            default.interval_seconds,
            problems,
        ),
        base_ejection_seconds: seconds(
            "baseEjectionSeconds",
            spec.base_ejection_seconds,
            default.base_ejection_seconds,
            problems,
        ),
        max_ejection_percent: percent(
            "maxEjectionPercent",
            spec.max_ejection_percent
                .unwrap_or(default.max_ejection_percent),
            problems,
        ),
    }
}

/// The template selectors: those naming a `kind` (a `Service` selector governs the Service's
/// traffic and places Service templates of that name).
fn template_selectors(
    csp: &ClusterSchedulingPolicy,
    problems: &mut Vec<String>,
) -> Vec<core::TemplateSelector> {
    let mut out = Vec::new();
    for (i, s) in csp.spec.resource_selectors.iter().enumerate() {
        let at = format!("spec.resourceSelectors[{i}]");
        let Some(kind) = &s.kind else { continue };
        if let Some(why) = unplaceable(s.api_version.as_deref(), kind) {
            problems.push(format!("{at}: {kind} cannot be placed: {why}"));
            continue;
        }
        out.push(core::TemplateSelector {
            api_version: s.api_version.clone(),
            kind: Some(kind.clone()),
            name: s.name.clone(),
            selector: s
                .label_selector
                .as_ref()
                .and_then(|l| label_selector(l, &format!("{at}.labelSelector"), problems)),
        });
    }
    out
}

/// Why a kind is not a template meridian can place, if it is not.
pub fn unplaceable(api_version: Option<&str>, kind: &str) -> Option<&'static str> {
    let group = api_version.map_or("", |v| v.rsplit_once('/').map_or("", |(g, _)| g));
    if group == "meridian.io" {
        return Some("meridian.io kinds configure meridian itself");
    }
    match kind {
        "Namespace"
        | "Node"
        | "PersistentVolume"
        | "ClusterRole"
        | "ClusterRoleBinding"
        | "CustomResourceDefinition"
        | "StorageClass"
        | "PriorityClass"
        | "APIService"
        | "MutatingWebhookConfiguration"
        | "ValidatingWebhookConfiguration" => {
            Some("it is cluster-scoped; templates are namespaced objects")
        }
        "EndpointSlice" | "Endpoints" | "ServiceImport" | "Event" | "Pod" => {
            Some("members derive it themselves (or meridian writes it back)")
        }
        "" => Some("kind is empty"),
        _ => None,
    }
}

fn tolerations(specs: &[TolerationSpec], problems: &mut Vec<String>) -> Vec<core::Toleration> {
    let mut out = Vec::new();
    for (i, t) in specs.iter().enumerate() {
        let at = format!("placement.tolerations[{i}]");
        let operator = match (t.operator, &t.value) {
            (Some(TolerationOperatorSpec::Exists), Some(_)) => {
                problems.push(format!("{at}: operator Exists takes no value"));
                continue;
            }
            (Some(TolerationOperatorSpec::Equal), _) | (None, Some(_)) => {
                core::TolerationOperator::Equal
            }
            (Some(TolerationOperatorSpec::Exists), None) | (None, None) => {
                core::TolerationOperator::Exists
            }
        };
        if operator == core::TolerationOperator::Equal && t.key.is_empty() {
            problems.push(format!("{at}: operator Equal needs a key"));
            continue;
        }
        let effect = t.effect.map(taint_effect);
        if t.toleration_seconds.is_some() && effect != Some(core::TaintEffect::NoExecute) {
            problems.push(format!(
                "{at}: tolerationSeconds applies to effect NoExecute only"
            ));
            continue;
        }
        out.push(core::Toleration {
            key: t.key.clone(),
            operator,
            value: t.value.clone(),
            effect,
            seconds: t.toleration_seconds,
        });
    }
    out
}

/// The placement part; None when the spec says nothing of how to place (Duplicated).
fn placement_policy(
    placement: &PlacementSpec,
    problems: &mut Vec<String>,
) -> Option<core::PlacementPolicy> {
    let spread = spread_constraints(&placement.spread_constraints, problems);
    let scheduling = placement.replica_scheduling.clone().unwrap_or_default();
    let replicas = replica_scheduling(&scheduling, problems)?;
    let standby = scheduling.standby.as_ref().map(|s| s.replicas);
    if standby == Some(0) {
        problems.push("placement.replicaScheduling.standby.replicas must be at least 1".into());
    }
    if placement
        .failover
        .as_ref()
        .is_some_and(|f| f.after_seconds == 0)
    {
        problems.push("placement.failover.afterSeconds must be at least 1".into());
    }
    Some(core::PlacementPolicy {
        spread,
        replicas,
        standby,
        failover_after_seconds: placement.failover.as_ref().map(|f| f.after_seconds),
        failback_after_seconds: placement.failback_after_seconds.unwrap_or(0),
        propagation: propagation(placement, problems),
        scoring: scoring(placement, problems),
        rollout: placement
            .rollout
            .as_ref()
            .and_then(|r| rollout(r, &placement.cluster_affinities, problems)),
    })
}

/// The scoring part: plugin weights, what the plugins read, the programs.
fn scoring(placement: &PlacementSpec, problems: &mut Vec<String>) -> core::placement::Scoring {
    use core::placement::{
        DataLocality, FailurePolicy, Plugin, PreferredAffinity, Scoring, Script, Webhook,
    };
    let mut weights = Vec::new();
    for (i, s) in placement.scoring.iter().enumerate() {
        let at = format!("placement.scoring[{i}]");
        match Plugin::parse(&s.plugin) {
            Some(p) if weights.iter().any(|(q, _)| *q == p) => {
                problems.push(format!("{at}: plugin {p} is listed twice"));
            }
            Some(p) => weights.push((p, s.weight)),
            None => problems.push(format!(
                "{at}: unknown plugin {:?} ({})",
                s.plugin,
                Plugin::ALL.map(Plugin::name).join(", ")
            )),
        }
    }
    let data_locality = placement.data_locality.as_ref().map(|d| {
        let at = "placement.dataLocality";
        if d.cluster_names.is_empty() && d.label_selector.is_none() && d.from_annotation.is_none() {
            problems.push(format!(
                "{at}: clusterNames, labelSelector or fromAnnotation is required"
            ));
        }
        DataLocality {
            cluster_names: d.cluster_names.clone(),
            selector: d
                .label_selector
                .as_ref()
                .and_then(|s| label_selector(s, &format!("{at}.labelSelector"), problems)),
            from_annotation: d.from_annotation.clone(),
        }
    });
    let preferred_affinities = placement
        .preferred_cluster_affinities
        .iter()
        .enumerate()
        .filter_map(|(i, a)| {
            let at = format!("placement.preferredClusterAffinities[{i}]");
            let clusters = cluster_set(&a.cluster_names, a.label_selector.as_ref(), &at, problems)?;
            Some(PreferredAffinity {
                clusters,
                weight: a.weight,
            })
        })
        .collect();
    let webhooks = placement
        .webhooks
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let at = format!("placement.webhooks[{i}]");
            if let Some(p) = webhook_url_problem(&w.url) {
                problems.push(format!("{at}.url: {p}"));
            }
            let timeout = w.timeout_millis.unwrap_or(DEFAULT_WEBHOOK_TIMEOUT_MILLIS);
            if timeout == 0 || timeout > MAX_WEBHOOK_TIMEOUT_MILLIS {
                problems.push(format!(
                    "{at}.timeoutMillis: {timeout} is outside 1..={MAX_WEBHOOK_TIMEOUT_MILLIS}"
                ));
            }
            Arc::new(Webhook {
                url: w.url.clone(),
                ca_bundle: w.ca_bundle.clone(),
                timeout_millis: timeout,
                failure_policy: match w.failure_policy {
                    Some(FailurePolicySpec::Fail) => FailurePolicy::Fail,
                    Some(FailurePolicySpec::Ignore) | None => FailurePolicy::Ignore,
                },
            })
        })
        .collect();
    let script = placement.script.as_ref().map(|s| {
        if let Err(why) = meridian_script::check(&s.lua) {
            problems.push(format!("placement.script.lua: {why}"));
        }
        Arc::new(Script {
            lua: Arc::from(s.lua.as_str()),
        })
    });
    Scoring {
        weights,
        data_locality,
        workload_affinity: workload_terms(
            &placement.workload_affinity,
            "workloadAffinity",
            problems,
        ),
        workload_anti_affinity: workload_terms(
            &placement.workload_anti_affinity,
            "workloadAntiAffinity",
            problems,
        ),
        preferred_affinities,
        webhooks,
        script,
    }
}

/// Why `url` cannot be a scoring webhook's (None: it can): HTTPS anywhere, plain HTTP only to
/// a loopback address.
fn webhook_url_problem(url: &str) -> Option<String> {
    if url.starts_with("https://") {
        return None;
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return Some(format!("{url:?} is neither https:// nor http://"));
    };
    let host = rest.split(['/', '?']).next().unwrap_or("");
    let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    (!loopback).then(|| format!("{url:?}: plain http:// is allowed to loopback addresses only"))
}

fn workload_terms(
    specs: &[WorkloadTermSpec],
    field: &str,
    problems: &mut Vec<String>,
) -> Vec<core::placement::WorkloadTerm> {
    specs
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let at = format!("placement.{field}[{i}]");
            let preferred = match (t.required.unwrap_or(false), t.weight) {
                (true, None) => None,
                (false, Some(w)) if w > 0 => Some(w),
                (false, Some(_)) => {
                    problems.push(format!("{at}: weight must be at least 1"));
                    return None;
                }
                (true, Some(_)) => {
                    problems.push(format!("{at}: required and weight exclude each other"));
                    return None;
                }
                (false, None) => {
                    problems.push(format!("{at}: say required: true or give a weight"));
                    return None;
                }
            };
            let selector =
                label_selector(&t.label_selector, &format!("{at}.labelSelector"), problems)?;
            Some(core::placement::WorkloadTerm {
                selector,
                topology: match t.topology {
                    SpreadByFieldSpec::Cluster => core::SpreadBy::Cluster,
                    SpreadByFieldSpec::Region => core::SpreadBy::Region,
                    SpreadByFieldSpec::Zone => core::SpreadBy::Zone,
                },
                preferred,
            })
        })
        .collect()
}

/// How the placed objects reach the members.
fn propagation(placement: &PlacementSpec, problems: &mut Vec<String>) -> core::Propagation {
    let defaults = core::Propagation::default();
    for path in &placement.retain {
        if !path.is_empty() && !path.starts_with('/') {
            problems.push(format!(
                "placement.retain: {path:?} is not a JSON pointer (it must start with /)"
            ));
        }
    }
    core::Propagation {
        conflict_resolution: match placement.conflict_resolution {
            Some(ConflictResolutionSpec::Overwrite) => core::ConflictResolution::Overwrite,
            Some(ConflictResolutionSpec::Abort) | None => core::ConflictResolution::Abort,
        },
        purge_mode: match placement.purge_mode {
            Some(PurgeModeSpec::Immediately) => core::PurgeMode::Immediately,
            Some(PurgeModeSpec::Never) => core::PurgeMode::Never,
            Some(PurgeModeSpec::Graceful) | None => core::PurgeMode::Graceful,
        },
        grace_period_seconds: placement
            .grace_period_seconds
            .unwrap_or(defaults.grace_period_seconds),
        preserve_on_deletion: placement.preserve_resources_on_deletion.unwrap_or(false),
        retain: placement.retain.clone(),
    }
}

/// `placement.rollout`: each stage takes clusters by name or labels, those of a tier (one of
/// `affinities`, by name), or the rest in batches; only the last stage may take the rest
/// (nothing would be left for a stage after it).
fn rollout(
    spec: &RolloutSpec,
    affinities: &[ClusterAffinitySpec],
    problems: &mut Vec<String>,
) -> Option<core::stages::Strategy> {
    use core::stages::{Amount, OnFailure, StageClusters, StageSpec, Strategy, TrafficDuring};
    if spec.stages.is_empty() {
        problems.push("placement.rollout.stages: at least one stage is required".into());
        return None;
    }
    let mut stages = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    for (i, s) in spec.stages.iter().enumerate() {
        let at = format!("placement.rollout.stages[{i}]");
        if s.name.is_empty() || !names.insert(s.name.as_str()) {
            problems.push(format!(
                "{at}.name: a stage needs a name of its own ({:?})",
                s.name
            ));
        }
        let by_set = !s.cluster_names.is_empty() || s.label_selector.is_some();
        let clusters = match (
            by_set,
            s.tier.as_deref(),
            s.max_unavailable_clusters,
            s.max_unavailable_percent,
        ) {
            (true, None, None, None) => StageClusters::Set(cluster_set(
                &s.cluster_names,
                s.label_selector.as_ref(),
                &at,
                problems,
            )?),
            (false, Some(tier), None, None) => {
                let Some(a) = affinities.iter().find(|a| a.name == tier) else {
                    let known: Vec<&str> = affinities.iter().map(|a| a.name.as_str()).collect();
                    problems.push(format!(
                        "{at}.tier: the policy has no clusterAffinities entry {tier:?} (it has: {})",
                        if known.is_empty() { "none".to_string() } else { known.join(", ") }
                    ));
                    continue;
                };
                StageClusters::Set(cluster_set(
                    &a.cluster_names,
                    a.label_selector.as_ref(),
                    &at,
                    problems,
                )?)
            }
            (false, None, Some(n), None) if n >= 1 => StageClusters::Rest {
                max_unavailable: Amount::Count(n),
            },
            (false, None, None, Some(p)) if (1..=100).contains(&p) => StageClusters::Rest {
                max_unavailable: Amount::Percent(p),
            },
            _ => {
                problems.push(format!(
                    "{at}: exactly one of clusterNames/labelSelector, tier, maxUnavailableClusters (at least 1) or maxUnavailablePercent (1 to 100)"
                ));
                continue;
            }
        };
        if matches!(clusters, StageClusters::Rest { .. }) && i + 1 != spec.stages.len() {
            problems.push(format!(
                "{at}: a stage of the rest (maxUnavailable…) takes every cluster left, so it must be the last"
            ));
        }
        stages.push(StageSpec {
            name: s.name.clone(),
            clusters,
            wait_seconds: s.wait_seconds.unwrap_or(0),
            approval_required: s.approval == Some(RolloutApprovalSpec::Required),
            max_failures: s.max_failures.unwrap_or(0),
        });
    }
    let deadline = spec.progress_deadline_seconds.unwrap_or(600);
    if deadline == 0 {
        problems.push("placement.rollout.progressDeadlineSeconds must be at least 1".into());
    }
    Some(Strategy {
        stages,
        traffic: match spec.traffic {
            Some(RolloutTrafficSpec::Keep) => TrafficDuring::Keep,
            Some(RolloutTrafficSpec::Drain) | None => TrafficDuring::Drain,
        },
        drain_seconds: spec.drain_seconds.unwrap_or(30),
        ramp_seconds: spec.ramp_seconds.unwrap_or(0),
        progress_deadline_seconds: deadline,
        on_failure: match spec.on_failure {
            Some(RolloutOnFailureSpec::Rollback) => OnFailure::Rollback,
            Some(RolloutOnFailureSpec::Pause) | None => OnFailure::Pause,
        },
        analysis: spec.analysis.as_ref().and_then(|a| analysis(a, problems)),
        control: Default::default(),
    })
}

/// What a GitOps tool says of the policy's rollouts through its annotations.
pub const ROLLOUT_PAUSED: &str = "meridian.io/rollout-paused";
pub const ROLLOUT_APPROVED: &str = "meridian.io/rollout-approved";
pub const ROLLOUT_ABORT: &str = "meridian.io/rollout-abort";

fn rollout_control(
    annotations: Option<&BTreeMap<String, String>>,
    problems: &mut Vec<String>,
) -> core::stages::Control {
    let get = |k: &str| annotations.and_then(|a| a.get(k)).map(|v| v.trim());
    let paused = match get(ROLLOUT_PAUSED) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            problems.push(format!(
                "annotation {ROLLOUT_PAUSED}: \"true\" or \"false\", not {other:?}"
            ));
            false
        }
    };
    let approved = get(ROLLOUT_APPROVED)
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let abort = match get(ROLLOUT_ABORT) {
        None => None,
        Some(v) => match v.parse::<i64>() {
            Ok(g) => Some(g),
            Err(_) => {
                problems.push(format!(
                    "annotation {ROLLOUT_ABORT}: the template generation to abort, not {v:?}"
                ));
                None
            }
        },
    };
    core::stages::Control {
        paused,
        approved,
        abort,
    }
}

fn analysis(
    spec: &RolloutAnalysisSpec,
    problems: &mut Vec<String>,
) -> Option<core::stages::Analysis> {
    let at = "placement.rollout.analysis";
    let url = spec.prometheus_url.trim_end_matches('/');
    let mut ok = true;
    if !(url.starts_with("http://") || url.starts_with("https://"))
        || url.parse::<http::Uri>().is_err()
    {
        problems.push(format!(
            "{at}.prometheusURL: {:?} is not an http(s) URL",
            spec.prometheus_url
        ));
        ok = false;
    }
    if spec.query.trim().is_empty() || spec.query.len() > 4096 {
        problems.push(format!("{at}.query: a PromQL query of at most 4096 bytes"));
        ok = false;
    }
    if !spec.threshold.is_finite() {
        problems.push(format!("{at}.threshold must be a finite number"));
        ok = false;
    }
    ok.then(|| core::stages::Analysis {
        prometheus_url: url.to_string(),
        query: spec.query.clone(),
        threshold: core::stages::Threshold(spec.threshold),
    })
}

fn spread_constraints(
    specs: &[SpreadConstraintSpec],
    problems: &mut Vec<String>,
) -> Vec<core::SpreadConstraint> {
    let mut out = Vec::new();
    for (i, c) in specs.iter().enumerate() {
        let at = format!("placement.spreadConstraints[{i}]");
        let by = match c.spread_by_field {
            SpreadByFieldSpec::Cluster => core::SpreadBy::Cluster,
            SpreadByFieldSpec::Region => core::SpreadBy::Region,
            SpreadByFieldSpec::Zone => core::SpreadBy::Zone,
        };
        if specs[..i]
            .iter()
            .any(|d| d.spread_by_field == c.spread_by_field)
        {
            problems.push(format!("{at}: spreadByField {by:?} is constrained twice"));
        }
        let min_groups = c.min_groups.unwrap_or(1);
        match c.max_groups {
            Some(0) => problems.push(format!("{at}: maxGroups must be at least 1")),
            Some(max) if min_groups > max => problems.push(format!(
                "{at}: minGroups {min_groups} is greater than maxGroups {max}"
            )),
            _ => {}
        }
        out.push(core::SpreadConstraint {
            by,
            min_groups,
            max_groups: c.max_groups,
        });
    }
    out
}

fn replica_scheduling(
    s: &ReplicaSchedulingSpec,
    problems: &mut Vec<String>,
) -> Option<core::ReplicaScheduling> {
    let at = "placement.replicaScheduling";
    if s.type_ == ReplicaSchedulingTypeSpec::Duplicated {
        if s.division_preference.is_some() || !s.weights.is_empty() || s.dynamic.is_some() {
            problems.push(format!(
                "{at}: divisionPreference, weights and dynamic need type Divided"
            ));
        }
        return Some(core::ReplicaScheduling::Duplicated);
    }
    let division = match (s.division_preference, s.weights.is_empty(), s.dynamic) {
        (Some(DivisionPreferenceSpec::Aggregated), true, None) => core::Division::Aggregated,
        (Some(DivisionPreferenceSpec::Aggregated), _, _) => {
            problems.push(format!(
                "{at}: divisionPreference Aggregated takes no weights and no dynamic"
            ));
            return None;
        }
        (_, false, Some(_)) => {
            problems.push(format!("{at}: weights and dynamic exclude each other"));
            return None;
        }
        (_, true, Some(DynamicWeightSpec::AvailableCapacity)) => core::Division::AvailableCapacity,
        (_, _, None) => {
            let rules = weight_rules(&s.weights, &format!("{at}.weights"), problems);
            if !s.weights.is_empty() && s.weights.iter().all(|w| w.weight == 0) {
                problems.push(format!(
                    "{at}.weights: every weight is 0, so no cluster could run a replica"
                ));
            }
            core::Division::Weights(rules)
        }
    };
    Some(core::ReplicaScheduling::Divided(division))
}

/// The Service selectors; selectors of other kinds (workload templates) are placement's.
fn service_selectors(
    csp: &ClusterSchedulingPolicy,
    problems: &mut Vec<String>,
) -> Vec<core::ServiceSelector> {
    let mut out = Vec::new();
    if csp.spec.resource_selectors.is_empty() {
        problems.push("spec.resourceSelectors: at least one selector is required".into());
    }
    for (i, s) in csp.spec.resource_selectors.iter().enumerate() {
        let at = format!("spec.resourceSelectors[{i}]");
        if s.kind.as_deref().is_some_and(|k| k != "Service") {
            continue;
        }
        if s.name.is_none() && s.label_selector.is_none() {
            problems.push(format!("{at}: name or labelSelector is required"));
            continue;
        }
        out.push(core::ServiceSelector {
            name: s.name.clone(),
            selector: s
                .label_selector
                .as_ref()
                .and_then(|l| label_selector(l, &format!("{at}.labelSelector"), problems)),
        });
    }
    out
}

/// `weights[]` of traffic or of replicaScheduling: a rule per entry that names its clusters.
fn weight_rules(
    specs: &[crate::crd::WeightSpec],
    at: &str,
    problems: &mut Vec<String>,
) -> Vec<core::WeightRule> {
    specs
        .iter()
        .enumerate()
        .filter_map(|(i, w)| {
            let at = format!("{at}[{i}]");
            let clusters = cluster_set(&w.cluster_names, w.label_selector.as_ref(), &at, problems)?;
            Some(core::WeightRule {
                clusters,
                weight: w.weight,
            })
        })
        .collect()
}

pub(crate) fn cluster_set(
    names: &[String],
    selector: Option<&LabelSelectorSpec>,
    at: &str,
    problems: &mut Vec<String>,
) -> Option<core::ClusterSet> {
    if names.is_empty() && selector.is_none() {
        problems.push(format!("{at}: clusterNames or labelSelector is required"));
        return None;
    }
    Some(core::ClusterSet {
        names: names.to_vec(),
        selector: match selector {
            Some(s) => Some(label_selector(s, &format!("{at}.labelSelector"), problems)?),
            None => None,
        },
    })
}

pub(crate) fn label_selector(
    s: &LabelSelectorSpec,
    at: &str,
    problems: &mut Vec<String>,
) -> Option<core::LabelSelector> {
    let mut expressions = Vec::new();
    for (i, r) in s.match_expressions.iter().enumerate() {
        let operator = match r.operator.as_str() {
            "In" => core::Operator::In,
            "NotIn" => core::Operator::NotIn,
            "Exists" => core::Operator::Exists,
            "DoesNotExist" => core::Operator::DoesNotExist,
            other => {
                problems.push(format!(
                    "{at}.matchExpressions[{i}]: unknown operator {other:?} (In, NotIn, Exists, DoesNotExist)"
                ));
                return None;
            }
        };
        let needs_values = matches!(operator, core::Operator::In | core::Operator::NotIn);
        if needs_values == r.values.is_empty() {
            problems.push(format!(
                "{at}.matchExpressions[{i}]: {} {}",
                r.operator,
                if needs_values {
                    "needs values"
                } else {
                    "takes no values"
                }
            ));
            return None;
        }
        expressions.push(core::Requirement {
            key: r.key.clone(),
            operator,
            values: r.values.clone(),
        });
    }
    Some(core::LabelSelector {
        match_labels: s.match_labels.clone(),
        match_expressions: expressions,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::manifest::{Loaded, Manifest, parse_str};

    fn read(yaml: &str) -> Result<core::Policy, Vec<String>> {
        let mut out = Loaded::default();
        parse_str(Path::new("p.yaml"), yaml, &mut out);
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        match &out.manifests[..] {
            [(_, Manifest::ClusterSchedulingPolicy(p))] => scheduling_policy(p),
            other => panic!("one policy expected, got {}", other.len()),
        }
    }

    const HEAD: &str = "apiVersion: meridian.io/v1alpha1\nkind: ClusterSchedulingPolicy\nmetadata: {name: p, namespace: shop, creationTimestamp: \"2026-01-01T00:00:00Z\"}\n";

    #[test]
    fn a_full_policy_converts() {
        let p = read(&format!(
            "{HEAD}spec:\n  resourceSelectors: [{{kind: Service, name: web}}, {{labelSelector: {{matchExpressions: [{{key: team, operator: In, values: [pay]}}]}}}}]\n  placement:\n    clusterAffinities: [{{name: eu, labelSelector: {{matchLabels: {{region: eu}}}}}}, {{name: us, clusterNames: [us-1]}}]\n    tolerations: [{{key: maintenance, effect: NoExecute}}]\n  traffic: {{mode: Tiers, minHealthyEndpoints: 2, weights: [{{clusterNames: [us-1], weight: 0}}], withdraw: {{afterSeconds: 30}}, failbackAfterSeconds: 60, dns: {{ttl: 7, maxAnswers: 2}}}}\n"
        ))
        .unwrap();
        assert_eq!(p.key.to_string(), "shop/p");
        assert_eq!(p.created, 1_767_225_600);
        assert_eq!(p.selectors.len(), 2);
        let t = &p.traffic;
        assert_eq!(t.source.as_deref(), Some("shop/p"));
        assert_eq!(t.mode, core::Mode::Tiers);
        assert_eq!(
            t.affinities.iter().map(|a| &*a.name).collect::<Vec<_>>(),
            ["eu", "us"]
        );
        assert_eq!(t.weights[0].weight, 0);
        assert_eq!(
            (
                t.min_healthy_endpoints,
                t.withdraw_after_seconds,
                t.failback_after_seconds,
                t.ttl,
                t.max_answers
            ),
            (2, Some(30), 60, Some(7), Some(2))
        );
        assert_eq!(t.tolerations[0].effect, Some(core::TaintEffect::NoExecute));
    }

    #[test]
    fn every_problem_is_named() {
        let problems = read(&format!(
            "{HEAD}spec:\n  resourceSelectors: [{{kind: Service}}]\n  placement:\n    clusterAffinities: [{{name: a}}, {{name: a, labelSelector: {{matchExpressions: [{{key: k, operator: Near}}]}}}}]\n  traffic: {{mode: Weighted, minHealthyEndpoints: 0, weights: [{{weight: 3}}], dns: {{ttl: 0}}}}\n"
        ))
        .unwrap_err();
        let all = problems.join("\n");
        for needle in [
            "spec.resourceSelectors[0]: name or labelSelector is required",
            "placement.clusterAffinities[0]: clusterNames or labelSelector is required",
            "placement.clusterAffinities[1]: the name \"a\" is used twice",
            "unknown operator \"Near\"",
            "traffic.weights[0]: clusterNames or labelSelector is required",
            "traffic.minHealthyEndpoints must be at least 1",
            "traffic.dns.ttl must be at least 1",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
        }
        let problems = read(&format!(
            "{HEAD}spec:\n  resourceSelectors: [{{name: web}}]\n  traffic: {{mode: Tiers}}\n"
        ))
        .unwrap_err();
        assert_eq!(
            problems,
            ["traffic.mode Tiers needs placement.clusterAffinities"]
        );
    }

    #[test]
    fn outlier_detection_fills_todays_defaults_and_names_what_is_wrong() {
        let none = read(&format!(
            "{HEAD}spec:\n  resourceSelectors: [{{name: web}}]\n"
        ))
        .unwrap();
        assert_eq!(none.traffic.outlier, core::OutlierDetection::default());
        let p = read(&format!(
            "{HEAD}spec:\n  resourceSelectors: [{{name: web}}]\n  traffic:\n    outlierDetection: {{consecutiveErrors: 0, consecutiveGatewayErrors: 3, failurePercentage: {{threshold: 50, minimumHosts: 2}}, intervalSeconds: 1}}\n"
        ))
        .unwrap();
        assert_eq!(
            p.traffic.outlier,
            core::OutlierDetection {
                consecutive_errors: None,
                consecutive_gateway_errors: Some(3),
                failure_percentage: Some(core::FailurePercentage {
                    threshold: 50,
                    minimum_hosts: 2,
                    request_volume: 50
                }),
                interval_seconds: 1,
                base_ejection_seconds: 30,
                max_ejection_percent: 50,
            }
        );
        let problems = read(&format!(
            "{HEAD}spec:\n  resourceSelectors: [{{name: web}}]\n  traffic:\n    outlierDetection: {{failurePercentage: {{threshold: 150}}, intervalSeconds: 0, maxEjectionPercent: 101}}\n"
        ))
        .unwrap_err();
        assert_eq!(
            problems,
            [
                "traffic.outlierDetection.failurePercentage.threshold is a percentage (0-100), not 150",
                "traffic.outlierDetection.intervalSeconds must be at least 1",
                "traffic.outlierDetection.maxEjectionPercent is a percentage (0-100), not 101",
            ]
        );
    }

    #[test]
    fn placement_converts_with_one_list_of_tiers_and_tolerations() {
        let p = read(&format!(
            "{HEAD}spec:\n  resourceSelectors: [{{apiVersion: apps/v1, kind: Deployment, name: web}}, {{kind: Service, name: web}}]\n  placement:\n    clusterAffinities: [{{name: eu, clusterNames: [eu-1]}}, {{name: us, clusterNames: [us-1]}}]\n    tolerations: [{{key: maintenance, operator: Exists, effect: NoExecute, tolerationSeconds: 60}}, {{key: gpu, value: \"yes\"}}]\n    spreadConstraints: [{{spreadByField: region, minGroups: 1, maxGroups: 2}}]\n    replicaScheduling: {{type: Divided, weights: [{{clusterNames: [eu-1], weight: 2}}], standby: {{replicas: 1}}}}\n    failover: {{afterSeconds: 30}}\n    failbackAfterSeconds: 90\n"
        ))
        .unwrap();
        assert_eq!(p.selectors.len(), 1, "the Service selector governs traffic");
        assert_eq!(
            p.templates
                .iter()
                .map(|t| t.kind.as_deref())
                .collect::<Vec<_>>(),
            [Some("Deployment"), Some("Service")]
        );
        let placement = p.placement.as_deref().unwrap();
        assert_eq!(placement.standby, Some(1));
        assert_eq!(placement.failover_after_seconds, Some(30));
        assert_eq!(placement.failback_after_seconds, 90);
        assert_eq!(placement.spread[0].by, core::SpreadBy::Region);
        assert!(matches!(
            &placement.replicas,
            core::ReplicaScheduling::Divided(core::Division::Weights(w)) if w[0].weight == 2
        ));
        let t = &p.traffic;
        assert_eq!(t.mode, core::Mode::Tiers, "standby sends traffic by tiers");
        assert_eq!(
            t.withdraw_after_seconds,
            Some(30),
            "failover withdraws traffic too"
        );
        assert_eq!(t.tolerations[0].seconds, Some(60));
        assert_eq!(t.tolerations[1].operator, core::TolerationOperator::Equal);
    }

    #[test]
    fn every_placement_problem_is_named() {
        let problems = read(&format!(
            "{HEAD}spec:\n  resourceSelectors: [{{kind: Namespace, name: shop}}, {{apiVersion: meridian.io/v1alpha1, kind: MemberCluster}}]\n  placement:\n    tolerations: [{{key: a, operator: Exists, value: x}}, {{key: b, effect: NoSchedule, tolerationSeconds: 5}}]\n    spreadConstraints: [{{spreadByField: zone, minGroups: 3, maxGroups: 2}}, {{spreadByField: zone, maxGroups: 0}}]\n    replicaScheduling: {{type: Divided, weights: [{{clusterNames: [a], weight: 0}}], standby: {{replicas: 1}}}}\n  traffic: {{mode: Locality}}\n"
        ))
        .unwrap_err();
        let all = problems.join("\n");
        for needle in [
            "spec.resourceSelectors[0]: Namespace cannot be placed: it is cluster-scoped",
            "spec.resourceSelectors[1]: MemberCluster cannot be placed: meridian.io kinds",
            "placement.tolerations[0]: operator Exists takes no value",
            "placement.tolerations[1]: tolerationSeconds applies to effect NoExecute only",
            "placement.spreadConstraints[0]: minGroups 3 is greater than maxGroups 2",
            "placement.spreadConstraints[1]: spreadByField Zone is constrained twice",
            "placement.spreadConstraints[1]: maxGroups must be at least 1",
            "placement.replicaScheduling.weights: every weight is 0",
            "standby needs at least two placement.clusterAffinities",
            "traffic.mode must be Tiers (or unset)",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
        }
    }

    #[test]
    fn a_rollout_is_read_with_its_defaults_and_its_problems_are_named() {
        let policy = read(&format!(
            "{HEAD}spec:\n  resourceSelectors: [{{apiVersion: apps/v1, kind: Deployment}}]\n  placement:\n    rollout:\n      rampSeconds: 30\n      onFailure: Rollback\n      stages:\n        - {{name: canary, clusterNames: [m1], waitSeconds: 60, approval: Required, maxFailures: 1}}\n        - {{name: eu, labelSelector: {{matchLabels: {{region: eu}}}}}}\n        - {{name: rest, maxUnavailablePercent: 25}}\n"
        ))
        .unwrap();
        let strategy = policy.placement.unwrap().rollout.clone().unwrap();
        assert_eq!(
            (
                strategy.traffic,
                strategy.drain_seconds,
                strategy.ramp_seconds,
                strategy.progress_deadline_seconds,
                strategy.on_failure
            ),
            (
                core::stages::TrafficDuring::Drain,
                30,
                30,
                600,
                core::stages::OnFailure::Rollback
            )
        );
        let tiered = read(&format!(
            "{HEAD}spec:\n  resourceSelectors: [{{apiVersion: apps/v1, kind: Deployment}}]\n  placement:\n    clusterAffinities:\n      - {{name: primary, clusterNames: [m1, m2]}}\n      - {{name: backup, labelSelector: {{matchLabels: {{role: backup}}}}}}\n    rollout:\n      stages: [{{name: first, tier: backup}}, {{name: then, tier: primary}}]\n"
        ))
        .unwrap();
        let stages = &tiered.placement.unwrap().rollout.clone().unwrap().stages;
        let core::stages::StageClusters::Set(backup) = &stages[0].clusters else {
            panic!("a tier's stage is a set of clusters: {stages:?}");
        };
        assert!(
            backup.names.is_empty() && backup.selector.is_some(),
            "{backup:?}"
        );
        assert_eq!(
            stages[1].clusters,
            core::stages::StageClusters::Set(core::ClusterSet {
                names: vec!["m1".into(), "m2".into()],
                selector: None
            })
        );
        let canary = &strategy.stages[0];
        assert_eq!(
            (
                canary.wait_seconds,
                canary.approval_required,
                canary.max_failures
            ),
            (60, true, 1)
        );
        assert_eq!(
            strategy.stages[2].clusters,
            core::stages::StageClusters::Rest {
                max_unavailable: core::stages::Amount::Percent(25)
            }
        );

        let problems = read(&format!(
            "{HEAD}spec:\n  resourceSelectors: [{{apiVersion: apps/v1, kind: Deployment}}]\n  placement:\n    clusterAffinities: [{{name: eu, clusterNames: [m1]}}]\n    rollout:\n      progressDeadlineSeconds: 0\n      stages:\n        - {{name: a, maxUnavailableClusters: 1}}\n        - {{name: a, clusterNames: [m1], maxUnavailablePercent: 10}}\n        - {{name: c, maxUnavailablePercent: 101}}\n        - {{name: d, tier: us}}\n        - {{name: e, tier: eu, clusterNames: [m2]}}\n"
        ))
        .unwrap_err()
        .join("\n");
        for needle in [
            "placement.rollout.stages[0]: a stage of the rest (maxUnavailable…) takes every cluster left, so it must be the last",
            "placement.rollout.stages[1].name: a stage needs a name of its own (\"a\")",
            "placement.rollout.stages[1]: exactly one of clusterNames/labelSelector",
            "placement.rollout.stages[2]: exactly one of",
            "placement.rollout.stages[3].tier: the policy has no clusterAffinities entry \"us\" (it has: eu)",
            "placement.rollout.stages[4]: exactly one of clusterNames/labelSelector, tier,",
            "placement.rollout.progressDeadlineSeconds must be at least 1",
        ] {
            assert!(
                problems.contains(needle),
                "missing {needle:?} in:\n{problems}"
            );
        }
    }
}
