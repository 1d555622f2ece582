//! Which cell each entity that left a cell went to, by the cells' versions: what lets a
//! delivery send both sides of a move in one update to a client whose level of detail
//! (docs/protocol.md 14.4) would otherwise send the cell the entity left and hold back the one
//! it entered, so that the entity vanished from the client's view until the slower cell's turn.
//!
//! Each cell keeps its latest moves out ([`MoveLog`]), shared read-only with the deliveries
//! through every pass (`frame.rs`): a new move copies the log (a few times a second per cell)
//! so that a pass only clones a pointer. Each pass also copies the last few moves beside the
//! cell's version ([`Recent`]): a delivery reads the cell there anyway, and most viewers lack
//! only those, so most checks never read the log.

use std::sync::Arc;

use tickwire_fanout::Version;

/// Moves a cell's log keeps. A viewer holding a version of the cell older than the oldest move
/// kept cannot know where every entity it lacks the removal of went, and gets every cell in
/// view that changed instead ([`MoveLog::since`]). At the B3 `lod` density (2,000 characters
/// in 400 cells of 10 m) a cell sees about 3 moves out a second, so 64 reach back some 20 s,
/// past any band's interval that scene uses.
pub(super) const MOVES_KEPT: usize = 64;

/// Moves a pass copies beside each cell ([`Recent`]): a cell at the B3 `lod` density sees about 3
/// a second, so 4 cover a viewer that holds a version under a second old.
pub(super) const RECENT: usize = 4;

/// An entity left a cell for another.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Move {
    /// The version of the cell left from which it no longer holds the entity.
    pub left_at: Version,
    /// The cell it went to.
    pub to: u32,
    /// The version of that cell from which it holds the entity.
    pub arrived_at: Version,
}

/// A cell's latest moves out, oldest first.
#[derive(Debug, Clone, Default)]
pub(super) struct MoveLog {
    moves: Vec<Move>,
    /// Every move with a `left_at` above this is kept (0: every move since the cell began).
    complete_after: Version,
}

/// The moves of `moves` (oldest first, holding every move with a `left_at` above
/// `complete_after`) that a viewer holding version `held` lacks, up to version `to` (the
/// version an update brings it to); `None` if they no longer reach back to `held`.
fn since(
    moves: &[Move],
    complete_after: Version,
    held: Version,
    to: Version,
) -> Option<impl Iterator<Item = &Move>> {
    if held < complete_after {
        return None;
    }
    let first = moves.partition_point(|m| m.left_at <= held);
    Some(moves[first..].iter().take_while(move |m| m.left_at <= to))
}

/// The last [`RECENT`] moves of a log, by value.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Recent {
    moves: [Move; RECENT],
    len: u8,
    /// Every move with a `left_at` above this is here.
    complete_after: Version,
}

impl Recent {
    /// [`MoveLog::since`], for a viewer whose version is recent enough.
    pub fn since(&self, held: Version, to: Version) -> Option<impl Iterator<Item = &Move>> {
        since(&self.moves[..usize::from(self.len)], self.complete_after, held, to)
    }

    /// The version of the cell its latest move out left (0: none): a viewer holding it or a
    /// later one lacks no move.
    pub fn newest(&self) -> Version {
        self.moves[..usize::from(self.len)].last().map_or(0, |m| m.left_at)
    }
}

impl MoveLog {
    /// The moves out of the cell that a viewer holding version `held` lacks, up to version `to`
    /// (the version an update brings it to); `None` if the log no longer reaches back to
    /// `held`.
    pub fn since(&self, held: Version, to: Version) -> Option<impl Iterator<Item = &Move>> {
        since(&self.moves, self.complete_after, held, to)
    }

    /// Its last [`RECENT`] moves.
    pub fn recent(&self) -> Recent {
        let first = self.moves.len().saturating_sub(RECENT);
        let mut recent = Recent {
            len: (self.moves.len() - first) as u8,
            complete_after: first.checked_sub(1).map_or(self.complete_after, |i| self.moves[i].left_at),
            ..Recent::default()
        };
        recent.moves[..usize::from(recent.len)].copy_from_slice(&self.moves[first..]);
        recent
    }
}

