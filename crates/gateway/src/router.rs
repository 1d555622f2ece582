//! Where application messages go. A [`Router`] gets every request and push a session delivers;
//! the gateway ships [`EchoRouter`], which answers `echo` for the ping-pong bench and tests.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use prost::Message;
use std::sync::atomic::Ordering;
use tickwire_fanout::Version;
use tickwire_session::SessionId;
use tickwire_wire::proto::{EchoRequest, Envelope, Push, Request, Response, Status, envelope};
use tickwire_wire::{Parts, Payload, encode_message};

use tokio::sync::mpsc;

use crate::auth::Role;
use crate::flow::UpdateFlow;
use crate::outbox::Signals;
pub use crate::reply::Reply;

/// What a router is given when the gateway starts ([`Router::on_start`]). Made by the
/// gateway only, so that a field can be added without breaking routers.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Startup<'a> {
    /// One single-threaded runtime per I/O thread.
    pub runtimes: &'a [tokio::runtime::Handle],
    /// Cancelled when the gateway shuts down.
    pub stop: &'a tokio_util::sync::CancellationToken,
    /// Tasks tracked here (on any thread) are waited for by the gateway's shutdown.
    pub tracker: &'a tokio_util::task::TaskTracker,
}

/// What waits in a session's outbox.
#[derive(Debug)]
pub(crate) enum Outgoing {
    /// Delivered exactly once, in order, across resumes.
    Message(Bytes),
    /// The same, and the answer to one of the session's requests ([`Reply`]): the session's
    /// task counts it off the answers it is owed when it takes it.
    Answer(Bytes),
    /// A channel update: counted in the session's [`UpdateFlow`], and dropped on a resume if
    /// the client never got it (its channel then sends one merged delta instead).
    Update(Bytes),
    /// The same, still in parts: the session's task sends them as they are
    /// ([`PushParts::into_payload`]).
    UpdateParts(PushParts),
}

/// A way to send to one session from anywhere: a bounded outbox in front of its task.
#[derive(Debug, Clone)]
pub struct SessionHandle {
    pub(crate) id: SessionId,
    /// A small number naming this session inside the gateway (servers see it on messages).
    pub(crate) conn_id: u64,
    pub(crate) player_id: Arc<str>,
    /// From the credential: a player or a game server.
    pub(crate) role: Role,
    pub(crate) outbox: mpsc::Sender<Outgoing>,
    /// Shared with the session's task: whether a push found the outbox full, how many answers
    /// it is owed, and the bytes of messages queued (`outbox.rs`).
    pub(crate) signals: Arc<Signals>,
    /// Channel updates in flight to this session.
    pub(crate) flow: Arc<UpdateFlow>,
    /// The I/O thread the session's task runs on (`tickwire_transport::wake_batch::io_thread`),
    /// if any: work for the session can be done there.
    pub(crate) io: Option<usize>,
}

/// A push could not be queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    #[error("the session's outbox is full (slow consumer)")]
    Full,
    #[error("the session has ended")]
    Closed,
}

impl SessionHandle {
    /// A handle with no session task behind it, and the receiving end of its outbox, sized and
    /// limited as `config` sizes a real one's: for driving routers without sockets.
    #[cfg(any(test, feature = "harness"))]
    pub(crate) fn unattached(
        conn_id: u64,
        role: Role,
        config: &crate::GatewayConfig,
    ) -> (SessionHandle, mpsc::Receiver<Outgoing>) {
        let (outbox, rx) = mpsc::channel(config.limits.outbox_capacity);
        let handle = SessionHandle {
            id: SessionId([0; 16]),
            conn_id,
            player_id: format!("conn-{conn_id}").into(),
            role,
            outbox,
            signals: Arc::new(Signals::new(crate::outbox::max_bytes(config))),
            flow: Arc::new(UpdateFlow::for_config(config)),
            io: None,
        };
        (handle, rx)
    }

    pub fn id(&self) -> SessionId {
        self.id
    }

    pub fn player_id(&self) -> &str {
        &self.player_id
    }

