//! What tells a connection's [`Watch`] how its client keeps up: [`PacedIo`] around the socket
//! (when it refuses data, and the bytes it takes), [`InFlight`] for each request (from when
//! hyper hands it over until its answer's body is dropped), and [`PacedBody`] around each
//! answer (when it waits on the client), which the watch can also cut.
//!
//! An answer waits on its client from when its body hands hyper a piece until hyper asks for
//! the next one: hyper asks once it has room (over HTTP/1.1, when the socket has taken the
//! last; over HTTP/2, when the stream has flow-control credit). The time the body itself takes
//! to produce a piece (a disk or a bucket) is not counted. Pieces are at most [`PIECE`] bytes
//! (a larger frame is handed over in parts), so that how long a wait lasts says how fast the
//! client takes the answer, not how large the body's reads are.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};

use axum::body::Body;
use bytes::{Buf, Bytes};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::watch::Watch;

/// The most an answer hands hyper at a time: as much as an HTTP/2 stream may queue
/// (`max_send_buf_size` in `serve/mod.rs`).
const PIECE: usize = crate::http::sending::CHUNK;

/// An answer's body and what is left of the frame it is handing over in parts.
#[derive(Debug)]
struct Answer {
    body: Body,
    rest: Bytes,
}

/// An answer, until the watch cuts it.
type Slot = Mutex<Option<Answer>>;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics under these locks; what they guard stays consistent.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A connection's [`Watch`], the wake-up of its task, and its answers' bodies.
#[derive(Debug)]
pub(crate) struct Watched {
    watch: Mutex<Watch>,
    /// Bytes the socket took since the watch last counted them (written without a lock).
    written: AtomicU64,
    bodies: Mutex<std::collections::HashMap<u64, Arc<Slot>>>,
    pub wake: Notify,
}

impl Watched {
    pub fn new(watch: Watch) -> Arc<Watched> {
        Arc::new(Watched {
            watch: Mutex::new(watch),
            written: AtomicU64::new(0),
            bodies: Mutex::default(),
            wake: Notify::new(),
        })
    }

    /// The watch, with the bytes the socket took by `now` counted.
    pub fn lock(&self, now: Instant) -> MutexGuard<'_, Watch> {
        let mut watch = lock(&self.watch);
        watch.took(now, self.written.swap(0, Ordering::Relaxed));
        watch
    }

    /// Runs `change` on the watch at `now`, and wakes the connection's task if it says so.
    fn change(&self, now: Instant, change: impl FnOnce(&mut Watch) -> bool) {
        if change(&mut self.lock(now)) {
            self.wake.notify_one();
        }
    }

    /// Drops the bodies of the answers `keys`; each ends with an error when hyper next asks.
    pub fn cut(&self, keys: &[u64]) {
        let slots: Vec<Arc<Slot>> = {
            let bodies = lock(&self.bodies);
            keys.iter().filter_map(|key| bodies.get(key).cloned()).collect()
        };
        for slot in slots {
            let answer = lock(&slot).take();
            drop(answer);
        }
    }
}

/// A request in flight on its connection, until dropped.
pub(crate) struct InFlight {
    watched: Arc<Watched>,
    key: u64,
}

impl InFlight {
    pub fn begin(watched: &Arc<Watched>) -> InFlight {
        let key = watched.lock(Instant::now()).begin();
        InFlight { watched: watched.clone(), key }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let slot = lock(&self.watched.bodies).remove(&self.key);
        // Dropped outside the lock: it may hold the answer's body.
        drop(slot);
        let (key, now) = (self.key, Instant::now());
        self.watched.change(now, |watch| watch.end(key, now));
    }
}

/// An answer's body that reports its waits on the client, and that the watch can cut.
pub(crate) struct PacedBody {
    slot: Arc<Slot>,
    /// Whether a piece was handed over and hyper has not asked for the next.
    handed: bool,
    /// Whether it has ended (no more frames, or an error).
    done: bool,
    in_flight: InFlight,
}

