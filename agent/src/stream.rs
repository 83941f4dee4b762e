//! The hub's side of an agent's stream. The agent CA's client certificate names the cluster
//! (`CN=meridian:agent:<cluster>`); every message names the cluster it speaks for too, and one
//! naming another cluster ends the stream (logged). What an agent sends becomes
//! [`Inbound`]s for the cluster's agent member task (`meridian_controllers::agents`): the
//! member's watch events (decoded into the same `MemberEvent`s a push member's watches give)
//! and heartbeats; the hub's requests for the member's API go down and their answers come
//! back to their callers (`api.rs`). A cluster no MemberCluster names as an agent member is
//! refused.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use meridian_controllers::agents::{
    AgentRoutes, AgentStream, ApiCall, Connection, Inbound, NotAnAgentMember,
};
use meridian_core::ClusterId;
use meridian_core::admission::TokenBucket;
use meridian_core::agent::{Impersonation, check_sender, cluster_of_subject};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::api::Pending;
use crate::events::{DecodeError, decode};
use crate::join::{Joins, unix};
use crate::metrics::AgentMetrics;
use crate::proto::{
    AgentHub, AgentMessage, ApiRequest, ApiResponse, HubMessage, HubStream, JoinRequest,
    JoinResponse, RenewRequest, agent_message,
};
use crate::store::TokenStore;

/// The hub's streams: what agents send goes to their member's task.
#[derive(Clone)]
pub struct Streams {
    pub routes: AgentRoutes,
    pub metrics: AgentMetrics,
    /// New streams are admitted at a bounded rate: a thousand agents reconnecting at once
    /// (the hub restarted) relist a few at a time instead of all at once.
    pub admission: Arc<Mutex<TokenBucket>>,
}

impl Streams {
    pub fn new(routes: AgentRoutes, metrics: AgentMetrics, per_second: u32) -> Self {
        Self {
            routes,
            metrics,
            admission: Arc::new(Mutex::new(TokenBucket::new(per_second, Instant::now()))),
        }
    }

    /// Waits for a place in the admission rate (each stream until its own slot).
    async fn admitted(&self) {
        let wait = self.admission.lock().reserve(Instant::now());
        if !wait.is_zero() {
            self.metrics.admission_waits.inc();
            tokio::time::sleep(wait).await;
        }
    }

    pub async fn connect(
        &self,
        request: Request<tonic::Streaming<AgentMessage>>,
    ) -> Result<Response<HubStream>, Status> {
        let (certified, certificate_expires) = certified(request.peer_certs().as_deref())
            .inspect_err(|refused| self.metrics.refused(refused.label()))?;
        let connection = Connection {
            peer: request
                .remote_addr()
                .map_or_else(|| "unknown".into(), |a| a.to_string()),
            certificate_expires,
        };
        self.admitted().await;
        let routes = self.routes.clone();
        let metrics = self.metrics.clone();
        let heartbeat = routes.heartbeat(&certified).ok_or_else(|| {
            let refused = NotAnAgentMember(certified.clone());
            tracing::warn!(cluster = %certified, why = %refused, "agent stream refused");
            metrics.refused(NOT_A_MEMBER);
            Status::failed_precondition(refused.to_string())
        })?;
        let inbound = request.into_inner();
        let (down, down_rx) = mpsc::channel(16);
        tracing::info!(cluster = %certified, peer = %connection.peer, "agent connected");
        let hello = HubMessage {
            hub_time_unix: unix(SystemTime::now()),
            heartbeat_seconds: u32::try_from(heartbeat.as_secs()).unwrap_or(u32::MAX),
            ..HubMessage::default()
        };
        let _ = down.send(Ok(hello)).await;
        let reader = Reader {
            certified,
            connection,
            routes,
            metrics,
            down,
            stream: None,
            pending: Pending::default(),
            waiting: 0,
        };
        tokio::spawn(reader.run(inbound));
        let stream = tokio_stream::wrappers::ReceiverStream::new(down_rx);
        Ok(Response::new(Box::pin(stream)))
    }
}

/// One agent stream's reader: what comes up goes to the member's task (answers to their
/// callers), requests for the member's API go down.
struct Reader {
    certified: ClusterId,
    connection: Connection,
    routes: AgentRoutes,
    metrics: AgentMetrics,
    down: mpsc::Sender<Result<HubMessage, Status>>,
    /// Opened with the first message that passes the checks: a stream that is refused never
    /// displaces the cluster's current one.
    stream: Option<AgentStream>,
    /// Requests sent down and waiting for their answers; dropped with the stream, which
    /// fails each of them.
    pending: Pending,
    /// How many of them `api_requests_waiting` counts.
    waiting: i64,
}

impl Reader {
    async fn run(mut self, mut inbound: tonic::Streaming<AgentMessage>) {
        loop {
            let calls = self.stream.as_mut().map(|s| &mut s.calls);
            let next = tokio::select! {
                message = inbound.message() => Next::Message(message),
                call = next_call(calls) => Next::Call(call),
            };
            let go_on = match next {
                Next::Message(Ok(Some(message))) => self.deliver(message).await,
                Next::Message(Ok(None)) => false,
                Next::Message(Err(e)) => {
                    tracing::debug!(cluster = %self.certified, error = %e, "agent stream broke");
                    false
                }
                Next::Call(Some(call)) => {
                    let request = self.pending.start(call);
                    self.metrics.api_requests.inc();
                    self.send_down(request).await
                }
                Next::Call(None) => false,
            };
            self.count_waiting();
            if !go_on {
                break;
            }
        }
        self.pending = Pending::default();
        self.count_waiting();
        // The stream drops here: the member's task hears it closed.
        if self.stream.is_some() {
            self.metrics.streams.dec();
        }
    }

