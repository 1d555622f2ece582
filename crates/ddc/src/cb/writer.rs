//! Writing compact binary the way the engine's writer does: a container is uniform when it
//! has at least one field and all its fields share a type byte (empty-valued types only in
//! objects), a negative integer is IntegerNegative, and a float is Float32 when that is exact.
//! Used for what the server builds (answers, wrappers); what clients send is stored as sent.

use super::varuint::write_varuint;
use super::{CbType, Field, HAS_NAME};

/// An owned compact-binary value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Object(Vec<(String, Value)>),
    Array(Vec<Value>),
    Binary(Vec<u8>),
    String(String),
    Integer(i128),
    Float(f64),
    Bool(bool),
    ObjectAttachment([u8; 20]),
    BinaryAttachment([u8; 20]),
    Hash([u8; 20]),
    Uuid([u8; 16]),
    DateTime(i64),
    TimeSpan(i64),
    ObjectId([u8; 12]),
    /// A value kept exactly as encoded (everything after the type byte): CustomById and
    /// CustomByName fields, and stored objects embedded unchanged in an answer.
    Encoded(CbType, Vec<u8>),
}

impl Value {
    /// A serialized object (type byte, then value), embedded without re-encoding; `None` if
    /// `bytes` does not start with an object type byte.
    pub fn embed_object(bytes: &[u8]) -> Option<Value> {
        let (&first, rest) = bytes.split_first()?;
        let ty = CbType::from_byte(first).ok().filter(|t| t.is_object() && first & HAS_NAME == 0)?;
        Some(Value::Encoded(ty, rest.to_vec()))
    }

