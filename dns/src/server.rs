//! The DNS server: a UDP hot path of our own (cached bytes, a hash lookup and a copy) on
//! blocking worker threads, and hickory-server for TCP. Both call the same answer function.
//!
//! ```text
//!  UDP ─► hot_query (no alloc) ─► moka hit, same snapshot version? ─► copy, patch ID + case ─► send
//!                                   │ miss
//!                                   ▼
//!                 Request::from_bytes ─► Answerer::respond ─► wire::encode ─► cache ─► send
//!  TCP ─► hickory-server (pipelining, idle timeout) ─► Answerer::respond ─► MessageResponse
//! ```

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use hickory_proto::op::{Header, HeaderCounts, MessageType, Metadata, ResponseCode};
use hickory_server::net::runtime::Time;
use hickory_server::net::xfer::Protocol;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use meridian_core::Snapshot;
use moka::sync::Cache;
use nix::errno::Errno;
use nix::sys::socket::{
    ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg,
};
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::answer::{Answerer, Transport};
use crate::config::DnsConfig;
use crate::metrics::{CounterSlot, DnsMetrics};
use crate::wire;

/// Encoded answers to one question, for one snapshot version.
struct CachedAnswer {
    version: u64,
    next: AtomicUsize,
    /// One slot per rotation of the answer, filled on first use.
    variants: Box<[OnceLock<Box<[u8]>>]>,
    slot: CounterSlot,
}

/// What the full path did, for the cache.
struct Answered {
    slot: CounterSlot,
    cacheable: bool,
    rotations: usize,
}

/// Everything the DNS listeners share.
pub struct Dns {
    answerer: Answerer,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    /// Keyed by the exact bytes of `wire::HotKey` (boxed to their length, so an entry costs
    /// its key, not the key's 266-byte parse buffer).
    cache: Cache<Box<[u8]>, Arc<CachedAnswer>>,
    metrics: DnsMetrics,
    /// Rotates answers that are not served from the cache (TCP, ECS): the cache keeps its
    /// own counter per question.
    rotation: AtomicUsize,
}

