//! An accepted connection: holds its place under the listener's bound, and ends itself when
//! the client sends too little at first or nothing for too long.
//!
//! Only reads count as activity: a server that keeps writing to a client that never reads is
//! bounded by flow control and its own buffers, while a client that never writes holds a
//! descriptor for nothing. HTTP/2 keepalive pings (xDS) are answered by live clients, so a
//! quiet ADS stream is not idle here.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};
use tracing::debug;

use crate::metrics::{KindLabels, ListenerMetrics};

/// When a connection is closed for silence (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    pub handshake: Duration,
    pub handshake_bytes: u64,
    pub idle: Duration,
}

impl Deadlines {
    pub fn new(handshake: Duration, handshake_bytes: u64, idle: Duration) -> Self {
        Self {
            handshake,
            handshake_bytes,
            idle,
        }
    }

    /// The deadline that applies, and its name: until `handshake_bytes` have come, the
    /// handshake deadline from the start; then the idle one from the last read.
    pub fn next(
        &self,
        started: Instant,
        bytes_read: u64,
        last_read: Instant,
    ) -> (Instant, &'static str) {
        if bytes_read < self.handshake_bytes {
            (started + self.handshake, "handshake")
        } else {
            (last_read + self.idle, "idle")
        }
    }
}

/// A connection's place under its listener's bound, as the listener sees it: a full
/// listener evicts the oldest connection still in its handshake for a new one, so idle
/// probes cannot lock real clients out; a listener whose protocol allows it (DNS, RFC 7766
/// §6.2.3) also evicts connections that have been quiet a while, from the source that holds
/// the most first.
#[derive(Debug)]
pub(crate) struct Slot {
    /// Set once the handshake bytes have come: no longer evictable as a probe.
    pub(crate) handshook: AtomicBool,
    evicted: AtomicBool,
    waker: Mutex<Option<Waker>>,
    pub(crate) source: IpAddr,
    /// When the connection last read or wrote a byte, in ms since `EPOCH`.
    active_ms: AtomicU64,
    /// The listener's count of connections per source, taken down when the connection goes.
    sources: Option<Arc<Mutex<HashMap<IpAddr, usize>>>>,
    /// The connection's place under the bound: uncounted when it is evicted, given back when
    /// the connection is dropped (its socket closed).
    place: Mutex<Option<Place>>,
}

/// A place under a listener's bound, counted in `meridian_listener_connections` until the
/// connection is evicted or gone: the gauge falls when an evicted connection is told to go,
/// so it never reads above the bound. The permit — the descriptor the place stands for — is
/// held until the connection is dropped, so a listener never holds more open sockets than its
/// bound (a new connection waits for the evicted one's socket to close).
#[derive(Debug)]
struct Place {
    _permit: OwnedSemaphorePermit,
    gauge: Option<Gauge>,
}

impl Place {
    fn new(permit: OwnedSemaphorePermit, gauge: Gauge) -> Self {
        gauge.inc();
        Self {
            _permit: permit,
            gauge: Some(gauge),
        }
    }

    /// No longer counted (once); the permit stays until the place is dropped.
    fn uncount(&mut self) -> bool {
        self.gauge.take().map(|g| g.dec()).is_some()
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.uncount();
    }
}

/// The origin of `Slot::active_ms`.
static EPOCH: LazyLock<std::time::Instant> = LazyLock::new(std::time::Instant::now);

fn now_ms() -> u64 {
    EPOCH.elapsed().as_millis() as u64
}

impl Default for Slot {
    fn default() -> Self {
        Self::new(IpAddr::from([0, 0, 0, 0]), None)
    }
}

impl Slot {
    pub(crate) fn new(source: IpAddr, sources: Option<Arc<Mutex<HashMap<IpAddr, usize>>>>) -> Self {
        if let Some(sources) = &sources {
            *sources.lock().entry(source).or_default() += 1;
        }
        Self {
            handshook: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            waker: Mutex::new(None),
            source,
            active_ms: AtomicU64::new(now_ms()),
            sources,
            place: Mutex::new(None),
        }
    }

