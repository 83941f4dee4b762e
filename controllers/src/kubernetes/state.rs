//! What one member's watches have seen, converted: a pure state machine fed with watch events
//! (no I/O), so relists, deletions during a disconnect and bad objects are unit-tested with
//! synthetic event streams.
//!
//! Each kind's relist (`Init`, `InitApply`…, `InitDone`) is buffered and swapped in at
//! `InitDone`; the first batch the store sees is one `Reset` once every kind has listed, and a
//! later relist of any kind is again one `Reset`. Between relists, events become `Changes`.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ResourceQuota, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher::Event;
use meridian_core::{
    Capacity, ClusterId, ClusterObjects, Kind, Object, ObjectKey, ObjectRef, Origin, Problem,
    Quota, Resources, Source, Subject,
};

use crate::convert::{self, key_of};
use crate::crd::{ServiceExportObject, ServiceImport};
use crate::{Change, SourceEvent};

/// One kind's objects (converted to `T`): the live set, and the relist in progress.
#[derive(Debug)]
pub(crate) struct Table<T> {
    pub(crate) live: BTreeMap<ObjectKey, T>,
    problems: BTreeMap<ObjectKey, String>,
    relist: Option<(BTreeMap<ObjectKey, T>, BTreeMap<ObjectKey, String>)>,
    pub(crate) listed: bool,
    /// Objects (served and rejected) kept at most: a member's API or agent that streams
    /// more cannot grow the hub's memory without end. The others are left out and counted.
    cap: usize,
    /// Objects left out for the cap since the last full list (and in the list in progress).
    left_out: usize,
    relist_left_out: usize,
}

/// Objects of one kind (Services, EndpointSlices, exports, imports …) kept per member: three
/// times the 33,000 fleet services meridian is measured at (a member holds an import of each),
/// ten times Kubernetes' own threshold of 10,000 Services a cluster. A bound, not a budget: at
/// the ~4 KiB an EndpointSlice of 100 endpoints takes converted, 400 MiB for that kind.
pub const MAX_OBJECTS_PER_KIND: usize = 100_000;
/// Pods (their requests only) kept per member: Kubernetes' threshold is 150,000.
pub const MAX_PODS: usize = 300_000;

impl<T> Table<T> {
    fn capped(cap: usize) -> Self {
        Self {
            live: BTreeMap::new(),
            problems: BTreeMap::new(),
            relist: None,
            listed: false,
            cap,
            left_out: 0,
            relist_left_out: 0,
        }
    }

    /// Objects past the cap since the last full list.
    pub(crate) fn left_out(&self) -> usize {
        self.left_out
    }
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Self::capped(MAX_OBJECTS_PER_KIND)
    }
}

/// What applying one event did to a table.
pub(crate) enum Applied<T> {
    Nothing,
    Upsert(ObjectKey, T),
    Delete(ObjectKey),
    /// A relist finished: the whole table changed at once.
    Relisted,
}

impl<T: Clone + PartialEq> Table<T> {
    /// Applies one watch event; an object `convert` rejects is kept as a problem (its reason).
    pub(crate) fn apply<K, E: std::fmt::Display>(
        &mut self,
        event: Event<K>,
        meta: impl Fn(&K) -> &ObjectMeta,
        convert: impl Fn(&K) -> Result<T, E>,
    ) -> Applied<T> {
        match event {
            Event::Init => {
                self.relist = Some(Default::default());
                self.relist_left_out = 0;
                Applied::Nothing
            }
            Event::InitApply(obj) => {
                let Ok(key) = key_of(meta(&obj)) else {
                    return Applied::Nothing;
                };
                let (objects, problems) = self.relist.get_or_insert_with(Default::default);
                let known = objects.contains_key(&key) || problems.contains_key(&key);
                if !known && objects.len() + problems.len() >= self.cap {
                    self.relist_left_out += 1;
                    return Applied::Nothing;
                }
                match convert(&obj) {
                    Ok(v) => {
                        objects.insert(key, v);
                    }
                    Err(e) => {
                        problems.insert(key, e.to_string());
                    }
                }
                Applied::Nothing
            }
            Event::InitDone => {
                let (objects, problems) = self.relist.take().unwrap_or_default();
                self.live = objects;
                self.problems = problems;
                self.left_out = std::mem::take(&mut self.relist_left_out);
                self.listed = true;
                Applied::Relisted
            }
            Event::Apply(obj) => {
                let Ok(key) = key_of(meta(&obj)) else {
                    return Applied::Nothing;
                };
                let known = self.live.contains_key(&key) || self.problems.contains_key(&key);
                if !known && self.live.len() + self.problems.len() >= self.cap {
                    self.left_out += 1;
                    return Applied::Nothing;
                }
                match convert(&obj) {
                    Ok(v) => {
                        self.problems.remove(&key);
                        if self.live.get(&key) == Some(&v) {
                            return Applied::Nothing;
                        }
                        self.live.insert(key.clone(), v.clone());
                        Applied::Upsert(key, v)
                    }
                    Err(e) => {
                        self.problems.insert(key.clone(), e.to_string());
                        match self.live.remove(&key) {
                            Some(_) => Applied::Delete(key),
                            None => Applied::Nothing,
                        }
                    }
                }
            }
            Event::Delete(obj) => {
                let Ok(key) = key_of(meta(&obj)) else {
                    return Applied::Nothing;
                };
                self.problems.remove(&key);
                match self.live.remove(&key) {
                    Some(_) => Applied::Delete(key),
                    None => Applied::Nothing,
                }
            }
        }
    }
}

