//! The composite resourceVersion's compact form, `mrv2.`: a few bytes a member, and
//! updated a member at a time as a watch's events come.
//!
//! ```text
//!  mrv2. <fingerprint: 11 chars> <n: vlq> <piece of roster[0]> … <piece of roster[n-1]>
//!        <extras: vlq> (<name length: vlq> <name: base64> <piece>)…
//!
//!  piece:  absent           vlq(0)
//!          decimal rv r     vlq(2r + 2)          (an etcd revision: 3–7 chars)
//!          any other rv s   vlq(2·len(s) + 1) base64(s)
//! ```
//!
//! - **Positional, not named.** A member is its place in the [`Roster`], every registered
//!   member in name order; the token carries the roster's fingerprint (SHA-256 of the names,
//!   8 bytes), not the names. Places cannot collide the way short name hashes would; the
//!   fingerprint is what must not, and at 64 bits against a handful of rosters held it does
//!   not in practice. The gateway holds its last [`ROSTERS_KEPT`] rosters, so a token issued
//!   before a member joined or left still decodes to names and keeps `mrv1.`'s meaning (a
//!   member it does not name is listed from now, one it names that left is not asked). A
//!   token against a roster no longer held names members the gateway cannot tell: it is
//!   [`VersionError::Expired`], a 410, and the client lists again — never members guessed.
//!   The fingerprint depends only on the names, so another replica or a restarted gateway
//!   with the same members reads the token.
//! - **Base64 digits, not base64 of bytes.** Each number is a VLQ of base64url digits, five
//!   bits a digit (as source maps do): a member's piece is text of its own, so a watch event
//!   replaces one piece ([`Live::set`]) instead of encoding every member again, where bytes
//!   base64-encoded as one run would shift every digit after a piece that changed length.
//!   Five bits a digit costs about what 7-bit varints in base64 would (5.25 bits a digit).
//! - **Members the roster lacks** (a race: the snapshot changed between the roster and the
//!   members asked) are carried by name after the pieces, so a token always says exactly the
//!   composite it was made from.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use parking_lot::Mutex;

use super::Composite;

/// What a compact composite starts with.
pub(crate) const PREFIX: &str = "mrv2.";
/// Rosters held to read tokens issued before the members changed: a few changes back is
/// what a watch ending on a change and resuming needs.
pub const ROSTERS_KEPT: usize = 8;
/// Members a [`Live`] block holds: a change re-joins one block's pieces and the blocks, not
/// every member's piece.
const BLOCK: usize = 64;
/// Characters of the fingerprint (8 bytes, base64 unpadded).
const FINGERPRINT_CHARS: usize = 11;
/// The base64url alphabet, each digit's value its index.
const DIGITS: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Why a `resourceVersion` cannot be read as a composite.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    #[error("{0:?} is not a resourceVersion this gateway issued")]
    Bad(String),
    /// Issued against members the gateway no longer holds the list of: which member each
    /// version was is unknown, so none is used (the client lists again).
    #[error(
        "resourceVersion {0:?} was issued for members this gateway no longer knows: list again"
    )]
    Expired(String),
}

impl VersionError {
    pub(crate) fn bad(token: &str) -> Self {
        Self::Bad(token.chars().take(64).collect())
    }

    fn expired(token: &str) -> Self {
        Self::Expired(token.chars().take(64).collect())
    }
}

/// Every registered member in name order: what an `mrv2.` token's places are places in.
#[derive(Debug, PartialEq, Eq)]
pub struct Roster {
    names: Vec<String>,
    /// A member's place, for [`Live::set`] on every event.
    places: HashMap<String, usize>,
    /// The names' fingerprint as the token carries it.
    fingerprint: String,
}

impl Roster {
    pub fn new(mut names: Vec<String>) -> Self {
        names.sort();
        names.dedup();
        let mut sha = ring::digest::Context::new(&ring::digest::SHA256);
        for name in &names {
            // Length-prefixed, so ["ab", "c"] and ["a", "bc"] differ.
            sha.update(&(name.len() as u64).to_be_bytes());
            sha.update(name.as_bytes());
        }
        let fingerprint = URL_SAFE_NO_PAD.encode(&sha.finish().as_ref()[..8]);
        let places = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        Self {
            names,
            places,
            fingerprint,
        }
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }
}

/// The last rosters, newest first: the one a token is made against, and the ones a token
/// may have been made against.
#[derive(Default)]
pub struct Rosters {
    held: Mutex<VecDeque<Arc<Roster>>>,
}

