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
//! acknowledged while that update was in flight divided by how long it was in flight, and a
//! *flight time*, from queued to acknowledged. The rate is the largest sample of the last second
//! or two (a dip, such as a drain below, does not shrink it; a client that slows down shows in
//! a second or two); the
//! base flight time is the least one seen lately (the link's round trip and the client's
//! acknowledgement delay, without queueing), as BBR keeps its minimum round trip. The window
//! is the rate times (base flight time + acknowledgement delay + `target`), clamped to
//! `[min_bytes, max_bytes]`: what the client drains while an update crosses the link and is
//! acknowledged, plus `target` of queueing. So a client that keeps up is never held back, however far away it is, and one
//! that does not gets updates at most about `target` behind: besides the bytes, an update is
//! held while the oldest one in flight has waited longer than the base flight time, the
//! acknowledgement delay and `target`. The samples measure what the
//! client took, not what the link could carry, so an idle stream does not shrink the window
//! (no samples) and a client that reads fast lets it grow at each acknowledgement. An update
//! is offered while the bytes in flight are *below* the window, so one larger than the window
//! still goes out once the earlier ones are acknowledged; and one that would take the bytes
//! in flight past `max_bytes` goes alone, the others waiting for it ([`Window::admits`]):
//! nothing starves.
//!
//! Like the scheduler, this is a pure state machine: every method that depends on time takes
//! `now`, and both the gateway and the simulations drive it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::Version;

/// The delivery rate is the largest sample of the current and the previous epoch this long.
const RATE_EPOCH: Duration = Duration::from_secs(1);

/// How long a base flight time stands without a fresh measurement. Past it, the window drains
/// once so that the next update travels alone and measures it again (BBR's PROBE_RTT): a
/// client that keeps up pays one update held back for one flight, every this often.
const BASE_FLIGHT_MEMORY: Duration = Duration::from_secs(10);

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
    /// The clients' acknowledgement delay: a flight time may exceed the base by this much
    /// without any queueing (the acknowledgement waited for company).
    pub ack_delay: Duration,
}

impl Default for WindowLimits {
    fn default() -> Self {
        WindowLimits {
            target: Duration::from_millis(150),
            min_bytes: 1024,
            initial_bytes: 1024,
            max_bytes: 512 * 1024,
            max_messages: 512,
            ack_delay: Duration::from_millis(200),
        }
    }
}

/// Why [`Window::room`] holds an update back. Counted apart, so that a figure of updates held
/// back says which bound held them. When several hold at once, the first in this order is
/// named: `Probe`, `Large`, `Overdue`, `Messages`, `Bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Hold {
    /// The base flight time is stale: the window drains so that the next update travels alone
    /// and measures it again (the module comment).
    Probe,
    /// The oldest update in flight has waited longer than the base flight time, the
    /// acknowledgement delay and `target`.
    Overdue,
    /// `max_messages` updates are in flight.
    Messages,
    /// The bytes in flight reached the window ([`Window::limit`]).
    Bytes,
    /// An update too large to join those in flight waits for them to drain.
    Large,
}

impl Hold {
    /// Every reason, in the order of [`Hold::index`].
    pub const ALL: [Hold; 5] = [Hold::Probe, Hold::Overdue, Hold::Messages, Hold::Bytes, Hold::Large];

    /// A short name, as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Hold::Probe => "probe",
            Hold::Overdue => "overdue",
            Hold::Messages => "messages",
            Hold::Bytes => "bytes",
            Hold::Large => "large",
        }
    }

    /// Its place in [`Hold::ALL`], for an array of counters.
    pub fn index(self) -> usize {
        self as usize
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
    /// Nothing else was in flight when it was queued: its flight time is a clean measure of
    /// the base flight time, with no queue ahead of it.
    alone: bool,
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
    /// The front entry's `queued` and `alone`, copied here ([`Window::front`]):
    /// [`Window::room`], which a fan-out pass calls for every subscriber from its own thread,
    /// then reads no entry (in release builds), only the window's own fields. The front
    /// entry's cache line was last written by the session's thread when it sent the update, so
    /// reading it was most of `room`'s time in a profile of the spatial world's pass.
    oldest: Option<(Instant, bool)>,
    bytes: usize,
    /// Entries at the front that have a sequence number.
    sent: usize,
    /// Bytes of channel updates acknowledged since the start, and when the last of them was
    /// (before the first acknowledgement: when the first update was queued).
    delivered: u64,
    delivered_at: Option<Instant>,
    /// The largest delivery-rate sample (bytes per second) of the previous and the current
    /// epoch of [`RATE_EPOCH`], and when the current one began.
    rate_max: [Option<f64>; 2],
    epoch: Option<Instant>,
    /// The base flight time, and when it was last measured by an update that travelled alone.
    base_flight: Option<(Duration, Instant)>,
    /// An update too large to join those in flight waits for them to drain; nothing else is
    /// admitted meanwhile.
    large_waiting: bool,
    /// The window held an update back since the base flight time was last measured.
    limited: bool,
    /// Channels whose undelivered updates were dropped on a resume, with the version their
    /// subscriber's replica holds (`None`: it needs a snapshot).
    rewinds: Vec<(C, Option<Version>)>,
}

