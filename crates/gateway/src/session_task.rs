//! One task per session: it owns the [`Session`] state machine and, while attached, its
//! connection. It reads frames, feeds the session, dispatches messages to the router, drains
//! the session's bounded outbox, and keeps a single timer armed at the session's next deadline.
//! When the connection drops, the task stays and waits for a resume until the window closes.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Context;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use tickwire_session::{Received, ResumeToken, Session, SessionError, SessionId, Timeout};
use tickwire_transport::Conn;
use tickwire_transport::wake_batch::DeferrableWaker;
use tickwire_wire::proto::{CloseReason, Control, Envelope, Welcome, control, envelope};
use tickwire_wire::{Frame, Payload, WireError, decode_control, decode_envelope, encode_message};
use tokio::sync::mpsc;
use tokio::time::sleep_until;

use crate::admission::{Open, SessionPlace};
use crate::auth::Role;
use crate::close::send_close;
use crate::flow::UpdateFlow;
use crate::rate_limit::TokenBucket;
use crate::registry::Takeover;
use crate::router::{Outgoing, SessionHandle, Signals, max_answers_owed};
use crate::shared::Shared;
use crate::stats::Stats;

mod backlog;
use backlog::Backlog;

/// Outbox messages written per wake-up before the task checks its other inputs again.
const OUTBOX_BATCH: usize = 64;

/// Why the session ended; sent to the client when a connection is attached.
#[derive(Debug)]
struct End {
    reason: CloseReason,
    message: String,
}

impl End {
    fn new(reason: CloseReason, message: impl Into<String>) -> End {
        End { reason, message: message.into() }
    }
}

impl From<SessionError> for End {
    fn from(e: SessionError) -> End {
        let reason = match e {
            SessionError::RetransmitOverflow { .. } => CloseReason::RetransmitOverflow,
            _ => CloseReason::ProtocolError,
        };
        End::new(reason, e.to_string())
    }
}

impl From<WireError> for End {
    fn from(e: WireError) -> End {
        let reason = match e {
            WireError::FrameTooLarge { .. } => CloseReason::FrameTooLarge,
            _ => CloseReason::ProtocolError,
        };
        End::new(reason, e.to_string())
    }
}

pub(crate) struct SessionTask {
    shared: Arc<Shared>,
    handle: SessionHandle,
    token: ResumeToken,
    session: Session,
    /// The connection, with its place in its address's budget (freed when it goes).
    conn: Option<Conn>,
    open: Option<Open>,
    rbuf: BytesMut,
    wbuf: BytesMut,
    outbox: mpsc::Receiver<Outgoing>,
    /// The waker the outbox is polled with: fan-out passes on other I/O threads wake this task
    /// in a batch (`tickwire_transport::wake_batch`).
    outbox_waker: DeferrableWaker,
    takeovers: mpsc::Receiver<Box<Takeover>>,
    bucket: TokenBucket,
    /// The client's acknowledgement last reported to the update window.
    acked: u64,
    /// The server's messages waiting for room in the session's resend buffer, and the
    /// client's waiting for the reply before them to go (`backlog.rs`).
    backlog: Backlog,
}

/// The payload length `item` takes in the session's resend buffer.
fn outgoing_len(item: &Outgoing) -> usize {
    match item {
        Outgoing::Message(message) | Outgoing::Answer(message) | Outgoing::Update(message) => message.len(),
        Outgoing::UpdateParts(update) => update.encoded_len(),
    }
}

/// `item`, just taken from the outbox: an answer is counted off those the session is owed
/// (and is a message from then on).
fn took(signals: &Signals, item: Outgoing) -> Outgoing {
    match item {
        Outgoing::Answer(message) => {
            signals.answers_owed.fetch_sub(1, Ordering::Relaxed);
            Outgoing::Message(message)
        }
        item => item,
    }
}

/// The next message in the outbox, polled with the task's deferrable waker.
async fn recv_outbox(outbox: &mut mpsc::Receiver<Outgoing>, waker: &mut DeferrableWaker) -> Option<Outgoing> {
    std::future::poll_fn(|cx| outbox.poll_recv(&mut Context::from_waker(waker.get(cx.waker())))).await
}

/// Reads from the connection if there is one; otherwise never completes.
async fn read_conn(conn: &mut Option<Conn>, buf: &mut BytesMut) -> io::Result<usize> {
    match conn {
        Some(conn) => conn.read(buf).await,
        None => std::future::pending().await,
    }
}

