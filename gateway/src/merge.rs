//! Lists and watches of every member, merged into one (the `/clusters/*/…` routes).
//!
//! - **Order**: members in name order, each member's items in its own order — which is the
//!   API server's key order, (namespace, name) — so the union is in (cluster, namespace,
//!   name) order and pages never reorder.
//! - **Marks**: every item carries the annotation `meridian.io/cluster`; same-named objects
//!   of different members stay separate objects.
//! - **resourceVersion**: a [`Composite`] of each member's, encoded stably (members sorted,
//!   one string for one state). A watch puts the composite on every event and bookmark, so
//!   resuming from any event's version neither loses nor repeats anything.
//! - **continue**: a [`Continue`] names the member being paged, its own token, and the
//!   composite of the members already done.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The annotation naming an aggregated item's member.
pub const CLUSTER_ANNOTATION: &str = "meridian.io/cluster";
/// What a composite or continue token starts with, so a member's own RV is never mistaken
/// for one.
const COMPOSITE_PREFIX: &str = "mrv1.";
const CONTINUE_PREFIX: &str = "mct1.";

/// Each member's resourceVersion.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Composite(pub BTreeMap<String, String>);

/// A resourceVersion or continue token that is not the gateway's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a resourceVersion or continue token this gateway issued")]
pub struct BadToken(pub String);

impl Composite {
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(&self.0).unwrap_or_default();
        format!("{COMPOSITE_PREFIX}{}", URL_SAFE_NO_PAD.encode(json))
    }

    pub fn decode(token: &str) -> Result<Self, BadToken> {
        decode(token, COMPOSITE_PREFIX).map(Self)
    }

    /// What a client's `resourceVersion` asks of each member: none, "0" (any) and "" pass
    /// through as they are; a composite gives each member its own (a member it does not
    /// name — one added since — is watched from now: the caller closes such a watch instead).
    pub fn for_member<'a>(
        requested: Option<&'a str>,
        composite: &'a Option<Composite>,
        cluster: &str,
    ) -> Option<&'a str> {
        match composite {
            Some(c) => c.0.get(cluster).map(String::as_str),
            None => requested,
        }
    }

    /// What a client's `resourceVersion` parameter says of the fleet: a composite this gateway
    /// issued, or None for anything else (none, "0", ""), which each member is asked as it is.
    pub fn requested(value: Option<&str>) -> Result<Option<Self>, BadToken> {
        value
            .filter(|v| v.starts_with(COMPOSITE_PREFIX))
            .map(Self::decode)
            .transpose()
    }

    pub fn set(&mut self, cluster: &str, rv: &str) {
        self.0.insert(cluster.to_string(), rv.to_string());
    }
}

fn decode<T: for<'de> Deserialize<'de>>(token: &str, prefix: &str) -> Result<T, BadToken> {
    let bad = || BadToken(token.chars().take(64).collect());
    let body = token.strip_prefix(prefix).ok_or_else(bad)?;
    let json = URL_SAFE_NO_PAD.decode(body).map_err(|_| bad())?;
    serde_json::from_slice(&json).map_err(|_| bad())
}

/// Where a paged list goes on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Continue {
    /// The member to list next.
    pub cluster: String,
    /// Its own continue token ("" to start it).
    #[serde(rename = "c", default)]
    pub member: String,
    /// The resourceVersions of the members already listed, and of this one's first page.
    #[serde(rename = "rv", default)]
    pub done: Composite,
}

impl Continue {
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        format!("{CONTINUE_PREFIX}{}", URL_SAFE_NO_PAD.encode(json))
    }

    pub fn decode(token: &str) -> Result<Self, BadToken> {
        decode(token, CONTINUE_PREFIX)
    }
}

/// Marks `object` as `cluster`'s: its annotation, or in a Table (the form kubectl asks
/// for) each row's object's.
pub fn mark(object: &mut Value, cluster: &str) {
    if object["kind"] == "Table" {
        if let Some(rows) = object["rows"].as_array_mut() {
            for row in rows {
                mark(&mut row["object"], cluster);
            }
        }
        return;
    }
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
        if !annotations.is_object() {
            *annotations = json!({});
        }
        annotations[CLUSTER_ANNOTATION] = json!(cluster);
    }
}

