//! The JSON update reader: a header line, then one `{"op","path","value"}` object per line.

use bytes::Bytes;
use serde::Deserialize;

use super::{Header, RMap, RNode, default_node};
use crate::error::DecodeError;
use crate::schema::{KeyKind, Kind, ROOT, Schema, TypeId};
use crate::value::Key;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonHeader {
    kind: String,
    from: u64,
    to: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOp {
    op: String,
    path: String,
    #[serde(default)]
    value: Option<serde_json::Value>,
}

fn bad(msg: impl Into<String>) -> DecodeError {
    DecodeError::Json(msg.into())
}

pub(super) fn header(update: &[u8]) -> Result<(Header, &[u8]), DecodeError> {
    let end = update.iter().position(|&b| b == b'\n').ok_or(DecodeError::Truncated("JSON header line"))?;
    let h: JsonHeader = serde_json::from_slice(&update[..end]).map_err(|e| bad(e.to_string()))?;
    let snapshot = match h.kind.as_str() {
        "snapshot" => true,
        "delta" => false,
        other => return Err(bad(format!("unknown kind {other:?}"))),
    };
    Ok((Header { snapshot, from: h.from, to: h.to }, &update[end + 1..]))
}

pub(super) fn apply(schema: &Schema, root: &mut RNode, body: &[u8]) -> Result<(), DecodeError> {
    for line in body.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let op: JsonOp = serde_json::from_slice(line).map_err(|e| bad(e.to_string()))?;
        apply_op(schema, root, &op)?;
    }
    Ok(())
}

/// Splits a JSON Pointer into unescaped segments.
fn segments(path: &str) -> Result<Vec<String>, DecodeError> {
    let rest = path.strip_prefix('/').ok_or_else(|| bad(format!("path {path:?} does not start with /")))?;
    Ok(rest.split('/').map(|s| s.replace("~1", "/").replace("~0", "~")).collect())
}

fn apply_op(schema: &Schema, root: &mut RNode, op: &JsonOp) -> Result<(), DecodeError> {
    let segs = segments(&op.path)?;
    let value = || op.value.as_ref().ok_or_else(|| bad(format!("{} needs a value", op.op)));
    if op.op == "len" {
        let (node, ty) = walk(schema, root, ROOT, &segs)?;
        let (RNode::List(items), Kind::List(item)) = (node, &schema.node(ty).kind) else {
            return Err(bad("len applies to lists"));
        };
        let len = value()?.as_u64().ok_or_else(|| bad("len must be a number"))?;
        if len < items.len() as u64 || len > 1 << 24 {
            return Err(DecodeError::BadLength(len));
        }
        items.resize(len as usize, default_node(schema, *item));
        return Ok(());
    }
    let (last, parent) = segs.split_last().ok_or_else(|| bad("empty path"))?;
    let (node, ty) = walk(schema, root, ROOT, parent)?;
    match (node, &schema.node(ty).kind, op.op.as_str()) {
        (RNode::Struct(fields), Kind::Struct(decl), "set" | "clear") => {
            let i =
                decl.iter().position(|f| &*f.name == last).ok_or_else(|| bad(format!("no field {last}")))?;
            fields[i] = match op.op.as_str() {
                "set" => node_from_json(schema, decl[i].ty, value()?)?,
                _ => default_node(schema, decl[i].ty),
            };
        }
        (RNode::List(items), Kind::List(item), "set") => {
            let index: usize = last.parse().map_err(|_| bad(format!("bad index {last}")))?;
            let len = items.len();
            let slot = items.get_mut(index).ok_or(DecodeError::BadIndex { index: index as u64, len })?;
            *slot = node_from_json(schema, *item, value()?)?;
        }
        (RNode::Map(map), Kind::Map { key, value: vt }, "set" | "remove") => {
            let key = parse_key(*key, last)?;
            if op.op == "set" {
                map.entries.insert(key, node_from_json(schema, *vt, value()?)?);
            } else if map.entries.remove(&key).is_none() {
                return Err(bad(format!("remove of absent key {key}")));
            }
        }
        _ => return Err(bad(format!("op {} does not apply at {}", op.op, op.path))),
    }
    Ok(())
}

