//! Builders for tests and benches, the one copy every crate imports (behind the `testing`
//! feature; always compiled for this crate's own unit tests).
//!
//! ```text
//!   cluster ─ on_network / with_gateway / tainted ─► ClusterSpec ───────┐
//!   svc(port…), ep / http_ep(ip) ─────────────────► Service, Endpoint ─┤
//!                                                                      ▼
//!   FleetBuilder: members in a Registry on a fake clock (t0), their objects in an Index
//!     member / join / export / slice / apply / reset, or add… (a member exporting shop/web)
//!     heartbeat_failed(name, after) / tick(after) / at(after)
//!     snapshot() / snapshot_with(default TrafficPolicy) ─► Snapshot
//!
//!   placement: healthy / unreachable(spec, since) ─► ClusterView; pods_free(n) /
//!     capacity(cpu, memory, used…) ─► Capacity;
//!     deployment(name, replicas) / config_map(name), annotated(t, key, value) ─► Template;
//!     placing(name, created, tiers, PlacementPolicy) ─► Policy; tier(name, clusters);
//!     match_labels(pairs) ─► LabelSelector
//! ```
//!
//! Every object a builder makes lives in namespace `shop`.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::index::{Index, Object};
use crate::model::{
    ClusterId, ClusterObjects, ClusterSpec, Endpoint, Export, Gateway, Locality, ObjectKey, Port,
    Protocol, Service, Slice, Taint, TaintEffect,
};
use crate::placement::{
    Capacity, PlacementPolicy, Resources, Template, TemplateKey, TemplateSelector, Workload,
};
use crate::policy::{AffinityTier, ClusterSet, LabelSelector, Policies, Policy, TrafficPolicy};
use crate::registry::{Health, Registry};
use crate::snapshot::{ClusterView, Snapshot};

/// `s` seconds, for offsets from a fake clock.
pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// An address from its text; panics on a typo.
pub fn ip(address: &str) -> IpAddr {
    address.parse().expect("an IP address")
}

/// A named TCP port.
pub fn port(name: &str, port: u16) -> Port {
    Port {
        name: Some(name.to_owned()),
        port,
        protocol: Protocol::Tcp,
        app_protocol: None,
    }
}

/// A Service with named TCP ports (no ClusterIPs, not ExternalName, not publishing unready).
pub fn svc(headless: bool, ports: &[(&str, u16)]) -> Service {
    Service {
        headless,
        external_name: false,
        publish_not_ready: false,
        ports: ports.iter().map(|&(n, p)| port(n, p)).collect(),
        cluster_ips: Vec::new(),
    }
}

/// A one-address, not terminating endpoint without ports; `serving` follows `ready`.
pub fn ep(address: IpAddr, ready: bool) -> Endpoint {
    Endpoint {
        addresses: vec![address],
        hostname: None,
        ready,
        serving: ready,
        terminating: false,
        zone: None,
        ports: Arc::from(Vec::new()),
    }
}

/// [`ep`] at `address` listening on TCP port `http` 8080 (the target port of `svc(.., &[("http",
/// 80)])`).
pub fn http_ep(address: &str, ready: bool) -> Endpoint {
    Endpoint {
        ports: Arc::from(vec![port("http", 8080)]),
        ..ep(ip(address), ready)
    }
}

/// A member named `name` in `region` and `zone`, on no network, without gateway or taints.
pub fn cluster(name: &str, region: &str, zone: &str) -> ClusterSpec {
    ClusterSpec {
        locality: Locality {
            region: Some(region.to_owned()),
            zone: Some(zone.to_owned()),
        },
        ..ClusterSpec::named(name)
    }
}

/// `spec` on `network`; with `gateway`, reachable from other networks through 192.0.2.1:15443.
pub fn on_network(spec: ClusterSpec, network: &str, gateway: bool) -> ClusterSpec {
    let spec = ClusterSpec {
        network: Some(network.to_owned()),
        gateway: None,
        ..spec
    };
    if gateway {
        with_gateway(spec, "192.0.2.1")
    } else {
        spec
    }
}

/// `spec` with its east-west gateway at `address`:15443.
pub fn with_gateway(mut spec: ClusterSpec, address: &str) -> ClusterSpec {
    spec.gateway = Some(Gateway {
        address: ip(address),
        port: 15443,
    });
    spec
}

/// `spec` with one more taint, `key` (no value) with `effect`.
pub fn tainted(mut spec: ClusterSpec, key: &str, effect: TaintEffect) -> ClusterSpec {
    spec.taints.push(Taint {
        key: key.to_owned(),
        value: None,
        effect,
    });
    spec
}

