//! Propagation: every placed object is written into its Kubernetes members,
//! kept there, and what the members did is reported back. Each member is written by whoever
//! may write it (`Leadership::may_write_to`: the leader, or with sharded writers the replica
//! holding the member); the hub-wide records (Placements, the templates' and policies'
//! status) by the leader. Every replica that writes watches every member, so a rollout that
//! drains one member for another sees the other's copies whoever writes them.
//!
//! ```text
//!  snapshot (decisions, templates, overrides, cluster health)
//!    + what each member holds (a watch per placed kind, on meridian's label)
//!    ─► core's Rollout per template: writes, drains, deletes (growth first)
//!    ─► per write: federation::render::manifest (replicas, overrides, meridian's marks)
//!         + retain (an HPA's /spec/replicas, the policy's paths: left to the member, and
//!           handed over first where meridian still owns them)
//!         + conflict check (an object meridian did not label: Abort | Overwrite)
//!         + the namespace, created (and labelled) when the member has none
//!       ─► Applier::apply when changed or drifted (federation::drift: the watch against what
//!          the member admitted of the last apply; reverts that keep coming back are held off)
//!    ─► status: federation::status::aggregate onto the hub template; a Placement per template
//! ```
//!
//! On a Kubernetes hub a member meridian writes into carries the finalizer
//! `meridian.io/placed-copies` on its MemberCluster: deleting it makes the member *retiring*
//! (core places nothing there), its copies move out the graceful way, and the finalizer goes
//! once the member holds none (or cannot be reached: what it holds is then left there).
//!
//! An Unreachable member is never written to: what it holds stays as it was, and since a
//! drain waits for its replacement (or the grace period), nothing moves until the rollout
//! says so. What meridian placed there and no longer wants is deleted when it returns.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use meridian_core::placement::{
    Decision, Held, OverridePolicy, Placed, PlacedReason, Placements, Rollout, Step, TemplateKey,
    override_rules,
};
use meridian_core::stages::Command;
use meridian_core::{ClusterId, ConflictResolution, ObjectKey, Propagation, Snapshot, Template};
use meridian_federation::{drift, render, retain, status, template};
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};
use tracing::{debug, info, warn};

use super::apply::{self, Applier, ApplyOptions, ObjectId, Written};
use super::connect;
use super::leader::Leadership;
use super::reconcile::{self, MemberState, Round, Slot, Slots, Wake};
use super::{AbortOnDrop, Facts, MANAGED_BY, MANAGED_BY_SELECTOR, MEMBER_CLUSTER};
use crate::crd::ClusterSchedulingPolicy;
use crate::metrics::PropagationMetrics;
use copies::{CopyStore, LiveCopy};
use dirty::{Dirty, Events, Holders};
pub use staged::RolloutView;
use staged::{Gate, HeldAt, Received, Staged, Write};

/// The label that says which template an object in a member was placed from (a bounded
/// form of the template's kind, group and name; the namespace is the object's own).
pub const TEMPLATE_LABEL: &str = "meridian.io/template";
/// On a copy whose policy says preserveResourcesOnDeletion: the copy outlives its template even
/// when the replica that deletes it never saw the policy.
pub const PRESERVE_ANNOTATION: &str = "meridian.io/preserve-on-deletion";
pub use super::apply::APPLIED_ANNOTATION;
/// On a MemberCluster meridian has written into: its deletion waits until the copies are out.
pub const MEMBER_FINALIZER: &str = "meridian.io/placed-copies";
/// Objects found in the way (conflicts) are looked for again this often.
const RESYNC: Duration = Duration::from_secs(60);
/// A running staged rollout is stepped at least this often.
const ROLLOUT_STEP: Duration = Duration::from_secs(1);
/// A round runs at least this often (besides its rollouts' deadlines and its watches).
const TICK: Duration = Duration::from_secs(5);
/// Drift reverted this many times in a row, each within [`FIGHT_WINDOW`] of the last, is a
/// fight with another controller: the object is left alone for [`HOLD_FIRST`], doubling up to
/// [`HOLD_MAX`] while the fight goes on.
const FIGHT_REVERTS: u32 = 5;
const FIGHT_WINDOW: Duration = Duration::from_secs(120);
const HOLD_FIRST: Duration = Duration::from_secs(30);
const HOLD_MAX: Duration = Duration::from_secs(600);

/// The label value naming `key`: `<kind>.<group>.<name>` (group `core` for v1), bounded to 63
/// characters with a hash.
pub fn template_label(key: &TemplateKey) -> String {
    let group = match key.group() {
        "" => "core",
        g => g,
    };
    let full = format!("{}.{}.{}", key.kind, group, key.name).to_lowercase();
    super::bounded_name(&full, &full)
}

fn template_key_of(id: &ObjectId) -> TemplateKey {
    TemplateKey::new(
        &id.api_version,
        &id.kind,
        id.namespace.as_deref().unwrap_or_default(),
        &id.name,
    )
}

fn object_id(key: &TemplateKey) -> ObjectId {
    ObjectId::new(&key.api_version, &key.kind, Some(&key.namespace), &key.name)
}

/// What `/debug/placements` and `meridian explain` show of propagation, per template.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TemplateView {
    pub step: Step,
    /// Per cluster: what it holds and how the last write went.
    pub copies: BTreeMap<ClusterId, CopyView>,
    /// Clusters holding an object of that name meridian did not create (conflictResolution
    /// Abort).
    pub conflicts: Vec<ClusterId>,
}

#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CopyView {
    pub replicas: Option<u32>,
    pub ready: bool,
    pub applied: bool,
    pub error: Option<String>,
    pub observed_generation: Option<i64>,
    pub ready_replicas: Option<i64>,
    pub available_replicas: Option<i64>,
}

/// The propagation state readers see (shared with the admin server).
#[derive(Clone, Default)]
pub struct PropagationView {
    templates: Arc<Mutex<BTreeMap<TemplateKey, TemplateView>>>,
    rollouts: Arc<Mutex<Rollouts>>,
    commands: staged::Commands,
    wake: Arc<Notify>,
}

/// The staged rollouts as the writer last saw them.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Rollouts {
    /// This replica drives the rollouts (it leads); otherwise `rollouts` is empty.
    pub leading: bool,
    pub rollouts: Vec<RolloutView>,
}

impl PropagationView {
    pub fn get(&self) -> BTreeMap<TemplateKey, TemplateView> {
        self.templates.lock().clone()
    }

    pub fn rollouts(&self) -> Rollouts {
        self.rollouts.lock().clone()
    }

    /// Queues an operator's command for every rollout of `policy`; refused on a replica that
    /// does not lead, or when the policy has no rollout.
    pub fn command(&self, policy: &ObjectKey, command: Command) -> Result<(), String> {
        let shown = self.rollouts.lock();
        if !shown.leading {
            return Err("this replica does not lead: send the command to the leader".into());
        }
        let name = policy.to_string();
        if !shown.rollouts.iter().any(|r| r.policy == name) {
            return Err(format!(
                "{name} has no staged rollout under way (is placement.rollout set, and has a template it places changed?)"
            ));
        }
        self.commands.lock().push((policy.clone(), command));
        self.wake.notify_one();
        Ok(())
    }

    fn take_commands(&self) -> Vec<(ObjectKey, Command)> {
        std::mem::take(&mut *self.commands.lock())
    }

    fn show_rollouts(&self, leading: bool, staged: &Staged) {
        *self.rollouts.lock() = Rollouts {
            leading,
            rollouts: staged.views(),
        };
    }

    /// Takes the views of `keys` from `views` (a key without one is gone).
    fn update(&self, keys: &BTreeSet<TemplateKey>, views: &BTreeMap<TemplateKey, TemplateView>) {
        let mut shown = self.templates.lock();
        for key in keys {
            match views.get(key) {
                Some(v) => shown.insert(key.clone(), v.clone()),
                None => shown.remove(key),
            };
        }
    }
}

impl TemplateView {
    /// Nothing left to do until an input changes: the rollout is settled with no deadline,
    /// every copy is applied without an error, and nothing is in the way.
    fn is_settled(&self) -> bool {
        self.step.is_settled()
            && self.step.deadline.is_none()
            && self.step.released.is_empty()
            && self.conflicts.is_empty()
            && self.copies.values().all(|c| c.applied && c.error.is_none())
    }
}

/// A watch on one kind of placed object in one member.
struct PlacedWatch {
    store: CopyStore,
    /// The first list is in: until then the store says nothing of what the member holds.
    listed: Arc<AtomicBool>,
    /// The last watch error (an RBAC refusal, say), until the watch works again.
    error: Arc<Mutex<Option<String>>>,
    _task: AbortOnDrop<()>,
}

/// The member's metadata.generation after meridian's last apply, and the template generation
/// that apply came from.
type Applied = (i64, i64);

/// What a pass reads of one live copy, as of its resourceVersion.
#[derive(Clone, Debug)]
struct LiveSummary {
    resource_version: Option<String>,
    replicas: Option<u32>,
    ready: bool,
    observed_generation: Option<i64>,
    ready_replicas: Option<i64>,
    available_replicas: Option<i64>,
    /// What the copy says of the write that made it, if another replica wrote it.
    applied_by_another: Option<Applied>,
    /// What it was rendered from: the template generation, the digest of a body without one,
    /// and of the override rules applied (see `staged::Received`).
    received: Option<Received>,
}

impl LiveSummary {
    fn of(id: &ObjectId, live: &LiveCopy) -> Self {
        let object = live.json();
        let field = |p: &str| object.pointer(p).and_then(Value::as_i64);
        Self {
            resource_version: live.resource_version.clone(),
            replicas: replica_count(id, &object),
            ready: status::ready(&id.kind, &object, None),
            observed_generation: field("/status/observedGeneration"),
            ready_replicas: field("/status/readyReplicas"),
            available_replicas: field("/status/availableReplicas"),
            applied_by_another: applied_by_another(&object),
            received: received(&object),
        }
    }
}

/// Drift reverts of one object that followed each other closely (see [`FIGHT_REVERTS`]).
#[derive(Clone, Copy, Debug)]
struct Reverts {
    count: u32,
    last: Instant,
    held_until: Option<Instant>,
}

impl Reverts {
    /// One more revert at `now`; starts (or lengthens) a hold when the fight goes on.
    fn revert(previous: Option<Reverts>, now: Instant) -> Reverts {
        let count = match previous {
            Some(r) if now.saturating_duration_since(r.last) <= FIGHT_WINDOW => r.count + 1,
            _ => 1,
        };
        let held_until = (count >= FIGHT_REVERTS).then(|| {
            let doublings = (count - FIGHT_REVERTS).min(8);
            now + (HOLD_FIRST * 2u32.pow(doublings)).min(HOLD_MAX)
        });
        Reverts {
            count,
            last: now,
            held_until,
        }
    }

    fn held(&self, now: Instant) -> Option<Duration> {
        self.held_until
            .map(|t| t.saturating_duration_since(now))
            .filter(|left| !left.is_zero())
    }
}

