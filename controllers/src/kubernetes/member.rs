//! A Kubernetes member source: one client, watches on Services, EndpointSlices, ServiceExports,
//! ServiceImports, Nodes and Namespaces, and heartbeats against `/readyz`.
//!
//! ```text
//!  watchers (backoff each) ──► MemberState (relists buffered) ──► Reset | Changes ──► store
//!  /readyz every heartbeatSeconds ──► Heartbeat ──► store (Registry: Healthy/Degraded/Unreachable)
//!                          └─ back after failing ──► watches restarted: a full relist, one Reset
//! ```
//! A member whose credentials are wrong or whose API is down never blocks anything else: its
//! task retries on its own, and the failure shows as a heartbeat error with the reason.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::{Duration, Instant, SystemTime};

use futures::stream::{BoxStream, SelectAll};
use futures::{FutureExt, StreamExt};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use meridian_core::{ClusterId, HealthTimings};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use super::connect::{self, WATCH_TIMEOUT_SECS};
use super::state::{MemberEvent, MemberState};
use super::{AbortOnDrop, Fleet, MANAGED_BY_SELECTOR_EXCLUDED};
use crate::SourceEvent;
use crate::convert::KubeAccess;

/// A watch failure counts (the member is Degraded) until this long after its last error:
/// kube-rs retries a failing watch at least every 30 s, and a re-opened watch says nothing
/// until an object changes.
const WATCH_FAILURE_MEMORY: Duration = Duration::from_secs(40);
/// How many ready watch events are folded into one batch for the store.
const BATCH: usize = 4096;

