//! The compact binary delta format (specified in `docs/protocol.md`, "State deltas").
//!
//! Paths are field indexes from the schema, map keys are interned ids, numbers are varints and
//! quantized floats are step counts. Every patch is self-delimiting (ends in a 0 byte), so segments
//! encoded once can be concatenated, and an entry can be left out by slicing.

use std::ops::Range;

use prost::encoding::encode_varint;

use super::{Emit, Mark, Mode};
use crate::schema::{Kind, Schema, TypeId, Vis};
use crate::tree::{Node, Version};
use crate::value::Key;

pub(crate) const KIND_DELTA: u8 = 0x01;
pub(crate) const KIND_SNAPSHOT: u8 = 0x02;

pub(crate) const FIELD_SET: u64 = 0;
pub(crate) const FIELD_PATCH: u64 = 1;
pub(crate) const FIELD_CLEAR: u64 = 2;

pub(crate) const ENTRY_INSERT: u64 = 0;
pub(crate) const ENTRY_PATCH: u64 = 1;
pub(crate) const ENTRY_REMOVE: u64 = 2;
pub(crate) const ENTRY_SET: u64 = 3;

pub(crate) const ITEM_SET: u64 = 0;
pub(crate) const ITEM_PATCH: u64 = 1;

/// The update header: kind, from version, to version.
pub(crate) fn header(snapshot: bool, from: Version, to: Version) -> Vec<u8> {
    let mut out = Vec::with_capacity(12);
    out.push(if snapshot { KIND_SNAPSHOT } else { KIND_DELTA });
    encode_varint(from, &mut out);
    encode_varint(to, &mut out);
    out
}

pub(crate) struct Binary {
    pub buf: Vec<u8>,
    skips: Vec<(Key, Range<usize>)>,
}

impl Binary {
    pub fn new() -> Binary {
        Binary { buf: Vec::with_capacity(256), skips: Vec::new() }
    }

    fn tag(&mut self, index: u64, shift: u32, op: u64) {
        encode_varint(((index << shift) | op) + 1, &mut self.buf);
    }

    /// Ends a child patch, or drops it (tag included) if nothing was written into it. An empty
    /// struct or map patch has no body; an empty list patch has only its "length unchanged" 0.
    fn leave(&mut self, mark: Mark) {
        let body = &self.buf[mark..];
        let after_tag = body.iter().position(|b| b & 0x80 == 0).map_or(body.len(), |p| p + 1);
        if matches!(&body[after_tag..], [] | [0]) {
            self.buf.truncate(mark);
        } else {
            self.buf.push(0);
        }
    }

    fn key(&mut self, key: &Key) {
        match key {
            Key::Int(i) => encode_varint(zigzag(*i), &mut self.buf),
            Key::Str(s) => {
                encode_varint(s.len() as u64, &mut self.buf);
                self.buf.extend_from_slice(s.as_bytes());
            }
        }
    }

    /// A full value: scalars as themselves; a struct as a patch of SETs onto its default (default
    /// scalars left out); a list as count then items; a map as a patch of INSERTs onto empty.
    /// `keyed`: a player-keyed map, whose entries are recorded for skipping.
    fn value(&mut self, schema: &Schema, ty: TypeId, node: &Node, mode: Mode, keyed: bool) {
        match (&schema.node(ty).kind, node) {
            (Kind::Int, Node::Int(i)) => encode_varint(zigzag(*i), &mut self.buf),
            (Kind::Float(q), Node::Float(f)) => self.float(*q, *f),
            (Kind::Bool, Node::Bool(b)) => self.buf.push(u8::from(*b)),
            (Kind::Str, Node::Str(s)) => self.bytes(s.as_bytes()),
            (Kind::Bytes, Node::Bytes(b)) => self.bytes(b),
            (Kind::Vec3(q), Node::Vec3(v)) => v.iter().for_each(|x| self.float(*q, *x)),
            (Kind::Struct(fields), Node::Struct(slots)) => {
                for (i, (field, slot)) in fields.iter().zip(slots.iter()).enumerate() {
                    let visible = match field.vis {
                        Vis::Broadcast => true,
                        Vis::ServerOnly => false,
                        Vis::OwnerOnly | Vis::Custom(_) => mode == Mode::Owned,
                    };
                    if visible && !is_default(&schema.node(field.ty).kind, &slot.node) {
                        self.tag(i as u64, 2, FIELD_SET);
                        self.value(schema, field.ty, &slot.node, mode, field.player_keyed);
                    }
                }
                self.buf.push(0);
            }
            (Kind::List(item), Node::List(list)) => {
                encode_varint(list.items.len() as u64, &mut self.buf);
                for slot in &list.items {
                    self.value(schema, *item, &slot.node, mode, false);
                }
            }
            (Kind::Map { value, .. }, Node::Map(map)) => {
                for entry in map.iter() {
                    let start = self.buf.len();
                    self.tag(u64::from(entry.id), 2, ENTRY_INSERT);
                    self.key(&entry.key);
                    self.value(schema, *value, &entry.slot.node, mode, false);
                    if keyed {
                        self.skips.push((entry.key.clone(), start..self.buf.len()));
                    }
                }
                self.buf.push(0);
            }
            _ => unreachable!("the tree follows its schema"),
        }
    }

