//! Random schemas, random values and random writes for the property tests, driven by a seed so a
//! failing case replays exactly.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use tickwire_state::{Field, Filter, Key, KeyKind, Schema, SchemaDef, State, Step, Type, Value};

/// SplitMix64: small, seedable, good enough to pick test cases.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

pub const PLAYERS: [&str; 4] = ["p0", "p1", "p2", "p3"];

pub fn player(i: usize) -> Key {
    Key::str(PLAYERS[i])
}

/// The custom filter used by random schemas: players p0 and p2 see the value, others nothing.
pub fn filters() -> HashMap<String, Filter> {
    let half: Filter = Arc::new(|player: &Key, value: &Value| match player {
        Key::Str(s) if &**s == "p0" || &**s == "p2" => Some(value.clone()),
        _ => None,
    });
    HashMap::from([("half".to_owned(), half)])
}

pub fn random_schema(rng: &mut Rng) -> SchemaDef {
    let n = 1 + rng.below(5) as usize;
    SchemaDef::new(random_fields(rng, n, 0, false))
}

fn random_fields(rng: &mut Rng, n: usize, depth: u32, private: bool) -> Vec<Field> {
    (0..n)
        .map(|i| {
            let name = format!("f{i}");
            let roll = rng.below(100);
            if !private && roll < 15 {
                let value = random_type(rng, depth + 1, true);
                Field::new(&name, Type::map(KeyKind::String, value)).owner_only()
            } else if !private && roll < 25 {
                Field::new(&name, random_type(rng, depth + 1, true)).custom("half")
            } else if roll < 35 {
                Field::new(&name, random_type(rng, depth + 1, private)).server_only()
            } else {
                let ty = random_type(rng, depth + 1, private);
                let keyed =
                    !private && matches!(ty, Type::Map { key: KeyKind::String, .. }) && rng.chance(50);
                let f = Field::new(&name, ty);
                if keyed { f.player_keyed() } else { f }
            }
        })
        .collect()
}

fn random_type(rng: &mut Rng, depth: u32, private: bool) -> Type {
    let containers = if depth >= 3 { 0 } else { 3 };
    match rng.below(8 + containers) {
        0 => Type::Int,
        1 => Type::Float,
        2 => Type::quantized(-10.0, 10.0, 0.25),
        3 => Type::Bool,
        4 => Type::String,
        5 => Type::Bytes,
        6 => Type::Vec3,
        7 => Type::QuantizedVec3(tickwire_state::Quant { min: 0.0, max: 100.0, precision: 0.5 }),
        8 => {
            let n = 1 + rng.below(4) as usize;
            Type::Struct(random_fields(rng, n, depth, private))
        }
        9 => Type::list(random_type(rng, depth + 1, private)),
        _ => {
            let key = if rng.chance(50) { KeyKind::String } else { KeyKind::Int };
            Type::map(key, random_type(rng, depth + 1, private))
        }
    }
}

pub fn random_value(rng: &mut Rng, ty: &Type) -> Value {
    match ty {
        Type::Int => Value::Int(rng.below(7) as i64 - 3),
        Type::Float => Value::Float([0.0, -1.5, 2.25, 1e9, -0.0][rng.below(5) as usize]),
        Type::QuantizedFloat(_) => Value::Float(rng.below(2400) as f64 / 100.0 - 12.0),
        Type::Bool => Value::Bool(rng.chance(50)),
        Type::String => Value::Str(["", "a", "héllo", "p1"][rng.below(4) as usize].to_owned()),
        Type::Bytes => Value::Bytes(Bytes::from(vec![rng.below(256) as u8; rng.below(3) as usize])),
        Type::Vec3 => Value::Vec3([rng.below(5) as f64, -(rng.below(5) as f64), 0.5]),
        Type::QuantizedVec3(_) => Value::Vec3([rng.below(120) as f64 - 10.0, 3.3, 99.9]),
        Type::Struct(fields) => Value::Struct(fields.iter().map(|f| random_value(rng, &f.ty)).collect()),
        Type::List(item) => Value::List((0..rng.below(3)).map(|_| random_value(rng, item)).collect()),
        Type::Map { key, value } => {
            let mut map = BTreeMap::new();
            for _ in 0..rng.below(3) {
                map.insert(random_key(rng, *key), random_value(rng, value));
            }
            Value::Map(map)
        }
    }
}

