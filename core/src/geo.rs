//! Geography for DNS clients outside the fleet: CIDR ranges mapped to a locality (region,
//! zone), so a query whose source or EDNS Client Subnet sits in such a range is answered as
//! for a client *in that region* — Locality tiers start at that region's clusters — though it
//! is in no cluster.
//!
//! ```text
//!  config geo.ranges + geo.file (controllers/src/geo.rs parses, reports bad lines)
//!      └─► GeoBuilder::add(net, locality, origin) … finish() ─► (GeoTable, conflicts)
//!              Event::Geo { table: Arc<GeoTable>, problems } ─► Fleet ─► every Snapshot
//!              (the same Arc: built once per change of the ranges, never per snapshot)
//!  DNS: Snapshot::locate(ip) = locate(cluster CIDRs, geo table, ip) ─► ClientPlace
//!       ─► select::Client::at(snapshot, place) ─► select_for
//! ```
//!
//! The resolution rule ([`locate`]): the longest matching prefix across the cluster CIDRs
//! and the geo ranges wins; at equal length a cluster's CIDR wins over a geo range; a tie
//! between clusters (an unknown client without geo) falls back to the longest geo range
//! holding the address, else the client is unknown.

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::Locality;
use crate::prefix::{Inserted, PrefixTable};

/// Where a DNS client is: in a cluster, or (outside the fleet) in a geo locality.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClientPlace {
    /// Index into `Snapshot::clusters`.
    Cluster(usize),
    /// Index into the snapshot's [`GeoTable::localities`].
    Geo(usize),
}

impl ClientPlace {
    pub fn cluster(self) -> Option<usize> {
        match self {
            ClientPlace::Cluster(c) => Some(c),
            ClientPlace::Geo(_) => None,
        }
    }
}

/// Geo ranges to localities by longest prefix. Shared between snapshots through an `Arc`:
/// an export can hold hundreds of thousands of ranges, so it is built once per change of
/// the ranges and never copied.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct GeoTable {
    /// Each distinct locality once: ranges hold an index, and so does the DNS cache key
    /// (two ranges of one locality get the same answers).
    localities: Vec<Locality>,
    nets: PrefixTable<u32>,
}

/// A summary: the table can hold hundreds of thousands of ranges, and a snapshot's or the
/// fleet's `Debug` must stay readable.
impl std::fmt::Debug for GeoTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeoTable")
            .field("ranges", &self.nets.len())
            .field("localities", &self.localities)
            .finish()
    }
}

impl GeoTable {
    pub fn localities(&self) -> &[Locality] {
        &self.localities
    }

    pub fn locality(&self, index: usize) -> Option<&Locality> {
        self.localities.get(index)
    }

    /// Ranges served (CIDRs given two localities are not among them).
    pub fn len(&self) -> usize {
        self.nets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    /// The locality index of the longest range holding `ip`, with that range's length.
    fn longest_above(&self, ip: IpAddr, floor: Option<u8>) -> Option<(u8, usize)> {
        let m = self.nets.longest_above(ip, floor)?;
        Some((m.len, m.value? as usize))
    }

    /// The locality of the longest range holding `ip`.
    pub fn lookup(&self, ip: IpAddr) -> Option<&Locality> {
        let (_, i) = self.longest_above(ip, None)?;
        self.localities.get(i)
    }
}

/// One CIDR given two (or more) different localities: it is not served at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeoConflict {
    pub net: IpNet,
    /// Every range that gave it, as `(origin, locality)` in the order they were added (the
    /// origin is the caller's: a config index, a file line).
    pub ranges: Vec<(usize, Locality)>,
}

/// Collects ranges, then builds the table once.
#[derive(Debug, Default)]
pub struct GeoBuilder {
    localities: Vec<Locality>,
    ids: HashMap<Locality, u32>,
    /// Masked network → the first range's (locality, origin), and every range after it that
    /// disagreed (then the CIDR is a conflict).
    ranges: HashMap<IpNet, Given>,
}

#[derive(Debug)]
struct Given {
    locality: u32,
    origin: usize,
    others: Vec<(usize, u32)>,
}

impl GeoBuilder {
    /// Adds a range (host bits ignored); `origin` names it in conflicts.
    pub fn add(&mut self, net: IpNet, locality: &Locality, origin: usize) {
        let id = match self.ids.get(locality) {
            Some(id) => *id,
            None => {
                let id = self.localities.len() as u32;
                self.localities.push(locality.clone());
                self.ids.insert(locality.clone(), id);
                id
            }
        };
        match self.ranges.entry(net.trunc()) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(Given {
                    locality: id,
                    origin,
                    others: Vec::new(),
                });
            }
            std::collections::hash_map::Entry::Occupied(mut o) => {
                let given = o.get_mut();
                if given.locality != id || !given.others.is_empty() {
                    given.others.push((origin, id));
                }
            }
        }
    }

    /// The table, and the CIDRs left out for naming two localities (ordered by their first
    /// range's origin).
    pub fn finish(self) -> (GeoTable, Vec<GeoConflict>) {
        let mut table = GeoTable {
            localities: self.localities,
            nets: PrefixTable::default(),
        };
        let mut conflicts = Vec::new();
        for (net, given) in self.ranges {
            if given.others.is_empty() {
                let inserted = table.nets.insert(net, given.locality);
                debug_assert_eq!(inserted, Inserted::New);
                continue;
            }
            let locality = |id: u32| table.localities[id as usize].clone();
            let mut ranges = vec![(given.origin, locality(given.locality))];
            ranges.extend(given.others.iter().map(|(o, l)| (*o, locality(*l))));
            conflicts.push(GeoConflict { net, ranges });
        }
        conflicts.sort_by_key(|c| c.ranges[0].0);
        (table, conflicts)
    }
}

/// Where `ip` is: the longest matching prefix across the cluster CIDRs (`clusters`, where
/// `None` marks a tie between clusters) and the geo ranges wins; at equal length the cluster
/// wins; a tie between clusters falls back to the longest geo range holding `ip`; else
/// unknown (`None`).
pub fn locate(clusters: &PrefixTable<usize>, geo: &GeoTable, ip: IpAddr) -> Option<ClientPlace> {
    let place = match clusters.longest(ip) {
        Some(m) => match m.value {
            // Only a strictly longer geo range beats a cluster: look no shorter than it.
            Some(cluster) => match geo.longest_above(ip, Some(m.len)) {
                Some((_, locality)) => ClientPlace::Geo(locality),
                None => ClientPlace::Cluster(cluster),
            },
            None => ClientPlace::Geo(geo.longest_above(ip, None)?.1),
        },
        None => ClientPlace::Geo(geo.longest_above(ip, None)?.1),
    };
    Some(place)
}

#[cfg(test)]
mod tests;
