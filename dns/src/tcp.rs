//! DNS over TCP (RFC 1035 §4.2.2, RFC 7766) on connections that `meridian_listen::Listener`
//! accepted: the listener bounds how many there are and survives EMFILE; this module only
//! speaks the protocol on one of them.
//!
//! ```text
//!  Conn (bound, handshake + idle deadlines) ─► read into a fixed buffer ─► frame()
//!      ├─ Incomplete: read more, until the message deadline
//!      ├─ Message(n) ─► Dns::answer_tcp ─► length-prefixed replies (a transfer: several) ─► write
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
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::{Instant, timeout_at};
use tracing::debug;

use crate::server::Dns;

/// The longest query read over TCP. The length prefix allows 65,535, but a query is a header,
/// one question and an OPT record: 4 KiB (the UDP bound too) is generous, and it keeps the
/// buffer of each of up to tens of thousands of connections small.
pub const MAX_TCP_REQUEST: usize = 4096;
/// Shorter than a DNS header: not a message at all.
const MIN_MESSAGE: usize = 12;

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
pub async fn serve_conn<S>(dns: &Dns, mut stream: S, peer: SocketAddr, idle: Duration) -> Closed
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
                let Some(replies) = dns.answer_tcp(&buf[2..2 + len], peer) else {
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

async fn write<S: AsyncWrite + Unpin>(stream: &mut S, bytes: &[u8]) -> io::Result<()> {
    stream.write_all(bytes).await?;
    stream.flush().await
}

#[cfg(test)]
mod tests;
