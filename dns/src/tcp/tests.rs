//! The TCP framing as a pure function, then whole connections over an in-memory duplex
//! stream against a real `Dns` (no sockets; tokio's paused clock for the deadlines).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use meridian_core::Snapshot;
use meridian_core::testing::{FleetBuilder, cluster};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::watch;

use super::*;
use crate::config::DnsConfig;
use crate::server::Dns;

const IDLE: Duration = Duration::from_secs(10);

struct FrameCase {
    name: &'static str,
    buf: Vec<u8>,
    expect: Frame,
}

/// A buffer starting with the length prefix `len`, followed by `body` bytes.
fn prefixed(len: u16, body: usize) -> Vec<u8> {
    let mut v = len.to_be_bytes().to_vec();
    v.resize(2 + body, 0xab);
    v
}

#[test]
fn frame_cases() {
    let cases = [
        FrameCase {
            name: "nothing yet",
            buf: vec![],
            expect: Frame::Incomplete,
        },
        FrameCase {
            name: "half a length prefix",
            buf: vec![0],
            expect: Frame::Incomplete,
        },
        FrameCase {
            name: "a prefix and part of the message",
            buf: prefixed(29, 28),
            expect: Frame::Incomplete,
        },
        FrameCase {
            name: "a whole message",
            buf: prefixed(29, 29),
            expect: Frame::Message(29),
        },
        FrameCase {
            name: "a whole message and the start of the next (pipelining)",
            buf: prefixed(29, 29 + 5),
            expect: Frame::Message(29),
        },
        FrameCase {
            name: "the shortest message: a header",
            buf: prefixed(12, 12),
            expect: Frame::Message(12),
        },
        FrameCase {
            name: "a zero length is no message",
            buf: prefixed(0, 0),
            expect: Frame::Invalid("tcp_message_shorter_than_a_header"),
        },
        FrameCase {
            name: "shorter than a header, decided before the bytes come",
            buf: prefixed(11, 0),
            expect: Frame::Invalid("tcp_message_shorter_than_a_header"),
        },
        FrameCase {
            name: "the longest query read",
            buf: prefixed(MAX_TCP_REQUEST as u16, MAX_TCP_REQUEST),
            expect: Frame::Message(MAX_TCP_REQUEST),
        },
        FrameCase {
            name: "over the limit, decided from the prefix alone",
            buf: prefixed(MAX_TCP_REQUEST as u16 + 1, 0),
            expect: Frame::Invalid("tcp_message_too_long"),
        },
        FrameCase {
            name: "the largest prefix",
            buf: prefixed(u16::MAX, 3),
            expect: Frame::Invalid("tcp_message_too_long"),
        },
    ];
    for case in cases {
        assert_eq!(frame(&case.buf), case.expect, "{}", case.name);
    }
}

#[test]
fn framed_prefixes_the_length_and_refuses_what_does_not_fit() {
    assert_eq!(framed(b"abc").unwrap(), b"\x00\x03abc");
    assert_eq!(framed(&[0; 65_535]).unwrap().len(), 65_537);
    assert!(framed(&[0; 65_536]).is_none());
}

/// A `Dns` over `snap`; AXFR allowed to loopback.
fn dns(snap: Snapshot) -> Arc<Dns> {
    let cfg = DnsConfig {
        allow_transfer: vec!["127.0.0.0/8".parse().unwrap()],
        ..DnsConfig::default()
    };
    let (_tx, rx) = watch::channel(Arc::new(snap));
    Dns::new(cfg, 1, rx, &mut Registry::default())
}

/// shop/web in eu-1 with `ready` endpoints.
fn fleet(ready: u8) -> Snapshot {
    let mut fleet = FleetBuilder::new();
    fleet.add(cluster("eu-1", "eu", "eu-1a"), ready);
    fleet.snapshot()
}

fn query(id: u16, name: &str, qtype: RecordType) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    m.to_vec().unwrap()
}

fn with_prefix(msg: &[u8]) -> Vec<u8> {
    framed(msg).unwrap()
}

const PEER: &str = "127.0.0.1:5353";

/// Serves one connection on a task; the test holds the client end.
fn connect(dns: Arc<Dns>, buffer: usize) -> (DuplexStream, tokio::task::JoinHandle<Closed>) {
    let (client, server) = tokio::io::duplex(buffer);
    let peer: SocketAddr = PEER.parse().unwrap();
    let task = tokio::spawn(async move { serve_conn(&dns, server, peer, IDLE).await });
    (client, task)
}

async fn read_reply(client: &mut DuplexStream) -> Message {
    let len = client.read_u16().await.unwrap();
    let mut buf = vec![0; usize::from(len)];
    client.read_exact(&mut buf).await.unwrap();
    Message::from_vec(&buf).unwrap()
}

/// What the server sends before closing, and why it closed.
async fn rest(
    mut client: DuplexStream,
    task: tokio::task::JoinHandle<Closed>,
) -> (Vec<u8>, Closed) {
    let mut tail = Vec::new();
    client.read_to_end(&mut tail).await.unwrap();
    (tail, task.await.unwrap())
}

