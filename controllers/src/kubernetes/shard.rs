//! Sharded writers on a Kubernetes hub: each replica renews a Lease of its own,
//! reads the others', and holds the members that rendezvous hashing gives it among the live
//! replicas — each won with a compare-and-swap of the member's claim annotation, so no member
//! ever has two writers. The same Leases carry each replica's view of which members it cannot
//! reach, from which every replica learns whether its own view is the majority's.
//!
//! ```text
//!  every retry period:
//!    renew Lease meridian-shard-<identity> (annotation: the members unreachable from here)
//!    list the shard Leases ─► shard::Peers (renewals timed on our clock) ─► live replicas
//!    list MemberClusters (metadata) ─► shard::step per member, on its claim annotation
//!        Release: drop it from Held first, clear the claim a round later (the drain handshake)
//!        Take:    patch the claim with the resourceVersion read (409: someone was first)
//!    publish Held { until: renew deadline, members } ─► Leadership::may_write_to
//!    shard::confirm per member ─► SourceEvent::Confirmations ─► the Registry
//! ```
//!
//! A replica whose Lease lapsed (frozen, cut from the hub) forgets what it held: its renew
//! deadline passes before any other replica sees its Lease expire (as in `leader`), and after
//! it it must win every claim again, against the claims others wrote meanwhile.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::PartialObjectMeta;
use kube::{Api, Client};
use meridian_core::ClusterId;
use meridian_core::shard::{self, Confirmation, Peers, Report, Step};
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use super::leader::Held;
use crate::SourceEvent;
use crate::crd::MemberCluster;

/// The annotation on a MemberCluster naming the replica that writes it.
pub const CLAIM: &str = "meridian.io/writer";
/// The annotation on a shard Lease listing the members its replica cannot reach.
pub const UNREACHABLE: &str = "meridian.io/unreachable";
/// The label of the shard Leases, valued with the leader-election Lease's name (so two
/// meridian deployments in one namespace keep apart).
pub const SHARD_LABEL: &str = "meridian.io/shards-of";

#[derive(Clone, Debug)]
pub struct ShardConfig {
    pub namespace: String,
    /// The leader-election Lease's name: the shard Leases are labelled with it.
    pub group: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl ShardConfig {
    /// This replica's Lease: `meridian-shard-<identity>`, made a valid object name.
    pub fn lease_name(&self) -> String {
        let cleaned: String = self
            .identity
            .to_ascii_lowercase()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        let name = format!("{}-shard-{}", self.group, cleaned.trim_matches('-'));
        super::bounded_name(&name, &self.identity)
    }
}

/// One member as this replica sees it, for `/debug/shards`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberShard {
    /// The replica named in the member's claim.
    pub claim: Option<String>,
    /// Its rendezvous owner among the live replicas.
    pub owner: Option<String>,
    pub held: bool,
    #[serde(flatten)]
    pub step: Step,
}

/// What the shard task knows, for `/debug/shards` and `meridian status`.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardState {
    pub identity: String,
    pub lease: String,
    pub live_replicas: Vec<String>,
    /// Every live replica's report (this one's included): the members it cannot reach.
    pub reports: BTreeMap<String, Report>,
    pub hub_readable: bool,
    pub members: BTreeMap<String, MemberShard>,
    /// The confirmation of each member this replica cannot reach.
    pub confirmations: BTreeMap<String, Confirmation>,
    pub last_round: Option<String>,
    pub last_error: Option<String>,
}

/// Shared with the admin server.
#[derive(Clone, Debug, Default)]
pub struct ShardView(Arc<Mutex<ShardState>>);