/// What a writing replica keeps per member: the watches of every member, and what it wrote
/// into those it may write.
struct Member {
    written: Written,
    /// Per object, the last apply body as the member admitted it (drift::admitted of its
    /// answer): what drift is measured against. Kept as JSON text (a parsed tree costs ~8×
    /// as much), read only when the copy changes.
    admitted: BTreeMap<ObjectId, Box<str>>,
    reverts: BTreeMap<ObjectId, Reverts>,
    /// Per copy, the inputs of the last pass that found nothing to write (see `plan`).
    quiet: HashMap<ObjectId, u64>,
    /// Per copy just written, the resourceVersion the watch showed before the write (None:
    /// no object): while the watch still shows it, the watch has not caught up with the
    /// write, and the old object is not drift.
    behind: HashMap<ObjectId, Option<String>>,
    /// Per copy, what a pass reads of the live object, read again only when its
    /// resourceVersion changes (not serialized per pass).
    held: HashMap<ObjectId, LiveSummary>,
    /// Per object, for observedGeneration gating.
    applied: BTreeMap<ObjectId, Applied>,
    watches: BTreeMap<(String, String), PlacedWatch>,
    hpas: Option<PlacedWatch>,
    errors: BTreeMap<ObjectId, String>,
    /// Objects found without meridian's label (checked once per resync).
    foreign: BTreeSet<ObjectId>,
    /// Objects known to be free or ours (no GET needed before writing).
    checked: BTreeSet<ObjectId>,
    namespaces: BTreeSet<String>,
    /// Copies the watch has shown once (only those can be "gone").
    seen: BTreeSet<ObjectId>,
    /// Bodies the member's API refused (4xx), by fingerprint: not sent again until they
    /// change or the next resync.
    refused: BTreeMap<ObjectId, u64>,
    /// What the member's HPAs scale, as (namespace, apiVersion, kind, name); per pass.
    hpa_targets: BTreeSet<(String, String, String, String)>,
    /// The member source has listed every kind once (its namespaces are known).
    source_listed: bool,
    /// Namespaces meridian deleted a copy from: deleted too once empty, if meridian made them.
    cleanup: BTreeSet<String>,
    /// The finalizer was put on the MemberCluster this term (or could not be).
    finalizer: bool,
    /// Retiring and let go of (the finalizer removed).
    released: bool,
    /// What the watches saw since the last pass.
    events: Arc<Mutex<Events>>,
    /// What the last pass saw of the member as a whole (None: not looked at yet).
    stamp: Option<MemberStamp>,
}

/// What of a member, besides its copies, the templates placed in or held by it are decided
/// and shown from: when it changes, they are all looked at again.
#[derive(Clone, Debug, PartialEq, Eq)]
struct MemberStamp {
    reachable: bool,
    retiring: bool,
    writing: bool,
    listed: bool,
    health: String,
}

impl Member {
    fn new() -> Self {
        Self {
            written: Written::default(),
            admitted: BTreeMap::new(),
            reverts: BTreeMap::new(),
            quiet: HashMap::new(),
            behind: HashMap::new(),
            held: HashMap::new(),
            applied: BTreeMap::new(),
            watches: BTreeMap::new(),
            hpas: None,
            errors: BTreeMap::new(),
            foreign: BTreeSet::new(),
            checked: BTreeSet::new(),
            namespaces: BTreeSet::new(),
            seen: BTreeSet::new(),
            refused: BTreeMap::new(),
            hpa_targets: BTreeSet::new(),
            source_listed: false,
            cleanup: BTreeSet::new(),
            finalizer: false,
            released: false,
            events: Arc::default(),
            stamp: None,
        }
    }

    /// The member source has listed every kind (which namespaces exist is known) and the HPA
    /// watch has listed or cannot (no HPAs known then): before that nothing is written.
    fn listed(&self) -> bool {
        self.source_listed
            && self
                .hpas
                .as_ref()
                .is_none_or(|w| w.listed.load(Ordering::Acquire) || w.error.lock().is_some())
    }

    /// Whether copies of `id`'s kind may be written or deleted: its watch has listed once (an
    /// empty store before that is not an empty member). A watch that cannot list (RBAC refuses
    /// the kind) is an error of that kind's copies only.
    fn kind_listed(&self, id: &ObjectId) -> Result<bool, String> {
        let Some(w) = self.watches.get(&(id.api_version.clone(), id.kind.clone())) else {
            return Ok(false);
        };
        if w.listed.load(Ordering::Acquire) {
            return Ok(true);
        }
        match w.error.lock().as_ref() {
            Some(e) => Err(format!("cannot watch {} in the member: {e}", id.kind)),
            None => Ok(false),
        }
    }

    fn refresh_hpa_targets(&mut self) {
        self.hpa_targets = self
            .hpas
            .iter()
            .flat_map(|w| w.store.state())
            .filter_map(|hpa| {
                let ns = hpa.namespace.clone()?;
                let (v, k, n) = retain::hpa_targets(&hpa.json())?;
                Some((ns, v, k, n))
            })
            .collect();
    }

    /// The live copy of `id` as the watch sees it: an object meridian labelled and annotated
    /// as placed from that very template (a copy of meridian's labels by another tool, or an
    /// object listed under another version of its kind, is not one).
    fn live(&self, id: &ObjectId) -> Option<Arc<LiveCopy>> {
        let watch = self
            .watches
            .get(&(id.api_version.clone(), id.kind.clone()))?;
        let o = watch.store.get(id.namespace.as_deref(), &id.name)?;
        let template = template_key_of(id).to_string();
        (o.template.as_ref() == Some(&template)).then_some(o)
    }

    /// What a pass reads of the live copy of `id` (None: the member holds none): read again
    /// only when its resourceVersion changed.
    fn summary(&mut self, id: &ObjectId) -> Option<LiveSummary> {
        let live = self.live(id)?;
        Some(self.summary_of(id, &live))
    }

    fn summary_of(&mut self, id: &ObjectId, live: &LiveCopy) -> LiveSummary {
        let rv = &live.resource_version;
        match self.held.get(id) {
            Some(s) if rv.is_some() && s.resource_version == *rv => s.clone(),
            _ => {
                let summary = LiveSummary::of(id, live);
                self.held.insert(id.clone(), summary.clone());
                summary
            }
        }
    }

    /// Every placed object the watches hold, by template.
    fn holdings(&self) -> BTreeMap<TemplateKey, Arc<LiveCopy>> {
        let mut out = BTreeMap::new();
        for ((api_version, kind), watch) in &self.watches {
            for o in watch.store.state() {
                let Some(ns) = &o.namespace else {
                    continue;
                };
                let key = TemplateKey::new(api_version, kind, ns, &o.name);
                if o.template.as_ref() == Some(&key.to_string()) {
                    out.insert(key, o);
                }
            }
        }
        out
    }

    /// Forgets everything this replica wrote into the member (another writes it now; when it
    /// comes back, it starts from what the member holds), keeping the watches.
    fn forget_writes(&mut self) {
        self.written.clear();
        self.admitted.clear();
        self.reverts.clear();
        self.quiet.clear();
        self.behind.clear();
        self.applied.clear();
        self.errors.clear();
        self.foreign.clear();
        self.checked.clear();
        self.refused.clear();
        self.cleanup.clear();
        self.finalizer = false;
        self.released = false;
    }

    /// Forgets what was written of `id` (it was deleted or released).
    fn forget(&mut self, id: &ObjectId) {
        self.written.forget(id);
        self.quiet.remove(id);
        self.behind.remove(id);
        self.held.remove(id);
        self.admitted.remove(id);
        self.reverts.remove(id);
        self.applied.remove(id);
    }

    /// Whether an HPA in the member scales `key`'s workload (an HPA's target may leave out
    /// the apiVersion).
    fn scaled_by_hpa(&self, key: &TemplateKey) -> bool {
        let (ns, kind, name) = (
            key.namespace.to_string(),
            key.kind.to_string(),
            key.name.to_string(),
        );
        [key.api_version.to_string(), String::new()]
            .into_iter()
            .any(|v| {
                self.hpa_targets
                    .contains(&(ns.clone(), v, kind.clone(), name.clone()))
            })
    }
}

impl MemberState for Member {
    fn stopped_writing(&mut self) {
        self.forget_writes();
    }
}

/// What a watch on placed objects selects.
fn placed_selector() -> String {
    format!("{MANAGED_BY_SELECTOR},{TEMPLATE_LABEL}")
}

/// A fingerprint of anything serializable.
fn print_of(value: &(impl Serialize + ?Sized)) -> u64 {
    apply::fingerprint(&serde_json::to_value(value).unwrap_or(Value::Null))
}

/// The object as JSON, with its metadata (DynamicObject keeps them apart).
fn as_json(o: &DynamicObject) -> Value {
    serde_json::to_value(o).unwrap_or(Value::Null)
}

/// What a watch tells the pass about besides its store.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Watched {
    /// Placed copies: the templates whose copies changed.
    Copies,
    /// The member's HPAs.
    Hpas,
}

/// Starts a watch of `resource` objects labelled as placed by meridian; each event wakes the
/// propagation loop (drift is reverted, status is aggregated) and is noted in `events` (the
/// next pass looks at the templates it names).
fn start_watch(
    client: &Client,
    resource: &ApiResource,
    selector: Option<&str>,
    wake: &Arc<Notify>,
    events: &Arc<Mutex<Events>>,
    watched: Watched,
) -> PlacedWatch {
    let store = CopyStore::default();
    let api = Api::<DynamicObject>::all_with(client.clone(), resource);
    let config = match selector {
        Some(s) => watcher::Config::default().labels(s),
        None => watcher::Config::default(),
    };
    let wake = wake.clone();
    let listed = Arc::new(AtomicBool::new(false));
    let error = Arc::new(Mutex::new(None));
    // The store keeps what a pass reads: of managedFields only meridian's own apply (what
    // `retain` asks about), so a copy costs its object, not every writer's field sets.
    let stream = watcher(api, config).modify(move |o: &mut DynamicObject| {
        let fields = &mut o.metadata.managed_fields;
        match watched {
            Watched::Copies => {
                if let Some(entries) = fields.as_mut() {
                    entries.retain(|e| e.manager.as_deref() == Some(apply::FIELD_MANAGER));
                }
            }
            Watched::Hpas => *fields = None,
        }
    });
    let stream = stream.default_backoff();
    let task = tokio::spawn({
        let (listed, error, events) = (listed.clone(), error.clone(), events.clone());
        let store = store.clone();
        let (api_version, kind) = (resource.api_version.clone(), resource.kind.clone());
        async move {
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                let copy = match &event {
                    Ok(event) => {
                        let copy = store.apply(event);
                        if matches!(event, watcher::Event::InitDone) {
                            listed.store(true, Ordering::Release);
                            *error.lock() = None;
                        }
                        copy
                    }
                    Err(e) => {
                        debug!(error = %e, "placed-object watch failed; retrying");
                        *error.lock() = Some(e.to_string());
                        None
                    }
                };
                {
                    let mut events = events.lock();
                    match (watched, copy) {
                        (Watched::Hpas, _) => events.hpas = true,
                        (Watched::Copies, Some(o)) => {
                            if let Some(ns) = &o.namespace {
                                events.templates.insert(TemplateKey::new(
                                    &api_version,
                                    &kind,
                                    ns,
                                    &o.name,
                                ));
                            }
                        }
                        (Watched::Copies, None) => events.relisted = true,
                    }
                }
                wake.notify_one();
            }
        }
    });
    PlacedWatch {
        store,
        listed,
        error,
        _task: AbortOnDrop(task),
    }
}