/// A Node's contribution to the member's capacity, in milli-units per resource.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub capacity: BTreeMap<String, i128>,
    pub allocatable: BTreeMap<String, i128>,
    /// What the Node adds to the cluster's capacity for placement (nothing when cordoned).
    pub placement: Resources,
}

/// One watch event of any kind a member source watches.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "an event lives for one loop iteration; boxing would cost an allocation per object"
)]
pub enum MemberEvent {
    Service(Event<Service>),
    Slice(Event<EndpointSlice>),
    Export(Event<ServiceExportObject>),
    Import(Event<ServiceImport>),
    Node(Event<Node>),
    Namespace(Event<Namespace>),
    Pod(Event<Pod>),
    Quota(Event<ResourceQuota>),
}

impl MemberEvent {
    /// The resource the event is of, as the API names it (`services`, `endpointslices`, …).
    pub fn resource(&self) -> &'static str {
        match self {
            MemberEvent::Service(_) => "services",
            MemberEvent::Slice(_) => "endpointslices",
            MemberEvent::Export(_) => "serviceexports",
            MemberEvent::Import(_) => "serviceimports",
            MemberEvent::Node(_) => "nodes",
            MemberEvent::Namespace(_) => "namespaces",
            MemberEvent::Pod(_) => "pods",
            MemberEvent::Quota(_) => "resourcequotas",
        }
    }
}

/// Everything known about one member from its watches.
#[derive(Debug)]
pub struct MemberState {
    cluster: ClusterId,
    services: Table<meridian_core::Service>,
    /// Each slice with the endpoints it left out (their reasons), reported as problems.
    slices: Table<(meridian_core::Slice, Vec<String>)>,
    exports: Table<meridian_core::Export>,
    imports: Table<meridian_core::Import>,
    nodes: Table<NodeFacts>,
    /// Each namespace's labels (what a Tenant's namespaceSelector picks by).
    namespaces: Table<BTreeMap<String, String>>,
    /// Each unfinished pod's requests on its Node (only those, not the Pod: a member can have
    /// many pods).
    pods: Table<crate::capacity::PodUse>,
    /// Why the member's Pods cannot be listed (its RBAC forbids it): capacity is unknown.
    pods_refused: Option<String>,
    /// Each ResourceQuota's allowance and use, for the ResourceBalance score.
    quotas: Table<Quota>,
    /// Why ResourceQuotas cannot be listed (forbidden, or not served): none count then.
    quotas_refused: Option<String>,
    /// The capacity last sent to the store (None: nothing sent yet).
    capacity_sent: Option<Option<Capacity>>,
    pending: Vec<Change>,
    /// A relist finished since the last batch: send everything.
    reset_due: bool,
    problems_changed: bool,
}

impl MemberState {
    pub fn new(cluster: ClusterId) -> Self {
        Self {
            cluster,
            services: Table::default(),
            slices: Table::default(),
            exports: Table::default(),
            imports: Table::default(),
            nodes: Table::default(),
            namespaces: Table::default(),
            pods: Table::capped(MAX_PODS),
            pods_refused: None,
            quotas: Table::default(),
            quotas_refused: None,
            capacity_sent: None,
            pending: Vec::new(),
            reset_due: true,
            problems_changed: false,
        }
    }

