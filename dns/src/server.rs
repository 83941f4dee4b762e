//! The DNS server: a UDP hot path of our own (cached bytes, a hash lookup and a copy) on
//! blocking worker threads, and TCP on connections accepted by `meridian_listen` (bounded,
//! alive through EMFILE, handshake and idle deadlines), framed by `tcp.rs`. Both call the
//! same answer function and encode with `wire.rs`.
//!
//! ```text
//!  UDP ─► hot_query (no alloc) ─► cache hit, still holds? ─► copy, patch ID + case ─► send
//!                                   │ miss
//!                                   ▼
//!           an address question or NXDOMAIN? ─► Answerer::respond_quick (answer::fast:
//!                                   │ no         the same decision, encoded by hand) ─► cache ─► send
//!                                   ▼
//!                 Request::from_bytes ─► Answerer::respond ─► wire::encode ─► cache ─► send
//!  TCP ─► meridian_listen::Listener (bound) ─► tcp::serve_conn (2-byte framing, pipelining,
//!         per-query and write deadlines) ─► Request::from_bytes ─► Answerer::respond
//!         ─► wire::encode (limit 65,535; a transfer's further messages) ─► write
//! ```

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use hickory_proto::op::{MessageType, ResponseCode};
use hickory_server::net::xfer::Protocol;
use hickory_server::server::Request;
use meridian_core::{ClientPlace, Snapshot, Stamp};
use meridian_listen::Listener;
use nix::errno::Errno;
use nix::sys::socket::{
    ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg,
};
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::answer::{Answerer, Depends, Response, Transport};
use crate::cache::AnswerCache;
use crate::config::DnsConfig;
use crate::metrics::{CounterSlot, DnsMetrics};
use crate::{tcp, wire};

/// Encoded answers to one question, for as long as what decided them holds.
struct CachedAnswer {
    holds: Holds,
    next: AtomicUsize,
    /// One slot per rotation of the answer, filled on first use.
    variants: Box<[OnceLock<Box<[u8]>>]>,
    slot: CounterSlot,
}

/// How long a cached answer holds: an answer about one service survives snapshots that
/// change other services (`meridian_core::Stamp`), a negative answer survives snapshots that
/// add or remove no service, anything else lives for its snapshot version.
enum Holds {
    Version(u64),
    Names(u64),
    Service(Arc<Stamp>),
}

impl Holds {
    fn of(depends: Depends, snap: &Snapshot) -> Self {
        match depends {
            // Nobody retires the stamps of a snapshot that was not restamped.
            _ if !snap.stamped => Holds::Version(snap.version),
            Depends::Snapshot => Holds::Version(snap.version),
            Depends::Names => Holds::Names(snap.names_version),
            Depends::Service(stamp) => Holds::Service(stamp),
        }
    }

    fn at(&self, snap: &Snapshot) -> bool {
        match self {
            Holds::Version(v) => *v == snap.version,
            // A snapshot nobody restamped retired nothing, so only its version can tell.
            Holds::Names(v) => snap.stamped && *v == snap.names_version,
            Holds::Service(stamp) => snap.stamped && stamp.holds_at(snap.version),
        }
    }
}

/// What the full path did, for the cache.
struct Answered {
    slot: CounterSlot,
    cacheable: bool,
    rotations: usize,
    depends: Depends,
}

/// Everything the DNS listeners share.
pub struct Dns {
    answerer: Answerer,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    /// Keyed by the exact bytes of `wire::HotKey` (boxed to their length, so an entry costs
    /// its key, not the key's 266-byte parse buffer).
    cache: AnswerCache<Arc<CachedAnswer>>,
    pub(crate) metrics: DnsMetrics,
    /// Rotates answers that are not served from the cache (TCP, ECS): the cache keeps its
    /// own counter per question.
    rotation: AtomicUsize,
    /// Places for zone transfers in progress (see `tcp::MAX_TRANSFERS`).
    pub(crate) transfers: Arc<tokio::sync::Semaphore>,
}

impl Dns {
    pub fn new(
        cfg: DnsConfig,
        serial_base: u32,
        snapshots: watch::Receiver<Arc<Snapshot>>,
        registry: &mut Registry,
    ) -> Arc<Self> {
        let answerer = Answerer::new(cfg, serial_base)
            .with_decision_metrics(crate::answer::DecisionMetrics::new(registry));
        let zones = (0..answerer.config().zones.len())
            .map(|z| answerer.zone_name(z).to_string())
            .collect();
        Arc::new(Self {
            cache: AnswerCache::new(answerer.config().cache_entries),
            metrics: DnsMetrics::new(zones, registry),
            answerer,
            snapshots,
            rotation: AtomicUsize::new(0),
            transfers: Arc::new(tokio::sync::Semaphore::new(crate::tcp::MAX_TRANSFERS)),
        })
    }

