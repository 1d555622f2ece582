//! The listener of the small HTTP servers beside the gateway (its `/metrics`, the live web
//! view): at most [`MAX_CONNECTIONS`] connections at once (more wait in the kernel's backlog)
//! and each closed [`LIFETIME`] after it was accepted, idle or not. `axum::serve` sets neither
//! a header timeout nor an idle limit of hyper's, so without this one peer trickling a header
//! byte a minute could hold connections, and the file descriptors the gateway's own listeners
//! need, for ever. A scrape or a page's poll takes milliseconds; a browser whose keep-alive
//! connection is closed opens another.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;

/// Connections one server holds at once.
pub const MAX_CONNECTIONS: usize = 64;
/// How long one connection lives.
pub const LIFETIME: Duration = Duration::from_secs(30);

/// A TCP listener whose connections are bounded in number and in life (see the module).
pub struct BoundedListener {
    inner: TcpListener,
    slots: Arc<Semaphore>,
    lifetime: Duration,
}

impl BoundedListener {
    pub fn new(inner: TcpListener) -> BoundedListener {
        BoundedListener::with_limits(inner, MAX_CONNECTIONS, LIFETIME)
    }

    pub fn with_limits(inner: TcpListener, max: usize, lifetime: Duration) -> BoundedListener {
        BoundedListener { inner, slots: Arc::new(Semaphore::new(max)), lifetime }
    }
}

impl axum::serve::Listener for BoundedListener {
    type Io = BoundedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (BoundedStream, SocketAddr) {
        // A place first: with every place taken, connections wait in the backlog.
        let place = self.slots.clone().acquire_owned().await.expect("the semaphore is never closed");
        // axum's accept logs and backs off on errors (a full file table among them).
        let (stream, addr) = axum::serve::Listener::accept(&mut self.inner).await;
        let ends = Box::pin(tokio::time::sleep(self.lifetime));
        (BoundedStream { stream, ends, _place: place }, addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// An accepted connection: reads and writes fail once its life is over, which ends it.
pub struct BoundedStream {
    stream: TcpStream,
    ends: Pin<Box<Sleep>>,
    _place: OwnedSemaphorePermit,
}

impl BoundedStream {
    /// An error once the connection's life is over (and a wake-up registered for then).
    fn over(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        self.ends
            .as_mut()
            .poll(cx)
            .is_ready()
            .then(|| io::Error::new(io::ErrorKind::TimedOut, "the connection's time is up"))
    }
}

impl AsyncRead for BoundedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(e) = self.over(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for BoundedStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if let Some(e) = self.over(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use axum::routing::get;

    use super::*;

    /// A peer that sends half a request and waits is cut off when its time is up, and while
    /// every place is taken a new connection waits; once one goes, it is served.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_are_bounded_in_number_and_in_life() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let bounded = BoundedListener::with_limits(listener, 1, Duration::from_millis(500));
        let app = axum::Router::new().route("/", get(|| async { "ok" }));
        tokio::spawn(async move { axum::serve(bounded, app).await });
        let answers = tokio::task::spawn_blocking(move || {
            let mut slow = std::net::TcpStream::connect(addr).unwrap();
            slow.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            slow.write_all(b"GET / HTTP/1.1\r\nHo").unwrap();
            // The only place is the slow peer's: this one waits for it.
            let mut next = std::net::TcpStream::connect(addr).unwrap();
            next.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            next.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
            let started = std::time::Instant::now();
            let mut answer = String::new();
            next.read_to_string(&mut answer).unwrap();
            let waited = started.elapsed();
            // The slow peer was cut off without an answer (a read timeout: it was not).
            let mut rest = Vec::new();
            if let Err(e) = slow.read_to_end(&mut rest) {
                assert_ne!(e.kind(), std::io::ErrorKind::WouldBlock, "the slow peer was never cut off");
            }
            (answer, waited, rest)
        })
        .await
        .unwrap();
        let (answer, waited, rest) = answers;
        assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"), "{answer}");
        assert!(
            waited >= Duration::from_millis(300),
            "served before the slow peer's time was up: {waited:?}"
        );
        assert!(!String::from_utf8_lossy(&rest).contains("200"), "the slow peer got no answer");
    }
}