/// Everything one pass needs besides the members.
struct Pass<'a> {
    snapshot: &'a Snapshot,
    templates: BTreeMap<&'a TemplateKey, &'a Template>,
    /// Per template, its body's fingerprint.
    body_prints: HashMap<&'a TemplateKey, u64>,
    now: Instant,
    /// A fingerprint of every OverridePolicy (what a render reads besides its template).
    overrides_print: u64,
}

/// Writes placed objects into every Kubernetes member this replica may write; `hub` (a
/// Kubernetes hub's client, and what its fenced writer is made from) also gets, from the
/// leader, the Placement records, the templates' aggregated status and the policies' status,
/// and from each member's writer, meridian's finalizer on its MemberCluster.
pub async fn run(
    snapshots: watch::Receiver<Arc<Snapshot>>,
    fleet: Facts,
    leadership: Leadership,
    hub: Option<(Client, connect::Writer)>,
    view: PropagationView,
    metrics: PropagationMetrics,
) {
    // Woken by the watches, and by an operator's rollout command.
    let wake = view.wake.clone();
    // Appliers for the hub, kept for their discovery caches: the leader's records, and the
    // writes about the members this replica writes (each request asks for its member).
    let hub = hub.map(|(client, writer)| HubAppliers {
        records: Applier::new(client.clone(), leadership.clone(), ClusterId::new("hub"))
            .fenced_by(&writer),
        members: Applier::new(
            client.clone(),
            leadership.for_shard(),
            ClusterId::new("hub"),
        )
        .fenced_by(&writer),
        client,
    });
    let mut staged = Staged::default();
    let mut members: Slots<Member> = Slots::new();
    let mut rollouts: BTreeMap<TemplateKey, Rollout> = BTreeMap::new();
    let mut settings: BTreeMap<TemplateKey, Propagation> = BTreeMap::new();
    let mut growth_ready: HashMap<TemplateKey, bool> = HashMap::new();
    let mut views: BTreeMap<TemplateKey, TemplateView> = BTreeMap::new();
    let mut hub_written = Written::default();
    let mut converging = Converging::default();
    let mut dirty = Dirty::default();
    let mut overrides_print = (None, 0);
    let mut wake_up = Wake::new(snapshots, &fleet, TICK).notified_by(wake.clone());
    let mut deadline: Option<Instant> = None;
    let mut led = false;
    // The decisions the hub's records were last written for.
    let mut hub_placements: Option<Arc<Placements>> = None;
    while let Some(Round { snapshot, facts }) = wake_up.next(deadline).await {
        if !writes_anything(&leadership) {
            // A new term starts from what the members hold, not from memory.
            members.clear();
            hub_written.clear();
            dirty.forget();
            staged.forget();
            view.show_rollouts(false, &staged);
            continue;
        }
        let leads = leadership.is_leader();
        if !leads {
            hub_written.clear();
            staged.forget();
        }
        // A term on the hub writes every template's records once.
        let hub_term = leads && !led;
        led = leads;
        if hub_term && let Some(hub) = &hub {
            resume_rollouts(&hub.client, &mut staged).await;
        }
        if snapshot.placements.decisions.is_empty() && members.is_empty() {
            continue;
        }
        // Every member's watches, written or not: a rollout spans members.
        reconcile::sync(
            &mut members,
            &facts,
            &leadership,
            RESYNC,
            |_, _, _| true,
            |_| Member::new(),
        );
        for (id, m) in &mut members {
            if let Some(f) = facts.get(id) {
                m.namespaces.clone_from(&f.namespaces);
                m.source_listed = f.listed;
            }
        }
        let now = Instant::now();
        let keys = looked_at(&snapshot, &mut members, &mut dirty, hub_term);
        // What a pass costs of its own: finding what to look at, and planning it (not the
        // discovery of a kind newly placed, below).
        let looking = now.elapsed();
        for (id, kinds) in kinds_to_watch(&snapshot, &members, &keys) {
            if let Some(m) = members.get_mut(&id)
                && reachable(&snapshot, &id)
            {
                ensure_watches(m, kinds, &wake).await;
            }
        }
        let planning = Instant::now();
        let steps = steps(
            &snapshot,
            now,
            &mut members,
            &dirty,
            &keys,
            &mut rollouts,
            &mut settings,
            &mut growth_ready,
        );
        deadline = steps.iter().filter_map(|(_, step, _)| step.deadline).min();
        if overrides_print
            .0
            .as_ref()
            .is_none_or(|o| !Arc::ptr_eq(o, &snapshot.overrides))
        {
            overrides_print = (
                Some(snapshot.overrides.clone()),
                print_of(&*snapshot.overrides),
            );
        }
        let pass = Pass {
            templates: steps
                .iter()
                .filter_map(|(k, _, _)| dirty.template(&snapshot, k))
                .map(|t| (&t.key, t))
                .collect(),
            body_prints: steps
                .iter()
                .filter_map(|(k, _, _)| dirty.template(&snapshot, k))
                .filter_map(|t| Some((&t.key, dirty.body_print(&t.key)?)))
                .collect(),
            snapshot: &snapshot,
            now,
            overrides_print: overrides_print.1,
        };
        if !writes_anything(&leadership) {
            continue;
        }
        let mut jobs: BTreeMap<ClusterId, Vec<Job>> = BTreeMap::new();
        let commands = view.take_commands();
        let mut staged_keys = BTreeSet::new();
        for (key, step, propagation) in &steps {
            // The leader drives staged rollouts (their progress is in the policies' status).
            let gate = if leads {
                stage(&pass, &mut members, &mut staged, key, &commands, &metrics)
            } else {
                None
            };
            if gate.is_some() {
                staged_keys.insert(key.clone());
            }
            plan(
                &pass,
                &mut members,
                key,
                step,
                propagation,
                gate.as_ref(),
                &mut jobs,
            );
        }
        if leads {
            staged.retain(|k| snapshot.placements.decisions.contains_key(k));
            staged.export(&metrics);
            // A stage's waits (drain, deadline, verification) end between passes: a running
            // rollout is stepped every second.
            if staged.running() {
                let soon = now + ROLLOUT_STEP;
                deadline = Some(deadline.map_or(soon, |d| d.min(soon)));
            }
        }
        // Shown before the writes it decided are made: nothing a reader sees in the members
        // is ahead of what the rollout says.
        view.show_rollouts(leads, &staged);
        metrics
            .plan_seconds
            .observe((looking + planning.elapsed()).as_secs_f64());
        metrics.looked_templates.observe(steps.len() as f64);
        debug!(looked = steps.len(), "propagation pass");
        let written: HashSet<TemplateKey> =
            jobs.values().flatten().map(|j| j.key().clone()).collect();
        if let Some(hub) = &hub {
            hold_members(&hub.members, &mut members, &jobs).await;
        }
        // Members are written side by side, each with a bounded number of requests in flight.
        let conflicts: Vec<(TemplateKey, ClusterId)> =
            futures::future::join_all(members.iter_mut().filter_map(|(id, m)| {
                let jobs = jobs.remove(id).unwrap_or_default();
                (!jobs.is_empty() || !m.cleanup.is_empty())
                    .then(|| carry_out(m, jobs, &pass, &metrics))
            }))
            .await
            .into_iter()
            .flatten()
            .collect();
        let mut looked: BTreeSet<TemplateKey> = keys;
        let mut unsettled = Vec::new();
        for (key, step, _) in steps {
            let view = template_view(&pass, &mut members, &key, step, &conflicts);
            let decision = snapshot.placements.decisions.get(&key).map(|d| &**d);
            converging.observe(&key, decision, &pass, &view, &metrics);
            let rolling = staged_keys.contains(&key)
                && staged
                    .rollouts()
                    .get(&key)
                    .is_some_and(|r| !r.progress.finished() || r.progress.paused.is_some());
            if !view.is_settled() || written.contains(&key) || rolling {
                unsettled.push(key.clone());
            }
            looked.insert(key.clone());
            views.insert(key, view);
        }
        for key in &looked {
            if !snapshot.placements.decisions.contains_key(key)
                && !dirty.holders().contains_key(key)
            {
                views.remove(key);
                converging.forget(key);
                rollouts.remove(key);
                growth_ready.remove(key);
            }
        }
        if let Some(hub) = &hub {
            release_retired(&hub.members, &mut members, &snapshot).await;
            if leadership.is_leader() {
                let moved = hub_term
                    || hub_placements
                        .as_ref()
                        .is_none_or(|p| !Arc::ptr_eq(p, &snapshot.placements));
                hub_placements = Some(snapshot.placements.clone());
                write_hub(
                    &hub.records,
                    &pass,
                    &looked,
                    moved,
                    &views,
                    &members,
                    &staged,
                    &mut hub_written,
                )
                .await;
            }
        }
        drop(pass);
        for key in unsettled {
            dirty.unsettled(key);
        }
        view.update(&looked, &views);
    }
}

/// Takes up the rollouts the policies' status holds (a new term on the hub).
async fn resume_rollouts(client: &Client, staged: &mut Staged) {
    let api = Api::<ClusterSchedulingPolicy>::all(client.clone());
    match api.list(&Default::default()).await {
        Ok(list) => {
            for p in list.items {
                let (Some(namespace), Some(status)) = (
                    p.metadata.namespace.as_deref(),
                    p.status.as_ref().and_then(|s| s.rollout.as_ref()),
                ) else {
                    continue;
                };
                staged.resume(&ObjectKey::new(namespace, p.name_any()), status);
            }
        }
        Err(e) => {
            warn!(error = %e, "cannot read the policies' rollout progress; rollouts under way start over from what the members hold")
        }
    }
}

