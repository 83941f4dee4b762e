//! The HTTP shell of one member: a loopback listener, TLS with HTTP/2 or HTTP/1.1 by ALPN (or
//! plain HTTP/1.1) keep-alive connections, the
//! Kubernetes paths routed to the member's `Store`, and watches streamed from its event ring.
//!
//! ```text
//!  accept ──► connection task (ends when the member goes down) ──► handle(request)
//!     /healthz /readyz /livez /version, discovery ──► answered from the registry
//!     GET/LIST/POST/PUT/PATCH/DELETE ──► one call into the Store under the member's lock
//!     WATCH ──► a task: initial events, then the ring after each wake-up, bookmarks,
//!               timeoutSeconds, 410 when its resourceVersion left the window or was expired
//! ```

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioExecutor;
use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::error::ApiError;
use crate::fleet::{Fleet, Member};
use crate::resources::ResourceType;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{self, Filter, PatchKind, Target, Writer};
use crate::time::now_rfc3339;

pub type Body = BoxBody<Bytes, Infallible>;

/// Serves `member` on `listener` until the process ends: while down, the port is closed and
/// every connection dropped; when up again, the same port listens again.
pub async fn serve(fleet: Arc<Fleet>, member: Arc<Member>, listener: TcpListener) {
    let mut listener = Some(listener);
    let mut up = member.up();
    loop {
        let Some(l) = listener.take() else {
            let open = up.wait_for(|u| *u).await.is_ok();
            if !open {
                return;
            }
            match bind(member.port).await {
                Ok(l) => listener = Some(l),
                Err(e) => {
                    warn!(member = %member.name, error = %e, "cannot listen again; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
            continue;
        };
        tokio::select! {
            accepted = l.accept() => {
                match accepted {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        tokio::spawn(connection(fleet.clone(), member.clone(), stream));
                    }
                    Err(e) => {
                        // Out of descriptors, most likely: counted (stats verb "accept-error")
                        // and said at most once a second for the whole process.
                        member.count("accept-error", "");
                        warn_accept(&member.name, &e);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                listener = Some(l);
            }
            () = went_down(&mut up) => {
                // Down: the listener is dropped (the port refuses), connections end themselves.
                drop(l);
            }
        }
    }
}

/// A failed accept, said at most once a second by the whole process.
fn warn_accept(member: &str, e: &std::io::Error) {
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = crate::fleet::unix_ns() / 1_000_000_000;
    if LAST.swap(now, Ordering::Relaxed) != now {
        warn!(member, error = %e, "cannot accept a connection (counted as accept-error)");
    }
}

/// Resolves when the member goes down (never, once the fleet is gone).
async fn went_down(up: &mut tokio::sync::watch::Receiver<bool>) {
    let down = up.wait_for(|u| !*u).await.is_ok();
    if !down {
        std::future::pending::<()>().await;
    }
}

/// A loopback listener on `port` (0: any free port).
pub async fn bind(port: u16) -> std::io::Result<TcpListener> {
    TcpListener::bind(("127.0.0.1", port)).await
}

/// The TLS every member of a process serves: one self-signed certificate for 127.0.0.1,
/// offering HTTP/2 and HTTP/1.1 by ALPN as an API server does.
pub struct Tls {
    acceptor: tokio_rustls::TlsAcceptor,
    /// The certificate, which is its own CA, for kubeconfigs.
    pub ca_pem: String,
}

impl Tls {
    pub fn self_signed() -> Self {
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()])
            .expect("a self-signed certificate for 127.0.0.1");
        let key = rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der())
            .expect("rcgen's key in PKCS#8");
        let mut config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .expect("rcgen's certificate and key match");
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Self {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            ca_pem: cert.cert.pem(),
        }
    }
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

async fn connection(fleet: Arc<Fleet>, member: Arc<Member>, stream: tokio::net::TcpStream) {
    let mut up = member.up();
    let service = {
        let fleet = fleet.clone();
        let member = member.clone();
        service_fn(move |req| handle(fleet.clone(), member.clone(), req))
    };
    let served = async {
        match &fleet.tls {
            Some(tls) => {
                let stream = tls.acceptor.accept(stream).await?;
                auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                    .map_err(std::io::Error::other)
            }
            None => http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await
                .map_err(std::io::Error::other),
        }
    };
    tokio::select! {
        result = served => {
            if let Err(e) = result {
                debug!(member = %member.name, error = %e, "connection ended");
            }
        }
        () = went_down(&mut up) => {}
    }
}

fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(body.into()).boxed())
        .expect("a valid response")
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let body = serde_json::to_vec(value).expect("a Value serializes");
    full(status, "application/json", body)
}

