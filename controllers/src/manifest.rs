//! Reading Kubernetes manifests from disk: multi-document YAML files and `kind: List`, as kubectl
//! prints them. Every problem names the file, the object and the reason; a bad document rejects
//! only itself. Unknown fields are warnings in Kubernetes kinds and errors in meridian.io kinds.
//!
//! ```text
//!  dir ──DirReader (blocking thread)──► per file: settle::Track (stable? half-written?)
//!            │ file::read: regular files only, ≤ maxFileBytes, within readTimeout
//!            ▼
//!  bytes ──split (on `---`)──► document ──depth::check──► serde_yaml_ng ──► Manifest
//! ```

use std::fmt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Node, Pod, ResourceQuota, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use meridian_core::{ObjectRef, Origin, Problem, Subject};
use serde::de::DeserializeOwned;
use serde_yaml_ng::Value;

use crate::crd::{
    ClusterSchedulingPolicy, MemberCluster, OverridePolicy, ServiceExport, ServiceImport, Tenant,
};

mod depth;
mod dir;
mod docs;
pub(crate) mod file;
mod limits;
pub(crate) mod settle;
mod split;
mod writes;

pub use dir::{DirRead, DirReader, MAX_LISTED_ENTRIES, ServedFile, directories_within};
pub(crate) use docs::DocKey;
pub use file::{BoundedReadError, read_bounded};
pub use limits::Limits;
pub use writes::OpenWrites;

/// One object read from disk.
#[derive(Clone, Debug)]
pub enum Manifest {
    MemberCluster(Box<MemberCluster>),
    ClusterSchedulingPolicy(Box<ClusterSchedulingPolicy>),
    Service(Box<Service>),
    EndpointSlice(Box<EndpointSlice>),
    ServiceExport(Box<ServiceExport>),
    ServiceImport(Box<ServiceImport>),
    OverridePolicy(Box<OverridePolicy>),
    Tenant(Box<Tenant>),
    /// A member directory's Nodes and Pods give its capacity; its ResourceQuotas their use.
    Node(Box<Node>),
    Pod(Box<Pod>),
    ResourceQuota(Box<ResourceQuota>),
    /// Gateway API routes and grants: in a hub directory, what meridian serves as RDS.
    HttpRoute(Box<crate::routes::HTTPRoute>),
    GrpcRoute(Box<crate::routes::GRPCRoute>),
    ReferenceGrant(Box<crate::routes::ReferenceGrant>),
    /// Any other kind, as written: in a hub directory a resource template, elsewhere ignored.
    Other(Box<OtherObject>),
}