/// Steps `key`'s staged rollout, if its policy has one (a dependency's: the policy of the
/// workloads it follows): how its copies are written.
fn stage(
    pass: &Pass<'_>,
    members: &mut Slots<Member>,
    staged: &mut Staged,
    key: &TemplateKey,
    commands: &[(ObjectKey, Command)],
    metrics: &PropagationMetrics,
) -> Option<Gate> {
    let decision = pass.snapshot.placements.decisions.get(key)?;
    let template = pass.templates.get(key)?;
    let policy = decision
        .policy
        .as_ref()
        .or_else(|| followed_policy(pass.snapshot, decision))?;
    let id = object_id(key);
    let held: BTreeMap<ClusterId, HeldAt> = decision
        .placed
        .iter()
        .filter_map(|p| {
            let m = members.get_mut(&p.cluster)?;
            let summary = m.summary(&id);
            let received = summary.as_ref().and_then(|s| s.received);
            let ready = summary.is_some_and(|s| s.ready);
            Some((p.cluster.clone(), HeldAt { received, ready }))
        })
        .collect();
    let mine: Vec<Command> = commands
        .iter()
        .filter(|(p, _)| p == policy)
        .map(|(_, c)| *c)
        .collect();
    // A template without a generation is told apart by its body.
    let body_print = (template.generation == 0)
        .then(|| pass.body_prints.get(key).copied())
        .flatten();
    staged.gate(
        pass.snapshot,
        (policy, decision),
        (template, body_print),
        &held,
        &mine,
        pass.now,
        metrics,
    )
}

/// The one policy placing every workload a dependency follows (None: it follows none, or
/// workloads of several policies — then it changes at once, as it did before rollouts).
fn followed_policy<'s>(snapshot: &'s Snapshot, decision: &Decision) -> Option<&'s ObjectKey> {
    let mut policies = decision.placed.iter().flat_map(|p| match &p.reason {
        PlacedReason::Dependency(workloads) => workloads.as_slice(),
        _ => &[],
    });
    let first = policies.next()?;
    let policy = snapshot.placements.decisions.get(first)?.policy.as_ref()?;
    policies
        .all(|w| {
            snapshot
                .placements
                .decisions
                .get(w)
                .is_some_and(|d| d.policy.as_ref() == Some(policy))
        })
        .then_some(policy)
}

/// The templates this pass looks at (see [`dirty`]): those whose inputs changed, those the
/// members' watches name, every one placed in or held by a member seen whole (new, listed
/// again, or changed as a whole), and those left unsettled; every template at the
/// start of a term on the hub.
fn looked_at(
    snapshot: &Snapshot,
    members: &mut Slots<Member>,
    dirty: &mut Dirty,
    everything: bool,
) -> BTreeSet<TemplateKey> {
    let mut keys = dirty.inputs(snapshot);
    keys.extend(dirty.take_unsettled());
    for (id, m) in members.iter_mut() {
        let reachable = reachable(snapshot, id);
        // The resync forgets which names were free or refused: that concerns only copies not
        // yet applied (or in the way), which stay unsettled and are looked at anyway.
        if reachable {
            resync(m);
        }
        let events = std::mem::take(&mut *m.events.lock());
        if events.hpas || m.stamp.is_none() {
            m.refresh_hpa_targets();
        }
        let stamp = MemberStamp {
            reachable,
            retiring: retiring(snapshot, id),
            writing: m.writing,
            listed: m.listed(),
            health: snapshot
                .cluster_view(id)
                .map_or_else(String::new, |v| v.health.as_str().to_string()),
        };
        let whole = events.relisted || events.hpas || m.stamp.as_ref() != Some(&stamp);
        m.stamp = Some(stamp);
        let member: &Member = m;
        keys.extend(dirty.member(
            id,
            whole,
            events.templates,
            |key| member.live(&object_id(key)),
            || member.holdings(),
        ));
    }
    for gone in dirty.members() {
        if !members.contains_key(&gone) {
            keys.extend(dirty.drop_member(&gone));
        }
    }
    if everything {
        keys.extend(dirty.everything(snapshot));
    }
    keys.into_iter().collect()
}

/// Each template's rollout step, workloads first: the templates that follow them (a
/// Service, its ConfigMaps) keep their old copies until the workloads run ready where they
/// went (make before break). A follower not among `keys` is looked at too when a workload it
/// follows became ready or stopped being.
#[allow(clippy::too_many_arguments)]
fn steps(
    snapshot: &Snapshot,
    now: Instant,
    members: &mut Slots<Member>,
    dirty: &Dirty,
    keys: &BTreeSet<TemplateKey>,
    rollouts: &mut BTreeMap<TemplateKey, Rollout>,
    settings: &mut BTreeMap<TemplateKey, Propagation>,
    growth_ready: &mut HashMap<TemplateKey, bool>,
) -> Vec<(TemplateKey, Step, Propagation)> {
    let decisions = &snapshot.placements.decisions;
    let follows = |k: &TemplateKey| decisions.get(k).is_some_and(|d| !d.follows().is_empty());
    let (followers, leaders): (Vec<&TemplateKey>, Vec<&TemplateKey>) =
        keys.iter().partition(|k| follows(k));
    let mut out = Vec::with_capacity(keys.len());
    let mut moved: HashSet<&TemplateKey> = HashSet::new();
    let mut step_of = |key: &TemplateKey, growth_ready: &mut HashMap<TemplateKey, bool>| {
        let decision = decisions.get(key).map(|d| &**d);
        if let Some(d) = decision {
            settings.insert(key.clone(), snapshot.placements.propagation_of(d));
        }
        let propagation = settings
            .get(key)
            .cloned()
            .unwrap_or_else(|| settings_from_copies(dirty.holders(), key));
        let held = held_copies(members, dirty.holders(), key, decision);
        let leaders_ready = decision.is_none_or(|d| {
            d.follows()
                .iter()
                .all(|l| growth_ready.get(*l).copied().unwrap_or(true))
        });
        let rollout = rollouts.entry(key.clone()).or_default();
        let step = rollout.step_after(decision, &held, &propagation, now, leaders_ready);
        let before = growth_ready.insert(key.clone(), step.growth_ready);
        if decision.is_none() && step.deletes.is_empty() && step.released.is_empty() {
            rollouts.remove(key);
            settings.remove(key);
        }
        (step, propagation, before)
    };
    for key in leaders {
        let (step, propagation, before) = step_of(key, growth_ready);
        if before != Some(step.growth_ready) {
            moved.insert(key);
        }
        out.push((key.clone(), step, propagation));
    }
    let mut followers: BTreeSet<&TemplateKey> = followers.into_iter().collect();
    if !moved.is_empty() {
        followers.extend(dirty.followers().iter().filter(|f| {
            decisions
                .get(*f)
                .is_some_and(|d| d.follows().iter().any(|l| moved.contains(*l)))
        }));
    }
    for key in followers {
        let (step, propagation, _) = step_of(key, growth_ready);
        out.push((key.clone(), step, propagation));
    }
    out
}

/// A Kubernetes hub's appliers (see `run`).
struct HubAppliers {
    /// For reading the policies' rollout progress at the start of a term.
    client: Client,
    /// Hub-wide records: the leader's.
    records: Applier,
    /// MemberCluster finalizers: each member's writer's.
    members: Applier,
}

/// This replica leads (hub-wide records) or holds members to write.
fn writes_anything(leadership: &Leadership) -> bool {
    leadership.is_leader() || leadership.for_shard().may_write()
}

/// Since when each template's current generation and decision have been rolling out, for
/// `meridian_propagation_converge_seconds`.
#[derive(Default)]
struct Converging {
    since: BTreeMap<TemplateKey, (u64, Instant, bool)>,
}

impl Converging {
    fn observe(
        &mut self,
        key: &TemplateKey,
        decision: Option<&Decision>,
        pass: &Pass<'_>,
        view: &TemplateView,
        metrics: &PropagationMetrics,
    ) {
        let Some(decision) = decision else { return };
        let generation = pass.templates.get(key).map_or(0, |t| t.generation);
        let target = apply::fingerprint(&json!([generation, decision.placed]));
        let entry = self
            .since
            .entry(key.clone())
            .or_insert((target, pass.now, false));
        if entry.0 != target {
            *entry = (target, pass.now, false);
        }
        let converged = view.step.is_settled()
            && !view.copies.is_empty()
            && view.copies.values().all(|c| c.applied && c.ready);
        if converged && !entry.2 {
            entry.2 = true;
            metrics
                .converge_seconds
                .observe(pass.now.saturating_duration_since(entry.1).as_secs_f64());
        }
    }

    fn forget(&mut self, key: &TemplateKey) {
        self.since.remove(key);
    }
}

/// Applies meridian's part of `cluster`'s MemberCluster: its finalizer, or (`finalizer`
/// false) nothing, which lets go of it. The rest of the object stays the user's.
async fn apply_finalizer(
    hub: &Applier,
    cluster: &ClusterId,
    finalizer: bool,
) -> Result<(), apply::Error> {
    let (api_version, kind) = MEMBER_CLUSTER;
    let mut metadata = json!({"name": cluster.as_str()});
    if finalizer {
        metadata["finalizers"] = json!([MEMBER_FINALIZER]);
    }
    let body = json!({"apiVersion": api_version, "kind": kind, "metadata": metadata});
    let id = ObjectId::new(api_version, kind, None, cluster.as_str());
    hub.apply(&id, &body, ApplyOptions::default())
        .await
        .map(drop)
}

/// Puts the finalizer on the MemberCluster of every member about to get a write, once per
/// term (a set element meridian's apply owns; the MemberCluster's other fields are left
/// alone). A refusal is logged and writes go on: only a deletion would then leave copies.
async fn hold_members(
    hub: &Applier,
    members: &mut Slots<Member>,
    jobs: &BTreeMap<ClusterId, Vec<Job>>,
) {
    for (cluster, m) in members.iter_mut().filter(|(_, m)| m.writing) {
        let writes = jobs
            .get(cluster)
            .is_some_and(|j| j.iter().any(|j| matches!(j, Job::Apply { .. })));
        if m.finalizer || !writes {
            continue;
        }
        match apply_finalizer(hub, cluster, true).await {
            Ok(()) => m.finalizer = true,
            Err(apply::Error::NotLeader) => return,
            Err(e) => {
                warn!(cluster = %cluster, error = %e, "cannot put meridian's finalizer on the MemberCluster: deleting it would leave the copies placed there");
                m.finalizer = true;
            }
        }
    }
}

/// Lets go of every retiring member that holds none of meridian's copies any more, or that
/// cannot be reached (its copies are then left where they are): removes the finalizer.
async fn release_retired(hub: &Applier, members: &mut Slots<Member>, snapshot: &Snapshot) {
    for (cluster, m) in members.iter_mut().filter(|(_, m)| m.writing) {
        if !retiring(snapshot, cluster) || m.released {
            continue;
        }
        let emptied = m.listed()
            && m.watches.values().all(|w| w.listed.load(Ordering::Acquire))
            && m.holdings().is_empty();
        let unreachable = !reachable(snapshot, cluster);
        if !emptied && !unreachable {
            continue;
        }
        match apply_finalizer(hub, cluster, false).await {
            Ok(()) if unreachable => {
                m.released = true;
                warn!(cluster = %cluster, left = m.holdings().len(), "a retiring member cannot be reached: let go, with what meridian placed there left in it");
            }
            Ok(()) => {
                m.released = true;
                info!(cluster = %cluster, "a retiring member holds none of meridian's copies: let go");
            }
            Err(apply::Error::NotLeader) => return,
            Err(e) => {
                warn!(cluster = %cluster, error = %e, "cannot remove meridian's finalizer from the retiring MemberCluster")
            }
        }
    }
}

