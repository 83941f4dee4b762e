//! The status of every ClusterSchedulingPolicy on a Kubernetes hub, so that `kubectl get csp
//! -o yaml` answers what `/debug/problems` and `/debug/placements` do:
//!
//! - `Valid`: the policy is read as written (False: the problems naming it);
//! - `Conflict`: it selects a Service or template an older policy has, or a copy of a template
//!   it places meets an object meridian did not create;
//! - and for a policy that places templates: `Scheduled` (every one has somewhere to run),
//!   `Applied` (every copy is written) and `Ready` (every copy is ready).

use std::collections::{BTreeMap, BTreeSet};

use meridian_core::ObjectKey;
use meridian_core::placement::{Decision, Outcome, TemplateKey};
use serde_json::{Value, json};

use super::staged::Staged;
use super::{ObjectId, Pass, TemplateView, applied_and_ready, condition};

pub(super) const KIND: &str = "ClusterSchedulingPolicy";
const API_VERSION: &str = "meridian.io/v1alpha1";
/// How the core words a problem of a policy that lost what it selects to an older one.
const CONFLICT_PREFIX: &str = "Conflict:";

/// The most items a condition message lists (a message is at most 32 KiB).
const LISTED: usize = 10;

/// `items` joined by `sep`, the first [`LISTED`] of them and how many more.
pub(super) fn listed<S: AsRef<str>>(items: &[S], sep: &str) -> String {
    let shown: Vec<&str> = items.iter().take(LISTED).map(AsRef::as_ref).collect();
    match items.len().saturating_sub(LISTED) {
        0 => shown.join(sep),
        more => format!("{}{sep}and {more} more", shown.join(sep)),
    }
}

/// Per policy the hub holds (read, or named by a problem because it could not be read): its
/// id and the status to apply, in policy order.
pub(super) fn statuses(
    pass: &Pass<'_>,
    views: &BTreeMap<TemplateKey, TemplateView>,
    staged: &Staged,
    only: Option<&BTreeSet<ObjectKey>>,
) -> Vec<(ObjectId, Value)> {
    let snapshot = pass.snapshot;
    let mut keys: BTreeSet<ObjectKey> = snapshot.policies.iter().map(|p| p.key.clone()).collect();
    keys.extend(
        snapshot
            .problems
            .iter()
            .filter_map(|p| p.subject.object())
            .filter(|o| o.kind == KIND)
            .filter_map(|o| Some(ObjectKey::new(o.namespace.as_deref()?, &o.name))),
    );
    keys.into_iter()
        .filter(|key| only.is_none_or(|o| o.contains(key)))
        .map(|key| {
            let id = ObjectId::new(API_VERSION, KIND, Some(&key.namespace), &key.name);
            let mut conditions = conditions(pass, views, &key);
            let mut status = serde_json::Map::new();
            if let Some((ok, reason, message)) = staged.condition_of(&key) {
                conditions.push(condition("Rollout", ok, reason, message));
            }
            if let Some(rollout) = staged.status_of(&key) {
                status.insert("rollout".into(), rollout);
            }
            status.insert("conditions".into(), conditions.into());
            let body = json!({
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": {"name": &*key.name, "namespace": &*key.namespace},
                "status": status,
            });
            (id, body)
        })
        .collect()
}

fn conditions(
    pass: &Pass<'_>,
    views: &BTreeMap<TemplateKey, TemplateView>,
    key: &ObjectKey,
) -> Vec<Value> {
    let snapshot = pass.snapshot;
    let (conflicts, invalid): (Vec<&str>, Vec<&str>) = snapshot
        .problems
        .iter()
        .filter(|p| p.subject.is(KIND, key))
        .map(|p| p.reason.as_str())
        .partition(|r| r.starts_with(CONFLICT_PREFIX));
    let mut out = vec![if invalid.is_empty() {
        condition("Valid", true, "Valid", "read as written".into())
    } else {
        condition("Valid", false, "Invalid", listed(&invalid, "; "))
    }];
    let decisions: Vec<&Decision> = snapshot
        .placements
        .decisions
        .values()
        .map(|d| &**d)
        .filter(|d| d.policy.as_ref() == Some(key))
        .collect();
    let copies_in_the_way: Vec<String> = decisions
        .iter()
        .filter_map(|d| Some((&d.template, views.get(&d.template)?)))
        .filter(|(_, v)| !v.conflicts.is_empty())
        .map(|(t, v)| {
            let clusters: Vec<&str> = v.conflicts.iter().map(|c| c.as_str()).collect();
            format!(
                "{t}: an object of that name exists in {} and is not meridian's",
                clusters.join(", ")
            )
        })
        .collect();
    out.push(match (conflicts.is_empty(), copies_in_the_way.is_empty()) {
        (true, true) => condition("Conflict", false, "NoConflict", "nothing in the way".into()),
        (false, _) => condition(
            "Conflict",
            true,
            "OlderPolicy",
            listed(
                &conflicts
                    .iter()
                    .map(|c| c.trim_start_matches(CONFLICT_PREFIX).trim())
                    .chain(copies_in_the_way.iter().map(String::as_str))
                    .collect::<Vec<_>>(),
                "; ",
            ),
        ),
        (true, false) => condition(
            "Conflict",
            true,
            "NotCreatedByMeridian",
            listed(&copies_in_the_way, "; "),
        ),
    });
    let places = snapshot
        .policies
        .iter()
        .any(|p| &p.key == key && !p.templates.is_empty());
    if places {
        out.extend(placement_conditions(&decisions, views));
    }
    out
}

/// Scheduled, Applied and Ready over the templates a policy places.
fn placement_conditions(
    decisions: &[&meridian_core::placement::Decision],
    views: &BTreeMap<TemplateKey, TemplateView>,
) -> Vec<Value> {
    let unschedulable: Vec<String> = decisions
        .iter()
        .filter_map(|d| match &d.outcome {
            Outcome::Unschedulable { reason } => Some(format!("{}: {reason}", d.template)),
            Outcome::Scheduled => None,
        })
        .collect();
    let scheduled = if decisions.is_empty() {
        condition(
            "Scheduled",
            true,
            "NothingSelected",
            "it selects no template".into(),
        )
    } else if unschedulable.is_empty() {
        condition(
            "Scheduled",
            true,
            "Scheduled",
            format!("{} template(s) placed", decisions.len()),
        )
    } else {
        condition(
            "Scheduled",
            false,
            "Unschedulable",
            listed(&unschedulable, "; "),
        )
    };
    let copies = || {
        decisions.iter().flat_map(|d| {
            views
                .get(&d.template)
                .into_iter()
                .flat_map(|v| v.copies.iter())
                .map(move |(cluster, copy)| (&d.template, cluster, copy))
        })
    };
    let errors: Vec<String> = copies()
        .filter_map(|(t, c, copy)| Some(format!("{t} in {c}: {}", copy.error.as_ref()?)))
        .collect();
    let not_ready: Vec<String> = copies()
        .filter(|(_, _, copy)| !copy.ready)
        .map(|(t, c, _)| format!("{t} in {c}"))
        .collect();
    let errors = (!errors.is_empty()).then(|| listed(&errors, "; "));
    let not_ready =
        (!not_ready.is_empty()).then(|| format!("not ready: {}", listed(&not_ready, ", ")));
    let [applied, ready] = applied_and_ready(errors, not_ready);
    vec![scheduled, applied, ready]
}
