//! The byte pipes under a session: TCP, or WebSocket binary messages.
//!
//! The protocol is the same stream of frames on both; this crate hides the difference so the
//! gateway and the client each have one connection loop. Reads are cancel-safe (they can sit in
//! a `select!`), and an idle TCP connection holds no read buffer: the loop waits for readiness
//! before it reserves memory.

use std::io;
use std::net::{IpAddr, SocketAddr};

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
}

impl WsLimits {
    /// Limits for a peer whose protocol frames are at most `max_frame_bytes` (plus the 4-byte
    /// length prefix): one whole frame per message.
    pub fn for_frames(max_frame_bytes: u32) -> WsLimits {
        WsLimits { max_message: (max_frame_bytes as usize + 4).max(WS_WRITE_CHUNK) }
    }

    /// Messages of at most 64 KiB, the size this side writes: what a server accepts from a
    /// peer it does not know yet, so that no peer can make it buffer more than that per
    /// message, before login or after. Longer writes span messages (frames are a byte stream).
    pub fn chunked() -> WsLimits {
        WsLimits { max_message: WS_WRITE_CHUNK }
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

/// One live connection, TCP or WebSocket.
#[derive(Debug)]
pub enum Conn {
    Tcp(TcpStream),
    Ws(Box<WsConn>),
}

/// A WebSocket connection and what its peer has sent without data lately.
#[derive(Debug)]
pub struct WsConn {
    stream: WebSocketStream<TcpStream>,
    /// Ping, pong and empty messages in a row since the last data. Kept here, not in a read
    /// future, so that a read cancelled by other work (the session task's `select!`) does not
    /// reset it.
    control_run: u32,
}

impl WsConn {
    fn new(stream: WebSocketStream<TcpStream>) -> Box<WsConn> {
        Box::new(WsConn { stream, control_run: 0 })
    }
}

impl Conn {
    /// Which transport this is, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Conn::Tcp(_) => "tcp",
            Conn::Ws(_) => "ws",
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

/// Opens a WebSocket connection to `url` (`ws://host:port/path`) over a fresh TCP connection.
pub async fn connect_ws(url: &str, addr: SocketAddr, limits: WsLimits) -> io::Result<Conn> {
    let stream = connect_tcp(addr, None).await?;
    let (ws, _response) = tokio_tungstenite::client_async_with_config(url, stream, Some(limits.config()))
        .await
        .map_err(io::Error::other)?;
    Ok(Conn::Ws(WsConn::new(ws)))
}

/// Completes the server side of a WebSocket handshake on an accepted TCP connection.
pub async fn accept_ws(stream: TcpStream, limits: WsLimits) -> io::Result<Conn> {
    let ws = tokio_tungstenite::accept_async_with_config(stream, Some(limits.config()))
        .await
        .map_err(io::Error::other)?;
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
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::Builder::new().name(format!("{name}-{i}")).spawn(move || {
                match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => {
                        let _ = tx.send(Ok(rt.handle().clone()));
                        rt.block_on(std::future::pending::<()>());
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            })?;
            rx.recv().map_err(|_| io::Error::other("runtime thread died"))?
        })
        .collect()
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
