//! A readable JSON account of what a node receives (`meridian xds dump`, `/debug/xds`):
//! decoded from the very bytes that are sent, so it cannot drift from the wire.

use prost::Message;
use serde_json::{Value, json};
use xds_api::pb::envoy::config::cluster::v3::Cluster;
use xds_api::pb::envoy::config::core::v3::{Address, HealthStatus, address, socket_address};
use xds_api::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};
use xds_api::pb::envoy::config::listener::v3::Listener;
use xds_api::pb::envoy::config::route::v3::{RouteConfiguration, route, route_action};

use crate::resources::{Kind, Resource, Resources};

/// Every resource in `resources`, by type, with its version and its essentials.
pub fn describe(resources: &Resources) -> Value {
    let mut out = serde_json::Map::new();
    for kind in Kind::ALL {
        let items: Vec<Value> = resources
            .of(kind)
            .values()
            .map(|r| describe_one(kind, r))
            .collect();
        out.insert(kind.short().to_owned(), Value::Array(items));
    }
    json!({
        "snapshotVersion": resources.snapshot_version,
        "synced": resources.synced,
        "resources": out,
    })
}

fn describe_one(kind: Kind, r: &Resource) -> Value {
    let detail = detail(kind, r.body.value.as_slice());
    json!({"name": r.name, "version": r.version, "detail": detail})
}

/// The essentials of one resource of `kind` as encoded on the wire (what a client was sent).
pub fn detail(kind: Kind, bytes: &[u8]) -> Value {
    match kind {
        Kind::Cluster => Cluster::decode(bytes).map(|c| cluster(&c)),
        Kind::Endpoint => ClusterLoadAssignment::decode(bytes).map(|a| assignment(&a)),
        Kind::Listener => Listener::decode(bytes).map(|l| listener(&l)),
        Kind::Route => RouteConfiguration::decode(bytes).map(|rc| routes(&rc)),
    }
    .unwrap_or_else(|e| json!({"decodeError": e.to_string()}))
}

/// The name a resource of `kind` calls itself by, decoded from the wire.
pub fn name(kind: Kind, bytes: &[u8]) -> Option<String> {
    match kind {
        Kind::Cluster => Cluster::decode(bytes).ok().map(|c| c.name),
        Kind::Endpoint => ClusterLoadAssignment::decode(bytes)
            .ok()
            .map(|a| a.cluster_name),
        Kind::Listener => Listener::decode(bytes).ok().map(|l| l.name),
        Kind::Route => RouteConfiguration::decode(bytes).ok().map(|rc| rc.name),
    }
}

fn cluster(c: &Cluster) -> Value {
    json!({
        "connectTimeoutSeconds": c.connect_timeout.as_ref().map(|d| d.seconds),
        "transportSocketMatches": c.transport_socket_matches.iter().map(|m| m.name.clone()).collect::<Vec<_>>(),
    })
}

fn assignment(a: &ClusterLoadAssignment) -> Value {
    let localities: Vec<Value> = a
        .endpoints
        .iter()
        .map(|l| {
            let loc = l.locality.clone().unwrap_or_default();
            json!({
                "priority": l.priority,
                "weight": l.load_balancing_weight.as_ref().map(|w| w.value),
                "region": loc.region, "zone": loc.zone, "cluster": loc.sub_zone,
                "endpoints": l.lb_endpoints.iter().map(|e| {
                    let addr = match &e.host_identifier {
                        Some(lb_endpoint::HostIdentifier::Endpoint(ep)) => ep.address.as_ref().map(address_text),
                        _ => None,
                    };
                    json!({
                        "address": addr,
                        "health": HealthStatus::try_from(e.health_status).map_or("?", |h| h.as_str_name()),
                        "viaGateway": e.metadata.is_some(),
                    })
                }).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({"localities": localities})
}

fn listener(l: &Listener) -> Value {
    if l.api_listener.is_some() {
        return json!({"apiListener": true, "routeConfig": l.name});
    }
    json!({
        "address": l.address.as_ref().map(address_text),
        "serverNames": l.filter_chains.iter()
            .flat_map(|c| c.filter_chain_match.iter().flat_map(|m| m.server_names.clone()))
            .collect::<Vec<_>>(),
    })
}

fn routes(rc: &RouteConfiguration) -> Value {
    let hosts: Vec<Value> = rc
        .virtual_hosts
        .iter()
        .map(|vh| {
            let clusters: Vec<String> = vh
                .routes
                .iter()
                .filter_map(|r| match &r.action {
                    Some(route::Action::Route(a)) => match &a.cluster_specifier {
                        Some(route_action::ClusterSpecifier::Cluster(c)) => Some(c.clone()),
                        _ => None,
                    },
                    _ => None,
                })
                .collect();
            json!({"domains": vh.domains, "clusters": clusters})
        })
        .collect();
    json!({"virtualHosts": hosts})
}

fn address_text(a: &Address) -> String {
    match &a.address {
        Some(address::Address::SocketAddress(s)) => {
            let port = match s.port_specifier {
                Some(socket_address::PortSpecifier::PortValue(p)) => p,
                _ => 0,
            };
            if s.address.contains(':') {
                format!("[{}]:{}", s.address, port)
            } else {
                format!("{}:{}", s.address, port)
            }
        }
        _ => String::from("?"),
    }
}
