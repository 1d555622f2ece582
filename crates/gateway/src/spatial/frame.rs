//! One fan-out pass of the spatial world, encoded: for each cell, the entries of
//! `ChannelUpdates.updates` that the pass's viewers need, each encoded once on the world's
//! thread and shared, read-only, by the threads that deliver them (`delivery.rs`).
//!
//! What a pass encodes, without looking at any viewer's replica (those live with the
//! deliveries): the latest change of every cell that changed and has viewers in that codec
//! (from the version before it, which every viewer that keeps up holds); a snapshot of every
//! cell a viewer just entered (or whose level-of-detail band got faster), and of every cell an
//! entity moved into that a viewer's band holds back (it may go out of turn:
//! `delivery/forced.rs`); and whatever the deliveries asked for at the previous pass for viewers
//! behind or due less often (a delta from the version they hold, or a snapshot), encoded at this
//! pass's version. Each cell also carries its latest moves out (`moves.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message;
use tickwire_fanout::Version;
use tickwire_state::Key;
use tickwire_wire::proto::{ChannelUpdate, DeltaCodec};

use super::moves::{Move, MoveLog, Recent};
use super::world::CellState;
use super::{CELL_BASE, SpatialFigures};
use crate::channel::state_codec;
use crate::router::field_len;

/// The tag of `ChannelUpdates.updates` (field 1, length-delimited).
const UPDATES_TAG: u8 = 0x0a;

/// A viewer whose version of a cell predates the cell's latest change gets the cell's snapshot
/// instead of a delta of its own when the latest change's delta is at least this fraction
/// (NUM/DEN) of the snapshot's size. A delta from an older version carries at least what the
/// latest change touched, so the snapshot is then at most about twice the bytes of the delta
/// it replaces, and the world encodes one snapshot per cell instead of one delta per version
/// held. Half, not more: a set sends only the fields that differ (docs/protocol.md 13.4), so
/// characters that all move every frame make deltas well under a snapshot: 54% in binary and
/// 74% in JSON in the harness test of such a world (`..._whose_every_entity_moved`).
const SNAPSHOT_INSTEAD_NUM: usize = 1;
const SNAPSHOT_INSTEAD_DEN: usize = 2;

/// The codecs, at their index in the per-codec arrays ([`codec_index`]).
pub(super) const CODECS: [DeltaCodec; 2] = [DeltaCodec::Binary, DeltaCodec::Json];

/// A codec's index in the per-codec arrays.
pub(super) fn codec_index(codec: DeltaCodec) -> usize {
    match codec {
        DeltaCodec::Binary => 0,
        DeltaCodec::Json => 1,
    }
}

/// One cell's update, as its entry of `ChannelUpdates.updates` (tag, length, message).
#[derive(Debug, Clone)]
pub(super) struct Entry {
    /// The version it applies to; 0: a snapshot, which applies to anything.
    pub from: Version,
    pub codec: usize,
    pub field: Bytes,
    /// The version it leads to: the cell's at the pass.
    pub to: Version,
}

/// One cell at a pass.
#[derive(Debug, Clone, Default)]
pub(super) struct CellFrame {
    pub version: Version,
    /// The version before its latest change.
    pub previous: Version,
    /// Per codec: the length of the latest change's entry, if one was encoded, and of the
    /// cell's latest snapshot entry (0: none yet). A guide for sending a viewer that is behind
    /// the snapshot instead of a delta of its own (`delivery::base_for`).
    pub latest_len: [Option<usize>; 2],
    pub snapshot_len: [usize; 2],
    pub entries: Vec<Entry>,
    /// Where the entities that left the cell lately went, as of the pass.
    pub moves: Arc<MoveLog>,
    /// The last of them.
    pub recent: Recent,
}

impl CellFrame {
    /// Whether an entity left the cell since version `held`.
    pub fn moved_since(&self, held: Version) -> bool {
        self.recent.newest() > held
    }