impl<C: Copy + Eq> Window<C> {
    pub fn new(limits: WindowLimits) -> Self {
        Window {
            limits,
            entries: VecDeque::new(),
            oldest: None,
            bytes: 0,
            sent: 0,
            delivered: 0,
            delivered_at: None,
            rate_max: [None, None],
            epoch: None,
            base_flight: None,
            large_waiting: false,
            limited: false,
            rewinds: Vec::new(),
        }
    }

    /// The window in bytes: what the client drains at its estimated rate in the base flight
    /// time plus `target`.
    pub fn limit(&self) -> usize {
        let WindowLimits { target, min_bytes, initial_bytes, max_bytes, .. } = self.limits;
        // A client that keeps up still has up to one acknowledgement delay's worth more in
        // flight than the base (its acknowledgement waits for company).
        let base = self.base_flight.map_or(Duration::ZERO, |(d, _)| d) + self.limits.ack_delay;
        let bytes = match self.rate() {
            Some(rate) => (rate * (base + target).as_secs_f64()) as usize,
            None => initial_bytes,
        };
        bytes.clamp(min_bytes, max_bytes.max(min_bytes))
    }

    /// The base flight time (see the module comment), once there is a sample.
    pub fn base_flight(&self) -> Option<Duration> {
        self.base_flight.map(|(d, _)| d)
    }

    /// Whether one more update may be queued at `now`.
    pub fn has_room(&mut self, now: Instant) -> bool {
        self.room(now).is_ok()
    }

    /// [`Window::has_room`], saying which bound holds the update back when one does (the first
    /// that holds, in the order of [`Hold`]'s documentation).
    pub fn room(&mut self, now: Instant) -> Result<(), Hold> {
        let Some((oldest_queued, oldest_alone)) = self.front() else { return Ok(()) };
        // A window that holds updates back must rest on a recent base: once it is old, drain
        // until an update travels alone (then the measurement is under way, and those behind
        // it do not disturb it). A client the window never limits is never drained.
        let stale =
            self.base_flight.is_some_and(|(_, at)| now.saturating_duration_since(at) > BASE_FLIGHT_MEMORY);
        if self.limited && stale && !oldest_alone {
            return Err(Hold::Probe);
        }
        // And the oldest update in flight must not have waited past the base flight time, the
        // acknowledgement delay and `target`: however the rate was estimated, no update queues
        // longer than that.
        let overdue = self.base_flight.is_some_and(|(base, _)| {
            now.saturating_duration_since(oldest_queued) > base + self.limits.ack_delay + self.limits.target
        });
        let room = if self.large_waiting {
            Err(Hold::Large)
        } else if overdue {
            Err(Hold::Overdue)
        } else if self.entries.len() >= self.limits.max_messages {
            Err(Hold::Messages)
        } else if self.bytes >= self.limit() {
            Err(Hold::Bytes)
        } else {
            Ok(())
        };
        self.limited |= room.is_err();
        room
    }

    /// Whether the client looks stopped at `now`: updates are in flight and none has been
    /// acknowledged for twice the longest an update may wait in flight (the base flight time,
    /// the acknowledgement delay and `target`; without a base yet, the last two). A client that
    /// reads slowly but acknowledges, however far away, is not: each acknowledgement starts the
    /// count again.
    pub fn stalled(&self, now: Instant) -> bool {
        if self.entries.is_empty() {
            return false;
        }
        let wait =
            self.base_flight.map_or(Duration::ZERO, |(d, _)| d) + self.limits.ack_delay + self.limits.target;
        self.delivered_at.is_some_and(|at| now.saturating_duration_since(at) > wait.saturating_mul(2))
    }

    /// Whether an update of `bytes` may join those in flight: never past `max_bytes`, except
    /// alone. So what is in flight never passes the larger of `max_bytes` and one update, and
    /// stays under the session's own retransmit bound. A refusal holds everything else back
    /// until the window drains, so the large update goes next.
    pub fn admits(&mut self, bytes: usize) -> bool {
        let fits = self.entries.is_empty() || self.bytes.saturating_add(bytes) <= self.limits.max_bytes;
        if !fits {
            self.large_waiting = true;
        }
        fits
    }

