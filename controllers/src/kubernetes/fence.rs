//! Fenced writer clients: a second client per cluster, used only for writes, whose
//! connections refuse to put a byte on the wire once this replica's leadership has lapsed.
//!
//! Asking `Leadership::may_write` before a request is not enough: a request that passed the
//! check can sit in kube's `tower::buffer` or inside hyper while the process is frozen (a GC
//! pause elsewhere, a stopped VM, SIGSTOP), and go out when it resumes — past the renew
//! deadline, over the new leader's writes. Here the check runs in the connection itself, at
//! every socket write (TLS records included), so what resumes after the deadline fails with
//! `PermissionDenied` instead of reaching the API server; a request cut off part-way is a
//! broken request the server never applies.
//!
//! ```text
//!  Applier writes ─► kube Client ─► base URI, auth, headers ─► hyper ─► timeouts ─► TLS
//!                                                                  └─► Fenced TCP stream:
//!                                                                      poll_write asks
//!                                                                      Leadership::may_write
//! ```
//!
//! Reads (watches, discovery, gets) keep the ordinary client: a replica that does not lead
//! reads everything, and its writer connections carry nothing.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use kube::{Client, Config};
use tower::Service;

use super::leader::Leadership;

/// Builds the writer client of `config`'s cluster, fenced by `leadership`, with the same
/// TLS, credentials, headers and timeouts as kube's own client of that config.
pub fn writer(config: &Config, leadership: Leadership) -> Result<Client, kube::Error> {
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    super::transport::client_over(
        config,
        FencedConnector {
            inner: tcp,
            leadership,
        },
    )
}

/// The TCP connector of a writer client: its streams are [`Fenced`].
#[derive(Clone)]
struct FencedConnector {
    inner: HttpConnector,
    leadership: Leadership,
}

type Connecting<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl Service<Uri> for FencedConnector {
    type Response = Fenced<<HttpConnector as Service<Uri>>::Response>;
    type Error = <HttpConnector as Service<Uri>>::Error;
    type Future = Connecting<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let leadership = self.leadership.clone();
        let connecting = self.inner.call(uri);
        Box::pin(async move {
            let inner = connecting.await?;
            Ok(Fenced { inner, leadership })
        })
    }
}

/// A stream that writes only while this replica leads.
pub(crate) struct Fenced<T> {
    inner: T,
    leadership: Leadership,
}

impl<T> Fenced<T> {
    fn fenced() -> io::Error {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            "not the writer: a write after the renew deadline (or the member's handover) is fenced off",
        )
    }
}

impl<T: Read + Unpin> Read for Fenced<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: Write + Unpin> Write for Fenced<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if !this.leadership.may_write() {
            return Poll::Ready(Err(Self::fenced()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    // Every write goes through poll_write, and its check.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

impl<T: Connection> Connection for Fenced<T> {
    fn connected(&self) -> Connected {
        self.inner.connected()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use hyper_util::rt::TokioIo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::watch;

    use super::*;

    #[tokio::test]
    async fn a_stream_writes_while_leading_and_refuses_once_the_deadline_passed() {
        let (tx, rx) = watch::channel(Some(Instant::now() + Duration::from_secs(60)));
        let leadership = Leadership::following(rx);
        let (ours, theirs) = tokio::io::duplex(64);
        let mut stream = TokioIo::new(Fenced {
            inner: TokioIo::new(ours),
            leadership,
        });
        let mut theirs = theirs;
        stream.write_all(b"PATCH").await.unwrap();
        let mut got = [0u8; 5];
        theirs.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"PATCH");
        // The deadline passes (as after a freeze): nothing more reaches the other side.
        tx.send(Some(Instant::now() - Duration::from_millis(1)))
            .unwrap();
        let e = stream.write_all(b"DELETE").await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        drop(stream);
        let mut rest = Vec::new();
        theirs.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "{rest:?}");
    }
}
