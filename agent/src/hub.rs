//! The hub's agent listener: gRPC over TLS with the agent CA's serving certificate; a client
//! certificate of the agent CA is asked for (optional: `Join` has none yet, and `Connect` and
//! `Renew` refuse a call without one).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meridian_controllers::agents::AgentRoutes;
use meridian_controllers::kubernetes::AbortOnDrop;
use meridian_core::agent::Approval;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use crate::ca::CaError;
use crate::join::Joins;
use crate::metrics::AgentMetrics;
use crate::proto::AgentHubServer;
use crate::store::{HubStore, StoreError};
use crate::stream::{HubService, Streams};

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
    /// New agent streams admitted per second (and as many at once after a quiet second).
    pub admission_per_second: u32,
    /// Whether a valid bootstrap token signs at once or waits for `meridian approve`.
    pub approval: Approval,
}

/// Why the agent listener cannot start.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("the agent CA")]
    Store(#[from] StoreError),
    #[error("the hub's serving certificate")]
    Serving(#[from] CaError),
    #[error("cannot listen for agents on {0}")]
    Bind(SocketAddr, #[source] std::io::Error),
    #[error("the agent listener on {0}")]
    Serve(SocketAddr, #[source] tonic::transport::Error),
}

/// The listener, bound, with its CA and serving certificate: everything that can fail at
/// start has (a port in use or an unreadable CA stops meridian before it serves).
pub struct PreparedHub {
    listener: tokio::net::TcpListener,
    tls: ServerTlsConfig,
    hub: HubService<HubStore>,
    store: HubStore,
}

/// Reads (or makes) the agent CA, makes the serving certificate and binds `settings.listen`.
pub async fn prepare(
    settings: &HubSettings,
    store: HubStore,
    routes: AgentRoutes,
    metrics: AgentMetrics,
) -> Result<PreparedHub, HubError> {
    let ca = Arc::new(store.ca().await?);
    let (cert, key) = ca.serving(&settings.server_names, SERVING_LIFETIME, SystemTime::now())?;
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(cert, key))
        .client_ca_root(Certificate::from_pem(ca.cert_pem()))
        .client_auth_optional(true);
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|e| HubError::Bind(settings.listen, e))?;
    tracing::info!(listen = %settings.listen, names = ?settings.server_names, "agent listener");
    Ok(PreparedHub {
        listener,
        tls,
        hub: HubService {
            joins: Joins::new(
                ca,
                store.clone(),
                settings.certificate_lifetime,
                settings.approval,
                metrics.clone(),
            ),
            streams: Streams::new(routes, metrics, settings.admission_per_second),
        },
        store,
    })
}

impl PreparedHub {
    /// Where the CA and tokens are kept (the admin server shows joins waiting for approval).
    pub fn store(&self) -> HubStore {
        self.store.clone()
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves agents until the process ends (and deletes expired tokens now and then).
    pub async fn serve(self) -> Result<(), HubError> {
        let _sweeper = AbortOnDrop(tokio::spawn(sweep_expired_tokens(self.store.clone())));
        let addr = self
            .local_addr()
            .map_err(|e| HubError::Bind(([0, 0, 0, 0], 0).into(), e))?;
        Server::builder()
            .tls_config(self.tls)
            .map_err(|e| HubError::Serve(addr, e))?
            .http2_keepalive_interval(Some(KEEPALIVE))
            .http2_keepalive_timeout(Some(KEEPALIVE))
            .add_service(AgentHubServer::new(self.hub))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(
                self.listener,
            ))
            .await
            .map_err(|e| HubError::Serve(addr, e))
    }
}

/// How often expired bootstrap tokens are deleted.
const SWEEP: Duration = Duration::from_secs(600);

/// Deletes expired tokens every `SWEEP` (every replica may: a token another already deleted is
/// no error).
async fn sweep_expired_tokens(store: HubStore) {
    let mut tick = tokio::time::interval(SWEEP);
    loop {
        tick.tick().await;
        match store.delete_expired(SystemTime::now()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "expired bootstrap tokens deleted"),
            Err(e) => {
                tracing::warn!(error = %meridian_controllers::reason_of(&e), "cannot delete expired bootstrap tokens")
            }
        }
    }
}
