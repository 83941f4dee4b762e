//! The HTTP stack of every cluster client: an HTTP/2 connection per API server (another per
//! hundred requests in flight), as client-go keeps, instead of kube-rs's HTTP/1.1 connection
//! per request in flight.
//!
//! A member is watched for a dozen kinds at once (Services, EndpointSlices, ServiceExports,
//! Nodes, HPAs, every propagated kind), and each HTTP/1.1 watch holds a connection — and a
//! file descriptor — of its own: ~20 per member, 20,000 at a thousand members, past this
//! machine's limit. Over TLS the client offers `h2` by ALPN; an API server that takes it
//! carries every watch, list and write of this client as streams of one connection. A server
//! that answers with `http/1.1` (or a plain `http://` endpoint) gets kube's behaviour. A
//! request that asks to switch protocols (the gateway's exec, attach and port-forward) goes
//! over HTTP/1.1, which has upgrades; HTTP/2 has none.
//!
//! ```text
//!  kube Client ─► headers ─► auth ─► retry (429/503/504) ─► base URI ─► Http
//!      Upgrade: … ─► hyper, http/1.1 only      everything else ─► Lanes ─► hyper (h2 | http/1.1)
//!                                                                      └─► timeouts ─► TLS (ALPN)
//!                                                                          └─► TCP (or fenced TCP)
//! ```
//!
//! One connection carries up to [`STREAMS_PER_CONNECTION`] requests at once; the next opens
//! another ([`Lanes`]), as client-go does, so a server's cap on streams never leaves a request
//! waiting behind watches that do not end.
//!
//! An idle HTTP/2 connection is pinged every [`KEEP_ALIVE`]: a peer gone silent (a member
//! behind a dropped route) fails every watch on it within [`KEEP_ALIVE_TIMEOUT`] of the ping,
//! and they start over on a new connection.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use http::Uri;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::rt::{Read, Write};
use hyper_rustls::FixedServerNameResolver;
use hyper_util::client::legacy::connect::{Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ConfigExt};
use kube::{Client, Config};
use parking_lot::Mutex;
use tower::{BoxError, Service, ServiceBuilder};

/// How often an HTTP/2 connection is pinged, idle or not.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// How long a ping may go unanswered before the connection (and every watch on it) fails.
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// A client of `config`'s cluster over plain TCP.
pub fn client(config: &Config) -> Result<Client, kube::Error> {
    if config.proxy_url.is_some() {
        // kube's own stack speaks to proxies (HTTP CONNECT, SOCKS5); HTTP/1.1 through them.
        return Client::try_from(config.clone());
    }
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    client_over(config, tcp)
}

/// A client of `config`'s cluster whose connections are made by `tcp`, with the TLS,
/// credentials, headers, timeouts and retries kube's own client of that config has.
pub fn client_over<C>(config: &Config, tcp: C) -> Result<Client, kube::Error>
where
    C: Service<Uri> + Clone + Send + Sync + 'static,
    C::Response: Connection + Read + Write + Send + Unpin + 'static,
    C::Future: Send + Unpin + 'static,
    C::Error: Into<BoxError>,
{
    let http = Http {
        lanes: Lanes::new(connector(config, tcp.clone(), true)?),
        upgrades: hyper_client(connector(config, tcp, false)?),
    };
    let service = ServiceBuilder::new()
        .layer(config.extra_headers_layer()?)
        .option_layer(config.auth_layer()?)
        .option_layer(
            config
                .default_retry
                .then(|| tower::retry::RetryLayer::new(RetryPolicy::server_retry())),
        )
        .layer(config.base_uri_layer())
        .map_err(BoxError::from)
        .service(http);
    Ok(Client::new(service, config.default_namespace.clone()))
}

type Connector<C> = hyper_timeout::TimeoutConnector<hyper_rustls::HttpsConnector<C>>;
type HyperClient<C> = hyper_util::client::legacy::Client<Connector<C>, Body>;

/// TLS (offering `h2` by ALPN when `http2`, else only `http/1.1`) and kube's timeouts over `tcp`.
fn connector<C>(config: &Config, tcp: C, http2: bool) -> Result<Connector<C>, kube::Error>
where
    C: Service<Uri> + Clone + Send + Sync + 'static,
    C::Response: Connection + Read + Write + Send + Unpin + 'static,
    C::Future: Send + Unpin + 'static,
    C::Error: Into<BoxError>,
{
    let mut tls = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = name.clone().try_into().map_err(|e| {
            kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(e))
        })?;
        tls = tls.with_server_name_resolver(FixedServerNameResolver::new(name));
    }
    let https = if http2 {
        tls.enable_http1().enable_http2().wrap_connector(tcp)
    } else {
        tls.enable_http1().wrap_connector(tcp)
    };
    let mut timed = hyper_timeout::TimeoutConnector::new(https);
    timed.set_connect_timeout(config.connect_timeout);
    timed.set_read_timeout(config.read_timeout);
    timed.set_write_timeout(config.write_timeout);
    timed.set_reset_reader_on_write(config.reset_reader_on_write);
    Ok(timed)
}

