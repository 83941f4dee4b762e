//! The tonic side: ADS (SotW and delta) and CSDS services, the debounced view of the fleet,
//! the per-group resource cache and stream admission. Streams are driven by the state
//! machines in `stream`; this module only moves messages and counts them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::Stream;
use meridian_core::Snapshot;
use meridian_core::admission::TokenBucket;
use moka::sync::Cache;
use parking_lot::Mutex;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};
use tracing::{Instrument, debug, info, warn};
use xds_api::pb::envoy::config::core::v3::Node;
use xds_api::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use xds_api::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use xds_api::pb::envoy::service::status::v3::client_status_discovery_service_server::{
    ClientStatusDiscoveryService, ClientStatusDiscoveryServiceServer,
};
use xds_api::pb::envoy::service::status::v3::{ClientStatusRequest, ClientStatusResponse};

use crate::csds;
use crate::metrics::{ReasonLabels, StreamLabels, TypeLabels, UnsupportedLabels, XdsMetrics};
use crate::node::{Group, NodeInfo};
use crate::resources::{self, Resources};
use crate::stream::{DeltaStream, Event, SotwStream, Step, StreamError, StreamStatus};

/// Settings of the xDS server (`xds:` in the config file).
#[derive(Clone, Debug)]
pub struct XdsConfig {
    /// Quiet time before a change is pushed.
    pub debounce: Duration,
    /// A stream of changes is pushed at least this often.
    pub debounce_max: Duration,
    /// New streams admitted per second (and the burst).
    pub admission_per_second: u32,
    pub tls: Option<TlsFiles>,
    /// HTTP/2 streams one connection may have open (SETTINGS_MAX_CONCURRENT_STREAMS): an
    /// Envoy or gRPC client needs one ADS stream, a flood of them is refused.
    pub max_concurrent_streams: u32,
    /// HTTP/2 PING this often on every connection; a peer that does not answer within
    /// `keepalive_timeout` is dropped (and a live one is never idle).
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
}

impl Default for XdsConfig {
    fn default() -> Self {
        Self {
            debounce: Duration::from_millis(100),
            debounce_max: Duration::from_secs(1),
            admission_per_second: 1000,
            tls: None,
            max_concurrent_streams: 100,
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
        }
    }
}

/// PEM files for TLS on the xDS listener; with a client CA, clients must present a
/// certificate it signed.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// Responses buffered per stream: a client that stops reading holds back only itself.
const STREAM_BUFFER: usize = 16;
/// gRPC's default is 4 MiB; a 100,000-name subscription fits, anything far larger is refused.
pub const MAX_REQUEST_BYTES: usize = 8 << 20;

/// The xDS server's shared state.
pub struct Xds {
    config: XdsConfig,
    /// The fleet as pushed: the store's snapshots after the debounce.
    views: watch::Receiver<Arc<Snapshot>>,
    /// The store's latest snapshot, for labels (not debounced).
    latest_snapshot: watch::Receiver<Arc<Snapshot>>,
    cache: Cache<(Group, u64), Arc<Resources>>,
    /// The latest build per group, which the next build reuses unchanged services from.
    latest: Mutex<HashMap<Group, Arc<Resources>>>,
    streams: Mutex<HashMap<u64, Arc<Mutex<dyn Machine>>>>,
    next_stream: AtomicU64,
    admission: Mutex<TokenBucket>,
    pub metrics: XdsMetrics,
}

impl Xds {
    /// Starts the debounce task over `snapshots` and returns the server state.
    pub fn new(
        config: XdsConfig,
        snapshots: watch::Receiver<Arc<Snapshot>>,
        registry: &mut Registry,
    ) -> Arc<Self> {
        if let Some(tls) = &config.tls {
            register_certificate_expiry(tls, registry);
        }
        let (tx, views) = watch::channel(snapshots.borrow().clone());
        let latest_snapshot = snapshots.clone();
        tokio::spawn(debounce(
            snapshots,
            tx,
            config.debounce,
            config.debounce_max,
        ));
        Arc::new(Self {
            admission: Mutex::new(TokenBucket::new(
                config.admission_per_second,
                Instant::now(),
            )),
            config,
            views,
            latest_snapshot,
            // Entries are whole resource sets; older versions are invalidated as newer ones
            // are built, so this holds about one per node group.
            cache: Cache::builder()
                .max_capacity(1024)
                .time_to_idle(Duration::from_secs(600))
                .eviction_policy(moka::policy::EvictionPolicy::lru())
                .build(),
            latest: Mutex::new(HashMap::new()),
            streams: Mutex::new(HashMap::new()),
            next_stream: AtomicU64::new(1),
            metrics: XdsMetrics::new(registry),
        })
    }

