//! The byte pipes under a session: TCP, or WebSocket binary messages, each with or without TLS.
//!
//! The protocol is the same stream of frames on all of them; this crate hides the difference so
//! the gateway and the client each have one connection loop. Reads are cancel-safe (they can
//! sit in a `select!`), and an idle plain TCP connection holds no read buffer: the loop waits
//! for readiness before it reserves memory.

mod before_login;
mod client_address;
mod tls;
pub mod wake_batch;
mod when_woken;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};

use before_login::Metered;
pub use client_address::{AddressCounts, ClientAddress};
pub use tls::{TlsClient, TlsError, TlsServer, root_store_from_file};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::TlsStream;
pub use when_woken::{WhenWoken, when_woken};

use bytes::{Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use tokio::io::Interest;
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

/// Bytes reserved for each read when the buffer has less room than this.
const READ_CHUNK: usize = 4096;

/// The largest WebSocket message this side sends: longer writes are split (frames travel as a
/// byte stream, so a frame may span messages).
const WS_WRITE_CHUNK: usize = 64 * 1024;

/// Ping, pong and empty messages a WebSocket peer may send in a row without any data before
/// the connection is refused: control traffic alone never advances the protocol.
const MAX_CONTROL_RUN: u32 = 64;

/// What a WebSocket peer may make this side buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WsLimits {
    /// The largest message (and frame) accepted, checked from its header before its payload
    /// is buffered. At least [`WS_WRITE_CHUNK`] bytes, so this side's own messages always fit.
    pub max_message: usize,
    /// The most bytes read from the peer after the upgrade until [`Conn::logged_in`]; past
    /// them the connection is not read (the peer's further bytes wait in the kernel, and the
    /// caller's login deadline ends a peer that never logs in), and a WebSocket frame longer
    /// than what is left of them ends the connection (`before_login.rs`). `None`: no such
    /// bound.
    pub before_login: Option<usize>,
}

impl WsLimits {
    /// Limits for a peer whose protocol frames are at most `max_frame_bytes` (plus the 4-byte
    /// length prefix): one whole frame per message.
    pub fn for_frames(max_frame_bytes: u32) -> WsLimits {
        WsLimits { max_message: (max_frame_bytes as usize + 4).max(WS_WRITE_CHUNK), before_login: None }
    }

    /// Messages of at most 64 KiB, the size this side writes: what a server accepts from a
    /// peer it does not know yet, so that no peer can make it buffer more than that per
    /// message, before login or after. Longer writes span messages (frames are a byte stream).
    /// And until the peer logs in, at most `before_login` bytes read at all (its first frame,
    /// with room for the WebSocket headers of many messages): so a connection that has not
    /// logged in holds a few tens of KiB (tungstenite's read buffer, a message in progress,
    /// the caller's frame buffer), not three 64 KiB buffers.
    pub fn chunked(before_login: usize) -> WsLimits {
        WsLimits { max_message: WS_WRITE_CHUNK, before_login: Some(before_login) }
    }

    fn config(self) -> WebSocketConfig {
        // Writes are flushed in chunks of WS_WRITE_CHUNK; a peer that does not read can make
        // this side hold at most a few of them. With the buffer bounded, tungstenite keeps at
        // most one pending pong (the latest), so a ping flood cannot queue pongs.
        WebSocketConfig::default()
            .read_buffer_size(READ_CHUNK * 4)
            .write_buffer_size(WS_WRITE_CHUNK)
            .max_write_buffer_size(WS_WRITE_CHUNK * 4)
            .max_message_size(Some(self.max_message))
            .max_frame_size(Some(self.max_message))
    }
}

/// One live connection: TCP, TLS over TCP, or WebSocket (over either).
#[derive(Debug)]
pub enum Conn {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    Ws(Box<WsConn>),
}