fn error_response(e: &ApiError) -> Response<Body> {
    let status = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(status, &e.to_json())
}

/// The query string, percent-decoded.
fn query(req: &Request<Incoming>) -> HashMap<String, String> {
    req.uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What a resource path names.
#[derive(Debug, Default)]
struct Path {
    group: String,
    version: String,
    namespace: Option<String>,
    resource: String,
    name: Option<String>,
    subresource: Option<String>,
    watch: bool,
}

/// `/api/v1/...` or `/apis/{group}/{version}/...` with at least a resource.
fn parse_path(path: &str) -> Option<Path> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let (watch, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    let (namespace, rest) = match rest {
        ["namespaces", _, "status" | "finalize"] => (None, rest),
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
        _ => (None, rest),
    };
    let (resource, name, subresource) = match rest {
        [r] => (*r, None, None),
        [r, n] => (*r, Some(*n), None),
        [r, n, s] => (*r, Some(*n), Some(*s)),
        _ => return None,
    };
    Some(Path {
        group: group.to_owned(),
        version: version.to_owned(),
        namespace,
        resource: resource.to_owned(),
        name: name.map(str::to_owned),
        subresource: subresource.map(str::to_owned),
        watch,
    })
}

fn authorized(member: &Member, req: &Request<Incoming>) -> bool {
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| t.trim() == member.token)
}

fn accept(req: &Request<Incoming>) -> &str {
    req.headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// The field manager: `fieldManager`, else the user agent's product (as the API server
/// derives it), else `unknown`.
fn manager(req: &Request<Incoming>, q: &HashMap<String, String>) -> String {
    if let Some(m) = q.get("fieldManager").filter(|m| !m.is_empty()) {
        return m.clone();
    }
    req.headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .filter(|s| !s.is_empty())
        .unwrap_or("unknown")
        .to_owned()
}

async fn handle(
    fleet: Arc<Fleet>,
    member: Arc<Member>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_owned();
    debug!(member = %member.name, method = %req.method(), uri = %req.uri(), "request");
    match path.as_str() {
        "/healthz" | "/readyz" | "/livez" => {
            member.count("health", &path[1..]);
            return Ok(full(StatusCode::OK, "text/plain", "ok"));
        }
        "/version" => {
            member.count("discovery", "version");
            return Ok(json_response(StatusCode::OK, &version()));
        }
        _ => {}
    }
    if !authorized(&member, &req) {
        member.count("unauthorized", "");
        return Ok(error_response(&ApiError::unauthorized()));
    }
    if let Some(answer) = discovery(&member, &req, &path) {
        member.count("discovery", &path);
        return Ok(answer);
    }
    let Some(p) = parse_path(&path) else {
        member.count("notfound", &path);
        return Ok(error_response(&ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )));
    };
    let resource = member
        .store
        .lock()
        .registry
        .get(&p.group, &p.version, &p.resource);
    let Some(resource) = resource else {
        member.count("notfound", &path);
        return Ok(error_response(&ApiError::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )));
    };
    Ok(resource_request(&fleet, &member, req, p, resource).await)
}

fn version() -> Value {
    json!({
        "major": "1", "minor": "34", "gitVersion": "v1.34.0-kubesim", "gitCommit": "kubesim",
        "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
        "compiler": "gc", "platform": "linux/amd64",
    })
}

/// Discovery documents; None when `path` is not one.
fn discovery(member: &Member, req: &Request<Incoming>, path: &str) -> Option<Response<Body>> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let aggregated = accept(req).contains("as=APIGroupDiscoveryList")
        && accept(req)
            .split(',')
            .next()
            .is_some_and(|first| first.contains("apidiscovery"));
    let store = member.store.lock();
    let registry = &store.registry;
    let answer = match segments.as_slice() {
        ["api"] if aggregated => registry.aggregated(true),
        ["apis"] if aggregated => registry.aggregated(false),
        ["api"] => registry.core_versions(&format!("127.0.0.1:{}", member.port)),
        ["apis"] => registry.group_list(),
        ["api", "v1"] => registry.resource_list("", "v1")?,
        ["apis", group] => registry.group(group)?,
        ["apis", group, version] => registry.resource_list(group, version)?,
        _ => return None,
    };
    if aggregated && matches!(segments.as_slice(), ["api"] | ["apis"]) {
        let body = serde_json::to_vec(&answer).expect("a Value serializes");
        return Some(full(
            StatusCode::OK,
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            body,
        ));
    }
    Some(json_response(StatusCode::OK, &answer))
}

