//! One watch set, many streams: the member's watch events, encoded once, kept in one store
//! and handed to every hub replica's stream. A pure state machine (no I/O, no clock); the
//! async shell is `watch_set.rs`.
//!
//! ```text
//!  watch_all(member) ─ encode ─► Fanout::publish ─► store: per resource, the listed objects
//!                                      │                  (and a list under way)
//!                                      ├─► stream A's queue ─► take ─► up to replica A
//!                                      └─► stream B's queue ─► take ─► up to replica B
//!  a new stream, or one that fell behind: take gives the store's snapshot (as a LIST would:
//!  Init, InitApply…, InitDone per resource), then the events published after it
//! ```
//!
//! A stream's queue is bounded ([`Fanout::new`]): a stream whose hub reads too slowly is not
//! waited for (the others go on) and holds no more than the bound. Past it, its queue is
//! dropped and its next `take` is the whole state again, which the hub takes as a relist
//! (the same `Init`…`InitDone` a watch's own relist brings, replacing the member's objects
//! in one step). Cutting the stream instead would also drop its tunnel (the hub's requests
//! for the member's API in flight) and make the hub count the member disconnected; a relist
//! costs neither.
//!
//! Snapshot and queue are taken under one lock with the events published, so a stream gets
//! every event after its snapshot, none twice and none missing.

use std::collections::{BTreeMap, HashMap, VecDeque};

use bytes::Bytes;

use crate::proto::{Phase, WatchEvent};

/// Identifies one stream's subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamId(u64);

/// One of the member's watch events, as it is kept and sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// The resource as the API names it (`services`, …).
    pub resource: &'static str,
    pub phase: Phase,
    /// `namespace/name` (`name` when cluster-scoped); empty for `Init` and `InitDone`.
    pub key: String,
    /// The object as JSON (shared by the store and every queue); empty for `Init`, `InitDone`.
    pub object: Bytes,
}

impl Item {
    /// The wire form (the object's bytes are shared, not copied).
    pub fn wire(&self) -> WatchEvent {
        WatchEvent {
            resource: self.resource.to_string(),
            phase: self.phase as i32,
            object_json: self.object.clone(),
        }
    }

    fn marker(resource: &'static str, phase: Phase) -> Self {
        Self {
            resource,
            phase,
            key: String::new(),
            object: Bytes::new(),
        }
    }
}

/// What a stream is given when it asks.
#[derive(Debug, Default, PartialEq)]
pub struct Taken {
    /// The events are the whole state (a new stream, or one that fell behind), not the
    /// events since the last take.
    pub snapshot: bool,
    pub events: Vec<Item>,
}

/// The store, and the streams it is fanned out to.
#[derive(Debug)]
pub struct Fanout {
    /// By resource: what a new stream is given first.
    resources: BTreeMap<&'static str, Resource>,
    streams: HashMap<StreamId, Queue>,
    next: u64,
    /// Events a stream may have waiting before it is given the whole state instead.
    bound: usize,
}

/// One resource's objects, as its watch left them.
#[derive(Debug, Default)]
struct Resource {
    /// Whether a list of it completed: before, there is nothing to give a new stream but the
    /// list under way.
    listed: bool,
    /// The objects by key as the last complete list and the events since left them.
    live: BTreeMap<String, Bytes>,
    /// A list under way (`Init` seen, `InitDone` not yet): what it brought so far. A new
    /// stream is given this one (it replaces `live` on `InitDone` anyway).
    listing: Option<BTreeMap<String, Bytes>>,
}

/// One stream's waiting events.
#[derive(Debug, Default)]
struct Queue {
    events: VecDeque<Item>,
    /// It fell behind (or is new): the queue holds nothing and the next take is the snapshot.
    behind: bool,
}

impl Fanout {
    /// A store with no streams, each of which may have `bound` events waiting.
    pub fn new(bound: usize) -> Self {
        Self {
            resources: BTreeMap::new(),
            streams: HashMap::new(),
            next: 0,
            bound: bound.max(1),
        }
    }

    /// A new stream: its first take is the snapshot.
    pub fn subscribe(&mut self) -> StreamId {
        let id = StreamId(self.next);
        self.next += 1;
        self.streams.insert(
            id,
            Queue {
                behind: true,
                ..Queue::default()
            },
        );
        id
    }

    pub fn unsubscribe(&mut self, id: StreamId) {
        self.streams.remove(&id);
    }

    /// How many streams there are.
    pub fn streams(&self) -> usize {
        self.streams.len()
    }

    /// Keeps `item` and queues it for every stream; returns the streams that fell behind with
    /// it (their queues were dropped).
    pub fn publish(&mut self, item: Item) -> Vec<StreamId> {
        self.keep(&item);
        let mut fell_behind = Vec::new();
        for (id, queue) in &mut self.streams {
            if queue.behind {
                continue;
            }
            if queue.events.len() >= self.bound {
                queue.behind = true;
                queue.events = VecDeque::new();
                fell_behind.push(*id);
                continue;
            }
            queue.events.push_back(item.clone());
        }
        fell_behind
    }

    /// What `id` has waiting: the snapshot when it is new or fell behind, else the events
    /// since its last take (none for a stream that is gone).
    pub fn take(&mut self, id: StreamId) -> Taken {
        let Some(queue) = self.streams.get_mut(&id) else {
            return Taken::default();
        };
        if std::mem::take(&mut queue.behind) {
            queue.events.clear();
            return Taken {
                snapshot: true,
                events: self.snapshot(),
            };
        }
        Taken {
            snapshot: false,
            events: queue.events.drain(..).collect(),
        }
    }

    /// How many events `id` has waiting (0 when behind: it waits for a snapshot instead).
    pub fn waiting(&self, id: StreamId) -> usize {
        self.streams.get(&id).map_or(0, |q| q.events.len())
    }

    /// The store as a fresh LIST of every resource would give it: per resource listed,
    /// `Init`, an `InitApply` per object, `InitDone`; per resource being listed, `Init` and
    /// what the list brought so far (its own `InitDone` follows live).
    pub fn snapshot(&self) -> Vec<Item> {
        let mut events = Vec::new();
        for (&resource, r) in &self.resources {
            let (objects, done) = match (&r.listing, r.listed) {
                (Some(listing), _) => (listing, false),
                (None, true) => (&r.live, true),
                (None, false) => continue,
            };
            events.push(Item::marker(resource, Phase::Init));
            events.extend(objects.iter().map(|(key, object)| Item {
                resource,
                phase: Phase::InitApply,
                key: key.clone(),
                object: object.clone(),
            }));
            if done {
                events.push(Item::marker(resource, Phase::InitDone));
            }
        }
        events
    }

    /// How many objects the store holds (lists under way included).
    pub fn objects(&self) -> usize {
        self.resources
            .values()
            .map(|r| r.live.len() + r.listing.as_ref().map_or(0, BTreeMap::len))
            .sum()
    }

    fn keep(&mut self, item: &Item) {
        let r = self.resources.entry(item.resource).or_default();
        match item.phase {
            Phase::Init => r.listing = Some(BTreeMap::new()),
            Phase::InitApply => {
                r.listing
                    .get_or_insert_with(BTreeMap::new)
                    .insert(item.key.clone(), item.object.clone());
            }
            Phase::InitDone => {
                r.live = r.listing.take().unwrap_or_default();
                r.listed = true;
            }
            Phase::Apply => {
                r.live.insert(item.key.clone(), item.object.clone());
            }
            Phase::Delete => {
                r.live.remove(&item.key);
            }
        }
    }
}

#[cfg(test)]
mod tests;
