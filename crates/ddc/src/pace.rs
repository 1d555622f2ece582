//! How slow a client may be while the server waits on it: sending a request body, or taking a
//! response. A deadline between pieces alone lets a client that sends one byte just before
//! each deadline hold a connection (and what its request holds) for as long as it likes: the
//! "slow loris" and its reading twin. So a client must also keep up a minimum rate.
//!
//! The rule is a bank of waiting time ([`Pace`]): it starts full at the allowance; the time the
//! server spends waiting on the client is drawn from it; each byte the client moves pays back
//! `1 / bytes_per_s` seconds, up to the allowance. A client that keeps up at the rate never runs
//! out; one that stops outright is cut off after at most the allowance; one that trickles at a
//! fraction `f` of the rate lasts `allowance / (1 - f)`. Time the server spends on its own work
//! (between waits) is not drawn: a slow disk or bucket is not the client's fault.
//!
//! Sans-IO: every method takes `now`, and the callers (`http/body.rs` for request bodies,
//! `serve/paced.rs` for responses) read the clock.

use std::time::Duration;

use tokio::time::Instant;

/// How slow a client may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinRate {
    /// The bytes a second the client must move on average while the server waits on it; 0
    /// sets no rate, only the allowance between pieces.
    pub bytes_per_s: u64,
    /// The most waiting time banked: how long a client that has kept up may then stall
    /// outright.
    pub allowance: Duration,
}

impl std::fmt::Display for MinRate {
    /// As a client breaking it is told: "slower than ...".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let allowance = self.allowance.as_millis();
        match self.bytes_per_s {
            0 => write!(f, "stalled for {allowance} ms"),
            rate => write!(f, "slower than {rate} bytes/s once its {allowance} ms allowance ran out"),
        }
    }
}

