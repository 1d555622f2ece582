//! Deterministic simulation of one channel's fan-out in simulated time.
//!
//! A random run joins and removes subscribers with random intervals, delays, outbox sizes and
//! skip-first-full-state, applies random patches to a real state tree, lets time pass, and
//! drains each subscriber's outbox at its own random pace (some never drain: frozen). Every
//! pass asks the scheduler who is due, encodes their updates with the real encoder, and an
//! oracle that does not share the scheduler's code checks:
//! - every queued update applies to the subscriber's replica (its `from` is exactly the version
//!   the replica holds: no gap, no repeat) and leaves it equal to the channel's view at send time;
//! - no update comes before `delay`, and the rate holds: between updates `i < j` of one
//!   subscriber at least `(j - i - 1) * interval` passes;
//! - freshness: a subscriber with room in its outbox whose previous offer is an interval old
//!   (and whose delay is over) holds the current version after the pass;
//! - at the end, with everyone draining, every replica equals the channel's final state.
//!
//! A subscriber that skips the first full state starts with a replica of the state at its
//! join, as its client would; the scheduler that lost patches made between the subscribe and
//! the first pass fails the first check.
//!
//! Two ways of running passes are simulated. As a channel's actor: a pass on every tick and one
//! right after every patch. As the spatial world: a pass on every tick only. Either way each
//! tick's pass may run late by a random amount (mostly under a tick; the ticks a pass overruns
//! are skipped, as tokio's `MissedTickBehavior::Skip` does), and the scheduler is given the
//! instant the tick was due (its `now` for the oracle's checks of rate and freshness too); a
//! pass after a patch, and joins and drains, happen at the clock's instants in between. A
//! scheduler given the clock's instants for ticks while the oracle keeps the due instants
//! fails the checks (a late tick makes the next one skip a subscriber). The oracle cannot tell
//! which convention the caller uses; a scheduler and oracle both on the clock pass.

mod common;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use common::schema;
use proptest::prelude::*;
use tickwire_fanout::{Due, Options, Outcome, Scheduler};
use tickwire_state::{Codec, Key, Replica, Schema, State, Step, Value, Version};

const KEYS: [&str; 4] = ["a", "b", "c", "d"];

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    /// The next tick's pass runs this many percent of a tick late (the last one before the pass
    /// counts). Past a whole tick, the ticks it overran are skipped, as
    /// `tokio::time::MissedTickBehavior::Skip` does.
    Late(u32),
    /// Write these (key index, value) pairs; with [`Passes::Channel`], then run a pass (as the
    /// actor does after a patch).
    Patch(Vec<(usize, i64)>),
    Join {
        interval_ms: u64,
        delay_ms: u64,
        skip_first: bool,
        capacity: usize,
    },
    Leave(prop::sample::Index),
    Drain(prop::sample::Index, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u64..60).prop_map(Op::Advance),
        5 => prop::collection::vec((0..KEYS.len(), -50i64..50), 1..4).prop_map(Op::Patch),
        2 => (
            prop::sample::select(vec![0u64, 10, 20, 33, 50, 100, 200]),
            prop::sample::select(vec![0u64, 0, 30, 150]),
            any::<bool>(),
            1usize..4,
        )
            .prop_map(|(interval_ms, delay_ms, skip_first, capacity)| Op::Join {
                interval_ms,
                delay_ms,
                skip_first,
                capacity
            }),
        1 => any::<prop::sample::Index>().prop_map(Op::Leave),
        5 => (any::<prop::sample::Index>(), 1usize..4).prop_map(|(i, n)| Op::Drain(i, n)),
        // Late ticks: mostly under a tick, some past one.
        3 => prop_oneof![4 => 1u32..100, 1 => 100u32..250].prop_map(Op::Late),
    ]
}

/// An update in a subscriber's outbox, with what its replica must equal once applied.
struct Queued {
    bytes: Vec<u8>,
    view: Value,
}

struct Sub {
    id: u32,
    options: Options,
    joined_at: Instant,
    capacity: usize,
    outbox: VecDeque<Queued>,
    replica: Replica,
    /// Instants at which the scheduler offered it an update (sent or refused).
    offers: Vec<Instant>,
}

impl Sub {
    /// What the replica will hold once the outbox is drained.
    fn latest_view(&self) -> Value {
        self.outbox.back().map_or_else(|| self.replica.value(), |q| q.view.clone())
    }
}

/// How passes run (see the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Passes {
    /// A channel's actor: every tick, and after every patch.
    Channel,
    /// The spatial world: every tick only.
    Timer,
}

struct World {
    t0: Instant,
    /// The clock.
    now: Instant,
    /// The instant the running pass counts as: a tick's due instant, or the clock for a pass
    /// after a patch.
    scheduled: Instant,
    passes: Passes,
    /// How late the next tick's pass runs.
    late: Duration,
    tick: Duration,
    next_tick: Instant,
    state: State,
    schema: std::sync::Arc<Schema>,
    scheduler: Scheduler<u32>,
    subs: Vec<Sub>,
    next_id: u32,
    player: Key,
}

