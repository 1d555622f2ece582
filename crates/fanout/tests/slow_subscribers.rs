//! Slow, frozen and resuming subscribers in simulated time: the scheduler and the window of
//! updates in flight together, over a model of the link that is as unkind as a real one.
//!
//! The link model: everything the gateway sends goes straight into an unbounded pipe (the
//! kernel's socket buffers take anything, which is what hid the problem), and the client reads
//! from it at its own pace in bytes per second, applies each update to a real replica, and
//! acknowledges the way `tickwire-session` does (after 16 messages, or 200 ms after the oldest
//! unacknowledged arrival). The channel publishes a ~300-byte change at 50 Hz, and each
//! subscriber wants every tick.
//!
//! The cases and what they check:
//! - a reader at a quarter of the stream's bytes: every update applies, it never has more in
//!   flight than the session's window allows (so it is never closed), and after the first two
//!   seconds no update it reads is older than [`MAX_AGE`];
//! - a reader that stops for 30 s and keeps its connection: what it has in flight stays
//!   bounded, and once it reads again it is caught up within a second, then stays fresh;
//! - a subscriber detached for 30 s and resumed: the updates it never received are dropped,
//!   it gets one merged update, then live ones;
//! - a healthy subscriber beside them gets every tick's update, never older than a tick.
//!
//! Each ends with the replica equal to the channel's state. Without the window the first case
//! fails: the quarter-rate reader's updates grow tens of seconds old and its updates in flight
//! pass the session's bound (a test below checks that).

mod common;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use common::schema;
use tickwire_fanout::{Due, Options, Outcome, Scheduler, Window, WindowLimits};
use tickwire_state::{Codec, Key, Replica, State, Step, Value};

const MS: Duration = Duration::from_millis(1);
const TICK: Duration = Duration::from_millis(20);
const ACK_EVERY: u64 = 16;
/// The acknowledgement delay the gateway announces by default (`session.ack_delay`), which the
/// window assumes too.
const ACK_DELAY: Duration = Duration::from_millis(200);
/// The session's own bounds (its defaults): channel updates must never reach them.
const SESSION_MAX_MESSAGES: usize = 1024;
const SESSION_MAX_BYTES: usize = 1 << 20;
/// The age bound this file proves for a reader at a quarter of the stream: the window's
/// target (150 ms) and base flight time (reading one update at that pace, plus the ack delay),
/// plus reading the update itself, with room to spare.
const MAX_AGE: Duration = Duration::from_millis(1000);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Reader {
    /// Reads this many bytes per second.
    Rate(f64),
    /// Reads nothing between these instants (ms from the start), then as fast as it can.
    Frozen { from_ms: u64, to_ms: u64 },
    /// The connection drops at `from_ms` (what was not read is lost) and the session resumes at
    /// `to_ms`; it reads as fast as it can otherwise.
    Detached { from_ms: u64, to_ms: u64 },
    /// Reads as fast as it can, this many milliseconds away each way: updates arrive, and its
    /// acknowledgements come back, that much later.
    Far { one_way_ms: u64 },
}

struct InPipe {
    seq: u64,
    bytes: Vec<u8>,
    queued: Instant,
    /// The channel's version when it was queued: the replica must hold it once applied.
    version: u64,
    view: Value,
}

struct Sub {
    reader: Reader,
    window: Window<u32>,
    pipe: VecDeque<InPipe>,
    replica: Replica,
    next_seq: u64,
    /// Client side: highest sequence number delivered, highest acknowledged, and since when
    /// something delivered is unacknowledged.
    delivered: u64,
    ack_sent: u64,
    unacked_since: Option<Instant>,
    budget: f64,
    /// (read at, age) of every update read.
    reads: Vec<(Instant, Duration)>,
    most_in_flight: (usize, usize),
    attached: bool,
    /// One-way latency, and acknowledgements on their way back: (arrives at, up to).
    latency: Duration,
    acks: VecDeque<(Instant, u64)>,
}

struct Sim {
    t0: Instant,
    now: Instant,
    state: State,
    player: Key,
    scheduler: Scheduler<usize>,
    subs: Vec<Sub>,
    round: i64,
    /// Offer every update regardless of the window, as the gateway did before it had one.
    no_window: bool,
}

