//! A hub object, as JSON, summarised into a [`Template`]: its key, labels and generation, the
//! replica count placement divides, one replica's pod requests, and the ConfigMaps, Secrets,
//! ServiceAccounts and PVCs its pod template names (the dependencies that follow it).
//!
//! ```text
//!  { apiVersion, kind, metadata{namespace,name,labels,generation}, spec… }
//!     ├─ replica_pointer(apiVersion, kind)   /spec/replicas | /spec/parallelism | none
//!     ├─ pod_spec_pointer(apiVersion, kind)  /spec/template/spec | /spec/jobTemplate/… | /spec
//!     │     ├─ requests      max(Σ containers + sidecars, each init container) + overhead
//!     │     └─ dependencies  volumes, env, envFrom, serviceAccountName, imagePullSecrets
//!     └─ body: the object itself, shared (Arc)
//! ```
//!
//! Which kinds are templates at all (namespaced, not meridian.io) is the caller's choice; a
//! template here only has to name its namespace.

use std::collections::BTreeMap;
use std::sync::Arc;

use meridian_core::placement::{Resources, Template, TemplateKey};
use serde_json::{Map, Value};

use crate::quantity::{self, QuantityError};

/// Why a hub object cannot be a template.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("missing {0}")]
    Missing(&'static str),
    #[error("{field} is not a {expected}")]
    WrongType {
        field: String,
        expected: &'static str,
    },
    #[error("a template needs a namespace (metadata.namespace)")]
    NoNamespace,
    #[error("{field} must be a non-negative integer (at most {max}), not {value}", max = u32::MAX)]
    Replicas { field: &'static str, value: Value },
    #[error("{field} is not a valid quantity")]
    Quantity {
        field: String,
        #[source]
        source: QuantityError,
    },
}

/// The JSON pointer of the field carrying a kind's replica count, when it carries one:
/// Deployment, StatefulSet and ReplicaSet (`apps`) `spec.replicas`, Job (`batch`)
/// `spec.parallelism`. Every other kind is placed whole.
pub fn replica_pointer(api_version: &str, kind: &str) -> Option<&'static str> {
    match (group(api_version), kind) {
        ("apps", "Deployment" | "StatefulSet" | "ReplicaSet") => Some("/spec/replicas"),
        ("batch", "Job") => Some("/spec/parallelism"),
        _ => None,
    }
}

/// The JSON pointer of a kind's pod spec, when it has one (the place overrides change
/// containers and dependencies are read from).
pub fn pod_spec_pointer(api_version: &str, kind: &str) -> Option<&'static str> {
    match (group(api_version), kind) {
        ("apps", "Deployment" | "StatefulSet" | "ReplicaSet" | "DaemonSet") | ("batch", "Job") => {
            Some("/spec/template/spec")
        }
        ("batch", "CronJob") => Some("/spec/jobTemplate/spec/template/spec"),
        ("", "Pod") => Some("/spec"),
        _ => None,
    }
}

/// The API group of an apiVersion (`""` for `v1`).
fn group(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

/// Summarises a hub object into a template (see the module docs).
pub fn summarize(body: Value) -> Result<Template, TemplateError> {
    summarize_shared(Arc::new(body))
}

/// [`summarize`] of a body the caller keeps too: the template shares it (a hub read that finds
/// a template unchanged hands the same body on, and comparing two templates compares a
/// pointer, not the object).
pub fn summarize_shared(body: Arc<Value>) -> Result<Template, TemplateError> {
    let key = key(&body)?;
    let labels = labels(&body)?;
    let generation = generation(&body)?;
    let replicas = replicas(&key, &body)?;
    let (requests, dependencies) = match pod_spec(&key, &body)? {
        Some((at, spec)) => (
            pod_requests(at, spec)?,
            pod_dependencies(&key.namespace, spec),
        ),
        None => (Resources::default(), Vec::new()),
    };
    Ok(Template {
        key,
        labels: Arc::new(labels),
        generation,
        replicas,
        requests,
        dependencies,
        body,
    })
}

fn key(body: &Value) -> Result<TemplateKey, TemplateError> {
    let api_version = required_str(body, "/apiVersion", "apiVersion")?;
    let kind = required_str(body, "/kind", "kind")?;
    let name = required_str(body, "/metadata/name", "metadata.name")?;
    let namespace = match body.pointer("/metadata/namespace") {
        None | Some(Value::Null) => return Err(TemplateError::NoNamespace),
        Some(Value::String(ns)) if ns.is_empty() => return Err(TemplateError::NoNamespace),
        Some(Value::String(ns)) => ns,
        Some(_) => return Err(wrong_type("metadata.namespace", "string")),
    };
    Ok(TemplateKey::new(api_version, kind, namespace, name))
}

fn required_str<'a>(
    body: &'a Value,
    pointer: &str,
    field: &'static str,
) -> Result<&'a str, TemplateError> {
    match body.pointer(pointer) {
        None | Some(Value::Null) => Err(TemplateError::Missing(field)),
        Some(Value::String(s)) if s.is_empty() => Err(TemplateError::Missing(field)),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(wrong_type(field, "string")),
    }
}