    pub fn answerer(&self) -> &Answerer {
        &self.answerer
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshots.borrow().clone()
    }

    fn next_rotation(&self) -> usize {
        self.rotation.fetch_add(1, Ordering::Relaxed)
    }

    /// Answers one UDP datagram into `out`; returns false when nothing should be sent.
    pub fn handle_udp(&self, raw: &[u8], src: SocketAddr, out: &mut Vec<u8>) -> bool {
        let snap = self.snapshot();
        // The source address places the client (a cluster, a geo locality, or unknown); a
        // query with ECS is never hot, so this is the place the cached answer was made for.
        let client = snap.locate(src.ip());
        let Some(hot) = wire::hot_query(raw, client) else {
            let rotation = self.next_rotation();
            return self
                .answer_full(&snap, raw, src.ip(), Transport::Udp, rotation, out)
                .is_some();
        };
        let mut rotation = 0;
        let cached = self
            .cache
            .get(hot.key.as_bytes())
            .filter(|e| e.holds.at(&snap));
        if let Some(entry) = &cached {
            if entry.variants.len() > 1 {
                rotation = entry.next.fetch_add(1, Ordering::Relaxed) % entry.variants.len();
            }
            if let Some(bytes) = entry.variants[rotation].get() {
                out.clear();
                out.extend_from_slice(bytes);
                // The cached bytes answer someone else's ID and letter case.
                out[..2].copy_from_slice(&raw[..2]);
                out[12..hot.name_end].copy_from_slice(&raw[12..hot.name_end]);
                self.metrics.cache_hits.inc();
                self.metrics.count(entry.slot);
                return true;
            }
        }
        self.metrics.cache_misses.inc();
        let _miss = tracing::info_span!(
            "dns.miss",
            qname = %wire::WireName(hot.name()),
            qtype = hot.qtype(),
        )
        .entered();
        let quick = self
            .answer_quick(&snap, raw, &hot, client, rotation)
            .and_then(|(answered, variants)| {
                let asked = rotation % answered.rotations.max(1);
                let at = variants.iter().position(|(r, _)| *r == asked)?;
                Some((answered, variants, at))
            });
        let (answered, variants) = match quick {
            Some((answered, variants, at)) => {
                out.clone_from(&variants[at].1);
                (answered, variants)
            }
            None => match self.answer_full(&snap, raw, src.ip(), Transport::Udp, rotation, out) {
                Some(answered) => (answered, Vec::new()),
                None => return false,
            },
        };
        if answered.cacheable {
            // An entry of this version whose rotation was missing gets it filled in.
            let entry = match cached {
                Some(entry) => entry,
                None => {
                    let entry = Arc::new(CachedAnswer {
                        holds: Holds::of(answered.depends, &snap),
                        next: AtomicUsize::new(1),
                        variants: (0..answered.rotations.max(1))
                            .map(|_| OnceLock::new())
                            .collect(),
                        slot: answered.slot,
                    });
                    self.cache
                        .insert(Box::from(hot.key.as_bytes()), entry.clone());
                    entry
                }
            };
            if variants.is_empty() {
                if let Some(cell) = entry.variants.get(rotation) {
                    let _ = cell.set(out.clone().into_boxed_slice());
                }
            } else {
                for (r, bytes) in variants {
                    if let Some(cell) = entry.variants.get(r) {
                        let _ = cell.set(bytes.into_boxed_slice());
                    }
                }
            }
        }
        true
    }

    /// The common miss (an address question about a service, or NXDOMAIN), decided as the
    /// full path decides and encoded without hickory (`answer::fast`), in `rotation` and,
    /// when they are few, every other rotation of the answer; `None` leaves the request to
    /// the full path.
    fn answer_quick(
        &self,
        snap: &Snapshot,
        raw: &[u8],
        hot: &wire::HotQuery,
        client: Option<ClientPlace>,
        rotation: usize,
    ) -> Option<(Answered, crate::answer::fast::Variants)> {
        let quick =
            self.answerer
                .respond_quick(snap, raw, hot, client, rotation, Instant::now())?;
        let slot = self.metrics.slot(
            Some(quick.zone),
            Some(quick.qtype),
            quick.rcode,
            Transport::Udp,
        );
        self.metrics.count(slot);
        self.metrics.quick_answers.inc();
        let answered = Answered {
            slot,
            cacheable: true,
            rotations: quick.rotations,
            depends: quick.depends,
        };
        Some((answered, quick.variants))
    }

