//! The whole app in-process (`App::start`), on loopback, against a copy of the quickstart
//! fleet: DNS over real UDP and TCP sockets, changes on disk, the hot path's byte identity.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use meridian::app::App;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn start(dir: &Path) -> App {
    common::start_quickstart(dir, &[]).await
}

fn query(id: u16, name: &str, qtype: RecordType, edns: bool) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    if edns {
        let mut e = Edns::new();
        e.set_max_payload(1232);
        m.set_edns(e);
    }
    m.to_vec().unwrap()
}

async fn udp(server: SocketAddr, source: &str, bytes: &[u8]) -> Vec<u8> {
    let socket = tokio::net::UdpSocket::bind((source, 0)).await.unwrap();
    socket.send_to(bytes, server).await.unwrap();
    let mut buf = vec![0; 65535];
    let (n, _) = tokio::time::timeout(Duration::from_secs(5), socket.recv_from(&mut buf))
        .await
        .unwrap()
        .unwrap();
    buf.truncate(n);
    buf
}

async fn tcp(server: SocketAddr, source: &str, bytes: &[u8]) -> Vec<u8> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind((source.parse::<std::net::IpAddr>().unwrap(), 0).into())
        .unwrap();
    let mut stream = socket.connect(server).await.unwrap();
    stream
        .write_all(&(bytes.len() as u16).to_be_bytes())
        .await
        .unwrap();
    stream.write_all(bytes).await.unwrap();
    let len = stream.read_u16().await.unwrap();
    let mut buf = vec![0; usize::from(len)];
    stream.read_exact(&mut buf).await.unwrap();
    buf
}

fn addresses(bytes: &[u8]) -> Vec<String> {
    let m = Message::from_vec(bytes).unwrap();
    let mut v: Vec<String> = m.answers.iter().map(|r| r.data.to_string()).collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_follow_the_files_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let app = start(dir.path()).await;
    let server = app.dns_listeners.udp;
    let q = query(7, "payments.shop.global.", RecordType::A, false);
    assert_eq!(
        addresses(&udp(server, "127.0.1.1", &q).await),
        ["127.1.1.1", "127.1.1.2"]
    );

    // Unexport payments in eu-1: an eu-1 client moves to the next tier (eu-2, same region).
    let file = dir.path().join("clusters/eu-1/payments.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let without_export = text.replace("kind: ServiceExport", "kind: ConfigMap");
    let tmp = dir.path().join("clusters/eu-1/.payments.tmp");
    std::fs::write(&tmp, without_export).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    let changed = Instant::now();
    loop {
        let got = addresses(&udp(server, "127.0.1.1", &q).await);
        if got == ["127.1.2.1", "127.1.2.2"] {
            break;
        }
        assert!(changed.elapsed() < Duration::from_secs(10), "still {got:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_hot_path_and_tcp_give_identical_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let app = start(dir.path()).await;
    let (u, t) = (app.dns_listeners.udp, app.dns_listeners.tcp);
    for (name, qtype) in [
        ("Payments.Shop.Global.", RecordType::A),
        ("_http._tcp.payments.shop.global.", RecordType::SRV),
        ("nope.shop.global.", RecordType::A),
        ("db-0.eu-1.db.shop.svc.clusterset.local.", RecordType::A),
        ("global.", RecordType::SOA),
    ] {
        let q = query(4242, name, qtype, true);
        // The first query misses the cache and is answered with rotation 0; the second takes
        // rotation 1 (a different order when there are two answers), the third is a cache
        // hit on rotation 0 again.
        let first = udp(u, "127.0.2.1", &q).await;
        let second = udp(u, "127.0.2.1", &q).await;
        let third = udp(u, "127.0.2.1", &q).await;
        assert_eq!(first, third, "{name}: cache hit differs from the miss");
        assert_eq!(
            addresses(&first),
            addresses(&second),
            "{name}: rotation changes the order, not the set"
        );
        let mut other = q.clone();
        other[0..2].copy_from_slice(&99u16.to_be_bytes());
        let patched = udp(u, "127.0.2.1", &other).await;
        assert_eq!(&patched[..2], &99u16.to_be_bytes(), "{name}: ID patched");
        let over_tcp = tcp(t, "127.0.2.1", &q).await;
        assert_eq!(first, over_tcp, "{name}: UDP hot path and TCP differ");
    }
    let before = Message::from_vec(
        &udp(
            u,
            "127.0.2.1",
            &query(1, "nope.shop.global.", RecordType::A, false),
        )
        .await,
    )
    .unwrap();
    assert_eq!(before.metadata.response_code, ResponseCode::NXDomain);
    app.shutdown().await;
}
