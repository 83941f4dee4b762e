//! What every part of the request path shares, kept apart from the parts that move bytes so
//! that the entry, the forwarder, the fan-out and the fleet watch can all lean on it without
//! leaning on each other: where requests go (the members as they can be used now), the view
//! `/debug/gateway` shows, a request as it goes on, and the Status every failure is answered
//! with (its reason in the header the view records).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::SystemTime;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode};
use kube::Client;
use meridian_controllers::kubernetes::Facts;
use meridian_core::registry::Health;
use meridian_core::tenant::Reach;
use meridian_core::{ClusterId, Snapshot};
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::watch;

use crate::GatewayConfig;
use crate::continues::Lists;
use crate::jwks::KeyRing;
use crate::merge;
use crate::merge::page::EntryKey;
use crate::merge::{Roster, Rosters};
use crate::metrics::GatewayMetrics;
use crate::tenant;

/// Where requests go: the members (their clients, from the controllers' kubernetes::Facts; their health,
/// from the snapshot) and the hub.
#[derive(Clone)]
pub struct Targets {
    pub fleet: Facts,
    pub snapshots: watch::Receiver<Arc<Snapshot>>,
    pub hub: Option<Client>,
}

/// A member as the gateway can use it now.
pub(crate) enum Member {
    Ready(Client),
    /// Registered but not to be asked: why.
    Down(String),
}

impl Targets {
    /// `name`'s client; None: no such member.
    pub(crate) fn member(&self, name: &str) -> Option<Member> {
        let snapshot = self.snapshots.borrow().clone();
        let view = snapshot.cluster_view(&ClusterId::new(name))?;
        Some(self.usable(name, view.health, view.reason.as_deref()))
    }

