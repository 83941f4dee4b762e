//! Bytes in, bytes out: encoding responses exactly as hickory-server does (so both paths give
//! identical bytes), truncation, and the allocation-free parse of the hot path's cache key.

use hickory_proto::ProtoError;
use hickory_proto::op::{EmitAndCount, Header, Metadata, ResponseCode, emit_message_parts};
use hickory_proto::rr::Record;
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder, BinEncoder};
use hickory_server::zone_handler::{MessageRequest, Queries};

use meridian_core::ClientPlace;

use crate::answer::{EDNS_PAYLOAD, Response};

/// The question section as the client sent it (case preserved), emitted the way
/// hickory-server's `MessageResponse` emits it, so both paths produce the same bytes.
struct QuestionBytes<'q> {
    queries: &'q Queries,
}

impl EmitAndCount for QuestionBytes<'_> {
    fn emit(&mut self, encoder: &mut BinEncoder<'_>) -> Result<usize, ProtoError> {
        let start = encoder.offset();
        let bytes = self.queries.as_bytes();
        encoder.emit_vec(bytes)?;
        if !self.queries.is_empty() {
            encoder.store_label_pointer(start, start + bytes.len());
        }
        Ok(self.queries.len())
    }
}

/// The question section a response repeats: the request's, or none (see
/// `Response::echo_question`).
pub fn question_of<'q>(resp: &Response, queries: &'q Queries) -> &'q Queries {
    static NONE: std::sync::LazyLock<Queries> = std::sync::LazyLock::new(|| {
        Queries::read(&mut BinDecoder::new(&[]), 0).expect("zero questions always read")
    });
    if resp.echo_question { queries } else { &NONE }
}

/// The UDP size limit for a request: 512 without EDNS, else max(512, min(client, 1232)).
pub fn udp_limit(req: &MessageRequest) -> u16 {
    req.edns
        .as_ref()
        .map_or(512, |e| e.max_payload().clamp(512, EDNS_PAYLOAD))
}

/// Encodes a response; if it exceeds `limit`, sends the question (and OPT) alone with TC set,
/// so the client retries over TCP.
pub fn encode(resp: &Response, queries: &Queries, limit: u16) -> Vec<u8> {
    let queries = question_of(resp, queries);
    let full = emit(
        &resp.metadata,
        queries,
        &resp.answers,
        &resp.authorities,
        &resp.additionals,
        resp,
        false,
    );
    if full.len() <= usize::from(limit) {
        return full;
    }
    emit(&resp.metadata, queries, &[], &[], &[], resp, true)
}

/// A further message of a zone transfer: `chunk` as its answers, the request's question and
/// the first message's header and OPT (as hickory-server sent them).
pub fn encode_continuation(resp: &Response, queries: &Queries, chunk: &[Record]) -> Vec<u8> {
    emit(&resp.metadata, queries, chunk, &[], &[], resp, false)
}

fn emit(
    metadata: &Metadata,
    queries: &Queries,
    answers: &[Record],
    authorities: &[Record],
    additionals: &[Record],
    resp: &Response,
    truncated: bool,
) -> Vec<u8> {
    let mut metadata = *metadata;
    metadata.truncation |= truncated;
    let mut bytes = Vec::with_capacity(512);
    let mut encoder = BinEncoder::new(&mut bytes);
    let result = emit_message_parts(
        &metadata,
        &mut QuestionBytes { queries },
        &mut answers.iter(),
        &mut authorities.iter(),
        &mut additionals.iter(),
        resp.edns.as_ref(),
        None,
        &mut encoder,
    );
    // A record that did not fit 65,535 bytes is rolled back by moving the offset, not by
    // shortening the buffer: without this its first bytes would follow the records counted.
    let end = encoder.offset();
    match result {
        Ok(_) => {
            bytes.truncate(end);
            bytes
        }
        Err(_) => server_failure(metadata.id),
    }
}

/// SERVFAIL with no sections: what is left when a response cannot be encoded.
fn server_failure(id: u16) -> Vec<u8> {
    let mut metadata = Metadata::new(
        id,
        hickory_proto::op::MessageType::Response,
        hickory_proto::op::OpCode::Query,
    );
    metadata.response_code = ResponseCode::ServFail;
    header_only(metadata)
}

