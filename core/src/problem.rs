//! Input meridian could not use (or used with a caveat): who reported it, what it is about,
//! where it was read, and why. Sources build these at the edge; the fleet keeps them per
//! origin so a member's problems leave with the member; `/debug/problems`, `meridian
//! validate` and the ServiceExport `Valid` condition all read the same values.
//!
//! ```text
//!  directory reader ──ManifestError──► Problem { origin, subject, Source::File, reason }
//!  Kubernetes watches ───────────────► Problem { origin, subject, Source::Api,  reason }
//!  snapshot merge (conflicts) ───────► Problem { origin, subject, Source::Merge, reason }
//! ```

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

use crate::model::{ClusterId, ObjectKey};

/// Who reported a problem: the hub (MemberClusters, policies), one member, or the geo
/// ranges (config `geo.ranges` and `geo.file`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Origin {
    Hub,
    Member(ClusterId),
    Geo,
}

impl Origin {
    pub fn is_member(&self, cluster: &ClusterId) -> bool {
        matches!(self, Origin::Member(c) if c == cluster)
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Hub => f.write_str("hub"),
            Origin::Geo => f.write_str("geo"),
            Origin::Member(c) => write!(f, "{c}"),
        }
    }
}

/// A named object: its kind, its namespace (none for cluster-scoped kinds) and its name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ObjectRef {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectRef {
    pub fn namespaced(kind: impl Into<String>, key: &ObjectKey) -> Self {
        Self {
            kind: kind.into(),
            namespace: Some(key.namespace.to_string()),
            name: key.name.to_string(),
        }
    }

    pub fn cluster_scoped(kind: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            namespace: None,
            name: name.into(),
        }
    }

    /// This kind, with this namespace and name.
    pub fn is(&self, kind: &str, key: &ObjectKey) -> bool {
        self.kind == kind
            && self.namespace.as_deref() == Some(&*key.namespace)
            && self.name == *key.name
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// What a problem is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Subject {
    Object(ObjectRef),
    /// Input that names no object: a file that cannot be read, a document that does not
    /// parse, an object without a name.
    Input(String),
}

impl Subject {
    pub fn object(&self) -> Option<&ObjectRef> {
        match self {
            Subject::Object(o) => Some(o),
            Subject::Input(_) => None,
        }
    }

    /// The object of this kind, namespace and name.
    pub fn is(&self, kind: &str, key: &ObjectKey) -> bool {
        self.object().is_some_and(|o| o.is(kind, key))
    }
}

impl From<ObjectRef> for Subject {
    fn from(o: ObjectRef) -> Self {
        Subject::Object(o)
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Object(o) => o.fmt(f),
            Subject::Input(s) => f.write_str(s),
        }
    }
}

/// Where the input was read.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// A manifest file of a directory hub or member.
    File { path: PathBuf },
    /// An object the origin's Kubernetes API served.
    Api,
    /// Found while merging the fleet (conflicting policies, an export that cannot be served):
    /// no single input object is wrong on its own.
    Merge,
}

/// Something in the input that meridian could not use, or used with a caveat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub origin: Origin,
    pub subject: Subject,
    pub source: Source,
    pub reason: String,
}

/// The longest reason a problem keeps: input quoted in a reason (a 50 MB line of a file) is
/// cut here, so logs, `/debug/problems`, the status page and `validate` stay readable.
pub const MAX_REASON_BYTES: usize = 512;

/// How many problems one source reports in full (the bad lines of one file); the rest are
/// counted in one more problem ([`bounded`]).
pub const MAX_PER_SOURCE: usize = 100;

/// `reason`, cut to [`MAX_REASON_BYTES`] (at a character boundary) with what was cut said.
pub fn clip(mut reason: String) -> String {
    if reason.len() <= MAX_REASON_BYTES {
        return reason;
    }
    let mut end = MAX_REASON_BYTES;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let cut = reason.len() - end;
    reason.truncate(end);
    reason.push_str(&format!("… ({cut} more bytes not shown)"));
    reason
}

/// Counts what one source rejects past its first [`MAX_PER_SOURCE`] problems, keeping those.
#[derive(Debug, Default)]
pub struct Bounded {
    pub kept: Vec<Problem>,
    /// Problems past the bound, counted only.
    pub more: usize,
}

impl Bounded {
    /// Keeps `p` if there is room; else counts it. Returns whether it was kept.
    pub fn push(&mut self, p: Problem) -> bool {
        if self.kept.len() < MAX_PER_SOURCE {
            self.kept.push(p);
            true
        } else {
            self.more += 1;
            false
        }
    }

    /// The kept problems, and one more saying how many were only counted (like the last
    /// kept one: same origin and source).
    pub fn finish(mut self) -> Vec<Problem> {
        if self.more > 0
            && let Some(last) = self.kept.last()
        {
            let summary = Problem {
                origin: last.origin.clone(),
                subject: Subject::Input(format!("{} more", self.more)),
                source: last.source.clone(),
                reason: format!(
                    "{} more problems of this input are not listed (the first {MAX_PER_SOURCE} are)",
                    self.more
                ),
            };
            self.kept.push(summary);
        }
        self.kept
    }
}

/// At most [`MAX_PER_SOURCE`] of `problems`, and one more counting the rest.
pub fn bounded(problems: impl IntoIterator<Item = Problem>) -> Vec<Problem> {
    let mut b = Bounded::default();
    for p in problems {
        b.push(p);
    }
    b.finish()
}

