//! Pure builders: a Snapshot and a node group in, the Envoy resources that node receives out
//!. Every resource is encoded once here and carried as an `Any` with a version
//! that is a hash of its bytes, so equal content has equal versions across streams, restarts
//! and replicas (which is what delta reconnects with `initial_resource_versions` rely on).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use meridian_core::route::{self, RouteTable};
use meridian_core::{
    Client, ClusterView, Endpoint, Member, ObjectKey, OutlierDetection, Port, Selection,
    ServiceView, Snapshot, select_for,
};
use prost::{Message, Name};
use serde::Serialize;
use xds_api::pb::envoy::config::cluster::v3::{self as xcluster, Cluster};
use xds_api::pb::envoy::config::core::v3::{self as xcore, address, socket_address};
use xds_api::pb::envoy::config::endpoint::v3::{
    self as xendpoint, ClusterLoadAssignment, LbEndpoint, LocalityLbEndpoints,
};
use xds_api::pb::envoy::config::listener::v3::{self as xlistener, Listener};
use xds_api::pb::envoy::config::route::v3::{self as xroute, RouteConfiguration};
use xds_api::pb::envoy::extensions::filters::http::router::v3::Router;
use xds_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    self as hcm, HttpConnectionManager,
};
use xds_api::pb::google::protobuf::{Any, Duration, Struct, UInt32Value, Value, value};

mod routes;

use crate::extra::{TcpProxy, TlsInspector, UpstreamTlsContext, tcp_proxy};
use crate::node::{Group, Role};

/// The four resource types meridian serves, in push order (CDS → EDS → LDS → RDS).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Kind {
    Cluster,
    Endpoint,
    Listener,
    Route,
}

pub const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const ENDPOINT_TYPE: &str =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
pub const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const ROUTE_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Cluster, Kind::Endpoint, Kind::Listener, Kind::Route];

    pub fn type_url(self) -> &'static str {
        match self {
            Kind::Cluster => CLUSTER_TYPE,
            Kind::Endpoint => ENDPOINT_TYPE,
            Kind::Listener => LISTENER_TYPE,
            Kind::Route => ROUTE_TYPE,
        }
    }

    pub fn from_type_url(url: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.type_url() == url)
    }

    pub fn index(self) -> usize {
        self as usize
    }

    /// CDS, EDS, LDS, RDS: the names operators know them by.
    pub fn short(self) -> &'static str {
        match self {
            Kind::Cluster => "CDS",
            Kind::Endpoint => "EDS",
            Kind::Listener => "LDS",
            Kind::Route => "RDS",
        }
    }

    /// LDS and CDS subscribe to everything when a request names nothing.
    pub fn wildcard_when_empty(self) -> bool {
        matches!(self, Kind::Cluster | Kind::Listener)
    }
}

/// One encoded resource.
#[derive(Debug, PartialEq)]
pub struct Resource {
    pub name: Arc<str>,
    /// A hash of the encoded bytes (16 hex digits).
    pub version: String,
    pub body: Any,
}

/// One kind of resources by name, in name order. Persistent (structure shared between
/// copies): the next build for a group starts as a copy of the previous one in O(1) and pays
/// only for the services that changed, which at a million endpoints is the difference between
/// copying 60,000 entries per snapshot and a few.
pub type NameMap = rpds::RedBlackTreeMapSync<Arc<str>, Arc<Resource>>;

/// Everything one node group receives, by kind and name.
#[derive(Debug, Default)]
pub struct Resources {
    pub snapshot_version: u64,
    pub synced: bool,
    by_kind: [NameMap; 4],
    /// What each service contributed, kept so that the next build for this group reuses the
    /// resources of every service that did not change (same `ServiceView`, same clusters).
    per_service: rpds::HashTrieMapSync<ObjectKey, ServiceItems>,
    /// A hash of everything about the clusters that the selection reads.
    clusters_fingerprint: u64,
    /// The route table a proxyless group's RDS was built from (None for other roles, which
    /// get no RDS): a new table renews the resources of the services whose routes changed.
    routes: Option<Arc<RouteTable>>,
    /// The decisions this build made (services it reused made none), for metrics.
    pub decisions: DecisionStats,
}

