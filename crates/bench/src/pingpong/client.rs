//! One simulated ping-pong client, and the counters all of them share.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use hdrhistogram::Histogram;
use prost::Message;
use rand::{Rng, SeedableRng, rngs::SmallRng};
use tickwire_client::{ConnectOptions, Connection, Event};
use tickwire_wire::proto::{EchoRequest, Status};
use tokio_util::sync::CancellationToken;

use super::{MAX_STEPS, Row};

/// Counters the client tasks share, per step where it matters.
pub(super) struct Shared {
    /// The hold window, in two words: this one, the step held (top 8 bits) and when its window
    /// began (low 56 bits, ns since `epoch`), one word so that a reader never pairs one
    /// window's step with another's start; and `hold_end_ns`, when it ended (`u64::MAX` while
    /// it lasts). A request counts in the step whose window holds the instant it was *due*,
    /// however late its task got to send it: a load generator that falls behind at the end of
    /// a window (where an overload shows) cannot leave its latest requests out.
    hold_start: AtomicU64,
    hold_end_ns: AtomicU64,
    epoch: Instant,
    pub(super) sent: [AtomicU64; MAX_STEPS],
    pub(super) answered: [AtomicU64; MAX_STEPS],
    pub(super) duplicated: AtomicU64,
    /// Answers with an error status or a body of the wrong size (not counted as answered).
    pub(super) bad_answers: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) connected: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) bytes_to_server: AtomicU64,
    pub(super) bytes_from_server: AtomicU64,
    /// Per step: round-trip times, both under one lock (one acquisition per answer).
    pub(super) rtt: Vec<Mutex<RttHistograms>>,
    pub(super) stop: CancellationToken,
}

impl Shared {
    pub(super) fn new() -> Shared {
        Shared {
            hold_start: AtomicU64::new(u64::MAX),
            hold_end_ns: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
            sent: std::array::from_fn(|_| AtomicU64::new(0)),
            answered: std::array::from_fn(|_| AtomicU64::new(0)),
            duplicated: AtomicU64::new(0),
            bad_answers: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            connected: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            bytes_to_server: AtomicU64::new(0),
            bytes_from_server: AtomicU64::new(0),
            rtt: (0..MAX_STEPS).map(|_| Mutex::new(RttHistograms::default())).collect(),
            stop: CancellationToken::new(),
        }
    }

    fn ns(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Starts holding step `step` now (`Some`), or ends the window now (`None`).
    pub(super) fn set_holding(&self, step: Option<usize>, now: Instant) {
        // The window first, then its end: a reader that sees the new end sees the new window;
        // one that sees the old end sees an empty or past window.
        match step {
            Some(step) => {
                debug_assert!(step < MAX_STEPS && MAX_STEPS <= 255);
                let start = self.ns(now).min(START_MASK) | ((step as u64) << 56);
                self.hold_start.store(start, SeqCst);
                self.hold_end_ns.store(u64::MAX, SeqCst);
            }
            None => self.hold_end_ns.store(self.ns(now), SeqCst),
        }
    }

    /// The step whose hold window holds `due`, or `usize::MAX`.
    pub(super) fn step_of(&self, due: Instant) -> usize {
        // Read in the reverse order of the writes.
        let at = self.ns(due);
        let end = self.hold_end_ns.load(SeqCst);
        let packed = self.hold_start.load(SeqCst);
        if packed == u64::MAX {
            return usize::MAX;
        }
        let (step, start) = ((packed >> 56) as usize, packed & START_MASK);
        if start <= at && at < end { step } else { usize::MAX }
    }
}

/// The bits of [`Shared`]'s packed window start that hold nanoseconds (2^56 ns: 2.2 years).
const START_MASK: u64 = (1 << 56) - 1;

/// A step's round-trip times in microseconds.
pub(super) struct RttHistograms {
    /// From each request's due time to its answer.
    pub(super) due: Histogram<u64>,
    /// From the request's write to its answer (the gateway's share, without the load
    /// generator's own lateness).
    pub(super) write: Histogram<u64>,
}

impl Default for RttHistograms {
    fn default() -> Self {
        RttHistograms { due: new_histogram(), write: new_histogram() }
    }
}

/// An RTT histogram in microseconds, from 1 µs to 10 minutes, 3 significant digits.
pub(super) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("histogram bounds are valid")
}

/// An echo request body of `size` bytes (`EchoRequest` plus padding). Exact for every size
/// except the few that the padding's length prefix skips over (it grows from 1 to 2 bytes at
/// 128 bytes of padding); those get one byte less.
pub fn echo_body(size: usize, response_bytes: u32) -> Bytes {
    let base = EchoRequest { response_bytes, padding: Bytes::new() }.encoded_len();
    // The padding field costs a tag byte, a varint length and the padding itself.
    let fits = |target: usize| {
        (1..=5).find_map(|prefix| {
            let pad = target.checked_sub(base + 1 + prefix)?;
            (prost::encoding::encoded_len_varint(pad as u64) == prefix).then_some(pad)
        })
    };
    let padding = (0..=size).rev().take(8).find_map(fits).unwrap_or(0);
    EchoRequest { response_bytes, padding: Bytes::from(vec![0x5a; padding]) }.encode_to_vec().into()
}

