//! One session driven from the caller's task.
//!
//! [`Connection::next_event`] only reads and runs timers, so it is cancel-safe and can sit in
//! a `select!` next to the caller's own work. Everything that must be written (messages, acks,
//! heartbeats) collects in a buffer that [`Connection::flush`] writes; call it before every
//! `next_event`. A lost link is an event, not an error: call [`Connection::resume`] to carry on.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::pin::Pin;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tickwire_session::{Received, ResumeToken, Role, Session, SessionConfig, SessionId, Timeout};
use tickwire_transport::{Conn, TlsClient};
use tickwire_wire::proto::{
    Close, CloseReason, Control, Envelope, Hello, Push, Request, Response, ResumeRequest, Welcome, control,
    envelope,
};
use tickwire_wire::{Frame, FrameDecoder, decode_control, decode_envelope, encode_message};
use tokio::time::{Sleep, sleep_until};

use crate::{ClientError, Target};

/// How to reach the gateway and who we are.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    pub target: Target,
    /// Auth token (a JWT in production mode; in dev mode, the wanted player id or empty).
    pub token: String,
    pub client_name: String,
    /// Local address to connect from (spreads many connections over loopback sources).
    pub local_addr: Option<IpAddr>,
    pub handshake_timeout: Duration,
    /// Largest frame accepted from the server before its Welcome; after it, the larger of this
    /// and the Welcome's `max_frame_bytes` (docs/protocol.md §2: the server sends no frame
    /// longer than its own maximum).
    pub max_frame_bytes: u32,
    /// The certificates to trust and the name to expect, for `tls://` and `wss://` targets.
    pub tls: Option<TlsClient>,
}

impl ConnectOptions {
    pub fn new(target: Target) -> ConnectOptions {
        ConnectOptions {
            target,
            token: String::new(),
            client_name: "tickwire-client".to_owned(),
            local_addr: None,
            handshake_timeout: Duration::from_secs(10),
            max_frame_bytes: tickwire_wire::DEFAULT_MAX_FRAME_BYTES,
            tls: None,
        }
    }
}

/// What the server sent, or what happened to the link.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Request(Request),
    Response(Response),
    Push(Push),
    /// The connection dropped or timed out; the session waits for [`Connection::resume`].
    LinkLost,
    /// The server ended the session; resuming is pointless.
    Closed {
        reason: CloseReason,
        message: String,
    },
}

/// A client session and its current connection.
pub struct Connection {
    opts: ConnectOptions,
    conn: Option<Conn>,
    session: Session,
    id: SessionId,
    token: ResumeToken,
    welcome: Welcome,
    decoder: FrameDecoder,
    rbuf: BytesMut,
    wbuf: BytesMut,
    events: VecDeque<Event>,
    deadline: Pin<Box<Sleep>>,
    closed: bool,
    bytes_in: u64,
    bytes_out: u64,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("session", &self.id)
            .field("attached", &self.conn.is_some())
            .finish()
    }
}

fn hello(opts: &ConnectOptions, resume: Option<ResumeRequest>) -> Frame {
    Frame::control(&Control {
        kind: Some(control::Kind::Hello(Hello {
            protocol_version: 1,
            token: opts.token.clone(),
            resume,
            client_name: opts.client_name.clone(),
        })),
    })
}

/// Opens a transport, sends `hello`, and waits for the Welcome, all within the handshake
/// timeout (a TCP connect alone can otherwise retry SYNs for minutes).
async fn handshake(
    opts: &ConnectOptions,
    hello: Frame,
    decoder: &FrameDecoder,
) -> Result<(Conn, Welcome, BytesMut), ClientError> {
    tokio::time::timeout(opts.handshake_timeout, handshake_inner(opts, hello, decoder))
        .await
        .map_err(|_| ClientError::HandshakeTimeout)?
}

async fn handshake_inner(
    opts: &ConnectOptions,
    hello: Frame,
    decoder: &FrameDecoder,
) -> Result<(Conn, Welcome, BytesMut), ClientError> {
    let mut conn = opts.target.connect(opts.local_addr, opts.max_frame_bytes, opts.tls.as_ref()).await?;
    let mut buf = BytesMut::new();
    hello.encode(&mut buf);
    conn.write_all(&buf).await?;
    buf.clear();
    let read_welcome = async {
        loop {
            if let Some(frame) = decoder.decode(&mut buf)? {
                let Frame::Control(body) = frame else {
                    return Err(ClientError::Protocol("expected Welcome, got a session frame".into()));
                };
                return match decode_control(body)? {
                    control::Kind::Welcome(w) => Ok(w),
                    control::Kind::Close(c) => {
                        Err(ClientError::Closed { reason: c.reason(), message: c.message })
                    }
                    control::Kind::Hello(_) => Err(ClientError::Protocol("server sent a Hello".into())),
                };
            }
            if conn.read(&mut buf).await? == 0 {
                return Err(ClientError::HandshakeClosed);
            }
        }
    };
    let welcome = read_welcome.await?;
    Ok((conn, welcome, buf))
}