/// Counts of the scheduling decisions a build made.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DecisionStats {
    /// By the tier traffic goes to first (`Selection::first_tier_label`).
    pub by_first_tier: BTreeMap<&'static str, u64>,
    pub spills: u64,
    pub failing_back: u64,
}

impl DecisionStats {
    fn record(&mut self, selection: &Selection) {
        *self
            .by_first_tier
            .entry(selection.first_tier_label())
            .or_default() += 1;
        self.spills += u64::from(selection.spills);
        self.failing_back += selection.failing_back() as u64;
    }
}

/// The resources one service contributes to one node group.
#[derive(Debug, Clone)]
struct ServiceItems {
    /// The view they were built from (compared by pointer: snapshots share unchanged views).
    view: Arc<ServiceView>,
    items: Items,
}

/// A service's resources for one node group.
type Items = Arc<[(Kind, Arc<Resource>)]>;

impl Resources {
    pub fn of(&self, kind: Kind) -> &NameMap {
        &self.by_kind[kind.index()]
    }

    pub fn len(&self) -> usize {
        self.by_kind.iter().map(NameMap::size).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn insert<M: Message + Name>(&mut self, kind: Kind, name: String, message: &M) {
        let resource = encode(name, message);
        self.by_kind[kind.index()].insert_mut(resource.name.clone(), resource);
    }

    /// Puts a service's items in (replacing what it had), or takes them out (`None`).
    fn set_service(&mut self, view: &Arc<ServiceView>, items: Option<Items>) {
        self.remove_service(&view.key);
        let Some(items) = items else {
            return;
        };
        for (kind, resource) in items.iter() {
            self.by_kind[kind.index()].insert_mut(resource.name.clone(), resource.clone());
        }
        self.per_service.insert_mut(
            view.key.clone(),
            ServiceItems {
                view: view.clone(),
                items,
            },
        );
    }

    /// Takes a service's items out.
    fn remove_service(&mut self, key: &ObjectKey) {
        let Some(old) = self.per_service.get(key).map(|e| e.items.clone()) else {
            return;
        };
        self.per_service.remove_mut(key);
        for (kind, resource) in old.iter() {
            self.by_kind[kind.index()].remove_mut(&resource.name);
        }
    }

    /// Fills `self` with every service's items: from `prev` (same group, previous snapshot)
    /// for each service whose view is the very same and when the clusters are unchanged, from
    /// `make` for the others. `make` returns None for a service this group gets nothing of.
    fn assemble(
        &mut self,
        snapshot: &Snapshot,
        prev: Option<&Resources>,
        mut make: impl FnMut(&Arc<ServiceView>) -> Option<Items>,
    ) {
        // The services whose routes changed since `prev` (a route edit renews its parents'
        // resources only); None: the builds are not comparable.
        let rerouted = |p: &Resources| match (&p.routes, &self.routes) {
            (None, None) => Some(Vec::new()),
            // Every snapshot of a fleet shares its table until the routes change.
            (Some(a), Some(b)) if Arc::ptr_eq(a, b) => Some(Vec::new()),
            (Some(a), Some(b)) => Some(a.services_rerouted(b)),
            _ => None,
        };
        let Some((prev, rerouted)) = prev
            .filter(|p| p.clusters_fingerprint == self.clusters_fingerprint)
            .and_then(|p| Some((p, rerouted(p)?)))
        else {
            for service in snapshot.services() {
                let items = make(service);
                self.set_service(service, items);
            }
            return;
        };
        self.by_kind = prev.by_kind.clone();
        self.per_service = prev.per_service.clone();
        match snapshot.changed_since(prev.snapshot_version) {
            Some(changed) => self.renew_changed(snapshot, changed, &mut make),
            None => self.renew_all(snapshot, &mut make),
        }
        // A service renewed above for its own change is built again here: rare (a route
        // edit and a change of its parent in one snapshot), and the same result.
        self.renew(snapshot, rerouted.iter(), make);
    }

    /// Renews the services `changed` names (the only views that differ from the snapshot
    /// `self` was copied from) and those whose policy depends on time.
    fn renew_changed(
        &mut self,
        snapshot: &Snapshot,
        changed: &[ObjectKey],
        make: impl FnMut(&Arc<ServiceView>) -> Option<Items>,
    ) {
        self.renew(snapshot, changed.iter().chain(snapshot.timed_keys()), make);
    }

    /// Renews the services `keys` names: built again, or taken out when they are gone.
    fn renew<'k>(
        &mut self,
        snapshot: &Snapshot,
        keys: impl Iterator<Item = &'k ObjectKey>,
        mut make: impl FnMut(&Arc<ServiceView>) -> Option<Items>,
    ) {
        for key in keys {
            match snapshot.service(&key.namespace, &key.name) {
                Some(service) => {
                    let items = make(service);
                    self.set_service(service, items);
                }
                None => self.remove_service(key),
            }
        }
    }

