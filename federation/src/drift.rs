//! Drift: whether a member's live object still holds what meridian applied to it.
//!
//! ```text
//!  desired (the server-side-apply body meridian sent) ─┐
//!  live    (the object as the member returns it)      ─┴─drifted─► ["/spec/replicas", …]
//!                                                                  (empty: no drift)
//! ```
//!
//! `desired` is *contained* in `live` when everything meridian set is still there; what the
//! API server defaulted and what other managers added is not drift. The rules:
//! - objects: every desired key is in live with a contained value; extra live keys are fine.
//! - lists whose elements all carry a string `name` (containers, env, volumes, named ports)
//!   are matched by name, order ignored; lists of unnamed ports by `containerPort` (or
//!   `port`) and `protocol` (absent: `TCP`, the API's default). A desired element missing in
//!   live is drift; extra live elements are another manager's (an injected sidecar). Any other
//!   list is atomic: same length, element by element.
//! - an empty desired list claims no element, so it is contained in any live list (it cannot
//!   be told whether the list is atomic or keyed).
//! - scalars are equal, numbers as f64 (`1 == 1.0`); in `spec` (not in `metadata`, a
//!   ConfigMap's or Secret's `data`, `stringData`, `binaryData`, nor an `env` list, where
//!   strings are data) two quantities are equal when they are the same amount (`"1000m"` and
//!   `"1"`, `"1024Mi"` and `"1Gi"`, `1` and `"1"`), since the API server rewrites them.
//! - a desired zero value (`null`, `false`, `0`, `""`, `{}`, `[]`) is contained in an absent
//!   field, since the API drops `omitempty` fields; not in `metadata` or `data`, whose maps keep
//!   empty values.
//! - ignored in desired: `status`, and `metadata.resourceVersion`, `uid`, `generation`,
//!   `creationTimestamp`, `managedFields` (the member's API server sets its own).
//!
//! `admitted(desired, stored)` is `desired` as the member kept it: the apply's answer, where a
//! mutating webhook rewrote or dropped what meridian set. Drift measured against it (instead
//! of the body sent) is what someone changed *after* the apply, so an object a webhook rewrites
//! is not re-applied on every pass.
//!
//! Each path is an RFC 6901 pointer into `desired` (list elements by their index there, so a
//! path always resolves in `desired`, also for an element live lacks): the value meridian
//! applied that the member no longer holds.

use serde_json::{Map, Value};

use crate::quantity::Quantity;

/// Metadata the member's API server sets (the apply body should not carry them; when it
/// does, the member's own values are not drift).
const SERVER_METADATA: &[&str] = &[
    "resourceVersion",
    "uid",
    "generation",
    "creationTimestamp",
    "managedFields",
];

/// The pointers at which `desired` is not contained in `live` (see the module docs), sorted;
/// empty when there is no drift.
pub fn drifted(desired: &Value, live: &Value) -> Vec<String> {
    walk(&mut desired.clone(), live)
}

/// `desired` as the member admitted it: where the object the member stored in answer to the
/// apply (`stored`) does not contain `desired` (a mutating webhook pinned an image to a digest,
/// or dropped a field), `desired` takes the stored value (null, "expect nothing", for a dropped
/// one; a keyed element the member dropped is left out). Drift is then measured against what
/// the member keeps, so such an object is not re-applied on every pass: see [`drifted`].
pub fn admitted(desired: &Value, stored: &Value) -> Value {
    let mut admitted = desired.clone();
    walk(&mut admitted, stored);
    admitted
}

/// Compares `desired` with `live`, and rewrites `desired` to what `live` holds wherever it
/// drifted; returns the drifted pointers, sorted.
fn walk(desired: &mut Value, live: &Value) -> Vec<String> {
    let mut walk = Walk::default();
    match desired {
        Value::Object(fields) => {
            for (key, d) in fields.iter_mut() {
                let rules = match key.as_str() {
                    "status" => continue,
                    "metadata" | "data" | "stringData" | "binaryData" => Rules::VERBATIM,
                    _ => Rules::API,
                };
                walk.enter(key, |w| match (key.as_str(), d) {
                    ("metadata", Value::Object(metadata)) => w.metadata(metadata, live.get(key)),
                    (_, d) => w.value(d, live.get(key), rules),
                });
            }
        }
        _ => walk.value(desired, Some(live), Rules::API),
    }
    // Sorted, so the result does not depend on serde_json's map order (`preserve_order`).
    walk.drift.sort();
    walk.drift
}

/// How leniently scalars compare under a field.
#[derive(Clone, Copy)]
struct Rules {
    /// Quantity strings compare by amount: the API server rewrites them.
    quantities: bool,
    /// A zero value is contained in an absent field: the API server drops `omitempty` ones.
    omitted_zeros: bool,
}

impl Rules {
    const API: Rules = Rules {
        quantities: true,
        omitted_zeros: true,
    };
    /// Metadata and data: strings are the user's, and empty map values are kept.
    const VERBATIM: Rules = Rules {
        quantities: false,
        omitted_zeros: false,
    };

    /// In an env list values are strings the process reads (`value: ""` is still `omitempty`).
    fn env(self) -> Rules {
        Rules {
            quantities: false,
            ..self
        }
    }
}

/// The pointer being compared and the drift found so far.
#[derive(Default)]
struct Walk {
    at: String,
    drift: Vec<String>,
}

