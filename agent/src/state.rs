//! Where an agent keeps its key and certificates: files in a directory (`--state-dir`, 0600,
//! written atomically) or a Secret in its own member (`--state-secret NAMESPACE/NAME`), for an
//! agent in a pod: a restarted or rescheduled pod reconnects with what it kept, needing no
//! volume and no new token (its token was spent by the first join).
//!
//! ```text
//!  directory: key.pem cert.pem ca.pem          Secret: data {key.pem, cert.pem, ca.pem}
//! ```
//!
//! The key is kept first, alone, before a join is asked (a join waiting for approval asks
//! again with it after a restart); the certificate and CA follow once joined or renewed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use meridian_controllers::kubernetes::MANAGED_BY;

use crate::store::{StoreError, io, kube_error, write_private};

pub(crate) const KEY: &str = "key.pem";
pub(crate) const CERT: &str = "cert.pem";
pub(crate) const CA: &str = "ca.pem";

/// Where the agent's state is kept.
#[derive(Clone)]
pub enum AgentState {
    Directory(PathBuf),
    Secret { api: Box<Api<Secret>>, name: String },
}

impl std::fmt::Debug for AgentState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// What is kept, entry by entry (absent: not kept yet).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Kept {
    pub key_pem: Option<String>,
    pub certificate_pem: Option<String>,
    pub ca_pem: Option<String>,
}

impl AgentState {
    /// A Secret `namespace/name` in the member the client reaches.
    pub fn secret(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self::Secret {
            api: Box::new(Api::namespaced(client, namespace)),
            name: name.to_string(),
        }
    }

    /// Where, for logs and errors.
    pub fn describe(&self) -> String {
        match self {
            AgentState::Directory(dir) => dir.display().to_string(),
            AgentState::Secret { api, name } => {
                format!("Secret {}/{name}", api.namespace().unwrap_or_default())
            }
        }
    }

    pub async fn read(&self) -> Result<Kept, StoreError> {
        match self {
            AgentState::Directory(dir) => {
                let read = |name: &str| read_file(&dir.join(name));
                Ok(Kept {
                    key_pem: read(KEY)?,
                    certificate_pem: read(CERT)?,
                    ca_pem: read(CA)?,
                })
            }
            AgentState::Secret { api, name } => {
                let secret = api
                    .get_opt(name)
                    .await
                    .map_err(|e| self.kube_error("reading", e))?;
                let data = secret.and_then(|s| s.data).unwrap_or_default();
                let entry = |key: &'static str| -> Result<Option<String>, StoreError> {
                    data.get(key)
                        .map(|v| {
                            String::from_utf8(v.0.clone()).map_err(|_| StoreError::Invalid {
                                what: self.describe(),
                                why: format!("{key} is not text"),
                            })
                        })
                        .transpose()
                };
                Ok(Kept {
                    key_pem: entry(KEY)?,
                    certificate_pem: entry(CERT)?,
                    ca_pem: entry(CA)?,
                })
            }
        }
    }

    /// Keeps `entries` (name, PEM), in that order for a directory (the key before a
    /// certificate: a certificate is never kept beside another's key), in one write for a
    /// Secret; other entries stay as they were.
    pub async fn write(&self, entries: &[(&'static str, &str)]) -> Result<(), StoreError> {
        match self {
            AgentState::Directory(dir) => {
                std::fs::create_dir_all(dir).map_err(|source| io(dir, source))?;
                for (name, text) in entries {
                    let path = dir.join(name);
                    write_private(&path, text.as_bytes()).map_err(|source| io(&path, source))?;
                }
                Ok(())
            }
            AgentState::Secret { api, name } => {
                let current = api
                    .get_opt(name)
                    .await
                    .map_err(|e| self.kube_error("reading", e))?;
                let mut data: BTreeMap<String, ByteString> = current
                    .as_ref()
                    .and_then(|s| s.data.clone())
                    .unwrap_or_default();
                for (entry, text) in entries {
                    data.insert((*entry).to_string(), ByteString(text.as_bytes().to_vec()));
                }
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        resource_version: current.and_then(|s| s.metadata.resource_version),
                        labels: Some(BTreeMap::from([(
                            MANAGED_BY.0.to_string(),
                            "meridian-agent".to_string(),
                        )])),
                        ..ObjectMeta::default()
                    },
                    type_: Some("Opaque".into()),
                    data: Some(data),
                    ..Secret::default()
                };
                let written = if secret.metadata.resource_version.is_some() {
                    api.replace(name, &PostParams::default(), &secret).await
                } else {
                    api.create(&PostParams::default(), &secret).await
                };
                written.map(drop).map_err(|e| self.kube_error("writing", e))
            }
        }
    }

    fn kube_error(&self, doing: &str, source: kube::Error) -> StoreError {
        kube_error(format!("{doing} {}", self.describe()), source)
    }
}

fn read_file(path: &Path) -> Result<Option<String>, StoreError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(io(path, source)),
    }
}