/// Appends `moves` (in version order, after those kept) to `log`, dropping the oldest past
/// [`MOVES_KEPT`]. Copies the log if a pass still shares it.
pub(super) fn record(log: &mut Arc<MoveLog>, moves: impl IntoIterator<Item = Move>) {
    let log = Arc::make_mut(log);
    log.moves.extend(moves);
    if log.moves.len() > MOVES_KEPT {
        let drop = log.moves.len() - MOVES_KEPT;
        log.complete_after = log.moves[drop - 1].left_at;
        log.moves.drain(..drop);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn to(left_at: Version) -> Move {
        Move { left_at, to: left_at as u32, arrived_at: left_at }
    }

    #[test]
    fn a_viewer_gets_the_moves_between_its_version_and_the_update() {
        let mut log = Arc::new(MoveLog::default());
        record(&mut log, [to(3), to(3), to(5), to(9)]);
        let since = |held, upto| log.since(held, upto).map(|m| m.map(|m| m.left_at).collect::<Vec<_>>());
        assert_eq!(since(0, 9), Some(vec![3, 3, 5, 9]));
        assert_eq!(since(3, 9), Some(vec![5, 9]));
        assert_eq!(since(3, 8), Some(vec![5]));
        assert_eq!(since(9, 12), Some(vec![]));
        assert_eq!(log.recent().newest(), 9);
        assert_eq!(MoveLog::default().recent().newest(), 0);
    }

    #[test]
    fn a_log_that_no_longer_reaches_a_version_says_so() {
        let mut log = Arc::new(MoveLog::default());
        let shared = log.clone();
        record(&mut log, (1..=MOVES_KEPT as u64 + 2).map(to));
        assert_eq!(shared.moves.len(), 0, "a pass holding the old log keeps it as it was");
        assert!(log.since(1, 100).is_none(), "the moves left at 1 and 2 are gone");
        assert_eq!(log.since(2, 100).map(Iterator::count), Some(MOVES_KEPT));
    }

    proptest! {
        /// Against a log that keeps everything: what `since` gives is exactly the moves in
        /// (held, to], whenever it answers, and it answers whenever the kept moves reach back.
        #[test]
        fn since_is_the_moves_between_the_versions(
            steps in proptest::collection::vec(0u64..3, 0..200),
            held in 0u64..300,
            span in 0u64..300,
        ) {
            let mut log = Arc::new(MoveLog::default());
            let mut all = Vec::new();
            let mut version = 0;
            for step in steps {
                version += step;
                all.push(to(version));
                record(&mut log, [to(version)]);
            }
            let upto = held + span;
            let want: Vec<_> = all.iter().filter(|m| m.left_at > held && m.left_at <= upto).copied().collect();
            let reaches = all.len() <= MOVES_KEPT || held >= all[all.len() - MOVES_KEPT - 1].left_at;
            let got = log.since(held, upto).map(|got| got.copied().collect::<Vec<_>>());
            prop_assert_eq!(got.is_some(), reaches);
            if let Some(got) = got {
                prop_assert_eq!(got, want.clone());
            }
            prop_assert_eq!(log.recent().newest() > held, all.iter().any(|m| m.left_at > held));
            // The recent moves answer the same, whenever they reach back to `held`.
            let recent = log.recent();
            prop_assert_eq!(recent.newest(), all.last().map_or(0, |m| m.left_at));
            let reaches = all.len() <= RECENT || held >= all[all.len() - RECENT - 1].left_at;
            let got = recent.since(held, upto).map(|got| got.copied().collect::<Vec<_>>());
            prop_assert_eq!(got.is_some(), reaches && log.since(held, upto).is_some());
            if let Some(got) = got {
                prop_assert_eq!(got, want);
            }
        }
    }
}