    /// The resources a node in `group` receives from `snapshot`, built once per group and
    /// snapshot version however many nodes ask.
    pub fn resources_for(&self, snapshot: &Snapshot, group: &Group) -> Arc<Resources> {
        let group = canonical(snapshot, group);
        self.cache.get_with((group.clone(), snapshot.version), || {
            self.metrics.view_builds.inc();
            let prev = self.latest.lock().get(&group).cloned();
            let started = Instant::now();
            let built = Arc::new(resources::build_from(
                snapshot,
                &group,
                started,
                prev.as_deref(),
            ));
            let took = started.elapsed();
            self.metrics.view_build_seconds.observe(took.as_secs_f64());
            self.record_decisions(&built.decisions);
            debug!(%group, version = snapshot.version, took_ms = took.as_secs_f64() * 1000.0, resources = built.len(), "xDS resources built");
            let mut latest = self.latest.lock();
            if latest
                .get(&group)
                .is_none_or(|p| p.snapshot_version < built.snapshot_version)
                && let Some(older) = latest.insert(group.clone(), built.clone())
            {
                // Streams only ever ask for the newest version: an older one is dead weight
                // (a full set of resources per group and version).
                self.cache.invalidate(&(group, older.snapshot_version));
            }
            built
        })
    }

    /// The resources a node in `group` would receive from `snapshot` at `now`, built apart
    /// from the cache and the streams (a what-if's imagined fleet shares its version with
    /// the real one, and must never be served).
    pub fn resources_imagined(
        &self,
        snapshot: &Snapshot,
        group: &Group,
        now: Instant,
    ) -> Resources {
        resources::build_from(snapshot, &canonical(snapshot, group), now, None)
    }

    /// What every connected stream holds, for CSDS and `/debug/xds`.
    pub fn stream_statuses(&self) -> Vec<StreamStatus> {
        let streams: Vec<_> = self.streams.lock().values().cloned().collect();
        streams.iter().map(|m| m.lock().status()).collect()
    }

    /// Serves ADS and CSDS on `listener` until `shutdown` resolves. The listener bounds the
    /// connections and survives accept errors (tonic's own incoming stream ends on the first
    /// one, and the port with it).
    pub async fn serve(
        self: Arc<Self>,
        listener: meridian_listen::Listener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), XdsError> {
        let mut builder = tonic::transport::Server::builder()
            .max_concurrent_streams(Some(self.config.max_concurrent_streams))
            .http2_keepalive_interval(Some(self.config.keepalive_interval))
            .http2_keepalive_timeout(Some(self.config.keepalive_timeout));
        if let Some(tls) = &self.config.tls {
            builder = builder.tls_config(tls_config(tls)?)?;
        }
        let ads = AggregatedDiscoveryServiceServer::new(Ads(self.clone()))
            .max_decoding_message_size(MAX_REQUEST_BYTES);
        let csds = ClientStatusDiscoveryServiceServer::new(Csds(self.clone()))
            .max_decoding_message_size(MAX_REQUEST_BYTES);
        let incoming = futures::stream::unfold(listener, |listener| async move {
            let conn = XdsConn(listener.accept().await);
            Some((Ok::<_, std::io::Error>(conn), listener))
        });
        builder
            .add_service(ads)
            .add_service(csds)
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await?;
        Ok(())
    }

