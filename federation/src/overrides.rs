//! OverridePolicy rules applied to a template's JSON, for one member cluster.
//!
//! ```text
//!  body ─clone─► image ─► command ─► args ─► env ─► labels ─► annotations ─► jsonPatch ─► body'
//!                (every pod spec container and init container)   (metadata)   (RFC 6902)
//!        any step fails ─► OverrideError (which part, which entry, why); body untouched
//! ```
//!
//! [`apply`] is one rule's [`Overriders`]; [`apply_all`] is every `(policy, rule index)` a
//! placement lists for a cluster, in that order (the more specific policy last, so it wins).
//!
//! Decisions made here, beyond Karmada's ImageOverrider (see [`crate::image`]):
//! - container overriders (image, command, args, env) act on the pod spec of the kinds that
//!   have one ([`crate::template::pod_spec_pointer`]), its `containers` and
//!   `initContainers`; on any other kind they are no-ops, so one policy may select a
//!   Deployment and its Service. A container named but absent is an error.
//! - `command`/`args`: `add` appends, `remove` drops every occurrence; `replace` is refused.
//! - `env`: `add` sets (replacing an entry of that name, `valueFrom` included), `remove` drops
//!   it (absent: nothing to do), `replace` sets the value of an existing entry (absent: error).
//! - `labels`/`annotations`: `add` sets (overwriting), `remove` deletes the keys (absent:
//!   nothing to do), `replace` sets existing keys only, and a key that is absent is an error
//!   (Karmada skips it silently; a replace that changes nothing is most likely a typo, and
//!   the object then is not placed half-overridden).

use meridian_core::model::ObjectKey;
use meridian_core::placement::{
    ArgsOverrider, EnvOverrider, ImageOverrider, JsonPatch, MapOverrider, OverrideOperator,
    OverridePolicy, Overriders, Placed,
};
use serde_json::{Map, Value};

use crate::image::{ImageError, ImageRef};
use crate::template::pod_spec_pointer;

/// The part of a rule's overriders, as `overrideRules[].overriders` spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Image,
    Command,
    Args,
    Env,
    Labels,
    Annotations,
    JsonPatch,
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Part::Image => "image",
            Part::Command => "command",
            Part::Args => "args",
            Part::Env => "env",
            Part::Labels => "labels",
            Part::Annotations => "annotations",
            Part::JsonPatch => "jsonPatch",
        })
    }
}

