//! The route of one entity's messages to the server that owns it, and the handover of that
//! ownership to another server without losing, duplicating or reordering a message.
//!
//! Every message for the entity (a client's input or RPC) gets the next sequence number and
//! goes to the owner. The owner reports how far it has processed. To hand the entity over, the
//! gateway stops sending to the old owner and asks it to release the entity; the old owner
//! answers with the last sequence number it processed (and will process nothing after it) and
//! the entity's state. The new owner then gets, in one acquire, the state and every message the
//! old owner had not processed, in order, followed by the messages that arrived meanwhile.
//!
//! Pure state machine: the caller does the sending ([`Action`]s) and feeds back what servers
//! answer. Messages waiting during a handover are bounded ([`Route::send`] refuses past the
//! bound, and the caller tells the client to slow down).

use std::collections::VecDeque;

/// A server, as the caller names it.
pub type ServerId = u64;

/// What the caller must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<M> {
    /// Send message `seq` to the owner.
    Deliver { to: ServerId, seq: u64, message: M },
    /// Ask the owner to release the entity for handover `handover`.
    Release { to: ServerId, handover: u64 },
    /// Give the entity to its new owner: its state, then these messages, in order.
    Acquire { to: ServerId, handover: u64, state: Vec<u8>, messages: Vec<(u64, M)> },
}

/// Why a call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("{0} messages are already waiting for a handover to finish")]
    Full(usize),
    #[error("a handover is already under way")]
    Busy,
    #[error("no handover {0} is under way")]
    UnknownHandover(u64),
    #[error("the release says {released} was processed, but only {sent} was sent")]
    BadRelease { released: u64, sent: u64 },
}

#[derive(Debug)]
enum Phase<M> {
    Owned,
    /// Waiting for the old owner's release; messages meanwhile wait here.
    HandingOver {
        handover: u64,
        to: ServerId,
        waiting: VecDeque<(u64, M)>,
    },
}

/// One entity's route.
#[derive(Debug)]
pub struct Route<M> {
    owner: ServerId,
    next_seq: u64,
    /// Sent to the owner and not yet reported processed, in order.
    unprocessed: VecDeque<(u64, M)>,
    phase: Phase<M>,
    next_handover: u64,
    max_waiting: usize,
    /// What a message weighs (its bytes, for the caller's bound); 0 unless set.
    weight: fn(&M) -> usize,
    /// The weight of the messages in flight ([`Route::in_flight`]).
    bytes: usize,
}

impl<M: Clone> Route<M> {
    /// A route to `owner`; at most `max_waiting` messages wait during a handover.
    pub fn new(owner: ServerId, max_waiting: usize) -> Route<M> {
        Route {
            owner,
            next_seq: 1,
            unprocessed: VecDeque::new(),
            phase: Phase::Owned,
            next_handover: 1,
            max_waiting,
            weight: |_| 0,
            bytes: 0,
        }
    }

    /// [`Route::new`], also adding up what the messages in flight weigh by `weight`
    /// ([`Route::in_flight_bytes`]).
    pub fn with_weight(owner: ServerId, max_waiting: usize, weight: fn(&M) -> usize) -> Route<M> {
        Route { weight, ..Route::new(owner, max_waiting) }
    }

    /// The server that owns the entity (during a handover, still the old one).
    pub fn owner(&self) -> ServerId {
        self.owner
    }

    pub fn handing_over(&self) -> bool {
        matches!(self.phase, Phase::HandingOver { .. })
    }

    /// Messages not yet reported processed, sent or held: what a caller bounds.
    pub fn in_flight(&self) -> usize {
        let waiting = match &self.phase {
            Phase::Owned => 0,
            Phase::HandingOver { waiting, .. } => waiting.len(),
        };
        self.unprocessed.len() + waiting
    }

    /// What the messages in flight weigh together (see [`Route::with_weight`]): what an
    /// acquire would carry besides the state, for a caller that bounds it.
    pub fn in_flight_bytes(&self) -> usize {
        self.bytes
    }