    /// Renews every service whose view is not the one `self` was built from (or whose policy
    /// depends on time), and drops those that are gone.
    fn renew_all(
        &mut self,
        snapshot: &Snapshot,
        mut make: impl FnMut(&Arc<ServiceView>) -> Option<Items>,
    ) {
        let mut with_items = 0;
        for service in snapshot.services() {
            // A policy with failback or withdraw windows decides differently as time passes.
            let unchanged = !service.policy.depends_on_time()
                && self
                    .per_service
                    .get(&service.key)
                    .is_some_and(|e| Arc::ptr_eq(&e.view, service));
            if !unchanged {
                let items = make(service);
                self.set_service(service, items);
            }
            with_items += usize::from(unchanged || self.per_service.contains_key(&service.key));
        }
        // Every service of the snapshot that has items is in `per_service`: equal counts mean
        // no other (removed) service is, which spares a lookup per service.
        if with_items == self.per_service.size() {
            return;
        }
        let gone: Vec<ObjectKey> = self
            .per_service
            .keys()
            .filter(|k| snapshot.service(&k.namespace, &k.name).is_none())
            .cloned()
            .collect();
        for key in gone {
            self.remove_service(&key);
        }
    }
}

fn encode<M: Message + Name>(name: String, message: &M) -> Arc<Resource> {
    Arc::new(Resource {
        version: content_version(&message.encode_to_vec()),
        body: pack(message),
        name: name.into(),
    })
}

/// Everything about the clusters that selection and the builders read, hashed: when it is
/// unchanged, a service's resources depend only on its own view.
fn clusters_fingerprint(snapshot: &Snapshot) -> u64 {
    let mut text = String::new();
    for c in &snapshot.clusters {
        use std::fmt::Write;
        let _ = write!(
            text,
            "{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{}|{};",
            c.spec.id,
            c.spec.labels,
            c.spec.locality,
            c.spec.network,
            c.spec.gateway,
            c.spec.taints,
            c.health,
            c.withdrawn,
            c.unreachable_since.is_some(),
        );
    }
    u64::from_str_radix(&content_version(text.as_bytes()), 16).unwrap_or_default()
}

/// The xDS name of a service port: `<svc>.<ns>.global:<port>`.
pub fn service_port_name(service: &ServiceView, port: &Port) -> String {
    let prefix = service_name_prefix(&service.key.namespace, &service.key.name);
    format!("{prefix}{}", port.port)
}

/// What the xDS name of every port of service `namespace/name` starts with.
pub fn service_name_prefix(namespace: &str, name: &str) -> String {
    format!("{name}.{namespace}.global:")
}

/// The SNI (and gateway cluster name) of a service port, as Istio's east-west gateways use it.
pub fn gateway_sni(service: &ServiceView, port: &Port) -> String {
    format!(
        "outbound_.{}_._.{}.{}.svc.cluster.local",
        port.port, service.key.name, service.key.namespace
    )
}

/// What a node in `group` receives from `snapshot`.
pub fn build(snapshot: &Snapshot, group: &Group, now: Instant) -> Resources {
    build_from(snapshot, group, now, None)
}