    /// The full path for one datagram: parse, answer, encode. Also what the fuzz target drives.
    fn answer_full(
        &self,
        snap: &Snapshot,
        raw: &[u8],
        src: IpAddr,
        transport: Transport,
        rotation: usize,
        out: &mut Vec<u8>,
    ) -> Option<Answered> {
        let request = match self.parse(raw, SocketAddr::new(src, 0), transport, out) {
            Ok(request) => request,
            Err(answered) => return answered,
        };
        let resp = self
            .answerer
            .respond(snap, &request, src, transport, rotation, Instant::now());
        *out = wire::encode(&resp, &request.queries, wire::udp_limit(&request));
        Some(self.count(&resp, &request, transport))
    }

    /// Parses a request. `Err` when it is not answered in full: FORMERR in `out` (counted) for
    /// a request whose header parses, `None` (nothing to send) for the rest.
    fn parse(
        &self,
        raw: &[u8],
        src: SocketAddr,
        transport: Transport,
        out: &mut Vec<u8>,
    ) -> Result<Request, Option<Answered>> {
        // hickory reserves room for every announced question before reading one: a 12-byte
        // datagram claiming 65,535 would cost megabytes. More than one is FORMERR anyway.
        let questions = raw
            .get(4..6)
            .map_or(0, |c| u16::from_be_bytes([c[0], c[1]]));
        let protocol = match transport {
            Transport::Udp => Protocol::Udp,
            Transport::Tcp => Protocol::Tcp,
        };
        let parsed = if questions > 1 {
            Err("more than one question".to_string())
        } else {
            Request::from_bytes(raw.to_vec(), src, protocol).map_err(|e| e.to_string())
        };
        let request = match parsed {
            Ok(r) => r,
            Err(e) => {
                debug!(%src, error = %e, "malformed request");
                let Some(reply) = wire::format_error(raw) else {
                    self.metrics.dropped("unparsable header or a response");
                    return Err(None);
                };
                *out = reply;
                let slot = self
                    .metrics
                    .slot(None, None, ResponseCode::FormErr, transport);
                self.metrics.count(slot);
                return Err(Some(Answered {
                    slot,
                    cacheable: false,
                    rotations: 1,
                    depends: Depends::Snapshot,
                }));
            }
        };
        if request.metadata.message_type == MessageType::Response {
            self.metrics.dropped("a response, not a query");
            return Err(None);
        }
        Ok(request)
    }

    /// Counts an answered request.
    fn count(&self, resp: &Response, request: &Request, transport: Transport) -> Answered {
        let qtype = request.queries.queries().first().map(|q| q.query_type());
        let slot = self
            .metrics
            .slot(resp.zone, qtype, resp.metadata.response_code, transport);
        self.metrics.count(slot);
        Answered {
            slot,
            cacheable: resp.cacheable,
            rotations: resp.rotations,
            depends: resp.depends.clone(),
        }
    }

    /// Answers one message read from a TCP connection: the replies to send, each with its
    /// length prefix (a zone transfer has several; nothing at all for a message that is not a
    /// query). The same path as a UDP miss, with TCP's size limit (65,535) instead of the
    /// UDP one, so both transports give identical bytes for what fits a datagram. `None` if
    /// answering panicked: a bug, which must end only this connection, not the server.
    pub(crate) fn answer_tcp(&self, raw: &[u8], src: SocketAddr) -> Option<Vec<Vec<u8>>> {
        let answered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.answer_tcp_inner(raw, src)
        }));
        answered.map_err(|_| {
            error!(%src, request = ?raw, "answering a TCP request panicked; closed the connection");
            self.metrics.dropped("internal error");
        }).ok()
    }

    fn answer_tcp_inner(&self, raw: &[u8], src: SocketAddr) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let request = match self.parse(raw, src, Transport::Tcp, &mut out) {
            Ok(request) => request,
            Err(Some(_)) => return tcp::framed(&out).into_iter().collect(),
            Err(None) => return Vec::new(),
        };
        let snap = self.snapshot();
        let resp = self.answerer.respond(
            &snap,
            &request,
            src.ip(),
            Transport::Tcp,
            self.next_rotation(),
            Instant::now(),
        );
        self.count(&resp, &request, Transport::Tcp);
        let first = wire::encode(&resp, &request.queries, u16::MAX);
        let mut replies: Vec<Vec<u8>> = tcp::framed(&first).into_iter().collect();
        for chunk in &resp.continuation {
            match tcp::framed(&wire::encode_continuation(&resp, &request.queries, chunk)) {
                Some(reply) => replies.push(reply),
                None => {
                    warn!(%src, "a zone transfer message does not fit 65,535 bytes; transfer cut short");
                    break;
                }
            }
        }
        replies
    }

    /// Bytes in, bytes out, without the cache: the request path the fuzz target and the tests
    /// drive. `None` means no reply is sent.
    pub fn answer_bytes(&self, raw: &[u8], src: IpAddr) -> Option<Vec<u8>> {
        let snap = self.snapshot();
        let mut out = Vec::new();
        self.answer_full(&snap, raw, src, Transport::Udp, 0, &mut out)?;
        Some(out)
    }
}

