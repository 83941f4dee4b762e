//! Fields that belong to the member: before meridian applies a template to a member, the
//! retained fields leave the apply body, so the apply neither overwrites nor claims them (a
//! member's HPA owns `spec.replicas`).
//!
//! ```text
//!  desired (the apply body) ─┐
//!  live (the member's object, None before the first apply) ─┤
//!  paths (RFC 6901 pointers) ─┴─retain─► desired, per path, and a handover apply:
//!      live None             ─► desired as it was (the first apply sets the field)
//!      live has none (null)  ─► desired drops it (meridian does not claim it)
//!      live has a value      ─► desired drops it; if meridian still owns it (live's
//!                               managedFields), the handover takes it at its live value
//!      … through a list      ─► desired takes live's value (a list element's identity is
//!                               not known here, so it cannot be handed over)
//! ```
//!
//! Why drop instead of sending the live value: a watch that lags the member's own writer (an
//! HPA that just scaled) would make meridian send the old value back. Why the handover: when
//! the last manager of a field stops sending it, the API server deletes it (a Deployment's
//! replicas fall back to 1). The handover apply, made under [`HANDOVER_MANAGER`] without force
//! before the body, keeps the field owned at its live value; the member's writer takes it over
//! on its next write (an update moves ownership), and a handover that meets a field someone
//! else changed since fails with a conflict and changes nothing, which is as good.
//!
//! All or nothing: every path is checked before anything changes, and a path that cannot be
//! followed in `desired` leaves `desired` as it was.

use serde_json::{Map, Value};

/// The field a member's HorizontalPodAutoscaler owns in the object it scales.
pub const HPA_RETAINED: &str = "/spec/replicas";

/// The field manager that holds retained fields meridian let go of, until the member's own
/// writer takes them (see the module docs).
pub const HANDOVER_MANAGER: &str = "meridian-handover";

/// Why a retained path cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RetainError {
    #[error("retained path {path:?} is not a JSON pointer: {reason}")]
    Pointer { path: String, reason: &'static str },
    #[error("retained path {path:?} cannot be set in the object: {reason}")]
    Unreachable { path: String, reason: &'static str },
}

/// Takes each of `paths` out of `desired` (or, through a list, sets it to live's value) where
/// `live` is the member's object; nothing when `live` is None. Returns the handover apply for
/// the fields `manager` still owns in `live`, if any (see the module docs).
pub fn retain(
    desired: &mut Value,
    live: Option<&Value>,
    paths: &[String],
    manager: &str,
) -> Result<Option<Value>, RetainError> {
    let parsed = paths
        .iter()
        .map(|path| tokens(path).map(|t| (path, t)))
        .collect::<Result<Vec<_>, _>>()?;
    let Some(live) = live else {
        return Ok(None);
    };
    let mut out = desired.clone();
    let mut handover = identity(desired);
    let mut handed_over = false;
    for (path, tokens) in parsed {
        let unreachable = |reason| RetainError::Unreachable {
            path: path.clone(),
            reason,
        };
        match live.pointer(path).filter(|v| !v.is_null()) {
            Some(_) if through_list(live, &tokens) => {
                copy(&mut out, live, &tokens).map_err(unreachable)?
            }
            Some(_) => {
                remove(&mut out, &tokens);
                if owns(live, manager, &tokens) {
                    copy(&mut handover, live, &tokens).map_err(unreachable)?;
                    handed_over = true;
                }
            }
            None => remove(&mut out, &tokens),
        }
    }
    *desired = out;
    Ok(handed_over.then_some(handover))
}

/// What an apply body of `object` needs to name it: apiVersion, kind, name and namespace.
fn identity(object: &Value) -> Value {
    let mut metadata = Map::new();
    for key in ["name", "namespace"] {
        if let Some(v) = object.pointer(&format!("/metadata/{key}")) {
            metadata.insert(key.into(), v.clone());
        }
    }
    let mut out = Map::new();
    for key in ["apiVersion", "kind"] {
        if let Some(v) = object.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    out.insert("metadata".into(), Value::Object(metadata));
    Value::Object(out)
}

/// Whether following `tokens` in `live` goes through a list.
fn through_list(live: &Value, tokens: &[String]) -> bool {
    let mut at = live;
    for token in tokens {
        match at {
            Value::Array(_) => return true,
            Value::Object(m) => match m.get(token) {
                Some(next) => at = next,
                None => return false,
            },
            _ => return false,
        }
    }
    false
}

/// Whether `manager`'s apply owns the field at `tokens` (maps only) in `live`, by its
/// managedFields (FieldsV1: `f:<key>` per level).
fn owns(live: &Value, manager: &str, tokens: &[String]) -> bool {
    let Some(entries) = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return false;
    };
    let text = |e: &Value, key| e.get(key).and_then(Value::as_str).map(str::to_string);
    entries
        .iter()
        .filter(|e| {
            text(e, "manager").as_deref() == Some(manager)
                && text(e, "operation").as_deref() == Some("Apply")
                && text(e, "subresource").is_none_or(|s| s.is_empty())
        })
        .any(|e| {
            let mut at = e.get("fieldsV1");
            for token in tokens {
                at = at.and_then(|v| v.get(format!("f:{token}")));
            }
            at.is_some()
        })
}

/// The unescaped reference tokens of a pointer; the whole object (`""`) is not a field.
fn tokens(path: &str) -> Result<Vec<String>, RetainError> {
    let invalid = |reason| RetainError::Pointer {
        path: path.to_string(),
        reason,
    };
    if path.is_empty() {
        return Err(invalid("the whole object cannot be retained"));
    }
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| invalid("it does not start with /"))?;
    rest.split('/')
        .map(|token| unescape(token).ok_or_else(|| invalid("~ not followed by 0 or 1")))
        .collect()
}

