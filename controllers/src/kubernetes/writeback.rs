//! MCS write-back into the members, each by its writer — the replica holding it when writes
//! are sharded, the leader otherwise (mcs-api v1alpha1):
//!
//! - ServiceExport conditions `Valid` and `Conflict`;
//! - in every member where the namespace exists, a ServiceImport per exported service (type,
//!   ports, `status.clusters`, and `spec.ips`);
//! - for ClusterSetIP services, a derived selector-less Service whose ClusterIP becomes the
//!   ServiceImport's `spec.ips`, so that the ClusterSetIP routes through kube-proxy, and
//!   EndpointSlices holding the endpoints that member's clients are sent to — the first tier of
//!   the same decision DNS answers with (a cluster on another network through its gateway).
//!
//! Everything written carries `app.kubernetes.io/managed-by=meridian`; meridian deletes what it
//! wrote itself once it is no longer wanted (unexported service, removed member), and also sets
//! owner references (slices → derived Service) for clusters where a garbage collector runs.
//! Desired objects are computed by pure functions; every write goes through the member's
//! [`Applier`] (server-side apply, the member's writer asked before each request) and is skipped when
//! [`Written`] says it is unchanged since the last write.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_core::{ClusterId, ObjectKey, Port, Protocol, ServiceView, Snapshot, select};
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::apply::{
    self, APPLIED_ANNOTATION, Applier, ApplyOptions, ObjectId, Written, label_managed,
};
use super::leader::Leadership;
use super::reconcile::{self, MemberState, Round, Slot, Slots, Wake};
use super::{Facts, MANAGED_BY_SELECTOR, bounded_name, name_hash};
use crate::metrics::WritebackMetrics;

pub const MCS_API_VERSION: &str = "multicluster.x-k8s.io/v1alpha1";
pub const MCS_SERVICE_NAME: &str = "multicluster.kubernetes.io/service-name";
pub const SOURCE_CLUSTER: &str = "multicluster.kubernetes.io/source-cluster";
pub const SLICE_MANAGED_BY: (&str, &str) =
    ("endpointslice.kubernetes.io/managed-by", "meridian.io");
/// Endpoints per derived EndpointSlice, as Kubernetes' own EndpointSlice controller fills them.
const ENDPOINTS_PER_SLICE: usize = 100;
/// What meridian wrote is listed this often (metadata only) to repair drift: an object someone
/// else changed or deleted is written again, one carrying meridian's label that is not wanted
/// is deleted (the default of `kubernetes.resyncSeconds`).
pub const RESYNC: Duration = Duration::from_secs(60);
/// A round runs at least this often (a member backing off is tried again, a resync falls
/// due).
const TICK: Duration = Duration::from_secs(5);

/// The name of the derived Service of `service`: a DNS label of at most 63 characters.
pub fn derived_name(service: &str) -> String {
    bounded_name(&format!("derived-{service}"), service)
}

/// One object meridian wants in a member.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    /// Which of the three kinds, for the order they are written in.
    pub kind: WrittenKind,
    pub id: ObjectId,
    /// The exported service it is written for.
    pub service: ObjectKey,
    /// The object, as server-side apply takes it, with meridian's label.
    pub body: Value,
}

impl Desired {
    fn new(
        kind: WrittenKind,
        service: &ObjectKey,
        name: &str,
        mut body: Value,
        labels: &[(&str, &str)],
    ) -> Self {
        label_managed(&mut body, labels);
        Self {
            kind,
            id: kind.id(&service.namespace, name),
            service: service.clone(),
            body,
        }
    }
}

/// Which services a pass writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every exported service; strays are looked for among everything written.
    Full,
    /// Only these: the services whose views changed since the snapshot of the member's last
    /// complete pass (gone ones included), so a change costs its services, not the fleet.
    Services(BTreeSet<ObjectKey>),
}

/// What one pass over a member writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pass {
    /// The services whose objects are decided and written.
    pub objects: Scope,
    /// The exports whose conditions are decided and written.
    pub conditions: Scope,
    /// After writing, list what is in the member and note what drifted (`RESYNC`).
    pub check_drift: bool,
}

impl Pass {
    fn full(check_drift: bool) -> Self {
        Self {
            objects: Scope::Full,
            conditions: Scope::Full,
            check_drift,
        }
    }
}

/// The services whose views differ between two snapshots the store published (a view is
/// renewed whenever anything that decides about its service changes: `Snapshot::restamp`),
/// or `None` when a snapshot was never restamped and the views cannot say.
pub fn changed_services(prev: &Snapshot, next: &Snapshot) -> Option<BTreeSet<ObjectKey>> {
    if !prev.stamped || !next.stamped {
        return None;
    }
    let mut changed: BTreeSet<ObjectKey> = next
        .services()
        .filter(|view| {
            prev.service(&view.key.namespace, &view.key.name)
                .is_none_or(|before| !Arc::ptr_eq(before, view))
        })
        .map(|view| view.key.clone())
        .collect();
    changed.extend(
        prev.services()
            .filter(|view| next.service(&view.key.namespace, &view.key.name).is_none())
            .map(|view| view.key.clone()),
    );
    Some(changed)
}