impl Walk {
    /// Runs `f` one level down, at `token`.
    fn enter(&mut self, token: &str, f: impl FnOnce(&mut Walk)) {
        let len = self.at.len();
        self.at.push('/');
        self.at
            .push_str(&token.replace('~', "~0").replace('/', "~1"));
        f(self);
        self.at.truncate(len);
    }

    fn drift_here(&mut self) {
        self.drift.push(self.at.clone());
    }

    fn metadata(&mut self, desired: &mut Map<String, Value>, live: Option<&Value>) {
        for (key, d) in desired.iter_mut() {
            if !SERVER_METADATA.contains(&key.as_str()) {
                self.enter(key, |w| {
                    w.value(d, live.and_then(|l| l.get(key)), Rules::VERBATIM)
                });
            }
        }
    }

    /// Compares one value; where it drifted, `desired` becomes what `live` holds.
    fn value(&mut self, desired: &mut Value, live: Option<&Value>, rules: Rules) {
        match (desired, live) {
            (d, None | Some(Value::Null)) => {
                if !(d.is_null() || rules.omitted_zeros && is_zero(d)) {
                    self.drift_here();
                    *d = Value::Null;
                }
            }
            (Value::Object(d), Some(Value::Object(l))) => {
                for (key, dv) in d.iter_mut() {
                    let rules = if key == "env" && dv.is_array() {
                        rules.env()
                    } else {
                        rules
                    };
                    self.enter(key, |w| w.value(dv, l.get(key), rules));
                }
            }
            (Value::Array(d), Some(Value::Array(l))) => self.list(d, l, rules),
            (d, Some(l)) => {
                if !scalar_eq(d, l, rules) {
                    self.drift_here();
                    *d = l.clone();
                }
            }
        }
    }

    fn list(&mut self, desired: &mut Vec<Value>, live: &[Value], rules: Rules) {
        let Some(key) = ListKey::of(desired) else {
            if !desired.is_empty() && desired.len() != live.len() {
                self.drift_here();
                *desired = live.to_vec();
                return;
            }
            for (i, (d, l)) in desired.iter_mut().zip(live).enumerate() {
                self.enter(&i.to_string(), |w| w.value(d, Some(l), rules));
            }
            return;
        };
        // The n-th desired element with a key matches the n-th live one: duplicates are
        // invalid in Kubernetes, but a value is then still contained in itself.
        let matches: Vec<Option<&Value>> = (0..desired.len())
            .map(|i| {
                let d = &desired[i];
                let nth = desired[..i].iter().filter(|e| key.same(e, d)).count();
                live.iter().filter(|e| key.same(e, d)).nth(nth)
            })
            .collect();
        let mut kept = vec![true; desired.len()];
        for (i, (d, l)) in desired.iter_mut().zip(matches).enumerate() {
            self.enter(&i.to_string(), |w| match l {
                Some(l) => w.value(d, Some(l), rules),
                None => {
                    w.drift_here();
                    kept[i] = false;
                }
            });
        }
        let mut kept = kept.into_iter();
        desired.retain(|_| kept.next().unwrap_or(true));
    }
}

/// How the elements of a keyed list are told apart.
#[derive(Clone, Copy)]
enum ListKey {
    Name,
    /// A port number field (`containerPort`, `port`), with `protocol`.
    Port(&'static str),
}

impl ListKey {
    /// The key every element of `items` carries, if one does.
    fn of(items: &[Value]) -> Option<ListKey> {
        let all = |f: fn(&Value) -> bool| !items.is_empty() && items.iter().all(f);
        if all(|e| e.get("name").is_some_and(Value::is_string)) {
            Some(ListKey::Name)
        } else if all(|e| e.get("containerPort").is_some_and(Value::is_number)) {
            Some(ListKey::Port("containerPort"))
        } else if all(|e| e.get("port").is_some_and(Value::is_number)) {
            Some(ListKey::Port("port"))
        } else {
            None
        }
    }

    fn same(self, a: &Value, b: &Value) -> bool {
        match self {
            ListKey::Name => a.get("name").is_some_and(|n| Some(n) == b.get("name")),
            ListKey::Port(field) => {
                let number = |e: &Value| e.get(field).and_then(Value::as_f64);
                number(a).is_some() && number(a) == number(b) && protocol(a) == protocol(b)
            }
        }
    }
}

/// A port's protocol, `TCP` when absent as the API defaults it.
fn protocol(port: &Value) -> &str {
    port.get("protocol")
        .and_then(Value::as_str)
        .unwrap_or("TCP")
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.is_empty(),
    }
}

fn scalar_eq(desired: &Value, live: &Value, rules: Rules) -> bool {
    match (desired, live) {
        (Value::Number(d), Value::Number(l)) => d.as_f64() == l.as_f64(),
        (Value::String(d), Value::String(l)) => d == l || rules.quantities && same_amount(d, l),
        (Value::Number(n), Value::String(s)) | (Value::String(s), Value::Number(n)) => {
            rules.quantities && same_amount(&n.to_string(), s)
        }
        (d, l) => d == l,
    }
}

/// Both are quantities, of the same amount.
fn same_amount(a: &str, b: &str) -> bool {
    match (Quantity::parse(a), Quantity::parse(b)) {
        (Ok(a), Ok(b)) => a.same_amount(&b),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
