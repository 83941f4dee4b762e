//! The per-decision meter the instruction hook and the library's guards share: instructions
//! counted against the budget, and the wall-clock deadline.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The hook fires every this many VM instructions. Smaller catches the wall clock sooner after
/// a run of expensive C calls (a 16 MiB concatenation is one instruction); larger costs less:
/// each firing is a Rust call (about 50 ns), so 128 adds well under 1 ns per instruction.
pub(crate) const HOOK_EVERY: u32 = 128;

/// Which limit stopped a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Trip {
    Instructions,
    Time,
}

/// Shared by the hook closure and the guards (both `'static + Send`, hence atomics; only the
/// thread holding the script's lock ever touches it).
#[derive(Debug)]
pub(crate) struct Meter {
    /// What `deadline` counts from.
    epoch: Instant,
    /// Instructions run in this decision (in steps of [`HOOK_EVERY`]).
    used: AtomicU64,
    /// The decision's budget; 0 between decisions, so that nothing runs then.
    budget: AtomicU64,
    /// Nanoseconds after `epoch` at which the decision is out of time.
    deadline: AtomicU64,
    /// 0: running; else the [`Trip`] that stopped it (sticky until the next decision, so that
    /// every later hook firing and every `pcall` raises again).
    tripped: AtomicU8,
}

impl Meter {
    pub(crate) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            used: AtomicU64::new(0),
            budget: AtomicU64::new(0),
            deadline: AtomicU64::new(0),
            tripped: AtomicU8::new(0),
        }
    }

    /// A decision starts: a fresh budget and deadline.
    pub(crate) fn start(&self, instructions: u64, time: Duration) {
        self.used.store(0, Relaxed);
        self.budget.store(instructions, Relaxed);
        let deadline = self.epoch.elapsed().saturating_add(time);
        self.deadline.store(
            u64::try_from(deadline.as_nanos()).unwrap_or(u64::MAX),
            Relaxed,
        );
        self.tripped.store(0, Relaxed);
    }

    /// The budget starts over (the deadline stays): what ran so far was the sandbox's own work.
    pub(crate) fn restart_count(&self) {
        self.used.store(0, Relaxed);
    }

    /// The decision is over: no instruction may run until the next one starts.
    pub(crate) fn stop(&self) {
        self.budget.store(0, Relaxed);
    }

    /// Instructions the decision ran (to the hook's granularity).
    #[cfg(test)]
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Relaxed)
    }

    /// The hook fired: `n` more instructions ran. Err once the budget or the time is spent.
    pub(crate) fn tick(&self, n: u64) -> Result<(), Trip> {
        if let Some(trip) = self.tripped() {
            return Err(trip);
        }
        let used = self.used.fetch_add(n, Relaxed) + n;
        if used > self.budget.load(Relaxed) {
            return Err(self.trip(Trip::Instructions));
        }
        self.check_time()
    }

    /// Err once the decision is past its deadline (or already stopped).
    pub(crate) fn check_time(&self) -> Result<(), Trip> {
        if let Some(trip) = self.tripped() {
            return Err(trip);
        }
        let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        if now > self.deadline.load(Relaxed) {
            return Err(self.trip(Trip::Time));
        }
        Ok(())
    }

    pub(crate) fn tripped(&self) -> Option<Trip> {
        match self.tripped.load(Relaxed) {
            0 => None,
            1 => Some(Trip::Instructions),
            _ => Some(Trip::Time),
        }
    }

    fn trip(&self, trip: Trip) -> Trip {
        let code = match trip {
            Trip::Instructions => 1,
            Trip::Time => 2,
        };
        // The first limit hit is the one reported.
        let _ = self.tripped.compare_exchange(0, code, Relaxed, Relaxed);
        self.tripped().unwrap_or(trip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_trips_and_stays_tripped() {
        let m = Meter::new();
        m.start(300, Duration::from_secs(60));
        assert_eq!(m.tick(128), Ok(()));
        assert_eq!(m.tick(128), Ok(()));
        assert_eq!(m.tick(128), Err(Trip::Instructions));
        // Sticky: the time check reports the same trip.
        assert_eq!(m.check_time(), Err(Trip::Instructions));
        // A new decision starts clean.
        m.start(300, Duration::from_secs(60));
        assert_eq!(m.tripped(), None);
        assert_eq!(m.tick(128), Ok(()));
    }

    #[test]
    fn deadline_trips() {
        let m = Meter::new();
        m.start(u64::MAX, Duration::ZERO);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(m.check_time(), Err(Trip::Time));
        assert_eq!(m.tick(1), Err(Trip::Time));
    }

    #[test]
    fn nothing_runs_between_decisions() {
        let m = Meter::new();
        m.start(1000, Duration::from_secs(60));
        m.stop();
        assert_eq!(m.tick(1), Err(Trip::Instructions));
    }
}
