//! The JSON delta format, for debugging and web clients: one op per line,
//! `{"op":"set"|"clear"|"remove"|"len","path":"/players/p1/hp","value":...}`.
//!
//! Paths are JSON Pointers (RFC 6901) built from field names and map keys, so a reader needs no
//! interning table. Lines are self-contained, so segments concatenate and entries slice out, just
//! as in the binary format.

use std::io::Write;
use std::ops::Range;

use super::{Emit, Mark, Mode};
use crate::schema::{Kind, Schema, TypeId, Vis};
use crate::tree::{Node, Version};
use crate::value::Key;

/// The update header line.
pub(crate) fn header(snapshot: bool, from: Version, to: Version) -> Vec<u8> {
    let kind = if snapshot { "snapshot" } else { "delta" };
    format!("{{\"kind\":\"{kind}\",\"from\":{from},\"to\":{to}}}\n").into_bytes()
}

pub(crate) struct Json {
    pub buf: Vec<u8>,
    path: String,
    marks: Vec<usize>,
    skips: Vec<(Key, Range<usize>)>,
}

/// An entry of a player-keyed map met inside a full value. It is written as its own line after
/// the value's line (where the map appears as `{}`), so that it can be sliced out.
struct Deferred<'n> {
    path: String,
    key: Key,
    ty: TypeId,
    node: &'n Node,
}

impl Json {
    pub fn new() -> Json {
        Json { buf: Vec::with_capacity(512), path: String::new(), marks: Vec::new(), skips: Vec::new() }
    }

    fn push_segment(&mut self, segment: &str) {
        self.marks.push(self.path.len());
        push_escaped(&mut self.path, segment);
    }

    fn pop_segment(&mut self) {
        if let Some(len) = self.marks.pop() {
            self.path.truncate(len);
        }
    }

    /// Writes one op line for the current path extended by `last`.
    fn op(&mut self, op: &str, last: Option<&str>, value: impl FnOnce(&mut Json)) {
        if let Some(last) = last {
            self.push_segment(last);
        }
        let _ = write!(self.buf, "{{\"op\":\"{op}\",\"path\":");
        let _ = serde_json::to_writer(&mut self.buf, &self.path);
        let start = self.buf.len();
        self.buf.extend_from_slice(b",\"value\":");
        let value_at = self.buf.len();
        value(self);
        if self.buf.len() == value_at {
            self.buf.truncate(start);
        }
        self.buf.extend_from_slice(b"}\n");
        if last.is_some() {
            self.pop_segment();
        }
    }

    /// A `set` line for the current path extended by `last`, then one line per entry of every
    /// player-keyed map inside the value, each recorded for skipping.
    fn set(&mut self, schema: &Schema, last: &str, ty: TypeId, node: &Node, mode: Mode, keyed: bool) {
        let mut deferred = Vec::new();
        self.push_segment(last);
        let base = self.path.clone();
        self.op("set", None, |j| j.value(schema, ty, node, mode, keyed, &base, &mut deferred));
        self.pop_segment();
        for d in deferred {
            let start = self.buf.len();
            let saved = std::mem::replace(&mut self.path, d.path);
            let saved_marks = std::mem::take(&mut self.marks);
            let (parent, last) = split_last_segment(&self.path);
            self.path = parent;
            self.set(schema, &last, d.ty, d.node, mode, false);
            self.path = saved;
            self.marks = saved_marks;
            let end = self.buf.len();
            self.skips.push((d.key, start..end));
        }
    }

