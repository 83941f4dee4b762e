//! The one way meridian writes into a Kubernetes cluster.
//!
//! ```text
//!  producer (writeback, propagation; the pull agent next)
//!     │ ObjectId + body (serde_json::Value), labelled with `label_managed`
//!     ├─ Written::unchanged? ──yes──► nothing is sent
//!     ▼
//!  Applier (one per member client)
//!     ├─ discovery cache: (apiVersion, kind) → (ApiResource, namespaced), asked once per kind
//!     ├─ Leadership::may_write()? ──no──► Error::NotLeader, no request
//!     └─ PATCH application/apply-patch+yaml ?fieldManager=meridian[&force=true]
//!           └─► the object the API returned (uid, resourceVersion, defaulted fields)
//! ```
//!
//! Why one path: whatever meridian writes — MCS objects, propagated templates of any kind,
//! status — must carry the same ownership (field manager `meridian`, the
//! `app.kubernetes.io/managed-by=meridian` label), be skipped when unchanged and be refused the
//! moment this replica stops leading. A producer says *what* it wants written; it never picks a
//! second way to write.
//!
//! - **Dynamic objects.** Bodies are JSON values and kinds are resolved by discovery, so a
//!   Deployment, a ConfigMap or a CRD nobody compiled in go through the same code as a Service.
//!   The discovery answer is cached per applier: a kind costs one discovery request per
//!   connection, not one per write. An unknown kind is not cached, so a CRD installed later is
//!   found on the next use.
//! - **Leadership before every request.** Each request is a write of its own: a leader frozen
//!   during one request must not send the next after it wakes up past its renew deadline, so the
//!   check sits in front of each request, not of each pass.
//! - **Fingerprints.** [`Written`] remembers a hash of each body the applier last sent into a
//!   member; a producer skips what is unchanged (the write-back re-sends everything when it
//!   resyncs; propagation relies on its watches to see drift).
//! - **Errors keep the API's word.** A refusal is [`Error::Api`] with the status code, reason
//!   and message the API server gave, so a 422's message can reach a condition or a problem.

use std::collections::BTreeMap;
use std::collections::hash_map::DefaultHasher;
use std::fmt;
use std::hash::{Hash, Hasher};

use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{GroupVersion, GroupVersionKind};
use kube::discovery::{self, ApiResource, Scope};
use kube::{Api, Client};
use meridian_core::ClusterId;
use parking_lot::Mutex;
use serde_json::{Map, Value};

use super::MANAGED_BY;
use super::leader::Leadership;

/// The field manager of every write: what meridian owns in an object is what it applied.
pub const FIELD_MANAGER: &str = "meridian";
/// Objects per page when listing: a member may hold thousands of derived slices.
const LIST_PAGE: u32 = 500;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which object: the apiVersion and kind say which API, namespace and name which object in it.
/// A cluster-scoped object has no namespace.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectId {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectId {
    pub fn new(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Self {
        Self {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
        }
    }

    /// The id a manifest names in its `apiVersion`, `kind` and `metadata`; None without
    /// apiVersion, kind or name.
    pub fn of(body: &Value) -> Option<Self> {
        let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_string);
        Some(Self {
            api_version: text(&body["apiVersion"])?,
            kind: text(&body["kind"])?,
            namespace: text(&body["metadata"]["namespace"]),
            name: text(&body["metadata"]["name"])?,
        })
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{}/{}/{}", self.kind, ns, self.name),
            None => write!(f, "{}/{}", self.kind, self.name),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "not this cluster's writer now (leadership or the member's shard lapsed): nothing was sent"
    )]
    NotLeader,
    #[error("the API server serves no kind {kind} in {api_version}")]
    UnknownKind { api_version: String, kind: String },
    #[error("discovery of {kind} in {api_version} failed")]
    Discovery {
        api_version: String,
        kind: String,
        #[source]
        source: kube::Error,
    },
    #[error("{kind} is namespaced: {id} needs a namespace")]
    NamespaceRequired { kind: String, id: Box<ObjectId> },
    /// The API server answered and refused; `message` is its own explanation.
    #[error("{id}: {code} {reason}: {message}")]
    Api {
        // Boxed, as in `Request`: errors travel in every `Result` the applier returns, and an
        // id is four strings.
        id: Box<ObjectId>,
        code: u16,
        reason: String,
        message: String,
    },
    /// The request got no answer from the API (transport, timeout, an undecodable reply).
    #[error("{id}: request failed")]
    Request {
        id: Box<ObjectId>,
        #[source]
        source: kube::Error,
    },
    #[error("listing {kind} in {api_version} failed")]
    List {
        api_version: String,
        kind: String,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// The HTTP status the API server answered with, if it answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            Error::Api { code, .. } => Some(*code),
            Error::Discovery { source, .. } | Error::List { source, .. } => match source {
                kube::Error::Api(s) => Some(s.code),
                _ => None,
            },
            _ => None,
        }
    }

    pub fn is_conflict(&self) -> bool {
        self.code() == Some(409)
    }

    pub fn is_forbidden(&self) -> bool {
        self.code() == Some(403)
    }

    pub fn is_invalid(&self) -> bool {
        self.code() == Some(422)
    }

    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }

    /// No answer from the API at all (as opposed to a refusal).
    pub fn is_transport(&self) -> bool {
        matches!(
            self,
            Error::Request { .. } | Error::Discovery { .. } | Error::List { .. }
        ) && self.code().is_none()
    }

    fn from_kube(id: &ObjectId, e: kube::Error) -> Self {
        match e {
            kube::Error::Api(status) => Error::Api {
                id: Box::new(id.clone()),
                code: status.code,
                reason: status.reason,
                message: status.message,
            },
            source => Error::Request {
                id: Box::new(id.clone()),
                source,
            },
        }
    }
}