/// What the write-back writes, in the order it writes them (and deletes them in reverse).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WrittenKind {
    /// Derived Services first: their ClusterIPs go into the ServiceImports and their UIDs into
    /// the slices' owner references.
    Service,
    ServiceImport,
    EndpointSlice,
}

impl WrittenKind {
    pub const ALL: [WrittenKind; 3] = [
        WrittenKind::Service,
        WrittenKind::ServiceImport,
        WrittenKind::EndpointSlice,
    ];

    pub fn api_version(self) -> &'static str {
        match self {
            WrittenKind::Service => "v1",
            WrittenKind::ServiceImport => MCS_API_VERSION,
            WrittenKind::EndpointSlice => "discovery.k8s.io/v1",
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            WrittenKind::Service => "Service",
            WrittenKind::ServiceImport => "ServiceImport",
            WrittenKind::EndpointSlice => "EndpointSlice",
        }
    }

    pub fn id(self, namespace: &str, name: &str) -> ObjectId {
        ObjectId::new(self.api_version(), self.kind(), Some(namespace), name)
    }

    /// Which of the three `id` is, if any.
    pub fn of(id: &ObjectId) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|k| k.api_version() == id.api_version && k.kind() == id.kind)
    }
}

/// A member's ServiceExport condition pair.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportConditions {
    pub key: ObjectKey,
    pub valid: (bool, String, String),
    pub conflict: (bool, String, String),
}

fn protocol(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "TCP",
        Protocol::Udp => "UDP",
        Protocol::Sctp => "SCTP",
    }
}

fn port_json(p: &Port) -> Value {
    let mut v = json!({ "port": p.port, "protocol": protocol(p.protocol) });
    if let Some(n) = &p.name {
        v["name"] = json!(n);
    }
    if let Some(a) = &p.app_protocol {
        v["appProtocol"] = json!(a);
    }
    v
}

/// What member `member` should hold: derived Services, ServiceImports (without `spec.ips`,
/// filled in from the derived Service's ClusterIP when written) and derived EndpointSlices.
pub fn desired_objects(
    snapshot: &Snapshot,
    member: usize,
    namespaces: &BTreeSet<String>,
    now: Instant,
) -> Vec<Desired> {
    let mut out = Vec::new();
    for view in snapshot.services() {
        if namespaces.contains(view.key.namespace.as_ref()) {
            service_objects(snapshot, view, member, now, &mut out);
        }
    }
    out
}

/// `desired_objects` for the services in `scope` only.
pub fn desired_objects_in(
    snapshot: &Snapshot,
    member: usize,
    namespaces: &BTreeSet<String>,
    now: Instant,
    scope: &Scope,
) -> Vec<Desired> {
    let Scope::Services(keys) = scope else {
        return desired_objects(snapshot, member, namespaces, now);
    };
    let mut out = Vec::new();
    for key in keys {
        if !namespaces.contains(key.namespace.as_ref()) {
            continue;
        }
        if let Some(view) = snapshot.service(&key.namespace, &key.name) {
            service_objects(snapshot, view, member, now, &mut out);
        }
    }
    out
}

/// What one service puts into a member: its ServiceImport and, unless headless, its derived
/// Service and slices.
fn service_objects(
    snapshot: &Snapshot,
    view: &ServiceView,
    member: usize,
    now: Instant,
    out: &mut Vec<Desired>,
) {
    let ns = view.key.namespace.to_string();
    let name = view.key.name.to_string();
    let clusters: Vec<Value> = view
        .backends
        .iter()
        .filter_map(|b| snapshot.clusters.get(b.cluster))
        .map(|c| json!({ "cluster": c.spec.id.as_str() }))
        .collect();
    let ports: Vec<Value> = view.ports.iter().map(port_json).collect();
    out.push(Desired::new(
        WrittenKind::ServiceImport,
        &view.key,
        &name,
        json!({
            "apiVersion": MCS_API_VERSION,
            "kind": "ServiceImport",
            "metadata": { "name": name, "namespace": ns },
            "spec": {
                "type": if view.headless { "Headless" } else { "ClusterSetIP" },
                "ports": ports,
            },
            "status": { "clusters": clusters },
        }),
        &[(MCS_SERVICE_NAME, &name)],
    ));
    if view.headless {
        return;
    }
    let derived = derived_name(&name);
    let service_ports: Vec<Value> = view
        .ports
        .iter()
        .map(|p| {
            let mut v = port_json(p);
            // Selector-less: the slices say where each named port goes.
            v["targetPort"] = json!(p.port);
            v
        })
        .collect();
    out.push(Desired::new(
        WrittenKind::Service,
        &view.key,
        &derived,
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": { "name": derived, "namespace": ns },
            "spec": { "type": "ClusterIP", "ports": service_ports },
        }),
        &[(MCS_SERVICE_NAME, &name)],
    ));
    out.extend(derived_slices(snapshot, view, member, &derived, now));
}

