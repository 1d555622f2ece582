//! The glue between a connection's requests and its [`Watch`]: each request is counted in
//! flight from when hyper hands it over until its response body is dropped ([`InFlight`]), and
//! each response body ([`PacedBody`]) reports when it waits on the client.
//!
//! A response waits on its client from when its body hands the connection a piece until the
//! connection asks for the next one: hyper asks only once it has room for more, so that time
//! is the client's (its socket full over HTTP/1.1; over HTTP/2, its stream or connection out of
//! flow-control credit, which keep-alive pings do not see). The time the body itself takes to
//! produce a piece (a disk or a bucket) is not counted.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::watch::Watch;
use crate::pace::{MinRate, Pace};

/// A connection's [`Watch`], and the wake-up of its task.
#[derive(Debug)]
pub(crate) struct Watched {
    watch: Mutex<Watch>,
    pub wake: Notify,
}

impl Watched {
    pub fn new(watch: Watch) -> Arc<Watched> {
        Arc::new(Watched { watch: Mutex::new(watch), wake: Notify::new() })
    }

    pub fn lock(&self) -> MutexGuard<'_, Watch> {
        // Nothing panics under it; the watch stays consistent.
        self.watch.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `change` on the watch and wakes the connection's task if it says so.
    fn change(&self, change: impl FnOnce(&mut Watch) -> bool) {
        if change(&mut self.lock()) {
            self.wake.notify_one();
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
        let key = watched.lock().begin();
        InFlight { watched: watched.clone(), key }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let now = Instant::now();
        self.watched.change(|watch| watch.end(self.key, now));
    }
}

/// A response body that reports its waits on the client (see the module's comment).
pub(crate) struct PacedBody {
    inner: Body,
    pace: Pace,
    /// The bytes of the piece last handed over, while the connection has not asked for more.
    handed: Option<u64>,
    in_flight: InFlight,
}

impl PacedBody {
    pub fn new(inner: Body, rate: MinRate, in_flight: InFlight) -> PacedBody {
        PacedBody { inner, pace: Pace::new(rate), handed: None, in_flight }
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
        let now = Instant::now();
        // The connection asked again: the client took the last piece.
        let took = this.handed.take().inspect(|&bytes| this.pace.moved(now, bytes)).is_some();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        let until = match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                this.handed = Some(frame.data_ref().map_or(0, |data| data.len() as u64));
                Some(this.pace.wait(now))
            }
            _ => None,
        };
        if took || until.is_some() {
            let key = this.in_flight.key;
            this.in_flight.watched.change(|watch| watch.waiting(key, until));
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