    /// A message for the entity: delivered now, or held while a handover is under way.
    pub fn send(&mut self, message: M) -> Result<Option<Action<M>>, RouteError> {
        let seq = self.next_seq;
        let weight = (self.weight)(&message);
        match &mut self.phase {
            Phase::Owned => {
                self.next_seq += 1;
                self.bytes += weight;
                self.unprocessed.push_back((seq, message.clone()));
                Ok(Some(Action::Deliver { to: self.owner, seq, message }))
            }
            Phase::HandingOver { waiting, .. } => {
                if waiting.len() >= self.max_waiting {
                    return Err(RouteError::Full(waiting.len()));
                }
                self.next_seq += 1;
                self.bytes += weight;
                waiting.push_back((seq, message));
                Ok(None)
            }
        }
    }

    /// The owner has processed every message up to `seq`. Reports from a server that is no
    /// longer the owner are ignored.
    pub fn processed(&mut self, from: ServerId, seq: u64) {
        if from != self.owner {
            return;
        }
        while self.unprocessed.front().is_some_and(|(s, _)| *s <= seq) {
            if let Some((_, message)) = self.unprocessed.pop_front() {
                self.bytes -= (self.weight)(&message);
            }
        }
    }

    /// Starts handing the entity over to `to`: nothing more goes to the old owner.
    pub fn begin_handover(&mut self, to: ServerId) -> Result<Action<M>, RouteError> {
        if self.handing_over() {
            return Err(RouteError::Busy);
        }
        let handover = self.next_handover;
        self.next_handover += 1;
        self.phase = Phase::HandingOver { handover, to, waiting: VecDeque::new() };
        Ok(Action::Release { to: self.owner, handover })
    }

    /// Whether [`Route::released`] would take this release, changing nothing: for a caller that
    /// has more to check and change before it commits.
    pub fn check_release(&self, handover: u64, processed: u64) -> Result<(), RouteError> {
        let Phase::HandingOver { handover: current, waiting, .. } = &self.phase else {
            return Err(RouteError::UnknownHandover(handover));
        };
        if *current != handover {
            return Err(RouteError::UnknownHandover(handover));
        }
        // The held messages took the newest numbers and were never sent to the old owner.
        let sent = self.next_seq - 1 - waiting.len() as u64;
        if processed > sent {
            return Err(RouteError::BadRelease { released: processed, sent });
        }
        Ok(())
    }

    /// The old owner released the entity: it processed everything up to `processed` and
    /// nothing after, and `state` is the entity's state. The new owner gets the state and
    /// every message not processed, in order.
    pub fn released(
        &mut self,
        handover: u64,
        processed: u64,
        state: Vec<u8>,
    ) -> Result<Action<M>, RouteError> {
        self.check_release(handover, processed)?;
        let Phase::HandingOver { to, waiting, .. } = std::mem::replace(&mut self.phase, Phase::Owned) else {
            unreachable!("checked above");
        };
        self.processed(self.owner, processed);
        self.unprocessed.extend(waiting);
        self.owner = to;
        let messages: Vec<(u64, M)> = self.unprocessed.iter().cloned().collect();
        Ok(Action::Acquire { to, handover, state, messages })
    }
}

