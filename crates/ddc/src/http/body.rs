//! Request bodies: streamed to disk through [`body_reader`] (at a minimum rate: [`crate::pace`]),
//! or, for bodies that must be checked whole (compact binary, compressed buffers, packages,
//! batches), read into memory by [`read_body`] against both a per-request cap and a
//! server-wide memory budget. A request that would overdraw the budget gets 429, which the
//! editor retries, instead of the server running out of memory. Responses served from memory
//! keep their share while they are sent: `sending.rs`.

use axum::body::Body;
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use tokio::time::Instant;
use tokio_util::io::StreamReader;

use super::ApiError;
pub use crate::budget::{Held, MemoryBudget};
use crate::pace::{MinRate, Pace};

/// The request body as a reader. A body that breaks off (the client stopped sending) reads as
/// `UnexpectedEof`, and one slower than `rate` allows as `TimedOut`: both the client's fault
/// (400 and 408), not the disk's.
pub fn body_reader(body: Body, rate: MinRate) -> impl tokio::io::AsyncRead + Unpin {
    let chunks =
        body.into_data_stream().map_err(|e| std::io::Error::new(std::io::ErrorKind::UnexpectedEof, e));
    let paced = futures_util::stream::unfold(Some((chunks, Pace::new(rate))), |state| async move {
        let (mut chunks, mut pace) = state?;
        match next_chunk(&mut chunks, &mut pace).await {
            Ok(Some(chunk)) => Some((chunk, Some((chunks, pace)))),
            Ok(None) => None,
            Err(too_slow) => {
                let slow = std::io::Error::new(std::io::ErrorKind::TimedOut, too_slow.to_string());
                // End the stream after the error.
                Some((Err(slow), None))
            }
        }
    });
    StreamReader::new(Box::pin(paced))
}

/// The next chunk of `chunks` (`Ok(None)` at the end), or [`ApiError::BodyTooSlow`] if the
/// client ran out of its allowance first.
async fn next_chunk<S, E>(chunks: &mut S, pace: &mut Pace) -> Result<Option<Result<Bytes, E>>, ApiError>
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin,
{
    let until = pace.wait(Instant::now());
    match tokio::time::timeout_at(until, chunks.next()).await {
        Err(_) => Err(ApiError::BodyTooSlow(pace.rate())),
        Ok(next) => {
            let len = match &next {
                Some(Ok(chunk)) => chunk.len() as u64,
                _ => 0,
            };
            pace.moved(Instant::now(), len);
            Ok(next)
        }
    }
}

/// A body read whole, and its share of the memory budget (returned when dropped).
pub struct Buffered {
    pub bytes: Vec<u8>,
    held: Held,
}

impl Buffered {
    /// The bytes, and the budget they hold (keep it as long as the bytes).
    pub fn into_parts(self) -> (Vec<u8>, Held) {
        (self.bytes, self.held)
    }
}

/// Reads a whole body of at most `limit` bytes, charging it to `budget` as it arrives: what the
/// buffer holds (its capacity, not only the bytes read), in one permit however many chunks
/// it came in.
pub async fn read_body(
    body: Body,
    limit: u64,
    rate: MinRate,
    budget: &MemoryBudget,
) -> Result<Buffered, ApiError> {
    let mut chunks = body.into_data_stream();
    let mut pace = Pace::new(rate);
    let mut bytes = Vec::new();
    let mut held = Held::default();
    // What `held` holds: the buffer's capacity.
    let mut charged = 0usize;
    loop {
        let chunk = match next_chunk(&mut chunks, &mut pace).await {
            Err(too_slow) => return Err(too_slow),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(ApiError::BodyBroken(e.to_string())),
            Ok(Some(Ok(chunk))) => chunk,
        };
        let len = bytes.len() + chunk.len();
        if len as u64 > limit {
            return Err(ApiError::TooLarge { limit });
        }
        if len > charged {
            // Grown as `Vec` grows (doubling, at most to the limit), charged before it grows.
            let capacity = len.max(charged * 2).min(usize::try_from(limit).unwrap_or(usize::MAX));
            held.grow(budget, capacity - charged)?;
            bytes.reserve_exact(capacity - bytes.len());
            charged = capacity;
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Buffered { bytes, held })
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use std::time::Duration;

    use super::*;

    const RATE: MinRate = MinRate { bytes_per_s: 1024, allowance: Duration::from_secs(5) };

    /// A body in one-byte chunks is charged what its buffer holds, in one permit, and gives it
    /// all back when dropped; one the budget cannot hold is refused.
    #[tokio::test]
    async fn a_body_is_charged_its_buffers_capacity() {
        let budget = MemoryBudget::new(100);
        let chunks = (0..60u8).map(|i| Ok::<_, Infallible>(bytes::Bytes::from(vec![i])));
        let body = Body::from_stream(futures_util::stream::iter(chunks));
        let Ok(read) = read_body(body, 1000, RATE, &budget).await else { panic!("not read") };
        assert_eq!(read.bytes, (0..60).collect::<Vec<u8>>());
        // Doubling from one byte: 64.
        assert_eq!(budget.available(), 100 - 64);
        drop(read);
        assert_eq!(budget.available(), 100);

        let chunks = (0..120u8).map(|i| Ok::<_, Infallible>(bytes::Bytes::from(vec![i])));
        let body = Body::from_stream(futures_util::stream::iter(chunks));
        let refused = read_body(body, 1000, RATE, &budget).await;
        assert!(matches!(refused, Err(ApiError::Busy)));
        assert_eq!(budget.available(), 100, "nothing kept");
    }
}