impl World {
    fn new(tick_ms: u64, passes: Passes) -> World {
        let t0 = Instant::now();
        let schema = schema();
        World {
            t0,
            now: t0,
            scheduled: t0,
            passes,
            late: Duration::ZERO,
            tick: Duration::from_millis(tick_ms),
            next_tick: t0,
            state: State::new(schema.clone()),
            schema,
            scheduler: Scheduler::new(),
            subs: Vec::new(),
            next_id: 0,
            player: Key::str("p"),
        }
    }

    fn at(&self) -> u128 {
        (self.now - self.t0).as_millis()
    }

    /// Moves time on, running a pass at every channel tick on the way.
    fn advance(&mut self, by: Duration) -> Result<(), TestCaseError> {
        let until = self.now + by;
        while self.next_tick + self.late <= until {
            let due = self.next_tick;
            self.now = self.now.max(due + self.late);
            self.next_tick += self.tick;
            // Ticks the late pass overran are skipped: the next is the first after it ran.
            while self.next_tick <= self.now {
                self.next_tick += self.tick;
            }
            self.late = Duration::ZERO;
            self.scheduled = due;
            self.pass()?;
        }
        self.now = until;
        Ok(())
    }

    /// The next tick's pass runs `percent` of a tick late.
    fn make_late(&mut self, percent: u32) {
        self.late = self.tick * percent / 100;
    }

    fn patch(&mut self, writes: &[(usize, i64)]) -> Result<(), TestCaseError> {
        let frame = self.state.version() as i64 + 1;
        self.state.set(&[Step::Field(0)], Value::Int(frame)).expect("frame is an int");
        for &(k, v) in writes {
            let key = Key::str(KEYS[k]);
            if v < -40 {
                self.state.remove(&[Step::Field(1), Step::Key(&key)]).expect("a map entry");
            } else {
                self.state.set(&[Step::Field(1), Step::Key(&key)], Value::Int(v)).expect("an int entry");
            }
        }
        match self.passes {
            Passes::Channel => {
                self.scheduled = self.now;
                self.pass()
            }
            Passes::Timer => Ok(()),
        }
    }

    fn join(&mut self, options: Options, capacity: usize) {
        let id = self.next_id;
        self.next_id += 1;
        let mut replica = Replica::new(self.schema.clone());
        if options.skip_first_full_state {
            // The client already holds the state as of now (it got it some other way). With
            // passes on the timer only, changes since the last pass are not sealed yet: sealed
            // here, as of the join.
            self.state.seal();
            let snapshot = self.state.prepare(0, Codec::Binary).expect("a snapshot");
            let bytes = snapshot.update_for(&self.state, &self.player, false).expect("an update").to_vec();
            replica.apply(&bytes).expect("a snapshot applies");
        }
        assert!(self.scheduler.join(id, options, self.now, self.state.version()));
        self.subs.push(Sub {
            id,
            options,
            joined_at: self.now,
            capacity,
            outbox: VecDeque::new(),
            replica,
            offers: Vec::new(),
        });
    }

    fn leave(&mut self, index: prop::sample::Index) {
        if self.subs.is_empty() {
            return;
        }
        let sub = self.subs.remove(index.index(self.subs.len()));
        assert!(self.scheduler.leave(sub.id));
    }

    fn drain(sub: &mut Sub, n: usize, at: u128) -> Result<(), TestCaseError> {
        for _ in 0..n {
            let Some(q) = sub.outbox.pop_front() else { break };
            let held = sub.replica.version();
            let applied = sub.replica.apply(&q.bytes);
            prop_assert!(
                applied.is_ok(),
                "t={at} ms: subscriber {} ({:?}) at version {held}: {applied:?}",
                sub.id,
                sub.options
            );
            prop_assert_eq!(sub.replica.value(), q.view, "t={} ms: subscriber {}", at, sub.id);
        }
        Ok(())
    }

