//! The aggregation Index: every member's exported-service objects, keyed by
//! `(cluster, namespace, name)`. Plain and synchronous: callers convert their input before they
//! take the lock, and a relist replaces one cluster's slice in one step (`reset`).

use std::collections::{BTreeMap, HashMap};
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
}

impl Index {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces one object. Returns whether anything changed.
    pub fn apply(&mut self, cluster: &ClusterId, object: Object) -> bool {
        let state = self.clusters.entry(cluster.clone()).or_default();
        match object {
            Object::Service(key, v) => upsert(&mut state.services, key, v),
            Object::Export(key, v) => upsert(&mut state.exports, key, v),
            Object::Slice(key, v) => upsert(&mut state.slices, key, Arc::new(v)),
            Object::Import(key, v) => upsert(&mut state.imports, key, v),
        }
    }

    /// Removes one object. Returns whether it was there.
    pub fn delete(&mut self, cluster: &ClusterId, kind: Kind, key: &ObjectKey) -> bool {
        let Some(state) = self.clusters.get_mut(cluster) else {
            return false;
        };
        match kind {
            Kind::Service => state.services.remove(key).is_some(),
            Kind::Export => state.exports.remove(key).is_some(),
            Kind::Slice => state.slices.remove(key).is_some(),
            Kind::Import => state.imports.remove(key).is_some(),
        }
    }

    /// Replaces everything a cluster contributes with a full list, in one step, so readers never
    /// see the cluster half-listed. Returns whether anything changed.
    pub fn reset(&mut self, cluster: &ClusterId, objects: ClusterObjects) -> bool {
        let next = ClusterState::from_objects(objects);
        match self.clusters.get(cluster) {
            Some(current) if same_state(current, &next) => false,
            _ => {
                self.clusters.insert(cluster.clone(), next);
                true
            }
        }
    }

    /// Forgets a cluster entirely (it left the hub).
    pub fn remove_cluster(&mut self, cluster: &ClusterId) -> bool {
        self.clusters.remove(cluster).is_some()
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

fn upsert<V: PartialEq>(map: &mut HashMap<ObjectKey, V>, key: ObjectKey, value: V) -> bool {
    match map.get(&key) {
        Some(current) if *current == value => false,
        _ => {
            map.insert(key, value);
            true
        }
    }
}

fn same_state(a: &ClusterState, b: &ClusterState) -> bool {
    a.services == b.services
        && a.exports == b.exports
        && a.slices == b.slices
        && a.imports == b.imports
}

#[cfg(test)]
mod tests;