/// The (namespace, name) of an item (or a Table row's object), for ordering.
fn key(item: &Value) -> (String, String) {
    let meta = match &item["object"] {
        Value::Object(o) => &o["metadata"],
        _ => &item["metadata"],
    };
    let text = |k: &str| meta[k].as_str().unwrap_or_default().to_string();
    (text("namespace"), text("name"))
}

/// One member's list, as it answered.
#[derive(Debug, Clone)]
pub struct MemberList {
    pub cluster: String,
    pub list: Value,
}

/// Keeps the entries of a member's list (items, or a Table's rows by their objects) that
/// `keep` accepts.
pub fn retain(list: &mut Value, mut keep: impl FnMut(&Value) -> bool) {
    let table = list["kind"] == "Table";
    let field = if table { "rows" } else { "items" };
    if let Some(entries) = list[field].as_array_mut() {
        entries.retain(|e| keep(if table { &e["object"] } else { e }));
    }
}

/// The union of `lists` (one per member, any order) as one list: items (a Table's rows)
/// marked and in (cluster, namespace, name) order, `resourceVersion` the composite of the
/// members' and of `done` (members an earlier page listed), the kind, apiVersion (and a
/// Table's columns) of the first list.
pub fn merge_lists(mut lists: Vec<MemberList>, done: &Composite) -> (Value, Composite) {
    lists.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    let mut composite = done.clone();
    let mut entries = Vec::new();
    let mut head: Option<Value> = None;
    for MemberList { cluster, mut list } in lists {
        if let Some(rv) = list["metadata"]["resourceVersion"].as_str() {
            composite.set(&cluster, rv);
        }
        let field = if list["kind"] == "Table" {
            "rows"
        } else {
            "items"
        };
        let mut member_entries = match list[field].take() {
            Value::Array(entries) => entries,
            _ => Vec::new(),
        };
        // Members answer in key order already: sort only what is not (cheaply checked).
        if !member_entries.is_sorted_by_key(key) {
            member_entries.sort_by_cached_key(key);
        }
        for mut entry in member_entries {
            match field {
                "rows" => mark(&mut entry["object"], &cluster),
                _ => mark(&mut entry, &cluster),
            }
            entries.push(entry);
        }
        head.get_or_insert(list);
    }
    let mut list = head.unwrap_or_else(|| json!({"kind": "List", "apiVersion": "v1"}));
    let field = if list["kind"] == "Table" {
        "rows"
    } else {
        "items"
    };
    list["metadata"] = json!({"resourceVersion": composite.encode()});
    list[field] = Value::Array(entries);
    (list, composite)
}

/// A Kubernetes `Status` failure, as the API answers errors.
pub fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

/// A watch event of `cluster` made the fleet's: its object marked and its resourceVersion (a
/// bookmark's too) recorded in `composite` and replaced by the composite. An ERROR event
/// passes as it is.
pub fn fleet_event(mut event: Value, cluster: &str, composite: &mut Composite) -> Value {
    if event["type"] == "ERROR" {
        return event;
    }
    let bookmark = event["type"] == "BOOKMARK";
    let object = &mut event["object"];
    if let Some(rv) = object["metadata"]["resourceVersion"]
        .as_str()
        .map(str::to_string)
    {
        composite.set(cluster, &rv);
    }
    if !bookmark {
        mark(object, cluster);
    }
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), json!(composite.encode()));
    }
    event
}

/// The annotation an API server puts on the bookmark that ends `sendInitialEvents`.
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Whether `event` is a member's bookmark ending its initial events (the gateway sends one
/// of its own once every member sent theirs).
pub fn ends_initial_events(event: &Value) -> bool {
    event["type"] == "BOOKMARK"
        && event["object"]["metadata"]["annotations"][INITIAL_EVENTS_END] == "true"
}

/// The gateway's own bookmark ending the initial events of every member.
pub fn initial_events_end(kind: &Value, api_version: &Value, composite: &Composite) -> Value {
    json!({
        "type": "BOOKMARK",
        "object": {
            "kind": kind, "apiVersion": api_version,
            "metadata": {"resourceVersion": composite.encode(),
                         "annotations": {INITIAL_EVENTS_END: "true"}},
        },
    })
}

#[cfg(test)]
mod tests;