fn wrong_type(field: impl Into<String>, expected: &'static str) -> TemplateError {
    TemplateError::WrongType {
        field: field.into(),
        expected,
    }
}

fn labels(body: &Value) -> Result<BTreeMap<String, String>, TemplateError> {
    let Some(labels) = object_at(body, "/metadata/labels", "metadata.labels")? else {
        return Ok(BTreeMap::new());
    };
    labels
        .iter()
        .map(|(k, v)| match v {
            Value::String(v) => Ok((k.clone(), v.clone())),
            _ => Err(wrong_type(format!("metadata.labels.{k}"), "string")),
        })
        .collect()
}

fn generation(body: &Value) -> Result<i64, TemplateError> {
    match body.pointer("/metadata/generation") {
        None | Some(Value::Null) => Ok(0),
        Some(g) => g
            .as_i64()
            .ok_or_else(|| wrong_type("metadata.generation", "integer")),
    }
}

/// The replica count, for a kind that carries one; absent (or null) is 1, as Kubernetes
/// defaults both `spec.replicas` and `spec.parallelism`.
fn replicas(key: &TemplateKey, body: &Value) -> Result<Option<u32>, TemplateError> {
    let Some(pointer) = replica_pointer(&key.api_version, &key.kind) else {
        return Ok(None);
    };
    let field = match pointer {
        "/spec/replicas" => "spec.replicas",
        _ => "spec.parallelism",
    };
    match body.pointer(pointer) {
        None | Some(Value::Null) => Ok(Some(1)),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| TemplateError::Replicas {
                field,
                value: v.clone(),
            }),
    }
}

/// A pod spec's dotted path (for errors) and the spec.
type PodSpec<'a> = (String, &'a Map<String, Value>);

/// The pod spec and its dotted path, for a kind that has one and an object that fills it in.
fn pod_spec<'a>(key: &TemplateKey, body: &'a Value) -> Result<Option<PodSpec<'a>>, TemplateError> {
    let Some(pointer) = pod_spec_pointer(&key.api_version, &key.kind) else {
        return Ok(None);
    };
    let dotted = pointer[1..].replace('/', ".");
    Ok(object_at(body, pointer, &dotted)?.map(|spec| (dotted, spec)))
}

/// The object at `pointer` (None when absent or null); an error naming `field` when it is
/// something else.
fn object_at<'a>(
    body: &'a Value,
    pointer: &str,
    field: &str,
) -> Result<Option<&'a Map<String, Value>>, TemplateError> {
    match body.pointer(pointer) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(_) => Err(wrong_type(field, "map")),
    }
}

/// The list under `key` of `spec` (empty when absent or null).
fn list<'a>(
    spec: &'a Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<&'a [Value], TemplateError> {
    match spec.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(wrong_type(format!("{at}.{key}"), "list")),
    }
}

/// One replica's effective requests, as the scheduler counts them: per resource the larger
/// of the containers' sum (plus sidecars, init containers with `restartPolicy: Always`, which
/// keep running) and each init container's own (plus the sidecars started before it), then
/// `spec.overhead` added; pods = 1.
pub fn pod_requests(at: String, spec: &Map<String, Value>) -> Result<Resources, TemplateError> {
    let mut containers = Resources::default();
    for (i, c) in list(spec, "containers", &at)?.iter().enumerate() {
        let r = container_requests(&format!("{at}.containers[{i}]"), c)?;
        containers = containers.saturating_add(r);
    }
    let mut sidecars = Resources::default();
    let mut init = Resources::default();
    for (i, c) in list(spec, "initContainers", &at)?.iter().enumerate() {
        let r = container_requests(&format!("{at}.initContainers[{i}]"), c)?;
        if c.get("restartPolicy").and_then(Value::as_str) == Some("Always") {
            sidecars = sidecars.saturating_add(r);
            init = max(init, sidecars);
        } else {
            init = max(init, sidecars.saturating_add(r));
        }
    }
    let overhead = match spec.get("overhead") {
        None | Some(Value::Null) => Resources::default(),
        Some(o) => amounts(&format!("{at}.overhead"), o)?,
    };
    let effective = max(containers.saturating_add(sidecars), init).saturating_add(overhead);
    Ok(Resources {
        pods: 1,
        ..effective
    })
}

fn max(a: Resources, b: Resources) -> Resources {
    Resources {
        cpu_millis: a.cpu_millis.max(b.cpu_millis),
        memory_bytes: a.memory_bytes.max(b.memory_bytes),
        gpus: a.gpus.max(b.gpus),
        pods: a.pods.max(b.pods),
    }
}