fn reachable(snapshot: &Snapshot, cluster: &ClusterId) -> bool {
    snapshot
        .cluster_view(cluster)
        .is_some_and(|c| c.health != meridian_core::registry::Health::Unreachable)
}

/// Its MemberCluster is being deleted.
fn retiring(snapshot: &Snapshot, cluster: &ClusterId) -> bool {
    snapshot
        .cluster_view(cluster)
        .is_some_and(|c| c.spec.retiring)
}

/// A watch for every kind placed in the member (and on its HPAs), started on first use; in a
/// retiring member, for every kind placed anywhere (nothing is placed there any more, and a
/// replica that starts leading now must still find what it holds before letting it go).
async fn ensure_watches(
    m: &mut Slot<Member>,
    kinds: BTreeSet<(String, String)>,
    wake: &Arc<Notify>,
) {
    for (api_version, kind) in kinds {
        if m.watches.contains_key(&(api_version.clone(), kind.clone())) {
            continue;
        }
        match m.applier.resource(&api_version, &kind).await {
            Ok((resource, _)) => {
                let w = start_watch(
                    m.applier.client(),
                    &resource,
                    Some(&placed_selector()),
                    wake,
                    &m.events,
                    Watched::Copies,
                );
                m.watches.insert((api_version, kind), w);
            }
            Err(e) => {
                warn!(cluster = %m.applier.cluster(), %api_version, %kind, error = %e, "cannot watch placed objects")
            }
        }
    }
    if m.hpas.is_none()
        && !m.watches.is_empty()
        && let Ok((resource, _)) = m
            .applier
            .resource("autoscaling/v2", "HorizontalPodAutoscaler")
            .await
    {
        m.hpas = Some(start_watch(
            m.applier.client(),
            &resource,
            None,
            wake,
            &m.events,
            Watched::Hpas,
        ));
    }
}

/// The kinds of placed objects each member needs a watch on, for the templates `keys`: the
/// kinds placed there, and in a retiring member not watched yet every kind placed anywhere
/// (what it holds must be found to move it out).
fn kinds_to_watch(
    snapshot: &Snapshot,
    members: &Slots<Member>,
    keys: &BTreeSet<TemplateKey>,
) -> HashMap<ClusterId, BTreeSet<(String, String)>> {
    let kind_of = |d: &Decision| {
        (
            d.template.api_version.to_string(),
            d.template.kind.to_string(),
        )
    };
    let mut kinds: HashMap<ClusterId, BTreeSet<(String, String)>> = HashMap::new();
    for d in keys
        .iter()
        .filter_map(|k| snapshot.placements.decisions.get(k))
    {
        for p in &d.placed {
            let watched = members.get(&p.cluster).is_some_and(|m| {
                m.watches.contains_key(&(
                    d.template.api_version.to_string(),
                    d.template.kind.to_string(),
                ))
            });
            if !watched {
                kinds
                    .entry(p.cluster.clone())
                    .or_default()
                    .insert(kind_of(d));
            }
        }
    }
    for (id, m) in members {
        if m.watches.is_empty() && retiring(snapshot, id) {
            let all = snapshot.placements.decisions.values().map(|d| kind_of(d));
            kinds.entry(id.clone()).or_default().extend(all);
        }
    }
    kinds
}

/// Once a minute: look again for objects meridian did not create (one may have been deleted,
/// or created since). Drift needs no resync: the watches see it.
fn resync(m: &mut Slot<Member>) {
    if !m.resync.due() {
        return;
    }
    m.foreign.clear();
    m.checked.clear();
    m.refused.clear();
    m.resync.done(Instant::now());
}

/// The settings of a template whose policy this replica never saw (it was deleted while
/// another replica led, or before a restart): what its copies say.
fn settings_from_copies(holders: &Holders, key: &TemplateKey) -> Propagation {
    let preserve = holders.get(key).into_iter().flatten().any(|(_, o)| {
        o.json()["metadata"]["annotations"][PRESERVE_ANNOTATION].as_str() == Some("true")
    });
    Propagation {
        preserve_on_deletion: preserve,
        ..Propagation::default()
    }
}

/// What each member holds of `key`'s template.
fn held_copies(
    members: &mut Slots<Member>,
    holders: &Holders,
    key: &TemplateKey,
    decision: Option<&Decision>,
) -> BTreeMap<ClusterId, Held> {
    let id = object_id(key);
    holders
        .get(key)
        .into_iter()
        .flatten()
        .filter_map(|(cluster, live)| {
            let m = members.get_mut(cluster)?;
            let summary = m.summary_of(&id, live);
            let decided = decision
                .and_then(|d| d.replicas_in(cluster))
                .and_then(|p| p.replicas);
            // Under an HPA the member owns the count: the rollout compares the decision's.
            let replicas = if m.scaled_by_hpa(key) {
                decided
            } else {
                summary.replicas
            };
            let ready = summary.ready;
            Some((cluster.clone(), Held { replicas, ready }))
        })
        .collect()
}

/// Requests in flight per member.
const IN_FLIGHT: usize = 16;
/// The longest one job waits for a member's answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// One request (or two: a GET before the first apply of a name) for one member.
enum Job {
    Apply {
        key: TemplateKey,
        id: ObjectId,
        body: Value,
        /// The first write of this name: is there an object meridian did not label?
        check_foreign: bool,
        abort_on_foreign: bool,
        /// The fields found drifted, when the body itself is unchanged since the last write.
        drifted: Vec<String>,
        /// Retained fields meridian still owns, to hand over before the body leaves them out
        /// (retain::HANDOVER_MANAGER).
        handover: Option<Value>,
        template_generation: i64,
        /// The copy's resourceVersion as the watch showed it when the job was made.
        live_version: Option<String>,
    },
    Delete {
        key: TemplateKey,
        id: ObjectId,
    },
    Release {
        key: TemplateKey,
        id: ObjectId,
    },
}

impl Job {
    fn id(&self) -> &ObjectId {
        match self {
            Job::Apply { id, .. } | Job::Delete { id, .. } | Job::Release { id, .. } => id,
        }
    }

    fn key(&self) -> &TemplateKey {
        match self {
            Job::Apply { key, .. } | Job::Delete { key, .. } | Job::Release { key, .. } => key,
        }
    }
}

/// Turns one template's step into jobs per member (no request is made here): renders each
/// copy, takes retained fields from the live object, and leaves out what is unchanged and
/// not drifted, and every Unreachable member.
fn plan(
    pass: &Pass<'_>,
    members: &mut Slots<Member>,
    key: &TemplateKey,
    step: &Step,
    propagation: &Propagation,
    gate: Option<&Gate>,
    jobs: &mut BTreeMap<ClusterId, Vec<Job>>,
) {
    let id = object_id(key);
    let decision = pass.snapshot.placements.decisions.get(key);
    let template = pass.templates.get(key).copied();
    // What a copy's job is decided from, besides the live object: the same inputs as a pass
    // that found nothing to do give nothing to do (no render, no drift walk).
    let inputs = template.map(|t| {
        (
            pass.body_prints.get(&t.key).copied(),
            pass.overrides_print,
            print_of(propagation),
        )
    });
    for w in &step.writes {
        let (Some(m), Some(template), Some(placed)) = (
            members.get_mut(&w.cluster),
            template,
            decision.and_then(|d| d.replicas_in(&w.cluster)),
        ) else {
            continue;
        };
        if !m.writing {
            continue;
        }
        // A staged rollout: the stage's revision, or nothing while the stage is not reached.
        let write = match gate.map(|g| g.write_for(&w.cluster)) {
            None => Write::Current,
            Some(Ok(Some(write))) => write,
            Some(Ok(None)) => {
                m.errors.remove(&id);
                continue;
            }
            Some(Err(e)) => {
                m.errors.insert(id.clone(), e);
                continue;
            }
        };
        if !reachable(pass.snapshot, &w.cluster) {
            m.errors.insert(
                id.clone(),
                "Unreachable: not written until it returns".into(),
            );
            continue;
        }
        // Written once the member and its watches have listed (an empty store is not an
        // empty member: an HPA's replicas, a held-back shrink, an object in the way).
        match (m.listed(), m.kind_listed(&id)) {
            (true, Ok(true)) => {}
            (_, Err(e)) => {
                m.errors.insert(id.clone(), e);
                continue;
            }
            _ => continue,
        }
        let mut placed = Placed {
            replicas: w.replicas,
            ..placed.clone()
        };
        // The body's print is the pass's (worked out once per template), except for a
        // rollback's previous body.
        let (template, overrides, print) = match write {
            Write::Current => (
                template,
                &pass.snapshot.overrides[..],
                pass.body_prints.get(key).copied(),
            ),
            Write::Previous(source) => {
                // The rules the previous revision applied here, not today's.
                let cluster = pass.snapshot.cluster_view(&w.cluster).map(|v| &v.spec);
                placed.overrides = override_rules(&source.overrides, &source.template, cluster);
                (&source.template, &source.overrides[..], None)
            }
        };
        let live = m.live(&id);
        if live.is_some() {
            m.seen.insert(id.clone());
        }
        let quiet = print_of(&json!([
            inputs,
            template.generation,
            matches!(write, Write::Previous(_)),
            placed,
            m.scaled_by_hpa(key),
            live.as_ref().map(|o| o.resource_version.clone()),
        ]));
        if m.quiet.get(&id) == Some(&quiet) {
            m.errors.remove(&id);
            continue;
        }
        m.quiet.remove(&id);
        match copy_job(pass, m, (template, overrides, print), &placed, propagation) {
            Ok(Some(job)) => jobs.entry(w.cluster.clone()).or_default().push(job),
            Ok(None) => {
                m.errors.remove(&id);
                m.quiet.insert(id.clone(), quiet);
            }
            Err(e) => {
                m.errors.insert(id.clone(), e);
            }
        }
    }
    let others = [(&step.deletes, false), (&step.released, true)];
    for (clusters, release) in others {
        for cluster in clusters.iter().filter(|c| reachable(pass.snapshot, c)) {
            if members
                .get(cluster)
                .is_some_and(|m| m.writing && m.listed() && m.kind_listed(&id) == Ok(true))
            {
                let (key, id) = (key.clone(), id.clone());
                let job = if release {
                    Job::Release { key, id }
                } else {
                    Job::Delete { key, id }
                };
                jobs.entry(cluster.clone()).or_default().push(job);
            }
        }
    }
}