/// What one derived slice holds: (source cluster, IPv6, ports as (name, port, protocol)).
type SliceGroup = (String, bool, Vec<(Option<String>, u16, &'static str)>);

/// The EndpointSlices of a derived Service: one per (source cluster, address family, ports).
fn derived_slices(
    snapshot: &Snapshot,
    view: &meridian_core::ServiceView,
    member: usize,
    derived: &str,
    now: Instant,
) -> Vec<Desired> {
    let ns = view.key.namespace.to_string();
    let selection = select(snapshot, view, Some(member), now);
    let Some(first) = selection.tiers.first() else {
        return Vec::new();
    };
    let mut groups: BTreeMap<SliceGroup, Vec<Value>> = BTreeMap::new();
    for m in &first.members {
        let (Some(cluster), Some(backend)) = (
            snapshot.clusters.get(m.cluster),
            view.backends.get(m.backend),
        ) else {
            continue;
        };
        let id = cluster.spec.id.as_str().to_string();
        if let Some((address, port)) = m.gateway() {
            let ports = view
                .ports
                .iter()
                .map(|p| (p.name.clone(), port, protocol(p.protocol)))
                .collect();
            groups
                .entry((id, address.is_ipv6(), ports))
                .or_default()
                .push(
                    json!({ "addresses": [address.to_string()], "conditions": { "ready": true } }),
                );
            continue;
        }
        for ep in selection.answerable_of(view, m) {
            let ports: Vec<_> = view
                .ports
                .iter()
                .map(|p| (p.name.clone(), ep.target_port(p), protocol(p.protocol)))
                .collect();
            for family in [false, true] {
                let addresses: Vec<String> = ep
                    .addresses
                    .iter()
                    .filter(|a| a.is_ipv6() == family)
                    .map(IpAddr::to_string)
                    .collect();
                if addresses.is_empty() {
                    continue;
                }
                let mut e = json!({
                    "addresses": addresses,
                    "conditions": { "ready": ep.ready || backend.publish_not_ready, "serving": ep.serving, "terminating": ep.terminating },
                });
                if let Some(h) = &ep.hostname {
                    e["hostname"] = json!(h);
                }
                if let Some(z) = &ep.zone {
                    e["zone"] = json!(z);
                }
                groups
                    .entry((id.clone(), family, ports.clone()))
                    .or_default()
                    .push(e);
            }
        }
    }
    groups
        .into_iter()
        .flat_map(|((cluster, v6, ports), endpoints)| {
            // Kubernetes caps a slice at 1,000 endpoints; its own controller fills 100.
            let chunks: Vec<Vec<Value>> = endpoints
                .chunks(ENDPOINTS_PER_SLICE)
                .map(<[Value]>::to_vec)
                .collect();
            chunks
                .into_iter()
                .enumerate()
                .map(move |(i, endpoints)| ((cluster.clone(), v6, ports.clone()), i, endpoints))
        })
        .map(|((cluster, v6, ports), chunk, endpoints)| {
            let seed = format!("{derived}/{cluster}/{v6}/{ports:?}");
            let name = bounded_name(
                &format!(
                    "{derived}-{cluster}-{:08x}-{chunk}",
                    name_hash(&seed) as u32
                ),
                &format!("{seed}/{chunk}"),
            );
            let ports: Vec<Value> = ports
                .iter()
                .map(|(n, port, proto)| {
                    let mut v = json!({ "port": port, "protocol": proto });
                    if let Some(n) = n {
                        v["name"] = json!(n);
                    }
                    v
                })
                .collect();
            Desired::new(
                WrittenKind::EndpointSlice,
                &view.key,
                &name,
                json!({
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSlice",
                    "metadata": { "name": name, "namespace": ns },
                    "addressType": if v6 { "IPv6" } else { "IPv4" },
                    "endpoints": endpoints,
                    "ports": ports,
                }),
                &[
                    SLICE_MANAGED_BY,
                    ("kubernetes.io/service-name", derived),
                    (MCS_SERVICE_NAME, view.key.name.as_ref()),
                    (SOURCE_CLUSTER, &cluster),
                ],
            )
        })
        .collect()
}

/// The `Valid` and `Conflict` conditions of each of a member's ServiceExports.
pub fn export_conditions(
    snapshot: &Snapshot,
    member: usize,
    exports: &BTreeSet<ObjectKey>,
) -> Vec<ExportConditions> {
    let Some(cluster) = snapshot.clusters.get(member).map(|c| &c.spec.id) else {
        return Vec::new();
    };
    exports
        .iter()
        .map(|key| {
            let problem = snapshot
                .problems
                .iter()
                .find(|p| p.origin.is_member(cluster) && p.subject.is("ServiceExport", key));
            let view = snapshot.service(&key.namespace, &key.name);
            let conflict = view.and_then(|v| v.conflicts.iter().find(|c| &c.cluster == cluster));
            let exported =
                view.is_some_and(|v| v.backend_of(member).is_some()) || conflict.is_some();
            let valid = match (problem, exported) {
                (Some(p), _) => (false, "Invalid".to_string(), p.reason.clone()),
                (None, true) => (true, "Exported".into(), String::new()),
                (None, false) => (
                    false,
                    "ServiceNotFound".into(),
                    format!("no Service {key} in cluster {cluster}"),
                ),
            };
            let conflict = match conflict {
                Some(c) => (true, "ConflictingProperties".to_string(), c.reason.clone()),
                None => (false, "NoConflict".into(), String::new()),
            };
            ExportConditions {
                key: key.clone(),
                valid,
                conflict,
            }
        })
        .collect()
}

/// The ClusterIP and UID the API gave each derived Service, by (namespace, derived name).
type Derived = BTreeMap<(String, String), (Option<String>, Option<String>)>;

/// What the leader last wrote into one member (its slot holds the applier, back-off and
/// resync clock).
struct MemberWrites {
    /// The derived Services, ServiceImports and EndpointSlices: what is recorded here and no
    /// longer wanted is deleted.
    objects: Written,
    /// ServiceExport status, apart from `objects`: the exports are the member's own objects,
    /// never to be deleted as strays.
    exports: Written,
    /// For the ServiceImports' `spec.ips` and the slices' owner references.
    derived: Derived,
    /// What was written for each service (for its strays when only it is written again).
    by_service: BTreeMap<ObjectKey, Vec<ObjectId>>,
    /// What the last complete pass was made from; `None` until one completes.
    settled: Option<Settled>,
    /// The services whose objects the last drift check found changed or gone in the member:
    /// the next pass writes them again.
    drifted: BTreeSet<ObjectKey>,
    /// The last drift check found an export's status changed: the next pass writes every
    /// export's conditions.
    conditions_drifted: bool,
    /// A new term read what the member holds: `None` until then (see [`learn`]).
    learned: Option<Learned>,
}

/// What a new term found in the member of meridian's earlier writes.
#[derive(Default)]
struct Learned {
    /// Per object: the print of the body applied, its resourceVersion, and its status (a
    /// ServiceImport's is a write of its own).
    objects: HashMap<ObjectId, (String, Option<String>, Value)>,
    /// Per ServiceExport: its conditions without their transition times, and its
    /// resourceVersion.
    exports: HashMap<ObjectId, (Value, Option<String>)>,
}

/// The inputs of a member's last complete pass: the next pass writes only what changed since.
struct Settled {
    snapshot: Arc<Snapshot>,
    namespaces: BTreeSet<String>,
    exports: BTreeSet<ObjectKey>,
}

impl MemberWrites {
    fn new() -> Self {
        Self {
            objects: Written::default(),
            exports: Written::default(),
            derived: Derived::new(),
            by_service: BTreeMap::new(),
            settled: None,
            drifted: BTreeSet::new(),
            conditions_drifted: false,
            learned: None,
        }
    }
}

impl MemberState for MemberWrites {
    /// A new term starts with a full resync (the slot's applier keeps its discovery cache).
    fn stopped_writing(&mut self) {
        *self = Self::new();
    }
}

impl Slot<MemberWrites> {
    /// A round failed: the next waits for the back-off, and starts over with a full pass and
    /// a drift check.
    fn failed(&mut self, now: Instant) {
        self.resync.reset();
        self.state.settled = None;
        self.backoff.failed(now);
    }

    /// What the next pass must write: the services that changed since the last complete pass
    /// (and those whose policy depends on time, and those the last drift check found
    /// changed in the member), or everything after a failed pass, on a new term, or when the
    /// member's namespaces are not what they were. Export conditions are all written again
    /// when the member's exports or the fleet's problems changed.
    fn plan<'k>(
        &mut self,
        changes: &mut Changes<'_>,
        namespaces: &BTreeSet<String>,
        exports: &BTreeSet<ObjectKey>,
        timed: impl Iterator<Item = &'k ObjectKey>,
    ) -> Pass {
        let check_drift = self.resync.due();
        let this = &mut self.state;
        let drifted = std::mem::take(&mut this.drifted);
        let conditions_drifted = std::mem::take(&mut this.conditions_drifted);
        let Some(s) = &this.settled else {
            return Pass::full(check_drift);
        };
        let exports_changed = s.exports != *exports;
        let problems_changed = s.snapshot.problems != changes.next.problems;
        let changed = match changes.since(&s.snapshot) {
            Some(changed) if s.namespaces == *namespaces => changed,
            _ => return Pass::full(check_drift),
        };
        let mut keys = changed.clone();
        keys.extend(drifted);
        keys.extend(timed.cloned());
        if exports_changed {
            this.forget_exports_not_in(exports);
        }
        let conditions = if conditions_drifted || exports_changed || problems_changed {
            Scope::Full
        } else {
            Scope::Services(keys.clone())
        };
        Pass {
            objects: Scope::Services(keys),
            conditions,
            check_drift,
        }
    }
}

impl MemberWrites {
    /// Forgets what was written to exports the member no longer has: one created again gets
    /// its conditions written again.
    fn forget_exports_not_in(&mut self, exports: &BTreeSet<ObjectKey>) {
        let gone: Vec<ObjectId> = (self.exports.ids())
            .filter(|id| {
                let ns = id.namespace.as_deref().unwrap_or_default();
                !exports.contains(&ObjectKey::new(ns, id.name.as_str()))
            })
            .cloned()
            .collect();
        for id in &gone {
            self.exports.forget(id);
        }
    }
}

/// `changed_services` from earlier snapshots to a round's, worked out once per round for each
/// snapshot members settled at (usually one), not once per member.
struct Changes<'a> {
    next: &'a Snapshot,
    since: HashMap<u64, Option<BTreeSet<ObjectKey>>>,
}

