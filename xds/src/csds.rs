//! CSDS (`ClientStatusDiscoveryService`): what every connected client was sent, and whether
//! it ACKed or NACKed it.

use xds_api::pb::envoy::admin::v3::{ClientResourceStatus, UpdateFailureState};
use xds_api::pb::envoy::service::status::v3::client_config::GenericXdsConfig;
use xds_api::pb::envoy::service::status::v3::{
    ClientConfig, ClientStatusRequest, ClientStatusResponse, ConfigStatus,
};

use crate::resources::Kind;
use crate::stream::{StreamStatus, TypeStatus};

/// The CSDS answer over `streams`. A request naming a node (by id) narrows it to that node;
/// node matchers are not supported and return every client.
pub fn response(streams: &[StreamStatus], req: &ClientStatusRequest) -> ClientStatusResponse {
    let wanted = req
        .node
        .as_ref()
        .map(|n| n.id.as_str())
        .filter(|id| !id.is_empty());
    ClientStatusResponse {
        config: streams
            .iter()
            .filter(|s| wanted.is_none_or(|id| s.node.as_ref().is_some_and(|n| n.id == id)))
            .map(client_config)
            .collect(),
    }
}

fn client_config(stream: &StreamStatus) -> ClientConfig {
    let mut generic = Vec::new();
    for kind in Kind::ALL {
        if let Some(status) = stream.types.get(kind.short()) {
            generic.extend(type_configs(kind, status));
        }
    }
    ClientConfig {
        node: stream.node.as_ref().map(|n| n.raw.clone()),
        generic_xds_configs: generic,
        ..Default::default()
    }
}

fn type_configs(kind: Kind, status: &TypeStatus) -> Vec<GenericXdsConfig> {
    let acked = status.acked_version.is_some() && status.acked_version == status.sent_version;
    let nacked = !acked && status.last_error.is_some();
    let (client_status, config_status) = if acked {
        (ClientResourceStatus::Acked, ConfigStatus::Synced)
    } else if nacked {
        (ClientResourceStatus::Nacked, ConfigStatus::Error)
    } else {
        (ClientResourceStatus::Requested, ConfigStatus::NotSent)
    };
    let error_state = nacked.then(|| UpdateFailureState {
        details: status.last_error.clone().unwrap_or_default(),
        version_info: status.sent_version.clone().unwrap_or_default(),
        ..Default::default()
    });
    let mut configs: Vec<GenericXdsConfig> = status
        .sent
        .iter()
        .map(|(name, version)| GenericXdsConfig {
            type_url: kind.type_url().to_owned(),
            name: name.clone(),
            version_info: version.clone(),
            config_status: config_status as i32,
            client_status: client_status as i32,
            error_state: error_state.clone(),
            ..Default::default()
        })
        .collect();
    // Subscribed names that were never sent do not exist (or wait for the first sync).
    configs.extend(
        status
            .names
            .iter()
            .filter(|n| !status.sent.contains_key(*n))
            .map(|name| GenericXdsConfig {
                type_url: kind.type_url().to_owned(),
                name: name.clone(),
                client_status: ClientResourceStatus::DoesNotExist as i32,
                config_status: ConfigStatus::NotSent as i32,
                ..Default::default()
            }),
    );
    configs
}
