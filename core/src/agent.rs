//! The pull-mode agent's rules, pure: who may join with which bootstrap token,
//! which cluster a client certificate speaks for, and when an agent renews its certificate.
//! The hub-side service and the member-side loop (`agent/`) only ask these.
//!
//! ```text
//!  meridian token create --cluster eu-1 --ttl 1h ─► BootstrapToken "abc123.0123456789abcdef"
//!  agent: key pair + CSR + token ─► hub: Tokens::admit(token, cluster, key, approval, now)
//!        ─► Sign: CN=meridian:agent:eu-1 (the token is spent) │ refused: JoinRefused
//!        ─► Pending (agent.autoApprove: false): the key is recorded on the token; the agent
//!           asks again until `meridian approve eu-1` (Tokens::approve) approves that key
//!  every stream message: sender(certificate CN) == the cluster it names, or the stream ends
//!  agent: renew_at(not_before, not_after, jitter): 75–80 % into the lifetime from signing
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime};

use crate::{ClusterId, is_cluster_name};

/// The subject prefix of an agent's certificate: `CN=meridian:agent:<cluster>`.
pub const AGENT_SUBJECT_PREFIX: &str = "meridian:agent:";
/// A token's id: six lower-case letters or digits; its secret: sixteen (as kubeadm's).
const ID_LEN: usize = 6;
const SECRET_LEN: usize = 16;

/// The common name an agent certificate carries for `cluster`.
pub fn agent_subject(cluster: &ClusterId) -> String {
    format!("{AGENT_SUBJECT_PREFIX}{cluster}")
}

/// The cluster an agent certificate's common name speaks for (None: not an agent's).
pub fn cluster_of_subject(common_name: &str) -> Option<ClusterId> {
    let name = common_name.strip_prefix(AGENT_SUBJECT_PREFIX)?;
    is_cluster_name(name).then(|| ClusterId::new(name))
}

/// Whether the sender of a message about `claimed` may send it: the certificate's cluster
/// and the cluster named must be the same.
pub fn check_sender(certified: &ClusterId, claimed: &ClusterId) -> Result<(), Impersonation> {
    if certified == claimed {
        Ok(())
    } else {
        Err(Impersonation {
            certified: certified.clone(),
            claimed: claimed.clone(),
        })
    }
}

/// A certificate for one cluster used to speak for another.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a certificate for cluster {certified} sent objects of cluster {claimed}")]
pub struct Impersonation {
    pub certified: ClusterId,
    pub claimed: ClusterId,
}

/// How long before its signing an agent certificate is valid from (its `notBefore`), for
/// clocks a little behind the hub's.
pub const CERTIFICATE_BACKDATE: Duration = Duration::from_secs(60);

/// When an agent renews a certificate valid from `not_before` to `not_after`: when 20–25 % of
/// the lifetime it was issued for remains, the point within that window set by `jitter` (0 to
/// 1), so agents issued together do not all renew at once. The lifetime counts from the
/// signing, [`CERTIFICATE_BACKDATE`] after `not_before`: counted from `not_before`, a short
/// certificate would renew at half its life.
pub fn renew_at(not_before: SystemTime, not_after: SystemTime, jitter: f64) -> SystemTime {
    let issued = (not_before + CERTIFICATE_BACKDATE).min(not_after);
    let lifetime = not_after.duration_since(issued).unwrap_or(Duration::ZERO);
    let share = 0.75 + 0.05 * jitter.clamp(0.0, 1.0);
    issued + lifetime.mul_f64(share)
}

/// A bootstrap token as the hub keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    pub id: String,
    pub secret: String,
    /// The one cluster that may join with it.
    pub cluster: ClusterId,
    pub expires: SystemTime,
    /// Spent by a join (a token admits one certificate).
    pub used: bool,
    /// The key that asked to join with this token, when joins wait for an operator's approval.
    pub request: Option<KeyRequest>,
    /// The operator approved `request` (`meridian approve`).
    pub approved: bool,
}

/// A join waiting for approval: which key asked (the SHA-256 of its SubjectPublicKeyInfo,
/// hex), and when first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRequest {
    pub key: String,
    pub at: SystemTime,
}

/// Whether a valid token signs at once or waits for the operator (`agent.autoApprove`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approval {
    Automatic,
    ByOperator,
}

/// What a join with a valid token comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admitted {
    /// Sign the request: the token (as returned) is spent; the caller records that first.
    Sign(BootstrapToken),
    /// Waiting for `meridian approve`; `recorded` when this attempt is the one that asked (the
    /// token as returned carries the request, for the caller to record).
    Pending {
        token: BootstrapToken,
        recorded: bool,
    },
}

impl BootstrapToken {
    /// `id.secret`, as the operator hands it to the agent.
    pub fn presented(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }
}

/// Why a join is refused (the agent is told; the hub logs it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinRefused {
    #[error("the bootstrap token is not of the form <6 characters>.<16 characters> (a-z, 0-9)")]
    Malformed,
    #[error("no bootstrap token {0:?}")]
    Unknown(String),
    #[error("bootstrap token {0:?}: the secret does not match")]
    Secret(String),
    #[error("bootstrap token {id:?} is for cluster {token_cluster}, not {cluster}")]
    OtherCluster {
        id: String,
        token_cluster: ClusterId,
        cluster: ClusterId,
    },
    #[error("bootstrap token {0:?} expired")]
    Expired(String),
    #[error("bootstrap token {0:?} was already used")]
    Used(String),
    #[error(
        "bootstrap token {0:?} is already waiting for approval of another key; make a new token for this agent"
    )]
    OtherKey(String),
}

