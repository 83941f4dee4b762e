//! A fake member API server behind a `kube::Client`, for the tests: it answers the LISTs and
//! WATCHes of `watch_all` and `/readyz`, counts the lists and watches opened per resource
//! (what a member's API server would serve), and streams the events a test sends to every
//! watch of their resource that is open.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tonic::codegen::{BoxFuture, Service, http};

/// The fake API; clones share it.
#[derive(Clone, Default)]
pub(crate) struct FakeMember(Arc<Inner>);

#[derive(Default)]
struct Log {
    past: Vec<(u64, String, Bytes)>,
    live: Option<broadcast::Sender<(String, Bytes)>>,
}

#[derive(Default)]
struct Inner {
    /// By resource, by `namespace/name`: what a LIST gives.
    objects: Mutex<BTreeMap<String, BTreeMap<String, Value>>>,
    /// LISTs and WATCHes served, by resource.
    lists: Mutex<BTreeMap<String, usize>>,
    watches: Mutex<BTreeMap<String, usize>>,
    /// Every watch event as `(version, resource, line)`: a watch from a resourceVersion is
    /// given those after it, then the ones to come (`live`), as an API server does.
    log: Mutex<Log>,
    version: AtomicU64,
}

/// A Service `namespace/name` as the API serves it.
pub(crate) fn service(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": namespace,
            // What the agent leaves out (the hub reads none of it).
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
        },
        "spec": {"ports": [{"port": 80, "protocol": "TCP"}]},
    })
}

impl FakeMember {
    /// A client of the fake member.
    pub(crate) fn client(&self) -> kube::Client {
        kube::Client::new(self.clone(), "default")
    }

    /// Keeps `object` of `resource` (a LIST gives it) and tells every open watch of it:
    /// `kind` is `ADDED`, `MODIFIED` or `DELETED`.
    pub(crate) fn change(&self, resource: &str, kind: &str, mut object: Value) {
        let mut log = self.0.log.lock();
        let version = self.0.version.fetch_add(1, Ordering::SeqCst) + 2;
        object["metadata"]["resourceVersion"] = json!(version.to_string());
        let meta = &object["metadata"];
        let key = format!(
            "{}/{}",
            meta["namespace"].as_str().unwrap_or_default(),
            meta["name"].as_str().unwrap_or_default()
        );
        {
            let mut objects = self.0.objects.lock();
            let of = objects.entry(resource.to_string()).or_default();
            match kind {
                "DELETED" => of.remove(&key),
                _ => of.insert(key, object.clone()),
            };
        }
        let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap();
        line.push(b'\n');
        let line = Bytes::from(line);
        log.past.push((version, resource.to_string(), line.clone()));
        if let Some(live) = &log.live {
            let _ = live.send((resource.to_string(), line));
        }
    }

    /// WATCHes opened so far, by resource.
    pub(crate) fn watches(&self) -> BTreeMap<String, usize> {
        self.0.watches.lock().clone()
    }

    /// LISTs served so far, by resource.
    pub(crate) fn lists(&self) -> BTreeMap<String, usize> {
        self.0.lists.lock().clone()
    }

    fn answer(&self, request: &http::Request<kube::client::Body>) -> http::Response<Body> {
        let path = request.uri().path();
        let query = request.uri().query().unwrap_or_default();
        if path == "/readyz" {
            return reply(200, Bytes::from_static(b"ok"));
        }
        let resource = path.rsplit('/').next().unwrap_or_default().to_string();
        if query
            .split('&')
            .any(|p| p == "watch=true" || p == "watch=1")
        {
            *self.0.watches.lock().entry(resource.clone()).or_default() += 1;
            let from = query
                .split('&')
                .find_map(|p| p.strip_prefix("resourceVersion="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            return self.watch(resource, from);
        }
        *self.0.lists.lock().entry(resource.clone()).or_default() += 1;
        // No change is half made while the list is read.
        let _log = self.0.log.lock();
        let items: Vec<Value> = self
            .0
            .objects
            .lock()
            .get(&resource)
            .map(|o| o.values().cloned().collect())
            .unwrap_or_default();
        let version = self.0.version.load(Ordering::SeqCst) + 1;
        let list = json!({
            "apiVersion": "v1",
            "kind": "List",
            "metadata": {"resourceVersion": version.to_string()},
            "items": items,
        });
        reply(200, serde_json::to_vec(&list).unwrap().into())
    }

    /// A watch of `resource` that stays open: the events after version `from`, then those
    /// sent from now on.
    fn watch(&self, resource: String, from: u64) -> http::Response<Body> {
        let mut log = self.0.log.lock();
        let past: Vec<Bytes> = log
            .past
            .iter()
            .filter(|(version, of, _)| *version > from && *of == resource)
            .map(|(_, _, line)| line.clone())
            .collect();
        let receiver = log
            .live
            .get_or_insert_with(|| broadcast::channel(4096).0)
            .subscribe();
        let live =
            tokio_stream::wrappers::BroadcastStream::new(receiver).filter_map(move |event| {
                let line = match event {
                    Ok((of, line)) if of == resource => Some(line),
                    _ => None,
                };
                std::future::ready(line)
            });
        let lines = futures::stream::iter(past)
            .chain(live)
            // A frame is made the way a full body makes its one (the frame type's crate is
            // not a dependency of this one).
            .then(|line| async move { Full::new(line).frame().await.expect("one frame") });
        http::Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(StreamBody::new(lines).boxed_unsync())
            .unwrap()
    }
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

fn reply(status: u16, body: Bytes) -> http::Response<Body> {
    http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(body).boxed_unsync())
        .unwrap()
}

impl Service<http::Request<kube::client::Body>> for FakeMember {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let response = self.answer(&request);
        Box::pin(async move { Ok(response) })
    }
}
