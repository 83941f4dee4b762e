//! The simulated members, their counters, and the fleet-wide write log.
//!
//! Each member is one `Store` behind one lock, a watch channel that wakes its open watches,
//! and an up/down switch its listener and connections follow.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::resources::ResourceType;
use crate::store::{Store, Target, Writer};

/// How the fleet behaves, whatever its size.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// The workload "controller" reports a new generation ready this long after the write.
    pub ready_delay: Duration,
    /// Watches that asked for bookmarks get one this often.
    pub bookmark_every: Duration,
    /// Events each member keeps for watches to resume from.
    pub window: usize,
    /// Entries the write log keeps.
    pub log_capacity: usize,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            ready_delay: Duration::ZERO,
            bookmark_every: Duration::from_secs(60),
            window: 10_000,
            log_capacity: 1_000_000,
        }
    }
}

/// One member as its setup describes it.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct MemberSpec {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Nodes to create; the fleet's default when None.
    #[serde(default)]
    pub nodes: Option<usize>,
}

/// What each node offers.
#[derive(Debug, Clone)]
pub struct NodeShape {
    pub cpu: String,
    pub memory: String,
    pub pods: String,
}

impl Default for NodeShape {
    fn default() -> Self {
        Self {
            cpu: "8".into(),
            memory: "32Gi".into(),
            pods: "110".into(),
        }
    }
}

/// One simulated API server.
#[derive(Debug)]
pub struct Member {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub port: u16,
    /// The bearer token its kubeconfig carries; nothing else is accepted.
    pub token: String,
    pub store: Mutex<Store>,
    /// Bumped after every change: open watches wake and read the ring.
    changed: watch::Sender<u64>,
    /// Whether the member listens; its connections end when it goes down.
    up: watch::Sender<bool>,
    /// Requests by (verb, resource).
    stats: Mutex<BTreeMap<(&'static str, String), u64>>,
    pub open_watches: AtomicI64,
}

impl Member {
    pub fn new(index: usize, spec: &MemberSpec, port: u16, token: String, window: usize) -> Self {
        Self {
            name: spec.name.clone(),
            labels: spec.labels.clone(),
            port,
            token,
            store: Mutex::new(Store::new(index as u64, window)),
            changed: watch::Sender::new(0),
            up: watch::Sender::new(true),
            stats: Mutex::new(BTreeMap::new()),
            open_watches: AtomicI64::new(0),
        }
    }

