//! The HTTP stack of every cluster client: one HTTP/2 connection per API server, as client-go
//! keeps, instead of kube-rs's HTTP/1.1 connection per request in flight.
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
//!  kube Client ─► headers ─► auth ─► retry (429/503/504) ─► base URI ─► ByUpgrade
//!      Upgrade: … ─► hyper, http/1.1 only      everything else ─► hyper (h2 | http/1.1)
//!                                                                      └─► timeouts ─► TLS (ALPN)
//!                                                                          └─► TCP (or fenced TCP)
//! ```
//!
//! An idle HTTP/2 connection is pinged every [`KEEP_ALIVE`]: a peer gone silent (a member
//! behind a dropped route) fails every watch on it within [`KEEP_ALIVE_TIMEOUT`] of the ping,
//! and they start over on a new connection.

use std::time::Duration;

use http::Uri;
use hyper::rt::{Read, Write};
use hyper_rustls::FixedServerNameResolver;
use hyper_util::client::legacy::connect::{Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ConfigExt};
use kube::{Client, Config};
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
    let http = ByUpgrade {
        multiplexed: hyper_client(config, tcp.clone(), true)?,
        upgrades: hyper_client(config, tcp, false)?,
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

type HyperClient<C> = hyper_util::client::legacy::Client<
    hyper_timeout::TimeoutConnector<hyper_rustls::HttpsConnector<C>>,
    Body,
>;

/// The hyper client under a cluster client: offering `h2` by ALPN when `http2`, else only
/// `http/1.1`.
fn hyper_client<C>(config: &Config, tcp: C, http2: bool) -> Result<HyperClient<C>, kube::Error>
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
    Ok(
        hyper_util::client::legacy::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .http2_keep_alive_interval(KEEP_ALIVE)
            .http2_keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .http2_keep_alive_while_idle(true)
            .build(timed),
    )
}

/// Sends a request that asks to switch protocols (exec, attach, port-forward through the
/// gateway: `Connection: Upgrade`) over HTTP/1.1, where an upgrade exists, and every other
/// request over the multiplexed connection — as client-go keeps a separate round tripper
/// for its SPDY and WebSocket streams.
#[derive(Clone)]
struct ByUpgrade<S> {
    multiplexed: S,
    upgrades: S,
}

impl<S> Service<http::Request<Body>> for ByUpgrade<S>
where
    S: Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        match self.multiplexed.poll_ready(cx) {
            std::task::Poll::Ready(Ok(())) => self.upgrades.poll_ready(cx),
            other => other,
        }
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.headers().contains_key(http::header::UPGRADE) {
            self.upgrades.call(request)
        } else {
            self.multiplexed.call(request)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http::{Request, Response};
    use hyper_util::rt::TokioIo;
    use hyper_util::server::conn::auto;

    use super::*;

    /// A TLS server offering `alpn` that answers every request with the HTTP version it came
    /// in; returns its address, its CA (DER) and the count of connections that carried a
    /// request (hyper opens one per request racing to connect, and drops those that negotiate
    /// h2 after another did: they carry nothing).
    async fn server(alpn: &[&[u8]]) -> (std::net::SocketAddr, Vec<u8>, Arc<AtomicUsize>) {
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
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let acceptor = acceptor.clone();
                let count = count.clone();
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let carried = std::sync::Once::new();
                    let service = hyper::service::service_fn(|req: Request<_>| {
                        carried.call_once(|| {
                            count.fetch_add(1, Ordering::SeqCst);
                        });
                        async move {
                            // Held a while, so concurrent requests are in flight together.
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            let body = format!("{{\"version\":\"{:?}\"}}", req.version());
                            Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                                bytes::Bytes::from(body),
                            )))
                        }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (addr, der, accepted)
    }

    fn config(addr: std::net::SocketAddr, ca: Vec<u8>) -> Config {
        let mut config = Config::new(format!("https://{addr}").parse().unwrap());
        config.root_cert = Some(vec![ca]);
        config
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
        let (addr, ca, accepted) = server(&[b"h2", b"http/1.1"]).await;
        let client = client(&config(addr, ca)).unwrap();
        let seen = versions(&client, 8).await;
        assert!(seen.iter().all(|v| v == "HTTP/2.0"), "{seen:?}");
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "one connection for all");
        // And later ones (as watches re-opened) go on the same one.
        versions(&client, 8).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_request_to_switch_protocols_goes_over_http1() {
        let (addr, ca, _) = server(&[b"h2", b"http/1.1"]).await;
        let client = client(&config(addr, ca)).unwrap();
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
        let (addr, ca, accepted) = server(&[b"http/1.1"]).await;
        let client = client(&config(addr, ca)).unwrap();
        let seen = versions(&client, 3).await;
        assert!(seen.iter().all(|v| v == "HTTP/1.1"), "{seen:?}");
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            3,
            "a connection per request in flight"
        );
    }
}
