//! The walk over everything that changed after a version, for one audience.
//!
//! Cost follows the changed paths only: unchanged slots are skipped by their stamps, and maps are
//! read from their most-recently-changed end. The broadcast walk writes one patch for everyone;
//! the private walk finds owner-only entries (and custom fields) that changed and hands each to
//! the player it belongs to.

use super::{Emit, Mode, PathStep};
use crate::schema::{FieldMask, Kind, ROOT, Schema, TypeId, Vis};
use crate::tree::{ListNode, MapNode, Node, Slot, Version};
use crate::value::Key;

/// Walks `root` for the broadcast audience: everything public that changed after `from`.
/// Entries of player-keyed maps are recorded in the emitter's `skips` with their byte range, so
/// that "all but this player's entry" is a slice.
pub(crate) fn broadcast<E: Emit>(
    schema: &Schema,
    e: &mut E,
    root: &Slot,
    from: Version,
    mask: Option<&FieldMask>,
) {
    let root_ty = ROOT;
    let mut w = Walker { schema, e, from, mask };
    if root.changed > from {
        w.node(root_ty, &root.node, Mode::Public, false);
    }
    w.e.end_patch();
}

struct Walker<'a, E> {
    schema: &'a Schema,
    e: &'a mut E,
    from: Version,
    /// The root fields this audience receives (all when `None`).
    mask: Option<&'a FieldMask>,
}

impl<E: Emit> Walker<'_, E> {
    fn node(&mut self, ty: TypeId, node: &Node, mode: Mode, player_keyed: bool) {
        match (node, &self.schema.node(ty).kind) {
            (Node::Struct(slots), Kind::Struct(_)) => self.structure(ty, slots, mode),
            (Node::List(list), Kind::List(item)) => self.list(*item, list, mode),
            (Node::Map(map), Kind::Map { value, .. }) => self.map(*value, map, mode, player_keyed),
            // Scalars are always replaced whole (`set` == `changed`), so the parent sets them.
            _ => {}
        }
    }

    fn structure(&mut self, ty: TypeId, slots: &[Slot], mode: Mode) {
        let schema = self.schema;
        for (i, (field, slot)) in schema.fields(ty).iter().zip(slots).enumerate() {
            if slot.changed <= self.from || (ty == ROOT && self.mask.is_some_and(|m| !m.contains(i))) {
                continue;
            }
            let i = i as u16;
            match field.vis {
                Vis::Broadcast => {}
                // The public view of an owner-only map is empty: when the map is replaced, clear
                // it for everyone, and the private walk re-sends each player's own entry.
                Vis::OwnerOnly if mode == Mode::Public => {
                    if slot.set > self.from {
                        self.e.clear_field(i, &field.name);
                    }
                    continue;
                }
                Vis::ServerOnly | Vis::OwnerOnly | Vis::Custom(_) => continue,
            }
            if slot.set > self.from {
                self.e.set_field(schema, i, &field.name, field.ty, &slot.node, mode, field.player_keyed);
            } else {
                let mark = self.e.enter_field(i, &field.name);
                self.node(field.ty, &slot.node, mode, field.player_keyed);
                self.e.leave_field(mark);
            }
        }
    }

    fn list(&mut self, item: TypeId, list: &ListNode, mode: Mode) {
        self.e.list_header((list.grown > self.from).then_some(list.items.len()));
        for (i, slot) in list.items.iter().enumerate() {
            if slot.changed <= self.from {
                continue;
            }
            if slot.set > self.from {
                self.e.set_item(self.schema, i as u32, item, &slot.node, mode);
            } else {
                let mark = self.e.enter_item(i as u32);
                self.node(item, &slot.node, mode, false);
                self.e.leave_item(mark);
            }
        }
    }

    fn map(&mut self, value: TypeId, map: &MapNode, mode: Mode, player_keyed: bool) {
        // Removals first: a key removed and re-inserted comes back under a new id.
        for t in map.tombstones.iter().rev() {
            if t.removed <= self.from {
                break;
            }
            if t.created <= self.from {
                let start = self.e.position();
                self.e.remove_entry(t.id, &t.key);
                if player_keyed {
                    let end = self.e.position();
                    self.e.skips().push((t.key.clone(), start..end));
                }
            }
        }
        for entry in map.changed_since(self.from) {
            let start = self.e.position();
            if entry.created > self.from {
                self.e.insert_entry(self.schema, entry.id, &entry.key, value, &entry.slot.node, mode);
            } else if entry.slot.set > self.from {
                self.e.set_entry(self.schema, entry.id, &entry.key, value, &entry.slot.node, mode);
            } else {
                let mark = self.e.enter_entry(entry.id, &entry.key);
                self.node(value, &entry.slot.node, mode, false);
                self.e.leave_entry(mark);
            }
            let end = self.e.position();
            if player_keyed && end > start {
                self.e.skips().push((entry.key.clone(), start..end));
            }
        }
    }
}

