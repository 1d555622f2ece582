//! Plain values: what game code writes into a state tree and what a client's replica holds.
//!
//! The engine's own tree (`tree.rs`) carries versions for dirty tracking; `Value` carries none, so
//! it is the currency at the edges: writes, custom filters, replicas and test oracles.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A map key: maps are keyed by integer or by string, as the schema says. Player ids are keys too.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    Int(i64),
    Str(Arc<str>),
}

impl Key {
    pub fn str(s: &str) -> Key {
        Key::Str(Arc::from(s))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Int(i) => write!(f, "{i}"),
            Key::Str(s) => write!(f, "{s:?}"),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Int(i) => write!(f, "{i}"),
            Key::Str(s) => f.write_str(s),
        }
    }
}

impl From<i64> for Key {
    fn from(v: i64) -> Key {
        Key::Int(v)
    }
}

impl From<&str> for Key {
    fn from(v: &str) -> Key {
        Key::str(v)
    }
}

/// A value of any schema type. Structs hold every field, in schema order.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Bytes(Bytes),
    Vec3([f64; 3]),
    Struct(Vec<Value>),
    List(Vec<Value>),
    Map(BTreeMap<Key, Value>),
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Int(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Float(v)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Str(v.to_owned())
    }
}

/// Float quantization: values are clamped to `[min, max]` and sent as a whole number of `precision`
/// steps above `min`, as a varint.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Quant {
    pub min: f64,
    pub max: f64,
    pub precision: f64,
}

impl Quant {
    /// The largest step count; checked at schema compile time to fit in 2^53.
    pub fn max_steps(&self) -> u64 {
        ((self.max - self.min) / self.precision).round() as u64
    }

    /// The step count that `v` is sent as. NaN maps to `min`.
    pub fn quantize(&self, v: f64) -> u64 {
        if v.is_nan() {
            return 0;
        }
        let clamped = v.clamp(self.min, self.max);
        (((clamped - self.min) / self.precision).round() as u64).min(self.max_steps())
    }

    /// The value a receiver reconstructs from a step count.
    pub fn dequantize(&self, steps: u64) -> f64 {
        self.min + steps as f64 * self.precision
    }

    /// What a receiver sees for `v`: `dequantize(quantize(v))`.
    pub fn round_trip(&self, v: f64) -> f64 {
        self.dequantize(self.quantize(v))
    }
}
