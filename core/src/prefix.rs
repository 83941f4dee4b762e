//! Longest-prefix match of an address over a set of CIDRs, each naming a value: the one
//! structure behind both "which cluster is this DNS client in" (`dnsClientCIDRs`, `podCIDRs`)
//! and "where is this outside client" (the geo ranges, `crate::geo`).
//!
//! A hash map per (masked network, prefix length), and per family the lengths present,
//! longest first: a lookup costs one hash probe per distinct length, not one per range, so a
//! MaxMind-style export of hundreds of thousands of ranges (about 25 distinct IPv4 lengths)
//! costs the same per query as a handful of cluster CIDRs with as many lengths.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::IpAddr;

use ipnet::IpNet;

/// CIDRs to values; one CIDR given two different values is ambiguous (`None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixTable<T> {
    /// Prefix lengths present, longest first, per family (v4, v6).
    lengths: [Vec<u8>; 2],
    /// Masked network → its value, or `None` when two values were given for it.
    nets: HashMap<IpNet, Option<T>, BuildHasherDefault<NetHasher>>,
}

/// The table's hasher. Every DNS query probes the table (a hit too: the cache key holds the
/// client's place), and SipHash cost more than the rest of a lookup. The keys are the
/// configured CIDRs, not chosen by clients, and a lookup never inserts, so a fast
/// multiply-rotate hash (FxHash's) is enough.
#[derive(Default)]
struct NetHasher(u64);

impl NetHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for NetHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl<T> Default for PrefixTable<T> {
    fn default() -> Self {
        Self {
            lengths: [Vec::new(), Vec::new()],
            nets: HashMap::default(),
        }
    }
}

/// The longest prefix holding an address: its length and value (`None`: ambiguous there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Match<T> {
    pub len: u8,
    pub value: Option<T>,
}

/// What inserting a CIDR did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inserted {
    /// A CIDR the table did not hold.
    New,
    /// Already there with the same value (no change).
    Same,
    /// Already there with another value (or already ambiguous): now ambiguous.
    Ambiguous,
}

fn family(net: &IpNet) -> usize {
    usize::from(matches!(net, IpNet::V6(_)))
}

impl<T: Copy + PartialEq> PrefixTable<T> {
    /// Maps `net` (host bits ignored) to `value`.
    pub fn insert(&mut self, net: IpNet, value: T) -> Inserted {
        let net = net.trunc();
        let lengths = &mut self.lengths[family(&net)];
        if let Err(at) = lengths.binary_search_by(|l| net.prefix_len().cmp(l)) {
            lengths.insert(at, net.prefix_len());
        }
        match self.nets.get_mut(&net) {
            None => {
                self.nets.insert(net, Some(value));
                Inserted::New
            }
            Some(Some(v)) if *v == value => Inserted::Same,
            Some(held) => {
                *held = None;
                Inserted::Ambiguous
            }
        }
    }

    /// The longest prefix holding `ip`, if any.
    pub fn longest(&self, ip: IpAddr) -> Option<Match<T>> {
        self.longest_above(ip, None)
    }

    /// The longest prefix holding `ip` that is longer than `floor` (every length when none).
    pub fn longest_above(&self, ip: IpAddr, floor: Option<u8>) -> Option<Match<T>> {
        let family = usize::from(ip.is_ipv6());
        for &len in &self.lengths[family] {
            if floor.is_some_and(|f| len <= f) {
                break;
            }
            let Ok(net) = IpNet::new(ip, len) else {
                continue;
            };
            if let Some(found) = self.nets.get(&net.trunc()) {
                return Some(Match { len, value: *found });
            }
        }
        None
    }

    /// The value of the longest prefix holding `ip`; `None` also when it is ambiguous there.
    pub fn lookup(&self, ip: IpAddr) -> Option<T> {
        self.longest(ip).and_then(|m| m.value)
    }

    /// CIDRs held (ambiguous ones included).
    pub fn len(&self) -> usize {
        self.nets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_longest_prefix_answers_and_two_values_are_ambiguous() {
        let mut t = PrefixTable::default();
        assert_eq!(t.insert(net("10.0.0.0/8"), 1), Inserted::New);
        assert_eq!(t.insert(net("10.1.0.0/16"), 2), Inserted::New);
        assert_eq!(t.insert(net("10.1.0.0/16"), 2), Inserted::Same);
        assert_eq!(t.insert(net("10.2.9.9/16"), 3), Inserted::New);
        assert_eq!(t.insert(net("10.2.0.0/16"), 4), Inserted::Ambiguous);
        assert_eq!(t.lookup(ip("10.1.2.3")), Some(2));
        assert_eq!(t.lookup(ip("10.9.2.3")), Some(1));
        assert_eq!(
            t.longest(ip("10.2.0.1")),
            Some(Match {
                len: 16,
                value: None
            })
        );
        assert_eq!(t.longest_above(ip("10.1.2.3"), Some(16)), None);
        assert_eq!(
            t.longest_above(ip("10.1.2.3"), Some(8)).map(|m| m.len),
            Some(16)
        );
        assert_eq!(t.lookup(ip("fd00::1")), None);
        assert_eq!(t.lengths[0], vec![16, 8]);
        assert_eq!(t.len(), 3);
    }
}
