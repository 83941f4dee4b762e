//! The aggregation Index: every member's exported-service objects, keyed by
//! `(cluster, namespace, name)`. Plain and synchronous: callers convert their input before they
//! take the lock, and a relist replaces one cluster's slice in one step (`reset`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde::Serialize;

use crate::model::{ClusterId, ClusterObjects, Export, Import, ObjectKey, Service, Slice};

/// One object of a kind the Index holds.
#[derive(Clone, Debug)]
pub enum Object {
    Service(ObjectKey, Service),
    Export(ObjectKey, Export),
    Slice(ObjectKey, Slice),
    Import(ObjectKey, Import),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Kind {
    Service,
    Export,
    Slice,
    Import,
}

/// What one cluster contributes.
#[derive(Clone, Debug, Default)]
pub(crate) struct ClusterState {
    pub(crate) services: HashMap<ObjectKey, Service>,
    pub(crate) exports: HashMap<ObjectKey, Export>,
    /// Keyed by the slice's own name; `Slice::service` names the service it belongs to.
    /// Shared with the snapshots built from it, so a rebuild copies pointers, not endpoints.
    pub(crate) slices: HashMap<ObjectKey, Arc<Slice>>,
    pub(crate) imports: HashMap<ObjectKey, Import>,
}

impl ClusterState {
    fn from_objects(objects: ClusterObjects) -> Self {
        Self {
            services: objects.services.into_iter().collect(),
            exports: objects.exports.into_iter().collect(),
            slices: objects
                .slices
                .into_iter()
                .map(|(k, v)| (k, Arc::new(v)))
                .collect(),
            imports: objects.imports.into_iter().collect(),
        }
    }

    fn endpoint_count(&self) -> usize {
        self.slices.values().map(|s| s.endpoints.len()).sum()
    }
}

/// Object counts, reported to Prometheus at scrape time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct IndexSizes {
    pub clusters: usize,
    pub services: usize,
    pub exports: usize,
    pub slices: usize,
    pub endpoints: usize,
    pub imports: usize,
}

#[derive(Debug, Default)]
pub struct Index {
    pub(crate) clusters: BTreeMap<ClusterId, ClusterState>,
    dirty: Dirty,
}

/// The services whose objects changed since the last [`Index::take_dirty`], so that a
/// snapshot re-merges only those (`Snapshot::rebuild`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Dirty {
    /// Everything may have changed (a cluster left): rebuild in full.
    pub all: bool,
    pub services: HashSet<ObjectKey>,
}

impl Dirty {
    pub fn is_empty(&self) -> bool {
        !self.all && self.services.is_empty()
    }
}

/// The service a slice belongs to.
fn service_of(slice_key: &ObjectKey, slice: &Slice) -> ObjectKey {
    ObjectKey {
        namespace: slice_key.namespace.clone(),
        name: slice.service.clone(),
    }
}

impl Index {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces one object. Returns whether anything changed.
    pub fn apply(&mut self, cluster: &ClusterId, object: Object) -> bool {
        let state = self.clusters.entry(cluster.clone()).or_default();
        let dirty = &mut self.dirty.services;
        match object {
            Object::Service(key, v) => upsert(&mut state.services, key, v, dirty),
            Object::Export(key, v) => upsert(&mut state.exports, key, v, dirty),
            Object::Import(key, v) => upsert(&mut state.imports, key, v, dirty),
            Object::Slice(key, v) => {
                let service = service_of(&key, &v);
                let old = state.slices.get(&key).map(|s| service_of(&key, s));
                let changed = upsert(&mut state.slices, key, Arc::new(v), &mut HashSet::new());
                if changed {
                    // A slice relabelled to another service changes both.
                    dirty.extend(old);
                    dirty.insert(service);
                }
                changed
            }
        }
    }

