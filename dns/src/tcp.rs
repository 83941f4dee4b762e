//! DNS over TCP (RFC 1035 §4.2.2, RFC 7766) on connections that `meridian_listen::Listener`
//! accepted: the listener bounds how many there are and survives EMFILE; this module only
//! speaks the protocol on one of them.
//!
//! ```text
//!  Conn (bound, handshake + idle deadlines) ─► read into a fixed buffer ─► frame()
//!      ├─ Incomplete: read more, until the message deadline
//!      ├─ Message(n) ─► Dns::answer_tcp ─► length-prefixed replies ─► write
//!      │    a transfer (AXFR/IXFR): a place among MAX_TRANSFERS (else REFUSED after
//!      │    TRANSFER_WAIT), answered on a blocking thread, the place held while written
//!      └─ Invalid (shorter than a header, longer than MAX_TCP_REQUEST): close
//! ```
//!
//! Pipelined queries are answered one after the other, in order (RFC 7766 §6.2.1.1 allows
//! any order; in order needs no bookkeeping and a query is answered in microseconds). Every
//! query must arrive whole within `dns.tcpIdleTimeoutSeconds` of the previous answer, so a
//! byte-a-second client cannot hold its place by trickling, and every reply must be taken
//! within the same time, so a client that never reads cannot either.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, timeout_at};
use tracing::debug;

use crate::server::Dns;
use crate::wire;

/// The longest query read over TCP. The length prefix allows 65,535, but a query is a header,
/// one question and an OPT record: 4 KiB (the UDP bound too) is generous, and it keeps the
/// buffer of each of up to tens of thousands of connections small.
pub const MAX_TCP_REQUEST: usize = 4096;
/// Shorter than a DNS header: not a message at all.
const MIN_MESSAGE: usize = 12;
/// Zone transfers answered (built and written) at once, across every connection: a transfer
/// of the whole zone is the one answer whose cost grows with the fleet, and twenty of them
/// must not take the serving threads or the memory of twenty zones.
pub const MAX_TRANSFERS: usize = 4;
/// How long a transfer waits for a place before it is REFUSED.
const TRANSFER_WAIT: Duration = Duration::from_secs(5);

/// What the bytes buffered so far start with (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// Less than a whole message: read more.
    Incomplete,
    /// A whole message of this many bytes follows the 2-byte length prefix.
    Message(usize),
    /// The length prefix announces something no query is; the connection is closed (the
    /// stream cannot be re-synchronised, and a peer sending this is not a DNS client).
    Invalid(&'static str),
}

/// Reads the length prefix at the start of `buf` (pure).
pub fn frame(buf: &[u8]) -> Frame {
    let [hi, lo, rest @ ..] = buf else {
        return Frame::Incomplete;
    };
    let len = usize::from(u16::from_be_bytes([*hi, *lo]));
    if len < MIN_MESSAGE {
        return Frame::Invalid("tcp_message_shorter_than_a_header");
    }
    if len > MAX_TCP_REQUEST {
        return Frame::Invalid("tcp_message_too_long");
    }
    if rest.len() < len {
        return Frame::Incomplete;
    }
    Frame::Message(len)
}

/// `msg` with its 2-byte length prefix; `None` if it does not fit one (a reply is never
/// longer: `wire::encode` truncates at 65,535).
pub fn framed(msg: &[u8]) -> Option<Vec<u8>> {
    let len = u16::try_from(msg.len()).ok()?;
    let mut out = Vec::with_capacity(2 + msg.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(msg);
    Some(out)
}

/// Why a connection ended, for `meridian_dns_tcp_closed_total` (only the ends meridian chose
/// or that went wrong; a client closing is the normal end and not counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// The client closed (or reset) the connection.
    Client,
    /// No whole query within the idle timeout of the previous answer.
    Idle,
    /// A reply was not taken within the idle timeout.
    WriteTimeout,
    /// The length prefix was impossible (see [`Frame::Invalid`]).
    BadLength(&'static str),
    /// Answering panicked (a bug); only this connection ends.
    InternalError,
}

impl Closed {
    pub fn reason(self) -> Option<&'static str> {
        match self {
            Closed::Client => None,
            Closed::Idle => Some("idle"),
            Closed::WriteTimeout => Some("write_timeout"),
            Closed::BadLength(why) => Some(why),
            Closed::InternalError => Some("internal_error"),
        }
    }
}

