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
//! The world and a delivery talk through two bounded mailboxes: the world posts each viewer's
//! latest view (cells, codec, schedule) and each pass (up to 8 waiting); the delivery posts the
//! entries its viewers will need that its last pass did not have (for a viewer behind, one due
//! less often than every pass, or a new one not yet due), and the viewers whose session has
//! gone. A view change and
//! a pass are applied in the order the world made them when the delivery keeps up; when it does
//! not, it applies the latest views and then every waiting pass in order. A viewer whose
//! message would lack an entry the pass did not have gets nothing until a pass has them all: the
//! entries are asked for, and it stays due. Nothing is lost either way: a viewer's version
//! of a cell changes only when an update for it is queued.
//!
//! Level of detail (docs/protocol.md 14.4) holds a cell's changes back from a viewer until its
//! interval lets them go ([`held::Held`]); a viewer with cells held back stays due, one interval
//! after another, until they have gone. When a cell's interval lets it go, it takes part in all
//! or nothing like any other.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hashbrown::{HashMap, HashSet};
use prost::Message;
use tickwire_fanout::{Due, Options, Outcome, Scheduler, Version};
use tickwire_wire::proto::{ChannelEvent, ChannelEventKind, DeltaCodec};
use tokio::sync::Notify;

use super::frame::{Frame, base_for, codec_index};
use held::Held;

mod held;
use super::{CELL_BASE, HELD_BACK_QUEUE, HELD_BACK_REASONS, SpatialFigures, WORLD_KEY};
use crate::router::{PushError, PushParts, SessionHandle};

/// The most bytes of cell entries one `channel.updates` message carries (one entry always, even
/// past it: a cell's state is bounded by `channels.max_state_bytes`). A viewer with more to
/// catch up on (snapshots of many cells just entered) gets the rest at its next passes, so no
/// message outgrows the session's bound on unacknowledged data or the frame size.
const MAX_MESSAGE_BYTES: usize = 256 << 10;

/// A viewer as the world last set it.
#[derive(Debug, Clone)]
pub(super) struct View {
    pub handle: SessionHandle,
    pub codec: DeltaCodec,
    pub options: Options,
    /// The cells in view, sorted.
    pub cells: Vec<u32>,
    /// Level of detail: how often each of `cells` may change in the viewer's updates (in
    /// order; empty: at every update).
    pub intervals: Vec<Duration>,
    /// When the world set it: a new viewer's first update waits `options.delay` from then.
    pub at: Instant,
}

/// What the world asks of a viewer, kept until the delivery's next run. Bounded: a viewer's
/// latest view, and whether its cells were cleared before it.
#[derive(Debug, Default)]
struct Change {
    /// Every cell left the view (the client is told) before `then`.
    cleared: bool,
    /// The viewer left and was shown again since the delivery's last run: it starts over, as
    /// a new viewer (its delay, a schedule from the new view's `at`), after `cleared`.
    forget: bool,
    then: Option<Then>,
}

#[derive(Debug)]
enum Then {
    Show(View),
    /// The session is gone: forget the viewer, telling it nothing.
    Gone,
}

/// An entry a viewer will need at the next pass: (cell, the version the viewer holds (`None`:
/// it needs a snapshot), codec index). The world chooses the entry with [`base_for`] at that
/// pass, as the delivery will.
pub(super) type Want = (u32, Option<Version>, usize);

/// What a delivery tells the world after a run.
#[derive(Debug, Default)]
pub(super) struct Report {
    /// Entries its viewers need that its passes did not have, as of its latest run.
    pub wants: HashSet<Want>,
    /// Viewers whose session ended.
    pub gone: Vec<u64>,
}

/// The report as the mailbox keeps it.
#[derive(Debug, Default)]
struct Reported {
    /// The latest run's wants.
    wants: HashSet<Want>,
    gone: Vec<u64>,
    /// The wants have not been taken since the delivery wrote them.
    fresh: bool,
}

/// Passes a delivery may have waiting. An I/O thread that gets no core for a while (the world's
/// tick is 20 ms; a loaded machine's scheduler can keep a thread waiting longer) delivers the
/// passes it missed in order when it runs, as the sessions' outboxes held them before; past
/// this many, the oldest are dropped, and viewers that needed them catch up from later passes
/// (the world encodes again what a delivery last asked for in each pass it posts to a full
/// mailbox).
const MAX_WAITING_PASSES: usize = 8;

#[derive(Debug, Default)]
struct Inbox {
    passes: VecDeque<Arc<Frame>>,
    changes: HashMap<u64, Change>,
}

