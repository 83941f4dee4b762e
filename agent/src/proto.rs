//! The agent protocol, `meridian.agent.v1` (hand-written prost messages and the gRPC plumbing
//! tonic would generate; no protoc at build time).
//!
//! ```proto
//! service AgentHub {
//!   // Server-authenticated TLS only: the token is the credential.
//!   rpc Join(JoinRequest) returns (JoinResponse);
//!   // Mutual TLS: the agent CA's certificate names the cluster.
//!   rpc Connect(stream AgentMessage) returns (stream HubMessage);
//!   // Mutual TLS: a new certificate for the cluster the current one names.
//!   rpc Renew(RenewRequest) returns (JoinResponse);
//! }
//! message RenewRequest { string csr_pem = 1; }
//! message JoinRequest  { string cluster = 1; string token = 2; string csr_pem = 3; }
//! message JoinResponse { string certificate_pem = 1; string ca_pem = 2;
//!                        int64 not_before_unix = 3; int64 not_after_unix = 4; }
//! message WatchEvent   { string resource = 1; Phase phase = 2; bytes object_json = 3; }
//! enum Phase { APPLY = 0; DELETE = 1; INIT = 2; INIT_APPLY = 3; INIT_DONE = 4; }
//! message AgentMessage { string cluster = 1; oneof body { WatchEvent event = 2;
//!                          Heartbeat heartbeat = 3; ApiResponse response = 4; } }
//! message Heartbeat    { bool member_ready = 1; string error = 2; string watch_failure = 3; }
//! message HubMessage   { int64 hub_time_unix = 1; uint32 heartbeat_seconds = 2;
//!                        ApiRequest request = 5; }
//! // A request for the member's API, sent by the agent with its own credentials; `cancel`
//! // (with the id alone) ends one still running.
//! message ApiRequest   { uint64 id = 1; string method = 2; string path = 3;
//!                        repeated Header headers = 4; bytes body = 5; bool cancel = 6; }
//! // The answer in parts: the first carries status and headers, then data, the last `end`
//! // (with `error` when the answer broke off).
//! message ApiResponse  { uint64 id = 1; uint32 status = 2; repeated Header headers = 3;
//!                        bytes data = 4; bool end = 5; string error = 6; }
//! message Header       { string name = 1; bytes value = 2; }
//! ```

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codegen::{BoxFuture, Service, StdError, http};
use tonic::server::NamedService;
use tonic::{Request, Response, Status};

pub const SERVICE: &str = "meridian.agent.v1.AgentHub";
const JOIN: &str = "/meridian.agent.v1.AgentHub/Join";
const CONNECT: &str = "/meridian.agent.v1.AgentHub/Connect";
const RENEW: &str = "/meridian.agent.v1.AgentHub/Renew";

#[derive(Clone, PartialEq, prost::Message)]
pub struct JoinRequest {
    #[prost(string, tag = "1")]
    pub cluster: String,
    #[prost(string, tag = "2")]
    pub token: String,
    #[prost(string, tag = "3")]
    pub csr_pem: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct JoinResponse {
    #[prost(string, tag = "1")]
    pub certificate_pem: String,
    #[prost(string, tag = "2")]
    pub ca_pem: String,
    #[prost(int64, tag = "3")]
    pub not_before_unix: i64,
    #[prost(int64, tag = "4")]
    pub not_after_unix: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RenewRequest {
    #[prost(string, tag = "1")]
    pub csr_pem: String,
}

/// One watch event of a member, as the agent sends it up: the resource it is of, what
/// happened (kube's watcher events, relists included), the object as the member's API served
/// it (JSON; none for `Init` and `InitDone`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchEvent {
    #[prost(string, tag = "1")]
    pub resource: String,
    #[prost(enumeration = "Phase", tag = "2")]
    pub phase: i32,
    /// `Bytes`: the agent sends the same object to every replica without copying it.
    #[prost(bytes = "bytes", tag = "3")]
    pub object_json: bytes::Bytes,
}

/// What an agent sends on its stream: always the cluster it speaks for (checked against its
/// certificate), then an event or a heartbeat.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AgentMessage {
    #[prost(string, tag = "1")]
    pub cluster: String,
    #[prost(oneof = "agent_message::Body", tags = "2, 3, 4")]
    pub body: Option<agent_message::Body>,
}

pub mod agent_message {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Body {
        #[prost(message, tag = "2")]
        Event(super::WatchEvent),
        #[prost(message, tag = "3")]
        Heartbeat(super::Heartbeat),
        #[prost(message, tag = "4")]
        Response(super::ApiResponse),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Heartbeat {
    /// Whether the agent reaches its member's API (`/readyz`), and why not.
    #[prost(bool, tag = "1")]
    pub member_ready: bool,
    #[prost(string, tag = "2")]
    pub error: String,
    /// A watch of the member that fails (empty: none), as push members report theirs.
    #[prost(string, tag = "3")]
    pub watch_failure: String,
}

/// What the hub sends down: its time and the heartbeat it wants at first, then requests for
/// the member's API.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HubMessage {
    /// The hub's time, for the agent's log when clocks disagree.
    #[prost(int64, tag = "1")]
    pub hub_time_unix: i64,
    /// How often the hub wants heartbeats (the member's `health.heartbeatSeconds`).
    #[prost(uint32, tag = "2")]
    pub heartbeat_seconds: u32,
    #[prost(message, optional, tag = "5")]
    pub request: Option<ApiRequest>,
}

/// A request for the member's API (`api.rs` says which the agent carries).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ApiRequest {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(string, tag = "2")]
    pub method: String,
    /// Path and query.
    #[prost(string, tag = "3")]
    pub path: String,
    #[prost(message, repeated, tag = "4")]
    pub headers: Vec<Header>,
    #[prost(bytes = "vec", tag = "5")]
    pub body: Vec<u8>,
    /// Ends request `id` (its caller went): nothing else is set.
    #[prost(bool, tag = "6")]
    pub cancel: bool,
}

