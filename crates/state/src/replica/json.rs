//! The JSON update reader: a header line, then one `{"op","path","value"}` object per line.

use serde::Deserialize;

use super::{Header, RNode, default_node, from_value};
use crate::error::DecodeError;
use crate::json_value::{JsonOp, from_json_str, parse_index, parse_key, segments};
use crate::schema::{Kind, ROOT, Schema, TypeId};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonHeader {
    kind: String,
    from: u64,
    to: u64,
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

fn apply_op(schema: &Schema, root: &mut RNode, op: &JsonOp) -> Result<(), DecodeError> {
    let segs = segments(&op.path).map_err(bad)?;
    let value = || op.value.map(|v| v.get()).ok_or_else(|| bad(format!("{} needs a value", op.op)));
    if op.op == "len" {
        let (node, ty) = walk(schema, root, ROOT, &segs)?;
        let (RNode::List(items), Kind::List(item)) = (node, &schema.node(ty).kind) else {
            return Err(bad("len applies to lists"));
        };
        value()?;
        let len = op.count().ok_or_else(|| bad("len must be a number"))?;
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
                "set" => from_value(from_json_str(schema, decl[i].ty, value()?).map_err(bad)?),
                _ => default_node(schema, decl[i].ty),
            };
        }
        (RNode::List(items), Kind::List(item), "set") => {
            let index = parse_index(last).map_err(bad)? as usize;
            let len = items.len();
            let slot = items.get_mut(index).ok_or(DecodeError::BadIndex { index: index as u64, len })?;
            *slot = from_value(from_json_str(schema, *item, value()?).map_err(bad)?);
        }
        (RNode::Map(map), Kind::Map { key, value: vt }, "set" | "remove") => {
            let key = parse_key(*key, last).map_err(bad)?;
            if op.op == "set" {
                map.entries.insert(key, from_value(from_json_str(schema, *vt, value()?).map_err(bad)?));
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
                let index = parse_index(seg).map_err(bad)? as usize;
                let len = items.len();
                (items.get_mut(index).ok_or(DecodeError::BadIndex { index: index as u64, len })?, *item)
            }
            (RNode::Map(map), Kind::Map { key, value }) => {
                let key = parse_key(*key, seg).map_err(bad)?;
                (map.entries.get_mut(&key).ok_or_else(|| bad(format!("no entry {key}")))?, *value)
            }
            _ => return Err(bad(format!("path step {seg} goes through a scalar"))),
        };
    }
    Ok((node, ty))
}
