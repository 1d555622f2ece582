//! Checks `docs/test-vectors/state.json`, the state-delta vectors `docs/protocol.md` promises.
//!
//! The script is replayed on a fresh state; each vector's update is encoded and compared with its
//! `hex` (binary) or `text` (JSON), then applied to a replica and the result compared with
//! `state`. Each invalid vector must fail with the named error.
//!
//! `TICKWIRE_WRITE_VECTORS=1 cargo test -p tickwire-state --test vectors` fills in missing `hex`,
//! `text` and `state` fields (for adding a vector); it never overwrites one.

use std::collections::HashMap;

use serde_json::{Value as J, json};
use tickwire_state::{Codec, Key, KeyKind, Replica, Schema, SchemaDef, State, Step, Type, Value};

const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/test-vectors/state.json");

enum Owned {
    Field(u16),
    Key(Key),
    Index(u32),
}

/// Resolves a path of field names, map keys and list indexes against the schema; returns the
/// steps and the declared type at the end.
fn resolve<'d>(def: &'d SchemaDef, path: &[J]) -> (Vec<Owned>, &'d Type) {
    let mut steps = Vec::new();
    let mut fields = &def.fields;
    let mut ty: Option<&Type> = None;
    for p in path {
        match ty {
            None | Some(Type::Struct(_)) => {
                if let Some(Type::Struct(f)) = ty {
                    fields = f;
                }
                let name = p.as_str().expect("field name");
                let i = fields.iter().position(|f| f.name == name).expect("known field");
                steps.push(Owned::Field(i as u16));
                ty = Some(&fields[i].ty);
            }
            Some(Type::Map { key, value }) => {
                steps.push(Owned::Key(match key {
                    KeyKind::String => Key::str(p.as_str().expect("string key")),
                    KeyKind::Int => Key::Int(p.as_i64().expect("int key")),
                }));
                ty = Some(value);
            }
            Some(Type::List(item)) => {
                steps.push(Owned::Index(p.as_u64().expect("index") as u32));
                ty = Some(item);
            }
            Some(other) => panic!("path goes through {other:?}"),
        }
    }
    (steps, ty.expect("non-empty path"))
}

fn borrowed(steps: &[Owned]) -> Vec<Step<'_>> {
    steps
        .iter()
        .map(|s| match s {
            Owned::Field(f) => Step::Field(*f),
            Owned::Key(k) => Step::Key(k),
            Owned::Index(i) => Step::Index(*i),
        })
        .collect()
}

fn value_from_json(ty: &Type, v: &J) -> Value {
    match ty {
        Type::Int => Value::Int(v.as_i64().expect("int")),
        Type::Float | Type::QuantizedFloat(_) => Value::Float(v.as_f64().expect("float")),
        Type::Bool => Value::Bool(v.as_bool().expect("bool")),
        Type::String => Value::Str(v.as_str().expect("string").to_owned()),
        Type::Bytes => Value::Bytes(hex::decode(v.as_str().expect("hex")).expect("hex").into()),
        Type::Vec3 | Type::QuantizedVec3(_) => {
            let a = v.as_array().expect("array");
            Value::Vec3([0, 1, 2].map(|i| a[i].as_f64().expect("float")))
        }
        Type::Struct(fields) => Value::Struct(
            fields
                .iter()
                .map(|f| v.get(&f.name).map_or_else(|| default(&f.ty), |x| value_from_json(&f.ty, x)))
                .collect(),
        ),
        Type::List(item) => {
            Value::List(v.as_array().expect("array").iter().map(|x| value_from_json(item, x)).collect())
        }
        Type::Map { key, value } => Value::Map(
            v.as_object()
                .expect("object")
                .iter()
                .map(|(k, x)| {
                    let k = match key {
                        KeyKind::String => Key::str(k),
                        KeyKind::Int => Key::Int(k.parse().expect("int key")),
                    };
                    (k, value_from_json(value, x))
                })
                .collect(),
        ),
    }
}

fn default(ty: &Type) -> Value {
    match ty {
        Type::Int => Value::Int(0),
        Type::Float | Type::QuantizedFloat(_) => Value::Float(0.0),
        Type::Bool => Value::Bool(false),
        Type::String => Value::Str(String::new()),
        Type::Bytes => Value::Bytes(Default::default()),
        Type::Vec3 | Type::QuantizedVec3(_) => Value::Vec3([0.0; 3]),
        Type::Struct(f) => Value::Struct(f.iter().map(|f| default(&f.ty)).collect()),
        Type::List(_) => Value::List(vec![]),
        Type::Map { .. } => Value::Map(Default::default()),
    }
}

fn value_to_json(ty: &Type, v: &Value) -> J {
    match (ty, v) {
        (_, Value::Int(i)) => json!(i),
        (_, Value::Float(f)) => json!(f),
        (_, Value::Bool(b)) => json!(b),
        (_, Value::Str(s)) => json!(s),
        (_, Value::Bytes(b)) => json!(hex::encode(b)),
        (_, Value::Vec3(x)) => json!(x),
        (Type::Struct(fields), Value::Struct(values)) => J::Object(
            fields.iter().zip(values).map(|(f, x)| (f.name.clone(), value_to_json(&f.ty, x))).collect(),
        ),
        (Type::List(item), Value::List(items)) => {
            J::Array(items.iter().map(|x| value_to_json(item, x)).collect())
        }
        (Type::Map { value, .. }, Value::Map(m)) => {
            J::Object(m.iter().map(|(k, x)| (k.to_string(), value_to_json(value, x))).collect())
        }
        _ => panic!("value does not fit {ty:?}"),
    }
}

