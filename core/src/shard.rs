//! Sharded writers and quorum health: which live replica writes which member,
//! when a member may change hands, and whether a member's unreachability is confirmed by a
//! majority of the replicas.
//!
//! ```text
//!  replicas' shard Leases ─► Peers::observe (renewals timed on our own clock)
//!                              └─► Peers::live(now) ─► owner(member, live): rendezvous hashing
//!  a member's writer annotation, owner, held? ─► step ─► Keep | Take | Release | Wait
//!  every live replica's report (members it sees Unreachable) ─► confirm ─► Confirmation
//! ```
//!
//! Ownership is a claim written on the member's hub object with compare-and-swap; a replica
//! takes a member only when it is the member's rendezvous owner among the replicas it sees
//! alive *and* the claim is free, its own, or held by a replica whose Lease went unrenewed for
//! a whole lease duration on our clock. A replica that loses its own Lease (a freeze, a cut
//! to the hub) forgets what it held and must win each claim again, so two replicas never
//! write one member at once. Pure and synchronous: every clock is passed in.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde::Serialize;

/// A stable 64-bit score of a (member, replica) pair: the same on every replica and every
/// build (replicas of different versions may run side by side during an upgrade), so
/// `std`'s randomly keyed hashers will not do. FNV-1a, then a finalizer that spreads it.
pub fn score(member: &str, replica: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in member.bytes().chain([0xff]).chain(replica.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // splitmix64's finalizer: FNV's low bits alone cluster for similar names.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The replica that should write `member`: the highest score, ties broken by name. Adding a
/// replica moves only the members it now scores highest for (about 1/N of them); removing one
/// moves only its own.
pub fn owner<'a>(member: &str, replicas: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    replicas
        .into_iter()
        .max_by_key(|r| (score(member, r), std::cmp::Reverse(*r)))
}

/// What one replica publishes beside its Lease renewal: the members it cannot reach.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    pub unreachable: BTreeSet<String>,
}

/// What this replica saw of another's Lease, timed on this replica's clock.
#[derive(Clone, Debug)]
struct Seen {
    /// The Lease's renewTime as written (compared, never read as a time: clocks differ).
    renewal: String,
    /// When `renewal` was first seen with this value.
    at: Instant,
    report: Report,
}

/// The other replicas, as their shard Leases show them.
#[derive(Clone, Debug, Default)]
pub struct Peers {
    seen: BTreeMap<String, Seen>,
}

impl Peers {
    /// A read of `replica`'s Lease: a renewal we had not seen restarts its clock.
    pub fn observe(&mut self, replica: &str, renewal: &str, report: Report, now: Instant) {
        match self.seen.get_mut(replica) {
            Some(s) if s.renewal == renewal => s.report = report,
            _ => {
                self.seen.insert(
                    replica.to_string(),
                    Seen {
                        renewal: renewal.to_string(),
                        at: now,
                        report,
                    },
                );
            }
        }
    }

    /// Leases that are gone (deleted or released) are forgotten: those replicas left.
    pub fn retain(&mut self, present: &BTreeSet<String>) {
        self.seen.retain(|name, _| present.contains(name));
    }

    /// Whether `replica` renewed within `lease_duration` of `now`, as we saw it.
    pub fn is_live(&self, replica: &str, now: Instant, lease_duration: Duration) -> bool {
        self.seen
            .get(replica)
            .is_some_and(|s| now.saturating_duration_since(s.at) < lease_duration)
    }

    /// How long `replica`'s Lease has gone unrenewed, as we saw it (None: never seen).
    pub fn silent_for(&self, replica: &str, now: Instant) -> Option<Duration> {
        self.seen
            .get(replica)
            .map(|s| now.saturating_duration_since(s.at))
    }

    /// The live replicas besides `me`, and `me`, sorted.
    pub fn live<'a>(&'a self, me: &'a str, now: Instant, lease_duration: Duration) -> Vec<&'a str> {
        let mut live: Vec<&str> = self
            .seen
            .keys()
            .map(String::as_str)
            .filter(|r| *r != me && self.is_live(r, now, lease_duration))
            .chain([me])
            .collect();
        live.sort_unstable();
        live
    }

