//! Joining: the hub's `Join` (a bootstrap token admits one cluster once; the agent CA signs its
//! request) and the agent's side of it (a key made here, never sent).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meridian_core::ClusterId;
use meridian_core::agent::{JoinRefused, Tokens};
use meridian_core::is_cluster_name;
use parking_lot::Mutex;
use tonic::{Request, Response, Status};

use crate::ca::{AgentCa, CaError, key_and_request};
use crate::proto::{self, JoinRequest, JoinResponse};

/// Where a spent token is recorded before the certificate leaves the hub (a Secret or a file
/// on the hub; in tests, memory). An error refuses the join: a token that could not be marked
/// spent must not admit twice after a restart.
pub trait SpentTokens: Send + Sync + 'static {
    fn spend(&self, id: &str) -> Result<(), String>;
}

/// The hub's `Join`.
pub struct Joins<S> {
    pub ca: Arc<AgentCa>,
    pub tokens: Arc<Mutex<Tokens>>,
    pub spent: S,
    /// An agent certificate's lifetime (renewed at 75–80 % of it).
    pub lifetime: Duration,
}

impl<S: SpentTokens> Joins<S> {
    pub async fn join(
        &self,
        request: Request<JoinRequest>,
    ) -> Result<Response<JoinResponse>, Status> {
        let request = request.into_inner();
        let cluster = ClusterId::new(&request.cluster);
        let now = SystemTime::now();
        if !is_cluster_name(&request.cluster) {
            return Err(Status::invalid_argument(format!(
                "{:?} is not a cluster name",
                request.cluster
            )));
        }
        // Admitted on a copy, kept only once the certificate is made and the token recorded
        // spent: a request that fails later leaves the token as it was.
        let mut tokens = self.tokens.lock();
        let mut trial = tokens.clone();
        let token = trial
            .admit(&request.token, &cluster, now)
            .map_err(|e| refused(&cluster, &e))?;
        let issued = self
            .ca
            .sign(&request.csr_pem, &cluster, self.lifetime, now)
            .map_err(|e| Status::invalid_argument(format!("{e}")))?;
        self.spent
            .spend(&token.id)
            .map_err(|e| Status::unavailable(format!("cannot record the token as used: {e}")))?;
        *tokens = trial;
        tracing::info!(%cluster, token = %token, "agent joined");
        Ok(Response::new(JoinResponse {
            certificate_pem: issued.cert_pem,
            ca_pem: self.ca.cert_pem().to_string(),
            not_before_unix: unix(issued.not_before),
            not_after_unix: unix(issued.not_after),
        }))
    }
}

fn refused(cluster: &ClusterId, why: &JoinRefused) -> Status {
    tracing::warn!(%cluster, %why, "agent join refused");
    Status::permission_denied(why.to_string())
}

/// Seconds since the epoch, as the protocol carries times.
pub(crate) fn unix(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
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
    #[error("cannot make the key and request")]
    Key(#[source] CaError),
    #[error("the hub refused: {}", .0.message())]
    Refused(Status),
}

/// The agent's side: makes a key and request for `cluster`, presents `token` over `channel`.
pub async fn join(
    channel: tonic::transport::Channel,
    cluster: &ClusterId,
    token: &str,
) -> Result<Joined, JoinError> {
    let (key_pem, csr_pem) = key_and_request(cluster).map_err(JoinError::Key)?;
    let answer = proto::join(
        channel,
        JoinRequest {
            cluster: cluster.to_string(),
            token: token.trim().to_string(),
            csr_pem,
        },
    )
    .await
    .map_err(JoinError::Refused)?;
    let at = |s: i64| SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(s).unwrap_or(0));
    Ok(Joined {
        key_pem,
        certificate_pem: answer.certificate_pem,
        ca_pem: answer.ca_pem,
        not_before: at(answer.not_before_unix),
        not_after: at(answer.not_after_unix),
    })
}

#[cfg(test)]
mod tests;
