//! The floor under the idle-session figure (`bench pingpong --server floor`): a bare responder
//! that speaks just enough of the session protocol for the ping-pong load generator (Hello and
//! Welcome, heartbeat answers, acks, echo requests) on one thread per process, straight on
//! epoll (mio): no tasks, timers, channels or routing. Loaded exactly as the gateway is, its
//! CPU is what the kernel's loopback TCP costs for the same exchanges plus the least user work
//! that can answer them: the floor the gateway's idle sessions are measured against.
//!
//! It is a measuring stick, not a server: no authentication, no read timeouts, no resume, no
//! limits beyond the frame size. A peer that breaks the protocol is disconnected.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::server::ChildServer;
use anyhow::Context;
use bytes::{Bytes, BytesMut};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use prost::Message;
use slab::Slab;
use tickwire_session::{Received, Role, Session, SessionConfig};
use tickwire_wire::proto::{Control, EchoRequest, Envelope, Response, Status, Welcome, control, envelope};
use tickwire_wire::{
    DEFAULT_MAX_FRAME_BYTES, Frame, FrameDecoder, decode_control, decode_envelope, encode_message,
};

const LISTENER: Token = Token(usize::MAX);
/// Bytes read per `read` call.
const READ_CHUNK: usize = 4096;
/// Largest echo answer it builds (the gateway's echo router has a limit too).
const MAX_ECHO_BYTES: usize = 1 << 20;

/// Flags of the hidden `tickwire bench pingpong-floor`.
#[derive(clap::Args, Debug)]
pub struct FloorArgs {
    /// Address to listen on (port 0: pick one).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Heartbeat announced in the Welcome (the client's interval).
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub heartbeat: Duration,
    /// Responder processes sharing the port (each holds at most the open-file limit).
    #[arg(long, default_value_t = 1)]
    pub processes: usize,
    /// Internal: run one responder on `--listen` (its port already chosen) instead of the set.
    #[arg(long, hide = true)]
    pub worker: bool,
}

/// Runs `tickwire bench pingpong-floor`: N responder processes on one port, announced with the
/// gateway's listening line once all of them listen; returns when one of them ends.
pub fn main(args: &FloorArgs) -> anyhow::Result<()> {
    if args.worker {
        return serve(args.listen, args.heartbeat);
    }
    // Bound, never listening: the port stays ours while the workers bind it with SO_REUSEPORT
    // (only listening sockets take connections, so this one takes none).
    let reserved = tickwire_transport::reuse_port_socket(args.listen)
        .with_context(|| format!("cannot bind {}", args.listen))?;
    let addr = reserved.local_addr()?.as_socket().context("not an IP socket")?;
    let exe = std::env::current_exe().context("cannot find the tickwire executable")?;
    let mut workers: Vec<Child> = Vec::new();
    for _ in 0..args.processes.max(1) {
        let mut child = Command::new(&exe)
            .args(["bench", "pingpong-floor", "--worker", "--listen", &addr.to_string()])
            .args(["--heartbeat", &format!("{}ms", args.heartbeat.as_millis())])
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start a floor responder")?;
        let mut line = String::new();
        let stdout = child.stdout.take().context("responder stdout")?;
        io::BufRead::read_line(&mut io::BufReader::new(stdout), &mut line)?;
        anyhow::ensure!(
            line.starts_with(tickwire_gateway::LISTENING_PREFIX),
            "a floor responder did not start"
        );
        workers.push(child);
    }
    println!("{}tcp://{addr}", tickwire_gateway::LISTENING_PREFIX);
    // Each responder dies with this process (PR_SET_PDEATHSIG), so waiting on one is enough.
    let status = workers[0].wait()?;
    anyhow::bail!("a floor responder exited: {status}")
}

/// Starts `tickwire bench pingpong-floor` with `processes` responders on a free loopback port,
/// as a child of the bench (stopped when dropped).
pub(super) fn start(processes: u8, heartbeat: Duration) -> anyhow::Result<(ChildServer, SocketAddr)> {
    let args = [
        "bench".to_owned(),
        "pingpong-floor".to_owned(),
        "--processes".to_owned(),
        processes.to_string(),
        "--heartbeat".to_owned(),
        format!("{}ms", heartbeat.as_millis()),
    ];
    let (child, addr) = ChildServer::start(&args, "tcp://")?;
    Ok((child, addr.parse().context("the floor printed a bad address")?))
}

/// One responder: an epoll loop over the listener and every connection, until killed.
fn serve(listen: SocketAddr, heartbeat: Duration) -> anyhow::Result<()> {
    // SAFETY: prctl with PR_SET_PDEATHSIG only sets a signal for this process.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    tickwire_transport::raise_fd_limit();
    let socket =
        tickwire_transport::reuse_port_socket(listen).with_context(|| format!("cannot bind {listen}"))?;
    socket.set_nonblocking(true)?;
    socket.listen(4096)?;
    let mut listener = TcpListener::from_std(socket.into());
    let mut poll = Poll::new()?;
    poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
    println!("{}tcp://{listen}", tickwire_gateway::LISTENING_PREFIX);
    let mut responder = Responder {
        config: SessionConfig::default().with_heartbeat(heartbeat),
        decoder: FrameDecoder::new(DEFAULT_MAX_FRAME_BYTES),
        zeros: Bytes::from(vec![0u8; MAX_ECHO_BYTES]),
        next_id: 0,
    };
    let mut peers: Slab<Peer> = Slab::new();
    let mut events = Events::with_capacity(1024);
    loop {
        match poll.poll(&mut events, None) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
        let now = Instant::now();
        for event in &events {
            if event.token() == LISTENER {
                accept_all(&listener, &poll, &mut peers)?;
                continue;
            }
            let key = event.token().0;
            let Some(peer) = peers.get_mut(key) else { continue };
            if peer.on_ready(now, &mut responder).is_err() {
                let mut peer = peers.remove(key);
                let _ = poll.registry().deregister(&mut peer.stream);
            }
        }
    }
}

