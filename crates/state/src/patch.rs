//! Patches: how a game server changes a channel's state. The format is the JSON delta format
//! (one op per line, JSON Pointer paths) plus list ops:
//!
//! | op | value | effect |
//! |---|---|---|
//! | `set` | the new value | a field, list item or map entry (inserted if absent) becomes the value; only what differs is sent |
//! | `remove` | | remove a map entry (absent: nothing to do) |
//! | `push` | an item | append to a list |
//! | `cap` | n | keep the newest n items of a list |
//! | `truncate` | n | keep the first n items of a list |
//!
//! A patch is parsed and checked against the schema as a whole before anything changes; an op
//! that then fails against the current state (a missing key on its path, an index out of range)
//! rolls the ops before it back, so a rejected patch leaves every value as it was.

use crate::error::StateError;
use crate::json_value::{JsonOp, PathBuf, from_json_str, resolve};
use crate::schema::{Kind, Schema};
use crate::state::{State, Step};
use crate::value::Value;

/// Most ops one patch may hold.
pub const MAX_PATCH_OPS: usize = 4096;

#[derive(Clone, Debug, PartialEq)]
pub enum PatchOp {
    Set { path: Vec<PathBuf>, value: Value },
    Remove { path: Vec<PathBuf> },
    Push { path: Vec<PathBuf>, value: Value },
    Cap { path: Vec<PathBuf>, len: usize },
    Truncate { path: Vec<PathBuf>, len: usize },
}

/// A parsed, schema-checked patch.
#[derive(Clone, Debug, PartialEq)]
pub struct Patch {
    pub ops: Vec<PatchOp>,
}

/// Why a patch was refused. Nothing was changed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PatchError {
    #[error("patch line {line}: {reason}")]
    Invalid { line: usize, reason: String },
    #[error("patch op {index} does not apply: {source}")]
    Rejected { index: usize, source: StateError },
    #[error("a patch may hold at most {MAX_PATCH_OPS} ops")]
    TooLong,
}

impl Patch {
    /// Parses JSON op lines and checks each against the schema (paths, types, values).
    pub fn parse_json(schema: &Schema, text: &[u8]) -> Result<Patch, PatchError> {
        let mut ops = Vec::new();
        for (i, line) in text.split(|&b| b == b'\n').enumerate() {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            if ops.len() == MAX_PATCH_OPS {
                return Err(PatchError::TooLong);
            }
            let invalid = |reason: String| PatchError::Invalid { line: i + 1, reason };
            let op: JsonOp = serde_json::from_slice(line).map_err(|e| invalid(e.to_string()))?;
            let (path, ty) = resolve(schema, &op.path).map_err(invalid)?;
            if path.is_empty() {
                return Err(invalid("the root cannot be replaced; set its fields".into()));
            }
            let value = || op.value.as_ref().ok_or_else(|| invalid(format!("`{}` needs a value", op.op)));
            let count = || {
                value()?;
                op.count().map(|n| n as usize).ok_or_else(|| invalid("the value must be a count".into()))
            };
            let list_item = || match schema.node(ty).kind {
                Kind::List(item) => Ok(item),
                _ => Err(invalid(format!("`{}` applies to lists", op.op))),
            };
            ops.push(match op.op.as_str() {
                "set" => {
                    PatchOp::Set { value: from_json_str(schema, ty, value()?.get()).map_err(invalid)?, path }
                }
                "remove" => {
                    if !matches!(path.last(), Some(PathBuf::Key(_))) {
                        return Err(invalid("`remove` applies to map entries".into()));
                    }
                    PatchOp::Remove { path }
                }
                "push" => {
                    let value = from_json_str(schema, list_item()?, value()?.get()).map_err(invalid)?;
                    PatchOp::Push { value, path }
                }
                "cap" => {
                    list_item()?;
                    PatchOp::Cap { len: count()?, path }
                }
                "truncate" => {
                    list_item()?;
                    PatchOp::Truncate { len: count()?, path }
                }
                other => return Err(invalid(format!("unknown op {other:?}"))),
            });
        }
        Ok(Patch { ops })
    }
}

