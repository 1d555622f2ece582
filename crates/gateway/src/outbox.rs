//! What a session's handle and its task share about the session's outbox, beside the bounded
//! channel itself: whether a push found it full (the session then ends as a slow consumer),
//! how many answers the session is owed, and how many bytes of messages wait in it. The
//! channel bounds the outbox in messages (`limits.outbox_capacity`); [`Signals`] bounds its
//! messages in bytes too, so that a session that stops reading while a game server broadcasts
//! large messages holds a few MiB, not 256 frames of up to 1 MiB each. Not counted: channel
//! updates, which the update window (`flow.rs`) bounds in bytes already, and the answers to the
//! session's own requests, whose places are held from the request on (they cannot be refused)
//! and which [`max_answers_owed`] bounds, each within a frame.

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
    /// Set when the session's task is ending: requests it hands on then are run without a
    /// place for their answers, which could not go.
    pub ending: AtomicBool,
    /// Bytes of messages (not channel updates, not answers) in the outbox.
    queued_bytes: AtomicUsize,
    max_bytes: usize,
}

impl Signals {
    pub fn new(max_bytes: usize) -> Signals {
        Signals {
            slow: AtomicBool::new(false),
            answers_owed: AtomicUsize::new(0),
            ending: AtomicBool::new(false),
            queued_bytes: AtomicUsize::new(0),
            max_bytes,
        }
    }

    /// Counts a message of `len` bytes into the outbox if what is queued stays within the
    /// budget less a `1 / keep`th of it (`keep` 0: the whole budget); `false`, and nothing
    /// counted, if not. (Relayed and paced messages keep a share free, so that the gateway's
    /// own pushes, which end the session when refused, always have it.)
    pub fn take_bytes(&self, len: usize, keep: usize) -> bool {
        let limit = self.max_bytes - self.max_bytes.checked_div(keep).unwrap_or(0);
        self.queued_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |queued| {
                (queued + len <= limit).then_some(queued + len)
            })
            .is_ok()
    }

    /// Counts `actual` bytes in place of the `counted` that were (a relayed push counted at its
    /// bound, `SessionHandle::relay`, and pushed at its size).
    pub fn recount(&self, counted: usize, actual: usize) {
        if actual > counted {
            self.queued_bytes.fetch_add(actual - counted, Ordering::Relaxed);
        } else {
            self.queued_bytes.fetch_sub(counted - actual, Ordering::Relaxed);
        }
    }

    /// Gives back `len` bytes counted in: the session's task took the message from the
    /// outbox, or it never went in.
    pub fn taken(&self, len: usize) {
        self.queued_bytes.fetch_sub(len, Ordering::Relaxed);
    }

    /// `item`, just taken from the outbox by the session's task: a message's bytes are counted
    /// out of the outbox, and an answer off those the session is owed (it is a message from
    /// then on).
    pub fn took(&self, item: Outgoing) -> Outgoing {
        match item {
            Outgoing::Answer(message) => {
                self.answers_owed.fetch_sub(1, Ordering::Relaxed);
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
    fn bytes_are_counted_in_and_out_within_the_budget_and_its_kept_shares() {
        let s = Signals::new(100);
        assert!(s.take_bytes(60, 4));
        assert!(!s.take_bytes(16, 4), "a relay keeps a quarter free: 76 > 75");
        assert!(s.take_bytes(15, 4));
        assert!(!s.take_bytes(26, 0), "past the budget: refused");
        assert_eq!(s.queued_bytes(), 75, "and not counted");
        assert!(s.take_bytes(25, 0), "a push may use the share relays keep");
        s.taken(100);
        assert_eq!(s.queued_bytes(), 0);
        assert!(s.take_bytes(100, 0), "one message may take the whole budget");
        let message = Outgoing::Message(bytes::Bytes::from_static(&[0; 100]));
        assert!(matches!(s.took(message), Outgoing::Message(_)));
        assert_eq!(s.queued_bytes(), 0);
    }
}