pub fn random_key(rng: &mut Rng, kind: KeyKind) -> Key {
    match kind {
        KeyKind::Int => Key::Int(rng.below(4) as i64 - 1),
        KeyKind::String => Key::str(["p0", "p1", "p2", "p3", "x"][rng.below(5) as usize]),
    }
}

#[derive(Clone, Debug)]
enum OwnedStep {
    Field(u16),
    Key(Key),
    Index(u32),
}

fn borrowed(path: &[OwnedStep]) -> Vec<Step<'_>> {
    path.iter()
        .map(|s| match s {
            OwnedStep::Field(f) => Step::Field(*f),
            OwnedStep::Key(k) => Step::Key(k),
            OwnedStep::Index(i) => Step::Index(*i),
        })
        .collect()
}

/// Makes one random write that fits the schema: set, remove, push, truncate or cap, somewhere in
/// the tree.
pub fn random_write(rng: &mut Rng, def: &SchemaDef, state: &mut State) {
    let mut path = Vec::new();
    let mut fields = &def.fields;
    loop {
        let i = rng.below(fields.len() as u64) as usize;
        path.push(OwnedStep::Field(i as u16));
        let mut ty = &fields[i].ty;
        loop {
            match ty {
                Type::Struct(inner) if rng.chance(70) => {
                    fields = inner;
                    break;
                }
                Type::Map { key, value } if rng.chance(75) => {
                    let key = random_key(rng, *key);
                    let present =
                        matches!(state.get(&borrowed(&path)), Ok(Value::Map(m)) if m.contains_key(&key));
                    path.push(OwnedStep::Key(key));
                    if !present || rng.chance(40) {
                        let v = random_value(rng, value);
                        state.set(&borrowed(&path), v).unwrap();
                        return;
                    }
                    if rng.chance(35) {
                        assert!(state.remove(&borrowed(&path)).unwrap());
                        return;
                    }
                    ty = value;
                }
                Type::List(item) if rng.chance(75) => {
                    let len = state.len(&borrowed(&path)).unwrap();
                    match rng.below(10) {
                        0..=2 => {
                            let v = random_value(rng, item);
                            state.push(&borrowed(&path), v).unwrap();
                            return;
                        }
                        3 => {
                            let n = rng.below(len as u64 + 1) as usize;
                            state.truncate(&borrowed(&path), n).unwrap();
                            return;
                        }
                        4 => {
                            let n = rng.below(len as u64 + 1) as usize;
                            state.cap_list(&borrowed(&path), n).unwrap();
                            return;
                        }
                        _ if len > 0 => {
                            path.push(OwnedStep::Index(rng.below(len as u64) as u32));
                            ty = item;
                        }
                        _ => {
                            let v = random_value(rng, item);
                            state.push(&borrowed(&path), v).unwrap();
                            return;
                        }
                    }
                }
                _ => {
                    let v = random_value(rng, ty);
                    state.set(&borrowed(&path), v).unwrap();
                    return;
                }
            }
        }
    }
}

pub fn compile(def: &SchemaDef) -> Arc<Schema> {
    Schema::compile(def.clone(), filters()).expect("random schemas are valid")
}

/// `view` with `player`'s own entries removed from every player-keyed map: what a subscriber
/// that skips its own entries sees.
pub fn without_own(fields: &[Field], view: Value, player: &Key) -> Value {
    let Value::Struct(values) = view else { return view };
    Value::Struct(
        fields
            .iter()
            .zip(values)
            .map(|(f, v)| {
                let v = if f.player_keyed {
                    match v {
                        Value::Map(mut m) => {
                            m.remove(player);
                            Value::Map(m)
                        }
                        other => other,
                    }
                } else {
                    v
                };
                strip_in(&f.ty, v, player)
            })
            .collect(),
    )
}

fn strip_in(ty: &Type, v: Value, player: &Key) -> Value {
    match (ty, v) {
        (Type::Struct(fields), v) => without_own(fields, v, player),
        (Type::List(item), Value::List(items)) => {
            Value::List(items.into_iter().map(|x| strip_in(item, x, player)).collect())
        }
        (Type::Map { value, .. }, Value::Map(m)) => {
            Value::Map(m.into_iter().map(|(k, x)| (k, strip_in(value, x, player))).collect())
        }
        (_, v) => v,
    }
}