impl Rosters {
    /// The roster of `names` (sorted): the newest held when it is the same, else a new one
    /// held from now on.
    pub fn current(&self, names: &[&str]) -> Arc<Roster> {
        let mut held = self.held.lock();
        if let Some(newest) = held.front()
            && newest.names.len() == names.len()
            && newest.names.iter().zip(names).all(|(a, b)| a == b)
        {
            return newest.clone();
        }
        let roster = Arc::new(Roster::new(names.iter().map(|n| n.to_string()).collect()));
        // The same names as an older roster (a member left and came back): one copy, newest.
        held.retain(|r| r.fingerprint != roster.fingerprint);
        held.push_front(roster.clone());
        held.truncate(ROSTERS_KEPT);
        roster
    }

    fn find(&self, fingerprint: &str) -> Option<Arc<Roster>> {
        self.held
            .lock()
            .iter()
            .find(|r| r.fingerprint == fingerprint)
            .cloned()
    }
}

/// `composite` as an `mrv2.` token against `roster`.
pub(crate) fn encode(composite: &Composite, roster: &Roster) -> String {
    let mut out = String::with_capacity(PREFIX.len() + FINGERPRINT_CHARS + 6 * roster.names.len());
    out.push_str(PREFIX);
    out.push_str(&roster.fingerprint);
    vlq(&mut out, roster.names.len() as u64);
    for name in &roster.names {
        piece(&mut out, composite.0.get(name).map(String::as_str));
    }
    extras(&mut out, composite, roster);
    out
}

/// The members of `composite` the roster lacks, by name (usually none: one digit).
fn extras(out: &mut String, composite: &Composite, roster: &Roster) {
    let extra: Vec<_> = composite
        .0
        .iter()
        .filter(|(n, _)| !roster.places.contains_key(*n))
        .collect();
    vlq(out, extra.len() as u64);
    for (name, rv) in extra {
        vlq(out, name.len() as u64);
        URL_SAFE_NO_PAD.encode_string(name, out);
        piece(out, Some(rv));
    }
}

/// Reads an `mrv2.` token against the roster its fingerprint names.
pub(crate) fn decode(token: &str, rosters: &Rosters) -> Result<Composite, VersionError> {
    let bad = || VersionError::bad(token);
    let body = token.strip_prefix(PREFIX).ok_or_else(bad)?;
    let fingerprint = body.get(..FINGERPRINT_CHARS).ok_or_else(bad)?;
    let mut r = Reader(&body.as_bytes()[FINGERPRINT_CHARS..]);
    let count = r.vlq().ok_or_else(bad)?;
    let roster = rosters
        .find(fingerprint)
        .filter(|roster| roster.names.len() as u64 == count)
        .ok_or_else(|| VersionError::expired(token))?;
    let mut composite = Composite::default();
    for name in &roster.names {
        if let Some(rv) = r.piece().ok_or_else(bad)? {
            composite.0.insert(name.clone(), rv);
        }
    }
    for _ in 0..r.vlq().ok_or_else(bad)? {
        let name = r.text().ok_or_else(bad)?;
        let rv = r.piece().ok_or_else(bad)?.ok_or_else(bad)?;
        composite.0.insert(name, rv);
    }
    if !r.0.is_empty() {
        return Err(bad());
    }
    Ok(composite)
}

/// `n` as base64 digits of five bits, least significant first, the sixth bit saying
/// another digit follows.
fn vlq(out: &mut String, mut n: u64) {
    loop {
        let digit = (n & 0x1f) as usize;
        n >>= 5;
        if n == 0 {
            out.push(DIGITS[digit] as char);
            return;
        }
        out.push(DIGITS[digit | 0x20] as char);
    }
}

/// One member's version (see the module's table).
fn piece(out: &mut String, rv: Option<&str>) {
    match rv {
        None => vlq(out, 0),
        Some(rv) => match revision(rv) {
            Some(n) => vlq(out, 2 * n + 2),
            None => {
                vlq(out, 2 * rv.len() as u64 + 1);
                URL_SAFE_NO_PAD.encode_string(rv, out);
            }
        },
    }
}

/// `rv` as the number it writes, when writing that number gives `rv` back (no sign, no
/// leading zero) and it leaves room for the piece's tag.
fn revision(rv: &str) -> Option<u64> {
    if rv.is_empty()
        || !rv.bytes().all(|b| b.is_ascii_digit())
        || (rv.len() > 1 && rv.starts_with('0'))
    {
        return None;
    }
    rv.parse::<u64>().ok().filter(|n| *n < u64::MAX / 2 - 1)
}