/// [`build`], reusing from `prev` (the same group's previous build) the resources of every
/// service whose view is shared with the previous snapshot, when the clusters are unchanged.
pub fn build_from(
    snapshot: &Snapshot,
    group: &Group,
    now: Instant,
    prev: Option<&Resources>,
) -> Resources {
    let mut out = Resources {
        snapshot_version: snapshot.version,
        synced: snapshot.synced,
        clusters_fingerprint: clusters_fingerprint(snapshot),
        routes: (group.role == Role::Proxyless).then(|| snapshot.routes.clone()),
        ..Resources::default()
    };
    let client = group
        .cluster
        .as_deref()
        .and_then(|c| snapshot.cluster_index(c));
    match group.role {
        Role::EastWestGateway => {
            if let Some(own) = client {
                build_gateway(&mut out, snapshot, own, prev);
            }
        }
        Role::Envoy | Role::Proxyless => build_client(&mut out, snapshot, group, client, now, prev),
    }
    out
}

fn build_client(
    out: &mut Resources,
    snapshot: &Snapshot,
    group: &Group,
    client: Option<usize>,
    now: Instant,
    prev: Option<&Resources>,
) {
    let decider = client_of(snapshot, group, client);
    let proxyless = group.role == Role::Proxyless;
    let mut decisions = DecisionStats::default();
    out.assemble(snapshot, prev, |service| {
        let selection = select_for(snapshot, service, &decider, now);
        decisions.record(&selection);
        Some(client_service_items(
            snapshot, service, &selection, proxyless,
        ))
    });
    out.decisions = decisions;
}

/// The node as the decision sees it: its network is what the node says, else its cluster's
/// (unknown when neither); a proxyless gRPC client cannot use gateways.
fn client_of<'a>(snapshot: &'a Snapshot, group: &'a Group, client: Option<usize>) -> Client<'a> {
    let mut decider = Client::in_cluster(snapshot, client);
    if let Some(network) = &group.network {
        decider.network = Some(Some(network.as_str()));
    }
    if group.role == Role::Proxyless {
        decider = decider.without_gateways();
    }
    decider
}

/// A service's resources for a client: per port, its cluster and assignment, and for
/// proxyless clients its listener and route.
fn client_service_items(
    snapshot: &Snapshot,
    service: &ServiceView,
    selection: &Selection,
    proxyless: bool,
) -> Items {
    let any_gateway = selection
        .tiers
        .iter()
        .flat_map(|t| &t.members)
        .any(Member::via_gateway);
    let mut items = Vec::new();
    for port in &service.ports {
        let name = service_port_name(service, port);
        let sni = gateway_sni(service, port);
        let localities = client_localities(snapshot, service, selection, port);
        let gateway_sni = any_gateway.then_some(sni.as_str());
        items.push((
            Kind::Cluster,
            encode(
                name.clone(),
                &eds_cluster(&name, gateway_sni, &service.policy.outlier),
            ),
        ));
        items.push((
            Kind::Endpoint,
            encode(name.clone(), &assignment(&name, localities)),
        ));
        if proxyless {
            items.push((Kind::Listener, encode(name.clone(), &api_listener(&name))));
            let routes = snapshot.routes.for_port(&service.key, port.port);
            items.push((
                Kind::Route,
                encode(
                    name.clone(),
                    &route_config(service, &name, routes.map(|r| &r[..])),
                ),
            ));
            if routes.is_some_and(|r| routes::sends_to_failing(r)) {
                let failing = routes::failing_cluster_name(&name);
                let cluster = eds_cluster(&failing, None, &service.policy.outlier);
                items.push((Kind::Cluster, encode(failing.clone(), &cluster)));
                let nothing = assignment(&failing, Vec::new());
                items.push((Kind::Endpoint, encode(failing, &nothing)));
            }
        }
    }
    items.into()
}

/// The localities of one service port for a client: tier i of the selection is priority i,
/// each member as the decision resolved it (its gateway, or its endpoints).
fn client_localities(
    snapshot: &Snapshot,
    service: &ServiceView,
    selection: &Selection,
    port: &Port,
) -> Vec<LocalityLbEndpoints> {
    let mut localities = Vec::new();
    for (priority, tier) in (0u32..).zip(&selection.tiers) {
        for member in &tier.members {
            let cluster = &snapshot.clusters[member.cluster];
            match member.gateway() {
                Some((address, gateway_port)) => localities.push(gateway_locality(
                    cluster,
                    address,
                    gateway_port,
                    member.weight,
                    priority,
                )),
                None => localities.extend(cluster_localities(
                    cluster,
                    selection.endpoints_of(service, member),
                    service.backends[member.backend].publish_not_ready,
                    port,
                    member.weight,
                    priority,
                )),
            }
        }
    }
    fit_weights(&mut localities);
    localities
}

