//! An API server in the test process, as kube-rs tests its own client: a `tower_test` mock
//! service behind a real `kube::Client`. It answers discovery as a kube-apiserver does for a
//! fixed set of kinds, records every request, and lets each test script the other replies.

use std::collections::BTreeMap;
use std::sync::Arc;

use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use parking_lot::Mutex;
use serde_json::{Value, json};

use super::AbortOnDrop;

/// One request the server received.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) method: String,
    pub(crate) path: String,
    /// Query parameters, decoded.
    pub(crate) query: BTreeMap<String, String>,
    pub(crate) content_type: Option<String>,
    /// The JSON body; Null when there was none.
    pub(crate) body: Value,
}

impl Seen {
    pub(crate) fn is_discovery(&self) -> bool {
        self.method == "GET" && discovery(&self.path).is_some()
    }

    pub(crate) fn param(&self, name: &str) -> Option<&str> {
        self.query.get(name).map(String::as_str)
    }
}

/// A status code and a JSON body.
pub(crate) type Reply = (u16, Value);

/// A Status as the API server sends it with a refusal.
pub(crate) fn status(code: u16, reason: &str, message: &str) -> Reply {
    (
        code,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code,
        }),
    )
}

pub(crate) struct ApiServer {
    seen: Arc<Mutex<Vec<Seen>>>,
    _task: AbortOnDrop<()>,
}

impl ApiServer {
    /// Starts a server answering discovery itself and every other request with `respond`, or,
    /// where it says None, as an empty cluster would (see [`default_reply`]).
    pub(crate) fn start(
        mut respond: impl FnMut(&Seen) -> Option<Reply> + Send + 'static,
    ) -> (Client, ApiServer) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let task = tokio::spawn(async move {
            let mut handle = std::pin::pin!(handle);
            while let Some((request, send)) = handle.next_request().await {
                let (parts, body) = request.into_parts();
                let bytes = body.collect_bytes().await.unwrap_or_default();
                let request = Seen {
                    method: parts.method.to_string(),
                    path: parts.uri.path().to_string(),
                    query: parts.uri.query().map(parse_query).unwrap_or_default(),
                    content_type: parts
                        .headers
                        .get(http::header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string),
                    body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                };
                let (code, reply) = match discovery(&request.path) {
                    Some(reply) if request.method == "GET" => reply,
                    _ => respond(&request).unwrap_or_else(|| default_reply(&request)),
                };
                // Recorded before the reply goes out: a test reading the log after its call
                // returned sees every request the call made.
                log.lock().push(request);
                // A string is sent as text (what /readyz answers), anything else as JSON.
                let (content_type, body) = match reply {
                    Value::String(text) => ("text/plain", text.into_bytes()),
                    json => (
                        "application/json",
                        serde_json::to_vec(&json).unwrap_or_default(),
                    ),
                };
                let response = Response::builder()
                    .status(code)
                    .header(http::header::CONTENT_TYPE, content_type)
                    .body(Body::from(body))
                    .unwrap_or_else(|_| Response::new(Body::from(Vec::new())));
                send.send_response(response);
            }
        });
        let client = Client::new(service, "default");
        (
            client,
            ApiServer {
                seen,
                _task: AbortOnDrop(task),
            },
        )
    }

    /// [`ApiServer::start`] with a cluster that keeps what is written in `store` (see
    /// [`Store`]); `respond` still answers first where it says Some.
    pub(crate) fn stateful(
        store: Arc<Mutex<Store>>,
        mut respond: impl FnMut(&Seen) -> Option<Reply> + Send + 'static,
    ) -> (Client, ApiServer) {
        Self::start(move |r| {
            Some(match respond(r) {
                Some((code, object)) if r.method == "PATCH" && code < 300 => {
                    (code, store.lock().apply(r, object))
                }
                Some(reply) => reply,
                None => store.lock().reply(r),
            })
        })
    }

    /// Every request so far, discovery included.
    pub(crate) fn requests(&self) -> Vec<Seen> {
        self.seen.lock().clone()
    }

    /// Every request so far but discovery.
    pub(crate) fn calls(&self) -> Vec<Seen> {
        self.requests()
            .into_iter()
            .filter(|r| !r.is_discovery())
            .collect()
    }

    /// Every PATCH so far.
    pub(crate) fn patches(&self) -> Vec<Seen> {
        self.calls()
            .into_iter()
            .filter(|r| r.method == "PATCH")
            .collect()
    }
}

/// A cluster that keeps what is written: an apply stores the object (a status apply merges its
/// status) at a new resourceVersion, a delete removes it, a get finds it, a list in every
/// namespace returns what is stored of its kind (whole: a metadata-only list reads the
/// metadata of each).
/// Objects are kept by path (`/api/v1/namespaces/shop/services/x`).
#[derive(Default)]
pub(crate) struct Store {
    objects: BTreeMap<String, Value>,
    version: u64,
}

impl Store {
    /// A store holding `objects` (by path), each at a resourceVersion of its own.
    pub(crate) fn with(objects: impl IntoIterator<Item = (String, Value)>) -> Self {
        let mut store = Store::default();
        for (path, object) in objects {
            store.put(&path, object);
        }
        store
    }

    /// The stored object at `path`, if any.
    pub(crate) fn get(&self, path: &str) -> Option<&Value> {
        self.objects.get(path)
    }

    /// Changes the object at `path` as someone else would (a new resourceVersion).
    pub(crate) fn touch(&mut self, path: &str, edit: impl FnOnce(&mut Value)) {
        self.version += 1;
        if let Some(object) = self.objects.get_mut(path) {
            edit(object);
            object["metadata"]["resourceVersion"] = json!(self.version.to_string());
        }
    }