    /// Ends the connection at its next read (or now, if it waits for one). False if it had
    /// already sent its handshake.
    pub(crate) fn evict(&self) -> bool {
        if self.handshook.load(Ordering::Acquire) {
            return false;
        }
        self.end();
        true
    }

    /// How long the connection has neither read nor written.
    pub(crate) fn quiet_for(&self) -> Duration {
        Duration::from_millis(now_ms().saturating_sub(self.active_ms.load(Ordering::Relaxed)))
    }

    /// Ends the connection if it has been quiet at least `quiet`; false if it has not.
    pub(crate) fn evict_quiet(&self, quiet: Duration) -> bool {
        if self.evicted.load(Ordering::Acquire) || self.quiet_for() < quiet {
            return false;
        }
        self.end();
        true
    }

    fn end(&self) {
        self.evicted.store(true, Ordering::Release);
        self.uncount();
        if let Some(waker) = self.waker.lock().take() {
            waker.wake();
        }
    }

    /// Takes the connection out of the gauge and its source's count (once).
    fn uncount(&self) {
        if !self.place.lock().as_mut().is_some_and(Place::uncount) {
            return;
        }
        if let Some(sources) = &self.sources {
            let mut sources = sources.lock();
            if let Some(n) = sources.get_mut(&self.source) {
                *n -= 1;
                if *n == 0 {
                    sources.remove(&self.source);
                }
            }
        }
    }

    fn active(&self) {
        self.active_ms.store(now_ms(), Ordering::Relaxed);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.uncount();
        // The permit goes with the place, now that the socket is closed.
        self.place.lock().take();
    }
}

/// A connection under a listener's bound.
pub struct Conn<S> {
    inner: S,
    peer: SocketAddr,
    deadlines: Deadlines,
    started: Instant,
    last_read: Instant,
    bytes_read: u64,
    /// Fires at the deadline in force when it was last set; checked (and moved on) when it
    /// fires, so a busy connection does not reset a timer on every read.
    timer: Pin<Box<Sleep>>,
    slot: Arc<Slot>,
    listener: &'static str,
    metrics: ListenerMetrics,
}

impl<S> Conn<S> {
    pub fn new(
        inner: S,
        peer: SocketAddr,
        permit: OwnedSemaphorePermit,
        deadlines: Deadlines,
        listener: &'static str,
        metrics: ListenerMetrics,
    ) -> Self {
        Self::with_slot(
            inner,
            peer,
            permit,
            deadlines,
            listener,
            metrics,
            Arc::default(),
        )
    }

