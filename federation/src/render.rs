//! Per-cluster manifests from templates and their placement decisions, laid out for a GitOps
//! repository (`meridian render --out DIR`, a directory member's `renderPath`).
//!
//! ```text
//!  Template.body ─► drop status, server-set metadata, last-applied annotation
//!                ─► replica field := Placed.replicas        (template::replica_pointer)
//!                ─► overrides::apply_all(Placed.overrides)
//!                ─► + app.kubernetes.io/managed-by: meridian
//!                   + meridian.io/template, meridian.io/template-generation
//!                ─► path: <cluster>/<namespace>/<Kind>.<name>.yaml | <cluster>/_cluster/…
//!                ─► to_yaml: one document, keys sorted at every level
//! ```
//!
//! meridian's label and annotations are added after the overrides, so no override can take
//! them away. Paths are built only from components that cannot leave the output directory:
//! a name with `/`, `\`, a control character, or that is `.` or `..`, is refused, never
//! escaped (an escaped name could collide with another object's).

use std::collections::BTreeMap;
use std::path::PathBuf;

use meridian_core::model::ClusterId;
use meridian_core::placement::{
    Outcome, OverridePolicy, Placed, Placements, Template, TemplateKey,
};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::{Map, Value};

use crate::describe;
use crate::overrides::{self, OverrideError};
use crate::template::replica_pointer;

// The label and its value, spelled once for the constants made of them.
macro_rules! managed_by_label {
    () => {
        "app.kubernetes.io/managed-by"
    };
}
macro_rules! meridian {
    () => {
        "meridian"
    };
}
/// The label every rendered object carries, as does everything else meridian writes into a
/// member; meridian never touches an object without it.
pub const MANAGED_BY_LABEL: &str = managed_by_label!();
pub const MANAGED_BY: &str = meridian!();
/// What meridian wrote itself, for listing it.
pub const MANAGED_BY_SELECTOR: &str = concat!(managed_by_label!(), "=", meridian!());
/// Everything but what meridian wrote itself.
pub const MANAGED_BY_SELECTOR_EXCLUDED: &str = concat!(managed_by_label!(), "!=", meridian!());
/// The template an object was rendered from (`TemplateKey`'s display).
pub const TEMPLATE_ANNOTATION: &str = "meridian.io/template";
/// The template's `metadata.generation` when it was rendered.
pub const GENERATION_ANNOTATION: &str = "meridian.io/template-generation";
/// For a template without a generation (a ConfigMap, a Secret): the digest of its body as
/// rendered, so a copy still says which edit it holds. Written by the Kubernetes writer.
pub const TEMPLATE_DIGEST_ANNOTATION: &str = "meridian.io/template-digest";
/// The digest of the override rules applied ([`Placed::overrides_digest`], hex); absent when
/// none applies. With the generation, it is the revision a copy holds (staged rollouts).
pub const OVERRIDES_ANNOTATION: &str = "meridian.io/overrides";
/// The directory of cluster-scoped objects (no namespace can be named so: `_` is not
/// allowed in a namespace).
pub const CLUSTER_SCOPED_DIR: &str = "_cluster";

