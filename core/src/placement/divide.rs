//! Replica division: Webster/Sainte-Laguë with caps, and the steady capacity division built on
//! it. Exact integer arithmetic only (priorities compared by cross-multiplication in `u128`),
//! so the same input always gives the same split.
//!
//! Webster gives the next replica to the largest `w / (2s + 1)`; equal priorities go to the
//! party with fewer replicas, then to the smaller `tie` (a stable per-object order of cluster
//! names, [`tie_key`]), then to the earlier party. That greedy is the same as "sort every seat
//! `(party, k)` by (priority desc, k asc, tie asc) and take the first `total`", so any start
//! that is known to lie under the result can be filled up from there with the same outcome —
//! [`webster`] starts from a lower bound and only runs the heap for the last ≤ n seats.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// One party of a division.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Party {
    /// Its weight (votes); 0 takes no seat.
    pub weight: u64,
    /// The most seats it may take.
    pub cap: u64,
    /// The stable tie-break: smaller wins.
    pub tie: u64,
}

/// FNV-1a 64, written here so the order it gives never changes with a dependency.
#[derive(Clone, Copy, Debug)]
pub(super) struct Fnv(u64);

impl Fnv {
    pub(super) fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    pub(super) fn bytes(mut self, bytes: &[u8]) -> Self {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        self
    }

    /// `s` and a separator no name contains, so `("ab", "c")` and `("a", "bc")` differ.
    pub(super) fn str(self, s: &str) -> Self {
        self.bytes(s.as_bytes()).bytes(&[0])
    }

    pub(super) fn finish(self) -> u64 {
        self.0
    }
}

/// The tie-break order of `cluster` for the object whose hash state is `object`
/// ([`Fnv::str`] of its identity): stable, and different per object, so ties between equal
/// clusters do not always go to the same one fleet-wide.
pub(super) fn tie_key(object: Fnv, cluster: &str) -> u64 {
    object.str(cluster).finish()
}

/// A seat on offer: party `idx`'s next one, when it holds `seats`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seat {
    weight: u64,
    seats: u64,
    tie: u64,
    idx: usize,
}

impl Ord for Seat {
    /// Greater is better: higher `w / (2s+1)`, then fewer seats, then smaller tie, then index.
    fn cmp(&self, other: &Self) -> Ordering {
        let mine = u128::from(self.weight) * u128::from(2 * other.seats + 1);
        let theirs = u128::from(other.weight) * u128::from(2 * self.seats + 1);
        mine.cmp(&theirs)
            .then(other.seats.cmp(&self.seats))
            .then(other.tie.cmp(&self.tie))
            .then(other.idx.cmp(&self.idx))
    }
}

impl PartialOrd for Seat {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Webster/Sainte-Laguë: `total` seats among `parties`, none above its cap. When the caps
/// leave fewer than `total` seats, every party gets its cap (the callers check capacity
/// first).
pub(super) fn webster(parties: &[Party], total: u64) -> Vec<u64> {
    let mut seats = lower_bound(parties, total);
    let given: u64 = seats.iter().sum();
    let mut heap: BinaryHeap<Seat> = parties
        .iter()
        .enumerate()
        .filter(|(i, p)| p.weight > 0 && seats[*i] < p.cap)
        .map(|(idx, p)| Seat {
            weight: p.weight,
            seats: seats[idx],
            tie: p.tie,
            idx,
        })
        .collect();
    for _ in given..total {
        let Some(mut seat) = heap.pop() else { break };
        seats[seat.idx] += 1;
        seat.seats += 1;
        if seat.seats < parties[seat.idx].cap {
            heap.push(seat);
        }
    }
    seats
}

/// Seats every party is sure to win. With `λ` the priority of the last seat given
/// (uncapped), party i wins every seat above it, at least `w_i/(2λ) − ½`, and summing the
/// upper bounds gives `1/(2λ) ≥ (R − n/2)/W`: so `s_i ≥ ⌈(w_i(2R − n) − W) / 2W⌉`. A cap only
/// removes seats of other parties from the order, so the capped result is at least
/// `min(bound, cap)`. Leaves at most n seats to the heap.
fn lower_bound(parties: &[Party], total: u64) -> Vec<u64> {
    let n = parties.iter().filter(|p| p.weight > 0 && p.cap > 0).count() as u128;
    let sum: u128 = parties
        .iter()
        .filter(|p| p.cap > 0)
        .map(|p| u128::from(p.weight))
        .sum();
    let twice = 2 * u128::from(total);
    parties
        .iter()
        .map(|p| {
            if p.weight == 0 || p.cap == 0 || twice <= n || sum == 0 {
                return 0;
            }
            let num = u128::from(p.weight) * (twice - n);
            if num <= sum {
                return 0;
            }
            let bound = (num - sum).div_ceil(2 * sum);
            u64::try_from(bound).unwrap_or(u64::MAX).min(p.cap)
        })
        .collect()
}

/// One cluster of a capacity division.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Room {
    /// Replicas of this template it can run: its free replicas plus those of the template
    /// it ran already.
    pub avail: u64,
    /// The template's replicas it holds from the previous decision (this role).
    pub base: u64,
    pub tie: u64,
    /// Its score (higher first for Aggregated, after the clusters holding replicas; 0 when
    /// the policy scores nothing).
    pub rank: u64,
}

