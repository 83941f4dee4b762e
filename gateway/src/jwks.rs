//! The issuer's keys, kept current. They come from a file or from the issuer's `jwks_uri`
//! (HTTPS), read at start — a gateway that gets no key does not start — and again every
//! refresh interval, and early (at most once per [`EARLIEST_AGAIN`]) when a token names a key
//! the gateway does not hold: an issuer rotating its keys publishes the new one before it
//! signs with it. A failed refresh keeps the keys held, and says so in the log and a metric.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use meridian_controllers::https::{HttpsClient, client_for};
use parking_lot::RwLock;
use tokio::sync::Notify;

use crate::metrics::{GatewayMetrics, ResultLabels};
use crate::token::Keys;
use crate::{GatewayError, read_keys};

/// A refresh asked for by an unknown key waits until this long after the last one.
pub const EARLIEST_AGAIN: Duration = Duration::from_secs(10);
/// A key set is a few kilobytes; an answer past this is not one.
const MAX_JWKS_BYTES: usize = 1024 * 1024;
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the issuer's JSON Web Key Set comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    File(PathBuf),
    /// The issuer's `jwks_uri`, trusting the CA certificates in `ca` (PEM), else the system's.
    Url {
        url: String,
        ca: Option<PathBuf>,
    },
}

impl std::fmt::Display for JwksSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JwksSource::File(path) => write!(f, "{}", path.display()),
            JwksSource::Url { url, .. } => f.write_str(url),
        }
    }
}

/// The keys every request verifies against, replaced whole by a refresh.
pub(crate) struct KeyRing {
    keys: RwLock<Arc<Keys>>,
    unknown_key: Notify,
}

impl KeyRing {
    pub(crate) fn new(keys: Arc<Keys>) -> Self {
        Self {
            keys: RwLock::new(keys),
            unknown_key: Notify::new(),
        }
    }

    pub(crate) fn current(&self) -> Arc<Keys> {
        self.keys.read().clone()
    }

    /// A token named a key not held: refresh soon (many such tokens, one refresh).
    pub(crate) fn unknown_key(&self) {
        self.unknown_key.notify_one();
    }
}

/// Reads or fetches the key set.
pub(crate) struct Fetcher {
    source: JwksSource,
    client: Option<HttpsClient>,
}

impl Fetcher {
    pub(crate) fn new(source: JwksSource) -> Result<Self, GatewayError> {
        let client = match &source {
            JwksSource::File(_) => None,
            JwksSource::Url { url, ca } => {
                let pem = ca
                    .as_ref()
                    .map(|path| {
                        std::fs::read_to_string(path).map_err(|source| GatewayError::Read {
                            what: "the JWKS CA",
                            path: path.clone(),
                            source,
                        })
                    })
                    .transpose()?;
                let client = client_for(pem.as_deref()).map_err(|e| GatewayError::Fetch {
                    url: url.clone(),
                    reason: e.to_string(),
                })?;
                Some(client)
            }
        };
        Ok(Self { source, client })
    }

    pub(crate) async fn keys(&self) -> Result<Arc<Keys>, GatewayError> {
        match (&self.source, &self.client) {
            (JwksSource::Url { url, .. }, Some(client)) => {
                let failed = |reason: String| GatewayError::Fetch {
                    url: url.clone(),
                    reason,
                };
                let bytes = tokio::time::timeout(FETCH_TIMEOUT, fetch(client, url))
                    .await
                    .map_err(|_| failed(format!("no answer within {} s", FETCH_TIMEOUT.as_secs())))?
                    .map_err(failed)?;
                crate::parse_keys(&bytes, &self.source)
            }
            (JwksSource::File(path), _) => read_keys(path),
            (JwksSource::Url { url, .. }, None) => Err(GatewayError::Fetch {
                url: url.clone(),
                reason: "no HTTPS client".into(),
            }),
        }
    }
}

async fn fetch(client: &HttpsClient, url: &str) -> Result<Bytes, String> {
    let request = http::Request::get(url)
        .header(http::header::ACCEPT, "application/json")
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let response = client.request(request).await.map_err(|e| e.to_string())?;
    let status = response.status();
    let body = Limited::new(response.into_body(), MAX_JWKS_BYTES)
        .collect()
        .await
        .map_err(|e| format!("reading the answer: {e}"))?
        .to_bytes();
    if !status.is_success() {
        return Err(format!("answered {}", status.as_u16()));
    }
    Ok(body)
}

/// Refreshes `ring` every `every`, and early when a token names an unknown key; runs until
/// the task is dropped.
pub(crate) async fn keep_current(
    ring: Arc<KeyRing>,
    fetcher: Fetcher,
    every: Duration,
    metrics: GatewayMetrics,
) {
    let mut last = Instant::now();
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = ring.unknown_key.notified() => {
                tokio::time::sleep(EARLIEST_AGAIN.saturating_sub(last.elapsed())).await;
            }
        }
        last = Instant::now();
        let result = match fetcher.keys().await {
            Ok(keys) => {
                tracing::debug!(source = %fetcher.source, keys = keys.len(), "issuer keys refreshed");
                *ring.keys.write() = keys;
                "ok"
            }
            Err(e) => {
                let held = ring.current().len();
                tracing::warn!(error = %e, held, "cannot refresh the issuer's keys; keeping the ones held");
                "failed"
            }
        };
        metrics
            .jwks_refreshes
            .get_or_create(&ResultLabels { result })
            .inc();
    }
}