/// Fields the API server sets, dropped from `metadata`: a member's API server sets its own.
const SERVER_METADATA: &[&str] = &[
    "uid",
    "resourceVersion",
    "managedFields",
    "creationTimestamp",
    "generation",
    "selfLink",
    "ownerReferences",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("the overrides for cluster {cluster} cannot apply")]
    Overrides {
        cluster: ClusterId,
        #[source]
        source: OverrideError,
    },
    #[error("{0} is not a map")]
    NotAMap(&'static str),
    #[error("no path for the rendered object")]
    Path(#[source] PathError),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("missing {0}")]
    Missing(&'static str),
    #[error("{field} {value:?} cannot be a path component: {reason}")]
    Unsafe {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
}

/// The object `template` becomes in `placed.cluster`.
pub fn manifest(
    template: &Template,
    placed: &Placed,
    policies: &[OverridePolicy],
) -> Result<Value, RenderError> {
    let mut body = Value::clone(&template.body);
    let object = body
        .as_object_mut()
        .ok_or(RenderError::NotAMap("the object"))?;
    object.remove("status");
    clean_metadata(object)?;
    drop_hub_assigned(&template.key, object);
    if let (Some(replicas), Some(pointer)) = (
        placed.replicas,
        replica_pointer(&template.key.api_version, &template.key.kind),
    ) {
        set_replicas(object, pointer, replicas)?;
    }
    let mut body =
        overrides::apply_all(&body, placed, policies).map_err(|source| RenderError::Overrides {
            cluster: placed.cluster.clone(),
            source,
        })?;
    mark(&mut body, template, placed.overrides_digest(policies))?;
    Ok(body)
}

/// What a render reads of a template's body: the body without its status and the metadata
/// the hub's API server sets. Bodies equal here render the same copies, so a status the hub
/// writes onto a template (its aggregated status, say) renders nothing new.
pub fn rendered_part(body: &Value) -> Value {
    let Some(object) = body.as_object() else {
        return body.clone();
    };
    let mut out = Map::with_capacity(object.len());
    for (key, value) in object {
        if key != "status" {
            out.insert(key.clone(), value.clone());
        }
    }
    // Not a map: left as it is (a render refuses it).
    let _ = clean_metadata(&mut out);
    Value::Object(out)
}

fn clean_metadata(object: &mut Map<String, Value>) -> Result<(), RenderError> {
    let Some(metadata) = object.get_mut("metadata") else {
        return Ok(());
    };
    let metadata = metadata
        .as_object_mut()
        .ok_or(RenderError::NotAMap("metadata"))?;
    for field in SERVER_METADATA {
        metadata.remove(*field);
    }
    if let Some(Value::Object(annotations)) = metadata.get_mut("annotations") {
        annotations.remove(LAST_APPLIED);
        if annotations.is_empty() {
            metadata.remove("annotations");
        }
    }
    Ok(())
}

/// Drops what the hub's API server assigned to the object and a member's would refuse or
/// assign differently: a Service's cluster IPs (a headless Service keeps `None`), a Job's
/// generated selector and the controller-uid labels that go with it, a PVC's bound volume,
/// a ServiceAccount's token Secrets.
fn drop_hub_assigned(key: &TemplateKey, object: &mut Map<String, Value>) {
    let Some(Value::Object(spec)) = object.get_mut("spec") else {
        if (key.group(), &*key.kind) == ("", "ServiceAccount") {
            object.remove("secrets");
        }
        return;
    };
    match (key.group(), &*key.kind) {
        ("", "Service") => {
            let headless = spec.get("clusterIP").and_then(Value::as_str) == Some("None");
            if !headless {
                spec.remove("clusterIP");
                spec.remove("clusterIPs");
            }
        }
        ("batch", "Job") if spec.get("manualSelector") != Some(&Value::Bool(true)) => {
            spec.remove("selector");
            if let Some(Value::Object(labels)) = spec
                .get_mut("template")
                .and_then(|t| t.get_mut("metadata"))
                .and_then(|m| m.get_mut("labels"))
            {
                labels.remove("controller-uid");
                labels.remove("batch.kubernetes.io/controller-uid");
            }
        }
        ("", "PersistentVolumeClaim") => {
            spec.remove("volumeName");
        }
        _ => {}
    }
}

/// Sets `/spec/<field>`, creating `spec` when the template has none.
fn set_replicas(
    object: &mut Map<String, Value>,
    pointer: &str,
    replicas: u32,
) -> Result<(), RenderError> {
    let field = pointer.rsplit('/').next().unwrap_or(pointer);
    let spec = object
        .entry("spec")
        .or_insert_with(|| Value::Object(Map::new()));
    if spec.is_null() {
        *spec = Value::Object(Map::new());
    }
    let spec = spec.as_object_mut().ok_or(RenderError::NotAMap("spec"))?;
    spec.insert(field.to_string(), Value::from(replicas));
    Ok(())
}

/// meridian's label and annotations.
fn mark(body: &mut Value, template: &Template, overrides: Option<u64>) -> Result<(), RenderError> {
    let object = body
        .as_object_mut()
        .ok_or(RenderError::NotAMap("the object"))?;
    let metadata = child_map(object, "metadata", "metadata")?;
    child_map(metadata, "labels", "metadata.labels")?
        .insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    let annotations = child_map(metadata, "annotations", "metadata.annotations")?;
    annotations.insert(TEMPLATE_ANNOTATION.into(), template.key.to_string().into());
    annotations.insert(
        GENERATION_ANNOTATION.into(),
        template.generation.to_string().into(),
    );
    if let Some(digest) = overrides {
        annotations.insert(OVERRIDES_ANNOTATION.into(), format!("{digest:016x}").into());
    }
    Ok(())
}

/// The map under `key`, created when absent or null.
fn child_map<'a>(
    parent: &'a mut Map<String, Value>,
    key: &str,
    field: &'static str,
) -> Result<&'a mut Map<String, Value>, RenderError> {
    let child = parent
        .entry(key)
        .or_insert_with(|| Value::Object(Map::new()));
    if child.is_null() {
        *child = Value::Object(Map::new());
    }
    child.as_object_mut().ok_or(RenderError::NotAMap(field))
}

/// Where `object` is written for `cluster`: `<cluster>/<namespace>/<Kind>.<name>.yaml`, or
/// `<cluster>/_cluster/<Kind>.<name>.yaml` without a namespace. Relative, and never outside
/// the directory it is joined to.
pub fn path(cluster: &ClusterId, object: &Value) -> Result<PathBuf, PathError> {
    let text = |pointer, field| match object.pointer(pointer) {
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.as_str())),
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(_)) => Ok(None),
        Some(_) => Err(PathError::Unsafe {
            field,
            value: object
                .pointer(pointer)
                .map(Value::to_string)
                .unwrap_or_default(),
            reason: "not a string",
        }),
    };
    let kind = text("/kind", "kind")?.ok_or(PathError::Missing("kind"))?;
    let name =
        text("/metadata/name", "metadata.name")?.ok_or(PathError::Missing("metadata.name"))?;
    let namespace = text("/metadata/namespace", "metadata.namespace")?;
    check_component("cluster", cluster.as_str())?;
    check_kind(kind)?;
    check_component("metadata.name", name)?;
    let dir = match namespace {
        Some(ns) => {
            check_namespace(ns)?;
            ns
        }
        None => CLUSTER_SCOPED_DIR,
    };
    Ok([cluster.as_str(), dir, &format!("{kind}.{name}.yaml")]
        .iter()
        .collect())
}