/// A fresh state with `ticks` applied, one sealed version per tick.
fn replay(def: &SchemaDef, schema: &std::sync::Arc<Schema>, ticks: &[J]) -> State {
    let mut state = State::new(schema.clone());
    for tick in ticks {
        for w in tick.as_array().expect("tick") {
            let path: Vec<J> = w["path"].as_array().expect("path").clone();
            let (steps, ty) = resolve(def, &path);
            let steps = borrowed(&steps);
            match w["op"].as_str().expect("op") {
                "set" => state.set(&steps, value_from_json(ty, &w["value"])).expect("set"),
                "remove" => assert!(state.remove(&steps).expect("remove")),
                "push" => {
                    let Type::List(item) = ty else { panic!("push on a non-list") };
                    state.push(&steps, value_from_json(item, &w["value"])).expect("push")
                }
                "truncate" => {
                    state.truncate(&steps, w["value"].as_u64().expect("length") as usize).expect("truncate")
                }
                "cap" => state.cap_list(&steps, w["value"].as_u64().expect("cap") as usize).expect("cap"),
                other => panic!("unknown op {other}"),
            }
        }
        state.seal();
    }
    state
}

fn error_name(e: &tickwire_state::DecodeError) -> String {
    format!("{e:?}").split(['(', ' ', '{']).next().unwrap_or_default().to_owned()
}

#[test]
fn state_vectors() {
    let text = std::fs::read_to_string(PATH).expect("read vectors");
    let mut doc: J = serde_json::from_str(&text).expect("valid JSON");
    let def: SchemaDef = serde_json::from_value(doc["schema"].clone()).expect("schema");
    let schema = Schema::new(def.clone()).expect("schema compiles");
    let root = Type::Struct(def.fields.clone());
    let write = std::env::var_os("TICKWIRE_WRITE_VECTORS").is_some();
    let mut changed = false;

    let script = doc["script"].as_array().expect("script").clone();
    // `states[n]`: after `n` ticks; `states[0]` was never written.
    let states: Vec<State> = (0..=script.len()).map(|n| replay(&def, &schema, &script[..n])).collect();

    let mut replicas: HashMap<String, Replica> = HashMap::new();
    for v in doc["vectors"].as_array_mut().expect("vectors") {
        let name = v["name"].as_str().expect("name").to_owned();
        let state = &states[v["after_tick"].as_u64().expect("after_tick") as usize];
        let player = Key::str(v["player"].as_str().expect("player"));
        let codec = if v["codec"] == "json" { Codec::Json } else { Codec::Binary };
        let from = v["from"].as_u64().expect("from");
        let skip = v.get("skip_self").and_then(J::as_bool).unwrap_or(false);
        let bytes = state.prepare(from, codec).unwrap().update_for(state, &player, skip).unwrap().to_vec();
        match codec {
            Codec::Binary => match v.get("hex").and_then(J::as_str) {
                Some(hex) => assert_eq!(hex::encode(&bytes), hex, "{name}"),
                None if write => {
                    v["hex"] = json!(hex::encode(&bytes));
                    changed = true;
                }
                None => panic!("{name}: no hex (run with TICKWIRE_WRITE_VECTORS=1)"),
            },
            Codec::Json => match v.get("text").and_then(J::as_str) {
                Some(text) => assert_eq!(String::from_utf8(bytes.clone()).unwrap(), text, "{name}"),
                None if write => {
                    v["text"] = json!(String::from_utf8(bytes.clone()).unwrap());
                    changed = true;
                }
                None => panic!("{name}: no text (run with TICKWIRE_WRITE_VECTORS=1)"),
            },
        }
        let mut replica = match v.get("base").and_then(J::as_str) {
            Some(base) => replicas[base].clone(),
            None => Replica::new(schema.clone()),
        };
        replica.apply_codec(codec, &bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = value_to_json(&root, &replica.value());
        if !skip {
            // (A subscriber skipping its own entries keeps the copy of its entry it last had.)
            assert_eq!(
                got,
                value_to_json(&root, &state.view_for(&player)),
                "{name}: replica differs from the view"
            );
        }
        match v.get("state") {
            Some(expected) => assert_eq!(&got, expected, "{name}"),
            None if write => {
                v["state"] = got;
                changed = true;
            }
            None => panic!("{name}: no state (run with TICKWIRE_WRITE_VECTORS=1)"),
        }
        replicas.insert(name, replica);
    }

    for v in doc["invalid"].as_array().expect("invalid") {
        let name = v["name"].as_str().expect("name");
        let bytes = hex::decode(v["hex"].as_str().expect("hex")).expect("hex");
        let err = Replica::new(schema.clone()).apply(&bytes).expect_err(name);
        assert_eq!(error_name(&err), v["error"].as_str().expect("error"), "{name}: {err}");
    }

    if changed {
        std::fs::write(PATH, serde_json::to_string_pretty(&doc).unwrap() + "\n").expect("write vectors");
    }
}