/// Divides `total` by available capacity. Fresh (or without a previous split): in
/// proportion to `avail`, none above it. Steady: a scale-up keeps `base` and divides the
/// increment in proportion to the room left (`avail − base`); a scale-down shrinks `base`
/// in proportion, so no cluster grows.
pub(super) fn by_capacity(rooms: &[Room], total: u64, fresh: bool) -> Vec<u64> {
    let kept: u64 = rooms.iter().map(|r| r.base).sum();
    if fresh || kept == 0 {
        let parties: Vec<Party> = rooms
            .iter()
            .map(|r| Party {
                weight: r.avail,
                cap: r.avail,
                tie: r.tie,
            })
            .collect();
        return webster(&parties, total);
    }
    if total >= kept {
        let parties: Vec<Party> = rooms
            .iter()
            .map(|r| {
                let room = r.avail.saturating_sub(r.base);
                Party {
                    weight: room,
                    cap: room,
                    tie: r.tie,
                }
            })
            .collect();
        let more = webster(&parties, total - kept);
        return rooms.iter().zip(more).map(|(r, m)| r.base + m).collect();
    }
    let parties: Vec<Party> = rooms
        .iter()
        .map(|r| Party {
            weight: r.base,
            cap: r.base,
            tie: r.tie,
        })
        .collect();
    webster(&parties, total)
}

/// Aggregated: which of `rooms` to use, as few as fit `total`, the roomiest first (then by
/// tie); in steady state the clusters holding replicas come first, and when they already
/// hold at least `total` only they are used (so a scale-down never moves a replica). Returns
/// indices into `rooms`, in the order chosen.
pub(super) fn aggregate(rooms: &[Room], total: u64, fresh: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..rooms.len()).collect();
    let holds = |i: usize| !fresh && rooms[i].base > 0;
    order.sort_by(|&a, &b| {
        holds(b)
            .cmp(&holds(a))
            .then(rooms[b].rank.cmp(&rooms[a].rank))
            .then(rooms[b].avail.cmp(&rooms[a].avail))
            .then(rooms[a].tie.cmp(&rooms[b].tie))
            .then(a.cmp(&b))
    });
    let kept: u64 = order
        .iter()
        .filter(|&&i| holds(i))
        .map(|&i| rooms[i].base)
        .sum();
    if !fresh && kept >= total && kept > 0 {
        order.retain(|&i| holds(i));
        return order;
    }
    let mut room = 0u64;
    let mut used = 0;
    for &i in &order {
        if room >= total && used > 0 && !holds(i) {
            break;
        }
        room = room.saturating_add(rooms[i].avail);
        used += 1;
    }
    order.truncate(used.max(1).min(order.len()));
    order
}
