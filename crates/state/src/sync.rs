//! Encode once, send many: a tick's changes as shared segments, and each subscriber's update as a
//! short list of references to them.
//!
//! `State::prepare(from)` walks what changed after `from` once and produces:
//! - a header (kind, from, to);
//! - the broadcast segment, one patch for everyone, with the byte ranges of player-keyed entries
//!   so that "all but my own entry" is two slices;
//! - private segments, only for players whose own owner-only entries changed;
//! - the paths of changed custom fields, filtered per player when their update is assembled.
//!
//! Subscribers at different versions (a lower fan-out rate, missed ticks) each use the `Prepared`
//! for their own `from`: one merged delta, never a backlog. When `from` is older than the removal
//! history the state keeps, `prepare` returns a snapshot instead.

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use hashbrown::HashMap;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::encode::binary::Binary;
use crate::encode::json::Json;
use crate::encode::walk::{self, EntryChange, PrivateItem};
use crate::encode::{Emit, Mode, PathStep, through_own};
use crate::error::StateError;
use crate::schema::{FieldMask, FieldNode, Kind, ROOT, Schema, TypeId, Vis};
use crate::state::State;
use crate::tree::{Node, Slot, Version};
use crate::value::Key;

/// The delta format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Codec {
    Binary,
    Json,
}

/// One tick's encoded changes after one `from` version, shared by every subscriber at `from`.
#[derive(Debug)]
pub struct Prepared {
    codec: Codec,
    from: Version,
    to: Version,
    snapshot: bool,
    header: Bytes,
    broadcast: Bytes,
    broadcast_empty: bool,
    skip: Vec<(Key, Range<usize>)>,
    skip_index: OnceLock<HashMap<Key, SmallVec<[Range<usize>; 1]>>>,
    /// Each owner's segments, with whether the segment's path goes through the owner's own
    /// entry of a player-keyed map (left out when the owner skips its own entries).
    private: HashMap<Key, SmallVec<[(Bytes, bool); 1]>>,
    custom: Vec<Vec<PathStep>>,
}

/// One subscriber's update: segments to write back to back (one vectored write).
#[derive(Clone, Debug, Default)]
pub struct Update {
    pub segments: SmallVec<[Bytes; 4]>,
    has_changes: bool,
}

impl Update {
    /// Total bytes.
    pub fn len(&self) -> usize {
        self.segments.iter().map(Bytes::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// False when the update carries nothing but its header; the caller may skip sending it
    /// (the subscriber's next delta then starts from its older version).
    pub fn has_changes(&self) -> bool {
        self.has_changes
    }

    /// The segments copied into one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len());
        for s in &self.segments {
            out.extend_from_slice(s);
        }
        out
    }
}

/// The encoders behind `Prepared`, over both formats.
trait Output: Emit {
    fn new() -> Self;
    fn into_bytes(self) -> Vec<u8>;
    fn header(snapshot: bool, from: Version, to: Version) -> Vec<u8>;
    /// The length of a patch with no ops.
    const EMPTY_PATCH: usize;
}

impl Output for Binary {
    fn new() -> Self {
        Binary::new()
    }
    fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
    fn header(snapshot: bool, from: Version, to: Version) -> Vec<u8> {
        crate::encode::binary::header(snapshot, from, to)
    }
    const EMPTY_PATCH: usize = 1;
}

impl Output for Json {
    fn new() -> Self {
        Json::new()
    }
    fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
    fn header(snapshot: bool, from: Version, to: Version) -> Vec<u8> {
        crate::encode::json::header(snapshot, from, to)
    }
    const EMPTY_PATCH: usize = 0;
}

impl State {
    /// Encodes everything that changed after `from` (a snapshot if `from` is 0 or older than
    /// [`State::floor`]). The state must be sealed.
    pub fn prepare(&self, from: Version, codec: Codec) -> Result<Prepared, StateError> {
        self.prepare_masked(from, codec, None)
    }

    /// [`State::prepare`] for subscribers that receive only the root fields in `mask`.
    pub fn prepare_masked(
        &self,
        from: Version,
        codec: Codec,
        mask: Option<&FieldMask>,
    ) -> Result<Prepared, StateError> {
        if self.is_dirty() {
            return Err(StateError::Unsealed);
        }
        if from > self.version {
            return Err(StateError::Unavailable { from, current: self.version, floor: self.floor });
        }
        let snapshot = from == 0 || from < self.floor;
        let from = if snapshot { 0 } else { from };
        Ok(match codec {
            Codec::Binary => prepare_with::<Binary>(self, from, snapshot, codec, mask),
            Codec::Json => prepare_with::<Json>(self, from, snapshot, codec, mask),
        })
    }

