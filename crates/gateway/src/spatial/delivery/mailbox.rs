//! The two bounded mailboxes between the world and one delivery (`delivery.rs`): the world
//! posts each viewer's latest view and each pass; the delivery posts what its viewers will need
//! that its last pass lacked, and the viewers whose session has gone. Apart from the delivery
//! because it is the one place the world's thread and an I/O thread share.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hashbrown::{HashMap, HashSet};
use tickwire_fanout::{Options, Version};
use tickwire_wire::proto::DeltaCodec;
use tokio::sync::Notify;

use super::super::frame::Frame;
use crate::router::SessionHandle;

/// A viewer as the world last set it.
#[derive(Debug, Clone)]
pub(in crate::spatial) struct View {
    pub handle: SessionHandle,
    pub codec: DeltaCodec,
    pub options: Options,
    /// The cells in view, sorted.
    pub cells: Vec<u32>,
    /// Level of detail: how often each of `cells` may change in the viewer's updates (in
    /// order; empty: at every update).
    pub intervals: Vec<Duration>,
    /// When the client became a viewer: its first update waits `options.delay` from then, and
    /// its bands' turns count from it (`held.rs`).
    pub at: Instant,
}

/// What the world asks of a viewer, kept until the delivery's next run. Bounded: a viewer's
/// latest view, and whether its cells were cleared before it.
#[derive(Debug, Default)]
pub(super) struct Change {
    /// Every cell left the view (the client is told) before `then`.
    pub cleared: bool,
    /// The viewer left and was shown again since the delivery's last run: it starts over, as
    /// a new viewer (its delay, a schedule from the new view's `at`), after `cleared`.
    pub forget: bool,
    pub then: Option<Then>,
}

#[derive(Debug)]
pub(super) enum Then {
    Show(View),
    /// The session is gone: forget the viewer, telling it nothing.
    Gone,
}

/// An entry a viewer will need at the next pass: (cell, the version the viewer holds (`None`:
/// it needs a snapshot), codec index). The world chooses the entry with [`base_for`] at that
/// pass, as the delivery will.
pub(in crate::spatial) type Want = (u32, Option<Version>, usize);

/// What a delivery tells the world after a run.
#[derive(Debug, Default)]
pub(in crate::spatial) struct Report {
    /// Entries its viewers need that its passes did not have, as of its latest run.
    pub wants: HashSet<Want>,
    /// Viewers whose session ended.
    pub gone: Vec<u64>,
}

/// The report as the mailbox keeps it.
#[derive(Debug, Default)]
pub(super) struct Reported {
    /// The latest run's wants.
    pub wants: HashSet<Want>,
    pub gone: Vec<u64>,
    /// The wants have not been taken since the delivery wrote them.
    pub fresh: bool,
}

/// Passes a delivery may have waiting. An I/O thread that gets no core for a while (the world's
/// tick is 20 ms; a loaded machine's scheduler can keep a thread waiting longer) delivers the
/// passes it missed in order when it runs, as the sessions' outboxes held them before; past
/// this many, the oldest are dropped, and viewers that needed them catch up from later passes
/// (the world encodes again what a delivery last asked for in each pass it posts to a full
/// mailbox).
pub(super) const MAX_WAITING_PASSES: usize = 8;

#[derive(Debug, Default)]
pub(super) struct Inbox {
    pub passes: VecDeque<Arc<Frame>>,
    pub changes: HashMap<u64, Change>,
}

/// The mailboxes between the world and one delivery.
#[derive(Debug, Default)]
pub(in crate::spatial) struct Mailbox {
    pub(super) inbox: Mutex<Inbox>,
    pub(super) report: Mutex<Reported>,
    pub(super) wake: Notify,
    pub(super) closed: AtomicBool,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