impl<'a> Changes<'a> {
    fn new(next: &'a Snapshot) -> Self {
        Self {
            next,
            since: HashMap::new(),
        }
    }

    fn since(&mut self, prev: &Snapshot) -> Option<&BTreeSet<ObjectKey>> {
        self.since
            .entry(prev.version)
            .or_insert_with(|| changed_services(prev, self.next))
            .as_ref()
    }
}

/// Writes into every Kubernetes member while this replica leads.
pub async fn run(
    snapshots: watch::Receiver<Arc<Snapshot>>,
    fleet: Facts,
    leadership: Leadership,
    metrics: WritebackMetrics,
    resync: Duration,
) {
    let mut wake = Wake::new(snapshots, &fleet, TICK);
    let mut slots: Slots<MemberWrites> = Slots::new();
    while let Some(Round { snapshot, facts }) = wake.next(None).await {
        for gone in slots.keys().filter(|id| !facts.contains_key(*id)) {
            metrics.forget(gone);
        }
        reconcile::sync(
            &mut slots,
            &facts,
            &leadership,
            resync,
            |id, f, writing| {
                writing && !f.retired && f.listed && snapshot.cluster_index(id.as_str()).is_some()
            },
            |_| MemberWrites::new(),
        );
        let mut changes = Changes::new(&snapshot);
        for (id, f) in &facts {
            if f.retired {
                // A member gone from the hub has no holder: the leader cleans up after it.
                if leadership.is_leader() {
                    let applier = f.applier(leadership.clone(), id);
                    slots.remove(id);
                    retire(applier, id, &fleet).await;
                }
                continue;
            }
            // A slot exists only while the member has a client; `writing` is this round's.
            let (Some(member), Some(slot)) =
                (snapshot.cluster_index(id.as_str()), slots.get_mut(id))
            else {
                continue;
            };
            if !slot.writing || !f.listed || slot.backoff.waits(Instant::now()) {
                continue;
            }
            let pass = slot.plan(
                &mut changes,
                &f.namespaces,
                &f.exports,
                snapshot.timed_keys(),
            );
            let now = Instant::now();
            let desired = desired_objects_in(&snapshot, member, &f.namespaces, now, &pass.objects);
            let conditions = match &pass.conditions {
                Scope::Full => export_conditions(&snapshot, member, &f.exports),
                Scope::Services(keys) => export_conditions(&snapshot, member, &(&f.exports & keys)),
            };
            match &pass.objects {
                Scope::Full => metrics.scope(id, true, snapshot.service_count()),
                Scope::Services(keys) => metrics.scope(id, false, keys.len()),
            }
            let result = reconcile_member(slot, desired, conditions, &pass).await;
            metrics.round(id, result.is_ok());
            match result {
                Ok(()) => {
                    slot.backoff.succeeded();
                    slot.state.settled = Some(Settled {
                        snapshot: snapshot.clone(),
                        namespaces: f.namespaces.clone(),
                        exports: f.exports.clone(),
                    })
                }
                Err(e) => {
                    slot.failed(Instant::now());
                    warn!(cluster = %id, error = %e, failures = slot.backoff.failures(), "write-back incomplete; retrying");
                }
            }
        }
    }
}