/// A base64url digit's value.
fn digit(c: u8) -> Option<u64> {
    let v = match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'-' => 62,
        b'_' => 63,
        _ => return None,
    };
    Some(u64::from(v))
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn vlq(&mut self) -> Option<u64> {
        let mut n = 0u64;
        for shift in (0..64).step_by(5) {
            let (&c, rest) = self.0.split_first()?;
            self.0 = rest;
            let digit = digit(c)?;
            let value = (digit & 0x1f).checked_shl(shift)?;
            if value >> shift != digit & 0x1f {
                return None;
            }
            n |= value;
            if digit & 0x20 == 0 {
                return Some(n);
            }
        }
        None
    }

    /// A base64 text of the length a VLQ before it gives.
    fn text(&mut self) -> Option<String> {
        let len = usize::try_from(self.vlq()?).ok()?;
        self.base64(len)
    }

    fn base64(&mut self, len: usize) -> Option<String> {
        let chars = len.checked_mul(4)?.div_ceil(3);
        let digits = self.0.get(..chars)?;
        self.0 = &self.0[chars..];
        let bytes = URL_SAFE_NO_PAD.decode(digits).ok()?;
        (bytes.len() == len).then_some(())?;
        String::from_utf8(bytes).ok()
    }

    /// A member's version: Some(None) when absent, None when the text is not a piece.
    fn piece(&mut self) -> Option<Option<String>> {
        let v = self.vlq()?;
        if v == 0 {
            return Some(None);
        }
        if v % 2 == 0 {
            return Some(Some((v / 2 - 1).to_string()));
        }
        let len = usize::try_from(v / 2).ok()?;
        self.base64(len).map(Some)
    }
}

/// A composite kept encoded as it changes (a watch's): an event's [`Live::set`] rewrites one
/// member's piece in its block, and [`Live::token`] joins the blocks — work a watch event
/// does in proportion to a block and the token's length (which the event carries anyway),
/// not in proportion to encoding every member again.
pub struct Live {
    composite: Composite,
    roster: Arc<Roster>,
    /// The pieces of BLOCK members at a time, and each piece's length.
    blocks: Vec<(String, Vec<usize>)>,
    /// Members the composite has that the roster lacks (rare: see the module's doc).
    extra: usize,
    /// The token as it stands; None when a set changed it since.
    token: Option<String>,
}

impl Live {
    pub fn new(composite: Composite, roster: Arc<Roster>) -> Self {
        let blocks = roster
            .names
            .chunks(BLOCK)
            .map(|names| {
                let mut text = String::new();
                let mut lens = Vec::with_capacity(names.len());
                for name in names {
                    let before = text.len();
                    piece(&mut text, composite.0.get(name).map(String::as_str));
                    lens.push(text.len() - before);
                }
                (text, lens)
            })
            .collect();
        let extra = composite
            .0
            .keys()
            .filter(|n| !roster.places.contains_key(*n))
            .count();
        Self {
            composite,
            roster,
            blocks,
            extra,
            token: None,
        }
    }

    pub fn composite(&self) -> &Composite {
        &self.composite
    }

    pub fn set(&mut self, cluster: &str, rv: &str) {
        if self.composite.0.get(cluster).map(String::as_str) == Some(rv) {
            return;
        }
        let new = self
            .composite
            .0
            .insert(cluster.to_string(), rv.to_string())
            .is_none();
        self.token = None;
        let Some(&place) = self.roster.places.get(cluster) else {
            self.extra += usize::from(new);
            return;
        };
        let (text, lens) = &mut self.blocks[place / BLOCK];
        let i = place % BLOCK;
        let start: usize = lens[..i].iter().sum();
        let mut replaced = String::new();
        piece(&mut replaced, Some(rv));
        text.replace_range(start..start + lens[i], &replaced);
        lens[i] = replaced.len();
    }

    /// The token as it stands.
    pub fn token(&mut self) -> &str {
        let Self {
            composite,
            roster,
            blocks,
            extra,
            token,
        } = self;
        token.get_or_insert_with(|| {
            let len: usize = blocks.iter().map(|(t, _)| t.len()).sum();
            let mut out = String::with_capacity(PREFIX.len() + FINGERPRINT_CHARS + len + 16);
            out.push_str(PREFIX);
            out.push_str(&roster.fingerprint);
            vlq(&mut out, roster.names.len() as u64);
            for (text, _) in blocks.iter() {
                out.push_str(text);
            }
            if *extra == 0 {
                vlq(&mut out, 0);
            } else {
                extras(&mut out, composite, roster);
            }
            out
        })
    }
}

#[cfg(test)]
mod tests;
