//! A Kubernetes member source: one client, watches on Services, EndpointSlices, ServiceExports,
//! ServiceImports, Nodes, Pods (their requests only, for capacity) and Namespaces, and
//! heartbeats against `/readyz`. The capacity for placement (Nodes' allocatable minus bound
//! pods' requests) goes to the store at most once per heartbeat, when it changed.
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
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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

use super::connect::{self, WatchTimeout};
use super::state::{MemberEvent, MemberState};
use super::{AbortOnDrop, DERIVED_EXCLUDED, Facts};
use crate::SourceEvent;
use crate::convert::KubeAccess;

/// A watch failure counts (the member is Degraded) until this long after its last error:
/// kube-rs retries a failing watch at least every 30 s, and a re-opened watch says nothing
/// until an object changes.
const WATCH_FAILURE_MEMORY: Duration = Duration::from_secs(40);
/// How many ready watch events are folded into one batch for the store.
const BATCH: usize = 4096;

pub type WatchItem = Result<MemberEvent, WatchError>;

/// A failed watch of one kind of a member's objects, with the API server's status code when
/// it gave one (a refusal, a kind it does not serve, an expired resourceVersion).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct WatchError {
    /// The resource: `pods`, `resourcequotas`, …
    pub kind: &'static str,
    pub code: Option<u16>,
    pub message: String,
}

impl WatchError {
    fn of(kind: &'static str, e: &watcher::Error) -> Self {
        let code = match e {
            watcher::Error::InitialListFailed(kube::Error::Api(s))
            | watcher::Error::WatchStartFailed(kube::Error::Api(s))
            | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(s.code),
            watcher::Error::WatchError(s) => Some(s.code),
            _ => None,
        };
        Self {
            kind,
            code: code.filter(|c| *c != 0),
            message: e.to_string(),
        }
    }

    fn is_forbidden(&self) -> bool {
        self.code == Some(403)
    }

    /// The member's API does not serve the kind.
    fn is_not_served(&self) -> bool {
        self.code == Some(404)
    }

    /// 410 Gone: the resourceVersion is too old, and the watch relists.
    fn is_expired(&self) -> bool {
        self.code == Some(410)
    }
}

/// Runs one member until the task is aborted (the member left the hub or changed source).
pub async fn run(
    cluster: ClusterId,
    access: KubeAccess,
    timings: HealthTimings,
    hub: Option<Client>,
    fleet: Facts,
    tx: mpsc::Sender<SourceEvent>,
    watch_timeout: WatchTimeout,
) {
    let heartbeat = Duration::from_secs(timings.heartbeat_seconds.max(1));
    // Kept across reconnects: the last known objects serve until a new list replaces them.
    let mut state = MemberState::new(cluster.clone());
    // What the store last heard about the watches. Unknown at start: a previous task of this
    // member may have left a failure behind, which the first report clears.
    let mut reported = Some(String::from("unknown"));
    loop {
        let Some(connected) = connect(
            &cluster,
            &access,
            hub.as_ref(),
            heartbeat,
            &tx,
            watch_timeout,
        )
        .await
        else {
            return;
        };
        let client = connected.client.clone();
        fleet.update(&cluster, |f| f.connect(connected));
        // Starts set: the first successful heartbeat, like one after an outage, is reported
        // only once the first full list is in, so a member counts as synced (SERVFAIL
        // until then, never NXDOMAIN) only with its objects.
        let relisting = Arc::new(AtomicBool::new(true));
        let (signal_tx, mut signal) = watch::channel(Signal::None);
        let _heartbeats = AbortOnDrop(tokio::spawn(heartbeats(
            cluster.clone(),
            client.clone(),
            heartbeat,
            fleet.clone(),
            tx.clone(),
            (signal_tx, relisting.clone()),
        )));
        let mut watching = Watching {
            heartbeat,
            cluster: &cluster,
            state: &mut state,
            tx: &tx,
            fleet: &fleet,
            relisting: &relisting,
            reported: &mut reported,
        };
        loop {
            match watching.run(&client, watch_timeout, &mut signal).await {
                Next::Relist => continue,
                Next::Reconnect => break,
                Next::Stop => return,
            }
        }
    }
}

/// What ends one round of watches.
enum Next {
    /// The API is back after failing: watch again from a full list.
    Relist,
    /// The credentials were refused: build the client again.
    Reconnect,
    /// The store is gone.
    Stop,
}

