//! Model types shared by every part of meridian. Kubernetes objects are converted into these at
//! the edge (`controllers/`), so nothing past the edge sees a kube type.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use serde::Serialize;

/// A member cluster's name, as given by its MemberCluster. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct ClusterId(Arc<str>);

impl ClusterId {
    pub fn new(name: impl AsRef<str>) -> Self {
        Self(Arc::from(name.as_ref()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether `name` can name a cluster: a DNS-1123 subdomain (lowercase alphanumerics, `-` and
/// `.`, alphanumeric at both ends of each label, at most 253 characters), as MemberCluster
/// names are.
pub fn is_cluster_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

/// A namespaced object name: `namespace/name`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ObjectKey {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

/// The key of a service across the fleet (MCS "sameness": the same namespace and name in every
/// cluster is the same service).
pub type ServiceKey = ObjectKey;

impl ObjectKey {
    pub fn new(namespace: impl AsRef<str>, name: impl AsRef<str>) -> Self {
        Self {
            namespace: Arc::from(namespace.as_ref()),
            name: Arc::from(name.as_ref()),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl fmt::Debug for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Where a cluster (or an endpoint) sits: `topology.kubernetes.io/region` and `/zone`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Locality {
    pub region: Option<String>,
    pub zone: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The SRV label, `_tcp` without the underscore.
    pub fn srv_label(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// A Service port (or an EndpointSlice port: then `port` is the target port).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    pub name: Option<String>,
    pub port: u16,
    pub protocol: Protocol,
    pub app_protocol: Option<String>,
}

/// One endpoint of an EndpointSlice, with the slice's ports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Endpoint {
    pub addresses: Vec<IpAddr>,
    pub hostname: Option<String>,
    /// EndpointSlice `conditions.ready`; unset means ready, as Kubernetes defines it.
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// The endpoint's own zone, when the slice names one.
    pub zone: Option<String>,
    /// The ports of the slice this endpoint came from (target ports).
    pub ports: Arc<[Port]>,
}

impl Endpoint {
    /// The port this endpoint listens on for `service_port`: the slice port of the same name
    /// and protocol (the target port), else the service port itself.
    pub fn target_port(&self, service_port: &Port) -> u16 {
        self.ports
            .iter()
            .find(|p| p.name == service_port.name && p.protocol == service_port.protocol)
            .map_or(service_port.port, |p| p.port)
    }

    /// Whether DNS answers and traffic may use this endpoint. Terminating endpoints never are;
    /// `publishNotReadyAddresses` lets not-ready ones through.
    pub fn is_answerable(&self, publish_not_ready: bool) -> bool {
        !self.terminating && (self.ready || publish_not_ready)
    }
}

/// A Service as meridian needs it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Service {
    pub headless: bool,
    pub external_name: bool,
    pub publish_not_ready: bool,
    pub ports: Vec<Port>,
    pub cluster_ips: Vec<IpAddr>,
}

/// A ServiceExport: marks the Service of the same name for export.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Export {
    /// `creationTimestamp` in seconds since the epoch; the oldest export decides a service's
    /// properties (MCS conflict resolution).
    pub created: i64,
    /// `metadata.labels`: a policy's label selector matches those of the oldest export.
    pub labels: BTreeMap<String, String>,
}

/// An EndpointSlice: which service it belongs to and its endpoints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Slice {
    pub service: Arc<str>,
    pub endpoints: Vec<Endpoint>,
}

/// A ServiceImport present in a member: its `spec.ips` is that cluster's ClusterSetIP.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Import {
    pub ips: Vec<IpAddr>,
    pub headless: bool,
}

/// Everything one member cluster contributes, as a full list (for relists).
#[derive(Clone, Debug, Default)]
pub struct ClusterObjects {
    pub services: Vec<(ObjectKey, Service)>,
    pub exports: Vec<(ObjectKey, Export)>,
    pub slices: Vec<(ObjectKey, Slice)>,
    pub imports: Vec<(ObjectKey, Import)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Taint {
    pub key: String,
    pub value: Option<String>,
    pub effect: TaintEffect,
}

/// The east-west gateway that clients on other networks use to reach a cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Gateway {
    pub address: IpAddr,
    pub port: u16,
}

/// Health timings of a member (MemberCluster `spec.health`), in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthTimings {
    pub heartbeat_seconds: u64,
    pub unreachable_after_seconds: u64,
    pub withdraw_after_seconds: u64,
}

impl Default for HealthTimings {
    fn default() -> Self {
        Self {
            heartbeat_seconds: 5,
            unreachable_after_seconds: 15,
            withdraw_after_seconds: 120,
        }
    }
}

/// A member cluster as registered on the hub (MemberCluster spec and labels).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    pub id: ClusterId,
    pub labels: BTreeMap<String, String>,
    pub locality: Locality,
    pub network: Option<String>,
    pub dns_client_cidrs: Vec<IpNet>,
    pub pod_cidrs: Vec<IpNet>,
    pub gateway: Option<Gateway>,
    pub taints: Vec<Taint>,
    pub health: HealthTimings,
    /// A directory member's `renderPath`: where its placed objects are kept rendered.
    pub render_path: Option<std::path::PathBuf>,
    /// Its MemberCluster is being deleted: nothing is placed there any more, and what meridian
    /// placed there moves out the graceful way (replacement first, traffic next, the old copy
    /// last) before the member is let go.
    pub retiring: bool,
    /// `spec.cost`: what running here costs, for the Cost score.
    pub cost: Option<Cost>,
}

/// `MemberCluster.spec.cost`, in one currency across the fleet. Prices are kept in millionths
/// (so the spec stays `Eq`); [`Cost::cpu_core_hour`] and the others give them back as `f64`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cost {
    pub cpu_core_hour_micros: u64,
    pub memory_gib_hour_micros: u64,
    pub egress_gib_micros: u64,
    /// The share of the cluster's capacity that is spot, in thousandths.
    pub spot_permille: u32,
}

impl Cost {
    /// From prices and a spot share in [0, 1] (negative or non-finite values count as 0).
    pub fn new(cpu_core_hour: f64, memory_gib_hour: f64, egress_gib: f64, spot_ratio: f64) -> Self {
        let micros = |v: f64| {
            if v.is_finite() && v > 0.0 {
                (v * 1e6).round() as u64
            } else {
                0
            }
        };
        Self {
            cpu_core_hour_micros: micros(cpu_core_hour),
            memory_gib_hour_micros: micros(memory_gib_hour),
            egress_gib_micros: micros(egress_gib),
            spot_permille: if spot_ratio.is_finite() {
                (spot_ratio.clamp(0.0, 1.0) * 1000.0).round() as u32
            } else {
                0
            },
        }
    }

    pub fn cpu_core_hour(&self) -> f64 {
        self.cpu_core_hour_micros as f64 / 1e6
    }

    pub fn memory_gib_hour(&self) -> f64 {
        self.memory_gib_hour_micros as f64 / 1e6
    }

    pub fn egress_gib(&self) -> f64 {
        self.egress_gib_micros as f64 / 1e6
    }

    pub fn spot_ratio(&self) -> f64 {
        f64::from(self.spot_permille) / 1000.0
    }
}

impl ClusterSpec {
    /// A spec with only a name, for tests and for clusters known only by name.
    pub fn named(id: &str) -> Self {
        Self {
            id: ClusterId::new(id),
            labels: BTreeMap::new(),
            locality: Locality::default(),
            network: None,
            dns_client_cidrs: Vec::new(),
            pod_cidrs: Vec::new(),
            gateway: None,
            taints: Vec::new(),
            health: HealthTimings::default(),
            render_path: None,
            retiring: false,
            cost: None,
        }
    }
}