/// Everything of the three kinds in the member that carries meridian's label, in the order
/// it is deleted in (slices before imports before derived Services).
async fn list_managed(applier: &Applier) -> Result<Vec<ObjectId>, apply::Error> {
    let mut out = Vec::new();
    for kind in WrittenKind::ALL {
        out.extend(
            applier
                .list_managed(kind.api_version(), kind.kind(), MANAGED_BY_SELECTOR)
                .await?,
        );
    }
    sort_for_deletion(&mut out);
    Ok(out)
}

/// Reverse write order: nothing left behind points at what is already gone.
fn sort_for_deletion(ids: &mut Vec<ObjectId>) {
    ids.sort_by(|a, b| (WrittenKind::of(b), b).cmp(&(WrittenKind::of(a), a)));
    ids.dedup();
}

/// A member left the hub: delete everything meridian wrote there, then forget it.
async fn retire(applier: Option<Applier>, cluster: &ClusterId, fleet: &Facts) {
    if let Some(applier) = applier {
        let cleaned = async {
            for id in list_managed(&applier).await? {
                applier.delete(&id).await?;
            }
            Ok::<_, apply::Error>(())
        }
        .await;
        match cleaned {
            Ok(()) => {
                info!(cluster = %cluster, "member removed: deleted what meridian wrote there")
            }
            Err(apply::Error::NotLeader) => {
                info!(cluster = %cluster, "member removed: leadership lapsed while deleting what meridian wrote there")
            }
            Err(e) => {
                // Unreachable or refusing: give up rather than keep a removed member forever;
                // owner references let a garbage collector finish the derived slices.
                warn!(cluster = %cluster, error = %e, "member removed: could not delete what meridian wrote there")
            }
        }
    }
    fleet.remove(cluster);
}