/// The apply of one copy, or None when the member holds it as meridian last wrote it.
fn copy_job(
    pass: &Pass<'_>,
    m: &mut Slot<Member>,
    (template, overrides, body_print): (&Template, &[OverridePolicy], Option<u64>),
    placed: &Placed,
    propagation: &Propagation,
) -> Result<Option<Job>, String> {
    let id = object_id(&template.key);
    let mut body =
        render::manifest(template, placed, overrides).map_err(|e| format!("cannot render: {e}"))?;
    apply::label_managed(
        &mut body,
        &[
            (TEMPLATE_LABEL, &template_label(&template.key)),
            (
                render::GENERATION_ANNOTATION,
                &template.generation.to_string(),
            ),
        ],
    );
    if let Some(annotations) = body
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        if propagation.preserve_on_deletion {
            annotations.insert(PRESERVE_ANNOTATION.into(), "true".into());
        }
        // Which edit of a template without a generation the copy holds (staged rollouts).
        if template.generation == 0 {
            let body_print = body_print.unwrap_or_else(|| dirty::body_print(&template.body));
            let digest = format!("{body_print:016x}");
            annotations.insert(render::TEMPLATE_DIGEST_ANNOTATION.into(), digest.into());
        }
    }
    let print = apply::fingerprint(&body).to_string();
    if let Some(annotations) = body
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.insert(APPLIED_ANNOTATION.into(), print.clone().into());
    }
    let live = m.live(&id).map(|o| o.json());
    let mut retained = propagation.retain.clone();
    if m.scaled_by_hpa(&template.key) {
        retained.push(retain::HPA_RETAINED.to_string());
    }
    let handover = retain::retain(&mut body, live.as_ref(), &retained, apply::FIELD_MANAGER)
        .map_err(|e| e.to_string())?;
    // This term has not written the copy, but it carries the print of this very body: the
    // member holds it as it would be written (drift, below, says whether it still does).
    let learned = !m.written.contains(&id)
        && live
            .as_ref()
            .and_then(|l| l.pointer("/metadata/annotations")?.get(APPLIED_ANNOTATION))
            .and_then(Value::as_str)
            == Some(print.as_str());
    let unchanged = learned || m.written.unchanged(&id, &body);
    let live_version = live
        .as_ref()
        .and_then(|l| l.pointer("/metadata/resourceVersion"))
        .and_then(Value::as_str)
        .map(str::to_string);
    if unchanged && m.behind.get(&id) == Some(&live_version) {
        // The watch still shows the object as it was before this very write.
        return Ok(None);
    }
    m.behind.remove(&id);
    // Drift is a live object that no longer holds what the member admitted of the last
    // write: only meaningful when the body is the one written (a new body is a change).
    let drifted = match (&live, unchanged) {
        (Some(live), true) => match m.admitted.get(&id) {
            Some(admitted) => {
                drift::drifted(&serde_json::from_str(admitted).unwrap_or(Value::Null), live)
            }
            None => drift::drifted(&without_type(&body), live),
        },
        (None, true) if m.seen.contains(&id) => vec!["the object is gone".into()],
        _ => Vec::new(),
    };
    if unchanged && drifted.is_empty() && handover.is_none() {
        if learned {
            // As if this term had written it: the copy counts as applied (at the generations
            // it carries), and what is written next is compared with it.
            m.written.record(&id, &body);
            if let Some(applied) = live.as_ref().and_then(applied_by_another) {
                m.applied.insert(id.clone(), applied);
            }
        }
        return Ok(None);
    }
    if !drifted.is_empty()
        && let Some(left) = m.reverts.get(&id).and_then(|r| r.held(pass.now))
    {
        return Err(format!(
            "drift at {} comes back after every revert: another controller or a webhook \
             changes what meridian sets; reverted again in {} s",
            drifted.join(", "),
            left.as_secs().max(1)
        ));
    }
    if m.refused.get(&id) == Some(&apply::fingerprint(&body)) {
        return Err(m
            .errors
            .get(&id)
            .cloned()
            .unwrap_or_else(|| "refused".into()));
    }
    let abort_on_foreign = propagation.conflict_resolution == ConflictResolution::Abort;
    let check_foreign = live.is_none() && !m.checked.contains(&id);
    Ok(Some(Job::Apply {
        key: template.key.clone(),
        id,
        body,
        check_foreign,
        abort_on_foreign,
        drifted,
        handover,
        template_generation: template.generation,
        live_version,
    }))
}

/// `body` without apiVersion and kind, which objects listed by a watch do not carry.
fn without_type(body: &Value) -> Value {
    let mut body = body.clone();
    if let Some(o) = body.as_object_mut() {
        o.remove("apiVersion");
        o.remove("kind");
    }
    body
}

/// Runs one member's jobs and records what came of them; returns the conflicts found.
async fn carry_out(
    m: &mut Slot<Member>,
    jobs: Vec<Job>,
    pass: &Pass<'_>,
    metrics: &PropagationMetrics,
) -> Vec<(TemplateKey, ClusterId)> {
    let cluster = m.applier.cluster().clone();
    let mut conflicts = Vec::new();
    let (mut ready, mut blocked) = (Vec::new(), Vec::new());
    for job in jobs {
        match job {
            Job::Apply {
                ref id,
                ref key,
                abort_on_foreign: true,
                ..
            } if m.foreign.contains(id) => conflicts.push((key.clone(), cluster.clone())),
            job => ready.push(job),
        }
    }
    // Namespaces first, one at a time (few, and each is needed by the writes after it).
    let needed: BTreeSet<String> = ready
        .iter()
        .filter(|j| matches!(j, Job::Apply { .. }))
        .filter_map(|j| j.id().namespace.clone())
        .filter(|ns| !m.namespaces.contains(ns))
        .collect();
    for ns in needed {
        if let Err(e) = ensure_namespace(m, &ns).await {
            let (stuck, rest): (Vec<Job>, Vec<Job>) = ready.into_iter().partition(|j| {
                matches!(j, Job::Apply { .. }) && j.id().namespace.as_deref() == Some(ns.as_str())
            });
            blocked.extend(stuck.into_iter().map(|j| (j, e.clone())));
            ready = rest;
        }
    }
    for (job, e) in blocked {
        m.errors.insert(job.id().clone(), e);
    }
    let applier = &m.applier;
    let results: Vec<(Job, Result<Option<Value>, JobError>)> = futures::stream::iter(ready)
        .map(|job| async move {
            let result = execute(applier, &job).await;
            (job, result)
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    for (job, result) in results {
        let id = job.id().clone();
        match (job, result) {
            (
                Job::Apply {
                    key,
                    body,
                    drifted,
                    template_generation,
                    live_version,
                    ..
                },
                Ok(Some(stored)),
            ) => {
                m.behind.insert(id.clone(), live_version);
                if !drifted.is_empty() {
                    info!(cluster = %cluster, object = %id, fields = ?drifted, "drift reverted");
                    metrics.drift_reverted.inc();
                    let reverts = Reverts::revert(m.reverts.get(&id).copied(), pass.now);
                    if reverts.count == FIGHT_REVERTS {
                        warn!(cluster = %cluster, object = %id, fields = ?drifted, "drift comes back after every revert: held off while the fight goes on");
                    }
                    m.reverts.insert(id.clone(), reverts);
                }
                let generation = stored
                    .pointer("/metadata/generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                let admitted = drift::admitted(&without_type(&body), &stored);
                m.admitted
                    .insert(id.clone(), admitted.to_string().into_boxed_str());
                debug!(cluster = %cluster, template = %key, "applied");
                metrics.applied(&cluster, "ok");
                m.written.record(&id, &body);
                m.refused.remove(&id);
                m.checked.insert(id.clone());
                m.foreign.remove(&id);
                m.errors.remove(&id);
                m.applied.insert(id, (generation, template_generation));
            }
            (Job::Apply { key, .. }, Ok(None)) => {
                if m.foreign.insert(id.clone()) {
                    warn!(cluster = %cluster, object = %id, "an object of that name exists and is not meridian's: left alone (conflictResolution Abort)");
                    metrics.conflicts.inc();
                }
                conflicts.push((key, cluster.clone()));
            }
            (Job::Delete { key, .. }, Ok(_)) => {
                info!(cluster = %cluster, template = %key, "deleted the copy no longer placed here");
                metrics.evictions.inc();
                m.forget(&id);
                m.checked.remove(&id);
                m.errors.remove(&id);
                m.seen.remove(&id);
                m.cleanup.extend(id.namespace.clone());
            }
            (Job::Release { key, .. }, Ok(_)) => {
                info!(cluster = %cluster, template = %key, "template gone: the copy is kept (preserveResourcesOnDeletion) and no longer meridian's");
                m.forget(&id);
            }
            (_, Err(JobError::Api(apply::Error::NotLeader))) => {
                // Leadership lapsed mid-pass: the rest of the pass is not this replica's.
            }
            (job, Err(e)) => {
                warn!(cluster = %cluster, object = %id, error = %e, "cannot write");
                if let Job::Apply { body, .. } = &job {
                    metrics.applied(&cluster, "error");
                    if e.is_refusal() {
                        m.refused.insert(id.clone(), apply::fingerprint(body));
                    }
                }
                m.errors.insert(id, e.to_string());
            }
        }
    }
    if !m.cleanup.is_empty() {
        clean_namespaces(m, pass).await;
    }
    conflicts
}

/// One job's requests. An apply answers the object as the member stored it, or None when an
/// object meridian did not create is in the way (conflictResolution Abort).
async fn execute(applier: &Applier, job: &Job) -> Result<Option<Value>, JobError> {
    // A member that stops answering (not yet Unreachable) must not hold up the pass.
    tokio::time::timeout(REQUEST_TIMEOUT, requests(applier, job))
        .await
        .map_err(|_| JobError::Timeout)?
        .map_err(JobError::Api)
}

enum JobError {
    Api(apply::Error),
    Timeout,
}

impl JobError {
    /// The member's API refused this very body: sending it again changes nothing.
    fn is_refusal(&self) -> bool {
        matches!(self, JobError::Api(e) if e.code().is_some_and(|c| (400..500).contains(&c) && c != 409 && c != 429))
    }
}

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobError::Api(e) => write!(f, "{e}"),
            JobError::Timeout => write!(f, "no answer within {} s", REQUEST_TIMEOUT.as_secs()),
        }
    }
}

async fn requests(applier: &Applier, job: &Job) -> Result<Option<Value>, apply::Error> {
    match job {
        Job::Apply {
            id,
            body,
            check_foreign,
            abort_on_foreign,
            handover,
            ..
        } => {
            if *check_foreign {
                let existing = applier.get(id).await?;
                let foreign = existing.is_some_and(|o| {
                    o.labels().get(MANAGED_BY.0).map(String::as_str) != Some(MANAGED_BY.1)
                });
                if foreign && *abort_on_foreign {
                    return Ok(None);
                }
                if foreign {
                    info!(cluster = %applier.cluster(), object = %id, "adopting an object meridian did not create (conflictResolution Overwrite)");
                }
            }
            if let Some(handover) = handover {
                hand_over(applier, id, handover).await?;
            }
            let stored = applier.apply(id, body, ApplyOptions::force()).await?;
            Ok(Some(as_json(&stored)))
        }
        Job::Delete { id, .. } => applier.delete(id).await.map(|()| None),
        Job::Release { id, .. } => {
            let patch = json!({"metadata": {"labels": {MANAGED_BY.0: null, TEMPLATE_LABEL: null}}});
            applier.merge_patch(id, &patch).await.map(|_| None)
        }
    }
}