impl Sim {
    fn new(readers: &[Reader], limits: WindowLimits) -> Sim {
        let t0 = Instant::now();
        let schema = schema();
        let mut scheduler = Scheduler::new();
        let options = Options { interval: TICK, delay: Duration::ZERO, skip_first_full_state: false };
        let subs = readers
            .iter()
            .enumerate()
            .map(|(i, &reader)| {
                scheduler.join(i, options, t0, 0);
                Sub {
                    reader,
                    window: Window::new(limits),
                    pipe: VecDeque::new(),
                    replica: Replica::new(schema.clone()),
                    next_seq: 1,
                    delivered: 0,
                    ack_sent: 0,
                    unacked_since: None,
                    budget: 0.0,
                    reads: Vec::new(),
                    most_in_flight: (0, 0),
                    attached: true,
                    latency: match reader {
                        Reader::Far { one_way_ms } => MS * one_way_ms as u32,
                        _ => Duration::ZERO,
                    },
                    acks: VecDeque::new(),
                }
            })
            .collect();
        let state = State::new(schema);
        Sim { t0, now: t0, state, player: Key::str("p"), scheduler, subs, round: 0, no_window: false }
    }

    fn ms(&self) -> u64 {
        (self.now - self.t0).as_millis() as u64
    }

    /// One tick of the game: 40 entries change (about 300 bytes of delta), then a pass.
    fn tick(&mut self) {
        self.round += 1;
        let round = self.round;
        self.state.set(&[Step::Field(0)], Value::Int(round)).expect("an int");
        for k in 0..40 {
            let key = Key::str(&format!("entity-{k}"));
            let value = Value::Int(round * 1_000_000_000 + k);
            self.state.set(&[Step::Field(1), Step::Key(&key)], value).expect("an int entry");
        }
        let version = self.state.seal();
        let view = self.state.view_for(&self.player);
        let mut due: Vec<Due<usize>> = Vec::new();
        self.scheduler.due(self.now, version, &mut due);
        for Due { id, from } in due {
            let sub = &mut self.subs[id];
            if !self.no_window && (!sub.window.has_room(self.now) || !sub.window.admits(300)) {
                self.scheduler.record(id, self.now, Outcome::Refused);
                continue;
            }
            let prepared = self.state.prepare(from.unwrap_or(0), Codec::Binary).expect("sealed");
            let bytes = prepared.update_for(&self.state, &self.player, false).expect("an update").to_vec();
            sub.window.queued(self.now, 0, from, bytes.len());
            let seq = sub.next_seq;
            sub.next_seq += 1;
            sub.window.sent(seq);
            sub.pipe.push_back(InPipe { seq, bytes, queued: self.now, version, view: view.clone() });
            let (n, b) = sub.window.in_flight();
            sub.most_in_flight = (sub.most_in_flight.0.max(n), sub.most_in_flight.1.max(b));
            self.scheduler.record(id, self.now, Outcome::Sent { to: prepared.to() });
        }
    }

