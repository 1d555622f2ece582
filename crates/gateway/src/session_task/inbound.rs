//! The client's messages on their way to the router: handed on in order, and held back
//! (parked, or left unread in the connection) while a reply waits for room in the session or
//! while the session is owed as many answers from the channels and the world as it may be.

use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;
use tickwire_wire::proto::{CloseReason, Envelope, envelope};
use tickwire_wire::{decode_envelope, encode_message};

use super::{End, SessionTask};
use crate::auth::Role;
use crate::outbox::max_answers_owed;
use crate::router::Outgoing;

impl SessionTask {
    pub(super) fn dispatch(&mut self, now: Instant, payload: Bytes) -> Result<(), End> {
        let router = &self.shared.router;
        match decode_envelope(payload)? {
            envelope::Kind::Request(request) => {
                if let Some(response) = router.on_request(&self.handle, request) {
                    let env = Envelope { kind: Some(envelope::Kind::Response(response)) };
                    self.send(now, encode_message(&env))?;
                }
            }
            envelope::Kind::Push(push) => router.on_push(&self.handle, push),
            envelope::Kind::Response(_) => {
                return Err(End::new(CloseReason::ProtocolError, "clients may not send responses"));
            }
        }
        Ok(())
    }

    /// Sends a message now, or after what waits for room ([`SessionTask::put`]). What the
    /// client sends next waits until it has gone (`Backlog::reply_waiting`).
    pub(super) fn send(&mut self, now: Instant, message: Bytes) -> Result<(), End> {
        self.put(now, Outgoing::Message(message), &mut Vec::new())?;
        self.backlog.note_reply();
        Ok(())
    }

    /// Keeps a message of the client's while the ones before it wait ([`SessionTask::must_hold`],
    /// while something waits for room); a client that keeps sending while it does not
    /// acknowledge its replies is closed as slow. Copied: the payload is a slice of the read
    /// buffer, and would keep all of it.
    pub(super) fn park(&mut self, payload: Bytes) -> Result<(), End> {
        let limits = &self.shared.config.limits;
        let max_bytes = self.shared.config.session.max_unacked_bytes.max(limits.max_frame_bytes as usize);
        // A game server sends thousands of messages a second (its own rate limit): as many
        // wait for it, within the same bytes.
        let max_messages = match self.handle.role() {
            Role::Player => limits.outbox_capacity,
            Role::Server => limits.outbox_capacity.max(limits.server_message_burst as usize),
        };
        let payload = Bytes::copy_from_slice(&payload);
        self.backlog.park(payload, max_messages, max_bytes).map_err(|full| {
            End::new(
                CloseReason::SlowConsumer,
                format!(
                    "{} messages ({} bytes) from the client waiting for room for the replies to its \
                     requests: it does not acknowledge what it is sent",
                    full.messages, full.bytes
                ),
            )
        })
    }

    /// Whether the client's next message must wait (in the backlog's `parked`): a reply to
    /// one before it waits for room, or the session is owed as many answers as it may be.
    pub(super) fn must_hold(&mut self) -> bool {
        self.backlog.reply_waiting() || self.owed_enough()
    }

    /// Whether the session is owed [`max_answers_owed`] answers to the client's requests by
    /// the channels and the world ([`SessionHandle::reply`]), held or queued: the client's next
    /// request then waits, so that its answer will find a place. Each answer owed comes to
    /// the outbox (given, or `UNAVAILABLE` if dropped) and wakes the task.
    pub(super) fn owed_enough(&self) -> bool {
        let owed = self.handle.signals.answers_owed.load(Ordering::Relaxed);
        owed >= max_answers_owed(self.shared.config.limits.outbox_capacity)
    }

    /// Whether to leave the client's frames in the read buffer, and stop reading: the session
    /// is owed enough answers, and its outbox, where they come, is being read
    /// ([`SessionTask::on_outbox`] takes the frames up again). So a client that pipelines
    /// requests faster than the channels and the world answer them is held back by TCP and its
    /// own window of unacknowledged messages, not queued for. The hold lasts as long as the
    /// channels and the world take to answer: its heartbeats are not read meanwhile. While
    /// something waits for room in the session, the frames are read on: the client's
    /// acknowledgements make that room, and its messages wait in `parked`.
    pub(super) fn hold_input(&self) -> bool {
        self.backlog.waiting_is_empty() && self.owed_enough()
    }

    /// Whether the client's frames were left unread and need not be any longer.
    pub(super) fn resumes_input(&self) -> bool {
        self.backlog.input_held() && !self.hold_input()
    }

    /// Handles the client's messages that waited, in order, until one must wait again.
    pub(super) fn dispatch_parked(&mut self, now: Instant) -> Result<(), End> {
        while !self.backlog.parked_is_empty() && !self.must_hold() {
            let Some(payload) = self.backlog.pop_parked() else { break };
            self.dispatch(now, payload)?;
        }
        Ok(())
    }

    /// The session is ending: every message of the client's that waited is handled, in order;
    /// their replies, which cannot go, are dropped.
    pub(super) fn dispatch_parked_at_end(&mut self, now: Instant) {
        drop(self.backlog.take_waiting());
        while let Some(payload) = self.backlog.pop_parked() {
            // An error here is the reply's (the router has had the message) or a malformed
            // message's: either way the session is ending, and the next message is the next.
            let _ = self.dispatch(now, payload);
            drop(self.backlog.take_waiting());
        }
    }
}