/// What a WebSocket runs over: TCP, or TLS over TCP (`wss://`).
#[derive(Debug)]
pub enum WsStream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for WsStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WsStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            WsStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WsStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WsStream::Plain(s) => Pin::new(s).poll_write(cx, data),
            WsStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, data),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WsStream::Plain(s) => Pin::new(s).poll_flush(cx),
            WsStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WsStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            WsStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A WebSocket connection and what its peer has sent without data lately.
#[derive(Debug)]
pub struct WsConn {
    stream: WebSocketStream<Metered>,
    /// Ping, pong and empty messages in a row since the last data. Kept here, not in a read
    /// future, so that a read cancelled by other work (the session task's `select!`) does not
    /// reset it.
    control_run: u32,
    /// Ping, pong and empty messages since [`Conn::take_control_messages`] last asked, for the
    /// caller's rate limit.
    control_total: u32,
}

impl WsConn {
    fn new(stream: WebSocketStream<Metered>) -> Box<WsConn> {
        Box::new(WsConn { stream, control_run: 0, control_total: 0 })
    }
}

impl Conn {
    /// Which transport this is, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Conn::Tcp(_) => "tcp",
            Conn::Tls(_) => "tls",
            Conn::Ws(_) => "ws",
        }
    }

    /// The peer has logged in: lifts [`WsLimits::before_login`] (nothing to do on TCP).
    pub fn logged_in(&mut self) {
        if let Conn::Ws(ws) = self {
            ws.stream.get_mut().logged_in();
        }
    }

    /// WebSocket ping, pong and empty messages received since the last call (0 on TCP): they
    /// never reach the caller as bytes, but cost a read and maybe a pong, so the caller charges
    /// them to its rate limit.
    pub fn take_control_messages(&mut self) -> u32 {
        match self {
            Conn::Ws(ws) => std::mem::take(&mut ws.control_total),
            Conn::Tcp(_) | Conn::Tls(_) => 0,
        }
    }

    /// Appends the next bytes that arrive to `buf`. `Ok(0)` means the peer closed.
    /// Cancel-safe: no bytes are lost if the future is dropped.
    pub async fn read(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        match self {
            Conn::Tcp(stream) => loop {
                stream.readable().await?;
                if buf.capacity() - buf.len() < READ_CHUNK / 4 {
                    buf.reserve(READ_CHUNK);
                }
                let room = buf.capacity() - buf.len();
                let mut got = 0;
                // A short read drained the socket: answer WouldBlock to `try_io` so tokio clears
                // the readiness now, instead of paying one more read that returns EAGAIN.
                let result = stream.try_io(Interest::READABLE, || {
                    got = stream.try_read_buf(buf)?;
                    if got > 0 && got < room { Err(io::ErrorKind::WouldBlock.into()) } else { Ok(()) }
                });
                match result {
                    Ok(()) => return Ok(got),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if got > 0 {
                            return Ok(got);
                        }
                    }
                    Err(e) => return Err(e),
                }
            },
            Conn::Tls(stream) => {
                if buf.capacity() - buf.len() < READ_CHUNK / 4 {
                    buf.reserve(READ_CHUNK);
                }
                // Cancel-safe: bytes are only ever moved into `buf` by a completed poll.
                tokio::io::AsyncReadExt::read_buf(stream.as_mut(), buf).await
            }
            Conn::Ws(ws) => loop {
                match ws.stream.next().await {
                    None | Some(Ok(Message::Close(_))) => return Ok(0),
                    Some(Ok(Message::Binary(data))) if !data.is_empty() => {
                        ws.control_run = 0;
                        buf.extend_from_slice(&data);
                        return Ok(data.len());
                    }
                    Some(Ok(Message::Binary(_) | Message::Ping(_) | Message::Pong(_))) => {
                        ws.control_run += 1;
                        ws.control_total = ws.control_total.saturating_add(1);
                        if ws.control_run > MAX_CONTROL_RUN {
                            return Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                "too many WebSocket control messages without data",
                            ));
                        }
                    }
                    Some(Ok(Message::Text(_) | Message::Frame(_))) => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "tickwire frames travel in binary WebSocket messages only",
                        ));
                    }
                    Some(Err(e)) => return Err(io::Error::other(e)),
                }
            },
        }
    }

    /// Writes all of `data`; over WebSocket, as binary messages of at most 64 KiB each. Not
    /// cancel-safe.
    pub async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Conn::Tcp(stream) => tokio::io::AsyncWriteExt::write_all(stream, data).await,
            Conn::Tls(stream) => {
                tokio::io::AsyncWriteExt::write_all(stream.as_mut(), data).await?;
                tokio::io::AsyncWriteExt::flush(stream.as_mut()).await
            }
            Conn::Ws(ws) => {
                for chunk in data.chunks(WS_WRITE_CHUNK) {
                    ws.stream
                        .feed(Message::Binary(Bytes::copy_from_slice(chunk)))
                        .await
                        .map_err(io::Error::other)?;
                }
                SinkExt::flush(&mut ws.stream).await.map_err(io::Error::other)
            }
        }
    }

    /// Closes the write side (a WebSocket close frame, or a TCP FIN). Errors are ignored: the
    /// connection is going away anyway.
    pub async fn shutdown(&mut self) {
        match self {
            Conn::Tcp(stream) => {
                let _ = tokio::io::AsyncWriteExt::shutdown(stream).await;
            }
            Conn::Tls(stream) => {
                // Sends the TLS close_notify, then the FIN.
                let _ = tokio::io::AsyncWriteExt::shutdown(stream.as_mut()).await;
            }
            Conn::Ws(ws) => {
                let _ = SinkExt::close(&mut ws.stream).await;
            }
        }
    }
}