impl PacedBody {
    /// `inner` as the answer of `in_flight`. It waits on the client from now until hyper first
    /// asks for it: an answer hyper never asks for (its stream given no credit, with a hyper
    /// that asks for credit before it asks the body) is cut like one that stopped.
    pub fn new(inner: Body, in_flight: InFlight) -> PacedBody {
        let slot = Arc::new(Mutex::new(Some(Answer { body: inner, rest: Bytes::new() })));
        lock(&in_flight.watched.bodies).insert(in_flight.key, slot.clone());
        let (key, now) = (in_flight.key, Instant::now());
        in_flight.watched.change(now, |watch| watch.handed(key, now));
        PacedBody { slot, handed: true, done: false, in_flight }
    }
}

impl HttpBody for PacedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let polled = match lock(&this.slot).as_mut() {
            Some(answer) => answer.next_piece(cx),
            None => {
                let cut = io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client took nothing of this answer for too long",
                );
                Poll::Ready(Some(Err(axum::Error::new(cut))))
            }
        };
        let handing = matches!(&polled, Poll::Ready(Some(Ok(_))));
        this.done = matches!(&polled, Poll::Ready(None | Some(Err(_))));
        let asked = std::mem::replace(&mut this.handed, handing);
        if asked || handing {
            let (key, now) = (this.in_flight.key, Instant::now());
            this.in_flight.watched.change(now, |watch| {
                let after_asked = asked && watch.asked(key, now);
                let after_handing = handing && watch.handed(key, now);
                after_asked || after_handing
            });
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.done || lock(&self.slot).as_ref().is_some_and(|a| a.rest.is_empty() && a.body.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let answer = lock(&self.slot);
        let Some(answer) = answer.as_ref() else { return SizeHint::default() };
        let rest = answer.rest.len() as u64;
        let body = answer.body.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(body.lower() + rest);
        if let Some(upper) = body.upper() {
            hint.set_upper(upper + rest);
        }
        hint
    }
}

impl Answer {
    /// The next frame, its data at most [`PIECE`] bytes.
    fn next_piece(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if self.rest.is_empty() {
            match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.rest = data,
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                other => return Poll::Ready(other),
            }
        }
        if self.rest.len() <= PIECE {
            return Poll::Ready(Some(Ok(Frame::data(std::mem::take(&mut self.rest)))));
        }
        // A copy, not a slice: a slice would keep the body's whole read buffer alive for as long
        // as hyper holds the piece.
        let piece = Bytes::copy_from_slice(&self.rest[..PIECE]);
        self.rest.advance(PIECE);
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }
}

/// A connection's socket (or TLS stream), telling its watch when it refuses data and what it
/// takes.
pub(crate) struct PacedIo<T> {
    inner: T,
    watched: Arc<Watched>,
    blocked: bool,
}

impl<T> PacedIo<T> {
    pub fn new(inner: T, watched: Arc<Watched>) -> PacedIo<T> {
        PacedIo { inner, watched, blocked: false }
    }

    /// Reports a write's outcome: `Some(bytes)` taken, or `None` refused (pending).
    fn wrote(&mut self, taken: Option<usize>) {
        match taken {
            Some(bytes) => {
                self.watched.written.fetch_add(bytes as u64, Ordering::Relaxed);
                if std::mem::take(&mut self.blocked) {
                    let now = Instant::now();
                    self.watched.change(now, |watch| watch.unblocked(now));
                }
            }
            None if !self.blocked => {
                self.blocked = true;
                let now = Instant::now();
                self.watched.change(now, |watch| watch.blocked(now));
            }
            None => {}
        }
    }

