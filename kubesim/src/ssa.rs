//! Server-side apply, simplified: field sets, `metadata.managedFields`, merging an applied body,
//! removing what a manager stopped applying, and conflicts.
//!
//! ```text
//!  applied body ──fields()──► set of leaf paths (maps by key; a list or scalar is one leaf)
//!  live + body ──apply()──► conflicts? (another manager owns a path with another value)
//!                          ─► drop paths this manager no longer applies and nobody else owns
//!                          ─► deep-merge the body (maps merge, lists and scalars replace)
//!                          ─► managedFields: this manager's Apply entry = the new set
//!  old + new (PUT, merge/json patch) ──record_update()──► the writer's Update entry takes the
//!                          changed paths, every other manager loses them
//! ```
//!
//! Departures from the API server: lists are atomic (no `k:`/`v:` keys for list elements, so
//! two managers cannot own different elements of one list), there is no `.` entry for a map
//! owned as a whole, and a null in an applied body is stored as null.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

/// A path of map keys from the object's root to an owned leaf.
pub type Path = Vec<String>;

/// Which part of an object a write may touch: the main resource never writes `status` when
/// the kind has a status subresource, which writes only `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Everything but identity and server-set metadata (and status, when `status_subresource`).
    Main { status_subresource: bool },
    /// `status` only.
    Status,
}

/// Metadata the server sets or that names the object: never owned by a manager.
const SERVER_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// Another manager owns a field the apply would change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Apply failed with {} conflict(s): {}", .conflicts.len(), describe(.conflicts))]
pub struct Conflicts {
    /// (manager, path) for every field in conflict.
    pub conflicts: Vec<(String, Path)>,
}

fn describe(conflicts: &[(String, Path)]) -> String {
    conflicts
        .iter()
        .map(|(m, p)| format!("conflict with \"{m}\": .{}", p.join(".")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// One entry of `metadata.managedFields`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Managed {
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    pub api_version: String,
    pub time: String,
    pub subresource: Option<String>,
    pub fields: BTreeSet<Path>,
}

impl Managed {
    fn is(&self, manager: &str, operation: &str, subresource: Option<&str>) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource.as_deref() == subresource
    }
}

/// The leaf paths a body sets within `scope`.
pub fn fields(body: &Value, scope: Scope) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    let Some(top) = body.as_object() else {
        return out;
    };
    for (key, value) in top.iter().filter(|(k, _)| in_scope(scope, k)) {
        if key == "metadata" {
            for (k, v) in value.as_object().into_iter().flatten() {
                if !SERVER_METADATA.contains(&k.as_str()) {
                    leaves(v, vec!["metadata".into(), k.clone()], &mut out);
                }
            }
        } else {
            leaves(value, vec![key.clone()], &mut out);
        }
    }
    out
}

fn leaves(value: &Value, path: Path, out: &mut BTreeSet<Path>) {
    match value.as_object() {
        Some(map) if !map.is_empty() => {
            for (k, v) in map {
                let mut p = path.clone();
                p.push(k.clone());
                leaves(v, p, out);
            }
        }
        _ => {
            out.insert(path);
        }
    }
}

/// One path is the other or lies under it: owning one is owning (part of) the other.
fn overlaps(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

fn at<'v>(object: &'v Value, path: &[String]) -> Option<&'v Value> {
    path.iter().try_fold(object, |v, k| v.get(k))
}

/// The `fieldsV1` form of a set: `{"f:spec": {"f:replicas": {}}}`.
pub fn to_fields_v1(set: &BTreeSet<Path>) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut node = &mut root;
        for key in path {
            node = node
                .entry(format!("f:{key}"))
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .expect("built as maps");
        }
    }
    Value::Object(root)
}

/// The set a `fieldsV1` value describes (its leaves).
pub fn from_fields_v1(value: &Value) -> BTreeSet<Path> {
    fn walk(v: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
        let children: Vec<_> = v
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| k.strip_prefix("f:").map(|k| (k, v)))
            .collect();
        if children.is_empty() {
            if !path.is_empty() {
                out.insert(path.clone());
            }
            return;
        }
        for (k, child) in children {
            path.push(k.to_owned());
            walk(child, path, out);
            path.pop();
        }
    }
    let mut out = BTreeSet::new();
    walk(value, &mut Vec::new(), &mut out);
    out
}

/// The object's managedFields entries (unreadable ones are dropped).
pub fn managers(object: &Value) -> Vec<Managed> {
    let entries = object
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array);
    let text = |e: &Value, k: &str| e.get(k).and_then(Value::as_str).map(str::to_owned);
    entries
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some(Managed {
                manager: text(e, "manager")?,
                operation: text(e, "operation")?,
                api_version: text(e, "apiVersion").unwrap_or_default(),
                time: text(e, "time").unwrap_or_default(),
                subresource: text(e, "subresource"),
                fields: e.get("fieldsV1").map(from_fields_v1).unwrap_or_default(),
            })
        })
        .collect()
}

/// Writes `entries` as the object's managedFields (entries owning nothing are left out).
pub fn set_managers(object: &mut Value, entries: &[Managed]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&e.fields),
            });
            if let Some(s) = &e.subresource {
                v["subresource"] = json!(s);
            }
            v
        })
        .collect();
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        match list.is_empty() {
            true => meta.remove("managedFields"),
            false => meta.insert("managedFields".into(), Value::Array(list)),
        };
    }
}

/// Who applies, and how.
#[derive(Debug, Clone)]
pub struct Applier<'a> {
    pub manager: &'a str,
    pub force: bool,
    pub scope: Scope,
    pub subresource: Option<&'a str>,
    pub api_version: &'a str,
    pub now: &'a str,
}

