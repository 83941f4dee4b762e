//! The tables a script reads: a cluster's table per cluster state (built once, frozen by the
//! prelude into a read-only view, shared by every decision while the cluster stays the same)
//! and the workload table (built once per decision, frozen the same way).

use std::collections::BTreeMap;

use meridian_core::placement::ClusterInput;
use meridian_core::{Capacity, ClusterSpec, Health, Resources, Template};
use mlua::{Function, Lua, Result, Table};

/// A cluster's table (its read-only view) and the inputs it was built from: reused while they
/// are equal, so a decision builds only the tables of clusters that changed since the last one.
/// What changes all the time (health, endpoints, capacity) is written into the tables behind
/// the view in place; the rest (a new label, a new price) builds the table again.
#[derive(Debug)]
pub(crate) struct Proto {
    spec: ClusterSpec,
    health: Health,
    endpoints: usize,
    capacity: Option<Capacity>,
    /// The view the script gets.
    pub(crate) table: Table,
    /// The cluster table behind the view, for [`Proto::refresh`].
    raw: Table,
    /// The capacity table and its `allocatable` and `requested` tables behind their views.
    raw_capacity: Option<[Table; 3]>,
    /// The decision that last used it, for eviction.
    pub(crate) seen: u64,
}

impl Proto {
    /// `freeze`: the prelude's, which turns the table into its read-only view.
    pub(crate) fn build(
        lua: &Lua,
        freeze: &Function,
        c: &ClusterInput<'_>,
        seen: u64,
    ) -> Result<Self> {
        let (raw, raw_capacity) = cluster(lua, c)?;
        Ok(Self {
            spec: c.view.spec.clone(),
            health: c.view.health,
            endpoints: c.view.endpoints,
            capacity: c.capacity.cloned(),
            table: freeze.call(&raw)?,
            raw,
            raw_capacity,
            seen,
        })
    }

    /// Whether it was built from the same inputs as `c` has now.
    pub(crate) fn is_for(&self, c: &ClusterInput<'_>) -> bool {
        self.endpoints == c.view.endpoints
            && self.health == c.view.health
            && self.capacity.as_ref() == c.capacity
            && self.spec == c.view.spec
    }

    /// Brings the table up to `c` in place when only its health, endpoints or capacity
    /// amounts changed (no decision runs meanwhile: the script's state is locked). False: the
    /// table must be built again.
    pub(crate) fn refresh(&mut self, c: &ClusterInput<'_>) -> Result<bool> {
        if self.spec != c.view.spec || self.capacity.is_some() != c.capacity.is_some() {
            return Ok(false);
        }
        if self.health != c.view.health {
            self.raw.raw_set("health", c.view.health.as_str())?;
            self.health = c.view.health;
        }
        if self.endpoints != c.view.endpoints {
            self.raw.raw_set("endpoints", c.view.endpoints)?;
            self.endpoints = c.view.endpoints;
        }
        if let (Some(cap), Some([free, allocatable, requested])) = (c.capacity, &self.raw_capacity)
            && self.capacity.as_ref() != Some(cap)
        {
            set_resources(free, &cap.allocatable.saturating_sub(cap.requested))?;
            set_resources(allocatable, &cap.allocatable)?;
            set_resources(requested, &cap.requested)?;
            self.capacity = Some(cap.clone());
        }
        Ok(true)
    }
}

/// The table of `cluster`, as lib.rs documents it, and its capacity tables.
fn cluster(lua: &Lua, c: &ClusterInput<'_>) -> Result<(Table, Option<[Table; 3]>)> {
    let spec = &c.view.spec;
    let t = lua.create_table_with_capacity(0, 10)?;
    t.raw_set("name", spec.id.as_str())?;
    t.raw_set("labels", strings(lua, &spec.labels)?)?;
    t.raw_set("region", spec.locality.region.as_deref())?;
    t.raw_set("zone", spec.locality.zone.as_deref())?;
    t.raw_set("health", c.view.health.as_str())?;
    t.raw_set("endpoints", c.view.endpoints)?;
    t.raw_set("network", spec.network.as_deref())?;
    let taints = lua.create_table_with_capacity(spec.taints.len(), 0)?;
    for (i, taint) in spec.taints.iter().enumerate() {
        let x = lua.create_table_with_capacity(0, 3)?;
        x.raw_set("key", taint.key.as_str())?;
        x.raw_set("value", taint.value.as_deref())?;
        x.raw_set("effect", format!("{:?}", taint.effect))?;
        taints.raw_set(i + 1, x)?;
    }
    t.raw_set("taints", taints)?;
    let mut raw_capacity = None;
    if let Some(cap) = c.capacity {
        let free = resources(lua, &cap.allocatable.saturating_sub(cap.requested))?;
        let allocatable = resources(lua, &cap.allocatable)?;
        let requested = resources(lua, &cap.requested)?;
        free.raw_set("allocatable", &allocatable)?;
        free.raw_set("requested", &requested)?;
        t.raw_set("capacity", &free)?;
        raw_capacity = Some([free, allocatable, requested]);
    }
    if let Some(cost) = &spec.cost {
        let x = lua.create_table_with_capacity(0, 4)?;
        x.raw_set("cpu_core_hour", cost.cpu_core_hour())?;
        x.raw_set("memory_gib_hour", cost.memory_gib_hour())?;
        x.raw_set("egress_gib", cost.egress_gib())?;
        x.raw_set("spot_ratio", cost.spot_ratio())?;
        t.raw_set("cost", x)?;
    }
    Ok((t, raw_capacity))
}

/// The `workload` table of a decision.
pub(crate) fn workload(lua: &Lua, t: &Template) -> Result<Table> {
    let w = lua.create_table_with_capacity(0, 8)?;
    w.raw_set("api_version", &*t.key.api_version)?;
    w.raw_set("kind", &*t.key.kind)?;
    w.raw_set("namespace", &*t.key.namespace)?;
    w.raw_set("name", &*t.key.name)?;
    w.raw_set("labels", strings(lua, &t.labels)?)?;
    let annotations = lua.create_table()?;
    if let Some(map) = t
        .body
        .pointer("/metadata/annotations")
        .and_then(|a| a.as_object())
    {
        for (k, v) in map {
            if let Some(v) = v.as_str() {
                annotations.raw_set(k.as_str(), v)?;
            }
        }
    }
    w.raw_set("annotations", annotations)?;
    w.raw_set("replicas", t.replicas)?;
    w.raw_set("requests", resources(lua, &t.requests)?)?;
    Ok(w)
}

fn strings(lua: &Lua, map: &BTreeMap<String, String>) -> Result<Table> {
    let t = lua.create_table_with_capacity(0, map.len())?;
    for (k, v) in map {
        t.raw_set(k.as_str(), v.as_str())?;
    }
    Ok(t)
}

fn resources(lua: &Lua, r: &Resources) -> Result<Table> {
    let t = lua.create_table_with_capacity(0, 4)?;
    set_resources(&t, r)?;
    Ok(t)
}

fn set_resources(t: &Table, r: &Resources) -> Result<()> {
    // Lua integers are i64; no real amount comes near the edge, so saturate.
    let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    t.raw_set("cpu_millis", int(r.cpu_millis))?;
    t.raw_set("memory_bytes", int(r.memory_bytes))?;
    t.raw_set("gpus", int(r.gpus))?;
    t.raw_set("pods", int(r.pods))?;
    Ok(())
}
