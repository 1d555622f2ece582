//! Typed errors: a bad schema, a write that does not fit the schema, and bytes a replica cannot
//! apply. None of them is ever a panic.

use thiserror::Error;

/// A schema declaration that cannot be compiled. The string is the field path, like `/players/*/x`.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SchemaError {
    #[error("schema file: {0}")]
    Parse(String),
    #[error("{0}: field names must be non-empty and unique within a struct")]
    BadFieldName(String),
    #[error("{path}: `{what}` applies only to maps")]
    NotAMap { path: String, what: &'static str },
    #[error(
        "{0}: owner_only, custom and player_keyed fields cannot sit inside an owner_only or custom field"
    )]
    NestedPrivate(String),
    #[error("{path}: no custom filter named `{name}` was registered")]
    UnknownFilter { path: String, name: String },
    #[error("{0}: quantization needs finite min < max, precision > 0, and fewer than 2^53 steps")]
    BadQuantization(String),
    #[error("{0}: nesting deeper than {max} levels", max = crate::schema::MAX_DEPTH)]
    TooDeep(String),
    #[error("{0}: more than {max} fields", max = crate::schema::MAX_FIELDS)]
    TooManyFields(String),
}

/// A write or read that does not fit the schema or the current state. The state is unchanged.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum StateError {
    #[error("path step {step}: expected {expected}")]
    WrongStep { step: usize, expected: &'static str },
    #[error("path step {step}: no field {field}")]
    NoField { step: usize, field: u16 },
    #[error("path step {step}: no entry with key {key}")]
    NoKey { step: usize, key: String },
    #[error("path step {step}: index {index} is out of range (length {len})")]
    NoIndex { step: usize, index: u32, len: usize },
    #[error("value does not match the schema at {0}")]
    TypeMismatch(String),
    #[error("JSON value: {0}")]
    Json(String),
    #[error("this operation needs a {0} at the end of the path")]
    WrongTarget(&'static str),
    #[error("the path is empty")]
    EmptyPath,
    #[error("a delta from version {from} is not available (current {current}, oldest {floor})")]
    Unavailable { from: u64, current: u64, floor: u64 },
    #[error("the state has unsealed writes; call seal() before encoding")]
    Unsealed,
    #[error("prepared at version {prepared} but the state is now at {current} (or has unsealed writes)")]
    Stale { prepared: u64, current: u64 },
    #[error("a list or map of {len} items is longer than this state allows ({max})")]
    TooLong { len: usize, max: usize },
    #[error("the state would hold about {bytes} bytes, more than it allows ({max})")]
    TooBig { bytes: usize, max: usize },
}

/// Bytes a replica could not apply. After one, the replica needs a snapshot.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("truncated update: {0}")]
    Truncated(&'static str),
    #[error("bad varint in {0}")]
    BadVarint(&'static str),
    #[error("unknown update kind {0:#04x}")]
    UnknownKind(u8),
    #[error("delta from version {from} does not apply to a replica at version {have}")]
    VersionMismatch { from: u64, have: u64 },
    #[error("no field {0} in this struct")]
    NoField(u64),
    #[error("operation {op} is not valid for {what}")]
    BadOp { op: u64, what: &'static str },
    #[error("unknown map entry id {0}")]
    UnknownId(u64),
    #[error("map entry id {0} or its key is already present")]
    DuplicateEntry(u64),
    #[error("list index {index} out of range (length {len})")]
    BadIndex { index: u64, len: usize },
    #[error("a length of {0} does not fit in the remaining bytes")]
    BadLength(u64),
    #[error("invalid UTF-8 in a string")]
    BadUtf8,
    #[error("bool byte {0:#04x} is neither 0 nor 1")]
    BadBool(u8),
    #[error("quantized value {0} is out of range")]
    BadQuant(u64),
    #[error("integer out of range")]
    BadInt,
    #[error("malformed JSON update: {0}")]
    Json(String),
    #[error("the replica failed an earlier update and needs a snapshot")]
    NeedsSnapshot,
}
