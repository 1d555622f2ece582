//! Plain values from JSON, typed by the schema: shared by the JSON replica and by patches that
//! game servers send as JSON ops. Also JSON Pointer paths resolved against the schema.

use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value as J;

use crate::schema::{KeyKind, Kind, ROOT, Schema, TypeId};
use crate::value::{Key, Value};

/// One line of the JSON format: an op, a JSON Pointer, and maybe a value. Used by the JSON
/// replica (updates) and by patches.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct JsonOp {
    pub op: String,
    pub path: String,
    #[serde(default)]
    pub value: Option<J>,
}

/// A path step that owns its key, from a JSON Pointer.
#[derive(Clone, Debug, PartialEq)]
pub enum PathBuf {
    Field(u16),
    Key(Key),
    Index(u32),
}

/// Splits a JSON Pointer (`/players/alice/hp`) into unescaped segments.
pub(crate) fn segments(path: &str) -> Result<Vec<String>, String> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let rest = path.strip_prefix('/').ok_or_else(|| format!("path {path:?} does not start with /"))?;
    Ok(rest.split('/').map(|s| s.replace("~1", "/").replace("~0", "~")).collect())
}

pub(crate) fn parse_key(kind: KeyKind, s: &str) -> Result<Key, String> {
    match kind {
        KeyKind::Int => s.parse().map(Key::Int).map_err(|_| format!("bad int key {s:?}")),
        KeyKind::String => Ok(Key::str(s)),
    }
}

/// Resolves a JSON Pointer against the schema: the steps, and the type at its end.
pub(crate) fn resolve(schema: &Schema, path: &str) -> Result<(Vec<PathBuf>, TypeId), String> {
    let mut ty = ROOT;
    let mut steps = Vec::new();
    for seg in segments(path)? {
        match &schema.node(ty).kind {
            Kind::Struct(fields) => {
                let i =
                    fields.iter().position(|f| *f.name == *seg).ok_or_else(|| format!("no field {seg:?}"))?;
                steps.push(PathBuf::Field(i as u16));
                ty = fields[i].ty;
            }
            Kind::List(item) => {
                steps.push(PathBuf::Index(seg.parse().map_err(|_| format!("bad list index {seg:?}"))?));
                ty = *item;
            }
            Kind::Map { key, value } => {
                steps.push(PathBuf::Key(parse_key(*key, &seg)?));
                ty = *value;
            }
            _ => return Err(format!("path {path:?} goes through a scalar at {seg:?}")),
        }
    }
    Ok((steps, ty))
}

/// A value of type `ty` from its JSON form (as the JSON codec writes it). Missing struct fields
/// are defaults; unknown ones are an error.
pub(crate) fn from_json(schema: &Schema, ty: TypeId, v: &J) -> Result<Value, String> {
    let mismatch = || format!("value {v} does not fit {:?}", schema.node(ty).kind);
    Ok(match (&schema.node(ty).kind, v) {
        (Kind::Int, J::Number(n)) => Value::Int(n.as_i64().ok_or_else(mismatch)?),
        (Kind::Float(_), J::Number(n)) => Value::Float(n.as_f64().ok_or_else(mismatch)?),
        (Kind::Float(_), J::Null) => Value::Float(f64::NAN),
        (Kind::Bool, J::Bool(b)) => Value::Bool(*b),
        (Kind::Str, J::String(s)) => Value::Str(s.clone()),
        (Kind::Bytes, J::String(s)) => Value::Bytes(Bytes::from(hex::decode(s).map_err(|_| mismatch())?)),
        (Kind::Vec3(_), J::Array(a)) if a.len() == 3 => {
            let c = |i: usize| a[i].as_f64().ok_or_else(mismatch);
            Value::Vec3([c(0)?, c(1)?, c(2)?])
        }
        (Kind::Struct(decl), J::Object(obj)) => {
            let mut values: Vec<Value> = decl.iter().map(|f| schema.default_value(f.ty)).collect();
            for (name, fv) in obj {
                let i =
                    decl.iter().position(|f| &*f.name == name).ok_or_else(|| format!("no field {name:?}"))?;
                values[i] = from_json(schema, decl[i].ty, fv)?;
            }
            Value::Struct(values)
        }
        (Kind::List(item), J::Array(a)) => {
            Value::List(a.iter().map(|x| from_json(schema, *item, x)).collect::<Result<_, _>>()?)
        }
        (Kind::Map { key, value }, J::Object(obj)) => Value::Map(
            obj.iter()
                .map(|(k, x)| Ok((parse_key(*key, k)?, from_json(schema, *value, x)?)))
                .collect::<Result<_, String>>()?,
        ),
        _ => return Err(mismatch()),
    })
}
