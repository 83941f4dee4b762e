//! A readable JSON account of what a node receives (`meridian xds dump`, `/debug/xds`):
//! decoded from the very bytes that are sent, so it cannot drift from the wire.

use prost::Message;
use serde_json::{Value, json};
use xds_api::pb::envoy::config::cluster::v3::Cluster;
use xds_api::pb::envoy::config::core::v3::{Address, HealthStatus, address, socket_address};
use xds_api::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};
use xds_api::pb::envoy::config::listener::v3::Listener;
use xds_api::pb::envoy::config::route::v3::{
    Route, RouteConfiguration, header_matcher, route, route_action, route_match,
};

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
                .flat_map(|r| weighted(r).into_iter().map(|(c, _)| c))
                .collect();
            let routes: Vec<Value> = vh.routes.iter().map(route_detail).collect();
            json!({"domains": vh.domains, "clusters": clusters, "routes": routes})
        })
        .collect();
    json!({"virtualHosts": hosts})
}

/// The clusters a route sends to, with their weights (1 for a single cluster).
fn weighted(r: &Route) -> Vec<(String, u32)> {
    let Some(route::Action::Route(a)) = &r.action else {
        return Vec::new();
    };
    match &a.cluster_specifier {
        Some(route_action::ClusterSpecifier::Cluster(c)) => vec![(c.clone(), 1)],
        Some(route_action::ClusterSpecifier::WeightedClusters(w)) => w
            .clusters
            .iter()
            .map(|c| (c.name.clone(), c.weight.as_ref().map_or(0, |w| w.value)))
            .collect(),
        _ => Vec::new(),
    }
}

/// One route: its name, what it matches, and where it sends (or what it answers).
fn route_detail(r: &Route) -> Value {
    let m = r.r#match.clone().unwrap_or_default();
    let path = match &m.path_specifier {
        Some(route_match::PathSpecifier::Prefix(p)) => json!({"prefix": p}),
        Some(route_match::PathSpecifier::Path(p)) => json!({"exact": p}),
        Some(route_match::PathSpecifier::SafeRegex(re)) => json!({"regex": re.regex}),
        _ => Value::Null,
    };
    let headers: Vec<Value> = m
        .headers
        .iter()
        .map(|h| {
            let value = match &h.header_match_specifier {
                Some(header_matcher::HeaderMatchSpecifier::ExactMatch(v)) => json!({"exact": v}),
                Some(header_matcher::HeaderMatchSpecifier::SafeRegexMatch(re)) => {
                    json!({"regex": re.regex})
                }
                _ => Value::Null,
            };
            json!({"name": h.name, "value": value})
        })
        .collect();
    let clusters: Vec<Value> = weighted(r)
        .into_iter()
        .map(|(name, weight)| json!({"name": name, "weight": weight}))
        .collect();
    let mut detail =
        json!({"name": r.name, "path": path, "headers": headers, "clusters": clusters});
    match &r.action {
        Some(route::Action::DirectResponse(d)) => detail["directResponse"] = json!(d.status),
        Some(route::Action::Route(a)) => {
            if let Some(t) = &a.timeout {
                detail["timeoutMs"] = json!(t.seconds * 1000 + i64::from(t.nanos) / 1_000_000);
            }
            if let Some(p) = &a.retry_policy {
                detail["retry"] = json!({
                    "on": p.retry_on,
                    "retries": p.num_retries.as_ref().map_or(1, |n| n.value),
                });
            }
        }
        _ => {}
    }
    detail
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
