//! Immutable, versioned views of the fleet. `Snapshot::rebuild` merges the Index and the
//! Registry once per change, again only for the services that changed (`Snapshot::build` merges
//! everything from scratch); DNS and xDS only ever read a Snapshot (the wiring publishes it on
//! a `tokio::sync::watch`, so this crate stays free of tokio).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::geo::{ClientPlace, GeoTable};
use crate::index::{Dirty, Index, IndexSizes, NamedSlice};
use crate::model::{ClusterId, ObjectKey, Port, Slice};
use crate::placement::{Capacity, ClusterInput, OverridePolicy, Placements, Template};
use crate::policy::{Policies, TrafficPolicy};
use crate::prefix::PrefixTable;
use crate::problem::{ObjectRef, Origin, Problem};
use crate::registry::{Health, Registry};

mod stamp;
pub mod view;
use stamp::{Remerged, service_deadline};
pub use view::{Backend, ClusterView, Conflict, ServiceView, Stamp};

/// One namespace's services by name (shared between snapshots until one of them changes).
pub(crate) type ByName = Arc<BTreeMap<Arc<str>, Arc<ServiceView>>>;

/// Which cluster a client address belongs to: longest-prefix match over every cluster's
/// `dnsClientCIDRs` and `podCIDRs`; a tie between clusters at the longest prefix means unknown
/// (an ambiguous entry), unless a geo range holds the address (`crate::geo::locate`).
pub type ClientTable = PrefixTable<usize>;

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    pub version: u64,
    /// The version that last added or removed a service (what negative answers depend on);
    /// the version itself until the snapshot is restamped.
    pub names_version: u64,
    /// Restamped against the snapshot published before it (`stamp.rs`): its services' stamps
    /// say how long answers hold. Otherwise answers hold for this version only.
    pub stamped: bool,
    #[serde(skip)]
    stamped_at: Option<Instant>,
    /// The views this build merged anew, for `restamp`.
    #[serde(skip)]
    remerged: Remerged,
    /// After `restamp`: the version of the snapshot it was restamped against and the services
    /// whose views differ from that one's (none when every view may differ).
    #[serde(skip)]
    changed: Option<(u64, Arc<[ObjectKey]>)>,
    /// Every member has synced or failed once; before that DNS answers SERVFAIL.
    pub synced: bool,
    pub clusters: Vec<ClusterView>,
    #[serde(skip)]
    pub(crate) cluster_ids: HashMap<ClusterId, usize>,
    /// namespace → name → service. Nested so that lookups by `&str` need no allocation.
    #[serde(skip)]
    /// Each namespace's map is shared with the previous snapshot until a service of it changes,
    /// so a rebuild copies (and later frees) one entry per namespace, not one per service.
    pub(crate) services: HashMap<Arc<str>, ByName>,
    #[serde(skip)]
    pub client_table: ClientTable,
    /// Geo ranges for DNS clients outside the fleet: the fleet's one table, shared (never
    /// copied) by every snapshot until the ranges change.
    #[serde(skip)]
    pub geo: Arc<GeoTable>,
    /// The hub's Tenants, for the gateway and the namespaces kept for them (shared likewise).
    #[serde(skip)]
    pub tenants: Arc<crate::tenant::Tenants>,
    /// What the hub's routes decide (shared likewise, until they or their services change).
    #[serde(skip)]
    pub routes: Arc<crate::route::RouteTable>,
    pub problems: Vec<Problem>,
    /// Input served with a caveat (e.g. unknown fields ignored in a Kubernetes kind).
    pub warnings: Vec<Problem>,
    /// Object counts of the Index this snapshot was built from (reported at scrape time).
    pub sizes: IndexSizes,
    /// Where every placed template runs (shared with the previous snapshot until placement
    /// decides again).
    #[serde(skip)]
    pub placements: Arc<Placements>,
    /// The templates and OverridePolicies placement decided from (what is rendered).
    #[serde(skip)]
    pub templates: Arc<[Template]>,
    #[serde(skip)]
    pub overrides: Arc<[OverridePolicy]>,
    /// Per policy that places workloads (`namespace/name`), the clusters (indices into
    /// `clusters`, sorted) they are placed in: its Services' traffic goes there first.
    #[serde(skip)]
    pub workloads: Arc<HashMap<String, Vec<usize>>>,
    /// The policies the services were merged with and placement decided by (shared with the
    /// fleet until they change): a what-if decides again from them.
    #[serde(skip)]
    pub policies: Arc<Policies>,
    /// Every member's capacity as placement last read it.
    #[serde(skip)]
    pub capacities: Arc<BTreeMap<ClusterId, Capacity>>,
    /// Problems found while merging, by service, so a rebuild replaces only its services'.
    #[serde(skip)]
    export_problems: BTreeMap<ObjectKey, Vec<Problem>>,
    /// The services whose governing policy depends on time (failback, withdraw windows): the
    /// only ones with deadlines, kept from build to build so finding the next deadline reads
    /// these and not every service.
    #[serde(skip)]
    timed: Arc<BTreeSet<ObjectKey>>,
}

