//! The member reconciler: the loop every writer into members shares, written once.
//!
//! ```text
//!  snapshot ─┐
//!  facts ────┼─► Wake::next (debounced) ─► Round { snapshot, facts, now }
//!  notify ───┤                               │
//!  tick ─────┘                               ▼
//!                          reconcile::sync: a slot per member this writer keeps —
//!                          its Applier for the member's current connection (fenced,
//!                          asking leadership for that member before each request),
//!                          whether this replica writes it, its retry back-off and
//!                          resync clock, and the writer's own state (MemberState)
//!                                            │
//!                                            ▼
//!                          the writer's round: *what* each member should hold
//! ```
//!
//! What is the same for every writer lives here: what wakes a round and how long changes
//! are gathered ([`Wake`]); one applier per connection, made again when the member's source
//! reconnects, and dropped with the member ([`sync`]); forgetting what was written
//! when this replica stops writing a member (leadership lapsed, a shard handed over:
//! [`MemberState::stopped_writing`]), so the next term starts from what the member holds;
//! asking a member that keeps failing less and less often ([`Backoff`]); checking for drift
//! by listing now and then ([`Resync`]). What differs — which objects a member should hold,
//! how they are written, what is reported — is each writer's: `writeback` (MCS objects),
//! `propagate` (placed copies), `tenants` (namespaces), `status` (MemberCluster status on
//! the hub).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_core::{ClusterId, Snapshot};
use tokio::sync::{Notify, watch};
use tokio::time::{Interval, MissedTickBehavior};

use super::apply::Applier;
use super::leader::Leadership;
use super::{Facts, MemberFacts};

/// Changes arriving within this window are written together.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// The longest wait before a member whose rounds keep failing is tried again.
const MAX_RETRY: Duration = Duration::from_secs(10);

/// What one round works from.
pub struct Round {
    pub snapshot: Arc<Snapshot>,
    /// A copy of every member's facts, taken once per round.
    pub facts: BTreeMap<ClusterId, MemberFacts>,
}

/// What wakes a writer: a new snapshot, a member's facts changing, its own notifications
/// (a watch event), a tick, or a deadline it asked for.
pub struct Wake {
    snapshots: watch::Receiver<Arc<Snapshot>>,
    facts_changed: watch::Receiver<u64>,
    fleet: Facts,
    notify: Option<Arc<Notify>>,
    tick: Interval,
    debounce: Duration,
}

impl Wake {
    /// Wakes on snapshots and facts, and every `tick` besides; gathers changes for
    /// [`DEBOUNCE`] before a round.
    pub fn new(snapshots: watch::Receiver<Arc<Snapshot>>, fleet: &Facts, tick: Duration) -> Self {
        let mut tick = tokio::time::interval(tick);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Self {
            snapshots,
            facts_changed: fleet.subscribe(),
            fleet: fleet.clone(),
            notify: None,
            tick,
            debounce: DEBOUNCE,
        }
    }

    /// Wakes on `notify` too.
    pub fn notified_by(mut self, notify: Arc<Notify>) -> Self {
        self.notify = Some(notify);
        self
    }

    /// Starts a round as soon as something wakes it (a writer that is cheap and wants its
    /// clock, like the status heartbeat).
    pub fn without_debounce(mut self) -> Self {
        self.debounce = Duration::ZERO;
        self
    }

    /// Waits for the next round (at the latest at `deadline`); None once the snapshots end.
    pub async fn next(&mut self, deadline: Option<Instant>) -> Option<Round> {
        let notify = self.notify.clone();
        let notified = async {
            match &notify {
                Some(n) => n.notified().await,
                None => std::future::pending().await,
            }
        };
        let deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = self.snapshots.changed() => r.ok()?,
            _ = self.facts_changed.changed() => {}
            () = notified => {}
            () = deadline => {}
            _ = self.tick.tick() => {}
        }
        if !self.debounce.is_zero() {
            tokio::time::sleep(self.debounce).await;
        }
        Some(Round {
            snapshot: self.snapshots.borrow_and_update().clone(),
            facts: self.fleet.all(),
        })
    }
}

/// What a writer keeps per member besides its slot.
pub trait MemberState {
    /// This replica stopped writing the member (another does now, or none): forget what was
    /// written, so that the next term starts from what the member holds.
    fn stopped_writing(&mut self);
}

/// A writer that keeps nothing of a member between rounds (what the member holds is read
/// again each round).
impl MemberState for () {
    fn stopped_writing(&mut self) {}
}