    fn report<R>(&mut self, polled: Poll<io::Result<R>>, taken: impl Fn(&R) -> usize) -> Poll<io::Result<R>> {
        match &polled {
            Poll::Pending => self.wrote(None),
            Poll::Ready(Ok(r)) => self.wrote(Some(taken(r))),
            Poll::Ready(Err(_)) => {}
        }
        polled
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for PacedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for PacedIo<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.report(polled, |n| *n)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.report(polled, |n| *n)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.report(polled, |()| 0)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.report(polled, |()| 0)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http_body_util::BodyExt;

    use super::*;
    use crate::pace::MinRate;

    const SEND: MinRate = MinRate { bytes_per_s: 1000, allowance: Duration::from_secs(30) };

    fn answer(frames: Vec<Bytes>) -> (Arc<Watched>, PacedBody) {
        let watched = Watched::new(Watch::new(Instant::now(), Duration::from_secs(10), SEND));
        let in_flight = InFlight::begin(&watched);
        let stream = futures_util::stream::iter(frames.into_iter().map(Ok::<_, io::Error>));
        (watched.clone(), PacedBody::new(Body::from_stream(stream), in_flight))
    }

    /// Each piece handed over makes the connection wait on its client (the bank's deadline is
    /// armed, drawn by the time waited and paid back by the bytes the socket took) until hyper
    /// asks again; large frames go in pieces of [`PIECE`] bytes; the end
    /// ends the wait, and dropping the body ends the request (the connection idles).
    #[tokio::test(start_paused = true)]
    async fn a_piece_handed_over_waits_until_hyper_asks_again() {
        let (watched, mut body) =
            answer(vec![Bytes::from(vec![1u8; 2 * PIECE + 10]), Bytes::from_static(b"end")]);
        let t0 = Instant::now();
        assert_eq!(watched.lock(t0).arm(), Some(t0 + SEND.allowance), "waiting until hyper first asks");
        let mut sizes = Vec::new();
        // The bank: 30 s, less each second waited, plus a second for each 1,000 bytes taken.
        let mut bank = SEND.allowance;
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            sizes.push(data.len());
            let now = Instant::now();
            assert_eq!(watched.lock(now).arm(), Some(now + bank), "waiting on the client");
            bank = (bank - Duration::from_secs(1) + Duration::from_millis(data.len() as u64))
                .min(SEND.allowance);
            tokio::time::advance(Duration::from_secs(1)).await;
            // The socket takes the piece (as `PacedIo` counts it): it pays back the second.
            watched.written.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        assert_eq!(sizes, [PIECE, PIECE, 10, 3]);
        assert_eq!(watched.lock(Instant::now()).arm(), None, "the end was asked for: not waiting");
        drop(body);
        let now = Instant::now();
        assert_eq!(watched.lock(now).arm(), Some(now + Duration::from_secs(10)), "idle");
    }

    /// A cut answer's body (and what is left of its frame) goes at once; the next time hyper
    /// asks, it gets an error, which resets the stream.
    #[tokio::test(start_paused = true)]
    async fn a_cut_answer_lets_go_of_its_body_and_ends_with_an_error() {
        let (watched, mut body) = answer(vec![Bytes::from(vec![1u8; 2 * PIECE])]);
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.data_ref().map(Bytes::len), Some(PIECE));
        watched.cut(&[body.in_flight.key]);
        assert!(lock(&body.slot).is_none(), "the body and the rest of its frame are gone");
        assert!(body.frame().await.unwrap().is_err());
        assert!(body.frame().await.is_none(), "ended");
        assert!(body.is_end_stream());
    }

    /// A socket that refuses data keeps the connection from idling and draws on its bank; the
    /// bytes it takes pay back.
    #[tokio::test(start_paused = true)]
    async fn a_socket_that_refuses_data_is_reported_and_what_it_takes_pays_back() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let t0 = Instant::now();
        let watched = Watched::new(Watch::new(t0, Duration::from_secs(10), SEND));
        let (near, mut far) = tokio::io::duplex(1000);
        let mut io = PacedIo::new(near, watched.clone());
        io.write_all(&[7u8; 1000]).await.unwrap();
        assert_eq!(watched.lock(t0).arm(), Some(t0 + Duration::from_secs(10)), "idle: all taken");
        // The next write finds the socket full.
        let mut write = Box::pin(io.write_all(&[8u8; 500]));
        assert!(futures_util::poll!(write.as_mut()).is_pending());
        assert_eq!(watched.lock(t0).arm(), Some(t0 + SEND.allowance), "waiting on the client, not idle");
        tokio::time::advance(Duration::from_secs(5)).await;
        let mut taken = vec![0u8; 1000];
        far.read_exact(&mut taken).await.unwrap();
        write.await.unwrap();
        // 5 s drawn; the 500 bytes taken after the wait paid back 0.5 s (the first 1,000 found
        // the bank full). Idle from now.
        let now = Instant::now();
        let mut watch = watched.lock(now);
        assert_eq!(watch.arm(), Some(now + Duration::from_secs(10)));
        watch.blocked(now);
        assert_eq!(
            watch.arm(),
            Some(now + SEND.allowance - Duration::from_secs(5) + Duration::from_millis(500))
        );
    }
}