fn build_gateway(out: &mut Resources, snapshot: &Snapshot, own: usize, prev: Option<&Resources>) {
    let cluster = &snapshot.clusters[own];
    let Some(gateway) = &cluster.spec.gateway else {
        return;
    };
    out.assemble(snapshot, prev, |service| {
        let backend = service.backend_of(own)?;
        let mut items = Vec::new();
        for port in &service.ports {
            let sni = gateway_sni(service, port);
            let localities = cluster_localities(
                cluster,
                backend.endpoints(),
                backend.publish_not_ready,
                port,
                backend.ready.max(1),
                0,
            );
            let cds = eds_cluster(&sni, None, &service.policy.outlier);
            items.push((Kind::Cluster, encode(sni.clone(), &cds)));
            items.push((
                Kind::Endpoint,
                encode(sni.clone(), &assignment(&sni, localities)),
            ));
        }
        Some(items.into())
    });
    // One filter chain per local service port, in name order.
    let chains: Vec<_> = out
        .of(Kind::Cluster)
        .keys()
        .map(|sni| passthrough_chain(sni))
        .collect();
    out.by_kind[Kind::Listener.index()] = NameMap::default();
    // Envoy refuses a listener without filter chains: no local services, no listener.
    if !chains.is_empty() {
        let name = format!("eastwest-gateway:{}", gateway.port);
        out.insert(
            Kind::Listener,
            name.clone(),
            &gateway_listener(&name, gateway.port, chains),
        );
    }
}

/// The locality weights of one priority must sum to at most u32::MAX (the xDS API; gRPC
/// refuses more): scale a priority's weights down together when they would not.
fn fit_weights(localities: &mut [LocalityLbEndpoints]) {
    let weight = |l: &LocalityLbEndpoints| {
        u64::from(l.load_balancing_weight.as_ref().map_or(1, |w| w.value))
    };
    let mut start = 0;
    while start < localities.len() {
        let priority = localities[start].priority;
        let end = start
            + localities[start..]
                .iter()
                .take_while(|l| l.priority == priority)
                .count();
        let group = &mut localities[start..end];
        let sum: u64 = group.iter().map(weight).sum();
        // Leave room for the rounding up of tiny weights to 1.
        let limit = u64::from(u32::MAX) - group.len() as u64;
        if sum > limit {
            for l in group.iter_mut() {
                let scaled = (weight(l) * limit / sum).max(1);
                l.load_balancing_weight = Some(UInt32Value {
                    value: u32::try_from(scaled).unwrap_or(u32::MAX),
                });
            }
        }
        start = end;
    }
}