impl Snapshot {
    /// An empty, unsynced snapshot: what DNS sees before the first sync.
    pub fn empty() -> Self {
        Self::default()
    }

    /// A snapshot built from scratch.
    pub fn build(version: u64, index: &Index, registry: &Registry, policies: &Policies) -> Self {
        Self::build_after(None, version, index, registry, policies, Instant::now())
    }

    /// The next snapshot after `prev`, re-merging only the services in `dirty` (what the Index
    /// saw change since `prev` was built) and sharing every other service with `prev`. Falls
    /// back to a full build when the set of clusters changed, since services refer to clusters
    /// by position, or when `dirty.all` (e.g. the policies changed). `now` dates the changes
    /// (failback counts from it).
    pub fn rebuild(
        prev: &Snapshot,
        dirty: &Dirty,
        version: u64,
        index: &Index,
        registry: &Registry,
        policies: &Policies,
        now: Instant,
    ) -> Self {
        let mut snapshot = Self::clusters_only(version, index, registry);
        if dirty.all || !snapshot.same_clusters_as(prev) {
            return Self::build_after(Some(prev), version, index, registry, policies, now);
        }
        snapshot.services = prev.services.clone();
        snapshot.export_problems = prev.export_problems.clone();
        for key in &dirty.services {
            snapshot.export_problems.remove(key);
            if let Some(by_name) = snapshot.services.get_mut(&key.namespace) {
                if by_name.contains_key(&key.name) {
                    Arc::make_mut(by_name).remove(&key.name);
                }
                if by_name.is_empty() {
                    snapshot.services.remove(&key.namespace);
                }
            }
        }
        let ctx = MergeContext {
            policies,
            prev: Some(prev),
            now,
        };
        let merged = merge_services(
            &snapshot.cluster_ids,
            index,
            &ctx,
            &mut snapshot.export_problems,
            Some(&dirty.services),
        );
        snapshot.timed = timed_after(&prev.timed, &dirty.services, &merged);
        snapshot.insert_services(merged);
        snapshot.remerged = Remerged::Services(dirty.services.iter().cloned().collect());
        snapshot.collect_problems();
        snapshot.policies = shared_policies(Some(prev), policies);
        snapshot
    }

    fn build_after(
        prev: Option<&Snapshot>,
        version: u64,
        index: &Index,
        registry: &Registry,
        policies: &Policies,
        now: Instant,
    ) -> Self {
        let mut snapshot = Self::clusters_only(version, index, registry);
        let ctx = MergeContext {
            policies,
            prev,
            now,
        };
        let merged = merge_services(
            &snapshot.cluster_ids,
            index,
            &ctx,
            &mut snapshot.export_problems,
            None,
        );
        snapshot.timed = Arc::new(timed_keys(&merged).cloned().collect());
        snapshot.insert_services(merged);
        snapshot.collect_problems();
        snapshot.policies = shared_policies(prev, policies);
        snapshot
    }

