//! The status of a hub template, aggregated from its copies in the member clusters, and
//! whether one copy is ready to take over from another (graceful failover).
//!
//! ```text
//!  MemberCopy { cluster, live object, applied_generation, applied_from } per member
//!    ── sorted by cluster name (the input order never shows in the result)
//!    ──aggregate(kind, template generation)──► status of the hub template:
//!        counters        summed over the copies reporting them
//!        conditions      one per type, sorted by type
//!        Job times       startTime the earliest, completionTime the latest (once all completed)
//!        observedGeneration   the template's generation, only when every copy is current
//! ```
//!
//! Rules:
//! - **counters** (Deployment `replicas`, `readyReplicas`, …; see [`aggregate`]): the sum over
//!   the copies that report the field. A field no copy reports is left out, as Kubernetes
//!   leaves out zero-valued counters; one copy reporting it makes it appear, even as 0.
//! - **conditions**, per type, over the copies that report it: the *healthy* status is `True`
//!   (`False` for the failure types `Failed`, `FailureTarget`, `ReplicaFailure`, whose
//!   `True` is the bad news). The aggregate is healthy when every copy is; else the unhealthy
//!   status when any copy says so; else `Unknown`. `reason` is that of the first copy with the
//!   aggregated status; `message` names the copies that are not healthy (all of them when all
//!   are), grouped by message: `"m1, m3: <msg>; m2: <msg>"`, cut at [`MAX_MESSAGE`] bytes;
//!   each of `lastTransitionTime`, `lastUpdateTime`, `lastProbeTime` is the latest. Times are
//!   compared as text, right for the RFC 3339 UTC seconds Kubernetes writes.
//! - A Job's `Complete` and `SuccessCriteriaMet` are written only when every copy reports
//!   them: a running copy has no `Complete` condition, and one finished copy is not a finished
//!   template.
//! - **observedGeneration** (see [`observed_generation`]) is the template's generation when
//!   every copy (a) observed what meridian last applied to it (`status.observedGeneration >=
//!   applied_generation`) and (b) that apply came from the template's current generation
//!   (`applied_from`); otherwise it is left out, so a reader never takes a status for the new
//!   generation before every member acts on it. No copies: left out. Jobs have no
//!   `observedGeneration` in their status, so none is written for them.
//!
//! Counts and generations that are not integers are read as absent: a member's odd status
//! spoils only its own part of the sum.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// One member's copy of a template.
#[derive(Clone, Copy, Debug)]
pub struct MemberCopy<'a> {
    pub cluster: &'a str,
    /// The live object in the member (`metadata.generation`, `status`).
    pub object: &'a Value,
    /// The member object's `metadata.generation` right after meridian's last apply of it;
    /// None: meridian has not applied it (or does not know).
    pub applied_generation: Option<i64>,
    /// The hub template generation that last apply came from.
    pub applied_from: Option<i64>,
}

/// The longest aggregated condition message, in bytes (Kubernetes allows 32768; a status
/// read by people should stay far shorter).
pub const MAX_MESSAGE: usize = 1024;

/// What a kind's aggregated status holds.
struct KindRules {
    counters: &'static [&'static str],
    /// The kind's status has `observedGeneration`.
    observed_generation: bool,
    /// Condition types written only when every copy reports them.
    completions: &'static [&'static str],
}

fn kind_rules(kind: &str) -> Option<KindRules> {
    let apps = |counters| KindRules {
        counters,
        observed_generation: true,
        completions: &[],
    };
    Some(match kind {
        "Deployment" => apps(&[
            "replicas",
            "readyReplicas",
            "updatedReplicas",
            "availableReplicas",
            "unavailableReplicas",
        ]),
        "ReplicaSet" => apps(&[
            "replicas",
            "readyReplicas",
            "availableReplicas",
            "fullyLabeledReplicas",
        ]),
        "StatefulSet" => apps(&[
            "replicas",
            "readyReplicas",
            "currentReplicas",
            "updatedReplicas",
            "availableReplicas",
        ]),
        "DaemonSet" => apps(&[
            "currentNumberScheduled",
            "numberMisscheduled",
            "desiredNumberScheduled",
            "numberReady",
            "updatedNumberScheduled",
            "numberAvailable",
            "numberUnavailable",
        ]),
        "Job" => KindRules {
            counters: &["active", "succeeded", "failed", "ready"],
            observed_generation: false,
            completions: &["Complete", "SuccessCriteriaMet"],
        },
        _ => return None,
    })
}

/// Condition types whose `True` is a failure.
const FAILURE_CONDITIONS: &[&str] = &["Failed", "FailureTarget", "ReplicaFailure"];
const CONDITION_TIMES: &[&str] = &["lastTransitionTime", "lastUpdateTime", "lastProbeTime"];

