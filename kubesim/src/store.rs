//! One member's objects: a plain synchronous store with the API server's write rules, its
//! resourceVersion counter and the ring of recent events watches are served from.
//!
//! ```text
//!  create / update / patch / apply / delete ──► rules (namespace exists, resourceVersion
//!     preconditions, status only through /status, generation, finalizers, managedFields)
//!        ──► commit: unchanged → nothing; else rv+1, object stored, Event into the ring
//!  ring (last `window` events) ──► events_since(rv) for watches; older → 410 Expired
//!  expire() ──► the ring is emptied and every older resourceVersion is Expired
//! ```
//! Nothing here awaits: the HTTP shell holds the member's lock around one call.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::error::{ApiError, Result};
use crate::resources::{Registry, ResourceType};
use crate::selector::{FieldSelector, LabelSelector};
use crate::ssa::{self, Applier, Scope};

/// What a watch reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Added,
    Modified,
    Deleted,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, as every watch of its resource sees it. The object itself is not kept (a
/// version per event would cost the ring far more than the store): only its watch line, and
/// what selectors look at.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub kind: EventKind,
    pub resource: Arc<ResourceType>,
    /// `{"type":…,"object":…}\n`, serialized once for every watch that sends it.
    pub line: Bytes,
    /// What filters read of the object.
    pub view: Arc<View>,
}

impl Event {
    /// The object, read back from the line (metadata-only watches).
    pub fn object(&self) -> Value {
        serde_json::from_slice::<Value>(&self.line)
            .map(|mut v| v["object"].take())
            .unwrap_or(Value::Null)
    }
}

/// What selectors read of an object: metadata name, namespace and labels, `status.phase`
/// and `spec.nodeName` (field selectors see only these four fields; any other reads as empty).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct View {
    pub name: String,
    pub namespace: String,
    /// Sorted by key.
    pub labels: Vec<(String, String)>,
    pub phase: String,
    pub node_name: String,
}

impl View {
    pub fn of(object: &Value) -> Self {
        let text = |p: &str| {
            object
                .pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let labels = object
            .pointer("/metadata/labels")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
            .collect();
        Self {
            name: text("/metadata/name"),
            namespace: text("/metadata/namespace"),
            labels,
            phase: text("/status/phase"),
            node_name: text("/spec/nodeName"),
        }
    }

    fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
            .ok()
            .map(|i| self.labels[i].1.as_str())
    }

    fn field(&self, path: &[String]) -> Option<&str> {
        let path: Vec<&str> = path.iter().map(String::as_str).collect();
        Some(match path.as_slice() {
            ["metadata", "name"] => &self.name,
            ["metadata", "namespace"] => &self.namespace,
            ["status", "phase"] => &self.phase,
            ["spec", "nodeName"] => &self.node_name,
            _ => return None,
        })
    }
}

/// One stored object: its JSON (a parsed `Value` costs ten to twenty times as much memory:
/// every small map is a B-tree node), and what selectors read.
#[derive(Debug, Clone)]
struct Stored {
    json: Bytes,
    view: Arc<View>,
}

/// `{"type":KIND,"object":JSON}\n` from the object's JSON as stored.
pub fn line_of(kind: &str, json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 32);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(json);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

pub fn watch_line(kind: &str, object: &Value) -> Bytes {
    let mut out =
        serde_json::to_vec(&json!({"type": kind, "object": object})).expect("a Value serializes");
    out.push(b'\n');
    Bytes::from(out)
}

/// A write's outcome.
#[derive(Debug, Clone)]
pub struct Written {
    pub object: Arc<Value>,
    /// The object's JSON as stored.
    pub json: Bytes,
    /// False when the write changed nothing (no new resourceVersion, no event).
    pub changed: bool,
}

/// Who writes, as managedFields name them.
#[derive(Debug, Clone)]
pub struct Writer<'a> {
    pub manager: &'a str,
    pub force: bool,
    pub now: &'a str,
}

/// Where a write goes.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub resource: &'a Arc<ResourceType>,
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    /// `status` (or `scale`), None for the main resource.
    pub subresource: Option<&'a str>,
}

/// How a PATCH body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    /// Treated as a merge patch: maps merge, lists are replaced (no patch strategies).
    Strategic,
    Json,
    Apply,
}

