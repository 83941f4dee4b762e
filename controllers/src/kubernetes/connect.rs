//! Kubernetes clients for the hub and the members: from a kubeconfig file (exec credential
//! plugins included, as kube-rs runs them), a kubeconfig held in a Secret on the hub, or the
//! in-cluster service account. Every client has bounded timeouts, so a silently stalled watch
//! ends in an error (and a restart) instead of hanging.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use kube::config::{InClusterError, KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Api, Client, Config};

use crate::convert::{Credentials, KubeAccess};

/// The server-side bound of one watch request (`timeoutSeconds`), after which it is re-opened.
/// A read that sees no byte for a third longer (plus a second) fails: longer than a quiet
/// watch lasts, so only a stalled connection hits it, and the watch starts over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchTimeout(pub u32);

impl Default for WatchTimeout {
    fn default() -> Self {
        Self(30)
    }
}

impl WatchTimeout {
    pub fn read_timeout(self) -> Duration {
        Duration::from_secs(u64::from(self.0) + u64::from(self.0) / 3 + 1)
    }
}
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read kubeconfig {}", path.display())]
    ReadKubeconfig {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    #[error("in-cluster config")]
    InCluster(#[source] InClusterError),
    #[error("spec.source.kubernetes.secretRef needs a Kubernetes hub (this hub is a directory)")]
    SecretNeedsKubernetesHub,
    #[error("cannot read Secret {namespace}/{name} on the hub")]
    ReadSecret {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("Secret {namespace}/{name} has no key {key:?}")]
    SecretKeyMissing {
        namespace: String,
        name: String,
        key: String,
    },
    #[error("Secret {namespace}/{name} key {key:?} is not UTF-8")]
    SecretNotUtf8 {
        namespace: String,
        name: String,
        key: String,
        #[source]
        source: std::str::Utf8Error,
    },
    #[error("Secret {namespace}/{name} key {key:?} is not a kubeconfig")]
    SecretNotKubeconfig {
        namespace: String,
        name: String,
        key: String,
        #[source]
        source: KubeconfigError,
    },
    #[error("kubeconfig")]
    Kubeconfig(#[source] KubeconfigError),
    #[error("apiEndpoint {endpoint:?}")]
    ApiEndpoint {
        endpoint: String,
        #[source]
        source: http::uri::InvalidUri,
    },
    #[error("cannot build a client")]
    Client(#[source] kube::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A cluster's client, and what its fenced writer client is built from.
#[derive(Clone)]
pub struct Connected {
    pub client: Client,
    pub writer: Writer,
}

/// What a cluster's fenced writer client is made from, once the Leadership that fences it is
/// known: the config its client was made from (`fence::writer`), or an agent member's tunnel.
#[derive(Clone)]
pub struct Writer(WriterKind);

#[derive(Clone)]
enum WriterKind {
    Config(std::sync::Arc<Config>),
    Agent(super::tunnel::Tunnel),
}

impl Writer {
    /// An agent member's writer: its tunnel, fenced.
    pub fn agent(tunnel: super::tunnel::Tunnel) -> Self {
        Self(WriterKind::Agent(tunnel))
    }

    /// A client for writes only, whose connections carry nothing once `leadership` lapses.
    pub fn client(&self, leadership: &super::leader::Leadership) -> Result<Client> {
        match &self.0 {
            WriterKind::Config(config) => {
                super::fence::writer(config, leadership.clone()).map_err(Error::Client)
            }
            WriterKind::Agent(tunnel) => Ok(tunnel.fenced(leadership.clone()).client()),
        }
    }
}

impl Writer {
    /// The API server this writer reaches and the CA (PEM) it trusts there; None for an agent
    /// member (the hub dials no API of its own for it).
    pub fn server(&self) -> Option<(String, Option<Vec<u8>>)> {
        let WriterKind::Config(config) = &self.0 else {
            return None;
        };
        let pem = config.root_cert.as_ref().map(|ders| {
            let mut pem = Vec::new();
            for der in ders {
                pem.extend_from_slice(b"-----BEGIN CERTIFICATE-----\n");
                let text = base64::engine::general_purpose::STANDARD.encode(der);
                for line in text.as_bytes().chunks(64) {
                    pem.extend_from_slice(line);
                    pem.push(b'\n');
                }
                pem.extend_from_slice(b"-----END CERTIFICATE-----\n");
            }
            pem
        });
        Some((
            config
                .cluster_url
                .to_string()
                .trim_end_matches('/')
                .to_owned(),
            pem,
        ))
    }
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            WriterKind::Config(config) => {
                f.debug_tuple("Writer").field(&config.cluster_url).finish()
            }
            WriterKind::Agent(tunnel) => f.debug_tuple("Writer").field(tunnel).finish(),
        }
    }
}

/// A client from a kubeconfig file (its current context unless `context`).
pub async fn from_kubeconfig(path: &Path, context: Option<&str>) -> Result<Connected> {
    from_parsed(
        read_kubeconfig(path)?,
        context,
        None,
        WatchTimeout::default(),
    )
    .await
}

/// The in-cluster service account's client (`KUBERNETES_SERVICE_HOST`).
pub fn in_cluster() -> Result<Connected> {
    let config = Config::incluster().map_err(Error::InCluster)?;
    client(config, WatchTimeout::default())
}

/// A member's client, as its MemberCluster says; `hub` reads Secrets.
pub async fn member_client(
    access: &KubeAccess,
    hub: Option<&Client>,
    timeout: WatchTimeout,
) -> Result<Connected> {
    let endpoint = access.api_endpoint.as_deref();
    match &access.credentials {
        Credentials::Kubeconfig { path, context } => {
            from_parsed(
                read_kubeconfig(path)?,
                context.as_deref(),
                endpoint,
                timeout,
            )
            .await
        }
        Credentials::Secret {
            namespace,
            name,
            key,
        } => {
            let hub = hub.ok_or(Error::SecretNeedsKubernetesHub)?;
            let kubeconfig = kubeconfig_in_secret(hub, namespace, name, key).await?;
            from_parsed(kubeconfig, None, endpoint, timeout).await
        }
    }
}

fn read_kubeconfig(path: &Path) -> Result<Kubeconfig> {
    Kubeconfig::read_from(path).map_err(|source| Error::ReadKubeconfig {
        path: path.to_path_buf(),
        source,
    })
}

/// The kubeconfig held under `key` of the hub's Secret `namespace/name`.
async fn kubeconfig_in_secret(
    hub: &Client,
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<Kubeconfig> {
    let secret = Api::<Secret>::namespaced(hub.clone(), namespace)
        .get(name)
        .await
        .map_err(|source| Error::ReadSecret {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            source,
        })?;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .ok_or_else(|| Error::SecretKeyMissing {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            key: key.to_owned(),
        })?;
    let text = std::str::from_utf8(&bytes.0).map_err(|source| Error::SecretNotUtf8 {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        key: key.to_owned(),
        source,
    })?;
    Kubeconfig::from_yaml(text).map_err(|source| Error::SecretNotKubeconfig {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        key: key.to_owned(),
        source,
    })
}

async fn from_parsed(
    kubeconfig: Kubeconfig,
    context: Option<&str>,
    endpoint: Option<&str>,
    timeout: WatchTimeout,
) -> Result<Connected> {
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..KubeConfigOptions::default()
    };
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(Error::Kubeconfig)?;
    if let Some(endpoint) = endpoint {
        config.cluster_url = endpoint.parse().map_err(|source| Error::ApiEndpoint {
            endpoint: endpoint.to_owned(),
            source,
        })?;
    }
    client(config, timeout)
}

fn client(mut config: Config, timeout: WatchTimeout) -> Result<Connected> {
    // So audit logs tell meridian's requests apart.
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(concat!("meridian/", env!("CARGO_PKG_VERSION"))),
    ));
    config.read_timeout = Some(timeout.read_timeout());
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.write_timeout = Some(CONNECT_TIMEOUT);
    let client = super::transport::client(&config).map_err(Error::Client)?;
    Ok(Connected {
        client,
        writer: Writer(WriterKind::Config(std::sync::Arc::new(config))),
    })
}

/// The back-off of the hub's own watches (its kinds and the templates' kinds): 0.5 s doubling
/// to at most 5 s, reset after 30 s without an error. kube's default (client-go's: 0.8 s
/// doubling to 30 s, reset after two minutes) left a hub that had been down for ten seconds
/// unwatched for up to half a minute after it was back, and longer when it had failed within
/// the two minutes before: edits waited. A hub is one API server, so retrying it every few
/// seconds costs little.
pub(crate) fn hub_backoff()
-> kube::runtime::utils::ResetTimerBackoff<kube::runtime::watcher::ExponentialBackoff> {
    let exponential = backon::ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(500))
        .with_max_delay(std::time::Duration::from_secs(5))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    kube::runtime::utils::ResetTimerBackoff::new(
        exponential.into(),
        std::time::Duration::from_secs(30),
    )
}
