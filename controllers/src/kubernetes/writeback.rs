//! MCS write-back into the members, by the leader only (mcs-api v1alpha1):
//!
//! - ServiceExport conditions `Valid` and `Conflict` (DESIGN §2);
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
//! Desired objects are computed by pure functions; writes are server-side apply, skipped when
//! the object is unchanged since the last write.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, Resource};
use meridian_core::{ClusterId, ObjectKey, Port, Protocol, Snapshot, select};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::leader::Leadership;
use super::{Fleet, MANAGED_BY};
use crate::crd::{ServiceExportObject, ServiceImport};

pub const FIELD_MANAGER: &str = "meridian";
pub const MCS_SERVICE_NAME: &str = "multicluster.kubernetes.io/service-name";
pub const SOURCE_CLUSTER: &str = "multicluster.kubernetes.io/source-cluster";
pub const SLICE_MANAGED_BY: (&str, &str) =
    ("endpointslice.kubernetes.io/managed-by", "meridian.io");
const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=meridian";
/// Endpoints per derived EndpointSlice, as Kubernetes' own EndpointSlice controller fills them.
const ENDPOINTS_PER_SLICE: usize = 100;
/// Everything is applied again (and strays deleted) this often, to repair drift.
const RESYNC: Duration = Duration::from_secs(60);
/// Changes arriving within this window are written together.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// The name of the derived Service of `service`: a DNS label of at most 63 characters.
pub fn derived_name(service: &str) -> String {
    bounded_name(&format!("derived-{service}"), service)
}

/// `name` if it fits in 63 characters, else a prefix and a hash of `seed`.
fn bounded_name(name: &str, seed: &str) -> String {
    if name.len() <= 63 {
        return name.to_string();
    }
    let hash = format!("{:016x}", fingerprint(&seed));
    let prefix = name[..63 - 17].trim_end_matches('-');
    format!("{prefix}-{hash}")
}

fn fingerprint<T: Hash + ?Sized>(v: &T) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

/// One object meridian wants in a member.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    pub kind: WrittenKind,
    pub namespace: String,
    pub name: String,
    /// The object, as server-side apply takes it.
    pub body: Value,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WrittenKind {
    /// Derived Services first: their ClusterIPs go into the ServiceImports and their UIDs into
    /// the slices' owner references.
    Service,
    ServiceImport,
    EndpointSlice,
}

/// A member's ServiceExport condition pair.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportConditions {
    pub key: ObjectKey,
    pub valid: (bool, String, String),
    pub conflict: (bool, String, String),
}

fn labels(service: &str) -> Value {
    json!({ MANAGED_BY.0: MANAGED_BY.1, MCS_SERVICE_NAME: service })
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
        let ns = view.key.namespace.to_string();
        if !namespaces.contains(&ns) {
            continue;
        }
        let name = view.key.name.to_string();
        let clusters: Vec<Value> = view
            .backends
            .iter()
            .filter_map(|b| snapshot.clusters.get(b.cluster))
            .map(|c| json!({ "cluster": c.spec.id.as_str() }))
            .collect();
        let ports: Vec<Value> = view.ports.iter().map(port_json).collect();
        out.push(Desired {
            kind: WrittenKind::ServiceImport,
            namespace: ns.clone(),
            name: name.clone(),
            body: json!({
                "apiVersion": "multicluster.x-k8s.io/v1alpha1",
                "kind": "ServiceImport",
                "metadata": { "name": name, "namespace": ns, "labels": labels(&name) },
                "spec": {
                    "type": if view.headless { "Headless" } else { "ClusterSetIP" },
                    "ports": ports,
                },
                "status": { "clusters": clusters },
            }),
        });
        if view.headless {
            continue;
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
        out.push(Desired {
            kind: WrittenKind::Service,
            namespace: ns.clone(),
            name: derived.clone(),
            body: json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": { "name": derived, "namespace": ns, "labels": labels(&name) },
                "spec": { "type": "ClusterIP", "ports": service_ports },
            }),
        });
        out.extend(derived_slices(snapshot, view, member, &derived, now));
    }
    out
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
                    fingerprint(&seed) as u32
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
            Desired {
                kind: WrittenKind::EndpointSlice,
                namespace: ns.clone(),
                name: name.clone(),
                body: json!({
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSlice",
                    "metadata": {
                        "name": name,
                        "namespace": ns,
                        "labels": {
                            MANAGED_BY.0: MANAGED_BY.1,
                            SLICE_MANAGED_BY.0: SLICE_MANAGED_BY.1,
                            "kubernetes.io/service-name": derived,
                            MCS_SERVICE_NAME: view.key.name.as_ref(),
                            SOURCE_CLUSTER: cluster,
                        },
                    },
                    "addressType": if v6 { "IPv6" } else { "IPv4" },
                    "endpoints": endpoints,
                    "ports": ports,
                }),
            }
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