    /// Runs one stream to its end.
    async fn drive<P: Protocol>(
        self: Arc<Self>,
        mut inbound: Streaming<P::Request>,
        out: mpsc::Sender<Result<P::Response, Status>>,
    ) {
        self.admit().await;
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let machine = Arc::new(Mutex::new(P::default()));
        self.streams.lock().insert(id, machine.clone());
        let mut views = self.views.clone();
        let mut open: Option<OpenStream> = None;
        let end = loop {
            let step = tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(req)) => {
                        if open.is_none() && let Some(node) = P::node_of(&req) {
                            open = Some(self.open_stream::<P>(id, node, &machine, &mut views));
                        }
                        match machine.lock().on_request(&req, Instant::now()) {
                            Ok(step) => step,
                            Err(e) => break Some(e),
                        }
                    }
                    Ok(None) => break None,
                    Err(status) => match inbound_failure(&status) {
                        Some(told) => {
                            self.metrics
                                .stream_errors
                                .get_or_create(&ReasonLabels { reason: "request_too_large" })
                                .inc();
                            warn!(stream = id, limit_bytes = MAX_REQUEST_BYTES, error = %status.message(), "xDS request over the size limit: stream ended with RESOURCE_EXHAUSTED");
                            let _ = out.send(Err(told)).await;
                            break None;
                        }
                        None => {
                            debug!(stream = id, %status, "xDS stream ended by the client");
                            break None;
                        }
                    },
                },
                changed = views.changed(), if open.is_some() => {
                    if changed.is_err() {
                        break None;
                    }
                    let snapshot = views.borrow_and_update().clone();
                    let group = &open.as_ref().expect("checked").group;
                    let view = self.resources_for(&snapshot, group);
                    machine.lock().on_view(view, Instant::now())
                }
            };
            if let Some(open) = open.as_mut() {
                open.subscribed.extend(self.count(&step.events));
            } else {
                self.count(&step.events);
            }
            if !self.send::<P>(&out, step.responses).await {
                break None;
            }
        };
        if let Some(error) = end {
            self.refuse(id, error, &out).await;
        }
        self.close_stream(id, open);
    }

    /// Waits for admission: a reconnect storm queues here, each stream until its own slot.
    async fn admit(&self) {
        let wait = self.admission.lock().reserve(Instant::now());
        if !wait.is_zero() {
            self.metrics.admission_waits.inc();
            self.metrics.admission_waiting.inc();
            tokio::time::sleep(wait).await;
            self.metrics.admission_waiting.dec();
        }
    }

    /// The stream's first node: its group, its first view, its metrics.
    fn open_stream<P: Protocol>(
        &self,
        id: u64,
        node: &Node,
        machine: &Mutex<P>,
        views: &mut watch::Receiver<Arc<Snapshot>>,
    ) -> OpenStream {
        let info = NodeInfo::from_node(node.clone());
        let view = self.resources_for(&views.borrow_and_update(), &info.group);
        machine.lock().on_view(view, Instant::now());
        let labels = self.stream_labels(P::NAME, &info.group);
        self.metrics.streams.get_or_create(&labels).inc();
        debug!(stream = id, node = %info.id, group = %info.group, protocol = P::NAME, "xDS stream opened");
        OpenStream {
            group: info.group,
            labels,
            subscribed: Vec::new(),
        }
    }

    /// Sends responses in order; false once the client is gone.
    async fn send<P: Protocol>(
        &self,
        out: &mpsc::Sender<Result<P::Response, Status>>,
        responses: Vec<P::Response>,
    ) -> bool {
        if responses.is_empty() {
            return true;
        }
        let span = tracing::info_span!("xds.push", protocol = P::NAME, responses = responses.len());
        async {
            for response in responses {
                self.metrics
                    .pushes
                    .get_or_create(&type_labels(P::type_url_of(&response)))
                    .inc();
                if out.send(Ok(response)).await.is_err() {
                    return false;
                }
            }
            true
        }
        .instrument(span)
        .await
    }

    async fn refuse<R>(&self, id: u64, error: StreamError, out: &mpsc::Sender<Result<R, Status>>) {
        let reason = match error {
            StreamError::MissingNode => "missing_node",
            StreamError::TooManyNames { .. } => "too_many_names",
        };
        self.metrics
            .stream_errors
            .get_or_create(&ReasonLabels { reason })
            .inc();
        warn!(stream = id, %error, "xDS stream refused");
        let status = match error {
            StreamError::MissingNode => Status::invalid_argument(error.to_string()),
            StreamError::TooManyNames { .. } => Status::resource_exhausted(error.to_string()),
        };
        let _ = out.send(Err(status)).await;
    }

    fn close_stream(&self, id: u64, open: Option<OpenStream>) {
        if let Some(open) = open {
            self.metrics.streams.get_or_create(&open.labels).dec();
            for resource in open.subscribed {
                self.metrics
                    .subscriptions
                    .get_or_create(&TypeLabels { resource })
                    .dec();
            }
        }
        self.streams.lock().remove(&id);
    }

    fn stream_labels(&self, protocol: &'static str, group: &Group) -> StreamLabels {
        let snapshot = self.latest_snapshot.borrow();
        let cluster = group
            .cluster
            .as_deref()
            .filter(|c| snapshot.cluster_index(c).is_some())
            .unwrap_or("unknown")
            .to_owned();
        StreamLabels { protocol, cluster }
    }

    fn record_decisions(&self, stats: &resources::DecisionStats) {
        for (first_tier, n) in &stats.by_first_tier {
            self.metrics.decisions.decided(first_tier, *n);
        }
        self.metrics
            .decisions
            .merged(stats.spills, stats.failing_back);
    }

    /// Counts a step's events; returns the types newly subscribed to.
    fn count(&self, events: &[Event]) -> Vec<&'static str> {
        let mut subscribed = Vec::new();
        for event in events {
            match event {
                Event::Subscribed { kind } => {
                    self.metrics
                        .subscriptions
                        .get_or_create(&TypeLabels {
                            resource: kind.short(),
                        })
                        .inc();
                    subscribed.push(kind.short());
                }
                Event::Ack { kind, latency } => {
                    self.metrics
                        .acks
                        .get_or_create(&TypeLabels {
                            resource: kind.short(),
                        })
                        .inc();
                    self.metrics.push_to_ack.observe(latency.as_secs_f64());
                }
                Event::Nack { kind, error } => {
                    self.metrics
                        .nacks
                        .get_or_create(&TypeLabels {
                            resource: kind.short(),
                        })
                        .inc();
                    info!(r#type = kind.short(), %error, "xDS client refused a response (NACK)");
                }
                Event::StaleNonce { kind } => {
                    self.metrics
                        .stale_nonces
                        .get_or_create(&TypeLabels {
                            resource: kind.short(),
                        })
                        .inc();
                }
                Event::Unsupported {
                    label,
                    type_url,
                    first,
                } => {
                    self.metrics
                        .unsupported_types
                        .get_or_create(&UnsupportedLabels { type_url: label })
                        .inc();
                    if *first {
                        info!(%type_url, "xDS request for a type meridian does not serve: ignored, the stream stays open (see /debug/xds)");
                    }
                }
            }
        }
        subscribed
    }
}

