//! Responses served from memory (a ref's object, its JSON text, a `.raw` payload, a package's
//! objects): their bytes keep their share of the memory budget while they are sent.
//!
//! Counted only until the handler returns, the bytes of answers waiting on slow readers would
//! be memory the budget does not see. Counted until sent, a reader that stops reading
//! (HTTP/1.1 with its socket full, HTTP/2 with no flow-control credit left, while it still
//! answers keep-alive pings) pins them until its connection's watch gives up on it
//! (`serve/watch.rs`: the connection dropped, or this answer cut, after `--send-timeout`), and
//! this body and its share go with it. The bytes reach the connection in copies of [`CHUNK`]
//! bytes, so what the connection itself holds of a stopped reader's answer stays small and is
//! not counted: over HTTP/2, up to three chunks a stream (one hyper holds, and h2's queue of
//! `max_send_buf_size`, which takes a whole chunk when it has room for a byte); over HTTP/1.1,
//! hyper's write buffer (about 400 KiB).

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::Stream;
use futures_util::stream::BoxStream;

use super::body::Held;

/// The bytes handed to the connection at a time.
pub const CHUNK: usize = 64 << 10;

/// A body's stream and its share of the memory budget, until the stream ends or the body is
/// dropped.
pub struct Sending {
    live: Option<(BoxStream<'static, std::io::Result<Bytes>>, Held)>,
}

impl Sending {
    /// `inner` as a body holding `held`.
    pub fn new(inner: BoxStream<'static, std::io::Result<Bytes>>, held: Held) -> Sending {
        Sending { live: Some((inner, held)) }
    }
}

impl Stream for Sending {
    type Item = std::io::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Some((inner, _)) = self.live.as_mut() else { return Poll::Ready(None) };
        let next = inner.as_mut().poll_next(cx);
        if let Poll::Ready(None) = next {
            // Sent: the share goes now, not when the connection drops the body.
            self.live = None;
        }
        next
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

        // A body dropped unsent (its connection dropped) gives its share back too.
        let response =
            held_response("application/octet-stream", Bytes::from(vec![7u8; 10]), held(&budget, 40));
        assert_eq!(budget.available(), 60);
        drop(response);
        assert_eq!(budget.available(), 100, "given back when dropped");
    }
}
