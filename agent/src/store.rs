//! Where the hub keeps the agent CA and the bootstrap tokens: files in a directory (a directory
//! hub's `agent.stateDir`) or Secrets in the hub namespace (a Kubernetes hub). Tokens are read
//! at every `Join`, so one made by `meridian token create` (another process, maybe another
//! machine) admits without a restart; a token is marked used before its certificate leaves.
//!
//! ```text
//!  directory: <stateDir>/ca.crt, ca.key (0600)    tokens/<id>.json {cluster, secret, expires, used,
//!                                                      request_key, requested_unix, approved}
//!  Secrets:   meridian-agent-ca {tls.crt, tls.key}  meridian-agent-token-<id> (type meridian.io/agent-token)
//! ```
//!
//! A token changes by compare-and-swap (`TokenStore::replace`): of two replicas admitting one
//! token at once, one is refused.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::{Api, Client};
use meridian_core::ClusterId;
use meridian_core::agent::{BootstrapToken, KeyRequest, NothingToApprove, Tokens, new_token};
use serde::{Deserialize, Serialize};

use crate::ca::{AgentCa, CaError};

/// The Secret type and label of a bootstrap token on a Kubernetes hub.
pub const TOKEN_SECRET_TYPE: &str = "meridian.io/agent-token";
const TOKEN_LABEL: &str = "meridian.io/agent-token";
const TOKEN_SECRET_PREFIX: &str = "meridian-agent-token-";
/// The Secret holding the agent CA on a Kubernetes hub.
pub const CA_SECRET: &str = "meridian-agent-ca";

/// Why the hub's agent state (or an agent's own, `state`) cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}")]
    Kube {
        what: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("{what} is not a bootstrap token meridian wrote: {why}")]
    Invalid { what: String, why: String },
    #[error("the agent CA in {what}")]
    Ca {
        what: String,
        #[source]
        source: CaError,
    },
    #[error("bootstrap token {0:?} was changed by another join at the same time")]
    Raced(String),
    #[error(transparent)]
    NothingToApprove(#[from] NothingToApprove),
    #[error("the system's random number generator failed")]
    Random,
}

/// What `Join` needs of the store (the hub's, or the tests' memory).
#[tonic::async_trait]
pub trait TokenStore: Send + Sync + 'static {
    /// Every token, used and expired ones included.
    async fn tokens(&self) -> Result<Tokens, StoreError>;
    /// The token `id` (of the form `token_id` checked), if there is one: what a join reads, so
    /// that a join costs the same with a thousand tokens kept.
    async fn token(&self, id: &str) -> Result<Option<BootstrapToken>, StoreError>;
    /// Replaces the token `before` (as read) by `after`, only if it is still as read; an error
    /// refuses the join (a token that could not be marked used must not admit a second agent
    /// after a restart).
    async fn replace(
        &self,
        before: &BootstrapToken,
        after: &BootstrapToken,
    ) -> Result<(), StoreError>;
}

/// The hub's agent state.
#[derive(Clone)]
pub enum HubStore {
    Directory(PathBuf),
    Secrets { client: Client, namespace: String },
}

/// A token as a file keeps it.
#[derive(Serialize, Deserialize)]
struct TokenFile {
    cluster: String,
    secret: String,
    expires_unix: u64,
    #[serde(default)]
    used: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    request_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    requested_unix: Option<u64>,
    #[serde(default)]
    approved: bool,
}

impl HubStore {
    /// The agent CA, made and kept on first use.
    pub async fn ca(&self) -> Result<AgentCa, StoreError> {
        match self {
            HubStore::Directory(dir) => directory_ca(dir),
            HubStore::Secrets { client, namespace } => secret_ca(client, namespace).await,
        }
    }

