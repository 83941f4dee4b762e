//! `meridian xds watch`: a real ADS client. It says who it is as a node of a cluster (the
//! same node metadata a proxy or a proxyless gRPC client sends), subscribes to every cluster
//! (CDS) and then to the endpoints of each (EDS), ACKs every response, and prints what it was
//! sent as it comes — the quickest way to see, live, what meridian sends a node: each update
//! timestamped, with what it added, changed and removed against the one before.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::SystemTime;

use anyhow::{Context, Result, bail};
use meridian_xds::{Kind, describe};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use xds_api::pb::envoy::config::cluster::v3::Cluster;
use xds_api::pb::envoy::config::core::v3::Node;
use xds_api::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use xds_api::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use xds_api::pb::google::protobuf::{Struct, Value, value};

use crate::cli::{NodeRole, XdsWatchArgs};
use crate::out::outln;

pub async fn watch(args: &XdsWatchArgs) -> Result<ExitCode> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", args.xds))?
        .connect_timeout(std::time::Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("cannot connect to the xDS server at {}", args.xds))?;
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let (requests, rx) = mpsc::channel(16);
    send(
        &requests,
        subscribe(Kind::Cluster, Vec::new(), Some(node(args))),
    )
    .await?;
    let mut responses = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .context("the xDS server refused the stream")?
        .into_inner();
    let mut endpoints_of: Vec<String> = Vec::new();
    let mut seen = Seen::default();
    let mut updates = 0;
    while let Some(response) = responses.message().await.context("the xDS stream failed")? {
        let kind = Kind::from_type_url(&response.type_url);
        match kind {
            Some(kind) => {
                for line in seen.update(kind, &response, SystemTime::now()) {
                    outln!("{line}");
                }
            }
            None => outln!("{} version {}", response.type_url, response.version_info),
        }
        let names = match kind {
            Some(Kind::Cluster) => {
                let clusters = endpoint_names(&response)?;
                // Endpoints are asked for by name; a new set of clusters is a new request.
                if clusters != endpoints_of {
                    endpoints_of = clusters;
                    send(
                        &requests,
                        subscribe(Kind::Endpoint, endpoints_of.clone(), None),
                    )
                    .await?;
                }
                Vec::new()
            }
            Some(Kind::Endpoint) => endpoints_of.clone(),
            _ => Vec::new(),
        };
        send(&requests, ack(&response, names)).await?;
        updates += 1;
        if args.count.is_some_and(|n| updates >= n) {
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn send(requests: &mpsc::Sender<DiscoveryRequest>, r: DiscoveryRequest) -> Result<()> {
    if requests.send(r).await.is_err() {
        bail!("the xDS stream closed");
    }
    Ok(())
}

/// The node as the server places it: CLUSTER_ID and NETWORK metadata, ROLE for a gateway, and
/// a gRPC user agent for a proxyless client.
fn node(args: &XdsWatchArgs) -> Node {
    let text = |s: &str| Value {
        kind: Some(value::Kind::StringValue(s.to_owned())),
    };
    let mut metadata = Struct::default();
    if let Some(c) = &args.node.node_cluster {
        metadata.fields.insert("CLUSTER_ID".into(), text(c));
    }
    if let Some(n) = &args.node.node_network {
        metadata.fields.insert("NETWORK".into(), text(n));
    }
    if let NodeRole::EastwestGateway = args.node.role {
        metadata
            .fields
            .insert("ROLE".into(), text("eastwest-gateway"));
    }
    let user_agent = match args.node.role {
        NodeRole::Proxyless => "gRPC (meridian xds watch)",
        NodeRole::Envoy | NodeRole::EastwestGateway => "envoy",
    };
    Node {
        id: args.node_id.clone(),
        cluster: args.node.node_cluster.clone().unwrap_or_default(),
        metadata: Some(metadata),
        user_agent_name: user_agent.into(),
        ..Default::default()
    }
}

fn subscribe(kind: Kind, names: Vec<String>, node: Option<Node>) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: kind.type_url().into(),
        resource_names: names,
        node,
        ..Default::default()
    }
}