    /// The bytes of a standalone field: its type byte, then its value (what an HTTP body holds
    /// for an object).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let (ty, value) = self.encode();
        out.push(ty as u8);
        out.extend_from_slice(&value);
        out
    }

    /// The type and the value bytes.
    fn encode(&self) -> (CbType, Vec<u8>) {
        let mut out = Vec::new();
        let ty = match self {
            Value::Null => CbType::Null,
            Value::Bool(false) => CbType::BoolFalse,
            Value::Bool(true) => CbType::BoolTrue,
            Value::Integer(v) if *v < 0 => {
                write_varuint(&mut out, u64::try_from(-1 - *v).unwrap_or(u64::MAX));
                CbType::IntegerNegative
            }
            Value::Integer(v) => {
                write_varuint(&mut out, u64::try_from(*v).unwrap_or(u64::MAX));
                CbType::IntegerPositive
            }
            Value::Float(f) => {
                let single = *f as f32;
                if f64::from(single) == *f || f.is_nan() {
                    out.extend_from_slice(&single.to_be_bytes());
                    CbType::Float32
                } else {
                    out.extend_from_slice(&f.to_be_bytes());
                    CbType::Float64
                }
            }
            Value::Binary(b) => {
                write_varuint(&mut out, b.len() as u64);
                out.extend_from_slice(b);
                CbType::Binary
            }
            Value::String(s) => {
                write_varuint(&mut out, s.len() as u64);
                out.extend_from_slice(s.as_bytes());
                CbType::String
            }
            Value::ObjectAttachment(h) => fixed(&mut out, h, CbType::ObjectAttachment),
            Value::BinaryAttachment(h) => fixed(&mut out, h, CbType::BinaryAttachment),
            Value::Hash(h) => fixed(&mut out, h, CbType::Hash),
            Value::Uuid(u) => fixed(&mut out, u, CbType::Uuid),
            Value::ObjectId(o) => fixed(&mut out, o, CbType::ObjectId),
            Value::DateTime(t) => fixed(&mut out, &t.to_be_bytes(), CbType::DateTime),
            Value::TimeSpan(t) => fixed(&mut out, &t.to_be_bytes(), CbType::TimeSpan),
            Value::Encoded(ty, bytes) => fixed(&mut out, bytes, *ty),
            Value::Object(fields) => {
                let encoded: Vec<(u8, Vec<u8>)> = fields
                    .iter()
                    .map(|(name, v)| {
                        let (t, value) = v.encode();
                        let mut field = Vec::new();
                        write_varuint(&mut field, name.len() as u64);
                        field.extend_from_slice(name.as_bytes());
                        field.extend_from_slice(&value);
                        (t as u8 | HAS_NAME, field)
                    })
                    .collect();
                return container(encoded, None, true);
            }
            Value::Array(items) => {
                let encoded: Vec<(u8, Vec<u8>)> = items
                    .iter()
                    .map(|v| {
                        let (t, value) = v.encode();
                        (t as u8, value)
                    })
                    .collect();
                return container(encoded, Some(items.len() as u64), false);
            }
        };
        (ty, out)
    }

    /// The value of a validated field, owned.
    pub fn from_field(field: &Field<'_>) -> Value {
        let v = field.value;
        let fixed_array = |n: usize| -> Vec<u8> { v.get(..n).map(<[u8]>::to_vec).unwrap_or_default() };
        let h20 = || <[u8; 20]>::try_from(fixed_array(20).as_slice()).unwrap_or([0; 20]);
        let i64be = || i64::from_be_bytes(<[u8; 8]>::try_from(fixed_array(8).as_slice()).unwrap_or([0; 8]));
        match field.ty {
            CbType::Null => Value::Null,
            CbType::BoolFalse => Value::Bool(false),
            CbType::BoolTrue => Value::Bool(true),
            CbType::IntegerPositive | CbType::IntegerNegative => Value::Integer(field.as_i128().unwrap_or(0)),
            CbType::Float32 => Value::Float(f64::from(f32::from_be_bytes(
                <[u8; 4]>::try_from(fixed_array(4).as_slice()).unwrap_or([0; 4]),
            ))),
            CbType::Float64 => Value::Float(f64::from_be_bytes(
                <[u8; 8]>::try_from(fixed_array(8).as_slice()).unwrap_or([0; 8]),
            )),
            CbType::Binary => Value::Binary(field.as_binary().unwrap_or_default().to_vec()),
            CbType::String => Value::String(field.as_str().unwrap_or_default().to_owned()),
            CbType::ObjectAttachment => Value::ObjectAttachment(h20()),
            CbType::BinaryAttachment => Value::BinaryAttachment(h20()),
            CbType::Hash => Value::Hash(h20()),
            CbType::Uuid => Value::Uuid(<[u8; 16]>::try_from(fixed_array(16).as_slice()).unwrap_or([0; 16])),
            CbType::ObjectId => {
                Value::ObjectId(<[u8; 12]>::try_from(fixed_array(12).as_slice()).unwrap_or([0; 12]))
            }
            CbType::DateTime => Value::DateTime(i64be()),
            CbType::TimeSpan => Value::TimeSpan(i64be()),
            CbType::CustomById | CbType::CustomByName => Value::Encoded(field.ty, v.to_vec()),
            CbType::Object | CbType::UniformObject => Value::Object(
                field
                    .iter()
                    .map(|f| (f.name.unwrap_or_default().to_owned(), Value::from_field(&f)))
                    .collect(),
            ),
            CbType::Array | CbType::UniformArray => {
                Value::Array(field.iter().map(|f| Value::from_field(&f)).collect())
            }
        }
    }
}

fn fixed(out: &mut Vec<u8>, bytes: &[u8], ty: CbType) -> CbType {
    out.extend_from_slice(bytes);
    ty
}

/// Size (and count), then the children: uniform when they all share a type byte and it is not
/// an empty-valued type (unless the children are named).
fn container(children: Vec<(u8, Vec<u8>)>, count: Option<u64>, named: bool) -> (CbType, Vec<u8>) {
    let first = children.first().map(|(t, _)| *t);
    let empty_valued = |t: u8| matches!(t & 0x1f, 0x01 | 0x0c | 0x0d);
    let uniform = first.filter(|&t| children.iter().all(|(u, _)| *u == t) && (named || !empty_valued(t)));
    let mut payload = Vec::new();
    if let Some(n) = count {
        write_varuint(&mut payload, n);
    }
    if let Some(t) = uniform {
        payload.push(t);
    }
    for (t, bytes) in &children {
        if uniform.is_none() {
            payload.push(*t);
        }
        payload.extend_from_slice(bytes);
    }
    let ty = match (count.is_some(), uniform.is_some()) {
        (false, false) => CbType::Object,
        (false, true) => CbType::UniformObject,
        (true, false) => CbType::Array,
        (true, true) => CbType::UniformArray,
    };
    let mut out = Vec::new();
    write_varuint(&mut out, payload.len() as u64);
    out.extend_from_slice(&payload);
    (ty, out)
}