/// Running listeners; dropping it does not stop them, `shutdown` does.
pub struct Listeners {
    pub udp: SocketAddr,
    pub tcp: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// The TCP accept loop; it owns the connection tasks, so aborting it ends them too.
    tcp_task: tokio::task::JoinHandle<()>,
}

impl Listeners {
    pub async fn shutdown(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.tcp_task.abort();
        let _ = self.tcp_task.await;
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// How often a UDP worker looks up from a blocking receive to check for shutdown.
const UDP_POLL: Duration = Duration::from_millis(250);

/// The UDP and TCP sockets DNS serves on, bound before anything starts so that every
/// listener that cannot bind is reported together.
pub struct Bound {
    udp: std::net::UdpSocket,
    tcp: tokio::net::TcpListener,
}

/// Binds UDP and TCP on `listen` (port 0 picks one port free on both).
pub async fn bind(listen: SocketAddr) -> io::Result<Bound> {
    let (udp, tcp) = bind_pair(listen).await?;
    Ok(Bound { udp, tcp })
}

/// Starts serving on the bound sockets. `guard` wraps the TCP socket in the listener that
/// bounds and times out its connections: the wiring chooses the bound (a share of the
/// descriptor limit, like the other listeners') and registers it with the same readiness
/// and metrics.
pub async fn serve(
    dns: Arc<Dns>,
    Bound { udp, tcp }: Bound,
    guard: impl FnOnce(tokio::net::TcpListener) -> Listener,
) -> io::Result<Listeners> {
    let udp_addr = udp.local_addr()?;
    let tcp_addr = tcp.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let workers = dns.answerer.config().udp_workers.max(1);
    let mut threads = Vec::new();
    for i in 0..workers {
        let socket = udp.try_clone()?;
        socket.set_read_timeout(Some(UDP_POLL))?;
        let dns = dns.clone();
        let stop = stop.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("dns-udp-{i}"))
                .spawn(move || udp_worker(&dns, &socket, &stop))?,
        );
    }
    let tcp_task = tokio::spawn(serve_tcp(dns, guard(tcp)));
    info!(udp = %udp_addr, tcp = %tcp_addr, "DNS listening");
    Ok(Listeners {
        udp: udp_addr,
        tcp: tcp_addr,
        stop,
        threads,
        tcp_task,
    })
}

/// The TCP accept loop: the listener hands out connections within its bound (and waits
/// out EMFILE); each is served on its own task, queries on one connection one at a time.
async fn serve_tcp(dns: Arc<Dns>, listener: Listener) {
    let idle = dns.answerer.config().tcp_idle_timeout;
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let conn = listener.accept().await;
        let peer = conn.peer();
        let dns = dns.clone();
        conns.spawn(async move {
            let closed = tcp::serve_conn(&dns, conn, peer, idle).await;
            if let Some(reason) = closed.reason() {
                dns.metrics.tcp_closed(reason);
            }
        });
        // Finished connections leave their results here until collected.
        while conns.try_join_next().is_some() {}
    }
}

async fn bind_pair(
    listen: SocketAddr,
) -> io::Result<(std::net::UdpSocket, tokio::net::TcpListener)> {
    // With port 0, retry until a port is free for both protocols.
    for _ in 0..20 {
        let udp = std::net::UdpSocket::bind(listen)?;
        let addr = udp.local_addr()?;
        match tokio::net::TcpListener::bind(addr).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) if listen.port() != 0 => return Err(e),
            Err(_) => continue,
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        "no port free for both UDP and TCP",
    ))
}

