//! The common cache miss without hickory: an A or AAAA question about an exported service (or
//! a name that is none, NXDOMAIN) from a plain UDP query, answered straight into the reply
//! buffer. The decision is the full path's own (`Answerer::decide`, `service_addresses`); only
//! the encoding is done here, and it must give the bytes hickory gives, name compression
//! included (the server tests and the fuzz target compare the two paths):
//!
//! ```text
//!  header      ID, QR AA (+ the request's RD and CD), RCODE; QD 1, AN n, NS 0|1, AR 0|1
//!  question    the request's bytes, as the client wrote them
//!  answers     owner: the first in full (lower-case), the others a pointer to it;
//!              A/IN TTL 4 (or AAAA 16)
//!  authority   (NXDOMAIN, NODATA) SOA/IN: owner the apex in full; mname "ns" and rname
//!              "hostmaster", each followed by a pointer to the apex
//!  additional  OPT (payload 1232, version 0, no options) when the request had one
//! ```
//!
//! hickory stores the question section as one compression candidate that includes the type
//! and class, so no later name is ever compressed against the question: the first owner
//! name is written in full, and that is what is reproduced here.
//!
//! Anything else — another type or class, a name that is not a service name, a headless
//! clusterset service, an unsynced snapshot, a reply that would not fit — returns `None` and
//! takes the full path.

use std::net::IpAddr;
use std::time::Instant;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use meridian_core::{ClientPlace, Snapshot};

use super::{Ask, Depends, EDNS_PAYLOAD, Rotations, Zone, exists_in};
use crate::answer::Answerer;
use crate::names::{self, Named};
use crate::wire::HotQuery;

/// Labels left of the apex that a service name can have (`<svc>.<ns>.svc`).
const MAX_RELATIVE_LABELS: usize = 4;
/// Above this many answers the full path decides (hickory stops compressing after 120 names).
const MAX_ANSWERS: usize = 100;
/// The most rotations a miss encodes at once (see [`Quick::variants`]).
pub(crate) const EAGER_ROTATIONS: usize = 4;
const CLASS_IN: u16 = 1;
const TYPE_SOA: u16 = 6;
const TYPE_OPT: u16 = 41;

/// Encoded replies, each with the rotation it is.
pub(crate) type Variants = Vec<(usize, Vec<u8>)>;

/// What the fast path answered, for the server to count and cache.
pub(crate) struct Quick {
    pub zone: usize,
    pub qtype: RecordType,
    pub rcode: ResponseCode,
    /// How many rotations the answer has.
    pub rotations: usize,
    /// Replies by rotation, decided once: with up to [`EAGER_ROTATIONS`] rotations, a name's
    /// first miss encodes every rotation (a 3-address name is then one miss, not three);
    /// beyond, only the asked one, so that a cached name with dozens of addresses does not
    /// hold dozens of copies of its reply that may never be asked for.
    pub variants: Variants,
    pub depends: Depends,
}

/// The answer before encoding.
enum Reply {
    Addresses {
        answer: Rotations,
        ttl: u32,
        depends: Depends,
    },
    Negative {
        rcode: ResponseCode,
        depends: Depends,
    },
}

