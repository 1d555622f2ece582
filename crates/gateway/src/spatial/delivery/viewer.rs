//! One viewer as its delivery keeps it, and what one pass does for it when it is due: gather
//! the cells it lacks whose turn has come (and those they force: `forced.rs`), ask for the
//! entries the pass did not have, and queue the update. Apart from `delivery.rs`, which keeps
//! the viewers, their schedule and the mailboxes, and counts what the passes did.

use std::time::Instant;

use hashbrown::HashSet;
use tickwire_fanout::{Hold, Outcome, Version};

use super::super::WORLD_KEY;
use super::super::frame::Frame;
use super::forced::{Forced, Owed};
use super::gather::{Gather, entry_for};
use super::held::Held;
use super::mailbox::Want;
use super::watch::Watch;
use crate::router::{PushError, PushParts, SessionHandle};

/// A viewer, as its delivery keeps it.
pub(super) struct Viewer {
    pub handle: SessionHandle,
    pub codec: usize,
    /// The cells in view, sorted.
    pub held: Vec<Held>,
    /// Where in `held` its next message starts: where a full message (`MAX_MESSAGE_BYTES`)
    /// stopped, so the cells after it are not starved by busy ones before it; 0 otherwise.
    pub first: usize,
    /// Where its bands' turns count from (`held.rs`): when it became a viewer.
    pub anchor: Instant,
    /// Cells that go with its next update whatever their band.
    pub owed: Owed,
    /// Which cells of `held` a pass reads: those whose band's turn has come (`watch.rs`).
    /// With bands (`Watch::banded`), the cells entities moved into go with the cells they left
    /// (`forced_by`).
    pub watch: Watch,
}

/// What one pass did for a due viewer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Nothing to send: the outcome to record.
    Nothing(Outcome),
    /// No room in its window of updates in flight.
    Refused(Hold),
    /// The pass lacked an entry it needs: asked for; due again, base and schedule as they were.
    Missing,
    /// Its update was queued; `again`: it is due again even if nothing changes.
    Sent { again: bool },
    /// Its outbox was full.
    Full,
    /// Its session is gone.
    Closed,
}

impl Viewer {
    /// A new viewer, with nothing in view yet.
    pub fn new(handle: SessionHandle, codec: usize, anchor: Instant) -> Viewer {
        Viewer {
            handle,
            codec,
            held: Vec::new(),
            first: 0,
            anchor,
            owed: Owed::default(),
            watch: Watch::default(),
        }
    }

    /// Asks for every cell in view that `frame` has moved past and that may change in an
    /// update at pass instant `at`, from the version held; with level of detail, also for
    /// those that would go with them (`forced_by`) and the cells owed. `look` and `forced`
    /// are scratch.
    pub fn want_stale(
        &self,
        frame: &Frame,
        at: Instant,
        wants: &mut HashSet<Want>,
        (look, forced): (&mut Vec<u32>, &mut Forced),
    ) {
        let banded = self.watch.banded();
        if banded {
            forced.reset(self.held.len());
        }
        let (cells, _) = self.watch.cells(at, self.held.len(), |i| self.held[i as usize].stale(frame), look);
        for h in cells.from(0).map(|i| &self.held[i]).filter(|h| h.stale(frame) && h.due(at)) {
            wants.insert((h.cell, h.version, self.codec));
            if banded {
                let c = &frame.cells[h.cell as usize];
                forced.moved_out(&self.held, frame, c, h.version, c.version, at);
            }
        }
        if !banded {
            return;
        }
        self.owed.now(&self.held, frame, at, forced);
        let mut next = 0;
        while let Some(&index) = forced.list.get(next) {
            next += 1;
            let h = self.held[index];
            wants.insert((h.cell, h.version, self.codec));
            let c = &frame.cells[h.cell as usize];
            forced.moved_out(&self.held, frame, c, h.version, c.version, at);
        }
    }

