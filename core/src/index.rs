//! The aggregation Index: every member's exported-service objects, keyed by
//! `(cluster, namespace, name)`. Plain and synchronous: callers convert their input before they
//! take the lock, and a relist replaces one cluster's slice in one step (`reset`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use serde::Serialize;

use crate::model::{ClusterId, ClusterObjects, Export, Import, ObjectKey, Service, Slice};

/// One object of a kind the Index holds.
#[derive(Clone, Debug, PartialEq)]
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
    /// Private: `slices_of` and `endpoints` are kept in step with it by `put_slice` and
    /// `remove_slice`.
    slices: HashMap<ObjectKey, Arc<Slice>>,
    /// Service → the keys of its slices, so re-merging one service reads its slices only.
    slices_of: HashMap<ObjectKey, BTreeSet<ObjectKey>>,
    /// The endpoints of every slice, counted as slices come and go (the sizes are read on
    /// every snapshot; summing them would touch every slice).
    endpoints: usize,
    pub(crate) imports: HashMap<ObjectKey, Import>,
}

impl ClusterState {
    fn from_objects(objects: ClusterObjects) -> Self {
        let mut state = Self {
            services: objects.services.into_iter().collect(),
            exports: objects.exports.into_iter().collect(),
            imports: objects.imports.into_iter().collect(),
            ..Self::default()
        };
        for (key, slice) in objects.slices {
            state.put_slice(key, Arc::new(slice));
        }
        state
    }

    /// Adds or replaces a slice; returns the one it replaced.
    fn put_slice(&mut self, key: ObjectKey, slice: Arc<Slice>) -> Option<Arc<Slice>> {
        self.endpoints += slice.endpoints.len();
        self.slices_of
            .entry(service_of(&key, &slice))
            .or_default()
            .insert(key.clone());
        let old = self.slices.insert(key.clone(), slice);
        if let Some(old) = &old {
            self.forget_slice(&key, old);
        }
        old
    }

    fn remove_slice(&mut self, key: &ObjectKey) -> Option<Arc<Slice>> {
        let old = self.slices.remove(key)?;
        self.forget_slice(key, &old);
        Some(old)
    }

    /// Takes a slice that is gone (or replaced) out of the counts and the service's set, unless
    /// its replacement belongs to the same service.
    fn forget_slice(&mut self, key: &ObjectKey, old: &Slice) {
        self.endpoints -= old.endpoints.len();
        let service = service_of(key, old);
        if self
            .slices
            .get(key)
            .is_some_and(|now| now.service == old.service)
        {
            return;
        }
        if let Some(keys) = self.slices_of.get_mut(&service) {
            keys.remove(key);
            if keys.is_empty() {
                self.slices_of.remove(&service);
            }
        }
    }

    /// The slices of one service, in slice-name order.
    pub(crate) fn slices_of(&self, service: &ObjectKey) -> impl Iterator<Item = NamedSlice<'_>> {
        self.slices_of
            .get(service)
            .into_iter()
            .flatten()
            .filter_map(|key| Some((key, self.slices.get(key)?)))
    }

    #[cfg(test)]
    pub(crate) fn slices(&self) -> &HashMap<ObjectKey, Arc<Slice>> {
        &self.slices
    }
}

/// A slice with its own name (the name orders slices, so answers are stable).
pub(crate) type NamedSlice<'a> = (&'a ObjectKey, &'a Arc<Slice>);

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
                if state.slices.get(&key).is_some_and(|current| **current == v) {
                    return false;
                }
                let service = service_of(&key, &v);
                let old = state.put_slice(key.clone(), Arc::new(v));
                // A slice relabelled to another service changes both.
                dirty.extend(old.map(|s| service_of(&key, &s)));
                dirty.insert(service);
                true
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
            Kind::Slice => state.remove_slice(key).map(|s| service_of(key, &s)),
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
            sizes.endpoints += state.endpoints;
        }
        sizes
    }

    /// Endpoints held for one cluster (for per-cluster metrics).
    pub fn endpoints_of(&self, cluster: &ClusterId) -> usize {
        self.clusters
            .get(cluster)
            .map_or(0, |state| state.endpoints)
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
