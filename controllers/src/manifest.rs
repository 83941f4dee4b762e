//! Reading Kubernetes manifests from disk: multi-document YAML files and `kind: List`, as kubectl
//! prints them. Every problem names the file, the object and the reason; a bad document rejects
//! only itself. Unknown fields are warnings in Kubernetes kinds and errors in meridian.io kinds.

use std::fmt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use meridian_core::{ObjectRef, Origin, Problem, Subject};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_yaml_ng::Value;

use crate::crd::{ClusterSchedulingPolicy, MemberCluster, ServiceExport, ServiceImport};

/// One object read from disk.
#[derive(Clone, Debug)]
pub enum Manifest {
    MemberCluster(Box<MemberCluster>),
    ClusterSchedulingPolicy(Box<ClusterSchedulingPolicy>),
    Service(Box<Service>),
    EndpointSlice(Box<EndpointSlice>),
    ServiceExport(Box<ServiceExport>),
    ServiceImport(Box<ServiceImport>),
}

impl Manifest {
    /// The object, for messages: its kind, namespace and name.
    pub fn describe(&self) -> ObjectRef {
        use kube::Resource;
        fn of<K: Resource<DynamicType = ()>>(k: &K) -> ObjectRef {
            let meta = k.meta();
            ObjectRef {
                kind: K::kind(&()).into_owned(),
                namespace: meta.namespace.clone(),
                name: meta.name.clone().unwrap_or_else(|| "?".into()),
            }
        }
        match self {
            Manifest::MemberCluster(m) => of(m.as_ref()),
            Manifest::ClusterSchedulingPolicy(m) => of(m.as_ref()),
            Manifest::Service(m) => of(m.as_ref()),
            Manifest::EndpointSlice(m) => of(m.as_ref()),
            Manifest::ServiceExport(m) => of(m.as_ref()),
            Manifest::ServiceImport(m) => of(m.as_ref()),
        }
    }
}

/// A problem with one object (or one document) of one file. The reader does not know whose
/// directory it reads; [`ManifestError::into_problem`] adds that.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestError {
    pub file: PathBuf,
    pub object: Subject,
    pub reason: String,
}

impl ManifestError {
    pub fn into_problem(self, origin: Origin) -> Problem {
        Problem::in_file(origin, self.file, self.object, self.reason)
    }
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}: {}",
            self.file.display(),
            self.object,
            self.reason
        )
    }
}

/// What a directory held.
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    /// Each object with the file it came from.
    pub manifests: Vec<(PathBuf, Manifest)>,
    pub errors: Vec<ManifestError>,
    pub warnings: Vec<ManifestError>,
}

/// Why a directory of manifests could not be read at all (a file that cannot be read is a
/// problem of that file, in [`Loaded::errors`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read directory {}", path.display())]
    ReadDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Reads every `*.yaml`, `*.yml` and `*.json` file under `dir` (recursively, in name order).