/// Rounds that failed in a row, and when the next may be tried: a member that refuses (its
/// RBAC, its agent gone) is asked again less and less often, not at every wake.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backoff {
    failures: u32,
    retry_at: Option<Instant>,
}

impl Backoff {
    /// A round failed at `now`: the next waits [`retry_delay`] of the failures in a row.
    pub fn failed(&mut self, now: Instant) {
        self.failures = self.failures.saturating_add(1);
        self.retry_at = Some(now + retry_delay(self.failures));
    }

    pub fn succeeded(&mut self) {
        *self = Self::default();
    }

    /// The next round must wait.
    pub fn waits(&self, now: Instant) -> bool {
        self.retry_at.is_some_and(|t| now < t)
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }
}

/// How long to wait after `failures` rounds failed in a row: half a second, doubling, at most
/// ten seconds.
pub fn retry_delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    (Duration::from_millis(500) * 2u32.pow(doublings)).min(MAX_RETRY)
}

/// When a member's drift was last checked by listing, and how often it is.
#[derive(Clone, Copy, Debug)]
pub struct Resync {
    every: Duration,
    last: Option<Instant>,
}

impl Resync {
    pub fn every(every: Duration) -> Self {
        Self { every, last: None }
    }

    pub fn due(&self) -> bool {
        self.last.is_none_or(|t| t.elapsed() >= self.every)
    }

    pub fn done(&mut self, at: Instant) {
        self.last = Some(at);
    }

    /// The next round checks.
    pub fn reset(&mut self) {
        self.last = None;
    }
}

/// One member as a writer keeps it.
pub struct Slot<S> {
    /// Made for `connection`; kept from round to round for its discovery cache.
    pub applier: Applier,
    /// The member's `MemberFacts::connection` the applier was made for.
    pub connection: u64,
    /// This replica may write the member (as of this round).
    pub writing: bool,
    pub backoff: Backoff,
    pub resync: Resync,
    pub state: S,
}

impl<S> std::ops::Deref for Slot<S> {
    type Target = S;

    /// A slot is its writer's state with the member's plumbing around it.
    fn deref(&self) -> &S {
        &self.state
    }
}

impl<S> std::ops::DerefMut for Slot<S> {
    fn deref_mut(&mut self) -> &mut S {
        &mut self.state
    }
}

impl<S: MemberState> Slot<S> {
    /// A slot written by this replica, for tests that drive a writer's round by hand.
    #[cfg(test)]
    pub(crate) fn writing(applier: Applier, resync: Duration, state: S) -> Self {
        Self {
            applier,
            connection: 1,
            writing: true,
            backoff: Backoff::default(),
            resync: Resync::every(resync),
            state,
        }
    }

    fn stop_writing(&mut self) {
        self.state.stopped_writing();
        self.backoff.succeeded();
        self.resync.reset();
    }
}

/// A writer's members, one slot each.
pub type Slots<S> = BTreeMap<ClusterId, Slot<S>>;

/// Brings `slots` in line with `facts`: a member that left, lost its client or reconnected
/// loses its slot (a new connection starts afresh); a member this replica stopped writing
/// has its state told so; a member `wanted` (given its facts and whether this replica writes
/// it) that has none gets a slot with an applier for its connection, scoped to its writer,
/// checking drift every `resync`, and the state `new` makes.
pub fn sync<S: MemberState>(
    slots: &mut Slots<S>,
    facts: &BTreeMap<ClusterId, MemberFacts>,
    leadership: &Leadership,
    resync: Duration,
    mut wanted: impl FnMut(&ClusterId, &MemberFacts, bool) -> bool,
    mut new: impl FnMut(&ClusterId) -> S,
) {
    slots.retain(|id, slot| {
        facts
            .get(id)
            .is_some_and(|f| f.client.is_some() && f.connection == slot.connection)
    });
    for (id, f) in facts {
        let writing = leadership.may_write_to(id);
        if let Some(slot) = slots.get_mut(id) {
            if slot.writing && !writing {
                slot.stop_writing();
            }
            slot.writing = writing;
            continue;
        }
        if !wanted(id, f, writing) {
            continue;
        }
        let Some(applier) = f.applier(leadership.for_member(id), id) else {
            continue;
        };
        slots.insert(
            id.clone(),
            Slot {
                applier,
                connection: f.connection,
                writing,
                backoff: Backoff::default(),
                resync: Resync::every(resync),
                state: new(id),
            },
        );
    }
}

#[cfg(test)]
mod tests;