/// `as=PartialObjectMetadata` / `…List`: metadata only.
fn metadata_only(req: &Request<Incoming>) -> bool {
    accept(req).contains("as=PartialObjectMetadata")
}

fn partial(object: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": object["metadata"]})
}

fn filter_of(p: &Path, q: &HashMap<String, String>) -> Result<Filter, ApiError> {
    let bad = |e: crate::selector::SelectorError| ApiError::bad_request(e.to_string());
    Ok(Filter {
        namespace: p.namespace.clone(),
        labels: LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))
            .map_err(bad)?,
        fields: FieldSelector::parse(q.get("fieldSelector").map_or("", String::as_str))
            .map_err(bad)?,
    })
}

fn is_true(q: &HashMap<String, String>, key: &str) -> bool {
    q.get(key).is_some_and(|v| v == "true" || v == "1")
}

async fn resource_request(
    fleet: &Arc<Fleet>,
    member: &Arc<Member>,
    req: Request<Incoming>,
    p: Path,
    resource: Arc<ResourceType>,
) -> Response<Body> {
    let q = query(&req);
    let display = resource.display();
    let method = req.method().clone();
    let watching = p.watch || is_true(&q, "watch");
    match (&method, &p.name) {
        (&Method::GET, None) if watching => {
            member.count("watch", &display);
            match filter_of(&p, &q) {
                Ok(filter) => watch(fleet, member, &req, &q, resource, filter),
                Err(e) => error_response(&e),
            }
        }
        (&Method::GET, None) => {
            member.count("list", &display);
            list(member, &req, &q, &p, &resource)
        }
        (&Method::GET, Some(name)) => {
            member.count("get", &display);
            let t = target(&resource, &p, name);
            let got = member.store.lock().get_json(&t);
            match got {
                Ok(o) if p.subresource.as_deref() == Some("scale") => {
                    json_response(StatusCode::OK, &scale_of(&parse(&o)))
                }
                Ok(o) if metadata_only(&req) => json_response(StatusCode::OK, &partial(&parse(&o))),
                Ok(o) => full(StatusCode::OK, "application/json", o),
                Err(e) => error_response(&e),
            }
        }
        (&Method::DELETE, None) => {
            member.count("deletecollection", &display);
            delete_collection(fleet, member, &q, &p, &resource)
        }
        _ => write(fleet, member, req, q, p, resource).await,
    }
}

fn target<'a>(resource: &'a Arc<ResourceType>, p: &'a Path, name: &'a str) -> Target<'a> {
    Target {
        resource,
        namespace: p.namespace.as_deref(),
        name,
        subresource: p.subresource.as_deref(),
    }
}

fn list(
    member: &Member,
    req: &Request<Incoming>,
    q: &HashMap<String, String>,
    p: &Path,
    resource: &ResourceType,
) -> Response<Body> {
    let filter = match filter_of(p, q) {
        Ok(f) => f,
        Err(e) => return error_response(&e),
    };
    let limit = q.get("limit").and_then(|l| l.parse().ok());
    let page = member.store.lock().list(
        resource,
        &filter,
        limit,
        q.get("continue").map(String::as_str),
    );
    let page = match page {
        Ok(p) => p,
        Err(e) => return error_response(&e),
    };
    let mut metadata = json!({"resourceVersion": page.resource_version.to_string()});
    if let Some(c) = &page.continue_ {
        metadata["continue"] = json!(c);
    }
    if metadata_only(req) {
        let items: Vec<Value> = page.items.iter().map(|o| partial(&parse(o))).collect();
        let list = json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
            "metadata": metadata, "items": items});
        return json_response(StatusCode::OK, &list);
    }
    // The stored JSON of each item as it is: no object is parsed or serialized again.
    let head = json!({"apiVersion": resource.api_version(), "kind": format!("{}List", resource.kind),
        "metadata": metadata});
    let mut out = serde_json::to_vec(&head).expect("a Value serializes");
    out.pop(); // the closing brace
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item);
    }
    out.extend_from_slice(b"]}");
    full(StatusCode::OK, "application/json", out)
}

/// Stored JSON, parsed (it was serialized from a Value: it parses).
fn parse(json: &[u8]) -> Value {
    serde_json::from_slice(json).unwrap_or(Value::Null)
}