    pub fn conn_id(&self) -> u64 {
        self.conn_id
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// A place in the outbox for the answer to request `id`, for a router that hands the
    /// request to another task (a channel's actor, the spatial world) and answers it from
    /// there. The place is held until [`Reply::send`], so the answer never finds the outbox
    /// full, however fast that task answers a burst. The session hands on no more requests
    /// while it is owed `outbox::max_answers_owed` answers, 8 by default (it leaves the
    /// client's later frames unread). `Err` is the answer to give at once when the outbox has
    /// no place: `UNAVAILABLE`, to retry.
    pub fn reply(&self, id: u64) -> Result<Reply, Response> {
        if self.signals.ending.load(Ordering::Relaxed) {
            // The session hands on what its client sent before it ended: run, not answered.
            return Ok(Reply::new(id, None));
        }
        match self.outbox.clone().try_reserve_owned() {
            Ok(place) => {
                self.signals.answers_owed.fetch_add(1, Ordering::Relaxed);
                Ok(Reply::new(id, Some(place)))
            }
            Err(mpsc::error::TrySendError::Full(_)) => Err(error_response(
                id,
                Status::Unavailable,
                "this session has no room for the answer: too many messages queued for it; retry".into(),
            )),
            Err(mpsc::error::TrySendError::Closed(_)) => {
                Err(error_response(id, Status::Unavailable, "the session has ended".into()))
            }
        }
    }

    /// Queues a one-way message if there is room, and otherwise reports `Full` without any
    /// consequence for the session: for messages a later one supersedes, like state updates
    /// that coalesce.
    pub fn offer(&self, topic: &str, body: Bytes) -> Result<(), PushError> {
        self.queue(
            Envelope { kind: Some(envelope::Kind::Push(Push { topic: topic.to_owned(), body })) },
            false,
        )
    }

    /// Queues a channel update (encoded with [`push_envelope`], so that one encoding can go to
    /// many sessions) from version `from` of `channel`, and counts it in the session's window
    /// of updates in flight. `Full` if the outbox is full, if the update would take the window
    /// past its ceiling, or if a resume dropped earlier updates of this channel since the caller
    /// chose `from` (the next pass rewinds it).
    pub(crate) fn offer_update(
        &self,
        now: Instant,
        channel: u64,
        from: Option<Version>,
        envelope: Bytes,
    ) -> Result<(), PushError> {
        let len = envelope.len();
        self.queue_update(now, channel, from, len, Outgoing::Update(envelope))
    }

    /// [`SessionHandle::offer_update`] for an update in parts, sent as they are by the session's
    /// task.
    pub(crate) fn offer_update_parts(
        &self,
        now: Instant,
        channel: u64,
        from: Option<Version>,
        update: PushParts,
    ) -> Result<(), PushError> {
        let len = update.encoded_len();
        self.queue_update(now, channel, from, len, Outgoing::UpdateParts(update))
    }

    fn queue_update(
        &self,
        now: Instant,
        channel: u64,
        from: Option<Version>,
        len: usize,
        update: Outgoing,
    ) -> Result<(), PushError> {
        let mut window = self.flow.lock();
        if window.has_rewind(channel) || !window.admits(len) {
            return Err(PushError::Full);
        }
        // Queued under the lock, so the window lists updates in the order the outbox holds them.
        self.try_send(update, false)?;
        window.queued(now, channel, from, len);
        Ok(())
    }

    fn queue(&self, envelope: Envelope, full_is_slow: bool) -> Result<(), PushError> {
        self.try_send(Outgoing::Message(encode_message(&envelope)), full_is_slow)
    }

    /// Queues `item`; a message (not an update) only within the outbox's byte budget too.
    fn try_send(&self, item: Outgoing, full_is_slow: bool) -> Result<(), PushError> {
        let bytes = match &item {
            Outgoing::Message(message) => message.len(),
            _ => 0,
        };
        let full = || {
            if full_is_slow {
                self.signals.slow.store(true, Ordering::Relaxed);
            }
            PushError::Full
        };
        if bytes > 0 && !self.signals.take_bytes(bytes, 0) {
            return Err(full());
        }
        self.outbox.try_send(item).map_err(|e| {
            self.signals.taken(bytes);
            match e {
                mpsc::error::TrySendError::Full(_) => full(),
                mpsc::error::TrySendError::Closed(_) => PushError::Closed,
            }
        })
    }

    /// Queues a one-way message without waiting. A full outbox is the caller's to handle:
    /// coalesce, drop, or end the session.
    pub fn push(&self, topic: &str, body: Bytes) -> Result<(), PushError> {
        self.queue(
            Envelope { kind: Some(envelope::Kind::Push(Push { topic: topic.to_owned(), body })) },
            true,
        )
    }

    /// A place in the outbox for a message a *client* sends this session (a `channel.send` to
    /// a channel's owner, a message to an entity's server), if the outbox has room to spare:
    /// a quarter of it stays for the gateway's own messages and the servers'. `Full`
    /// otherwise, with no consequence for the session: the sender is told to retry. So clients
    /// sending faster than a server reads never make that server a slow consumer.
    pub(crate) fn relay(&self, len: usize) -> Result<Relay<'_>, PushError> {
        self.place_leaving(4, len)
    }