/// A fleet built through the public API: members in a [`Registry`] driven by a fake clock
/// starting at `t0`, their objects (all in namespace `shop`) in an [`Index`], and the
/// [`Snapshot`]s built from both.
///
/// `add`, `add_endpoints` and `add_service` each add a healthy member exporting `shop/web`
/// (export ages in the order members are added, endpoints at `10.<n>.…` for the n-th member);
/// `member`, `export`, `slice`, `apply` and `reset` build any other shape.
#[derive(Debug)]
pub struct FleetBuilder {
    /// The fake clock's zero: members join and send their first heartbeat at `t0`.
    pub t0: Instant,
    /// The members' objects; tests apply and delete objects here directly too.
    pub index: Index,
    /// The members and their health; tests drive heartbeats here directly too.
    pub registry: Registry,
    /// The version of the snapshots `snapshot` and `snapshot_with` build (1 unless set).
    pub version: u64,
    /// Members added with `add*`: seeds their endpoint addresses and export ages.
    added: usize,
}

impl Default for FleetBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl FleetBuilder {
    /// A fleet with no members, its clock at now.
    pub fn new() -> Self {
        Self {
            t0: Instant::now(),
            index: Index::new(),
            registry: Registry::new(),
            version: 1,
            added: 0,
        }
    }

    /// A fleet of members known only by name, each with a good heartbeat at `t0`.
    pub fn with_members(names: &[&str]) -> Self {
        let mut fleet = Self::new();
        for name in names {
            fleet.member(ClusterSpec::named(name));
        }
        fleet
    }

    /// `spec` joins at `t0` and has not yet sent a heartbeat.
    pub fn join(&mut self, spec: ClusterSpec) -> &mut Self {
        self.registry.upsert(spec, self.t0);
        self
    }

    /// `spec` joins at `t0` with a good heartbeat.
    pub fn member(&mut self, spec: ClusterSpec) -> &mut Self {
        let id = spec.id.clone();
        self.join(spec);
        self.registry.heartbeat_ok(&id, self.t0);
        self
    }

    /// `object` applied as reported by `cluster`.
    pub fn apply(&mut self, cluster: &str, object: Object) -> &mut Self {
        self.index.apply(&ClusterId::new(cluster), object);
        self
    }

    /// `cluster`'s objects replaced by `objects`, as after a relist.
    pub fn reset(&mut self, cluster: &str, objects: ClusterObjects) -> &mut Self {
        self.index.reset(&ClusterId::new(cluster), objects);
        self
    }

    /// The Service `shop/<name>` and its ServiceExport (created at `created`) in `cluster`.
    pub fn export(
        &mut self,
        cluster: &str,
        name: &str,
        service: Service,
        created: i64,
    ) -> &mut Self {
        let key = ObjectKey::new("shop", name);
        self.apply(cluster, Object::Service(key.clone(), service));
        self.apply(
            cluster,
            Object::Export(
                key,
                Export {
                    created,
                    ..Export::default()
                },
            ),
        )
    }

    /// The EndpointSlice `shop/<slice>` of Service `service` in `cluster`.
    pub fn slice(
        &mut self,
        cluster: &str,
        slice: &str,
        service: &str,
        endpoints: Vec<Endpoint>,
    ) -> &mut Self {
        self.apply(
            cluster,
            Object::Slice(
                ObjectKey::new("shop", slice),
                Slice {
                    service: Arc::from(service),
                    endpoints,
                },
            ),
        )
    }

    /// A healthy member exporting `shop/web` (port `http` 80) with `ready` ready endpoints.
    pub fn add(&mut self, spec: ClusterSpec, ready: u8) -> &mut Self {
        self.add_endpoints(spec, ready, 0)
    }

    /// A healthy member exporting `shop/web` (port `http` 80) with `ready` ready endpoints at
    /// `10.<n>.0.<i>` and `not_ready` not ready ones at `10.<n>.1.<i>`, `n` counting members.
    pub fn add_endpoints(&mut self, spec: ClusterSpec, ready: u8, not_ready: u8) -> &mut Self {
        let n = u8::try_from(self.added).expect("at most 256 members with generated addresses");
        let endpoints = (0..ready)
            .map(|i| ep(IpAddr::V4(Ipv4Addr::new(10, n, 0, i)), true))
            .chain((0..not_ready).map(|i| ep(IpAddr::V4(Ipv4Addr::new(10, n, 1, i)), false)))
            .collect();
        self.add_service(spec, svc(false, &[("http", 80)]), endpoints)
    }