    /// Every kind the Index needs has listed once.
    pub fn listed(&self) -> bool {
        self.services.listed && self.slices.listed && self.exports.listed && self.imports.listed
    }

    /// The watches are starting over (the API came back): hold every batch until all kinds
    /// have listed again, and then replace the member's objects in one step. Until then the
    /// last known objects keep serving.
    pub fn relist_all(&mut self) {
        self.services.listed = false;
        self.slices.listed = false;
        self.exports.listed = false;
        self.imports.listed = false;
        self.reset_due = true;
    }

    pub fn apply(&mut self, event: MemberEvent) {
        fn record<T>(
            applied: Applied<T>,
            kind: Kind,
            object: impl FnOnce(ObjectKey, T) -> Object,
            state: &mut (&mut Vec<Change>, &mut bool),
        ) {
            match applied {
                Applied::Nothing => {}
                Applied::Upsert(key, v) => state.0.push(Change::Upsert(object(key, v))),
                Applied::Delete(key) => state.0.push(Change::Delete(kind, key)),
                Applied::Relisted => *state.1 = true,
            }
        }
        let before = self.problem_count();
        let mut out = (&mut self.pending, &mut self.reset_due);
        match event {
            MemberEvent::Service(e) => {
                let a = self.services.apply(
                    e,
                    |s| &s.metadata,
                    |s| convert::service(s).map(|(_, v)| v),
                );
                record(a, Kind::Service, Object::Service, &mut out);
            }
            MemberEvent::Slice(e) => {
                let a = self.slices.apply(e, |s| &s.metadata, convert_slice);
                record(a, Kind::Slice, |k, (s, _)| Object::Slice(k, s), &mut out);
            }
            MemberEvent::Export(e) => {
                let a = self.exports.apply(
                    e,
                    |s| &s.metadata,
                    |s| convert::export(&s.metadata).map(|(_, v)| v),
                );
                record(a, Kind::Export, Object::Export, &mut out);
            }
            MemberEvent::Import(e) => {
                let a =
                    self.imports
                        .apply(e, |s| &s.metadata, |s| convert::import(s).map(|(_, v)| v));
                record(a, Kind::Import, Object::Import, &mut out);
            }
            MemberEvent::Node(e) => {
                self.nodes
                    .apply(e, |n| &n.metadata, |n| Ok::<_, Infallible>(node_facts(n)));
            }
            MemberEvent::Namespace(e) => {
                self.namespaces.apply(
                    e,
                    |n| &n.metadata,
                    |n| Ok::<_, Infallible>(n.metadata.labels.clone().unwrap_or_default()),
                );
            }
            MemberEvent::Pod(e) => {
                self.pods_refused = None;
                self.pods
                    .apply(e, |p| &p.metadata, |p| Ok::<_, Infallible>(pod_requests(p)));
            }
            MemberEvent::Quota(e) => {
                self.quotas_refused = None;
                // The API validated its quantities; one it could not have is no limit.
                self.quotas.apply(
                    e,
                    |q| &q.metadata,
                    |q| Ok::<_, Infallible>(crate::capacity::quota(q).unwrap_or_default()),
                );
            }
        }
        // A problem fixed or added with no object change still has to reach the store.
        self.problems_changed |= before != self.problem_count();
    }

    fn problem_count(&self) -> usize {
        self.services.problems.len()
            + self.slices.problems.len()
            + self
                .slices
                .live
                .values()
                .map(|(_, p)| p.len())
                .sum::<usize>()
            + self.exports.problems.len()
            + self.imports.problems.len()
            + usize::from(self.pods_refused.is_some())
            + self.services.left_out()
            + self.slices.left_out()
            + self.exports.left_out()
            + self.imports.left_out()
    }

    /// The member's Pods cannot be listed (`reason`): its capacity is unknown (not zero), and
    /// that is a problem of the member's; every other watch goes on.
    pub fn pods_refused(&mut self, reason: String) {
        if self.pods_refused.is_none() {
            self.problems_changed = true;
        }
        self.pods_refused = Some(reason);
    }

    /// ResourceQuotas cannot be listed (`reason`: forbidden, or not served): no quota counts.
    pub fn quotas_refused(&mut self, reason: String) {
        self.quotas_refused = Some(reason);
    }

