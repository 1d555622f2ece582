//! Multi-process mode: several gateway processes share the listening ports (`SO_REUSEPORT`),
//! so the kernel spreads new connections over them. Each process owns the sessions it opened
//! and stamps its index into the first byte of their ids. A resume that lands on another
//! process is handed over, socket and all: the file descriptor travels over a Unix socket
//! (`SCM_RIGHTS`) together with the bytes already read, and the owner carries on as if it had
//! accepted the connection itself. Clients see one gateway.
//!
//! Why processes at all: one process can hold only as many connections as its open-file limit,
//! and that limit cannot always be raised (containers without `CAP_SYS_RESOURCE`).

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

use bytes::BytesMut;
use sendfd::{RecvWithFd, SendWithFd};
use tickwire_session::SessionId;

/// Most bytes a handoff carries besides the socket: the Hello plus what followed it.
const MAX_HANDOFF_BYTES: usize = 2 << 20;

/// This process's place among the gateway's worker processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSet {
    /// This worker, `0..count`.
    pub index: u8,
    pub count: u8,
    /// Directory holding one Unix socket per worker, for handoffs.
    pub dir: PathBuf,
}

impl WorkerSet {
    fn socket(&self, index: u8) -> PathBuf {
        self.dir.join(format!("worker-{index}.sock"))
    }

    /// The worker that owns a session.
    pub(crate) fn owner(&self, id: &SessionId) -> u8 {
        id.0[0] % self.count.max(1)
    }

    /// Marks a new session id as this worker's.
    pub(crate) fn stamp(&self, id: &mut SessionId) {
        id.0[0] = self.index;
    }
}

/// Binds this worker's handoff socket; other workers connect to it to hand over connections.
pub(crate) fn bind_handoffs(workers: &WorkerSet) -> io::Result<UnixListener> {
    let path = workers.socket(workers.index);
    let _ = std::fs::remove_file(&path);
    UnixListener::bind(&path)
}

/// Receives one handed-over connection from an accepted handoff stream (blocking, each read
/// bounded by `timeout`): the TCP socket, and the bytes the other worker had read from it.
pub(crate) fn receive_handoff(
    stream: UnixStream,
    timeout: std::time::Duration,
) -> io::Result<(std::net::TcpStream, BytesMut)> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(timeout))?;
    let (fd, buf) = receive(stream)?;
    // SAFETY: `fd` came to us through SCM_RIGHTS; nobody else owns it here.
    Ok((unsafe { std::net::TcpStream::from_raw_fd(fd) }, buf))
}

fn receive(mut stream: UnixStream) -> io::Result<(RawFd, BytesMut)> {
    let mut first = vec![0u8; 64 * 1024];
    let mut fds = [0 as RawFd; 1];
    let (n, nfds) = stream.recv_with_fd(&mut first, &mut fds)?;
    if nfds != 1 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "handoff without a socket"));
    }
    let mut buf = BytesMut::from(&first[..n]);
    let mut rest = Vec::new();
    (&mut stream).take(MAX_HANDOFF_BYTES as u64).read_to_end(&mut rest)?;
    buf.extend_from_slice(&rest);
    Ok((fds[0], buf))
}

/// Hands a TCP connection and the bytes read from it so far to worker `target`.
pub(crate) async fn hand_off(
    workers: &WorkerSet,
    target: u8,
    stream: tokio::net::TcpStream,
    data: BytesMut,
) -> io::Result<()> {
    if data.len() > MAX_HANDOFF_BYTES {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "too many bytes to hand off"));
    }
    let path = workers.socket(target);
    let std_stream = stream.into_std()?;
    tokio::task::spawn_blocking(move || {
        let mut unix = UnixStream::connect(path)?;
        let sent = unix.send_with_fd(&data, &[std_stream.as_raw_fd()])?;
        unix.write_all(&data[sent..])?;
        // Our copy of the socket closes when `std_stream` drops; the owner holds its own.
        Ok(())
    })
    .await
    .map_err(io::Error::other)?
}