/// What the leader last wrote into one member: object → fingerprint of its body.
#[derive(Default)]
struct MemberWrites {
    objects: BTreeMap<(WrittenKind, String, String), u64>,
    exports: BTreeMap<ObjectKey, u64>,
    /// ClusterIPs of derived Services, by (namespace, derived name), and their UIDs.
    derived: BTreeMap<(String, String), (Option<String>, Option<String>)>,
    resynced: Option<Instant>,
}

/// Writes into every Kubernetes member while this replica leads.
pub async fn run(
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    fleet: Fleet,
    leadership: Leadership,
) {
    let mut writes: BTreeMap<ClusterId, MemberWrites> = BTreeMap::new();
    let mut facts_changed = fleet.subscribe();
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            r = snapshots.changed() => if r.is_err() { return },
            _ = facts_changed.changed() => {}
            _ = tick.tick() => {}
        }
        tokio::time::sleep(DEBOUNCE).await;
        if !leadership.is_leader() {
            // A new term starts with a full resync.
            writes.clear();
            continue;
        }
        let snapshot = snapshots.borrow_and_update().clone();
        let facts = fleet.all();
        writes.retain(|id, _| facts.contains_key(id));
        for (id, f) in &facts {
            if f.retired {
                retire(f.client.as_ref(), id, &fleet, &leadership).await;
                writes.remove(id);
                continue;
            }
            let (Some(client), true) = (&f.client, f.listed) else {
                continue;
            };
            let Some(member) = snapshot.cluster_index(id.as_str()) else {
                continue;
            };
            let state = writes.entry(id.clone()).or_default();
            let desired = desired_objects(&snapshot, member, &f.namespaces, Instant::now());
            let conditions = export_conditions(&snapshot, member, &f.exports);
            if let Err(e) =
                reconcile_member(client, id, desired, conditions, state, &leadership).await
            {
                warn!(cluster = %id, error = %e, "write-back incomplete; retrying");
                state.resynced = None;
            }
        }
    }
}