/// What the client is told when its request stream fails on the server's side: a request
/// over the size limit ends the stream with RESOURCE_EXHAUSTED naming the limit (tonic's
/// decoder reports it as OUT_OF_RANGE, and dropping the stream would end it with OK). `None`
/// for the client's own doing (a reset, a cancel): nobody is left to tell.
pub fn inbound_failure(status: &Status) -> Option<Status> {
    let too_large = status.code() == tonic::Code::OutOfRange
        && status.message().contains("message length too large");
    too_large.then(|| {
        Status::resource_exhausted(format!(
            "request larger than meridian's limit of {MAX_REQUEST_BYTES} bytes ({} MiB): {}",
            MAX_REQUEST_BYTES >> 20,
            status.message()
        ))
    })
}

/// An accepted xDS connection, with what tonic asks of one.
struct XdsConn(meridian_listen::Conn<tokio::net::TcpStream>);

impl tonic::transport::server::Connected for XdsConn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.0.get_ref().connect_info()
    }
}

impl tokio::io::AsyncRead for XdsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for XdsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

/// A stream whose node is known.
struct OpenStream {
    group: Group,
    labels: StreamLabels,
    /// Types it subscribed to, to take off the gauge when it ends.
    subscribed: Vec<&'static str>,
}

/// The group as far as it changes what a node receives: a cluster the fleet does not know is
/// no cluster, and a network no cluster is on is "some other network". Nodes choose these
/// strings freely; canonical groups keep the caches bounded by the fleet, not by the nodes.
fn canonical(snapshot: &Snapshot, group: &Group) -> Group {
    const OTHER_NETWORK: &str = "<other>";
    let cluster = group
        .cluster
        .clone()
        .filter(|c| snapshot.cluster_index(c).is_some());
    let network = group.network.as_ref().map(|n| {
        if snapshot
            .clusters
            .iter()
            .any(|c| c.spec.network.as_deref() == Some(n.as_str()))
        {
            n.clone()
        } else {
            OTHER_NETWORK.to_owned()
        }
    });
    Group {
        cluster,
        network,
        role: group.role,
    }
}