impl Dns {
    pub fn new(
        cfg: DnsConfig,
        serial_base: u32,
        snapshots: watch::Receiver<Arc<Snapshot>>,
        registry: &mut Registry,
    ) -> Arc<Self> {
        let answerer = Answerer::new(cfg, serial_base)
            .with_decision_metrics(crate::metrics::DecisionMetrics::new(registry));
        let zones = (0..answerer.config().zones.len())
            .map(|z| answerer.zone_name(z).to_string())
            .collect();
        Arc::new(Self {
            cache: Cache::builder()
                .max_capacity(answerer.config().cache_entries)
                .build(),
            metrics: DnsMetrics::new(zones, registry),
            answerer,
            snapshots,
            rotation: AtomicUsize::new(0),
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
        let client = snap.client_cluster(src.ip());
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
            .filter(|e| e.version == snap.version);
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
        let Some(answered) = self.answer_full(&snap, raw, src.ip(), Transport::Udp, rotation, out)
        else {
            return false;
        };
        if answered.cacheable {
            // An entry of this version whose rotation was missing gets it filled in.
            let entry = match cached {
                Some(entry) => entry,
                None => {
                    let entry = Arc::new(CachedAnswer {
                        version: snap.version,
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
            if let Some(cell) = entry.variants.get(rotation) {
                let _ = cell.set(out.clone().into_boxed_slice());
            }
        }
        true
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
        // hickory reserves room for every announced question before reading one: a 12-byte
        // datagram claiming 65,535 would cost megabytes. More than one is FORMERR anyway.
        let questions = raw
            .get(4..6)
            .map_or(0, |c| u16::from_be_bytes([c[0], c[1]]));
        let parsed = if questions > 1 {
            Err("more than one question".to_string())
        } else {
            Request::from_bytes(raw.to_vec(), SocketAddr::new(src, 0), Protocol::Udp)
                .map_err(|e| e.to_string())
        };
        let request = match parsed {
            Ok(r) => r,
            Err(e) => {
                debug!(%src, error = %e, "malformed request");
                let reply = wire::format_error(raw);
                if reply.is_none() {
                    self.metrics.dropped("unparsable header or a response");
                    return None;
                }
                *out = reply?;
                let slot = self
                    .metrics
                    .slot(None, None, ResponseCode::FormErr, transport);
                self.metrics.count(slot);
                return Some(Answered {
                    slot,
                    cacheable: false,
                    rotations: 1,
                });
            }
        };
        if request.metadata.message_type == MessageType::Response {
            self.metrics.dropped("a response, not a query");
            return None;
        }
        let resp = self
            .answerer
            .respond(snap, &request, src, transport, rotation, Instant::now());
        *out = wire::encode(&resp, &request.queries, wire::udp_limit(&request));
        let qtype = request.queries.queries().first().map(|q| q.query_type());
        let slot = self
            .metrics
            .slot(resp.zone, qtype, resp.metadata.response_code, transport);
        self.metrics.count(slot);
        Some(Answered {
            slot,
            cacheable: resp.cacheable,
            rotations: resp.rotations,
        })
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

/// hickory-server's view of meridian: TCP (and anything hickory serves) goes through here.
struct Handler(Arc<Dns>);

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        let dns = &self.0;
        let transport = match request.protocol() {
            Protocol::Udp => Transport::Udp,
            _ => Transport::Tcp,
        };
        let snap = dns.snapshot();
        let resp = dns.answerer.respond(
            &snap,
            request,
            request.src().ip(),
            transport,
            dns.next_rotation(),
            Instant::now(),
        );
        let qtype = request.queries.queries().first().map(|q| q.query_type());
        dns.metrics.count(dns.metrics.slot(
            resp.zone,
            qtype,
            resp.metadata.response_code,
            transport,
        ));
        let queries = wire::question_of(&resp, &request.queries);
        let builder = MessageResponseBuilder::new(queries, resp.edns.as_ref());
        let message = builder.build(
            resp.metadata,
            resp.answers.iter(),
            resp.authorities.iter(),
            std::iter::empty(),
            resp.additionals.iter(),
        );
        let info = match response_handle.send_response(message).await {
            Ok(info) => info,
            Err(e) => {
                warn!(error = %e, "failed to send a DNS response");
                return failed(request);
            }
        };
        for chunk in &resp.continuation {
            let builder = MessageResponseBuilder::new(&request.queries, resp.edns.as_ref());
            let message = builder.build(
                resp.metadata,
                chunk.iter(),
                std::iter::empty(),
                std::iter::empty(),
                std::iter::empty(),
            );
            if let Err(e) = response_handle.send_response(message).await {
                warn!(error = %e, "zone transfer interrupted");
                break;
            }
        }
        info
    }
}

fn failed(request: &Request) -> ResponseInfo {
    let mut metadata = Metadata::response_from_request(&request.metadata);
    metadata.response_code = ResponseCode::ServFail;
    ResponseInfo::from(Header {
        metadata,
        counts: HeaderCounts::default(),
    })
}

/// Running listeners; dropping it does not stop them, `shutdown` does.
pub struct Listeners {
    pub udp: SocketAddr,
    pub tcp: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    server: hickory_server::Server<Handler>,
}

impl Listeners {
    pub async fn shutdown(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.server.shutdown_gracefully().await;
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// How often a UDP worker looks up from a blocking receive to check for shutdown.
const UDP_POLL: Duration = Duration::from_millis(250);

/// Binds UDP and TCP on `listen` (port 0 picks one port free on both) and starts serving.
pub async fn serve(dns: Arc<Dns>, listen: SocketAddr) -> io::Result<Listeners> {
    let (udp, tcp) = bind_pair(listen).await?;
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
    let mut server = hickory_server::Server::new(Handler(dns.clone()));
    server.register_listener(tcp, dns.answerer.config().tcp_idle_timeout, 64);
    info!(udp = %udp_addr, tcp = %tcp_addr, "DNS listening");
    Ok(Listeners {
        udp: udp_addr,
        tcp: tcp_addr,
        stop,
        threads,
        server,
    })
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
const UDP_MAX_REQUEST: usize = 4096;

fn udp_worker(dns: &Dns, socket: &std::net::UdpSocket, stop: &AtomicBool) {
    let fd = socket.as_raw_fd();
    let mut bufs = vec![[0u8; UDP_MAX_REQUEST]; UDP_BATCH];
    let mut outs: Vec<Vec<u8>> = (0..UDP_BATCH).map(|_| Vec::with_capacity(1232)).collect();
    let mut received: Vec<(usize, SocketAddr)> = Vec::with_capacity(UDP_BATCH);
    let mut recv_headers = MultiHeaders::<SockaddrStorage>::preallocate(UDP_BATCH, None);
    let mut send_headers = MultiHeaders::<SockaddrStorage>::preallocate(UDP_BATCH, None);
    while !stop.load(Ordering::Relaxed) {
        received.clear();
        {
            let mut iovs: Vec<[IoSliceMut<'_>; 1]> =
                bufs.iter_mut().map(|b| [IoSliceMut::new(b)]).collect();
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
        let to_send = || {
            received
                .iter()
                .zip(&outs)
                .zip(answered)
                .filter(|(_, sent)| *sent)
        };
        let replies: Vec<[IoSlice<'_>; 1]> =
            to_send().map(|((_, out), _)| [IoSlice::new(out)]).collect();
        let addrs: Vec<Option<SockaddrStorage>> = to_send()
            .map(|(((_, src), _), _)| Some(SockaddrStorage::from(*src)))
            .collect();
        if replies.is_empty() {
            continue;
        }
        let no_cmsgs: [ControlMessage<'_>; 0] = [];
        if let Err(e) = sendmmsg(
            fd,
            &mut send_headers,
            replies.iter(),
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
