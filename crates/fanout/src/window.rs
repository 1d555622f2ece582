//! How much channel state one session may have in flight: queued, or sent and not yet
//! acknowledged by the client.
//!
//! It exists because a full outbox is the wrong signal for a slow reader. The kernel's socket
//! buffers take updates long after a client stopped keeping up, so updates queued one by one
//! grow older and older, and the session's unacknowledged window, not the outbox, fills and ends
//! the session. Channel state does not need that: an update held back now is merged into the
//! next one. So each session has a [`Window`] of channel updates in flight, sized from the rate
//! at which the client drains them, and the channel actors offer an update only while the
//! window has room. A client that reads slowly then gets merged deltas at the pace it reads,
//! each about `target` old at most; a frozen one gets nothing more until it reads; and one
//! that comes back after a dropped connection gets one merged delta per channel, because the
//! updates it never received are dropped on resume and each channel is told to *rewind* to the
//! version its replica really holds ([`Window::resume`]).
//!
//! The size: every acknowledged update yields a *delivery-rate sample*, the bytes the client
//! acknowledged while that update was in flight divided by how long it was in flight. The
//! estimate is a moving average of the samples, and the window is the estimate times `target`,
//! clamped to `[min_bytes, max_bytes]`. The samples measure what the client took, not what the
//! link could carry, so an idle stream does not shrink the window (no samples) and a client
//! that reads fast lets it grow at each acknowledgement. An update is offered while the bytes
//! in flight are *below* the window, so one larger than the window still goes out once the
//! earlier ones are acknowledged: nothing starves.
//!
//! Like the scheduler, this is a pure state machine: every method that depends on time takes
//! `now`, and both the gateway and the simulations drive it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::Version;

/// Bounds of a [`Window`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowLimits {
    /// How long an update may wait in flight behind the others: the window holds what the
    /// client drains in this time.
    pub target: Duration,
    /// The window never shrinks below this many bytes.
    pub min_bytes: usize,
    /// The window before the first acknowledgement gives a rate.
    pub initial_bytes: usize,
    /// The window never grows past this many bytes: what one session's channel updates may hold
    /// in memory.
    pub max_bytes: usize,
    /// At most this many updates in flight, whatever their size.
    pub max_messages: usize,
}

impl Default for WindowLimits {
    fn default() -> Self {
        WindowLimits {
            target: Duration::from_millis(250),
            min_bytes: 1024,
            initial_bytes: 4096,
            max_bytes: 512 * 1024,
            max_messages: 512,
        }
    }
}

#[derive(Debug, Clone)]
struct Entry<C> {
    /// `None` once the channel no longer needs to hear about it (see [`Window::forget`]).
    channel: Option<C>,
    from: Option<Version>,
    bytes: usize,
    queued: Instant,
    /// The session sequence number it went out with; 0 while it waits in the outbox.
    seq: u64,
    /// `delivered` when it was queued: the rate sample is what was delivered since.
    delivered_before: u64,
    /// When the acknowledgement that brought `delivered` to that value came (or `queued`).
    delivered_at: Instant,
}

/// One session's channel updates in flight, keyed by channel `C`.
#[derive(Debug, Clone)]
pub struct Window<C> {
    limits: WindowLimits,
    /// Oldest first: the order they were queued, which is the order they are sent.
    entries: VecDeque<Entry<C>>,
    bytes: usize,
    /// Entries at the front that have a sequence number.
    sent: usize,
    /// Bytes of channel updates acknowledged since the start, and when the last of them was
    /// (before the first acknowledgement: when the first update was queued).
    delivered: u64,
    delivered_at: Option<Instant>,
    /// Estimated delivery rate in bytes per second, once there is a sample.
    rate: Option<f64>,
    /// Channels whose undelivered updates were dropped on a resume, with the version their
    /// subscriber's replica holds (`None`: it needs a snapshot).
    rewinds: Vec<(C, Option<Version>)>,
}

impl<C: Copy + Eq> Window<C> {
    pub fn new(limits: WindowLimits) -> Self {
        Window {
            limits,
            entries: VecDeque::new(),
            bytes: 0,
            sent: 0,
            delivered: 0,
            delivered_at: None,
            rate: None,
            rewinds: Vec::new(),
        }
    }

    /// The window in bytes: what the client drains in `target` at its estimated rate.
    pub fn limit(&self) -> usize {
        let WindowLimits { target, min_bytes, initial_bytes, max_bytes, .. } = self.limits;
        let bytes = match self.rate {
            Some(rate) => (rate * target.as_secs_f64()) as usize,
            None => initial_bytes,
        };
        bytes.clamp(min_bytes, max_bytes.max(min_bytes))
    }

