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
                let response = Response::builder()
                    .status(code)
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(Body::from(serde_json::to_vec(&reply).unwrap_or_default()))
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
        "GET" if r.query.contains_key("labelSelector") || r.query.contains_key("limit") => (
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
