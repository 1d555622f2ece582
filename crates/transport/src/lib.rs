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
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

/// Bytes reserved for each read when the buffer has less room than this.
const READ_CHUNK: usize = 4096;

/// One live connection, TCP or WebSocket.
#[derive(Debug)]
pub enum Conn {
    Tcp(TcpStream),
    Ws(Box<WebSocketStream<TcpStream>>),
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
                match stream.try_read_buf(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            },
            Conn::Ws(ws) => loop {
                match ws.next().await {
                    None | Some(Ok(Message::Close(_))) => return Ok(0),
                    Some(Ok(Message::Binary(data))) if !data.is_empty() => {
                        buf.extend_from_slice(&data);
                        return Ok(data.len());
                    }
                    Some(Ok(Message::Binary(_) | Message::Ping(_) | Message::Pong(_))) => {}
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

    /// Writes all of `data`; over WebSocket, as one binary message. Not cancel-safe.
    pub async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Conn::Tcp(stream) => tokio::io::AsyncWriteExt::write_all(stream, data).await,
            Conn::Ws(ws) => ws
                .send(Message::Binary(Bytes::copy_from_slice(data)))
                .await
                .map_err(io::Error::other),
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
                let _ = SinkExt::close(ws.as_mut()).await;
            }
        }
    }
}

/// Opens a TCP connection, optionally from a chosen local address (the bench spreads many
/// connections over several loopback sources this way).
pub async fn connect_tcp(addr: SocketAddr, local: Option<IpAddr>) -> io::Result<TcpStream> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    if let Some(ip) = local {
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    let stream = socket.connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Opens a WebSocket connection to `url` (`ws://host:port/path`) over a fresh TCP connection.
pub async fn connect_ws(url: &str, addr: SocketAddr) -> io::Result<Conn> {
    let stream = connect_tcp(addr, None).await?;
    let (ws, _response) =
        tokio_tungstenite::client_async(url, stream).await.map_err(io::Error::other)?;
    Ok(Conn::Ws(Box::new(ws)))
}

/// Completes the server side of a WebSocket handshake on an accepted TCP connection.
pub async fn accept_ws(stream: TcpStream) -> io::Result<Conn> {
    let ws = tokio_tungstenite::accept_async(stream).await.map_err(io::Error::other)?;
    Ok(Conn::Ws(Box::new(ws)))
}
