//! The status page at `/ui`: the fleet as a person reads it — which members are healthy, and
//! where each service's traffic goes from a chosen client cluster (the tiers, weights and
//! addresses DNS answers and the endpoints xDS sends), placements, and the problems list.
//!
//! The page is three static files embedded in the binary (no build step). It reads one view
//! model: `/ui/state` once, then `/ui/events`, a server-sent event stream that sends the view
//! again whenever it changes (at most [`MAX_STREAMS`] at once, each view made once for every
//! stream asking the same; the page counts heartbeat ages itself). The view is asked of the same answer function and xDS builders
//! as `explain`, so the picture is what clients get.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use futures::Stream;
use meridian_core::Snapshot;
use meridian_dns::explain::explain_at;
use meridian_xds::{Group, Role};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::AdminState;
use crate::explain::{filter_words, tier_words};

const PAGE: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");

/// Services pictured at once: a page of pictures, not the whole fleet (the filter finds the rest).
const SHOWN_SERVICES: usize = 100;

/// How often the stream looks again when no snapshot came: the members' last heartbeats move
/// on their own (the page counts their age itself, every second, from `lastHeartbeat`).
const REFRESH: Duration = Duration::from_secs(5);

/// Status-page streams open at once; one more is refused (503, the browser retries) until one
/// ends, so subscribers cannot take the admin listener's threads or memory.
const MAX_STREAMS: usize = 64;

/// Views kept for the streams, by what they were asked; past this they are computed again.
const MAX_SHARED_VIEWS: usize = 64;

/// One event stream lasts this long, then ends and the browser reconnects at once: the admin
/// listener closes connections that send nothing for its idle timeout (60 s by default), and
/// an event stream's client never sends.
const STREAM_FOR: Duration = Duration::from_secs(25);

pub fn routes() -> Router<AdminState> {
    Router::new()
        .route("/ui", get(|| async { Html(PAGE) }))
        .route("/ui/", get(|| async { Html(PAGE) }))
        .route(
            "/ui/app.js",
            get(|| asset("text/javascript; charset=utf-8", SCRIPT)),
        )
        .route(
            "/ui/app.css",
            get(|| asset("text/css; charset=utf-8", STYLE)),
        )
        .route("/ui/state", get(state))
        .route("/ui/events", get(events))
}

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// What the page asks for: the client cluster the pictures are drawn for (none: a client of
/// no member cluster), and a filter on `namespace/name`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ViewQuery {
    pub cluster: Option<String>,
    pub filter: Option<String>,
}

impl ViewQuery {
    fn client(&self) -> Option<&str> {
        self.cluster.as_deref().filter(|c| !c.is_empty())
    }

    /// An unknown client cluster is the caller's mistake, said at once rather than drawn empty.
    fn check(&self, snap: &Snapshot) -> Result<(), String> {
        match self.client() {
            Some(c) if snap.cluster_index(c).is_none() => Err(format!("no member cluster {c:?}")),
            _ => Ok(()),
        }
    }
}

async fn state(State(s): State<AdminState>, Query(q): Query<ViewQuery>) -> Response {
    let checked = q.check(&s.snapshots.borrow());
    match checked {
        Ok(()) => match tokio::task::spawn_blocking(move || view(&s, &q)).await {
            Ok(v) => axum::Json(v).into_response(),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
        },
        Err(e) => (StatusCode::BAD_REQUEST, axum::Json(json!({ "error": e }))).into_response(),
    }
}

async fn events(State(s): State<AdminState>, Query(q): Query<ViewQuery>) -> Response {
    let checked = q.check(&s.snapshots.borrow());
    if let Err(e) = checked {
        return (StatusCode::BAD_REQUEST, axum::Json(json!({ "error": e }))).into_response();
    }
    let Ok(slot) = s.ui.slots.clone().try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "5")],
            format!("{MAX_STREAMS} status-page streams are open; try again shortly\n"),
        )
            .into_response();
    };
    Sse::new(view_changes(s, q, slot))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
        .into_response()
}

/// What the status page's streams share: their bound, and the views they send — one
/// computation per snapshot (or refresh) and question, however many pages ask it.
#[derive(Clone)]
pub struct UiStreams {
    slots: Arc<Semaphore>,
    views: Arc<Mutex<HashMap<ViewKey, SharedView>>>,
}