/// An object of a kind meridian has no type for.
#[derive(Clone, Debug)]
pub struct OtherObject {
    pub object: ObjectRef,
    pub api_version: String,
    pub value: serde_json::Value,
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
            Manifest::OverridePolicy(m) => of(m.as_ref()),
            Manifest::Tenant(m) => of(m.as_ref()),
            Manifest::Node(m) => of(m.as_ref()),
            Manifest::Pod(m) => of(m.as_ref()),
            Manifest::ResourceQuota(m) => of(m.as_ref()),
            Manifest::HttpRoute(m) => of(m.as_ref()),
            Manifest::GrpcRoute(m) => of(m.as_ref()),
            Manifest::ReferenceGrant(m) => of(m.as_ref()),
            Manifest::Other(o) => o.object.clone(),
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
    #[error("{} is not a directory", path.display())]
    NotADirectory { path: PathBuf },
    #[error(
        "{} holds more than {max} entries (files and directories, hidden ones aside): not a directory of manifests",
        path.display()
    )]
    TooManyEntries { path: PathBuf, max: usize },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Reads every `*.yaml`, `*.yml` and `*.json` file under `dir` once (recursively, in name
/// order), within the default [`Limits`]. Fails only when a directory itself cannot be listed.
pub fn load_dir(dir: &Path) -> Result<Loaded> {
    DirReader::new(Limits::default().once())
        .read(dir, std::time::Instant::now())
        .map(|read| read.loaded)
}

/// Parses one file's text, adding what it holds to `out`, within the default depth limit.
pub fn parse_str(file: &Path, text: &str, out: &mut Loaded) {
    parse_str_within(file, text, Limits::DEFAULT_MAX_DEPTH, out);
}

/// Parses one file's text document by document: a document that does not parse, or nests
/// deeper than `max_depth`, rejects only itself.
pub fn parse_str_within(file: &Path, text: &str, max_depth: usize, out: &mut Loaded) {
    for doc in split::split(text) {
        parse_document(file, &doc, max_depth, out);
    }
}

/// Parses one document of `file`, adding what it holds (or why it holds nothing) to `out`.
fn parse_document(file: &Path, doc: &split::Document<'_>, max_depth: usize, out: &mut Loaded) {
    let malformed = |reason: String| ManifestError {
        file: file.to_path_buf(),
        object: Subject::Input(format!("document {}", doc.number)),
        reason,
    };
    if let Err(e) = depth::check(doc.text, max_depth) {
        let line = e.line + doc.first_line - 1;
        out.errors.push(malformed(format!(
            "nesting deeper than {} levels at line {line}; the document is not parsed",
            e.limit
        )));
        return;
    }
    let value = match serde_yaml_ng::from_str::<Value>(doc.text) {
        Ok(v) => v,
        Err(e) => {
            out.errors.push(malformed(format!(
                "malformed YAML: {}",
                in_file_lines(&e, doc.first_line)
            )));
            return;
        }
    };
    if value.is_null() {
        return;
    }
    parse_value(file, value, doc.number, out);
}

/// A parser error with the line numbers of the file, not of the document (libyaml names
/// more than one line: `... at line 13 column 1, while parsing a flow sequence at line 2`).
fn in_file_lines(e: &serde_yaml_ng::Error, first_line: usize) -> String {
    let text = e.to_string();
    if first_line <= 1 {
        return text;
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(i) = rest.find("line ") {
        let (before, after) = rest.split_at(i + "line ".len());
        out.push_str(before);
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        match after[..digits].parse::<usize>() {
            Ok(n) => out.push_str(&(n + first_line - 1).to_string()),
            Err(_) => out.push_str(&after[..digits]),
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
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
    let parsed = match (group, kind.as_str()) {
        ("meridian.io", "MemberCluster") => {
            typed::<MemberCluster>(value).map(|(v, u)| (Manifest::MemberCluster(Box::new(v)), u))
        }
        ("meridian.io", "ClusterSchedulingPolicy") => typed::<ClusterSchedulingPolicy>(value)
            .map(|(v, u)| (Manifest::ClusterSchedulingPolicy(Box::new(v)), u)),
        ("", "Service") => {
            typed::<Service>(value).map(|(v, u)| (Manifest::Service(Box::new(v)), u))
        }
        ("discovery.k8s.io", "EndpointSlice") => {
            typed::<EndpointSlice>(value).map(|(v, u)| (Manifest::EndpointSlice(Box::new(v)), u))
        }
        ("multicluster.x-k8s.io", "ServiceExport") => {
            // MCS ServiceExports usually carry no spec at all.
            let mut value = value;
            if let Some(map) = value.as_mapping_mut() {
                map.entry("spec".into())
                    .or_insert_with(|| Value::Mapping(Default::default()));
            }
            typed::<ServiceExport>(value).map(|(v, u)| (Manifest::ServiceExport(Box::new(v)), u))
        }
        ("multicluster.x-k8s.io", "ServiceImport") => {
            typed::<ServiceImport>(value).map(|(v, u)| (Manifest::ServiceImport(Box::new(v)), u))
        }
        ("meridian.io", "OverridePolicy") => {
            typed::<OverridePolicy>(value).map(|(v, u)| (Manifest::OverridePolicy(Box::new(v)), u))
        }
        ("meridian.io", "Tenant") => {
            typed::<Tenant>(value).map(|(v, u)| (Manifest::Tenant(Box::new(v)), u))
        }
        ("", "Node") => typed::<Node>(value).map(|(v, u)| (Manifest::Node(Box::new(v)), u)),
        ("", "Pod") => typed::<Pod>(value).map(|(v, u)| (Manifest::Pod(Box::new(v)), u)),
        ("", "ResourceQuota") => {
            typed::<ResourceQuota>(value).map(|(v, u)| (Manifest::ResourceQuota(Box::new(v)), u))
        }
        ("gateway.networking.k8s.io", "HTTPRoute") => typed::<crate::routes::HTTPRoute>(value)
            .map(|(v, u)| (Manifest::HttpRoute(Box::new(v)), u)),
        ("gateway.networking.k8s.io", "GRPCRoute") => typed::<crate::routes::GRPCRoute>(value)
            .map(|(v, u)| (Manifest::GrpcRoute(Box::new(v)), u)),
        ("gateway.networking.k8s.io", "ReferenceGrant") => {
            typed::<crate::routes::ReferenceGrant>(value)
                .map(|(v, u)| (Manifest::ReferenceGrant(Box::new(v)), u))
        }
        ("meridian.io", _) => {
            out.errors.push(err(format!(
                    "{api_version} {kind} is not a meridian.io kind (MemberCluster, ClusterSchedulingPolicy, OverridePolicy, Tenant)"
                )));
            return;
        }
        _ => match other(value, &object, &api_version) {
            Ok(o) => Ok((Manifest::Other(Box::new(o)), Vec::new())),
            Err(reason) => {
                out.errors.push(err(reason));
                return;
            }
        },
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

/// An object of a kind without a type: kept as JSON (YAML that JSON cannot hold, such as a
/// non-string key, is an error of that object).
/// Without a name it is no object at all (and, as often as not, a document cut short by a
/// write in progress: an error, so the file's last good version keeps serving).
fn other(value: Value, object: &Subject, api_version: &str) -> Result<OtherObject, String> {
    let Subject::Object(object) = object else {
        return Err("metadata.name is required".into());
    };
    let value =
        serde_json::to_value(&value).map_err(|e| format!("not representable as JSON: {e}"))?;
    let object = object.clone();
    Ok(OtherObject {
        object,
        api_version: api_version.to_string(),
        value,
    })
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
