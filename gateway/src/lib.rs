//! meridian's federation API gateway: one Kubernetes API for the fleet.
//!
//! ```text
//!  client (kubectl, client-go) ──HTTPS, HTTP/2──► gateway
//!    Authorization: Bearer <OIDC ID token> ─► token::verify ─► Identity   (401 before anything)
//!    or a client certificate of gateway.tls.clientCA ─► cert::identity (CN user, O groups)
//!    path::route:
//!      /clusters/<name>/<api path>  ─► that member's API server (meridian's credential)
//!      /clusters/*/<api path>       ─► every member, merged (merge: lists, named GETs, watches)
//!      anything else                ─► the hub's API server
//!    headers::forwarded: the client's identity headers stripped, the caller impersonated
//!      (Impersonate-User/-Group, the tenant as Impersonate-Extra and X-Tenant-ID): the
//!      member's RBAC decides, and its 403 passes through as its own Status
//! ```
//!
//! The pure parts — routes, tokens, header rules, composite resourceVersions, continue
//! tokens, merge order — are plain modules with plain tests; `proxy` and `watch` only move
//! bytes between the client and the members. Members come from the controllers' `kubernetes::Facts`
//! (their clients) and the core's snapshot (their health): an Unreachable member answers 503
//! at once, naming it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub mod cert;
mod continues;
pub mod headers;
pub mod jwks;
pub mod kubeconfig;
pub mod merge;
pub mod metrics;
pub mod path;
mod proxy;
pub mod scrape;
mod serve;
pub mod tenant;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod token;
mod trace;
mod watch;

pub use jwks::JwksSource;
pub use metrics::GatewayMetrics;
pub use proxy::state::{GatewayView, Targets};
pub use serve::Gateway;
pub use token::{Keys, OidcConfig};

/// The gateway's settings (`gateway` in meridian.yaml).
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Client certificates signed by these CAs (PEM) are an identity too (CN the user, O the
    /// groups); None: bearer tokens only.
    pub client_ca: Option<PathBuf>,
    pub oidc: OidcConfig,
    /// The issuer's JSON Web Key Set: a file or its `jwks_uri`.
    pub jwks: JwksSource,
    /// How often the key set is read again.
    pub jwks_refresh: Duration,
    /// Request bodies larger than this are refused (413).
    pub max_body_bytes: usize,
    /// The longest a member may take to answer a request that is not a watch.
    pub member_timeout: Duration,
    /// Open client connections at most.
    pub max_connections: usize,
}

/// Why the gateway cannot start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("cannot read {what} {path}")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{from} holds no {what}")]
    Missing { what: &'static str, from: String },
    #[error("the gateway's TLS settings")]
    Tls(#[source] rustls::Error),
    #[error("the client CA {path}: {reason}")]
    ClientCa { path: PathBuf, reason: String },
    #[error("the issuer's keys from {from}")]
    Keys {
        from: String,
        #[source]
        source: token::KeysError,
    },
    #[error("cannot fetch the issuer's keys from {url}: {reason}")]
    Fetch { url: String, reason: String },
}

/// The issuer's keys from the JWKS file the config names.
pub fn read_keys(path: &std::path::Path) -> Result<Arc<Keys>, GatewayError> {
    let bytes = std::fs::read(path).map_err(|source| GatewayError::Read {
        what: "the JWKS file",
        path: path.to_path_buf(),
        source,
    })?;
    parse_keys(&bytes, &JwksSource::File(path.to_path_buf()))
}

/// A key set read from `from`; one without a usable signing key is an error.
fn parse_keys(bytes: &[u8], from: &JwksSource) -> Result<Arc<Keys>, GatewayError> {
    let keys = Keys::from_jwks(bytes).map_err(|source| GatewayError::Keys {
        from: from.to_string(),
        source,
    })?;
    if keys.is_empty() {
        return Err(GatewayError::Missing {
            what: "RS256 or ES256 signing key",
            from: from.to_string(),
        });
    }
    Ok(Arc::new(keys))
}