fn ack(response: &DiscoveryResponse, names: Vec<String>) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: response.type_url.clone(),
        version_info: response.version_info.clone(),
        response_nonce: response.nonce.clone(),
        resource_names: names,
        ..Default::default()
    }
}

/// The names the endpoints of these clusters are asked for by (EDS service names).
fn endpoint_names(response: &DiscoveryResponse) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for any in &response.resources {
        let cluster =
            Cluster::decode(any.value.as_slice()).context("a Cluster that does not decode")?;
        let eds_name = cluster
            .eds_cluster_config
            .as_ref()
            .map(|e| e.service_name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| cluster.name.clone());
        names.push(eds_name);
    }
    names.sort();
    names.dedup();
    Ok(names)
}

/// What the watch was last sent, per type: each resource's decoded detail by name.
#[derive(Default)]
struct Seen {
    by_kind: BTreeMap<&'static str, BTreeMap<String, serde_json::Value>>,
}

impl Seen {
    /// The lines for `response`: a timestamped header with what changed, then each resource
    /// added or changed, and each removed one. A state-of-the-world response holds every
    /// resource of its type, so what it lacks was removed.
    fn update(&mut self, kind: Kind, response: &DiscoveryResponse, now: SystemTime) -> Vec<String> {
        let mut current = BTreeMap::new();
        for any in &response.resources {
            let bytes = any.value.as_slice();
            let name = describe::name(kind, bytes).unwrap_or_else(|| "?".into());
            current.insert(name, describe::detail(kind, bytes));
        }
        let before = self.by_kind.entry(kind.short()).or_default();
        let added: Vec<&String> = current
            .keys()
            .filter(|n| !before.contains_key(*n))
            .collect();
        let changed: Vec<&String> = current
            .iter()
            .filter(|(n, d)| before.get(*n).is_some_and(|old| old != *d))
            .map(|(n, _)| n)
            .collect();
        let removed: Vec<String> = before
            .keys()
            .filter(|n| !current.contains_key(*n))
            .cloned()
            .collect();
        let mut lines = vec![format!(
            "{} {} version {}: {} resource(s); {} added, {} changed, {} removed",
            clock(now),
            kind.short(),
            response.version_info,
            current.len(),
            added.len(),
            changed.len(),
            removed.len()
        )];
        for name in added.iter().chain(&changed) {
            let mark = if before.contains_key(*name) { "~" } else { "+" };
            lines.extend(resource_lines(kind, mark, name, &current[*name]));
        }
        lines.extend(removed.iter().map(|n| format!("  - {n}")));
        *before = current;
        lines
    }
}

/// `HH:MM:SS.mmm` UTC: when an update came, to line it up with meridian's log.
fn clock(now: SystemTime) -> String {
    let since = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let day = since.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        day / 3600,
        day / 60 % 60,
        day % 60,
        since.subsec_millis()
    )
}

/// One resource as lines: its name (marked `+` new, `~` changed, or ` ` in a dump), then
/// for endpoints one line per locality with each endpoint's address (IPv6 bracketed), and
/// its health and route when they are not the plain case.
pub fn resource_lines(
    kind: Kind,
    mark: &str,
    name: &str,
    detail: &serde_json::Value,
) -> Vec<String> {
    let mut lines = vec![format!("  {mark} {name}{}", cluster_note(kind, detail))];
    if kind != Kind::Endpoint {
        return lines;
    }
    for l in detail["localities"].as_array().into_iter().flatten() {
        let endpoints: Vec<String> = l["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .map(endpoint_text)
            .collect();
        let place = [&l["region"], &l["zone"]]
            .iter()
            .filter_map(|v| v.as_str().filter(|s| !s.is_empty()))
            .collect::<Vec<_>>()
            .join("/");
        lines.push(format!(
            "      priority {} {} ({place}) weight {}: {}",
            l["priority"],
            l["cluster"].as_str().unwrap_or(""),
            l["weight"],
            if endpoints.is_empty() {
                "no endpoints".into()
            } else {
                endpoints.join(" ")
            }
        ));
    }
    lines
}

fn cluster_note(kind: Kind, detail: &serde_json::Value) -> &'static str {
    let through_gateway = detail["transportSocketMatches"]
        .as_array()
        .is_some_and(|m| !m.is_empty());
    match kind {
        Kind::Cluster if through_gateway => " (some endpoints through an east-west gateway)",
        _ => "",
    }
}