/// One part of an answer: the first has the status (never 0) and headers.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ApiResponse {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint32, tag = "2")]
    pub status: u32,
    #[prost(message, repeated, tag = "3")]
    pub headers: Vec<Header>,
    #[prost(bytes = "vec", tag = "4")]
    pub data: Vec<u8>,
    #[prost(bool, tag = "5")]
    pub end: bool,
    /// Why the answer broke off (with `end`).
    #[prost(string, tag = "6")]
    pub error: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Header {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Phase {
    Apply = 0,
    Delete = 1,
    /// A relist begins: what follows (InitApply…) replaces the resource's objects at InitDone.
    Init = 2,
    InitApply = 3,
    InitDone = 4,
}

/// The hub's stream of messages to one agent.
pub type HubStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<HubMessage, Status>> + Send>>;

/// What the hub answers.
#[tonic::async_trait]
pub trait AgentHub: Send + Sync + 'static {
    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status>;

    async fn connect(
        &self,
        request: Request<tonic::Streaming<AgentMessage>>,
    ) -> Result<Response<HubStream>, Status>;

    async fn renew(&self, request: Request<RenewRequest>)
    -> Result<Response<JoinResponse>, Status>;
}

/// The service to add to a tonic server.
pub struct AgentHubServer<T> {
    inner: Arc<T>,
}

impl<T> AgentHubServer<T> {
    pub fn new(inner: T) -> Self {
        Self {
            inner: Arc::new(inner),
        }
    }
}

impl<T> Clone for AgentHubServer<T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<T> NamedService for AgentHubServer<T> {
    const NAME: &'static str = SERVICE;
}

struct Join<T>(Arc<T>);

impl<T: AgentHub> tonic::server::UnaryService<JoinRequest> for Join<T> {
    type Response = JoinResponse;
    type Future = BoxFuture<Response<JoinResponse>, Status>;

    fn call(&mut self, request: Request<JoinRequest>) -> Self::Future {
        let hub = self.0.clone();
        Box::pin(async move { hub.join(request).await })
    }
}

struct Renew<T>(Arc<T>);

impl<T: AgentHub> tonic::server::UnaryService<RenewRequest> for Renew<T> {
    type Response = JoinResponse;
    type Future = BoxFuture<Response<JoinResponse>, Status>;

    fn call(&mut self, request: Request<RenewRequest>) -> Self::Future {
        let hub = self.0.clone();
        Box::pin(async move { hub.renew(request).await })
    }
}

struct Connect<T>(Arc<T>);

impl<T: AgentHub> tonic::server::StreamingService<AgentMessage> for Connect<T> {
    type Response = HubMessage;
    type ResponseStream = HubStream;
    type Future = BoxFuture<Response<HubStream>, Status>;

    fn call(&mut self, request: Request<tonic::Streaming<AgentMessage>>) -> Self::Future {
        let hub = self.0.clone();
        Box::pin(async move { hub.connect(request).await })
    }
}

impl<T, B> Service<http::Request<B>> for AgentHubServer<T>
where
    T: AgentHub,
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::BoxBody>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        match request.uri().path() {
            JOIN => {
                let join = Join(self.inner.clone());
                Box::pin(async move {
                    let mut grpc = tonic::server::Grpc::new(tonic::codec::ProstCodec::default());
                    Ok(grpc.unary(join, request).await)
                })
            }
            RENEW => {
                let renew = Renew(self.inner.clone());
                Box::pin(async move {
                    let mut grpc = tonic::server::Grpc::new(tonic::codec::ProstCodec::default());
                    Ok(grpc.unary(renew, request).await)
                })
            }
            CONNECT => {
                let connect = Connect(self.inner.clone());
                Box::pin(async move {
                    let mut grpc = tonic::server::Grpc::new(tonic::codec::ProstCodec::default());
                    Ok(grpc.streaming(connect, request).await)
                })
            }
            _ => Box::pin(async {
                Ok(
                    Status::unimplemented("no such method in meridian.agent.v1.AgentHub")
                        .into_http(),
                )
            }),
        }
    }
}

/// The agent's side of `Join`.
pub async fn join(
    channel: tonic::transport::Channel,
    request: JoinRequest,
) -> Result<JoinResponse, Status> {
    unary(channel, JOIN, request).await
}

/// The agent's side of `Renew` (on a channel with the agent's current certificate).
pub async fn renew(
    channel: tonic::transport::Channel,
    request: RenewRequest,
) -> Result<JoinResponse, Status> {
    unary(channel, RENEW, request).await
}

async fn unary<Q: prost::Message + 'static, A: prost::Message + Default + 'static>(
    channel: tonic::transport::Channel,
    path: &'static str,
    request: Q,
) -> Result<A, Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("the hub is not ready: {e}")))?;
    let path = http::uri::PathAndQuery::from_static(path);
    grpc.unary(
        Request::new(request),
        path,
        tonic::codec::ProstCodec::default(),
    )
    .await
    .map(Response::into_inner)
}

/// The agent's side of `Connect`: `up` goes to the hub, the hub's messages come back.
pub async fn connect(
    channel: tonic::transport::Channel,
    up: impl futures::Stream<Item = AgentMessage> + Send + 'static,
) -> Result<tonic::Streaming<HubMessage>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("the hub is not ready: {e}")))?;
    let path = http::uri::PathAndQuery::from_static(CONNECT);
    grpc.streaming(Request::new(up), path, tonic::codec::ProstCodec::default())
        .await
        .map(Response::into_inner)
}
