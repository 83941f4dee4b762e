//! Who is asking: the node identity sent on a stream's first message.

use std::fmt;

use serde::Serialize;
use xds_api::pb::envoy::config::core::v3::Node;
use xds_api::pb::google::protobuf::value::Kind;

/// What a node does with the feed, which decides the resources it receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Envoy in front of an application: every service, remote networks through gateways.
    Envoy,
    /// A gRPC client with xDS built in: ApiListeners, same-network endpoints only (it cannot
    /// send the SNI a gateway routes by).
    Proxyless,
    /// An east-west gateway: SNI passthrough to its own cluster's endpoints.
    EastWestGateway,
}

/// The parts of a node that decide what it receives. Nodes with equal groups receive
/// byte-identical resources, which is what the encoding cache is keyed by.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Group {
    /// `metadata.CLUSTER_ID`, else `locality.sub_zone`; None when the node says neither.
    pub cluster: Option<String>,
    /// `metadata.NETWORK`; None means "the network of its cluster".
    pub network: Option<String>,
    pub role: Role,
}

/// A node as the control plane sees it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    pub id: String,
    pub user_agent: String,
    pub group: Group,
    /// The node as sent, echoed in CSDS.
    #[serde(skip)]
    pub raw: Node,
}

pub const ROLE_EASTWEST_GATEWAY: &str = "eastwest-gateway";

impl NodeInfo {
    pub fn from_node(node: Node) -> Self {
        let cluster = metadata_string(&node, "CLUSTER_ID").or_else(|| {
            node.locality
                .as_ref()
                .map(|l| l.sub_zone.clone())
                .filter(|s| !s.is_empty())
        });
        let network = metadata_string(&node, "NETWORK");
        let role = if metadata_string(&node, "ROLE").as_deref() == Some(ROLE_EASTWEST_GATEWAY) {
            Role::EastWestGateway
        } else if is_grpc_user_agent(&node.user_agent_name) {
            Role::Proxyless
        } else {
            Role::Envoy
        };
        Self {
            id: node.id.clone(),
            user_agent: node.user_agent_name.clone(),
            group: Group {
                cluster,
                network,
                role,
            },
            raw: node,
        }
    }
}

/// gRPC libraries name themselves "gRPC Go", "gRPC C-core", "gRPC Java"; Envoy says "envoy".
fn is_grpc_user_agent(name: &str) -> bool {
    name.get(..4)
        .is_some_and(|p| p.eq_ignore_ascii_case("grpc"))
}

fn metadata_string(node: &Node, key: &str) -> Option<String> {
    let value = node.metadata.as_ref()?.fields.get(key)?;
    match value.kind.as_ref()? {
        Kind::StringValue(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cluster={} network={} role={:?}",
            self.cluster.as_deref().unwrap_or("-"),
            self.network.as_deref().unwrap_or("-"),
            self.role
        )
    }
}
