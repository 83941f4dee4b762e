//! Kubernetes API requests to an agent member, carried over its agent's stream: the hub's
//! client for a member it holds no credential for.
//!
//! ```text
//!  writer (write-back, propagation, tenants, gateway) ─► kube::Client ─► Tunnel::call
//!     ─► the member's newest stream (AgentRoutes) ─► ApiCall ─► the stream's reader
//!        (meridian-agent) ─► the agent, which sends it with its own credentials ─►
//!  ResponsePart::Head, Data…, End ◄─ the reader ◄─ the agent's answer, streamed back
//! ```
//!
//! A `Client` made here is the member's `MemberFacts::client`, so whatever writes or watches a
//! push member does the same to an agent member, and the member's RBAC for the *agent* decides.
//! A request waits for no stream: with none open it fails at once, as a request to a member
//! API server that is down does. A fenced tunnel (`Tunnel::fenced`, the member's writer) asks
//! `Leadership::may_write` when the request is handed to the stream, so a request that waited
//! in kube's buffer past the renew deadline (a frozen process) never reaches the agent.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Frame;
use meridian_core::ClusterId;
use tokio::sync::mpsc;

use super::leader::Leadership;

mod routes;
pub use routes::{AgentRoutes, AgentStream, Connection, Inbound, NotAnAgentMember};

/// Bytes of one answer waiting for its caller; a caller that falls this far behind (a watch
/// nobody reads) loses its request rather than hold the whole stream up or grow without end.
pub const MAX_QUEUED_BYTES: usize = 64 << 20;
/// How long an answer's head may take (a watch's head comes at once; its events have no
/// deadline).
const HEAD_TIMEOUT: Duration = Duration::from_secs(60);

/// One request for the member's API, on its way to the agent.
#[derive(Debug)]
pub struct ApiCall {
    pub method: http::Method,
    /// Path and query, as the API server is asked (the agent's client adds its own base).
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// Where the answer goes, part by part.
    pub respond: Respond,
}

/// Where one answer goes: never waits (the stream's reader serves every request of the
/// member), but holds at most `MAX_QUEUED_BYTES` its caller has not read.
#[derive(Debug, Clone)]
pub struct Respond {
    tx: mpsc::UnboundedSender<ResponsePart>,
    queued: Arc<AtomicUsize>,
}

/// Why a part of an answer cannot be delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undeliverable {
    /// The caller went (a watch ended, a request timed out).
    Gone,
    /// The caller fell `MAX_QUEUED_BYTES` behind.
    Overflow,
}

impl Respond {
    /// Where an answer goes, and the body its caller reads it from (after the head).
    pub fn channel(cluster: &ClusterId) -> (Self, TunnelBody) {
        let (tx, parts) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let body = TunnelBody {
            parts,
            queued: queued.clone(),
            cluster: cluster.clone(),
            done: false,
        };
        (Self { tx, queued }, body)
    }

    pub fn send(&self, part: ResponsePart) -> Result<(), Undeliverable> {
        if let ResponsePart::Data(data) = &part {
            let queued = self.queued.fetch_add(data.len(), Ordering::Relaxed) + data.len();
            if queued > MAX_QUEUED_BYTES {
                let _ = self.tx.send(ResponsePart::End(Err(format!(
                    "the caller fell more than {MAX_QUEUED_BYTES} bytes behind the answer"
                ))));
                return Err(Undeliverable::Overflow);
            }
        }
        self.tx.send(part).map_err(|_| Undeliverable::Gone)
    }
}

/// One part of the member's answer, as the agent streams it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponsePart {
    Head {
        status: u16,
        headers: HeaderMap,
    },
    Data(Bytes),
    /// The answer is complete, or why it broke off.
    End(Result<(), String>),
}

/// Why a request through an agent's stream failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TunnelError {
    #[error("no agent is connected for member {0}")]
    NoStream(ClusterId),
    #[error("this replica may not write member {0} now")]
    NotWriting(ClusterId),
    #[error("the stream of member {0}'s agent ended before the answer did")]
    StreamEnded(ClusterId),
    #[error("member {0}'s agent sent no answer within {1:?}")]
    Timeout(ClusterId, Duration),
    #[error("the request body cannot be read: {0}")]
    Body(String),
    #[error("member {0}'s agent: {1}")]
    Agent(ClusterId, String),
}