/// One simulated client: connect, then send on schedule and match answers until stopped.
pub(super) async fn client(seed: u64, shared: Arc<Shared>, opts: ConnectOptions, row: Row, body: Bytes) {
    let mut conn = match Connection::connect(opts).await {
        Ok(conn) => conn,
        Err(e) => {
            tracing::debug!(error = %e, "connect failed");
            shared.failed.fetch_add(1, Relaxed);
            shared.errors.fetch_add(1, Relaxed);
            return;
        }
    };
    shared.connected.fetch_add(1, Relaxed);
    let mut rng = SmallRng::seed_from_u64(seed);
    let think = |rng: &mut SmallRng| match row.max_think {
        Some(max) => rng.random_range(row.think_range(max)),
        None => row.interval,
    };
    // A random phase spreads the clients' sends evenly over the interval.
    let phase = row.max_think.unwrap_or(row.interval).mul_f64(rng.random::<f64>());
    let mut next = tokio::time::Instant::now() + phase;
    let timer = tokio::time::sleep_until(next);
    tokio::pin!(timer);
    // (id, due, written, step) of each request not answered yet.
    let mut outstanding: VecDeque<(u64, Instant, Instant, usize)> = VecDeque::new();
    let mut id = 0u64;
    let (mut seen_in, mut seen_out) = (0u64, 0u64);
    loop {
        conn.flush().await;
        let (bytes_in, bytes_out) = conn.byte_counts();
        shared.bytes_from_server.fetch_add(bytes_in - seen_in, Relaxed);
        shared.bytes_to_server.fetch_add(bytes_out - seen_out, Relaxed);
        (seen_in, seen_out) = (bytes_in, bytes_out);
        tokio::select! {
            biased;
            () = shared.stop.cancelled() => break,
            () = &mut timer => {
                id += 1;
                let step = shared.step_of(next.into_std());
                if step != usize::MAX {
                    shared.sent[step].fetch_add(1, Relaxed);
                }
                // RTT counts from when the request was due, not from when this task got to
                // send it: a late load generator must not hide its own lateness (coordinated
                // omission).
                outstanding.push_back((id, next.into_std(), Instant::now(), step));
                if conn.send_request(id, "echo", body.clone()).is_err() {
                    shared.errors.fetch_add(1, Relaxed);
                    break;
                }
                // Open loop: the schedule never waits for answers.
                next += think(&mut rng);
                timer.as_mut().reset(next);
            }
            event = conn.next_event() => match event {
                Ok(Some(Event::Response(response))) => {
                    match outstanding.iter().position(|(i, ..)| *i == response.id) {
                        Some(pos) => {
                            let (_, due_at, written_at, step) =
                                outstanding.remove(pos).expect("position is valid");
                            let good = response.status == Status::Ok as i32
                                && response.body.len() == row.response_bytes as usize;
                            if !good {
                                // An error answer is not an answer: it stays unanswered (lost).
                                shared.bad_answers.fetch_add(1, Relaxed);
                            } else if step != usize::MAX {
                                let now = Instant::now();
                                let from_due = (now - due_at).as_micros() as u64;
                                let from_write = (now - written_at).as_micros() as u64;
                                let mut h = shared.rtt[step].lock().expect("histogram lock");
                                let _ = h.due.record(from_due.max(1));
                                let _ = h.write.record(from_write.max(1));
                                shared.answered[step].fetch_add(1, Relaxed);
                            }
                        }
                        None => {
                            shared.duplicated.fetch_add(1, Relaxed);
                        }
                    }
                }
                Ok(Some(Event::LinkLost)) => {
                    // A real client resumes; the bench counts the drop as an error and resumes too.
                    shared.errors.fetch_add(1, Relaxed);
                    if conn.resume().await.is_err() {
                        break;
                    }
                }
                Ok(Some(_)) | Err(_) => {
                    shared.errors.fetch_add(1, Relaxed);
                    break;
                }
                Ok(None) => {}
            },
        }
    }
    if !shared.stop.is_cancelled() {
        shared.connected.fetch_sub(1, Relaxed);
    }
    conn.close().await;
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A request counts in the step whose window holds its due time, sent late or not.
    #[test]
    fn a_request_counts_in_the_window_it_was_due_in() {
        let shared = Shared::new();
        let t0 = Instant::now() + Duration::from_secs(1);
        let ms = |n: u64| t0 + Duration::from_millis(n);
        assert_eq!(shared.step_of(ms(0)), usize::MAX, "no window yet");
        shared.set_holding(Some(3), ms(0));
        assert_eq!(shared.step_of(t0 - Duration::from_millis(1)), usize::MAX, "due before it");
        assert_eq!(shared.step_of(ms(5)), 3);
        shared.set_holding(None, ms(10));
        assert_eq!(shared.step_of(ms(9)), 3, "due inside, sent after the end");
        assert_eq!(shared.step_of(ms(10)), usize::MAX, "due after the end");
        shared.set_holding(Some(4), ms(20));
        assert_eq!(shared.step_of(ms(9)), usize::MAX, "the last window is over");
        assert_eq!(shared.step_of(ms(21)), 4);
    }
}
