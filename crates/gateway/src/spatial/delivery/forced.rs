//! Both sides of a move in one update (docs/protocol.md 14.4, "Entities between cells"): which
//! cells in a viewer's view must go with an update out of their level-of-detail band's turn, so
//! that an entity that walked from a cell the update carries into one held back does not vanish
//! from the client's view. Apart from `delivery.rs` because it is one rule with its own state
//! (the cells found for one update, the cells owed to the next), read from the cells' logs of
//! moves (`moves.rs`).

use std::time::Instant;

use tickwire_fanout::Version;

use super::super::frame::{CellFrame, Frame};
use super::held::Held;

/// The cells found to go with one update (or to ask for, a pass ahead), each once, in the
/// order found. Kept between updates for its buffers.
#[derive(Debug, Default)]
pub(super) struct Forced {
    pub list: Vec<usize>,
    /// By index in the viewer's `held`: in `list`.
    marks: Vec<bool>,
    /// A log that no longer reached back made every held-back cell the viewer lacks changes
    /// of go: nothing more to find that way.
    pub everything: bool,
}

impl Forced {
    /// Empty, for a viewer with `n` cells in view.
    pub fn reset(&mut self, n: usize) {
        for &index in &self.list {
            self.marks[index] = false;
        }
        self.list.clear();
        if self.marks.len() < n {
            self.marks.resize(n, false);
        }
        self.everything = false;
    }

    pub fn add(&mut self, index: usize) {
        add(&mut self.list, &mut self.marks, index);
    }

    /// Adds the cells that must go with an update taking cell `c`, of which the viewer holds
    /// `version` (`None`: it takes the snapshot, and lost nothing), to version `to`
    /// ([`forced_by`]).
    pub fn moved_out(
        &mut self,
        held: &[Held],
        frame: &Frame,
        c: &CellFrame,
        version: Option<Version>,
        to: Version,
        at: Instant,
    ) {
        let Some(since) = version.filter(|&v| c.moved_since(v)) else { return };
        let Forced { list, marks, everything } = self;
        forced_by(held, frame, c, (since, to), at, everything, |index, _| add(list, marks, index));
    }
}

fn add(list: &mut Vec<usize>, marks: &mut [bool], index: usize) {
    if !marks[index] {
        marks[index] = true;
        list.push(index);
    }
}

/// An update that takes cell `c` from version `since` to `to` removes each entity that left it
/// since; each cell in view such an entity went to, whose version the viewer holds predates the
/// entity's arrival and whose band holds it back at `at`, must go in the same update. Calls
/// `forced` with the index of each in `held` and the version it must reach (maybe more than
/// once). If the cell's log no longer reaches back to `since`, every cell in view held back
/// that the viewer lacks changes of, at the frame's version, once per `everything`.
pub(super) fn forced_by(
    held: &[Held],
    frame: &Frame,
    c: &CellFrame,
    (since, to): (Version, Version),
    at: Instant,
    everything: &mut bool,
    mut forced: impl FnMut(usize, Version),
) {
    let known = c.moves_since(since, to, |m| {
        let Some(index) = index_of(held, m.to) else { return };
        let h = &held[index];
        if h.version.is_some_and(|v| v < m.arrived_at) && !h.due(at) {
            forced(index, m.arrived_at);
        }
    });
    if !known && !*everything {
        *everything = true;
        for (index, h) in held.iter().enumerate() {
            if h.stale(frame) && !h.due(at) {
                forced(index, frame.cells[h.cell as usize].version);
            }
        }
    }
}

/// Where cell `cell` is in `held` (sorted by cell), if it is in view. A view of the whole world,
/// or of whole rows of it, holds each cell at its index less the first's.
pub(super) fn index_of(held: &[Held], cell: u32) -> Option<usize> {
    let first = held.first()?.cell;
    let guess = cell.checked_sub(first)? as usize;
    if held.get(guess).is_some_and(|h| h.cell == cell) {
        return Some(guess);
    }
    held.binary_search_by_key(&cell, |h| h.cell).ok()
}

/// Cells owed to a viewer's next update whatever their band, each with the version it must
/// reach: an entity went to it from a cell that left the view, or a full update left it out.
/// At most one entry per cell in view.
#[derive(Debug, Default)]
pub(super) struct Owed(Vec<(u32, Version)>);

impl Owed {
    /// Cell `cell` must reach version `version`.
    pub fn owe(&mut self, cell: u32, version: Version) {
        match self.0.iter_mut().find(|(c, _)| *c == cell) {
            Some((_, v)) => *v = (*v).max(version),
            None => self.0.push((cell, version)),
        }
    }

    /// Adds to `forced` each cell owed that `frame` brings to the version owed and that an
    /// update at `at` would leave out.
    pub fn now(&self, held: &[Held], frame: &Frame, at: Instant, forced: &mut Forced) {
        for &(cell, version) in &self.0 {
            if let Some(index) = index_of(held, cell)
                && held[index].version.is_some_and(|v| v < version)
                && frame.cells[cell as usize].version >= version
                && !held[index].due(at)
            {
                forced.add(index);
            }
        }
    }

    /// After an update: drops the cells that reached their version or left the view.
    pub fn settle(&mut self, held: &[Held]) {
        self.0.retain(|&(cell, version)| {
            index_of(held, cell).is_some_and(|index| held[index].version.is_some_and(|v| v < version))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(cells: &[u32]) -> Vec<Held> {
        let at = Instant::now();
        cells.iter().map(|&cell| Held { version: Some(1), next: at, cell, interval_ms: 100 }).collect()
    }

    #[test]
    fn a_cell_is_found_in_a_whole_view_at_once_and_in_any_view() {
        let whole = held(&[0, 1, 2, 3, 4]);
        assert_eq!(index_of(&whole, 3), Some(3));
        let rows = held(&[5, 6, 7, 25, 26, 27]);
        assert_eq!(index_of(&rows, 26), Some(4));
        assert_eq!(index_of(&rows, 8), None);
        assert_eq!(index_of(&rows, 4), None);
        assert_eq!(index_of(&[], 4), None);
    }

    #[test]
    fn each_cell_is_forced_once_and_owed_until_it_reaches_its_version() {
        let mut forced = Forced::default();
        forced.reset(4);
        forced.add(2);
        forced.add(0);
        forced.add(2);
        assert_eq!(forced.list, [2, 0]);
        forced.reset(4);
        forced.add(2);
        assert_eq!(forced.list, [2], "marks cleared");

        let mut cells = held(&[0, 1, 2]);
        let mut owed = Owed::default();
        owed.owe(1, 5);
        owed.owe(1, 7);
        owed.owe(9, 3);
        assert_eq!(owed.0, [(1, 7), (9, 3)], "one entry per cell, the higher version");
        cells[1].version = Some(6);
        owed.settle(&cells);
        assert_eq!(owed.0, [(1, 7)], "cell 9 is out of view");
        cells[1].version = Some(7);
        owed.settle(&cells);
        assert!(owed.0.is_empty());
    }
}
