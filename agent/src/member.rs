//! `meridian agent`: the member's side. It joins once (a bootstrap token for its key's
//! certificate), keeps its key and certificate (`state`: a directory or a Secret in its
//! member), and then holds a stream to every replica of the hub: its member's watch events and
//! a heartbeat every `heartbeatSeconds` the hub asks for. The member is watched once however
//! many streams there are (`watch_set.rs`): each new stream is given the state the watches
//! keep (as a relist), then their events as they come. Down each
//! stream come the hub's requests for the member's API — the MCS write-back, placed
//! workloads, tenant namespaces, the gateway's requests —, which it sends with its own
//! credentials and answers back (`api.rs`): the member's RBAC for the agent decides. It
//! renews its certificate at 75–80 % of its lifetime on the side, without dropping the stream,
//! and reconnects with jittered backoff. The agent writes nothing of its own: a hub that is
//! down or refuses it makes it delete nothing.
//!
//! ```text
//!  state: key.pem cert.pem ca.pem   (none: Join with --bootstrap-token-file)
//!  WatchSet::run: watch_all(member), once ─► store + a bounded queue per stream
//!  per replica: Connect (mTLS) ── Subscription: state, then events ─► up
//!                                 heartbeats (/readyz) ─► up
//!              ◄─ ApiRequest ─► api::carry (the member's client) ─► ApiResponse ─► up
//!  renew_at ─► Renew ─► state (whether or not a stream is up)
//! ```

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use meridian_controllers::kubernetes::connect::WatchTimeout;
use meridian_controllers::kubernetes::member::{readyz, watch_all};
use meridian_controllers::reason_of;
use meridian_core::ClusterId;
use meridian_core::agent::renew_at;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::ca::key_and_request;
use crate::join::{Asking, JoinError, Joined, join, unix};
use crate::metrics::AgentSide;
use crate::proto::{self, AgentMessage, Heartbeat, RenewRequest, agent_message::Body};
use crate::state::{AgentState, CA, CERT, KEY, Kept};
use crate::store::StoreError;
use crate::watch_set::{Subscription, WatchSet};

/// The longest wait between two attempts to reach the hub.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How often a join waiting for the operator's approval asks again.
const APPROVAL_POLL: Duration = Duration::from_secs(3);
/// How long connecting to the hub may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the hub's name is resolved again (a replica added or gone), and again after a
/// failed resolution.
const RESOLVE: Duration = Duration::from_secs(30);
const RESOLVE_RETRY: Duration = Duration::from_secs(5);
/// Messages waiting to go up one stream. A slow replica fills it and then falls behind the
/// shared watches (`watch_set.rs`: it is sent the whole state again), holding up no other.
const UP_QUEUE: usize = 1024;

/// What `meridian agent` is told.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    /// The hub's agent listener, `host:port`.
    pub hub: String,
    pub cluster: ClusterId,
    /// The bootstrap token (`id.secret`), for the first join.
    pub token_file: Option<PathBuf>,
    /// The CA the hub's serving certificate is signed by (the agent CA), for the first join.
    pub hub_ca_file: Option<PathBuf>,
    /// Where the key and certificates are kept.
    pub state: AgentState,
    pub watch_timeout: WatchTimeout,
}