    /// The services whose views differ from those of snapshot `version`, if this one was
    /// restamped against it and not every view changed: a consumer holding what it built from
    /// `version` renews those (and the timed ones, `timed_keys`) instead of comparing every view.
    pub fn changed_since(&self, version: u64) -> Option<&[ObjectKey]> {
        self.changed
            .as_ref()
            .filter(|(since, _)| *since == version)
            .map(|(_, keys)| &**keys)
    }

    /// The services whose policy depends on time: their decisions change with no event.
    pub fn timed_keys(&self) -> impl Iterator<Item = &ObjectKey> {
        self.timed.iter()
    }

    /// The next time a decision changes with no event: a failback window or a policy's
    /// withdraw time ending. The store republishes then, so cached answers follow.
    pub fn next_deadline(&self, now: Instant) -> Option<Instant> {
        self.timed_services()
            .filter_map(|service| service_deadline(&self.clusters, service, now))
            .min()
    }

    /// Clusters, client table and sizes; no services yet.
    fn clusters_only(version: u64, index: &Index, registry: &Registry) -> Self {
        let mut snapshot = Snapshot {
            version,
            names_version: version,
            synced: registry.all_settled(),
            sizes: index.sizes(),
            ..Snapshot::default()
        };
        let clusters = registry
            .members()
            .map(|(spec, health)| ClusterView {
                spec: spec.clone(),
                health: health.health,
                withdrawn: health.withdrawn,
                unreachable_since: (health.health == Health::Unreachable).then_some(health.since),
                recovered_at: health.recovered_at,
                reason: health.shown_reason(),
                endpoints: index.endpoints_of(&spec.id),
            })
            .collect();
        snapshot.set_clusters(clusters);
        snapshot
    }

    /// Replaces the clusters (and what is looked up from them: ids, client table).
    pub(crate) fn set_clusters(&mut self, clusters: Vec<ClusterView>) {
        self.cluster_ids.clear();
        self.client_table = ClientTable::default();
        for (idx, view) in clusters.iter().enumerate() {
            self.cluster_ids.insert(view.spec.id.clone(), idx);
            for net in view
                .spec
                .dns_client_cidrs
                .iter()
                .chain(&view.spec.pod_cidrs)
            {
                self.client_table.insert(*net, idx);
            }
        }
        self.clusters = clusters;
    }

    /// Adds a view (or replaces the one of its service, under the same policy).
    pub(crate) fn insert_service(&mut self, view: Arc<ServiceView>) {
        if view.policy.depends_on_time() && !self.timed.contains(&view.key) {
            Arc::make_mut(&mut self.timed).insert(view.key.clone());
        }
        let by_name = self.services.entry(view.key.namespace.clone()).or_default();
        Arc::make_mut(by_name).insert(view.key.name.clone(), view);
    }

    fn insert_services(&mut self, merged: Vec<ServiceView>) {
        for view in merged {
            let by_name = self.services.entry(view.key.namespace.clone()).or_default();
            Arc::make_mut(by_name).insert(view.key.name.clone(), Arc::new(view));
        }
    }

    fn collect_problems(&mut self) {
        self.problems = self.export_problems.values().flatten().cloned().collect();
    }