    pub(crate) fn with_slot(
        inner: S,
        peer: SocketAddr,
        permit: OwnedSemaphorePermit,
        deadlines: Deadlines,
        listener: &'static str,
        metrics: ListenerMetrics,
        slot: Arc<Slot>,
    ) -> Self {
        let gauge = metrics
            .connections
            .get_or_create(&ListenerMetrics::labels(listener))
            .clone();
        *slot.place.lock() = Some(Place::new(permit, gauge));
        let now = Instant::now();
        Self {
            inner,
            peer,
            timer: Box::pin(tokio::time::sleep_until(deadlines.next(now, 0, now).0)),
            deadlines,
            started: now,
            last_read: now,
            bytes_read: 0,
            slot,
            listener,
            metrics,
        }
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Ready(error) once the deadline in force has passed; else registers the timer.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            ready!(self.timer.as_mut().poll(cx));
            let (deadline, kind) =
                self.deadlines
                    .next(self.started, self.bytes_read, self.last_read);
            if Instant::now() >= deadline {
                self.metrics
                    .timeouts
                    .get_or_create(&KindLabels {
                        listener: self.listener,
                        kind,
                    })
                    .inc();
                debug!(listener = self.listener, peer = %self.peer, kind, "connection closed: too quiet");
                return Poll::Ready(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{kind} timeout"),
                ));
            }
            self.timer.as_mut().reset(deadline);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Conn<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.slot.evicted.load(Ordering::Acquire) {
            this.metrics
                .timeouts
                .get_or_create(&KindLabels {
                    listener: this.listener,
                    kind: "evicted",
                })
                .inc();
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "evicted: the listener is full and this connection sent nothing yet, or nothing for a while",
            )));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                let n = buf.filled().len() - before;
                if n > 0 {
                    this.slot.active();
                    this.bytes_read += n as u64;
                    this.last_read = Instant::now();
                    if this.bytes_read >= this.deadlines.handshake_bytes {
                        this.slot.handshook.store(true, Ordering::Release);
                    }
                }
                Poll::Ready(result)
            }
            Poll::Pending => match this.poll_deadline(cx) {
                Poll::Ready(e) => Poll::Ready(Err(e)),
                Poll::Pending => {
                    *this.slot.waker.lock() = Some(cx.waker().clone());
                    Poll::Pending
                }
            },
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Conn<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = ready!(Pin::new(&mut self.inner).poll_write(cx, buf));
        if matches!(written, Ok(n) if n > 0) {
            self.slot.active();
        }
        Poll::Ready(written)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = ready!(Pin::new(&mut self.inner).poll_write_vectored(cx, bufs));
        if matches!(written, Ok(n) if n > 0) {
            self.slot.active();
        }
        Poll::Ready(written)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handshake_deadline_holds_until_enough_bytes_came() {
        let d = Deadlines::new(Duration::from_secs(10), 24, Duration::from_secs(300));
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(8);
        // A byte a second: still the handshake deadline from the start, not from the last byte.
        assert_eq!(
            d.next(t0, 8, later),
            (t0 + Duration::from_secs(10), "handshake")
        );
        assert_eq!(
            d.next(t0, 24, later),
            (later + Duration::from_secs(300), "idle")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_is_closed_at_the_handshake_deadline() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (client, server) = tokio::io::duplex(64);
        let semaphore = std::sync::Arc::new(tokio::sync::Semaphore::new(1));
        let metrics = ListenerMetrics::default();
        let mut conn = Conn::new(
            server,
            "127.0.0.1:1".parse().unwrap(),
            semaphore.clone().try_acquire_owned().unwrap(),
            Deadlines::new(Duration::from_secs(2), 4, Duration::from_secs(60)),
            "test",
            metrics.clone(),
        );
        let mut client = client;
        client.write_all(b"ab").await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(conn.read(&mut buf).await.unwrap(), 2);
        let started = Instant::now();
        let e = conn.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() <= Duration::from_secs(2));
        assert_eq!(
            metrics
                .timeouts
                .get_or_create(&KindLabels {
                    listener: "test",
                    kind: "handshake"
                })
                .get(),
            1
        );
        assert_eq!(semaphore.available_permits(), 0);
        drop(conn);
        assert_eq!(semaphore.available_permits(), 1, "the place is given back");
    }

    #[tokio::test(start_paused = true)]
    async fn an_active_connection_is_closed_only_when_idle() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, server) = tokio::io::duplex(64);
        let semaphore = std::sync::Arc::new(tokio::sync::Semaphore::new(1));
        let mut conn = Conn::new(
            server,
            "127.0.0.1:1".parse().unwrap(),
            semaphore.try_acquire_owned().unwrap(),
            Deadlines::new(Duration::from_secs(2), 1, Duration::from_secs(5)),
            "test",
            ListenerMetrics::default(),
        );
        let mut buf = [0u8; 8];
        for _ in 0..5 {
            client.write_all(b"x").await.unwrap();
            assert_eq!(conn.read(&mut buf).await.unwrap(), 1);
            tokio::time::sleep(Duration::from_secs(4)).await;
        }
        let quiet_from = Instant::now();
        let e = conn.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(
            quiet_from.elapsed() <= Duration::from_secs(1),
            "4 s were already idle"
        );
    }
}
