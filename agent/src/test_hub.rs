//! A hub serving the agent service on loopback, for the tests: real gRPC and TLS, a serving
//! certificate of a test CA, client certificates of the agent CA asked for (optional, as
//! `Join` needs none).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meridian_controllers::SourceEvent;
use meridian_controllers::agents::{self, AgentRoutes};
use meridian_controllers::kubernetes::Facts;
use meridian_core::agent::{Approval, BootstrapToken, Tokens};
use meridian_core::{ClusterId, HealthTimings};
use parking_lot::Mutex;
use rcgen::{CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tokio::sync::mpsc;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity, Server, ServerTlsConfig};

use crate::ca::AgentCa;
use crate::join::Joins;
use crate::metrics::AgentMetrics;
use crate::proto::AgentHubServer;
use crate::store::{StoreError, TokenStore};
use crate::stream::{HubService, Streams};

/// The tests' tokens in memory (`test_tokens`) with the changes joins recorded;
/// `read_only` refuses to record any.
#[derive(Default, Clone)]
pub(crate) struct Recorded {
    changed: Arc<Mutex<BTreeMap<String, BootstrapToken>>>,
    read_only: bool,
}

impl Recorded {
    pub(crate) fn read_only() -> Self {
        Self {
            read_only: true,
            ..Self::default()
        }
    }

    /// The ids of the tokens joins spent.
    pub(crate) fn spent(&self) -> Vec<String> {
        self.changed
            .lock()
            .values()
            .filter(|t| t.used)
            .map(|t| t.id.clone())
            .collect()
    }
}

#[tonic::async_trait]
impl TokenStore for Recorded {
    async fn tokens(&self) -> Result<Tokens, StoreError> {
        let changed = self.changed.lock();
        Ok(Tokens::new(
            test_tokens()
                .into_iter()
                .map(|t| changed.get(&t.id).cloned().unwrap_or(t)),
        ))
    }

    async fn token(&self, id: &str) -> Result<Option<BootstrapToken>, StoreError> {
        Ok(self.tokens().await?.get(id).cloned())
    }

    async fn replace(
        &self,
        _before: &BootstrapToken,
        after: &BootstrapToken,
    ) -> Result<(), StoreError> {
        if self.read_only {
            return Err(StoreError::Io {
                path: "tokens".into(),
                source: std::io::Error::other("the hub's store is read-only"),
            });
        }
        self.changed.lock().insert(after.id.clone(), after.clone());
        Ok(())
    }
}

pub(crate) struct TestHub {
    pub port: u16,
    pub serving_ca: String,
    pub ca: Arc<AgentCa>,
    /// What the agent member tasks of eu-1 and us-1 tell the store.
    pub inbound: mpsc::Receiver<SourceEvent>,
}

/// A token `id.0123456789abcdef` for `cluster`.
pub(crate) fn token(id: &str, cluster: &str, expires: SystemTime) -> BootstrapToken {
    BootstrapToken {
        id: id.into(),
        secret: "0123456789abcdef".into(),
        cluster: ClusterId::new(cluster),
        expires,
        used: false,
        request: None,
        approved: false,
    }
}

/// Tokens euone1 (eu-1), usone1 (us-1), both for an hour, and old001 (eu-1, expired).
fn test_tokens() -> Vec<BootstrapToken> {
    let now = SystemTime::now();
    vec![
        token("euone1", "eu-1", now + Duration::from_secs(3600)),
        token("usone1", "us-1", now + Duration::from_secs(3600)),
        token("old001", "eu-1", now - Duration::from_secs(1)),
    ]
}

/// A hub with agent members eu-1 and us-1 (heartbeats every second), signing valid tokens at
/// once.
pub(crate) async fn serve(store: Recorded) -> TestHub {
    serve_with(store, 100, Approval::Automatic).await
}

/// `serve`, admitting `per_second` new streams a second, with `approval` of joins.
pub(crate) async fn serve_with(store: Recorded, per_second: u32, approval: Approval) -> TestHub {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve_on(&HubIdentity::new(), listener, store, per_second, approval).await
}

/// What the replicas of one hub share: the agent CA, and a serving certificate for 127.0.0.1.
pub(crate) struct HubIdentity {
    cert: String,
    key: String,
    serving_ca: String,
    ca: Arc<AgentCa>,
}