    /// Pass `frame` for this viewer, due from version `from` of the world, at `now`: gathers
    /// its update into `g` and queues it, or says why not. The cells read are left in
    /// `g.look` (`Watch::read` takes them once the step is done). Wants for the next pass go
    /// into `wants`.
    pub fn step(
        &mut self,
        frame: &Frame,
        from: Option<Version>,
        now: Instant,
        g: &mut Gather,
        wants: &mut HashSet<Want>,
    ) -> Step {
        let cells = &frame.cells;
        let at = frame.scheduled;
        // The next pass's instant: what is asked for now is for it.
        let next_pass = frame.scheduled + frame.tick;
        g.clear();
        let (n, first) = (self.held.len(), self.first);
        // Out of `g` while the gather fills it; back once read (for `Watch::read`).
        let mut cells_read = std::mem::take(&mut g.look);
        // `waiting`: cells the viewer lacks that its level of detail holds back for now, maybe
        // some in the bands whose turn has not come.
        let (look, mut waiting) =
            self.watch.cells(at, n, |i| self.held[i as usize].stale(frame), &mut cells_read);
        let mut missing = false;
        // Cells left for a later pass: the message was full.
        let mut partial = false;
        let mut stopped_at = 0;
        // Cells forced that a full update left out, with the versions they must reach.
        let mut left_out = Vec::new();
        for index in look.from(first) {
            let Held { cell, version: held, .. } = self.held[index];
            let c = &cells[cell as usize];
            if held == Some(c.version) {
                continue;
            }
            if !self.held[index].due(at) {
                waiting = true;
                continue;
            }
            let Some(entry) = entry_for(c, held, self.codec) else {
                missing = true;
                break;
            };
            if !g.take(index, held, entry) {
                partial = true;
                stopped_at = index;
                break;
            }
        }
        g.look = cells_read;
        if self.watch.banded() && !missing {
            // The cells entities went to from those it takes (and from those, and so on),
            // and the cells owed, go too. A full update leaves them owed.
            g.forced.reset(n);
            self.owed.now(&self.held, frame, at, &mut g.forced);
            let (mut read, mut took) = (0, 0);
            loop {
                if let Some(&(index, to)) = g.advanced.get(read) {
                    read += 1;
                    let Held { cell, version, .. } = self.held[index];
                    g.forced.moved_out(&self.held, frame, &cells[cell as usize], version, to, at);
                } else if let (false, Some(&index)) = (partial, g.forced.list.get(took)) {
                    let Held { cell, version: held, .. } = self.held[index];
                    let Some(entry) = entry_for(&cells[cell as usize], held, self.codec) else {
                        missing = true;
                        break;
                    };
                    if !g.take(index, held, entry) {
                        partial = true;
                        stopped_at = index;
                    } else {
                        took += 1;
                    }
                } else {
                    break;
                }
            }
            let cell_of = |index: usize| self.held[index].cell;
            left_out = g.forced.list[took..]
                .iter()
                .map(|&i| (cell_of(i), cells[cell_of(i) as usize].version))
                .collect();
        }
        if !missing && g.parts.is_empty() {
            // Nothing to send now. Holding back cells it lacks, it is due again one interval
            // later whatever the version, or it would not be due again in a world that
            // stopped changing.
            return Step::Nothing(if waiting {
                Outcome::Deferred
            } else if from.is_some() {
                Outcome::Empty
            } else {
                Outcome::Sent { to: frame.world_version }
            });
        }
        // Gathered first (one scan of the cells in view, not two), then refused without
        // room: what a refusal costs is dropping the entries' handles.
        if let Err(hold) = self.handle.flow.room(now) {
            return Step::Refused(hold);
        }
        if missing {
            // All or nothing: a message carries every cell in view that changed (but those
            // its level of detail holds back). The viewer asks for all of it, what this pass
            // had too (a later pass may not have it), and stays due, base and schedule as
            // they were, until a pass has it all.
            self.want_stale(frame, next_pass, wants, (&mut g.ahead, &mut g.forced));
            return Step::Missing;
        }
        let next = Vec::with_capacity(g.parts.len());
        let update = PushParts { topic: "channel.updates", parts: std::mem::replace(&mut g.parts, next) };
        match self.handle.offer_update_parts(now, WORLD_KEY, from, update) {
            Ok(()) => {
                for &(index, to) in &g.advanced {
                    let held = &mut self.held[index];
                    held.version = Some(to);
                    held.sent(at, self.anchor);
                }
                self.owed.settle(&self.held);
                for (cell, version) in left_out {
                    self.owed.owe(cell, version);
                }
                self.first = stopped_at;
                if partial {
                    // The entries of the rest of its cells, asked for.
                    self.want_stale(frame, next_pass, wants, (&mut g.ahead, &mut g.forced));
                }
                Step::Sent { again: partial || waiting }
            }
            Err(PushError::Full) => Step::Full,
            Err(PushError::Closed) => Step::Closed,
        }
    }
}
