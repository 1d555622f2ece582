//! The versioned state tree: values plus the stamps that make dirty tracking key-level.
//!
//! Every slot (a struct field, a list item, a map entry's value) records two versions: `changed`,
//! the last version at which it or anything below it changed, and `set`, the last version at
//! which it was replaced whole. Maps keep their entries in a linked list ordered by `changed`, and
//! tombstones for removed entries ordered by removal. So "everything that changed since version v"
//! is found by walking only the changed paths, from any v, without snapshots, diffs between
//! states or per-tick change logs: a lagging subscriber's merged delta comes from the same walk
//! as everyone's. A write compares only the value it writes with the one it replaces
//! ([`Slot::assign`]), so that what it did not change keeps its stamps.

use std::collections::VecDeque;

use bytes::Bytes;
use hashbrown::HashMap;

use crate::error::StateError;
use crate::schema::{Kind, Schema, TypeId};
use crate::value::{Key, Value};

/// A state version. Version 0 is the all-defaults state every replica starts from.
pub type Version = u64;

#[derive(Debug)]
pub(crate) struct Slot {
    pub changed: Version,
    pub set: Version,
    pub node: Node,
}

impl Slot {
    pub fn new(node: Node, v: Version) -> Slot {
        Slot { changed: v, set: v, node }
    }

    /// Makes this slot hold `new`, stamping at `v` only what differs: a scalar that differs is
    /// replaced, a struct (or a list of the same length, or a map with the same keys) is
    /// assigned part by part, anything else is replaced whole. So a delta carries what a write
    /// changed, not all it wrote. Returns whether anything differed; if nothing did, nothing is
    /// stamped.
    pub fn assign(&mut self, new: Node, v: Version) -> bool {
        let changed = match (&mut self.node, new) {
            (Node::Struct(old), Node::Struct(new)) if old.len() == new.len() => {
                assign_all(old.iter_mut(), new.into_vec().into_iter().map(|s| s.node), v)
            }
            (Node::List(old), Node::List(new)) if old.items.len() == new.items.len() => {
                assign_all(old.items.iter_mut(), new.items.into_iter().map(|s| s.node), v)
            }
            (Node::Map(old), Node::Map(new)) if old.same_keys(&new) => old.assign_entries(*new, v),
            (old, new) => {
                if old.same_scalar(&new) {
                    return false;
                }
                *self = Slot::new(new, v);
                return true;
            }
        };
        if changed {
            self.changed = v;
        }
        changed
    }
}

/// Assigns each new node to its slot; whether any differed.
fn assign_all<'a>(
    slots: impl Iterator<Item = &'a mut Slot>,
    new: impl Iterator<Item = Node>,
    v: Version,
) -> bool {
    slots.zip(new).fold(false, |any, (slot, node)| slot.assign(node, v) | any)
}

#[derive(Debug)]
pub(crate) enum Node {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(Box<str>),
    Bytes(Bytes),
    Vec3([f64; 3]),
    Struct(Box<[Slot]>),
    List(ListNode),
    Map(Box<MapNode>),
}

/// What one scalar, key, item or entry counts for in [`Node::weight`], besides its bytes.
const SCALAR_WEIGHT: usize = 8;

impl Node {
    /// True when both are the same scalar value (floats and vectors compared bit for bit, so a
    /// NaN equals itself); false for any container.
    fn same_scalar(&self, other: &Node) -> bool {
        match (self, other) {
            (Node::Int(a), Node::Int(b)) => a == b,
            (Node::Float(a), Node::Float(b)) => a.to_bits() == b.to_bits(),
            (Node::Bool(a), Node::Bool(b)) => a == b,
            (Node::Str(a), Node::Str(b)) => a == b,
            (Node::Bytes(a), Node::Bytes(b)) => a == b,
            (Node::Vec3(a), Node::Vec3(b)) => a.map(f64::to_bits) == b.map(f64::to_bits),
            _ => false,
        }
    }