/// The mailboxes between the world and one delivery.
#[derive(Debug, Default)]
pub(super) struct Mailbox {
    inbox: Mutex<Inbox>,
    report: Mutex<Reported>,
    wake: Notify,
    closed: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing that holds these locks panics or waits; a poisoned one is still consistent.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Mailbox {
    /// The viewer `conn` sees `view` from now on.
    pub fn show(&self, conn: u64, view: View) {
        let mut inbox = lock(&self.inbox);
        let change = inbox.changes.entry(conn).or_default();
        if matches!(change.then, Some(Then::Gone)) {
            change.forget = true;
        }
        change.then = Some(Then::Show(view));
    }

    /// Every cell leaves `conn`'s view, and it is told so; it stays a viewer until shown again
    /// or gone.
    pub fn clear(&self, conn: u64) {
        let mut inbox = lock(&self.inbox);
        let change = inbox.changes.entry(conn).or_default();
        change.cleared = true;
        change.then = None;
    }

    /// `conn`'s session has gone.
    pub fn gone(&self, conn: u64) {
        lock(&self.inbox).changes.entry(conn).or_default().then = Some(Then::Gone);
    }

    /// A pass to deliver, and a wake for the delivery. Returns whether an older pass had to
    /// be dropped to make room (`MAX_WAITING_PASSES`).
    pub fn pass(&self, frame: Arc<Frame>) -> bool {
        let dropped = {
            let mut inbox = lock(&self.inbox);
            let full = inbox.passes.len() >= MAX_WAITING_PASSES;
            if full {
                inbox.passes.pop_front();
            }
            inbox.passes.push_back(frame);
            full
        };
        self.wake.notify_one();
        dropped
    }

    /// What the delivery reported since the last call: the sessions it found gone, and its
    /// latest wants if they are new or if the next pass posted will drop one (a delivery that
    /// stays 8 or more passes behind must find them in a pass it keeps; once it has dropped
    /// one, its mailbox stays full until it runs, and a run that delivers reports anew).
    pub fn take_report(&self) -> Report {
        // Full: the pass about to be posted drops one, maybe the one that carried them.
        let full = lock(&self.inbox).passes.len() >= MAX_WAITING_PASSES;
        let mut report = lock(&self.report);
        let wants = if report.fresh || full { report.wants.clone() } else { HashSet::new() };
        report.fresh = false;
        Report { wants, gone: std::mem::take(&mut report.gone) }
    }

    /// The world has stopped: the delivery's task ends.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake.notify_one();
    }
}

/// A viewer, as its delivery keeps it.
struct Viewer {
    handle: SessionHandle,
    codec: usize,
    /// The cells in view, sorted.
    held: Vec<Held>,
    /// Where in `held` its next message starts: where a full message (`MAX_MESSAGE_BYTES`)
    /// stopped, so the cells after it are not starved by busy ones before it; 0 otherwise.
    first: usize,
}