impl PatchKind {
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let ct = ct.split(';').next().unwrap_or_default().trim();
        Some(match ct {
            "application/merge-patch+json" => Self::Merge,
            "application/strategic-merge-patch+json" => Self::Strategic,
            "application/json-patch+json" => Self::Json,
            "application/apply-patch+yaml" | "application/apply-patch+json" => Self::Apply,
            _ => return None,
        })
    }
}

/// A LIST's page.
#[derive(Debug)]
pub struct Page {
    /// Each object's JSON.
    pub items: Vec<Bytes>,
    pub resource_version: u64,
    pub continue_: Option<String>,
}

/// Which objects a list or watch wants.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Filter {
    pub fn matches(&self, view: &View) -> bool {
        let ns_ok = self
            .namespace
            .as_deref()
            .is_none_or(|ns| view.namespace == ns);
        ns_ok
            && self.labels.matches_with(|k| view.label(k))
            && self.fields.matches_with(|p| view.field(p))
    }
}

/// Namespaced objects by (namespace, name); cluster-scoped ones under "".
type Objects = BTreeMap<(String, String), Stored>;

/// One member's API state.
#[derive(Debug)]
pub struct Store {
    pub registry: Registry,
    /// By resource key (`group/version/resource`).
    objects: HashMap<String, Objects>,
    /// The member's resourceVersion: every change takes the next one.
    rv: u64,
    /// Watches may start from this resourceVersion or later; older is 410 Expired.
    floor: u64,
    /// The events after `floor`, oldest first.
    ring: VecDeque<Arc<Event>>,
    /// How many events the ring keeps.
    window: usize,
    /// Bumped by `expire`: a watch opened at an older epoch ends.
    pub epoch: u64,
    /// Makes uids unique across members.
    index: u64,
    uids: u64,
    /// The next ClusterIP a Service gets (10.96.0.0/12 upwards).
    next_ip: u32,
}

fn key(t: &ResourceType) -> String {
    format!("{}/{}/{}", t.group, t.version, t.resource)
}