/// How to apply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyOptions {
    /// Take fields over from other managers instead of failing with 409: meridian is the
    /// source of truth for what it writes.
    pub force: bool,
    /// The field manager to apply as; meridian's own ([`FIELD_MANAGER`]) when None.
    pub manager: Option<&'static str>,
}

impl ApplyOptions {
    pub fn force() -> Self {
        Self {
            force: true,
            manager: None,
        }
    }

    /// An apply as another field manager, without force.
    pub fn as_manager(manager: &'static str) -> Self {
        Self {
            force: false,
            manager: Some(manager),
        }
    }
}

/// What discovery said about one kind.
#[derive(Clone, Debug)]
struct Kind {
    resource: ApiResource,
    namespaced: bool,
}

/// Writes into one cluster through one client. Keep it as long as the client: its discovery
/// cache is what saves a request per kind.
pub struct Applier {
    client: Client,
    /// Writes go here: a fenced writer client (`fence::writer`) when one was given, `client`
    /// otherwise.
    writer: Option<Client>,
    /// Asked before every request, never once per pass.
    leadership: Leadership,
    /// For logs: which member this applier writes into.
    cluster: ClusterId,
    /// (apiVersion, kind) → what discovery said; only found kinds, so a CRD installed later is
    /// found on its next use.
    kinds: Mutex<BTreeMap<(String, String), Kind>>,
}

impl fmt::Debug for Applier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Applier")
            .field("cluster", &self.cluster)
            .field("kinds", &self.kinds.lock().len())
            .finish_non_exhaustive()
    }
}

impl Applier {
    pub fn new(client: Client, leadership: Leadership, cluster: ClusterId) -> Self {
        Self {
            client,
            writer: None,
            leadership,
            cluster,
            kinds: Mutex::default(),
        }
    }

    /// Writes through the cluster's fenced writer client (`fence`) from now on; through its
    /// own client still when that cannot be made (said in the log).
    pub fn fenced_by(mut self, writer: &super::connect::Writer) -> Self {
        match writer.client(&self.leadership) {
            Ok(client) => self.writer = Some(client),
            Err(e) => {
                tracing::warn!(cluster = %self.cluster, error = %e, "cannot make the fenced writer client: writing through the reader's")
            }
        }
        self
    }

    /// A failed write, as a replica that no longer leads reports it: a write its fenced
    /// connection refused (or that failed for any reason) once leadership lapsed is NotLeader.
    fn write_error(&self, id: &ObjectId, e: kube::Error) -> Error {
        if self.leadership.may_write() {
            Error::from_kube(id, e)
        } else {
            Error::NotLeader
        }
    }

    pub fn cluster(&self) -> &ClusterId {
        &self.cluster
    }

    /// Server-side apply of `body` as `id`; returns the object as the API stored it.
    pub async fn apply(
        &self,
        id: &ObjectId,
        body: &Value,
        opts: ApplyOptions,
    ) -> Result<DynamicObject> {
        self.server_side_apply(id, body, opts, false).await
    }

    /// Server-side apply of `body` to the status subresource of `id`.
    pub async fn apply_status(
        &self,
        id: &ObjectId,
        body: &Value,
        opts: ApplyOptions,
    ) -> Result<DynamicObject> {
        self.server_side_apply(id, body, opts, true).await
    }

