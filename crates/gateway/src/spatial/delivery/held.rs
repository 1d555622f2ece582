//! One cell in a viewer's view as its delivery keeps it: the version the client holds, and
//! when the cell's level of detail (docs/protocol.md 14.4) lets its changes go next. Apart from
//! `delivery.rs` because it is the rule of when, kept small and tested alone.
//!
//! A band's turns fall on one grid per viewer: the instants its anchor (when it became a
//! viewer) plus a whole number of intervals. So the cells of a band that keep changing go in
//! the same updates, and an entity that walks between two of them does not need the cell it
//! entered sent out of turn (`delivery/forced.rs`); bands whose intervals divide each other
//! share turns. A cell that had nothing to send at a turn goes as soon as it changes, and is
//! back on the grid after.

use std::time::{Duration, Instant};

use tickwire_fanout::Version;

use super::super::frame::Frame;

/// A cell in a viewer's view, as its delivery keeps it: 40 bytes (a pass reads the cells in view
/// of every due viewer, and with level of detail that may be every cell of the world).
#[derive(Debug, Clone, Copy)]
pub(super) struct Held {
    /// The version of the cell the client holds (`None`: it needs a snapshot).
    pub version: Option<Version>,
    /// With an interval: the band's turn from which the cell may change in an update again.
    /// With none: the last update it changed in.
    pub next: Instant,
    pub cell: u32,
    /// Level of detail: the cell changes in the viewer's updates at most once per this many
    /// milliseconds on average (0: in every update), but when it goes with a cell an entity
    /// left for it.
    pub interval_ms: u32,
}

/// The first of `anchor + k * interval` (k ≥ 0) after `t`.
pub(super) fn turn_after(anchor: Instant, interval: Duration, t: Instant) -> Instant {
    let Some(since) = t.checked_duration_since(anchor) else { return anchor };
    let n = interval.as_nanos().max(1);
    let turns = since.as_nanos() / n + 1;
    let offset = Duration::from_nanos(u64::try_from(turns * n).unwrap_or(u64::MAX));
    // Past what an `Instant` holds only after centuries of turns: then one interval on.
    anchor.checked_add(offset).or_else(|| t.checked_add(interval)).unwrap_or(t)
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

    /// The cell changed in an update at pass instant `at`: it goes next at its band's first
    /// turn after `at`, on the grid from `anchor`. A cell sent out of turn (with a cell an
    /// entity left for it) so keeps its turn.
    pub fn sent(&mut self, at: Instant, anchor: Instant) {
        self.next = if self.interval_ms == 0 { at } else { turn_after(anchor, self.interval(), at) };
    }

    /// A new interval: the cell goes next at the new band's first turn after the old band's
    /// turn before `next` (about its last update; at once if that has passed).
    pub fn set_interval(&mut self, interval_ms: u32, anchor: Instant) {
        if interval_ms == self.interval_ms {
            return;
        }
        let last =
            if self.interval_ms == 0 { Some(self.next) } else { self.next.checked_sub(self.interval()) };
        let last = last.unwrap_or(self.next);
        self.interval_ms = interval_ms;
        self.next = if interval_ms == 0 { last } else { turn_after(anchor, self.interval(), last) };
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
    fn a_cell_goes_at_its_bands_turns_whenever_it_was_sent() {
        let t0 = Instant::now();
        let mut h = held(100, t0);
        assert!(h.due(t0));
        h.sent(t0 + 20 * MS, t0);
        assert_eq!(h.next, t0 + 100 * MS, "the band's next turn, not 100 ms after the send");
        assert!(!h.due(t0 + 99 * MS) && h.due(t0 + 100 * MS));
        // Sent long after (nothing changed for a while): the next turn after the send.
        h.sent(t0 + 530 * MS, t0);
        assert_eq!(h.next, t0 + 600 * MS);
        // On a turn: the one after.
        h.sent(t0 + 600 * MS, t0);
        assert_eq!(h.next, t0 + 700 * MS);
        // Out of turn (an entity came from a cell sent now), before its turn at 800 ms: it
        // keeps that turn.
        h.sent(t0 + 740 * MS, t0);
        assert_eq!(h.next, t0 + 800 * MS);
        // A snapshot needed goes at once.
        h.version = None;
        assert!(h.due(t0));
        assert_eq!(turn_after(t0 + 5 * MS, 100 * MS, t0), t0 + 5 * MS, "before the anchor: the anchor");
    }

    #[test]
    fn a_new_interval_counts_from_the_last_update_on_its_own_grid() {
        let t0 = Instant::now();
        let mut h = held(0, t0);
        assert!(h.due(t0), "interval 0: always");
        h.sent(t0 + 40 * MS, t0);
        assert_eq!(h.next, t0 + 40 * MS, "interval 0 keeps the last update");
        // Moved to a slower band right after an update: its first turn after that update.
        h.set_interval(100, t0);
        assert_eq!(h.next, t0 + 100 * MS);
        assert!(!h.due(t0 + 60 * MS));
        // Slower again, from the same last turn (0 ms): the 500 ms band's first turn after it.
        h.set_interval(500, t0);
        assert_eq!(h.next, t0 + 500 * MS);
        // Faster: the 100 ms band's first turn after the last (0 ms).
        h.set_interval(100, t0);
        assert_eq!(h.next, t0 + 100 * MS);
        // Back to every update: due at once.
        h.set_interval(0, t0);
        assert!(h.due(t0 + MS));
    }
}