/// The `status` to write on the hub template of `kind` (Deployment, ReplicaSet, StatefulSet,
/// DaemonSet, Job), from its copies; None for any other kind (see the module docs).
pub fn aggregate(kind: &str, template_generation: i64, copies: &[MemberCopy<'_>]) -> Option<Value> {
    let rules = kind_rules(kind)?;
    let copies = by_cluster(copies);
    let mut status = Map::new();
    for field in rules.counters {
        if let Some(sum) = sum(&copies, field) {
            status.insert((*field).into(), sum.into());
        }
    }
    if kind == "Job" {
        job_times(&copies, &mut status);
    }
    let conditions = conditions(&copies, rules.completions);
    if !conditions.is_empty() {
        status.insert("conditions".into(), conditions.into());
    }
    if rules.observed_generation
        && let Some(generation) = observed_generation(template_generation, &copies)
    {
        status.insert("observedGeneration".into(), generation.into());
    }
    Some(Value::Object(status))
}

/// `template_generation` when every copy observed meridian's last apply and that apply came
/// from `template_generation`; None otherwise, and for no copies (see the module docs).
pub fn observed_generation(template_generation: i64, copies: &[MemberCopy<'_>]) -> Option<i64> {
    let current = |c: &MemberCopy<'_>| {
        let observed = int(c.object.pointer("/status/observedGeneration"));
        c.applied_from == Some(template_generation)
            && matches!((observed, c.applied_generation), (Some(o), Some(a)) if o >= a)
    };
    (!copies.is_empty() && copies.iter().all(current)).then_some(template_generation)
}

fn by_cluster<'a>(copies: &[MemberCopy<'a>]) -> Vec<MemberCopy<'a>> {
    let mut sorted = copies.to_vec();
    sorted.sort_by_key(|c| c.cluster);
    sorted
}

fn int(v: Option<&Value>) -> Option<i64> {
    v.and_then(Value::as_i64)
}

fn status_field<'a>(copy: &MemberCopy<'a>, field: &str) -> Option<&'a Value> {
    copy.object.get("status").and_then(|s| s.get(field))
}

/// The sum of `status.<field>` over the copies reporting it; None when none does.
fn sum(copies: &[MemberCopy<'_>], field: &str) -> Option<i64> {
    copies
        .iter()
        .filter_map(|c| int(status_field(c, field)))
        .reduce(i64::saturating_add)
}

/// `startTime` the earliest; `completionTime` the latest, once every copy has one.
fn job_times(copies: &[MemberCopy<'_>], status: &mut Map<String, Value>) {
    let times = |field| {
        copies
            .iter()
            .map(move |c| status_field(c, field).and_then(Value::as_str))
    };
    if let Some(start) = times("startTime").flatten().min() {
        status.insert("startTime".into(), start.into());
    }
    let completions: Option<Vec<&str>> = times("completionTime").collect();
    if let Some(end) = completions.and_then(|all| all.into_iter().max()) {
        status.insert("completionTime".into(), end.into());
    }
}

/// One copy's condition of one type.
struct Reported<'a> {
    cluster: &'a str,
    condition: &'a Map<String, Value>,
}

impl Reported<'_> {
    fn text(&self, field: &str) -> Option<&str> {
        self.condition.get(field).and_then(Value::as_str)
    }

    fn status(&self) -> &str {
        match self.text("status") {
            Some(s @ ("True" | "False")) => s,
            _ => "Unknown",
        }
    }
}