impl Default for UiStreams {
    fn default() -> Self {
        Self {
            slots: Arc::new(Semaphore::new(MAX_STREAMS)),
            views: Arc::default(),
        }
    }
}

type ViewKey = (Option<String>, Option<String>);

/// A view as the streams send it: its JSON without `now`, and when it was made.
#[derive(Clone)]
struct SharedView {
    /// The snapshot version and the refresh period it was made in.
    made_for: (u64, u64),
    body: Arc<str>,
    now: u64,
}

impl SharedView {
    /// The event's data: the view with the server's clock (the page counts ages from it).
    fn data(&self) -> String {
        let rest = self.body.strip_prefix('{').unwrap_or(&self.body);
        let comma = if rest == "}" { "" } else { "," };
        format!("{{\"now\":{}{comma}{rest}", self.now)
    }
}

impl UiStreams {
    /// The view for `query` at this snapshot and refresh period: shared, or made now.
    async fn view(&self, admin: &AdminState, query: &ViewQuery) -> SharedView {
        let made_for = (admin.snapshots.borrow().version, refresh_period());
        let key = (query.cluster.clone(), query.filter.clone());
        if let Some(v) = self
            .views
            .lock()
            .get(&key)
            .filter(|v| v.made_for == made_for)
        {
            return v.clone();
        }
        let (a, q) = (admin.clone(), query.clone());
        let made = tokio::task::spawn_blocking(move || {
            let mut v = view(&a, &q);
            let now = v
                .as_object_mut()
                .and_then(|o| o.remove("now"))
                .and_then(|n| n.as_u64())
                .unwrap_or_default();
            (v.to_string(), now)
        })
        .await
        .unwrap_or_else(|e| (json!({ "error": e.to_string() }).to_string(), 0));
        let shared = SharedView {
            made_for,
            body: made.0.into(),
            now: made.1,
        };
        let mut views = self.views.lock();
        if views.len() >= MAX_SHARED_VIEWS {
            views.clear();
        }
        views.insert(key, shared.clone());
        shared
    }
}

fn refresh_period() -> u64 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    secs / REFRESH.as_secs()
}

struct Watching {
    admin: AdminState,
    query: ViewQuery,
    snapshots: tokio::sync::watch::Receiver<Arc<Snapshot>>,
    last: Option<Arc<str>>,
    until: Instant,
    /// Held while the stream lives: its place among [`MAX_STREAMS`].
    _slot: OwnedSemaphorePermit,
}

/// The view now, then again each time it differs (a new snapshot, a heartbeat), until the
/// stream's time is up. Pull-driven: a page that does not read is sent nothing more, and
/// nothing queues for it.
fn view_changes(
    admin: AdminState,
    query: ViewQuery,
    slot: OwnedSemaphorePermit,
) -> impl Stream<Item = Result<Event, std::convert::Infallible>> {
    let watching = Watching {
        snapshots: admin.snapshots.clone(),
        admin,
        query,
        last: None,
        until: Instant::now() + STREAM_FOR,
        _slot: slot,
    };
    futures::stream::unfold(watching, |mut w| async move {
        loop {
            if w.last.is_some() {
                let left = w.until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return None;
                }
                tokio::select! {
                    changed = w.snapshots.changed() => {
                        if changed.is_err() {
                            tokio::time::sleep(REFRESH.min(left)).await;
                        }
                    }
                    _ = tokio::time::sleep(REFRESH.min(left)) => {}
                }
            }
            let shared = w.admin.ui.view(&w.admin, &w.query).await;
            if w.last.as_ref() != Some(&shared.body) {
                let first = w.last.is_none();
                w.last = Some(shared.body.clone());
                let mut event = Event::default().event("state").data(shared.data());
                if first {
                    event = event.retry(Duration::from_millis(500));
                }
                return Some((Ok(event), w));
            }
        }
    })
}

