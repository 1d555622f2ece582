//! The binary update decoder: the format of `docs/protocol.md`, "State deltas".

use std::cell::{Cell, RefCell};

use bytes::Bytes;
use hashbrown::HashSet;

use super::{Header, RMap, RNode, default_node};
use crate::encode::binary::{
    ENTRY_INSERT, ENTRY_PATCH, ENTRY_REMOVE, ENTRY_SET, FIELD_CLEAR, FIELD_PATCH, FIELD_SET, ITEM_PATCH,
    ITEM_SET, KIND_DELTA, KIND_SNAPSHOT, unzigzag,
};
use crate::error::DecodeError;
use crate::schema::{KeyKind, Kind, ROOT, Schema, TypeId};
use crate::value::{Key, Quant};

pub(super) fn header(update: &[u8]) -> Result<(Header, Reader<'_>), DecodeError> {
    let mut r = Reader { buf: update };
    let kind = r.u8("update header")?;
    let from = r.varint("update header")?;
    let to = r.varint("update header")?;
    let snapshot = match kind {
        KIND_SNAPSHOT => true,
        KIND_DELTA => false,
        other => return Err(DecodeError::UnknownKind(other)),
    };
    Ok((Header { snapshot, from, to }, r))
}

/// Applies the patches that follow the header, up to the end of the update. Returns the
/// entries of outermost maps it wrote if `count` ([`super::Replica::entries_applied`]), else 0.
pub(super) fn apply(
    schema: &Schema,
    root: &mut RNode,
    r: &mut Reader<'_>,
    count: bool,
) -> Result<u64, DecodeError> {
    let d = Decoder { schema, entries: Cell::new(0), seen: RefCell::new(HashSet::new()) };
    while !r.buf.is_empty() {
        if count {
            d.patch(ROOT, root, Path(0), r)?;
        } else {
            d.patch(ROOT, root, Uncounted, r)?;
        }
    }
    Ok(d.entries.get())
}

pub(super) struct Reader<'a> {
    buf: &'a [u8],
}

impl Reader<'_> {
    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        let (&b, rest) = self.buf.split_first().ok_or(DecodeError::Truncated(what))?;
        self.buf = rest;
        Ok(b)
    }

    fn varint(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        prost::encoding::decode_varint(&mut self.buf).map_err(|_| DecodeError::BadVarint(what))
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&[u8], DecodeError> {
        if n > self.buf.len() as u64 {
            return Err(DecodeError::Truncated(what));
        }
        let (head, rest) = self.buf.split_at(n as usize);
        self.buf = rest;
        Ok(head)
    }

    /// A count of items that each take at least one byte.
    fn count(&mut self, what: &'static str) -> Result<usize, DecodeError> {
        let n = self.varint(what)?;
        if n > self.buf.len() as u64 {
            return Err(DecodeError::BadLength(n));
        }
        Ok(n as usize)
    }
}

/// The methods that decode a node take `at`: where the node is, as far as counting entries goes
/// ([`Place`]).
struct Decoder<'s> {
    schema: &'s Schema,
    /// Entries of outermost maps counted so far.
    entries: Cell<u64>,
    /// The entries counted so far, by the path to their map and key: each counts once per
    /// update, however the update reaches it (removed and inserted again under a new id,
    /// written in two segments, or in a map written whole and then patched).
    seen: RefCell<HashSet<(u64, Key)>>,
}

/// Where the decoder is: a [`Path`] from the root while entries are counted, [`Uncounted`]
/// when they are not, or inside a map's entry (a map there is not outermost). A type, not a
/// flag, so that a replica that does not count decodes as if counting did not exist.
trait Place: Copy {
    /// One step below: struct field `i` (`step(2 * i)`) or list item `i` (`step(2 * i + 1)`).
    fn step(self, i: u64) -> Self;
    /// The map here, if its entries are counted.
    fn map(self) -> Option<u64>;
}

#[derive(Clone, Copy)]
struct Uncounted;

impl Place for Uncounted {
    fn step(self, _: u64) -> Self {
        self
    }
    fn map(self) -> Option<u64> {
        None
    }
}