    /// One message from the agent; false when the stream must end.
    async fn deliver(&mut self, message: AgentMessage) -> bool {
        let item = match read(&self.certified, message) {
            Ok(Some(Up::Member(item))) => item,
            Ok(Some(Up::Answer(response))) => {
                return match self.pending.answer(response) {
                    Some(cancel) => self.send_down(cancel).await,
                    None => true,
                };
            }
            Ok(None) => return true,
            Err(refused) => {
                tracing::warn!(cluster = %self.certified, why = %refused, "agent stream refused");
                self.metrics.refused(refused.label());
                let _ = self.down.send(Err(refused.into())).await;
                return false;
            }
        };
        if self.stream.is_none() {
            match self
                .routes
                .open(&self.certified, self.connection.clone())
                .await
            {
                Ok(open) => {
                    self.metrics.streams.inc();
                    self.stream = Some(open);
                }
                Err(gone) => {
                    self.metrics.refused(NOT_A_MEMBER);
                    let _ = self
                        .down
                        .send(Err(Status::failed_precondition(gone.to_string())))
                        .await;
                    return false;
                }
            }
        }
        // False: the member's task went (the member left or restarted).
        match &self.stream {
            Some(open) => open.send(item).await,
            None => false,
        }
    }

    /// Keeps `api_requests_waiting` in step with this stream's waiting requests.
    fn count_waiting(&mut self) {
        let now = i64::try_from(self.pending.len()).unwrap_or(i64::MAX);
        self.metrics.api_waiting.inc_by(now - self.waiting);
        self.waiting = now;
    }

    /// A request (or a cancel) down to the agent.
    async fn send_down(&mut self, request: ApiRequest) -> bool {
        let message = HubMessage {
            request: Some(request),
            ..HubMessage::default()
        };
        self.down.send(Ok(message)).await.is_ok()
    }
}

enum Next {
    Message(Result<Option<AgentMessage>, Status>),
    /// A request for the member's API (None: its sender is gone).
    Call(Option<ApiCall>),
}

/// Waits for a request for the member's API; forever while no stream is open.
async fn next_call(calls: Option<&mut mpsc::Receiver<ApiCall>>) -> Option<ApiCall> {
    match calls {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// What a message from the agent brings.
enum Up {
    /// For the member's task.
    Member(Inbound),
    /// Part of an answer from the member's API.
    Answer(ApiResponse),
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

/// The metric label of a stream refused for a cluster that is no agent member here.
const NOT_A_MEMBER: &str = "not_a_member";

impl Refused {
    /// The metric label of the refusal.
    fn label(&self) -> &'static str {
        match self {
            Refused::NoCertificate | Refused::Unreadable => "no_certificate",
            Refused::NotAnAgent(_) => "not_an_agent",
            Refused::Impersonation(_) => "impersonation",
            Refused::Event(_) => "bad_event",
        }
    }
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

/// The cluster the connection's client certificate speaks for, and when it expires.
fn certified(
    certs: Option<&Vec<tonic::transport::CertificateDer<'static>>>,
) -> Result<(ClusterId, Option<SystemTime>), Refused> {
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
    let cluster = cluster_of_subject(common_name)
        .ok_or_else(|| Refused::NotAnAgent(common_name.to_string()))?;
    let expires = u64::try_from(cert.validity().not_after.timestamp())
        .ok()
        .map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s));
    Ok((cluster, expires))
}

/// One message from `certified`'s agent: what it brings, or why the stream ends.
fn read(certified: &ClusterId, message: AgentMessage) -> Result<Option<Up>, Refused> {
    check_sender(certified, &ClusterId::new(&message.cluster))?;
    Ok(match message.body {
        Some(agent_message::Body::Event(event)) => {
            Some(Up::Member(Inbound::Event(Box::new(decode(&event)?))))
        }
        Some(agent_message::Body::Heartbeat(beat)) => Some(Up::Member(Inbound::Heartbeat {
            member_ready: beat.member_ready,
            error: beat.error,
            watch_failure: beat.watch_failure,
        })),
        Some(agent_message::Body::Response(response)) => Some(Up::Answer(response)),
        None => None,
    })
}

/// The hub's agent service: joining and streams.
pub struct HubService<S> {
    pub joins: Joins<S>,
    pub streams: Streams,
}

#[tonic::async_trait]
impl<S: TokenStore> AgentHub for HubService<S> {
    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        self.joins.join(request).await
    }

    async fn connect(
        &self,
        request: Request<tonic::Streaming<AgentMessage>>,
    ) -> Result<Response<HubStream>, Status> {
        self.streams.connect(request).await
    }

    async fn renew(
        &self,
        request: Request<RenewRequest>,
    ) -> Result<Response<JoinResponse>, Status> {
        let (cluster, _) = certified(request.peer_certs().as_deref()).inspect_err(|_| {
            self.joins.metrics.renewal("refused");
        })?;
        let renewed = self
            .joins
            .renew(&cluster, &request.into_inner().csr_pem)
            .await?;
        let expires = crate::join::from_unix(renewed.not_after_unix);
        self.streams.routes.renewed(&cluster, expires);
        Ok(Response::new(renewed))
    }
}

#[cfg(test)]
mod tests;