fn type_labels(type_url: &str) -> TypeLabels {
    TypeLabels {
        resource: resources::Kind::from_type_url(type_url).map_or("other", |k| k.short()),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    #[error("cannot read {path}: {source}")]
    TlsFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),
}

fn tls_config(files: &TlsFiles) -> Result<ServerTlsConfig, XdsError> {
    let read = |path: &PathBuf| {
        std::fs::read(path).map_err(|source| XdsError::TlsFile {
            path: path.clone(),
            source,
        })
    };
    let mut tls =
        ServerTlsConfig::new().identity(Identity::from_pem(read(&files.cert)?, read(&files.key)?));
    if let Some(ca) = &files.client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(read(ca)?));
    }
    Ok(tls)
}

/// `meridian_xds_tls_certificate_expiry_timestamp_seconds`: when the served certificate stops
/// being valid, for an alert well before it does. Only with TLS: a 0 would look expired.
fn register_certificate_expiry(tls: &TlsFiles, registry: &mut Registry) {
    let expiry = std::fs::read(&tls.cert)
        .map_err(|e| e.to_string())
        .and_then(|pem| crate::certificate::not_after(&pem).map_err(|e| e.to_string()));
    match expiry {
        Ok(at) => {
            let seconds = at
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let gauge = prometheus_client::metrics::gauge::Gauge::<i64>::default();
            gauge.set(i64::try_from(seconds).unwrap_or(i64::MAX));
            registry.register(
                "tls_certificate_expiry_timestamp_seconds",
                "When the xDS server's TLS certificate expires (its notAfter), in Unix seconds",
                gauge,
            );
        }
        Err(e) => {
            tracing::warn!(cert = %tls.cert.display(), error = %e, "cannot read the xDS certificate's expiry; no expiry metric");
        }
    }
}

/// Checks that TLS files are readable before the server starts, for a clear start-up error.
pub fn check_tls(files: &TlsFiles) -> Result<(), XdsError> {
    tls_config(files).map(|_| ())
}

/// Publishes `input` on `output` after `quiet` without changes, and at least every `max`
/// while changes keep coming.
async fn debounce(
    mut input: watch::Receiver<Arc<Snapshot>>,
    output: watch::Sender<Arc<Snapshot>>,
    quiet: Duration,
    max: Duration,
) {
    while input.changed().await.is_ok() {
        // The first synced snapshot goes out at once: clients are waiting for it.
        if !output.borrow().synced && input.borrow().synced {
            let latest = input.borrow_and_update().clone();
            if output.send(latest).is_err() {
                return;
            }
            continue;
        }
        let first = tokio::time::Instant::now();
        let deadline = first + max;
        loop {
            let wake = (tokio::time::Instant::now() + quiet).min(deadline);
            tokio::select! {
                changed = input.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if tokio::time::Instant::now() >= deadline {
                        break;
                    }
                }
                _ = tokio::time::sleep_until(wake) => break,
            }
        }
        let latest = input.borrow_and_update().clone();
        if output.send(latest).is_err() {
            return;
        }
    }
}

/// New streams' admission: a reconnect storm waits here instead of starving the streams
/// already connected of CPU (`meridian_core::admission`).
/// What the driver needs from a stream state machine; SotW and delta differ only here.
trait Protocol: Machine + Default + 'static {
    const NAME: &'static str;
    type Request: prost::Message + Default + Send + 'static;
    type Response: prost::Message + Send + 'static;
    fn node_of(req: &Self::Request) -> Option<&Node>;
    fn type_url_of(resp: &Self::Response) -> &str;
    fn on_request(
        &mut self,
        req: &Self::Request,
        now: Instant,
    ) -> Result<Step<Self::Response>, StreamError>;
    fn on_view(&mut self, view: Arc<Resources>, now: Instant) -> Step<Self::Response>;
}

/// What the registry of streams can ask any stream.
trait Machine: Send {
    fn status(&self) -> StreamStatus;
}

impl Machine for SotwStream {
    fn status(&self) -> StreamStatus {
        SotwStream::status(self)
    }
}

impl Machine for DeltaStream {
    fn status(&self) -> StreamStatus {
        DeltaStream::status(self)
    }
}