impl Connection {
    /// Opens a new session.
    pub async fn connect(opts: ConnectOptions) -> Result<Connection, ClientError> {
        let decoder = FrameDecoder::new(opts.max_frame_bytes);
        let (conn, welcome, rbuf) = handshake(&opts, hello(&opts, None), &decoder).await?;
        let decoder = FrameDecoder::new(opts.max_frame_bytes.max(welcome.max_frame_bytes));
        let bad = || ClientError::Protocol("Welcome carries a malformed session id or token".into());
        let id = SessionId::from_slice(&welcome.session_id).ok_or_else(bad)?;
        let token = ResumeToken::from_slice(&welcome.resume_token).ok_or_else(bad)?;
        let heartbeat = Duration::from_millis(u64::from(welcome.heartbeat_ms.max(1)));
        let defaults = SessionConfig::default().with_heartbeat(heartbeat);
        let config = SessionConfig {
            resume_window: Duration::from_millis(u64::from(welcome.resume_window_ms)),
            // An older server sends 0: no bound of its own, keep ours.
            ack_delay: match welcome.ack_delay_ms {
                0 => defaults.ack_delay,
                ms => Duration::from_millis(u64::from(ms)),
            },
            ..defaults
        }
        .acking_within(welcome.max_unacked_messages, welcome.max_unacked_bytes);
        let now = Instant::now();
        let session = Session::new(Role::Client, config, now);
        let deadline = Box::pin(sleep_until(session.poll_timeout().into()));
        let mut connection = Connection {
            opts,
            conn: Some(conn),
            session,
            id,
            token,
            welcome,
            decoder,
            rbuf,
            wbuf: BytesMut::new(),
            events: VecDeque::new(),
            deadline,
            closed: false,
            bytes_in: 0,
            bytes_out: 0,
        };
        connection.on_input(now)?;
        Ok(connection)
    }

    pub fn session_id(&self) -> SessionId {
        self.id
    }