/// A hyper client with a pool of its own: one HTTP/2 connection to each server (or, over
/// HTTP/1.1, one per request in flight), pinged every [`KEEP_ALIVE`].
fn hyper_client<C>(connector: Connector<C>) -> HyperClient<C>
where
    C: Service<Uri> + Clone + Send + Sync + 'static,
    C::Response: Connection + Read + Write + Send + Unpin + 'static,
    C::Future: Send + Unpin + 'static,
    C::Error: Into<BoxError>,
{
    hyper_util::client::legacy::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(KEEP_ALIVE)
        .http2_keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(connector)
}

/// The bottom of a cluster client: a request that asks to switch protocols (exec, attach,
/// port-forward through the gateway: `Upgrade:`) goes over HTTP/1.1, where an upgrade exists,
/// as client-go keeps a separate round tripper for its SPDY and WebSocket streams; every other
/// request goes over the multiplexed [`Lanes`].
#[derive(Clone)]
struct Http<C> {
    lanes: Lanes<C>,
    upgrades: HyperClient<C>,
}

impl<C> Service<http::Request<Body>> for Http<C>
where
    C: Service<Uri> + Clone + Send + Sync + 'static,
    C::Response: Connection + Read + Write + Send + Unpin + 'static,
    C::Future: Send + Unpin + 'static,
    C::Error: Into<BoxError>,
{
    type Response = http::Response<Streamed>;
    type Error = hyper_util::client::legacy::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), Self::Error>> {
        // hyper's client is always ready: it queues a request until a connection takes it.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let (sent, stream) = if request.headers().contains_key(http::header::UPGRADE) {
            (self.upgrades.request(request), None)
        } else {
            let (client, stream) = self.lanes.take();
            (client.request(request), Some(stream))
        };
        Box::pin(async move {
            let response = sent.await?;
            Ok(response.map(|body| Streamed {
                body,
                _stream: stream,
            }))
        })
    }
}

/// How many requests one connection carries at once before the next one opens another.
/// An HTTP/2 server caps the streams of a connection (Go's default is 250, kube-apiserver's
/// 1,000), and a request past the cap waits for a stream to end — behind watches that may
/// never end, so a member's heartbeat would hang. client-go opens another connection then;
/// so does this, well below either cap. A member's own watches (a dozen kinds) fit in one.
pub const STREAMS_PER_CONNECTION: usize = 100;

/// The multiplexed connections to one API server: lanes, each a hyper client with its own
/// pool (so its own connection), filled in order up to [`STREAMS_PER_CONNECTION`] requests
/// in flight each.
#[derive(Clone)]
struct Lanes<C> {
    connector: Connector<C>,
    lanes: Arc<Mutex<Vec<Lane<C>>>>,
}

struct Lane<C> {
    client: HyperClient<C>,
    in_flight: Arc<AtomicUsize>,
}

impl<C> Lanes<C>
where
    C: Service<Uri> + Clone + Send + Sync + 'static,
    C::Response: Connection + Read + Write + Send + Unpin + 'static,
    C::Future: Send + Unpin + 'static,
    C::Error: Into<BoxError>,
{
    fn new(connector: Connector<C>) -> Self {
        Self {
            connector,
            lanes: Arc::default(),
        }
    }

    /// The first lane with room for one more request (a new one when none has), and the
    /// stream that request holds there until its response body is dropped.
    fn take(&self) -> (HyperClient<C>, Stream) {
        let mut lanes = self.lanes.lock();
        let index = match lanes
            .iter()
            .position(|l| l.in_flight.load(Ordering::Relaxed) < STREAMS_PER_CONNECTION)
        {
            Some(index) => index,
            None => {
                lanes.push(Lane {
                    client: hyper_client(self.connector.clone()),
                    in_flight: Arc::default(),
                });
                lanes.len() - 1
            }
        };
        let lane = &lanes[index];
        lane.in_flight.fetch_add(1, Ordering::Relaxed);
        (lane.client.clone(), Stream(lane.in_flight.clone()))
    }
}

/// A request in flight on a lane: its place there is given back when dropped.
struct Stream(Arc<AtomicUsize>);

impl Drop for Stream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that holds its request's [`Stream`] until it is dropped (a watch: until
/// the watcher stops reading).
pub struct Streamed {
    body: Incoming,
    _stream: Option<Stream>,
}

impl hyper::body::Body for Streamed {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http::{Request, Response};
    use hyper_util::rt::TokioIo;
    use hyper_util::server::conn::auto;

    use super::*;

    struct Server {
        addr: std::net::SocketAddr,
        ca: Vec<u8>,
        /// Connections that carried a request (hyper opens one per request racing to connect,
        /// and drops those that negotiate h2 after another did: they carry nothing).
        carried: Arc<AtomicUsize>,
        /// `/watch` requests received (each is held open for good, as a watch can be).
        watching: Arc<AtomicUsize>,
    }