fn unsafe_component(field: &'static str, value: &str, reason: &'static str) -> PathError {
    PathError::Unsafe {
        field,
        value: value.to_string(),
        reason,
    }
}

/// One path component that stays one: no separator, not `.` or `..`, nothing unprintable.
fn check_component(field: &'static str, value: &str) -> Result<(), PathError> {
    let fail = |reason| Err(unsafe_component(field, value, reason));
    if value.is_empty() {
        return fail("empty");
    }
    if value == "." || value == ".." {
        return fail("a relative directory");
    }
    if value.contains(['/', '\\']) {
        return fail("contains a path separator");
    }
    if value.chars().any(char::is_control) {
        return fail("contains a control character");
    }
    if value.len() > 253 {
        return fail("longer than 253 bytes");
    }
    Ok(())
}

fn check_kind(kind: &str) -> Result<(), PathError> {
    let ok = kind.starts_with(|c: char| c.is_ascii_alphabetic())
        && kind.chars().all(|c| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(unsafe_component("kind", kind, "not a Kubernetes kind"))
    }
}

/// A DNS label, as Kubernetes requires of namespaces.
fn check_namespace(ns: &str) -> Result<(), PathError> {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let ok = ns.len() <= 63
        && ns.starts_with(alnum)
        && ns.ends_with(alnum)
        && ns.chars().all(|c| alnum(c) || c == '-');
    if ok {
        Ok(())
    } else {
        Err(unsafe_component(
            "metadata.namespace",
            ns,
            "not a DNS label",
        ))
    }
}