fn eds_cluster(name: &str, gateway_sni: Option<&str>, outlier: &OutlierDetection) -> Cluster {
    Cluster {
        name: name.to_owned(),
        cluster_discovery_type: Some(xcluster::cluster::ClusterDiscoveryType::Type(
            xcluster::cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(xcluster::cluster::EdsClusterConfig {
            eds_config: Some(ads_config_source()),
            service_name: String::new(),
        }),
        connect_timeout: Some(seconds(5)),
        lb_policy: xcluster::cluster::LbPolicy::RoundRobin as i32,
        outlier_detection: Some(outlier_detection(outlier)),
        common_lb_config: Some(xcluster::cluster::CommonLbConfig {
            locality_config_specifier: Some(
                xcluster::cluster::common_lb_config::LocalityConfigSpecifier::LocalityWeightedLbConfig(
                    Default::default(),
                ),
            ),
            ..Default::default()
        }),
        transport_socket_matches: gateway_sni
            .map(|sni| vec![gateway_transport_socket_match(sni)])
            .unwrap_or_default(),
        ..Default::default()
    }
}

/// The policy's outlier detection as Envoy and gRPC read it. Envoy counts 5 consecutive 5xx
/// unless told not to (`enforcing_consecutive_5xx` 0), and enforces gateway errors and the
/// failure percentage only when told to (100); gRPC reads the failure percentage alone.
fn outlier_detection(o: &OutlierDetection) -> xcluster::OutlierDetection {
    let value = |v: u32| Some(UInt32Value { value: v });
    let mut out = xcluster::OutlierDetection {
        interval: Some(seconds(i64::from(o.interval_seconds))),
        base_ejection_time: Some(seconds(i64::from(o.base_ejection_seconds))),
        max_ejection_percent: value(o.max_ejection_percent),
        ..Default::default()
    };
    match o.consecutive_errors {
        Some(n) => out.consecutive_5xx = value(n),
        None => out.enforcing_consecutive_5xx = value(0),
    }
    if let Some(n) = o.consecutive_gateway_errors {
        out.consecutive_gateway_failure = value(n);
        out.enforcing_consecutive_gateway_failure = value(100);
    }
    if let Some(f) = &o.failure_percentage {
        out.failure_percentage_threshold = value(f.threshold);
        out.enforcing_failure_percentage = value(100);
        out.failure_percentage_minimum_hosts = value(f.minimum_hosts);
        out.failure_percentage_request_volume = value(f.request_volume);
    }
    out
}

/// Key and value that mark an endpoint as a gateway, in endpoint metadata and in the
/// cluster's transport-socket match.
const TLS_MODE_KEY: &str = "tlsMode";
const TLS_MODE_GATEWAY: &str = "meridian-gateway";
const TRANSPORT_SOCKET_MATCH_FILTER: &str = "envoy.transport_socket_match";

fn gateway_transport_socket_match(sni: &str) -> xcluster::cluster::TransportSocketMatch {
    let tls = UpstreamTlsContext {
        sni: sni.to_owned(),
    };
    xcluster::cluster::TransportSocketMatch {
        name: TLS_MODE_GATEWAY.to_owned(),
        r#match: Some(string_struct(TLS_MODE_KEY, TLS_MODE_GATEWAY)),
        transport_socket: Some(xcore::TransportSocket {
            name: "envoy.transport_sockets.tls".to_owned(),
            config_type: Some(xcore::transport_socket::ConfigType::TypedConfig(pack(&tls))),
        }),
    }
}

fn assignment(name: &str, localities: Vec<LocalityLbEndpoints>) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: name.to_owned(),
        endpoints: localities,
        policy: Some(xendpoint::cluster_load_assignment::Policy {
            // 100: a priority takes traffic only when the ones above have none healthy, so
            // Envoy and gRPC spill exactly where the selection put the tier boundaries.
            overprovisioning_factor: Some(UInt32Value { value: 100 }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// One locality per zone of `cluster` that holds one of `endpoints`; the cluster's weight is
/// shared between its zones by ready endpoints.
fn cluster_localities<'e>(
    cluster: &ClusterView,
    endpoints: impl Iterator<Item = &'e Endpoint>,
    publish_not_ready: bool,
    port: &Port,
    weight: u32,
    priority: u32,
) -> Vec<LocalityLbEndpoints> {
    let mut zones: BTreeMap<&str, (u32, Vec<LbEndpoint>)> = BTreeMap::new();
    let cluster_zone = cluster.spec.locality.zone.as_deref().unwrap_or_default();
    for ep in endpoints {
        let Some(address) = ep.addresses.first() else {
            continue;
        };
        let zone = ep.zone.as_deref().unwrap_or(cluster_zone);
        let entry = zones.entry(zone).or_default();
        entry.0 += u32::from(ep.ready);
        entry.1.push(lb_endpoint(
            *address,
            ep.target_port(port),
            health_of(ep, publish_not_ready),
            None,
        ));
    }
    let ready_total: u32 = zones.values().map(|z| z.0).sum();
    zones
        .into_iter()
        .map(|(zone, (ready, lb_endpoints))| LocalityLbEndpoints {
            locality: Some(locality(cluster, zone)),
            lb_endpoints,
            load_balancing_weight: Some(UInt32Value {
                value: zone_share(weight, ready, ready_total),
            }),
            priority,
            ..Default::default()
        })
        .collect()
}

/// A cluster's weight split by ready endpoints; never 0 (Envoy ignores weightless localities).
fn zone_share(weight: u32, ready: u32, ready_total: u32) -> u32 {
    if ready_total == 0 {
        return weight.max(1);
    }
    (u64::from(weight) * u64::from(ready) / u64::from(ready_total)).clamp(1, u64::from(u32::MAX))
        as u32
}

fn gateway_locality(
    cluster: &ClusterView,
    address: IpAddr,
    port: u16,
    weight: u32,
    priority: u32,
) -> LocalityLbEndpoints {
    let zone = cluster.spec.locality.zone.as_deref().unwrap_or_default();
    LocalityLbEndpoints {
        locality: Some(locality(cluster, zone)),
        lb_endpoints: vec![lb_endpoint(
            address,
            port,
            xcore::HealthStatus::Healthy,
            Some(string_struct(TLS_MODE_KEY, TLS_MODE_GATEWAY)),
        )],
        load_balancing_weight: Some(UInt32Value {
            value: weight.max(1),
        }),
        priority,
        ..Default::default()
    }
}

fn locality(cluster: &ClusterView, zone: &str) -> xcore::Locality {
    xcore::Locality {
        region: cluster.spec.locality.region.clone().unwrap_or_default(),
        zone: zone.to_owned(),
        sub_zone: cluster.spec.id.as_str().to_owned(),
    }
}

/// Endpoint health: ready → HEALTHY, serving and terminating → DRAINING, anything else UNHEALTHY.
/// A service that publishes not-ready addresses gets them as HEALTHY, as DNS answers them.
fn health_of(ep: &Endpoint, publish_not_ready: bool) -> xcore::HealthStatus {
    if ep.is_answerable(publish_not_ready) {
        xcore::HealthStatus::Healthy
    } else if ep.serving && ep.terminating {
        xcore::HealthStatus::Draining
    } else {
        xcore::HealthStatus::Unhealthy
    }
}

fn lb_endpoint(
    address: IpAddr,
    port: u16,
    health: xcore::HealthStatus,
    transport_match: Option<Struct>,
) -> LbEndpoint {
    LbEndpoint {
        health_status: health as i32,
        metadata: transport_match.map(|m| xcore::Metadata {
            filter_metadata: [(TRANSPORT_SOCKET_MATCH_FILTER.to_owned(), m)].into(),
            ..Default::default()
        }),
        host_identifier: Some(xendpoint::lb_endpoint::HostIdentifier::Endpoint(
            xendpoint::Endpoint {
                address: Some(socket_address(address, port)),
                ..Default::default()
            },
        )),
        ..Default::default()
    }
}

fn api_listener(name: &str) -> Listener {
    let manager = HttpConnectionManager {
        stat_prefix: name.to_owned(),
        codec_type: hcm::http_connection_manager::CodecType::Auto as i32,
        route_specifier: Some(hcm::http_connection_manager::RouteSpecifier::Rds(
            hcm::Rds {
                config_source: Some(ads_config_source()),
                route_config_name: name.to_owned(),
            },
        )),
        http_filters: vec![hcm::HttpFilter {
            name: "envoy.filters.http.router".to_owned(),
            config_type: Some(hcm::http_filter::ConfigType::TypedConfig(pack(
                &Router::default(),
            ))),
            ..Default::default()
        }],
        ..Default::default()
    };
    Listener {
        name: name.to_owned(),
        api_listener: Some(xlistener::ApiListener {
            api_listener: Some(pack(&manager)),
        }),
        ..Default::default()
    }
}

/// The routes of a service port for its proxyless clients: the matches of the routes that
/// attach to it, in precedence order (no match: no route, as the spec's 404), else every
/// request to the port's own cluster.
fn route_config(
    service: &ServiceView,
    name: &str,
    attached: Option<&[route::Attached]>,
) -> RouteConfiguration {
    let host = format!("{}.{}.global", service.key.name, service.key.namespace);
    let routes = match attached {
        Some(attached) => routes::routes(attached, &routes::failing_cluster_name(name)),
        None => vec![xroute::Route {
            r#match: Some(xroute::RouteMatch {
                path_specifier: Some(xroute::route_match::PathSpecifier::Prefix(String::new())),
                ..Default::default()
            }),
            action: Some(xroute::route::Action::Route(xroute::RouteAction {
                cluster_specifier: Some(xroute::route_action::ClusterSpecifier::Cluster(
                    name.to_owned(),
                )),
                ..Default::default()
            })),
            ..Default::default()
        }],
    };
    RouteConfiguration {
        name: name.to_owned(),
        virtual_hosts: vec![xroute::VirtualHost {
            name: name.to_owned(),
            domains: vec![name.to_owned(), host],
            routes,
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn passthrough_chain(sni: &str) -> xlistener::FilterChain {
    let proxy = TcpProxy {
        stat_prefix: sni.to_owned(),
        cluster_specifier: Some(tcp_proxy::ClusterSpecifier::Cluster(sni.to_owned())),
    };
    xlistener::FilterChain {
        name: sni.to_owned(),
        filter_chain_match: Some(xlistener::FilterChainMatch {
            server_names: vec![sni.to_owned()],
            ..Default::default()
        }),
        filters: vec![xlistener::Filter {
            name: "envoy.filters.network.tcp_proxy".to_owned(),
            config_type: Some(xlistener::filter::ConfigType::TypedConfig(pack(&proxy))),
        }],
        ..Default::default()
    }
}

fn gateway_listener(name: &str, port: u16, chains: Vec<xlistener::FilterChain>) -> Listener {
    Listener {
        name: name.to_owned(),
        address: Some(socket_address(IpAddr::from([0, 0, 0, 0]), port)),
        listener_filters: vec![xlistener::ListenerFilter {
            name: "envoy.filters.listener.tls_inspector".to_owned(),
            config_type: Some(xlistener::listener_filter::ConfigType::TypedConfig(pack(
                &TlsInspector {},
            ))),
            ..Default::default()
        }],
        filter_chains: chains,
        ..Default::default()
    }
}

fn ads_config_source() -> xcore::ConfigSource {
    xcore::ConfigSource {
        config_source_specifier: Some(xcore::config_source::ConfigSourceSpecifier::Ads(
            xcore::AggregatedConfigSource::default(),
        )),
        resource_api_version: xcore::ApiVersion::V3 as i32,
        ..Default::default()
    }
}

fn socket_address(ip: IpAddr, port: u16) -> xcore::Address {
    xcore::Address {
        address: Some(address::Address::SocketAddress(xcore::SocketAddress {
            address: ip.to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(port))),
            ..Default::default()
        })),
    }
}

fn string_struct(key: &str, value: &str) -> Struct {
    Struct {
        fields: [(
            key.to_owned(),
            Value {
                kind: Some(value::Kind::StringValue(value.to_owned())),
            },
        )]
        .into(),
    }
}

fn seconds(s: i64) -> Duration {
    Duration {
        seconds: s,
        nanos: 0,
    }
}

pub(crate) fn pack<M: Message + Name>(message: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: message.encode_to_vec(),
    }
}

/// FNV-1a over the encoded bytes: stable across processes and builds, unlike std's hasher.
pub(crate) fn content_version(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

#[cfg(any(test, feature = "testing"))]
impl Resources {
    /// A view with the given (kind, name, content) resources, for state machine tests and
    /// the fuzz target (feature `testing`).
    pub fn for_tests(snapshot_version: u64, items: &[(Kind, &str, &str)]) -> Self {
        let mut out = Resources {
            snapshot_version,
            synced: true,
            ..Resources::default()
        };
        for (kind, name, content) in items {
            let resource = Resource {
                name: Arc::from(*name),
                version: content_version(content.as_bytes()),
                body: Any {
                    type_url: kind.type_url().to_owned(),
                    value: content.as_bytes().to_vec(),
                },
            };
            out.by_kind[kind.index()].insert_mut(Arc::from(*name), Arc::new(resource));
        }
        out
    }

    pub fn unsynced() -> Self {
        Resources::default()
    }
}

#[cfg(test)]
mod tests;