/// Why the agent stops (anything else it retries).
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{path}")]
    State {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the agent has no certificate in its state directory and no --bootstrap-token-file to join with"
    )]
    NoToken,
    #[error("the agent has no certificate yet and no --hub-ca-file to trust the hub by")]
    NoHubCa,
    #[error("joining the hub")]
    Join(#[source] Box<JoinError>),
    #[error("the agent key in {0}")]
    Key(String, #[source] crate::ca::CaError),
    #[error("the agent's kept state")]
    Kept(#[from] StoreError),
    #[error("the hub at {0:?}")]
    Address(String, #[source] Box<dyn std::error::Error + Send + Sync>),
}

/// The agent's credentials, as kept in its state directory.
#[derive(Debug, Clone)]
struct Credentials {
    key_pem: String,
    certificate_pem: String,
    ca_pem: String,
    not_before: SystemTime,
    not_after: SystemTime,
}

impl From<Joined> for Credentials {
    fn from(j: Joined) -> Self {
        Self {
            key_pem: j.key_pem,
            certificate_pem: j.certificate_pem,
            ca_pem: j.ca_pem,
            not_before: j.not_before,
            not_after: j.not_after,
        }
    }
}

/// Runs the agent until the process ends; returns only when it cannot go on at all.
pub async fn run(
    settings: AgentSettings,
    member: kube::Client,
    side: AgentSide,
) -> Result<(), AgentError> {
    let credentials = credentials(&settings, &side).await?;
    side.update(|v| {
        v.hub.clone_from(&settings.hub);
        v.cluster = settings.cluster.to_string();
        v.certificate_expires_unix = unix(credentials.not_after);
    });
    let agent = Agent {
        watches: WatchSet::new(side.clone()),
        settings,
        member,
        credentials: Mutex::new(credentials),
        side,
    };
    // Renewal goes on whether or not a stream is up: a certificate must not lapse while the
    // hub is away (the token that made it is spent). So do the watches: a stream that opens
    // is given their state at once.
    let timeout = agent.settings.watch_timeout;
    tokio::select! {
        () = agent.watches.run(|| watch_all(&agent.member, timeout)) => {}
        () = agent.stay_connected() => {}
        () = agent.renew_when_due() => {}
    }
    Ok(())
}

/// The running agent.
struct Agent {
    settings: AgentSettings,
    member: kube::Client,
    /// The member's one set of watches, shared by the streams to every replica.
    watches: WatchSet,
    credentials: Mutex<Credentials>,
    side: AgentSide,
}

impl Agent {
    /// A stream to every address the hub's name resolves to (every replica behind a headless
    /// Service: each hears the member and writes it through its own stream), followed as the
    /// name resolves to others.
    async fn stay_connected(&self) {
        let mut streams: HashMap<SocketAddr, futures::future::AbortHandle> = HashMap::new();
        let mut running = futures::stream::FuturesUnordered::new();
        loop {
            let wait = match resolve(&self.settings.hub).await {
                Ok(addresses) => {
                    streams.retain(|address, stream| {
                        let kept = addresses.contains_key(address);
                        if !kept {
                            tracing::info!(%address, "the hub's name no longer resolves to this address: its stream ends");
                            stream.abort();
                            self.side.update(|v| v.stream_ended(*address));
                        }
                        kept
                    });
                    for (address, entry) in addresses {
                        if let std::collections::hash_map::Entry::Vacant(e) = streams.entry(address)
                        {
                            let (stream, handle) =
                                futures::future::abortable(self.stay_connected_to(address, entry));
                            e.insert(handle);
                            running.push(stream);
                        }
                    }
                    RESOLVE
                }
                Err(why) => {
                    tracing::warn!(hub = %self.settings.hub, %why, "cannot resolve the hub's name; keeping the streams held");
                    RESOLVE_RETRY
                }
            };
            let sleep = tokio::time::sleep(wait);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    () = &mut sleep => break,
                    Some(_) = running.next(), if !running.is_empty() => {}
                }
            }
        }
    }

    /// One stream after another to `address`, forever, with jittered backoff between them.
    async fn stay_connected_to(&self, address: SocketAddr, entry: String) {
        let mut backoff = Backoff::default();
        loop {
            let started = std::time::Instant::now();
            let ended = self.session(address, &entry).await;
            match &ended {
                Ok(()) => tracing::info!(%address, "the hub ended the stream; connecting again"),
                Err(why) => tracing::warn!(%address, %why, "no stream to the hub"),
            }
            self.side.reconnects.inc();
            self.side.update(|v| {
                v.stream_ended(address);
                v.since_unix = unix(SystemTime::now());
                v.last_error = ended.err();
            });
            // A stream that held a while was a working one: the next attempt starts quick. One
            // refused at once keeps backing off (a refused agent must not hammer the hub).
            if started.elapsed() > MAX_BACKOFF {
                backoff.reset();
            }
            let wait = backoff.next();
            tracing::debug!(?wait, "waiting before connecting again");
            tokio::time::sleep(wait).await;
        }
    }

    /// One stream to the hub's replica at `address`, until it ends.
    async fn session(&self, address: SocketAddr, entry: &str) -> Result<(), String> {
        let current = self.credentials.lock().clone();
        let identity = Some((current.certificate_pem.as_str(), current.key_pem.as_str()));
        let channel = channel(entry, Some(address), &current.ca_pem, identity)
            .await
            .map_err(|e| reason_of(&e))?;
        let (up, up_rx) = mpsc::channel(UP_QUEUE);
        let mut down = proto::connect(channel, tokio_stream::wrappers::ReceiverStream::new(up_rx))
            .await
            .map_err(|s| format!("the hub refused the stream: {}", s.message()))?;
        let hello = down
            .message()
            .await
            .map_err(|s| format!("the hub ended the stream: {}", s.message()))?
            .ok_or("the hub ended the stream at once")?;
        let heartbeat = Duration::from_secs(u64::from(hello.heartbeat_seconds.max(1)));
        tracing::info!(
            %address,
            heartbeat_seconds = heartbeat.as_secs(),
            "connected to the hub"
        );
        self.side.update(|v| {
            v.streams.insert(address.to_string());
            v.connected = true;
            v.since_unix = unix(SystemTime::now());
            v.heartbeat_seconds = heartbeat.as_secs();
        });
        // The first heartbeat goes before the member's state: the hub holds it until the state
        // is in, then counts the member healthy with its objects in one step (the state is
        // kept, so it would otherwise often come first, and the member would serve its objects
        // a heartbeat before it counts healthy).
        if !self.send_heartbeat(&up, heartbeat).await {
            return Err("the stream to the hub closed".into());
        }
        let subscription = self.watches.subscribe();
        let listening = self.carry_requests(&mut down, &up);
        tokio::select! {
            end = listening => end,
            () = self.send_watches(&up, subscription) => Err("the stream to the hub closed".into()),
            () = self.send_heartbeats(&up, heartbeat) => {
                Err("the stream to the hub closed".into())
            }
        }
    }

    /// The member's state, then its watch events as they come, sent up (the state again
    /// whenever this stream fell behind). Ends when the stream is gone.
    async fn send_watches(&self, up: &mpsc::Sender<AgentMessage>, mut events: Subscription<'_>) {
        loop {
            for item in events.next().await.events {
                let message = AgentMessage {
                    cluster: self.settings.cluster.to_string(),
                    body: Some(Body::Event(item.wire())),
                };
                if up.send(message).await.is_err() {
                    return;
                }
                self.side.events_sent.inc();
            }
        }
    }

    /// A heartbeat every `every`: whether the member's API is ready, and a failing watch.
    /// (The first one went before the member's state: `session`.)
    async fn send_heartbeats(&self, up: &mpsc::Sender<AgentMessage>, every: Duration) {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if !self.send_heartbeat(up, every).await {
                return;
            }
        }
    }

    /// One heartbeat (`/readyz` answered within `timeout`); false when the stream is gone.
    async fn send_heartbeat(&self, up: &mpsc::Sender<AgentMessage>, timeout: Duration) -> bool {
        let ready = readyz(&self.member, timeout).await;
        let beat = Heartbeat {
            member_ready: ready.is_ok(),
            error: ready.err().map(|(reason, _)| reason).unwrap_or_default(),
            watch_failure: self.watches.failure(),
        };
        let message = AgentMessage {
            cluster: self.settings.cluster.to_string(),
            body: Some(Body::Heartbeat(beat)),
        };
        if up.send(message).await.is_err() {
            return false;
        }
        self.side.heartbeats_sent.inc();
        true
    }

    /// Carries the hub's requests for the member's API, each on its own task (a watch lasts
    /// while the hub reads it), until the stream ends; the requests still running end with it.
    async fn carry_requests(
        &self,
        down: &mut tonic::Streaming<proto::HubMessage>,
        up: &mpsc::Sender<AgentMessage>,
    ) -> Result<(), String> {
        let mut running = tokio::task::JoinSet::new();
        let mut by_id = HashMap::new();
        loop {
            let message = tokio::select! {
                message = down.message() => message,
                Some(done) = running.join_next_with_id(), if !running.is_empty() => {
                    let task = match done {
                        Ok((task, ())) => task,
                        Err(e) => e.id(),
                    };
                    by_id.retain(|_, h: &mut tokio::task::AbortHandle| h.id() != task);
                    continue;
                }
            };
            let request = match message {
                Ok(Some(proto::HubMessage {
                    request: Some(request),
                    ..
                })) => request,
                Ok(Some(_)) => continue,
                Ok(None) => return Ok(()),
                Err(s) => return Err(format!("the hub ended the stream: {}", s.message())),
            };
            if request.cancel {
                if let Some(handle) = by_id.remove(&request.id) {
                    handle.abort();
                }
                continue;
            }
            self.side.api_requests.inc();
            let id = request.id;
            let handle = running.spawn(crate::api::carry(
                self.member.clone(),
                request,
                self.settings.cluster.to_string(),
                up.clone(),
            ));
            by_id.insert(id, handle);
        }
    }

    /// Renews the certificate at 75–80 % of its lifetime (jittered), forever; a failed
    /// renewal is tried again in a while (the current certificate holds until it expires).
    async fn renew_when_due(&self) {
        loop {
            let current = self.credentials.lock().clone();
            let due = renew_at(current.not_before, current.not_after, random_unit());
            let wait = due
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO);
            tokio::time::sleep(wait).await;
            match self.renew(&current).await {
                Ok(renewed) => {
                    if let Err(e) = save(&self.settings.state, &renewed).await {
                        tracing::error!(error = %reason_of(&e), "the renewed certificate cannot be kept");
                    }
                    tracing::info!(
                        expires_unix = unix(renewed.not_after),
                        "certificate renewed"
                    );
                    self.side.renewal("admitted");
                    self.side
                        .update(|v| v.certificate_expires_unix = unix(renewed.not_after));
                    *self.credentials.lock() = renewed;
                }
                Err(why) => {
                    tracing::warn!(%why, "cannot renew the certificate yet");
                    self.side.renewal("failed");
                    let left = current
                        .not_after
                        .duration_since(SystemTime::now())
                        .unwrap_or(Duration::ZERO);
                    tokio::time::sleep((left / 10).max(Duration::from_secs(1))).await;
                }
            }
        }
    }

    async fn renew(&self, current: &Credentials) -> Result<Credentials, String> {
        let identity = Some((current.certificate_pem.as_str(), current.key_pem.as_str()));
        let channel = channel(
            first_entry(&self.settings.hub),
            None,
            &current.ca_pem,
            identity,
        )
        .await
        .map_err(|e| reason_of(&e))?;
        let (key_pem, csr_pem) =
            key_and_request(&self.settings.cluster).map_err(|e| reason_of(&e))?;
        let answer = proto::renew(channel, RenewRequest { csr_pem })
            .await
            .map_err(|s| format!("the hub refused: {}", s.message()))?;
        let (not_before, not_after) =
            validity(&answer.certificate_pem).ok_or("the hub's certificate cannot be read")?;
        Ok(Credentials {
            key_pem,
            certificate_pem: answer.certificate_pem,
            ca_pem: answer.ca_pem,
            not_before,
            not_after,
        })
    }
}

