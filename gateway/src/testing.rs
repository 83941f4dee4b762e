//! Fake members for the gateway's tests and its benchmark: an HTTP server per member on
//! loopback that answers LISTs as a kube-apiserver pages them (`limit`, its own `continue`,
//! one resourceVersion per list) and holds watches open, and the `Targets` that reach them.
//!
//! ```text
//!  FakeFleet::start(n, objects) ─► n listeners, one per member, ConfigMaps pre-serialized
//!  targets(addrs) ─► Targets { fleet: Facts with a kube::Client per member,
//!                              snapshots: every member Healthy, Tenants read }
//! ```
//!
//! A member's answers are built by copying pre-serialized objects, so a thousand of them in
//! one process cost little beside the gateway under test.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::StatusCode;
use kube::Client;
use meridian_controllers::kubernetes::Facts;
use meridian_core::tenant::Tenants;
use meridian_core::testing::FleetBuilder;
use meridian_core::{ClusterId, Snapshot};
use parking_lot::Mutex;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::Targets;

/// A certificate, any: the roots of clients that never use TLS.
const ANY_CERT: &str = include_str!("cert/dave.pem");

/// What a fake member answers its own counts at (for a benchmark in another process).
pub const STATS: &str = "/fake/stats";

/// How a fake member misbehaves (all off by default).
#[derive(Clone, Debug, Default)]
pub struct Script {
    /// Every request answered with this status (a Status body).
    pub refuse: Option<u16>,
    /// Pages after this many (of all the member served) answered 500.
    pub fail_after_pages: Option<usize>,
    /// Lists answered as Tables (kubectl's form).
    pub tables: bool,
}

/// One fake member.
pub struct FakeMember {
    pub name: String,
    pub addr: SocketAddr,
    /// Its ConfigMaps, in key order, serialized once.
    objects: Vec<Bytes>,
    pub resource_version: String,
    pub script: Mutex<Script>,
    /// Every request's path and query, in order.
    pub seen: Mutex<Vec<String>>,
    pages: AtomicUsize,
    /// Watches opened (and not necessarily closed).
    pub watches: AtomicUsize,
    /// The fleet's requests being answered now, and the most at once.
    load: Arc<Load>,
}

/// Requests in flight across a fake fleet.
#[derive(Default, Debug)]
pub struct Load {
    now: AtomicUsize,
    pub peak: AtomicUsize,
}

impl FakeMember {
    /// The requests it saw that were LISTs (not watches).
    pub fn lists(&self) -> Vec<String> {
        self.seen
            .lock()
            .iter()
            .filter(|p| !p.contains("watch="))
            .cloned()
            .collect()
    }

    fn page(&self, query: &BTreeMap<String, String>) -> Response {
        let script = self.script.lock().clone();
        if let Some(code) = script.refuse {
            return status(code, "refused by the test");
        }
        let served = self.pages.fetch_add(1, Ordering::SeqCst);
        if script.fail_after_pages.is_some_and(|n| served >= n) {
            return status(500, "failing by the test");
        }
        let from: usize = match query.get("continue") {
            Some(token) => match token.strip_prefix('o').and_then(|o| o.parse().ok()) {
                Some(offset) => offset,
                None => return status(400, "not my continue token"),
            },
            None => 0,
        };
        let limit = query
            .get("limit")
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|l| *l > 0)
            .unwrap_or(usize::MAX);
        let until = from.saturating_add(limit).min(self.objects.len());
        let next = (until < self.objects.len()).then(|| format!("o{until}"));
        let body = self.render(&self.objects[from.min(until)..until], next, script.tables);
        (StatusCode::OK, [("content-type", "application/json")], body).into_response()
    }

    fn render(&self, objects: &[Bytes], next: Option<String>, table: bool) -> Vec<u8> {
        let meta = json!({"resourceVersion": self.resource_version, "continue": next});
        let mut out = Vec::with_capacity(objects.iter().map(Bytes::len).sum::<usize>() + 256);
        if table {
            out.extend_from_slice(br#"{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":"#);
            out.extend(meta.to_string().into_bytes());
            out.extend_from_slice(
                br#","columnDefinitions":[{"name":"Name","type":"string"}],"rows":["#,
            );
        } else {
            out.extend_from_slice(br#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":"#);
            out.extend(meta.to_string().into_bytes());
            out.extend_from_slice(br#","items":["#);
        }
        for (i, object) in objects.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            if table {
                out.extend_from_slice(br#"{"cells":["row"],"object":"#);
                out.extend_from_slice(object);
                out.push(b'}');
            } else {
                out.extend_from_slice(object);
            }
        }
        out.extend_from_slice(b"]}");
        out
    }
}

fn status(code: u16, message: &str) -> Response {
    let body = crate::merge::status(code, "Test", message).to_string();
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, [("content-type", "application/json")], body).into_response()
}

fn query(request: &Request) -> BTreeMap<String, String> {
    request
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

async fn answer(State(member): State<Arc<FakeMember>>, request: Request) -> Response {
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    if path == STATS {
        let stats = json!({"watches": member.watches.load(Ordering::SeqCst), "lists": member.lists().len()});
        return (StatusCode::OK, stats.to_string()).into_response();
    }
    member.seen.lock().push(path);
    let query = query(&request);
    if matches!(query.get("watch").map(String::as_str), Some("1" | "true")) {
        member.watches.fetch_add(1, Ordering::SeqCst);
        // Open until the client goes: a watch with nothing happening.
        let quiet = futures::stream::pending::<Result<Bytes, std::io::Error>>();
        return (
            StatusCode::OK,
            [("content-type", "application/json")],
            Body::from_stream(quiet),
        )
            .into_response();
    }
    let load = member.load.clone();
    let now = load.now.fetch_add(1, Ordering::SeqCst) + 1;
    load.peak.fetch_max(now, Ordering::SeqCst);
    // Long enough for the gateway's requests to overlap, as a real member's would.
    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    let response = member.page(&query);
    load.now.fetch_sub(1, Ordering::SeqCst);
    response
}

/// A ConfigMap as an API server stores it, `size` bytes of data or so.
pub fn configmap(namespace: &str, name: &str, size: usize) -> Bytes {
    let object = json!({
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{namespace}-{name}"),
                     "resourceVersion": "7", "creationTimestamp": "2025-01-01T00:00:00Z",
                     "labels": {"app": "bench"},
                     "managedFields": [{"manager": "kubectl", "operation": "Apply", "apiVersion": "v1",
                                        "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:key": {}}}}]},
        "data": {"key": "x".repeat(size)},
    });
    Bytes::from(object.to_string())
}

