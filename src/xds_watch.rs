//! `meridian xds watch`: a real ADS client. It says who it is as a node of a cluster (the
//! same node metadata a proxy or a proxyless gRPC client sends), subscribes to every cluster
//! (CDS) and then to the endpoints of each (EDS), ACKs every response, and prints what it was
//! sent as it comes — the quickest way to see, live, what meridian sends a node.

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use meridian_xds::Kind;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use xds_api::pb::envoy::config::cluster::v3::Cluster;
use xds_api::pb::envoy::config::core::v3::{Node, address};
use xds_api::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};
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
    let mut updates = 0;
    while let Some(response) = responses.message().await.context("the xDS stream failed")? {
        let names = match Kind::from_type_url(&response.type_url) {
            Some(Kind::Cluster) => {
                let clusters = print_clusters(&response)?;
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
            Some(Kind::Endpoint) => {
                print_endpoints(&response)?;
                endpoints_of.clone()
            }
            _ => {
                outln!("{} version {}", response.type_url, response.version_info);
                Vec::new()
            }
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

/// Prints the clusters; returns the names their endpoints are asked for by.
fn print_clusters(response: &DiscoveryResponse) -> Result<Vec<String>> {
    outln!(
        "CDS version {}: {} clusters",
        response.version_info,
        response.resources.len()
    );
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
        outln!("  {}", cluster.name);
        names.push(eds_name);
    }
    names.sort();
    names.dedup();
    Ok(names)
}

fn print_endpoints(response: &DiscoveryResponse) -> Result<()> {
    outln!(
        "EDS version {}: {} assignments",
        response.version_info,
        response.resources.len()
    );
    for any in &response.resources {
        let cla = ClusterLoadAssignment::decode(any.value.as_slice())
            .context("a ClusterLoadAssignment that does not decode")?;
        outln!("  {}", cla.cluster_name);
        for l in &cla.endpoints {
            let cluster = l.locality.as_ref().map_or("", |l| l.sub_zone.as_str());
            let weight = l.load_balancing_weight.as_ref().map_or(0, |w| w.value);
            let addresses: Vec<String> = l
                .lb_endpoints
                .iter()
                .filter_map(|e| match &e.host_identifier {
                    Some(lb_endpoint::HostIdentifier::Endpoint(ep)) => ep.address.as_ref(),
                    _ => None,
                })
                .filter_map(|a| match &a.address {
                    Some(address::Address::SocketAddress(s)) => Some(format!(
                        "{}:{}",
                        s.address,
                        match s.port_specifier {
                            Some(
                                xds_api::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(p),
                            ) => p,
                            _ => 0,
                        }
                    )),
                    _ => None,
                })
                .collect();
            outln!(
                "    priority {} {cluster} weight {weight}: {}",
                l.priority,
                addresses.join(" ")
            );
        }
    }
    Ok(())
}
