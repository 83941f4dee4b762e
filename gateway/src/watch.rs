//! A watch of every member as one stream (`/clusters/*/…?watch=1`).
//!
//! Each member is watched from its own part of the composite resourceVersion (or as the
//! client asked: none, "0"); every event goes out marked with its member and carrying the
//! composite as it stands after that event, so a client resuming from any event's version
//! starts each member exactly after what it saw. With `sendInitialEvents`, each member's
//! `initial-events-end` bookmark is held back and one of the gateway's goes out once every
//! member sent its own. The stream ends — and a client-go reflector simply watches again
//! from its last version — when any member's watch ends or the set of members changes (a
//! member joined since a composite was issued is answered 410, so the client relists; so is
//! a composite made for members the gateway no longer holds the list of). A
//! member that is up but whose watch did not open in time ends it within seconds too.
//!
//! At fleet size: exactly one watch per member (`meridian_gateway_member_watches`), opened
//! MEMBERS_AT_ONCE at a time so a thousand members open in a few round trips; each member's
//! share of the merged stream is its connection and the one event line being read — events
//! are pulled one at a time as the client reads, never queued.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures::stream::{self, Stream, StreamExt};
use http::{StatusCode, header};
use http_body_util::BodyExt;
use kube::Client;
use meridian_core::Tenants;
use meridian_core::tenant::Reach;
use serde_json::Value;

use crate::merge::{self, Composite, Live};
use crate::path::{query_param, with_params};
use crate::proxy::fanout::{LeftOut, requested_version};
use crate::proxy::forward::send;
use crate::proxy::list::MEMBERS_AT_ONCE;
use crate::proxy::state::{Call, GatewayView, Member, Shared, Targets, failure};
use crate::tenant;

/// How often a fleet watch looks for members up but not in it.
const REWATCH_LEFT_OUT: std::time::Duration = std::time::Duration::from_secs(5);

type Events = Pin<Box<dyn Stream<Item = (String, Option<Value>)> + Send>>;

pub(crate) async fn every(shared: &Shared, path: &str, call: &Call) -> Response {
    let (requested, composite) = match requested_version(path, &shared.rosters) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    let members = shared.members_for(call, path);
    if let Some(c) = &composite
        && let Some((name, _)) = members
            .iter()
            .find(|(n, m)| matches!(m, Member::Ready(_)) && !c.0.contains_key(n))
    {
        return failure(
            StatusCode::GONE,
            "Expired",
            &format!("member {name} joined after this resourceVersion: list again"),
        );
    }
    let initial = query_param(path, "sendInitialEvents") == Some("true");
    let mut left_out = LeftOut::default();
    let mut ready = Vec::new();
    for (name, m) in members {
        match m {
            Member::Ready(client) => ready.push((name, client)),
            Member::Down(why) => left_out.add(shared, &name, why),
        }
    }
    let opened: Vec<(String, Opened)> = stream::iter(ready)
        .map(|(name, client)| {
            let p = with_params(
                path,
                &[(
                    "resourceVersion",
                    Composite::for_member(requested, &composite, &name),
                )],
            );
            async move {
                let opened = open(&client, &name, &p, call, shared).await;
                (name, opened)
            }
        })
        .buffered(MEMBERS_AT_ONCE)
        .collect()
        .await;
    let mut streams: Vec<Events> = Vec::new();
    let mut watched = BTreeSet::new();
    for (name, opened) in opened {
        match opened {
            Opened::Watching(events) => {
                watched.insert(name);
                streams.push(events);
            }
            Opened::Gone(gone) => return gone,
            Opened::LeftOut(why) => left_out.add(shared, &name, why),
        }
    }
    let state = Merged {
        composite: Live::new(composite.unwrap_or_default(), shared.roster()),
        waiting_initial: if initial {
            watched.clone()
        } else {
            BTreeSet::new()
        },
        kind: (Value::Null, Value::Null),
        members: watched,
        targets: shared.targets.clone(),
        reach: call.reach.clone(),
        tenants: shared.targets.snapshots.borrow().tenants.clone(),
        path: path.to_string(),
        _guard: WatchGuard::new(shared),
    };
    let body = Body::from_stream(merged(streams, state));
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    left_out.warn(&mut response);
    response
}

/// What opening one member's watch came to.
enum Opened {
    Watching(Events),
    /// The member answered 410: the whole answer (the client lists again).
    Gone(Response),
    LeftOut(String),
}

async fn open(client: &Client, name: &str, path: &str, call: &Call, shared: &Shared) -> Opened {
    let response = match send(client, name, path, call, Some(shared.config.member_timeout)).await {
        Ok(response) => response,
        Err(e) => return Opened::LeftOut(e.describe()),
    };
    let status = response.status();
    if status.is_success() {
        let held = MemberWatch::new(shared);
        return Opened::Watching(events(name.to_string(), response.into_body(), held));
    }
    let body = response
        .into_body()
        .collect_bytes()
        .await
        .unwrap_or_default();
    if status == StatusCode::GONE {
        let gone = (status, [(header::CONTENT_TYPE, "application/json")], body);
        return Opened::Gone(axum::response::IntoResponse::into_response(gone));
    }
    let message = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|b| b["message"].as_str().map(str::to_string))
        .unwrap_or_default();
    Opened::LeftOut(format!("{} {message}", status.as_u16()))
}

/// Counts a member's watch while its stream lives.
struct MemberWatch(prometheus_client::metrics::gauge::Gauge);

impl MemberWatch {
    fn new(shared: &Shared) -> Self {
        shared.metrics.member_watches.inc();
        Self(shared.metrics.member_watches.clone())
    }
}