    /// A full value. `at` is its path, for the entries of player-keyed maps, which are left out
    /// here (the map is written `{}`) and returned in `deferred`.
    #[allow(clippy::too_many_arguments)]
    fn value<'n>(
        &mut self,
        schema: &Schema,
        ty: TypeId,
        node: &'n Node,
        mode: Mode,
        keyed: bool,
        at: &str,
        deferred: &mut Vec<Deferred<'n>>,
    ) {
        match (&schema.node(ty).kind, node) {
            (Kind::Int, Node::Int(i)) => {
                let _ = write!(self.buf, "{i}");
            }
            (Kind::Float(_), Node::Float(f)) => self.float(*f),
            (Kind::Bool, Node::Bool(b)) => self.buf.extend_from_slice(if *b { b"true" } else { b"false" }),
            (Kind::Str, Node::Str(s)) => {
                let _ = serde_json::to_writer(&mut self.buf, &**s);
            }
            (Kind::Bytes, Node::Bytes(b)) => {
                let _ = write!(self.buf, "\"{}\"", hex::encode(b));
            }
            (Kind::Vec3(_), Node::Vec3(v)) => {
                self.buf.push(b'[');
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        self.buf.push(b',');
                    }
                    self.float(*x);
                }
                self.buf.push(b']');
            }
            (Kind::Struct(fields), Node::Struct(slots)) => {
                self.buf.push(b'{');
                let mut first = true;
                for (field, slot) in fields.iter().zip(slots.iter()) {
                    let visible = match field.vis {
                        Vis::Broadcast => true,
                        Vis::ServerOnly => false,
                        Vis::OwnerOnly | Vis::Custom(_) => mode == Mode::Owned,
                    };
                    if !visible {
                        continue;
                    }
                    if !first {
                        self.buf.push(b',');
                    }
                    first = false;
                    let _ = serde_json::to_writer(&mut self.buf, &*field.name);
                    self.buf.push(b':');
                    let mut inner = at.to_owned();
                    push_escaped(&mut inner, &field.name);
                    self.value(schema, field.ty, &slot.node, mode, field.player_keyed, &inner, deferred);
                }
                self.buf.push(b'}');
            }
            (Kind::List(item), Node::List(list)) => {
                self.buf.push(b'[');
                for (i, slot) in list.items.iter().enumerate() {
                    if i > 0 {
                        self.buf.push(b',');
                    }
                    let mut inner = at.to_owned();
                    push_escaped(&mut inner, &i.to_string());
                    self.value(schema, *item, &slot.node, mode, false, &inner, deferred);
                }
                self.buf.push(b']');
            }
            (Kind::Map { value, .. }, Node::Map(map)) => {
                self.buf.push(b'{');
                let mut first = true;
                for entry in map.iter() {
                    let mut inner = at.to_owned();
                    push_escaped(&mut inner, &entry.key.to_string());
                    if keyed {
                        deferred.push(Deferred {
                            path: inner,
                            key: entry.key.clone(),
                            ty: *value,
                            node: &entry.slot.node,
                        });
                        continue;
                    }
                    if !first {
                        self.buf.push(b',');
                    }
                    first = false;
                    let _ = serde_json::to_writer(&mut self.buf, &entry.key.to_string());
                    self.buf.push(b':');
                    self.value(schema, *value, &entry.slot.node, mode, false, &inner, deferred);
                }
                self.buf.push(b'}');
            }
            _ => unreachable!("the tree follows its schema"),
        }
    }

    fn float(&mut self, f: f64) {
        // JSON has no NaN or infinity; they are written as null.
        let _ = serde_json::to_writer(&mut self.buf, &f);
    }
}

/// Appends `/segment` to a JSON Pointer, escaped as RFC 6901 says.
fn push_escaped(path: &mut String, segment: &str) {
    path.push('/');
    for c in segment.chars() {
        match c {
            '~' => path.push_str("~0"),
            '/' => path.push_str("~1"),
            c => path.push(c),
        }
    }
}

/// Splits an escaped pointer into its parent and its unescaped last segment.
fn split_last_segment(path: &str) -> (String, String) {
    let at = path.rfind('/').unwrap_or(0);
    let last = path[at + 1..].replace("~1", "/").replace("~0", "~");
    (path[..at].to_owned(), last)
}

impl Emit for Json {
    fn position(&self) -> usize {
        self.buf.len()
    }

    fn skips(&mut self) -> &mut Vec<(Key, Range<usize>)> {
        &mut self.skips
    }

    fn end_patch(&mut self) {}

    fn enter_field(&mut self, _index: u16, name: &str) -> Mark {
        self.push_segment(name);
        self.buf.len()
    }

    fn leave_field(&mut self, _mark: Mark) {
        self.pop_segment();
    }

    fn set_field(
        &mut self,
        schema: &Schema,
        _: u16,
        name: &str,
        ty: TypeId,
        node: &Node,
        mode: Mode,
        keyed: bool,
    ) {
        self.set(schema, name, ty, node, mode, keyed);
    }

    fn clear_field(&mut self, _index: u16, name: &str) {
        self.op("clear", Some(name), |_| {});
    }

    fn list_header(&mut self, new_len: Option<usize>) {
        if let Some(len) = new_len {
            self.op("len", None, |j| {
                let _ = write!(j.buf, "{len}");
            });
        }
    }

    fn enter_item(&mut self, index: u32) -> Mark {
        self.push_segment(&index.to_string());
        self.buf.len()
    }

    fn leave_item(&mut self, _mark: Mark) {
        self.pop_segment();
    }

    fn set_item(&mut self, schema: &Schema, index: u32, ty: TypeId, node: &Node, mode: Mode) {
        self.set(schema, &index.to_string(), ty, node, mode, false);
    }

    fn enter_entry(&mut self, _id: u32, key: &Key) -> Mark {
        self.push_segment(&key.to_string());
        self.buf.len()
    }

    fn leave_entry(&mut self, _mark: Mark) {
        self.pop_segment();
    }

    fn insert_entry(&mut self, schema: &Schema, _id: u32, key: &Key, ty: TypeId, node: &Node, mode: Mode) {
        self.set(schema, &key.to_string(), ty, node, mode, false);
    }

    fn set_entry(&mut self, schema: &Schema, id: u32, key: &Key, ty: TypeId, node: &Node, mode: Mode) {
        self.insert_entry(schema, id, key, ty, node, mode);
    }

    fn remove_entry(&mut self, _id: u32, key: &Key) {
        self.op("remove", Some(&key.to_string()), |_| {});
    }
}