    /// The reports of the live replicas besides `me`.
    pub fn reports<'a>(
        &'a self,
        me: &'a str,
        now: Instant,
        lease_duration: Duration,
    ) -> impl Iterator<Item = (&'a str, &'a Report)> + 'a {
        self.seen
            .iter()
            .filter(move |(r, _)| r.as_str() != me && self.is_live(r, now, lease_duration))
            .map(|(r, s)| (r.as_str(), &s.report))
    }
}

/// What a replica does about one member in a round.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "step", rename_all = "camelCase")]
pub enum Step {
    /// Ours, and held since our Lease was last renewed: keep writing.
    Keep,
    /// Ours to take: write the claim (compare-and-swap on what was read), then write.
    Take,
    /// Ours, but another live replica should have it now: stop writing, then clear the claim.
    Release,
    /// Not ours: `holder` writes it (or nobody yet, while the owner takes it).
    Wait { holder: Option<String> },
}

/// The step for one member: `claim` is the writer named on the member (None: free), `live`
/// the live replicas (with `me`; a claim by anyone else is a dead replica's), and `held`
/// whether we hold it now (false after our Lease lapsed: a claim of ours must be won again
/// before we write).
pub fn step(me: &str, member: &str, claim: Option<&str>, live: &[&str], held: bool) -> Step {
    let ours = owner(member, live.iter().copied()) == Some(me);
    match claim {
        Some(c) if c == me => match (ours, held) {
            (true, true) => Step::Keep,
            (true, false) => Step::Take,
            (false, _) => Step::Release,
        },
        // A live holder keeps it until it releases it: a member never has two writers.
        Some(c) if live.contains(&c) => Step::Wait {
            holder: Some(c.to_string()),
        },
        // Free, or its holder's Lease expired on our clock.
        _ if ours => Step::Take,
        other => Step::Wait {
            holder: other.map(str::to_string),
        },
    }
}

/// Whether a member this replica sees Unreachable may be treated as such (and withdrawn).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(tag = "confirmation", rename_all = "camelCase")]
pub enum Confirmation {
    /// A majority of the live replicas see it Unreachable (or writes are not sharded: one
    /// replica's view is the fleet's).
    #[default]
    Confirmed,
    /// Not asked yet (sharded): the next round of the shard task tells.
    Pending,
    /// Fewer than a majority do: it is our route that failed, not the member.
    Minority { unreachable: usize, live: usize },
    /// The hub cannot be read, so the others' views are unknown: we never withdraw on our own.
    HubUnreadable,
}

/// The confirmation of `member` from `mine` (what this replica sees) and the live peers'
/// reports; `hub_fresh` is false when the peers' Leases could not be read lately, and then a
/// member already confirmed stays so (losing the hub must not bring back endpoints the
/// majority agreed were gone), and any other is not confirmed.
pub fn confirm<'a>(
    member: &str,
    mine: &Report,
    peers: impl IntoIterator<Item = &'a Report>,
    hub_fresh: bool,
    previous: Confirmation,
) -> Confirmation {
    if !hub_fresh {
        return match previous {
            Confirmation::Confirmed => Confirmation::Confirmed,
            _ => Confirmation::HubUnreadable,
        };
    }
    let mut live = 1;
    let mut unreachable = usize::from(mine.unreachable.contains(member));
    for r in peers {
        live += 1;
        unreachable += usize::from(r.unreachable.contains(member));
    }
    if unreachable * 2 > live {
        Confirmation::Confirmed
    } else {
        Confirmation::Minority { unreachable, live }
    }
}

impl Confirmation {
    /// Why a member we cannot reach is still served (None: confirmed).
    pub fn why_served(&self) -> Option<String> {
        match self {
            Confirmation::Confirmed => None,
            Confirmation::Pending => Some(
                "unreachable from this replica; asking the other replicas: serving its last \
                 endpoints"
                    .into(),
            ),
            Confirmation::Minority { unreachable, live } => Some(format!(
                "unreachable from this replica, but only {unreachable} of {live} live replicas \
                 see it unreachable: serving its last endpoints"
            )),
            Confirmation::HubUnreadable => Some(
                "unreachable from this replica, and the hub cannot be read to ask the other \
                 replicas: serving its last endpoints"
                    .into(),
            ),
        }
    }
}

#[cfg(test)]
mod tests;