impl ShardView {
    pub fn get(&self) -> ShardState {
        self.0.lock().clone()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandoverLabels {
    step: &'static str,
}

/// Prometheus metrics of the shard task.
#[derive(Clone, Debug, Default)]
pub struct ShardMetrics {
    held: Family<ClusterLabels, Gauge>,
    live: Gauge,
    hub_readable: Gauge,
    handovers: Family<HandoverLabels, Counter>,
    unconfirmed: Gauge,
}

impl ShardMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "held",
            "1 for each member this replica writes (sharded writers)",
            m.held.clone(),
        );
        registry.register(
            "live_replicas",
            "Replicas whose shard Lease this replica sees renewed",
            m.live.clone(),
        );
        registry.register(
            "hub_readable",
            "1 while the other replicas' Leases can be read; 0: members unreachable from here are served stale",
            m.hub_readable.clone(),
        );
        registry.register(
            "handovers",
            "Members taken (claim won) or released by this replica",
            m.handovers.clone(),
        );
        registry.register(
            "unconfirmed_members",
            "Members this replica cannot reach but a majority of replicas can (or the hub cannot tell): served, not withdrawn",
            m.unconfirmed.clone(),
        );
        m
    }
}

/// Starts the shard task. `local` is what this replica's Registry sees unreachable; the
/// returned receiver is what it holds, for `Leadership::sharded`.
pub fn start(
    client: Client,
    config: ShardConfig,
    local: watch::Receiver<Arc<BTreeSet<ClusterId>>>,
    events: mpsc::Sender<SourceEvent>,
    metrics: ShardMetrics,
) -> (
    watch::Receiver<Arc<Held>>,
    ShardView,
    tokio::task::JoinHandle<()>,
) {
    let (tx, held) = watch::channel(Arc::new(Held::default()));
    let view = ShardView::default();
    let shards = Shards {
        leases: Api::namespaced(client.clone(), &config.namespace),
        members: Api::all(client),
        lease_name: config.lease_name(),
        config,
        peers: Peers::default(),
        held: Held::default(),
        draining: BTreeSet::new(),
        peers_read: None,
        confirmed: BTreeMap::new(),
        tx,
        local,
        events,
        view: view.clone(),
        metrics,
    };
    (held, view, tokio::spawn(shards.run()))
}

struct Shards {
    leases: Api<Lease>,
    members: Api<MemberCluster>,
    config: ShardConfig,
    lease_name: String,
    peers: Peers,
    held: Held,
    /// Members released from Held last round: their claims are cleared this round.
    draining: BTreeSet<ClusterId>,
    /// When the other replicas' Leases were last read (sent).
    peers_read: Option<Instant>,
    /// What was last sent to the Registry per member.
    confirmed: BTreeMap<ClusterId, Confirmation>,
    tx: watch::Sender<Arc<Held>>,
    local: watch::Receiver<Arc<BTreeSet<ClusterId>>>,
    events: mpsc::Sender<SourceEvent>,
    view: ShardView,
    metrics: ShardMetrics,
}

impl Shards {
    async fn run(mut self) {
        info!(lease = %self.lease_name, identity = %self.config.identity, "sharded writers: renewing this replica's Lease");
        loop {
            if self.events.is_closed() {
                return;
            }
            self.round().await;
            tokio::time::sleep(self.config.retry_period).await;
        }
    }

    async fn round(&mut self) {
        let sent = Instant::now();
        if self.held.until.is_some_and(|t| sent >= t) {
            if !self.held.members.is_empty() {
                warn!(
                    members = self.held.members.len(),
                    "shard Lease lapsed: no longer writing the members this replica held; each must be won again"
                );
            }
            self.held = Held::default();
            self.publish();
        }
        let mine = self.report();
        let mut errors = Vec::new();
        let bound = self.config.renew_deadline;
        match within(bound, "renewing the shard Lease", self.renew(&mine)).await {
            Ok(()) => self.held.until = Some(sent + self.config.renew_deadline),
            Err(e) => errors.push(e),
        }
        match within(bound, "reading the shard Leases", self.read_peers(sent)).await {
            Ok(()) => self.peers_read = Some(sent),
            Err(e) => errors.push(e),
        }
        let now = Instant::now();
        let live: Vec<String> = self
            .peers
            .live(&self.config.identity, now, self.config.lease_duration)
            .into_iter()
            .map(str::to_string)
            .collect();
        let mut members = BTreeMap::new();
        if self.held.until.is_some_and(|t| now < t) {
            match within(bound, "claiming members", self.claim_members(&live)).await {
                Ok(m) => members = m,
                Err(e) => errors.push(e),
            }
        }
        self.publish();
        let hub_fresh = self
            .peers_read
            .is_some_and(|t| now.saturating_duration_since(t) < self.config.lease_duration);
        let confirmations = self.confirm(&mine, hub_fresh, now).await;
        for e in &errors {
            warn!(error = %e, "sharded writers");
        }
        self.record(live, mine, hub_fresh, members, confirmations, errors);
    }