/// A member left the hub: delete everything meridian wrote there, then forget it.
async fn retire(
    client: Option<&Client>,
    cluster: &ClusterId,
    fleet: &Fleet,
    leadership: &Leadership,
) {
    if let Some(client) = client
        && leadership.is_leader()
    {
        let cleaned = async {
            for (kind, ns, name) in list_managed(client).await?.into_iter().rev() {
                if !leadership.is_leader() {
                    break;
                }
                delete(client, kind, &ns, &name).await?;
            }
            Ok::<_, kube::Error>(())
        }
        .await;
        match cleaned {
            Ok(()) => {
                info!(cluster = %cluster, "member removed: deleted what meridian wrote there")
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
    client: &Client,
    cluster: &ClusterId,
    mut desired: Vec<Desired>,
    conditions: Vec<ExportConditions>,
    state: &mut MemberWrites,
    leadership: &Leadership,
) -> Result<(), kube::Error> {
    let resync = state.resynced.is_none_or(|t| t.elapsed() >= RESYNC);
    if resync {
        state.objects.clear();
        state.exports.clear();
    }
    desired.sort_by_key(|d| d.kind);
    let wanted: BTreeSet<(WrittenKind, String, String)> = desired
        .iter()
        .map(|d| (d.kind, d.namespace.clone(), d.name.clone()))
        .collect();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    // One object the API refuses must not hold up the others: the first error is returned
    // after the pass (and the next pass tries again).
    let mut first_error = None;
    for mut d in desired {
        if d.kind == WrittenKind::ServiceImport || d.kind == WrittenKind::EndpointSlice {
            fill_from_derived(&mut d, state);
        }
        let id = (d.kind, d.namespace.clone(), d.name.clone());
        let print = fingerprint(&d.body.to_string());
        if state.objects.get(&id) == Some(&print) {
            continue;
        }
        if !leadership.is_leader() {
            return Ok(());
        }
        match apply(client, &d, &params, state, leadership).await {
            Ok(true) => {
                debug!(cluster = %cluster, kind = ?d.kind, object = %format!("{}/{}", d.namespace, d.name), "written");
                state.objects.insert(id, print);
            }
            Ok(false) => return Ok(()),
            Err(e) => {
                warn!(cluster = %cluster, kind = ?d.kind, object = %format!("{}/{}", d.namespace, d.name), error = %e, "cannot write");
                first_error.get_or_insert(e);
            }
        }
    }
    // Strays: what was written before and is no longer wanted; on a resync, whatever carries
    // our label in the member.
    let mut strays: Vec<(WrittenKind, String, String)> = state
        .objects
        .keys()
        .filter(|k| !wanted.contains(k))
        .cloned()
        .collect();
    if resync {
        strays.extend(
            list_managed(client)
                .await?
                .into_iter()
                .filter(|k| !wanted.contains(k)),
        );
    }
    strays.sort();
    strays.dedup();
    for (kind, ns, name) in strays.into_iter().rev() {
        if !leadership.is_leader() {
            return Ok(());
        }
        delete(client, kind, &ns, &name).await?;
        info!(cluster = %cluster, kind = ?kind, object = %format!("{ns}/{name}"), "deleted what is no longer wanted");
        state.objects.remove(&(kind, ns.clone(), name.clone()));
        if kind == WrittenKind::Service {
            state.derived.remove(&(ns, name));
        }
    }
    for c in conditions {
        let print = fingerprint(&format!("{c:?}"));
        if state.exports.get(&c.key) == Some(&print) {
            continue;
        }
        if !leadership.is_leader() {
            return Ok(());
        }
        write_export_conditions(client, &c).await?;
        state.exports.insert(c.key.clone(), print);
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    if resync {
        state.resynced = Some(Instant::now());
    }
    Ok(())
}

/// A ServiceImport gets its derived Service's ClusterIP as `spec.ips`; a slice gets the
/// derived Service as its owner.
fn fill_from_derived(d: &mut Desired, state: &MemberWrites) {
    let derived = match d.kind {
        WrittenKind::ServiceImport => derived_name(&d.name),
        _ => d.body["metadata"]["labels"]["kubernetes.io/service-name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    };
    let Some((ip, uid)) = state.derived.get(&(d.namespace.clone(), derived.clone())) else {
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
                    "apiVersion": "v1", "kind": "Service", "name": derived, "uid": uid,
                }]);
            }
        }
    }
}

/// Writes one object; `Ok(false)` when leadership lapsed between its requests.
async fn apply(
    client: &Client,
    d: &Desired,
    params: &PatchParams,
    state: &mut MemberWrites,
    leadership: &Leadership,
) -> Result<bool, kube::Error> {
    match d.kind {
        WrittenKind::Service => {
            let api = Api::<Service>::namespaced(client.clone(), &d.namespace);
            let svc = api.patch(&d.name, params, &Patch::Apply(&d.body)).await?;
            let ip = svc
                .spec
                .and_then(|s| s.cluster_ip)
                .filter(|ip| !ip.is_empty() && ip != "None");
            state.derived.insert(
                (d.namespace.clone(), d.name.clone()),
                (ip, svc.metadata.uid),
            );
        }
        WrittenKind::ServiceImport => {
            let api = Api::<ServiceImport>::namespaced(client.clone(), &d.namespace);
            api.patch(&d.name, params, &Patch::Apply(&d.body)).await?;
            // Each request is a write of its own: a leader frozen during the first one must
            // not send the second after it wakes up past its renew deadline.
            if !leadership.is_leader() {
                return Ok(false);
            }
            let status = json!({
                "apiVersion": "multicluster.x-k8s.io/v1alpha1",
                "kind": "ServiceImport",
                "status": d.body["status"],
            });
            api.patch_status(&d.name, params, &Patch::Apply(&status))
                .await?;
        }
        WrittenKind::EndpointSlice => {
            let api = Api::<EndpointSlice>::namespaced(client.clone(), &d.namespace);
            api.patch(&d.name, params, &Patch::Apply(&d.body)).await?;
        }
    }
    Ok(true)
}

async fn delete(
    client: &Client,
    kind: WrittenKind,
    ns: &str,
    name: &str,
) -> Result<(), kube::Error> {
    let result = match kind {
        WrittenKind::Service => delete_one::<Service>(client, ns, name).await,
        WrittenKind::ServiceImport => delete_one::<ServiceImport>(client, ns, name).await,
        WrittenKind::EndpointSlice => delete_one::<EndpointSlice>(client, ns, name).await,
    };
    match result {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        other => other,
    }
}

async fn delete_one<K>(client: &Client, ns: &str, name: &str) -> Result<(), kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    Api::<K>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default())
        .await
        .map(|_| ())
}