    /// A healthy member exporting `service` as `shop/web`, its `endpoints` in slice
    /// `shop/web-1`; members added earlier export it older.
    pub fn add_service(
        &mut self,
        spec: ClusterSpec,
        service: Service,
        endpoints: Vec<Endpoint>,
    ) -> &mut Self {
        let name = spec.id.as_str().to_owned();
        let created = i64::try_from(self.added).expect("export age");
        self.member(spec)
            .export(&name, "web", service, created)
            .slice(&name, "web-1", "web", endpoints);
        self.added += 1;
        self
    }

    /// `name`'s heartbeat fails `after` seconds past `t0`.
    pub fn heartbeat_failed(&mut self, name: &str, after: u64) -> &mut Self {
        self.registry
            .heartbeat_failed(&ClusterId::new(name), self.at(after), "connection refused");
        self
    }

    /// The registry's clock moves to `after` seconds past `t0`.
    pub fn tick(&mut self, after: u64) -> &mut Self {
        self.registry.tick(self.at(after));
        self
    }

    /// The instant `after` seconds past `t0`.
    pub fn at(&self, after: u64) -> Instant {
        self.t0 + secs(after)
    }

    /// The next version, rebuilt from `prev` with what changed since and restamped against
    /// it at `t0`, as the store publishes.
    pub fn publish_after(&mut self, prev: &Snapshot, policies: &Policies) -> Snapshot {
        self.version += 1;
        let dirty = self.index.take_dirty();
        let mut next = Snapshot::rebuild(
            prev,
            &dirty,
            self.version,
            &self.index,
            &self.registry,
            policies,
            self.t0,
        );
        next.restamp(prev, self.t0);
        next
    }

    /// A snapshot with the default TrafficPolicy and no policy objects.
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_with(TrafficPolicy::default())
    }

    /// A snapshot whose default policy (and so the policy of every service) is `policy`.
    pub fn snapshot_with(&self, policy: TrafficPolicy) -> Snapshot {
        Snapshot::build(
            self.version,
            &self.index,
            &self.registry,
            &Policies::new(Arc::new(policy), vec![]),
        )
    }
}

/// A Healthy cluster view of `spec`, never unreachable.
pub fn healthy(spec: ClusterSpec) -> ClusterView {
    ClusterView {
        spec,
        health: Health::Healthy,
        withdrawn: false,
        unreachable_since: None,
        recovered_at: None,
        reason: None,
        endpoints: 0,
    }
}

/// `spec` Unreachable since `since`.
pub fn unreachable(spec: ClusterSpec, since: Instant) -> ClusterView {
    ClusterView {
        health: Health::Unreachable,
        unreachable_since: Some(since),
        reason: Some("heartbeat failed".into()),
        ..healthy(spec)
    }
}

/// Room for `pods` more pods (and plenty of cpu and memory).
pub fn pods_free(pods: u64) -> Capacity {
    Capacity {
        allocatable: Resources {
            cpu_millis: 1_000_000,
            memory_bytes: 1 << 40,
            gpus: 0,
            pods,
        },
        requested: Resources::default(),
        workloads: Arc::default(),
        quotas: Arc::default(),
    }
}

/// `cpu_millis` and `memory_mib` allocatable, of which `used_cpu_millis` and
/// `used_memory_mib` are requested already (and room for 110 pods, none used).
pub fn capacity(
    cpu_millis: u64,
    memory_mib: u64,
    used_cpu_millis: u64,
    used_memory_mib: u64,
) -> Capacity {
    Capacity {
        allocatable: Resources {
            cpu_millis,
            memory_bytes: memory_mib << 20,
            gpus: 0,
            pods: 110,
        },
        requested: Resources {
            cpu_millis: used_cpu_millis,
            memory_bytes: used_memory_mib << 20,
            gpus: 0,
            pods: 0,
        },
        workloads: Arc::default(),
        quotas: Arc::default(),
    }
}

/// `capacity` with `pods` pods of `t` running in it (bound, their requests counted, as a
/// member reports them).
pub fn running(mut capacity: Capacity, t: &Template, pods: u64) -> Capacity {
    let held = t.requests.times(pods);
    capacity.requested = capacity.requested.saturating_add(held);
    let mut workloads = (*capacity.workloads).clone();
    let entry = workloads.entry(Workload::of(&t.key)).or_default();
    *entry = entry.saturating_add(held);
    capacity.workloads = Arc::new(workloads);
    capacity
}

