//! The session's messages on their way to the client: sent now if the session's resend
//! buffer has room and nothing waits before them, else waiting in order (the backlog), with
//! the channel updates among them told to the update window.

use std::time::Instant;

use tickwire_wire::proto::CloseReason;
use tickwire_wire::{Frame, Payload};

use super::{End, SessionTask};
use crate::router::Outgoing;
use crate::stats::Stats;

/// Outbox messages written per wake-up before the task checks its other inputs again.
const OUTBOX_BATCH: usize = 64;

/// The payload length `item` takes in the session's resend buffer.
pub(super) fn outgoing_len(item: &Outgoing) -> usize {
    match item {
        Outgoing::Message(message) | Outgoing::Answer(message) | Outgoing::Update(message) => message.len(),
        Outgoing::UpdateParts(update) => update.encoded_len(),
    }
}

impl SessionTask {
    /// Queues a DATA frame the session produced (none while detached) for the next flush.
    pub(super) fn write_data(&mut self, frame: Option<Frame>) {
        if let Some(frame) = frame {
            frame.encode(&mut self.wbuf);
            Stats::add(&self.shared.stats.messages_out, 1);
        }
    }

    /// Sends a channel update, noting its sequence number for the window.
    pub(super) fn send_update(
        &mut self,
        now: Instant,
        update: Payload,
        updates: &mut Vec<u64>,
    ) -> Result<(), End> {
        updates.push(self.session.next_seq());
        let frame = self.session.send_replaceable(now, update)?;
        self.write_data(frame);
        Ok(())
    }

    pub(super) async fn on_outbox(&mut self, first: Outgoing) -> Result<(), End> {
        let now = Instant::now();
        // Sequence numbers of the channel updates in this batch, told to the window at once.
        let mut updates = Vec::new();
        let mut item = Some(first);
        for _ in 0..OUTBOX_BATCH {
            // Once one waits for room, the rest stay in the outbox.
            if !self.backlog.waiting_is_empty() {
                break;
            }
            let Some(next) = item.take().or_else(|| self.outbox.try_recv().ok()) else { break };
            self.put(now, self.handle.signals.took(next), &mut updates)?;
        }
        self.updates_sent(updates);
        if self.resumes_input() {
            // Answers taken from the outbox let the client's frames in again. (Boxed: a rare
            // path, kept out of the size of every session's task.)
            return Box::pin(self.on_input(now)).await;
        }
        self.dispatch_parked(now)?;
        self.flush().await;
        Ok(())
    }

    /// Sends `item` now if the session has room for it and nothing waits before it; else it
    /// waits (in the backlog). A message larger than the session's bounds alone cannot ever be
    /// sent: the session ends with `RETRANSMIT_OVERFLOW`, as before.
    pub(super) fn put(&mut self, now: Instant, item: Outgoing, updates: &mut Vec<u64>) -> Result<(), End> {
        if !self.backlog.waiting_is_empty() || self.must_wait(&item) {
            // What waits is taken from a full outbox at most once per resume (the outbox is not
            // read while anything waits): twice the outbox's bounds, in messages and in bytes,
            // let a resume carry a full outbox and a full backlog on, and no more.
            if self.backlog.waiting_len() >= 2 * self.shared.config.limits.outbox_capacity {
                return Err(End::new(
                    CloseReason::SlowConsumer,
                    format!("more than {} messages waiting for acknowledgements", self.backlog.waiting_len()),
                ));
            }
            let bytes = self.backlog.waiting_bytes() + outgoing_len(&item);
            if !self.backlog.waiting_is_empty() && bytes > 2 * crate::outbox::max_bytes(&self.shared.config) {
                return Err(End::new(
                    CloseReason::SlowConsumer,
                    format!("more than {bytes} bytes waiting for acknowledgements"),
                ));
            }
            self.backlog.push_waiting(item);
            return Ok(());
        }
        self.send_now(now, item, updates)
    }

    pub(super) fn send_now(
        &mut self,
        now: Instant,
        item: Outgoing,
        updates: &mut Vec<u64>,
    ) -> Result<(), End> {
        match item {
            Outgoing::Message(message) | Outgoing::Answer(message) => {
                let frame = self.session.send(now, message)?;
                self.write_data(frame);
                Ok(())
            }
            Outgoing::Update(update) => self.send_update(now, update.into(), updates),
            Outgoing::UpdateParts(update) => self.send_update(now, update.into_payload(), updates),
        }
    }

    /// Whether `item` must wait for acknowledgements to make room for it. One that would not
    /// fit with nothing unacknowledged never will: it goes now, and ends the session.
    pub(super) fn must_wait(&self, item: &Outgoing) -> bool {
        !self.session.has_room(outgoing_len(item)) && self.session.unacked().0 > 0
    }

    /// Sends what waited for room, in order, as far as the room now goes.
    pub(super) fn send_waiting(&mut self, now: Instant) -> Result<(), End> {
        let mut updates = Vec::new();
        while let Some(item) = self.backlog.front_waiting() {
            if self.must_wait(item) {
                break;
            }
            let Some(item) = self.backlog.pop_waiting() else { break };
            self.send_now(now, item, &mut updates)?;
        }
        self.updates_sent(updates);
        Ok(())
    }

    /// Tells the update window the sequence numbers the updates just sent took.
    pub(super) fn updates_sent(&self, updates: Vec<u64>) {
        if !updates.is_empty() {
            let mut window = self.handle.flow.lock();
            for seq in updates {
                window.sent(seq);
            }
        }
    }
}
