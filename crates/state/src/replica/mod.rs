//! The client side: a replica that applies updates (binary or JSON) and holds what its player
//! may see.
//!
//! Decoding follows the schema, so recursion is bounded by the schema's depth, and every length
//! is checked against the bytes that remain before anything is allocated. Bad input is a typed
//! [`DecodeError`]. After one in an update's body (the update may be partly applied), the
//! replica refuses deltas until it gets a snapshot; a delta from a version other than the one
//! it holds is refused and changes nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use hashbrown::HashMap;

mod binary;
mod json;

use crate::error::DecodeError;
use crate::schema::{ROOT, Schema, TypeId};
use crate::sync::Codec;
use crate::tree::Version;
use crate::value::{Key, Value};

#[derive(Debug, Clone)]
pub(crate) enum RNode {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Bytes(Bytes),
    Vec3([f64; 3]),
    Struct(Vec<RNode>),
    List(Vec<RNode>),
    Map(RMap),
}

#[derive(Debug, Clone, Default)]
pub(crate) struct RMap {
    pub entries: BTreeMap<Key, RNode>,
    pub ids: HashMap<u32, Key>,
}

/// A client's copy of the state, built from a snapshot and the deltas after it.
#[derive(Debug, Clone)]
pub struct Replica {
    schema: Arc<Schema>,
    root: RNode,
    version: Version,
    poisoned: bool,
    /// Whether it counts entries ([`Replica::counting_entries`]), and how many so far.
    counting: bool,
    entries: u64,
}

impl Replica {
    pub fn new(schema: Arc<Schema>) -> Replica {
        let root = default_node(&schema, ROOT);
        Replica { schema, root, version: 0, poisoned: false, counting: false, entries: 0 }
    }

    /// The version of the last update applied.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The same replica, counting from now on the entries its updates write
    /// ([`Replica::entries_applied`]). Off by default: the count costs a hash and a key per entry written.
    pub fn counting_entries(mut self) -> Replica {
        self.counting = true;
        self
    }

    /// With [`Replica::counting_entries`] (else 0), the entries of outermost maps (those not
    /// inside another map's entry) that the updates applied since wrote: each entry an update
    /// inserts, sets, patches or removes counts once, however many of its fields change and
    /// in how many of the update's segments, and so does each entry of a map it sets whole (a
    /// snapshot's). Entries dropped by clearing a map, or by setting a whole map in place of
    /// one, are not counted. For a state whose map holds entities, the entity updates
    /// received. An update refused (even one partly applied before its error) adds nothing.
    pub fn entries_applied(&self) -> u64 {
        self.entries
    }

    /// The replica's state as a plain value.
    pub fn value(&self) -> Value {
        to_value(&self.root)
    }

    /// The value at `path`, if the replica has it (cheaper than `value()` for one field).
    pub fn get(&self, path: &[crate::Step<'_>]) -> Option<Value> {
        let mut node = &self.root;
        for step in path {
            node = match (node, step) {
                (RNode::Struct(fields), crate::Step::Field(i)) => fields.get(*i as usize)?,
                (RNode::List(items), crate::Step::Index(i)) => items.get(*i as usize)?,
                (RNode::Map(map), crate::Step::Key(k)) => map.entries.get(*k)?,
                _ => return None,
            };
        }
        Some(to_value(node))
    }

    /// Applies one binary update (header and patches). On error the replica may be partly
    /// updated; it then accepts only a snapshot.
    pub fn apply(&mut self, update: &[u8]) -> Result<Version, DecodeError> {
        let (header, mut body) = binary::header(update)?;
        let count = self.counting;
        self.apply_with(header, |schema, root| binary::apply(schema, root, &mut body, count))
    }

    /// Applies one JSON update (a header line, then one op per line).
    pub fn apply_json(&mut self, update: &[u8]) -> Result<Version, DecodeError> {
        let (header, body) = json::header(update)?;
        let count = self.counting;
        self.apply_with(header, |schema, root| json::apply(schema, root, body, count))
    }

    /// Applies one update encoded with `codec`: [`Replica::apply`] or [`Replica::apply_json`].
    pub fn apply_codec(&mut self, codec: Codec, update: &[u8]) -> Result<Version, DecodeError> {
        match codec {
            Codec::Binary => self.apply(update),
            Codec::Json => self.apply_json(update),
        }
    }

    fn apply_with(
        &mut self,
        header: Header,
        body: impl FnOnce(&Schema, &mut RNode) -> Result<u64, DecodeError>,
    ) -> Result<Version, DecodeError> {
        if header.snapshot {
            self.root = default_node(&self.schema, ROOT);
        } else if self.poisoned {
            return Err(DecodeError::NeedsSnapshot);
        } else if header.from != self.version {
            return Err(DecodeError::VersionMismatch { from: header.from, have: self.version });
        }
        match body(&self.schema, &mut self.root) {
            Ok(entries) => {
                self.version = header.to;
                self.poisoned = false;
                self.entries += entries;
                Ok(header.to)
            }
            Err(e) => {
                self.poisoned = true;
                Err(e)
            }
        }
    }
}

/// An update's header, in either format.
struct Header {
    snapshot: bool,
    from: Version,
    to: Version,
}

pub(crate) fn default_node(schema: &Schema, ty: TypeId) -> RNode {
    from_value(schema.default_value(ty))
}

/// A replica node for a plain value. Map entries get no ids: defaults have no entries, and the
/// JSON format names entries by key.
pub(crate) fn from_value(v: Value) -> RNode {
    match v {
        Value::Int(i) => RNode::Int(i),
        Value::Float(f) => RNode::Float(f),
        Value::Bool(b) => RNode::Bool(b),
        Value::Str(s) => RNode::Str(s),
        Value::Bytes(b) => RNode::Bytes(b),
        Value::Vec3(v) => RNode::Vec3(v),
        Value::Struct(f) => RNode::Struct(f.into_iter().map(from_value).collect()),
        Value::List(l) => RNode::List(l.into_iter().map(from_value).collect()),
        Value::Map(m) => RNode::Map(RMap {
            entries: m.into_iter().map(|(k, v)| (k, from_value(v))).collect(),
            ids: Default::default(),
        }),
    }
}

fn to_value(node: &RNode) -> Value {
    match node {
        RNode::Int(i) => Value::Int(*i),
        RNode::Float(f) => Value::Float(*f),
        RNode::Bool(b) => Value::Bool(*b),
        RNode::Str(s) => Value::Str(s.clone()),
        RNode::Bytes(b) => Value::Bytes(b.clone()),
        RNode::Vec3(v) => Value::Vec3(*v),
        RNode::Struct(f) => Value::Struct(f.iter().map(to_value).collect()),
        RNode::List(l) => Value::List(l.iter().map(to_value).collect()),
        RNode::Map(m) => Value::Map(m.entries.iter().map(|(k, v)| (k.clone(), to_value(v))).collect()),
    }
}