/// The Deployment `shop/<name>` with `replicas` (None: a kind placed whole), each pod
/// requesting 100m cpu and 128 MiB.
pub fn deployment(name: &str, replicas: Option<u32>) -> Template {
    Template {
        key: TemplateKey::new("apps/v1", "Deployment", "shop", name),
        labels: Default::default(),
        generation: 1,
        replicas,
        requests: Resources {
            cpu_millis: 100,
            memory_bytes: 128 << 20,
            gpus: 0,
            pods: 1,
        },
        dependencies: Vec::new(),
        body: Arc::new(serde_json::Value::Null),
    }
}

/// The ConfigMap `shop/<name>` (placed whole).
pub fn config_map(name: &str) -> Template {
    Template {
        key: TemplateKey::new("v1", "ConfigMap", "shop", name),
        replicas: None,
        requests: Resources::default(),
        ..deployment(name, None)
    }
}

/// `t` with the annotation `key: value` in its body's `metadata.annotations` (what the
/// plugins that read annotations look at).
pub fn annotated(mut t: Template, key: &str, value: &str) -> Template {
    let mut body = (*t.body).clone();
    if !body.is_object() {
        body = serde_json::json!({});
    }
    body["metadata"]["annotations"][key] = serde_json::Value::from(value);
    t.body = Arc::new(body);
    t
}

/// A selector of `matchLabels` only.
pub fn match_labels(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        match_expressions: Vec::new(),
    }
}

/// The affinity tier `name` of the clusters named.
pub fn tier(name: &str, clusters: &[&str]) -> AffinityTier {
    AffinityTier {
        name: Arc::from(name),
        clusters: ClusterSet {
            names: clusters.iter().map(|c| c.to_string()).collect(),
            selector: None,
        },
    }
}

/// The policy `shop/<name>`, created at `created`, placing every Deployment of `shop` in
/// `tiers` (none: anywhere) by `placement`.
pub fn placing(
    name: &str,
    created: i64,
    tiers: Vec<AffinityTier>,
    placement: PlacementPolicy,
) -> Policy {
    Policy {
        key: ObjectKey::new("shop", name),
        created,
        selectors: Vec::new(),
        templates: vec![TemplateSelector {
            kind: Some("Deployment".into()),
            ..TemplateSelector::default()
        }],
        traffic: Arc::new(TrafficPolicy {
            affinities: tiers,
            ..TrafficPolicy::default()
        }),
        placement: Some(Arc::new(placement)),
    }
}

/// HTTPRoute `shop/<name>` whose parent is Service `shop/<parent>` (every port), with one
/// rule sending every request to `backends`: (Service of shop, port, weight).
pub fn service_route(
    name: &str,
    parent: &str,
    backends: &[(&str, u16, u32)],
) -> crate::route::Route {
    use crate::route::{BackendRef, ParentRef, Route, RouteKind, Rule};
    Route {
        kind: RouteKind::Http,
        key: ObjectKey::new("shop", name),
        created: None,
        generation: None,
        parents: vec![ParentRef {
            group: String::new(),
            kind: "Service".into(),
            namespace: "shop".into(),
            name: parent.into(),
            port: None,
        }],
        rules: vec![Rule {
            name: None,
            matches: Vec::new(),
            backends: backends
                .iter()
                .map(|(service, port, weight)| BackendRef {
                    group: String::new(),
                    kind: "Service".into(),
                    namespace: "shop".into(),
                    name: (*service).into(),
                    port: Some(*port),
                    weight: *weight,
                })
                .collect(),
            timeout: None,
            retry: None,
            filters: Vec::new(),
        }],
        source: crate::problem::Source::Api,
    }
}

/// A geo table of `(cidr, region, zone)` ranges (`""`: no zone), for tests of geo clients.
pub fn geo_table(ranges: &[(&str, &str, &str)]) -> Arc<crate::geo::GeoTable> {
    let mut builder = crate::geo::GeoBuilder::default();
    for (i, (cidr, region, zone)) in ranges.iter().enumerate() {
        let locality = Locality {
            region: Some(region.to_string()),
            zone: (!zone.is_empty()).then(|| zone.to_string()),
        };
        builder.add(cidr.parse().expect("cidr"), &locality, i);
    }
    let (table, conflicts) = builder.finish();
    assert!(
        conflicts.is_empty(),
        "test geo ranges conflict: {conflicts:?}"
    );
    Arc::new(table)
}