/// Why one overrider cannot apply.
#[derive(Debug, thiserror::Error)]
pub enum OverriderError {
    #[error("no container named {0:?}")]
    NoContainer(String),
    #[error("container {0:?} has no image")]
    NoImage(String),
    #[error("the image of container {container:?}")]
    Image {
        container: String,
        #[source]
        source: ImageError,
    },
    #[error("operator {0:?} is not supported here")]
    Operator(OverrideOperator),
    #[error("{0:?} needs a value")]
    NoValue(OverrideOperator),
    #[error("container {container:?} has no env {name:?} to replace")]
    NoEnv { container: String, name: String },
    #[error("no key {0:?} to replace")]
    NoKey(String),
    #[error("{0} is not a {1}")]
    WrongType(String, &'static str),
    #[error("not a valid JSON patch operation")]
    BadPatch(#[source] serde_json::Error),
    #[error("the patch does not apply")]
    Patch(#[source] json_patch::PatchError),
}

/// Why a rule, or a placement's list of rules, cannot apply.
#[derive(Debug, thiserror::Error)]
pub enum OverrideError {
    #[error("overriders.{part}[{index}] cannot apply")]
    Overrider {
        part: Part,
        index: usize,
        #[source]
        source: OverriderError,
    },
    #[error("override policy {policy} rule {rule}")]
    Rule {
        policy: ObjectKey,
        rule: usize,
        #[source]
        source: Box<OverrideError>,
    },
    #[error("override policy {0} is not known")]
    UnknownPolicy(ObjectKey),
    #[error("override policy {policy} has no rule {rule}")]
    UnknownRule { policy: ObjectKey, rule: usize },
}

/// Applies one rule's overriders to `body` in the fixed order; on error `body` is unchanged.
pub fn apply(body: &mut Value, rule: &Overriders) -> Result<(), OverrideError> {
    let mut next = body.clone();
    apply_in_place(&mut next, rule)?;
    *body = next;
    Ok(())
}

/// Applies every rule `placed.overrides` names, in order, to a copy of `body`.
pub fn apply_all(
    body: &Value,
    placed: &Placed,
    policies: &[OverridePolicy],
) -> Result<Value, OverrideError> {
    let mut next = body.clone();
    for (key, index) in &placed.overrides {
        let policy = policies
            .iter()
            .find(|p| &p.key == key)
            .ok_or_else(|| OverrideError::UnknownPolicy(key.clone()))?;
        let rule = policy
            .rules
            .get(*index)
            .ok_or_else(|| OverrideError::UnknownRule {
                policy: key.clone(),
                rule: *index,
            })?;
        apply_in_place(&mut next, &rule.overriders).map_err(|e| OverrideError::Rule {
            policy: key.clone(),
            rule: *index,
            source: Box::new(e),
        })?;
    }
    Ok(next)
}

/// One rule on `body`, which may be left half-changed on error (callers work on a copy).
fn apply_in_place(body: &mut Value, rule: &Overriders) -> Result<(), OverrideError> {
    each(Part::Image, &rule.image, |o| image(body, o))?;
    each(Part::Command, &rule.command, |o| args(body, "command", o))?;
    each(Part::Args, &rule.args, |o| args(body, "args", o))?;
    each(Part::Env, &rule.env, |o| env(body, o))?;
    each(Part::Labels, &rule.labels, |o| map(body, "labels", o))?;
    each(Part::Annotations, &rule.annotations, |o| {
        map(body, "annotations", o)
    })?;
    json_patch(body, &rule.json_patch)
}

fn each<T>(
    part: Part,
    overriders: &[T],
    mut f: impl FnMut(&T) -> Result<(), OverriderError>,
) -> Result<(), OverrideError> {
    for (index, o) in overriders.iter().enumerate() {
        f(o).map_err(|source| OverrideError::Overrider {
            part,
            index,
            source,
        })?;
    }
    Ok(())
}

/// The containers and init containers of the body's pod spec; None for a kind without one.
fn containers(body: &mut Value) -> Result<Option<Vec<&mut Map<String, Value>>>, OverriderError> {
    let api_version = body.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = body.get("kind").and_then(Value::as_str).unwrap_or("");
    let Some(pointer) = pod_spec_pointer(api_version, kind) else {
        return Ok(None);
    };
    let mut found = Vec::new();
    let Some(spec) = body.pointer_mut(pointer) else {
        return Ok(Some(found));
    };
    let Value::Object(spec) = spec else {
        return Err(OverriderError::WrongType(pointer.to_string(), "map"));
    };
    for (key, list) in spec.iter_mut() {
        if key != "containers" && key != "initContainers" {
            continue;
        }
        let Value::Array(list) = list else {
            return Err(OverriderError::WrongType(
                format!("{pointer}/{key}"),
                "list",
            ));
        };
        for c in list {
            match c {
                Value::Object(c) => found.push(c),
                _ => {
                    return Err(OverriderError::WrongType(
                        format!("{pointer}/{key}"),
                        "list of maps",
                    ));
                }
            }
        }
    }
    Ok(Some(found))
}

fn container_name(c: &Map<String, Value>) -> &str {
    c.get("name").and_then(Value::as_str).unwrap_or("")
}

/// The container of that name, None for a kind without a pod spec.
fn named<'a>(
    body: &'a mut Value,
    name: &str,
) -> Result<Option<&'a mut Map<String, Value>>, OverriderError> {
    match containers(body)? {
        None => Ok(None),
        Some(all) => all
            .into_iter()
            .find(|c| container_name(c) == name)
            .map(Some)
            .ok_or_else(|| OverriderError::NoContainer(name.to_string())),
    }
}

fn image(body: &mut Value, o: &ImageOverrider) -> Result<(), OverriderError> {
    let Some(all) = containers(body)? else {
        return Ok(());
    };
    if let Some(missing) = o
        .container_names
        .iter()
        .find(|n| !all.iter().any(|c| container_name(c) == n.as_str()))
    {
        return Err(OverriderError::NoContainer(missing.clone()));
    }
    let every = o.container_names.is_empty();
    for c in all {
        let name = container_name(c).to_string();
        if !every && !o.container_names.contains(&name) {
            continue;
        }
        let current = match c.get("image") {
            Some(Value::String(image)) => image,
            _ if every => continue,
            _ => return Err(OverriderError::NoImage(name)),
        };
        let fail = |source| OverriderError::Image {
            container: name.clone(),
            source,
        };
        let mut image = ImageRef::parse(current).map_err(fail)?;
        image
            .apply(o.component, o.operator, &o.value)
            .map_err(fail)?;
        c.insert("image".into(), Value::String(image.to_string()));
    }
    Ok(())
}

/// `command` or `args` of one container.
fn args(body: &mut Value, field: &str, o: &ArgsOverrider) -> Result<(), OverriderError> {
    let Some(c) = named(body, &o.container_name)? else {
        return Ok(());
    };
    let present = c.get(field).is_some_and(|v| !v.is_null());
    let current = match c.get(field) {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list.clone(),
        Some(_) => return Err(OverriderError::WrongType(field.to_string(), "list")),
    };
    let next: Vec<Value> = match o.operator {
        OverrideOperator::Add => current
            .into_iter()
            .chain(o.values.iter().cloned().map(Value::String))
            .collect(),
        OverrideOperator::Remove if !present => return Ok(()),
        OverrideOperator::Remove => current
            .into_iter()
            .filter(|v| !v.as_str().is_some_and(|s| o.values.iter().any(|r| r == s)))
            .collect(),
        OverrideOperator::Replace => return Err(OverriderError::Operator(o.operator)),
    };
    c.insert(field.to_string(), Value::Array(next));
    Ok(())
}

fn env(body: &mut Value, o: &EnvOverrider) -> Result<(), OverriderError> {
    let Some(c) = named(body, &o.container_name)? else {
        return Ok(());
    };
    let entry = |value: &str| serde_json::json!({"name": o.name, "value": value});
    if c.get("env").is_none_or(Value::is_null) {
        match o.operator {
            OverrideOperator::Add => {
                c.insert("env".into(), Value::Array(Vec::new()));
            }
            OverrideOperator::Remove => return Ok(()),
            OverrideOperator::Replace => return Err(no_env(o)),
        }
    }
    let Some(Value::Array(list)) = c.get_mut("env") else {
        return Err(OverriderError::WrongType("env".into(), "list"));
    };
    let position = list
        .iter()
        .position(|e| e.get("name").and_then(Value::as_str) == Some(o.name.as_str()));
    match (o.operator, position) {
        (OverrideOperator::Remove, _) => {
            list.retain(|e| e.get("name").and_then(Value::as_str) != Some(o.name.as_str()));
        }
        (OverrideOperator::Add, Some(i)) => list[i] = entry(value(o)?),
        (OverrideOperator::Add, None) => list.push(entry(value(o)?)),
        (OverrideOperator::Replace, Some(i)) => list[i] = entry(value(o)?),
        (OverrideOperator::Replace, None) => return Err(no_env(o)),
    }
    Ok(())
}

fn value(o: &EnvOverrider) -> Result<&str, OverriderError> {
    o.value
        .as_deref()
        .ok_or(OverriderError::NoValue(o.operator))
}

fn no_env(o: &EnvOverrider) -> OverriderError {
    OverriderError::NoEnv {
        container: o.container_name.clone(),
        name: o.name.clone(),
    }
}

/// `metadata.labels` or `metadata.annotations`.
fn map(body: &mut Value, field: &str, o: &MapOverrider) -> Result<(), OverriderError> {
    let Value::Object(object) = body else {
        return Err(OverriderError::WrongType("the object".into(), "map"));
    };
    let metadata = object
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(metadata) = metadata else {
        return Err(OverriderError::WrongType("metadata".into(), "map"));
    };
    let created = metadata.get(field).is_none_or(Value::is_null);
    if created {
        metadata.insert(field.to_string(), Value::Object(Map::new()));
    }
    let Some(Value::Object(target)) = metadata.get_mut(field) else {
        return Err(OverriderError::WrongType(
            format!("metadata.{field}"),
            "map",
        ));
    };
    match o.operator {
        OverrideOperator::Add => {
            for (k, v) in &o.values {
                target.insert(k.clone(), Value::String(v.clone()));
            }
        }
        OverrideOperator::Remove => {
            for k in o.values.keys() {
                target.remove(k);
            }
        }
        OverrideOperator::Replace => {
            if let Some(absent) = o.values.keys().find(|k| !target.contains_key(*k)) {
                return Err(OverriderError::NoKey(absent.clone()));
            }
            for (k, v) in &o.values {
                target.insert(k.clone(), Value::String(v.clone()));
            }
        }
    }
    if created && target.is_empty() {
        metadata.remove(field);
    }
    Ok(())
}

/// The rule's RFC 6902 operations, as one patch.
fn json_patch(body: &mut Value, ops: &[JsonPatch]) -> Result<(), OverrideError> {
    let fail = |index, source| OverrideError::Overrider {
        part: Part::JsonPatch,
        index,
        source,
    };
    let patch = ops
        .iter()
        .enumerate()
        .map(|(i, op)| operation(op).map_err(|e| fail(i, OverriderError::BadPatch(e))))
        .collect::<Result<Vec<_>, _>>()?;
    json_patch::patch(body, &patch).map_err(|e| fail(e.operation, OverriderError::Patch(e)))
}

fn operation(op: &JsonPatch) -> Result<json_patch::PatchOperation, serde_json::Error> {
    let mut o = Map::new();
    o.insert("op".into(), Value::String(op.op.clone()));
    o.insert("path".into(), Value::String(op.path.clone()));
    if let Some(from) = &op.from {
        o.insert("from".into(), Value::String(from.clone()));
    }
    if let Some(value) = &op.value {
        o.insert("value".into(), value.clone());
    }
    serde_json::from_value(Value::Object(o))
}

#[cfg(test)]
mod tests;