/// Everything in the member that carries meridian's label.
async fn list_managed(client: &Client) -> Result<Vec<(WrittenKind, String, String)>, kube::Error> {
    let mut out = managed::<Service>(client, WrittenKind::Service).await?;
    out.extend(managed::<ServiceImport>(client, WrittenKind::ServiceImport).await?);
    out.extend(managed::<EndpointSlice>(client, WrittenKind::EndpointSlice).await?);
    Ok(out)
}

/// The objects of one kind that carry meridian's label (their metadata only).
async fn managed<K>(
    client: &Client,
    kind: WrittenKind,
) -> Result<Vec<(WrittenKind, String, String)>, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let lp = ListParams::default().labels(MANAGED_SELECTOR);
    let list = Api::<K>::all(client.clone()).list_metadata(&lp).await?;
    Ok(list
        .into_iter()
        .map(|o| {
            let meta = o.metadata;
            (
                kind,
                meta.namespace.unwrap_or_default(),
                meta.name.unwrap_or_default(),
            )
        })
        .collect())
}

async fn write_export_conditions(client: &Client, c: &ExportConditions) -> Result<(), kube::Error> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let condition = |type_: &str, (status, reason, message): &(bool, String, String)| {
        json!({
            "type": type_,
            "status": if *status { "True" } else { "False" },
            "reason": reason,
            "message": message,
            "lastTransitionTime": now,
        })
    };
    let patch = json!({
        "apiVersion": "multicluster.x-k8s.io/v1alpha1",
        "kind": "ServiceExport",
        "status": { "conditions": [condition("Valid", &c.valid), condition("Conflict", &c.conflict)] },
    });
    let api = Api::<ServiceExportObject>::namespaced(client.clone(), &c.key.namespace);
    match api
        .patch_status(
            &c.key.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        other => other.map(|_| ()),
    }
}

#[cfg(test)]
mod tests;
