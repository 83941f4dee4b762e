//! A token bucket for new streams (xDS clients, agents): a reconnect storm is admitted at a
//! bounded rate instead of starving the streams already connected. Pure: the clock is passed
//! in.

use std::time::{Duration, Instant};

/// Up to `per_second` new streams a second, and as many at once after a quiet second.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    per_second: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(per_second: u32, now: Instant) -> Self {
        let per_second = f64::from(per_second.max(1));
        Self {
            per_second,
            tokens: per_second,
            last: now,
        }
    }

    /// Takes a token now, or the next one nobody has reserved: how long until it is the
    /// caller's (zero: now). A storm's waiters each sleep once until their own slot, in the
    /// order they asked, instead of all waking for every token and all but one going back to
    /// sleep.
    pub fn reserve(&mut self, now: Instant) -> Duration {
        self.refill(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.per_second)
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.per_second);
        self.last = now.max(self.last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_a_seconds_worth_then_the_rate() {
        let t = Instant::now();
        let mut bucket = TokenBucket::new(10, t);
        assert!((0..10).all(|_| bucket.reserve(t).is_zero()));
        assert_eq!(
            bucket.reserve(t),
            Duration::from_millis(100),
            "the eleventh waits"
        );
        // Its slot taken, the next token is a tenth of a second after that.
        assert_eq!(
            bucket.reserve(t + Duration::from_millis(100)),
            Duration::from_millis(100)
        );
        // Five quiet seconds later: ten at once again, and no more.
        let later = t + Duration::from_secs(5);
        assert_eq!(
            (0..20).filter(|_| bucket.reserve(later).is_zero()).count(),
            10
        );
    }

    #[test]
    fn reservations_give_each_of_a_storm_its_own_slot_in_order() {
        let t = Instant::now();
        let mut bucket = TokenBucket::new(50, t);
        let waits: Vec<Duration> = (0..1000).map(|_| bucket.reserve(t)).collect();
        // The first second's worth at once, then one every 20 ms, in the order asked.
        assert!(waits[..50].iter().all(Duration::is_zero));
        for (k, wait) in waits.iter().enumerate().skip(50) {
            let expected = (k as f64 - 49.0) / 50.0;
            assert!(
                (wait.as_secs_f64() - expected).abs() < 1e-9,
                "{k}: {wait:?}"
            );
        }
        // Once the reserved slots have passed, the bucket refills as if nobody had asked.
        let after = t + Duration::from_secs(19) + Duration::from_secs(1);
        assert_eq!(bucket.reserve(after), Duration::ZERO);
        assert_eq!(
            bucket.reserve(after + Duration::from_secs(1)),
            Duration::ZERO
        );
    }
}