impl Answerer {
    /// Answers `raw` (whose cache key is `hot`) in `rotation` (and in the others too when they
    /// are few) when the fast path covers it.
    pub(crate) fn respond_quick(
        &self,
        snap: &Snapshot,
        raw: &[u8],
        hot: &HotQuery,
        client: Option<ClientPlace>,
        rotation: usize,
        now: Instant,
    ) -> Option<Quick> {
        let qtype = match (hot.qclass(), hot.qtype()) {
            (CLASS_IN, 1) => RecordType::A,
            (CLASS_IN, 28) => RecordType::AAAA,
            _ => return None,
        };
        if !snap.synced {
            return None;
        }
        let (zi, zone, apex_at) = self.zone_of_wire(hot.name())?;
        let mut labels = [""; MAX_RELATIVE_LABELS];
        let n = relative_labels_of(&hot.name()[..apex_at], &mut labels)?;
        let target = names::parse(&labels[..n], zone.cfg.style, zone.cfg.namespace.as_deref());
        let ask = Ask {
            snap,
            zone,
            client,
            rotation: 0,
            now,
        };
        let reply = self.decide_quick(ask, target, qtype)?;
        let (rcode, rotations, variants, depends) = match reply {
            Reply::Addresses {
                answer,
                ttl,
                depends,
            } => {
                let rotations = answer.rotations.max(1);
                let wanted = if rotations <= EAGER_ROTATIONS {
                    0..rotations
                } else {
                    let r = rotation % rotations;
                    r..r + 1
                };
                let starts = answer.starts(wanted.end);
                let variants = wanted
                    .map(|r| {
                        let mut out = Vec::new();
                        let addrs = answer.from(starts[r]);
                        encode_addresses(raw, hot, addrs, ttl, qtype, &mut out)?;
                        Some((r, out))
                    })
                    .collect::<Option<Vec<_>>>()?;
                (ResponseCode::NoError, rotations, variants, depends)
            }
            Reply::Negative { rcode, depends } => {
                let mut out = Vec::new();
                self.encode_negative(raw, hot, snap, zone, rcode, &mut out)?;
                (rcode, 1, vec![(0, out)], depends)
            }
        };
        Some(Quick {
            zone: zi,
            qtype,
            rcode,
            rotations,
            variants,
            depends,
        })
    }

    /// The full path's decision for a service name (or a name that is no service's).
    fn decide_quick(&self, ask: Ask<'_>, target: Named<'_>, qtype: RecordType) -> Option<Reply> {
        let (ns, svc) = match target {
            Named::Service { ns, svc } => (ns, svc),
            Named::Unknown => {
                return Some(Reply::Negative {
                    rcode: ResponseCode::NXDomain,
                    depends: Depends::Names,
                });
            }
            _ => return None,
        };
        let Some(view) = ask.snap.service(ns, svc) else {
            return Some(Reply::Negative {
                rcode: ResponseCode::NXDomain,
                depends: Depends::Names,
            });
        };
        let depends = Depends::Service(view.stamp.clone());
        let sel = self.decide(ask.snap, view, ask.client, ask.now);
        if !exists_in(ask.zone, view, &sel) {
            return Some(Reply::Negative {
                rcode: ResponseCode::NXDomain,
                depends,
            });
        }
        let answer = self.service_answer(ask, view, &sel, qtype);
        if answer.weighted.addrs.is_empty() {
            return Some(Reply::Negative {
                rcode: ResponseCode::NoError,
                depends,
            });
        }
        Some(Reply::Addresses {
            answer,
            ttl: view.policy.ttl.unwrap_or(self.cfg.ttl),
            depends,
        })
    }

    /// The most specific zone holding a wire-format name, and where its apex starts in it.
    fn zone_of_wire(&self, name: &[u8]) -> Option<(usize, &Zone, usize)> {
        // The first label boundary at which some apex matches is the most specific zone.
        let mut at = 0;
        loop {
            if let Some((zi, zone)) = self
                .zones
                .iter()
                .enumerate()
                .find(|(_, z)| name[at..] == *z.apex_wire)
            {
                return Some((zi, zone, at));
            }
            let len = usize::from(*name.get(at)?);
            if len == 0 {
                return None;
            }
            at += 1 + len;
        }
    }

    /// NXDOMAIN or NODATA: the question and the zone's SOA in the authority section.
    fn encode_negative(
        &self,
        raw: &[u8],
        hot: &HotQuery,
        snap: &Snapshot,
        zone: &Zone,
        rcode: ResponseCode,
        out: &mut Vec<u8>,
    ) -> Option<()> {
        let apex = &zone.apex_wire;
        // SOA RDATA: "ns" + pointer, "hostmaster" + pointer, five 32-bit numbers.
        let rdata_len = (1 + 2 + 2) + (1 + 10 + 2) + 20;
        let size = 12 + (hot.name_end - 12 + 4) + apex.len() + 10 + rdata_len + opt_len(hot);
        if size > usize::from(hot.limit()) {
            return None;
        }
        reserve_exactly(out, size);
        header(raw, hot, rcode, [1, 0, 1, u16::from(hot.has_edns())], out);
        let apex_at = out.len();
        out.extend_from_slice(apex);
        push_u16(out, TYPE_SOA);
        push_u16(out, CLASS_IN);
        push_u32(out, self.cfg.ttl);
        push_u16(out, rdata_len as u16);
        let pointer = 0xC000 | apex_at as u16;
        for label in [&b"ns"[..], &b"hostmaster"[..]] {
            out.push(label.len() as u8);
            out.extend_from_slice(label);
            push_u16(out, pointer);
        }
        for n in [self.serial(snap), 60, 10, 3600, self.cfg.ttl] {
            push_u32(out, n);
        }
        push_opt(hot, out);
        debug_assert_eq!(out.len(), size);
        Some(())
    }
}