    /// One millisecond of every client reading and acknowledging.
    fn read(&mut self) {
        let (now, ms) = (self.now, self.ms());
        for (id, sub) in self.subs.iter_mut().enumerate() {
            let rate = match sub.reader {
                Reader::Rate(rate) => rate,
                Reader::Frozen { from_ms, to_ms } if (from_ms..to_ms).contains(&ms) => 0.0,
                Reader::Detached { from_ms, to_ms } if (from_ms..to_ms).contains(&ms) => {
                    if sub.attached {
                        // The link drops: what the client did not read is gone with it.
                        sub.attached = false;
                        sub.pipe.clear();
                    }
                    sub.pipe.clear();
                    continue;
                }
                _ => f64::INFINITY,
            };
            if !sub.attached {
                // The resume: the client holds everything up to `delivered`.
                sub.attached = true;
                sub.window.resume(sub.delivered);
                sub.next_seq = sub.delivered + 1;
                sub.ack_sent = sub.delivered;
                sub.unacked_since = None;
                if let Some(base) = sub.window.take_rewind(0) {
                    self.scheduler.rewind(id, base);
                }
            }
            while sub.acks.front().is_some_and(|(at, _)| *at <= now) {
                let (_, up_to) = sub.acks.pop_front().expect("checked");
                sub.window.acked(now, up_to);
            }
            sub.budget = (sub.budget + rate / 1000.0).min(1e9);
            while let Some(next) = sub.pipe.front() {
                if sub.budget < next.bytes.len() as f64 || next.queued + sub.latency > now {
                    break;
                }
                let next = sub.pipe.pop_front().expect("checked");
                sub.budget -= next.bytes.len() as f64;
                let applied = sub.replica.apply(&next.bytes);
                assert!(applied.is_ok(), "t={ms} ms: subscriber {id}: {applied:?}");
                assert_eq!(sub.replica.version(), next.version, "t={ms} ms: subscriber {id}");
                assert_eq!(sub.replica.value(), next.view, "t={ms} ms: subscriber {id}");
                sub.delivered = next.seq;
                sub.unacked_since.get_or_insert(now);
                sub.reads.push((now, now - next.queued));
            }
            if sub.pipe.is_empty() && rate.is_infinite() {
                sub.budget = 0.0;
            }
            let ack_due = sub.delivered - sub.ack_sent >= ACK_EVERY
                || sub.unacked_since.is_some_and(|since| now >= since + ACK_DELAY);
            if ack_due {
                sub.ack_sent = sub.delivered;
                sub.unacked_since = None;
                sub.acks.push_back((now + sub.latency, sub.delivered));
            }
        }
    }

    fn run(&mut self, for_ms: u64) {
        for _ in 0..for_ms {
            self.now += MS;
            self.read();
            if (self.now - self.t0).as_millis().is_multiple_of(TICK.as_millis()) {
                self.tick();
            }
        }
    }

    /// Ages of the updates subscriber `id` read in `[from_ms, to_ms)`.
    fn ages(&self, id: usize, from_ms: u64, to_ms: u64) -> Vec<Duration> {
        let range = self.t0 + MS * from_ms as u32..self.t0 + MS * to_ms as u32;
        self.subs[id].reads.iter().filter(|(at, _)| range.contains(at)).map(|(_, age)| *age).collect()
    }

    /// Every subscriber reads what is left at full speed; each must end on the final state.
    fn settle(&mut self) {
        for sub in &mut self.subs {
            sub.reader = Reader::Rate(f64::INFINITY);
        }
        self.run(2_000);
        // No more changes: what is still on its way arrives.
        for _ in 0..500 {
            self.now += MS;
            self.read();
        }
        for (id, sub) in self.subs.iter().enumerate() {
            assert_eq!(sub.replica.version(), self.state.version(), "subscriber {id}");
            assert_eq!(sub.replica.value(), self.state.view_for(&self.player), "subscriber {id}");
        }
    }
}

/// The stream's bytes per second, from one typical update.
fn stream_rate() -> f64 {
    // Every update after the first is a delta of the same 40 entries.
    let mut state = State::new(schema());
    for round in 1..=2 {
        for k in 0..40 {
            let key = Key::str(&format!("entity-{k}"));
            state.set(&[Step::Field(1), Step::Key(&key)], Value::Int(round * 1_000_000_000 + k)).unwrap();
        }
        state.seal();
    }
    let delta = state.prepare(1, Codec::Binary).unwrap();
    let size = delta.update_for(&state, &Key::str("p"), false).unwrap().to_vec().len();
    assert!(size > 200, "a realistic update: {size} bytes");
    size as f64 / TICK.as_secs_f64()
}

fn quantile(mut ages: Vec<Duration>, q: f64) -> Duration {
    ages.sort();
    ages[((ages.len() - 1) as f64 * q) as usize]
}

fn run_slow_reader(no_window: bool) -> (Duration, Duration, (usize, usize)) {
    let rate = stream_rate();
    let mut sim = Sim::new(&[Reader::Rate(f64::INFINITY), Reader::Rate(rate / 4.0)], WindowLimits::default());
    sim.no_window = no_window;
    sim.run(30_000);
    let healthy = sim.ages(0, 0, 30_000);
    assert!(healthy.len() >= 1_450, "the healthy one gets every tick: {}", healthy.len());
    assert!(healthy.iter().all(|age| *age <= TICK), "the healthy one's updates are fresh");
    let slow = sim.ages(1, 2_000, 30_000);
    assert!(slow.len() > 100, "the slow one keeps getting updates: {}", slow.len());
    let result = (quantile(slow.clone(), 0.99), quantile(slow, 1.0), sim.subs[1].most_in_flight);
    sim.settle();
    result
}