/// The autoscaling/v1 Scale of a workload.
fn scale_of(object: &Value) -> Value {
    json!({
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {
            "name": object["metadata"]["name"],
            "namespace": object["metadata"]["namespace"],
            "resourceVersion": object["metadata"]["resourceVersion"],
            "uid": object["metadata"]["uid"],
        },
        "spec": {"replicas": object["spec"]["replicas"].as_i64().unwrap_or(1)},
        "status": {"replicas": object["status"]["replicas"].as_i64().unwrap_or(0)},
    })
}

async fn write(
    fleet: &Arc<Fleet>,
    member: &Arc<Member>,
    req: Request<Incoming>,
    q: HashMap<String, String>,
    p: Path,
    resource: Arc<ResourceType>,
) -> Response<Body> {
    let method = req.method().clone();
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_owned();
    let manager = manager(&req, &q);
    let uri = req.uri().to_string();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return error_response(&ApiError::bad_request(format!("cannot read the body: {e}")));
        }
    };
    let now = now_rfc3339();
    let who = Writer {
        manager: &manager,
        force: is_true(&q, "force"),
        now: &now,
    };
    let parse = |b: &Bytes| -> Result<Value, ApiError> {
        serde_json::from_slice(b)
            .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))
    };
    let display = resource.display();
    let (verb, name, result) = match (&method, p.name.as_deref()) {
        (&Method::POST, None) => {
            let name_in_body = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|b| {
                    b.pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .unwrap_or_default();
            let t = target(&resource, &p, &name_in_body);
            let result = parse(&body).and_then(|b| member.store.lock().create(&t, b, &who));
            ("create", name_in_body, result)
        }
        (&Method::PUT, Some(name)) => {
            let t = target(&resource, &p, name);
            let result = match p.subresource.as_deref() {
                Some("scale") => parse(&body).and_then(|b| scale_write(member, &t, &b, &who)),
                _ => parse(&body).and_then(|b| member.store.lock().update(&t, b, &who)),
            };
            ("update", name.to_owned(), result)
        }
        (&Method::PATCH, Some(name)) => {
            let t = target(&resource, &p, name);
            let Some(kind) = PatchKind::from_content_type(&content_type) else {
                return error_response(&ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!("the body of the request was in an unknown format: {content_type}"),
                ));
            };
            let verb = if kind == PatchKind::Apply {
                "apply"
            } else {
                "patch"
            };
            let result = match p.subresource.as_deref() {
                Some("scale") => parse(&body).and_then(|b| {
                    let replicas = b.pointer("/spec/replicas").cloned().unwrap_or(Value::Null);
                    scale_write(member, &t, &json!({"spec": {"replicas": replicas}}), &who)
                }),
                _ => member.store.lock().patch(&t, kind, &body, &who),
            };
            (verb, name.to_owned(), result)
        }
        (&Method::DELETE, Some(name)) => {
            let t = target(&resource, &p, name);
            let options: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let uid = options
                .pointer("/preconditions/uid")
                .and_then(Value::as_str);
            let rv = options
                .pointer("/preconditions/resourceVersion")
                .and_then(Value::as_str);
            let result = member.store.lock().delete(&t, (uid, rv), &now);
            ("delete", name.to_owned(), result)
        }
        _ => {
            member.count("refused", &display);
            return error_response(&ApiError::method_not_allowed(method.as_str(), &uri));
        }
    };
    member.count(verb, &display);
    let t = target(&resource, &p, &name);
    match result {
        Ok(written) => {
            if resource.review {
                return json_response(StatusCode::CREATED, &written.object);
            }
            fleet.log_write(
                member,
                verb,
                &t,
                200,
                Some((&written.object, written.changed)),
            );
            if written.changed {
                member.notify();
                if resource.is_workload() && t.subresource.is_none() {
                    make_ready(fleet, member, &resource, p.namespace.clone(), name);
                }
            }
            let status = if verb == "create" {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            match p.subresource.as_deref() {
                Some("scale") => json_response(status, &scale_of(&written.object)),
                _ => full(status, "application/json", written.json.clone()),
            }
        }
        Err(e) => {
            fleet.log_write(member, verb, &t, e.code, None);
            error_response(&e)
        }
    }
}

/// PUT or PATCH of `/scale`: `spec.replicas` of the workload.
fn scale_write(
    member: &Member,
    t: &Target<'_>,
    scale: &Value,
    who: &Writer<'_>,
) -> Result<store::Written, ApiError> {
    let main = Target {
        subresource: None,
        ..*t
    };
    let patch = json!({"spec": {"replicas": scale.pointer("/spec/replicas").cloned().unwrap_or(Value::Null)}});
    let bytes = serde_json::to_vec(&patch).expect("a Value serializes");
    member
        .store
        .lock()
        .patch(&main, PatchKind::Merge, &bytes, who)
}

