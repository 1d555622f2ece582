//! Delivering the spatial world's passes, on the I/O thread of the sessions they go to.
//!
//! Why apart from the world: per viewer, a pass asks the session's window of updates in flight
//! whether it has room, gathers the cells' entries into one message, and queues it in the
//! session's outbox. Done on the world's thread, each of those touches memory the session's I/O
//! thread writes (the window on every acknowledgement, the outbox's queue and waker on every
//! read), and that waiting was most of a pass at thousands of viewers. So each I/O thread has a
//! [`Delivery`] that owns what the viewers of its sessions hold (the cells in view, the version
//! of each, the schedule) and runs every pass for them there, from the [`Frame`] the world
//! encoded: the world's pass encodes and hands over one frame per I/O thread; the viewers'
//! windows, outboxes and wake-ups stay on the thread that owns them. That is with
//! `channels.spatial_delivery = "io_threads"`. By default, and for sessions on no I/O thread
//! (tests, the harness), every viewer shares one delivery the world runs itself, at the end of
//! its pass: on 2 cores, where the I/O threads are the busiest, that kept clients' rates
//! higher at the knee in most paired rounds.
//!
//! The world and a delivery talk through two bounded mailboxes (`delivery/mailbox.rs`): the
//! world posts each viewer's
//! latest view (cells, codec, schedule) and each pass (up to 8 waiting); the delivery posts the
//! entries its viewers will need that its last pass did not have (for a viewer behind, one due
//! less often than every pass, or a new one not yet due), and the viewers whose session has
//! gone. A view change and a pass are applied in the order the world made them when the
//! delivery keeps up; when it does not, it applies the latest views and then every waiting pass
//! in order. A viewer whose
//! message would lack an entry the pass did not have gets nothing until a pass has them all: the
//! entries are asked for, and it stays due. Nothing is lost either way: a viewer's version
//! of a cell changes only when an update for it is queued.
//!
//! Level of detail (docs/protocol.md 14.4) holds a cell's changes back from a viewer until its
//! interval lets them go ([`held::Held`]); a viewer with cells held back stays due, one interval
//! after another, until they have gone. When a cell's interval lets it go, it takes part in all
//! or nothing like any other. A cell that goes takes with it each cell in view that an entity
//! it lost went to (`delivery/forced.rs`, from the cells' logs of moves: `moves.rs`), so an
//! entity walking into a slower band does not vanish from the client's view in between. A
//! pass reads only the cells of a viewer's bands whose turn has come (`delivery/watch.rs`), and
//! one viewer's pass is `delivery/viewer.rs`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hashbrown::{HashMap, HashSet};
use prost::Message;
use tickwire_fanout::{Due, Outcome, Scheduler};
use tickwire_wire::proto::{ChannelEvent, ChannelEventKind};

use super::frame::{Frame, codec_index};
use super::{CELL_BASE, HELD_BACK_QUEUE, HELD_BACK_REASONS, SpatialFigures, WORLD_KEY};
use crate::router::SessionHandle;

mod forced;
mod gather;
mod held;
mod mailbox;
mod viewer;
mod watch;
use forced::forced_by;
use gather::Gather;
use held::Held;
use mailbox::{Change, MAX_WAITING_PASSES, Then, lock};
pub(super) use mailbox::{Mailbox, Report, View};
use viewer::{Step, Viewer};
use watch::Watch;

/// The most bytes of cell entries one `channel.updates` message carries (one entry always, even
/// past it: a cell's state is bounded by `channels.max_state_bytes`). A viewer with more to
/// catch up on (snapshots of many cells just entered) gets the rest at its next passes, so no
/// message outgrows the session's bound on unacknowledged data or the frame size.
const MAX_MESSAGE_BYTES: usize = 256 << 10;

/// What a [`Delivery::run`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Run {
    /// Viewers queued a message, over all its passes.
    pub sent: u64,
    /// Passes delivered.
    pub passes: usize,
}

/// What one run counted, added to the world's figures once per run.
#[derive(Default)]
struct Counts {
    fanouts: u64,
    catch_up: u64,
    held_back: [u64; HELD_BACK_REASONS],
}