    /// Makes and keeps a new token for `cluster`, valid until `expires`.
    pub async fn new_token(
        &self,
        cluster: ClusterId,
        expires: SystemTime,
    ) -> Result<BootstrapToken, StoreError> {
        let mut random = [0u8; 22];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut random)
            .map_err(|_| StoreError::Random)?;
        let token = new_token(cluster, expires, &random);
        self.create(&token).await?;
        Ok(token)
    }

    async fn create(&self, token: &BootstrapToken) -> Result<(), StoreError> {
        match self {
            HubStore::Directory(dir) => {
                let dir = dir.join("tokens");
                std::fs::create_dir_all(&dir).map_err(|source| io(&dir, source))?;
                write_kept(&dir.join(format!("{}.json", token.id)), &token_file(token))
            }
            HubStore::Secrets { client, namespace } => {
                let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
                api.create(&PostParams::default(), &token_secret(token))
                    .await
                    .map(drop)
                    .map_err(|e| {
                        kube_error(format!("creating Secret {}", secret_name(&token.id)), e)
                    })
            }
        }
    }

    /// Approves the joins of `cluster` waiting for it (`meridian approve`); returns them.
    pub async fn approve(&self, cluster: &ClusterId) -> Result<Vec<BootstrapToken>, StoreError> {
        let read = self.tokens().await?;
        let mut tokens = read.clone();
        let approved = tokens.approve(cluster, SystemTime::now())?;
        for after in &approved {
            let before = read.get(&after.id).unwrap_or(after);
            self.replace(before, after).await?;
        }
        Ok(approved)
    }

    /// Deletes tokens past their expiry (used or not); returns how many.
    pub async fn delete_expired(&self, now: SystemTime) -> Result<usize, StoreError> {
        let tokens = self.tokens().await?;
        let expired: Vec<String> = tokens.expired(now).map(|t| t.id.clone()).collect();
        for id in &expired {
            match self {
                HubStore::Directory(dir) => {
                    let path = dir.join("tokens").join(format!("{id}.json"));
                    std::fs::remove_file(&path).map_err(|source| io(&path, source))?;
                }
                HubStore::Secrets { client, namespace } => {
                    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
                    api.delete(&secret_name(id), &Default::default())
                        .await
                        .map_err(|e| {
                            kube_error(format!("deleting Secret {}", secret_name(id)), e)
                        })?;
                }
            }
        }
        Ok(expired.len())
    }
}

#[tonic::async_trait]
impl TokenStore for HubStore {
    async fn tokens(&self) -> Result<Tokens, StoreError> {
        match self {
            HubStore::Directory(dir) => directory_tokens(&dir.join("tokens")),
            HubStore::Secrets { client, namespace } => {
                let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
                let list = api
                    .list(&ListParams::default().labels(&format!("{TOKEN_LABEL}=true")))
                    .await
                    .map_err(|e| kube_error("listing the bootstrap token Secrets".into(), e))?;
                let tokens: Result<Vec<BootstrapToken>, StoreError> =
                    list.items.iter().map(token_of_secret).collect();
                Ok(Tokens::new(tokens?))
            }
        }
    }

    async fn token(&self, id: &str) -> Result<Option<BootstrapToken>, StoreError> {
        match self {
            HubStore::Directory(dir) => directory_token(&dir.join("tokens"), id),
            HubStore::Secrets { client, namespace } => {
                let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
                let name = secret_name(id);
                let secret = api
                    .get_opt(&name)
                    .await
                    .map_err(|e| kube_error(format!("reading Secret {name}"), e))?;
                secret
                    .filter(|s| s.type_.as_deref() == Some(TOKEN_SECRET_TYPE))
                    .map(|s| token_of_secret(&s))
                    .transpose()
            }
        }
    }

