//! Which cells of a viewer's view a pass must look at. With level of detail a view may hold
//! every cell of the world, most of them in slow bands (docs/protocol.md 14.4): a pass that read
//! each of them for each due viewer spent most of its time finding cells whose turn had not
//! come. A band's turns fall on one grid per viewer (`held.rs`), so the band as a whole knows
//! when its next cell can be due, and a pass reads only the cells of the bands whose turn has
//! come, the cells with no band, and the cells of a band that were due and did not go (quiet,
//! or left out of an update). Apart from `delivery.rs` because it is one rule of *when*, kept
//! small and tested alone.
//!
//! The invariant: every cell of a band is in `pending` or not due before the band's `from`.
//! It holds because a banded cell's turns are its band's grid: a cell not due at `at` is not
//! due before the grid's first turn after `at`.

use std::time::{Duration, Instant};

use super::held::{Held, turn_after};

/// The cells of one viewer's view a pass reads, by index in its `held` (sorted by cell). A view
/// with no bands has nothing to watch: every cell, at every pass, and one pointer here (a pass
/// reads thousands of viewers).
#[derive(Debug, Default)]
pub(super) struct Watch(Option<Box<Bands>>);

#[derive(Debug, Default)]
struct Bands {
    /// Cells in every update (no band): read at every pass.
    every: Vec<u32>,
    bands: Vec<Band>,
    /// Banded cells that were due when their band was last read and did not go: read at every
    /// pass until they do.
    pending: Vec<u32>,
}

/// The cells a pass reads ([`Watch::cells`]), as indexes in the view: every one of its `n`,
/// or those listed (sorted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Look<'a> {
    cells: Option<&'a [u32]>,
    n: usize,
}

impl Look<'_> {
    /// The cells' indexes in the view, in order from the first at or after index `first`, then
    /// from the start (where a full message stopped, so no cell is starved).
    pub fn from(self, first: usize) -> impl Iterator<Item = usize> {
        let (len, split) = match self.cells {
            Some(cells) => (cells.len(), cells.partition_point(|&index| (index as usize) < first)),
            None => (self.n, first.min(self.n)),
        };
        let at = move |k: usize| self.cells.map_or(k, |cells| cells[k] as usize);
        (split..len).chain(0..split).map(at)
    }
}

#[derive(Debug)]
struct Band {
    interval: Duration,
    /// No cell of the band outside `pending` is due before this (`None`: any may be now).
    from: Option<Instant>,
    cells: Vec<u32>,
}

impl Band {
    fn due(&self, at: Instant) -> bool {
        self.from.is_none_or(|from| at >= from)
    }
}

impl Watch {
    /// The watch of a view, every band to be read at the next pass.
    pub fn of(held: &[Held]) -> Watch {
        if held.iter().all(|h| h.interval_ms == 0) {
            return Watch(None);
        }
        let mut watch = Bands::default();
        for (index, h) in held.iter().enumerate() {
            let index = u32::try_from(index).expect("a view holds fewer than 2^32 cells");
            if h.interval_ms == 0 {
                watch.every.push(index);
                continue;
            }
            let interval = Duration::from_millis(u64::from(h.interval_ms));
            match watch.bands.iter_mut().find(|b| b.interval == interval) {
                Some(band) => band.cells.push(index),
                None => watch.bands.push(Band { interval, from: None, cells: vec![index] }),
            }
        }
        Watch(Some(Box::new(watch)))
    }

    /// Whether the view has bands: its level of detail holds some cells back.
    pub fn banded(&self) -> bool {
        self.0.is_some()
    }

    /// Every cell may be due now (its version was forgotten: a snapshot is needed).
    pub fn all_due(&mut self) {
        if let Some(watch) = &mut self.0 {
            watch.bands.iter_mut().for_each(|band| band.from = None);
        }
    }

