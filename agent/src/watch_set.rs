//! The agent's one set of watches of its member, shared by its streams to every hub replica
//! (the shell around [`Fanout`]): however many replicas the hub's name resolves to, the
//! member's API server serves one watch per resource, and each event is encoded once.
//!
//! ```text
//!  WatchSet::run: watch_all(member) ─ without managedFields ─ events::item ─► Fanout::publish
//!                                                               └─ wakes every Subscription
//!  Subscription::next (one per stream): the snapshot first, then the events since, or the
//!  snapshot again after the stream fell STREAM_QUEUE events behind
//! ```
//!
//! The watches run for as long as the agent does, whether or not a stream is up: a hub that
//! restarts (or a replica added) is given the kept state at once, and costs the member's API
//! server no new list.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use meridian_controllers::kubernetes::member::WatchItem;
use meridian_controllers::reason_of;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::events::{item, without_managed_fields};
use crate::fanout::{Fanout, StreamId, Taken};
use crate::metrics::AgentSide;

/// Events one stream may have waiting before it is given the whole state again: a few
/// seconds of a busy member's events, a few hundred KiB of pointers at most (the objects
/// themselves are shared with the store).
pub const STREAM_QUEUE: usize = 4096;
/// How long the watches rest when all of them ended (they retry on their own; this is a
/// guard against a tight loop).
const WATCHES_ENDED_PAUSE: Duration = Duration::from_secs(1);

/// The member's watches, their store, and the streams they are fanned out to.
pub struct WatchSet {
    shared: Mutex<Shared>,
    /// The watch of the member that fails now, for every stream's heartbeats.
    failure: WatchFailure,
    side: AgentSide,
    /// The events a stream may have waiting (for the log of one that fell behind).
    bound: usize,
}

struct Shared {
    fanout: Fanout,
    /// Each stream's wake-up: its queue grew or it fell behind.
    wakers: HashMap<StreamId, Arc<Notify>>,
}

impl WatchSet {
    pub fn new(side: AgentSide) -> Self {
        Self::with_bound(side, STREAM_QUEUE)
    }

    /// A set whose streams may each have `bound` events waiting.
    pub fn with_bound(side: AgentSide, bound: usize) -> Self {
        Self {
            shared: Mutex::new(Shared {
                fanout: Fanout::new(bound),
                wakers: HashMap::new(),
            }),
            failure: WatchFailure::default(),
            side,
            bound,
        }
    }

    /// Fans out what `watches` (the member's `watch_all`, made again by `watches` whenever
    /// it ends) see, forever.
    pub async fn run<S>(&self, mut watches: impl FnMut() -> S)
    where
        S: Stream<Item = WatchItem> + Unpin,
    {
        loop {
            let mut stream = watches();
            while let Some(watched) = stream.next().await {
                self.watched(watched);
            }
            tracing::warn!("the member's watches ended; watching again");
            tokio::time::sleep(WATCHES_ENDED_PAUSE).await;
        }
    }

    /// One event, or error, of the watches.
    pub fn watched(&self, watched: WatchItem) {
        let event = match watched {
            Ok(event) => event,
            Err(e) => {
                tracing::debug!(resource = e.kind, error = %e, "watch failed");
                self.failure.failed(e.kind, e.message);
                return;
            }
        };
        self.failure.fine(event.resource());
        let item = match item(&without_managed_fields(event)) {
            Ok(item) => item,
            Err(e) => {
                tracing::warn!(error = %reason_of(&e), "an event cannot be sent");
                return;
            }
        };
        let mut shared = self.shared.lock();
        for behind in shared.fanout.publish(item) {
            tracing::info!(
                stream = ?behind,
                bound = self.bound,
                "a stream to the hub fell behind: it is sent the whole state again"
            );
        }
        for waker in shared.wakers.values() {
            waker.notify_one();
        }
        self.side
            .watch_store_objects
            .set(i64::try_from(shared.fanout.objects()).unwrap_or(i64::MAX));
    }

    /// A new stream's subscription: the state first, then what follows.
    pub fn subscribe(&self) -> Subscription<'_> {
        let woken = Arc::new(Notify::new());
        let mut shared = self.shared.lock();
        let id = shared.fanout.subscribe();
        shared.wakers.insert(id, woken.clone());
        Subscription {
            set: self,
            id,
            woken,
            first: true,
        }
    }

    /// Why a watch of the member fails now (empty: none fails), for the heartbeats.
    pub fn failure(&self) -> String {
        self.failure.reason()
    }

    /// How many events the stream `id` has waiting.
    #[cfg(test)]
    pub(crate) fn waiting(&self, id: StreamId) -> usize {
        self.shared.lock().fanout.waiting(id)
    }
}

/// One stream's share of the watches; unsubscribed when dropped.
pub struct Subscription<'a> {
    set: &'a WatchSet,
    pub id: StreamId,
    woken: Arc<Notify>,
    /// Nothing taken yet: a snapshot is the stream's first, not a resync.
    first: bool,
}

impl Subscription<'_> {
    /// The next events for the stream, waiting until there are some.
    pub async fn next(&mut self) -> Taken {
        loop {
            // A publish between this take and the wait leaves a permit: nothing is missed.
            let taken = self.set.shared.lock().fanout.take(self.id);
            if taken.snapshot && !std::mem::take(&mut self.first) {
                self.set.side.resyncs.inc();
            }
            if !taken.events.is_empty() {
                return taken;
            }
            self.woken.notified().await;
        }
    }
}

impl Drop for Subscription<'_> {
    fn drop(&mut self) {
        let mut shared = self.set.shared.lock();
        shared.fanout.unsubscribe(self.id);
        shared.wakers.remove(&self.id);
    }
}

/// The watch of the member that fails now, for the heartbeats (as push members report it).
#[derive(Default)]
struct WatchFailure(Mutex<Option<(&'static str, String)>>);

impl WatchFailure {
    fn failed(&self, resource: &'static str, error: String) {
        // Pods and quotas only refine capacity: their refusal degrades nothing.
        if !matches!(resource, "pods" | "resourcequotas") {
            *self.0.lock() = Some((resource, format!("watch {resource}: {error}")));
        }
    }

    fn fine(&self, resource: &str) {
        let mut failing = self.0.lock();
        if failing.as_ref().is_some_and(|(r, _)| *r == resource) {
            *failing = None;
        }
    }

    fn reason(&self) -> String {
        self.0
            .lock()
            .as_ref()
            .map(|(_, r)| r.clone())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