    /// Removes one object. Returns whether it was there.
    pub fn delete(&mut self, cluster: &ClusterId, kind: Kind, key: &ObjectKey) -> bool {
        let Some(state) = self.clusters.get_mut(cluster) else {
            return false;
        };
        let service = match kind {
            Kind::Service => state.services.remove(key).map(|_| key.clone()),
            Kind::Export => state.exports.remove(key).map(|_| key.clone()),
            Kind::Slice => state.slices.remove(key).map(|s| service_of(key, &s)),
            Kind::Import => state.imports.remove(key).map(|_| key.clone()),
        };
        let removed = service.is_some();
        self.dirty.services.extend(service);
        removed
    }

    /// Replaces everything a cluster contributes with a full list, in one step, so readers never
    /// see the cluster half-listed. Returns whether anything changed.
    pub fn reset(&mut self, cluster: &ClusterId, objects: ClusterObjects) -> bool {
        let next = ClusterState::from_objects(objects);
        let mut changed = HashSet::new();
        match self.clusters.get(cluster) {
            Some(current) => mark_changes(current, &next, &mut changed),
            None => mark_changes(&ClusterState::default(), &next, &mut changed),
        }
        let first_list = !self.clusters.contains_key(cluster);
        if changed.is_empty() && !first_list {
            return false;
        }
        self.dirty.services.extend(changed);
        self.clusters.insert(cluster.clone(), next);
        true
    }

    /// Forgets a cluster entirely (it left the hub).
    pub fn remove_cluster(&mut self, cluster: &ClusterId) -> bool {
        let removed = self.clusters.remove(cluster).is_some();
        self.dirty.all |= removed;
        removed
    }

    /// What changed since the last call.
    pub fn take_dirty(&mut self) -> Dirty {
        std::mem::take(&mut self.dirty)
    }

    pub fn has_cluster(&self, cluster: &ClusterId) -> bool {
        self.clusters.contains_key(cluster)
    }

    pub fn sizes(&self) -> IndexSizes {
        let mut sizes = IndexSizes {
            clusters: self.clusters.len(),
            ..IndexSizes::default()
        };
        for state in self.clusters.values() {
            sizes.services += state.services.len();
            sizes.exports += state.exports.len();
            sizes.slices += state.slices.len();
            sizes.imports += state.imports.len();
            sizes.endpoints += state.endpoint_count();
        }
        sizes
    }

    /// Endpoints held for one cluster (for per-cluster metrics).
    pub fn endpoints_of(&self, cluster: &ClusterId) -> usize {
        self.clusters
            .get(cluster)
            .map_or(0, ClusterState::endpoint_count)
    }
}

fn upsert<V: PartialEq>(
    map: &mut HashMap<ObjectKey, V>,
    key: ObjectKey,
    value: V,
    dirty: &mut HashSet<ObjectKey>,
) -> bool {
    match map.get(&key) {
        Some(current) if *current == value => false,
        _ => {
            dirty.insert(key.clone());
            map.insert(key, value);
            true
        }
    }
}

/// Marks every service whose objects differ between two states of one cluster.
fn mark_changes(a: &ClusterState, b: &ClusterState, dirty: &mut HashSet<ObjectKey>) {
    fn diff<V: PartialEq>(
        a: &HashMap<ObjectKey, V>,
        b: &HashMap<ObjectKey, V>,
        dirty: &mut HashSet<ObjectKey>,
    ) {
        for (k, v) in a {
            if b.get(k) != Some(v) {
                dirty.insert(k.clone());
            }
        }
        for k in b.keys() {
            if !a.contains_key(k) {
                dirty.insert(k.clone());
            }
        }
    }
    diff(&a.services, &b.services, dirty);
    diff(&a.exports, &b.exports, dirty);
    diff(&a.imports, &b.imports, dirty);
    for (k, s) in &a.slices {
        if b.slices.get(k) != Some(s) {
            dirty.insert(service_of(k, s));
            if let Some(other) = b.slices.get(k) {
                dirty.insert(service_of(k, other));
            }
        }
    }
    for (k, s) in &b.slices {
        if !a.slices.contains_key(k) {
            dirty.insert(service_of(k, s));
        }
    }
}

#[cfg(test)]
mod tests;