#[tokio::test]
async fn pipelined_queries_are_answered_in_order_on_one_connection() {
    let (mut client, task) = connect(dns(fleet(2)), 64 * 1024);
    let mut wire = Vec::new();
    for (id, name) in [
        (1, "web.shop.global."),
        (2, "nope.shop.global."),
        (3, "eu-1.web.shop.global."),
    ] {
        wire.extend(with_prefix(&query(id, name, RecordType::A)));
    }
    // One write with all three, the way a pipelining client sends them.
    client.write_all(&wire).await.unwrap();
    let replies = [
        read_reply(&mut client).await,
        read_reply(&mut client).await,
        read_reply(&mut client).await,
    ];
    let ids: Vec<u16> = replies.iter().map(|r| r.metadata.id).collect();
    assert_eq!(ids, [1, 2, 3]);
    assert_eq!(replies[0].answers.len(), 2);
    assert_eq!(replies[1].metadata.response_code, ResponseCode::NXDomain);
    assert_eq!(replies[2].answers.len(), 2);
    // The connection stays open for more.
    client
        .write_all(&with_prefix(&query(4, "web.shop.global.", RecordType::A)))
        .await
        .unwrap();
    assert_eq!(read_reply(&mut client).await.metadata.id, 4);
    client.shutdown().await.unwrap();
    let (tail, closed) = rest(client, task).await;
    assert!(tail.is_empty());
    assert_eq!(closed, Closed::Client);
}

#[tokio::test]
async fn a_query_split_across_writes_is_answered_once_whole() {
    let (mut client, task) = connect(dns(fleet(1)), 64 * 1024);
    let wire = with_prefix(&query(9, "web.shop.global.", RecordType::A));
    for piece in [&wire[..1], &wire[1..2], &wire[2..7], &wire[7..]] {
        client.write_all(piece).await.unwrap();
        tokio::task::yield_now().await;
    }
    assert_eq!(read_reply(&mut client).await.metadata.id, 9);
    drop(client);
    assert_eq!(task.await.unwrap(), Closed::Client);
}

#[tokio::test]
async fn an_answer_too_big_for_udp_comes_whole_over_tcp() {
    let (mut client, task) = connect(dns(fleet(200)), 64 * 1024);
    client
        .write_all(&with_prefix(&query(5, "web.shop.global.", RecordType::A)))
        .await
        .unwrap();
    let reply = read_reply(&mut client).await;
    assert!(!reply.metadata.truncation);
    assert_eq!(reply.answers.len(), 200);
    drop(client);
    task.await.unwrap();
}

#[tokio::test]
async fn a_zone_transfer_spans_several_messages_from_soa_to_soa() {
    let (mut client, task) = connect(dns(fleet(200)), 64 * 1024);
    client
        .write_all(&with_prefix(&query(6, "global.", RecordType::AXFR)))
        .await
        .unwrap();
    let mut records = Vec::new();
    let mut messages = 0;
    loop {
        let reply = read_reply(&mut client).await;
        assert_eq!(reply.metadata.id, 6);
        assert_eq!(reply.metadata.response_code, ResponseCode::NoError);
        messages += 1;
        records.extend(reply.answers);
        if records.len() > 1 && records.last().unwrap().record_type() == RecordType::SOA {
            break;
        }
    }
    assert!(messages > 1, "{} records in one message", records.len());
    assert_eq!(records[0].record_type(), RecordType::SOA);
    drop(client);
    task.await.unwrap();
}

#[tokio::test]
async fn transfers_past_the_bound_are_refused_and_queries_keep_their_answers() {
    let dns = dns(fleet(200));
    // Clients that never read: each transfer holds its place while its replies wait.
    let mut stalled = Vec::new();
    for id in 0..MAX_TRANSFERS as u16 {
        let (mut client, task) = connect(dns.clone(), 1024);
        client
            .write_all(&with_prefix(&query(id, "global.", RecordType::AXFR)))
            .await
            .unwrap();
        stalled.push((client, task));
    }
    let (mut asker, asked) = connect(dns.clone(), 64 * 1024);
    asker
        .write_all(&with_prefix(&query(90, "web.shop.global.", RecordType::A)))
        .await
        .unwrap();
    assert_eq!(read_reply(&mut asker).await.metadata.id, 90);
    let (mut late, _late) = connect(dns.clone(), 64 * 1024);
    late.write_all(&with_prefix(&query(91, "global.", RecordType::AXFR)))
        .await
        .unwrap();
    let refused = read_reply(&mut late).await;
    assert_eq!(
        (refused.metadata.id, refused.metadata.response_code),
        (91, ResponseCode::Refused)
    );
    drop(asker);
    asked.await.unwrap();
    for (client, task) in stalled {
        drop(client);
        task.await.unwrap();
    }
}