impl Store {
    pub fn new(index: u64, window: usize) -> Self {
        Self {
            registry: Registry::default(),
            objects: HashMap::new(),
            rv: 0,
            floor: 0,
            ring: VecDeque::new(),
            window: window.max(1),
            epoch: 0,
            index,
            uids: 0,
            next_ip: 10,
        }
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// Every open watch ends and every resourceVersion up to now answers 410: clients
    /// relist.
    pub fn expire(&mut self) {
        self.ring.clear();
        self.floor = self.rv;
        self.epoch += 1;
    }

    /// The events after `rv` matching `resource`, or Expired when they are no longer kept.
    pub fn events_since(&self, rv: u64, resource: &ResourceType) -> Result<Vec<Arc<Event>>> {
        if rv < self.floor {
            return Err(ApiError::expired(rv, self.floor));
        }
        let start = self.ring.partition_point(|e| e.rv <= rv);
        Ok(self
            .ring
            .range(start..)
            .filter(|e| *e.resource == *resource)
            .cloned()
            .collect())
    }

    /// The object, parsed (a copy to change as the caller likes).
    pub fn get(&self, t: &Target<'_>) -> Result<Arc<Value>> {
        let json = self.get_json(t)?;
        Ok(Arc::new(
            serde_json::from_slice(&json).expect("stored JSON parses"),
        ))
    }

    /// The object's JSON as stored.
    pub fn get_json(&self, t: &Target<'_>) -> Result<Bytes> {
        self.objects
            .get(&key(t.resource))
            .and_then(|o| o.get(&(ns_of(t), t.name.to_owned())))
            .map(|s| s.json.clone())
            .ok_or_else(|| ApiError::not_found(t.resource, t.name))
    }

    /// One page of the objects of `resource` matching `filter`, after the `continue` token.
    pub fn list(
        &self,
        resource: &ResourceType,
        filter: &Filter,
        limit: Option<usize>,
        continue_: Option<&str>,
    ) -> Result<Page> {
        let after = continue_
            .filter(|c| !c.is_empty())
            .map(|c| {
                decode_continue(c).ok_or_else(|| ApiError::bad_request("invalid continue token"))
            })
            .transpose()?;
        let mut items = Vec::new();
        let mut last_key = None;
        let mut more = false;
        let empty = Objects::new();
        let objects = self.objects.get(&key(resource)).unwrap_or(&empty);
        let range = match &after {
            Some(k) => objects.range::<(String, String), _>((
                std::ops::Bound::Excluded(k),
                std::ops::Bound::Unbounded,
            )),
            None => objects.range::<(String, String), _>(..),
        };
        for (k, object) in range {
            if let Some(ns) = &filter.namespace
                && k.0 != *ns
            {
                continue;
            }
            if !filter.matches(&object.view) {
                continue;
            }
            if limit.is_some_and(|l| l > 0 && items.len() == l) {
                more = true;
                break;
            }
            items.push(object.json.clone());
            last_key = Some(k);
        }
        let continue_ = last_key.filter(|_| more).map(encode_continue);
        Ok(Page {
            items,
            resource_version: self.rv,
            continue_,
        })
    }

    /// Every object of `resource` matching `filter` (a watch's initial events).
    pub fn all(&self, resource: &ResourceType, filter: &Filter) -> Vec<Bytes> {
        self.objects
            .get(&key(resource))
            .into_iter()
            .flat_map(|o| o.values())
            .filter(|o| filter.matches(&o.view))
            .map(|o| o.json.clone())
            .collect()
    }

    pub fn namespace_exists(&self, namespace: &str) -> bool {
        self.objects
            .get("/v1/namespaces")
            .is_some_and(|o| o.contains_key(&(String::new(), namespace.to_owned())))
    }

    /// POST: a new object.
    pub fn create(&mut self, t: &Target<'_>, body: Value, who: &Writer<'_>) -> Result<Written> {
        let Value::Object(_) = &body else {
            return Err(ApiError::bad_request("the body is not an object"));
        };
        let mut body = body;
        let name = match body.pointer("/metadata/name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() => n.to_owned(),
            _ => match body
                .pointer("/metadata/generateName")
                .and_then(Value::as_str)
            {
                Some(prefix) => format!("{prefix}{:05x}", self.rv + 1),
                None => return Err(ApiError::bad_request("metadata.name is required")),
            },
        };
        let target = Target { name: &name, ..*t };
        self.check_namespace(&target, &body)?;
        if self.get_json(&target).is_ok() {
            return Err(ApiError::already_exists(t.resource, &name));
        }
        if t.resource.review {
            // An access review is answered, never stored: everything is allowed.
            body["status"] = json!({"allowed": true, "incomplete": false});
            let json = Bytes::from(serde_json::to_vec(&body).expect("a Value serializes"));
            return Ok(Written {
                object: Arc::new(body),
                json,
                changed: false,
            });
        }
        let meta = metadata_mut(&mut body);
        meta.insert("name".into(), json!(name));
        for server_set in [
            "resourceVersion",
            "deletionTimestamp",
            "managedFields",
            "uid",
        ] {
            meta.remove(server_set);
        }
        if t.resource.status {
            body.as_object_mut().expect("an object").remove("status");
        }
        self.created(&target, body, who, false)
    }

    /// Fills what the server sets on a new object, records its writer, and commits it.
    fn created(
        &mut self,
        t: &Target<'_>,
        mut body: Value,
        who: &Writer<'_>,
        applied: bool,
    ) -> Result<Written> {
        body["apiVersion"] = json!(t.resource.api_version());
        body["kind"] = json!(t.resource.kind);
        self.uids += 1;
        let uid = format!(
            "00000000-0000-4000-8000-{:012x}",
            (self.index << 32) | self.uids
        );
        let meta = metadata_mut(&mut body);
        if let Some(ns) = t.namespace.filter(|_| t.resource.namespaced) {
            meta.insert("namespace".into(), json!(ns));
        } else {
            meta.remove("namespace");
        }
        meta.insert("uid".into(), json!(uid));
        meta.insert("creationTimestamp".into(), json!(who.now));
        meta.insert("generation".into(), json!(1));
        if t.resource.resource == "services" && t.resource.group.is_empty() {
            self.allocate_cluster_ip(&mut body);
        }
        if t.resource.resource == "namespaces" && t.resource.group.is_empty() {
            body["spec"]["finalizers"] = json!(["kubernetes"]);
            body["status"] = json!({"phase": "Active"});
        }
        if !applied {
            ssa::record_update(None, &mut body, &applier(t, who));
        }
        if t.resource.resource == "customresourcedefinitions" {
            self.registry.register_crd(&body);
        }
        Ok(self.commit(t, None, body))
    }

    /// A Service without a ClusterIP gets the next one, as the API server's allocator would.
    fn allocate_cluster_ip(&mut self, body: &mut Value) {
        let headless_or_set = body
            .pointer("/spec/clusterIP")
            .and_then(Value::as_str)
            .is_some_and(|ip| !ip.is_empty());
        let external = body.pointer("/spec/type").and_then(Value::as_str) == Some("ExternalName");
        if headless_or_set || external {
            return;
        }
        let n = self.next_ip;
        self.next_ip += 1;
        let ip = format!("10.96.{}.{}", (n >> 8) & 0xff, n & 0xff);
        body["spec"]["clusterIP"] = json!(ip);
        body["spec"]["clusterIPs"] = json!([ip]);
    }

    fn check_namespace(&self, t: &Target<'_>, body: &Value) -> Result<()> {
        if !t.resource.namespaced {
            return Ok(());
        }
        let Some(ns) = t.namespace else {
            return Err(ApiError::bad_request("a namespace is required"));
        };
        if let Some(own) = body.pointer("/metadata/namespace").and_then(Value::as_str)
            && !own.is_empty()
            && own != ns
        {
            return Err(ApiError::bad_request(format!(
                "the namespace of the object ({own}) does not match the namespace on the request ({ns})"
            )));
        }
        match self.namespace_exists(ns) {
            true => Ok(()),
            false => Err(ApiError::namespace_not_found(ns)),
        }
    }

    /// PUT: replaces the object (or its status), refused when its resourceVersion is stale.
    pub fn update(&mut self, t: &Target<'_>, body: Value, who: &Writer<'_>) -> Result<Written> {
        let old = self.get(t)?;
        if !body.is_object() {
            return Err(ApiError::bad_request("the body is not an object"));
        }
        check_version(t, &old, &body)?;
        self.replace(t, &old, body, who)
    }

    /// Keeps what the write may not change, records the writer and commits.
    fn replace(
        &mut self,
        t: &Target<'_>,
        old: &Arc<Value>,
        body: Value,
        who: &Writer<'_>,
    ) -> Result<Written> {
        let mut new = keep_server_fields(t, old, body);
        ssa::record_update(Some(old), &mut new, &applier(t, who));
        Ok(self.commit(t, Some(old.clone()), new))
    }

    /// PATCH: merge, strategic (as merge), JSON patch, or server-side apply.
    pub fn patch(
        &mut self,
        t: &Target<'_>,
        kind: PatchKind,
        body: &[u8],
        who: &Writer<'_>,
    ) -> Result<Written> {
        if kind == PatchKind::Apply {
            return self.apply(t, body, who);
        }
        let old = self.get(t)?;
        let mut new = (*old).clone();
        match kind {
            PatchKind::Json => {
                let patch: json_patch::Patch = serde_json::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("not a JSON patch: {e}")))?;
                json_patch::patch(&mut new, &patch).map_err(|e| {
                    ApiError::new(
                        422,
                        "Invalid",
                        format!("the JSON patch does not apply: {e}"),
                    )
                })?;
            }
            _ => {
                let patch: Value = serde_json::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("not a JSON merge patch: {e}")))?;
                json_patch::merge(&mut new, &patch);
            }
        }
        check_version(t, &old, &new)?;
        self.replace(t, &old, new, who)
    }

    /// Server-side apply: creates the object when missing, otherwise merges the applied
    /// fields (see `ssa`).
    fn apply(&mut self, t: &Target<'_>, body: &[u8], who: &Writer<'_>) -> Result<Written> {
        let body: Value = serde_yaml_ng::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("the apply body is not YAML or JSON: {e}"))
        })?;
        if !body.is_object() {
            return Err(ApiError::bad_request("the apply body is not an object"));
        }
        if let Some(name) = body.pointer("/metadata/name").and_then(Value::as_str)
            && name != t.name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({name}) does not match the name on the URL ({})",
                t.name
            )));
        }
        let conflict = |e: ssa::Conflicts| {
            let mut err = ApiError::new(409, "Conflict", e.to_string());
            err.details = Some((
                t.resource.group.clone(),
                t.resource.resource.clone(),
                t.name.to_owned(),
            ));
            err
        };
        match self.get(t) {
            Ok(old) => {
                check_version(t, &old, &body)?;
                let new = ssa::apply(&old, &body, &applier(t, who)).map_err(conflict)?;
                let new = keep_server_fields(t, &old, new);
                Ok(self.commit(t, Some(old), new))
            }
            Err(e) if t.subresource.is_some() => Err(e),
            Err(_) => {
                self.check_namespace(t, &body)?;
                let skeleton = json!({"metadata": {"name": t.name}});
                let mut new = ssa::apply(&skeleton, &body, &applier(t, who)).map_err(conflict)?;
                if t.resource.status {
                    new.as_object_mut().expect("an object").remove("status");
                }
                self.created(t, new, who, true)
            }
        }
    }

    /// DELETE: with finalizers the object stays, marked for deletion, until they are gone.
    /// Deleting a namespace deletes what is in it at once.
    pub fn delete(
        &mut self,
        t: &Target<'_>,
        preconditions: (Option<&str>, Option<&str>),
        now: &str,
    ) -> Result<Written> {
        let old = self.get(t)?;
        let (uid, rv) = preconditions;
        if uid.is_some_and(|u| old.pointer("/metadata/uid").and_then(Value::as_str) != Some(u)) {
            return Err(ApiError::stale(
                t.resource,
                t.name,
                "Precondition failed: UID in precondition does not match the object",
            ));
        }
        if rv.is_some_and(|v| resource_version(&old) != Some(v)) {
            return Err(ApiError::stale(
                t.resource,
                t.name,
                "Precondition failed: ResourceVersion in precondition does not match the object",
            ));
        }
        if t.resource.resource == "namespaces" && t.resource.group.is_empty() {
            self.empty_namespace(t.name, now);
        }
        let mut new = (*old).clone();
        if new.pointer("/metadata/deletionTimestamp").is_none() {
            metadata_mut(&mut new).insert("deletionTimestamp".into(), json!(now));
        }
        if t.resource.resource == "namespaces" && t.resource.group.is_empty() {
            // The namespace lifecycle's own finalizer is done at once here.
            new["spec"]["finalizers"] = json!([]);
        }
        Ok(self.commit(t, Some(old), new))
    }

    /// Deletes every object in `namespace` (finalizers ignored: the namespace is going).
    fn empty_namespace(&mut self, namespace: &str, now: &str) {
        let mut doomed = Vec::new();
        for objects in self.objects.values() {
            for ((ns, name), object) in objects {
                if ns == namespace
                    && let Ok(v) = serde_json::from_slice::<Value>(&object.json)
                {
                    doomed.push((name.clone(), Arc::new(v)));
                }
            }
        }
        for (name, object) in doomed {
            let Some(t) = object["apiVersion"]
                .as_str()
                .and_then(|av| self.registry.by_kind(av, object["kind"].as_str()?))
            else {
                continue;
            };
            let mut gone = (*object).clone();
            metadata_mut(&mut gone).insert("deletionTimestamp".into(), json!(now));
            metadata_mut(&mut gone).remove("finalizers");
            let target = Target {
                resource: &t,
                namespace: Some(namespace),
                name: &name,
                subresource: None,
            };
            self.commit(&target, Some(object), gone);
        }
    }

    /// Stores `new` under a new resourceVersion unless it equals `old`; an object marked for
    /// deletion without finalizers is removed instead. Bumps the generation when anything
    /// outside metadata and status changed.
    fn commit(&mut self, t: &Target<'_>, old: Option<Arc<Value>>, mut new: Value) -> Written {
        if let Some(old) = &old {
            if same(old, &new) {
                let json = self.get_json(t).unwrap_or_default();
                return Written {
                    object: old.clone(),
                    json,
                    changed: false,
                };
            }
            let generation = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            let generation = match spec_changed(old, &new) {
                true => generation + 1,
                false => generation,
            };
            metadata_mut(&mut new).insert("generation".into(), json!(generation));
        }
        self.rv += 1;
        metadata_mut(&mut new).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let finalized = new
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty);
        let deleting = new.pointer("/metadata/deletionTimestamp").is_some() && finalized;
        let json = Bytes::from(serde_json::to_vec(&new).expect("a Value serializes"));
        let view = Arc::new(View::of(&new));
        let slot = (ns_of(t), t.name.to_owned());
        let objects = self.objects.entry(key(t.resource)).or_default();
        let kind = if deleting {
            objects.remove(&slot);
            EventKind::Deleted
        } else {
            let stored = Stored {
                json: json.clone(),
                view: view.clone(),
            };
            objects.insert(slot, stored);
            match old {
                Some(_) => EventKind::Modified,
                None => EventKind::Added,
            }
        };
        self.push(Event {
            rv: self.rv,
            kind,
            resource: t.resource.clone(),
            line: line_of(kind.as_str(), &json),
            view,
        });
        Written {
            object: Arc::new(new),
            json,
            changed: true,
        }
    }

    fn push(&mut self, event: Event) {
        self.ring.push_back(Arc::new(event));
        while self.ring.len() > self.window {
            if let Some(old) = self.ring.pop_front() {
                self.floor = old.rv;
            }
        }
    }

    /// The member's controllers, reduced to one step: a workload whose spec changed reports
    /// every replica ready (None when its status already says so, or it is gone).
    pub fn make_ready(&mut self, t: &Target<'_>, now: &str) -> Option<Written> {
        let object = self.get(t).ok()?;
        let generation = object
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)?;
        let observed = object
            .pointer("/status/observedGeneration")
            .and_then(Value::as_i64);
        if observed == Some(generation) || object.pointer("/metadata/deletionTimestamp").is_some() {
            return None;
        }
        let replicas = object
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let status = match t.resource.resource.as_str() {
            "daemonsets" => {
                let nodes = self.objects.get("/v1/nodes").map_or(0, BTreeMap::len);
                json!({
                    "observedGeneration": generation,
                    "desiredNumberScheduled": nodes,
                    "currentNumberScheduled": nodes,
                    "updatedNumberScheduled": nodes,
                    "numberReady": nodes,
                    "numberAvailable": nodes,
                    "numberMisscheduled": 0,
                })
            }
            "statefulsets" => json!({
                "observedGeneration": generation,
                "replicas": replicas,
                "readyReplicas": replicas,
                "availableReplicas": replicas,
                "currentReplicas": replicas,
                "updatedReplicas": replicas,
                "currentRevision": format!("{}-{generation}", t.name),
                "updateRevision": format!("{}-{generation}", t.name),
            }),
            _ => {
                let mut s = json!({
                    "observedGeneration": generation,
                    "replicas": replicas,
                    "readyReplicas": replicas,
                    "availableReplicas": replicas,
                    "updatedReplicas": replicas,
                    "fullyLabeledReplicas": replicas,
                });
                if t.resource.resource == "deployments" {
                    let condition = |kind: &str, reason: &str| json!({"type": kind, "status": "True", "reason": reason, "lastUpdateTime": now, "lastTransitionTime": now});
                    s["conditions"] = json!([
                        condition("Available", "MinimumReplicasAvailable"),
                        condition("Progressing", "NewReplicaSetAvailable"),
                    ]);
                }
                s
            }
        };
        let mut new = (*object).clone();
        new["status"] = status;
        Some(self.commit(t, Some(object), new))
    }
}