/// The kept credentials, or new ones from a join (retried while the hub cannot be reached).
async fn credentials(
    settings: &AgentSettings,
    side: &AgentSide,
) -> Result<Credentials, AgentError> {
    if let Some(kept) = load(&settings.state).await? {
        if kept.not_after > SystemTime::now() {
            tracing::info!(
                expires_unix = unix(kept.not_after),
                "using the kept certificate"
            );
            return Ok(kept);
        }
        tracing::warn!("the kept certificate expired: joining again with the bootstrap token");
    }
    let token_file = settings.token_file.as_ref().ok_or(AgentError::NoToken)?;
    let token = std::fs::read_to_string(token_file).map_err(|source| AgentError::State {
        path: token_file.clone(),
        source,
    })?;
    let ca_file = settings.hub_ca_file.as_ref().ok_or(AgentError::NoHubCa)?;
    let hub_ca = std::fs::read_to_string(ca_file).map_err(|source| AgentError::State {
        path: ca_file.clone(),
        source,
    })?;
    let asking = asking(settings).await?;
    let mut backoff = Backoff::default();
    loop {
        let channel = channel(first_entry(&settings.hub), None, &hub_ca, None).await;
        let attempt = match channel {
            Ok(channel) => join(channel, &asking, &token).await,
            Err(e) => {
                tracing::warn!(error = %reason_of(&e), "cannot reach the hub to join");
                tokio::time::sleep(backoff.next()).await;
                continue;
            }
        };
        match attempt {
            Ok(joined) => {
                let credentials = Credentials::from(joined);
                save(&settings.state, &credentials).await?;
                tracing::info!(expires_unix = unix(credentials.not_after), "joined the hub");
                return Ok(credentials);
            }
            // Unreachable or busy: try again; refused (a bad, used or expired token): stop.
            Err(JoinError::Refused(status)) if status.code() == tonic::Code::Unavailable => {
                tracing::warn!(why = %status.message(), "the hub cannot admit us yet");
                tokio::time::sleep(backoff.next()).await;
            }
            // agent.autoApprove: false — asked; the same key asks again until approved.
            Err(JoinError::Refused(status)) if status.code() == tonic::Code::FailedPrecondition => {
                tracing::info!(why = %status.message(), "the join waits for the hub's approval");
                side.update(|v| v.last_error = Some(status.message().to_string()));
                tokio::time::sleep(APPROVAL_POLL).await;
            }
            Err(e) => return Err(AgentError::Join(Box::new(e))),
        }
    }
}