    async fn server_side_apply(
        &self,
        id: &ObjectId,
        body: &Value,
        opts: ApplyOptions,
        status: bool,
    ) -> Result<DynamicObject> {
        let api = self.write_api(id).await?;
        let (params, patch) = (params(opts), Patch::Apply(body));
        let stored = if status {
            api.patch_status(&id.name, &params, &patch).await
        } else {
            api.patch(&id.name, &params, &patch).await
        };
        stored.map_err(|e| self.write_error(id, e))
    }

    /// Creates `body` as `id` unless an object of that name exists (None then): unlike an
    /// apply, it never takes over what is there.
    pub async fn create(&self, id: &ObjectId, body: &Value) -> Result<Option<DynamicObject>> {
        let api = self.write_api(id).await?;
        let object: DynamicObject =
            serde_json::from_value(body.clone()).map_err(|e| Error::Api {
                id: Box::new(id.clone()),
                code: 400,
                reason: "BadRequest".into(),
                message: format!("not an object: {e}"),
            })?;
        match api.create(&kube::api::PostParams::default(), &object).await {
            Ok(o) => Ok(Some(o)),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
            Err(e) => Err(self.write_error(id, e)),
        }
    }

    /// Whether any object of a kind is in `namespace` (one item listed, metadata only).
    pub async fn any_in(&self, api_version: &str, kind: &str, namespace: &str) -> Result<bool> {
        let k = self.kind(api_version, kind).await?;
        let api =
            Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, &k.resource);
        let page = api
            .list_metadata(&ListParams::default().limit(1))
            .await
            .map_err(|source| Error::List {
                api_version: api_version.to_string(),
                kind: kind.to_string(),
                source,
            })?;
        Ok(!page.items.is_empty())
    }

    /// A JSON merge patch of `id` (to drop meridian's labels from a copy it lets go).
    pub async fn merge_patch(&self, id: &ObjectId, patch: &Value) -> Result<DynamicObject> {
        let api = self.write_api(id).await?;
        api.patch(&id.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| self.write_error(id, e))
    }

    /// A JSON merge patch of `id`'s status subresource (a status meridian owns whole).
    pub async fn merge_patch_status(&self, id: &ObjectId, patch: &Value) -> Result<DynamicObject> {
        let api = self.write_api(id).await?;
        api.patch_status(&id.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| self.write_error(id, e))
    }

    /// What discovery says of a kind: its resource, and whether it is namespaced (to watch
    /// it).
    pub async fn resource(&self, api_version: &str, kind: &str) -> Result<(ApiResource, bool)> {
        let k = self.kind(api_version, kind).await?;
        Ok((k.resource, k.namespaced))
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The object as it is now; None when there is none. Reading needs no leadership.
    pub async fn get(&self, id: &ObjectId) -> Result<Option<DynamicObject>> {
        let api = self.object_api(id).await?;
        api.get_opt(&id.name)
            .await
            .map_err(|e| Error::from_kube(id, e))
    }

    /// Deletes `id`; an object already gone is deleted. Dependents (owner references) are left
    /// to the garbage collector in the background.
    pub async fn delete(&self, id: &ObjectId) -> Result<()> {
        let api = self.write_api(id).await?;
        match api.delete(&id.name, &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.write_error(id, e)),
        }
    }

    /// The ids of every object of a kind matching `label_selector`, in every namespace, read
    /// as metadata only; sorted.
    pub async fn list_managed(
        &self,
        api_version: &str,
        kind: &str,
        label_selector: &str,
    ) -> Result<Vec<ObjectId>> {
        let listed = self
            .list_versions(api_version, kind, label_selector)
            .await?;
        Ok(listed.into_iter().map(|(id, _)| id).collect())
    }

    /// `list_managed` with each object's resourceVersion.
    pub async fn list_versions(
        &self,
        api_version: &str,
        kind: &str,
        label_selector: &str,
    ) -> Result<Vec<(ObjectId, Option<String>)>> {
        let namespaced = self.kind(api_version, kind).await?.namespaced;
        let listed = self
            .paged(api_version, kind, label_selector, |api, lp| async move {
                api.list_metadata(&lp).await
            })
            .await?;
        let mut out: Vec<_> = listed
            .into_iter()
            .filter_map(|o| {
                let id = ObjectId {
                    api_version: api_version.to_string(),
                    kind: kind.to_string(),
                    namespace: o.metadata.namespace.filter(|_| namespaced),
                    name: o.metadata.name?,
                };
                Some((id, o.metadata.resource_version))
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// Every object of a kind matching `label_selector`, in every namespace, whole.
    pub async fn list_objects(
        &self,
        api_version: &str,
        kind: &str,
        label_selector: &str,
    ) -> Result<Vec<DynamicObject>> {
        self.paged(api_version, kind, label_selector, |api, lp| async move {
            api.list(&lp).await
        })
        .await
    }

    /// Every item of a kind matching `label_selector`, in every namespace, a page
    /// ([`LIST_PAGE`]) per request of `page`.
    async fn paged<T, F, Fut>(
        &self,
        api_version: &str,
        kind: &str,
        label_selector: &str,
        page: F,
    ) -> Result<Vec<T>>
    where
        T: Clone,
        F: Fn(Api<DynamicObject>, ListParams) -> Fut,
        Fut: std::future::Future<Output = kube::Result<kube::core::ObjectList<T>>>,
    {
        let k = self.kind(api_version, kind).await?;
        let api = Api::<DynamicObject>::all_with(self.client.clone(), &k.resource);
        let mut lp = ListParams::default()
            .labels(label_selector)
            .limit(LIST_PAGE);
        let mut out = Vec::new();
        loop {
            let listed = page(api.clone(), lp.clone())
                .await
                .map_err(|source| Error::List {
                    api_version: api_version.to_string(),
                    kind: kind.to_string(),
                    source,
                })?;
            out.extend(listed.items);
            match listed.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => lp = lp.continue_token(&token),
                None => break,
            }
        }
        Ok(out)
    }

    fn leading(&self) -> Result<()> {
        if self.leadership.may_write() {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }

    /// An Api to write `id` with, asked for only while leading. Discovery may take a while, so
    /// leadership is asked again once the kind is known, right before the write goes out; a
    /// replica that does not lead sends no write, not even discovery for one (reads — get,
    /// list, a watch's discovery — need no leadership).
    async fn write_api(&self, id: &ObjectId) -> Result<Api<DynamicObject>> {
        self.leading()?;
        let writer = self.writer.as_ref().unwrap_or(&self.client);
        let api = self.api_with(writer, id).await?;
        self.leading()?;
        Ok(api)
    }

    /// An Api for `id`'s kind, scoped to its namespace when the kind is namespaced.
    async fn object_api(&self, id: &ObjectId) -> Result<Api<DynamicObject>> {
        self.api_with(&self.client, id).await
    }

    async fn api_with(&self, client: &Client, id: &ObjectId) -> Result<Api<DynamicObject>> {
        let k = self.kind(&id.api_version, &id.kind).await?;
        let client = client.clone();
        // A cluster-scoped object has no namespace: one given anyway is ignored, as kubectl
        // does.
        match (k.namespaced, &id.namespace) {
            (true, Some(ns)) => Ok(Api::namespaced_with(client, ns, &k.resource)),
            (true, None) => Err(Error::NamespaceRequired {
                kind: id.kind.clone(),
                id: Box::new(id.clone()),
            }),
            (false, _) => Ok(Api::all_with(client, &k.resource)),
        }
    }

    async fn kind(&self, api_version: &str, kind: &str) -> Result<Kind> {
        let key = (api_version.to_string(), kind.to_string());
        if let Some(k) = self.kinds.lock().get(&key) {
            return Ok(k.clone());
        }
        let unknown = || Error::UnknownKind {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
        };
        let gv: GroupVersion = api_version.parse().map_err(|_| unknown())?;
        let gvk: GroupVersionKind = gv.with_kind(kind);
        let (resource, caps) = match discovery::pinned_kind(&self.client, &gvk).await {
            Ok(found) => found,
            // The group version is not served at all, or is served without this kind.
            Err(kube::Error::Api(s)) if s.code == 404 => return Err(unknown()),
            Err(kube::Error::Discovery(kube::error::DiscoveryError::MissingKind(_))) => {
                return Err(unknown());
            }
            Err(source) => {
                return Err(Error::Discovery {
                    api_version: api_version.to_string(),
                    kind: kind.to_string(),
                    source,
                });
            }
        };
        let k = Kind {
            resource,
            namespaced: caps.scope == Scope::Namespaced,
        };
        self.kinds.lock().insert(key, k.clone());
        Ok(k)
    }
}

fn params(opts: ApplyOptions) -> PatchParams {
    let params = PatchParams::apply(opts.manager.unwrap_or(FIELD_MANAGER));
    if opts.force { params.force() } else { params }
}

/// What an applier last wrote into one cluster: a fingerprint of each body sent, so that what
/// is unchanged is not sent again, and where the caller recorded it, the resourceVersion the
/// write left, so that a later listing tells which objects someone else changed since.
#[derive(Clone, Debug, Default)]
pub struct Written {
    prints: BTreeMap<ObjectId, Print>,
}

#[derive(Clone, Debug)]
struct Print {
    body: u64,
    version: Option<String>,
}

impl Written {
    /// `body` is what was last recorded for `id`.
    pub fn unchanged(&self, id: &ObjectId, body: &Value) -> bool {
        self.prints.get(id).map(|p| p.body) == Some(fingerprint(body))
    }

    /// `body` was written as `id`.
    pub fn record(&mut self, id: &ObjectId, body: &Value) {
        self.record_at(id, body, None);
    }

    /// `body` was written as `id`, which the write left at resourceVersion `version`.
    pub fn record_at(&mut self, id: &ObjectId, body: &Value, version: Option<String>) {
        let body = fingerprint(body);
        self.prints.insert(id.clone(), Print { body, version });
    }

    /// Whether `id`, listed at resourceVersion `listed`, was changed by someone else since it
    /// was written (unknown when the write's version was not recorded: not drifted).
    pub fn drifted(&self, id: &ObjectId, listed: Option<&str>) -> bool {
        self.prints
            .get(id)
            .and_then(|p| p.version.as_deref())
            .is_some_and(|written| Some(written) != listed)
    }

    pub fn forget(&mut self, id: &ObjectId) {
        self.prints.remove(id);
    }

    /// Forget everything: the next pass writes everything again.
    pub fn clear(&mut self) {
        self.prints.clear();
    }

    pub fn ids(&self) -> impl Iterator<Item = &ObjectId> {
        self.prints.keys()
    }

    pub fn contains(&self, id: &ObjectId) -> bool {
        self.prints.contains_key(id)
    }
}

/// On an object meridian wrote into a member: the fingerprint of the body applied (before
/// this annotation). A term that starts without memory of its writes — a new leader, a new
/// shard owner, a restart — learns from it that the object is already right, and writes
/// nothing for it.
pub const APPLIED_ANNOTATION: &str = "meridian.io/applied";

/// A hash of a JSON value that does not depend on the order of its object keys: serde_json
/// keeps keys sorted today, but its `preserve_order` feature (which any crate in the tree may
/// turn on) would make equal bodies serialise differently.
pub fn fingerprint(body: &Value) -> u64 {
    let mut h = DefaultHasher::new();
    hash_value(body, &mut h);
    h.finish()
}

fn hash_value(v: &Value, h: &mut impl Hasher) {
    match v {
        Value::Null => 0u8.hash(h),
        Value::Bool(b) => (1u8, b).hash(h),
        // Display keeps 1 and 1.0 apart, as the API server does.
        Value::Number(n) => (2u8, n.to_string()).hash(h),
        Value::String(s) => (3u8, s).hash(h),
        Value::Array(items) => {
            (4u8, items.len()).hash(h);
            for item in items {
                hash_value(item, h);
            }
        }
        Value::Object(map) => {
            (5u8, map.len()).hash(h);
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by_key(|(k, _)| *k);
            for (k, v) in entries {
                k.hash(h);
                hash_value(v, h);
            }
        }
    }
}

/// Puts `app.kubernetes.io/managed-by=meridian` and `extra` into `metadata.labels`: meridian
/// only ever deletes what carries its label. A body that is not an object, or whose metadata
/// or labels are not objects, is left alone (the API server will refuse it).
pub fn label_managed(body: &mut Value, extra: &[(&str, &str)]) {
    let Some(labels) = body
        .as_object_mut()
        .and_then(|o| child_object(o, "metadata"))
        .and_then(|m| child_object(m, "labels"))
    else {
        return;
    };
    for (k, v) in std::iter::once(&MANAGED_BY).chain(extra) {
        labels.insert((*k).to_string(), Value::String((*v).to_string()));
    }
}

/// The object under `key`, made when it is missing or null.
fn child_object<'a>(
    map: &'a mut Map<String, Value>,
    key: &str,
) -> Option<&'a mut Map<String, Value>> {
    let child = map.entry(key).or_insert(Value::Null);
    if child.is_null() {
        *child = Value::Object(Map::new());
    }
    child.as_object_mut()
}

#[cfg(test)]
mod tests;