/// One member's watch loop and what it reports.
struct Watching<'a> {
    /// How often the capacity may be sent (a burst of pod events is one update).
    heartbeat: Duration,
    cluster: &'a ClusterId,
    state: &'a mut MemberState,
    tx: &'a mpsc::Sender<SourceEvent>,
    fleet: &'a Facts,
    /// Set by the heartbeats when the API came back: heartbeats are not reported healthy until
    /// the relist is in, so the member's withdrawn endpoints come back only with fresh ones.
    relisting: &'a AtomicBool,
    reported: &'a mut Option<String>,
}

impl Watching<'_> {
    async fn run(
        &mut self,
        client: &Client,
        timeout: WatchTimeout,
        signal: &mut watch::Receiver<Signal>,
    ) -> Next {
        let mut watches = watch_all(client, timeout);
        let mut failures: BTreeMap<&'static str, (Instant, String)> = BTreeMap::new();
        let mut expiry = tokio::time::interval(Duration::from_secs(5));
        let mut capacity = tokio::time::interval(self.heartbeat);
        capacity.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                item = watches.next() => {
                    let Some(item) = item else { return Next::Relist };
                    if !self.apply_batch(item, &mut watches, &mut failures).await {
                        return Next::Stop;
                    }
                }
                changed = signal.changed() => {
                    if changed.is_err() {
                        return Next::Stop;
                    }
                    let what = *signal.borrow_and_update();
                    self.state.relist_all();
                    match what {
                        Signal::Recovered => {
                            info!("API reachable again: relisting");
                            return Next::Relist;
                        }
                        Signal::Reconnect => {
                            info!("credentials refused: reading them again and reconnecting");
                            return Next::Reconnect;
                        }
                        Signal::None => {}
                    }
                }
                _ = expiry.tick() => {
                    failures.retain(|_, (at, _)| at.elapsed() < WATCH_FAILURE_MEMORY);
                }
                _ = capacity.tick() => {
                    if let Some(event) = self.state.take_capacity()
                        && self.tx.send(event).await.is_err()
                    {
                        return Next::Stop;
                    }
                }
            }
            if !self.report_watches(&failures).await {
                return Next::Stop;
            }
        }
    }

    /// Applies an event and whatever else is ready, then sends the batch; false when the store
    /// is gone.
    async fn apply_batch(
        &mut self,
        first: WatchItem,
        watches: &mut SelectAll<BoxStream<'static, WatchItem>>,
        failures: &mut BTreeMap<&'static str, (Instant, String)>,
    ) -> bool {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match watches.next().now_or_never() {
                Some(Some(item)) => batch.push(item),
                _ => break,
            }
        }
        for item in batch {
            match item {
                Ok(event) => {
                    failures.remove(event.resource());
                    self.state.apply(event);
                }
                Err(e) if e.kind == "pods" && e.is_forbidden() => {
                    // Capacity becomes unknown; the member is not degraded for it.
                    debug!(error = %e, "pods cannot be listed");
                    self.state.pods_refused(e.message);
                }
                Err(e) if e.kind == "resourcequotas" && (e.is_forbidden() || e.is_not_served()) => {
                    // Quota use only refines a score; the member is not degraded for it.
                    debug!(error = %e, "resourcequotas cannot be listed");
                    self.state.quotas_refused(e.message);
                }
                Err(e) if e.is_expired() => {
                    // Routine (etcd compacted past the watch, an API server restarted): the
                    // watcher relists at once, and a relist that fails is a failure of its own.
                    // The member is not Degraded for it.
                    let kind = e.kind;
                    info!(
                        kind,
                        "watch {kind}: resourceVersion expired (410 Gone); relisting"
                    );
                }
                Err(e) => {
                    let kind = e.kind;
                    debug!(kind, error = %e, "watch failed");
                    failures.insert(kind, (Instant::now(), format!("watch {kind}: {e}")));
                }
            }
        }
        let Some(event) = self.state.take_event() else {
            publish_facts(self.fleet, self.cluster, self.state);
            return true;
        };
        let relisted = matches!(event, SourceEvent::Reset { .. });
        if self.tx.send(event).await.is_err() {
            return false;
        }
        publish_facts(self.fleet, self.cluster, self.state);
        if relisted && self.relisting.swap(false, Ordering::SeqCst) {
            // The API came back and its objects are in: now the member may be healthy again.
            let ok = SourceEvent::Heartbeat {
                cluster: self.cluster.clone(),
                result: Ok(()),
            };
            return self.tx.send(ok).await.is_ok();
        }
        true
    }

    /// Tells the store when the watches start or stop failing; false when the store is gone.
    async fn report_watches(
        &mut self,
        failures: &BTreeMap<&'static str, (Instant, String)>,
    ) -> bool {
        let now_failing = failures.values().next().map(|(_, reason)| reason.clone());
        if now_failing == *self.reported {
            return true;
        }
        match &now_failing {
            Some(reason) => warn!(reason = %reason, "a watch is failing"),
            None if self.reported.is_some() => info!("watches are fine"),
            None => {}
        }
        self.reported.clone_from(&now_failing);
        let event = SourceEvent::WatchHealth {
            cluster: self.cluster.clone(),
            failure: now_failing,
        };
        self.tx.send(event).await.is_ok()
    }
}

