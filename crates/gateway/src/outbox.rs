//! What a session's handle and its task share about the session's outbox, beside the bounded
//! channel itself: whether a push found it full (the session then ends as a slow consumer),
//! how many answers the session is owed, and how many bytes of messages wait in it. The
//! channel bounds the outbox in messages (`limits.outbox_capacity`); [`Signals`] bounds its
//! messages in bytes too, so that a session that stops reading while a game server broadcasts
//! large messages holds a few MiB, not 256 frames of up to 1 MiB each. Channel updates are
//! not counted here: the update window (`flow.rs`) bounds them in bytes already.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::router::Outgoing;

/// Shared by a session's handles and its task.
#[derive(Debug)]
pub(crate) struct Signals {
    /// Set when a push finds the outbox full: the session ends as a slow consumer. The session
    /// task checks it after every step; a full outbox always has a message to wake the task.
    pub slow: AtomicBool,
    /// Answers to the session's requests not yet taken from its outbox by its task: places
    /// held by `Reply`s, and answers queued.
    pub answers_owed: AtomicUsize,
    /// Bytes of messages (not channel updates) in the outbox.
    queued_bytes: AtomicUsize,
    max_bytes: usize,
}

impl Signals {
    pub fn new(max_bytes: usize) -> Signals {
        Signals {
            slow: AtomicBool::new(false),
            answers_owed: AtomicUsize::new(0),
            queued_bytes: AtomicUsize::new(0),
            max_bytes,
        }
    }

    /// Counts a message of `len` bytes into the outbox if it keeps what waits there within
    /// the budget; `false` (and nothing counted) if not.
    pub fn take_bytes(&self, len: usize) -> bool {
        let before = self.queued_bytes.fetch_add(len, Ordering::Relaxed);
        if before + len > self.max_bytes {
            self.queued_bytes.fetch_sub(len, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Counts a message of `len` bytes into the outbox whatever the budget: one whose place
    /// was taken while there was room ([`Signals::has_room`]).
    pub fn add_bytes(&self, len: usize) {
        self.queued_bytes.fetch_add(len, Ordering::Relaxed);
    }

    /// The session's task took a message of `len` bytes from the outbox.
    pub fn taken(&self, len: usize) {
        self.queued_bytes.fetch_sub(len, Ordering::Relaxed);
    }

    /// Whether more than a `1 / share`th of the byte budget is free (as `relay` and `paced`
    /// leave a share of the outbox's places).
    pub fn has_room(&self, share: usize) -> bool {
        let queued = self.queued_bytes.load(Ordering::Relaxed);
        queued < self.max_bytes - self.max_bytes / share.max(1)
    }

    /// `item`, just taken from the outbox by the session's task: a message's bytes are counted
    /// out of the outbox, and an answer off those the session is owed too (it is a message
    /// from then on).
    pub fn took(&self, item: Outgoing) -> Outgoing {
        match item {
            Outgoing::Answer(message) => {
                self.answers_owed.fetch_sub(1, Ordering::Relaxed);
                self.taken(message.len());
                Outgoing::Message(message)
            }
            Outgoing::Message(message) => {
                self.taken(message.len());
                Outgoing::Message(message)
            }
            item => item,
        }
    }

    /// Bytes of messages in the outbox now.
    #[cfg(test)]
    pub fn queued_bytes(&self) -> usize {
        self.queued_bytes.load(Ordering::Relaxed)
    }
}

/// The most bytes of messages a session's outbox holds, and its backlog of messages waiting
/// for room in the session: twice the larger of the resend buffer and the largest frame
/// (2 MiB by default), so any one message fits.
pub(crate) fn max_bytes(config: &crate::GatewayConfig) -> usize {
    2 * config.session.max_unacked_bytes.max(config.limits.max_frame_bytes as usize)
}

/// The most answers a session is owed before it hands on no more of its client's requests
/// (`SessionHandle::reply`): a 32nd of the outbox, from 1 to 16 (8 by default). Within the
/// 16 places the spatial world leaves beside a view's `UNSUBSCRIBED` events
/// (`spatial::max_view_cells`), so those always fit.
pub(crate) fn max_answers_owed(outbox_capacity: usize) -> usize {
    (outbox_capacity / 32).clamp(1, 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_counted_in_and_out_within_the_budget() {
        let s = Signals::new(100);
        assert!(s.take_bytes(60));
        assert!(!s.take_bytes(41), "past the budget: refused");
        assert_eq!(s.queued_bytes(), 60, "and not counted");
        assert!(s.has_room(4) && !s.has_room(2), "60 of 100: more than a quarter free, not half");
        s.add_bytes(50);
        assert!(!s.has_room(8), "a held place may pass the budget");
        s.taken(50);
        s.taken(60);
        assert_eq!(s.queued_bytes(), 0);
        assert!(s.take_bytes(100), "one message may take the whole budget");
    }
}