    async fn replace(
        &self,
        before: &BootstrapToken,
        after: &BootstrapToken,
    ) -> Result<(), StoreError> {
        match self {
            HubStore::Directory(dir) => {
                // One process changes a directory hub's tokens at a time (the hub's joins are
                // serial); the check still catches a `meridian approve` between read and write.
                let tokens = dir.join("tokens");
                if directory_token(&tokens, &after.id)?.as_ref() != Some(before) {
                    return Err(StoreError::Raced(after.id.clone()));
                }
                write_kept(
                    &tokens.join(format!("{}.json", after.id)),
                    &token_file(after),
                )
            }
            HubStore::Secrets { client, namespace } => {
                // Replaced at the version read: of two replicas changing one token at once,
                // one write fails, and its join is refused.
                let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
                let name = secret_name(&after.id);
                let current = api
                    .get(&name)
                    .await
                    .map_err(|e| kube_error(format!("reading Secret {name}"), e))?;
                if &token_of_secret(&current)? != before {
                    return Err(StoreError::Raced(after.id.clone()));
                }
                let mut next = token_secret(after);
                next.metadata.resource_version = current.metadata.resource_version;
                match api.replace(&name, &PostParams::default(), &next).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(e)) if e.code == 409 => {
                        Err(StoreError::Raced(after.id.clone()))
                    }
                    Err(e) => Err(kube_error(format!("updating Secret {name}"), e)),
                }
            }
        }
    }
}

fn secret_name(id: &str) -> String {
    format!("{TOKEN_SECRET_PREFIX}{id}")
}

fn token_file(token: &BootstrapToken) -> Vec<u8> {
    let file = TokenFile {
        cluster: token.cluster.to_string(),
        secret: token.secret.clone(),
        expires_unix: unix(token.expires),
        used: token.used,
        request_key: token.request.as_ref().map(|r| r.key.clone()),
        requested_unix: token.request.as_ref().map(|r| unix(r.at)),
        approved: token.approved,
    };
    serde_json::to_vec_pretty(&file).unwrap_or_default()
}

fn token_secret(token: &BootstrapToken) -> Secret {
    let data = [
        ("token-id", token.id.clone()),
        ("token-secret", token.secret.clone()),
        ("cluster", token.cluster.to_string()),
        ("expires-unix", unix(token.expires).to_string()),
        ("used", token.used.to_string()),
        ("approved", token.approved.to_string()),
    ]
    .into_iter()
    .chain(token.request.iter().flat_map(|r| {
        [
            ("request-key", r.key.clone()),
            ("requested-unix", unix(r.at).to_string()),
        ]
    }))
    .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
    .collect();
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(&token.id)),
            labels: Some(BTreeMap::from([(TOKEN_LABEL.into(), "true".into())])),
            ..ObjectMeta::default()
        },
        type_: Some(TOKEN_SECRET_TYPE.into()),
        data: Some(data),
        ..Secret::default()
    }
}

fn token_of_secret(secret: &Secret) -> Result<BootstrapToken, StoreError> {
    let what = format!(
        "Secret {}",
        secret.metadata.name.as_deref().unwrap_or_default()
    );
    let field = |key: &str| -> Result<String, StoreError> {
        let value = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or_else(|| StoreError::Invalid {
                what: what.clone(),
                why: format!("no {key}"),
            })?;
        String::from_utf8(value.0.clone()).map_err(|_| StoreError::Invalid {
            what: what.clone(),
            why: format!("{key} is not text"),
        })
    };
    let seconds = |key: &str| -> Result<SystemTime, StoreError> {
        let n = field(key)?
            .parse::<u64>()
            .map_err(|_| StoreError::Invalid {
                what: what.clone(),
                why: format!("{key} is not a number"),
            })?;
        Ok(SystemTime::UNIX_EPOCH + Duration::from_secs(n))
    };
    let request = match field("request-key") {
        Ok(key) => Some(KeyRequest {
            key,
            at: seconds("requested-unix")?,
        }),
        Err(_) => None,
    };
    Ok(BootstrapToken {
        id: field("token-id")?,
        secret: field("token-secret")?,
        cluster: ClusterId::new(field("cluster")?),
        expires: seconds("expires-unix")?,
        used: field("used").is_ok_and(|u| u == "true"),
        request,
        approved: field("approved").is_ok_and(|a| a == "true"),
    })
}

fn directory_tokens(dir: &Path) -> Result<Tokens, StoreError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Tokens::default()),
        Err(source) => return Err(io(dir, source)),
    };
    let mut tokens = Vec::new();
    for entry in entries {
        let path = entry.map_err(|source| io(dir, source))?.path();
        let Some(id) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        tokens.extend(directory_token(dir, id)?);
    }
    Ok(Tokens::new(tokens))
}