/// An unready API server lists every check; the reason keeps the failed ones (`[-]…`).
fn failed_checks(body: &str) -> String {
    let failed: Vec<&str> = body
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("[-]"))
        .collect();
    match failed.is_empty() {
        true => body.chars().take(200).collect(),
        false => failed.join("; "),
    }
}

/// Builds the client, retrying with backoff (and reporting why) until it works.
async fn connect(
    cluster: &ClusterId,
    access: &KubeAccess,
    hub: Option<&Client>,
    heartbeat: Duration,
    tx: &mpsc::Sender<SourceEvent>,
    watch_timeout: WatchTimeout,
) -> Option<connect::Connected> {
    let mut backoff = Duration::from_millis(500);
    loop {
        match connect::member_client(access, hub, watch_timeout).await {
            Ok(connected) => return Some(connected),
            Err(e) => {
                let reason = crate::reason_of(&e);
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
    fleet: Facts,
    tx: mpsc::Sender<SourceEvent>,
    (signal, relisting): (watch::Sender<Signal>, Arc<AtomicBool>),
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
        // meridian's own shortage says nothing of the member: its health stands as it was.
        if result
            .as_ref()
            .is_err_and(|r| r == crate::OUT_OF_DESCRIPTORS)
        {
            warn!(cluster = %cluster, "{}", crate::OUT_OF_DESCRIPTORS);
            continue;
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
                relisting.store(true, Ordering::SeqCst);
                signal.send_replace(Signal::Recovered);
            }
        }
        failing = result.is_err();
        if result.is_ok() && relisting.load(Ordering::SeqCst) {
            // Reported by the watch loop once the relist is in.
            continue;
        }
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
pub async fn readyz(client: &Client, timeout: Duration) -> Result<(), (String, bool)> {
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
        Ok(Err(kube::Error::Api(e))) => Err((
            format!("/readyz: {} {}", e.code, failed_checks(&e.message)),
            false,
        )),
        Ok(Err(e)) if crate::out_of_descriptors(&e) => {
            Err((crate::OUT_OF_DESCRIPTORS.to_owned(), false))
        }
        Ok(Err(e)) => Err((format!("/readyz: {e}"), false)),
        Err(_) => Err((format!("/readyz: no answer within {timeout:?}"), false)),
    }
}

pub(crate) fn publish_facts(fleet: &Facts, cluster: &ClusterId, state: &MemberState) {
    let (capacity, allocatable) = state.capacity();
    let namespaces = state.namespaces();
    let exports = state.exports();
    let listed = state.listed();
    fleet.update(cluster, |f| {
        f.capacity = capacity;
        f.allocatable = allocatable;
        f.namespaces = namespaces.keys().cloned().collect();
        f.namespace_labels = namespaces;
        f.exports = exports;
        f.listed = listed;
    });
}

/// Every watch of a member, merged. The derived Services and EndpointSlices meridian writes
/// are left out, so they never read back as the member's own.
pub fn watch_all(
    client: &Client,
    timeout: WatchTimeout,
) -> SelectAll<BoxStream<'static, WatchItem>> {
    let config = watcher::Config::default().timeout(timeout.0);
    let own = config.clone().labels(DERIVED_EXCLUDED);
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
            config.clone(),
            MemberEvent::Namespace,
            "namespaces",
        ),
        watch(
            Api::all(client.clone()),
            config.clone(),
            MemberEvent::Quota,
            "resourcequotas",
        ),
        // Finished pods hold nothing; the API leaves them out.
        watch(
            Api::all(client.clone()),
            config.fields("status.phase!=Succeeded,status.phase!=Failed"),
            MemberEvent::Pod,
            "pods",
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
        .map(move |r| r.map(wrap).map_err(|e| WatchError::of(kind, &e)))
        .boxed()
}

#[cfg(test)]
mod tests;