/// Why `meridian approve` approved nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no join of cluster {0} is waiting for approval (an agent asks with a valid token first)")]
pub struct NothingToApprove(pub ClusterId);

/// The hub's bootstrap tokens, by id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tokens {
    by_id: BTreeMap<String, BootstrapToken>,
}

impl Tokens {
    pub fn new(tokens: impl IntoIterator<Item = BootstrapToken>) -> Self {
        Self {
            by_id: tokens.into_iter().map(|t| (t.id.clone(), t)).collect(),
        }
    }

    /// Whether `presented` lets `cluster`'s `key` join now: signed at once, or (by an operator's
    /// approval) once the key that asked first is approved. Refusals change nothing.
    pub fn admit(
        &mut self,
        presented: &str,
        cluster: &ClusterId,
        key: &str,
        approval: Approval,
        now: SystemTime,
    ) -> Result<Admitted, JoinRefused> {
        let (id, secret) = parse(presented)?;
        let token = self
            .by_id
            .get_mut(id)
            .ok_or_else(|| JoinRefused::Unknown(id.to_string()))?;
        if !same_secret(token.secret.as_bytes(), secret.as_bytes()) {
            return Err(JoinRefused::Secret(id.to_string()));
        }
        if &token.cluster != cluster {
            return Err(JoinRefused::OtherCluster {
                id: id.to_string(),
                token_cluster: token.cluster.clone(),
                cluster: cluster.clone(),
            });
        }
        if now >= token.expires {
            return Err(JoinRefused::Expired(id.to_string()));
        }
        if token.used {
            return Err(JoinRefused::Used(id.to_string()));
        }
        if approval == Approval::ByOperator {
            match &token.request {
                Some(asked) if asked.key != key => {
                    return Err(JoinRefused::OtherKey(id.to_string()));
                }
                Some(_) if !token.approved => {
                    return Ok(Admitted::Pending {
                        token: token.clone(),
                        recorded: false,
                    });
                }
                Some(_) => {}
                None => {
                    token.request = Some(KeyRequest {
                        key: key.to_string(),
                        at: now,
                    });
                    return Ok(Admitted::Pending {
                        token: token.clone(),
                        recorded: true,
                    });
                }
            }
        }
        token.used = true;
        Ok(Admitted::Sign(token.clone()))
    }

    /// Approves every join of `cluster` waiting with a valid token (`meridian approve`); returns
    /// the tokens as approved, for the caller to record.
    pub fn approve(
        &mut self,
        cluster: &ClusterId,
        now: SystemTime,
    ) -> Result<Vec<BootstrapToken>, NothingToApprove> {
        let approved: Vec<BootstrapToken> = self
            .by_id
            .values_mut()
            .filter(|t| {
                &t.cluster == cluster
                    && !t.used
                    && !t.approved
                    && t.request.is_some()
                    && now < t.expires
            })
            .map(|t| {
                t.approved = true;
                t.clone()
            })
            .collect();
        if approved.is_empty() {
            Err(NothingToApprove(cluster.clone()))
        } else {
            Ok(approved)
        }
    }

    /// Joins waiting for an operator's approval, oldest first.
    pub fn pending(&self, now: SystemTime) -> Vec<&BootstrapToken> {
        let mut pending: Vec<&BootstrapToken> = self
            .by_id
            .values()
            .filter(|t| !t.used && !t.approved && t.request.is_some() && now < t.expires)
            .collect();
        pending.sort_by_key(|t| t.request.as_ref().map(|r| r.at));
        pending
    }

    /// The token `id`, as read.
    pub fn get(&self, id: &str) -> Option<&BootstrapToken> {
        self.by_id.get(id)
    }

    /// Tokens past their expiry (to delete from the hub).
    pub fn expired(&self, now: SystemTime) -> impl Iterator<Item = &BootstrapToken> {
        self.by_id.values().filter(move |t| now >= t.expires)
    }
}

/// A new token for `cluster` from `random` bytes (at least 22 of them; the caller's CSPRNG).
pub fn new_token(cluster: ClusterId, expires: SystemTime, random: &[u8]) -> BootstrapToken {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    // 36 letters: a byte modulo 36 leans slightly to the first four, which costs a token
    // less than 0.1 bit of its 82.
    let mut chars = random
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]));
    let id: String = chars.by_ref().take(ID_LEN).collect();
    let secret: String = chars.take(SECRET_LEN).collect();
    BootstrapToken {
        id,
        secret,
        cluster,
        expires,
        used: false,
        request: None,
        approved: false,
    }
}

/// The id of a presented token (`id.secret`), checked for form: what a store looks it up by.
pub fn token_id(presented: &str) -> Result<&str, JoinRefused> {
    parse(presented).map(|(id, _)| id)
}

fn parse(presented: &str) -> Result<(&str, &str), JoinRefused> {
    let (id, secret) = presented
        .trim()
        .split_once('.')
        .ok_or(JoinRefused::Malformed)?;
    let valid = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    if valid(id, ID_LEN) && valid(secret, SECRET_LEN) {
        Ok((id, secret))
    } else {
        Err(JoinRefused::Malformed)
    }
}

/// Compares two secrets in time independent of where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl fmt::Display for BootstrapToken {
    /// The id only: a token's secret is never logged.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (cluster {})", self.id, self.cluster)
    }
}

#[cfg(test)]
mod tests;