/// The path from the root, hashed: names a map whether the update patches it or writes it
/// whole.
#[derive(Clone, Copy)]
struct Path(u64);

impl Place for Path {
    fn step(self, i: u64) -> Self {
        // SplitMix64's finalizer over the parent's path and the step.
        let mut z = self.0.rotate_left(5) ^ i.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Path(z ^ (z >> 31))
    }
    fn map(self) -> Option<u64> {
        Some(self.0)
    }
}

impl Decoder<'_> {
    /// Counts the entry `key` of the map at `at`, once per update.
    fn count(&self, at: impl Place, key: &Key) {
        if let Some(at) = at.map()
            && self.seen.borrow_mut().insert((at, key.clone()))
        {
            self.entries.set(self.entries.get() + 1);
        }
    }

    /// Patches `node`, of type `ty`, at path `at`.
    fn patch<P: Place>(
        &self,
        ty: TypeId,
        node: &mut RNode,
        at: P,
        r: &mut Reader<'_>,
    ) -> Result<(), DecodeError> {
        match (&self.schema.node(ty).kind, node) {
            (Kind::Struct(_), RNode::Struct(fields)) => self.struct_patch(ty, fields, at, r),
            (Kind::List(item), RNode::List(items)) => self.list_patch(*item, items, at, r),
            (Kind::Map { key, value }, RNode::Map(map)) => self.map_patch(*key, *value, map, at, r),
            _ => Err(DecodeError::BadOp { op: u64::from(FIELD_PATCH as u8), what: "a scalar" }),
        }
    }

    fn struct_patch<P: Place>(
        &self,
        ty: TypeId,
        fields: &mut [RNode],
        at: P,
        r: &mut Reader<'_>,
    ) -> Result<(), DecodeError> {
        let decl = self.schema.fields(ty);
        loop {
            let tag = r.varint("struct patch")?;
            if tag == 0 {
                return Ok(());
            }
            let (index, op) = ((tag - 1) >> 2, (tag - 1) & 3);
            let field = decl.get(index as usize).ok_or(DecodeError::NoField(index))?;
            let slot = &mut fields[index as usize];
            let at = at.step(2 * index);
            match op {
                FIELD_SET => *slot = self.value(field.ty, at, r)?,
                FIELD_PATCH => self.patch(field.ty, slot, at, r)?,
                FIELD_CLEAR => *slot = default_node(self.schema, field.ty),
                _ => return Err(DecodeError::BadOp { op, what: "a struct field" }),
            }
        }
    }

    fn list_patch<P: Place>(
        &self,
        item: TypeId,
        items: &mut Vec<RNode>,
        at: P,
        r: &mut Reader<'_>,
    ) -> Result<(), DecodeError> {
        let header = r.varint("list patch")?;
        if header > 0 {
            let new_len = header - 1;
            // A list only grows in a patch, and each new item is set below (>= 1 byte each).
            if new_len < items.len() as u64 || new_len - items.len() as u64 > r.buf.len() as u64 {
                return Err(DecodeError::BadLength(new_len));
            }
            items.resize(new_len as usize, default_node(self.schema, item));
        }
        loop {
            let tag = r.varint("list patch")?;
            if tag == 0 {
                return Ok(());
            }
            let (index, op) = ((tag - 1) >> 1, (tag - 1) & 1);
            let len = items.len();
            let slot = items.get_mut(index as usize).ok_or(DecodeError::BadIndex { index, len })?;
            let at = at.step(2 * index + 1);
            match op {
                ITEM_SET => *slot = self.value(item, at, r)?,
                ITEM_PATCH => self.patch(item, slot, at, r)?,
                _ => unreachable!("op is one bit"),
            }
        }
    }

    fn map_patch<P: Place>(
        &self,
        kind: KeyKind,
        value: TypeId,
        map: &mut RMap,
        at: P,
        r: &mut Reader<'_>,
    ) -> Result<(), DecodeError> {
        loop {
            let tag = r.varint("map patch")?;
            if tag == 0 {
                return Ok(());
            }
            let (id, op) = ((tag - 1) >> 2, (tag - 1) & 3);
            let id = u32::try_from(id).map_err(|_| DecodeError::UnknownId(id))?;
            let unknown = || DecodeError::UnknownId(u64::from(id));
            // An entry's value holds no outermost map.
            match op {
                ENTRY_INSERT => {
                    let key = self.key(kind, r)?;
                    let node = self.value(value, Uncounted, r)?;
                    if map.ids.contains_key(&id) || map.entries.contains_key(&key) {
                        return Err(DecodeError::DuplicateEntry(u64::from(id)));
                    }
                    self.count(at, &key);
                    map.ids.insert(id, key.clone());
                    map.entries.insert(key, node);
                }
                ENTRY_PATCH => {
                    let key = map.ids.get(&id).ok_or_else(unknown)?;
                    self.count(at, key);
                    let node = map.entries.get_mut(key).expect("ids and entries agree");
                    self.patch(value, node, Uncounted, r)?;
                }
                ENTRY_REMOVE => {
                    let key = map.ids.remove(&id).ok_or_else(unknown)?;
                    self.count(at, &key);
                    map.entries.remove(&key);
                }
                ENTRY_SET => {
                    let key = map.ids.get(&id).ok_or_else(unknown)?.clone();
                    self.count(at, &key);
                    let node = self.value(value, Uncounted, r)?;
                    map.entries.insert(key, node);
                }
                _ => unreachable!("op is two bits"),
            }
        }
    }

    fn key(&self, kind: KeyKind, r: &mut Reader<'_>) -> Result<Key, DecodeError> {
        Ok(match kind {
            KeyKind::Int => Key::Int(unzigzag(r.varint("map key")?)),
            KeyKind::String => {
                let len = r.varint("map key")?;
                let bytes = r.take(len, "map key")?;
                Key::str(std::str::from_utf8(bytes).map_err(|_| DecodeError::BadUtf8)?)
            }
        })
    }

    fn value<P: Place>(&self, ty: TypeId, at: P, r: &mut Reader<'_>) -> Result<RNode, DecodeError> {
        Ok(match &self.schema.node(ty).kind {
            Kind::Int => RNode::Int(unzigzag(r.varint("int")?)),
            Kind::Float(q) => RNode::Float(float(*q, r)?),
            Kind::Bool => match r.u8("bool")? {
                0 => RNode::Bool(false),
                1 => RNode::Bool(true),
                b => return Err(DecodeError::BadBool(b)),
            },
            Kind::Str => {
                let len = r.varint("string")?;
                let bytes = r.take(len, "string")?;
                RNode::Str(std::str::from_utf8(bytes).map_err(|_| DecodeError::BadUtf8)?.to_owned())
            }
            Kind::Bytes => {
                let len = r.varint("bytes")?;
                RNode::Bytes(Bytes::copy_from_slice(r.take(len, "bytes")?))
            }
            Kind::Vec3(q) => RNode::Vec3([float(*q, r)?, float(*q, r)?, float(*q, r)?]),
            Kind::Struct(_) => {
                let mut node = default_node(self.schema, ty);
                let RNode::Struct(fields) = &mut node else { unreachable!("default of a struct") };
                self.struct_patch(ty, fields, at, r)?;
                node
            }
            Kind::List(item) => {
                let n = r.count("list")?;
                let mut items = Vec::with_capacity(n);
                for i in 0..n as u64 {
                    items.push(self.value(*item, at.step(2 * i + 1), r)?);
                }
                RNode::List(items)
            }
            Kind::Map { key, value } => {
                let mut map = RMap::default();
                self.map_patch(*key, *value, &mut map, at, r)?;
                RNode::Map(map)
            }
        })
    }
}

fn float(q: Option<Quant>, r: &mut Reader<'_>) -> Result<f64, DecodeError> {
    match q {
        Some(q) => {
            let steps = r.varint("quantized float")?;
            if steps > q.max_steps() {
                return Err(DecodeError::BadQuant(steps));
            }
            Ok(q.dequantize(steps))
        }
        None => {
            let bytes = r.take(8, "float")?;
            Ok(f64::from_le_bytes(bytes.try_into().expect("took 8 bytes")))
        }
    }
}