fn walk<'n>(
    schema: &Schema,
    mut node: &'n mut RNode,
    mut ty: TypeId,
    segs: &[String],
) -> Result<(&'n mut RNode, TypeId), DecodeError> {
    for seg in segs {
        (node, ty) = match (node, &schema.node(ty).kind) {
            (RNode::Struct(fields), Kind::Struct(decl)) => {
                let i = decl
                    .iter()
                    .position(|f| &*f.name == seg)
                    .ok_or_else(|| bad(format!("no field {seg}")))?;
                (&mut fields[i], decl[i].ty)
            }
            (RNode::List(items), Kind::List(item)) => {
                let index: usize = seg.parse().map_err(|_| bad(format!("bad index {seg}")))?;
                let len = items.len();
                (items.get_mut(index).ok_or(DecodeError::BadIndex { index: index as u64, len })?, *item)
            }
            (RNode::Map(map), Kind::Map { key, value }) => {
                let key = parse_key(*key, seg)?;
                (map.entries.get_mut(&key).ok_or_else(|| bad(format!("no entry {key}")))?, *value)
            }
            _ => return Err(bad(format!("path step {seg} goes through a scalar"))),
        };
    }
    Ok((node, ty))
}

fn parse_key(kind: KeyKind, s: &str) -> Result<Key, DecodeError> {
    match kind {
        KeyKind::Int => s.parse().map(Key::Int).map_err(|_| bad(format!("bad int key {s}"))),
        KeyKind::String => Ok(Key::str(s)),
    }
}

fn node_from_json(schema: &Schema, ty: TypeId, v: &serde_json::Value) -> Result<RNode, DecodeError> {
    use serde_json::Value as J;
    let mismatch = || bad(format!("value {v} does not fit {:?}", schema.node(ty).kind));
    Ok(match (&schema.node(ty).kind, v) {
        (Kind::Int, J::Number(n)) => RNode::Int(n.as_i64().ok_or_else(mismatch)?),
        (Kind::Float(_), J::Number(n)) => RNode::Float(n.as_f64().ok_or_else(mismatch)?),
        (Kind::Float(_), J::Null) => RNode::Float(f64::NAN),
        (Kind::Bool, J::Bool(b)) => RNode::Bool(*b),
        (Kind::Str, J::String(s)) => RNode::Str(s.clone()),
        (Kind::Bytes, J::String(s)) => RNode::Bytes(Bytes::from(hex::decode(s).map_err(|_| mismatch())?)),
        (Kind::Vec3(_), J::Array(a)) if a.len() == 3 => {
            let c = |i: usize| a[i].as_f64().ok_or_else(mismatch);
            RNode::Vec3([c(0)?, c(1)?, c(2)?])
        }
        (Kind::Struct(decl), J::Object(obj)) => {
            let mut node = default_node(schema, ty);
            let RNode::Struct(fields) = &mut node else { unreachable!("default of a struct") };
            for (name, fv) in obj {
                let i = decl
                    .iter()
                    .position(|f| &*f.name == name)
                    .ok_or_else(|| bad(format!("no field {name}")))?;
                fields[i] = node_from_json(schema, decl[i].ty, fv)?;
            }
            node
        }
        (Kind::List(item), J::Array(a)) => {
            RNode::List(a.iter().map(|x| node_from_json(schema, *item, x)).collect::<Result<_, _>>()?)
        }
        (Kind::Map { key, value }, J::Object(obj)) => {
            let mut map = RMap::default();
            for (k, x) in obj {
                map.entries.insert(parse_key(*key, k)?, node_from_json(schema, *value, x)?);
            }
            RNode::Map(map)
        }
        _ => return Err(mismatch()),
    })
}