#[tokio::test]
async fn a_malformed_message_gets_formerr_and_the_connection_goes_on() {
    let (mut client, task) = connect(dns(fleet(1)), 64 * 1024);
    // A header announcing one question, and no question.
    let mut header = query(0x77, "web.shop.global.", RecordType::A);
    header.truncate(12);
    client.write_all(&with_prefix(&header)).await.unwrap();
    let reply = read_reply(&mut client).await;
    assert_eq!(
        (reply.metadata.id, reply.metadata.response_code),
        (0x77, ResponseCode::FormErr)
    );
    client
        .write_all(&with_prefix(&query(8, "web.shop.global.", RecordType::A)))
        .await
        .unwrap();
    assert_eq!(read_reply(&mut client).await.answers.len(), 1);
    drop(client);
    task.await.unwrap();
}

#[tokio::test]
async fn a_truncated_length_prefix_ends_without_a_reply() {
    let (mut client, task) = connect(dns(fleet(1)), 64 * 1024);
    client.write_all(&[0]).await.unwrap();
    client.shutdown().await.unwrap();
    let (tail, closed) = rest(client, task).await;
    assert!(tail.is_empty(), "{tail:?}");
    assert_eq!(closed, Closed::Client);
}

#[tokio::test]
async fn a_message_cut_short_ends_without_a_reply() {
    let (mut client, task) = connect(dns(fleet(1)), 64 * 1024);
    let wire = with_prefix(&query(3, "web.shop.global.", RecordType::A));
    client.write_all(&wire[..wire.len() - 1]).await.unwrap();
    client.shutdown().await.unwrap();
    let (tail, closed) = rest(client, task).await;
    assert!(tail.is_empty(), "{tail:?}");
    assert_eq!(closed, Closed::Client);
}

#[tokio::test]
async fn an_oversize_length_closes_the_connection_unread() {
    for len in [MAX_TCP_REQUEST as u16 + 1, u16::MAX] {
        let (mut client, task) = connect(dns(fleet(1)), 64 * 1024);
        // A real query first: answered; then the impossible prefix ends it.
        let mut wire = with_prefix(&query(1, "web.shop.global.", RecordType::A));
        wire.extend_from_slice(&len.to_be_bytes());
        client.write_all(&wire).await.unwrap();
        assert_eq!(read_reply(&mut client).await.metadata.id, 1);
        let (tail, closed) = rest(client, task).await;
        assert!(tail.is_empty());
        assert_eq!(closed, Closed::BadLength("tcp_message_too_long"), "{len}");
    }
}

#[tokio::test]
async fn a_zero_length_closes_the_connection() {
    let (mut client, task) = connect(dns(fleet(1)), 64 * 1024);
    client.write_all(&[0, 0]).await.unwrap();
    let (tail, closed) = rest(client, task).await;
    assert!(tail.is_empty());
    assert_eq!(
        closed,
        Closed::BadLength("tcp_message_shorter_than_a_header")
    );
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_is_closed_at_the_idle_timeout_after_the_last_answer() {
    let (mut client, task) = connect(dns(fleet(1)), 64 * 1024);
    tokio::time::sleep(IDLE - Duration::from_secs(1)).await;
    client
        .write_all(&with_prefix(&query(1, "web.shop.global.", RecordType::A)))
        .await
        .unwrap();
    read_reply(&mut client).await;
    let answered = Instant::now();
    let (tail, closed) = rest(client, task).await;
    assert!(tail.is_empty());
    assert_eq!(closed, Closed::Idle);
    assert_eq!(
        answered.elapsed(),
        IDLE,
        "counted from the answer, not the start"
    );
}

#[tokio::test(start_paused = true)]
async fn a_query_trickled_a_byte_at_a_time_is_closed_at_the_idle_timeout() {
    let (mut client, task) = connect(dns(fleet(1)), 64 * 1024);
    let started = Instant::now();
    let wire = with_prefix(&query(1, "web.shop.global.", RecordType::A));
    let trickle = tokio::spawn(async move {
        for b in wire {
            if client.write_all(&[b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        client
    });
    assert_eq!(task.await.unwrap(), Closed::Idle);
    assert_eq!(
        started.elapsed(),
        IDLE,
        "bytes coming do not extend the deadline"
    );
    let mut client = trickle.await.unwrap();
    let mut tail = Vec::new();
    client.read_to_end(&mut tail).await.unwrap();
    assert!(tail.is_empty(), "no reply to a query that never came whole");
}

#[tokio::test(start_paused = true)]
async fn a_client_that_never_reads_is_closed_at_the_write_timeout() {
    // 64 bytes of buffer: a 200-address answer cannot be taken by a client that never reads.
    let (mut client, task) = connect(dns(fleet(200)), 64);
    client
        .write_all(&with_prefix(&query(1, "web.shop.global.", RecordType::A)))
        .await
        .unwrap();
    let started = Instant::now();
    assert_eq!(task.await.unwrap(), Closed::WriteTimeout);
    assert_eq!(started.elapsed(), IDLE);
}