    /// About how many bytes this value takes in a snapshot: strings and byte strings at their
    /// length, and every number, key, item and entry at 8. An estimate kept cheap on purpose,
    /// always at least the encoded size's order of magnitude; [`crate::Limits::max_bytes`]
    /// bounds it.
    pub fn weight(&self) -> usize {
        match self {
            Node::Int(_) | Node::Float(_) | Node::Bool(_) => SCALAR_WEIGHT,
            Node::Str(s) => SCALAR_WEIGHT + s.len(),
            Node::Bytes(b) => SCALAR_WEIGHT + b.len(),
            Node::Vec3(_) => 3 * SCALAR_WEIGHT,
            Node::Struct(fields) => fields.iter().map(|f| f.node.weight()).sum(),
            Node::List(list) => SCALAR_WEIGHT + list.items.iter().map(|i| i.node.weight()).sum::<usize>(),
            Node::Map(map) => {
                SCALAR_WEIGHT + map.iter().map(|e| key_weight(&e.key) + e.slot.node.weight()).sum::<usize>()
            }
        }
    }
}

/// A map key's part of [`Node::weight`].
pub(crate) fn key_weight(key: &Key) -> usize {
    match key {
        Key::Int(_) => SCALAR_WEIGHT,
        Key::Str(s) => SCALAR_WEIGHT + s.len(),
    }
}

#[derive(Debug, Default)]
pub(crate) struct ListNode {
    pub items: Vec<Slot>,
    /// The last version at which the list grew. (Shrinking replaces the list whole.)
    pub grown: Version,
}

const NIL: u32 = u32::MAX;

#[derive(Debug)]
pub(crate) struct Entry {
    pub key: Key,
    /// The key's interned id: assigned at insert, never reused within this map.
    pub id: u32,
    pub created: Version,
    pub slot: Slot,
    prev: u32,
    next: u32,
}

#[derive(Debug, Clone)]
pub(crate) struct Tombstone {
    pub key: Key,
    pub id: u32,
    pub created: Version,
    pub removed: Version,
}

/// A map with O(1) lookup, O(1) "move to most recently changed", and in-order iteration of the
/// entries changed since any version.
#[derive(Debug, Default)]
pub(crate) struct MapNode {
    slab: Vec<Option<Entry>>,
    free: Vec<u32>,
    index: HashMap<Key, u32>,
    /// Least recently changed entry.
    head: Option<u32>,
    /// Most recently changed entry.
    tail: Option<u32>,
    pub tombstones: VecDeque<Tombstone>,
    next_id: u32,
}

impl MapNode {
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn get(&self, key: &Key) -> Option<&Entry> {
        self.index.get(key).map(|&i| self.entry(i))
    }

    fn entry(&self, i: u32) -> &Entry {
        self.slab[i as usize].as_ref().expect("linked slab index is live")
    }

    fn entry_mut(&mut self, i: u32) -> &mut Entry {
        self.slab[i as usize].as_mut().expect("linked slab index is live")
    }

    /// `key`'s slot, left where it is in the change order and unstamped.
    pub fn get_mut(&mut self, key: &Key) -> Option<&mut Slot> {
        let i = *self.index.get(key)?;
        Some(&mut self.entry_mut(i).slot)
    }

    /// Marks `key`'s entry changed at `v` (moving it to the tail) and returns its slot.
    pub fn touch(&mut self, key: &Key, v: Version) -> Option<&mut Slot> {
        let i = *self.index.get(key)?;
        Some(self.touch_at(i, v))
    }

    /// [`MapNode::touch`] for the entry at slab index `i`.
    fn touch_at(&mut self, i: u32, v: Version) -> &mut Slot {
        self.unlink(i);
        self.link_tail(i);
        let e = self.entry_mut(i);
        e.slot.changed = v;
        &mut e.slot
    }

    /// Inserts or replaces `key`'s value at version `v`.
    pub fn put(&mut self, key: Key, node: Node, v: Version) {
        if let Some(slot) = self.touch(&key, v) {
            *slot = Slot::new(node, v);
            return;
        }
        let entry = Entry {
            key: key.clone(),
            id: self.next_id,
            created: v,
            slot: Slot::new(node, v),
            prev: NIL,
            next: NIL,
        };
        self.next_id = self.next_id.wrapping_add(1);
        let i = match self.free.pop() {
            Some(i) => {
                self.slab[i as usize] = Some(entry);
                i
            }
            None => {
                self.slab.push(Some(entry));
                (self.slab.len() - 1) as u32
            }
        };
        self.index.insert(key, i);
        self.link_tail(i);
    }