    /// The same clusters at the same indices as `other` (so indices carry over).
    /// Every cluster as placement sees it: its view and the capacity this snapshot carries.
    pub fn cluster_inputs(&self) -> Vec<ClusterInput<'_>> {
        self.clusters
            .iter()
            .map(|view| ClusterInput {
                view,
                capacity: self.capacities.get(&view.spec.id),
            })
            .collect()
    }

    pub fn same_clusters_as(&self, other: &Snapshot) -> bool {
        self.clusters.len() == other.clusters.len()
            && self
                .clusters
                .iter()
                .zip(&other.clusters)
                .all(|(a, b)| a.spec.id == b.spec.id)
    }

    pub fn cluster_index(&self, id: &str) -> Option<usize> {
        self.clusters.iter().position(|c| c.spec.id.as_str() == id)
    }

    /// The clusters where the policy behind `policy` places workloads, when it places any.
    pub fn workloads_of(&self, policy: &TrafficPolicy) -> Option<&[usize]> {
        if self.workloads.is_empty() {
            return None;
        }
        self.workloads
            .get(policy.source.as_deref()?)
            .map(Vec::as_slice)
    }

    pub fn cluster_by_id(&self, id: &ClusterId) -> Option<usize> {
        self.cluster_ids.get(id).copied()
    }

    /// The view of cluster `id`, if the fleet has it.
    pub fn cluster_view(&self, id: &ClusterId) -> Option<&ClusterView> {
        self.clusters.get(self.cluster_by_id(id)?)
    }

    pub fn service(&self, namespace: &str, name: &str) -> Option<&Arc<ServiceView>> {
        self.services.get(namespace)?.get(name)
    }

    /// Whether any exported service lives in this namespace (an empty non-terminal in DNS).
    pub fn has_namespace(&self, namespace: &str) -> bool {
        self.services.contains_key(namespace)
    }

    pub fn has_services(&self) -> bool {
        !self.services.is_empty()
    }

    /// Every exported service, ordered by namespace and name.
    pub fn services(&self) -> impl Iterator<Item = &Arc<ServiceView>> {
        let mut namespaces: Vec<_> = self.services.iter().collect();
        namespaces.sort_by(|a, b| a.0.cmp(b.0));
        namespaces
            .into_iter()
            .flat_map(|(_, by_name)| by_name.values())
    }

    pub fn service_count(&self) -> usize {
        self.services.values().map(|by_name| by_name.len()).sum()
    }

    /// The client's cluster from its address.
    pub fn client_cluster(&self, ip: IpAddr) -> Option<usize> {
        self.client_table.lookup(ip)
    }

    /// Where a DNS client is, by address: a cluster, a geo locality, or unknown (the rule is
    /// `crate::geo::locate`'s).
    pub fn locate(&self, ip: IpAddr) -> Option<ClientPlace> {
        crate::geo::locate(&self.client_table, &self.geo, ip)
    }
}

/// The keys of the views whose policy depends on time.
fn timed_keys(views: &[ServiceView]) -> impl Iterator<Item = &ObjectKey> {
    views
        .iter()
        .filter(|view| view.policy.depends_on_time())
        .map(|view| &view.key)
}

/// `prev`'s timed services after re-merging `dirty` into `merged` (shared when unchanged).
fn timed_after(
    prev: &Arc<BTreeSet<ObjectKey>>,
    dirty: &HashSet<ObjectKey>,
    merged: &[ServiceView],
) -> Arc<BTreeSet<ObjectKey>> {
    let now_timed: BTreeSet<&ObjectKey> = timed_keys(merged).collect();
    let unchanged = dirty
        .iter()
        .all(|key| prev.contains(key) == now_timed.contains(key));
    if unchanged {
        return Arc::clone(prev);
    }
    let mut timed = BTreeSet::clone(prev);
    for key in dirty {
        timed.remove(key);
    }
    timed.extend(now_timed.into_iter().cloned());
    Arc::new(timed)
}

/// One cluster's candidate export of a service, before conflicts are resolved.
struct Candidate<'a> {
    cluster: usize,
    id: &'a ClusterId,
    export: &'a crate::model::Export,
    created: i64,
    service: &'a crate::model::Service,
    slices: Vec<NamedSlice<'a>>,
}

/// `policies`, shared with `prev` when they are the same (they rarely change).
fn shared_policies(prev: Option<&Snapshot>, policies: &Policies) -> Arc<Policies> {
    match prev {
        Some(p) if p.policies.same_as(policies) => Arc::clone(&p.policies),
        _ => Arc::new(policies.clone()),
    }
}

/// What merging needs besides the Index: the policies, and the previous snapshot with the
/// time of this one (to date recoveries).
struct MergeContext<'a> {
    policies: &'a Policies,
    prev: Option<&'a Snapshot>,
    now: Instant,
}

