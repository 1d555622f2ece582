//! What a session task holds back, in both directions, while the client's acknowledgements
//! make room in the session's resend buffer: the server's messages that do not fit yet, and
//! the client's messages that arrived while the reply to one of its requests waits
//! ([`Backlog`]). Apart from `session_task.rs` because each is a bounded queue with its own
//! rule, kept small.
//!
//! Why the client's messages wait too: a request's reply may be far larger than the request
//! (an `echo` of half a frame answers 25 bytes), so replies queued for a client that sends
//! requests and never acknowledges would grow by the reply's size per request. While a reply
//! waits, the task handles none of the client's later messages, in order; they wait as they
//! came, bounded by count and bytes. Acknowledgements (every frame's `ack`) are read all the
//! while, so a client that reads its replies frees the room they wait for.
//!
//! It also marks when the client's frames are left unread: while the session is owed as many
//! answers to the client's requests as it may be (`SessionTask::hold_input`).

use std::collections::VecDeque;

use bytes::Bytes;

use super::outbound::outgoing_len;
use crate::router::Outgoing;

/// What waits, in one allocation made only once something does, so that a session that never
/// waits carries one pointer for it (the task of each of 35,000 ping-pong sessions grew by
/// 0.7 KiB with a queue inline, and by 1 KiB at 20,000 with a second pointer and a flag:
/// each time across an allocator size class).
#[derive(Default)]
pub(super) struct Backlog(Option<Box<Queues>>);

#[derive(Default)]
struct Queues {
    /// The server's messages the session had no room for (its resend buffer at
    /// `max_unacked_*`), sent in order as the client's acknowledgements free room. The outbox
    /// is not read meanwhile, so a client that stops acknowledging fills it and is closed as
    /// slow; a burst that outruns the acknowledgements of a client that keeps up waits instead
    /// of ending the session. Holds the outbox's one item that did not fit, the reply to the
    /// client's request that did not (`parked` holds the requests after it), and after a
    /// resume the messages that were queued: at most twice `outbox_capacity` (`put`).
    waiting: VecDeque<Outgoing>,
    /// The bytes `waiting` holds (`outbound::outgoing_len` of each).
    waiting_bytes: usize,
    /// A reply to the client went into `waiting` and may still be there: the client's
    /// messages wait in `parked` until `waiting` is empty.
    reply_waits: bool,
    /// The client's messages (DATA payloads the session delivered) not handled yet because
    /// the reply to an earlier request waits, in order, and their bytes.
    parked: VecDeque<Bytes>,
    parked_bytes: usize,
    /// The client's frames are left in the read buffer, unread, and its connection is not
    /// read (the session is owed enough answers: `SessionTask::hold_input`).
    input_held: bool,
}

/// More of the client's messages waiting than the backlog takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ParkedFull {
    pub messages: usize,
    pub bytes: usize,
}

impl Backlog {
    fn queues(&mut self) -> &mut Queues {
        self.0.get_or_insert_with(Box::default)
    }

    /// Frees the allocation once nothing waits.
    fn tidy(&mut self) {
        if self
            .0
            .as_ref()
            .is_some_and(|q| q.waiting.is_empty() && q.parked.is_empty() && !q.reply_waits && !q.input_held)
        {
            self.0 = None;
        }
    }