    /// True when both maps hold exactly the same keys.
    fn same_keys(&self, other: &MapNode) -> bool {
        self.len() == other.len() && other.index.keys().all(|k| self.index.contains_key(k))
    }

    /// Assigns each of `new`'s values to the entry of the same key ([`Slot::assign`]), moving
    /// the entries that differed to the most-recent end. The keys must be the same
    /// ([`MapNode::same_keys`]). Whether any differed.
    fn assign_entries(&mut self, new: MapNode, v: Version) -> bool {
        let mut any = false;
        for entry in new.slab.into_iter().flatten() {
            let i = self.index[&entry.key];
            if self.entry_mut(i).slot.assign(entry.slot.node, v) {
                self.touch_at(i, v);
                any = true;
            }
        }
        any
    }

    /// Removes `key` at version `v`. An entry that existed before `v` leaves a tombstone.
    pub fn remove(&mut self, key: &Key, v: Version) -> bool {
        let Some(i) = self.index.remove(key) else { return false };
        self.unlink(i);
        let e = self.slab[i as usize].take().expect("indexed entry is live");
        self.free.push(i);
        if e.created < v {
            self.tombstones.push_back(Tombstone { key: e.key, id: e.id, created: e.created, removed: v });
        }
        true
    }

    /// Drops the oldest tombstones beyond `max` or removed at or before `horizon`; returns the
    /// newest removal version dropped (deltas from before it can no longer be produced).
    pub fn prune(&mut self, max: usize, horizon: Version) -> Version {
        let mut floor = 0;
        while let Some(t) = self.tombstones.front() {
            if self.tombstones.len() <= max && t.removed > horizon {
                break;
            }
            floor = floor.max(t.removed);
            self.tombstones.pop_front();
        }
        floor
    }

    /// Entries changed after `from`, most recent first.
    pub fn changed_since(&self, from: Version) -> ChangedSince<'_> {
        ChangedSince { map: self, at: self.tail, from }
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.slab.iter().flatten()
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next) = {
            let e = self.entry(i);
            (e.prev, e.next)
        };
        match prev {
            NIL => self.head = (next != NIL).then_some(next),
            p => self.entry_mut(p).next = next,
        }
        match next {
            NIL => self.tail = (prev != NIL).then_some(prev),
            n => self.entry_mut(n).prev = prev,
        }
        let e = self.entry_mut(i);
        e.prev = NIL;
        e.next = NIL;
    }

    fn link_tail(&mut self, i: u32) {
        let old_tail = self.tail.unwrap_or(NIL);
        {
            let e = self.entry_mut(i);
            e.prev = old_tail;
            e.next = NIL;
        }
        match old_tail {
            NIL => self.head = Some(i),
            t => self.entry_mut(t).next = i,
        }
        self.tail = Some(i);
    }
}

pub(crate) struct ChangedSince<'a> {
    map: &'a MapNode,
    at: Option<u32>,
    from: Version,
}

impl<'a> Iterator for ChangedSince<'a> {
    type Item = &'a Entry;

    fn next(&mut self) -> Option<&'a Entry> {
        let e = self.map.entry(self.at?);
        if e.slot.changed <= self.from {
            self.at = None;
            return None;
        }
        self.at = (e.prev != NIL).then_some(e.prev);
        Some(e)
    }
}