/// Reports the workload ready, after the fleet's delay.
fn make_ready(
    fleet: &Arc<Fleet>,
    member: &Arc<Member>,
    resource: &Arc<ResourceType>,
    namespace: Option<String>,
    name: String,
) {
    let run = {
        let (member, resource) = (member.clone(), resource.clone());
        move || {
            let t = Target {
                resource: &resource,
                namespace: namespace.as_deref(),
                name: &name,
                subresource: None,
            };
            let ready = member.store.lock().make_ready(&t, &now_rfc3339());
            if ready.is_some() {
                member.notify();
            }
        }
    };
    let delay = fleet.config.ready_delay;
    if delay.is_zero() {
        run();
    } else {
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            run();
        });
    }
}

fn delete_collection(
    fleet: &Arc<Fleet>,
    member: &Arc<Member>,
    q: &HashMap<String, String>,
    p: &Path,
    resource: &Arc<ResourceType>,
) -> Response<Body> {
    let filter = match filter_of(p, q) {
        Ok(f) => f,
        Err(e) => return error_response(&e),
    };
    let now = now_rfc3339();
    let mut deleted = Vec::new();
    {
        let mut store = member.store.lock();
        for o in store.all(resource, &filter) {
            let o = parse(&o);
            let (ns, name) = (
                o.pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                o.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
            );
            let t = Target {
                resource,
                namespace: ns.as_deref(),
                name: &name,
                subresource: None,
            };
            if let Ok(w) = store.delete(&t, (None, None), &now) {
                fleet.log_write(member, "delete", &t, 200, Some((&w.object, w.changed)));
                deleted.push((*w.object).clone());
            }
        }
    }
    member.notify();
    json_response(
        StatusCode::OK,
        &json!({"apiVersion": resource.api_version(), "kind": format!("{}List", resource.kind), "metadata": {}, "items": deleted}),
    )
}

/// What a watch request asked for.
struct WatchRequest {
    resource: Arc<ResourceType>,
    filter: Filter,
    /// None: start with the current objects as ADDED.
    from: Option<u64>,
    bookmarks: bool,
    initial_events_end: bool,
    timeout: Duration,
    metadata_only: bool,
}

fn watch(
    fleet: &Arc<Fleet>,
    member: &Arc<Member>,
    req: &Request<Incoming>,
    q: &HashMap<String, String>,
    resource: Arc<ResourceType>,
    filter: Filter,
) -> Response<Body> {
    let from = match q.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => None,
        Some(v) => match v.parse::<u64>() {
            Ok(v) => Some(v),
            Err(_) => {
                return error_response(&ApiError::bad_request(format!(
                    "invalid resourceVersion {v:?}"
                )));
            }
        },
    };
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .map_or(Duration::from_secs(1800), Duration::from_secs);
    let request = WatchRequest {
        resource,
        filter,
        from,
        bookmarks: is_true(q, "allowWatchBookmarks"),
        initial_events_end: is_true(q, "sendInitialEvents"),
        timeout,
        metadata_only: metadata_only(req),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    tokio::spawn(run_watch(
        member.clone(),
        request,
        tx,
        fleet.config.bookmark_every,
    ));
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .expect("a valid response")
}