/// A container's requests, each resource falling back to its limit when not requested (the
/// API server defaults a missing request to the limit).
fn container_requests(at: &str, container: &Value) -> Result<Resources, TemplateError> {
    let requests = container.pointer("/resources/requests");
    let limits = container.pointer("/resources/limits");
    let pick = |name: &str| -> Result<Option<(String, &Value)>, TemplateError> {
        for (which, map) in [("requests", requests), ("limits", limits)] {
            match map {
                None | Some(Value::Null) => {}
                Some(Value::Object(m)) => {
                    if let Some(v) = m.get(name).filter(|v| !v.is_null()) {
                        return Ok(Some((format!("{at}.resources.{which}.{name}"), v)));
                    }
                }
                Some(_) => return Err(wrong_type(format!("{at}.resources.{which}"), "map")),
            }
        }
        Ok(None)
    };
    let read = |name: &str, parse: fn(&str) -> Result<u64, QuantityError>| {
        pick(name)?.map_or(Ok(0), |(field, v)| read_quantity(field, v, parse))
    };
    Ok(Resources {
        cpu_millis: read("cpu", quantity::cpu_millis)?,
        memory_bytes: read("memory", quantity::whole)?,
        gpus: read("nvidia.com/gpu", quantity::whole)?,
        pods: 0,
    })
}

/// A resource map such as `spec.overhead` (`cpu`, `memory`, `nvidia.com/gpu`).
pub fn amounts(at: &str, map: &Value) -> Result<Resources, TemplateError> {
    let Value::Object(m) = map else {
        return Err(wrong_type(at, "map"));
    };
    let read = |name: &str, parse: fn(&str) -> Result<u64, QuantityError>| match m.get(name) {
        None | Some(Value::Null) => Ok(0),
        Some(v) => read_quantity(format!("{at}.{name}"), v, parse),
    };
    Ok(Resources {
        cpu_millis: read("cpu", quantity::cpu_millis)?,
        memory_bytes: read("memory", quantity::whole)?,
        gpus: read("nvidia.com/gpu", quantity::whole)?,
        pods: 0,
    })
}

/// A quantity written as a string (`"500m"`) or, as YAML often gives it, a number (`1`).
fn read_quantity(
    field: String,
    v: &Value,
    parse: fn(&str) -> Result<u64, QuantityError>,
) -> Result<u64, TemplateError> {
    let text = match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return Err(wrong_type(field, "quantity")),
    };
    parse(&text).map_err(|source| TemplateError::Quantity { field, source })
}

/// The ConfigMaps, Secrets, ServiceAccounts and PVCs a pod spec names, in its namespace;
/// sorted, without duplicates. The `default` ServiceAccount is left out (every namespace has
/// one); a StatefulSet's `volumeClaimTemplates` are not dependencies (its controller creates
/// a claim per replica in the member). Malformed entries are skipped: a dependency that cannot
/// be read is one fewer object to follow, not a reason to refuse the workload.
fn pod_dependencies(namespace: &str, spec: &Map<String, Value>) -> Vec<TemplateKey> {
    let mut refs = Refs::default();
    refs.volumes(spec);
    for key in ["containers", "initContainers", "ephemeralContainers"] {
        for c in items(spec.get(key)) {
            refs.container(c);
        }
    }
    if let Some(sa) = str_at(spec.get("serviceAccountName")).filter(|sa| *sa != "default") {
        refs.add("ServiceAccount", sa);
    }
    for s in items(spec.get("imagePullSecrets")) {
        refs.add_at("Secret", s, "/name");
    }
    let mut keys: Vec<TemplateKey> = refs
        .0
        .into_iter()
        .map(|(kind, name)| TemplateKey::new("v1", kind, namespace, &name))
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// `(kind, name)` pairs found so far.
#[derive(Default)]
struct Refs(Vec<(&'static str, String)>);

impl Refs {
    fn add(&mut self, kind: &'static str, name: &str) {
        if !name.is_empty() {
            self.0.push((kind, name.to_string()));
        }
    }

    fn add_at(&mut self, kind: &'static str, v: &Value, pointer: &str) {
        if let Some(name) = str_at(v.pointer(pointer)) {
            self.add(kind, name);
        }
    }

    fn volumes(&mut self, spec: &Map<String, Value>) {
        for v in items(spec.get("volumes")) {
            self.add_at("ConfigMap", v, "/configMap/name");
            self.add_at("Secret", v, "/secret/secretName");
            self.add_at(
                "PersistentVolumeClaim",
                v,
                "/persistentVolumeClaim/claimName",
            );
            for source in items(v.pointer("/projected/sources")) {
                self.add_at("ConfigMap", source, "/configMap/name");
                self.add_at("Secret", source, "/secret/name");
            }
        }
    }

    fn container(&mut self, c: &Value) {
        for e in items(c.get("env")) {
            self.add_at("ConfigMap", e, "/valueFrom/configMapKeyRef/name");
            self.add_at("Secret", e, "/valueFrom/secretKeyRef/name");
        }
        for e in items(c.get("envFrom")) {
            self.add_at("ConfigMap", e, "/configMapRef/name");
            self.add_at("Secret", e, "/secretRef/name");
        }
    }
}

fn items(v: Option<&Value>) -> &[Value] {
    v.and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn str_at(v: Option<&Value>) -> Option<&str> {
    v.and_then(Value::as_str)
}

#[cfg(test)]
mod tests;