/// A fleet of fake members `m0000`, `m0001`, ….
pub struct FakeFleet {
    pub members: Vec<Arc<FakeMember>>,
    pub load: Arc<Load>,
}

impl FakeFleet {
    /// `count` members, each with `objects` ConfigMaps (of about `size` bytes) over a few
    /// namespaces, each listening on its own loopback port.
    pub async fn start(count: usize, objects: usize, size: usize) -> std::io::Result<Self> {
        Self::start_with(&vec![objects; count], size).await
    }

    /// A member for each entry of `objects`, with that many ConfigMaps.
    pub async fn start_with(objects: &[usize], size: usize) -> std::io::Result<Self> {
        let load = Arc::new(Load::default());
        let mut members = Vec::with_capacity(objects.len());
        for (i, &objects) in objects.iter().enumerate() {
            let name = format!("m{i:04}");
            let mut keys: Vec<(String, String)> = (0..objects)
                .map(|o| (format!("ns-{}", o % 4), format!("cm-{o:05}")))
                .collect();
            keys.sort();
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            let member = Arc::new(FakeMember {
                addr: listener.local_addr()?,
                objects: keys.iter().map(|(ns, n)| configmap(ns, n, size)).collect(),
                resource_version: format!("{}", 1000 + i),
                script: Mutex::default(),
                seen: Mutex::default(),
                pages: AtomicUsize::new(0),
                watches: AtomicUsize::new(0),
                load: load.clone(),
                name,
            });
            let router = Router::new().fallback(answer).with_state(member.clone());
            tokio::spawn(async move {
                let _ = axum::serve(listener, router).await;
            });
            members.push(member);
        }
        Ok(Self { members, load })
    }

    pub fn member(&self, name: &str) -> &FakeMember {
        self.members
            .iter()
            .find(|m| m.name == name)
            .expect("a member of the fake fleet")
    }

    /// Each member's name and address.
    pub fn addrs(&self) -> Vec<(String, SocketAddr)> {
        self.members
            .iter()
            .map(|m| (m.name.clone(), m.addr))
            .collect()
    }

    /// Where the gateway finds these members (see [`targets`]).
    pub fn targets(&self) -> (Targets, watch::Sender<Arc<Snapshot>>) {
        targets(&self.addrs())
    }
}

/// A client of a member at `addr` (plain HTTP on loopback).
pub fn client(addr: SocketAddr) -> Client {
    // Plain HTTP needs no roots, but without any kube loads the system's for each client:
    // seconds for a thousand members.
    let roots: Vec<Vec<u8>> = rustls_pemfile::certs(&mut ANY_CERT.as_bytes())
        .filter_map(Result::ok)
        .map(|c| c.to_vec())
        .collect();
    let url = format!("http://{addr}").parse().expect("a loopback URL");
    let mut config = kube::Config::new(url);
    config.root_cert = Some(roots);
    Client::try_from(config).expect("a client")
}

/// Where the gateway finds `members`: each connected and Healthy; the hub's Tenants read
/// (and none bounding anyone). The sender keeps the snapshot current.
pub fn targets(members: &[(String, SocketAddr)]) -> (Targets, watch::Sender<Arc<Snapshot>>) {
    let fleet = Facts::default();
    for (name, addr) in members {
        let client = client(*addr);
        fleet.update(&ClusterId::new(name), |f| {
            f.client = Some(client);
            f.listed = true;
        });
    }
    let names: Vec<&str> = members.iter().map(|(n, _)| n.as_str()).collect();
    let mut snapshot = FleetBuilder::with_members(&names).snapshot();
    snapshot.tenants = Arc::new(Tenants::listed(Vec::new()));
    let (tx, rx) = watch::channel(Arc::new(snapshot));
    (
        Targets {
            fleet,
            snapshots: rx,
            hub: None,
        },
        tx,
    )
}