/// One YAML document, map keys sorted at every level (so the same object always gives the
/// same bytes, whatever order its JSON was built in, with serde_json's `preserve_order` or
/// without; `apiVersion`, `kind`, `metadata`, `spec` happen to sort in the usual order).
pub fn to_yaml(object: &Value) -> String {
    // serde_yaml_ng fails only on maps with non-string keys or a failing Serialize impl; a
    // JSON value has neither.
    serde_yaml_ng::to_string(&Sorted(object)).expect("a JSON value serializes to YAML")
}

/// Serializes a JSON value with its map keys in sorted order.
struct Sorted<'a>(&'a Value);

impl Serialize for Sorted<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Object(m) => {
                let mut entries: Vec<(&String, &Value)> = m.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, &Sorted(v))?;
                }
                map.end()
            }
            Value::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for v in items {
                    seq.serialize_element(&Sorted(v))?;
                }
                seq.end()
            }
            other => other.serialize(s),
        }
    }
}

/// Every rendered file, by path relative to the output directory, and what could not be.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rendered {
    pub files: BTreeMap<PathBuf, String>,
    pub problems: Vec<RenderProblem>,
}

/// A template that is unschedulable, or could not be rendered (for one cluster, or at all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderProblem {
    pub template: TemplateKey,
    /// None: the problem is the template's, not one cluster's.
    pub cluster: Option<ClusterId>,
    pub reason: String,
}

/// Renders every placed cluster of every decision. An unschedulable decision still renders
/// the placements it keeps from before, and is reported; a cluster whose overrides (or path)
/// fail is skipped and reported, the template's other clusters still rendered.
pub fn render_all(
    placements: &Placements,
    templates: &[Template],
    policies: &[OverridePolicy],
) -> Rendered {
    render_clusters(placements, templates, policies, |_| true)
}

/// [`render_all`] for the clusters `wanted` says yes to (a server keeps only its members
/// with a `renderPath` rendered, and should not pay for the others).
pub fn render_clusters(
    placements: &Placements,
    templates: &[Template],
    policies: &[OverridePolicy],
    wanted: impl Fn(&ClusterId) -> bool,
) -> Rendered {
    let by_key: BTreeMap<&TemplateKey, &Template> = templates.iter().map(|t| (&t.key, t)).collect();
    let mut out = Rendered::default();
    for decision in placements.decisions.values() {
        let problem = |cluster: Option<&ClusterId>, reason: String| RenderProblem {
            template: decision.template.clone(),
            cluster: cluster.cloned(),
            reason,
        };
        if let Outcome::Unschedulable { reason } = &decision.outcome {
            out.problems
                .push(problem(None, format!("unschedulable: {reason}")));
        }
        let Some(template) = by_key.get(&decision.template) else {
            out.problems
                .push(problem(None, "no template of that key to render".into()));
            continue;
        };
        for placed in decision.placed.iter().filter(|p| wanted(&p.cluster)) {
            let cluster = Some(&placed.cluster);
            let rendered = manifest(template, placed, policies).and_then(|object| {
                let path = path(&placed.cluster, &object).map_err(RenderError::Path)?;
                Ok((path, to_yaml(&object)))
            });
            match rendered {
                Ok((path, _)) if out.files.contains_key(&path) => out.problems.push(problem(
                    cluster,
                    format!(
                        "{} is already rendered from another template",
                        path.display()
                    ),
                )),
                Ok((path, yaml)) => {
                    out.files.insert(path, yaml);
                }
                Err(e) => out.problems.push(problem(cluster, describe(&e))),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