fn applier<'a>(t: &'a Target<'a>, who: &'a Writer<'a>) -> Applier<'a> {
    Applier {
        manager: who.manager,
        force: who.force,
        scope: match t.subresource {
            Some("status") => Scope::Status,
            _ => Scope::Main {
                status_subresource: t.resource.status,
            },
        },
        subresource: t.subresource,
        api_version: static_api_version(t.resource),
        now: who.now,
    }
}

/// The resource's apiVersion for managedFields (leaked once per distinct value: there are few).
fn static_api_version(t: &ResourceType) -> &'static str {
    static CACHE: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let wanted = t.api_version();
    let mut cache = CACHE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(found) = cache.iter().find(|v| **v == wanted) {
        return found;
    }
    let leaked: &'static str = Box::leak(wanted.into_boxed_str());
    cache.push(leaked);
    leaked
}

fn ns_of(t: &Target<'_>) -> String {
    match t.resource.namespaced {
        true => t.namespace.unwrap_or_default().to_owned(),
        false => String::new(),
    }
}

fn resource_version(object: &Value) -> Option<&str> {
    object
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
}

/// A write naming a resourceVersion must name the stored one.
fn check_version(t: &Target<'_>, old: &Value, body: &Value) -> Result<()> {
    match resource_version(body) {
        Some(v) if !v.is_empty() && Some(v) != resource_version(old) => Err(ApiError::stale(
            t.resource,
            t.name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )),
        _ => Ok(()),
    }
}

