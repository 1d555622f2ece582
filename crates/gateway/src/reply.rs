//! The answer a request is owed when a router hands it to another task (a channel's actor,
//! the spatial world): a place held in the session's outbox from the request on
//! ([`SessionHandle::reply`](crate::SessionHandle::reply)), so that the answer never finds the
//! outbox full, and answered exactly once, with `UNAVAILABLE` if it is dropped unanswered.

use tickwire_wire::encode_message;
use tickwire_wire::proto::{Envelope, Response, Status, envelope};
use tokio::sync::mpsc;

use crate::router::{Outgoing, error_response};

/// The answer owed to one request, with its place held in the session's outbox
/// ([`SessionHandle::reply`](crate::SessionHandle::reply)). A reply dropped unanswered
/// answers `UNAVAILABLE` as it goes, so no request is left without an answer and no place is
/// held for ever.
#[derive(Debug)]
pub struct Reply {
    id: u64,
    /// `None` for a request the session handed on as it ended: its answer could not go.
    place: Option<mpsc::OwnedPermit<Outgoing>>,
}

impl Reply {
    pub(crate) fn new(id: u64, place: Option<mpsc::OwnedPermit<Outgoing>>) -> Reply {
        Reply { id, place }
    }

    /// The id of the request this answers.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Queues the answer in the place held. The first answer goes; later ones are ignored.
    pub fn send(&mut self, response: Response) {
        debug_assert_eq!(response.id, self.id, "an answer to another request");
        if let Some(place) = self.place.take() {
            let envelope = Envelope { kind: Some(envelope::Kind::Response(response)) };
            place.send(Outgoing::Answer(encode_message(&envelope)));
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if self.place.is_some() {
            let msg = "the request was dropped before it was answered".to_owned();
            self.send(error_response(self.id, Status::Unavailable, msg));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use bytes::Bytes;

    use super::*;
    use crate::auth::Role;
    use crate::router::{PushError, SessionHandle};

    fn answer(item: Outgoing) -> Response {
        let Outgoing::Answer(bytes) = item else { panic!("an answer is an Answer") };
        match tickwire_wire::decode_envelope(bytes).unwrap() {
            envelope::Kind::Response(r) => r,
            other => panic!("not a response: {other:?}"),
        }
    }

    #[test]
    fn a_reply_holds_its_place_until_it_answers_once_and_a_dropped_one_answers_unavailable() {
        let config = crate::GatewayConfig::load(None, &["limits.outbox_capacity=2".into()]).unwrap();
        let (handle, mut rx) = SessionHandle::unattached(1, Role::Server, &config);
        let mut first = handle.reply(7).unwrap();
        let second = handle.reply(8).unwrap();
        assert_eq!(handle.outbox.capacity(), 0, "both places held");
        assert_eq!(handle.signals.answers_owed.load(Ordering::Relaxed), 2, "two answers owed");
        assert_eq!(handle.push("t", Bytes::new()), Err(PushError::Full), "nothing else fits");
        let refused = handle.reply(9).unwrap_err();
        assert_eq!((refused.id, refused.status()), (9, Status::Unavailable));
        drop(second);
        let r = answer(rx.try_recv().unwrap());
        assert_eq!((r.id, r.status()), (8, Status::Unavailable), "{}", r.error);
        first.send(Response {
            id: 7,
            status: Status::Ok as i32,
            body: Bytes::from_static(b"x"),
            error: String::new(),
        });
        first.send(error_response(7, Status::Internal, "a second answer".into()));
        drop(first);
        let r = answer(rx.try_recv().unwrap());
        assert_eq!((r.id, r.status(), &r.body[..]), (7, Status::Ok, &b"x"[..]));
        assert!(rx.try_recv().is_err(), "one answer each");
        assert_eq!(handle.outbox.capacity(), 2, "both places given back");
        assert_eq!(handle.signals.answers_owed.load(Ordering::Relaxed), 2, "until the task takes them");
    }

    /// A session that is ending hands on what its client sent with replies that hold no
    /// place: the requests run even with the outbox full, and their answers go nowhere.
    #[test]
    fn an_ending_session_gets_replies_without_places() {
        let config = crate::GatewayConfig::load(None, &["limits.outbox_capacity=1".into()]).unwrap();
        let (handle, mut rx) = SessionHandle::unattached(1, Role::Server, &config);
        let _held = handle.reply(1).unwrap();
        assert_eq!(handle.reply(2).unwrap_err().status(), Status::Unavailable, "the outbox is full");
        handle.signals.ending.store(true, Ordering::Relaxed);
        let mut late = handle.reply(3).expect("a reply, without a place");
        late.send(error_response(3, Status::Internal, "goes nowhere".into()));
        drop(late);
        assert!(rx.try_recv().is_err(), "nothing queued");
        assert_eq!(handle.signals.answers_owed.load(Ordering::Relaxed), 1, "only the first is owed");
    }
}