/// Applies the retained fields meridian still owns at their live values as
/// retain::HANDOVER_MANAGER, so that they stay when meridian's body leaves them out.
async fn hand_over(applier: &Applier, id: &ObjectId, handover: &Value) -> Result<(), apply::Error> {
    let as_handover = ApplyOptions::as_manager(retain::HANDOVER_MANAGER);
    match applier.apply(id, handover, as_handover).await {
        Ok(_) => {
            debug!(cluster = %applier.cluster(), object = %id, "retained fields handed over");
            Ok(())
        }
        // The member's writer changed the field since the watch saw it: it is theirs already.
        Err(e) if e.is_conflict() => Ok(()),
        Err(e) => Err(e),
    }
}

/// What readers see of one template after a pass.
fn template_view(
    pass: &Pass<'_>,
    members: &mut Slots<Member>,
    key: &TemplateKey,
    step: Step,
    conflicts: &[(TemplateKey, ClusterId)],
) -> TemplateView {
    let id = object_id(key);
    let generation = pass.templates.get(key).map(|t| t.generation);
    let clusters = step
        .writes
        .iter()
        .map(|w| &w.cluster)
        .chain(step.draining.iter().map(|d| &d.cluster));
    let copies = clusters
        .filter_map(|c| Some((c.clone(), copy_view(members.get_mut(c)?, &id, generation))))
        .collect();
    TemplateView {
        copies,
        conflicts: conflicts
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, c)| c.clone())
            .collect(),
        step,
    }
}

/// Creates the namespace (labelled as meridian's) when the member has none of that name.
async fn ensure_namespace(m: &mut Slot<Member>, namespace: &str) -> Result<(), String> {
    if m.namespaces.contains(namespace) {
        return Ok(());
    }
    let id = ObjectId::new("v1", "Namespace", None, namespace);
    let body = json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace, "labels": {MANAGED_BY.0: MANAGED_BY.1}},
    });
    // A create, never an apply: a namespace of that name that exists is someone else's and
    // must not become meridian's (to be deleted one day).
    match m.applier.create(&id, &body).await {
        Ok(created) => {
            if created.is_some() {
                info!(cluster = %m.applier.cluster(), %namespace, "created the namespace for what is placed here");
            }
            m.namespaces.insert(namespace.to_string());
            Ok(())
        }
        Err(e) => Err(format!("cannot create namespace {namespace}: {e}")),
    }
}

/// Deletes the namespaces of `m.cleanup` that meridian created (for what it places, not for a
/// Tenant) and that hold nothing it places and nothing of anyone else's (Pods, PVCs: a StatefulSet's claims are not
/// meridian's); the ones still in use, or not yet known to be empty, are kept for a later
/// pass.
async fn clean_namespaces(m: &mut Slot<Member>, pass: &Pass<'_>) {
    let cluster = m.applier.cluster().clone();
    let held = m.holdings();
    for namespace in std::mem::take(&mut m.cleanup) {
        if pass.snapshot.placements.places_in(&cluster, &namespace) {
            continue;
        }
        if held.keys().any(|k| *k.namespace == *namespace) {
            m.cleanup.insert(namespace);
            continue;
        }
        match namespace_is_ours_and_empty(&m.applier, &namespace).await {
            Ok(true) => match m
                .applier
                .delete(&ObjectId::new("v1", "Namespace", None, &namespace))
                .await
            {
                Ok(()) => {
                    info!(cluster = %cluster, %namespace, "deleted the namespace meridian created: nothing remains there");
                    m.namespaces.remove(&namespace);
                }
                Err(e) => {
                    warn!(cluster = %cluster, %namespace, error = %e, "cannot delete the namespace meridian created");
                    m.cleanup.insert(namespace);
                }
            },
            Ok(false) => {}
            Err(e) => {
                debug!(cluster = %cluster, %namespace, error = %e, "cannot tell whether the namespace is empty");
                m.cleanup.insert(namespace);
            }
        }
    }
}

