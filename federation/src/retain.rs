//! Fields that belong to the member: before meridian applies a template to a member, the
//! retained fields of the apply body take the member's live values, so the apply neither
//! overwrites nor claims them (a member's HPA owns `spec.replicas`).
//!
//! ```text
//!  desired (the apply body) ─┐
//!  live (the member's object, None before the first apply) ─┤
//!  paths (RFC 6901 pointers) ─┴─retain─► desired, per path:
//!      live has a value there ─► desired takes it
//!      live has none (or null) ─► desired drops it (meridian does not claim it)
//!      live is None            ─► desired as it was (the first apply sets the field)
//! ```
//!
//! All or nothing: every path is checked before anything changes, and a path that cannot be
//! followed in `desired` leaves `desired` as it was.

use serde_json::{Map, Value};

/// The field a member's HorizontalPodAutoscaler owns in the object it scales.
pub const HPA_RETAINED: &str = "/spec/replicas";

/// Why a retained path cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RetainError {
    #[error("retained path {path:?} is not a JSON pointer: {reason}")]
    Pointer { path: String, reason: &'static str },
    #[error("retained path {path:?} cannot be set in the object: {reason}")]
    Unreachable { path: String, reason: &'static str },
}

/// Copies each of `paths` from `live` into `desired`, or removes it from `desired` where
/// `live` has none; nothing when `live` is None (see the module docs).
pub fn retain(
    desired: &mut Value,
    live: Option<&Value>,
    paths: &[String],
) -> Result<(), RetainError> {
    let parsed = paths
        .iter()
        .map(|path| tokens(path).map(|t| (path, t)))
        .collect::<Result<Vec<_>, _>>()?;
    let Some(live) = live else {
        return Ok(());
    };
    let mut out = desired.clone();
    for (path, tokens) in parsed {
        match live.pointer(path).filter(|v| !v.is_null()) {
            Some(_) => {
                copy(&mut out, live, &tokens).map_err(|reason| RetainError::Unreachable {
                    path: path.clone(),
                    reason,
                })?
            }
            None => remove(&mut out, &tokens),
        }
    }
    *desired = out;
    Ok(())
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
