//! The accept loop: bounded, and alive through descriptor exhaustion.
//!
//! tokio's `TcpListener::accept` returns EMFILE at once, again and again, while the process is
//! out of descriptors and a connection waits in the backlog: a loop that just retries spins a
//! core, one that gives up (tonic's incoming stream) loses the port for good. Here such errors
//! are counted, warned about at most every [`WARN_EVERY`], and waited out ([`BACKOFF`]); the
//! listener is kept.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use crate::conn::{Conn, Deadlines, Slot};
use crate::metrics::{KindLabels, ListenerMetrics};

/// Wait after an accept error that will repeat until descriptors free up.
pub const BACKOFF: Duration = Duration::from_millis(100);
/// At most one warning per listener this often (with the count of errors in between).
pub const WARN_EVERY: Duration = Duration::from_secs(5);
/// How long a new connection waits for the place of one it evicted.
const EVICTION_WAIT: Duration = Duration::from_millis(250);
/// A failing listener whose accept has waited this long without an error is accepting again
/// (nothing was in the backlog to fail on).
const RECOVERED_AFTER: Duration = Duration::from_millis(500);

/// One listener's bound and timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerSettings {
    /// Open connections at most; more are accepted and closed at once.
    pub max_connections: usize,
    /// A connection must send `handshake_bytes` within this long.
    pub handshake_timeout: Duration,
    /// Bytes that make a connection more than a probe: the HTTP/2 preface (24) for gRPC,
    /// less than any request line (16) for HTTP/1. Until then a connection may be evicted.
    pub handshake_bytes: u64,
    /// A connection that sends nothing for this long is closed.
    pub idle_timeout: Duration,
    /// Connections past their handshake that have neither read nor written for this long
    /// may be closed for new ones when the listener is full (the source holding the most
    /// first), or when their source is at `max_per_source`: for protocols whose clients
    /// reconnect as a matter of course (DNS over TCP). None: only probes are evicted.
    pub quiet_eviction: Option<Duration>,
    /// Connections from one source address at most; None: no bound but the listener's.
    pub max_per_source: Option<usize>,
}

/// What an accept error means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcceptError {
    /// The process or the system is out of something; retrying at once fails again.
    Exhausted(&'static str),
    /// One connection went wrong before it was accepted (reset, aborted): the next is fine.
    Transient,
    /// Anything else: backed off like exhaustion, as it may repeat.
    Other,
}

/// Classifies an accept error (pure).
pub fn classify(error: &io::Error) -> AcceptError {
    use nix::errno::Errno;
    let Some(code) = error.raw_os_error() else {
        return AcceptError::Other;
    };
    match Errno::from_raw(code) {
        Errno::EMFILE => AcceptError::Exhausted("emfile"),
        Errno::ENFILE => AcceptError::Exhausted("enfile"),
        Errno::ENOBUFS => AcceptError::Exhausted("enobufs"),
        Errno::ENOMEM => AcceptError::Exhausted("enomem"),
        Errno::ECONNABORTED | Errno::ECONNRESET | Errno::EINTR | Errno::EPROTO | Errno::EPERM => {
            AcceptError::Transient
        }
        _ => AcceptError::Other,
    }
}

/// One warning per [`WARN_EVERY`], counting what it left out (pure).
#[derive(Debug, Default)]
pub struct RateLimit {
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimit {
    /// `Some(errors left out since the last warning)` when a warning is due.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) < WARN_EVERY)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// Whether a listener is accepting, for `/readyz` and the `accepting` gauge.
#[derive(Debug, Default)]
struct AcceptState {
    /// Since when accept has been failing, and with what (None while accepting).
    failing: Option<(Instant, &'static str)>,
    warn: RateLimit,
}

/// A listener stuck in accept errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stuck {
    pub listener: &'static str,
    pub kind: &'static str,
    pub since: Duration,
}

impl std::fmt::Display for Stuck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let why = match self.kind {
            "emfile" => "meridian is out of file descriptors (EMFILE)",
            "enfile" => "the system is out of file descriptors (ENFILE)",
            "enobufs" | "enomem" => "the system is out of memory for sockets",
            _ => "accept keeps failing",
        };
        write!(
            f,
            "listener {} is not accepting connections for {:.0}s: {why}",
            self.listener,
            self.since.as_secs_f64()
        )
    }
}