impl<M: Clone> Route<M> {
    /// The owner is gone without releasing the entity (its session ended), during a handover or
    /// not. `to` takes it: the state, and every message not reported processed, in order. The
    /// lost owner may have processed some of them without reporting it, so across a lost
    /// server delivery is at least once (an orderly handover is exactly once).
    pub fn lost(&mut self, to: ServerId, state: Vec<u8>) -> Action<M> {
        let handover = self.next_handover;
        self.next_handover += 1;
        if let Phase::HandingOver { waiting, .. } = std::mem::replace(&mut self.phase, Phase::Owned) {
            self.unprocessed.extend(waiting);
        }
        self.owner = to;
        let messages: Vec<(u64, M)> = self.unprocessed.iter().cloned().collect();
        Action::Acquire { to, handover, state, messages }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handover_forwards_what_the_old_owner_did_not_process() {
        let mut r: Route<&str> = Route::new(1, 10);
        assert_eq!(r.send("a").unwrap(), Some(Action::Deliver { to: 1, seq: 1, message: "a" }));
        assert_eq!(r.send("b").unwrap(), Some(Action::Deliver { to: 1, seq: 2, message: "b" }));
        r.processed(1, 1);
        assert_eq!(r.begin_handover(2).unwrap(), Action::Release { to: 1, handover: 1 });
        assert_eq!(r.begin_handover(3), Err(RouteError::Busy));
        assert_eq!(r.send("c").unwrap(), None, "held while the owner releases");
        assert_eq!(r.released(9, 1, vec![]), Err(RouteError::UnknownHandover(9)));
        assert_eq!(r.released(1, 5, vec![]), Err(RouteError::BadRelease { released: 5, sent: 2 }));
        // The old owner processed only "a": "b" and "c" go to the new one, in order.
        assert_eq!(
            r.released(1, 1, vec![7]).unwrap(),
            Action::Acquire { to: 2, handover: 1, state: vec![7], messages: vec![(2, "b"), (3, "c")] }
        );
        assert_eq!(r.owner(), 2);
        assert_eq!(r.send("d").unwrap(), Some(Action::Deliver { to: 2, seq: 4, message: "d" }));
    }

    #[test]
    fn the_weight_in_flight_follows_messages_through_a_handover() {
        let mut r: Route<&str> = Route::with_weight(1, 10, |m| m.len());
        r.send("aa").unwrap();
        r.send("bbb").unwrap();
        assert_eq!(r.in_flight_bytes(), 5);
        r.processed(1, 1);
        assert_eq!(r.in_flight_bytes(), 3);
        r.begin_handover(2).unwrap();
        r.send("cccc").unwrap();
        assert_eq!(r.in_flight_bytes(), 7, "held messages count");
        r.released(1, 1, vec![]).unwrap();
        assert_eq!(r.in_flight_bytes(), 7, "forwarded, not yet processed by the new owner");
        r.processed(1, 3);
        assert_eq!(r.in_flight_bytes(), 7, "the old owner's reports no longer count");
        r.processed(2, 3);
        assert_eq!(r.in_flight_bytes(), 0);
        r.send("d").unwrap();
        r.lost(3, vec![]);
        assert_eq!(r.in_flight_bytes(), 1, "a lost owner's messages go on to the next");
        assert_eq!(Route::<&str>::new(1, 10).in_flight_bytes(), 0);
    }

    #[test]
    fn a_release_cannot_claim_messages_held_back_from_the_old_owner() {
        let mut r: Route<u32> = Route::new(1, 10);
        r.send(1).unwrap();
        r.processed(1, 1);
        r.begin_handover(2).unwrap();
        r.send(2).unwrap(); // Held: number 2 never went to server 1.
        assert_eq!(r.released(1, 2, vec![]), Err(RouteError::BadRelease { released: 2, sent: 1 }));
        assert_eq!(
            r.released(1, 1, vec![]).unwrap(),
            Action::Acquire { to: 2, handover: 1, state: vec![], messages: vec![(2, 2)] }
        );
    }

    #[test]
    fn a_lost_owner_hands_everything_unreported_to_the_next() {
        let mut r: Route<u32> = Route::new(1, 10);
        r.send(1).unwrap();
        r.send(2).unwrap();
        r.processed(1, 1);
        r.begin_handover(2).unwrap();
        r.send(3).unwrap();
        assert_eq!(r.in_flight(), 2);
        // Server 1 died before releasing: 2 (sent, unreported) and 3 (held) go to server 3.
        assert_eq!(
            r.lost(3, vec![9]),
            Action::Acquire { to: 3, handover: 2, state: vec![9], messages: vec![(2, 2), (3, 3)] }
        );
        assert!(!r.handing_over());
        assert_eq!(r.send(4).unwrap(), Some(Action::Deliver { to: 3, seq: 4, message: 4 }));
        // A late release of the abandoned handover is refused.
        assert_eq!(r.released(1, 1, vec![]), Err(RouteError::UnknownHandover(1)));
    }

    #[test]
    fn waiting_is_bounded() {
        let mut r: Route<u32> = Route::new(1, 2);
        r.begin_handover(2).unwrap();
        r.send(1).unwrap();
        r.send(2).unwrap();
        assert_eq!(r.send(3), Err(RouteError::Full(2)));
    }
}
