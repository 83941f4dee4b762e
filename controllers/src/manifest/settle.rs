//! When a file is read, and what is served from it meanwhile: the pure half of a directory
//! source, driven by a clock the caller passes in.
//!
//! - A file is read once it is **stable**: the same [`Stamp`] (size, mtime, inode) at two
//!   looks at least `settle` apart, or an mtime at least `settle` old. A file rewritten in
//!   place (`open(path, 'w')`, then writes) is not read half-way through.
//! - A read that looks **half-written** (more problems than the version served, or empty
//!   where that one was not) of a file whose served version was good is held back for
//!   `grace`, and the good version keeps serving; still broken after the grace, the new read
//!   is served and its problems reported. A file never good has nothing to keep: its reads
//!   are served at once.

use std::time::{Duration, Instant, SystemTime};

/// What one look at a file saw: enough to notice that it changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub(crate) len: u64,
    pub(crate) modified: SystemTime,
    /// A rename onto the path (how editors save) changes the inode, maybe nothing else.
    pub(crate) inode: u64,
}

/// What to do with a file after a look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Look {
    /// What is served (or held back) was read from this very stamp: nothing to read.
    Unchanged,
    /// Stable and new: read it.
    Read,
    /// Changing (or changed too recently): look again after this long.
    Wait(Duration),
}

/// The counts [`half_written`] compares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Objects the read produced.
    pub(crate) objects: usize,
    /// Errors and warnings the read produced.
    pub(crate) problems: usize,
}

/// Whether `new` looks like a write caught in progress, next to the `served` version.
pub(crate) fn half_written(new: Summary, served: Summary) -> bool {
    new.problems > served.problems || (new.objects == 0 && served.objects > 0)
}

/// One file's reads: the version served and a broken one held back.
#[derive(Debug)]
pub(crate) struct Track<T> {
    /// The stamp seen at the latest look, and when it was first seen.
    seen: Option<(Stamp, Instant)>,
    served: Option<Version<T>>,
    /// A half-written read held back while the good version serves.
    held: Option<Held<T>>,
    /// Bumped whenever what is served changes, so the source knows when to send a new reset.
    version: u64,
}

#[derive(Debug)]
struct Version<T> {
    stamp: Stamp,
    value: T,
    summary: Summary,
    /// Read clean (not half-written): a later broken read is held back for the grace.
    good: bool,
}

#[derive(Debug)]
struct Held<T> {
    stamp: Stamp,
    value: T,
    summary: Summary,
    /// Since when the file has been broken (across several held reads of a long write).
    since: Instant,
}

impl<T> Default for Track<T> {
    fn default() -> Self {
        Self {
            seen: None,
            served: None,
            held: None,
            version: 0,
        }
    }
}

impl<T> Track<T> {
    /// A look at the file: `stamp` as it is now, `age` how old its mtime is.
    pub(crate) fn look(
        &mut self,
        stamp: Stamp,
        age: Duration,
        now: Instant,
        settle: Duration,
    ) -> Look {
        let known = |s: Option<Stamp>| s == Some(stamp);
        if known(self.served.as_ref().map(|v| v.stamp))
            || known(self.held.as_ref().map(|h| h.stamp))
        {
            return Look::Unchanged;
        }
        let since = match self.seen {
            Some((s, since)) if s == stamp => since,
            _ => {
                self.seen = Some((stamp, now));
                now
            }
        };
        let unchanged_for = now.saturating_duration_since(since);
        if age >= settle || unchanged_for >= settle {
            Look::Read
        } else {
            Look::Wait(settle - unchanged_for.max(age))
        }
    }

    /// The read changed under us (its stamp moved while it was read): wait for it to settle.
    pub(crate) fn moved(&mut self, stamp: Stamp, now: Instant) {
        self.seen = Some((stamp, now));
    }

    /// A read of `stamp`: served, or held back if it looks half-written.
    pub(crate) fn offer(
        &mut self,
        stamp: Stamp,
        value: T,
        summary: Summary,
        now: Instant,
        grace: Duration,
    ) {
        let served = self.served.as_ref();
        let broken = served.is_some_and(|v| v.good && half_written(summary, v.summary));
        if !broken {
            self.serve(stamp, value, summary, true);
            return;
        }
        let since = self.held.as_ref().map_or(now, |h| h.since);
        self.held = Some(Held {
            stamp,
            value,
            summary,
            since,
        });
        self.expire(now, grace);
    }

    /// Serves a held read whose grace has run out; returns how long until one does.
    pub(crate) fn expire(&mut self, now: Instant, grace: Duration) -> Option<Duration> {
        let held = self.held.as_ref()?;
        let broken_for = now.saturating_duration_since(held.since);
        if broken_for < grace {
            return Some(grace - broken_for);
        }
        let held = self.held.take().expect("checked above");
        self.serve(held.stamp, held.value, held.summary, false);
        None
    }

    fn serve(&mut self, stamp: Stamp, value: T, summary: Summary, good: bool) {
        self.held = None;
        self.served = Some(Version {
            stamp,
            value,
            summary,
            good,
        });
        self.version += 1;
    }

    /// What is served, if anything.
    pub(crate) fn served(&self) -> Option<&T> {
        self.served.as_ref().map(|v| &v.value)
    }

    pub(crate) fn served_mut(&mut self) -> Option<&mut T> {
        self.served.as_mut().map(|v| &mut v.value)
    }