type WatchItem = Result<MemberEvent, (&'static str, String)>;

/// Runs one member until the task is aborted (the member left the hub or changed source).
pub async fn run(
    cluster: ClusterId,
    access: KubeAccess,
    timings: HealthTimings,
    hub: Option<Client>,
    fleet: Fleet,
    tx: mpsc::Sender<SourceEvent>,
) {
    let heartbeat = Duration::from_secs(timings.heartbeat_seconds.max(1));
    // Kept across reconnects: the last known objects serve until a new list replaces them.
    let mut state = MemberState::new(cluster.clone());
    'connect: loop {
        let Some(client) = connect(&cluster, &access, hub.as_ref(), heartbeat, &tx).await else {
            return;
        };
        fleet.update(&cluster, |f| f.client = Some(client.clone()));
        let (signal_tx, mut signal) = watch::channel(Signal::None);
        let _heartbeats = AbortOnDrop(tokio::spawn(heartbeats(
            cluster.clone(),
            client.clone(),
            heartbeat,
            fleet.clone(),
            tx.clone(),
            signal_tx,
        )));
        loop {
            let mut watches = watch_all(&client);
            let mut failures: BTreeMap<&'static str, (Instant, String)> = BTreeMap::new();
            let mut reported: Option<String> = None;
            let mut expiry = tokio::time::interval(Duration::from_secs(5));
            loop {
                tokio::select! {
                    item = watches.next() => {
                        let Some(item) = item else { break };
                        let mut batch = vec![item];
                        while batch.len() < BATCH {
                            match watches.next().now_or_never() {
                                Some(Some(item)) => batch.push(item),
                                _ => break,
                            }
                        }
                        for item in batch {
                            match item {
                                Ok(event) => {
                                    failures.remove(kind_of(&event));
                                    state.apply(event);
                                }
                                Err((kind, e)) => {
                                    debug!(kind, error = %e, "watch failed");
                                    failures.insert(kind, (Instant::now(), format!("watch {kind}: {e}")));
                                }
                            }
                        }
                        if let Some(event) = state.take_event()
                            && tx.send(event).await.is_err()
                        {
                            return;
                        }
                        publish_facts(&fleet, &cluster, &state);
                    }
                    changed = signal.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        let what = *signal.borrow_and_update();
                        state.relist_all();
                        match what {
                            Signal::Recovered => {
                                info!("API reachable again: relisting");
                                break;
                            }
                            Signal::Reconnect => {
                                info!("credentials refused: reading them again and reconnecting");
                                continue 'connect;
                            }
                            Signal::None => {}
                        }
                    }
                    _ = expiry.tick() => {
                        failures.retain(|_, (at, _)| at.elapsed() < WATCH_FAILURE_MEMORY);
                    }
                }
                let now_failing = failures.values().next().map(|(_, reason)| reason.clone());
                if now_failing != reported {
                    if let Some(reason) = &now_failing {
                        warn!(reason = %reason, "a watch is failing");
                    } else {
                        info!("watches are fine again");
                    }
                    reported.clone_from(&now_failing);
                    let event = SourceEvent::WatchHealth {
                        cluster: cluster.clone(),
                        failure: now_failing,
                    };
                    if tx.send(event).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Builds the client, retrying with backoff (and reporting why) until it works.
async fn connect(
    cluster: &ClusterId,
    access: &KubeAccess,
    hub: Option<&Client>,
    heartbeat: Duration,
    tx: &mpsc::Sender<SourceEvent>,
) -> Option<Client> {
    let mut backoff = Duration::from_millis(500);
    loop {
        match connect::member_client(access, hub).await {
            Ok(client) => return Some(client),
            Err(reason) => {
                warn!(reason = %reason, "cannot connect to the member");
                let event = SourceEvent::Heartbeat {
                    cluster: cluster.clone(),
                    result: Err(reason),
                };
                if tx.send(event).await.is_err() {
                    return None;
                }
                tokio::time::sleep(backoff.min(heartbeat)).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// What the heartbeats tell the watch loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Signal {
    None,
    /// The API answers again after failing: relist.
    Recovered,
    /// The API keeps refusing the credentials: build the client again from the kubeconfig or
    /// Secret (which may have been rotated).
    Reconnect,
}

/// Refused credentials this many heartbeats in a row make the member source reconnect.
const REFUSED_BEFORE_RECONNECT: u32 = 3;

/// GET /readyz every `every`; tells the store, and the watch loop when the API came back.
async fn heartbeats(
    cluster: ClusterId,
    client: Client,
    every: Duration,
    fleet: Fleet,
    tx: mpsc::Sender<SourceEvent>,
    signal: watch::Sender<Signal>,
) {
    let mut failing = false;
    let mut refused = 0u32;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let result = readyz(&client, every)
            .await
            .map_err(|(reason, auth): (String, bool)| {
                refused = if auth { refused + 1 } else { 0 };
                reason
            });
        if refused >= REFUSED_BEFORE_RECONNECT {
            signal.send_replace(Signal::Reconnect);
        }
        if result.is_ok() {
            if fleet.get(&cluster, |f| f.kubernetes_version.is_none())
                && let Ok(info) = client.apiserver_version().await
            {
                fleet.update(&cluster, |f| f.kubernetes_version = Some(info.git_version));
            }
            fleet.update(&cluster, |f| f.last_heartbeat = Some(SystemTime::now()));
            refused = 0;
            if failing {
                signal.send_replace(Signal::Recovered);
            }
        }
        failing = result.is_err();
        let event = SourceEvent::Heartbeat {
            cluster: cluster.clone(),
            result,
        };
        if tx.send(event).await.is_err() {
            return;
        }
    }
}

/// `Err((reason, refused))`, where `refused` says the credentials were (401 or 403).
async fn readyz(client: &Client, timeout: Duration) -> Result<(), (String, bool)> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| (e.to_string(), false))?;
    let answer = tokio::time::timeout(
        timeout.max(Duration::from_secs(1)),
        client.request_text(request),
    )
    .await;
    match answer {
        Ok(Ok(body)) if body.trim() == "ok" => Ok(()),
        Ok(Ok(body)) => Err((format!("/readyz: {}", body.trim()), false)),
        Ok(Err(kube::Error::Api(e))) if e.code == 401 || e.code == 403 => Err((
            format!(
                "/readyz: credentials refused ({} {}): {}",
                e.code, e.reason, e.message
            ),
            true,
        )),
        Ok(Err(e)) => Err((format!("/readyz: {e}"), false)),
        Err(_) => Err((format!("/readyz: no answer within {timeout:?}"), false)),
    }
}

fn publish_facts(fleet: &Fleet, cluster: &ClusterId, state: &MemberState) {
    let (capacity, allocatable) = state.capacity();
    let namespaces = state.namespaces();
    let exports = state.exports();
    let listed = state.listed();
    fleet.update(cluster, |f| {
        f.capacity = capacity;
        f.allocatable = allocatable;
        f.namespaces = namespaces;
        f.exports = exports;
        f.listed = listed;
    });
}

fn kind_of(event: &MemberEvent) -> &'static str {
    match event {
        MemberEvent::Service(_) => "services",
        MemberEvent::Slice(_) => "endpointslices",
        MemberEvent::Export(_) => "serviceexports",
        MemberEvent::Import(_) => "serviceimports",
        MemberEvent::Node(_) => "nodes",
        MemberEvent::Namespace(_) => "namespaces",
    }
}

/// Every watch of a member, merged. What meridian writes itself is left out of Services and
/// EndpointSlices, so its derived objects never read back as the member's own.
fn watch_all(client: &Client) -> SelectAll<BoxStream<'static, WatchItem>> {
    let config = watcher::Config::default().timeout(WATCH_TIMEOUT_SECS);
    let own = config.clone().labels(MANAGED_BY_SELECTOR_EXCLUDED);
    futures::stream::select_all([
        watch(
            Api::all(client.clone()),
            own.clone(),
            MemberEvent::Service,
            "services",
        ),
        watch(
            Api::all(client.clone()),
            own,
            MemberEvent::Slice,
            "endpointslices",
        ),
        watch(
            Api::all(client.clone()),
            config.clone(),
            MemberEvent::Export,
            "serviceexports",
        ),
        watch(
            Api::all(client.clone()),
            config.clone(),
            MemberEvent::Import,
            "serviceimports",
        ),
        watch(
            Api::all(client.clone()),
            config.clone(),
            MemberEvent::Node,
            "nodes",
        ),
        watch(
            Api::all(client.clone()),
            config,
            MemberEvent::Namespace,
            "namespaces",
        ),
    ])
}

fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    wrap: fn(Event<K>) -> MemberEvent,
    kind: &'static str,
) -> BoxStream<'static, WatchItem>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    watcher::watcher(api, config)
        .default_backoff()
        .map(move |r| r.map(wrap).map_err(|e| (kind, e.to_string())))
        .boxed()
}