    /// Updates and bytes in flight.
    pub fn in_flight(&self) -> (usize, usize) {
        (self.entries.len(), self.bytes)
    }

    /// When the oldest update in flight was queued.
    pub fn oldest(&self) -> Option<Instant> {
        self.front().map(|(queued, _)| queued)
    }

    /// The oldest update in flight's `queued` and `alone`, from the copy kept beside the
    /// entries (checked against them in debug builds).
    fn front(&self) -> Option<(Instant, bool)> {
        debug_assert_eq!(self.oldest, self.entries.front().map(|e| (e.queued, e.alone)));
        self.oldest
    }

    /// The estimated delivery rate in bytes per second, once an acknowledgement gave one.
    pub fn rate(&self) -> Option<f64> {
        match self.rate_max {
            [Some(a), Some(b)] => Some(a.max(b)),
            [a, b] => a.or(b),
        }
    }

    fn sample_rate(&mut self, now: Instant, sample: f64) {
        let epoch = *self.epoch.get_or_insert(now);
        if now.saturating_duration_since(epoch) >= RATE_EPOCH {
            self.rate_max = [self.rate_max[1], None];
            self.epoch = Some(now);
        }
        self.rate_max[1] = Some(self.rate_max[1].map_or(sample, |m| m.max(sample)));
    }

    /// An update of `bytes` for `channel`, from version `from` (`None`: a snapshot), was queued
    /// to the session at `now`.
    pub fn queued(&mut self, now: Instant, channel: C, from: Option<Version>, bytes: usize) {
        if self.entries.is_empty() {
            // After an idle spell the rate sample starts now, not at the last acknowledgement.
            self.delivered_at = Some(now);
            self.large_waiting = false;
        }
        let delivered_at = *self.delivered_at.get_or_insert(now);
        if self.entries.is_empty() {
            self.oldest = Some((now, true));
        }
        self.entries.push_back(Entry {
            channel: Some(channel),
            from,
            bytes,
            queued: now,
            seq: 0,
            alone: self.entries.is_empty(),
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
        while let Some(entry) = self.pop_acked(ack) {
            // Everything acknowledged while this one was in flight, itself included, over the
            // longer of the time it was in flight and the time since the acknowledgement before
            // it was queued: one acknowledgement covering many updates (clients acknowledge
            // every `ack_delay` or so) is not a burst of speed. At least a millisecond.
            let flight = now.saturating_duration_since(entry.queued);
            let elapsed =
                flight.max(now.saturating_duration_since(entry.delivered_at)).max(Duration::from_millis(1));
            // A lower flight time is always a better bound on the base; one measured alone
            // replaces it even if higher (the link got slower), and renews it.
            match self.base_flight {
                _ if entry.alone => {
                    self.base_flight = Some((flight, now));
                    self.limited = false;
                }
                Some((base, at)) if flight < base => self.base_flight = Some((flight, at)),
                None => self.base_flight = Some((flight, now)),
                Some(_) => {}
            }
            let sample = (self.delivered - entry.delivered_before) as f64 / elapsed.as_secs_f64();
            self.sample_rate(now, sample);
        }
        self.delivered_at = Some(now);
    }

    /// The connection was replaced and the client holds every message up to `delivered`. The
    /// session drops the channel updates after that instead of resending them, and so does the
    /// caller with those still in the outbox; this forgets them all, and records for each
    /// channel the version its replica holds: the `from` of its first dropped update.
    pub fn resume(&mut self, delivered: u64) {
        self.acked_without_sample(delivered);
        // The outage is no measure of the client's pace.
        self.delivered_at = None;
        self.large_waiting = false;
        for entry in self.entries.drain(..) {
            let Some(channel) = entry.channel else { continue };
            if !self.rewinds.iter().any(|(c, _)| *c == channel) {
                self.rewinds.push((channel, entry.from));
            }
        }
        self.oldest = None;
        self.bytes = 0;
        self.sent = 0;
    }

    /// Acknowledged by a resume handshake: no rate sample, the time includes the outage.
    fn acked_without_sample(&mut self, ack: u64) {
        while self.pop_acked(ack).is_some() {}
    }

    /// Takes the oldest update off the window if the client acknowledged it (`ack` covers its
    /// sequence number), and counts it delivered.
    fn pop_acked(&mut self, ack: u64) -> Option<Entry<C>> {
        if self.sent == 0 || self.entries.front().is_none_or(|e| e.seq > ack) {
            return None;
        }
        let entry = self.entries.pop_front()?;
        self.oldest = self.entries.front().map(|e| (e.queued, e.alone));
        self.sent -= 1;
        self.bytes -= entry.bytes;
        self.delivered += entry.bytes as u64;
        Some(entry)
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
mod tests;
