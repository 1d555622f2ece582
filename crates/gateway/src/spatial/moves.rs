//! Which cell each entity that left a cell went to, by the cells' versions: what lets a
//! delivery send both sides of a move in one update to a client whose level of detail
//! (docs/protocol.md 14.4) would otherwise send the cell the entity left and hold back the one
//! it entered, so that the entity vanished from the client's view until the slower cell's turn.
//!
//! Each cell keeps its latest moves out ([`MoveLog`]), shared read-only with the deliveries
//! through every pass (`frame.rs`): a new move copies the log (a few times a second per cell)
//! so that a pass only clones a pointer.

use std::sync::Arc;

use tickwire_fanout::Version;

/// Moves a cell's log keeps. A viewer holding a version of the cell older than the oldest move
/// kept cannot know where every entity it lacks the removal of went, and gets every cell in
/// view that changed instead ([`MoveLog::since`]). At the B3 `lod` density (2,000 characters
/// in 400 cells of 10 m) a cell sees about 3 moves out a second, so 64 reach back some 20 s,
/// past any band's interval that scene uses.
pub(super) const MOVES_KEPT: usize = 64;

/// An entity left a cell for another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

impl MoveLog {
    /// The moves out of the cell that a viewer holding version `held` lacks, up to version `to`
    /// (the version an update brings it to); `None` if the log no longer reaches back to
    /// `held`.
    pub fn since(&self, held: Version, to: Version) -> Option<impl Iterator<Item = &Move>> {
        if held < self.complete_after {
            return None;
        }
        let first = self.moves.partition_point(|m| m.left_at <= held);
        Some(self.moves[first..].iter().take_while(move |m| m.left_at <= to))
    }

    /// Whether any move out of the cell is newer than version `held`: the cheap test a delivery
    /// makes for each cell it sends.
    pub fn any_since(&self, held: Version) -> bool {
        self.moves.last().is_some_and(|m| m.left_at > held)
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
        assert!(log.any_since(8) && !log.any_since(9));
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
                prop_assert_eq!(got, want);
            }
            prop_assert_eq!(log.any_since(held), all.iter().any(|m| m.left_at > held));
        }
    }
}