/// The labels of `relative` (a wire-format name without its apex) as text, leftmost first;
/// `None` when there are more than `labels` holds or one is not UTF-8.
fn relative_labels_of<'n>(relative: &'n [u8], labels: &mut [&'n str]) -> Option<usize> {
    let mut at = 0;
    let mut n = 0;
    while at < relative.len() {
        let len = usize::from(relative[at]);
        let slot = labels.get_mut(n)?;
        *slot = std::str::from_utf8(relative.get(at + 1..at + 1 + len)?).ok()?;
        n += 1;
        at += 1 + len;
    }
    Some(n)
}

/// An answer of addresses: the first owner name in full, the others pointing to it.
fn encode_addresses(
    raw: &[u8],
    hot: &HotQuery,
    (tail, head): (&[IpAddr], &[IpAddr]),
    ttl: u32,
    qtype: RecordType,
    out: &mut Vec<u8>,
) -> Option<()> {
    let n = tail.len() + head.len();
    if n > MAX_ANSWERS {
        return None;
    }
    let name = hot.name();
    let rdata = if qtype == RecordType::A { 4 } else { 16 };
    let size =
        12 + (hot.name_end - 12 + 4) + name.len() + (n - 1) * 2 + n * (10 + rdata) + opt_len(hot);
    if size > usize::from(hot.limit()) {
        return None;
    }
    reserve_exactly(out, size);
    let count = n as u16;
    header(
        raw,
        hot,
        ResponseCode::NoError,
        [1, count, 0, u16::from(hot.has_edns())],
        out,
    );
    let owner_at = out.len();
    for (i, ip) in tail.iter().chain(head).enumerate() {
        if i == 0 {
            out.extend_from_slice(name);
        } else {
            push_u16(out, 0xC000 | owner_at as u16);
        }
        push_u16(out, u16::from(qtype));
        push_u16(out, CLASS_IN);
        push_u32(out, ttl);
        match ip {
            IpAddr::V4(v4) => {
                push_u16(out, 4);
                out.extend_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                push_u16(out, 16);
                out.extend_from_slice(&v6.octets());
            }
        }
    }
    push_opt(hot, out);
    debug_assert_eq!(out.len(), size);
    Some(())
}

/// Room for exactly a reply of `size` bytes: no reallocation while it is encoded, and none
/// when the cache keeps it as a boxed slice.
fn reserve_exactly(out: &mut Vec<u8>, size: usize) {
    out.clear();
    out.reserve_exact(size);
}

/// The header and the question as the client sent it.
fn header(raw: &[u8], hot: &HotQuery, rcode: ResponseCode, counts: [u16; 4], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&raw[..2]);
    // QR, AA, and the request's RD; the request's CD; the RCODE (all fit in 4 bits here).
    out.push(0x84 | (raw[2] & 0x01));
    out.push((raw[3] & 0x10) | (u16::from(rcode) as u8 & 0x0F));
    for c in counts {
        push_u16(out, c);
    }
    out.extend_from_slice(&raw[12..hot.name_end + 4]);
}

fn opt_len(hot: &HotQuery) -> usize {
    if hot.has_edns() { 11 } else { 0 }
}

/// The OPT record of a reply to a request with EDNS: meridian's payload, version 0.
fn push_opt(hot: &HotQuery, out: &mut Vec<u8>) {
    if hot.has_edns() {
        out.push(0);
        push_u16(out, TYPE_OPT);
        push_u16(out, EDNS_PAYLOAD);
        push_u32(out, 0);
        push_u16(out, 0);
    }
}

fn push_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn push_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}