    /// Whether a read is held back (the file is being written, or broken within its grace).
    pub(crate) fn holding(&self) -> bool {
        self.held.is_some()
    }

    pub(crate) fn version(&self) -> u64 {
        self.version
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTLE: Duration = Duration::from_millis(100);
    const GRACE: Duration = Duration::from_secs(5);
    const MS: Duration = Duration::from_millis(1);

    /// A fake clock: `t(ms)` is that many milliseconds after the start.
    struct Clock(Instant);
    impl Clock {
        fn t(&self, ms: u64) -> Instant {
            self.0 + Duration::from_millis(ms)
        }
    }

    fn stamp(len: u64, mtime_ms: u64) -> Stamp {
        Stamp {
            len,
            modified: SystemTime::UNIX_EPOCH + Duration::from_millis(mtime_ms),
            inode: 7,
        }
    }

    fn good(objects: usize) -> Summary {
        Summary {
            objects,
            problems: 0,
        }
    }

    const BROKEN: Summary = Summary {
        objects: 1,
        problems: 1,
    };

    #[test]
    fn an_old_file_is_read_at_once_and_then_left_alone() {
        let c = Clock(Instant::now());
        let mut t = Track::default();
        let s = stamp(10, 0);
        assert_eq!(
            t.look(s, Duration::from_secs(60), c.t(0), SETTLE),
            Look::Read
        );
        t.offer(s, "v1", good(2), c.t(0), GRACE);
        assert_eq!(t.served(), Some(&"v1"));
        assert_eq!(
            t.look(s, Duration::from_secs(60), c.t(500), SETTLE),
            Look::Unchanged
        );
        assert_eq!(t.version(), 1);
    }

    #[test]
    fn a_fresh_file_is_read_only_once_it_stops_changing() {
        let c = Clock(Instant::now());
        let mut t: Track<&str> = Track::default();
        // Just written: wait.
        assert_eq!(
            t.look(stamp(5, 0), 10 * MS, c.t(0), SETTLE),
            Look::Wait(90 * MS)
        );
        // Grew since: the wait starts again.
        assert_eq!(
            t.look(stamp(9, 40), Duration::ZERO, c.t(40), SETTLE),
            Look::Wait(100 * MS)
        );
        // Unchanged 60 ms later: not yet.
        assert_eq!(
            t.look(stamp(9, 40), 60 * MS, c.t(100), SETTLE),
            Look::Wait(40 * MS)
        );
        // Unchanged for the settle time: read.
        assert_eq!(t.look(stamp(9, 40), 100 * MS, c.t(140), SETTLE), Look::Read);
    }

    #[test]
    fn a_half_written_read_keeps_the_good_version_for_the_grace() {
        let c = Clock(Instant::now());
        let mut t = Track::default();
        t.offer(stamp(10, 0), "good", good(3), c.t(0), GRACE);
        // A rewrite caught half-way: more problems than the good version.
        t.offer(stamp(4, 1000), "half", BROKEN, c.t(1000), GRACE);
        assert_eq!(t.served(), Some(&"good"));
        assert!(t.holding());
        assert_eq!(
            t.look(stamp(4, 1000), GRACE, c.t(1100), SETTLE),
            Look::Unchanged
        );
        assert_eq!(t.expire(c.t(3000), GRACE), Some(Duration::from_secs(3)));
        // Finished within the grace: the new version serves, nothing was reported.
        t.offer(stamp(12, 2000), "new", good(3), c.t(3000), GRACE);
        assert_eq!(t.served(), Some(&"new"));
        assert!(!t.holding());
        assert_eq!(t.expire(c.t(9000), GRACE), None);
        assert_eq!(t.served(), Some(&"new"));
    }

    #[test]
    fn a_file_still_broken_after_the_grace_is_served_broken() {
        let c = Clock(Instant::now());
        let mut t = Track::default();
        t.offer(stamp(10, 0), "good", good(3), c.t(0), GRACE);
        t.offer(stamp(4, 1000), "broken-1", BROKEN, c.t(1000), GRACE);
        // Another broken read: the grace counts from the first.
        t.offer(stamp(5, 3000), "broken-2", BROKEN, c.t(3000), GRACE);
        assert_eq!(t.served(), Some(&"good"));
        assert_eq!(t.expire(c.t(5999), GRACE), Some(MS));
        assert_eq!(t.expire(c.t(6000), GRACE), None);
        assert_eq!(t.served(), Some(&"broken-2"));
        // A broken version is no good version to keep: the next broken read serves at once.
        t.offer(stamp(6, 7000), "broken-3", BROKEN, c.t(7000), GRACE);
        assert_eq!(t.served(), Some(&"broken-3"));
    }

    #[test]
    fn a_file_never_good_is_served_at_once_and_emptying_a_file_is_suspect() {
        let c = Clock(Instant::now());
        let mut t = Track::default();
        t.offer(stamp(4, 0), "broken", BROKEN, c.t(0), GRACE);
        assert_eq!(t.served(), Some(&"broken"));
        assert!(
            half_written(good(0), good(2)),
            "truncated by open(path, 'w')"
        );
        assert!(
            !half_written(good(1), good(2)),
            "an object removed on purpose"
        );
        assert!(half_written(BROKEN, good(1)));
        assert!(
            !half_written(BROKEN, BROKEN),
            "as broken as before is no write in progress"
        );
    }
}
