//! The session state machine.
//!
//! Each direction numbers its DATA frames 1, 2, 3, … Each side remembers `last_received`, the
//! highest sequence number it delivered, and acknowledges it cumulatively: on every DATA and
//! HEARTBEAT frame it sends, and in a standalone ACK after `ack_every` unacknowledged arrivals.
//! Sent payloads stay in a bounded retransmit buffer until acknowledged. On resume, each side
//! learns the other's `last_received` from the handshake and resends everything after it; the
//! receiver drops anything at or below its own `last_received`. That gives exactly-once,
//! in-order delivery across connections.
//!
//! Timers are not armed per send. The shell asks [`Session::poll_timeout`] for the one deadline
//! that matters and calls [`Session::on_timeout`] when it passes; a deadline that moved later in
//! the meantime simply reports [`Timeout::Nothing`] and the shell re-arms once.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;
use tickwire_wire::{Frame, Payload};

use crate::{SessionConfig, SessionError};

/// Which end of the session this is. Only clients run a heartbeat timer; servers answer
/// heartbeats, so an idle session costs the server one read and one write per heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

/// What an incoming frame amounted to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// A new application message, to hand to the application.
    Deliver(Bytes),
    /// A message delivered before (a retransmission after resume); already handled.
    Duplicate,
    /// An ACK or HEARTBEAT: bookkeeping only.
    Nothing,
}

/// What a passed deadline means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Timeout {
    /// The deadline moved on; ask [`Session::poll_timeout`] again.
    Nothing,
    /// Send this heartbeat.
    Transmit(Frame),
    /// Nothing arrived within the read timeout: drop the connection, keep the session.
    LinkDead,
    /// No connection resumed the session within the resume window: it is over.
    Expired,
}

#[derive(Debug, Clone, Copy)]
enum Link {
    Attached { last_rx: Instant, last_tx: Instant },
    Detached { since: Instant },
}

/// What the retransmit buffer keeps of a message sent and not yet acknowledged.
#[derive(Debug)]
enum Kept {
    /// Resent on resume.
    Payload(Payload),
    /// A replaceable message ([`Session::send_replaceable`]): dropped on resume, never resent,
    /// so only its length is kept, for the bound on unacknowledged bytes.
    Replaceable(usize),
}

impl Kept {
    fn len(&self) -> usize {
        match self {
            Kept::Payload(payload) => payload.len(),
            Kept::Replaceable(len) => *len,
        }
    }
}

/// One end of a reliable session.
#[derive(Debug)]
pub struct Session {
    role: Role,
    config: SessionConfig,
    link: Link,
    /// Sequence number the next sent message gets.
    next_seq: u64,
    /// Highest sequence number the peer acknowledged.
    peer_acked: u64,
    /// Messages `peer_acked + 1 ..next_seq`, oldest first.
    unacked: VecDeque<Kept>,
    unacked_bytes: usize,
    /// Highest sequence number delivered to our application.
    last_received: u64,
    /// Highest `last_received` value we have told the peer.
    ack_sent: u64,
    /// A heartbeat answer is owed (server role).
    heartbeat_owed: bool,
    /// An ACK is owed to a client that sent DATA after the server had been silent for half a
    /// heartbeat (server role): a client that keeps sending sends no heartbeats, and must hear
    /// from the server within its read timeout.
    ack_owed: bool,
    /// When the oldest message delivered and not yet acknowledged arrived.
    unacked_since: Option<Instant>,
    /// Payload bytes delivered since the last acknowledgement we sent.
    received_bytes_unacked: usize,
}

impl Session {
    /// A new session with a live connection.
    pub fn new(role: Role, config: SessionConfig, now: Instant) -> Session {
        Session {
            role,
            config,
            link: Link::Attached { last_rx: now, last_tx: now },
            next_seq: 1,
            peer_acked: 0,
            unacked: VecDeque::new(),
            unacked_bytes: 0,
            last_received: 0,
            ack_sent: 0,
            heartbeat_owed: false,
            ack_owed: false,
            unacked_since: None,
            received_bytes_unacked: 0,
        }
    }

    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    pub fn is_attached(&self) -> bool {
        matches!(self.link, Link::Attached { .. })
    }

    /// Highest sequence number delivered to the application; sent in the resume handshake.
    pub fn last_received(&self) -> u64 {
        self.last_received
    }