/// Serves one connection until the client closes it or it is closed for one of the reasons
/// of [`Closed`]; returns which.
pub async fn serve_conn<S>(
    dns: &Arc<Dns>,
    mut stream: S,
    peer: SocketAddr,
    idle: Duration,
) -> Closed
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    // Never more than one whole query is needed to decide: a fixed buffer, read into only
    // as far as it has room (pipelined queries wait in the socket until there is).
    let mut buf = vec![0u8; 2 + MAX_TCP_REQUEST];
    let mut filled = 0;
    let mut deadline = Instant::now() + idle;
    loop {
        match frame(&buf[..filled]) {
            Frame::Incomplete => {
                match timeout_at(deadline, stream.read(&mut buf[filled..])).await {
                    Err(_) => return Closed::Idle,
                    Ok(Ok(0)) => {
                        if filled > 0 {
                            debug!(%peer, buffered = filled, "TCP client closed in the middle of a message");
                        }
                        return Closed::Client;
                    }
                    Ok(Ok(n)) => filled += n,
                    Ok(Err(e)) => {
                        // Also how the listener's own deadlines and evictions end a connection.
                        debug!(%peer, error = %e, "TCP DNS connection ended");
                        return Closed::Client;
                    }
                }
            }
            Frame::Message(len) => {
                let query = &buf[2..2 + len];
                // A transfer's place is held until its replies are written.
                let (replies, _place) = if wire::asks_transfer(query) {
                    transfer(dns, query, peer).await
                } else {
                    (dns.answer_tcp(query, peer), None)
                };
                let Some(replies) = replies else {
                    return Closed::InternalError;
                };
                buf.copy_within(2 + len..filled, 0);
                filled -= 2 + len;
                for reply in &replies {
                    match timeout_at(Instant::now() + idle, write(&mut stream, reply)).await {
                        Err(_) => return Closed::WriteTimeout,
                        Ok(Err(e)) => {
                            debug!(%peer, error = %e, "TCP DNS reply not sent");
                            return Closed::Client;
                        }
                        Ok(Ok(())) => {}
                    }
                }
                deadline = Instant::now() + idle;
            }
            Frame::Invalid(why) => {
                debug!(%peer, reason = why, "closing a TCP DNS connection: impossible length prefix");
                return Closed::BadLength(why);
            }
        }
    }
}

/// A transfer's replies, built on a blocking thread once it has a place among
/// [`MAX_TRANSFERS`] (returned, to be held while they are written); REFUSED if no place
/// frees within [`TRANSFER_WAIT`]. None if answering panicked.
async fn transfer(
    dns: &Arc<Dns>,
    query: &[u8],
    peer: SocketAddr,
) -> (Option<Vec<Vec<u8>>>, Option<OwnedSemaphorePermit>) {
    let place = timeout_at(
        Instant::now() + TRANSFER_WAIT,
        dns.transfers.clone().acquire_owned(),
    )
    .await;
    let Ok(Ok(place)) = place else {
        debug!(%peer, "zone transfer refused: {MAX_TRANSFERS} transfers in progress");
        dns.metrics.transfer_refused();
        let refused = wire::refused(query).and_then(|r| framed(&r));
        return (Some(refused.into_iter().collect()), None);
    };
    let (dns, query) = (dns.clone(), query.to_vec());
    let replies = tokio::task::spawn_blocking(move || dns.answer_tcp(&query, peer))
        .await
        .ok()
        .flatten();
    (replies, Some(place))
}

async fn write<S: AsyncWrite + Unpin>(stream: &mut S, bytes: &[u8]) -> io::Result<()> {
    stream.write_all(bytes).await?;
    stream.flush().await
}

#[cfg(test)]
mod tests;
