//! Responses served from memory (a ref's object, its JSON text, a `.raw` payload, a package's
//! objects): their bytes keep their share of the memory budget while they are sent, and a
//! reader that stops taking them is cut off.
//!
//! Why both: counted only until the handler returns, the bytes of answers waiting on slow
//! readers would be memory the budget does not see; counted until sent, a reader that stops
//! reading (HTTP/1.1 with its socket full, HTTP/2 with no flow-control credit left, while it
//! still answers keep-alive pings) would pin the budget, and every request needing it would
//! get 429 for as long as it liked. So a body that its connection has not asked data of for
//! [`STALL`] is cut off: its bytes and its share go, and the next time the connection polls it
//! (when the reader moves again, or the connection is dropped) it ends with an error, which
//! resets the connection or HTTP/2 stream. The bytes reach the connection in copies of
//! [`CHUNK`] bytes, so what the connection itself holds of a stopped reader's answer (hyper
//! queues a few chunks, h2 one or two per stream) stays small and is not counted.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::Stream;
use futures_util::stream::BoxStream;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::body::Held;

/// How long a response's connection may go without asking its body for data before the
/// response is cut off. A download that keeps moving is not cut off, however long it takes:
/// a reader taking a chunk (64 KiB) a minute keeps it going (with HTTP/2, per stream).
pub const STALL: Duration = Duration::from_secs(60);

/// The bytes handed to the connection at a time.
pub const CHUNK: usize = 64 << 10;

/// A body's stream and its share, until the body ends, is dropped or stalls.
struct Slot {
    live: Option<(BoxStream<'static, std::io::Result<Bytes>>, Held)>,
    /// When the connection last asked for data.
    asked: Instant,
    stalled: bool,
}

fn lock(slot: &Mutex<Slot>) -> MutexGuard<'_, Slot> {
    // Nothing under it panics but the inner stream's poll; the slot stays consistent.
    slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A response body that holds `held` while `inner` is sent (see the module's comment).
pub struct Sending {
    slot: Arc<Mutex<Slot>>,
    /// Dropped with the body: ends the watchdog's task.
    _done: oneshot::Sender<()>,
}

impl Sending {
    /// `inner` as a body holding `held`; a watchdog task cuts it off after [`STALL`] without a
    /// request for data. Needs a tokio runtime with a timer.
    pub fn new(inner: BoxStream<'static, std::io::Result<Bytes>>, held: Held) -> Sending {
        let slot =
            Arc::new(Mutex::new(Slot { live: Some((inner, held)), asked: Instant::now(), stalled: false }));
        let (done, mut gone) = oneshot::channel::<()>();
        let watched = Arc::downgrade(&slot);
        tokio::spawn(async move {
            loop {
                let Some(slot) = watched.upgrade() else { return };
                let due = lock(&slot).asked + STALL;
                drop(slot);
                tokio::select! {
                    () = tokio::time::sleep_until(due) => {}
                    _ = &mut gone => return,
                }
                let Some(slot) = watched.upgrade() else { return };
                let mut slot = lock(&slot);
                if slot.live.is_none() {
                    return;
                }
                if slot.asked + STALL <= Instant::now() {
                    slot.live = None;
                    slot.stalled = true;
                    return;
                }
            }
        });
        Sending { slot, _done: done }
    }
}

impl Stream for Sending {
    type Item = std::io::Result<Bytes>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut slot = lock(&self.slot);
        slot.asked = Instant::now();
        let Some((inner, _)) = slot.live.as_mut() else {
            let cut = std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the reader took no data for {} s", STALL.as_secs()),
            );
            return Poll::Ready(slot.stalled.then_some(Err(cut)));
        };
        let next = inner.as_mut().poll_next(cx);
        if let Poll::Ready(None) = next {
            // Sent: the share goes now, not when the connection drops the body.
            slot.live = None;
        }
        next
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        lock(&self.slot).live = None;
    }
}

/// `bytes` as a stream of copies of at most [`CHUNK`] bytes each.
pub fn chunks(bytes: Bytes) -> BoxStream<'static, std::io::Result<Bytes>> {
    let pieces = futures_util::stream::unfold((bytes, 0), |(bytes, at)| async move {
        if at >= bytes.len() {
            return None;
        }
        let end = bytes.len().min(at + CHUNK);
        Some((Ok(Bytes::copy_from_slice(&bytes[at..end])), (bytes, end)))
    });
    Box::pin(pieces)
}

/// A response of `bytes` (with its `Content-Type` and `Content-Length`) that holds `held`,
/// the bytes' share of the memory budget, while it is sent ([`Sending`]).
pub fn held_response(content_type: &'static str, bytes: Bytes, held: Held) -> Response {
    let length = bytes.len();
    let mut response = Body::from_stream(Sending::new(chunks(bytes), held)).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    response
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;
    use crate::http::body::MemoryBudget;

    fn held(budget: &MemoryBudget, bytes: usize) -> Held {
        let mut held = Held::default();
        held.grow(budget, bytes).unwrap();
        held
    }

    /// A response keeps its share until its body has been read to the end, and no longer: the
    /// share goes with the last chunk's successor (the end), before the body is dropped.
    #[tokio::test]
    async fn a_held_response_keeps_its_budget_until_its_body_is_read() {
        let budget = MemoryBudget::new(100);
        let payload = Bytes::from(vec![7u8; CHUNK + 10]);
        let response = held_response("application/octet-stream", payload, held(&budget, 40));
        assert_eq!(response.headers()[header::CONTENT_LENGTH], (CHUNK + 10).to_string().as_str());
        assert_eq!(budget.available(), 60, "held while the response waits to be sent");
        let mut body = response.into_body().into_data_stream();
        assert_eq!(body.next().await.unwrap().unwrap().len(), CHUNK, "one chunk at a time");
        assert_eq!(budget.available(), 60, "held while the rest waits");
        assert_eq!(body.next().await.unwrap().unwrap().len(), 10);
        assert!(body.next().await.is_none());
        assert_eq!(budget.available(), 100, "given back at the end");
    }

    /// A reader that stops taking data is cut off after `STALL`: its share goes, and the body
    /// ends with an error. One that keeps taking it is not, however long it takes.
    #[tokio::test(start_paused = true)]
    async fn a_reader_that_stops_is_cut_off_and_one_that_reads_slowly_is_not() {
        let budget = MemoryBudget::new(100);
        let payload = Bytes::from(vec![1u8; 3 * CHUNK]);
        let response = held_response("application/octet-stream", payload.clone(), held(&budget, 40));
        let mut slow = response.into_body().into_data_stream();
        for _ in 0..3 {
            tokio::time::sleep(STALL - Duration::from_secs(1)).await;
            assert_eq!(slow.next().await.unwrap().unwrap().len(), CHUNK);
        }
        assert!(slow.next().await.is_none(), "all of it, over three minutes");
        assert_eq!(budget.available(), 100);

        let response = held_response("application/octet-stream", payload, held(&budget, 40));
        let mut stopped = response.into_body().into_data_stream();
        assert_eq!(stopped.next().await.unwrap().unwrap().len(), CHUNK);
        tokio::time::sleep(STALL - Duration::from_secs(1)).await;
        assert_eq!(budget.available(), 60, "held while it may still read");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(budget.available(), 100, "given back though the body lives on");
        assert!(stopped.next().await.unwrap().is_err(), "the body ends with an error");
    }
}