impl HubIdentity {
    pub(crate) fn new() -> Self {
        let (cert, key, serving_ca) = serving();
        let (ca, _) = AgentCa::generate(SystemTime::now()).unwrap();
        Self {
            cert,
            key,
            serving_ca,
            ca: Arc::new(ca),
        }
    }

    /// Replicas serving with a certificate of the agent CA, as a real hub does: an agent
    /// trusts them by the CA its join brought back, as `meridian agent` does.
    pub(crate) fn of_agent_ca() -> Self {
        let (ca, _) = AgentCa::generate(SystemTime::now()).unwrap();
        let (cert, key) = ca
            .serving(
                &["127.0.0.1".to_string()],
                Duration::from_secs(3600),
                SystemTime::now(),
            )
            .unwrap();
        Self {
            cert,
            key,
            serving_ca: ca.cert_pem().to_string(),
            ca: Arc::new(ca),
        }
    }

    /// The CA an agent trusts the replicas by, as a file's contents.
    pub(crate) fn serving_ca(&self) -> &str {
        &self.serving_ca
    }
}

/// A replica of the hub of `identity` on `listener` (bound already: an agent may be told its
/// address before it serves), as `serve` makes one.
pub(crate) async fn replica(identity: &HubIdentity, listener: tokio::net::TcpListener) -> TestHub {
    serve_on(
        identity,
        listener,
        Recorded::default(),
        100,
        Approval::Automatic,
    )
    .await
}

async fn serve_on(
    identity: &HubIdentity,
    listener: tokio::net::TcpListener,
    store: Recorded,
    per_second: u32,
    approval: Approval,
) -> TestHub {
    let (cert, key, serving_ca) = (
        identity.cert.clone(),
        identity.key.clone(),
        identity.serving_ca.clone(),
    );
    let ca = identity.ca.clone();
    let (tx, inbound) = mpsc::channel(256);
    let routes = AgentRoutes::default();
    for cluster in ["eu-1", "us-1"] {
        let timings = HealthTimings {
            heartbeat_seconds: 1,
            ..HealthTimings::default()
        };
        tokio::spawn(agents::run(
            ClusterId::new(cluster),
            timings,
            routes.clone(),
            Facts::default(),
            tx.clone(),
        ));
    }
    while routes.members().len() < 2 {
        tokio::task::yield_now().await;
    }
    let hub = HubService {
        joins: Joins::new(
            ca.clone(),
            store,
            Duration::from_secs(60),
            approval,
            AgentMetrics::default(),
        ),
        streams: Streams::new(routes, AgentMetrics::default(), per_second),
    };
    let port = listener.local_addr().unwrap().port();
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(cert, key))
        .client_ca_root(Certificate::from_pem(ca.cert_pem()))
        .client_auth_optional(true);
    tokio::spawn(
        Server::builder()
            .tls_config(tls)
            .unwrap()
            .add_service(AgentHubServer::new(hub))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    TestHub {
        port,
        serving_ca,
        ca,
        inbound,
    }
}

/// The next store event about `cluster` that `wanted` picks, within 10 s (the members'
/// periodic "no agent has connected" heartbeats are passed over).
pub(crate) async fn next_where(
    hub: &mut TestHub,
    cluster: &str,
    wanted: impl Fn(&SourceEvent) -> bool,
) -> SourceEvent {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let event = tokio::time::timeout_at(deadline, hub.inbound.recv())
            .await
            .expect("the hub delivered nothing wanted within 10 s")
            .expect("the store's channel closed");
        let about = match &event {
            SourceEvent::Reset { cluster, .. }
            | SourceEvent::Changes { cluster, .. }
            | SourceEvent::Heartbeat { cluster, .. }
            | SourceEvent::WatchHealth { cluster, .. }
            | SourceEvent::Capacity { cluster, .. } => cluster.as_str(),
            _ => "",
        };
        if about == cluster && wanted(&event) {
            return event;
        }
    }
}

impl TestHub {
    /// A channel to the hub, with a client certificate (PEM cert and key) or none.
    pub(crate) async fn channel(&self, identity: Option<(&str, &str)>) -> Channel {
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.serving_ca))
            .domain_name("127.0.0.1");
        if let Some((cert, key)) = identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        Channel::from_shared(format!("https://127.0.0.1:{}", self.port))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap()
    }
}

/// A server certificate for 127.0.0.1 and the CA that signed it (PEM).
fn serving() -> (String, String, String) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, "hub test CA");
    ca.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    (cert.pem(), key.serialize_pem(), ca_cert.pem())
}