    /// The capacity for placement: Nodes' allocatable minus the requests of the pods bound
    /// to them, and the namespaces' quotas; None (unknown) without Nodes or when the Pods
    /// cannot be listed. Not known yet (`None` outside) until Nodes, Pods and ResourceQuotas
    /// (unless refused) have listed once.
    pub fn placement_capacity(&self) -> Option<Option<Capacity>> {
        if self.pods_refused.is_some() {
            return self.nodes.listed.then_some(None);
        }
        let quotas_known = self.quotas.listed || self.quotas_refused.is_some();
        if !self.nodes.listed || !self.pods.listed || !quotas_known {
            return None;
        }
        let quotas = match self.quotas_refused {
            Some(_) => Default::default(),
            None => crate::capacity::by_namespace(
                self.quotas.live.iter().map(|(k, q)| (&*k.namespace, *q)),
            ),
        };
        Some(crate::capacity::of(
            self.nodes.live.values().map(|n| n.placement),
            self.pods.live.values(),
            quotas,
        ))
    }

    /// The capacity event for the store when the capacity changed since the last one sent.
    pub fn take_capacity(&mut self) -> Option<SourceEvent> {
        let now = self.placement_capacity()?;
        if self.capacity_sent.as_ref() == Some(&now) {
            return None;
        }
        self.capacity_sent = Some(now.clone());
        Some(SourceEvent::Capacity {
            cluster: self.cluster.clone(),
            capacity: now,
        })
    }

    /// The batch for the store: a Reset after a relist, else the changes since the last batch;
    /// nothing until every kind has listed once (so no half-listed member is ever served).
    pub fn take_event(&mut self) -> Option<SourceEvent> {
        if !self.listed() {
            return None;
        }
        if self.reset_due {
            self.reset_due = false;
            self.pending.clear();
            self.problems_changed = false;
            return Some(SourceEvent::Reset {
                cluster: self.cluster.clone(),
                objects: self.objects(),
                problems: self.problems(),
                warnings: Vec::new(),
            });
        }
        if self.pending.is_empty() && !self.problems_changed {
            return None;
        }
        self.problems_changed = false;
        Some(SourceEvent::Changes {
            cluster: self.cluster.clone(),
            changes: std::mem::take(&mut self.pending),
            problems: self.problems(),
        })
    }

    /// The member's objects as one full list.
    pub fn objects(&self) -> ClusterObjects {
        fn list<T: Clone>(t: &Table<T>) -> Vec<(ObjectKey, T)> {
            t.live.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
        }
        ClusterObjects {
            services: list(&self.services),
            exports: list(&self.exports),
            slices: self
                .slices
                .live
                .iter()
                .map(|(k, (s, _))| (k.clone(), s.clone()))
                .collect(),
            imports: list(&self.imports),
        }
    }

