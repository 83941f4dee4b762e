//! One UDP datagram in, the reply out, through both request paths of `meridian_dns::Dns`:
//! `handle_udp` (hot path + answer cache, asked twice so the second ask can hit the cache) and
//! `answer_bytes` (the full path without the cache), against a Snapshot shaped like
//! examples/quickstart.
//!
//! Every reply must echo the query ID, parse again, and fit the UDP size limit; the cached
//! path must give the uncached path's answer (byte for byte, except that rotation may reorder
//! a multi-record answer). Before the input itself, a "sibling" of it is sent from another
//! address of the same client cluster: same question, other ID, other letter case, other
//! header/EDNS bits the cache key ignores. Its cached reply is then what the input gets on a
//! hit, so a cache key that leaves out something the answer depends on fails on one input.
//!
//! The first input byte (also the high byte of the ID) picks the source address.

#![no_main]

mod fleet;

use std::net::SocketAddr;

use std::sync::LazyLock;

use fleet::{FIXTURE, SOURCES};
use hickory_proto::op::{Message, MessageType};
use libfuzzer_sys::fuzz_target;

/// `MERIDIAN_FUZZ_PRINT=1` prints every reply (to look at what seeds or a crash get back).
static PRINT: LazyLock<bool> = LazyLock::new(|| std::env::var_os("MERIDIAN_FUZZ_PRINT").is_some());

/// The UDP size limit a reply to `raw` must fit: 512 without EDNS, else the client's payload
/// clamped to 512..=1232.
fn request_limit(raw: &[u8]) -> usize {
    match Message::from_vec(raw) {
        Ok(m) => m.edns.map_or(512, |e| usize::from(e.max_payload().clamp(512, 1232))),
        Err(_) => 512,
    }
}

/// Checks one reply and returns it parsed.
fn check_reply(what: &str, raw: &[u8], reply: &[u8]) -> Message {
    assert!(reply.len() >= 12, "{what}: reply shorter than a header: {reply:02x?}");
    if raw.len() >= 2 {
        assert_eq!(reply[..2], raw[..2], "{what}: reply ID differs from the query's");
    }
    let limit = request_limit(raw);
    assert!(
        reply.len() <= limit,
        "{what}: reply of {} bytes exceeds the UDP limit of {limit}: {reply:02x?}",
        reply.len()
    );
    let msg = match Message::from_vec(reply) {
        Ok(m) => m,
        Err(e) => panic!("{what}: reply does not parse: {e}: {reply:02x?}"),
    };
    assert_eq!(msg.metadata.message_type, MessageType::Response, "{what}: reply is not a response");
    msg
}

/// Records of a section, order-free.
fn record_set(records: &[hickory_proto::rr::Record]) -> Vec<String> {
    let mut out: Vec<String> = records.iter().map(|r| format!("{r:?}")).collect();
    out.sort();
    out
}

/// `handle_udp`'s reply must be `answer_bytes`' one: the same bytes, or, where a section holds
/// several records, the same header, question, EDNS and records in another order. Rotation
/// reorders A/AAAA answers, and the A/AAAA additionals of a clusterset SRV answer; the cache
/// rotates per question, and `handle_udp`'s uncached path (not a plain query: ECS, trailing
/// bytes, compression...) by a global counter, while `answer_bytes` always uses rotation 0.
fn assert_same_answer(what: &str, cached: &[u8], cached_msg: &Message, uncached: &[u8]) {
    if cached == uncached {
        return;
    }
    let uncached_msg = Message::from_vec(uncached).expect("uncached reply parses (checked before)");
    let several = |m: &Message| [&m.answers, &m.authorities, &m.additionals].iter().any(|s| s.len() > 1);
    let same = several(cached_msg)
        && cached_msg.metadata == uncached_msg.metadata
        && cached_msg.queries == uncached_msg.queries
        && cached_msg.edns == uncached_msg.edns
        && record_set(&cached_msg.answers) == record_set(&uncached_msg.answers)
        && record_set(&cached_msg.authorities) == record_set(&uncached_msg.authorities)
        && record_set(&cached_msg.additionals) == record_set(&uncached_msg.additionals);
    assert!(
        same,
        "{what}: handle_udp and answer_bytes disagree\n handle_udp:   {cached:02x?}\n answer_bytes: {uncached:02x?}\n{cached_msg:#?}\n{uncached_msg:#?}"
    );
}

/// The question name's end, walking labels like the hot path (no compression).
fn name_end(raw: &[u8]) -> Option<usize> {
    let mut pos = 12;
    loop {
        let len = usize::from(*raw.get(pos)?);
        if len == 0 {
            return Some(pos + 1);
        }
        if len > 63 || pos + 1 + len > raw.len() {
            return None;
        }
        pos += 1 + len;
    }
}

/// The same question as `raw` with everything the cache key ignores changed: the ID, the
/// letter case of the name, AA/TC, Z/AD/RA and the request's RCODE bits, and in an OPT record
/// right after a single question, the extended RCODE and the DO/Z flags.
fn sibling(raw: &[u8]) -> Option<Vec<u8>> {
    if raw.len() < 12 {
        return None;
    }
    let mut s = raw.to_vec();
    s[0] ^= 0xA5;
    s[1] ^= 0x5A;
    s[2] ^= 0x06;
    s[3] ^= 0xEF;
    if let Some(end) = name_end(raw) {
        for b in &mut s[12..end] {
            if b.is_ascii_alphabetic() {
                *b ^= 0x20;
            }
        }
        // Label lengths may be letters too (0x41..): undo those.
        let mut pos = 12;
        while pos < end {
            let len = usize::from(raw[pos]);
            s[pos] = raw[pos];
            pos += 1 + len;
        }
        let opt = end + 4;
        if raw[10..12] == [0, 1] && raw.len() >= opt + 11 && raw[opt] == 0 && raw[opt + 1..opt + 3] == [0, 41] {
            s[opt + 5] ^= 0x3C;
            s[opt + 7] ^= 0x80;
            s[opt + 8] ^= 0x01;
        }
    }
    Some(s)
}

fuzz_target!(|data: &[u8]| {
    let fx = &*FIXTURE;
    let sel = usize::from(data.first().copied().unwrap_or(0));
    let (src_ip, twin_ip) = SOURCES[sel % SOURCES.len()];
    let src = SocketAddr::new(src_ip, 5353);

    let uncached = fx.dns.answer_bytes(data, src_ip);
    if let Some(reply) = &uncached {
        let msg = check_reply("answer_bytes", data, reply);
        if *PRINT {
            eprintln!("source {src_ip}, {} bytes:\n{msg}", reply.len());
        }
    } else if *PRINT {
        eprintln!("source {src_ip}: no reply");
    }

    // The same question from another client of the same cluster primes the cache.
    if let Some(sib) = sibling(data) {
        let mut out = vec![0xEE; 7];
        if fx.dns.handle_udp(&sib, SocketAddr::new(twin_ip, 40000), &mut out) {
            check_reply("handle_udp(sibling)", &sib, &out);
        }
    }

    // Asked twice: a miss that fills the cache (unless the sibling did), then a hit.
    let mut out = vec![0xEE; 600];
    for round in ["handle_udp(first)", "handle_udp(second)"] {
        let sent = fx.dns.handle_udp(data, src, &mut out);
        assert_eq!(sent, uncached.is_some(), "{round}: handle_udp and answer_bytes disagree on replying");
        if let Some(uncached) = &uncached {
            let msg = check_reply(round, data, &out);
            assert_same_answer(round, &out, &msg, uncached);
        }
    }
});
