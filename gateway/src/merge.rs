//! Lists and watches of every member, merged into one (the `/clusters/*/…` routes).
//!
//! - **Order**: members in name order, each member's items in its own order — the API
//!   server's key order, (namespace, name) — so the union is in (cluster, namespace, name)
//!   order and pages never reorder. A member's items are not sorted again: a member's list
//!   arrives in pages, and a sort within a page could not order across them.
//! - **Marks**: every item carries the annotation `meridian.io/cluster`; same-named objects
//!   of different members stay separate objects. Lists are marked as they are copied
//!   ([`page`]); a named object and watch events as values ([`mark`]).
//! - **resourceVersion**: a [`Composite`] of each member's, encoded stably (members sorted,
//!   one string for one state) and compactly, a few bytes a member ([`version`]: `mrv2.`;
//!   the `mrv1.` tokens of earlier gateways still read). A watch puts the composite on every
//!   event and bookmark, so resuming from any event's version neither loses nor repeats
//!   anything; it keeps it encoded and rewrites one member's part an event ([`version::Live`]).
//! - **continue**: a [`Continue`] names the member being paged and its own token, and the
//!   paged list it belongs to; what the members already done answered is held by the gateway
//!   under that list's id (`continues`), so a token stays the same size at any fleet size.

use std::collections::BTreeMap;
use std::ops::Bound;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub mod page;
pub mod version;

pub use version::{Live, Roster, Rosters, VersionError};

/// The annotation naming an aggregated item's member.
pub const CLUSTER_ANNOTATION: &str = "meridian.io/cluster";
/// What a composite or continue token starts with, so a member's own RV is never mistaken
/// for one. `mrv1.` is an earlier gateway's composite (base64 of JSON naming every member,
/// ~20 KB at 1,000 members): still read, as clients hold them across an upgrade, never issued.
const OLD_COMPOSITE_PREFIX: &str = "mrv1.";
const CONTINUE_PREFIX: &str = "mct2.";
/// The continue tokens of an earlier gateway, which carried every member's version: their
/// lists are gone (a client lists again).
const OLD_CONTINUE_PREFIX: &str = "mct1.";

/// Each member's resourceVersion.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Composite(pub BTreeMap<String, String>);

/// A continue token (or an `mrv1.` composite's JSON) that is not the gateway's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a resourceVersion or continue token this gateway issued")]
pub struct BadToken(pub String);

impl Composite {
    /// The `mrv2.` token of this composite, its members placed in `roster`.
    pub fn encode(&self, roster: &Roster) -> String {
        version::encode(self, roster)
    }

    /// A token this gateway (or an earlier one) issued; an `mrv2.` token is read against the
    /// roster it was made against, and is [`VersionError::Expired`] when that is not held.
    pub fn decode(token: &str, rosters: &Rosters) -> Result<Self, VersionError> {
        if token.starts_with(OLD_COMPOSITE_PREFIX) {
            return decode(token, OLD_COMPOSITE_PREFIX)
                .map(Self)
                .map_err(|_| VersionError::bad(token));
        }
        version::decode(token, rosters)
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
    pub fn requested(value: Option<&str>, rosters: &Rosters) -> Result<Option<Self>, VersionError> {
        value
            .filter(|v| v.starts_with(OLD_COMPOSITE_PREFIX) || v.starts_with(version::PREFIX))
            .map(|v| Self::decode(v, rosters))
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

/// Where a paged list goes on: a few hundred bytes however many members the fleet has.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Continue {
    /// The paged list's id: the gateway holds the versions of the members already listed
    /// under it.
    #[serde(rename = "l")]
    pub list: String,
    /// The member to list next.
    #[serde(rename = "m")]
    pub cluster: String,
    /// Its own continue token ("" to start it).
    #[serde(rename = "c", default)]
    pub member: String,
}

impl Continue {
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        format!("{CONTINUE_PREFIX}{}", URL_SAFE_NO_PAD.encode(json))
    }

    pub fn decode(token: &str) -> Result<Self, BadToken> {
        decode(token, CONTINUE_PREFIX)
    }

    /// Whether `token` is a continue token of an earlier gateway (its list cannot go on).
    pub fn is_old(token: &str) -> bool {
        token.starts_with(OLD_CONTINUE_PREFIX)
    }

    /// The members done when this token was issued, of what the list has recorded: every one
    /// before the member it names, and that one too once its first page was listed (its own
    /// token then continues that page's version).
    pub fn done(&self, recorded: &Composite) -> Composite {
        let mut done: BTreeMap<String, String> = recorded
            .0
            .range::<str, _>((Bound::Unbounded, Bound::Excluded(self.cluster.as_str())))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !self.member.is_empty()
            && let Some(rv) = recorded.0.get(&self.cluster)
        {
            done.insert(self.cluster.clone(), rv.clone());
        }
        Composite(done)
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
pub fn fleet_event(mut event: Value, cluster: &str, composite: &mut Live) -> Value {
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
        meta.insert("resourceVersion".into(), json!(composite.token()));
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
pub fn initial_events_end(kind: &Value, api_version: &Value, composite: &mut Live) -> Value {
    json!({
        "type": "BOOKMARK",
        "object": {
            "kind": kind, "apiVersion": api_version,
            "metadata": {"resourceVersion": composite.token(),
                         "annotations": {INITIAL_EVENTS_END: "true"}},
        },
    })
}

#[cfg(test)]
mod tests;