    fn float(&mut self, q: Option<crate::value::Quant>, f: f64) {
        match q {
            Some(q) => encode_varint(q.quantize(f), &mut self.buf),
            None => self.buf.extend_from_slice(&f.to_le_bytes()),
        }
    }

    fn bytes(&mut self, b: &[u8]) {
        encode_varint(b.len() as u64, &mut self.buf);
        self.buf.extend_from_slice(b);
    }
}

/// True for values the receiver's default already equals, which a full struct may leave out.
/// Quantized floats are always sent: their default is whatever 0.0 quantizes to.
fn is_default(kind: &Kind, node: &Node) -> bool {
    if matches!(kind, Kind::Float(Some(_)) | Kind::Vec3(Some(_))) {
        return false;
    }
    match node {
        Node::Int(i) => *i == 0,
        Node::Float(f) => f.to_bits() == 0,
        Node::Bool(b) => !b,
        Node::Str(s) => s.is_empty(),
        Node::Bytes(b) => b.is_empty(),
        Node::Vec3(v) => v.iter().all(|x| x.to_bits() == 0),
        Node::List(l) => l.items.is_empty(),
        Node::Map(m) => m.len() == 0,
        Node::Struct(_) => false,
    }
}

pub(crate) fn zigzag(i: i64) -> u64 {
    ((i << 1) ^ (i >> 63)) as u64
}

pub(crate) fn unzigzag(u: u64) -> i64 {
    ((u >> 1) as i64) ^ -((u & 1) as i64)
}

impl Emit for Binary {
    fn position(&self) -> usize {
        self.buf.len()
    }

    fn skips(&mut self) -> &mut Vec<(Key, Range<usize>)> {
        &mut self.skips
    }

    fn end_patch(&mut self) {
        self.buf.push(0);
    }

    fn enter_field(&mut self, index: u16, _name: &str) -> Mark {
        let mark = self.buf.len();
        self.tag(u64::from(index), 2, FIELD_PATCH);
        mark
    }

    fn leave_field(&mut self, mark: Mark) {
        self.leave(mark);
    }

    fn set_field(
        &mut self,
        schema: &Schema,
        index: u16,
        _: &str,
        ty: TypeId,
        node: &Node,
        mode: Mode,
        keyed: bool,
    ) {
        self.tag(u64::from(index), 2, FIELD_SET);
        self.value(schema, ty, node, mode, keyed);
    }

    fn clear_field(&mut self, index: u16, _name: &str) {
        self.tag(u64::from(index), 2, FIELD_CLEAR);
    }

    fn list_header(&mut self, new_len: Option<usize>) {
        encode_varint(new_len.map_or(0, |n| n as u64 + 1), &mut self.buf);
    }

    fn enter_item(&mut self, index: u32) -> Mark {
        let mark = self.buf.len();
        self.tag(u64::from(index), 1, ITEM_PATCH);
        mark
    }

    fn leave_item(&mut self, mark: Mark) {
        self.leave(mark);
    }

    fn set_item(&mut self, schema: &Schema, index: u32, ty: TypeId, node: &Node, mode: Mode) {
        self.tag(u64::from(index), 1, ITEM_SET);
        self.value(schema, ty, node, mode, false);
    }

    fn enter_entry(&mut self, id: u32, _key: &Key) -> Mark {
        let mark = self.buf.len();
        self.tag(u64::from(id), 2, ENTRY_PATCH);
        mark
    }

    fn leave_entry(&mut self, mark: Mark) {
        self.leave(mark);
    }

    fn insert_entry(&mut self, schema: &Schema, id: u32, key: &Key, ty: TypeId, node: &Node, mode: Mode) {
        self.tag(u64::from(id), 2, ENTRY_INSERT);
        self.key(key);
        self.value(schema, ty, node, mode, false);
    }

    fn set_entry(&mut self, schema: &Schema, id: u32, _key: &Key, ty: TypeId, node: &Node, mode: Mode) {
        self.tag(u64::from(id), 2, ENTRY_SET);
        self.value(schema, ty, node, mode, false);
    }

    fn remove_entry(&mut self, id: u32, _key: &Key) {
        self.tag(u64::from(id), 2, ENTRY_REMOVE);
    }
}