/// The key to join with: the one kept (a join that waited for approval, maybe across a
/// restart, asks with the key that was approved), else a new one, kept before it is first
/// sent.
async fn asking(settings: &AgentSettings) -> Result<Asking, AgentError> {
    let key_error = |e| AgentError::Key(settings.state.describe(), e);
    if let Some(key_pem) = settings.state.read().await?.key_pem {
        return Asking::with_key(&settings.cluster, key_pem).map_err(key_error);
    }
    let asking = Asking::new(&settings.cluster).map_err(key_error)?;
    settings.state.write(&[(KEY, &asking.key_pem)]).await?;
    Ok(asking)
}

/// The addresses `--hub` (`host:port`, or several, comma-separated) resolves to, each with
/// the entry that named it (whose host the hub's certificate must name).
async fn resolve(hub: &str) -> Result<BTreeMap<SocketAddr, String>, String> {
    let mut addresses = BTreeMap::new();
    for entry in hub_entries(hub) {
        let resolved = tokio::net::lookup_host(entry)
            .await
            .map_err(|e| format!("{entry}: {e}"))?;
        for address in resolved {
            addresses
                .entry(address)
                .or_insert_with(|| entry.to_string());
        }
    }
    if addresses.is_empty() {
        return Err(format!("{hub:?} resolves to no address"));
    }
    Ok(addresses)
}