    /// Messages and payload bytes waiting for the peer's acknowledgement.
    pub fn unacked(&self) -> (usize, usize) {
        (self.unacked.len(), self.unacked_bytes)
    }

    /// Whether a message of `len` payload bytes can be sent now without passing the bounds of
    /// the resend buffer ([`SessionConfig::max_unacked_messages`] and `max_unacked_bytes`): a
    /// sender that waits for acknowledgements while this is false never gets
    /// [`SessionError::RetransmitOverflow`] from a message that fits the bounds alone.
    pub fn has_room(&self, len: usize) -> bool {
        self.unacked.len() < self.config.max_unacked_messages
            && self.unacked_bytes.saturating_add(len) <= self.config.max_unacked_bytes
    }

    /// Highest sequence number the peer acknowledged.
    pub fn peer_acked(&self) -> u64 {
        self.peer_acked
    }

    /// The sequence number the next message sent gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Queues an application message. Returns the DATA frame to write now, or `None` while
    /// detached (the message goes out on resume).
    pub fn send(&mut self, now: Instant, payload: impl Into<Payload>) -> Result<Option<Frame>, SessionError> {
        self.send_as(now, payload.into(), false)
    }

    /// [`Session::send`] for a message that a later one supersedes (a state update that the
    /// next update merges into). It is delivered exactly once in order like any other while the
    /// connection lasts; but if the connection is replaced before the peer received it, it is
    /// dropped on [`Session::attach`] instead of resent, and the messages after it are
    /// renumbered. The caller then sends what replaces it.
    pub fn send_replaceable(
        &mut self,
        now: Instant,
        payload: impl Into<Payload>,
    ) -> Result<Option<Frame>, SessionError> {
        self.send_as(now, payload.into(), true)
    }

    fn send_as(
        &mut self,
        now: Instant,
        payload: Payload,
        replaceable: bool,
    ) -> Result<Option<Frame>, SessionError> {
        let (messages, bytes) = (self.unacked.len() + 1, self.unacked_bytes + payload.len());
        if !self.has_room(payload.len()) {
            return Err(SessionError::RetransmitOverflow { messages, bytes });
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.unacked.push_back(if replaceable {
            Kept::Replaceable(payload.len())
        } else {
            Kept::Payload(payload.clone())
        });
        self.unacked_bytes = bytes;
        let Link::Attached { last_tx, .. } = &mut self.link else {
            return Ok(None);
        };
        *last_tx = now;
        self.acked_all();
        self.heartbeat_owed = false;
        Ok(Some(Frame::Data { seq, ack: self.last_received, payload }))
    }

    /// Feeds one DATA, ACK or HEARTBEAT frame from the current connection.
    pub fn on_frame(&mut self, now: Instant, frame: Frame) -> Result<Received, SessionError> {
        let Link::Attached { last_rx, last_tx } = &mut self.link else {
            return Err(SessionError::Detached);
        };
        *last_rx = now;
        let last_tx = *last_tx;
        match frame {
            Frame::Control(_) => Err(SessionError::NotASessionFrame),
            Frame::Ack { ack } => {
                self.on_ack(ack)?;
                Ok(Received::Nothing)
            }
            Frame::Heartbeat { ack } => {
                self.on_ack(ack)?;
                if self.role == Role::Server
                    && now.saturating_duration_since(last_tx) >= self.config.heartbeat / 2
                {
                    self.heartbeat_owed = true;
                }
                Ok(Received::Nothing)
            }
            Frame::Data { seq, ack, payload } => {
                self.on_ack(ack)?;
                let expected = self.last_received + 1;
                if seq < expected {
                    Ok(Received::Duplicate)
                } else if seq > expected {
                    Err(SessionError::SequenceGap { expected, got: seq })
                } else {
                    self.last_received = seq;
                    self.received_bytes_unacked += payload.len();
                    if self.role == Role::Server
                        && now.saturating_duration_since(last_tx) >= self.config.heartbeat / 2
                    {
                        self.ack_owed = true;
                    }
                    Ok(Received::Deliver(payload.into_bytes()))
                }
            }
        }
    }

    fn on_ack(&mut self, ack: u64) -> Result<(), SessionError> {
        let sent = self.next_seq - 1;
        if ack > sent {
            return Err(SessionError::AckOutOfRange { ack, sent });
        }
        while self.peer_acked < ack {
            let kept = self.unacked.pop_front().expect("unacked holds every unacked message");
            self.unacked_bytes -= kept.len();
            self.peer_acked += 1;
        }
        Ok(())
    }

    /// The message just delivered asks for an acknowledgement within `ack_delay` (the peer
    /// paces what it sends by them, as the gateway does channel state). Others are acknowledged
    /// by the next frame that goes out, or after `ack_every` messages.
    pub fn ack_soon(&mut self, now: Instant) {
        if self.last_received > self.ack_sent {
            self.unacked_since.get_or_insert(now);
        }
    }

    /// Everything delivered so far is being acknowledged in the frame going out.
    fn acked_all(&mut self) {
        self.ack_owed = false;
        self.ack_sent = self.last_received;
        self.unacked_since = None;
        self.received_bytes_unacked = 0;
    }

    /// When a standalone ACK becomes due, if anything delivered is unacknowledged.
    fn ack_deadline(&self) -> Option<Instant> {
        self.unacked_since.map(|since| since + self.config.ack_delay)
    }

    /// A frame the session wants sent now that no application message carries: a heartbeat
    /// answer, or an ACK once `ack_every` messages (or `ack_bytes` bytes) are unacknowledged, or
    /// (server role) to DATA after half a heartbeat of silence.
    /// Call after each batch
    /// of incoming frames.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Frame> {
        let Link::Attached { last_tx, .. } = &mut self.link else {
            return None;
        };
        let ack_due = self.last_received - self.ack_sent >= self.config.ack_every
            || (self.last_received > self.ack_sent && self.received_bytes_unacked >= self.config.ack_bytes)
            || self.unacked_since.is_some_and(|since| now >= since + self.config.ack_delay)
            || self.ack_owed;
        let frame = if self.heartbeat_owed {
            Frame::Heartbeat { ack: self.last_received }
        } else if ack_due {
            Frame::Ack { ack: self.last_received }
        } else {
            return None;
        };
        *last_tx = now;
        self.heartbeat_owed = false;
        self.acked_all();
        Some(frame)
    }