    /// Rejected objects, as the member's API served them.
    pub fn problems(&self) -> Vec<Problem> {
        let origin = Origin::Member(self.cluster.clone());
        let named = |kind: &'static str, t: &BTreeMap<ObjectKey, String>| {
            t.iter()
                .map(|(k, reason)| {
                    Problem::in_api(
                        origin.clone(),
                        ObjectRef::namespaced(kind, k),
                        reason.clone(),
                    )
                })
                .collect::<Vec<_>>()
        };
        let mut out = named("Service", &self.services.problems);
        out.extend(named("EndpointSlice", &self.slices.problems));
        for (key, (_, left_out)) in &self.slices.live {
            out.extend(left_out.iter().map(|reason| {
                Problem::in_api(
                    origin.clone(),
                    ObjectRef::namespaced("EndpointSlice", key),
                    reason.clone(),
                )
            }));
        }
        out.extend(named("ServiceExport", &self.exports.problems));
        out.extend(named("ServiceImport", &self.imports.problems));
        let left_out = [
            ("Services", self.services.left_out(), self.services.cap),
            ("EndpointSlices", self.slices.left_out(), self.slices.cap),
            ("ServiceExports", self.exports.left_out(), self.exports.cap),
            ("ServiceImports", self.imports.left_out(), self.imports.cap),
            ("Nodes", self.nodes.left_out(), self.nodes.cap),
            (
                "Namespaces",
                self.namespaces.left_out(),
                self.namespaces.cap,
            ),
            ("Pods", self.pods.left_out(), self.pods.cap),
            ("ResourceQuotas", self.quotas.left_out(), self.quotas.cap),
        ];
        for (kind, n, cap) in left_out.into_iter().filter(|(_, n, _)| *n > 0) {
            out.push(Problem {
                origin: origin.clone(),
                subject: Subject::Input(kind.into()),
                source: Source::Api,
                reason: format!(
                    "the member serves more than {cap} {kind}, the most meridian keeps of a member: {n} left out"
                ),
            });
        }
        if let Some(reason) = &self.pods_refused {
            out.push(Problem {
                origin,
                subject: Subject::Input("Pods".into()),
                source: Source::Api,
                reason: format!(
                    "cannot list Pods ({reason}); the capacity for placement by available capacity is unknown"
                ),
            });
        }
        out
    }

    /// Capacity and allocatable summed over the member's Nodes, as Kubernetes quantities.
    pub fn capacity(&self) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
        let mut capacity = BTreeMap::new();
        let mut allocatable = BTreeMap::new();
        for node in self.nodes.live.values() {
            for (k, v) in &node.capacity {
                *capacity.entry(k.clone()).or_insert(0) += v;
            }
            for (k, v) in &node.allocatable {
                *allocatable.entry(k.clone()).or_insert(0) += v;
            }
        }
        let format = |m: BTreeMap<String, i128>| {
            m.into_iter()
                .map(|(k, v)| (k, format_milli(v)))
                .collect::<BTreeMap<_, _>>()
        };
        (format(capacity), format(allocatable))
    }

    /// The member's namespaces and their labels.
    pub fn namespaces(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        self.namespaces
            .live
            .iter()
            .map(|(k, labels)| (k.name.to_string(), labels.clone()))
            .collect()
    }

    /// The member's ServiceExports (for their status conditions).
    pub fn exports(&self) -> BTreeSet<ObjectKey> {
        self.exports
            .live
            .keys()
            .chain(self.exports.problems.keys())
            .cloned()
            .collect()
    }
}

/// A slice and the endpoints it left out: the rest of the slice serves, and each endpoint
/// left out is a problem of the slice's (as in a directory member).
fn convert_slice(es: &EndpointSlice) -> convert::Result<(meridian_core::Slice, Vec<String>)> {
    let (_, slice, problems) = convert::slice(es, convert::Validation::Kubernetes)?;
    if !problems.is_empty() {
        tracing::warn!(slice = ?es.metadata.name, problems = ?problems, "endpoints left out");
    }
    Ok((slice, problems))
}

fn node_facts(n: &Node) -> NodeFacts {
    let sum =
        |m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            m.into_iter()
                .flatten()
                .filter_map(|(k, q)| Some((k.clone(), parse_milli(&q.0)?)))
                .collect()
        };
    let status = n.status.as_ref();
    NodeFacts {
        capacity: sum(status.and_then(|s| s.capacity.as_ref())),
        allocatable: sum(status.and_then(|s| s.allocatable.as_ref())),
        placement: crate::capacity::node(n).unwrap_or_else(|reason| {
            tracing::warn!(node = ?n.metadata.name, %reason, "node's allocatable left out of its cluster's capacity");
            Resources::default()
        }),
    }
}

/// What a pod holds of its Node ([`crate::capacity::pod`]); the API validated its quantities,
/// so one that does not read is left out with a warning.
fn pod_requests(p: &Pod) -> crate::capacity::PodUse {
    crate::capacity::pod(p).unwrap_or_else(|reason| {
        tracing::warn!(namespace = ?p.metadata.namespace, pod = ?p.metadata.name, %reason, "pod's requests left out of its cluster's capacity");
        crate::capacity::PodUse::default()
    })
}

/// Parses a Kubernetes quantity ("4", "250m", "16Gi", "1.5G", "1e3") into milli-units,
/// exactly (`meridian_federation::quantity`), rounding a fraction of a milli-unit up as the
/// API server does; None for what is no quantity, or past `u64` milli-units.
pub fn parse_milli(q: &str) -> Option<i128> {
    let quantity = meridian_federation::quantity::Quantity::parse(q.trim()).ok()?;
    quantity.ceil_scaled(1000).map(i128::from)
}

/// Formats milli-units as a quantity: whole units when exact, else with the `m` suffix.
pub fn format_milli(v: i128) -> String {
    if v % 1000 == 0 {
        (v / 1000).to_string()
    } else {
        format!("{v}m")
    }
}

#[cfg(test)]
mod tests;