async fn namespace_is_ours_and_empty(
    applier: &Applier,
    namespace: &str,
) -> Result<bool, apply::Error> {
    let Some(ns) = applier
        .get(&ObjectId::new("v1", "Namespace", None, namespace))
        .await?
    else {
        return Ok(false);
    };
    // A tenant's namespace stays while the tenant names it (`super::tenants` removes it).
    if ns.labels().get(MANAGED_BY.0).map(String::as_str) != Some(MANAGED_BY.1)
        || ns
            .labels()
            .contains_key(meridian_core::tenant::TENANT_LABEL)
        || ns.metadata.deletion_timestamp.is_some()
    {
        return Ok(false);
    }
    for (api_version, kind) in [("v1", "Pod"), ("v1", "PersistentVolumeClaim")] {
        if applier.any_in(api_version, kind, namespace).await? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A copy's replica count, from the field its kind keeps it in (a Job's parallelism).
fn replica_count(id: &ObjectId, object: &Value) -> Option<u32> {
    let pointer = template::replica_pointer(&id.api_version, &id.kind)?;
    object
        .pointer(pointer)?
        .as_u64()
        .and_then(|r| u32::try_from(r).ok())
}

/// One copy as this replica sees it. Whether it is applied is what this replica wrote, or, in
/// a member another replica writes, whether the live copy was written from the template's
/// current generation (its errors are that replica's to report).
fn copy_view(m: &mut Slot<Member>, id: &ObjectId, template_generation: Option<i64>) -> CopyView {
    let live = m.summary(id);
    let applied = if m.writing {
        m.written.contains(id)
    } else {
        live.as_ref()
            .and_then(|l| l.applied_by_another)
            .is_some_and(|(_, from)| Some(from) == template_generation)
    };
    CopyView {
        replicas: live.as_ref().and_then(|l| l.replicas),
        ready: live.as_ref().is_some_and(|l| l.ready),
        applied,
        error: m.errors.get(id).cloned(),
        observed_generation: live.as_ref().and_then(|l| l.observed_generation),
        ready_replicas: live.as_ref().and_then(|l| l.ready_replicas),
        available_replicas: live.as_ref().and_then(|l| l.available_replicas),
    }
}

/// What a copy written by another replica says of that write: (the generation the member
/// gave it, the template generation it came from). The live generation may be past the one
/// the write got, which only makes observedGeneration wait longer, never claim too early.
fn applied_by_another(live: &Value) -> Option<Applied> {
    let generation = live.pointer("/metadata/generation")?.as_i64()?;
    Some((generation, received(live)?.generation))
}

/// What a copy says it was rendered from (None: no template generation on it).
fn received(live: &Value) -> Option<Received> {
    let annotations = live.pointer("/metadata/annotations")?;
    let digest = |name| {
        let hex = annotations.get(name)?.as_str()?;
        u64::from_str_radix(hex, 16).ok()
    };
    Some(Received {
        generation: annotations
            .get(render::GENERATION_ANNOTATION)?
            .as_str()?
            .parse()
            .ok()?,
        body: digest(render::TEMPLATE_DIGEST_ANNOTATION),
        overrides: digest(render::OVERRIDES_ANNOTATION),
    })
}

/// The Placement records and the templates' aggregated status, on a Kubernetes hub.
#[allow(clippy::too_many_arguments)]
async fn write_hub(
    applier: &Applier,
    pass: &Pass<'_>,
    looked: &BTreeSet<TemplateKey>,
    moved: bool,
    views: &BTreeMap<TemplateKey, TemplateView>,
    members: &Slots<Member>,
    staged: &Staged,
    written: &mut Written,
) {
    if looked.is_empty() && !moved {
        return;
    }
    if moved {
        forget_unplaced(applier, pass, written).await;
    }
    // Only the policies of the templates looked at (a dependency's rollout: the policy it
    // is staged by), unless the decisions moved.
    let governing: Option<BTreeSet<ObjectKey>> = (!moved).then(|| {
        looked
            .iter()
            .filter_map(|k| {
                let placing = pass.snapshot.placements.decisions.get(k)?.policy.clone();
                placing.or_else(|| Some(staged.rollouts().get(k)?.policy.clone()))
            })
            .collect()
    });
    let policies = policies::statuses(pass, views, staged, governing.as_ref());
    if moved {
        forget_stale_statuses(pass, &policies, written);
    }
    // Per template, its writes in order (a Placement before its status); templates side by
    // side, and the policies' statuses.
    let mut batches: Vec<(String, Vec<HubWrite>)> = Vec::new();
    for (key, view) in looked.iter().filter_map(|k| Some((k, views.get(k)?))) {
        let (Some(decision), Some(template)) = (
            pass.snapshot.placements.decisions.get(key),
            pass.templates.get(key),
        ) else {
            continue;
        };
        let (record_id, record, record_status) = placement_record(pass, decision, template, view);
        let mut writes = vec![
            HubWrite {
                print: record_id.clone(),
                id: record_id.clone(),
                body: record,
                status: false,
            },
            HubWrite {
                print: ObjectId {
                    kind: "PlacementStatus".into(),
                    ..record_id.clone()
                },
                id: record_id,
                body: record_status,
                status: true,
            },
        ];
        if let Some(aggregated) = aggregated_status(decision, template, members) {
            let id = object_id(key);
            writes.push(HubWrite {
                print: ObjectId {
                    kind: format!("{}Status", key.kind),
                    ..id.clone()
                },
                body: json!({
                    "apiVersion": &*key.api_version,
                    "kind": &*key.kind,
                    "metadata": {"name": &*key.name, "namespace": &*key.namespace},
                    "status": aggregated,
                }),
                id,
                status: true,
            });
        }
        writes.retain(|w| !written.unchanged(&w.print, &w.body));
        if !writes.is_empty() {
            batches.push((key.to_string(), writes));
        }
    }
    for (id, body) in policies {
        let print = ObjectId {
            kind: POLICY_PRINT.into(),
            ..id.clone()
        };
        if !written.unchanged(&print, &body) {
            let name = format!("policy {}", print.name);
            let write = HubWrite {
                print,
                id,
                body,
                status: true,
            };
            batches.push((name, vec![write]));
        }
    }
    let done: Vec<Vec<HubWrite>> = futures::stream::iter(batches)
        .map(|(key, writes)| async move {
            let mut done = Vec::with_capacity(writes.len());
            for w in writes {
                let body = if w.status {
                    stamp(w.body.clone())
                } else {
                    w.body.clone()
                };
                let result = if w.status {
                    applier
                        .apply_status(&w.id, &body, ApplyOptions::force())
                        .await
                } else {
                    applier.apply(&w.id, &body, ApplyOptions::force()).await
                };
                match result {
                    Ok(_) => done.push(w),
                    Err(apply::Error::NotLeader) => break,
                    Err(e) => {
                        warn!(of = %key, object = %w.print, error = %e, "cannot write on the hub");
                        break;
                    }
                }
            }
            done
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    for w in done.into_iter().flatten() {
        written.record(&w.print, &w.body);
    }
}

/// Deletes the Placements of templates no longer placed (at a term's start, also those
/// found by label), and forgets what was written of them.
async fn forget_unplaced(applier: &Applier, pass: &Pass<'_>, written: &mut Written) {
    let records: BTreeSet<ObjectId> = pass
        .snapshot
        .placements
        .decisions
        .keys()
        .map(record_id)
        .collect();
    let mut gone: Vec<ObjectId> = written
        .ids()
        .filter(|id| id.kind == "Placement" && !records.contains(*id))
        .cloned()
        .collect();
    if written.ids().next().is_none() {
        // A new term: the Placements of templates deleted meanwhile are found by label.
        if let Ok(all) = applier
            .list_managed(
                "meridian.io/v1alpha1",
                "Placement",
                super::MANAGED_BY_SELECTOR,
            )
            .await
        {
            gone.extend(all.into_iter().filter(|id| !records.contains(id)));
        }
    }
    for id in gone {
        match applier.delete(&id).await {
            Ok(()) => {
                // Its status and its template's status go with it: a template made again
                // gets both written afresh.
                let prints: Vec<ObjectId> = written
                    .ids()
                    .filter(|p| {
                        p.namespace == id.namespace && placement_print_of(p) == Some(&id.name)
                    })
                    .cloned()
                    .collect();
                for p in prints {
                    written.forget(&p);
                }
                written.forget(&id);
            }
            Err(e) => {
                warn!(placement = %id, error = %e, "cannot delete the Placement of a template no longer placed")
            }
        }
    }
}

/// Forgets the status fingerprints of templates no longer placed and of policies gone:
/// written afresh if they return.
fn forget_stale_statuses(pass: &Pass<'_>, policies: &[(ObjectId, Value)], written: &mut Written) {
    let decided: BTreeSet<ObjectId> = pass
        .snapshot
        .placements
        .decisions
        .keys()
        .map(object_id)
        .collect();
    let stale: Vec<ObjectId> = written
        .ids()
        .filter(|p| p.kind != "Placement" && p.kind != "PlacementStatus")
        .filter(|p| {
            if p.kind == POLICY_PRINT {
                return !policies
                    .iter()
                    .any(|(id, _)| id.namespace == p.namespace && id.name == p.name);
            }
            let kind = p.kind.strip_suffix("Status").unwrap_or(&p.kind).to_string();
            !decided.contains(&ObjectId {
                kind,
                ..(*p).clone()
            })
        })
        .cloned()
        .collect();
    for p in stale {
        written.forget(&p);
    }
}

/// The Placement name a hub fingerprint belongs to: a Placement's own and its status' are
/// named by it, a template's status by the template.
fn placement_print_of(print: &ObjectId) -> Option<&String> {
    (print.kind == "PlacementStatus").then_some(&print.name)
}

/// One write on the hub: `print` names it among the fingerprints (a Placement and its status
/// are two), `status` says it goes to the status subresource.
/// The fingerprint kind of a policy's status among the hub writes.
const POLICY_PRINT: &str = "ClusterSchedulingPolicyStatus";

struct HubWrite {
    print: ObjectId,
    id: ObjectId,
    body: Value,
    status: bool,
}

/// The template's status summed over its placed copies.
fn aggregated_status(
    decision: &Decision,
    template: &Template,
    members: &Slots<Member>,
) -> Option<Value> {
    let id = object_id(&template.key);
    let objects: Vec<(ClusterId, Value, Option<Applied>)> = decision
        .placed
        .iter()
        .filter_map(|p| {
            let m = members.get(&p.cluster)?;
            let live = m.live(&id)?.json();
            let applied = if m.writing {
                m.applied.get(&id).copied()
            } else {
                applied_by_another(&live)
            };
            Some((p.cluster.clone(), live, applied))
        })
        .collect();
    if objects.len() < decision.placed.len() {
        // A copy not yet seen: the sum would be short and the gate cannot open.
        if objects.is_empty() {
            return None;
        }
    }
    let copies: Vec<status::MemberCopy<'_>> = objects
        .iter()
        .map(|(cluster, object, applied)| status::MemberCopy {
            cluster: cluster.as_str(),
            object,
            applied_generation: applied.map(|a| a.0),
            applied_from: applied.map(|a| a.1),
        })
        .collect();
    let mut aggregated = status::aggregate(&template.key.kind, template.generation, &copies)?;
    if objects.len() < decision.placed.len()
        && let Some(o) = aggregated.as_object_mut()
    {
        o.remove("observedGeneration");
    }
    Some(aggregated)
}

/// The Placement of a template: in its namespace, named by its label.
fn record_id(key: &TemplateKey) -> ObjectId {
    ObjectId::new(
        "meridian.io/v1alpha1",
        "Placement",
        Some(&key.namespace),
        &template_label(key),
    )
}

/// The Placement record of one template: (its id, the object, its status).
fn placement_record(
    pass: &Pass<'_>,
    decision: &Decision,
    template: &Template,
    view: &TemplateView,
) -> (ObjectId, Value, Value) {
    let key = &template.key;
    let name = template_label(key);
    let id = record_id(key);
    let reason = |p: &Placed| {
        serde_json::to_value(&p.reason)
            .ok()
            .and_then(|v| v["reason"].as_str().map(str::to_string))
            .unwrap_or_default()
    };
    let clusters: Vec<Value> = decision
        .placed
        .iter()
        .map(|p| json!({"name": p.cluster.as_str(), "replicas": p.replicas, "reason": reason(p)}))
        .collect();
    let summary = decision
        .placed
        .iter()
        .map(|p| match p.replicas {
            Some(r) => format!("{}={r}", p.cluster),
            None => p.cluster.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",");
    let outcome = match &decision.outcome {
        meridian_core::placement::Outcome::Scheduled => "Scheduled".to_string(),
        meridian_core::placement::Outcome::Unschedulable { reason } => {
            format!("Unschedulable: {reason}")
        }
    };
    let record = json!({
        "apiVersion": "meridian.io/v1alpha1",
        "kind": "Placement",
        "metadata": {"name": name, "namespace": &*key.namespace,
                     "labels": {MANAGED_BY.0: MANAGED_BY.1}},
        "spec": {
            "template": {"apiVersion": &*key.api_version, "kind": &*key.kind, "name": &*key.name,
                         "generation": template.generation},
            "policy": decision.policy.as_ref().map(ToString::to_string),
            "outcome": outcome,
            "tier": decision.tier.as_deref(),
            "summary": summary,
            "clusters": clusters,
        },
    });
    let health = |c: &ClusterId| {
        pass.snapshot
            .cluster_view(c)
            .map_or("Unknown", |v| v.health.as_str())
    };
    let copies: Vec<Value> = view
        .copies
        .iter()
        .map(|(c, v)| {
            json!({
                "name": c.as_str(), "health": health(c), "applied": v.applied, "error": v.error,
                "replicas": v.replicas, "observedGeneration": v.observed_generation,
                "readyReplicas": v.ready_replicas, "availableReplicas": v.available_replicas,
                "ready": v.ready,
            })
        })
        .collect();
    let evictions: Vec<Value> = view
        .step
        .draining
        .iter()
        .map(|d| {
            let reason = d
                .reason
                .as_ref()
                .and_then(|r| serde_json::to_value(r).ok())
                .and_then(|v| v["reason"].as_str().map(str::to_string))
                .unwrap_or_else(|| "NotPlaced".into());
            json!({"cluster": d.cluster.as_str(), "reason": reason,
                   "waitedSeconds": d.waited_seconds, "orphaned": d.orphaned})
        })
        .collect();
    let record_status = json!({
        "apiVersion": "meridian.io/v1alpha1",
        "kind": "Placement",
        "metadata": {"name": name, "namespace": &*key.namespace},
        "status": {
            "clusters": copies,
            "evictions": evictions,
            "conditions": conditions(view),
        },
    });
    (id, strip_nulls(record), strip_nulls(record_status))
}

/// Applied, Ready and Conflict, without `lastTransitionTime`: [`stamp`] adds it when the
/// status is written, so an unchanged status is not written again.
fn conditions(view: &TemplateView) -> Vec<Value> {
    let errors: Vec<String> = view
        .copies
        .iter()
        .filter_map(|(c, v)| Some(format!("{c}: {}", v.error.as_ref()?)))
        .collect();
    let not_ready: Vec<String> = view
        .copies
        .iter()
        .filter(|(_, v)| !v.ready)
        .map(|(c, _)| c.to_string())
        .collect();
    let errors = (!errors.is_empty()).then(|| errors.join("; "));
    let not_ready =
        (!not_ready.is_empty()).then(|| format!("not ready in {}", not_ready.join(", ")));
    let mut out = applied_and_ready(errors, not_ready).to_vec();
    if !view.conflicts.is_empty() {
        let clusters: Vec<&str> = view.conflicts.iter().map(ClusterId::as_str).collect();
        out.push(condition(
            "Conflict",
            true,
            "NotCreatedByMeridian",
            format!(
                "an object of that name exists in {} and is not meridian's (conflictResolution Abort)",
                clusters.join(", ")
            ),
        ));
    }
    out
}

/// `Applied` and `Ready`: true, or false with what failed (the copies' errors) and what is
/// not ready, each already worded.
fn applied_and_ready(errors: Option<String>, not_ready: Option<String>) -> [Value; 2] {
    [
        match errors {
            None => condition(
                "Applied",
                true,
                "Applied",
                "every placed copy is written".into(),
            ),
            Some(errors) => condition("Applied", false, "ApplyFailed", errors),
        },
        match not_ready {
            None => condition("Ready", true, "Ready", "every copy is ready".into()),
            Some(not_ready) => condition("Ready", false, "NotReady", not_ready),
        },
    ]
}

/// One status condition, without `lastTransitionTime` (see [`stamp`]).
fn condition(type_: &str, ok: bool, reason: &str, message: String) -> Value {
    json!({"type": type_, "status": if ok { "True" } else { "False" }, "reason": reason,
           "message": message})
}

/// `status.conditions` dated now.
fn stamp(mut status: Value) -> Value {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    if let Some(conditions) = status["status"]["conditions"].as_array_mut() {
        for c in conditions {
            c["lastTransitionTime"] = json!(now);
        }
    }
    status
}

/// Server-side apply takes a null as "this field"; leave absent what is unknown.
fn strip_nulls(mut v: Value) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(map) => {
                map.retain(|_, v| !v.is_null());
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}

mod analysis;
mod copies;
mod dirty;
mod policies;
mod staged;
#[cfg(test)]
mod tests;
