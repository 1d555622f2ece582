//! A token bucket per connection: sustained messages per second plus a burst.

use std::time::Instant;

#[derive(Debug)]
pub(crate) struct TokenBucket {
    per_second: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub(crate) fn new(per_second: u32, burst: u32, now: Instant) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket { per_second: f64::from(per_second), burst, tokens: burst, last: now }
    }

    /// Takes one token; false when the bucket is empty.
    pub(crate) fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn burst_then_sustained_rate() {
        let t = Instant::now();
        let mut bucket = TokenBucket::new(10, 3, t);
        assert!((0..3).all(|_| bucket.take(t)));
        assert!(!bucket.take(t));
        assert!(bucket.take(t + Duration::from_millis(100)));
        assert!(!bucket.take(t + Duration::from_millis(100)));
        // Refill never exceeds the burst.
        let later = t + Duration::from_secs(60);
        assert!((0..3).all(|_| bucket.take(later)));
        assert!(!bucket.take(later));
    }
}