/// The entries of `--hub`.
fn hub_entries(hub: &str) -> impl Iterator<Item = &str> {
    hub.split(',').map(str::trim).filter(|e| !e.is_empty())
}

/// The entry joins and renewals go to (any replica signs: they share the agent CA).
fn first_entry(hub: &str) -> &str {
    hub_entries(hub).next().unwrap_or(hub)
}

/// A TLS channel to the hub (at `address`, else wherever its name resolves to), trusting
/// `ca_pem` for the hub's name, with a client certificate or none.
async fn channel(
    hub: &str,
    address: Option<SocketAddr>,
    ca_pem: &str,
    identity: Option<(&str, &str)>,
) -> Result<Channel, AgentError> {
    let host = hub
        .rsplit_once(':')
        .map_or(hub, |(host, _)| host)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name(host);
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let target = address.map_or_else(|| hub.to_string(), |a| a.to_string());
    Channel::from_shared(format!("https://{target}"))
        .map_err(|e| AgentError::Address(hub.to_string(), e.into()))?
        .tls_config(tls)
        .map_err(|e| AgentError::Address(hub.to_string(), e.into()))?
        .connect_timeout(CONNECT_TIMEOUT)
        .connect()
        .await
        .map_err(|e| AgentError::Address(hub.to_string(), e.into()))
}

/// The credentials kept, if all of them are (and the certificate can be read).
async fn load(state: &AgentState) -> Result<Option<Credentials>, AgentError> {
    let Kept {
        key_pem: Some(key_pem),
        certificate_pem: Some(certificate_pem),
        ca_pem: Some(ca_pem),
    } = state.read().await?
    else {
        return Ok(None);
    };
    let Some((not_before, not_after)) = validity(&certificate_pem) else {
        tracing::warn!(state = %state.describe(), "the kept certificate cannot be read: joining again");
        return Ok(None);
    };
    Ok(Some(Credentials {
        key_pem,
        certificate_pem,
        ca_pem,
        not_before,
        not_after,
    }))
}

async fn save(state: &AgentState, c: &Credentials) -> Result<(), StoreError> {
    // The key before the certificate: a certificate is never kept beside another's key.
    state
        .write(&[
            (KEY, &c.key_pem),
            (CA, &c.ca_pem),
            (CERT, &c.certificate_pem),
        ])
        .await
}

/// A certificate's notBefore and notAfter.
fn validity(pem: &str) -> Option<(SystemTime, SystemTime)> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let (_, cert) = X509Certificate::from_der(&pem.contents).ok()?;
    let at = |t: x509_parser::time::ASN1Time| {
        u64::try_from(t.timestamp())
            .ok()
            .map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s))
    };
    Some((
        at(cert.validity().not_before)?,
        at(cert.validity().not_after)?,
    ))
}

/// Exponential backoff from half a second to `MAX_BACKOFF`, each wait jittered by ±50 %, so
/// a thousand agents that lost the hub at once do not come back at once.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: Duration::from_millis(500),
        }
    }
}

impl Backoff {
    fn next(&mut self) -> Duration {
        let wait = self.next.mul_f64(0.5 + random_unit());
        self.next = (self.next * 2).min(MAX_BACKOFF);
        wait
    }

    fn reset(&mut self) {
        *self = Self::default();
    }
}

/// A random number in [0, 1) from the system's CSPRNG (0.5 if it fails: jitter is a nicety).
pub(crate) fn random_unit() -> f64 {
    let mut bytes = [0u8; 4];
    match ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes) {
        Ok(()) => f64::from(u32::from_le_bytes(bytes)) / (f64::from(u32::MAX) + 1.0),
        Err(_) => 0.5,
    }
}

#[cfg(test)]
mod tests;