/// A change only some players may see, found by the private walk.
pub(crate) enum PrivateItem<'a> {
    /// An owner-only map's entry changed: its owner gets it. `path` leads to the map field.
    Owned { path: Vec<PathStep>, map_value: TypeId, change: EntryChange<'a> },
    /// A custom field changed: every player gets it through the filter. `path` ends at the field.
    Custom { path: Vec<PathStep> },
}

pub(crate) enum EntryChange<'a> {
    Insert { id: u32, key: &'a Key, node: &'a Node },
    Set { id: u32, key: &'a Key, node: &'a Node },
    Patch { id: u32, key: &'a Key, node: &'a Node },
    Remove { id: u32, key: &'a Key },
}

impl EntryChange<'_> {
    pub fn owner(&self) -> &Key {
        match self {
            EntryChange::Insert { key, .. }
            | EntryChange::Set { key, .. }
            | EntryChange::Patch { key, .. }
            | EntryChange::Remove { key, .. } => key,
        }
    }
}

/// Finds every private change after `from`. With `snapshot`, everything private is found (a
/// filter may show something even for a default value).
pub(crate) fn private<'a>(
    schema: &Schema,
    root: &'a Slot,
    from: Version,
    snapshot: bool,
    mask: Option<&FieldMask>,
    out: &mut Vec<PrivateItem<'a>>,
) {
    let root_ty = ROOT;
    if !schema.node(root_ty).has_private || !(snapshot || root.changed > from) {
        return;
    }
    let mut path = Vec::new();
    let mut f = PrivateFinder { schema, from, mask, out };
    f.node(root_ty, &root.node, &mut path, snapshot, false);
}

/// The private walk. `all` is set below a slot the broadcast segment replaced whole (or for a
/// snapshot): the receiver's copy of that subtree was reset to its public view, so every private
/// item in it is sent again, whatever its own stamps say.
struct PrivateFinder<'s, 'a, 'o> {
    schema: &'s Schema,
    from: Version,
    mask: Option<&'s FieldMask>,
    out: &'o mut Vec<PrivateItem<'a>>,
}