    /// The cells a pass at `at` must read, sorted, each once, filled into `out` (none kept: a
    /// view of `n` cells with no bands, every cell): of the cells pending, those `stale` says
    /// changed (the viewer lacks their version; a quiet one has nothing to send, and nothing
    /// to ask for a pass ahead). True if a band was skipped: it may hold changes back (so the
    /// viewer must be due again).
    pub fn cells<'a>(
        &self,
        at: Instant,
        n: usize,
        stale: impl Fn(u32) -> bool,
        out: &'a mut Vec<u32>,
    ) -> (Look<'a>, bool) {
        let Some(watch) = &self.0 else { return (Look { cells: None, n }, false) };
        out.clear();
        out.extend_from_slice(&watch.every);
        out.extend(watch.pending.iter().copied().filter(|&index| stale(index)));
        let mut skipped = false;
        for band in &watch.bands {
            if band.due(at) {
                out.extend_from_slice(&band.cells);
            } else {
                skipped = true;
            }
        }
        // Sorted runs end to end: the stable sort merges runs.
        out.sort();
        out.dedup();
        (Look { cells: Some(out), n }, skipped)
    }

    /// After a pass at `at` read `read` (what [`Watch::cells`] gave for `at`) and the viewer's
    /// update, if any, went: the banded cells still due wait in `pending` (those read, and the
    /// quiet ones it did not read), and each band read turns next on its grid from `anchor`.
    pub fn read(&mut self, held: &[Held], read: &[u32], at: Instant, anchor: Instant) {
        // No bands: nothing waits (and `read` was not filled in).
        let Some(watch) = &mut self.0 else { return };
        let waits = |i: u32| {
            let h = &held[i as usize];
            h.interval_ms != 0 && h.due(at)
        };
        // Both sorted: merged, each once, still sorted.
        let old = std::mem::take(&mut watch.pending);
        let (mut a, mut b) = (old.iter().copied().peekable(), read.iter().copied().peekable());
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(&x), Some(&y)) if x < y => a.next(),
                (Some(&x), Some(&y)) if x > y => b.next(),
                (Some(_), Some(_)) => {
                    a.next();
                    b.next()
                }
                (Some(_), None) => a.next(),
                (None, Some(_)) => b.next(),
                (None, None) => break,
            };
            if let Some(i) = next.filter(|&i| waits(i)) {
                watch.pending.push(i);
            }
        }
        for band in watch.bands.iter_mut().filter(|band| band.due(at)) {
            band.from = Some(turn_after(anchor, band.interval, at));
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A view of `intervals.len()` cells, none sent yet.
    fn view(intervals: &[u32], t0: Instant) -> Vec<Held> {
        intervals
            .iter()
            .enumerate()
            .map(|(i, &interval_ms)| Held { version: None, next: t0, cell: i as u32, interval_ms })
            .collect()
    }

    /// Whether the viewer lacks the version of cell `i` the world is at.
    fn stale<'a>(held: &'a [Held], world: &'a [u64]) -> impl Fn(u32) -> bool + 'a {
        move |i| held[i as usize].version != Some(world[i as usize])
    }

    /// What a pass at `at` reads, and whether a band was skipped.
    fn look(watch: &Watch, at: Instant, held: &[Held], world: &[u64]) -> (Vec<u32>, bool) {
        let mut out = Vec::new();
        let (cells, skipped) = watch.cells(at, held.len(), stale(held, world), &mut out);
        (cells.from(0).map(|i| i as u32).collect(), skipped)
    }

    #[test]
    fn a_band_is_read_at_its_turns_and_its_cells_left_behind_at_every_pass() {
        let t0 = Instant::now();
        let mut held = view(&[0, 100, 100, 1000], t0);
        let mut world = vec![1u64; 4];
        let mut watch = Watch::of(&held);
        // First pass: snapshots, every cell.
        let (out, skipped) = look(&watch, t0, &held, &world);
        assert_eq!((&out[..], skipped), (&[0, 1, 2, 3][..], false));
        // Cell 2 is left out (a full update); the others go.
        for i in [0, 1, 3] {
            held[i].version = Some(1);
            held[i].sent(t0, t0);
        }
        watch.read(&held, &out, t0, t0);
        // 20 ms later: the cell with no band and the one left behind.
        let (out, skipped) = look(&watch, t0 + 20 * MS, &held, &world);
        assert_eq!((&out[..], skipped), (&[0, 2][..], true), "both bands skipped");
        held[2].version = Some(1);
        held[2].sent(t0 + 20 * MS, t0);
        watch.read(&held, &out, t0 + 20 * MS, t0);
        let (out, _) = look(&watch, t0 + 40 * MS, &held, &world);
        assert_eq!(out, [0], "cell 2 went");
        // At 100 ms, the 100 ms band's turn: cell 2 changed, cell 1 did not.
        world[2] = 2;
        let (out, skipped) = look(&watch, t0 + 100 * MS, &held, &world);
        assert_eq!((&out[..], skipped), (&[0, 1, 2][..], true), "the 1 s band is skipped");
        held[2].version = Some(2);
        held[2].sent(t0 + 100 * MS, t0);
        watch.read(&held, &out, t0 + 100 * MS, t0);
        // Cell 1 was quiet at its turn: it waits, and is read only once it changes.
        let (out, _) = look(&watch, t0 + 120 * MS, &held, &world);
        assert_eq!(out, [0], "quiet");
        watch.read(&held, &out, t0 + 120 * MS, t0);
        world[1] = 2;
        let (out, _) = look(&watch, t0 + 140 * MS, &held, &world);
        assert_eq!(out, [0, 1], "changed: read at once, not at its next turn");
        // A forgotten version: every band now.
        watch.all_due();
        let (out, skipped) = look(&watch, t0 + 160 * MS, &held, &world);
        assert_eq!((&out[..], skipped), (&[0, 1, 2, 3][..], false));
        // A view with no bands: every cell, always, and nothing kept.
        let plain = Watch::of(&view(&[0, 0, 0], t0));
        assert!(plain.0.is_none() && !plain.banded());
        let mut scratch = Vec::new();
        let (every, skipped) = plain.cells(t0, 3, |_| true, &mut scratch);
        assert_eq!((every, skipped), (Look { cells: None, n: 3 }, false), "nothing listed");
        assert_eq!(every.from(1).collect::<Vec<_>>(), [1, 2, 0], "every cell, from the first");
    }

    proptest! {
        /// Whatever changes and goes when, a pass reads every cell that is due at it and that
        /// the viewer lacks the version of (what a scan of the whole view would find).
        #[test]
        fn no_due_cell_with_news_is_skipped(
            intervals in prop::collection::vec(prop::sample::select(vec![0u32, 50, 100, 500, 1000]), 1..24),
            passes in prop::collection::vec(
                (1u32..80, prop::collection::vec((any::<bool>(), any::<bool>()), 24), any::<u8>()),
                1..60,
            ),
        ) {
            let t0 = Instant::now();
            let mut held = view(&intervals, t0);
            let mut world = vec![1u64; held.len()];
            let mut watch = Watch::of(&held);
            let mut at = t0;
            for (step, cells, event) in passes {
                at += step * MS;
                // Some cells change.
                for (i, v) in world.iter_mut().enumerate() {
                    *v += u64::from(cells[i].0);
                }
                let (out, _) = look(&watch, at, &held, &world);
                let wanted: Vec<u32> = (0..held.len() as u32)
                    .filter(|&i| held[i as usize].due(at) && stale(&held, &world)(i))
                    .collect();
                for i in &wanted {
                    prop_assert!(out.contains(i), "cell {i} due at {:?} with news not read", at - t0);
                }
                prop_assert!(out.windows(2).all(|w| w[0] < w[1]), "sorted, each once");
                // Some of those go (the others are left out), and with them, now and then,
                // cells out of their turn (an entity came from a cell that goes).
                for i in 0..held.len() {
                    let forced = held[i].version.is_some() && event % 2 == 1;
                    if cells[i].1 && (wanted.contains(&(i as u32)) || forced) {
                        held[i].version = Some(world[i]);
                        held[i].sent(at, t0);
                    }
                }
                watch.read(&held, &out, at, t0);
                if event % 16 == 0 {
                    // A rewind: every version forgotten.
                    held.iter_mut().for_each(|h| h.version = None);
                    watch.all_due();
                }
            }
        }
    }
}