impl Drop for MemberWatch {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// One member's watch body as events, one JSON document per line; None at its end (or on a
/// line that is not JSON, which ends the watch the same way).
fn events(cluster: String, body: kube::client::Body, held: MemberWatch) -> Events {
    let data = body.into_data_stream();
    let lines = stream::unfold(
        (data, BytesMut::new(), cluster, false, held),
        |(mut data, mut buffer, cluster, ended, held)| async move {
            if ended {
                return None;
            }
            loop {
                if let Some(i) = buffer.iter().position(|b| *b == b'\n') {
                    let line = buffer.split_to(i + 1);
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    let event = serde_json::from_slice::<Value>(&line).ok();
                    let ended = event.is_none();
                    return Some((
                        (cluster.clone(), event),
                        (data, buffer, cluster, ended, held),
                    ));
                }
                match data.next().await {
                    Some(Ok(chunk)) => buffer.extend_from_slice(&chunk),
                    _ => {
                        // The member's watch ended (its timeout, or the connection).
                        return Some((
                            (cluster.clone(), None),
                            (data, buffer, cluster, true, held),
                        ));
                    }
                }
            }
        },
    );
    Box::pin(lines)
}

/// The merged stream's state.
struct Merged {
    /// Every member's version as the client has seen it, kept encoded: an event rewrites
    /// its member's part, not the whole token.
    composite: Live,
    /// Members whose initial events have not ended yet (sendInitialEvents).
    waiting_initial: BTreeSet<String>,
    /// The kind and apiVersion of a member's bookmark, for the gateway's own.
    kind: (Value, Value),
    members: BTreeSet<String>,
    targets: Targets,
    /// The caller's tenants' reach: events of objects outside it are not sent.
    reach: Option<Arc<Reach>>,
    /// The Tenants the reach was drawn from: when they change, a tenant's watch ends (and is
    /// checked again when the client watches again).
    tenants: Arc<Tenants>,
    path: String,
    /// Held for its Drop: the open-watch count.
    _guard: WatchGuard,
}

impl Merged {
    /// What goes out for one member event; None: nothing (a member's initial-events end).
    fn on_event(&mut self, cluster: &str, event: Value) -> Option<Bytes> {
        if merge::ends_initial_events(&event) && self.waiting_initial.remove(cluster) {
            if let Some(rv) = event["object"]["metadata"]["resourceVersion"].as_str() {
                self.composite.set(cluster, rv);
            }
            self.kind = (
                event["object"]["kind"].clone(),
                event["object"]["apiVersion"].clone(),
            );
            if !self.waiting_initial.is_empty() {
                return None;
            }
            return Some(line(&merge::initial_events_end(
                &self.kind.0,
                &self.kind.1,
                &mut self.composite,
            )));
        }
        if let Some(reach) = &self.reach
            && event["type"] != "BOOKMARK"
            && event["type"] != "ERROR"
            && !tenant::visible(reach, cluster, &self.path, &event["object"])
        {
            // Not the caller's: only its version counts (what a later event carries).
            if let Some(rv) = event["object"]["metadata"]["resourceVersion"].as_str() {
                self.composite.set(cluster, rv);
            }
            return None;
        }
        Some(line(&merge::fleet_event(
            event,
            cluster,
            &mut self.composite,
        )))
    }

    /// The members the snapshot registers (or, for a tenant's user, the Tenants) changed since
    /// the watch began.
    fn members_changed(&self) -> bool {
        if self.reach.is_some()
            && !Arc::ptr_eq(&self.tenants, &self.targets.snapshots.borrow().tenants)
        {
            return true;
        }
        let now: BTreeSet<String> = self
            .targets
            .members()
            .into_iter()
            .filter(|(n, _)| {
                self.reach
                    .as_ref()
                    .is_none_or(|r| tenant::asks(r, &self.path, n))
            })
            .filter(|(_, m)| matches!(m, Member::Ready(_)))
            .map(|(n, _)| n)
            .collect();
        now != self.members
    }
}

fn line(v: &Value) -> Bytes {
    let mut bytes = serde_json::to_vec(v).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

fn merged(
    streams: Vec<Events>,
    state: Merged,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send {
    let snapshots = state.targets.snapshots.clone();
    let all = stream::select_all(streams);
    stream::unfold(
        (all, state, snapshots),
        |(mut all, mut state, mut snapshots)| async move {
            loop {
                tokio::select! {
                    next = all.next() => match next {
                        Some((cluster, Some(event))) => {
                            if let Some(out) = state.on_event(&cluster, event) {
                                return Some((Ok(out), (all, state, snapshots)));
                            }
                        }
                        // A member's watch ended: so does this one; the client watches again.
                        Some((cluster, None)) => {
                            tracing::debug!(%cluster, "a member's watch ended: the fleet watch ends");
                            return None;
                        }
                        None => return None,
                    },
                    changed = snapshots.changed() => {
                        if changed.is_err() || state.members_changed() {
                            tracing::debug!("the fleet's members changed: the fleet watch ends");
                            return None;
                        }
                    }
                    // A member left out when the watch began (its watch did not open in
                    // time) though it is up: the watch ends soon, so the client watches again
                    // with it rather than never seeing its events.
                    _ = tokio::time::sleep(REWATCH_LEFT_OUT) => {
                        if state.members_changed() {
                            tracing::debug!("a member up but left out of the fleet watch: it ends");
                            return None;
                        }
                    }
                }
            }
        },
    )
}

/// Counts an open watch while it lives.
struct WatchGuard {
    metrics: crate::metrics::GatewayMetrics,
    view: GatewayView,
}

impl WatchGuard {
    fn new(shared: &Shared) -> Self {
        shared.metrics.watches.inc();
        shared.view.watches(1);
        Self {
            metrics: shared.metrics.clone(),
            view: shared.view.clone(),
        }
    }
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.metrics.watches.dec();
        self.view.watches(-1);
    }
}