/// `<dir>/<id>.json`, if it is there.
fn directory_token(dir: &Path, id: &str) -> Result<Option<BootstrapToken>, StoreError> {
    let path = dir.join(format!("{id}.json"));
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(io(&path, source)),
    };
    let file: TokenFile = serde_json::from_slice(&bytes).map_err(|e| StoreError::Invalid {
        what: path.display().to_string(),
        why: e.to_string(),
    })?;
    let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
    Ok(Some(BootstrapToken {
        id: id.to_string(),
        secret: file.secret,
        cluster: ClusterId::new(file.cluster),
        expires: at(file.expires_unix),
        used: file.used,
        request: file.request_key.map(|key| KeyRequest {
            key,
            at: at(file.requested_unix.unwrap_or_default()),
        }),
        approved: file.approved,
    }))
}

fn directory_ca(dir: &Path) -> Result<AgentCa, StoreError> {
    let (cert, key) = (dir.join("ca.crt"), dir.join("ca.key"));
    if cert.exists() {
        let read = |p: &Path| std::fs::read_to_string(p).map_err(|source| io(p, source));
        return AgentCa::from_pem(&read(&cert)?, &read(&key)?).map_err(|source| StoreError::Ca {
            what: dir.display().to_string(),
            source,
        });
    }
    std::fs::create_dir_all(dir).map_err(|source| io(dir, source))?;
    let (ca, key_pem) = AgentCa::generate(SystemTime::now()).map_err(|source| StoreError::Ca {
        what: dir.display().to_string(),
        source,
    })?;
    // The key first: a certificate without its key would be read back as a broken CA.
    write_kept(&key, key_pem.as_bytes())?;
    write_kept(&cert, ca.cert_pem().as_bytes())?;
    tracing::info!(dir = %dir.display(), "made the agent CA");
    Ok(ca)
}

async fn secret_ca(client: &Client, namespace: &str) -> Result<AgentCa, StoreError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let from_secret = |secret: &Secret| -> Result<AgentCa, StoreError> {
        let what = format!("Secret {namespace}/{CA_SECRET}");
        let get = |k: &str| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(k))
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
                .ok_or_else(|| StoreError::Invalid {
                    what: what.clone(),
                    why: format!("no {k}"),
                })
        };
        AgentCa::from_pem(&get("tls.crt")?, &get("tls.key")?)
            .map_err(|source| StoreError::Ca { what, source })
    };
    if let Some(secret) = api
        .get_opt(CA_SECRET)
        .await
        .map_err(|e| kube_error(format!("reading Secret {CA_SECRET}"), e))?
    {
        return from_secret(&secret);
    }
    let (ca, key_pem) = AgentCa::generate(SystemTime::now()).map_err(|source| StoreError::Ca {
        what: format!("Secret {namespace}/{CA_SECRET}"),
        source,
    })?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(CA_SECRET.into()),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            (
                "tls.crt".into(),
                ByteString(ca.cert_pem().as_bytes().to_vec()),
            ),
            ("tls.key".into(), ByteString(key_pem.into_bytes())),
        ])),
        ..Secret::default()
    };
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            tracing::info!(namespace, "made the agent CA (Secret {CA_SECRET})");
            Ok(ca)
        }
        // Another replica made it first: everyone uses that one.
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let secret = api
                .get(CA_SECRET)
                .await
                .map_err(|e| kube_error(format!("reading Secret {CA_SECRET}"), e))?;
            from_secret(&secret)
        }
        Err(e) => Err(kube_error(format!("creating Secret {CA_SECRET}"), e)),
    }
}

/// Writes `bytes` to `path` atomically (a temporary file renamed over it), readable by the
/// owner only.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn write_kept(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    write_private(path, bytes).map_err(|source| io(path, source))
}

pub(crate) fn io(path: &Path, source: std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub(crate) fn kube_error(what: String, source: kube::Error) -> StoreError {
    StoreError::Kube {
        what,
        source: Box::new(source),
    }
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests;
