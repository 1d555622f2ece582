//! The JSON update reader: a header line, then one `{"op","path","value"}` object per line.

use hashbrown::HashSet;
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

/// Applies the ops that follow the header. Returns, if `count`, the entries of outermost maps
/// they wrote ([`super::Replica::entries_applied`]): the entry each op's path ends at or goes
/// through (each once, however many of its fields the update writes), and the entries of maps
/// an op sets whole; else 0.
pub(super) fn apply(schema: &Schema, root: &mut RNode, body: &[u8], count: bool) -> Result<u64, DecodeError> {
    let mut entries = 0;
    // Paths of the entries counted.
    let mut seen: HashSet<Vec<String>> = HashSet::new();
    for line in body.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let op: JsonOp = serde_json::from_slice(line).map_err(|e| bad(e.to_string()))?;
        let mut segs = segments(&op.path).map_err(bad)?;
        apply_op(schema, root, &op, &segs)?;
        if !count {
            continue;
        }
        match outer_entry_len(schema, &segs) {
            Some(len) if !seen.contains(&segs[..len]) => {
                entries += 1;
                seen.insert(segs[..len].to_vec());
            }
            Some(_) => {}
            None if op.op == "set" => {
                let (node, ty) = walk(schema, root, ROOT, &segs)?;
                entries += outer_entries(schema, node, ty, &mut segs, &mut seen);
            }
            None => {}
        }
    }
    Ok(entries)
}

/// The length of the path to the first map entry `segs` goes through or ends at, if any.
fn outer_entry_len(schema: &Schema, segs: &[String]) -> Option<usize> {
    let mut ty = ROOT;
    for (i, seg) in segs.iter().enumerate() {
        ty = match &schema.node(ty).kind {
            Kind::Map { .. } => return Some(i + 1),
            Kind::Struct(decl) => decl.iter().find(|f| &*f.name == seg)?.ty,
            Kind::List(item) => *item,
            _ => return None,
        };
    }
    None
}

/// The entries of the outermost maps in `node` (of type `ty`, at `path`) not in `seen`, which
/// gets their paths.
fn outer_entries(
    schema: &Schema,
    node: &RNode,
    ty: TypeId,
    path: &mut Vec<String>,
    seen: &mut HashSet<Vec<String>>,
) -> u64 {
    let mut below = |node: &RNode, ty: TypeId, step: String, seen: &mut HashSet<Vec<String>>| {
        path.push(step);
        let n = outer_entries(schema, node, ty, path, seen);
        path.pop();
        n
    };
    match (node, &schema.node(ty).kind) {
        (RNode::Map(map), Kind::Map { .. }) => {
            let mut counted = 0;
            for key in map.entries.keys() {
                let mut entry = path.clone();
                entry.push(key.to_string());
                if seen.insert(entry) {
                    counted += 1;
                }
            }
            counted
        }
        (RNode::Struct(nodes), Kind::Struct(decl)) => {
            nodes.iter().zip(decl).map(|(node, f)| below(node, f.ty, f.name.to_string(), seen)).sum()
        }
        (RNode::List(nodes), Kind::List(item)) => {
            nodes.iter().enumerate().map(|(i, node)| below(node, *item, i.to_string(), seen)).sum()
        }
        _ => 0,
    }
}

fn apply_op(schema: &Schema, root: &mut RNode, op: &JsonOp, segs: &[String]) -> Result<(), DecodeError> {
    let value = || op.value.map(|v| v.get()).ok_or_else(|| bad(format!("{} needs a value", op.op)));
    if op.op == "len" {
        let (node, ty) = walk(schema, root, ROOT, segs)?;
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