    /// The members this replica's Registry cannot reach.
    fn report(&self) -> Report {
        Report {
            unreachable: self
                .local
                .borrow()
                .iter()
                .map(|c| c.as_str().to_string())
                .collect(),
        }
    }

    /// Renews (or creates) this replica's Lease, with its report. Nobody else writes it.
    async fn renew(&self, report: &Report) -> Result<(), kube::Error> {
        let stamp = MicroTime(Timestamp::now());
        let seconds = i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let unreachable = report
            .unreachable
            .iter()
            .cloned()
            .collect::<Vec<_>>()
            .join(",");
        let mut lease = self
            .leases
            .get_opt(&self.lease_name)
            .await?
            .unwrap_or_default();
        let fresh = lease.metadata.resource_version.is_none();
        lease.metadata.name = Some(self.lease_name.clone());
        lease.metadata.namespace = Some(self.config.namespace.clone());
        lease
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(SHARD_LABEL.into(), self.config.group.clone());
        lease
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(UNREACHABLE.into(), unreachable);
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            spec.acquire_time = Some(stamp.clone());
        }
        spec.holder_identity = Some(self.config.identity.clone());
        spec.lease_duration_seconds = Some(seconds);
        spec.renew_time = Some(stamp);
        if fresh {
            self.leases.create(&PostParams::default(), &lease).await?;
        } else {
            self.leases
                .replace(&self.lease_name, &PostParams::default(), &lease)
                .await?;
        }
        Ok(())
    }

    async fn read_peers(&mut self, now: Instant) -> Result<(), kube::Error> {
        let selector = format!("{SHARD_LABEL}={}", self.config.group);
        let leases = self
            .leases
            .list(&ListParams::default().labels(&selector))
            .await?;
        let mut present = BTreeSet::new();
        for lease in leases {
            let spec = lease.spec.unwrap_or_default();
            let (Some(holder), Some(renewal)) = (spec.holder_identity, spec.renew_time) else {
                continue; // released
            };
            if holder.is_empty() || holder == self.config.identity {
                continue;
            }
            let report = Report {
                unreachable: lease
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(UNREACHABLE))
                    .map(|v| {
                        v.split(',')
                            .filter(|m| !m.is_empty())
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default(),
            };
            self.peers
                .observe(&holder, &renewal.0.to_string(), report, now);
            if self
                .peers
                .silent_for(&holder, now)
                .is_some_and(|t| t >= self.stale_after())
            {
                self.delete_stale(&lease.metadata, &holder).await;
                continue;
            }
            present.insert(holder);
        }
        self.peers.retain(&present);
        Ok(())
    }

    /// A replica gone this long left for good (a default identity names a process): its
    /// Lease is deleted, so Leases do not pile up over restarts.
    fn stale_after(&self) -> Duration {
        (self.config.lease_duration * 10).max(Duration::from_secs(300))
    }

    /// Deletes a dead replica's Lease if it is still what was read (a renewal meanwhile keeps
    /// it).
    async fn delete_stale(&self, meta: &ObjectMeta, holder: &str) {
        let Some(name) = meta.name.as_deref() else {
            return;
        };
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: meta.resource_version.clone(),
                uid: meta.uid.clone(),
            }),
            ..DeleteParams::default()
        };
        match self.leases.delete(name, &params).await {
            Ok(_) => info!(
                lease = name,
                replica = holder,
                "deleted the Lease of a replica gone for good"
            ),
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => warn!(lease = name, error = %e, "cannot delete a dead replica's Lease"),
        }
    }

    /// Reads every member's claim and takes, keeps or releases it.
    async fn claim_members(
        &mut self,
        live: &[String],
    ) -> Result<BTreeMap<String, MemberShard>, kube::Error> {
        let live: Vec<&str> = live.iter().map(String::as_str).collect();
        let me = self.config.identity.clone();
        let list = self.members.list_metadata(&ListParams::default()).await?;
        let mut steps = Vec::new();
        for m in list {
            let Some(name) = m.metadata.name.clone() else {
                continue;
            };
            let claim = claim_of(&m);
            let id = ClusterId::new(&name);
            let held = self.held.members.contains(&id);
            let step = shard::step(&me, &name, claim.as_deref(), &live, held);
            steps.push((id, m, claim, step));
        }
        // Stop writing first: what is released or taken by others leaves Held before its
        // claim is cleared, and members gone from the hub leave it too.
        let keep: BTreeSet<ClusterId> = steps
            .iter()
            .filter(|(_, _, _, s)| *s == Step::Keep)
            .map(|(id, ..)| id.clone())
            .collect();
        if keep != self.held.members {
            for gone in self.held.members.difference(&keep) {
                info!(cluster = %gone, "no longer writing this member");
            }
            self.held.members = keep;
            self.publish();
        }
        let mut out = BTreeMap::new();
        let mut draining = BTreeSet::new();
        for (id, meta, claim, step) in steps {
            match &step {
                Step::Release => {
                    // Writes already on the wire when the member left Held finish before its
                    // claim is cleared: the claim goes a round after the writing stopped.
                    draining.insert(id.clone());
                    if self.draining.contains(&id) && self.set_claim(&meta, None).await {
                        info!(cluster = %id, "released the member to its new owner");
                        self.count("release");
                    }
                }
                Step::Take => {
                    if self.set_claim(&meta, Some(&me)).await {
                        info!(cluster = %id, previous = ?claim, "writing this member now");
                        self.count("take");
                        self.held.members.insert(id.clone());
                    }
                }
                Step::Keep | Step::Wait { .. } => {}
            }
            out.insert(
                id.as_str().to_string(),
                MemberShard {
                    owner: shard::owner(id.as_str(), live.iter().copied()).map(str::to_string),
                    held: self.held.members.contains(&id),
                    claim,
                    step,
                },
            );
        }
        self.draining = draining;
        Ok(out)
    }

    /// Writes the member's claim if it is still what was read (the resourceVersion makes the
    /// patch a compare-and-swap); whether it was written.
    async fn set_claim(&self, meta: &PartialObjectMeta<MemberCluster>, to: Option<&str>) -> bool {
        let Some(name) = meta.metadata.name.as_deref() else {
            return false;
        };
        let patch = json!({
            "metadata": {
                "resourceVersion": meta.metadata.resource_version,
                "annotations": { CLAIM: to },
            }
        });
        match self
            .members
            .patch_metadata(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => true,
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
                debug!(
                    cluster = name,
                    "the member's claim changed since it was read"
                );
                false
            }
            Err(e) => {
                warn!(cluster = name, error = %e, "cannot write the member's claim");
                false
            }
        }
    }

    fn count(&self, step: &'static str) {
        self.metrics
            .handovers
            .get_or_create(&HandoverLabels { step })
            .inc();
    }

    fn publish(&self) {
        let held = Arc::new(self.held.clone());
        self.tx.send_if_modified(|h| {
            let changed = **h != *held;
            if changed {
                *h = held;
            }
            changed
        });
    }

    /// Tells the Registry what the live replicas say of each member this one cannot reach
    /// (every round, not only on a change: a member removed and added again starts Pending).
    async fn confirm(
        &mut self,
        mine: &Report,
        hub_fresh: bool,
        now: Instant,
    ) -> BTreeMap<String, Confirmation> {
        let (identity, lease) = (self.config.identity.as_str(), self.config.lease_duration);
        let reports: Vec<&Report> = self
            .peers
            .reports(identity, now, lease)
            .map(|(_, r)| r)
            .collect();
        let mut verdicts = BTreeMap::new();
        for member in &mine.unreachable {
            let id = ClusterId::new(member);
            let previous = self
                .confirmed
                .get(&id)
                .copied()
                .unwrap_or(Confirmation::Pending);
            let c = shard::confirm(member, mine, reports.iter().copied(), hub_fresh, previous);
            verdicts.insert(id, c);
        }
        // Members reachable again keep no verdict: the next loss waits for the next round.
        let mut sent: Vec<(ClusterId, Confirmation)> = self
            .confirmed
            .keys()
            .filter(|id| !verdicts.contains_key(*id))
            .map(|id| (id.clone(), Confirmation::Pending))
            .collect();
        sent.extend(verdicts.iter().map(|(id, c)| (id.clone(), *c)));
        if !sent.is_empty() {
            let _ = self.events.send(SourceEvent::Confirmations(sent)).await;
        }
        let shown = verdicts
            .iter()
            .map(|(id, c)| (id.as_str().to_string(), *c))
            .collect();
        self.confirmed = verdicts;
        shown
    }

    fn record(
        &self,
        live: Vec<String>,
        mine: Report,
        hub_fresh: bool,
        members: BTreeMap<String, MemberShard>,
        confirmations: BTreeMap<String, Confirmation>,
        errors: Vec<String>,
    ) {
        let now = Instant::now();
        let identity = self.config.identity.as_str();
        let mut reports: BTreeMap<String, Report> = self
            .peers
            .reports(identity, now, self.config.lease_duration)
            .map(|(r, rep)| (r.to_string(), rep.clone()))
            .collect();
        reports.insert(identity.to_string(), mine);
        self.metrics.live.set(live.len() as i64);
        self.metrics.hub_readable.set(i64::from(hub_fresh));
        self.metrics.unconfirmed.set(
            confirmations
                .values()
                .filter(|c| **c != Confirmation::Confirmed)
                .count() as i64,
        );
        self.metrics.held.clear();
        for m in &self.held.members {
            self.metrics
                .held
                .get_or_create(&ClusterLabels {
                    cluster: m.as_str().to_string(),
                })
                .set(1);
        }
        let mut state = self.view.0.lock();
        let keep_members = members.is_empty() && !errors.is_empty();
        *state = ShardState {
            identity: identity.to_string(),
            lease: self.lease_name.clone(),
            live_replicas: live,
            reports,
            hub_readable: hub_fresh,
            members: if keep_members {
                // The hub could not be read: the last view, with what we hold now.
                let mut last = std::mem::take(&mut state.members);
                for (name, m) in &mut last {
                    m.held = self.held.members.contains(&ClusterId::new(name));
                }
                last
            } else {
                members
            },
            confirmations,
            last_round: Timestamp::try_from(SystemTime::now())
                .ok()
                .map(|t| t.to_string()),
            last_error: errors.into_iter().next(),
        };
    }
}

/// A hub request of a round, bounded by the renew deadline: a hub that stopped answering
/// must not stall the round, which judges the Lease and the hub's freshness by the clock.
async fn within<T>(
    bound: Duration,
    what: &str,
    request: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(bound, request).await {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: the hub did not answer within {bound:?}")),
    }
}

fn claim_of(m: &PartialObjectMeta<MemberCluster>) -> Option<String> {
    m.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CLAIM))
        .filter(|c| !c.is_empty())
        .cloned()
}
