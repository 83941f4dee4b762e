//! Joining: the hub's `Join` (a bootstrap token admits one cluster once; the agent CA signs its
//! request) and the agent's side of it (a key made here, never sent).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meridian_controllers::reason_of;
use meridian_core::ClusterId;
use meridian_core::agent::{Admitted, Approval, BootstrapToken, JoinRefused, Tokens, token_id};
use meridian_core::is_cluster_name;
use tonic::{Request, Response, Status};

use crate::ca::{AgentCa, CaError, Issued, key_and_request, request_key, request_with_key};
use crate::metrics::AgentMetrics;
use crate::proto::{self, JoinRequest, JoinResponse};
use crate::store::TokenStore;

/// The hub's `Join`.
pub struct Joins<S> {
    pub ca: Arc<AgentCa>,
    pub store: S,
    /// One join at a time in this process (the store settles joins of other replicas).
    pub serial: tokio::sync::Mutex<()>,
    /// An agent certificate's lifetime (renewed at 75–80 % of it).
    pub lifetime: Duration,
    /// Whether a valid token signs at once (`agent.autoApprove`).
    pub approval: Approval,
    pub metrics: AgentMetrics,
}

impl<S: TokenStore> Joins<S> {
    pub fn new(
        ca: Arc<AgentCa>,
        store: S,
        lifetime: Duration,
        approval: Approval,
        metrics: AgentMetrics,
    ) -> Self {
        Self {
            ca,
            store,
            serial: tokio::sync::Mutex::new(()),
            lifetime,
            approval,
            metrics,
        }
    }

    pub async fn join(
        &self,
        request: Request<JoinRequest>,
    ) -> Result<Response<JoinResponse>, Status> {
        let joined = self.admit(request).await;
        self.metrics.join(result_of(&joined));
        joined
    }

    async fn admit(&self, request: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        let request = request.into_inner();
        let cluster = ClusterId::new(&request.cluster);
        let now = SystemTime::now();
        if !is_cluster_name(&request.cluster) {
            return Err(Status::invalid_argument(format!(
                "{:?} is not a cluster name",
                request.cluster
            )));
        }
        let key =
            request_key(&request.csr_pem).map_err(|e| Status::invalid_argument(reason_of(&e)))?;
        let _one_at_a_time = self.serial.lock().await;
        let id = token_id(&request.token).map_err(|e| refused(&cluster, &e))?;
        let kept = self.store.token(id).await.map_err(|e| {
            Status::unavailable(format!(
                "cannot read the bootstrap token: {}",
                reason_of(&e)
            ))
        })?;
        let mut tokens = Tokens::new(kept.clone());
        let admitted = tokens
            .admit(&request.token, &cluster, &key, self.approval, now)
            .map_err(|e| refused(&cluster, &e))?;
        match admitted {
            Admitted::Pending { token, recorded } => {
                if recorded {
                    self.record(kept.as_ref(), &token, "join request").await?;
                    tracing::info!(%cluster, token = %token, key = %key, "agent join waits for approval");
                }
                Err(Status::failed_precondition(format!(
                    "waiting for approval: run `meridian approve {cluster}` on the hub (key sha256:{key})"
                )))
            }
            Admitted::Sign(token) => {
                // Signed before the token is spent (a bad request spends nothing); the
                // certificate leaves only once the token is recorded as used.
                let issued = self
                    .ca
                    .sign(&request.csr_pem, &cluster, self.lifetime, now)
                    .map_err(|e| Status::invalid_argument(reason_of(&e)))?;
                self.record(kept.as_ref(), &token, "token as used").await?;
                tracing::info!(%cluster, token = %token, "agent joined");
                Ok(Response::new(answer(&self.ca, issued)))
            }
        }
    }

