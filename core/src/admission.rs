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

    /// Takes a token (None), or says how long until one is there.
    pub fn take(&mut self, now: Instant) -> Option<Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.per_second);
        self.last = now.max(self.last);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return None;
        }
        Some(Duration::from_secs_f64(
            (1.0 - self.tokens) / self.per_second,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_a_seconds_worth_then_the_rate() {
        let t = Instant::now();
        let mut bucket = TokenBucket::new(10, t);
        assert_eq!((0..10).filter(|_| bucket.take(t).is_none()).count(), 10);
        let wait = bucket.take(t).expect("the eleventh waits");
        assert_eq!(wait, Duration::from_millis(100));
        // A tenth of a second later, one more; a second later, ten more and no more.
        assert!(bucket.take(t + Duration::from_millis(100)).is_none());
        let later = t + Duration::from_secs(5);
        assert_eq!((0..20).filter(|_| bucket.take(later).is_none()).count(), 10);
    }

    #[test]
    fn a_thousand_at_once_are_spread_over_the_seconds_the_rate_says() {
        let t = Instant::now();
        let mut bucket = TokenBucket::new(100, t);
        let mut now = t;
        let mut admitted = 0;
        while admitted < 1000 {
            match bucket.take(now) {
                None => admitted += 1,
                Some(wait) => now += wait,
            }
        }
        let spread = now.duration_since(t).as_secs_f64();
        assert!((8.9..=9.1).contains(&spread), "{spread}");
    }
}
