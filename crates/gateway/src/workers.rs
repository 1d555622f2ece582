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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
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
/// Returns its path too, for removal when the worker stops.
pub(crate) fn bind_handoffs(workers: &WorkerSet) -> io::Result<(UnixListener, PathBuf)> {
    let path = workers.socket(workers.index);
    let _ = std::fs::remove_file(&path);
    Ok((UnixListener::bind(&path)?, path))
}

/// Receives one handed-over connection from an accepted handoff stream, blocking, all of it by
/// `deadline`: the TCP socket, and the bytes the other worker had read from it. The socket is
/// owned as soon as it arrives, so it closes on any error after that.
pub(crate) fn receive_handoff(
    mut stream: UnixStream,
    deadline: std::time::Instant,
) -> io::Result<(std::net::TcpStream, BytesMut)> {
    stream.set_nonblocking(false)?;
    read_until(&stream, deadline)?;
    let mut chunk = vec![0u8; 64 * 1024];
    let mut fds = [0 as RawFd; 1];
    let (n, nfds) = stream.recv_with_fd(&mut chunk, &mut fds)?;
    if nfds != 1 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "handoff without a socket"));
    }
    // SAFETY: the descriptor came to us through SCM_RIGHTS; nobody else owns it here.
    let socket = socket2::Socket::from(unsafe { OwnedFd::from_raw_fd(fds[0]) });
    // Received without MSG_CMSG_CLOEXEC: a process this one starts must not inherit it.
    socket.set_cloexec(true)?;
    let mut buf = BytesMut::from(&chunk[..n]);
    loop {
        read_until(&stream, deadline)?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        if buf.len() > MAX_HANDOFF_BYTES {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "handoff longer than any worker sends"));
        }
    }
    Ok((socket.into(), buf))
}

/// Makes the next read on `stream` give up at `deadline`.
fn read_until(stream: &UnixStream, deadline: std::time::Instant) -> io::Result<()> {
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "handoff not received in time"));
    }
    stream.set_read_timeout(Some(left))
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

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::time::{Duration, Instant};

    use super::*;

    /// A connected TCP pair on loopback.
    fn tcp_pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        (client, listener.accept().unwrap().0)
    }

    #[test]
    fn a_handoff_arrives_with_its_socket_and_bytes() {
        let (client, server) = tcp_pair();
        let (mut from, to) = UnixStream::pair().unwrap();
        let sent = from.send_with_fd(b"hello", &[server.as_raw_fd()]).unwrap();
        from.write_all(&b"hello, world"[sent..]).unwrap();
        drop((from, server));
        let (socket, buf) = receive_handoff(to, Instant::now() + Duration::from_secs(5)).unwrap();
        assert_eq!(&buf[..], b"hello, world");
        assert_eq!(socket.peer_addr().unwrap(), client.local_addr().unwrap());
        // SAFETY: fcntl with F_GETFD reads the flags of a descriptor `socket` owns.
        let flags = unsafe { libc::fcntl(socket.as_raw_fd(), libc::F_GETFD) };
        assert!(flags >= 0 && flags & libc::FD_CLOEXEC != 0, "close-on-exec is set: {flags}");
    }

    #[test]
    fn a_stalled_handoff_times_out_and_closes_the_socket_it_brought() {
        let (mut client, server) = tcp_pair();
        let (from, to) = UnixStream::pair().unwrap();
        from.send_with_fd(b"hel", &[server.as_raw_fd()]).unwrap();
        // The only copy of the socket is now the one in flight; the sender stalls, open.
        drop(server);
        let err = receive_handoff(to, Instant::now() + Duration::from_millis(100)).unwrap_err();
        assert!(matches!(err.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut), "{err}");
        // The received socket was closed with the error: its peer reads the end of the stream.
        client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(client.read(&mut [0u8; 8]).unwrap(), 0, "the handed-over socket is closed");
        drop(from);
    }

    #[test]
    fn a_handoff_longer_than_any_worker_sends_is_refused() {
        let (_client, server) = tcp_pair();
        let (mut from, to) = UnixStream::pair().unwrap();
        from.send_with_fd(b"x", &[server.as_raw_fd()]).unwrap();
        drop(server);
        let writer = std::thread::spawn(move || {
            // Past MAX_HANDOFF_BYTES; the reader stops (and drops its end) before the rest.
            let _ = from.write_all(&vec![0u8; MAX_HANDOFF_BYTES + 128 * 1024]);
        });
        let err = receive_handoff(to, Instant::now() + Duration::from_secs(5)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        writer.join().unwrap();
    }

    #[test]
    fn a_handoff_without_a_socket_is_refused() {
        let (mut from, to) = UnixStream::pair().unwrap();
        from.write_all(b"no descriptor").unwrap();
        drop(from);
        let err = receive_handoff(to, Instant::now() + Duration::from_secs(5)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