    /// Replaces the token as read (`before`) by `after` in the store; a failure refuses the
    /// join as the hub's own (Unavailable: the agent tries again).
    async fn record(
        &self,
        before: Option<&BootstrapToken>,
        after: &BootstrapToken,
        what: &str,
    ) -> Result<(), Status> {
        self.store
            .replace(before.unwrap_or(after), after)
            .await
            .map_err(|e| {
                Status::unavailable(format!("cannot record the {what}: {}", reason_of(&e)))
            })
    }

    /// A new certificate for the cluster the caller's current one names.
    pub async fn renew(&self, cluster: &ClusterId, csr_pem: &str) -> Result<JoinResponse, Status> {
        let renewed = self
            .ca
            .sign(csr_pem, cluster, self.lifetime, SystemTime::now())
            .map_err(|e| Status::invalid_argument(reason_of(&e)))
            .map(|issued| answer(&self.ca, issued));
        self.metrics.renewal(result_of(&renewed));
        if renewed.is_ok() {
            tracing::info!(%cluster, "agent certificate renewed");
        }
        renewed
    }
}

/// A join's or renewal's result as the metrics count it: the hub's own failure (unavailable)
/// apart from a refusal of what the agent sent.
fn result_of<T>(result: &Result<T, Status>) -> &'static str {
    match result {
        Ok(_) => "admitted",
        Err(status) if status.code() == tonic::Code::Unavailable => "failed",
        Err(status) if status.code() == tonic::Code::FailedPrecondition => "pending",
        Err(_) => "refused",
    }
}

fn answer(ca: &AgentCa, issued: Issued) -> JoinResponse {
    JoinResponse {
        certificate_pem: issued.cert_pem,
        ca_pem: ca.cert_pem().to_string(),
        not_before_unix: unix(issued.not_before),
        not_after_unix: unix(issued.not_after),
    }
}

fn refused(cluster: &ClusterId, why: &JoinRefused) -> Status {
    tracing::warn!(%cluster, %why, "agent join refused");
    Status::permission_denied(why.to_string())
}

/// Seconds since the epoch, as the protocol carries times.
pub fn unix(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The instant of a `unix` time on the wire (before 1970 reads as 1970).
pub fn from_unix(seconds: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

/// What an agent holds once joined.
#[derive(Debug, Clone)]
pub struct Joined {
    pub key_pem: String,
    pub certificate_pem: String,
    pub ca_pem: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

/// Why an agent could not join.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("the hub refused: {}", .0.message())]
    Refused(Status),
}

/// What an agent asks to join with: its cluster, its key (made here, never sent) and the
/// request for that key.
pub struct Asking {
    pub cluster: ClusterId,
    pub key_pem: String,
    csr_pem: String,
}

impl Asking {
    /// With a new key.
    pub fn new(cluster: &ClusterId) -> Result<Self, CaError> {
        let (key_pem, csr_pem) = key_and_request(cluster)?;
        Ok(Self {
            cluster: cluster.clone(),
            key_pem,
            csr_pem,
        })
    }

    /// With a key kept from before (a join that waits for approval asks with one key).
    pub fn with_key(cluster: &ClusterId, key_pem: String) -> Result<Self, CaError> {
        Ok(Self {
            cluster: cluster.clone(),
            csr_pem: request_with_key(cluster, &key_pem)?,
            key_pem,
        })
    }
}

/// The agent's side: presents `token` and the request over `channel`.
pub async fn join(
    channel: tonic::transport::Channel,
    asking: &Asking,
    token: &str,
) -> Result<Joined, JoinError> {
    let answer = proto::join(
        channel,
        JoinRequest {
            cluster: asking.cluster.to_string(),
            token: token.trim().to_string(),
            csr_pem: asking.csr_pem.clone(),
        },
    )
    .await
    .map_err(JoinError::Refused)?;
    Ok(Joined {
        key_pem: asking.key_pem.clone(),
        certificate_pem: answer.certificate_pem,
        ca_pem: answer.ca_pem,
        not_before: from_unix(answer.not_before_unix),
        not_after: from_unix(answer.not_after_unix),
    })
}

#[cfg(test)]
mod tests;
