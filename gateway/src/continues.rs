//! The paged lists through `*` that may still go on.
//!
//! ```text
//!  page 1 ──► record(None, versions) ─► id ──► continue: mct2.{list: id, member, its token}
//!  page n ──► resume(token, path) ─► versions of the members done ──► … ──► record(id, …)
//!             gone (idle, evicted, another gateway) ─► 410 Expired: the client lists again
//! ```
//!
//! A paged list's last page must carry every member's resourceVersion (a client watches from
//! it), so what each page learnt has to reach the next. In the token that is ~30 bytes a
//! member: tens of KB at 1,000 members, past what URLs carry. Here it is held under a random
//! id, and the token stays a few hundred bytes whatever the fleet's size. Held lists are
//! bounded by bytes (the least recently used go first) and by idle time — about as long as a
//! member keeps its own continue tokens (until its etcd compacts, five minutes by default).
//! A list that is gone answers 410 `Expired`, as an API server answers a continue token it
//! compacted away; client-go's pager then lists again without `limit`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use parking_lot::Mutex;
use ring::rand::{SecureRandom, SystemRandom};

use crate::merge::{Composite, Continue};

/// How long a paged list may wait for its next page.
pub(crate) const LIST_IDLE: Duration = Duration::from_secs(300);
/// The most the held lists take, roughly: 2,000 lists of 1,000 members.
pub(crate) const LISTS_BYTES: usize = 64 << 20;

/// Why a continue token cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ResumeError {
    /// Its list is no longer held (idle too long, evicted, or issued by another gateway).
    #[error(
        "the provided continue parameter is too old to display a consistent list result: start a new list without the continue parameter"
    )]
    Expired,
    #[error("the continue parameter was issued for another list ({0})")]
    OtherList(String),
    #[error("cannot draw a random list id")]
    Random,
}

/// The held lists.
pub(crate) struct Lists {
    held: Mutex<Held>,
    idle: Duration,
    max_bytes: usize,
    random: SystemRandom,
}

#[derive(Default)]
struct Held {
    lists: HashMap<String, List>,
    bytes: usize,
}

struct List {
    /// The collection path it lists: its token does not go on with another.
    path: String,
    /// Each member's resourceVersion as its first page answered.
    versions: Composite,
    used: Instant,
    bytes: usize,
}

impl List {
    fn weigh(&mut self) {
        let entries: usize = self
            .versions
            .0
            .iter()
            .map(|(k, v)| k.len() + v.len() + 48)
            .sum();
        self.bytes = 128 + self.path.len() + entries;
    }
}

impl Lists {
    pub(crate) fn new(idle: Duration, max_bytes: usize) -> Self {
        Self {
            held: Mutex::default(),
            idle,
            max_bytes,
            random: SystemRandom::new(),
        }
    }

    /// The versions of the members done when `token` was issued, for a list of `path`.
    pub(crate) fn resume(
        &self,
        token: &Continue,
        path: &str,
        now: Instant,
    ) -> Result<Composite, ResumeError> {
        let mut held = self.held.lock();
        let idle = self.idle;
        let list = held
            .lists
            .get_mut(&token.list)
            .filter(|l| now.saturating_duration_since(l.used) <= idle)
            .ok_or(ResumeError::Expired)?;
        if list.path != path {
            return Err(ResumeError::OtherList(list.path.clone()));
        }
        list.used = now;
        Ok(token.done(&list.versions))
    }

    /// Records what a page learnt (`versions`: every member listed so far) under `list`, or a
    /// new list when None; answers the list's id.
    pub(crate) fn record(
        &self,
        list: Option<&str>,
        path: &str,
        versions: &Composite,
        now: Instant,
    ) -> Result<String, ResumeError> {
        let mut held = self.held.lock();
        let id = match list.filter(|id| held.lists.contains_key(*id)) {
            Some(id) => id.to_string(),
            None => self.new_id()?,
        };
        let list = held.lists.entry(id.clone()).or_insert_with(|| List {
            path: path.to_string(),
            versions: Composite::default(),
            used: now,
            bytes: 0,
        });
        let before = list.bytes;
        list.versions.0.extend(versions.0.clone());
        list.used = now;
        list.weigh();
        let after = list.bytes;
        held.bytes = held.bytes + after - before;
        self.evict(&mut held, now, &id);
        Ok(id)
    }

    /// Lists held now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.held.lock().lists.len()
    }

    fn new_id(&self) -> Result<String, ResumeError> {
        let mut bytes = [0u8; 16];
        self.random
            .fill(&mut bytes)
            .map_err(|_| ResumeError::Random)?;
        Ok(URL_SAFE_NO_PAD.encode(bytes))
    }

    /// Drops idle lists, then the least recently used until the rest fit (never `keep`).
    fn evict(&self, held: &mut Held, now: Instant, keep: &str) {
        let idle = self.idle;
        let Held { lists, bytes } = held;
        lists.retain(|id, l| {
            let live = id == keep || now.saturating_duration_since(l.used) <= idle;
            if !live {
                *bytes -= l.bytes;
            }
            live
        });
        while *bytes > self.max_bytes {
            let Some(oldest) = lists
                .iter()
                .filter(|(id, _)| id.as_str() != keep)
                .min_by_key(|(_, l)| l.used)
                .map(|(id, _)| id.clone())
            else {
                break;
            };
            if let Some(l) = lists.remove(&oldest) {
                *bytes -= l.bytes;
            }
        }
    }
}

#[cfg(test)]
mod tests;