    /// The next instant at which [`Session::on_timeout`] has something to do.
    pub fn poll_timeout(&self) -> Instant {
        match self.link {
            Link::Attached { last_rx, last_tx } => {
                let dead = last_rx + self.config.read_timeout;
                let next = match self.role {
                    Role::Client => dead.min(last_tx + self.config.heartbeat),
                    Role::Server => dead,
                };
                self.ack_deadline().map_or(next, |ack| next.min(ack))
            }
            Link::Detached { since } => since + self.config.resume_window,
        }
    }

    /// Handles a passed deadline.
    pub fn on_timeout(&mut self, now: Instant) -> Timeout {
        match &mut self.link {
            Link::Attached { last_rx, last_tx } => {
                if now >= *last_rx + self.config.read_timeout {
                    return Timeout::LinkDead;
                }
                if self.role == Role::Client && now >= *last_tx + self.config.heartbeat {
                    *last_tx = now;
                    let ack = self.last_received;
                    self.acked_all();
                    return Timeout::Transmit(Frame::Heartbeat { ack });
                }
                if self.unacked_since.is_some_and(|since| now >= since + self.config.ack_delay) {
                    *last_tx = now;
                    let ack = self.last_received;
                    self.acked_all();
                    return Timeout::Transmit(Frame::Ack { ack });
                }
                Timeout::Nothing
            }
            Link::Detached { since } => {
                if now >= *since + self.config.resume_window {
                    Timeout::Expired
                } else {
                    Timeout::Nothing
                }
            }
        }
    }

    /// The connection is gone. The session waits up to the resume window for a new one.
    pub fn detach(&mut self, now: Instant) {
        if self.is_attached() {
            self.link = Link::Detached { since: now };
            self.heartbeat_owed = false;
            self.unacked_since = None;
        }
    }