/// Merges every service's exports across clusters, or only those in `only`: then each cluster
/// is asked for those services' objects by key, so the cost follows what changed, not the fleet.
fn merge_services(
    cluster_ids: &HashMap<ClusterId, usize>,
    index: &Index,
    ctx: &MergeContext<'_>,
    problems: &mut BTreeMap<ObjectKey, Vec<Problem>>,
    only: Option<&HashSet<ObjectKey>>,
) -> Vec<ServiceView> {
    let mut candidates: BTreeMap<&ObjectKey, Vec<Candidate<'_>>> = BTreeMap::new();
    let mut imports: HashMap<&ObjectKey, Vec<(usize, Vec<IpAddr>)>> = HashMap::new();
    for (id, state) in &index.clusters {
        // Objects of a cluster that left the hub are not served.
        let Some(&cluster) = cluster_ids.get(id) else {
            continue;
        };
        for (key, import) in wanted_of(&state.imports, only) {
            if !import.headless && !import.ips.is_empty() {
                imports
                    .entry(key)
                    .or_default()
                    .push((cluster, import.ips.clone()));
            }
        }
        for (key, export) in wanted_of(&state.exports, only) {
            let Some(service) = state.services.get(key) else {
                // MCS: an export without its Service is not served (no Valid condition yet).
                continue;
            };
            if service.external_name {
                problems
                    .entry(key.clone())
                    .or_default()
                    .push(Problem::in_merge(
                        Origin::Member(id.clone()),
                        ObjectRef::namespaced("ServiceExport", key),
                        "an ExternalName service cannot be exported",
                    ));
                continue;
            }
            candidates.entry(key).or_default().push(Candidate {
                cluster,
                id,
                export,
                created: export.created,
                service,
                slices: state.slices_of(key).collect(),
            });
        }
    }
    candidates
        .into_iter()
        .map(|(key, mut cands)| {
            cands.sort_by(|a, b| (a.created, a.id).cmp(&(b.created, b.id)));
            let mut imports = imports.remove(key).unwrap_or_default();
            imports.sort_by_key(|(c, _)| *c);
            merge_one(key, &cands, imports, ctx, problems)
        })
        .collect()
}

/// The entries of `map` to merge: all of them, or those of the services in `only` (looked up,
/// not scanned for).
fn wanted_of<'a, V>(
    map: &'a HashMap<ObjectKey, V>,
    only: Option<&'a HashSet<ObjectKey>>,
) -> Box<dyn Iterator<Item = (&'a ObjectKey, &'a V)> + 'a> {
    match only {
        None => Box::new(map.iter()),
        Some(keys) => Box::new(keys.iter().filter_map(|key| map.get_key_value(key))),
    }
}