/// The viewers of one I/O thread's sessions (or of the sessions on none), and their passes.
pub(super) struct Delivery {
    mailbox: Arc<Mailbox>,
    figures: Arc<SpatialFigures>,
    viewers: HashMap<u64, Viewer>,
    schedule: Scheduler<u64>,
    /// Viewers whose interval is longer than the world's tick, or with cells whose level of
    /// detail makes them change less often than the viewer's updates: their entries are asked
    /// for a pass before they are due.
    slow: HashSet<u64>,
    /// The world's tick: a viewer due less often is `slow`.
    tick: Duration,
    /// New viewers not yet sent anything: the same, as the pass that encoded the snapshots of
    /// their cells may come before they are due.
    fresh: HashSet<u64>,
    due: Vec<Due<u64>>,
    /// The latest pass it has seen: where the moves out of a cell that leaves a view are read.
    latest: Option<Arc<Frame>>,
}

impl Delivery {
    pub fn new(figures: Arc<SpatialFigures>, tick: Duration) -> Delivery {
        Delivery {
            tick,
            mailbox: Arc::default(),
            figures,
            viewers: HashMap::new(),
            schedule: Scheduler::new(),
            slow: HashSet::new(),
            fresh: HashSet::new(),
            due: Vec::new(),
            latest: None,
        }
    }

    pub fn mailbox(&self) -> &Arc<Mailbox> {
        &self.mailbox
    }

    /// How many viewers it serves.
    #[cfg(test)]
    pub fn viewer_count(&self) -> usize {
        self.viewers.len()
    }

    /// The delivery's task on an I/O thread: a run whenever the world posts a pass, until the
    /// world closes the mailbox. The CPU time of each run that had a pass to deliver and
    /// viewers to deliver it to goes into `spatial_delivery_cpu_seconds`.
    pub async fn serve(mut self) {
        loop {
            self.mailbox.wake.notified().await;
            if self.mailbox.closed.load(Ordering::Acquire) {
                return;
            }
            let cpu = tickwire_transport::thread_cpu_time();
            let run = tickwire_transport::wake_batch::batch(|| self.run(Instant::now()));
            // Only runs that delivered a pass to someone: not a delivery left with no viewers,
            // nor a run woken by a wake its previous run already served.
            if let (Some(before), Some(after), true) =
                (cpu, tickwire_transport::thread_cpu_time(), run.passes > 0 && !self.viewers.is_empty())
            {
                self.figures.delivery_cpu.record(after.saturating_sub(before));
            }
        }
    }

    /// Applies the views the world posted, then delivers every pass waiting, in order, at
    /// `now`.
    pub fn run(&mut self, now: Instant) -> Run {
        let (passes, changes) = {
            let mut inbox = lock(&self.mailbox.inbox);
            (std::mem::take(&mut inbox.passes), std::mem::take(&mut inbox.changes))
        };
        let mut report = Report::default();
        if let Some(frame) = passes.back() {
            self.latest = Some(frame.clone());
        }
        let latest = self.latest.clone();
        for (conn, change) in changes {
            self.apply(conn, change, latest.as_deref());
        }
        let waited = passes.len().saturating_sub(1) as u64;
        self.figures.passes_waited.fetch_add(waited, Ordering::Relaxed);
        let mut sent = 0;
        for frame in &passes {
            // Only the last pass's wants go to the world: an earlier pass's may have been met
            // by a later one, and what is still lacking the last asks for again.
            report.wants.clear();
            sent += self.deliver(frame, now, &mut report);
        }
        if passes.len() >= MAX_WAITING_PASSES {
            // So far behind that the pass after this run's last is likely dropped before the
            // next run: every viewer will need every cell from the version it holds now, and
            // the world encodes that in the passes it posts to a full mailbox.
            for viewer in self.viewers.values() {
                for held in &viewer.held {
                    report.wants.insert((held.cell, held.version, viewer.codec));
                }
            }
        }
        // The latest run's wants replace the earlier ones (its last pass asked again for all its
        // due viewers still lack); a run with no pass asks for nothing new and leaves them.
        if !passes.is_empty() || !report.gone.is_empty() {
            let mut out = lock(&self.mailbox.report);
            if !passes.is_empty() {
                out.wants = report.wants;
                out.fresh = true;
            }
            out.gone.extend(report.gone);
        }
        Run { sent, passes: passes.len() }
    }