/// The hub's way to member `cluster`'s API, through whichever stream its agent holds now.
#[derive(Clone)]
pub struct Tunnel {
    routes: AgentRoutes,
    cluster: ClusterId,
    fence: Option<Leadership>,
}

impl std::fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tunnel")
            .field("cluster", &self.cluster)
            .field("fenced", &self.fence.is_some())
            .finish()
    }
}

impl Tunnel {
    pub fn new(routes: AgentRoutes, cluster: ClusterId) -> Self {
        Self {
            routes,
            cluster,
            fence: None,
        }
    }

    /// The same way, refusing every request once `leadership` may no longer write.
    pub fn fenced(&self, leadership: Leadership) -> Self {
        Self {
            fence: Some(leadership),
            ..self.clone()
        }
    }

    /// A kube client whose requests go this way.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.clone(), "default")
    }

    async fn send(self, request: http::Request<kube::client::Body>) -> Result<Answer, TunnelError> {
        let (head, body) = request.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| TunnelError::Body(e.to_string()))?
            .to_bytes();
        let path = head
            .uri
            .path_and_query()
            .map_or_else(|| head.uri.path().to_string(), ToString::to_string);
        let (respond, mut answer) = Respond::channel(&self.cluster);
        let call = ApiCall {
            method: head.method,
            path,
            headers: head.headers,
            body,
            respond,
        };
        if self.fence.as_ref().is_some_and(|l| !l.may_write()) {
            return Err(TunnelError::NotWriting(self.cluster));
        }
        let calls = self
            .routes
            .calls_of(&self.cluster)
            .ok_or_else(|| TunnelError::NoStream(self.cluster.clone()))?;
        calls
            .send(call)
            .await
            .map_err(|_| TunnelError::StreamEnded(self.cluster.clone()))?;
        let first = tokio::time::timeout(HEAD_TIMEOUT, answer.parts.recv())
            .await
            .map_err(|_| TunnelError::Timeout(self.cluster.clone(), HEAD_TIMEOUT))?;
        match first {
            Some(ResponsePart::Head { status, headers }) => Ok(Answer {
                status,
                headers,
                body: answer,
            }),
            Some(ResponsePart::End(Err(why))) => Err(TunnelError::Agent(self.cluster, why)),
            Some(_) | None => Err(TunnelError::StreamEnded(self.cluster)),
        }
    }
}

struct Answer {
    status: u16,
    headers: HeaderMap,
    body: TunnelBody,
}

impl tower::Service<http::Request<kube::client::Body>> for Tunnel {
    type Response = http::Response<TunnelBody>;
    type Error = TunnelError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, TunnelError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), TunnelError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let tunnel = self.clone();
        Box::pin(async move {
            let answer = tunnel.send(request).await?;
            let mut response = http::Response::new(answer.body);
            *response.status_mut() =
                StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
            *response.headers_mut() = answer.headers;
            Ok(response)
        })
    }
}

/// An answer's body as the agent streams it.
pub struct TunnelBody {
    parts: mpsc::UnboundedReceiver<ResponsePart>,
    queued: Arc<AtomicUsize>,
    cluster: ClusterId,
    done: bool,
}

impl hyper::body::Body for TunnelBody {
    type Data = Bytes;
    type Error = TunnelError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, TunnelError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let part = std::task::ready!(self.parts.poll_recv(cx));
        let frame = match part {
            Some(ResponsePart::Data(data)) => {
                self.queued.fetch_sub(data.len(), Ordering::Relaxed);
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            Some(ResponsePart::End(Ok(()))) => None,
            Some(ResponsePart::End(Err(why))) => {
                Some(Err(TunnelError::Agent(self.cluster.clone(), why)))
            }
            Some(ResponsePart::Head { .. }) | None => {
                Some(Err(TunnelError::StreamEnded(self.cluster.clone())))
            }
        };
        self.done = true;
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests;