    /// A TLS server offering `alpn`, allowing [`STREAMS_PER_CONNECTION`] streams on an HTTP/2
    /// connection, that answers every request but `/watch` with the HTTP version it came in.
    async fn server(alpn: &[&[u8]]) -> Server {
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let der = cert.cert.der().to_vec();
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
        let mut tls = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![der.clone().into()], key)
            .unwrap();
        tls.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let carried = Arc::new(AtomicUsize::new(0));
        let watching = Arc::new(AtomicUsize::new(0));
        let (count, watches) = (carried.clone(), watching.clone());
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let acceptor = acceptor.clone();
                let count = count.clone();
                let watches = watches.clone();
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let carried = std::sync::Once::new();
                    let service = hyper::service::service_fn(|req: Request<_>| {
                        carried.call_once(|| {
                            count.fetch_add(1, Ordering::SeqCst);
                        });
                        let watch = req.uri().path() == "/watch";
                        if watch {
                            watches.fetch_add(1, Ordering::SeqCst);
                        }
                        async move {
                            if watch {
                                std::future::pending::<()>().await;
                            }
                            // Held a while, so concurrent requests are in flight together.
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            let body = format!("{{\"version\":\"{:?}\"}}", req.version());
                            Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                                bytes::Bytes::from(body),
                            )))
                        }
                    });
                    let mut http = auto::Builder::new(TokioExecutor::new());
                    http.http2()
                        .max_concurrent_streams(STREAMS_PER_CONNECTION as u32);
                    let _ = http.serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        Server {
            addr,
            ca: der,
            carried,
            watching,
        }
    }

    fn client_of(server: &Server) -> Client {
        let mut config = Config::new(format!("https://{}", server.addr).parse().unwrap());
        config.root_cert = Some(vec![server.ca.clone()]);
        client(&config).unwrap()
    }

    async fn versions(client: &Client, n: usize) -> Vec<String> {
        let requests = (0..n).map(|_| {
            let client = client.clone();
            async move {
                let req = Request::get("/version").body(Vec::new()).unwrap();
                let v: serde_json::Value = client.request(req).await.unwrap();
                v["version"].as_str().unwrap().to_string()
            }
        });
        futures::future::join_all(requests).await
    }

    #[tokio::test]
    async fn concurrent_requests_share_one_http2_connection() {
        let server = server(&[b"h2", b"http/1.1"]).await;
        let client = client_of(&server);
        let seen = versions(&client, 8).await;
        assert!(seen.iter().all(|v| v == "HTTP/2.0"), "{seen:?}");
        assert_eq!(
            server.carried.load(Ordering::SeqCst),
            1,
            "one connection for all"
        );
        // And later ones (as watches re-opened) go on the same one.
        versions(&client, 8).await;
        assert_eq!(server.carried.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn requests_past_a_connection_s_stream_cap_open_another_connection() {
        let server = server(&[b"h2", b"http/1.1"]).await;
        let client = client_of(&server);
        // Watches that never end fill one connection and half of another.
        let watches = STREAMS_PER_CONNECTION * 3 / 2;
        let mut held = tokio::task::JoinSet::new();
        for _ in 0..watches {
            let client = client.clone();
            held.spawn(async move {
                let req = Request::get("/watch").body(Vec::new().into()).unwrap();
                let _ = client.send(req).await;
            });
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while server.watching.load(Ordering::SeqCst) < watches {
            assert!(
                tokio::time::Instant::now() < deadline,
                "only {} of {watches} watches reached the server: the rest wait for a stream",
                server.watching.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let answered = tokio::time::timeout(Duration::from_secs(5), versions(&client, 1)).await;
        assert_eq!(
            answered.expect("a request behind the watches waits"),
            ["HTTP/2.0"]
        );
        assert_eq!(server.carried.load(Ordering::SeqCst), 2, "two connections");
        held.abort_all();
    }

    #[tokio::test]
    async fn a_request_to_switch_protocols_goes_over_http1() {
        let server = server(&[b"h2", b"http/1.1"]).await;
        let client = client_of(&server);
        let upgrade = Request::get("/version")
            .header(http::header::CONNECTION, "Upgrade")
            .header(http::header::UPGRADE, "websocket")
            .body(Vec::new())
            .unwrap();
        let v: serde_json::Value = client.request(upgrade).await.unwrap();
        assert_eq!(v["version"], "HTTP/1.1");
        assert_eq!(versions(&client, 2).await, ["HTTP/2.0", "HTTP/2.0"]);
    }

    #[tokio::test]
    async fn a_server_without_http2_is_spoken_to_in_http1() {
        let server = server(&[b"http/1.1"]).await;
        let client = client_of(&server);
        let seen = versions(&client, 3).await;
        assert!(seen.iter().all(|v| v == "HTTP/1.1"), "{seen:?}");
        assert_eq!(
            server.carried.load(Ordering::SeqCst),
            3,
            "a connection per request in flight"
        );
    }
}
