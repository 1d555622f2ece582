//! One cell in a viewer's view as its delivery keeps it: the version the client holds, and
//! when the cell's level of detail (docs/protocol.md 14.4) lets its changes go next. Apart from
//! `delivery.rs` because it is the rule of when, kept small and tested alone.

use std::time::{Duration, Instant};

use tickwire_fanout::Version;

use super::super::frame::Frame;

/// A cell in a viewer's view, as its delivery keeps it: 40 bytes (a pass reads the cells in view
/// of every due viewer, and with level of detail that may be every cell of the world).
#[derive(Debug, Clone, Copy)]
pub(super) struct Held {
    /// The version of the cell the client holds (`None`: it needs a snapshot).
    pub version: Option<Version>,
    /// With an interval: the pass instant from which the cell may change in an update again.
    /// Counted from the previous one, as the scheduler counts a viewer's due times, so passes
    /// that fall between keep the rate.
    pub next: Instant,
    pub cell: u32,
    /// Level of detail: the cell changes in the viewer's updates at most once per this many
    /// milliseconds on average (0: in every update).
    pub interval_ms: u32,
}

impl Held {
    /// Whether the client lacks the cell's version at `frame`.
    pub fn stale(&self, frame: &Frame) -> bool {
        self.version != Some(frame.cells[self.cell as usize].version)
    }

    /// Whether the cell may change in an update at pass instant `at`: always when the client
    /// needs its snapshot.
    pub fn due(&self, at: Instant) -> bool {
        self.interval_ms == 0 || self.version.is_none() || at >= self.next
    }

    fn interval(&self) -> Duration {
        Duration::from_millis(u64::from(self.interval_ms))
    }

    /// The cell changed in an update at pass instant `at`.
    pub fn sent(&mut self, at: Instant) {
        if self.interval_ms == 0 {
            // Kept, so that a slower band set later counts from this update.
            self.next = at;
            return;
        }
        self.next += self.interval();
        if self.next <= at {
            self.next = at + self.interval();
        }
    }

    /// The cell may change in an update at pass instant `at`, whatever its interval (both
    /// sides of a move go together: `delivery::force_moves`); its interval counts from that
    /// update.
    pub fn force(&mut self, at: Instant) {
        self.next = self.next.min(at);
    }

    /// A new interval, counted from the cell's last update (or at once, if that is sooner).
    pub fn set_interval(&mut self, interval_ms: u32) {
        if interval_ms != self.interval_ms {
            let last = self.next.checked_sub(self.interval());
            self.interval_ms = interval_ms;
            self.next = last.map_or(self.next, |last| last + self.interval());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn held(interval_ms: u32, next: Instant) -> Held {
        Held { version: Some(1), next, cell: 0, interval_ms }
    }

    #[test]
    fn a_cell_goes_once_per_interval_counted_from_the_previous_time() {
        let t0 = Instant::now();
        let mut h = held(100, t0);
        assert!(h.due(t0));
        h.sent(t0 + 20 * MS);
        assert_eq!(h.next, t0 + 100 * MS, "from the previous instant, not the send");
        assert!(!h.due(t0 + 99 * MS) && h.due(t0 + 100 * MS));
        // Sent long after: the next counts from the send.
        h.sent(t0 + 500 * MS);
        assert_eq!(h.next, t0 + 600 * MS);
        // A snapshot needed goes at once.
        h.version = None;
        assert!(h.due(t0));
    }

    #[test]
    fn a_new_interval_counts_from_the_last_update_even_one_of_every_update() {
        let t0 = Instant::now();
        let mut h = held(0, t0);
        assert!(h.due(t0), "interval 0: always");
        h.sent(t0 + 40 * MS);
        // Moved to a slower band right after an update: not again before the new interval.
        h.set_interval(100);
        assert_eq!(h.next, t0 + 140 * MS);
        assert!(!h.due(t0 + 60 * MS));
        // Faster again: from the same last update.
        h.set_interval(50);
        assert_eq!(h.next, t0 + 90 * MS);
    }
}
