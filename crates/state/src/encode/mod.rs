//! Delta encoding: one walk over the changed paths, two output formats.
//!
//! `walk` decides *what* an audience receives (policies, versions, removals); an [`Emit`]
//! implementation decides *how* it is written: `binary` (the compact format in
//! `docs/protocol.md`) or `json` (one JSON-Patch-like op per line, for debugging and web clients).

pub(crate) mod binary;
pub(crate) mod json;
pub(crate) mod walk;

use std::ops::Range;

use crate::schema::{Schema, TypeId};
use crate::tree::Node;
use crate::value::Key;

/// Which fields a full value or a patch includes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// What every subscriber may see: broadcast fields only.
    Public,
    /// Inside an owner-only entry or a custom value: everything but server-only fields.
    Owned,
}

/// One step of the path to a private item, replayed when the item is written as its own patch.
#[derive(Clone, Debug)]
pub(crate) enum PathStep {
    Field(u16),
    /// `keyed`: the map is player-keyed, so a subscriber skipping its own entry never has it.
    Entry {
        id: u32,
        key: Key,
        keyed: bool,
    },
    Item(u32),
}

/// A position in the output, returned by `enter_*` so that `leave_*` can drop an empty patch.
pub(crate) type Mark = usize;

/// The output side of an encoder. The walker calls these in document order.
pub(crate) trait Emit {
    /// Bytes written so far.
    fn position(&self) -> usize;
    /// Byte ranges of the entries of player-keyed maps written so far, by key: what a
    /// subscriber that skips its own entries leaves out.
    fn skips(&mut self) -> &mut Vec<(Key, Range<usize>)>;
    /// Ends one patch applied at the root.
    fn end_patch(&mut self);

    fn enter_field(&mut self, index: u16, name: &str) -> Mark;
    fn leave_field(&mut self, mark: Mark);
    /// Sets a field to a full value. `keyed`: the field is a player-keyed map.
    #[allow(clippy::too_many_arguments)]
    fn set_field(
        &mut self,
        schema: &Schema,
        index: u16,
        name: &str,
        ty: TypeId,
        node: &Node,
        mode: Mode,
        keyed: bool,
    );
    fn clear_field(&mut self, index: u16, name: &str);

    /// Written right after entering a list: its new length, if it grew.
    fn list_header(&mut self, new_len: Option<usize>);
    fn enter_item(&mut self, index: u32) -> Mark;
    fn leave_item(&mut self, mark: Mark);
    fn set_item(&mut self, schema: &Schema, index: u32, ty: TypeId, node: &Node, mode: Mode);

    fn enter_entry(&mut self, id: u32, key: &Key) -> Mark;
    fn leave_entry(&mut self, mark: Mark);
    fn insert_entry(&mut self, schema: &Schema, id: u32, key: &Key, ty: TypeId, node: &Node, mode: Mode);
    fn set_entry(&mut self, schema: &Schema, id: u32, key: &Key, ty: TypeId, node: &Node, mode: Mode);
    fn remove_entry(&mut self, id: u32, key: &Key);
}

/// True when `path` goes through `player`'s own entry of a player-keyed map: a subscriber that
/// skips its own entries does not have that subtree, so it must not get items inside it.
pub(crate) fn through_own(path: &[PathStep], player: &Key) -> bool {
    path.iter().any(|s| matches!(s, PathStep::Entry { key, keyed: true, .. } if key == player))
}