fn header_only(metadata: Metadata) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(12);
    let mut encoder = BinEncoder::new(&mut bytes);
    let header = Header {
        metadata,
        counts: Default::default(),
    };
    let _ = hickory_proto::serialize::binary::BinEncodable::emit(&header, &mut encoder);
    bytes
}

/// The reply to a request whose header parses but whose body does not: FORMERR with the
/// header echoed, as hickory-server answers it. `None` when not even the header parses, or
/// the message is itself a response (never answered, to avoid reflection loops).
pub fn format_error(raw: &[u8]) -> Option<Vec<u8>> {
    header_reply(raw, ResponseCode::FormErr)
}

/// REFUSED with the header echoed and no sections (a transfer past the concurrent bound);
/// `None` as for [`format_error`].
pub fn refused(raw: &[u8]) -> Option<Vec<u8>> {
    header_reply(raw, ResponseCode::Refused)
}

fn header_reply(raw: &[u8], rcode: ResponseCode) -> Option<Vec<u8>> {
    let mut decoder = BinDecoder::new(raw);
    let header = Header::read(&mut decoder).ok()?;
    if header.metadata.message_type == hickory_proto::op::MessageType::Response {
        return None;
    }
    let mut metadata = Metadata::response_from_request(&header.metadata);
    metadata.response_code = rcode;
    Some(header_only(metadata))
}

/// A cache key read straight from the request bytes: the lower-cased question plus everything
/// else the answer depends on. Building it allocates nothing.
#[derive(Clone)]
pub struct HotKey {
    len: u16,
    buf: [u8; HotKey::CAP],
}

impl HotKey {
    /// Question name (≤ 255) + type, class + flags + limit + client cluster.
    const CAP: usize = 255 + 4 + 1 + 2 + 4;

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
}

impl PartialEq for HotKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for HotKey {}

/// The client's place in a cache key: a cluster's index, a geo locality's index with the top
/// bit set, or all ones for an unknown client, so that an answer for one is never replayed
/// to another (their tiers differ). Geo clients of one locality share answers.
pub fn place_key(client: Option<ClientPlace>) -> u32 {
    const GEO: u32 = 1 << 31;
    match client {
        Some(ClientPlace::Cluster(c)) => (c as u32) & !GEO,
        // Never all ones (unknown), even for an absurd number of localities.
        Some(ClientPlace::Geo(g)) => GEO | (g as u32).min(GEO - 2),
        None => u32::MAX,
    }
}

/// A wire-format name shown as text (`payments.shop.global.`), for spans and logs; only
/// formatted when something records it.
pub struct WireName<'a>(pub &'a [u8]);

impl std::fmt::Display for WireName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut rest = self.0;
        while let Some((&len, tail)) = rest.split_first() {
            let Some(label) = tail.get(..usize::from(len)) else {
                break;
            };
            if len == 0 {
                break;
            }
            for &b in label {
                match b {
                    b'.' | b'\\' => write!(f, "\\{}", char::from(b))?,
                    0x21..=0x7e => write!(f, "{}", char::from(b))?,
                    _ => write!(f, "\\{b:03}")?,
                }
            }
            f.write_str(".")?;
            rest = &tail[usize::from(len)..];
        }
        if self.0.first() == Some(&0) {
            f.write_str(".")?;
        }
        Ok(())
    }
}

/// Whether `raw` asks for a zone transfer (AXFR or IXFR in its first question): those are
/// answered off the serving threads, a few at a time (see `tcp`). A message that does not
/// parse this far is not one.
pub fn asks_transfer(raw: &[u8]) -> bool {
    const IXFR: u16 = 251;
    const AXFR: u16 = 252;
    if raw.len() < 17 || u16::from_be_bytes([raw[4], raw[5]]) == 0 {
        return false;
    }
    let mut pos = 12;
    while let Some(&len) = raw.get(pos) {
        match len {
            0 => {
                return raw
                    .get(pos + 1..pos + 3)
                    .is_some_and(|t| matches!(u16::from_be_bytes([t[0], t[1]]), AXFR | IXFR));
            }
            // A compression pointer or a reserved label type: not a question name we read.
            64.. => return false,
            len => pos += 1 + usize::from(len),
        }
    }
    false
}

