//! ACQUIREs paced to what their new owner can take. A server that registers into a slot whose
//! last server was lost is due an ACQUIRE for every entity waiting there (300 in B3's layout
//! at 3,000 clients), and one that takes over a lost neighbour's entities, or a crowd walking
//! across a border, as many at once. Pushed in one go, they would fill its outbox and close it
//! as a slow consumer, its entities would wait for the next server, which would meet the same
//! wall. So an ACQUIRE goes out only while more than an eighth of the server's outbox is free
//! ([`SessionHandle::paced`]); the others wait here, in order, and go out at the next passes.
//! While an entity's ACQUIRE waits, it is not handed on, and messages to it join the waiting
//! ACQUIRE, numbered in order, so that nothing reaches its new owner before the ACQUIRE and
//! nobody is refused for the wait. A RELEASE put off for room (`begin_handover`) is asked
//! again at every pass until it goes, whether or not its entity is published again.

use std::collections::VecDeque;

use prost::Message;
use tickwire_spatial::handover::Action;
use tickwire_wire::proto::{EntityMessage, Handover, HandoverKind};

use super::{EntityMsg, World, to_vec3};
use crate::router::{Relay, SessionHandle};

/// An ACQUIRE waiting for room in its slot's server's outbox.
pub(in crate::spatial) struct Waiting {
    entity_id: u64,
    from_slot: u32,
    /// The server it is for: one that took the slot since is not it.
    to: u64,
    action: Action<EntityMsg>,
}

fn handover_of(action: &Action<EntityMsg>) -> Option<u64> {
    match action {
        Action::Acquire { handover, .. } => Some(*handover),
        _ => None,
    }
}

impl World {
    /// Sends an [`Action::Acquire`] to its new owner: now if nothing waits for that server
    /// and its outbox has room to spare, else after the ACQUIREs waiting for it.
    pub(super) fn acquire(
        &mut self,
        entity_id: u64,
        from_slot: u32,
        to_slot: u32,
        to: &SessionHandle,
        action: Action<EntityMsg>,
    ) {
        let Some(handover) = handover_of(&action) else { return };
        let queue = &mut self.acquires_waiting[to_slot as usize];
        if queue.is_empty()
            && let Ok(place) = to.paced(acquire_len(&action))
        {
            self.push_acquire(entity_id, from_slot, to_slot, place, action);
            return;
        }
        queue.push_back(Waiting { entity_id, from_slot, to: to.conn_id(), action });
        if let Some(e) = self.entities.get_mut(&entity_id) {
            e.acquire_waits = Some(handover);
        }
    }

    /// Where the waiting ACQUIRE of `entity_id` is in `slot`'s queue, if one waits.
    pub(super) fn waiting_acquire(&self, slot: u32, entity_id: u64) -> Option<usize> {
        let queue = self.acquires_waiting.get(slot as usize)?;
        queue.iter().position(|w| w.entity_id == entity_id && self.is_current(w))
    }

    /// Whether `w` is its entity's ACQUIRE that waits now, not one left behind by a take-over
    /// (another handover id) or a despawn.
    fn is_current(&self, w: &Waiting) -> bool {
        let waits = self.entities.get(&w.entity_id).and_then(|e| e.acquire_waits);
        waits.is_some() && waits == handover_of(&w.action)
    }

    /// At each pass: the ACQUIREs that waited go out, in order, as far as their servers'
    /// outboxes have room (one whose entity was taken over since, its server lost or another
    /// handover id, is dropped); then the RELEASEs put off for room are asked again.
    pub fn send_waiting_acquires(&mut self) {
        self.send_acquires();
        for entity_id in std::mem::take(&mut self.releases_put_off) {
            self.entity_moved_cell(entity_id);
        }
    }

    fn send_acquires(&mut self) {
        for slot in 0..self.acquires_waiting.len() {
            if self.acquires_waiting[slot].is_empty() {
                continue;
            }
            let Some(server) = self.live_server(slot as u32).cloned() else { continue };
            while let Some(next) = self.acquires_waiting[slot].front() {
                if next.to != server.conn_id() || !self.is_current(next) {
                    self.acquires_waiting[slot].pop_front();
                    continue;
                }
                let Ok(place) = server.paced(acquire_len(&next.action)) else { break };
                let Waiting { entity_id, from_slot, action, .. } =
                    self.acquires_waiting[slot].pop_front().expect("looked at above");
                if let Some(e) = self.entities.get_mut(&entity_id) {
                    e.acquire_waits = None;
                }
                self.push_acquire(entity_id, from_slot, slot as u32, place, action);
                // It may have been published into another server's cell before it waited.
                self.entity_moved_cell(entity_id);
            }
        }
    }

    fn push_acquire(
        &self,
        entity_id: u64,
        from_slot: u32,
        to_slot: u32,
        place: Relay<'_>,
        action: Action<EntityMsg>,
    ) {
        let Action::Acquire { handover, state, messages, .. } = action else { return };
        let Some(e) = self.entities.get(&entity_id) else { return };
        let handover = Handover {
            entity_id,
            handover_id: handover,
            kind: HandoverKind::Acquire as i32,
            from_slot,
            to_slot,
            position: to_vec3(e.position),
            value_json: String::from_utf8(state).unwrap_or_default(),
            controller_connection: e.controller,
            messages: messages
                .into_iter()
                .map(|(seq, m)| EntityMessage { entity_id, seq, from_connection: m.from, body: m.body })
                .collect(),
        };
        // Pushed like any message: exactly once, in order, across the server's resumes.
        place.push("spatial.handover", handover.encode_to_vec().into());
    }
}

/// The most bytes the push of an ACQUIRE of `action` takes as a body: its state, its
/// messages (each with its entity, number and sender), and its numbers and position. The bound
/// its place in the server's outbox is taken for (`SessionHandle::paced`).
fn acquire_len(action: &Action<EntityMsg>) -> usize {
    match action {
        Action::Acquire { state, messages, .. } => {
            96 + state.len() + messages.iter().map(|(_, m)| m.body.len() + 32).sum::<usize>()
        }
        _ => 0,
    }
}

/// Puts a message numbered `seq` in the waiting ACQUIRE at `at` of `slot`'s queue (from
/// [`World::waiting_acquire`]), after the messages already there. On the queues alone, so
/// that it can be called while an entity and a server of the world are borrowed.
pub(super) fn join(queues: &mut [VecDeque<Waiting>], (slot, at): (u32, usize), seq: u64, message: EntityMsg) {
    if let Some(Waiting { action: Action::Acquire { messages, .. }, .. }) =
        queues.get_mut(slot as usize).and_then(|q| q.get_mut(at))
    {
        messages.push((seq, message));
    }
}