    /// Whether one more update may be queued now.
    pub fn has_room(&self) -> bool {
        self.entries.len() < self.limits.max_messages && self.bytes < self.limit()
    }

    /// Updates and bytes in flight.
    pub fn in_flight(&self) -> (usize, usize) {
        (self.entries.len(), self.bytes)
    }

    /// When the oldest update in flight was queued.
    pub fn oldest(&self) -> Option<Instant> {
        self.entries.front().map(|e| e.queued)
    }

    /// The estimated delivery rate in bytes per second, once an acknowledgement gave one.
    pub fn rate(&self) -> Option<f64> {
        self.rate
    }

    /// An update of `bytes` for `channel`, from version `from` (`None`: a snapshot), was queued
    /// to the session at `now`.
    pub fn queued(&mut self, now: Instant, channel: C, from: Option<Version>, bytes: usize) {
        let delivered_at = *self.delivered_at.get_or_insert(now);
        self.entries.push_back(Entry {
            channel: Some(channel),
            from,
            bytes,
            queued: now,
            seq: 0,
            delivered_before: self.delivered,
            delivered_at,
        });
        self.bytes += bytes;
    }

    /// The oldest update still waiting in the outbox went out with sequence number `seq`.
    /// Returns `false` if none was waiting.
    pub fn sent(&mut self, seq: u64) -> bool {
        let Some(entry) = self.entries.get_mut(self.sent) else { return false };
        entry.seq = seq;
        self.sent += 1;
        true
    }

    /// The client acknowledged everything up to sequence number `ack`, seen at `now`.
    pub fn acked(&mut self, now: Instant, ack: u64) {
        while self.sent > 0 && self.entries.front().is_some_and(|e| e.seq <= ack) {
            let entry = self.entries.pop_front().expect("checked above");
            self.sent -= 1;
            self.bytes -= entry.bytes;
            self.delivered += entry.bytes as u64;
            // Everything acknowledged while this one was in flight, itself included, over the
            // longer of the time it was in flight and the time since the acknowledgement before
            // it was queued: one acknowledgement covering many updates (clients acknowledge
            // every 100 ms or so) is not a burst of speed. At least a millisecond.
            let elapsed = now
                .saturating_duration_since(entry.queued)
                .max(now.saturating_duration_since(entry.delivered_at))
                .max(Duration::from_millis(1));
            let sample = (self.delivered - entry.delivered_before) as f64 / elapsed.as_secs_f64();
            self.rate = Some(match self.rate {
                Some(rate) => rate + (sample - rate) / 4.0,
                None => sample,
            });
        }
        self.delivered_at = Some(now);
    }

    /// The connection was replaced and the client holds every message up to `delivered`. The
    /// session drops the channel updates after that instead of resending them, and so does the
    /// caller with those still in the outbox; this forgets them all, and records for each
    /// channel the version its replica holds: the `from` of its first dropped update.
    pub fn resume(&mut self, delivered: u64) {
        self.acked_without_sample(delivered);
        for entry in self.entries.drain(..) {
            let Some(channel) = entry.channel else { continue };
            if !self.rewinds.iter().any(|(c, _)| *c == channel) {
                self.rewinds.push((channel, entry.from));
            }
        }
        self.bytes = 0;
        self.sent = 0;
    }

    /// Acknowledged by a resume handshake: no rate sample, the time includes the outage.
    fn acked_without_sample(&mut self, ack: u64) {
        while self.sent > 0 && self.entries.front().is_some_and(|e| e.seq <= ack) {
            let entry = self.entries.pop_front().expect("checked above");
            self.sent -= 1;
            self.bytes -= entry.bytes;
            self.delivered += entry.bytes as u64;
        }
    }

    /// Whether some channel has a rewind to pick up.
    pub fn has_rewinds(&self) -> bool {
        !self.rewinds.is_empty()
    }

    /// Whether `channel` has a rewind to pick up.
    pub fn has_rewind(&self, channel: C) -> bool {
        self.rewinds.iter().any(|(c, _)| *c == channel)
    }

    /// The version `channel`'s subscriber really holds after a resume dropped updates to it:
    /// `Some(None)` means a snapshot; `None` means nothing was dropped.
    pub fn take_rewind(&mut self, channel: C) -> Option<Option<Version>> {
        let at = self.rewinds.iter().position(|(c, _)| *c == channel)?;
        Some(self.rewinds.swap_remove(at).1)
    }