fn accept_all(listener: &TcpListener, poll: &Poll, peers: &mut Slab<Peer>) -> io::Result<()> {
    loop {
        let (mut stream, _) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            // Out of descriptors, or a connection reset before it was accepted: try later.
            Err(_) => return Ok(()),
        };
        stream.set_nodelay(true)?;
        let entry = peers.vacant_entry();
        poll.registry().register(&mut stream, Token(entry.key()), Interest::READABLE | Interest::WRITABLE)?;
        entry.insert(Peer { stream, rbuf: BytesMut::new(), wbuf: BytesMut::new(), session: None });
    }
}

/// What every connection shares.
struct Responder {
    config: SessionConfig,
    decoder: FrameDecoder,
    zeros: Bytes,
    next_id: u64,
}

/// The peer broke the protocol or went away: drop the connection.
struct Gone;

impl From<io::Error> for Gone {
    fn from(_: io::Error) -> Gone {
        Gone
    }
}

struct Peer {
    stream: TcpStream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    /// `None` until the Hello.
    session: Option<Session>,
}

impl Peer {
    /// Reads what arrived, answers it, and writes what is pending.
    fn on_ready(&mut self, now: Instant, responder: &mut Responder) -> Result<(), Gone> {
        let mut chunk = [0u8; READ_CHUNK];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(Gone),
                Ok(n) => {
                    self.rbuf.extend_from_slice(&chunk[..n]);
                    // A short read drained the socket (edge-triggered epoll reports the next
                    // arrival), so no second read that would only say EAGAIN: tokio does the same.
                    if n < READ_CHUNK {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        while let Some(frame) = responder.decoder.decode(&mut self.rbuf).map_err(|_| Gone)? {
            self.on_frame(now, frame, responder)?;
        }
        if let Some(session) = &mut self.session {
            while let Some(frame) = session.poll_transmit(now) {
                frame.encode(&mut self.wbuf);
            }
        }
        while !self.wbuf.is_empty() {
            match self.stream.write(&self.wbuf) {
                Ok(0) => return Err(Gone),
                Ok(n) => {
                    let _ = self.wbuf.split_to(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn on_frame(&mut self, now: Instant, frame: Frame, responder: &mut Responder) -> Result<(), Gone> {
        let Some(session) = &mut self.session else {
            let Frame::Control(body) = frame else { return Err(Gone) };
            let Ok(control::Kind::Hello(_)) = decode_control(body) else { return Err(Gone) };
            responder.next_id += 1;
            welcome(&responder.config, responder.next_id).encode(&mut self.wbuf);
            self.session = Some(Session::new(Role::Server, responder.config.clone(), now));
            return Ok(());
        };
        let Received::Deliver(payload) = session.on_frame(now, frame).map_err(|_| Gone)? else {
            return Ok(());
        };
        let Ok(envelope::Kind::Request(request)) = decode_envelope(payload) else { return Err(Gone) };
        let response = match EchoRequest::decode(request.body) {
            Ok(echo) if request.method == "echo" && echo.response_bytes as usize <= MAX_ECHO_BYTES => {
                Response {
                    id: request.id,
                    status: Status::Ok as i32,
                    body: responder.zeros.slice(..echo.response_bytes as usize),
                    error: String::new(),
                }
            }
            _ => Response {
                id: request.id,
                status: Status::InvalidArgument as i32,
                body: Bytes::new(),
                error: "the floor answers only echo requests".into(),
            },
        };
        let envelope = Envelope { kind: Some(envelope::Kind::Response(response)) };
        if let Some(frame) = session.send(now, encode_message(&envelope)).map_err(|_| Gone)? {
            frame.encode(&mut self.wbuf);
        }
        Ok(())
    }
}

fn welcome(config: &SessionConfig, id: u64) -> Frame {
    let millis = |d: Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX);
    let mut session_id = [0u8; 16];
    session_id[..8].copy_from_slice(&id.to_le_bytes());
    let token: [u8; 16] = rand::random();
    Frame::control(&Control {
        kind: Some(control::Kind::Welcome(Welcome {
            session_id: Bytes::copy_from_slice(&session_id),
            resume_token: Bytes::copy_from_slice(&token),
            resumed: false,
            last_received: 0,
            heartbeat_ms: millis(config.heartbeat),
            resume_window_ms: millis(config.resume_window),
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            player_id: format!("floor-{id}"),
            ack_delay_ms: millis(config.ack_delay),
            connection_id: id,
            max_unacked_messages: u32::try_from(config.max_unacked_messages).unwrap_or(u32::MAX),
            max_unacked_bytes: u32::try_from(config.max_unacked_bytes).unwrap_or(u32::MAX),
        })),
    })
}