/// The whole view model of the page.
pub fn view(s: &AdminState, q: &ViewQuery) -> Value {
    let snap = s.snapshots.borrow().clone();
    let now = Instant::now();
    let client = q.client();
    let filter = q.filter.as_deref().unwrap_or("").trim();
    let matching: Vec<_> = snap
        .services()
        .filter(|v| filter.is_empty() || v.key.to_string().contains(filter))
        .collect();
    // What an Envoy and a proxyless gRPC client of the chosen cluster receive, side by side:
    // the same decision, but a proxyless client reaches no other network's gateway.
    let feed_of = |role| {
        meridian_xds::describe::describe(&s.xds.resources_for(
            &snap,
            &Group {
                cluster: client.map(str::to_owned),
                network: None,
                role,
            },
        ))
    };
    let feeds = Feeds {
        envoy: feed_of(Role::Envoy),
        proxyless: feed_of(Role::Proxyless),
    };
    let services: Vec<Value> = matching
        .iter()
        .take(SHOWN_SERVICES)
        .map(|v| {
            let (ns, name) = (&*v.key.namespace, &*v.key.name);
            service_picture(s, &snap, &feeds, (ns, name), client, now)
        })
        .collect();
    json!({
        "version": snap.version,
        "synced": snap.synced,
        "clientCluster": client,
        "now": millis_since_epoch(SystemTime::now()),
        "clusters": clusters(s, &snap),
        "servicesTotal": snap.service_count(),
        "servicesMatching": matching.len(),
        "services": services,
        "placements": crate::explain::placements_json(&snap, &s.propagation.get()),
        "problems": snap.problems,
        "warnings": snap.warnings,
    })
}

fn millis_since_epoch(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn clusters(s: &AdminState, snap: &Snapshot) -> Vec<Value> {
    let rooms = super::rooms_by_cluster(snap);
    snap.clusters
        .iter()
        .map(|c| {
            let heartbeat = s.heartbeats.last(&c.spec.id);
            let mut card = super::with_capacity(super::cluster_json(c), rooms.get(&c.spec.id));
            card["lastHeartbeat"] = json!(heartbeat.map(millis_since_epoch));
            card
        })
        .collect()
}

/// One service from one client cluster: what DNS answers and why (the tiers and weights of
/// the decision, the clusters filtered out), and the EDS priorities an Envoy there receives.
/// The described xDS feeds of the chosen client, per kind of client.
struct Feeds {
    envoy: Value,
    proxyless: Value,
}

fn service_picture(
    s: &AdminState,
    snap: &Snapshot,
    feeds: &Feeds,
    (ns, name): (&str, &str),
    client: Option<&str>,
    now: Instant,
) -> Value {
    let qname = format!("{name}.{ns}.global");
    let dns = match explain_at(s.dns.answerer(), snap, &qname, "A", client, now) {
        Ok(d) => d,
        Err(e) => return json!({ "service": format!("{ns}/{name}"), "error": e.to_string() }),
    };
    let answers: Vec<&str> = dns
        .answers
        .iter()
        .filter_map(|r| r.split_whitespace().last())
        .collect();
    let (tiers, filtered) = match &dns.decision {
        Some(d) => (
            d.tiers
                .iter()
                .map(|t| {
                    json!({
                        "priority": t.priority,
                        "why": t.reasons.iter().map(tier_words).collect::<Vec<_>>(),
                        "ready": t.ready,
                        "clusters": t.clusters.iter().map(|m| json!({
                            "cluster": m.cluster,
                            "weight": m.weight,
                            "ready": m.ready,
                            "viaGateway": m.via_gateway,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect::<Vec<_>>(),
            d.filtered
                .iter()
                .map(|f| json!({ "cluster": f.cluster, "why": filter_words(&f.reason) }))
                .collect::<Vec<_>>(),
        ),
        None => (Vec::new(), Vec::new()),
    };
    json!({
        "service": format!("{ns}/{name}"),
        "dns": { "name": qname, "rcode": dns.status, "answers": answers },
        "tiers": tiers,
        "filtered": filtered,
        "eds": crate::explain::service_assignments(&feeds.envoy, ns, name),
        "edsProxyless": crate::explain::service_assignments(&feeds.proxyless, ns, name),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_the_script_and_style_it_is_served_with() {
        assert!(PAGE.contains("/ui/app.js"));
        assert!(PAGE.contains("/ui/app.css"));
        assert!(SCRIPT.contains("/ui/events"));
    }

    #[test]
    fn an_empty_cluster_is_no_client_cluster() {
        let q = ViewQuery {
            cluster: Some(String::new()),
            filter: None,
        };
        assert_eq!(q.client(), None);
        assert!(q.check(&Snapshot::empty()).is_ok());
        let q = ViewQuery {
            cluster: Some("eu-9".into()),
            filter: None,
        };
        assert_eq!(
            q.check(&Snapshot::empty()),
            Err("no member cluster \"eu-9\"".into())
        );
    }
}