    /// A place in the outbox for a message the gateway itself sends in bursts it can spread
    /// out (the spatial world's handovers: a server that registers into a slot of 300 waiting
    /// entities is due 300 ACQUIREs at once), if more than an eighth of the outbox is free;
    /// `Full` otherwise, and the caller sends it later. So the gateway never makes a session a
    /// slow consumer by its own burst, and its handovers go before what clients relay (which
    /// stops at a quarter free: [`SessionHandle::relay`]), never starved by them.
    pub(crate) fn paced(&self, len: usize) -> Result<Relay<'_>, PushError> {
        self.place_leaving(8, len)
    }

    /// A place in the outbox for a push whose body is at most `len` bytes, if a `1 / share`th
    /// of its places, and of its byte budget with the push counted in, stay free.
    fn place_leaving(&self, share: usize, len: usize) -> Result<Relay<'_>, PushError> {
        if self.outbox.is_closed() {
            return Err(PushError::Closed);
        }
        if self.outbox.capacity() <= self.outbox.max_capacity() / share {
            return Err(PushError::Full);
        }
        let counted = len + PUSH_HEAD;
        if !self.signals.take_bytes(counted, share) {
            return Err(PushError::Full);
        }
        match self.outbox.try_reserve() {
            Ok(place) => Ok(Relay { place: Some(place), signals: &self.signals, counted }),
            Err(e) => {
                self.signals.taken(counted);
                Err(match e {
                    mpsc::error::TrySendError::Full(()) => PushError::Full,
                    mpsc::error::TrySendError::Closed(()) => PushError::Closed,
                })
            }
        }
    }
}

/// The most bytes a push's envelope and topic add to its body (the topics the gateway pushes
/// are at most about 20 bytes).
const PUSH_HEAD: usize = 64;

/// A place held in a session's outbox ([`SessionHandle::relay`]), with the bytes counted in
/// for it in the outbox's budget: given back if it goes unused.
pub(crate) struct Relay<'a> {
    place: Option<mpsc::Permit<'a, Outgoing>>,
    signals: &'a Signals,
    counted: usize,
}

impl Relay<'_> {
    /// Queues a push in the place held, its bytes counted as they are.
    pub fn push(mut self, topic: &str, body: Bytes) {
        let envelope = Envelope { kind: Some(envelope::Kind::Push(Push { topic: topic.to_owned(), body })) };
        let message = encode_message(&envelope);
        self.signals.recount(std::mem::take(&mut self.counted), message.len());
        if let Some(place) = self.place.take() {
            place.send(Outgoing::Message(message));
        }
    }
}

impl Drop for Relay<'_> {
    fn drop(&mut self) {
        self.signals.taken(self.counted);
    }
}

/// A Push envelope, encoded once (for [`SessionHandle::offer_update`]).
pub(crate) fn push_envelope(topic: &str, body: Bytes) -> Bytes {
    encode_message(&Envelope { kind: Some(envelope::Kind::Push(Push { topic: topic.to_owned(), body })) })
}

/// A push envelope whose body is the concatenation of `parts`, not yet joined: for bodies
/// assembled from pieces encoded once and shared (the spatial world's `channel.updates`, one per
/// viewer from the cells' entries). The world's pass hands each session its parts, and the
/// session's task sends them as they are ([`PushParts::into_payload`]), copied once into its
/// write buffer: the pass copies no bytes and allocates one small list per viewer instead of
/// the whole message, and no one joins them.
#[derive(Debug)]
pub(crate) struct PushParts {
    pub topic: &'static str,
    pub parts: Vec<Bytes>,
}

/// A length-delimited field's size: a one-byte tag, the length, the body.
pub(crate) fn field_len(len: usize) -> usize {
    1 + prost::encoding::encoded_len_varint(len as u64) + len
}