    fn forget(&mut self, conn: u64) {
        if let Some(viewer) = self.viewers.remove(&conn) {
            viewer.handle.flow.lock().forget(WORLD_KEY);
        }
        self.schedule.leave(conn);
        self.slow.remove(&conn);
        self.fresh.remove(&conn);
    }

    /// Applies `change` to viewer `conn`; `latest` is the latest pass the delivery has seen.
    fn apply(&mut self, conn: u64, change: Change, latest: Option<&Frame>) {
        if change.cleared
            && let Some(viewer) = self.viewers.get_mut(&conn)
        {
            for held in viewer.held.drain(..) {
                unsubscribed(&viewer.handle, held.cell);
            }
            viewer.watch = Watch::default();
            viewer.first = 0;
        }
        if change.forget {
            self.forget(conn);
        }
        match change.then {
            None => {}
            Some(Then::Gone) => self.forget(conn),
            Some(Then::Show(view)) => {
                let codec = codec_index(view.codec);
                let viewer = self.viewers.entry(conn).or_insert_with(|| {
                    self.fresh.insert(conn);
                    Viewer::new(view.handle.clone(), codec, view.at)
                });
                viewer.anchor = view.at;
                // Positions in `held` move with the view: the next message starts at its first.
                viewer.first = 0;
                // A new codec: every cell again from a snapshot, due even if nothing changed.
                let mut entered = viewer.codec != codec;
                if entered {
                    viewer.codec = codec;
                    viewer.held.iter_mut().for_each(|held| held.version = None);
                }
                // Cells that left the view: the client drops their entities (section 14.2).
                let mut left = Vec::new();
                viewer.held.retain(|held| {
                    let keep = view.cells.binary_search(&held.cell).is_ok();
                    if !keep {
                        unsubscribed(&viewer.handle, held.cell);
                        left.extend(held.version.map(|version| (held.cell, version)));
                    }
                    keep
                });
                let interval = |i: usize| {
                    let interval = view.intervals.get(i).copied().unwrap_or_default();
                    u32::try_from(interval.as_millis()).unwrap_or(u32::MAX)
                };
                for (i, &cell) in view.cells.iter().enumerate() {
                    match viewer.held.binary_search_by_key(&cell, |held| held.cell) {
                        Ok(at) => viewer.held[at].set_interval(interval(i), view.at),
                        Err(at) => {
                            let held = Held { version: None, next: view.at, cell, interval_ms: interval(i) };
                            viewer.held.insert(at, held);
                            entered = true;
                        }
                    }
                }
                viewer.watch = Watch::of(&viewer.held);
                // An entity that left a cell now out of view for one still in it goes with the
                // viewer's next update, as if the cell it left had gone (`forced_by`), from the
                // moves the latest pass knows.
                if let (true, Some(frame)) = (viewer.watch.banded(), latest) {
                    let Viewer { held, owed, .. } = viewer;
                    let mut everything = false;
                    for (cell, version) in left {
                        let c = &frame.cells[cell as usize];
                        let from_to = (version, c.version);
                        forced_by(
                            held,
                            frame,
                            c,
                            from_to,
                            frame.scheduled,
                            &mut everything,
                            |index, needed| {
                                owed.owe(held[index].cell, needed);
                            },
                        );
                    }
                }
                // Slower than the viewer's updates: asked for ahead, as a slow viewer's.
                let lod = view.intervals.iter().any(|&i| i > view.options.interval);
                if !self.schedule.set_options(conn, view.options, false) {
                    self.schedule.join(conn, view.options, view.at, 0);
                }
                if entered {
                    // Due again even if nothing in the world changed: the new cells need
                    // snapshots.
                    self.schedule.resnapshot(conn);
                }
                // (A delay is `fresh`'s: it counts only before the first update.)
                if view.options.interval > self.tick || lod {
                    self.slow.insert(conn);
                } else {
                    self.slow.remove(&conn);
                }
            }
        }
    }