/// Opens a TCP connection, optionally from a chosen local address (the bench spreads many
/// connections over several loopback sources this way).
pub async fn connect_tcp(addr: SocketAddr, local: Option<IpAddr>) -> io::Result<TcpStream> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    if let Some(ip) = local {
        // Let connect() pick the port for the whole 4-tuple; a plain bind(ip, 0) would scan
        // every bound socket for a conflict and reserve a port across all destinations.
        set_bind_address_no_port(&socket)?;
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    let stream = socket.connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Opens a TLS connection over a fresh TCP connection and completes the TLS handshake.
pub async fn connect_tls(addr: SocketAddr, local: Option<IpAddr>, tls: &TlsClient) -> io::Result<Conn> {
    let stream = connect_tcp(addr, local).await?;
    let stream = tls.connector.connect(tls.server_name.clone(), stream).await?;
    Ok(Conn::Tls(Box::new(TlsStream::Client(stream))))
}

/// Completes the server side of a TLS handshake on an accepted TCP connection.
pub async fn accept_tls(stream: TcpStream, tls: &TlsServer) -> io::Result<Box<TlsStream<TcpStream>>> {
    let stream = tls.acceptor().accept(stream).await.map_err(tls::io_error)?;
    Ok(Box::new(TlsStream::Server(stream)))
}

/// Opens a WebSocket connection to `url` (`ws://host:port/path`, or `wss://` with `tls`) over
/// a fresh TCP connection.
pub async fn connect_ws(
    url: &str,
    addr: SocketAddr,
    limits: WsLimits,
    tls: Option<&TlsClient>,
) -> io::Result<Conn> {
    let tcp = connect_tcp(addr, None).await?;
    let stream = match tls {
        Some(tls) => {
            let stream = tls.connector.connect(tls.server_name.clone(), tcp).await?;
            WsStream::Tls(Box::new(TlsStream::Client(stream)))
        }
        None => WsStream::Plain(tcp),
    };
    let stream = Metered::client(stream);
    let (mut ws, _response) = tokio_tungstenite::client_async_with_config(url, stream, Some(limits.config()))
        .await
        .map_err(io::Error::other)?;
    ws.get_mut().bound(limits.before_login);
    Ok(Conn::Ws(WsConn::new(ws)))
}

/// Completes the server side of a WebSocket handshake on an accepted connection.
/// (The upgrade request itself is bounded by tungstenite: 64 KiB.)
pub async fn accept_ws(stream: WsStream, limits: WsLimits) -> io::Result<Conn> {
    let stream = Metered::server(stream);
    let mut ws = tokio_tungstenite::accept_async_with_config(stream, Some(limits.config()))
        .await
        .map_err(io::Error::other)?;
    ws.get_mut().bound(limits.before_login);
    Ok(Conn::Ws(WsConn::new(ws)))
}

fn set_bind_address_no_port(socket: &TcpSocket) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let one: libc::c_int = 1;
    // SAFETY: setsockopt on a socket we own, with a correctly sized int option.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Starts `n` threads, each running a single-threaded tokio runtime, and returns their handles.
///
/// Thread-per-core: a task spawned on a handle stays on that thread, so a wake-up never crosses
/// threads. With tokio's work-stealing runtime, idle workers are woken for every burst of
/// work, and on a lightly loaded box those futex wake-ups cost more than the work itself.
/// The threads run until the process exits.
pub fn io_threads(n: usize, name: &str) -> io::Result<Vec<tokio::runtime::Handle>> {
    (0..n.max(1))
        .map(|i| {
            runtime_thread(format!("{name}-{i}"), |rt| {
                wake_batch::register(rt.handle().clone());
                rt.block_on(std::future::pending::<()>());
            })
        })
        .collect()
}

/// Runs `task` on a thread of its own, named `name`, in a single-threaded tokio runtime; the
/// thread ends when the task does.
///
/// For one task that does a lot of work per wake-up (the spatial world's fan-out pass): on an
/// I/O thread it would hold up every session there for the length of its pass. It is not an
/// I/O thread, so the sessions it wakes inside a [`wake_batch::batch`] are woken in one batch
/// per I/O thread.
pub fn dedicated_thread<F>(name: &str, task: F) -> io::Result<()>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    runtime_thread(name.to_owned(), move |rt| rt.block_on(task)).map(drop)
}