pub(crate) fn metadata_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object["metadata"].is_object() {
        object["metadata"] = json!({});
    }
    object["metadata"]
        .as_object_mut()
        .expect("just made an object")
}

/// `body` as written through `t`, with what that write may not change taken from `old`:
/// identity and server-set metadata always; status through the main resource of a kind with
/// a status subresource; everything but status through `/status`.
fn keep_server_fields(t: &Target<'_>, old: &Value, body: Value) -> Value {
    let mut new = match t.subresource {
        Some("status") => {
            let mut new = old.clone();
            match body.get("status") {
                Some(s) => new["status"] = s.clone(),
                None => {
                    new.as_object_mut().expect("an object").remove("status");
                }
            }
            // managedFields as the write computed them.
            if let Some(m) = body.pointer("/metadata/managedFields") {
                metadata_mut(&mut new).insert("managedFields".into(), m.clone());
            }
            return new;
        }
        _ => body,
    };
    if t.resource.status {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                new.as_object_mut().expect("an object").remove("status");
            }
        }
    }
    new["apiVersion"] = old["apiVersion"].clone();
    new["kind"] = old["kind"].clone();
    let meta = metadata_mut(&mut new);
    for server_set in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "generation",
        "deletionTimestamp",
        "resourceVersion",
    ] {
        match old.pointer(&format!("/metadata/{server_set}")) {
            Some(v) => meta.insert(server_set.into(), v.clone()),
            None => meta.remove(server_set),
        };
    }
    new
}