    pub fn waiting_is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|q| q.waiting.is_empty())
    }

    pub fn waiting_len(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.waiting.len())
    }

    /// The bytes of what waits to be sent.
    pub fn waiting_bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.waiting_bytes)
    }

    pub fn push_waiting(&mut self, item: Outgoing) {
        let q = self.queues();
        q.waiting_bytes += outgoing_len(&item);
        q.waiting.push_back(item);
    }

    pub fn front_waiting(&self) -> Option<&Outgoing> {
        self.0.as_ref()?.waiting.front()
    }

    pub fn pop_waiting(&mut self) -> Option<Outgoing> {
        let q = self.0.as_mut()?;
        let item = q.waiting.pop_front();
        if let Some(item) = &item {
            q.waiting_bytes -= outgoing_len(item);
        }
        self.tidy();
        item
    }

    /// Everything waiting to be sent, in order, leaving none (the client's parked messages
    /// stay).
    pub fn take_waiting(&mut self) -> VecDeque<Outgoing> {
        let taken = self
            .0
            .as_mut()
            .map(|q| {
                q.waiting_bytes = 0;
                std::mem::take(&mut q.waiting)
            })
            .unwrap_or_default();
        self.tidy();
        taken
    }

    /// A reply was just put after what waits: if it waits too, the client's later messages
    /// must wait ([`Backlog::reply_waiting`]).
    pub fn note_reply(&mut self) {
        if !self.waiting_is_empty() {
            self.queues().reply_waits = true;
        }
    }

    /// Whether a reply to the client still waits for room: its later messages must wait.
    pub fn reply_waiting(&mut self) -> bool {
        let Some(q) = self.0.as_mut() else { return false };
        q.reply_waits &= !q.waiting.is_empty();
        let waits = q.reply_waits;
        self.tidy();
        waits
    }

    /// Whether the client's frames are left unread.
    pub fn input_held(&self) -> bool {
        self.0.as_ref().is_some_and(|q| q.input_held)
    }

    pub fn set_input_held(&mut self, held: bool) {
        if held {
            self.queues().input_held = true;
        } else if let Some(q) = self.0.as_mut() {
            q.input_held = false;
            self.tidy();
        }
    }

    pub fn parked_is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|q| q.parked.is_empty())
    }

    /// Adds a client's `message` after the others, unless that would make more than
    /// `max_messages` messages or `max_bytes` bytes wait (one message waits alone whatever
    /// its size: it is within the frame limit).
    pub fn park(&mut self, message: Bytes, max_messages: usize, max_bytes: usize) -> Result<(), ParkedFull> {
        let q = self.queues();
        let bytes = q.parked_bytes + message.len();
        if q.parked.len() >= max_messages || (bytes > max_bytes && !q.parked.is_empty()) {
            return Err(ParkedFull { messages: q.parked.len() + 1, bytes });
        }
        q.parked_bytes = bytes;
        q.parked.push_back(message);
        Ok(())
    }

    /// The client's oldest message waiting.
    pub fn pop_parked(&mut self) -> Option<Bytes> {
        let q = self.0.as_mut()?;
        let message = q.parked.pop_front();
        if let Some(m) = &message {
            q.parked_bytes -= m.len();
        }
        self.tidy();
        message
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parked_messages_come_out_in_order_within_both_bounds() {
        let mut b = Backlog::default();
        assert!(b.parked_is_empty() && b.pop_parked().is_none());
        let m = |n: usize| Bytes::from(vec![n as u8; n]);
        b.park(m(10), 3, 25).unwrap();
        b.park(m(15), 3, 25).unwrap();
        assert_eq!(b.park(m(1), 3, 25), Err(ParkedFull { messages: 3, bytes: 26 }), "bytes");
        assert_eq!(b.pop_parked(), Some(m(10)));
        b.park(m(1), 3, 25).unwrap();
        b.park(m(2), 3, 25).unwrap();
        assert_eq!(b.park(m(3), 3, 25), Err(ParkedFull { messages: 4, bytes: 21 }), "count");
        let out: Vec<_> = std::iter::from_fn(|| b.pop_parked()).collect();
        assert_eq!(out, [m(15), m(1), m(2)]);
        assert!(b.parked_is_empty() && b.0.is_none(), "freed once empty");
        // One message alone may pass the byte bound.
        b.park(m(40), 3, 25).unwrap();
        assert_eq!(b.pop_parked(), Some(m(40)));
    }

    #[test]
    fn a_reply_waits_while_something_waits_before_it_and_the_parked_stay_through_a_take() {
        let mut b = Backlog::default();
        b.note_reply();
        assert!(!b.reply_waiting() && b.0.is_none(), "nothing waits: the reply went");
        b.push_waiting(Outgoing::Message(Bytes::from_static(b"reply")));
        b.note_reply();
        b.park(Bytes::from_static(b"next"), 8, 100).unwrap();
        assert!(b.reply_waiting());
        assert_eq!(b.take_waiting().len(), 1);
        assert!(!b.reply_waiting(), "what waited went (a resume took it)");
        assert_eq!(b.pop_parked(), Some(Bytes::from_static(b"next")), "the client's messages stay");
        assert!(b.0.is_none());
    }
}
