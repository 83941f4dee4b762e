//! Kubernetes clients for the hub and the members: from a kubeconfig file (exec credential
//! plugins included, as kube-rs runs them), a kubeconfig held in a Secret on the hub, or the
//! in-cluster service account. Every client has bounded timeouts, so a silently stalled watch
//! ends in an error (and a restart) instead of hanging.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::config::{KubeConfigOptions, Kubeconfig};
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

/// A client from a kubeconfig file (its current context unless `context`).
pub async fn from_kubeconfig(path: &Path, context: Option<&str>) -> Result<Client, String> {
    let kubeconfig = Kubeconfig::read_from(path)
        .map_err(|e| format!("cannot read kubeconfig {}: {e}", path.display()))?;
    from_parsed(kubeconfig, context, None, WatchTimeout::default()).await
}

/// The in-cluster service account's client (`KUBERNETES_SERVICE_HOST`).
pub fn in_cluster() -> Result<Client, String> {
    let config = Config::incluster().map_err(|e| format!("in-cluster config: {e}"))?;
    client(config, WatchTimeout::default())
}

/// A member's client, as its MemberCluster says; `hub` reads Secrets.
pub async fn member_client(
    access: &KubeAccess,
    hub: Option<&Client>,
    timeout: WatchTimeout,
) -> Result<Client, String> {
    let endpoint = access.api_endpoint.as_deref();
    match &access.credentials {
        Credentials::Kubeconfig { path, context } => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| format!("cannot read kubeconfig {}: {e}", path.display()))?;
            from_parsed(kubeconfig, context.as_deref(), endpoint, timeout).await
        }
        Credentials::Secret {
            namespace,
            name,
            key,
        } => {
            let hub = hub.ok_or(
                "spec.source.kubernetes.secretRef needs a Kubernetes hub (this hub is a directory)",
            )?;
            let secret = Api::<Secret>::namespaced(hub.clone(), namespace)
                .get(name)
                .await
                .map_err(|e| format!("cannot read Secret {namespace}/{name} on the hub: {e}"))?;
            let bytes = secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .ok_or_else(|| format!("Secret {namespace}/{name} has no key {key:?}"))?;
            let text = std::str::from_utf8(&bytes.0)
                .map_err(|_| format!("Secret {namespace}/{name} key {key:?} is not UTF-8"))?;
            let kubeconfig = Kubeconfig::from_yaml(text).map_err(|e| {
                format!("Secret {namespace}/{name} key {key:?} is not a kubeconfig: {e}")
            })?;
            from_parsed(kubeconfig, None, endpoint, timeout).await
        }
    }
}

async fn from_parsed(
    kubeconfig: Kubeconfig,
    context: Option<&str>,
    endpoint: Option<&str>,
    timeout: WatchTimeout,
) -> Result<Client, String> {
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..KubeConfigOptions::default()
    };
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(|e| format!("kubeconfig: {e}"))?;
    if let Some(endpoint) = endpoint {
        config.cluster_url = endpoint
            .parse()
            .map_err(|e| format!("apiEndpoint {endpoint:?}: {e}"))?;
    }
    client(config, timeout)
}

fn client(mut config: Config, timeout: WatchTimeout) -> Result<Client, String> {
    // So audit logs tell meridian's requests apart.
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(concat!("meridian/", env!("CARGO_PKG_VERSION"))),
    ));
    config.read_timeout = Some(timeout.read_timeout());
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.write_timeout = Some(CONNECT_TIMEOUT);
    Client::try_from(config).map_err(|e| format!("cannot build a client: {e}"))
}