/// Datagrams read (and answered) per system call. Under load this divides the per-packet
/// syscall cost; when idle, `MSG_WAITFORONE` returns as soon as one datagram is there.
const UDP_BATCH: usize = 32;
/// Larger datagrams are not DNS queries we answer (EDNS payloads stop at 1232 anyway).
const UDP_MAX_REQUEST: usize = tcp::MAX_TCP_REQUEST;

fn udp_worker(dns: &Dns, socket: &std::net::UdpSocket, stop: &AtomicBool) {
    let fd = socket.as_raw_fd();
    // On the heap from the start (128 KiB would go through the thread's stack in Box::new).
    let mut bufs: Box<[[u8; UDP_MAX_REQUEST]; UDP_BATCH]> =
        (vec![[0u8; UDP_MAX_REQUEST]; UDP_BATCH].into_boxed_slice())
            .try_into()
            .expect("UDP_BATCH buffers");
    let mut outs: Vec<Vec<u8>> = (0..UDP_BATCH).map(|_| Vec::with_capacity(1232)).collect();
    let mut received: Vec<(usize, SocketAddr)> = Vec::with_capacity(UDP_BATCH);
    let mut addrs: Vec<Option<SockaddrStorage>> = Vec::with_capacity(UDP_BATCH);
    let mut recv_headers = MultiHeaders::<SockaddrStorage>::preallocate(UDP_BATCH, None);
    let mut send_headers = MultiHeaders::<SockaddrStorage>::preallocate(UDP_BATCH, None);
    // A batch allocates nothing (the I/O vectors are arrays on the stack): at a modest rate a
    // batch is one datagram, so what a batch costs, each query costs.
    while !stop.load(Ordering::Relaxed) {
        received.clear();
        {
            let mut iovs = bufs.each_mut().map(|b| [IoSliceMut::new(b)]);
            match recvmmsg(
                fd,
                &mut recv_headers,
                iovs.iter_mut(),
                MsgFlags::MSG_WAITFORONE,
                None,
            ) {
                Ok(msgs) => {
                    received.extend(msgs.filter_map(|m| Some((m.bytes, socket_addr(m.address?)?))))
                }
                Err(Errno::EAGAIN | Errno::EINTR) => continue,
                Err(e) => {
                    warn!(error = %e, "UDP receive failed");
                    continue;
                }
            }
        }
        let mut answered = [false; UDP_BATCH];
        for (i, &(len, src)) in received.iter().enumerate() {
            answered[i] = answer_one(dns, &bufs[i][..len], src, &mut outs[i]);
        }
        let mut replies: [[IoSlice<'_>; 1]; UDP_BATCH] =
            std::array::from_fn(|_| [IoSlice::new(&[])]);
        addrs.clear();
        for (((_, src), out), _) in
            (received.iter().zip(&outs).zip(answered)).filter(|(_, sent)| *sent)
        {
            replies[addrs.len()] = [IoSlice::new(out)];
            addrs.push(Some(SockaddrStorage::from(*src)));
        }
        if addrs.is_empty() {
            continue;
        }
        let no_cmsgs: [ControlMessage<'_>; 0] = [];
        if let Err(e) = sendmmsg(
            fd,
            &mut send_headers,
            replies[..addrs.len()].iter(),
            &addrs,
            no_cmsgs,
            MsgFlags::empty(),
        ) {
            debug!(error = %e, "UDP send failed");
        }
    }
}

/// Answers one datagram into `out`; false when nothing is to be sent. A bug in answering one
/// datagram must not take the worker (and UDP DNS) down.
fn answer_one(dns: &Dns, raw: &[u8], src: SocketAddr, out: &mut Vec<u8>) -> bool {
    let answered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        dns.handle_udp(raw, src, out)
    }));
    answered.unwrap_or_else(|_| {
        error!(%src, request = ?raw, "answering a request panicked; dropped it");
        dns.metrics.dropped("internal error");
        false
    })
}

fn socket_addr(addr: SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = addr.as_sockaddr_in() {
        return Some(SocketAddr::V4((*v4).into()));
    }
    addr.as_sockaddr_in6()
        .map(|v6| SocketAddr::V6((*v6).into()))
}

#[cfg(test)]
mod tests;
