//! One viewer's update as a pass gathers it: the entry of each cell it carries, within the
//! bytes one message may take. Apart from `delivery.rs`, which decides which cells go and when.

use bytes::Bytes;
use tickwire_fanout::Version;

use super::super::frame::{CellFrame, Entry, base_for};
use super::MAX_MESSAGE_BYTES;
use super::forced::Forced;

/// The entry of cell `c` that applies to what a viewer holding `held` has, in codec `codec`.
/// Any will do when the one [`base_for`] chooses is not there: a delta from its version (the
/// world chose by the lengths it knew while encoding the pass, which may differ from the
/// pass's last), or a snapshot, which applies to anything.
pub(super) fn entry_for(c: &CellFrame, held: Option<Version>, codec: usize) -> Option<&Entry> {
    let base = base_for(held, c, codec);
    c.find(base, codec)
        .or_else(|| held.filter(|&h| h != base).and_then(|h| c.find(h, codec)))
        .or_else(|| c.find(0, codec))
}

/// One viewer's message as a pass gathers it (kept between viewers for its buffers).
#[derive(Default)]
pub(super) struct Gather {
    pub parts: Vec<Bytes>,
    /// (index in `held`, version reached).
    pub advanced: Vec<(usize, Version)>,
    pub bytes: usize,
    /// Snapshots in place of a delta of its own.
    pub catch_up: u64,
    /// Cells that must go with the update though their band holds them back (`forced_by`).
    pub forced: Forced,
    /// The cells of the view the pass reads (`Watch::cells`), by index in `held`.
    pub look: Vec<u32>,
    /// The same, for what is asked for a pass ahead.
    pub ahead: Vec<u32>,
}

impl Gather {
    pub fn clear(&mut self) {
        self.parts.clear();
        self.advanced.clear();
        self.bytes = 0;
        self.catch_up = 0;
    }

    /// Adds `entry`, for the cell at `index` in view of which the viewer holds `held`; false,
    /// adding nothing, if it would take a message that has an entry past `MAX_MESSAGE_BYTES`.
    pub fn take(&mut self, index: usize, held: Option<Version>, entry: &Entry) -> bool {
        if !self.parts.is_empty() && self.bytes + entry.field.len() > MAX_MESSAGE_BYTES {
            return false;
        }
        self.bytes += entry.field.len();
        self.parts.push(entry.field.clone());
        self.advanced.push((index, entry.to));
        if held.is_some_and(|h| h != 0) && entry.from == 0 {
            self.catch_up += 1;
        }
        true
    }
}