    /// Wakes the member's watches.
    pub fn notify(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub fn up(&self) -> watch::Receiver<bool> {
        self.up.subscribe()
    }

    pub fn set_up(&self, up: bool) {
        self.up.send_replace(up);
    }

    pub fn is_up(&self) -> bool {
        *self.up.borrow()
    }

    pub fn count(&self, verb: &'static str, resource: &str) {
        *self
            .stats
            .lock()
            .entry((verb, resource.to_owned()))
            .or_default() += 1;
    }

    /// Expires every watch and resourceVersion (a full resync for every client).
    pub fn expire(&self) {
        self.store.lock().expire();
        self.notify();
    }

    /// Its requests by verb and resource (also added to `all`), and its requests by verb.
    fn stats_json(
        &self,
        all: &mut BTreeMap<(&'static str, String), u64>,
    ) -> (Value, BTreeMap<&'static str, u64>) {
        let mut by_verb: BTreeMap<&'static str, BTreeMap<String, u64>> = BTreeMap::new();
        let mut totals: BTreeMap<&'static str, u64> = BTreeMap::new();
        for ((verb, resource), n) in self.stats.lock().iter() {
            by_verb
                .entry(verb)
                .or_default()
                .insert(resource.clone(), *n);
            *totals.entry(verb).or_default() += n;
            *all.entry((verb, resource.clone())).or_default() += n;
        }
        let watches = self.open_watches.load(Ordering::Relaxed);
        (
            json!({"requests": by_verb, "watches": watches, "up": self.is_up()}),
            totals,
        )
    }

    /// Seeds the member's starting objects: its namespaces and `nodes` Ready nodes.
    pub fn seed_basics(&self, nodes: usize, shape: &NodeShape) {
        let mut store = self.store.lock();
        let now = crate::time::now_rfc3339();
        let who = Writer {
            manager: "kubesim",
            force: true,
            now: &now,
        };
        let namespaces = store
            .registry
            .get("", "v1", "namespaces")
            .expect("built in");
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let t = Target {
                resource: &namespaces,
                namespace: None,
                name: ns,
                subresource: None,
            };
            let _ = store.create(&t, json!({"metadata": {"name": ns}}), &who);
        }
        let node_type = store.registry.get("", "v1", "nodes").expect("built in");
        for i in 0..nodes {
            let name = format!("{}-node-{i}", self.name);
            let t = Target {
                resource: &node_type,
                namespace: None,
                name: &name,
                subresource: None,
            };
            let _ = store.create(&t, self.node(&name, i, shape, &now), &who);
            // Nodes' status is theirs (the kubelet's): written through /status.
            let status = Target {
                subresource: Some("status"),
                ..t
            };
            let _ = store.update(&status, self.node(&name, i, shape, &now), &who);
        }
    }

    fn node(&self, name: &str, i: usize, shape: &NodeShape, now: &str) -> Value {
        let mut labels = json!({
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
        });
        for (k, v) in &self.labels {
            let key = match k.as_str() {
                "region" => "topology.kubernetes.io/region",
                "zone" => "topology.kubernetes.io/zone",
                other => other,
            };
            labels[key] = json!(v);
        }
        let capacity = json!({"cpu": shape.cpu, "memory": shape.memory, "pods": shape.pods});
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "spec": {"podCIDR": format!("10.244.{i}.0/24")},
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                    "lastHeartbeatTime": now, "lastTransitionTime": now}],
                "nodeInfo": {"kubeletVersion": "v1.34.0-kubesim"},
            },
        })
    }
}

/// One write as the log keeps it.
#[derive(Debug, Clone, Serialize)]
pub struct WriteEntry {
    pub seq: u64,
    /// Unix time in nanoseconds when the write was answered.
    pub time_ns: u64,
    pub member: Arc<str>,
    /// create, update, patch, apply, delete.
    pub verb: &'static str,
    pub group: String,
    pub version: String,
    pub resource: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subresource: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// The HTTP status of the answer.
    pub code: u16,
    /// False for a refused write or one that changed nothing.
    pub changed: bool,
    pub resource_version: String,
    pub generation: i64,
    /// `bench.meridian.io/rev` from metadata.annotations or spec.template.metadata.annotations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rev: Option<String>,
}

/// The annotation benchmarks mark template revisions with.
pub const REV_ANNOTATION: &str = "bench.meridian.io/rev";

/// The last `capacity` writes of every member.
#[derive(Debug)]
pub struct WriteLog {
    entries: VecDeque<WriteEntry>,
    next: u64,
    capacity: usize,
}

impl WriteLog {
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            next: 1,
            capacity: capacity.max(1),
        }
    }

    pub fn push(&mut self, mut entry: WriteEntry) {
        entry.seq = self.next;
        self.next += 1;
        self.entries.push_back(entry);
        while self.entries.len() > self.capacity {
            self.entries.pop_front();
        }
    }

    /// Entries with seq > `since`, at most `limit`; and the next seq to ask from.
    pub fn since(&self, since: u64, limit: usize) -> (Vec<WriteEntry>, u64) {
        let start = self.entries.partition_point(|e| e.seq <= since);
        let out: Vec<WriteEntry> = self.entries.range(start..).take(limit).cloned().collect();
        let next = out.last().map_or(since.max(self.next - 1), |e| e.seq);
        (out, next)
    }
}

/// Every member, the write log, and how they behave.
#[derive(Debug)]
pub struct Fleet {
    pub members: Vec<Arc<Member>>,
    by_name: HashMap<String, usize>,
    pub log: Mutex<WriteLog>,
    pub config: FleetConfig,
    /// Set when members serve TLS.
    pub tls: Option<crate::server::Tls>,
}