    /// The Welcome of the latest connection (player id, heartbeat, resume window).
    pub fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    pub fn is_attached(&self) -> bool {
        self.conn.is_some()
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Bytes read and written on this session's connections so far (after the handshake).
    pub fn byte_counts(&self) -> (u64, u64) {
        (self.bytes_in, self.bytes_out)
    }

    /// Reconnects and resumes the session. Everything unacknowledged is resent in both
    /// directions; nothing is delivered twice.
    pub async fn resume(&mut self) -> Result<(), ClientError> {
        if self.closed {
            return Err(ClientError::Shutdown);
        }
        self.lose_link();
        let resume = ResumeRequest {
            session_id: Bytes::copy_from_slice(&self.id.0),
            resume_token: Bytes::copy_from_slice(&self.token.0),
            last_received: self.session.last_received(),
        };
        let hello = hello(&self.opts, Some(resume));
        let (conn, welcome, rbuf) = match handshake(&self.opts, hello, &self.decoder).await {
            // Closed before the gateway read the Hello (docs/protocol.md §9): the session is
            // still there for a later try.
            Err(e @ ClientError::Closed { .. }) if e.is_retryable() => return Err(e),
            Err(ClientError::Closed { reason, message }) => {
                self.closed = true;
                return Err(ClientError::Closed { reason, message });
            }
            other => other?,
        };
        if !welcome.resumed {
            return Err(ClientError::Protocol("server answered a resume with a new session".into()));
        }
        let now = Instant::now();
        let resend = self.session.attach(now, welcome.last_received)?;
        for frame in resend {
            frame.encode(&mut self.wbuf);
        }
        self.welcome = welcome;
        self.conn = Some(conn);
        self.rbuf = rbuf;
        self.on_input(now)?;
        Ok(())
    }

    /// Queues one application message; it goes out on the next [`Connection::flush`], or
    /// after the next resume if the link is down.
    pub fn send(&mut self, envelope: &Envelope) -> Result<(), ClientError> {
        if self.closed {
            return Err(ClientError::Shutdown);
        }
        if let Some(frame) = self.session.send(Instant::now(), encode_message(envelope))? {
            frame.encode(&mut self.wbuf);
        }
        Ok(())
    }

    /// Queues a request.
    pub fn send_request(&mut self, id: u64, method: &str, body: Bytes) -> Result<(), ClientError> {
        let request = Request { id, method: method.to_owned(), body };
        self.send(&Envelope { kind: Some(envelope::Kind::Request(request)) })
    }

    /// Writes everything queued. A write failure becomes a [`Event::LinkLost`].
    pub async fn flush(&mut self) {
        let Some(conn) = self.conn.as_mut() else { return };
        if self.wbuf.is_empty() {
            return;
        }
        match conn.write_all(&self.wbuf).await {
            Ok(()) => {
                self.bytes_out += self.wbuf.len() as u64;
                self.wbuf.clear();
            }
            Err(_) => {
                self.lose_link();
                self.events.push_back(Event::LinkLost);
            }
        }
    }

    /// Waits for the next event. `Ok(None)` means the session did some housekeeping (an ack or
    /// heartbeat is queued): call [`Connection::flush`] and then this again. Cancel-safe.
    pub async fn next_event(&mut self) -> Result<Option<Event>, ClientError> {
        if let Some(event) = self.events.pop_front() {
            return Ok(Some(event));
        }
        if self.closed {
            return Err(ClientError::Shutdown);
        }
        let Some(conn) = self.conn.as_mut() else { return Ok(Some(Event::LinkLost)) };
        tokio::select! {
            read = conn.read(&mut self.rbuf) => match read {
                Ok(0) | Err(_) => {
                    self.lose_link();
                    return Ok(Some(Event::LinkLost));
                }
                Ok(n) => {
                    self.bytes_in += n as u64;
                    self.on_input(Instant::now())?;
                }
            },
            () = &mut self.deadline => {
                match self.session.on_timeout(Instant::now()) {
                    Timeout::Nothing => {}
                    Timeout::Transmit(frame) => frame.encode(&mut self.wbuf),
                    Timeout::LinkDead | Timeout::Expired => {
                        self.lose_link();
                        return Ok(Some(Event::LinkLost));
                    }
                }
            }
        }
        let next = self.session.poll_timeout().into();
        if self.deadline.is_elapsed() || next < self.deadline.deadline() {
            self.deadline.as_mut().reset(next);
        }
        Ok(self.events.pop_front())
    }

    fn on_input(&mut self, now: Instant) -> Result<(), ClientError> {
        while let Some(frame) = self.decoder.decode(&mut self.rbuf)? {
            match frame {
                Frame::Control(body) => match decode_control(body)? {
                    control::Kind::Close(close) => {
                        self.closed = true;
                        self.conn = None;
                        self.events
                            .push_back(Event::Closed { reason: close.reason(), message: close.message });
                        return Ok(());
                    }
                    _ => return Err(ClientError::Protocol("unexpected control message".into())),
                },
                frame => {
                    if let Received::Deliver(payload) = self.session.on_frame(now, frame)? {
                        self.events.push_back(match decode_envelope(payload)? {
                            envelope::Kind::Request(r) => Event::Request(r),
                            envelope::Kind::Response(r) => Event::Response(r),
                            envelope::Kind::Push(p) => {
                                // The gateway paces channel state by these acknowledgements.
                                if p.topic == "channel.update" || p.topic == "channel.updates" {
                                    self.session.ack_soon(now);
                                }
                                Event::Push(p)
                            }
                        });
                    }
                }
            }
        }
        if let Some(frame) = self.session.poll_transmit(now) {
            frame.encode(&mut self.wbuf);
        }
        if self.rbuf.is_empty() {
            self.rbuf = BytesMut::new();
        }
        Ok(())
    }

    fn lose_link(&mut self) {
        if self.conn.take().is_some() {
            self.session.detach(Instant::now());
        }
        self.rbuf = BytesMut::new();
        self.wbuf.clear();
    }

    /// Ends the session: tells the server and closes the connection.
    pub async fn close(mut self) {
        if let Some(mut conn) = self.conn.take() {
            let close = Control {
                kind: Some(control::Kind::Close(Close {
                    reason: CloseReason::Normal as i32,
                    message: "bye".into(),
                })),
            };
            self.wbuf.clear();
            Frame::control(&close).encode(&mut self.wbuf);
            let _ = conn.write_all(&self.wbuf).await;
            conn.shutdown().await;
        }
    }
}