    /// `channel` starts a new subscription (or ends one): its updates still in flight keep
    /// their bytes until acknowledged, but no longer lead to a rewind.
    pub fn forget(&mut self, channel: C) {
        for entry in &mut self.entries {
            if entry.channel == Some(channel) {
                entry.channel = None;
            }
        }
        self.rewinds.retain(|(c, _)| *c != channel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn limits() -> WindowLimits {
        WindowLimits {
            target: 250 * MS,
            min_bytes: 1000,
            initial_bytes: 4000,
            max_bytes: 100_000,
            max_messages: 8,
        }
    }

    #[test]
    fn room_until_the_initial_window_is_full_and_one_may_overshoot() {
        let t = Instant::now();
        let mut w = Window::<u32>::new(limits());
        assert!(w.has_room());
        w.queued(t, 1, None, 3999);
        assert!(w.has_room(), "below the window: one more may go, whatever its size");
        w.queued(t, 1, Some(1), 10_000);
        assert!(!w.has_room());
        assert_eq!(w.in_flight(), (2, 13_999));
    }

    #[test]
    fn acknowledgements_free_the_window_and_measure_the_rate() {
        let t = Instant::now();
        let mut w = Window::<u32>::new(limits());
        w.queued(t, 1, None, 2000);
        w.queued(t, 1, Some(1), 2000);
        assert!(w.sent(1));
        assert!(w.sent(2));
        assert!(!w.sent(3), "nothing else waits");
        // Both acknowledged 100 ms later: 4000 bytes in 100 ms is 40 kB/s, a 10 kB window.
        w.acked(t + 100 * MS, 2);
        assert_eq!(w.in_flight(), (0, 0));
        let rate = w.rate().unwrap();
        assert!((20_000.0..=40_000.0).contains(&rate), "{rate}");
        assert!(w.limit() >= 5000);
    }

    #[test]
    fn a_slow_reader_shrinks_the_window_to_its_pace() {
        let t = Instant::now();
        let mut w = Window::<u32>::new(limits());
        // 400 bytes acknowledged every 100 ms: 4 kB/s, so 1 kB in 250 ms (the floor).
        let mut seq = 0;
        for i in 0..40u32 {
            let now = t + 100 * MS * i;
            w.queued(now, 1, Some(u64::from(i)), 400);
            seq += 1;
            w.sent(seq);
            w.acked(now + 100 * MS, seq);
        }
        let rate = w.rate().unwrap();
        assert!((3_000.0..=5_000.0).contains(&rate), "{rate}");
        assert_eq!(w.limit(), 1000);
    }

    #[test]
    fn the_message_cap_holds_whatever_the_bytes() {
        let t = Instant::now();
        let mut w = Window::<u32>::new(limits());
        for _ in 0..8 {
            w.queued(t, 1, None, 1);
        }
        assert!(!w.has_room());
    }

    #[test]
    fn resume_drops_what_the_client_lacks_and_rewinds_each_channel_once() {
        let t = Instant::now();
        let mut w = Window::<u32>::new(limits());
        // Channel 1: 0 -> 1 (seq 1, delivered), 1 -> 2 (seq 3), 2 -> 3 (in the outbox).
        // Channel 2: snapshot (seq 2, not delivered).
        w.queued(t, 1, Some(0), 10);
        w.queued(t, 2, None, 10);
        w.queued(t, 1, Some(1), 10);
        w.queued(t, 1, Some(2), 10);
        for seq in 1..=3 {
            w.sent(seq);
        }
        w.resume(1);
        assert_eq!(w.in_flight(), (0, 0));
        assert!(w.has_rewinds());
        assert_eq!(w.take_rewind(2), Some(None), "its snapshot never arrived");
        assert_eq!(w.take_rewind(1), Some(Some(1)));
        assert_eq!(w.take_rewind(1), None);
        assert!(!w.has_rewinds());
        assert!(w.has_room());
    }

    #[test]
    fn a_forgotten_channel_is_not_rewound() {
        let t = Instant::now();
        let mut w = Window::<u32>::new(limits());
        w.queued(t, 1, Some(4), 10);
        w.forget(1);
        w.queued(t, 1, None, 10);
        w.resume(0);
        assert_eq!(w.take_rewind(1), Some(None), "the new subscription's snapshot, not version 4");
    }
}