impl Problem {
    /// A problem with (part of) a manifest file.
    pub fn in_file(
        origin: Origin,
        path: impl Into<PathBuf>,
        subject: impl Into<Subject>,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            origin,
            subject: subject.into(),
            source: Source::File { path: path.into() },
            reason: clip(reason.into()),
        }
    }

    /// A problem with an object a Kubernetes API served.
    pub fn in_api(origin: Origin, object: ObjectRef, reason: impl Into<String>) -> Self {
        Self {
            origin,
            subject: Subject::Object(object),
            source: Source::Api,
            reason: clip(reason.into()),
        }
    }

    /// A problem found while merging the fleet.
    pub fn in_merge(origin: Origin, object: ObjectRef, reason: impl Into<String>) -> Self {
        Self {
            origin,
            subject: Subject::Object(object),
            source: Source::Merge,
            reason: clip(reason.into()),
        }
    }

    /// Where and what, as one string: `file: Kind ns/name`, `cluster API: Kind ns/name`, or
    /// the subject alone for a merge (the `object` of `/debug/problems`).
    pub fn location(&self) -> String {
        match &self.source {
            Source::File { path } => format!("{}: {}", path.display(), self.subject),
            Source::Api => format!("{} API: {}", self.origin, self.subject),
            Source::Merge => self.subject.to_string(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            // A merge names no input, so the cluster says where to look.
            Source::Merge => write!(
                f,
                "cluster {}: {}: {}",
                self.origin, self.subject, self.reason
            ),
            _ => write!(f, "{}: {}", self.location(), self.reason),
        }
    }
}

/// `/debug/problems` keeps `cluster`, `object` and `reason` as they always were, and adds the
/// typed parts beside them.
#[derive(Serialize)]
struct ProblemJson<'a> {
    cluster: String,
    object: String,
    reason: &'a str,
    origin: &'static str,
    subject: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    source: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
}

impl Serialize for Problem {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let object = self.subject.object();
        ProblemJson {
            cluster: self.origin.to_string(),
            object: self.location(),
            reason: &self.reason,
            origin: match self.origin {
                Origin::Hub => "hub",
                Origin::Member(_) => "member",
                Origin::Geo => "geo",
            },
            subject: self.subject.to_string(),
            kind: object.map(|o| o.kind.as_str()),
            namespace: object.and_then(|o| o.namespace.as_deref()),
            name: object.map(|o| o.name.as_str()),
            source: match self.source {
                Source::File { .. } => "file",
                Source::Api => "api",
                Source::Merge => "merge",
            },
            file: match &self.source {
                Source::File { path } => Some(path.display().to_string()),
                _ => None,
            },
        }
        .serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_reason_is_cut_and_a_flood_of_problems_is_counted() {
        let line = "x".repeat(50 << 20);
        let p = Problem::in_file(Origin::Geo, "/g.csv", Subject::Input("line 1".into()), line);
        assert!(p.reason.len() < MAX_REASON_BYTES + 64, "{}", p.reason.len());
        assert!(
            p.reason.ends_with("more bytes not shown)"),
            "{}",
            &p.reason[500..]
        );
        let many = (0..1_000_000).map(|i| {
            Problem::in_file(
                Origin::Geo,
                "/g.csv",
                Subject::Input(format!("line {i}")),
                "bad",
            )
        });
        let kept = bounded(many);
        assert_eq!(kept.len(), MAX_PER_SOURCE + 1);
        assert_eq!(
            kept.last().unwrap().reason,
            "999900 more problems of this input are not listed (the first 100 are)"
        );
    }

    #[test]
    fn every_source_reads_as_it_always_did() {
        let key = ObjectKey::new("shop", "pay");
        let file = Problem::in_file(
            Origin::Member(ClusterId::new("eu-1")),
            "/c/eu-1/a.yaml",
            Subject::Input("document 4".into()),
            "malformed YAML: x",
        );
        assert_eq!(
            file.to_string(),
            "/c/eu-1/a.yaml: document 4: malformed YAML: x"
        );
        let api = Problem::in_api(
            Origin::Member(ClusterId::new("m1")),
            ObjectRef::namespaced("Service", &key),
            "port 70000 is out of range",
        );
        assert_eq!(api.location(), "m1 API: Service shop/pay");
        let merged = Problem::in_merge(
            Origin::Hub,
            ObjectRef::namespaced("ClusterSchedulingPolicy", &key),
            "Conflict: …",
        );
        assert_eq!(
            merged.to_string(),
            "cluster hub: ClusterSchedulingPolicy shop/pay: Conflict: …"
        );
        assert!(merged.subject.is("ClusterSchedulingPolicy", &key));
        assert!(!merged.subject.is("Service", &key));
    }

    #[test]
    fn the_json_keeps_cluster_object_and_reason() {
        let p = Problem::in_file(
            Origin::Hub,
            "/hub/extra.yaml",
            ObjectRef::cluster_scoped("MemberCluster", "eu-3"),
            "unknown field(s): spec.netwrk",
        );
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["cluster"], "hub");
        assert_eq!(json["object"], "/hub/extra.yaml: MemberCluster eu-3");
        assert_eq!(json["reason"], "unknown field(s): spec.netwrk");
        assert_eq!(json["kind"], "MemberCluster");
        assert_eq!(json["source"], "file");
        assert_eq!(json["file"], "/hub/extra.yaml");
    }
}