fn steps(path: &[PathBuf]) -> Vec<Step<'_>> {
    path.iter()
        .map(|s| match s {
            PathBuf::Field(f) => Step::Field(*f),
            PathBuf::Key(k) => Step::Key(k),
            PathBuf::Index(i) => Step::Index(*i),
        })
        .collect()
}

/// How to put back what one op changed.
enum Undo<'p> {
    Restore(&'p [PathBuf], Value),
    Remove(&'p [PathBuf]),
    Truncate(&'p [PathBuf], usize),
}

impl State {
    /// Applies every op of `patch`, or none.
    pub fn apply_patch(&mut self, patch: &Patch) -> Result<(), PatchError> {
        let mut undo = Vec::with_capacity(patch.ops.len());
        for (index, op) in patch.ops.iter().enumerate() {
            if let Err(source) = self.apply_op(op, &mut undo) {
                for u in undo.into_iter().rev() {
                    // Each undo puts back a value that was there a moment ago, so it fits.
                    let _ = match u {
                        Undo::Restore(path, value) => self.set(&steps(path), value),
                        Undo::Remove(path) => self.remove(&steps(path)).map(drop),
                        Undo::Truncate(path, len) => self.truncate(&steps(path), len),
                    };
                }
                return Err(PatchError::Rejected { index, source });
            }
        }
        Ok(())
    }

    fn apply_op<'p>(&mut self, op: &'p PatchOp, undo: &mut Vec<Undo<'p>>) -> Result<(), StateError> {
        match op {
            PatchOp::Set { path, value } => {
                let before = self.get(&steps(path));
                self.set(&steps(path), value.clone())?;
                undo.push(match before {
                    Ok(v) => Undo::Restore(path, v),
                    Err(_) => Undo::Remove(path),
                });
            }
            PatchOp::Remove { path } => {
                if let Ok(before) = self.get(&steps(path))
                    && self.remove(&steps(path))?
                {
                    undo.push(Undo::Restore(path, before));
                }
            }
            PatchOp::Push { path, value } => {
                let len = self.len(&steps(path))?;
                self.push(&steps(path), value.clone())?;
                undo.push(Undo::Truncate(path, len));
            }
            PatchOp::Cap { path, len } | PatchOp::Truncate { path, len } => {
                let before = self.get(&steps(path))?;
                if matches!(op, PatchOp::Cap { .. }) {
                    self.cap_list(&steps(path), *len)?;
                } else {
                    self.truncate(&steps(path), *len)?;
                }
                undo.push(Undo::Restore(path, before));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{Field, KeyKind, SchemaDef, Type};
    use crate::value::Key;

    fn schema() -> std::sync::Arc<Schema> {
        Schema::new(SchemaDef::new([
            Field::new("round", Type::Int),
            Field::new("log", Type::list(Type::String)),
            Field::new("players", Type::map(KeyKind::String, Type::structure([Field::new("hp", Type::Int)]))),
            Field::new("speed", Type::Float),
        ]))
        .unwrap()
    }

    fn apply(state: &mut State, text: &str) -> Result<(), PatchError> {
        let patch = Patch::parse_json(state.schema(), text.as_bytes())?;
        state.apply_patch(&patch)
    }

    #[test]
    fn applies_every_op() {
        let mut state = State::new(schema());
        apply(
            &mut state,
            r#"{"op":"set","path":"/round","value":3}
               {"op":"set","path":"/players/ann","value":{"hp":10}}
               {"op":"set","path":"/players/ann/hp","value":9}
               {"op":"push","path":"/log","value":"a"}
               {"op":"push","path":"/log","value":"b"}
               {"op":"push","path":"/log","value":"c"}
               {"op":"cap","path":"/log","value":2}"#,
        )
        .unwrap();
        assert_eq!(state.get(&[Step::Field(0)]).unwrap(), Value::Int(3));
        assert_eq!(state.get(&[Step::Field(1)]).unwrap(), Value::List(vec!["b".into(), "c".into()]));
        let ann = Key::str("ann");
        assert_eq!(state.get(&[Step::Field(2), Step::Key(&ann), Step::Field(0)]).unwrap(), Value::Int(9));
        apply(
            &mut state,
            r#"{"op":"remove","path":"/players/ann"}
            {"op":"remove","path":"/players/nobody"}
            {"op":"truncate","path":"/log","value":0}"#,
        )
        .unwrap();
        assert_eq!(state.len(&[Step::Field(2)]).unwrap(), 0);
        assert_eq!(state.len(&[Step::Field(1)]).unwrap(), 0);
    }

    #[test]
    fn malformed_or_misfit_patches_are_refused_with_a_reason() {
        let s = schema();
        let bad = [
            ("not json", 1),
            (r#"{"op":"set","path":"/round","value":"three"}"#, 1),
            (
                "{\"op\":\"set\",\"path\":\"/round\",\"value\":1}\n{\"op\":\"set\",\"path\":\"/nope\",\"value\":1}",
                2,
            ),
            (r#"{"op":"push","path":"/round","value":1}"#, 1),
            (r#"{"op":"remove","path":"/round"}"#, 1),
            (r#"{"op":"explode","path":"/round"}"#, 1),
            (r#"{"op":"set","path":"","value":{}}"#, 1),
            (r#"{"op":"set","path":"/round"}"#, 1),
            (r#"{"op":"set","path":"/round","value":1,"extra":2}"#, 1),
            (r#"{"op":"set","path":"/round","value":null}"#, 1),
            (r#"{"op":"cap","path":"/log","value":-1}"#, 1),
            (r#"{"op":"cap","path":"/log"}"#, 1),
        ];
        for (text, line) in bad {
            match Patch::parse_json(&s, text.as_bytes()) {
                Err(PatchError::Invalid { line: l, .. }) => assert_eq!(l, line, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        // A field or key named twice, and a list index in another spelling, with their reasons.
        for (text, why) in [
            (r#"{"op":"set","path":"/players/ann","value":{"hp":1,"hp":2}}"#, "appears twice"),
            (r#"{"op":"set","path":"/players","value":{"ann":{},"ann":{}}}"#, "appears twice"),
            (r#"{"op":"set","path":"/log/01","value":"x"}"#, "bad list index"),
            (r#"{"op":"set","path":"/log/+1","value":"x"}"#, "bad list index"),
        ] {
            match Patch::parse_json(&s, text.as_bytes()) {
                Err(PatchError::Invalid { line: 1, reason }) => {
                    assert!(reason.contains(why), "{text}: {reason}")
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        // `null` is a float's value (one that is not finite), not a missing value.
        let patch = Patch::parse_json(&s, br#"{"op":"set","path":"/speed","value":null}"#).unwrap();
        let mut state = State::new(s.clone());
        state.apply_patch(&patch).unwrap();
        assert!(matches!(state.get(&[Step::Field(3)]), Ok(Value::Float(f)) if f.is_nan()));
    }

    #[test]
    fn a_failing_op_rolls_back_the_ops_before_it() {
        let mut state = State::new(schema());
        apply(&mut state, r#"{"op":"set","path":"/players/ann","value":{"hp":10}}"#).unwrap();
        state.seal();
        let before = state.get(&[]).unwrap();
        let err = apply(
            &mut state,
            r#"{"op":"set","path":"/round","value":5}
               {"op":"set","path":"/players/bob","value":{"hp":1}}
               {"op":"remove","path":"/players/ann"}
               {"op":"push","path":"/log","value":"x"}
               {"op":"set","path":"/players/ghost/hp","value":1}"#,
        )
        .unwrap_err();
        assert!(
            matches!(err, PatchError::Rejected { index: 4, source: StateError::NoKey { .. } }),
            "{err:?}"
        );
        assert_eq!(state.get(&[]).unwrap(), before, "every value is back");
    }
}