impl Viewer {
    /// Asks for every cell in view that `frame` has moved past and that may change in an
    /// update at pass instant `at`, from the version held.
    fn want_stale(&self, frame: &Frame, at: Instant, wants: &mut HashSet<Want>) {
        for held in self.held.iter().filter(|h| h.stale(frame) && h.due(at)) {
            wants.insert((held.cell, held.version, self.codec));
        }
    }
}

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
        for (conn, change) in changes {
            self.apply(conn, change);
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

    fn apply(&mut self, conn: u64, change: Change) {
        if change.cleared
            && let Some(viewer) = self.viewers.get_mut(&conn)
        {
            for held in viewer.held.drain(..) {
                unsubscribed(&viewer.handle, held.cell);
            }
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
                    Viewer { handle: view.handle.clone(), codec, held: Vec::new(), first: 0 }
                });
                // Positions in `held` move with the view: the next message starts at its first.
                viewer.first = 0;
                // A new codec: every cell again from a snapshot, due even if nothing changed.
                let mut entered = viewer.codec != codec;
                if entered {
                    viewer.codec = codec;
                    viewer.held.iter_mut().for_each(|held| held.version = None);
                }
                // Cells that left the view: the client drops their entities (section 14.2).
                viewer.held.retain(|held| {
                    let keep = view.cells.binary_search(&held.cell).is_ok();
                    if !keep {
                        unsubscribed(&viewer.handle, held.cell);
                    }
                    keep
                });
                let interval = |i: usize| {
                    let interval = view.intervals.get(i).copied().unwrap_or_default();
                    u32::try_from(interval.as_millis()).unwrap_or(u32::MAX)
                };
                for (i, &cell) in view.cells.iter().enumerate() {
                    match viewer.held.binary_search_by_key(&cell, |held| held.cell) {
                        Ok(at) => viewer.held[at].set_interval(interval(i)),
                        Err(at) => {
                            let held = Held { version: None, next: view.at, cell, interval_ms: interval(i) };
                            viewer.held.insert(at, held);
                            entered = true;
                        }
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
                schedule.rewind(conn, None);
            }
        }
        due.clear();
        schedule.due(frame.scheduled, frame.world_version, due);
        let mut counts = Counts::default();
        let mut sent = 0;
        let mut parts: Vec<Bytes> = Vec::new();
        // (index in `held`, version reached).
        let mut advanced: Vec<(usize, Version)> = Vec::new();
        // Viewers due at the next pass whose entries this one lacked.
        let mut behind: Vec<u64> = Vec::new();
        let at = frame.scheduled;
        // The next pass's instant: what is asked for now is for it.
        let next_pass = frame.scheduled + frame.tick;
        for &Due { id: conn, from } in due.iter() {
            let Some(viewer) = viewers.get_mut(&conn) else { continue };
            let cells = &frame.cells;
            // Cells the viewer lacks that its level of detail holds back for now.
            let mut waiting = false;
            parts.clear();
            advanced.clear();
            let mut missing = false;
            // Cells left for a later pass: the message was full.
            let mut partial = false;
            let mut bytes = 0;
            let mut catch_up = 0;
            let (n, first) = (viewer.held.len(), viewer.first);
            let mut stopped_at = 0;
            for index in (first..n).chain(0..first) {
                let Held { cell, version: held, .. } = viewer.held[index];
                let c = &cells[cell as usize];
                if held == Some(c.version) {
                    continue;
                }
                if !viewer.held[index].due(at) {
                    waiting = true;
                    continue;
                }
                let base = base_for(held, c, viewer.codec);
                // Any entry that applies to what the viewer holds will do when the one the rule
                // chose is not there: a delta from its version (the world chose by the lengths
                // it knew while encoding the pass, which may differ from the pass's last), or a
                // snapshot, which applies to anything.
                let k = viewer.codec;
                let entry = c
                    .find(base, k)
                    .or_else(|| held.filter(|&h| h != base).and_then(|h| c.find(h, k)))
                    .or_else(|| c.find(0, k));
                match entry {
                    Some(entry) if !parts.is_empty() && bytes + entry.field.len() > MAX_MESSAGE_BYTES => {
                        partial = true;
                        stopped_at = index;
                        break;
                    }
                    Some(entry) => {
                        bytes += entry.field.len();
                        parts.push(entry.field.clone());
                        advanced.push((index, entry.to));
                        // A snapshot in place of a delta of its own.
                        if held.is_some_and(|h| h != 0) && entry.from == 0 {
                            catch_up += 1;
                        }
                    }
                    None => {
                        missing = true;
                        break;
                    }
                }
            }
            if !missing && parts.is_empty() {
                // Nothing to send now. Holding back cells it lacks, it is due again one interval
                // later whatever the version, or it would not be due again in a world that
                // stopped changing.
                let outcome = if waiting {
                    Outcome::Deferred
                } else if from.is_some() {
                    Outcome::Empty
                } else {
                    Outcome::Sent { to: frame.world_version }
                };
                schedule.record(conn, frame.scheduled, outcome);
                continue;
            }
            // Gathered first (one scan of the cells in view, not two), then refused without
            // room: what a refusal costs is dropping the entries' handles.
            if let Err(hold) = viewer.handle.flow.room(now) {
                counts.held_back[hold.index()] += 1;
                schedule.record(conn, frame.scheduled, Outcome::Refused);
                behind.push(conn);
                continue;
            }
            if missing {
                // All or nothing: a message carries every cell in view that changed (but those
                // its level of detail holds back). The viewer asks for all of it, what this pass
                // had too (a later pass may not have it), and stays due, base and schedule as
                // they were, until a pass has it all.
                viewer.want_stale(frame, next_pass, &mut report.wants);
                schedule.record(conn, frame.scheduled, Outcome::Empty);
                continue;
            }
            let next = Vec::with_capacity(parts.len());
            let update = PushParts { topic: "channel.updates", parts: std::mem::replace(&mut parts, next) };
            match viewer.handle.offer_update_parts(now, WORLD_KEY, from, update) {
                Ok(()) => {
                    for &(index, to) in &advanced {
                        let held = &mut viewer.held[index];
                        held.version = Some(to);
                        held.sent(at);
                    }
                    counts.fanouts += 1;
                    counts.catch_up += catch_up;
                    fresh.remove(&conn);
                    sent += 1;
                    schedule.record(conn, frame.scheduled, Outcome::Sent { to: frame.world_version });
                    viewer.first = stopped_at;
                    if partial {
                        // Due again even if nothing changes, with the entries of the rest of
                        // its cells asked for.
                        schedule.resnapshot(conn);
                        viewer.want_stale(frame, next_pass, &mut report.wants);
                    } else if waiting {
                        // Due again even if nothing changes: the cells held back go when
                        // their level of detail lets them.
                        schedule.resnapshot(conn);
                    }
                }
                Err(PushError::Full) => {
                    counts.held_back[HELD_BACK_QUEUE] += 1;
                    schedule.record(conn, frame.scheduled, Outcome::Refused);
                    behind.push(conn);
                }
                Err(PushError::Closed) => report.gone.push(conn),
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
            if let Some(viewer) = viewers.get(conn)
                && !viewer.handle.flow.stalled(now)
            {
                viewer.want_stale(frame, next_pass, &mut report.wants);
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
