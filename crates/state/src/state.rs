//! `State`: one room's or channel's state tree and its write API.
//!
//! Writes are recorded as they happen: each one stamps the slots along its path with the pending
//! version, so several writes in one tick coalesce, and `seal()` ends the tick by bumping the
//! version if anything changed. Every write is checked against the schema and the current tree
//! before anything is touched, so a rejected write changes nothing, not even the version.

use std::sync::Arc;

use crate::error::StateError;
use crate::schema::{Kind, ROOT, Schema, TypeId};
use crate::tree::{ListNode, Node, Slot, Version, key_fits};
use crate::value::{Key, Value};

/// One step of a path into the tree: a struct field index, a map key, or a list index.
#[derive(Clone, Copy, Debug)]
pub enum Step<'a> {
    Field(u16),
    Key(&'a Key),
    Index(u32),
}

/// How much removal history a state keeps for lagging subscribers, and how large its
/// containers may grow.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Tombstones kept per map; older removals force lagging subscribers onto a snapshot.
    pub max_tombstones: usize,
    /// Versions of removal history kept.
    pub history: u64,
    /// Items one list, or entries one map, may hold; a write past it is refused
    /// ([`StateError::TooLong`]) and changes nothing.
    pub max_len: usize,
    /// About how many bytes the whole state may hold (see [`State::bytes`]); a write past it
    /// is refused ([`StateError::TooBig`]) and changes nothing.
    pub max_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_tombstones: 1024, history: 1200, max_len: usize::MAX, max_bytes: usize::MAX }
    }
}

/// Refuses a value holding a list or map longer than `max`, at any depth.
fn check_lengths(value: &Value, max: usize) -> Result<(), StateError> {
    let (len, children): (usize, Box<dyn Iterator<Item = &Value>>) = match value {
        Value::List(items) => (items.len(), Box::new(items.iter())),
        Value::Map(entries) => (entries.len(), Box::new(entries.values())),
        Value::Struct(fields) => (0, Box::new(fields.iter())),
        _ => return Ok(()),
    };
    if len > max {
        return Err(StateError::TooLong { len, max });
    }
    children.into_iter().try_for_each(|v| check_lengths(v, max))
}

/// A state of `bytes` going down by `minus` and up by `plus`: its new size, unless that grows it
/// past `max`.
fn resized(bytes: usize, max: usize, minus: usize, plus: usize) -> Result<usize, StateError> {
    let new = (bytes - minus).saturating_add(plus);
    if plus > minus && new > max {
        return Err(StateError::TooBig { bytes: new, max });
    }
    Ok(new)
}

/// A versioned state tree.
pub struct State {
    pub(crate) schema: Arc<Schema>,
    pub(crate) root: Slot,
    pub(crate) version: Version,
    dirty: bool,
    /// Deltas can be produced from this version on.
    pub(crate) floor: Version,
    limits: Limits,
    /// The root's [`Node::weight`], kept up to date by every write.
    bytes: usize,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").field("version", &self.version).field("dirty", &self.dirty).finish()
    }
}

/// What the last step of a path addresses.
enum Target {
    /// A slot (struct field, list item, or existing map entry); its type.
    Slot(TypeId),
    /// A key absent from its map; the map's value type.
    Absent(TypeId),
}

impl State {
    pub fn new(schema: Arc<Schema>) -> State {
        State::with_limits(schema, Limits::default())
    }

    pub fn with_limits(schema: Arc<Schema>, limits: Limits) -> State {
        let root = Node::from_value(&schema, ROOT, schema.default_value(ROOT), 0)
            .expect("a schema's default value fits the schema");
        let bytes = root.weight();
        State { schema, root: Slot::new(root, 0), version: 0, dirty: false, floor: 0, limits, bytes }
    }

    /// About how many bytes the state holds: strings and byte strings at their length, every
    /// number, key, list item and map entry at 8. What [`Limits::max_bytes`] bounds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Checks that the state may go from its size by `minus` and `plus` bytes, and returns the
    /// new size.
    fn resize(&self, minus: usize, plus: usize) -> Result<usize, StateError> {
        resized(self.bytes, self.limits.max_bytes, minus, plus)
    }

