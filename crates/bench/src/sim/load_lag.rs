//! How late the bots' threads run. On a machine shared with the gateway, a step can fail
//! because the load could not keep up: its bots read late, the gateway's window merges what it
//! could not send, and the clients' rates drop. A probe on each bot thread, due every
//! [`PROBE_EVERY`], records how long after its due time it ran, every due tick counted (after a
//! stall, the ticks it missed run at once, each with its own lateness). The step reports the
//! quantiles, so a reader can tell a starved load from a slow gateway.
//!
//! Late means any of: the thread waited for a core (the gateway, at a higher priority, had
//! both), it was busy with the bots ready before the probe (each world pass wakes every bot of
//! the thread at once), or the timer's 1 ms rounding. All of them delay what the bots read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::bots::BotStats;

/// How often the probe is due.
pub const PROBE_EVERY: Duration = Duration::from_millis(10);

/// Records the lateness of a tick due every [`PROBE_EVERY`] into `stats.load_lag_us`, until
/// `stop`.
pub async fn probe(stats: Arc<BotStats>, stop: CancellationToken) {
    // The default missed-tick behaviour (burst) runs every due tick: none is skipped.
    let mut ticks = tokio::time::interval(PROBE_EVERY);
    let stopped = tickwire_transport::when_woken(stop.cancelled_owned());
    tokio::pin!(stopped);
    loop {
        let due = tokio::select! {
            biased;
            () = &mut stopped => return,
            due = ticks.tick() => due.into_std(),
        };
        let late = Instant::now().saturating_duration_since(due);
        stats.load_lag_us.record(&[late.as_micros() as u64]);
    }
}

/// Starts a probe on each runtime.
pub fn start(runtimes: &[tokio::runtime::Handle], stats: &Arc<BotStats>, stop: &CancellationToken) {
    for runtime in runtimes {
        runtime.spawn(probe(stats.clone(), stop.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_thread_shows_every_missed_tick_as_lateness() {
        let runtimes = tickwire_transport::io_threads(1, "lag-test").unwrap();
        let (stats, stop) = (Arc::new(BotStats::default()), CancellationToken::new());
        let probe = runtimes[0].spawn(probe(stats.clone(), stop.clone()));
        // Let a few ticks run, then block the probe's thread for 60 ms.
        std::thread::sleep(Duration::from_millis(50));
        runtimes[0].spawn(async { std::thread::sleep(Duration::from_millis(60)) });
        std::thread::sleep(Duration::from_millis(150));
        stop.cancel();
        // The probe has recorded its last tick before the figures are read.
        let waiter = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        waiter.block_on(probe).unwrap();
        let lag = stats.load_lag_us.take();
        assert!(lag.len() >= 10, "the probe ran: {} ticks", lag.len());
        // The ticks due during the block all ran when it ended, each with its own lateness
        // (about 50, 40, 30, 20 and 10 ms): none is skipped.
        let late = lag
            .iter_recorded()
            .filter(|v| v.value_iterated_to() >= 9_000)
            .map(|v| v.count_at_value())
            .sum::<u64>();
        assert!(late >= 4, "{late} ticks at least 9 ms late");
        assert!(lag.max() >= 45_000, "max lateness {} µs", lag.max());
    }
}