/// One aggregated condition per type some copy reports, sorted by type.
fn conditions(copies: &[MemberCopy<'_>], completions: &[&str]) -> Vec<Value> {
    let mut by_type: BTreeMap<&str, Vec<Reported<'_>>> = BTreeMap::new();
    for copy in copies {
        let listed = status_field(copy, "conditions").and_then(Value::as_array);
        for condition in listed.into_iter().flatten().filter_map(Value::as_object) {
            if let Some(kind) = condition.get("type").and_then(Value::as_str) {
                by_type.entry(kind).or_default().push(Reported {
                    cluster: copy.cluster,
                    condition,
                });
            }
        }
    }
    by_type
        .into_iter()
        .filter(|(kind, reports)| !completions.contains(kind) || reports.len() == copies.len())
        .map(|(kind, reports)| condition(kind, &reports))
        .collect()
}

fn condition(kind: &str, reports: &[Reported<'_>]) -> Value {
    let (healthy, unhealthy) = if FAILURE_CONDITIONS.contains(&kind) {
        ("False", "True")
    } else {
        ("True", "False")
    };
    let not_healthy: Vec<&Reported<'_>> =
        reports.iter().filter(|r| r.status() != healthy).collect();
    let status = if not_healthy.is_empty() {
        healthy
    } else if not_healthy.iter().any(|r| r.status() == unhealthy) {
        unhealthy
    } else {
        "Unknown"
    };
    let named: Vec<&Reported<'_>> = if not_healthy.is_empty() {
        reports.iter().collect()
    } else {
        not_healthy
    };
    let mut out = Map::new();
    out.insert("type".into(), kind.into());
    out.insert("status".into(), status.into());
    let explaining = reports.iter().find(|r| r.status() == status);
    if let Some(reason) = explaining.and_then(|r| r.text("reason")) {
        out.insert("reason".into(), reason.into());
    }
    out.insert("message".into(), message(&named).into());
    for field in CONDITION_TIMES {
        if let Some(latest) = reports.iter().filter_map(|r| r.text(field)).max() {
            out.insert((*field).into(), latest.into());
        }
    }
    Value::Object(out)
}

/// `"m1, m3: <msg>; m2: <msg>"`: the clusters grouped by what they say (their reason when
/// they give no message, their status when neither), cut at [`MAX_MESSAGE`].
fn message(reports: &[&Reported<'_>]) -> String {
    let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
    for r in reports {
        let said = [r.text("message"), r.text("reason")]
            .into_iter()
            .flatten()
            .find(|s| !s.is_empty())
            .unwrap_or_else(|| r.status());
        match groups.iter_mut().find(|(s, _)| *s == said) {
            Some((_, clusters)) => clusters.push(r.cluster),
            None => groups.push((said, vec![r.cluster])),
        }
    }
    let text = groups
        .iter()
        .map(|(said, clusters)| format!("{}: {said}", clusters.join(", ")))
        .collect::<Vec<_>>()
        .join("; ");
    truncate(text, MAX_MESSAGE)
}

/// `text` cut to at most `max` bytes on a character boundary, ending in `…` when cut.
fn truncate(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let ellipsis = '…';
    let mut end = max - ellipsis.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push(ellipsis);
    text
}

/// Whether one member copy of `kind` counts as ready, so the copy it replaces may go:
/// - Deployment: its controller observed the current generation
///   (`status.observedGeneration >= metadata.generation`) and `availableReplicas >= desired`;
///   StatefulSet and ReplicaSet the same with `readyReplicas`. `desired` is
///   `desired_replicas`, else `spec.replicas`, else 1 (the API's default).
/// - DaemonSet: observed, its controller counted the nodes (`desiredNumberScheduled`), and
///   `numberReady >= desiredNumberScheduled` (no node to run on is ready, as `kubectl rollout
///   status` has it).
/// - Job: not failed, and running or done (`ready > 0`, `succeeded > 0`, or `Complete`): the
///   old copy's work stops only once the new one's has started.
/// - any other kind (ConfigMap, Service, …): ready once it exists.
pub fn ready(kind: &str, object: &Value, desired_replicas: Option<u32>) -> bool {
    let count = |field| int(object.pointer(&format!("/status/{field}")));
    let desired = || {
        desired_replicas
            .map(i64::from)
            .or_else(|| int(object.pointer("/spec/replicas")))
            .unwrap_or(1)
    };
    match kind {
        "Deployment" => observed(object) && count("availableReplicas").unwrap_or(0) >= desired(),
        "StatefulSet" | "ReplicaSet" => {
            observed(object) && count("readyReplicas").unwrap_or(0) >= desired()
        }
        "DaemonSet" => {
            observed(object)
                && count("desiredNumberScheduled")
                    .is_some_and(|want| count("numberReady").unwrap_or(0) >= want)
        }
        "Job" => {
            !has_condition(object, "Failed")
                && (count("ready").unwrap_or(0) > 0
                    || count("succeeded").unwrap_or(0) > 0
                    || has_condition(object, "Complete"))
        }
        _ => true,
    }
}

/// The controller has seen the object's current spec (a missing generation counts as 1, the
/// API's first).
fn observed(object: &Value) -> bool {
    let generation = int(object.pointer("/metadata/generation")).unwrap_or(1);
    int(object.pointer("/status/observedGeneration")).is_some_and(|seen| seen >= generation)
}

/// The object has a condition of `kind` with status True.
fn has_condition(object: &Value, kind: &str) -> bool {
    let conditions = object
        .pointer("/status/conditions")
        .and_then(Value::as_array);
    conditions.into_iter().flatten().any(|c| {
        c.get("type").and_then(Value::as_str) == Some(kind)
            && c.get("status").and_then(Value::as_str) == Some("True")
    })
}

#[cfg(test)]
mod tests;