    /// Calls `each` with every entity's move out of the cell since version `held`, up to
    /// version `to`, from the recent ones if they reach back that far; false if the log does
    /// not either.
    pub fn moves_since(&self, held: Version, to: Version, mut each: impl FnMut(&Move)) -> bool {
        if let Some(moves) = self.recent.since(held, to) {
            moves.for_each(&mut each);
        } else if let Some(moves) = self.moves.since(held, to) {
            moves.for_each(&mut each);
        } else {
            return false;
        }
        true
    }

    /// The entry from `from` in codec `codec`, if the pass encoded it.
    pub fn find(&self, from: Version, codec: usize) -> Option<&Entry> {
        self.entries.iter().find(|e| e.from == from && e.codec == codec)
    }
}

/// The version a viewer holding `held` of a cell should get an update from: its own, or 0 for
/// the snapshot (`SNAPSHOT_INSTEAD_*`).
pub(super) fn base_for(held: Option<Version>, cell: &CellFrame, codec: usize) -> Version {
    let Some(held) = held else { return 0 };
    if held == cell.previous || held == 0 {
        return held;
    }
    let full = cell.snapshot_len[codec];
    match cell.latest_len[codec] {
        Some(latest) if full > 0 && latest * SNAPSHOT_INSTEAD_DEN >= full * SNAPSHOT_INSTEAD_NUM => 0,
        _ => held,
    }
}

/// A pass: what the deliveries read.
#[derive(Debug)]
pub(super) struct Frame {
    /// The instant the pass was due on the world's timer: the schedules run on it.
    pub scheduled: Instant,
    /// The world's tick: the next pass is due this long after `scheduled`.
    pub tick: Duration,
    /// Goes up whenever any cell changes.
    pub world_version: u64,
    pub cells: Vec<CellFrame>,
}

/// Encodes cell `cell`'s update from `base` in `codec` as its `ChannelUpdates` entry, at the
/// cell's version; a snapshot if `base` is 0 or if the cell's history no longer reaches `base`.
/// `None` only if the update cannot be encoded at all.
fn encode(
    c: &mut CellState,
    cell: u32,
    base: Version,
    codec: usize,
    figures: &SpatialFigures,
) -> Option<Entry> {
    let field = |c: &mut CellState, base: Version| {
        figures.encodings.fetch_add(1, Ordering::Relaxed);
        let no_player = Key::Int(0);
        let prepared = c.cache.get(&c.state, base, state_codec(CODECS[codec])).ok()?;
        let update = prepared.update_for(&c.state, &no_player, false).ok()?;
        // Sent even when nothing visible changed: the client's replica must move to the new
        // version, or the next delta would not apply.
        let message = ChannelUpdate {
            channel_id: CELL_BASE + u64::from(cell),
            codec: CODECS[codec] as i32,
            update: update.to_vec().into(),
        };
        // At its exact size: queued updates hold it, and the window counts only its length.
        let mut field = Vec::with_capacity(field_len(message.encoded_len()));
        field.push(UPDATES_TAG);
        message.encode_length_delimited(&mut field).ok()?;
        // From what it really applies to: 0 when the history no longer reached `base` and the
        // cache made a snapshot instead.
        Some(Entry { from: prepared.from(), codec, field: Bytes::from(field), to: prepared.to() })
    };
    let entry = field(c, base).or_else(|| if base == 0 { None } else { field(c, 0) })?;
    if entry.from == 0 {
        c.snapshot_len[codec] = entry.field.len();
    } else if entry.from == c.previous {
        c.latest_len[codec] = (entry.from, entry.field.len());
    }
    Some(entry)
}

/// Per codec, the length of cell `c`'s latest change's entry, if the one encoded last is from
/// its current `previous`.
fn latest_len(c: &CellState) -> [Option<usize>; 2] {
    std::array::from_fn(|k| (c.latest_len[k].0 == c.previous).then_some(c.latest_len[k].1))
}

impl CellFrame {
    /// Cell `c` as a pass finds it, with no entries yet.
    pub fn of(c: &CellState) -> CellFrame {
        CellFrame {
            version: c.state.version(),
            previous: c.previous,
            latest_len: latest_len(c),
            snapshot_len: c.snapshot_len,
            entries: Vec::new(),
            moves: c.moves.clone(),
            recent: c.moves.recent(),
        }
    }