    /// A full snapshot, for joiners.
    pub fn snapshot(&self, codec: Codec) -> Result<Prepared, StateError> {
        self.prepare(0, codec)
    }
}

fn prepare_with<E: Output>(
    state: &State,
    from: Version,
    snapshot: bool,
    codec: Codec,
    mask: Option<&FieldMask>,
) -> Prepared {
    let schema = &*state.schema;
    let to = state.version;

    let mut e = E::new();
    walk::broadcast(schema, &mut e, &state.root, from, mask);
    let broadcast_empty = e.position() <= E::EMPTY_PATCH;
    let skip = std::mem::take(e.skips());
    let broadcast = Bytes::from(e.into_bytes());

    let mut items = Vec::new();
    walk::private(schema, &state.root, from, snapshot, mask, &mut items);
    let mut custom = Vec::new();
    let mut ranges = Vec::new();
    let mut e = E::new();
    for item in items {
        match item {
            PrivateItem::Custom { path } => custom.push(path),
            PrivateItem::Owned { path, map_value, change } => {
                let start = e.position();
                write_owned(schema, &mut e, &path, map_value, &change, from);
                if e.position() - start > E::EMPTY_PATCH {
                    let owner = change.owner();
                    ranges.push((owner.clone(), start..e.position(), through_own(&path, owner)));
                }
            }
        }
    }
    let buf = Bytes::from(e.into_bytes());
    let mut private: HashMap<Key, SmallVec<[(Bytes, bool); 1]>> = HashMap::with_capacity(ranges.len());
    for (key, range, through) in ranges {
        private.entry(key).or_default().push((buf.slice(range), through));
    }

    Prepared {
        codec,
        from,
        to,
        snapshot,
        header: Bytes::from(E::header(snapshot, from, to)),
        broadcast,
        broadcast_empty,
        skip,
        skip_index: OnceLock::new(),
        private,
        custom,
    }
}

fn write_owned<E: Emit>(
    schema: &Schema,
    e: &mut E,
    path: &[PathStep],
    value_ty: TypeId,
    change: &EntryChange<'_>,
    from: Version,
) {
    walk::write_rooted(schema, e, ROOT, path, |e, _map_ty| match *change {
        EntryChange::Insert { id, key, node } => e.insert_entry(schema, id, key, value_ty, node, Mode::Owned),
        EntryChange::Set { id, key, node } => e.set_entry(schema, id, key, value_ty, node, Mode::Owned),
        EntryChange::Patch { id, key, node } => {
            let mark = e.enter_entry(id, key);
            walk::owned_patch(schema, e, value_ty, node, from);
            e.leave_entry(mark);
        }
        EntryChange::Remove { id, key } => e.remove_entry(id, key),
    });
}

impl Prepared {
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// The version the subscriber must be at (0 for a snapshot).
    pub fn from(&self) -> Version {
        self.from
    }

    /// The version the subscriber is at after applying.
    pub fn to(&self) -> Version {
        self.to
    }

    pub fn is_snapshot(&self) -> bool {
        self.snapshot
    }

    /// The shared broadcast segment.
    pub fn broadcast(&self) -> &Bytes {
        &self.broadcast
    }

    /// The players that have a private segment (custom fields aside).
    pub fn private_players(&self) -> impl Iterator<Item = &Key> {
        self.private.keys()
    }

    /// `player`'s update. With `skip_self`, the player's own entries in player-keyed maps are
    /// left out of the broadcast part (by slicing). `state` must be the state this was prepared
    /// from, unchanged since; it is read only when the schema has custom fields.
    pub fn update_for(&self, state: &State, player: &Key, skip_self: bool) -> Result<Update, StateError> {
        let mut segments = SmallVec::new();
        segments.push(self.header.clone());
        let mut has_changes = self.snapshot || !self.broadcast_empty;
        match self.skip_ranges(player).filter(|_| skip_self) {
            Some(ranges) => {
                let mut at = 0;
                for r in ranges {
                    if r.start > at {
                        segments.push(self.broadcast.slice(at..r.start));
                    }
                    at = r.end;
                }
                segments.push(self.broadcast.slice(at..));
            }
            None => segments.push(self.broadcast.clone()),
        }
        if let Some(private) = self.private.get(player) {
            for (segment, through) in private {
                if !(skip_self && *through) {
                    has_changes = true;
                    segments.push(segment.clone());
                }
            }
        }
        if !self.custom.is_empty() {
            if state.version() != self.to || state.is_dirty() {
                return Err(StateError::Stale { prepared: self.to, current: state.version() });
            }
            let custom = match self.codec {
                Codec::Binary => self.custom_for::<Binary>(state, player, skip_self),
                Codec::Json => self.custom_for::<Json>(state, player, skip_self),
            };
            if !custom.is_empty() {
                has_changes = true;
                segments.push(Bytes::from(custom));
            }
        }
        Ok(Update { segments, has_changes })
    }