impl Node {
    /// Builds the node for `value` of type `ty`, every slot stamped `v`.
    pub fn from_value(schema: &Schema, ty: TypeId, value: Value, v: Version) -> Result<Node, StateError> {
        let mismatch = || StateError::TypeMismatch(format!("{:?}", schema.node(ty).kind));
        Ok(match (&schema.node(ty).kind, value) {
            (Kind::Int, Value::Int(i)) => Node::Int(i),
            // Quantized floats are stored as subscribers will see them.
            (Kind::Float(q), Value::Float(f)) => Node::Float(q.map_or(f, |q| q.round_trip(f))),
            (Kind::Float(q), Value::Int(i)) => Node::Float(q.map_or(i as f64, |q| q.round_trip(i as f64))),
            (Kind::Bool, Value::Bool(b)) => Node::Bool(b),
            (Kind::Str, Value::Str(s)) => Node::Str(s.into_boxed_str()),
            (Kind::Bytes, Value::Bytes(b)) => Node::Bytes(b),
            (Kind::Vec3(q), Value::Vec3(x)) => Node::Vec3(q.map_or(x, |q| x.map(|c| q.round_trip(c)))),
            (Kind::Struct(fields), Value::Struct(values)) => {
                if fields.len() != values.len() {
                    return Err(mismatch());
                }
                let slots = fields
                    .iter()
                    .zip(values)
                    .map(|(f, val)| Ok(Slot::new(Node::from_value(schema, f.ty, val, v)?, v)))
                    .collect::<Result<Box<[Slot]>, StateError>>()?;
                Node::Struct(slots)
            }
            (Kind::List(item), Value::List(values)) => {
                let items = values
                    .into_iter()
                    .map(|val| Ok(Slot::new(Node::from_value(schema, *item, val, v)?, v)))
                    .collect::<Result<Vec<Slot>, StateError>>()?;
                Node::List(ListNode { items, grown: v })
            }
            (Kind::Map { key, value }, Value::Map(entries)) => {
                let mut map = MapNode::default();
                for (k, val) in entries {
                    if !key_fits(*key, &k) {
                        return Err(mismatch());
                    }
                    map.put(k, Node::from_value(schema, *value, val, v)?, v);
                }
                Node::Map(Box::new(map))
            }
            _ => return Err(mismatch()),
        })
    }

    /// The node's full value, including server-only fields: the server's own view.
    pub fn to_value(&self) -> Value {
        match self {
            Node::Int(i) => Value::Int(*i),
            Node::Float(f) => Value::Float(*f),
            Node::Bool(b) => Value::Bool(*b),
            Node::Str(s) => Value::Str(s.to_string()),
            Node::Bytes(b) => Value::Bytes(b.clone()),
            Node::Vec3(x) => Value::Vec3(*x),
            Node::Struct(slots) => Value::Struct(slots.iter().map(|s| s.node.to_value()).collect()),
            Node::List(list) => Value::List(list.items.iter().map(|s| s.node.to_value()).collect()),
            Node::Map(map) => {
                Value::Map(map.iter().map(|e| (e.key.clone(), e.slot.node.to_value())).collect())
            }
        }
    }
}

pub(crate) fn key_fits(kind: crate::schema::KeyKind, key: &Key) -> bool {
    matches!(
        (kind, key),
        (crate::schema::KeyKind::Int, Key::Int(_)) | (crate::schema::KeyKind::String, Key::Str(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys_since(map: &MapNode, from: Version) -> Vec<Key> {
        map.changed_since(from).map(|e| e.key.clone()).collect()
    }

    #[test]
    fn change_order_and_tombstones() {
        let mut m = MapNode::default();
        m.put(Key::Int(1), Node::Int(1), 1);
        m.put(Key::Int(2), Node::Int(2), 1);
        m.put(Key::Int(3), Node::Int(3), 2);
        assert_eq!(keys_since(&m, 0), [Key::Int(3), Key::Int(2), Key::Int(1)]);
        m.touch(&Key::Int(1), 3);
        assert_eq!(keys_since(&m, 2), [Key::Int(1)]);
        assert_eq!(keys_since(&m, 1), [Key::Int(1), Key::Int(3)]);

        assert!(m.remove(&Key::Int(2), 4));
        assert!(!m.remove(&Key::Int(2), 4));
        m.put(Key::Int(5), Node::Int(5), 4);
        assert!(m.remove(&Key::Int(5), 4), "removed in the tick it was created: no tombstone");
        assert_eq!(m.tombstones.len(), 1);
        assert_eq!(m.len(), 2);

        // The freed slab slot is reused, the id is not.
        m.put(Key::Int(2), Node::Int(22), 5);
        assert_eq!(m.get(&Key::Int(2)).unwrap().id, 4);
        assert_eq!(keys_since(&m, 4), [Key::Int(2)]);

        assert_eq!(m.prune(0, 0), 4);
        assert!(m.tombstones.is_empty());
    }
}