impl<'a> PrivateFinder<'_, 'a, '_> {
    fn node(&mut self, ty: TypeId, node: &'a Node, path: &mut Vec<PathStep>, all: bool, keyed: bool) {
        let schema = self.schema;
        let from = self.from;
        match (node, &schema.node(ty).kind) {
            (Node::Struct(slots), Kind::Struct(fields)) => {
                for (i, (field, slot)) in fields.iter().zip(slots.iter()).enumerate() {
                    if !(all || slot.changed > from)
                        || (ty == ROOT && self.mask.is_some_and(|m| !m.contains(i)))
                    {
                        continue;
                    }
                    let all = all || slot.set > from;
                    path.push(PathStep::Field(i as u16));
                    match field.vis {
                        Vis::Broadcast if schema.node(field.ty).has_private => {
                            self.node(field.ty, &slot.node, path, all, field.player_keyed);
                        }
                        Vis::OwnerOnly => {
                            if let (Node::Map(map), Kind::Map { value, .. }) =
                                (&slot.node, &schema.node(field.ty).kind)
                            {
                                self.owned_map(*value, map, path, all);
                            }
                        }
                        Vis::Custom(_) => self.out.push(PrivateItem::Custom { path: path.clone() }),
                        _ => {}
                    }
                    path.pop();
                }
            }
            (Node::List(list), Kind::List(item)) if schema.node(*item).has_private => {
                for (i, slot) in list.items.iter().enumerate() {
                    if all || slot.changed > from {
                        path.push(PathStep::Item(i as u32));
                        self.node(*item, &slot.node, path, all || slot.set > from, false);
                        path.pop();
                    }
                }
            }
            (Node::Map(map), Kind::Map { value, .. }) if schema.node(*value).has_private => {
                let entries: Box<dyn Iterator<Item = _>> =
                    if all { Box::new(map.iter()) } else { Box::new(map.changed_since(from)) };
                for entry in entries {
                    path.push(PathStep::Entry { id: entry.id, key: entry.key.clone(), keyed });
                    let all = all || entry.created > from || entry.slot.set > from;
                    self.node(*value, &entry.slot.node, path, all, false);
                    path.pop();
                }
            }
            _ => {}
        }
    }

    fn owned_map(&mut self, value: TypeId, map: &'a MapNode, path: &[PathStep], all: bool) {
        if all {
            // The receiver's map was cleared: every entry is new to it.
            for entry in map.iter() {
                let change = EntryChange::Insert { id: entry.id, key: &entry.key, node: &entry.slot.node };
                self.out.push(PrivateItem::Owned { path: path.to_vec(), map_value: value, change });
            }
            return;
        }
        for t in map.tombstones.iter().rev() {
            if t.removed <= self.from {
                break;
            }
            if t.created <= self.from {
                let change = EntryChange::Remove { id: t.id, key: &t.key };
                self.out.push(PrivateItem::Owned { path: path.to_vec(), map_value: value, change });
            }
        }
        for entry in map.changed_since(self.from) {
            let (id, key, node) = (entry.id, &entry.key, &entry.slot.node);
            let change = if entry.created > self.from {
                EntryChange::Insert { id, key, node }
            } else if entry.slot.set > self.from {
                EntryChange::Set { id, key, node }
            } else {
                EntryChange::Patch { id, key, node }
            };
            self.out.push(PrivateItem::Owned { path: path.to_vec(), map_value: value, change });
        }
    }
}

/// Writes one private item as its own root patch: the path is entered step by step, `op` writes
/// the change, and the path is left again.
pub(crate) fn write_rooted<E: Emit>(
    schema: &Schema,
    e: &mut E,
    root_ty: TypeId,
    path: &[PathStep],
    op: impl FnOnce(&mut E, TypeId),
) {
    let mut ty = root_ty;
    let mut marks = Vec::with_capacity(path.len());
    for step in path {
        match (step, &schema.node(ty).kind) {
            (PathStep::Field(i), Kind::Struct(fields)) => {
                let field = &fields[*i as usize];
                marks.push(e.enter_field(*i, &field.name));
                ty = field.ty;
            }
            (PathStep::Item(i), Kind::List(item)) => {
                e.list_header(None);
                marks.push(e.enter_item(*i));
                ty = *item;
            }
            (PathStep::Entry { id, key, .. }, Kind::Map { value, .. }) => {
                marks.push(e.enter_entry(*id, key));
                ty = *value;
            }
            _ => unreachable!("private paths are built from the schema"),
        }
    }
    op(e, ty);
    for (step, mark) in path.iter().zip(marks).rev() {
        match step {
            PathStep::Field(_) => e.leave_field(mark),
            PathStep::Item(_) => e.leave_item(mark),
            PathStep::Entry { .. } => e.leave_entry(mark),
        }
    }
    e.end_patch();
}

/// Writes the patch of an owned entry (`Patch` changes) in owned mode.
pub(crate) fn owned_patch<E: Emit>(schema: &Schema, e: &mut E, ty: TypeId, node: &Node, from: Version) {
    let mut w = Walker { schema, e, from, mask: None };
    w.node(ty, node, Mode::Owned, false);
}