impl Protocol for SotwStream {
    const NAME: &'static str = "sotw";
    type Request = DiscoveryRequest;
    type Response = DiscoveryResponse;
    fn node_of(req: &DiscoveryRequest) -> Option<&Node> {
        req.node.as_ref()
    }
    fn type_url_of(resp: &DiscoveryResponse) -> &str {
        &resp.type_url
    }
    fn on_request(
        &mut self,
        req: &DiscoveryRequest,
        now: Instant,
    ) -> Result<Step<DiscoveryResponse>, StreamError> {
        SotwStream::on_request(self, req, now)
    }
    fn on_view(&mut self, view: Arc<Resources>, now: Instant) -> Step<DiscoveryResponse> {
        SotwStream::on_view(self, view, now)
    }
}

impl Protocol for DeltaStream {
    const NAME: &'static str = "delta";
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaDiscoveryResponse;
    fn node_of(req: &DeltaDiscoveryRequest) -> Option<&Node> {
        req.node.as_ref()
    }
    fn type_url_of(resp: &DeltaDiscoveryResponse) -> &str {
        &resp.type_url
    }
    fn on_request(
        &mut self,
        req: &DeltaDiscoveryRequest,
        now: Instant,
    ) -> Result<Step<DeltaDiscoveryResponse>, StreamError> {
        DeltaStream::on_request(self, req, now)
    }
    fn on_view(&mut self, view: Arc<Resources>, now: Instant) -> Step<DeltaDiscoveryResponse> {
        DeltaStream::on_view(self, view, now)
    }
}

type ResponseStream<R> = Pin<Box<dyn Stream<Item = Result<R, Status>> + Send>>;

fn spawn_stream<P: Protocol>(
    xds: Arc<Xds>,
    inbound: Streaming<P::Request>,
) -> ResponseStream<P::Response> {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(xds.drive::<P>(inbound, tx));
    Box::pin(ReceiverStream::new(rx))
}

/// The ADS service over the shared state (tonic's traits take `&self`; streams need an `Arc`).
#[derive(Clone)]
pub struct Ads(pub Arc<Xds>);

/// The CSDS service over the shared state.
#[derive(Clone)]
pub struct Csds(pub Arc<Xds>);

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ResponseStream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = ResponseStream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        Ok(Response::new(spawn_stream::<SotwStream>(
            self.0.clone(),
            request.into_inner(),
        )))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Ok(Response::new(spawn_stream::<DeltaStream>(
            self.0.clone(),
            request.into_inner(),
        )))
    }
}

#[tonic::async_trait]
impl ClientStatusDiscoveryService for Csds {
    type StreamClientStatusStream = ResponseStream<ClientStatusResponse>;

    async fn stream_client_status(
        &self,
        request: Request<Streaming<ClientStatusRequest>>,
    ) -> Result<Response<Self::StreamClientStatusStream>, Status> {
        let mut inbound = request.into_inner();
        let xds = self.0.clone();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            while let Ok(Some(req)) = inbound.message().await {
                let response = csds::response(&xds.stream_statuses(), &req);
                if tx.send(Ok(response)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn fetch_client_status(
        &self,
        request: Request<ClientStatusRequest>,
    ) -> Result<Response<ClientStatusResponse>, Status> {
        Ok(Response::new(csds::response(
            &self.0.stream_statuses(),
            request.get_ref(),
        )))
    }
}

/// Binds the xDS listener, so that start-up fails on a taken port.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_over_the_limit_is_told_resource_exhausted_with_the_limit() {
        // What tonic's decoder says (tonic 0.12, codec/decode.rs).
        let decoder = Status::out_of_range(
            "Error, decoded message length too large: found 9437190 bytes, the limit is: 8388608 bytes",
        );
        let told = inbound_failure(&decoder).expect("told");
        assert_eq!(told.code(), tonic::Code::ResourceExhausted);
        assert!(
            told.message().contains("8388608 bytes (8 MiB)"),
            "{}",
            told.message()
        );
        assert!(
            told.message().contains("found 9437190"),
            "{}",
            told.message()
        );
    }

    #[test]
    fn a_client_that_goes_away_is_not_told_anything() {
        assert!(inbound_failure(&Status::cancelled("h2 protocol error: stream reset")).is_none());
        assert!(inbound_failure(&Status::unknown("connection closed")).is_none());
    }
}