/// A session the handshake has let in: who it is, and its place in the session budgets.
pub(crate) struct NewSession {
    pub(crate) id: SessionId,
    pub(crate) token: ResumeToken,
    pub(crate) player_id: String,
    pub(crate) role: Role,
    /// Its place in the session budgets (none for a game server).
    pub(crate) place: Option<SessionPlace>,
}

impl SessionTask {
    pub(crate) fn spawn(shared: Arc<Shared>, conn: (Conn, Open), rbuf: BytesMut, new: NewSession) {
        let NewSession { id, token, player_id, role, place } = new;
        let now = Instant::now();
        let limits = &shared.config.limits;
        let (outbox_tx, outbox) = mpsc::channel(limits.outbox_capacity);
        let (takeover_tx, takeovers) = mpsc::channel(1);
        shared.registry.insert(id, token, takeover_tx, place);
        Stats::add(&shared.stats.sessions_open, 1);
        let task = SessionTask {
            handle: SessionHandle {
                id,
                conn_id: shared.next_conn_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                player_id: player_id.into(),
                role,
                outbox: outbox_tx,
                signals: Arc::default(),
                flow: Arc::new(UpdateFlow::for_config(&shared.config)),
                io: tickwire_transport::wake_batch::io_thread(),
            },
            token,
            session: Session::new(tickwire_session::Role::Server, shared.session_config.clone(), now),
            conn: None,
            open: None,
            rbuf,
            wbuf: BytesMut::new(),
            outbox,
            outbox_waker: DeferrableWaker::default(),
            takeovers,
            bucket: match role {
                Role::Player => TokenBucket::new(limits.messages_per_second, limits.message_burst, now),
                Role::Server => {
                    TokenBucket::new(limits.server_messages_per_second, limits.server_message_burst, now)
                }
            },
            acked: 0,
            backlog: Backlog::default(),
            shared: shared.clone(),
        };
        shared.tracker.spawn(task.run(conn));
    }

    async fn run(mut self, first: (Conn, Open)) {
        let end = match Box::pin(self.attach_new(first)).await {
            Ok(()) => self.serve().await,
            Err(end) => end,
        };
        tracing::debug!(session = %self.handle.id, reason = ?end.reason, message = %end.message, "session ended");
        self.shared.stats.closed(end.reason);
        let conn = self.take_conn();
        // What the client sent was acknowledged: what still waited is handled, whatever ended
        // the session (its Close, a slow-consumer close, its resume window), replies or not
        // (none can go now).
        self.dispatch_parked_at_end(Instant::now());
        if let Some(mut conn) = conn {
            Box::pin(send_close(&mut conn, end.reason, &end.message)).await;
        }
        self.shared.registry.remove(&self.handle.id);
        Stats::sub(&self.shared.stats.sessions_open, 1);
        self.shared.router.on_session_closed(&self.handle);
    }