    /// The weight of the slot at a checked `path`.
    fn weight_at(&self, path: &[Step<'_>]) -> usize {
        let mut slot = &self.root;
        for (i, step) in path.iter().enumerate() {
            match step_into(slot, step, i) {
                Ok(next) => slot = next,
                Err(_) => return 0,
            }
        }
        slot.node.weight()
    }

    pub fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    /// The last sealed version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The oldest version a delta can still be produced from; older subscribers get a snapshot.
    pub fn floor(&self) -> Version {
        self.floor
    }

    /// True when writes were made since the last `seal`.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Ends the tick: if anything changed, the version goes up by one. Returns the version.
    pub fn seal(&mut self) -> Version {
        if self.dirty {
            self.version += 1;
            self.dirty = false;
        }
        self.version
    }

    fn pending(&mut self) -> Version {
        self.dirty = true;
        self.version + 1
    }

    /// [`State::set`] with the value as JSON text, in the JSON codec's form (a struct is an
    /// object of its fields, missing ones default; docs/protocol.md section 12), read straight
    /// into the type at `path`. Cheaper than a one-op [`crate::Patch`]: nothing is built but the
    /// value.
    pub fn set_json(&mut self, path: &[Step<'_>], json: &str) -> Result<(), StateError> {
        let (Target::Slot(ty) | Target::Absent(ty)) = self.check(path)?;
        let value = crate::json_value::from_json_str(&self.schema, ty, json).map_err(StateError::Json)?;
        self.set(path, value)
    }

    /// Sets the value at `path`: a struct field, a list item, or a map entry (inserted if absent).
    /// Only the parts that differ from the value held there are stamped, so subscribers receive
    /// those; a set of the value already held leaves the state as it was (not dirty).
    pub fn set(&mut self, path: &[Step<'_>], value: Value) -> Result<(), StateError> {
        let (last, parent) = path.split_last().ok_or(StateError::EmptyPath)?;
        let target = self.check(path)?;
        check_lengths(&value, self.limits.max_len)?;
        let v = self.version + 1;
        match (target, last) {
            (Target::Absent(ty), Step::Key(key)) => {
                let len = self.len(parent)?;
                if len >= self.limits.max_len {
                    return Err(StateError::TooLong { len: len + 1, max: self.limits.max_len });
                }
                let node = Node::from_value(&self.schema, ty, value, v)?;
                self.bytes = self.resize(0, node.weight() + crate::tree::key_weight(key))?;
                let v = self.pending();
                let slot = descend(&mut self.root, parent, v)?;
                let Node::Map(map) = &mut slot.node else { return Err(StateError::WrongTarget("map")) };
                map.put((*key).clone(), node, v);
            }
            (Target::Absent(_), _) => return Err(StateError::WrongTarget("map key")),
            (Target::Slot(ty), _) => {
                let node = Node::from_value(&self.schema, ty, value, v)?;
                let (held, max) = (self.bytes, self.limits.max_bytes);
                let slot = find_mut(&mut self.root, path)?;
                let bytes = resized(held, max, slot.node.weight(), node.weight())?;
                // Only what differs is stamped, and the path to it; a write that changes
                // nothing leaves the state as it was, not dirty.
                if !slot.assign(node, v) {
                    return Ok(());
                }
                self.bytes = bytes;
                let v = self.pending();
                descend(&mut self.root, path, v)?;
            }
        }
        Ok(())
    }

    /// Removes a map entry. Returns false, and changes nothing, if it was not there.
    pub fn remove(&mut self, path: &[Step<'_>]) -> Result<bool, StateError> {
        let (last, parent) = path.split_last().ok_or(StateError::EmptyPath)?;
        let Step::Key(key) = last else { return Err(StateError::WrongTarget("map key")) };
        if let Target::Absent(_) = self.check(path)? {
            return Ok(false);
        }
        self.bytes = self.resize(self.weight_at(path) + crate::tree::key_weight(key), 0)?;
        let v = self.pending();
        let limits = self.limits;
        let slot = descend(&mut self.root, parent, v)?;
        let Node::Map(map) = &mut slot.node else { return Err(StateError::WrongTarget("map")) };
        map.remove(key, v);
        let dropped = map.prune(limits.max_tombstones, v.saturating_sub(limits.history));
        self.floor = self.floor.max(dropped);
        Ok(true)
    }

    /// Appends to the list at `path`.
    pub fn push(&mut self, path: &[Step<'_>], value: Value) -> Result<(), StateError> {
        let item = self.list_item_type(path)?;
        check_lengths(&value, self.limits.max_len)?;
        let len = self.len(path)?;
        if len >= self.limits.max_len {
            return Err(StateError::TooLong { len: len + 1, max: self.limits.max_len });
        }
        let node = Node::from_value(&self.schema, item, value, self.version + 1)?;
        self.bytes = self.resize(0, node.weight())?;
        let v = self.pending();
        let slot = descend(&mut self.root, path, v)?;
        let Node::List(list) = &mut slot.node else { return Err(StateError::WrongTarget("list")) };
        list.items.push(Slot::new(node, v));
        list.grown = v;
        Ok(())
    }

    /// Shortens the list at `path` to `len` items; a no-op if it is not longer. Subscribers
    /// receive the list whole.
    pub fn truncate(&mut self, path: &[Step<'_>], len: usize) -> Result<(), StateError> {
        self.list_item_type(path)?;
        if self.len(path)? <= len {
            return Ok(());
        }
        let v = self.pending();
        let slot = descend(&mut self.root, path, v)?;
        slot.set = v;
        if let Node::List(list) = &mut slot.node {
            let dropped: usize = list.items[len..].iter().map(|i| i.node.weight()).sum();
            list.items.truncate(len);
            self.bytes -= dropped;
        }
        Ok(())
    }

    /// Replaces the list at `path` with its newest `cap` items (a capped log).
    pub fn cap_list(&mut self, path: &[Step<'_>], cap: usize) -> Result<(), StateError> {
        self.list_item_type(path)?;
        let len = self.len(path)?;
        if len <= cap {
            return Ok(());
        }
        let v = self.pending();
        let slot = descend(&mut self.root, path, v)?;
        slot.set = v;
        if let Node::List(list) = &mut slot.node {
            let dropped: usize = list.items.drain(..len - cap).map(|i| i.node.weight()).sum();
            list.grown = v;
            self.bytes -= dropped;
        }
        Ok(())
    }

    /// The value at `path`, as the server sees it (server-only fields included).
    pub fn get(&self, path: &[Step<'_>]) -> Result<Value, StateError> {
        let mut slot = &self.root;
        for (i, step) in path.iter().enumerate() {
            slot = step_into(slot, step, i)?;
        }
        Ok(slot.node.to_value())
    }

    /// The number of items in the list or entries in the map at `path`.
    pub fn len(&self, path: &[Step<'_>]) -> Result<usize, StateError> {
        let mut slot = &self.root;
        for (i, step) in path.iter().enumerate() {
            slot = step_into(slot, step, i)?;
        }
        match &slot.node {
            Node::List(list) => Ok(list.items.len()),
            Node::Map(map) => Ok(map.len()),
            _ => Err(StateError::WrongTarget("list or map")),
        }
    }

    fn list_item_type(&self, path: &[Step<'_>]) -> Result<TypeId, StateError> {
        match self.check(path)? {
            Target::Slot(ty) => match self.schema.node(ty).kind {
                Kind::List(item) => Ok(item),
                _ => Err(StateError::WrongTarget("list")),
            },
            Target::Absent(_) => Err(StateError::NoKey { step: path.len() - 1, key: "(absent)".into() }),
        }
    }

    /// Walks `path` without touching anything: every step must exist, except that the last step
    /// may name an absent map key.
    fn check(&self, path: &[Step<'_>]) -> Result<Target, StateError> {
        let mut slot = &self.root;
        let mut ty = ROOT;
        for (i, step) in path.iter().enumerate() {
            let kind = &self.schema.node(ty).kind;
            match (kind, step) {
                (Kind::Struct(fields), Step::Field(f)) => {
                    ty = fields.get(*f as usize).ok_or(StateError::NoField { step: i, field: *f })?.ty;
                }
                (Kind::List(item), Step::Index(_)) => ty = *item,
                (Kind::Map { key: kk, value }, Step::Key(key)) => {
                    if !key_fits(*kk, key) {
                        return Err(StateError::WrongStep {
                            step: i,
                            expected: "a key of the map's key type",
                        });
                    }
                    let Node::Map(map) = &slot.node else { unreachable!("tree follows schema") };
                    if i + 1 == path.len() && map.get(key).is_none() {
                        return Ok(Target::Absent(*value));
                    }
                    ty = *value;
                }
                (Kind::Struct(_), _) => return Err(StateError::WrongStep { step: i, expected: "a field" }),
                (Kind::List(_), _) => return Err(StateError::WrongStep { step: i, expected: "an index" }),
                (Kind::Map { .. }, _) => return Err(StateError::WrongStep { step: i, expected: "a key" }),
                _ => return Err(StateError::WrongStep { step: i, expected: "the end of the path" }),
            }
            slot = step_into(slot, step, i)?;
        }
        Ok(Target::Slot(ty))
    }
}

fn step_into<'s>(slot: &'s Slot, step: &Step<'_>, i: usize) -> Result<&'s Slot, StateError> {
    match (&slot.node, step) {
        (Node::Struct(fields), Step::Field(f)) => {
            fields.get(*f as usize).ok_or(StateError::NoField { step: i, field: *f })
        }
        (Node::List(ListNode { items, .. }), Step::Index(ix)) => {
            items.get(*ix as usize).ok_or(StateError::NoIndex { step: i, index: *ix, len: items.len() })
        }
        (Node::Map(map), Step::Key(k)) => {
            map.get(k).map(|e| &e.slot).ok_or_else(|| StateError::NoKey { step: i, key: k.to_string() })
        }
        _ => Err(StateError::WrongStep { step: i, expected: "a step that fits the tree" }),
    }
}

/// Follows a checked `path` without stamping anything.
fn find_mut<'s>(root: &'s mut Slot, path: &[Step<'_>]) -> Result<&'s mut Slot, StateError> {
    path.iter().enumerate().try_fold(root, |slot, (i, step)| step_mut(slot, step, i, None))
}

/// Follows `path`, stamping every slot on it (and moving map entries to their map's most-recent
/// end). Callers check the path first, so this does not fail on a checked path.
fn descend<'s>(root: &'s mut Slot, path: &[Step<'_>], v: Version) -> Result<&'s mut Slot, StateError> {
    root.changed = v;
    path.iter().enumerate().try_fold(root, |slot, (i, step)| {
        let next = step_mut(slot, step, i, Some(v))?;
        next.changed = v;
        Ok(next)
    })
}

/// One step down from `slot`; a map entry stepped into is moved to its map's most-recent end
/// when `touch` gives the version it changed at.
fn step_mut<'s>(
    slot: &'s mut Slot,
    step: &Step<'_>,
    i: usize,
    touch: Option<Version>,
) -> Result<&'s mut Slot, StateError> {
    match (&mut slot.node, step) {
        (Node::Struct(fields), Step::Field(f)) => {
            fields.get_mut(*f as usize).ok_or(StateError::NoField { step: i, field: *f })
        }
        (Node::List(list), Step::Index(ix)) => {
            let len = list.items.len();
            list.items.get_mut(*ix as usize).ok_or(StateError::NoIndex { step: i, index: *ix, len })
        }
        (Node::Map(map), Step::Key(k)) => match touch {
            Some(v) => map.touch(k, v),
            None => map.get_mut(k),
        }
        .ok_or_else(|| StateError::NoKey { step: i, key: k.to_string() }),
        _ => Err(StateError::WrongStep { step: i, expected: "a step that fits the tree" }),
    }
}
