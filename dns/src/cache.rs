//! The UDP answer cache: bounded, sharded, two generations per shard.
//!
//! A general-purpose concurrent cache (moka, until this module) spent about 1,200
//! instructions on a hit and 2,000 on an insert, with its admission sketch, access deques and
//! housekeeping — a third of a hit's whole cost and a fifth of a miss's. What the answer cache
//! needs is less: a bounded map from question bytes to an answer, where entries asked for
//! recently stay. Each shard keeps a young and an old map; new answers go into the young one,
//! a hit in the old one moves its entry back to the young one, and when the young map is full
//! it becomes the old one (and the old one is dropped). An entry asked for at least once per
//! generation stays; one not asked for in two generations goes. The shard is a
//! `parking_lot` mutex held for one map operation: the UDP workers rarely meet on one.

use std::collections::HashMap;

use parking_lot::Mutex;

/// Shards: enough that workers asking different names seldom share a lock.
const SHARDS: usize = 16;

type Map<V> = HashMap<Box<[u8]>, V, ahash::RandomState>;

pub(crate) struct AnswerCache<V> {
    shards: Box<[Mutex<Shard<V>>]>,
    /// Picks the shard; each map hashes with its own keys.
    hasher: ahash::RandomState,
    /// Entries a shard's young map takes before it becomes the old one.
    generation: usize,
}

struct Shard<V> {
    young: Map<V>,
    old: Map<V>,
}

impl<V: Clone> AnswerCache<V> {
    /// A cache of at most `capacity` entries (young and old maps of every shard together;
    /// at least one per map of each shard, 32, unless it is 0: then nothing is cached).
    pub(crate) fn new(capacity: u64) -> Self {
        let capacity = usize::try_from(capacity).unwrap_or(usize::MAX);
        let generation = match capacity {
            0 => 0,
            _ => (capacity / (2 * SHARDS)).max(1),
        };
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    young: Map::default(),
                    old: Map::default(),
                })
            })
            .collect();
        Self {
            shards,
            hasher: ahash::RandomState::new(),
            generation,
        }
    }

    fn shard(&self, key: &[u8]) -> &Mutex<Shard<V>> {
        let hash = self.hasher.hash_one(key);
        &self.shards[(hash % SHARDS as u64) as usize]
    }

    pub(crate) fn get(&self, key: &[u8]) -> Option<V> {
        self.shard(key).lock().get(key, self.generation)
    }

    pub(crate) fn insert(&self, key: Box<[u8]>, value: V) {
        if self.generation > 0 {
            self.shard(&key).lock().keep(key, value, self.generation);
        }
    }

    /// Entries held now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        (self.shards.iter())
            .map(|s| {
                let s = s.lock();
                s.young.len() + s.old.len()
            })
            .sum()
    }
}

impl<V: Clone> Shard<V> {
    fn get(&mut self, key: &[u8], generation: usize) -> Option<V> {
        if let Some(value) = self.young.get(key) {
            return Some(value.clone());
        }
        let (key, value) = self.old.remove_entry(key)?;
        self.keep(key, value.clone(), generation);
        Some(value)
    }

    fn keep(&mut self, key: Box<[u8]>, value: V, generation: usize) {
        self.young.insert(key, value);
        if self.young.len() >= generation {
            self.old = std::mem::take(&mut self.young);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> Box<[u8]> {
        format!("q{i}").into_bytes().into_boxed_slice()
    }

    #[test]
    fn it_holds_at_most_its_capacity_and_keeps_what_is_asked_for() {
        let cache = AnswerCache::new(320);
        for i in 0..10_000 {
            cache.insert(key(i), i);
            // One name asked for all along: never evicted.
            assert_eq!(cache.get(&key(0)), Some(0));
            assert!(cache.len() <= 320, "{} entries", cache.len());
        }
        assert!(
            cache.len() >= 160,
            "at least one generation stays: {}",
            cache.len()
        );
        // The most recent entries are there; long-unasked ones are gone.
        assert_eq!(cache.get(&key(9_999)), Some(9_999));
        assert_eq!(cache.get(&key(5)), None);
    }

    #[test]
    fn a_cache_of_no_entries_keeps_nothing() {
        let cache = AnswerCache::new(0);
        cache.insert(key(1), 1);
        assert_eq!((cache.get(&key(1)), cache.len()), (None, 0));
    }

    #[test]
    fn a_hit_in_the_old_generation_moves_the_entry_to_the_young_one() {
        let mut shard = Shard {
            young: Map::default(),
            old: Map::default(),
        };
        shard.keep(key(1), 1, 2);
        shard.keep(key(2), 2, 2);
        assert!(
            shard.young.is_empty() && shard.old.len() == 2,
            "a full young map turns old"
        );
        assert_eq!(shard.get(&key(1), 2), Some(1));
        assert!(shard.young.contains_key(&key(1)[..]) && !shard.old.contains_key(&key(1)[..]));
        // The next turn drops 2 (not asked for in two generations) and keeps 1.
        shard.keep(key(3), 3, 2);
        assert_eq!(shard.get(&key(2), 2), None);
        assert_eq!(shard.get(&key(1), 2), Some(1));
    }
}