    /// A new connection carries on the session. `peer_last_received` comes from the resume
    /// handshake. Returns the frames to resend, in order, before anything else: every message
    /// the peer lacks except replaceable ones, which are dropped (the peer never saw them or
    /// their sequence numbers, so the rest are renumbered from `peer_last_received + 1`).
    pub fn attach(&mut self, now: Instant, peer_last_received: u64) -> Result<Vec<Frame>, SessionError> {
        if peer_last_received < self.peer_acked {
            return Err(SessionError::AckWentBackwards {
                claimed: peer_last_received,
                acked: self.peer_acked,
            });
        }
        self.on_ack(peer_last_received)?;
        self.link = Link::Attached { last_rx: now, last_tx: now };
        self.acked_all();
        self.heartbeat_owed = false;
        self.unacked.retain(|kept| matches!(kept, Kept::Payload(_)));
        self.unacked_bytes = self.unacked.iter().map(Kept::len).sum();
        self.next_seq = self.peer_acked + 1 + self.unacked.len() as u64;
        let first = self.peer_acked + 1;
        Ok(self
            .unacked
            .iter()
            .zip(first..)
            .filter_map(|(kept, seq)| match kept {
                Kept::Payload(payload) => {
                    Some(Frame::Data { seq, ack: self.last_received, payload: payload.clone() })
                }
                Kept::Replaceable(_) => None,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tickwire_wire::Parts;

    use super::*;

    fn pair(now: Instant) -> (Session, Session) {
        let config = SessionConfig::default();
        (Session::new(Role::Client, config.clone(), now), Session::new(Role::Server, config, now))
    }

    #[test]
    fn data_is_delivered_and_acked_by_piggyback() {
        let t = Instant::now();
        let (mut c, mut s) = pair(t);
        let f = c.send(t, Bytes::from_static(b"ping")).unwrap().unwrap();
        assert_eq!(s.on_frame(t, f).unwrap(), Received::Deliver(Bytes::from_static(b"ping")));
        let reply = s.send(t, Bytes::from_static(b"pong")).unwrap().unwrap();
        assert_eq!(reply, Frame::Data { seq: 1, ack: 1, payload: Bytes::from_static(b"pong").into() });
        c.on_frame(t, reply).unwrap();
        assert_eq!(c.unacked(), (0, 0));
        assert_eq!(s.unacked(), (1, 4));
    }

    #[test]
    fn overflow_by_count_and_by_bytes() {
        let t = Instant::now();
        let config = SessionConfig { max_unacked_messages: 2, max_unacked_bytes: 10, ..Default::default() };
        let mut s = Session::new(Role::Server, config, t);
        assert!(s.has_room(10) && !s.has_room(11));
        s.send(t, Bytes::from_static(b"12345")).unwrap();
        assert!(!s.has_room(6), "has_room agrees with send");
        assert_eq!(
            s.send(t, Bytes::from_static(b"123456")),
            Err(SessionError::RetransmitOverflow { messages: 2, bytes: 11 })
        );
        assert!(s.has_room(1));
        s.send(t, Bytes::from_static(b"1")).unwrap();
        assert!(!s.has_room(0), "no room by count");
        assert!(matches!(s.send(t, Bytes::new()), Err(SessionError::RetransmitOverflow { messages: 3, .. })));
    }

    #[test]
    fn gaps_and_bogus_acks_are_errors() {
        let t = Instant::now();
        let (_, mut s) = pair(t);
        assert_eq!(
            s.on_frame(t, Frame::Data { seq: 2, ack: 0, payload: Bytes::new().into() }),
            Err(SessionError::SequenceGap { expected: 1, got: 2 })
        );
        assert_eq!(
            s.on_frame(t, Frame::Ack { ack: 1 }),
            Err(SessionError::AckOutOfRange { ack: 1, sent: 0 })
        );
        assert_eq!(s.on_frame(t, Frame::Control(Bytes::new())), Err(SessionError::NotASessionFrame));
    }

    #[test]
    fn client_heartbeats_when_idle_and_server_answers() {
        let t = Instant::now();
        let (mut c, mut s) = pair(t);
        let hb = c.config().heartbeat;
        assert_eq!(c.poll_timeout(), t + hb);
        assert_eq!(s.poll_timeout(), t + hb * 2);
        let Timeout::Transmit(beat) = c.on_timeout(t + hb) else { panic!("expected heartbeat") };
        assert_eq!(c.poll_timeout(), t + hb * 2);
        s.on_frame(t + hb, beat).unwrap();
        assert_eq!(s.poll_transmit(t + hb), Some(Frame::Heartbeat { ack: 0 }));
        assert_eq!(s.poll_transmit(t + hb), None);
        assert_eq!(s.poll_timeout(), t + hb * 3);
    }

    /// A client that sends DATA more often than its heartbeat sends no heartbeats; with nothing
    /// for it from the server, the server's ACKs keep its link alive.
    #[test]
    fn a_client_that_only_sends_hears_from_the_server_within_its_read_timeout() {
        let t = Instant::now();
        let (mut c, mut s) = pair(t);
        let hb = c.config().heartbeat;
        let mut now = t;
        let mut acks = 0;
        // A push every 0.4 heartbeat for 20 heartbeats.
        for _ in 0..50 {
            now += hb * 2 / 5;
            assert_ne!(c.on_timeout(now), Timeout::LinkDead, "at {:?}", now - t);
            let push = c.send(now, Bytes::from_static(b"input")).unwrap().unwrap();
            assert!(matches!(s.on_frame(now, push).unwrap(), Received::Deliver(_)));
            if let Some(frame) = s.poll_transmit(now) {
                assert!(matches!(frame, Frame::Ack { .. }), "{frame:?}");
                acks += 1;
                c.on_frame(now, frame).unwrap();
            }
        }
        // One ACK per silence of half a heartbeat: every other push here.
        assert_eq!(acks, 25);
        // A server that sent within half a heartbeat owes nothing.
        let reply = s.send(now, Bytes::from_static(b"state")).unwrap().unwrap();
        c.on_frame(now, reply).unwrap();
        let push = c.send(now + hb / 4, Bytes::from_static(b"input")).unwrap().unwrap();
        s.on_frame(now + hb / 4, push).unwrap();
        assert_eq!(s.poll_transmit(now + hb / 4), None);
    }

    #[test]
    fn read_timeout_kills_the_link_and_resume_window_the_session() {
        let t = Instant::now();
        let (_, mut s) = pair(t);
        let cfg = s.config().clone();
        assert_eq!(s.on_timeout(t + cfg.read_timeout - Duration::from_millis(1)), Timeout::Nothing);
        assert_eq!(s.on_timeout(t + cfg.read_timeout), Timeout::LinkDead);
        s.detach(t + cfg.read_timeout);
        let end = t + cfg.read_timeout + cfg.resume_window;
        assert_eq!(s.poll_timeout(), end);
        assert_eq!(s.on_timeout(end - Duration::from_millis(1)), Timeout::Nothing);
        assert_eq!(s.on_timeout(end), Timeout::Expired);
    }

    #[test]
    fn ack_every_triggers_a_standalone_ack() {
        let t = Instant::now();
        let (mut c, mut s) = pair(t);
        for _ in 0..16 {
            let f = s.send(t, Bytes::from_static(b"x")).unwrap().unwrap();
            c.on_frame(t, f).unwrap();
            if c.last_received() < 16 {
                assert_eq!(c.poll_transmit(t), None);
            }
        }
        let ack = c.poll_transmit(t).unwrap();
        assert_eq!(ack, Frame::Ack { ack: 16 });
        s.on_frame(t, ack).unwrap();
        assert_eq!(s.unacked(), (0, 0));
    }

    #[test]
    fn ack_bytes_triggers_a_standalone_ack() {
        let t = Instant::now();
        let config = SessionConfig { ack_bytes: 100, ..Default::default() };
        let mut c = Session::new(Role::Client, config, t);
        let mut s = Session::new(Role::Server, SessionConfig::default(), t);
        let f = s.send(t, Bytes::from(vec![0; 60])).unwrap().unwrap();
        c.on_frame(t, f).unwrap();
        assert_eq!(c.poll_transmit(t), None, "60 of 100 bytes");
        let f = s.send(t, Bytes::from(vec![0; 40])).unwrap().unwrap();
        c.on_frame(t, f).unwrap();
        assert_eq!(c.poll_transmit(t), Some(Frame::Ack { ack: 2 }));
        let f = s.send(t, Bytes::from(vec![0; 60])).unwrap().unwrap();
        c.on_frame(t, f).unwrap();
        assert_eq!(c.poll_transmit(t), None, "the count starts again after an ack");
    }

    #[test]
    fn acking_within_a_peers_bounds_halves_them() {
        let c = SessionConfig::default().acking_within(20, 1000);
        assert_eq!((c.ack_every, c.ack_bytes), (10, 500));
        let c = SessionConfig::default().acking_within(1024, 1 << 20);
        assert_eq!((c.ack_every, c.ack_bytes), (16, 1 << 19), "never later than our own defaults");
        let c = SessionConfig::default().acking_within(0, 0);
        assert_eq!(c, SessionConfig::default(), "0: an older server that does not say");
        let c = SessionConfig::default().acking_within(1, 1);
        assert_eq!((c.ack_every, c.ack_bytes), (1, 1));
    }

    #[test]
    fn resume_resends_only_what_the_peer_lacks() {
        let t = Instant::now();
        let (mut c, mut s) = pair(t);
        let frames: Vec<_> = (0..3u8).map(|i| s.send(t, Bytes::from(vec![i])).unwrap().unwrap()).collect();
        c.on_frame(t, frames[0].clone()).unwrap();
        s.detach(t);
        c.detach(t);
        assert_eq!(s.send(t, Bytes::from_static(&[3])).unwrap(), None);
        let resent = s.attach(t, c.last_received()).unwrap();
        assert_eq!(resent.len(), 3);
        c.attach(t, s.last_received()).unwrap();
        let mut got = Vec::new();
        for f in resent {
            if let Received::Deliver(p) = c.on_frame(t, f).unwrap() {
                got.push(p[0]);
            }
        }
        assert_eq!(got, vec![1, 2, 3]);
        assert_eq!(s.attach(t, 0), Err(SessionError::AckWentBackwards { claimed: 0, acked: 1 }));
    }

    #[test]
    fn an_ack_goes_out_within_the_ack_delay() {
        let t = Instant::now();
        let (mut c, mut s) = pair(t);
        let delay = c.config().ack_delay;
        let f = s.send(t, Bytes::from_static(b"x")).unwrap().unwrap();
        c.on_frame(t + delay, f).unwrap();
        assert_eq!(c.poll_timeout(), t + c.config().heartbeat, "an ordinary message waits");
        c.ack_soon(t + delay);
        assert_eq!(c.poll_transmit(t + delay), None, "one message is not yet worth an ACK");
        assert_eq!(c.poll_timeout(), t + delay * 2);
        let f = s.send(t, Bytes::from_static(b"y")).unwrap().unwrap();
        c.on_frame(t + delay + delay / 2, f).unwrap();
        c.ack_soon(t + delay + delay / 2);
        assert_eq!(c.poll_timeout(), t + delay * 2, "the oldest unacknowledged arrival sets it");
        assert_eq!(c.on_timeout(t + delay * 2), Timeout::Transmit(Frame::Ack { ack: 2 }));
        assert_eq!(c.poll_timeout(), t + delay * 2 + c.config().heartbeat, "back to the heartbeat");
        // A message going out carries the ACK and cancels the timer.
        let f = s.send(t, Bytes::from_static(b"z")).unwrap().unwrap();
        c.on_frame(t + delay * 3, f).unwrap();
        c.ack_soon(t + delay * 3);
        c.send(t + delay * 3, Bytes::from_static(b"reply")).unwrap();
        assert_eq!(c.on_timeout(t + delay * 4), Timeout::Nothing);
    }

    #[test]
    fn replaceable_messages_the_peer_lacks_are_dropped_on_resume_and_the_rest_renumbered() {
        let t = Instant::now();
        let (mut c, mut s) = pair(t);
        let first = s.send_replaceable(t, Bytes::from_static(b"u1")).unwrap().unwrap();
        s.send(t, Bytes::from_static(b"m2")).unwrap();
        // Two sent as a head and parts: counted and resent as their bytes on the wire.
        s.send_replaceable(t, Parts::new(b"u", vec![Bytes::from_static(b"3")]).unwrap()).unwrap();
        s.send(t, Parts::new(b"m", vec![Bytes::new(), Bytes::from_static(b"4")]).unwrap()).unwrap();
        assert_eq!(s.unacked(), (4, 8));
        // The client got only the first before the link dropped.
        c.on_frame(t, first).unwrap();
        s.detach(t);
        c.detach(t);
        let resent = s.attach(t, c.last_received()).unwrap();
        let payloads: Vec<_> = resent
            .iter()
            .map(|f| match f {
                Frame::Data { seq, payload, .. } => (*seq, payload.clone().into_bytes()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(payloads, vec![(2, Bytes::from_static(b"m2")), (3, Bytes::from_static(b"m4"))]);
        assert_eq!(s.unacked(), (2, 4));
        assert_eq!(s.next_seq(), 4);
        // The client takes them in order, then a new message follows without a gap.
        c.attach(t, s.last_received()).unwrap();
        for f in resent {
            assert!(matches!(c.on_frame(t, f).unwrap(), Received::Deliver(_)));
        }
        let next = s.send(t, Bytes::from_static(b"m5")).unwrap().unwrap();
        assert!(matches!(c.on_frame(t, next).unwrap(), Received::Deliver(_)));
        assert_eq!(c.last_received(), 4);
    }
}