/// What the hot path learned from a request.
pub struct HotQuery {
    pub key: HotKey,
    /// End of the question name in the request (the name starts at 12).
    pub name_end: usize,
}

impl HotQuery {
    /// The question name in wire format, lower-case, with its root label.
    pub fn name(&self) -> &[u8] {
        &self.key.buf[..self.name_end - 12]
    }

    fn u16_at(&self, at: usize) -> u16 {
        u16::from_be_bytes([self.key.buf[at], self.key.buf[at + 1]])
    }

    pub fn qtype(&self) -> u16 {
        self.u16_at(self.name_end - 12)
    }

    pub fn qclass(&self) -> u16 {
        self.u16_at(self.name_end - 12 + 2)
    }

    /// The UDP size limit of the reply: the client's EDNS payload clamped to 512..=1232, or
    /// 512 without EDNS.
    pub fn limit(&self) -> u16 {
        match self.u16_at(self.name_end - 12 + 5) {
            0 => 512,
            limit => limit,
        }
    }

    /// Whether the request had an OPT record (the reply then carries one).
    pub fn has_edns(&self) -> bool {
        self.u16_at(self.name_end - 12 + 5) != 0
    }
}

/// Parses a plain query — one question, no compression, at most an OPT record without
/// EDNS Client Subnet — into a cache key. Anything else returns `None` and takes the full
/// path.
pub fn hot_query(raw: &[u8], client: Option<ClientPlace>) -> Option<HotQuery> {
    if raw.len() < 17 {
        return None;
    }
    let flags = raw[2];
    // QR=0 and OPCODE=QUERY.
    if flags & 0xF8 != 0 {
        return None;
    }
    let counts = |i: usize| u16::from_be_bytes([raw[i], raw[i + 1]]);
    if counts(4) != 1 || counts(6) != 0 || counts(8) != 0 || counts(10) > 1 {
        return None;
    }
    let mut key = HotKey {
        len: 0,
        buf: [0; HotKey::CAP],
    };
    let mut pos = 12;
    loop {
        let len = usize::from(*raw.get(pos)?);
        if len == 0 {
            pos += 1;
            break;
        }
        if len > 63 || pos + 1 + len > raw.len() || pos - 12 + 1 + len > 254 {
            return None;
        }
        key.buf[pos - 12] = len as u8;
        for i in 0..len {
            key.buf[pos - 12 + 1 + i] = raw[pos + 1 + i].to_ascii_lowercase();
        }
        pos += 1 + len;
    }
    let name_end = pos;
    // The root label's zero is already in the (zeroed) key.
    let mut k = name_end - 12;
    let question = raw.get(pos..pos + 4)?;
    key.buf[k..k + 4].copy_from_slice(question);
    k += 4;
    pos += 4;
    // RD and CD are copied into the response.
    key.buf[k] = (flags & 0x01) | (raw[3] & 0x10);
    k += 1;
    let limit: u16 = if counts(10) == 1 {
        let opt = raw.get(pos..pos + 11)?;
        // Root owner, type OPT, version 0.
        if opt[0] != 0 || opt[1..3] != [0, 41] || opt[6] != 0 {
            return None;
        }
        let payload = u16::from_be_bytes([opt[3], opt[4]]);
        let rdlen = usize::from(u16::from_be_bytes([opt[9], opt[10]]));
        pos += 11;
        let mut options = raw.get(pos..pos + rdlen)?;
        while options.len() >= 4 {
            let code = u16::from_be_bytes([options[0], options[1]]);
            let len = usize::from(u16::from_be_bytes([options[2], options[3]]));
            // ECS changes the answer and is echoed: full path.
            if code == 8 || options.len() < 4 + len {
                return None;
            }
            options = &options[4 + len..];
        }
        if !options.is_empty() {
            return None;
        }
        pos += rdlen;
        payload.clamp(512, EDNS_PAYLOAD)
    } else {
        // 0 marks "no EDNS": the response then carries no OPT.
        0
    };
    if pos != raw.len() {
        return None;
    }
    key.buf[k..k + 2].copy_from_slice(&limit.to_be_bytes());
    k += 2;
    key.buf[k..k + 4].copy_from_slice(&place_key(client).to_be_bytes());
    k += 4;
    key.len = k as u16;
    Some(HotQuery { key, name_end })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transfer_is_told_by_its_question_type() {
        use hickory_proto::op::{Message, MessageType, OpCode, Query};
        use hickory_proto::rr::{Name, RecordType};
        let ask = |qtype| {
            let mut m = Message::new(1, MessageType::Query, OpCode::Query);
            m.add_query(Query::query(Name::from_ascii("global.").unwrap(), qtype));
            m.to_vec().unwrap()
        };
        assert!(asks_transfer(&ask(RecordType::AXFR)));
        assert!(asks_transfer(&ask(RecordType::IXFR)));
        assert!(!asks_transfer(&ask(RecordType::A)));
        let axfr = ask(RecordType::AXFR);
        assert!(!asks_transfer(&axfr[..axfr.len() - 3]), "cut short");
        assert!(!asks_transfer(&[0u8; 12]));
    }

    #[test]
    fn an_answer_over_65535_bytes_drops_whole_records_and_counts_what_it_keeps() {
        use hickory_proto::op::{Message, MessageType, OpCode};
        use hickory_proto::rr::rdata::A;
        use hickory_proto::rr::{Name, RData};
        let name = Name::from_ascii("big.shop.global.").unwrap();
        // 5,000 A records of 16 bytes each (a compressed name) do not fit 65,535 bytes.
        let answers: Vec<Record> = (0..5_000u32)
            .map(|i| {
                Record::from_rdata(
                    name.clone(),
                    5,
                    RData::A(A::from(std::net::Ipv4Addr::from(i))),
                )
            })
            .collect();
        let resp = Response {
            metadata: Metadata::new(7, MessageType::Response, OpCode::Query),
            answers,
            authorities: Vec::new(),
            additionals: Vec::new(),
            edns: None,
            cacheable: false,
            rotations: 1,
            zone: None,
            continuation: Vec::new(),
            depends: crate::answer::Depends::Snapshot,
            echo_question: false,
        };
        let empty = Queries::read(&mut BinDecoder::new(&[]), 0).unwrap();
        let bytes = encode(&resp, &empty, u16::MAX);
        assert!(bytes.len() <= usize::from(u16::MAX), "{}", bytes.len());
        let mut decoder = BinDecoder::new(&bytes);
        let message = Message::read(&mut decoder).expect("a valid message");
        assert_eq!(decoder.len(), 0, "bytes after the records it counts");
        assert!(message.metadata.truncation, "what was dropped is said");
        let kept = message.answers.len();
        assert!(kept > 1_000 && kept < 5_000, "{kept}");
    }

    #[test]
    fn a_wire_name_reads_as_dotted_text_with_odd_bytes_escaped() {
        let show = |wire: &[u8]| WireName(wire).to_string();
        assert_eq!(
            show(b"\x08payments\x04shop\x06global\x00"),
            "payments.shop.global."
        );
        assert_eq!(show(b"\x00"), ".");
        assert_eq!(show(b"\x03a.b\x02\x01 \x00"), "a\\.b.\\001\\032.");
        // A label longer than what is left ends the text, never the process.
        assert_eq!(show(b"\x01a\x09short"), "a.");
    }

    fn query(name: &[u8], qtype: u16, opt: Option<&[u8]>) -> Vec<u8> {
        let mut q = vec![
            0x12,
            0x34,
            0x01,
            0x00,
            0,
            1,
            0,
            0,
            0,
            0,
            0,
            u8::from(opt.is_some()),
        ];
        q.extend_from_slice(name);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&[0, 1]);
        if let Some(opt) = opt {
            q.extend_from_slice(opt);
        }
        q
    }

    const NAME: &[u8] = b"\x08Payments\x04shop\x06global\x00";

    #[test]
    fn keys_ignore_case_and_id() {
        let a = hot_query(&query(NAME, 1, None), Some(ClientPlace::Cluster(1))).unwrap();
        let mut other = query(b"\x08payments\x04SHOP\x06global\x00", 1, None);
        other[0] = 0x99;
        let b = hot_query(&other, Some(ClientPlace::Cluster(1))).unwrap();
        assert!(a.key == b.key);
        assert_eq!(a.name_end, 12 + NAME.len());
    }

    #[test]
    fn keys_differ_by_type_cluster_and_edns() {
        let base = hot_query(&query(NAME, 1, None), Some(ClientPlace::Cluster(1)))
            .unwrap()
            .key;
        assert!(
            base != hot_query(&query(NAME, 28, None), Some(ClientPlace::Cluster(1)))
                .unwrap()
                .key
        );
        assert!(
            base != hot_query(&query(NAME, 1, None), Some(ClientPlace::Cluster(2)))
                .unwrap()
                .key
        );
        assert!(base != hot_query(&query(NAME, 1, None), None).unwrap().key);
        // A geo client's answers are its locality's: never a cluster's or an unknown
        // client's, and never another locality's.
        let geo = |g| {
            hot_query(&query(NAME, 1, None), Some(ClientPlace::Geo(g)))
                .unwrap()
                .key
        };
        assert!(base != geo(1));
        assert!(
            geo(0)
                != hot_query(&query(NAME, 1, None), Some(ClientPlace::Cluster(0)))
                    .unwrap()
                    .key
        );
        assert!(geo(0) != hot_query(&query(NAME, 1, None), None).unwrap().key);
        assert!(geo(0) != geo(1));
        assert!(geo(3) == geo(3));
        let opt = [0, 0, 41, 0x10, 0x00, 0, 0, 0, 0, 0, 0];
        assert!(
            base != hot_query(&query(NAME, 1, Some(&opt)), Some(ClientPlace::Cluster(1)))
                .unwrap()
                .key
        );
    }

    #[test]
    fn unusual_requests_take_the_full_path() {
        // EDNS Client Subnet.
        let ecs = [0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 8, 0, 8, 0, 4, 0, 1, 24, 0];
        assert!(hot_query(&query(NAME, 1, Some(&ecs)), None).is_none());
        // EDNS version 1.
        let v1 = [0, 0, 41, 0x10, 0, 0, 1, 0, 0, 0, 0];
        assert!(hot_query(&query(NAME, 1, Some(&v1)), None).is_none());
        // A compression pointer in the question.
        assert!(hot_query(&query(b"\xc0\x0c", 1, None), None).is_none());
        // Trailing garbage, a short packet, a response, an UPDATE.
        let mut trailing = query(NAME, 1, None);
        trailing.push(0);
        assert!(hot_query(&trailing, None).is_none());
        assert!(hot_query(&query(NAME, 1, None)[..20], None).is_none());
        let mut response = query(NAME, 1, None);
        response[2] |= 0x80;
        assert!(hot_query(&response, None).is_none());
        let mut update = query(NAME, 1, None);
        update[2] = 5 << 3;
        assert!(hot_query(&update, None).is_none());
    }

    #[test]
    fn a_name_of_the_maximal_length_fits_the_key() {
        let mut name = Vec::new();
        for (len, byte) in [(63, b'a'), (63, b'a'), (63, b'a'), (61, b'b')] {
            name.push(len);
            name.extend(std::iter::repeat_n(byte, usize::from(len)));
        }
        name.push(0);
        assert_eq!(name.len(), 255);
        let opt = [0, 0, 41, 0x10, 0x00, 0, 0, 0, 0, 0, 0];
        let q = hot_query(&query(&name, 1, Some(&opt)), Some(ClientPlace::Cluster(7))).unwrap();
        assert_eq!(q.name_end, 12 + 255);
        assert_eq!(q.key.as_bytes().len(), HotKey::CAP);
        // One byte more is not a name.
        let mut long = name.clone();
        long.insert(0, b'x');
        long[1] = 0;
        long.insert(0, 1);
        assert!(hot_query(&query(&long, 1, None), None).is_none());
    }

    #[test]
    fn cookies_do_not_prevent_caching() {
        let cookie = [
            0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 12, 0, 10, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8,
        ];
        let q = hot_query(&query(NAME, 1, Some(&cookie)), None).unwrap();
        let plain = [0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 0];
        assert!(q.key == hot_query(&query(NAME, 1, Some(&plain)), None).unwrap().key);
    }
}