/// The CPU time the calling thread has used so far (`CLOCK_THREAD_CPUTIME_ID`): user and
/// kernel time, without the time it waited for a core or was blocked. `None` if the clock
/// cannot be read.
pub fn thread_cpu_time() -> Option<std::time::Duration> {
    let mut ts = std::mem::MaybeUninit::<libc::timespec>::uninit();
    // SAFETY: `ts` points to writable memory for one timespec, which the call fills on success.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, ts.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: clock_gettime returned 0, so it wrote the whole timespec.
    let ts = unsafe { ts.assume_init() };
    Some(std::time::Duration::new(u64::try_from(ts.tv_sec).ok()?, u32::try_from(ts.tv_nsec).ok()?))
}

/// Starts a thread named `name` with a single-threaded runtime, returns the runtime's handle
/// once it is built, and then runs `body` with it on that thread.
fn runtime_thread(
    name: String,
    body: impl FnOnce(&tokio::runtime::Runtime) + Send + 'static,
) -> io::Result<tokio::runtime::Handle> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new().name(name).spawn(
        move || match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => {
                let _ = tx.send(Ok(rt.handle().clone()));
                body(&rt);
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        },
    )?;
    rx.recv().map_err(|_| io::Error::other("runtime thread died"))?
}

/// A TCP socket bound to `addr` with `SO_REUSEADDR` and `SO_REUSEPORT`, not yet listening.
/// Kept bound but never listening, it reserves a port (resolving port 0) for processes that
/// each bind the same port to listen on it: only listening sockets take connections.
pub fn reuse_port_socket(addr: SocketAddr) -> io::Result<socket2::Socket> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// Raises this process's open-file limit as far as the system allows and returns it.
/// Root may raise the hard limit too (up to `fs.nr_open`).
pub fn raise_fd_limit() -> u64 {
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(1 << 20);
    let wanted = nr_open.min(1 << 20) as libc::rlim_t;
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain syscalls on a stack value.
    unsafe {
        let both = libc::rlimit { rlim_cur: wanted, rlim_max: wanted };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &both) != 0 {
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
    }
    lim.rlim_cur
}