/// Counts an open watch for as long as it lives.
struct OpenWatch(Arc<Member>);

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.0.open_watches.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn run_watch(
    member: Arc<Member>,
    w: WatchRequest,
    tx: mpsc::Sender<Bytes>,
    bookmark_every: Duration,
) {
    member.open_watches.fetch_add(1, Ordering::Relaxed);
    let _open = OpenWatch(member.clone());
    let deadline = tokio::time::Instant::now() + w.timeout;
    let mut wake = member.subscribe();
    wake.borrow_and_update();
    let line = |kind: &str, o: &Value| match w.metadata_only {
        true => store::watch_line(kind, &partial(o)),
        false => store::watch_line(kind, o),
    };
    // The start: the objects as they are, or the events after the asked resourceVersion.
    let (epoch, mut last, initial) = {
        let store = member.store.lock();
        match w.from {
            None => (
                store.epoch,
                store.resource_version(),
                Ok(store.all(&w.resource, &w.filter)),
            ),
            Some(rv) => (store.epoch, rv, Err(store.events_since(rv, &w.resource))),
        }
    };
    let mut out: Vec<Bytes> = Vec::new();
    match initial {
        Ok(objects) => {
            out.extend(objects.iter().map(|o| match w.metadata_only {
                true => line("ADDED", &parse(o)),
                false => store::line_of("ADDED", o),
            }));
            if w.initial_events_end {
                out.push(bookmark(&w.resource, last, true));
            }
        }
        Err(Ok(events)) => {
            for e in events {
                if w.filter.matches(&e.view) {
                    out.push(if w.metadata_only {
                        line(e.kind.as_str(), &e.object())
                    } else {
                        e.line.clone()
                    });
                }
                last = e.rv;
            }
        }
        Err(Err(expired)) => {
            let _ = tx
                .send(store::watch_line("ERROR", &expired.to_json()))
                .await;
            return;
        }
    }
    for b in out {
        if tx.send(b).await.is_err() {
            return;
        }
    }
    // As the API server's watch cache does: a bookmark shortly before the deadline too, so a
    // client re-watching resumes from a recent resourceVersion, not from before the events
    // the ring has since let go.
    let before_deadline = deadline - Duration::from_secs(2).min(w.timeout / 2);
    let mut warned = false;
    let mut bookmarks =
        tokio::time::interval_at(tokio::time::Instant::now() + bookmark_every, bookmark_every);
    loop {
        tokio::select! {
            changed = wake.changed() => {
                if changed.is_err() {
                    return;
                }
                let batch = {
                    let store = member.store.lock();
                    if store.epoch != epoch {
                        Err(ApiError::expired(last, store.resource_version()))
                    } else {
                        let now = store.resource_version();
                        store.events_since(last, &w.resource).map(|events| (events, now))
                    }
                };
                match batch {
                    Ok((events, now)) => {
                        for e in events {
                            if !w.filter.matches(&e.view) {
                                continue;
                            }
                            let b = if w.metadata_only { line(e.kind.as_str(), &e.object()) } else { e.line.clone() };
                            if tx.send(b).await.is_err() {
                                return;
                            }
                        }
                        last = now;
                    }
                    Err(expired) => {
                        let _ = tx.send(store::watch_line("ERROR", &expired.to_json())).await;
                        return;
                    }
                }
            }
            _ = bookmarks.tick(), if w.bookmarks => {
                if tx.send(bookmark(&w.resource, last, false)).await.is_err() {
                    return;
                }
            }
            _ = tokio::time::sleep_until(before_deadline), if w.bookmarks && !warned => {
                warned = true;
                if tx.send(bookmark(&w.resource, last, false)).await.is_err() {
                    return;
                }
            }
            _ = tokio::time::sleep_until(deadline) => return,
            _ = tx.closed() => return,
        }
    }
}

fn bookmark(resource: &ResourceType, rv: u64, initial_events_end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_events_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let object =
        json!({"apiVersion": resource.api_version(), "kind": resource.kind, "metadata": metadata});
    store::watch_line("BOOKMARK", &object)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let p = parse_path("/apis/apps/v1/namespaces/shop/deployments/web/status").unwrap();
        assert_eq!(
            (
                p.group.as_str(),
                p.namespace.as_deref(),
                p.resource.as_str()
            ),
            ("apps", Some("shop"), "deployments")
        );
        assert_eq!(
            (p.name.as_deref(), p.subresource.as_deref()),
            (Some("web"), Some("status"))
        );
        let p = parse_path("/api/v1/namespaces/shop").unwrap();
        assert_eq!(
            (p.resource.as_str(), p.name.as_deref(), p.namespace),
            ("namespaces", Some("shop"), None)
        );
        let p = parse_path("/api/v1/namespaces/shop/status").unwrap();
        assert_eq!(
            (p.name.as_deref(), p.subresource.as_deref()),
            (Some("shop"), Some("status"))
        );
        let p = parse_path("/api/v1/watch/namespaces/shop/pods").unwrap();
        assert!(p.watch);
        assert_eq!(
            (p.resource.as_str(), p.namespace.as_deref()),
            ("pods", Some("shop"))
        );
        let p = parse_path("/api/v1/namespaces").unwrap();
        assert_eq!((p.resource.as_str(), p.name), ("namespaces", None));
        assert!(parse_path("/metrics").is_none());
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(decode("a%3Db%2Cc+d"), "a=b,c d");
        assert_eq!(decode("%21x"), "!x");
        assert_eq!(decode("50%"), "50%");
    }
}
