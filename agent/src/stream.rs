//! The hub's side of an agent's stream. The agent CA's client certificate names the cluster
//! (`CN=meridian:agent:<cluster>`); every message names the cluster it speaks for too, and one
//! naming another cluster ends the stream (logged). What an agent sends becomes [`Inbound`]s
//! for the hub-side member source: the member's watch events (decoded into the same
//! `MemberEvent`s a push member's watches give) and heartbeats.

use std::time::SystemTime;

use meridian_controllers::kubernetes::state::MemberEvent;
use meridian_core::ClusterId;
use meridian_core::agent::{Impersonation, check_sender, cluster_of_subject};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::events::{DecodeError, decode};
use crate::join::{Joins, SpentTokens, unix};
use crate::proto::{
    AgentHub, AgentMessage, HubMessage, HubStream, JoinRequest, JoinResponse, agent_message,
};

/// What one agent's stream brought.
#[derive(Debug)]
pub enum Inbound {
    Event(Box<MemberEvent>),
    Heartbeat {
        member_ready: bool,
        error: String,
    },
    /// The stream ended (the agent went, or was refused).
    Closed,
}

/// Where the hub's streams deliver what agents send, by cluster.
#[derive(Clone)]
pub struct Streams {
    pub sink: mpsc::Sender<(ClusterId, Inbound)>,
}

impl Streams {
    pub async fn connect(
        &self,
        request: Request<tonic::Streaming<AgentMessage>>,
    ) -> Result<Response<HubStream>, Status> {
        let certified = certified_cluster(request.peer_certs().as_deref())?;
        let mut inbound = request.into_inner();
        let sink = self.sink.clone();
        let (down, down_rx) = mpsc::channel(16);
        tracing::info!(cluster = %certified, "agent connected");
        let _ = down
            .send(Ok(HubMessage {
                hub_time_unix: unix(SystemTime::now()),
            }))
            .await;
        tokio::spawn(async move {
            loop {
                let message = match inbound.message().await {
                    Ok(Some(message)) => message,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(cluster = %certified, error = %e, "agent stream broke");
                        break;
                    }
                };
                match read(&certified, message) {
                    Ok(Some(item)) => {
                        if sink.send((certified.clone(), item)).await.is_err() {
                            break;
                        }
                    }
                    Ok(None) => {}
                    Err(refused) => {
                        tracing::warn!(cluster = %certified, why = %refused, "agent stream refused");
                        let _ = down.send(Err(refused.into())).await;
                        break;
                    }
                }
            }
            let _ = sink.send((certified, Inbound::Closed)).await;
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(down_rx);
        Ok(Response::new(Box::pin(stream)))
    }
}

/// Why an agent's stream is refused.
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error("an agent's stream needs its client certificate")]
    NoCertificate,
    #[error("the client certificate cannot be read")]
    Unreadable,
    #[error("{0:?} is not an agent's certificate (CN=meridian:agent:<cluster>)")]
    NotAnAgent(String),
    #[error(transparent)]
    Impersonation(#[from] Impersonation),
    #[error(transparent)]
    Event(#[from] DecodeError),
}

impl From<Refused> for Status {
    fn from(refused: Refused) -> Self {
        let message = refused.to_string();
        match refused {
            Refused::NoCertificate | Refused::Unreadable => Status::unauthenticated(message),
            Refused::NotAnAgent(_) | Refused::Impersonation(_) => {
                Status::permission_denied(message)
            }
            Refused::Event(_) => Status::invalid_argument(message),
        }
    }
}

/// The cluster the connection's client certificate speaks for.
fn certified_cluster(
    certs: Option<&Vec<tonic::transport::CertificateDer<'static>>>,
) -> Result<ClusterId, Refused> {
    let der = certs
        .and_then(|c| c.first())
        .ok_or(Refused::NoCertificate)?;
    let (_, cert) = X509Certificate::from_der(der.as_ref()).map_err(|_| Refused::Unreadable)?;
    let common_name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default();
    cluster_of_subject(common_name).ok_or_else(|| Refused::NotAnAgent(common_name.to_string()))
}

/// One message from `certified`'s agent: what it brings, or why the stream ends.
fn read(certified: &ClusterId, message: AgentMessage) -> Result<Option<Inbound>, Refused> {
    check_sender(certified, &ClusterId::new(&message.cluster))?;
    Ok(match message.body {
        Some(agent_message::Body::Event(event)) => Some(Inbound::Event(Box::new(decode(&event)?))),
        Some(agent_message::Body::Heartbeat(beat)) => Some(Inbound::Heartbeat {
            member_ready: beat.member_ready,
            error: beat.error,
        }),
        None => None,
    })
}

/// The hub's agent service: joining and streams.
pub struct Hub<S> {
    pub joins: Joins<S>,
    pub streams: Streams,
}

#[tonic::async_trait]
impl<S: SpentTokens> AgentHub for Hub<S> {
    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        self.joins.join(request).await
    }

    async fn connect(
        &self,
        request: Request<tonic::Streaming<AgentMessage>>,
    ) -> Result<Response<HubStream>, Status> {
        self.streams.connect(request).await
    }
}

#[cfg(test)]
mod tests;