    /// Stores `object` at `path` as someone else would create it.
    pub(crate) fn put(&mut self, path: &str, mut object: Value) {
        self.version += 1;
        object["metadata"]["resourceVersion"] = json!(self.version.to_string());
        self.objects.insert(path.to_string(), object);
    }

    pub(crate) fn remove(&mut self, path: &str) {
        self.objects.remove(path);
    }

    /// Keeps what an apply of `r` left: `object` (a status apply changes only the status).
    fn apply(&mut self, r: &Seen, mut object: Value) -> Value {
        let (path, status_only) = match r.path.strip_suffix("/status") {
            Some(path) => (path.to_string(), true),
            None => (r.path.clone(), false),
        };
        if status_only && let Some(stored) = self.objects.get(&path) {
            let status = object["status"].take();
            object = stored.clone();
            object["status"] = status;
        }
        if let Some((_, rest)) = path.split_once("/namespaces/") {
            object["metadata"]["namespace"] = json!(rest.split('/').next());
        }
        self.version += 1;
        object["metadata"]["resourceVersion"] = json!(self.version.to_string());
        self.objects.insert(path, object.clone());
        object
    }

    fn reply(&mut self, r: &Seen) -> Reply {
        match r.method.as_str() {
            "PATCH" => (200, self.apply(r, default_reply(r).1)),
            "DELETE" => {
                self.objects.remove(&r.path);
                default_reply(r)
            }
            "GET" => match self.objects.get(&r.path) {
                Some(object) => (200, object.clone()),
                None if is_list(r) => (200, self.list(&r.path)),
                None => default_reply(r),
            },
            _ => default_reply(r),
        }
    }

    /// `/api/v1/services` lists `/api/v1/namespaces/*/services/*`.
    fn list(&self, collection: &str) -> Value {
        let (group, plural) = collection.rsplit_once('/').unwrap_or_default();
        let items: Vec<Value> = (self.objects.iter())
            .filter(|(path, _)| {
                let parts: Vec<&str> = path
                    .strip_prefix(group)
                    .unwrap_or_default()
                    .split('/')
                    .collect();
                matches!(parts.as_slice(), ["", "namespaces", _, p, _] if *p == plural)
            })
            .map(|(_, o)| o.clone())
            .collect();
        json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
               "metadata": {"resourceVersion": self.version.to_string()}, "items": items})
    }
}

fn is_list(r: &Seen) -> bool {
    r.query.contains_key("labelSelector") || r.query.contains_key("limit")
}

/// What an empty cluster answers: an apply is stored as sent (with a uid and a
/// resourceVersion), a delete succeeds, a list is empty, a get finds nothing.
pub(crate) fn default_reply(r: &Seen) -> Reply {
    match r.method.as_str() {
        "PATCH" => {
            let mut object = r.body.clone();
            let name = r.path.trim_end_matches("/status").rsplit('/').next();
            object["metadata"]["name"] = json!(name);
            object["metadata"]["uid"] = json!(format!("uid-{}", name.unwrap_or_default()));
            object["metadata"]["resourceVersion"] = json!("1");
            (200, object)
        }
        "DELETE" => (
            200,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 200}),
        ),
        "GET" if is_list(r) => (
            200,
            json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": "1"}, "items": []}),
        ),
        _ => status(404, "NotFound", "not found"),
    }
}

/// The discovery documents of the kinds this server serves; a group version it does not
/// serve is a 404, as from a kube-apiserver.
fn discovery(path: &str) -> Option<Reply> {
    // (name, kind, namespaced, subresources)
    let resources: &[(&str, &str, bool, &[&str])] = match path {
        "/api/v1" => &[
            ("services", "Service", true, &["status"]),
            ("configmaps", "ConfigMap", true, &[]),
            ("namespaces", "Namespace", false, &["status"]),
            ("pods", "Pod", true, &["status"]),
            (
                "persistentvolumeclaims",
                "PersistentVolumeClaim",
                true,
                &["status"],
            ),
        ],
        "/apis/apps/v1" => &[("deployments", "Deployment", true, &["status", "scale"])],
        "/apis/discovery.k8s.io/v1" => &[("endpointslices", "EndpointSlice", true, &[])],
        "/apis/multicluster.x-k8s.io/v1alpha1" => &[
            ("serviceimports", "ServiceImport", true, &["status"]),
            ("serviceexports", "ServiceExport", true, &["status"]),
        ],
        "/apis/rbac.authorization.k8s.io/v1" => &[("clusterroles", "ClusterRole", false, &[])],
        "/apis/meridian.io/v1alpha1" => &[("memberclusters", "MemberCluster", false, &["status"])],
        _ => {
            let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
            return match parts.as_slice() {
                ["api", _] | ["apis", _, _] => Some(status(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                )),
                _ => None,
            };
        }
    };
    let group_version = path
        .trim_start_matches("/apis/")
        .trim_start_matches("/api/");
    let verbs = json!([
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch"
    ]);
    let mut list = Vec::new();
    for (name, kind, namespaced, subresources) in resources {
        list.push(json!({
            "name": name, "singularName": kind.to_lowercase(), "namespaced": namespaced,
            "kind": kind, "verbs": verbs,
        }));
        for sub in *subresources {
            list.push(json!({
                "name": format!("{name}/{sub}"), "singularName": "", "namespaced": namespaced,
                "kind": kind, "verbs": ["get", "patch", "update"],
            }));
        }
    }
    Some((
        200,
        json!({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
            "resources": list,
        }),
    ))
}

fn parse_query(query: &str) -> BTreeMap<String, String> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

/// Percent-decoding of a query component (`+` is a space).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