impl Fleet {
    pub fn new(members: Vec<Arc<Member>>, config: FleetConfig) -> Self {
        let by_name = members
            .iter()
            .enumerate()
            .map(|(i, m)| (m.name.clone(), i))
            .collect();
        Self {
            members,
            by_name,
            log: Mutex::new(WriteLog::new(config.log_capacity)),
            config,
            tls: None,
        }
    }

    pub fn member(&self, name: &str) -> Option<&Arc<Member>> {
        self.by_name.get(name).map(|&i| &self.members[i])
    }

    /// Logs one write answered by `member`.
    pub fn log_write(
        &self,
        member: &Member,
        verb: &'static str,
        t: &Target<'_>,
        code: u16,
        written: Option<(&Value, bool)>,
    ) {
        let (object, changed) = match written {
            Some((o, c)) => (Some(o), c),
            None => (None, false),
        };
        let text = |p: &str| {
            object
                .and_then(|o| o.pointer(p))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let rev =
            text(&format!("/metadata/annotations/{}", escape(REV_ANNOTATION))).or_else(|| {
                text(&format!(
                    "/spec/template/metadata/annotations/{}",
                    escape(REV_ANNOTATION)
                ))
            });
        let entry = WriteEntry {
            seq: 0,
            time_ns: unix_ns(),
            member: Arc::from(member.name.as_str()),
            verb,
            group: t.resource.group.clone(),
            version: t.resource.version.clone(),
            resource: t.resource.resource.clone(),
            subresource: t.subresource.map(str::to_owned),
            namespace: t
                .namespace
                .filter(|_| t.resource.namespaced)
                .map(str::to_owned),
            name: t.name.to_owned(),
            code,
            changed,
            resource_version: text("/metadata/resourceVersion").unwrap_or_default(),
            generation: object
                .and_then(|o| o.pointer("/metadata/generation"))
                .and_then(Value::as_i64)
                .unwrap_or(0),
            rev,
        };
        self.log.lock().push(entry);
    }

    /// `GET /stats`: per member (when `detail`) and totals.
    pub fn stats(&self, detail: bool) -> Value {
        let mut totals: BTreeMap<&'static str, u64> = BTreeMap::new();
        let mut per_member = serde_json::Map::new();
        let mut watches = 0;
        let mut by_resource = BTreeMap::new();
        for m in &self.members {
            let (json, t) = m.stats_json(&mut by_resource);
            watches += m.open_watches.load(Ordering::Relaxed);
            for (verb, n) in t {
                *totals.entry(verb).or_default() += n;
            }
            if detail {
                per_member.insert(m.name.clone(), json);
            }
        }
        let writes: u64 = [
            "create",
            "update",
            "patch",
            "apply",
            "delete",
            "deletecollection",
        ]
        .iter()
        .map(|v| totals.get(v).copied().unwrap_or(0))
        .sum();
        let requests: u64 = totals.values().sum();
        let mut by_verb_resource: BTreeMap<&'static str, BTreeMap<String, u64>> = BTreeMap::new();
        for ((verb, resource), n) in by_resource {
            by_verb_resource
                .entry(verb)
                .or_default()
                .insert(resource, n);
        }
        let mut out = json!({
            "totals": {"byVerb": totals, "byVerbResource": by_verb_resource, "requests": requests,
                "writes": writes, "watches": watches},
            "writeLogNext": self.log.lock().next,
        });
        if detail {
            out["members"] = Value::Object(per_member);
        }
        out
    }

    pub fn reset_stats(&self) {
        for m in &self.members {
            m.stats.lock().clear();
        }
    }

    /// The resource type a member serves for `t`.
    pub fn resource_of(member: &Member, name: &str) -> Option<Arc<ResourceType>> {
        member.store.lock().registry.by_name(name)
    }
}

/// A JSON pointer token for a key holding `/` or `~`.
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
