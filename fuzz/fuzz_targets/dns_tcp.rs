//! A TCP DNS connection on arbitrary bytes: `meridian_dns::tcp::serve_conn` (RFC 7766
//! framing, pipelining, the per-connection buffer) against the fleet of `fleet.rs`.
//!
//! Input: the first byte picks the client's source address (as in `dns_request`), the second
//! the capacity of the in-memory pipe between client and server (1–256 bytes, so messages
//! and length prefixes arrive split at every possible place); the rest is what the client
//! sends before it closes its side.
//!
//! Checked, against a model of the framing walked over the same bytes with `tcp::frame`:
//! - the connection ends as the model says: `BadLength` at the first impossible length prefix,
//!   otherwise `Client` (the peer closed, after whole messages or in the middle of one); never
//!   `Idle` or `WriteTimeout` (the client sends everything and reads everything), never
//!   `InternalError` (answering panicked);
//! - what the server sent is a sequence of whole length-prefixed messages and nothing else,
//!   each one parses, is a response, and carries the ID of a query it answers, in the order
//!   the queries were sent (a zone transfer answers one query with several messages; a
//!   message that is itself a response gets none), with nothing after the records its header
//!   counts (`huge` in `fleet.rs` answers over 65,535 bytes: truncated at a whole record).

#![no_main]

mod fleet;

use std::net::SocketAddr;
use std::sync::LazyLock;
use std::time::Duration;

use fleet::{FIXTURE, SOURCES};
use hickory_proto::op::{Message, MessageType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
use libfuzzer_sys::fuzz_target;
use meridian_dns::tcp::{Closed, Frame, frame, serve_conn};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime")
});

/// Generous: the client never makes the server wait, so no deadline may fire.
const IDLE: Duration = Duration::from_secs(30);

/// What the framing of `sent` must lead to: the whole queries in it, and how the connection ends.
fn model(mut sent: &[u8]) -> (Vec<&[u8]>, Closed) {
    let mut queries = Vec::new();
    loop {
        match frame(sent) {
            Frame::Message(len) => {
                queries.push(&sent[2..2 + len]);
                sent = &sent[2 + len..];
            }
            Frame::Incomplete => return (queries, Closed::Client),
            Frame::Invalid(why) => return (queries, Closed::BadLength(why)),
        }
    }
}

/// The server's bytes as whole length-prefixed messages; panics on anything else.
fn replies(mut received: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while !received.is_empty() {
        let [hi, lo, rest @ ..] = received else {
            panic!("a lone byte after the last reply: {received:02x?}");
        };
        let len = usize::from(u16::from_be_bytes([*hi, *lo]));
        assert!(rest.len() >= len, "a reply cut short: {len} announced, {} sent", rest.len());
        out.push(&rest[..len]);
        received = &rest[len..];
    }
    out
}

/// Runs one connection: the client writes `sent` through a pipe of `capacity` bytes and closes
/// its side, reading everything the server sends until the server closes.
fn converse(peer: SocketAddr, capacity: usize, sent: &[u8]) -> (Closed, Vec<u8>) {
    let dns = &FIXTURE.dns;
    RUNTIME.block_on(async {
        let (client, server) = tokio::io::duplex(capacity);
        let (mut from_server, mut to_server) = tokio::io::split(client);
        let serve = async move { serve_conn(dns, server, peer, IDLE).await };
        let send = async move {
            // The server may close first (an impossible length prefix): the rest is refused.
            if to_server.write_all(sent).await.is_ok() {
                let _ = to_server.shutdown().await;
            }
            drop(to_server);
        };
        let receive = async move {
            let mut received = Vec::new();
            from_server.read_to_end(&mut received).await.expect("an in-memory pipe does not fail");
            received
        };
        let (closed, (), received) = tokio::join!(serve, send, receive);
        (closed, received)
    })
}

fuzz_target!(|data: &[u8]| {
    let [source, capacity, sent @ ..] = data else {
        return;
    };
    let peer = SocketAddr::new(SOURCES[usize::from(*source) % SOURCES.len()].0, 5353);
    let (queries, expected_end) = model(sent);

    let (closed, received) = converse(peer, usize::from(*capacity) + 1, sent);
    assert_eq!(closed, expected_end, "the connection ended otherwise than its framing says");

    let mut answering = 0;
    for reply in replies(&received) {
        let mut decoder = BinDecoder::new(reply);
        let msg = match Message::read(&mut decoder) {
            Ok(m) => m,
            Err(e) => panic!("a TCP reply does not parse: {e}: {reply:02x?}"),
        };
        // A reply over 65,535 bytes is truncated at a whole record (dnspython's TrailingJunk,
        // kdig's "trailing data" otherwise).
        assert!(decoder.is_empty(), "{} bytes after the records the header counts", decoder.len());
        assert_eq!(msg.metadata.message_type, MessageType::Response, "a TCP reply is not a response");
        // Replies come in query order: this one answers the current query or a later one.
        while queries.get(answering).is_some_and(|q| q[..2] != reply[..2]) {
            answering += 1;
        }
        assert!(
            answering < queries.len(),
            "a reply with ID {:02x?} answers no query sent at or after its place",
            &reply[..2]
        );
    }
});