/// Fails only when a directory itself cannot be listed.
pub fn load_dir(dir: &Path) -> Result<Loaded> {
    let mut files = Vec::new();
    collect_files(dir, &mut files)?;
    files.sort();
    let mut loaded = Loaded::default();
    for file in files {
        match std::fs::read_to_string(&file) {
            Ok(text) => parse_str(&file, &text, &mut loaded),
            Err(e) => loaded.errors.push(ManifestError {
                file: file.clone(),
                object: Subject::Input("file".into()),
                reason: format!("cannot read: {e}"),
            }),
        }
    }
    Ok(loaded)
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let unreadable = |source| Error::ReadDir {
        path: dir.to_path_buf(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let entry = entry.map_err(unreadable)?;
        let path = entry.path();
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        if entry.file_type().map_err(unreadable)?.is_dir() {
            collect_files(&path, out)?;
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            out.push(path);
        }
    }
    Ok(())
}

/// Parses one file's text, adding what it holds to `out`.
pub fn parse_str(file: &Path, text: &str, out: &mut Loaded) {
    for (n, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = match Value::deserialize(doc) {
            Ok(v) => v,
            Err(e) => {
                out.errors.push(ManifestError {
                    file: file.to_path_buf(),
                    object: Subject::Input(format!("document {}", n + 1)),
                    reason: format!("malformed YAML: {e}"),
                });
                // The parser cannot resynchronise after a syntax error.
                return;
            }
        };
        if value.is_null() {
            continue;
        }
        parse_value(file, value, n + 1, out);
    }
}

fn parse_value(file: &Path, value: Value, doc: usize, out: &mut Loaded) {
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if kind == "List" || kind.ends_with("List") && value.get("items").is_some() {
        if let Some(Value::Sequence(items)) = value.get("items").cloned() {
            for item in items {
                parse_value(file, item, doc, out);
            }
        }
        return;
    }
    let object = describe(&value, &kind, doc);
    let err = |reason: String| ManifestError {
        file: file.to_path_buf(),
        object: object.clone(),
        reason,
    };
    if kind.is_empty() || api_version.is_empty() {
        out.errors
            .push(err("apiVersion and kind are required".into()));
        return;
    }
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    let strict = group == "meridian.io";
    let parsed =
        match (group, kind.as_str()) {
            ("meridian.io", "MemberCluster") => typed::<MemberCluster>(value)
                .map(|(v, u)| (Manifest::MemberCluster(Box::new(v)), u)),
            ("meridian.io", "ClusterSchedulingPolicy") => typed::<ClusterSchedulingPolicy>(value)
                .map(|(v, u)| (Manifest::ClusterSchedulingPolicy(Box::new(v)), u)),
            ("", "Service") => {
                typed::<Service>(value).map(|(v, u)| (Manifest::Service(Box::new(v)), u))
            }
            ("discovery.k8s.io", "EndpointSlice") => typed::<EndpointSlice>(value)
                .map(|(v, u)| (Manifest::EndpointSlice(Box::new(v)), u)),
            ("multicluster.x-k8s.io", "ServiceExport") => {
                // MCS ServiceExports usually carry no spec at all.
                let mut value = value;
                if let Some(map) = value.as_mapping_mut() {
                    map.entry("spec".into())
                        .or_insert_with(|| Value::Mapping(Default::default()));
                }
                typed::<ServiceExport>(value)
                    .map(|(v, u)| (Manifest::ServiceExport(Box::new(v)), u))
            }
            ("multicluster.x-k8s.io", "ServiceImport") => typed::<ServiceImport>(value)
                .map(|(v, u)| (Manifest::ServiceImport(Box::new(v)), u)),
            _ => {
                out.warnings.push(err(format!(
                    "{api_version} {kind} is not a kind meridian reads; ignored"
                )));
                return;
            }
        };
    match parsed {
        Err(e) => out.errors.push(err(format!("invalid {kind}: {e}"))),
        Ok((_, unknown)) if strict && !unknown.is_empty() => {
            out.errors
                .push(err(format!("unknown field(s): {}", unknown.join(", "))));
        }
        Ok((manifest, unknown)) => {
            if !unknown.is_empty() {
                out.warnings.push(err(format!(
                    "unknown field(s) ignored: {}",
                    unknown.join(", ")
                )));
            }
            out.manifests.push((file.to_path_buf(), manifest));
        }
    }
}

/// Deserializes a typed object, collecting the paths of fields the type does not know.
fn typed<T: DeserializeOwned>(value: Value) -> Result<(T, Vec<String>), serde_yaml_ng::Error> {
    let mut unknown = Vec::new();
    let parsed = serde_ignored::deserialize(value, |path| {
        // `?` marks an Option on the way down; users know the field path without it.
        let path = path.to_string().replace(".?", "").replace("?.", "");
        // kube-derive's root types identify themselves without reading these two.
        if path != "apiVersion" && path != "kind" {
            unknown.push(path);
        }
    })?;
    Ok((parsed, unknown))
}

fn describe(value: &Value, kind: &str, doc: usize) -> Subject {
    let meta = value.get("metadata");
    let name = meta.and_then(|m| m.get("name")).and_then(Value::as_str);
    let ns = meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str);
    let kind = if kind.is_empty() { "object" } else { kind };
    match (ns, name) {
        (ns, Some(name)) => Subject::Object(ObjectRef {
            kind: kind.to_string(),
            namespace: ns.map(str::to_string),
            name: name.to_string(),
        }),
        _ => Subject::Input(format!("{kind} in document {doc}")),
    }
}

#[cfg(test)]
mod tests;
