//! The listener: TLS (HTTP/2 and HTTP/1.1 by ALPN), a bound on open connections, a deadline
//! for the TLS handshake, and the router with one fallback handler (every path is routed by
//! `path::route`, not by axum).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use crate::continues::{LIST_IDLE, LISTS_BYTES, Lists};
use crate::jwks::{Fetcher, KeyRing, keep_current};
use crate::merge::Rosters;
use crate::proxy::state::{GatewayView, Shared, Targets};
use crate::proxy::{ClientCert, handle};
use crate::{GatewayConfig, GatewayError, GatewayMetrics};

/// A client that has not finished the TLS handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A gateway ready to serve: its TLS settings and the issuer's keys read.
pub struct Gateway {
    acceptor: TlsAcceptor,
    keys: Arc<KeyRing>,
    fetcher: Fetcher,
    config: GatewayConfig,
}

impl Gateway {
    /// Reads the certificate, key and issuer keys (fetching them when the config names a
    /// URL): a gateway that cannot serve fails here, before anything listens.
    pub async fn new(config: GatewayConfig) -> Result<Self, GatewayError> {
        let acceptor = TlsAcceptor::from(Arc::new(server_tls(&config)?));
        let fetcher = Fetcher::new(config.jwks.clone())?;
        let keys = Arc::new(KeyRing::new(fetcher.keys().await?));
        Ok(Self {
            acceptor,
            keys,
            fetcher,
            config,
        })
    }

    /// Serves on `listener` until the task is dropped.
    pub async fn serve(
        self,
        listener: TcpListener,
        targets: Targets,
        metrics: GatewayMetrics,
        view: GatewayView,
        own_metrics: Arc<prometheus_client::registry::Registry>,
    ) {
        let Self {
            acceptor,
            keys,
            fetcher,
            config,
        } = self;
        let listen = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let held = keys.current().len();
        view.started(listen.clone(), &config.oidc.issuer, held);
        tracing::info!(%listen, issuer = %config.oidc.issuer, keys = held, jwks = %config.jwks, "federation API gateway listening");
        // Dropped with this task, as the gateway is.
        let _refreshing = AbortOnDrop(tokio::spawn(keep_current(
            keys.clone(),
            fetcher,
            config.jwks_refresh,
            metrics.clone(),
        )));
        let connections = Arc::new(Semaphore::new(config.max_connections));
        let shared = Arc::new(Shared {
            config,
            keys,
            targets,
            metrics,
            view,
            own_metrics,
            connections: connections.clone(),
            lists: Lists::new(LIST_IDLE, LISTS_BYTES),
            rosters: Rosters::default(),
        });
        let router = Router::new().fallback(handle).with_state(shared);
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "gateway accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(permit) = connections.clone().try_acquire_owned() else {
                tracing::warn!(%peer, "gateway connection refused: too many open");
                continue;
            };
            let acceptor = acceptor.clone();
            let router = router.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
                {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "gateway TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "gateway TLS handshake timed out");
                        return;
                    }
                };
                // The connection's client certificate (verified in the handshake) rides on
                // each of its requests.
                let presented = ClientCert(
                    tls.get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .map(|c| crate::cert::identity(c.as_ref())),
                );
                let service = hyper_util::service::TowerToHyperService::new(
                    router.layer(axum::Extension(presented)),
                );
                let builder = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                );
                if let Err(e) = builder
                    .serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(tls), service)
                    .await
                {
                    tracing::debug!(%peer, error = %e, "gateway connection ended");
                }
            });
        }
    }
}

/// Stops a task when its owner goes.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Client certificates are asked for, never required (bearer tokens stay an identity); one
/// presented must chain to `clientCA`, or the handshake fails.
fn client_verifier(
    config: &GatewayConfig,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, GatewayError> {
    let Some(path) = &config.client_ca else {
        return Ok(rustls::server::WebPkiClientVerifier::no_client_auth());
    };
    let pem = std::fs::read(path).map_err(|source| GatewayError::Read {
        what: "the client CA",
        path: path.clone(),
        source,
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()).filter_map(Result::ok) {
        roots.add(cert).map_err(GatewayError::Tls)?;
    }
    if roots.is_empty() {
        return Err(GatewayError::Missing {
            what: "PEM CA certificate",
            from: path.display().to_string(),
        });
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| GatewayError::ClientCa {
        path: path.clone(),
        reason: e.to_string(),
    })
}

fn server_tls(config: &GatewayConfig) -> Result<rustls::ServerConfig, GatewayError> {
    let read = |what, path: &std::path::Path| {
        std::fs::read(path).map_err(|source| GatewayError::Read {
            what,
            path: path.to_path_buf(),
            source,
        })
    };
    let certs: Vec<_> =
        rustls_pemfile::certs(&mut read("the certificate", &config.cert)?.as_slice())
            .filter_map(Result::ok)
            .collect();
    if certs.is_empty() {
        return Err(GatewayError::Missing {
            what: "PEM certificate",
            from: config.cert.display().to_string(),
        });
    }
    let key = rustls_pemfile::private_key(&mut read("the key", &config.key)?.as_slice())
        .ok()
        .flatten()
        .ok_or_else(|| GatewayError::Missing {
            what: "PEM private key",
            from: config.key.display().to_string(),
        })?;
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(GatewayError::Tls)?
    .with_client_cert_verifier(client_verifier(config)?)
    .with_single_cert(certs, key)
    .map_err(GatewayError::Tls)?;
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tls)
}
