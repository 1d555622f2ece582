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
use tickwire_wire::proto::{CloseReason, Control, Welcome, control};
use tickwire_wire::{Frame, WireError, decode_control};
use tokio::sync::mpsc;
use tokio::time::sleep_until;

use crate::admission::{Open, SessionPlace};
use crate::auth::Role;
use crate::close::send_close;
use crate::flow::UpdateFlow;
use crate::outbox::Signals;
use crate::rate_limit::TokenBucket;
use crate::registry::Takeover;
use crate::router::{Outgoing, SessionHandle};
use crate::shared::Shared;
use crate::stats::Stats;

mod backlog;
mod inbound;
mod outbound;
use backlog::Backlog;

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
                signals: Arc::new(Signals::new(crate::outbox::max_bytes(&shared.config))),
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
        // the session (its Close, a slow-consumer close, its resume window), with no place
        // for the answers (none can go now, and none are counted as sent).
        let now = Instant::now();
        self.session.detach(now);
        self.handle.signals.ending.store(true, Ordering::Relaxed);
        self.dispatch_parked_at_end(now);
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
                let (places, bytes) = (
                    self.shared.config.limits.outbox_capacity,
                    crate::outbox::max_bytes(&self.shared.config),
                );
                return End::new(
                    CloseReason::SlowConsumer,
                    format!("this session's outbox is full ({places} messages, or {bytes} bytes of them)"),
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
        match self.session.on_timeout(Instant::now()) {
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
        let outbox = std::iter::from_fn(|| self.outbox.try_recv().ok()).map(|item| signals.took(item));
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