impl PushParts {
    /// The sizes of the body and of `Push { topic = 1; body = 2 }` (an empty field is left
    /// out, as prost does).
    fn lens(&self) -> (usize, usize) {
        let body_len: usize = self.parts.iter().map(Bytes::len).sum();
        let push_len = (if self.topic.is_empty() { 0 } else { field_len(self.topic.len()) })
            + if body_len == 0 { 0 } else { field_len(body_len) };
        (body_len, push_len)
    }

    /// The length of [`PushParts::join`], without joining.
    pub fn encoded_len(&self) -> usize {
        field_len(self.lens().1)
    }

    /// Writes what comes before the parts (the envelope's and the push's tags and lengths, and
    /// the topic), given [`PushParts::lens`].
    fn put_head(&self, buf: &mut impl bytes::BufMut, (body_len, push_len): (usize, usize)) {
        use prost::encoding::encode_varint;
        // Envelope { push = 3 }: tag (3 << 3 | 2).
        buf.put_u8(0x1a);
        encode_varint(push_len as u64, buf);
        if !self.topic.is_empty() {
            buf.put_u8(0x0a);
            encode_varint(self.topic.len() as u64, buf);
            buf.put_slice(self.topic.as_bytes());
        }
        if body_len > 0 {
            buf.put_u8(0x12);
            encode_varint(body_len as u64, buf);
        }
    }

    /// The same bytes as [`push_envelope`] with the concatenation of the parts as the body,
    /// written in one pass.
    pub fn join(&self) -> Bytes {
        let lens = self.lens();
        let mut buf = bytes::BytesMut::with_capacity(field_len(lens.1));
        self.put_head(&mut buf, lens);
        for part in &self.parts {
            buf.extend_from_slice(part);
        }
        buf.freeze()
    }

    /// The message as the session sends it: the head inline and the parts still shared, so it
    /// is copied once, into the connection's write buffer, and what the session keeps until the
    /// client acknowledges it is its length. Joined if the head does not fit ([`Parts::MAX_HEAD`];
    /// a topic of about 40 bytes or more).
    pub fn into_payload(self) -> Payload {
        let lens = self.lens();
        let (body_len, push_len) = lens;
        let len = field_len(push_len) - body_len;
        if len > Parts::MAX_HEAD {
            return Payload::Whole(self.join());
        }
        let mut head = [0u8; Parts::MAX_HEAD];
        self.put_head(&mut &mut head[..], lens);
        Parts::new(&head[..len], self.parts).expect("the head fits: checked above").into()
    }
}

/// Application logic behind the gateway. Called on the session's own task, so a slow router
/// slows only that session; hand long work to another task, with a [`Reply`] to answer through
/// ([`SessionHandle::reply`]).
pub trait Router: Send + Sync + 'static {
    /// Answers a request. `None` means no response is sent now: none at all, or one later
    /// through a [`Reply`] taken here.
    fn on_request(&self, session: &SessionHandle, request: Request) -> Option<Response>;

    /// A one-way message from the client.
    fn on_push(&self, _session: &SessionHandle, _push: Push) {}

    /// The session has ended for good (closed, expired or shut down).
    fn on_session_closed(&self, _session: &SessionHandle) {}

    /// The gateway started: a router that runs tasks of its own can spread them over the I/O
    /// threads' runtimes, or start threads of its own, and ends them when `startup.stop` is
    /// cancelled (the gateway shuts down). What it runs under `startup.tracker` is waited for
    /// by [`RunningGateway::shutdown`](crate::RunningGateway::shutdown). An error (no thread
    /// could be started) stops the gateway from starting.
    fn on_start(&self, _startup: &Startup<'_>) -> std::io::Result<()> {
        Ok(())
    }

    /// Figures of the router's own, read at each scrape of `/metrics`.
    fn gauges(&self) -> Vec<Gauge> {
        Vec::new()
    }
}

/// One figure for the metrics endpoint: a name, labels and a value, exported as a gauge, or
/// as a counter when it only ever grows.
#[derive(Debug, Clone, PartialEq)]
pub struct Gauge {
    pub name: &'static str,
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
    /// Exported with Prometheus type `counter`.
    pub counter: bool,
}

impl Gauge {
    pub fn new(name: &'static str, value: f64) -> Gauge {
        Gauge { name, labels: Vec::new(), value, counter: false }
    }

    /// A figure that only grows (a total since the start).
    pub fn counter(name: &'static str, value: u64) -> Gauge {
        Gauge { name, labels: Vec::new(), value: value as f64, counter: true }
    }