impl MinRate {
    /// The waiting time `bytes` pay back.
    fn earned(&self, bytes: u64) -> Duration {
        if self.bytes_per_s == 0 {
            return self.allowance;
        }
        let nanos = u128::from(bytes) * 1_000_000_000 / u128::from(self.bytes_per_s);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

/// `since + wait`, or about thirty years on if that is past what an `Instant` holds (an
/// allowance of "forever").
pub(crate) fn after(since: Instant, wait: Duration) -> Instant {
    since.checked_add(wait).unwrap_or_else(|| since + Duration::from_secs(30 * 365 * 86_400))
}

/// One transfer's bank of waiting time (see the module's comment).
#[derive(Debug, Clone)]
pub struct Pace {
    rate: MinRate,
    /// What is left, not counting the wait under way.
    banked: Duration,
    /// When the wait under way started.
    waiting_since: Option<Instant>,
}

impl Pace {
    /// A transfer that has not started: the whole allowance banked.
    pub fn new(rate: MinRate) -> Pace {
        Pace { rate, banked: rate.allowance, waiting_since: None }
    }

    /// The server waits on the client from `now` (or from when the wait under way started):
    /// when it must have moved by.
    pub fn wait(&mut self, now: Instant) -> Instant {
        let since = *self.waiting_since.get_or_insert(now);
        after(since, self.banked)
    }

    /// The rule it keeps.
    pub fn rate(&self) -> MinRate {
        self.rate
    }

    /// When the wait under way runs out; `None` when the server is not waiting.
    pub fn deadline(&self) -> Option<Instant> {
        self.waiting_since.map(|since| after(since, self.banked))
    }

    /// The client moved `bytes` at `now`: the wait under way (if any) ends and is drawn from
    /// the bank, and the bytes pay back into it.
    pub fn moved(&mut self, now: Instant, bytes: u64) {
        if let Some(since) = self.waiting_since.take() {
            self.banked = self.banked.saturating_sub(now.saturating_duration_since(since));
        }
        self.banked = self.banked.saturating_add(self.rate.earned(bytes)).min(self.rate.allowance);
    }

    /// Whether the wait under way has run out at `now`.
    pub fn is_late(&self, now: Instant) -> bool {
        self.deadline().is_some_and(|deadline| now >= deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: MinRate = MinRate { bytes_per_s: 1000, allowance: Duration::from_secs(10) };

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn a_client_that_stops_outright_lasts_the_allowance() {
        let t0 = Instant::now();
        let mut pace = Pace::new(RATE);
        assert_eq!(pace.deadline(), None, "not waiting");
        assert_eq!(pace.wait(t0), t0 + secs(10.0));
        assert_eq!(pace.wait(t0 + secs(3.0)), t0 + secs(10.0), "the same wait");
        assert!(!pace.is_late(t0 + secs(9.9)));
        assert!(pace.is_late(t0 + secs(10.0)));
    }

    #[test]
    fn keeping_up_at_the_rate_never_runs_out() {
        let t0 = Instant::now();
        let mut pace = Pace::new(RATE);
        // 100 bytes every 0.1 s (exactly the rate) for 100 s.
        for i in 0..1000u32 {
            let now = t0 + secs(0.1) * i;
            pace.wait(now);
            pace.moved(now + secs(0.1), 100);
        }
        assert_eq!(pace.wait(t0 + secs(100.0)), t0 + secs(110.0), "the whole allowance left");
    }

    #[test]
    fn a_trickle_at_a_fraction_of_the_rate_lasts_the_allowance_over_one_minus_it() {
        let t0 = Instant::now();
        let mut pace = Pace::new(RATE);
        // 1 byte a second: a thousandth of the rate; the bank drains 0.999 s a second.
        let mut now = t0;
        let mut cut_at = None;
        for _ in 0..20 {
            let deadline = pace.wait(now);
            if deadline <= now + secs(1.0) {
                cut_at = Some(deadline);
                break;
            }
            now += secs(1.0);
            pace.moved(now, 1);
        }
        let cut_at = cut_at.expect("cut off");
        let lasted = cut_at - t0;
        assert!(lasted > secs(10.0) && lasted < secs(10.02), "{lasted:?}");
        // A deadline between pieces alone (rate 0) would never cut this client off.
        let mut stall_only = Pace::new(MinRate { bytes_per_s: 0, ..RATE });
        for i in 0..100u32 {
            let now = t0 + secs(9.0) * i;
            assert!(!stall_only.is_late(now));
            stall_only.wait(now);
            stall_only.moved(now + secs(9.0), 1);
        }
    }

    #[test]
    fn a_burst_banks_no_more_than_the_allowance() {
        let t0 = Instant::now();
        let mut pace = Pace::new(RATE);
        pace.wait(t0);
        pace.moved(t0 + secs(1.0), 1 << 30);
        assert_eq!(pace.wait(t0 + secs(1.0)), t0 + secs(11.0));
    }

    #[test]
    fn only_waiting_time_is_drawn() {
        let t0 = Instant::now();
        let mut pace = Pace::new(RATE);
        pace.wait(t0);
        pace.moved(t0 + secs(4.0), 0);
        // The server's own work for an hour: nothing drawn.
        let later = t0 + secs(3600.0);
        assert_eq!(pace.wait(later), later + secs(6.0));
        // A client moving at half the rate while waited on: drains half as fast as a stall.
        pace.moved(later + secs(2.0), 1000);
        assert_eq!(pace.wait(later + secs(2.0)), later + secs(2.0) + secs(5.0));
    }

    #[test]
    fn huge_counts_and_rates_do_not_overflow() {
        let t0 = Instant::now();
        let mut pace = Pace::new(MinRate { bytes_per_s: 1, allowance: Duration::MAX / 4 });
        pace.wait(t0);
        pace.moved(t0, u64::MAX);
        pace.moved(t0, u64::MAX);
        assert_eq!(pace.deadline(), None);
        assert!(pace.wait(t0) > t0 + secs(1e8), "no panic past what an Instant holds");
        let mut fast = Pace::new(MinRate { bytes_per_s: u64::MAX, allowance: secs(1.0) });
        fast.wait(t0);
        fast.moved(t0 + secs(0.5), 1);
        assert_eq!(fast.wait(t0 + secs(0.5)), t0 + secs(1.0), "a byte at that rate earns ~nothing");
    }
}