fn endpoint_text(e: &serde_json::Value) -> String {
    let mut text = e["address"].as_str().unwrap_or("?").to_owned();
    let mut notes = Vec::new();
    if e["viaGateway"] == true {
        notes.push("gateway".to_owned());
    }
    match e["health"].as_str() {
        Some("HEALTHY") | None => {}
        Some(health) => notes.push(health.to_ascii_lowercase()),
    }
    if !notes.is_empty() {
        text.push_str(&format!(" ({})", notes.join(", ")));
    }
    text
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use xds_api::pb::envoy::config::core::v3::address;
    use xds_api::pb::envoy::config::endpoint::v3::lb_endpoint;

    use super::*;

    #[test]
    fn endpoints_show_their_health_the_gateway_and_ipv6_in_brackets() {
        let detail = json!({"localities": [{
            "priority": 1, "weight": 2, "region": "eu", "zone": "eu-2a", "cluster": "eu-2",
            "endpoints": [
                {"address": "127.1.2.21:8080", "health": "HEALTHY", "viaGateway": false},
                {"address": "[fd00::21]:8080", "health": "DRAINING", "viaGateway": false},
                {"address": "10.9.0.1:15443", "health": "HEALTHY", "viaGateway": true},
            ],
        }]});
        assert_eq!(
            resource_lines(Kind::Endpoint, "+", "payments.shop.global:8080", &detail),
            [
                "  + payments.shop.global:8080",
                "      priority 1 eu-2 (eu/eu-2a) weight 2: 127.1.2.21:8080 [fd00::21]:8080 (draining) 10.9.0.1:15443 (gateway)",
            ]
        );
    }

    #[test]
    fn an_update_says_what_it_added_changed_and_removed() {
        let assignment = |name: &str, address: &str| {
            let cla = xds_api::pb::envoy::config::endpoint::v3::ClusterLoadAssignment {
                cluster_name: name.into(),
                endpoints: vec![
                    xds_api::pb::envoy::config::endpoint::v3::LocalityLbEndpoints {
                        lb_endpoints: vec![xds_api::pb::envoy::config::endpoint::v3::LbEndpoint {
                            host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(
                                xds_api::pb::envoy::config::endpoint::v3::Endpoint {
                                    address: Some(xds_api::pb::envoy::config::core::v3::Address {
                                        address: Some(address::Address::SocketAddress(
                                            xds_api::pb::envoy::config::core::v3::SocketAddress {
                                                address: address.into(),
                                                ..Default::default()
                                            },
                                        )),
                                    }),
                                    ..Default::default()
                                },
                            )),
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                ],
                ..Default::default()
            };
            xds_api::pb::google::protobuf::Any {
                type_url: Kind::Endpoint.type_url().into(),
                value: cla.encode_to_vec(),
            }
        };
        let response = |version: &str, resources| DiscoveryResponse {
            version_info: version.into(),
            resources,
            ..Default::default()
        };
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(3_723_004);
        let mut seen = Seen::default();
        let first = seen.update(
            Kind::Endpoint,
            &response(
                "1",
                vec![assignment("a", "10.0.0.1"), assignment("b", "10.0.0.2")],
            ),
            at,
        );
        assert_eq!(
            first[0],
            "01:02:03.004 EDS version 1: 2 resource(s); 2 added, 0 changed, 0 removed"
        );
        let next = seen.update(
            Kind::Endpoint,
            &response(
                "2",
                vec![assignment("b", "10.0.0.3"), assignment("c", "10.0.0.4")],
            ),
            at,
        );
        assert_eq!(
            next[0],
            "01:02:03.004 EDS version 2: 2 resource(s); 1 added, 1 changed, 1 removed"
        );
        let names: Vec<&str> = next
            .iter()
            .filter(|l| l.starts_with("  "))
            .filter(|l| !l.starts_with("      "))
            .map(String::as_str)
            .collect();
        assert_eq!(names, ["  + c", "  ~ b", "  - a"]);
    }
}