/// `body` applied by `who` onto `live` (the stored object, managedFields included): the new
/// object, or the conflicts that refuse it.
pub fn apply(live: &Value, body: &Value, who: &Applier<'_>) -> Result<Value, Conflicts> {
    let applied = fields(body, who.scope);
    let mut entries = managers(live);
    let previous = entries
        .iter()
        .position(|e| e.is(who.manager, "Apply", who.subresource))
        .map(|i| entries.remove(i).fields)
        .unwrap_or_default();
    let mut conflicts = Vec::new();
    for entry in &entries {
        for owned in &entry.fields {
            for path in applied.iter().filter(|p| overlaps(p, owned)) {
                let shorter = if path.len() <= owned.len() {
                    path
                } else {
                    owned
                };
                if at(live, shorter) != at(body, shorter) {
                    conflicts.push((entry.manager.clone(), owned.clone()));
                }
            }
        }
    }
    if !conflicts.is_empty() && !who.force {
        conflicts.sort();
        conflicts.dedup();
        return Err(Conflicts { conflicts });
    }
    // Forced: the fields taken leave their previous owners.
    let taken: BTreeSet<&Path> = conflicts.iter().map(|(_, p)| p).collect();
    for entry in &mut entries {
        entry.fields.retain(|p| !taken.contains(p));
    }
    let mut out = live.clone();
    for dropped in previous.difference(&applied) {
        let kept = entries
            .iter()
            .any(|e| e.fields.iter().any(|p| overlaps(p, dropped)));
        if !kept {
            remove(&mut out, dropped);
        }
    }
    merge(&mut out, body, who.scope);
    entries.push(Managed {
        manager: who.manager.to_owned(),
        operation: "Apply".into(),
        api_version: who.api_version.to_owned(),
        time: who.now.to_owned(),
        subresource: who.subresource.map(str::to_owned),
        fields: applied,
    });
    set_managers(&mut out, &entries);
    Ok(out)
}

/// The managedFields of `new`, written by `manager` (an Update) over `old`: the paths it
/// changed or added become its own and leave every other manager; removed paths leave
/// everyone. `new`'s own managedFields are ignored (a client cannot rewrite ownership here).
pub fn record_update(old: Option<&Value>, new: &mut Value, who: &Applier<'_>) {
    let after = fields(new, who.scope);
    let before = old.map(|o| fields(o, who.scope)).unwrap_or_default();
    let changed: BTreeSet<Path> = after
        .iter()
        .filter(|p| old.and_then(|o| at(o, p)) != at(new, p))
        .cloned()
        .collect();
    let removed: BTreeSet<&Path> = before.difference(&after).collect();
    let mut entries = old.map(managers).unwrap_or_default();
    for entry in &mut entries {
        entry
            .fields
            .retain(|p| !changed.iter().any(|c| overlaps(c, p)) && !removed.contains(p));
    }
    if !changed.is_empty() {
        match entries
            .iter_mut()
            .find(|e| e.is(who.manager, "Update", who.subresource))
        {
            Some(mine) => {
                mine.fields.extend(changed);
                mine.time = who.now.to_owned();
            }
            None => entries.push(Managed {
                manager: who.manager.to_owned(),
                operation: "Update".into(),
                api_version: who.api_version.to_owned(),
                time: who.now.to_owned(),
                subresource: who.subresource.map(str::to_owned),
                fields: changed,
            }),
        }
    }
    set_managers(new, &entries);
}

/// Deep-merges `body` into `out` within `scope`: maps by key, anything else replaced.
fn merge(out: &mut Value, body: &Value, scope: Scope) {
    let Some(body) = body.as_object() else {
        return;
    };
    for (key, value) in body.iter().filter(|(k, _)| in_scope(scope, k)) {
        if key == "metadata" {
            if out.get("metadata").is_none() {
                out["metadata"] = json!({});
            }
            let meta = out.get_mut("metadata").expect("just set");
            for (k, v) in value.as_object().into_iter().flatten() {
                if !SERVER_METADATA.contains(&k.as_str()) {
                    merge_value(meta, k, v);
                }
            }
        } else {
            merge_value(out, key, value);
        }
    }
}

/// Whether a top-level field is written through `scope`.
fn in_scope(scope: Scope, key: &str) -> bool {
    match (scope, key) {
        (_, "apiVersion" | "kind") => false,
        (Scope::Status, k) => k == "status",
        (Scope::Main { status_subresource }, "status") => !status_subresource,
        (Scope::Main { .. }, _) => true,
    }
}

fn merge_value(into: &mut Value, key: &str, value: &Value) {
    let Some(map) = into.as_object_mut() else {
        return;
    };
    match (map.get_mut(key), value) {
        (Some(existing @ Value::Object(_)), Value::Object(fields)) => {
            for (k, v) in fields {
                merge_value(existing, k, v);
            }
        }
        _ => {
            map.insert(key.to_owned(), value.clone());
        }
    }
}

/// Removes the field at `path`, then any map that removing it left empty (but not the
/// top-level ones: an emptied `metadata.labels` stays a map).
fn remove(object: &mut Value, path: &[String]) {
    let mut path = path.to_vec();
    while let Some(last) = path.pop() {
        let Some(parent) = at_mut(object, &path).and_then(Value::as_object_mut) else {
            return;
        };
        parent.remove(&last);
        if !parent.is_empty() || path.len() <= 2 {
            return;
        }
    }
}

fn at_mut<'v>(object: &'v mut Value, path: &[String]) -> Option<&'v mut Value> {
    path.iter().try_fold(object, |v, k| v.get_mut(k))
}

#[cfg(test)]
mod tests;