fn unescape(token: &str) -> Option<String> {
    let mut out = String::with_capacity(token.len());
    let mut chars = token.chars();
    while let Some(c) = chars.next() {
        out.push(match c {
            '~' => match chars.next()? {
                '0' => '~',
                '1' => '/',
                _ => return None,
            },
            c => c,
        });
    }
    Some(out)
}

/// Sets `desired` at `tokens` to live's value there, creating the maps on the way that
/// `desired` lacks; a list `desired` lacks cannot be made up, nor an element past its end.
fn copy(desired: &mut Value, live: &Value, tokens: &[String]) -> Result<(), &'static str> {
    let (mut d, mut l) = (desired, live);
    for token in tokens {
        if d.is_null() && l.is_object() {
            *d = Value::Object(Map::new());
        }
        (d, l) = match (d, l) {
            (Value::Object(dm), Value::Object(lm)) => {
                let l = lm.get(token).ok_or("live has no value there")?;
                (dm.entry(token.as_str()).or_insert(Value::Null), l)
            }
            (Value::Array(da), Value::Array(la)) => {
                let i = index(token).ok_or("not a list index")?;
                let l = la.get(i).ok_or("live has no value there")?;
                (da.get_mut(i).ok_or("the list is shorter in the object")?, l)
            }
            (Value::Null, Value::Array(_)) => return Err("the object has no list there"),
            _ => return Err("the object and the live one differ in shape on the way"),
        };
    }
    *d = l.clone();
    Ok(())
}

/// Removes the value at `tokens` from `desired`, if it has one.
fn remove(desired: &mut Value, tokens: &[String]) {
    let Some((last, parents)) = tokens.split_last() else {
        return;
    };
    let mut at = desired;
    for token in parents {
        let next = match at {
            Value::Object(m) => m.get_mut(token),
            Value::Array(a) => index(token).and_then(|i| a.get_mut(i)),
            _ => None,
        };
        let Some(next) = next else {
            return;
        };
        at = next;
    }
    match at {
        Value::Object(m) => {
            m.remove(last);
        }
        Value::Array(a) => {
            if let Some(i) = index(last).filter(|i| *i < a.len()) {
                a.remove(i);
            }
        }
        _ => {}
    }
}

/// A list index as RFC 6901 spells it: digits, no leading zero.
fn index(token: &str) -> Option<usize> {
    let digits = !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit());
    let leading_zero = token.len() > 1 && token.starts_with('0');
    (digits && !leading_zero)
        .then(|| token.parse().ok())
        .flatten()
}

/// `(apiVersion, kind, name)` of the object a HorizontalPodAutoscaler (`autoscaling/v1` or
/// `v2`) scales; None when `hpa` is not one or its `spec.scaleTargetRef` lacks a kind or
/// name. The apiVersion is `""` when the reference leaves it out (the API allows that).
pub fn hpa_targets(hpa: &Value) -> Option<(String, String, String)> {
    let text = |pointer| hpa.pointer(pointer).and_then(Value::as_str);
    let is_hpa = text("/kind") == Some("HorizontalPodAutoscaler")
        && text("/apiVersion").is_some_and(|v| v.starts_with("autoscaling/"));
    if !is_hpa {
        return None;
    }
    let target = hpa.pointer("/spec/scaleTargetRef")?;
    let field = |name| target.get(name).and_then(Value::as_str);
    let kind = field("kind").filter(|k| !k.is_empty())?;
    let name = field("name").filter(|n| !n.is_empty())?;
    let api_version = match target.get("apiVersion") {
        None | Some(Value::Null) => "",
        Some(v) => v.as_str()?,
    };
    Some((api_version.into(), kind.into(), name.into()))
}

#[cfg(test)]
mod tests;