    pub fn label(mut self, key: &'static str, value: impl Into<String>) -> Gauge {
        self.labels.push((key, value.into()));
        self
    }
}

/// Answers `echo` requests with a body of the requested size; anything else is NOT_FOUND.
#[derive(Debug)]
pub struct EchoRouter {
    zeros: Bytes,
}

impl EchoRouter {
    /// `max_body` caps the response size a client may ask for.
    pub fn new(max_body: usize) -> EchoRouter {
        EchoRouter { zeros: Bytes::from(vec![0u8; max_body]) }
    }
}

/// A response with an error status and no body.
pub fn error_response(id: u64, status: Status, error: String) -> Response {
    Response { id, status: status as i32, body: Bytes::new(), error }
}

impl Router for EchoRouter {
    fn on_request(&self, _session: &SessionHandle, request: Request) -> Option<Response> {
        let id = request.id;
        if request.method != "echo" {
            let msg = format!("unknown method `{}`", request.method);
            return Some(error_response(id, Status::NotFound, msg));
        }
        let echo = match EchoRequest::decode(request.body) {
            Ok(echo) => echo,
            Err(e) => {
                let msg = format!("malformed EchoRequest: {e}");
                return Some(error_response(id, Status::InvalidArgument, msg));
            }
        };
        let size = echo.response_bytes as usize;
        if size > self.zeros.len() {
            let msg = format!("response_bytes {size} exceeds the limit of {}", self.zeros.len());
            return Some(error_response(id, Status::InvalidArgument, msg));
        }
        Some(Response { id, status: Status::Ok as i32, body: self.zeros.slice(..size), error: String::new() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A relayed push counts its bound in the outbox's bytes while its place is held, then its
    /// size; a place dropped unused gives its bytes back; a relay that would leave less than a
    /// quarter of the bytes free is refused.
    #[test]
    fn a_relayed_push_is_counted_at_its_size_and_an_unused_place_gives_its_bytes_back() {
        let config = crate::GatewayConfig::load(None, &[]).unwrap();
        let budget = crate::outbox::max_bytes(&config);
        let (handle, mut rx) = SessionHandle::unattached(1, Role::Server, &config);
        let place = handle.relay(1_000).unwrap();
        assert_eq!(handle.signals.queued_bytes(), 1_000 + PUSH_HEAD);
        drop(place);
        assert_eq!(handle.signals.queued_bytes(), 0);
        handle.relay(1_000).unwrap().push("t", Bytes::from_static(b"small"));
        let Ok(Outgoing::Message(message)) = rx.try_recv() else { panic!("a message") };
        assert_eq!(handle.signals.queued_bytes(), message.len());
        assert_eq!(handle.relay(budget * 3 / 4).err(), Some(PushError::Full));
        assert!(handle.push("t", Bytes::from(vec![0; budget / 2])).is_ok(), "a push may use the kept share");
    }

    #[test]
    fn joined_parts_are_the_push_of_the_concatenation() {
        let parts: Vec<Bytes> =
            [&b"ab"[..], &[7u8; 300][..], b"", b"z"].iter().map(|p| Bytes::copy_from_slice(p)).collect();
        let whole: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        for topic in ["channel.updates", ""] {
            let update = PushParts { topic, parts: parts.clone() };
            let joined = update.join();
            assert_eq!(joined, push_envelope(topic, whole.clone().into()), "{topic:?}");
            assert_eq!(update.encoded_len(), joined.len(), "{topic:?}");
            let payload = PushParts { topic, parts: parts.clone() }.into_payload();
            assert!(matches!(payload, Payload::Parts(_)), "{topic:?}: sent as parts");
            assert_eq!(payload.into_bytes(), joined, "{topic:?}");
            let empty = PushParts { topic, parts: Vec::new() };
            assert_eq!(empty.join(), push_envelope(topic, Bytes::new()), "{topic:?}");
            assert_eq!(empty.encoded_len(), empty.join().len(), "{topic:?}");
        }
        // A topic too long for an inline head is joined.
        let long = PushParts { topic: "a.topic.name.longer.than.any.the.gateway.uses", parts: parts.clone() };
        let joined = long.join();
        let payload = long.into_payload();
        assert!(matches!(payload, Payload::Whole(_)));
        assert_eq!(payload.into_bytes(), joined);
    }
}