async fn reconcile_member(
    slot: &mut Slot<MemberWrites>,
    desired: Vec<Desired>,
    conditions: Vec<ExportConditions>,
    pass: &Pass,
) -> Result<(), apply::Error> {
    match reconcile_pass(slot, desired, conditions, pass).await {
        // Leadership lapsed in the middle of the pass: stop writing, quietly; the next term
        // starts with a full resync.
        Err(apply::Error::NotLeader) => Ok(()),
        other => other,
    }
}

async fn reconcile_pass(
    slot: &mut Slot<MemberWrites>,
    mut desired: Vec<Desired>,
    conditions: Vec<ExportConditions>,
    pass: &Pass,
) -> Result<(), apply::Error> {
    let cluster = slot.applier.cluster().clone();
    let learned = match slot.state.learned.take() {
        Some(learned) => learned,
        None => learn(&slot.applier, &mut slot.state.derived).await?,
    };
    // Learned once per term: later passes go by what this term wrote.
    slot.state.learned = Some(Learned::default());
    desired.sort_by_key(|d| d.kind);
    let wanted: BTreeSet<ObjectId> = desired.iter().map(|d| d.id.clone()).collect();
    let written = written_by_service(&desired);
    // One object the API refuses must not hold up the others: the first error is returned
    // after the pass (and the next pass tries again).
    let mut first_error = None;
    for mut d in desired {
        if d.kind == WrittenKind::ServiceImport || d.kind == WrittenKind::EndpointSlice {
            fill_from_derived(&mut d, &slot.state.derived);
        }
        if slot.state.objects.unchanged(&d.id, &d.body) {
            continue;
        }
        if let Some(version) = already_applied(&learned, &d) {
            slot.state.objects.record_at(&d.id, &d.body, version);
            continue;
        }
        match write(&slot.applier, &d, &mut slot.state.derived).await {
            Ok(version) => {
                debug!(cluster = %cluster, object = %d.id, "written");
                slot.state.objects.record_at(&d.id, &d.body, version);
            }
            Err(apply::Error::NotLeader) => return Err(apply::Error::NotLeader),
            Err(e) => {
                warn!(cluster = %cluster, object = %d.id, error = %e, "cannot write");
                first_error.get_or_insert(e);
            }
        }
    }
    // Strays: what was written before (for the services in scope) and is no longer wanted.
    let mut strays: Vec<ObjectId> = match &pass.objects {
        Scope::Full => slot.state.objects.ids().cloned().collect(),
        Scope::Services(keys) => keys
            .iter()
            .filter_map(|key| slot.state.by_service.get(key))
            .flatten()
            .cloned()
            .collect(),
    };
    strays.retain(|id| !wanted.contains(id));
    match &pass.objects {
        Scope::Full => slot.state.by_service = written,
        Scope::Services(keys) => {
            for key in keys {
                slot.state.by_service.remove(key);
            }
            slot.state.by_service.extend(written);
        }
    }
    delete_strays(slot, strays).await?;
    for c in conditions {
        let id = export_id(&c.key);
        let status = export_status(&c);
        if slot.state.exports.unchanged(&id, &status) {
            continue;
        }
        if let Some((_, version)) = learned
            .exports
            .get(&id)
            .filter(|(conditions, _)| *conditions == status["status"]["conditions"])
        {
            slot.state.exports.record_at(&id, &status, version.clone());
            continue;
        }
        let stamped = stamp_transitions(&status, &k8s_openapi::jiff::Timestamp::now().to_string());
        match slot
            .applier
            .apply_status(&id, &stamped, ApplyOptions::force())
            .await
        {
            // The export is gone; its watch will say so.
            Err(e) if e.is_not_found() => slot.state.exports.record(&id, &status),
            Err(e) => return Err(e),
            Ok(written) => {
                slot.state
                    .exports
                    .record_at(&id, &status, written.metadata.resource_version)
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    if pass.check_drift {
        check_drift(slot).await?;
        slot.resync.done(Instant::now());
    }
    Ok(())
}

fn export_id(key: &ObjectKey) -> ObjectId {
    ObjectId::new(
        MCS_API_VERSION,
        "ServiceExport",
        Some(&key.namespace),
        &key.name,
    )
}

/// Deletes `strays` (in reverse write order) and forgets them.
async fn delete_strays(
    slot: &mut Slot<MemberWrites>,
    mut strays: Vec<ObjectId>,
) -> Result<(), apply::Error> {
    sort_for_deletion(&mut strays);
    for id in strays {
        slot.applier.delete(&id).await?;
        info!(cluster = %slot.applier.cluster(), object = %id, "deleted what is no longer wanted");
        slot.state.objects.forget(&id);
        if let (Some(WrittenKind::Service), Some(ns)) = (WrittenKind::of(&id), &id.namespace) {
            slot.state.derived.remove(&(ns.clone(), id.name.clone()));
        }
    }
    Ok(())
}

/// Lists what is in the member (metadata only) after a complete pass, when everything
/// recorded as written is what is wanted: whatever carries meridian's label and is not
/// recorded is deleted; an object whose resourceVersion is not the one meridian's write left
/// (someone changed it) or that is gone is forgotten, and its service written again by the
/// next pass; an export whose status changed gets its conditions written again. A resync
/// costs three listings, not a write of everything.
async fn check_drift(slot: &mut Slot<MemberWrites>) -> Result<(), apply::Error> {
    let mut listed = Vec::new();
    for kind in WrittenKind::ALL {
        listed.extend(
            slot.applier
                .list_versions(kind.api_version(), kind.kind(), MANAGED_BY_SELECTOR)
                .await?,
        );
    }
    let service_of: HashMap<&ObjectId, &ObjectKey> = (slot.state.by_service.iter())
        .flat_map(|(key, ids)| ids.iter().map(move |id| (id, key)))
        .collect();
    let mut seen = BTreeSet::new();
    let mut strays = Vec::new();
    let mut changed = Vec::new();
    for (id, version) in &listed {
        if !slot.state.objects.contains(id) {
            strays.push(id.clone());
        } else if slot.state.objects.drifted(id, version.as_deref()) {
            changed.push(id.clone());
        }
        seen.insert(id);
    }
    changed.extend(
        slot.state
            .objects
            .ids()
            .filter(|id| !seen.contains(id))
            .cloned(),
    );
    for id in &changed {
        debug!(cluster = %slot.applier.cluster(), object = %id, "changed or deleted in the member: written again");
        slot.state.objects.forget(id);
        if let Some(key) = service_of.get(id) {
            slot.state.drifted.insert((*key).clone());
        }
    }
    delete_strays(slot, strays).await?;
    let exports = slot
        .applier
        .list_versions(MCS_API_VERSION, "ServiceExport", "")
        .await?;
    let exports: HashMap<ObjectId, Option<String>> = exports.into_iter().collect();
    // An export not listed is gone, which the member's watch says (see `plan`).
    let changed: Vec<ObjectId> = (slot.state.exports.ids())
        .filter(|id| {
            exports
                .get(*id)
                .is_some_and(|listed| slot.state.exports.drifted(id, listed.as_deref()))
        })
        .cloned()
        .collect();
    slot.state.conditions_drifted |= !changed.is_empty();
    for id in &changed {
        slot.state.exports.forget(id);
    }
    Ok(())
}

/// The ids of `desired`, by the service each is written for.
fn written_by_service(desired: &[Desired]) -> BTreeMap<ObjectKey, Vec<ObjectId>> {
    let mut by_service: BTreeMap<ObjectKey, Vec<ObjectId>> = BTreeMap::new();
    for d in desired {
        by_service
            .entry(d.service.clone())
            .or_default()
            .push(d.id.clone());
    }
    by_service
}

/// A ServiceImport gets its derived Service's ClusterIP as `spec.ips`; a slice gets the
/// derived Service as its owner.
fn fill_from_derived(d: &mut Desired, derived: &Derived) {
    let service = match d.kind {
        WrittenKind::ServiceImport => derived_name(&d.id.name),
        _ => d.body["metadata"]["labels"]["kubernetes.io/service-name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    };
    let namespace = d.id.namespace.clone().unwrap_or_default();
    let Some((ip, uid)) = derived.get(&(namespace, service.clone())) else {
        return;
    };
    match d.kind {
        WrittenKind::ServiceImport => {
            if let Some(ip) = ip {
                d.body["spec"]["ips"] = json!([ip]);
            }
        }
        _ => {
            if let Some(uid) = uid {
                d.body["metadata"]["ownerReferences"] = json!([{
                    "apiVersion": "v1", "kind": "Service", "name": service, "uid": uid,
                }]);
            }
        }
    }
}

/// Writes one object: a ServiceImport's status is a second request, a derived Service's
/// ClusterIP and UID are read from what the API returned. Returns the resourceVersion the
/// write left.
async fn write(
    applier: &Applier,
    d: &Desired,
    derived: &mut Derived,
) -> Result<Option<String>, apply::Error> {
    let written = applier
        .apply(&d.id, &with_applied_print(&d.body), ApplyOptions::force())
        .await?;
    match d.kind {
        WrittenKind::Service => {
            let ip = written.data["spec"]["clusterIP"]
                .as_str()
                .filter(|ip| !ip.is_empty() && *ip != "None")
                .map(str::to_string);
            let namespace = d.id.namespace.clone().unwrap_or_default();
            derived.insert((namespace, d.id.name.clone()), (ip, written.metadata.uid));
            Ok(written.metadata.resource_version)
        }
        WrittenKind::ServiceImport => {
            // A write of its own: the applier asks for leadership again before sending it.
            let status = json!({
                "apiVersion": MCS_API_VERSION,
                "kind": "ServiceImport",
                "status": d.body["status"],
            });
            let written = applier
                .apply_status(&d.id, &status, ApplyOptions::force())
                .await?;
            Ok(written.metadata.resource_version)
        }
        WrittenKind::EndpointSlice => Ok(written.metadata.resource_version),
    }
}

/// `body` carrying the print of itself ([`APPLIED_ANNOTATION`]).
fn with_applied_print(body: &Value) -> Value {
    let mut out = body.clone();
    let print = apply::fingerprint(body).to_string();
    if let Some(meta) = out.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| json!({}))
            .as_object_mut();
        if let Some(a) = annotations {
            a.insert(APPLIED_ANNOTATION.into(), print.into());
        }
    }
    out
}

/// What the member holds of meridian's earlier writes (a term's first pass): each object's
/// applied print, the derived Services' ClusterIPs and UIDs (what the ServiceImports and
/// slices written after them carry), and the exports' conditions.
async fn learn(applier: &Applier, derived: &mut Derived) -> Result<Learned, apply::Error> {
    let mut learned = Learned::default();
    for kind in WrittenKind::ALL {
        let objects = applier
            .list_objects(kind.api_version(), kind.kind(), MANAGED_BY_SELECTOR)
            .await?;
        for o in objects {
            let id = kind.id(
                o.metadata.namespace.as_deref().unwrap_or_default(),
                o.metadata.name.as_deref().unwrap_or_default(),
            );
            if kind == WrittenKind::Service {
                let ip = o.data["spec"]["clusterIP"]
                    .as_str()
                    .filter(|ip| !ip.is_empty() && *ip != "None")
                    .map(str::to_string);
                let namespace = id.namespace.clone().unwrap_or_default();
                derived.insert((namespace, id.name.clone()), (ip, o.metadata.uid.clone()));
            }
            let print = o
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(APPLIED_ANNOTATION))
                .cloned();
            if let Some(print) = print {
                let status = o.data.get("status").cloned().unwrap_or(Value::Null);
                learned
                    .objects
                    .insert(id, (print, o.metadata.resource_version, status));
            }
        }
    }
    for export in applier
        .list_objects(MCS_API_VERSION, "ServiceExport", "")
        .await?
    {
        let (Some(ns), Some(name)) = (&export.metadata.namespace, &export.metadata.name) else {
            continue;
        };
        let mut conditions = export.data["status"]["conditions"].clone();
        for c in conditions.as_array_mut().into_iter().flatten() {
            if let Some(c) = c.as_object_mut() {
                c.remove("lastTransitionTime");
            }
        }
        let id = export_id(&ObjectKey::new(ns.as_str(), name.as_str()));
        learned
            .exports
            .insert(id, (conditions, export.metadata.resource_version));
    }
    Ok(learned)
}

/// The resourceVersion of `d` as the member holds it, when an earlier term applied this very
/// body (and, for a ServiceImport, its status) and nobody changed it since: nothing to write.
fn already_applied(learned: &Learned, d: &Desired) -> Option<Option<String>> {
    let (print, version, status) = learned.objects.get(&d.id)?;
    let same_status = d.kind != WrittenKind::ServiceImport || *status == d.body["status"];
    (*print == apply::fingerprint(&d.body).to_string() && same_status).then(|| version.clone())
}

/// A ServiceExport's status as written, but for `lastTransitionTime`: what the fingerprint is
/// taken of, so that only a change of the conditions themselves is written again.
fn export_status(c: &ExportConditions) -> Value {
    let condition = |type_: &str, (status, reason, message): &(bool, String, String)| {
        json!({
            "type": type_,
            "status": if *status { "True" } else { "False" },
            "reason": reason,
            "message": message,
        })
    };
    json!({
        "apiVersion": MCS_API_VERSION,
        "kind": "ServiceExport",
        "status": { "conditions": [condition("Valid", &c.valid), condition("Conflict", &c.conflict)] },
    })
}

fn stamp_transitions(status: &Value, now: &str) -> Value {
    let mut stamped = status.clone();
    if let Some(conditions) = stamped["status"]["conditions"].as_array_mut() {
        for c in conditions {
            c["lastTransitionTime"] = json!(now);
        }
    }
    stamped
}

#[cfg(test)]
mod tests;
