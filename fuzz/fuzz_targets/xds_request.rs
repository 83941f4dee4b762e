//! DiscoveryRequest bytes in, through the per-stream state machines of `meridian_xds::stream`
//! (SotW and delta), interleaved with new views of the fleet.
//!
//! Input: the first byte picks the protocol (even: SotW, odd: delta). Then a sequence of
//! operations, each one byte: below 0x20 a new view (one of three, the first unsynced);
//! otherwise a request whose length is the next two bytes (big-endian) and whose bytes follow,
//! decoded with prost (undecodable ones are skipped, as tonic would end the stream).
//!
//! Checked after every step: no panic; a stream error only for a first request without a
//! node (and the stream then ends); every response is for a type meridian serves, with a nonce
//! larger than any before; nothing is sent before a synced view; the stream's status stays
//! serialisable and bounded (unsupported types remembered at most 16).

#![no_main]

use std::sync::{Arc, LazyLock};
use std::time::Instant;

use libfuzzer_sys::fuzz_target;
use meridian_xds::resources::{Kind, Resources};
use meridian_xds::stream::{DeltaStream, SotwStream, StreamError};
use prost::Message;
use xds_api::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};

static VIEWS: LazyLock<[Arc<Resources>; 3]> = LazyLock::new(|| {
    use Kind::{Cluster as C, Endpoint as E, Listener as L, Route as R};
    [
        Arc::new(Resources::unsynced()),
        Arc::new(Resources::for_tests(
            1,
            &[(C, "a", "ca1"), (C, "b", "cb1"), (E, "a", "ea1"), (E, "b", "eb1"), (L, "a", "la1"), (R, "a", "ra1")],
        )),
        Arc::new(Resources::for_tests(
            2,
            &[(C, "a", "ca2"), (C, "c", "cc1"), (E, "a", "ea2"), (E, "c", "ec1"), (L, "b", "lb1"), (R, "a", "ra2")],
        )),
    ]
});

/// Checks shared by both protocols.
struct Checker {
    last_nonce: u64,
    synced: bool,
    node_seen: bool,
}

impl Checker {
    fn responses<'a>(&mut self, responses: impl Iterator<Item = (&'a str, &'a str)>) {
        for (type_url, nonce) in responses {
            assert!(self.synced, "a response before the first synced view");
            assert!(Kind::from_type_url(type_url).is_some(), "a response for {type_url:?}");
            let nonce: u64 = nonce.parse().expect("nonces are numbers");
            assert!(nonce > self.last_nonce, "nonce {nonce} after {}", self.last_nonce);
            self.last_nonce = nonce;
        }
    }

    fn error(&self, e: &StreamError, had_node: bool) {
        assert_eq!(*e, StreamError::MissingNode);
        assert!(!self.node_seen && !had_node, "MissingNode after a node");
    }
}

fn ops(data: &[u8], mut each: impl FnMut(Option<&[u8]>, usize) -> bool) {
    let mut rest = data;
    while let Some((&op, tail)) = rest.split_first() {
        rest = tail;
        if op < 0x20 {
            if !each(None, op as usize % 3) {
                return;
            }
            continue;
        }
        if rest.len() < 2 {
            return;
        }
        let len = (usize::from(rest[0]) << 8 | usize::from(rest[1])).min(rest.len() - 2);
        let (body, tail) = rest[2..].split_at(len);
        rest = tail;
        if !each(Some(body), 0) {
            return;
        }
    }
}

/// Drives one stream state machine (SotW or delta: the same calls, other request types)
/// through the ops `data` spells, checking every step.
macro_rules! drive {
    ($stream:expr, $request:ty, $data:expr) => {{
        let mut stream = $stream;
        let mut check = Checker { last_nonce: 0, synced: false, node_seen: false };
        let now = Instant::now();
        ops($data, |req, view| {
            match req {
                None => {
                    let v = VIEWS[view].clone();
                    check.synced |= v.synced;
                    let step = stream.on_view(v, now);
                    check.responses(step.responses.iter().map(|r| (r.type_url.as_str(), r.nonce.as_str())));
                }
                Some(bytes) => {
                    let Ok(req) = <$request>::decode(bytes) else { return true };
                    match stream.on_request(&req, now) {
                        Ok(step) => {
                            check.node_seen = true;
                            check.responses(step.responses.iter().map(|r| (r.type_url.as_str(), r.nonce.as_str())))
                        }
                        Err(e) => {
                            check.error(&e, req.node.is_some());
                            return false;
                        }
                    }
                }
            }
            let status = stream.status();
            assert!(status.unsupported.len() <= 16);
            serde_json::to_string(&status).expect("status serialises");
            true
        });
    }};
}

fn sotw(data: &[u8]) {
    drive!(SotwStream::new(), DiscoveryRequest, data)
}

fn delta(data: &[u8]) {
    drive!(DeltaStream::new(), DeltaDiscoveryRequest, data)
}

fuzz_target!(|data: &[u8]| {
    let Some((&protocol, rest)) = data.split_first() else { return };
    if protocol % 2 == 0 {
        sotw(rest);
    } else {
        delta(rest);
    }
});