    fn skip_ranges(&self, player: &Key) -> Option<&SmallVec<[Range<usize>; 1]>> {
        if self.skip.is_empty() {
            return None;
        }
        let index = self.skip_index.get_or_init(|| {
            let mut index: HashMap<Key, SmallVec<[Range<usize>; 1]>> = HashMap::new();
            for (key, range) in &self.skip {
                index.entry(key.clone()).or_default().push(range.clone());
            }
            for ranges in index.values_mut() {
                ranges.sort_by_key(|r| r.start);
            }
            index
        });
        index.get(player)
    }

    /// Every changed custom field, filtered for `player`.
    fn custom_for<E: Output>(&self, state: &State, player: &Key, skip_self: bool) -> Vec<u8> {
        let schema = &*state.schema;
        let mut e = E::new();
        for path in &self.custom {
            if skip_self && through_own(path, player) {
                continue;
            }
            let Some((PathStep::Field(index), parent_path)) = path.split_last() else { continue };
            let Some((slot, field)) = resolve_field(schema, &state.root, parent_path, *index) else {
                continue;
            };
            let Vis::Custom(filter) = field.vis else { continue };
            let shown = (schema.filters[filter as usize])(player, &slot.node.to_value())
                .and_then(|v| Node::from_value(schema, field.ty, v, self.to).ok());
            walk::write_rooted(schema, &mut e, ROOT, parent_path, |e, _| match &shown {
                Some(node) => e.set_field(schema, *index, &field.name, field.ty, node, Mode::Owned, false),
                None => e.clear_field(*index, &field.name),
            });
        }
        e.into_bytes()
    }
}

/// The slot and declaration of field `index` of the struct at `path`.
fn resolve_field<'a>(
    schema: &'a Schema,
    root: &'a Slot,
    path: &[PathStep],
    index: u16,
) -> Option<(&'a Slot, &'a FieldNode)> {
    let mut slot = root;
    let mut ty = ROOT;
    for step in path {
        (slot, ty) = match (step, &slot.node, &schema.node(ty).kind) {
            (PathStep::Field(i), Node::Struct(slots), Kind::Struct(fields)) => {
                (slots.get(*i as usize)?, fields.get(*i as usize)?.ty)
            }
            (PathStep::Item(i), Node::List(list), Kind::List(item)) => (list.items.get(*i as usize)?, *item),
            (PathStep::Entry { key, .. }, Node::Map(map), Kind::Map { value, .. }) => {
                (&map.get(key)?.slot, *value)
            }
            _ => return None,
        };
    }
    match (&slot.node, &schema.node(ty).kind) {
        (Node::Struct(slots), Kind::Struct(fields)) => {
            Some((slots.get(index as usize)?, fields.get(index as usize)?))
        }
        _ => None,
    }
}

/// Caches one `Prepared` per (from, codec) for the current version, so every subscriber at the
/// same version shares one encoding. Cleared when the state's version moves on.
#[derive(Debug, Default)]
pub struct PreparedCache {
    version: Version,
    entries: Vec<(Version, Codec, Option<FieldMask>, Arc<Prepared>)>,
}

impl PreparedCache {
    pub fn get(&mut self, state: &State, from: Version, codec: Codec) -> Result<Arc<Prepared>, StateError> {
        self.get_masked(state, from, codec, None)
    }

    /// [`PreparedCache::get`] for subscribers with a field filter.
    pub fn get_masked(
        &mut self,
        state: &State,
        from: Version,
        codec: Codec,
        mask: Option<&FieldMask>,
    ) -> Result<Arc<Prepared>, StateError> {
        if self.version != state.version() {
            self.entries.clear();
            self.version = state.version();
        }
        if let Some((.., p)) =
            self.entries.iter().find(|(f, c, m, _)| *f == from && *c == codec && m.as_ref() == mask)
        {
            return Ok(p.clone());
        }
        let p = Arc::new(state.prepare_masked(from, codec, mask)?);
        self.entries.push((from, codec, mask.cloned(), p.clone()));
        Ok(p)
    }
}