    /// Adds the entry from `base` in `codec`, unless the pass has it already (an entry that
    /// cannot be encoded at all is left out; a viewer that needs it asks again).
    pub fn add(&mut self, c: &mut CellState, cell: u32, base: Version, codec: usize, f: &SpatialFigures) {
        if self.find(base, codec).is_some() {
            return;
        }
        let Some(entry) = encode(c, cell, base, codec, f) else { return };
        // A delta the history could not reach came out as a snapshot; that one may be here
        // already.
        if self.find(entry.from, codec).is_none() {
            self.entries.push(entry);
        }
        // The lengths may have changed with it.
        self.latest_len = latest_len(c);
        self.snapshot_len = c.snapshot_len;
    }
}

#[cfg(test)]
mod tests {
    use hashbrown::HashSet;
    use tickwire_state::{
        Field, KeyKind, Limits, PreparedCache, Schema, SchemaDef, State, Step, Type, Value,
    };

    use super::*;
    use crate::spatial::world::ENTITIES_FIELD;

    /// A cell whose state keeps one tombstone, so its history stops reaching old versions after
    /// two removals.
    fn cell() -> CellState {
        let def = SchemaDef::new([Field::new("entities", Type::map(KeyKind::Int, Type::Int))]);
        let limits = Limits { max_tombstones: 1, history: 1, ..Limits::default() };
        CellState {
            state: State::with_limits(Schema::new(def).unwrap(), limits),
            previous: 0,
            snapshot_len: [0; 2],
            latest_len: [(0, 0); 2],
            cache: PreparedCache::default(),
            entities: HashSet::new(),
            moves: Arc::default(),
        }
    }

    fn set(c: &mut CellState, id: i64) -> Version {
        let key = Key::Int(id);
        let before = c.state.version();
        c.state.set(&[Step::Field(ENTITIES_FIELD), Step::Key(&key)], Value::Int(id)).unwrap();
        c.previous = before;
        c.state.seal()
    }

    fn remove(c: &mut CellState, id: i64) -> Version {
        let key = Key::Int(id);
        let before = c.state.version();
        assert!(c.state.remove(&[Step::Field(ENTITIES_FIELD), Step::Key(&key)]).unwrap());
        c.previous = before;
        c.state.seal()
    }

    /// A delta asked for from a version the cell's history no longer reaches comes out as a
    /// snapshot, and is labelled as one: from 0, its length kept as the cell's snapshot length,
    /// and found (once) by every viewer that needs a snapshot.
    #[test]
    fn a_delta_past_the_floor_is_labelled_a_snapshot() {
        let mut c = cell();
        let old = set(&mut c, 1);
        set(&mut c, 2);
        set(&mut c, 3);
        remove(&mut c, 1);
        remove(&mut c, 2);
        assert!(c.state.floor() > old, "two removals with one tombstone kept raise the floor");
        let figures = SpatialFigures::default();
        let mut frame = CellFrame::of(&c);
        frame.add(&mut c, 0, old, 0, &figures);

        assert_eq!(frame.entries.len(), 1);
        let entry = &frame.entries[0];
        assert_eq!((entry.from, entry.to), (0, c.state.version()));
        assert!(frame.find(old, 0).is_none(), "not labelled as a delta from {old}");
        assert!(frame.find(0, 0).is_some());
        assert_eq!(frame.snapshot_len[0], entry.field.len());
        assert_eq!(c.snapshot_len[0], entry.field.len());

        // Another viewer past the floor, and one asking for the snapshot itself, share it.
        frame.add(&mut c, 0, old + 1, 0, &figures);
        frame.add(&mut c, 0, 0, 0, &figures);
        assert_eq!(frame.entries.len(), 1);

        // A base the history still reaches gets a delta of its own.
        let reachable = c.state.floor();
        set(&mut c, 4);
        let mut frame = CellFrame::of(&c);
        frame.add(&mut c, 0, reachable, 0, &figures);
        assert_eq!(frame.entries.len(), 1);
        assert_eq!(frame.entries[0].from, reachable);
    }
}
