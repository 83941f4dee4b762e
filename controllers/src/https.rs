//! The HTTPS client meridian calls out with (scoring webhooks, the gateway's JWKS fetches):
//! rustls with ring, trusting a given CA bundle or else the system roots, and plain HTTP to
//! loopback for tests and sidecars.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

type Https = hyper_rustls::HttpsConnector<HttpConnector>;
/// The HTTPS client of webhook calls (and of the gateway's JWKS fetches).
pub type HttpsClient = Client<Https, Full<Bytes>>;

/// Why a client cannot be made from a CA bundle.
#[derive(Debug, thiserror::Error)]
pub enum HttpsClientError {
    #[error("caBundle is not PEM: {0}")]
    NotPem(#[source] std::io::Error),
    #[error("caBundle holds no certificate")]
    NoCertificate,
    #[error("caBundle certificate rejected: {0}")]
    Rejected(#[source] rustls::Error),
    #[error("TLS setup: {0}")]
    Tls(#[source] rustls::Error),
}

/// An HTTPS (and loopback HTTP) client trusting `ca_bundle`, else the system roots.
pub fn client_for(ca_bundle: Option<&str>) -> Result<HttpsClient, HttpsClientError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_bundle {
        Some(pem) => {
            let certs = rustls_pemfile::certs(&mut pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(HttpsClientError::NotPem)?;
            if certs.is_empty() {
                return Err(HttpsClientError::NoCertificate);
            }
            for cert in certs {
                roots.add(cert).map_err(HttpsClientError::Rejected)?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(HttpsClientError::Tls)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new()).build(https))
}
