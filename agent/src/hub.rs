//! The hub's agent listener: gRPC over TLS with the agent CA's serving certificate; a client
//! certificate of the agent CA is asked for (optional: `Join` has none yet, and `Connect` and
//! `Renew` refuse a call without one).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meridian_controllers::agents::AgentRoutes;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use crate::ca::CaError;
use crate::join::Joins;
use crate::proto::AgentHubServer;
use crate::store::{HubStore, StoreError};
use crate::stream::{Hub, Streams};

/// The serving certificate is made at every start; agents trust the CA, not the certificate.
const SERVING_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// A silent connection is probed this often, and dropped when a probe goes unanswered as long.
const KEEPALIVE: Duration = Duration::from_secs(10);

/// How the hub's agent listener is set up.
#[derive(Debug, Clone, PartialEq)]
pub struct HubSettings {
    pub listen: SocketAddr,
    /// The names and addresses agents reach the hub by (the serving certificate's).
    pub server_names: Vec<String>,
    /// An agent certificate's lifetime.
    pub certificate_lifetime: Duration,
}

/// Why the agent listener cannot start.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("the agent CA")]
    Store(#[from] StoreError),
    #[error("the hub's serving certificate")]
    Serving(#[from] CaError),
    #[error("the agent listener on {0}")]
    Listen(SocketAddr, #[source] tonic::transport::Error),
}

/// Serves agents on `settings.listen` until the process ends.
pub async fn serve(
    settings: HubSettings,
    store: HubStore,
    routes: AgentRoutes,
) -> Result<(), HubError> {
    let ca = Arc::new(store.ca().await?);
    let (cert, key) = ca.serving(&settings.server_names, SERVING_LIFETIME, SystemTime::now())?;
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(cert, key))
        .client_ca_root(Certificate::from_pem(ca.cert_pem()))
        .client_auth_optional(true);
    let hub = Hub {
        joins: Joins::new(ca, store, settings.certificate_lifetime),
        streams: Streams { routes },
    };
    tracing::info!(listen = %settings.listen, names = ?settings.server_names, "agent listener");
    Server::builder()
        .tls_config(tls)
        .map_err(|e| HubError::Listen(settings.listen, e))?
        .http2_keepalive_interval(Some(KEEPALIVE))
        .http2_keepalive_timeout(Some(KEEPALIVE))
        .add_service(AgentHubServer::new(hub))
        .serve(settings.listen)
        .await
        .map_err(|e| HubError::Listen(settings.listen, e))
}