/// The two versions differ in nothing but managedFields' timestamps (compared in place: no
/// copy of either).
fn same(old: &Value, new: &Value) -> bool {
    let (Some(a), Some(b)) = (old.as_object(), new.as_object()) else {
        return old == new;
    };
    if a.len() != b.len() {
        return false;
    }
    a.iter().all(|(k, v)| match (k.as_str(), b.get(k)) {
        ("metadata", Some(w)) => same_metadata(v, w),
        (_, Some(w)) => v == w,
        (_, None) => false,
    })
}

fn same_metadata(old: &Value, new: &Value) -> bool {
    let (Some(a), Some(b)) = (old.as_object(), new.as_object()) else {
        return old == new;
    };
    if a.len() != b.len() {
        return false;
    }
    a.iter().all(|(k, v)| match (k.as_str(), b.get(k)) {
        ("managedFields", Some(w)) => same_entries(v, w),
        (_, Some(w)) => v == w,
        (_, None) => false,
    })
}

fn same_entries(old: &Value, new: &Value) -> bool {
    let (Some(a), Some(b)) = (old.as_array(), new.as_array()) else {
        return old == new;
    };
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            let (Some(x), Some(y)) = (x.as_object(), y.as_object()) else {
                return x == y;
            };
            x.len() == y.len() && x.iter().all(|(k, v)| k == "time" || y.get(k) == Some(v))
        })
}

/// Anything outside metadata and status changed: the generation moves.
fn spec_changed(old: &Value, new: &Value) -> bool {
    let outside = |v: &Value| -> BTreeMap<String, Value> {
        v.as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| !matches!(k.as_str(), "metadata" | "status"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    outside(old) != outside(new)
}

fn encode_continue(k: &(String, String)) -> String {
    format!("{}/{}", k.0, k.1)
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(token: &str) -> Option<(String, String)> {
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect();
    let text = String::from_utf8(bytes?).ok()?;
    let (ns, name) = text.split_once('/')?;
    Some((ns.to_owned(), name.to_owned()))
}

#[cfg(test)]
mod tests;