    /// Every registered member, in name order.
    pub(crate) fn members(&self) -> Vec<(String, Member)> {
        let snapshot = self.snapshots.borrow().clone();
        let mut out: Vec<(String, Member)> = snapshot
            .clusters
            .iter()
            .map(|v| {
                let name = v.spec.id.as_str().to_string();
                let member = self.usable(&name, v.health, v.reason.as_deref());
                (name, member)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    fn usable(&self, name: &str, health: Health, reason: Option<&str>) -> Member {
        if health == Health::Unreachable {
            return Member::Down(format!(
                "cluster {name} is Unreachable{}",
                reason.map(|r| format!(": {r}")).unwrap_or_default()
            ));
        }
        match self.fleet.get(&ClusterId::new(name), |f| f.client.clone()) {
            Some(client) => Member::Ready(client),
            None => Member::Down(format!(
                "cluster {name} has no Kubernetes API meridian reaches (a directory member, or not connected yet)"
            )),
        }
    }
}

/// What `/debug/gateway` shows.
#[derive(Clone, Default)]
pub struct GatewayView(Arc<Mutex<ViewState>>);

#[derive(Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct ViewState {
    listen: Option<String>,
    issuer: String,
    keys: usize,
    open_watches: i64,
    /// The last problems (newest last): refused tokens, members left out, failed forwards.
    recent_problems: VecDeque<Problem>,
}

#[derive(Serialize)]
struct Problem {
    at: String,
    route: &'static str,
    cluster: String,
    code: u16,
    message: String,
}

const PROBLEMS_KEPT: usize = 50;

impl GatewayView {
    pub(crate) fn started(&self, listen: String, issuer: &str, keys: usize) {
        let mut s = self.0.lock();
        s.listen = Some(listen);
        s.issuer = issuer.to_string();
        s.keys = keys;
    }

    pub(crate) fn problem(&self, route: &'static str, cluster: &str, code: u16, message: &str) {
        let mut s = self.0.lock();
        if s.recent_problems.len() == PROBLEMS_KEPT {
            s.recent_problems.pop_front();
        }
        let at = epoch_seconds(SystemTime::now());
        s.recent_problems.push_back(Problem {
            at,
            route,
            cluster: cluster.to_string(),
            code,
            message: message.chars().take(300).collect(),
        });
    }

    pub(crate) fn watches(&self, delta: i64) {
        self.0.lock().open_watches += delta;
    }

    pub fn to_json(&self) -> Value {
        serde_json::to_value(&*self.0.lock()).unwrap_or(Value::Null)
    }
}

fn epoch_seconds(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    format!("{secs:.3}")
}

/// Everything a request needs.
pub(crate) struct Shared {
    pub config: GatewayConfig,
    pub keys: Arc<KeyRing>,
    pub targets: Targets,
    pub metrics: GatewayMetrics,
    pub view: GatewayView,
    /// meridian's own metrics, added to `/clusters/metrics`.
    pub own_metrics: Arc<prometheus_client::registry::Registry>,
    /// The bound on open connections (`maxConnections`): a tunnel outlives the connection it
    /// was upgraded from, so it holds a place of its own.
    pub connections: Arc<tokio::sync::Semaphore>,
    /// Paged lists through `*` that may go on: their continue tokens name them.
    pub lists: Lists,
    /// The member lists composite resourceVersions are made against, the current one and a
    /// few before it (tokens issued before a member joined or left still read).
    pub rosters: Rosters,
}

/// A request as it goes on: its method, the forwarded headers, the body read, and where the
/// caller's tenants let it go (None: no tenant bounds it).
#[derive(Clone)]
pub(crate) struct Call {
    pub method: Method,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub reach: Option<Arc<Reach>>,
}

impl Call {
    /// The same request, as a GET with no body (what aggregated reads send members); an
    /// aggregated read never upgrades, so an upgrade's headers do not go on.
    pub(crate) fn get(&self) -> Call {
        let mut headers = self.headers.clone();
        headers.remove(header::CONNECTION);
        headers.remove(header::UPGRADE);
        Call {
            method: Method::GET,
            headers,
            body: Bytes::new(),
            reach: self.reach.clone(),
        }
    }

    /// Whether `object` of `cluster`, answered for `path`, may be shown to the caller.
    pub(crate) fn shows(&self, cluster: &str, path: &str, object: &Value) -> bool {
        self.reach
            .as_ref()
            .is_none_or(|r| tenant::visible(r, cluster, path, object))
    }

    /// [`Call::shows`] for a list's entry, known by its namespace and name.
    pub(crate) fn shows_entry(&self, cluster: &str, path: &str, entry: &EntryKey<'_>) -> bool {
        self.reach.as_ref().is_none_or(|r| {
            tenant::visible_named(
                r,
                cluster,
                path,
                entry.namespace.as_deref(),
                entry.name.as_deref(),
            )
        })
    }
}

impl Shared {
    /// The members a request through `*` asks: every registered one, or the caller's
    /// tenants' (where its namespace is theirs), in name order.
    pub(crate) fn members_for(&self, call: &Call, path: &str) -> Vec<(String, Member)> {
        let mut members = self.targets.members();
        if let Some(reach) = &call.reach {
            members.retain(|(name, _)| tenant::asks(reach, path, name));
        }
        members
    }

    /// Every registered member in name order, as composite resourceVersions place them
    /// (whatever the caller reaches, so a token means the same for every caller).
    pub(crate) fn roster(&self) -> Arc<Roster> {
        let snapshot = self.targets.snapshots.borrow().clone();
        let mut names: Vec<&str> = snapshot
            .clusters
            .iter()
            .map(|v| v.spec.id.as_str())
            .collect();
        names.sort_unstable();
        names.dedup();
        self.rosters.current(&names)
    }
}

/// A Kubernetes Status failure response (the reason also in `x-meridian-reason` for the
/// debug view).
pub(crate) fn failure(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = merge::status(code.as_u16(), reason, message).to_string();
    let mut response = (code, [(header::CONTENT_TYPE, "application/json")], body).into_response();
    if let Ok(v) = HeaderValue::from_str(&message.replace(['\r', '\n'], " ")) {
        response.headers_mut().insert("x-meridian-reason", v);
    }
    response
}
