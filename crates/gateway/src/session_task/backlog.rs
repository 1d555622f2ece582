//! What a session task holds back, in both directions, while the client's acknowledgements
//! make room in the session's resend buffer: the server's messages that do not fit yet
//! ([`Waiting`]), and the client's messages that arrived while the reply to one of its
//! requests waits ([`Parked`]). Apart from `session_task.rs` because each is a bounded queue
//! with its own rule, kept small.
//!
//! Why the client's messages wait too: a request's reply may be far larger than the request
//! (an `echo` of half a frame answers 25 bytes), so replies queued for a client that sends
//! requests and never acknowledges would grow by the reply's size per request. While a reply
//! waits, the task handles none of the client's later messages, in order; they wait as they
//! came, bounded by count and bytes. Acknowledgements (every frame's `ack`) are read all the
//! while, so a client that reads its replies frees the room they wait for.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::router::Outgoing;

/// The server's messages the session had no room for (its resend buffer at `max_unacked_*`),
/// sent in order as the client's acknowledgements free room. The outbox is not read
/// meanwhile, so a client that stops acknowledging fills it and is closed as slow; a burst
/// that outruns the acknowledgements of a client that keeps up waits instead of ending the
/// session. Holds the outbox's one item that did not fit, the reply to the client's request
/// that did not ([`Parked`] holds the requests after it), and after a resume the messages that
/// were queued: at most `outbox_capacity`.
///
/// A queue allocated only once something waits, so that a session that never waits carries
/// one pointer for it (the task of each of 35,000 ping-pong sessions grew by 0.7 KiB with the
/// queue inline, across an allocator size class).
#[derive(Default)]
#[expect(clippy::box_collection, reason = "the box keeps the task one pointer larger, not four")]
pub(super) struct Waiting(Option<Box<VecDeque<Outgoing>>>);

impl Waiting {
    pub fn is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|q| q.is_empty())
    }

    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.len())
    }

    pub fn push_back(&mut self, item: Outgoing) {
        self.0.get_or_insert_with(Box::default).push_back(item);
    }

    pub fn front(&self) -> Option<&Outgoing> {
        self.0.as_ref()?.front()
    }

    pub fn pop_front(&mut self) -> Option<Outgoing> {
        self.0.as_mut()?.pop_front()
    }

    /// Everything waiting, in order, leaving nothing.
    pub fn take(&mut self) -> impl Iterator<Item = Outgoing> + use<> {
        self.0.take().into_iter().flat_map(|q| *q)
    }
}

/// The client's messages (DATA payloads the session delivered) not handled yet because the
/// reply to an earlier request waits, in order; allocated only once one waits.
#[derive(Default)]
pub(super) struct Parked(Option<Box<ParkedQueue>>);

#[derive(Default)]
struct ParkedQueue {
    messages: VecDeque<Bytes>,
    bytes: usize,
}

/// More of the client's messages waiting than a [`Parked`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ParkedFull {
    pub messages: usize,
    pub bytes: usize,
}

impl Parked {
    pub fn is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|q| q.messages.is_empty())
    }

    /// Adds `message` after the others, unless that would make more than `max_messages`
    /// messages or `max_bytes` bytes wait (one message waits alone whatever its size: it is
    /// within the frame limit).
    pub fn push(&mut self, message: Bytes, max_messages: usize, max_bytes: usize) -> Result<(), ParkedFull> {
        let q = self.0.get_or_insert_with(Box::default);
        let bytes = q.bytes + message.len();
        if q.messages.len() >= max_messages || (bytes > max_bytes && !q.messages.is_empty()) {
            return Err(ParkedFull { messages: q.messages.len() + 1, bytes });
        }
        q.bytes = bytes;
        q.messages.push_back(message);
        Ok(())
    }

    /// The oldest message waiting; the queue goes once empty.
    pub fn pop(&mut self) -> Option<Bytes> {
        let q = self.0.as_mut()?;
        let message = q.messages.pop_front()?;
        q.bytes -= message.len();
        if q.messages.is_empty() {
            self.0 = None;
        }
        Some(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parked_messages_come_out_in_order_within_both_bounds() {
        let mut parked = Parked::default();
        assert!(parked.is_empty() && parked.pop().is_none());
        let m = |n: usize| Bytes::from(vec![n as u8; n]);
        parked.push(m(10), 3, 25).unwrap();
        parked.push(m(15), 3, 25).unwrap();
        assert_eq!(parked.push(m(1), 3, 25), Err(ParkedFull { messages: 3, bytes: 26 }), "bytes");
        assert_eq!(parked.pop(), Some(m(10)));
        parked.push(m(1), 3, 25).unwrap();
        parked.push(m(2), 3, 25).unwrap();
        assert_eq!(parked.push(m(3), 3, 25), Err(ParkedFull { messages: 4, bytes: 21 }), "count");
        let out: Vec<_> = std::iter::from_fn(|| parked.pop()).collect();
        assert_eq!(out, [m(15), m(1), m(2)]);
        assert!(parked.is_empty() && parked.0.is_none(), "freed once empty");
        // One message alone may pass the byte bound.
        parked.push(m(40), 3, 25).unwrap();
        assert_eq!(parked.pop(), Some(m(40)));
    }
}