/// One listener's name and accept state, shared with its accept loop.
type Named = (&'static str, Arc<Mutex<AcceptState>>);

/// Every listener's accept state, for readiness.
#[derive(Debug, Clone, Default)]
pub struct Health {
    listeners: Arc<Mutex<Vec<Named>>>,
}

impl Health {
    /// Listeners failing to accept for longer than `threshold`.
    pub fn stuck(&self, now: Instant, threshold: Duration) -> Vec<Stuck> {
        self.listeners
            .lock()
            .iter()
            .filter_map(|(listener, state)| {
                let (since, kind) = state.lock().failing?;
                let since = now.saturating_duration_since(since);
                (since >= threshold).then_some(Stuck {
                    listener,
                    kind,
                    since,
                })
            })
            .collect()
    }

    fn add(&self, name: &'static str) -> Arc<Mutex<AcceptState>> {
        let state = Arc::new(Mutex::new(AcceptState::default()));
        self.listeners.lock().push((name, state.clone()));
        state
    }
}

/// A bound TCP listener with a connection bound and timeouts.
pub struct Listener {
    name: &'static str,
    inner: TcpListener,
    settings: ListenerSettings,
    permits: Arc<Semaphore>,
    state: Arc<Mutex<AcceptState>>,
    metrics: ListenerMetrics,
    rejected_warn: Mutex<RateLimit>,
    /// Connections that have not sent their handshake yet, oldest first (entries of closed
    /// or handshaken ones are dropped as they are met).
    pending: Mutex<VecDeque<Weak<Slot>>>,
    /// Every connection (entries of closed ones pruned as the list grows), when quiet ones
    /// may be evicted.
    live: Mutex<Vec<Weak<Slot>>>,
    /// Open connections per source address.
    sources: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Listener {
    pub fn new(
        name: &'static str,
        inner: TcpListener,
        settings: ListenerSettings,
        health: &Health,
        metrics: &ListenerMetrics,
    ) -> Self {
        let labels = ListenerMetrics::labels(name);
        metrics
            .max_connections
            .get_or_create(&labels)
            .set(settings.max_connections as i64);
        metrics.accepting.get_or_create(&labels).set(1);
        metrics.connections.get_or_create(&labels).set(0);
        Self {
            name,
            inner,
            permits: Arc::new(Semaphore::new(settings.max_connections)),
            settings,
            state: health.add(name),
            metrics: metrics.clone(),
            rejected_warn: Mutex::new(RateLimit::default()),
            pending: Mutex::new(VecDeque::new()),
            live: Mutex::new(Vec::new()),
            sources: Arc::default(),
        }
    }

    pub fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.inner.local_addr()
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The next connection within the bound. Never fails: errors are waited out.
    pub async fn accept(&self) -> Conn<TcpStream> {
        loop {
            let failing = self.state.lock().failing.is_some();
            let result = if failing {
                tokio::select! {
                    r = self.inner.accept() => Some(r),
                    _ = tokio::time::sleep(RECOVERED_AFTER) => None,
                }
            } else {
                Some(self.inner.accept().await)
            };
            match result {
                None => self.recovered(),
                Some(Ok((stream, peer))) => {
                    self.recovered();
                    if let Some(conn) = self.admit(stream, peer).await {
                        return conn;
                    }
                }
                Some(Err(e)) => self.failed(&e).await,
            }
        }
    }

    /// Evicts the oldest connection that has not sent its handshake (of `source`, if
    /// given); false if there is none.
    fn evict_oldest_pending(&self, source: Option<IpAddr>) -> bool {
        let mut pending = self.pending.lock();
        let mut i = 0;
        while i < pending.len() {
            let Some(p) = pending[i].upgrade() else {
                pending.remove(i);
                continue;
            };
            if source.is_some_and(|s| s != p.source) {
                i += 1;
                continue;
            }
            pending.remove(i);
            if p.evict() {
                return true;
            }
        }
        false
    }

    /// Evicts the quietest connection (quiet for at least `quiet_eviction`) of `source`; if
    /// None, of the source holding the most connections, else of any source. False if none
    /// is quiet enough.
    fn evict_quietest(&self, source: Option<IpAddr>) -> bool {
        let Some(quiet) = self.settings.quiet_eviction else {
            return false;
        };
        let evict_of = |only: Option<IpAddr>| {
            let quietest = self
                .live
                .lock()
                .iter()
                // Reversed: of equally quiet ones, the oldest (max_by_key keeps the last).
                .rev()
                .filter_map(Weak::upgrade)
                .filter(|p| only.is_none_or(|s| p.source == s))
                .max_by_key(|p| p.quiet_for());
            quietest.is_some_and(|p| p.evict_quiet(quiet))
        };
        if source.is_some() {
            return evict_of(source);
        }
        let heaviest = {
            let sources = self.sources.lock();
            sources.iter().max_by_key(|(_, n)| **n).map(|(ip, _)| *ip)
        };
        heaviest.is_some_and(|h| evict_of(Some(h))) || evict_of(None)
    }

    fn at_source_bound(&self, source: IpAddr) -> bool {
        self.settings
            .max_per_source
            .is_some_and(|max| self.sources.lock().get(&source).copied().unwrap_or(0) >= max)
    }

    /// A place under the bound: a free one, or that of an evicted connection (one in its
    /// handshake, else a quiet one). A source at its own bound only ever evicts its own.
    async fn permit(&self, source: IpAddr) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if self.at_source_bound(source)
            && !self.evict_oldest_pending(Some(source))
            && !self.evict_quietest(Some(source))
        {
            debug!(listener = self.name, %source, "connection closed: its source holds its share of the bound, none of them quiet");
            return None;
        }
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return Some(permit);
        }
        if !self.evict_oldest_pending(None) && !self.evict_quietest(None) {
            debug!(listener = self.name, %source, "connection closed: the listener is full, no connection in its handshake or quiet");
            return None;
        }
        if let Some(left_out) = self.rejected_warn.lock().allow(Instant::now()) {
            warn!(
                listener = self.name,
                max_connections = self.settings.max_connections,
                left_out,
                "listener at its connection bound: closed the oldest connection that sent nothing yet (or the quietest of the source holding the most) for a new one (see meridian_listener_timeouts_total, kind evicted)"
            );
        }
        tokio::time::timeout(EVICTION_WAIT, self.permits.clone().acquire_owned())
            .await
            .ok()?
            .ok()
    }

    /// Wraps a new connection, or closes it at once when the listener is full of
    /// connections past their handshake.
    async fn admit(
        &self,
        stream: TcpStream,
        peer: std::net::SocketAddr,
    ) -> Option<Conn<TcpStream>> {
        let Some(permit) = self.permit(peer.ip()).await else {
            let labels = ListenerMetrics::labels(self.name);
            self.metrics.rejected.get_or_create(&labels).inc();
            if let Some(left_out) = self.rejected_warn.lock().allow(Instant::now()) {
                warn!(
                    listener = self.name,
                    %peer,
                    max_connections = self.settings.max_connections,
                    left_out,
                    "listener at its connection bound (or this source at its share of it): new connections are closed at once (see meridian_listener_rejected_connections_total)"
                );
            }
            // Dropped here: closed, without ever being read.
            return None;
        };
        let _ = stream.set_nodelay(true);
        let slot = Arc::new(Slot::new(peer.ip(), Some(self.sources.clone())));
        if self.settings.quiet_eviction.is_some() {
            let mut live = self.live.lock();
            if live.len() >= 2 * self.settings.max_connections {
                live.retain(|w| w.strong_count() > 0);
            }
            live.push(Arc::downgrade(&slot));
        }
        {
            let mut queue = self.pending.lock();
            // Forget entries of connections gone or past their handshake, so the queue stays
            // as long as the connections actually pending.
            if queue.len() >= self.settings.max_connections {
                queue.retain(|w| {
                    w.upgrade()
                        .is_some_and(|p| !p.handshook.load(Ordering::Acquire))
                });
            }
            queue.push_back(Arc::downgrade(&slot));
        }
        Some(Conn::with_slot(
            stream,
            peer,
            permit,
            Deadlines::new(
                self.settings.handshake_timeout,
                self.settings.handshake_bytes,
                self.settings.idle_timeout,
            ),
            self.name,
            self.metrics.clone(),
            slot,
        ))
    }

    fn recovered(&self) {
        let mut state = self.state.lock();
        if let Some((since, kind)) = state.failing.take() {
            self.metrics
                .accepting
                .get_or_create(&ListenerMetrics::labels(self.name))
                .set(1);
            warn!(
                listener = self.name,
                kind,
                failed_for_ms = since.elapsed().as_millis() as u64,
                "listener accepting connections again"
            );
        }
    }

    async fn failed(&self, error: &io::Error) {
        let class = classify(error);
        let kind = match class {
            AcceptError::Transient => {
                debug!(listener = self.name, %error, "a connection failed before it was accepted");
                return;
            }
            AcceptError::Exhausted(kind) => kind,
            AcceptError::Other => "other",
        };
        self.metrics
            .accept_errors
            .get_or_create(&KindLabels {
                listener: self.name,
                kind,
            })
            .inc();
        let now = Instant::now();
        let warn_now = {
            let mut state = self.state.lock();
            if state.failing.is_none() {
                state.failing = Some((now, kind));
                self.metrics
                    .accepting
                    .get_or_create(&ListenerMetrics::labels(self.name))
                    .set(0);
            }
            state.warn.allow(now)
        };
        if let Some(left_out) = warn_now {
            warn!(
                listener = self.name,
                kind,
                %error,
                left_out,
                backoff_ms = BACKOFF.as_millis() as u64,
                "cannot accept connections; backing off and keeping the listener"
            );
        }
        tokio::time::sleep(BACKOFF).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(errno: nix::errno::Errno) -> io::Error {
        io::Error::from_raw_os_error(errno as i32)
    }

    #[test]
    fn descriptor_exhaustion_is_told_apart_from_a_bad_connection() {
        use nix::errno::Errno;
        assert_eq!(
            classify(&os(Errno::EMFILE)),
            AcceptError::Exhausted("emfile")
        );
        assert_eq!(
            classify(&os(Errno::ENFILE)),
            AcceptError::Exhausted("enfile")
        );
        assert_eq!(classify(&os(Errno::ECONNABORTED)), AcceptError::Transient);
        assert_eq!(classify(&os(Errno::EINVAL)), AcceptError::Other);
        assert_eq!(
            classify(&io::Error::other("not from the kernel")),
            AcceptError::Other
        );
    }

    #[test]
    fn warnings_are_rate_limited_and_count_what_they_left_out() {
        let t0 = Instant::now();
        let mut limit = RateLimit::default();
        assert_eq!(limit.allow(t0), Some(0));
        for i in 1..=9 {
            assert_eq!(limit.allow(t0 + Duration::from_millis(i * 100)), None);
        }
        assert_eq!(limit.allow(t0 + WARN_EVERY), Some(9));
        assert_eq!(limit.allow(t0 + WARN_EVERY), None);
    }

    #[test]
    fn a_listener_is_stuck_only_after_the_threshold() {
        let health = Health::default();
        let state = health.add("xds");
        health.add("admin");
        let t0 = Instant::now();
        assert!(health.stuck(t0, Duration::from_secs(3)).is_empty());
        state.lock().failing = Some((t0, "emfile"));
        assert!(
            health
                .stuck(t0 + Duration::from_secs(2), Duration::from_secs(3))
                .is_empty()
        );
        let stuck = health.stuck(t0 + Duration::from_secs(4), Duration::from_secs(3));
        assert_eq!(stuck.len(), 1);
        assert_eq!(stuck[0].listener, "xds");
        let said = stuck[0].to_string();
        assert!(said.contains("listener xds"), "{said}");
        assert!(said.contains("out of file descriptors"), "{said}");
    }

    fn settings(max_connections: usize) -> ListenerSettings {
        ListenerSettings {
            max_connections,
            handshake_timeout: Duration::from_secs(5),
            handshake_bytes: 1,
            idle_timeout: Duration::from_secs(5),
            quiet_eviction: None,
            max_per_source: None,
        }
    }

    #[tokio::test]
    async fn a_full_listener_evicts_the_oldest_silent_connection_for_a_new_one() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let metrics = ListenerMetrics::default();
        let listener = Arc::new(Listener::new(
            "test",
            TcpListener::bind("127.0.0.1:0").await.unwrap(),
            settings(2),
            &Health::default(),
            &metrics,
        ));
        let addr = listener.local_addr().unwrap();
        // Two silent probes fill the listener; their server side reads as a server would.
        let mut probes = Vec::new();
        let mut readers = Vec::new();
        for _ in 0..2 {
            probes.push(TcpStream::connect(addr).await.unwrap());
            let mut conn = listener.accept().await;
            readers.push(tokio::spawn(async move {
                let mut buf = [0u8; 8];
                conn.read(&mut buf).await
            }));
        }
        // A real client gets in, and the oldest probe is the one closed.
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(b"hello").await.unwrap();
        let mut conn = tokio::time::timeout(Duration::from_secs(5), listener.accept())
            .await
            .expect("admitted");
        let mut buf = [0u8; 8];
        assert_eq!(conn.read(&mut buf).await.unwrap(), 5);
        let first = readers.remove(0).await.unwrap();
        assert_eq!(first.unwrap_err().kind(), io::ErrorKind::ConnectionAborted);
        assert!(!readers[0].is_finished(), "the newer probe is still open");
        let labels = KindLabels {
            listener: "test",
            kind: "evicted",
        };
        assert_eq!(metrics.timeouts.get_or_create(&labels).get(), 1);
    }

    /// A listener named "test" on a loopback port, bound to `max_connections`.
    async fn bound(max_connections: usize) -> (Listener, ListenerMetrics, std::net::SocketAddr) {
        let metrics = ListenerMetrics::default();
        let listener = Listener::new(
            "test",
            TcpListener::bind("127.0.0.1:0").await.unwrap(),
            settings(max_connections),
            &Health::default(),
            &metrics,
        );
        let addr = listener.local_addr().unwrap();
        (listener, metrics, addr)
    }

    #[tokio::test]
    async fn an_evicted_connection_leaves_the_count_at_once_and_its_place_once_closed() {
        use tokio::io::AsyncWriteExt;
        let (listener, metrics, addr) = bound(2).await;
        let mut probes = Vec::new();
        let mut held = Vec::new();
        for _ in 0..2 {
            probes.push(TcpStream::connect(addr).await.unwrap());
            held.push(listener.accept().await);
        }
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(b"hello").await.unwrap();
        let labels = ListenerMetrics::labels("test");
        let gauge = metrics.connections.get_or_create(&labels).clone();
        // The oldest probe is evicted for the client: out of the count at once, but its
        // socket is open until its task drops it, and the client waits for that place.
        let evicted = held.remove(0);
        let (admitted, ()) = tokio::join!(
            tokio::time::timeout(Duration::from_secs(5), listener.accept()),
            async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                assert_eq!(gauge.get(), 1, "the evicted probe is no longer counted");
                drop(evicted);
            }
        );
        let _admitted = admitted.expect("admitted once the evicted socket closed");
        assert_eq!(gauge.get(), 2);
        drop(held);
        assert_eq!(gauge.get(), 1);
    }

    #[tokio::test]
    async fn connections_over_the_bound_are_closed_at_once() {
        use tokio::io::AsyncReadExt;
        let (listener, metrics, addr) = bound(1).await;
        let mut first = TcpStream::connect(addr).await.unwrap();
        let mut held = listener.accept().await;
        // Past its handshake: not evictable.
        tokio::io::AsyncWriteExt::write_all(&mut first, b"x")
            .await
            .unwrap();
        held.read_exact(&mut [0u8; 1]).await.unwrap();
        let mut second = TcpStream::connect(addr).await.unwrap();
        let accept = tokio::spawn(async move {
            let c = listener.accept().await;
            (listener, c)
        });
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), second.read(&mut buf))
            .await
            .expect("closed at once");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        let labels = ListenerMetrics::labels("test");
        assert_eq!(metrics.rejected.get_or_create(&labels).get(), 1);
        assert_eq!(metrics.connections.get_or_create(&labels).get(), 1);
        // Closing the held one frees its place.
        drop(held);
        let _third = TcpStream::connect(addr).await.unwrap();
        let (_listener, _c) = tokio::time::timeout(Duration::from_secs(5), accept)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(metrics.connections.get_or_create(&labels).get(), 1);
    }

    /// A connection from `source` to `addr` past its handshake, with the server side reading
    /// as a server would; returns the client and the server side's read.
    async fn answered(
        listener: &Listener,
        addr: std::net::SocketAddr,
        source: [u8; 4],
    ) -> (TcpStream, tokio::task::JoinHandle<io::Result<usize>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind((std::net::Ipv4Addr::from(source), 0).into())
            .unwrap();
        let mut client = socket.connect(addr).await.unwrap();
        client.write_all(b"q").await.unwrap();
        let mut conn = listener.accept().await;
        conn.read_exact(&mut [0u8; 1]).await.unwrap();
        let reader = tokio::spawn(async move { conn.read(&mut [0u8; 8]).await });
        (client, reader)
    }

    #[tokio::test]
    async fn quiet_connections_of_the_heaviest_source_make_room_and_one_source_holds_its_share() {
        let metrics = ListenerMetrics::default();
        let quiet = Duration::from_millis(200);
        let listener = Arc::new(Listener::new(
            "test",
            TcpListener::bind("127.0.0.1:0").await.unwrap(),
            ListenerSettings {
                quiet_eviction: Some(quiet),
                max_per_source: Some(2),
                ..settings(3)
            },
            &Health::default(),
            &metrics,
        ));
        let addr = listener.local_addr().unwrap();
        let (_a1, a1) = answered(&listener, addr, [127, 0, 0, 2]).await;
        let (_a2, a2) = answered(&listener, addr, [127, 0, 0, 2]).await;
        let (_b1, b1) = answered(&listener, addr, [127, 0, 0, 3]).await;
        // A third from 127.0.0.2 while its two are busy: closed at once, the others kept.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(([127, 0, 0, 2], 0).into()).unwrap();
        let mut over = socket.connect(addr).await.unwrap();
        let l = listener.clone();
        let rejecting = tokio::spawn(async move { l.accept().await });
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::io::AsyncReadExt::read(&mut over, &mut buf),
        )
        .await
        .expect("closed at once");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        assert!(!a1.is_finished() && !a2.is_finished() && !b1.is_finished());
        rejecting.abort();
        // Once they are quiet, a new source's client takes the place of the quietest
        // connection of the source holding the most: 127.0.0.2's first.
        tokio::time::sleep(quiet + Duration::from_millis(50)).await;
        let (_c, c) = tokio::time::timeout(
            Duration::from_secs(5),
            answered(&listener, addr, [127, 0, 0, 4]),
        )
        .await
        .expect("admitted once a connection is quiet");
        let evicted = a1.await.unwrap();
        assert_eq!(
            evicted.unwrap_err().kind(),
            io::ErrorKind::ConnectionAborted
        );
        assert!(!a2.is_finished() && !b1.is_finished() && !c.is_finished());
        assert_eq!(
            listener.sources.lock().get(&[127, 0, 0, 2].into()),
            Some(&1)
        );
    }
}