    /// Delivers `frame` to every due viewer.
    fn deliver(&mut self, frame: &Frame, now: Instant, report: &mut Report) -> u64 {
        let Delivery { viewers, schedule, due, slow, fresh, .. } = self;
        for (&conn, viewer) in viewers.iter_mut() {
            if viewer.handle.flow.take_rewind(WORLD_KEY).is_some() {
                viewer.held.iter_mut().for_each(|held| held.version = None);
                viewer.watch.all_due();
                schedule.rewind(conn, None);
            }
        }
        due.clear();
        schedule.due(frame.scheduled, frame.world_version, due);
        let mut counts = Counts::default();
        let mut sent = 0;
        let mut g = Gather::default();
        // Viewers due at the next pass whose entries this one lacked.
        let mut behind: Vec<u64> = Vec::new();
        let at = frame.scheduled;
        // The next pass's instant: what is asked for now is for it.
        let next_pass = frame.scheduled + frame.tick;
        for &Due { id: conn, from } in due.iter() {
            let Some(viewer) = viewers.get_mut(&conn) else { continue };
            let step = viewer.step(frame, from, now, &mut g, &mut report.wants);
            viewer.watch.read(&viewer.held, &g.look, at, viewer.anchor);
            let outcome = match step {
                Step::Nothing(outcome) => outcome,
                Step::Refused(hold) => {
                    counts.held_back[hold.index()] += 1;
                    behind.push(conn);
                    Outcome::Refused
                }
                Step::Missing => Outcome::Empty,
                Step::Sent { .. } => {
                    counts.fanouts += 1;
                    counts.catch_up += g.catch_up;
                    fresh.remove(&conn);
                    sent += 1;
                    Outcome::Sent { to: frame.world_version }
                }
                Step::Full => {
                    counts.held_back[HELD_BACK_QUEUE] += 1;
                    behind.push(conn);
                    Outcome::Refused
                }
                Step::Closed => {
                    report.gone.push(conn);
                    continue;
                }
            };
            schedule.record(conn, frame.scheduled, outcome);
            if let Step::Sent { again: true } = step {
                // Due again even if nothing changes: the rest of a full message, or cells its
                // level of detail holds back, which go when their turn comes.
                schedule.resnapshot(conn);
            }
        }
        // Ask now for what the next pass's due viewers will need and would not find: the
        // entries of viewers refused now (those due less often are asked for a pass before
        // they are due), of those due less often, and of new ones not yet due, from the
        // versions they hold. The world encodes them at the next pass's versions. Not for a
        // client that looks stopped (`Window::stalled`: nothing acknowledged for a long while):
        // it would leave them unused pass after pass. Once it acknowledges anything, it is asked
        // for again at each refusal; a pass that finds it room but not its entries asks for
        // them too (above).
        let soon = slow
            .iter()
            .chain(fresh.iter())
            .filter(|&&conn| schedule.next_due(conn).is_some_and(|due| due <= next_pass));
        for conn in behind.iter().filter(|&conn| !slow.contains(conn)).chain(soon) {
            if let Some(viewer) = viewers.get_mut(conn)
                && !viewer.handle.flow.stalled(now)
            {
                viewer.want_stale(frame, next_pass, &mut report.wants, (&mut g.ahead, &mut g.forced));
            }
        }
        for &conn in &report.gone {
            self.forget(conn);
        }
        self.count(&counts);
        sent
    }

    fn count(&self, counts: &Counts) {
        let f = &self.figures;
        f.fanouts.fetch_add(counts.fanouts, Ordering::Relaxed);
        f.catch_up_snapshots.fetch_add(counts.catch_up, Ordering::Relaxed);
        let held_back: u64 = counts.held_back.iter().sum();
        if held_back > 0 {
            f.coalesced.fetch_add(held_back, Ordering::Relaxed);
            for (n, &k) in f.held_back.iter().zip(&counts.held_back) {
                n.fetch_add(k, Ordering::Relaxed);
            }
        }
    }
}

/// Tells a viewer's client that a cell left its view.
fn unsubscribed(handle: &SessionHandle, cell: u32) {
    let event = ChannelEvent {
        channel_id: CELL_BASE + u64::from(cell),
        kind: ChannelEventKind::Unsubscribed as i32,
        reason: "left the area of interest".into(),
    };
    let _ = handle.push("channel.event", event.encode_to_vec().into());
}