    fn welcome(&self, resumed: bool) -> Frame {
        let cfg = self.session.config();
        let millis = |d: std::time::Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX);
        Frame::control(&Control {
            kind: Some(control::Kind::Welcome(Welcome {
                session_id: Bytes::copy_from_slice(&self.handle.id.0),
                resume_token: Bytes::copy_from_slice(&self.token.0),
                resumed,
                last_received: self.session.last_received(),
                heartbeat_ms: millis(cfg.heartbeat),
                resume_window_ms: millis(cfg.resume_window),
                max_frame_bytes: self.shared.decoder.max_frame_bytes(),
                player_id: self.handle.player_id.to_string(),
                ack_delay_ms: millis(cfg.ack_delay),
                connection_id: self.handle.conn_id,
                max_unacked_messages: u32::try_from(cfg.max_unacked_messages).unwrap_or(u32::MAX),
                max_unacked_bytes: u32::try_from(cfg.max_unacked_bytes).unwrap_or(u32::MAX),
            })),
        })
    }

    /// Attaches a connection. Every attach goes through here, and every detach through
    /// [`SessionTask::take_conn`], so the `connections_open` gauge stays right.
    fn put_conn(&mut self, (mut conn, open): (Conn, Open)) {
        // Logged in (or resumed): its reads are no longer bounded as a stranger's.
        conn.logged_in();
        self.conn = Some(conn);
        self.open = Some(open);
        Stats::add(&self.shared.stats.connections_open, 1);
    }

    /// Detaches the connection, if any, and drops its buffers.
    fn take_conn(&mut self) -> Option<Conn> {
        self.open = None;
        let conn = self.conn.take()?;
        Stats::sub(&self.shared.stats.connections_open, 1);
        // Frames left unread were not acknowledged: the client sends them again on a resume.
        self.backlog.set_input_held(false);
        self.rbuf = BytesMut::new();
        self.wbuf.clear();
        Some(conn)
    }

    async fn attach_new(&mut self, conn: (Conn, Open)) -> Result<(), End> {
        self.put_conn(conn);
        self.welcome(false).encode(&mut self.wbuf);
        self.flush().await;
        self.on_input(Instant::now()).await
    }

    async fn serve(&mut self) -> End {
        // Made once: a `cancelled()` future made per wake-up registers and unregisters a waiter
        // each time, a cost every idle session's heartbeat paid. And polled only when the
        // token woke it: each poll of it locks the token's node and its waiter list, which
        // every session shares.
        let cancelled = tickwire_transport::when_woken(self.shared.cancel.clone().cancelled_owned());
        let half_timeout = self.session.config().read_timeout / 2;
        let deadline = sleep_until(self.session.poll_timeout().into());
        tokio::pin!(deadline, cancelled);
        loop {
            let attached = self.conn.is_some();
            let step = tokio::select! {
                biased;
                () = &mut cancelled => Err(End::new(CloseReason::Shutdown, "the gateway is shutting down")),
                Some(takeover) = self.takeovers.recv() => Box::pin(self.on_takeover(*takeover)).await,
                read = read_conn(&mut self.conn, &mut self.rbuf), if attached && !self.backlog.input_held() => match read {
                    Ok(0) | Err(_) => {
                        self.drop_link();
                        Ok(())
                    }
                    Ok(n) => {
                        Stats::add(&self.shared.stats.bytes_in, n as u64);
                        self.on_input(Instant::now()).await
                    }
                },
                Some(msg) = recv_outbox(&mut self.outbox, &mut self.outbox_waker), if attached && self.backlog.waiting_is_empty() => {
                    self.on_outbox(msg).await
                }
                () = &mut deadline => Box::pin(self.on_deadline()).await,
            };
            if let Err(end) = step {
                return end;
            }
            if self.handle.signals.slow.load(Ordering::Relaxed) {
                let queued = self.shared.config.limits.outbox_capacity;
                return End::new(
                    CloseReason::SlowConsumer,
                    format!("more than {queued} messages queued for this session"),
                );
            }
            // Deadlines only move later with traffic, so the timer is not re-armed per message.
            // It is re-armed when it fires, when the deadline moves earlier (attach/detach),
            // and when a step finds it less than half a read timeout away: that last one
            // happens at most once per half timeout, on a wake-up we are having anyway, and
            // keeps the timer of a healthy idle session from ever firing.
            let next = self.session.poll_timeout().into();
            let soon = deadline.deadline() < tokio::time::Instant::now() + half_timeout;
            if deadline.is_elapsed() || next < deadline.deadline() || (soon && next > deadline.deadline()) {
                deadline.as_mut().reset(next);
            }
        }
    }

    async fn on_deadline(&mut self) -> Result<(), End> {
        let now = Instant::now();
        if self.resumes_input() {
            // The outbox has room, though no message came to say so (a place held for an
            // instant by another sender and given back unused).
            self.on_input(now).await?;
        }
        match self.session.on_timeout(now) {
            Timeout::Nothing => Ok(()),
            Timeout::Transmit(frame) => {
                frame.encode(&mut self.wbuf);
                self.flush().await;
                Ok(())
            }
            Timeout::LinkDead => {
                self.drop_link();
                Ok(())
            }
            Timeout::Expired => Err(End::new(CloseReason::ResumeFailed, "resume window expired")),
        }
    }

    fn drop_link(&mut self) {
        if self.take_conn().is_some() {
            Stats::add(&self.shared.stats.drops, 1);
            self.session.detach(Instant::now());
        }
    }

    async fn on_takeover(&mut self, takeover: Takeover) -> Result<(), End> {
        let now = Instant::now();
        if let Some(mut old) = self.take_conn() {
            self.session.detach(now);
            self.shared.stats.closed(CloseReason::Replaced);
            send_close(&mut old, CloseReason::Replaced, "session resumed on another connection").await;
        }
        let mut conn = takeover.conn;
        let (resend, queued) = match self.attach(now, takeover.last_received) {
            Ok(attached) => attached,
            Err(e) => {
                // The client claims to have lost what it acknowledged: the session cannot go on.
                let end = End::new(CloseReason::ResumeFailed, e.to_string());
                send_close(&mut conn, end.reason, &end.message).await;
                return Err(end);
            }
        };
        Stats::add(&self.shared.stats.sessions_resumed, 1);
        self.put_conn((conn, takeover.open));
        self.rbuf = takeover.buf;
        self.wbuf.clear();
        self.welcome(true).encode(&mut self.wbuf);
        for frame in resend {
            frame.encode(&mut self.wbuf);
        }
        for message in queued {
            self.send(now, message)?;
        }
        self.flush().await;
        self.on_input(now).await
    }

    /// Carries the session on over a new connection whose client holds every message up to
    /// `last_received`. Channel updates it never got are dropped, from the session's resend
    /// buffer and from the outbox alike, and their channels rewound, so that each sends one
    /// merged delta instead of the backlog; all under the update window's lock, so no channel
    /// queues an update on a base that was just dropped. Returns the frames to resend and the
    /// messages that were waiting in the outbox, to send after them.
    fn attach(&mut self, now: Instant, last_received: u64) -> Result<(Vec<Frame>, Vec<Bytes>), SessionError> {
        let flow = self.handle.flow.clone();
        let mut window = flow.lock();
        let mut queued = Vec::new();
        let waiting = self.backlog.take_waiting();
        let signals = self.handle.signals.clone();
        let outbox = std::iter::from_fn(|| self.outbox.try_recv().ok()).map(|item| took(&signals, item));
        for item in waiting.into_iter().chain(outbox) {
            if let Outgoing::Message(message) = item {
                queued.push(message);
            }
        }
        let resend = self.session.attach(now, last_received)?;
        flow.resumed(&mut window, last_received);
        self.acked = self.session.peer_acked();
        Ok((resend, queued))
    }

    /// Decodes and handles every complete frame in the read buffer, then writes the replies.
    async fn on_input(&mut self, now: Instant) -> Result<(), End> {
        // WebSocket pings and pongs count like frames, so a ping flood is limited too.
        let controls = self.conn.as_mut().map_or(0, Conn::take_control_messages);
        for _ in 0..controls {
            if !self.bucket.take(now) {
                return Err(End::new(
                    CloseReason::RateLimited,
                    "frame rate limit exceeded (WebSocket control messages)",
                ));
            }
        }
        self.backlog.set_input_held(false);
        while self.conn.is_some() {
            if self.hold_input() {
                self.backlog.set_input_held(true);
                break;
            }
            let Some(frame) = self.shared.decoder.decode(&mut self.rbuf)? else { break };
            match frame {
                Frame::Control(body) => match decode_control(body)? {
                    control::Kind::Close(close) => {
                        // What waited is handled as the session ends (`run`).
                        self.take_conn();
                        return Err(End::new(
                            CloseReason::Normal,
                            format!("client closed: {}", close.message),
                        ));
                    }
                    _ => {
                        return Err(End::new(
                            CloseReason::ProtocolError,
                            "unexpected control message after the handshake",
                        ));
                    }
                },
                frame => {
                    // Every frame counts, so a flood of ACKs or HEARTBEATs is limited too.
                    if !self.bucket.take(now) {
                        return Err(End::new(CloseReason::RateLimited, "frame rate limit exceeded"));
                    }
                    if let Received::Deliver(payload) = self.session.on_frame(now, frame)? {
                        Stats::add(&self.shared.stats.messages_in, 1);
                        if self.backlog.parked_is_empty() && !self.must_hold() {
                            self.dispatch(now, payload)?;
                        } else {
                            self.park(payload)?;
                        }
                    }
                }
            }
        }
        self.send_waiting(now)?;
        self.dispatch_parked(now)?;
        if let Some(frame) = self.session.poll_transmit(now) {
            frame.encode(&mut self.wbuf);
        }
        let acked = self.session.peer_acked();
        if acked != self.acked {
            self.acked = acked;
            self.handle.flow.lock().acked(now, acked);
        }
        if self.rbuf.is_empty() {
            // Idle sessions hold no read buffer.
            self.rbuf = BytesMut::new();
        }
        self.flush().await;
        Ok(())
    }

    fn dispatch(&mut self, now: Instant, payload: Bytes) -> Result<(), End> {
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
    fn send(&mut self, now: Instant, message: Bytes) -> Result<(), End> {
        self.put(now, Outgoing::Message(message), &mut Vec::new())?;
        self.backlog.note_reply();
        Ok(())
    }

    /// Keeps a message of the client's while the ones before it wait ([`SessionTask::must_hold`],
    /// while something waits for room); a client that keeps sending while it does not
    /// acknowledge its replies is closed as slow. Copied: the payload
    /// is a slice of the read buffer, and would keep all of it.
    fn park(&mut self, payload: Bytes) -> Result<(), End> {
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
    fn must_hold(&mut self) -> bool {
        self.backlog.reply_waiting() || self.owed_enough()
    }

    /// Whether the session is owed [`max_answers_owed`] answers to the client's requests by
    /// the channels and the world ([`SessionHandle::reply`]), held or queued: the client's next
    /// request then waits, so that its answer will find a place. Each answer owed comes to
    /// the outbox (given, or `UNAVAILABLE` if dropped) and wakes the task.
    fn owed_enough(&self) -> bool {
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
    fn hold_input(&self) -> bool {
        self.backlog.waiting_is_empty() && self.owed_enough()
    }

    /// Whether the client's frames were left unread and need not be any longer.
    fn resumes_input(&self) -> bool {
        self.backlog.input_held() && !self.hold_input()
    }

    /// Handles the client's messages that waited, in order, until one must wait again.
    fn dispatch_parked(&mut self, now: Instant) -> Result<(), End> {
        while !self.backlog.parked_is_empty() && !self.must_hold() {
            let Some(payload) = self.backlog.pop_parked() else { break };
            self.dispatch(now, payload)?;
        }
        Ok(())
    }

    /// The session is ending: every message of the client's that waited is handled, in order;
    /// their replies, which cannot go, are dropped.
    fn dispatch_parked_at_end(&mut self, now: Instant) {
        drop(self.backlog.take_waiting());
        while let Some(payload) = self.backlog.pop_parked() {
            // An error here is the reply's (the router has had the message) or a malformed
            // message's: either way the session is ending, and the next message is the next.
            let _ = self.dispatch(now, payload);
            drop(self.backlog.take_waiting());
        }
    }

    /// Queues a DATA frame the session produced (none while detached) for the next flush.
    fn write_data(&mut self, frame: Option<Frame>) {
        if let Some(frame) = frame {
            frame.encode(&mut self.wbuf);
            Stats::add(&self.shared.stats.messages_out, 1);
        }
    }

    /// Sends a channel update, noting its sequence number for the window.
    fn send_update(&mut self, now: Instant, update: Payload, updates: &mut Vec<u64>) -> Result<(), End> {
        updates.push(self.session.next_seq());
        let frame = self.session.send_replaceable(now, update)?;
        self.write_data(frame);
        Ok(())
    }

    async fn on_outbox(&mut self, first: Outgoing) -> Result<(), End> {
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
            self.put(now, took(&self.handle.signals, next), &mut updates)?;
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
    fn put(&mut self, now: Instant, item: Outgoing, updates: &mut Vec<u64>) -> Result<(), End> {
        if !self.backlog.waiting_is_empty() || self.must_wait(&item) {
            if self.backlog.waiting_len() >= self.shared.config.limits.outbox_capacity {
                return Err(End::new(
                    CloseReason::SlowConsumer,
                    format!("more than {} messages waiting for acknowledgements", self.backlog.waiting_len()),
                ));
            }
            self.backlog.push_waiting(item);
            return Ok(());
        }
        self.send_now(now, item, updates)
    }

    fn send_now(&mut self, now: Instant, item: Outgoing, updates: &mut Vec<u64>) -> Result<(), End> {
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
    fn must_wait(&self, item: &Outgoing) -> bool {
        !self.session.has_room(outgoing_len(item)) && self.session.unacked().0 > 0
    }

    /// Sends what waited for room, in order, as far as the room now goes.
    fn send_waiting(&mut self, now: Instant) -> Result<(), End> {
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
    fn updates_sent(&self, updates: Vec<u64>) {
        if !updates.is_empty() {
            let mut window = self.handle.flow.lock();
            for seq in updates {
                window.sent(seq);
            }
        }
    }

    /// Writes the pending output. A failed or stalled write drops the connection; the session
    /// keeps everything unacknowledged for the resume.
    async fn flush(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            self.wbuf.clear();
            return;
        };
        if self.wbuf.is_empty() {
            return;
        }
        let limit = self.shared.config.limits.write_timeout;
        let len = self.wbuf.len() as u64;
        match tokio::time::timeout(limit, conn.write_all(&self.wbuf)).await {
            Ok(Ok(())) => {
                Stats::add(&self.shared.stats.bytes_out, len);
                self.wbuf.clear();
            }
            Ok(Err(_)) | Err(_) => self.drop_link(),
        }
    }
}