fn merge_one(
    key: &ObjectKey,
    cands: &[Candidate<'_>],
    imports: Vec<(usize, Vec<IpAddr>)>,
    ctx: &MergeContext<'_>,
    problems: &mut BTreeMap<ObjectKey, Vec<Problem>>,
) -> ServiceView {
    let oldest = cands[0].service;
    let governing = ctx.policies.governing(key, &cands[0].export.labels);
    for loser in &governing.losers {
        problems
            .entry(key.clone())
            .or_default()
            .push(Problem::in_merge(
                Origin::Hub,
                ObjectRef::namespaced("ClusterSchedulingPolicy", &loser.key),
                format!(
                    "Conflict: it selects service {key}, which the older policy {} governs",
                    governing.traffic.source.as_deref().unwrap_or("?")
                ),
            ));
    }
    let prev_view = ctx
        .prev
        .and_then(|p| Some((p, p.service(&key.namespace, &key.name)?)));
    let mut conflicts = Vec::new();
    let mut backends = Vec::new();
    for cand in cands {
        if cand.service.headless != oldest.headless {
            conflicts.push(Conflict {
                cluster: cand.id.clone(),
                reason: format!(
                    "headless={} disagrees with the oldest export (headless={})",
                    cand.service.headless, oldest.headless
                ),
                excluded: true,
            });
            continue;
        }
        let ports: Vec<Port> = cand
            .service
            .ports
            .iter()
            .filter(|p| oldest.ports.contains(p))
            .cloned()
            .collect();
        if ports.len() != cand.service.ports.len() || ports.len() != oldest.ports.len() {
            conflicts.push(Conflict {
                cluster: cand.id.clone(),
                reason:
                    "port definitions disagree with the oldest export; serving the ports that agree"
                        .into(),
                excluded: false,
            });
        }
        let slices = union_of(&cand.slices);
        let ready = slices
            .iter()
            .flat_map(|s| s.endpoints.iter())
            .filter(|e| e.is_answerable(cand.service.publish_not_ready))
            .count() as u32;
        let before = prev_view.and_then(|(p, v)| {
            v.backends.iter().find(|b| {
                p.clusters
                    .get(b.cluster)
                    .is_some_and(|c| &c.spec.id == cand.id)
            })
        });
        let recovered_at = match before {
            Some(b) if b.ready == 0 && ready > 0 => Some(ctx.now),
            Some(b) if ready > 0 => b.recovered_at,
            _ => None,
        };
        backends.push(Backend {
            cluster: cand.cluster,
            slices,
            ready,
            publish_not_ready: cand.service.publish_not_ready,
            ports,
            recovered_at,
        });
    }
    backends.sort_by_key(|b| b.cluster);
    ServiceView {
        key: key.clone(),
        headless: oldest.headless,
        ports: oldest.ports.clone(),
        shared_addresses: shared_addresses(&backends),
        backends,
        imports,
        conflicts,
        policy: governing.traffic.clone(),
        labels: cands[0].export.labels.clone(),
        stamp: Arc::default(),
    }
}

/// The addresses reported by more than one of `backends`, sorted (each backend's own slices
/// hold every address once already: `union_of`).
fn shared_addresses(backends: &[Backend]) -> Vec<IpAddr> {
    if backends.len() < 2 {
        return Vec::new();
    }
    let mut first_seen: HashMap<IpAddr, usize> = HashMap::new();
    let mut shared = Vec::new();
    for backend in backends {
        for address in backend.endpoints().flat_map(|e| e.addresses.iter()) {
            let first = *first_seen.entry(*address).or_insert(backend.cluster);
            if first != backend.cluster {
                shared.push(*address);
            }
        }
    }
    shared.sort_unstable();
    shared.dedup();
    shared
}

/// A service's slices in one cluster, in name order, without duplicate addresses (a pod can
/// appear in two slices while the slice controller moves it). The common case — no address in
/// two slices — shares the Index's slices; only a cluster with duplicates gets a merged copy.
fn union_of(slices: &[NamedSlice<'_>]) -> Vec<Arc<Slice>> {
    let mut slices = slices.to_vec();
    slices.sort_by(|a, b| a.0.cmp(b.0));
    let shared = || slices.iter().map(|(_, s)| Arc::clone(s)).collect();
    if slices.len() < 2 {
        return shared();
    }
    let mut seen = HashSet::new();
    let mut duplicates = false;
    for (_, slice) in &slices {
        for e in &slice.endpoints {
            duplicates |= e.addresses.iter().any(|a| seen.contains(a));
            seen.extend(e.addresses.iter().copied());
        }
    }
    if !duplicates {
        return shared();
    }
    let mut seen = HashSet::new();
    let mut merged = Vec::new();
    for (_, slice) in &slices {
        for e in &slice.endpoints {
            // Check before inserting: an endpoint left out must not mark its other addresses
            // as seen, and an endpoint naming one address twice is not its own duplicate.
            if e.addresses.iter().all(|a| !seen.contains(a)) {
                seen.extend(e.addresses.iter().copied());
                merged.push(e.clone());
            }
        }
    }
    vec![Arc::new(Slice {
        service: slices[0].1.service.clone(),
        endpoints: merged,
    })]
}

#[cfg(test)]
mod tests;