    /// One fan-out pass at `scheduled`, then the oracle's checks. A tick's offers are at its
    /// due instant: the rate holds between the instants the passes count as; and a pass never
    /// runs before it is due, so the delay holds in real time too.
    fn pass(&mut self) -> Result<(), TestCaseError> {
        let version = self.state.seal();
        let view = self.state.view_for(&self.player);
        let had_room: Vec<bool> = self.subs.iter().map(|s| s.outbox.len() < s.capacity).collect();
        let mut due: Vec<Due<u32>> = Vec::new();
        self.scheduler.due(self.scheduled, version, &mut due);
        for d in due {
            let sub = self.subs.iter_mut().find(|s| s.id == d.id).expect("the scheduler knows only members");
            let prepared = self.state.prepare(d.from.unwrap_or(0), Codec::Binary).expect("sealed state");
            let update = prepared.update_for(&self.state, &self.player, false).expect("an update");
            let outcome = if d.from.is_some() && !prepared.is_snapshot() && !update.has_changes() {
                Outcome::Empty
            } else if sub.outbox.len() >= sub.capacity {
                sub.offers.push(self.scheduled);
                Outcome::Refused
            } else {
                sub.offers.push(self.scheduled);
                sub.outbox.push_back(Queued { bytes: update.to_vec(), view: view.clone() });
                Outcome::Sent { to: prepared.to() }
            };
            self.scheduler.record(d.id, self.scheduled, outcome);
        }
        let at = self.at();
        for (sub, had_room) in self.subs.iter().zip(had_room) {
            let start = sub.joined_at + sub.options.delay;
            if let Some(first) = sub.offers.first() {
                prop_assert!(
                    *first >= start,
                    "t={at} ms: subscriber {} got an update before its delay",
                    sub.id
                );
            }
            // The rate: offers i < j are at least (j - i - 1) intervals apart.
            let n = sub.offers.len();
            for i in n.saturating_sub(6)..n {
                for j in i + 2..n {
                    let gap = sub.offers[j] - sub.offers[i];
                    prop_assert!(
                        gap >= sub.options.interval * (j - i - 1) as u32,
                        "t={at} ms: subscriber {} ({:?}): offers {i} and {j} only {gap:?} apart",
                        sub.id,
                        sub.options
                    );
                }
            }
            // Freshness: due by the oracle's own reckoning, with room: it holds the current view.
            let now = self.scheduled;
            let due = now >= start && sub.offers.last().is_none_or(|t| now >= *t + sub.options.interval);
            if due && had_room {
                prop_assert_eq!(
                    sub.latest_view(),
                    view.clone(),
                    "t={} ms: subscriber {} ({:?}) was due with room but is behind version {}",
                    at,
                    sub.id,
                    sub.options,
                    version
                );
            }
        }
        Ok(())
    }

    /// Everyone drains; after the longest interval and delay every replica holds the final state.
    fn settle(&mut self) -> Result<(), TestCaseError> {
        let rounds = (400 / self.tick.as_millis() as u64) + 3;
        for _ in 0..rounds {
            let at = self.at();
            for sub in &mut self.subs {
                Self::drain(sub, usize::MAX, at)?;
            }
            self.advance(self.tick)?;
        }
        let at = self.at();
        let version: Version = self.state.version();
        let view = self.state.view_for(&self.player);
        for sub in &mut self.subs {
            Self::drain(sub, usize::MAX, at)?;
            prop_assert_eq!(sub.replica.version(), version, "subscriber {} ({:?})", sub.id, sub.options);
            prop_assert_eq!(sub.replica.value(), view.clone(), "subscriber {}", sub.id);
        }
        Ok(())
    }
}

fn run(tick_ms: u64, passes: Passes, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut world = World::new(tick_ms, passes);
    for op in ops {
        match op {
            Op::Advance(ms) => world.advance(Duration::from_millis(ms))?,
            Op::Late(percent) => world.make_late(percent),
            Op::Patch(writes) => world.patch(&writes)?,
            Op::Join { interval_ms, delay_ms, skip_first, capacity } => {
                let options = Options {
                    interval: Duration::from_millis(interval_ms),
                    delay: Duration::from_millis(delay_ms),
                    skip_first_full_state: skip_first,
                };
                world.join(options, capacity);
            }
            Op::Leave(i) => world.leave(i),
            Op::Drain(i, n) => {
                if !world.subs.is_empty() {
                    let at = world.at();
                    let len = world.subs.len();
                    World::drain(&mut world.subs[i.index(len)], n, at)?;
                }
            }
        }
    }
    world.settle()
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(2_000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn every_subscriber_converges_at_its_own_rate(
        tick_ms in prop::sample::select(vec![10u64, 20, 50]),
        ops in prop::collection::vec(op(), 1..200),
    ) {
        run(tick_ms, Passes::Channel, ops)?;
    }

    #[test]
    fn every_subscriber_converges_at_its_own_rate_with_passes_on_the_timer_only(
        tick_ms in prop::sample::select(vec![10u64, 20, 50]),
        ops in prop::collection::vec(op(), 1..200),
    ) {
        run(tick_ms, Passes::Timer, ops)?;
    }
}

/// The case in `simulation.proptest-regressions`, found by the channel's simulation before late
/// ticks were among its operations (so its seed no longer reproduces it), kept for both ways of
/// running passes.
#[test]
fn a_skip_first_subscriber_at_interval_zero_gets_the_patch_after_its_join() {
    for passes in [Passes::Channel, Passes::Timer] {
        let ops = vec![
            Op::Join { interval_ms: 0, delay_ms: 0, skip_first: true, capacity: 1 },
            Op::Patch(vec![(0, 0)]),
        ];
        run(10, passes, ops).unwrap();
    }
}

/// The race the first scheduler lost: a patch lands after a skip-first subscribe and before
/// that subscriber's first pass.
#[test]
fn a_patch_between_a_skip_first_subscribe_and_its_first_pass_is_delivered() {
    let ops = vec![
        Op::Patch(vec![(0, 1)]),
        Op::Join { interval_ms: 100, delay_ms: 0, skip_first: true, capacity: 2 },
        Op::Patch(vec![(1, 2)]),
        Op::Advance(120),
    ];
    run(20, Passes::Channel, ops).unwrap();
}