#[test]
fn a_reader_at_a_quarter_of_the_stream_gets_fresh_merged_updates_and_is_never_closed() {
    let (p99, max, (messages, bytes)) = run_slow_reader(false);
    eprintln!(
        "quarter-rate reader: age p99 {p99:?}, max {max:?}; in flight at most {messages} updates, {bytes} B"
    );
    assert!(max <= MAX_AGE, "age p99 {p99:?}, max {max:?}");
    assert!(messages < SESSION_MAX_MESSAGES && bytes < SESSION_MAX_BYTES);
}

/// The same run without the window, as the gateway was before it had one: the check above
/// must be able to fail.
#[test]
fn without_the_window_the_quarter_rate_reader_falls_behind() {
    let (p99, _, (messages, _)) = run_slow_reader(true);
    assert!(p99 > Duration::from_secs(10), "p99 {p99:?}");
    assert!(messages > SESSION_MAX_MESSAGES, "it would have been closed: {messages} in flight");
}

#[test]
fn a_far_client_that_keeps_up_is_not_held_back() {
    // 150 ms each way: with the 200 ms acknowledgement delay, 500 ms of flight, more than the
    // window's target alone would cover.
    let mut sim = Sim::new(&[Reader::Far { one_way_ms: 150 }], WindowLimits::default());
    sim.run(30_000);
    // From 6 s on: the window starts at 1 KiB and grows by about an eighth per flight (500 ms)
    // until the client, not the window, sets the pace.
    let ages = sim.ages(0, 6_000, 30_000);
    let late = ages.iter().filter(|age| **age > MS * 151).count();
    eprintln!("far client: {} updates in 24 s, {late} later than the link", ages.len());
    // Every tick but the few held back while the window drains to re-measure the link.
    assert!(ages.len() >= 1_140, "{} of 1,200 ticks", ages.len());
    assert_eq!(late, 0, "what it gets is as fresh as the link allows");
    sim.settle();
}

#[test]
fn a_reader_that_stops_for_30_s_holds_little_in_flight_and_catches_up_at_once() {
    let frozen = Reader::Frozen { from_ms: 5_000, to_ms: 35_000 };
    let mut sim = Sim::new(&[Reader::Rate(f64::INFINITY), frozen], WindowLimits::default());
    sim.run(45_000);
    let (messages, bytes) = sim.subs[1].most_in_flight;
    eprintln!("frozen reader: at most {messages} updates, {bytes} B in flight");
    assert!(bytes < 64 * 1024, "{bytes} B in flight");
    // What it reads when it wakes: the little that was in flight (old), then fresh state.
    let stale = sim.ages(1, 35_000, 36_000).iter().filter(|age| **age > MAX_AGE).count();
    assert!(stale <= messages, "{stale} stale updates after the freeze");
    let after = sim.ages(1, 36_000, 45_000);
    assert!(after.len() > 400 && after.iter().all(|age| *age <= TICK), "live again after a second");
    sim.settle();
}

#[test]
fn a_resumed_subscriber_gets_one_merged_update_then_live_ones() {
    let detached = Reader::Detached { from_ms: 5_000, to_ms: 35_000 };
    let mut sim = Sim::new(&[Reader::Rate(f64::INFINITY), detached], WindowLimits::default());
    sim.run(35_000);
    let version_at_resume = sim.state.version();
    sim.run(1);
    let sub = &sim.subs[1];
    let after: Vec<_> = sub.reads.iter().filter(|(at, _)| *at >= sim.t0 + MS * 35_000).collect();
    // Nothing queued before the drop reaches it; the first update takes it from where it was
    // to the present in one step.
    assert!(after.iter().all(|(_, age)| *age <= TICK), "{after:?}");
    assert_eq!(after.len(), 1, "one merged update: {after:?}");
    assert!(sub.replica.version() >= version_at_resume);
    sim.run(10_000);
    let live = sim.ages(1, 35_100, 45_000);
    assert!(live.len() > 450 && live.iter().all(|age| *age <= TICK));
    sim.settle();
}
