//! Compact binary (`application/x-ue-cb`), the self-describing format Unreal's DDC speaks:
//! refs (cache records), batch requests and the server's answers are all compact-binary
//! objects. The format is in `compact-binary.md` of the DDC specs; the test vectors in
//! `crates/ddc/tests/fixtures/ddc-vectors.json` come from an independent implementation.
//!
//! Split by direction: [`reader`] validates untrusted bytes once and then reads them in place
//! (zero-copy [`Field`]s); [`writer`] builds objects the way the engine's writer does (the
//! uniform-container choice included), so the server's answers are byte-identical to what an
//! editor expects. Nothing here normalises a stored object: the bytes a client sent are the
//! bytes hashed and kept.

mod json;
mod package;
mod reader;
mod varuint;
mod writer;

pub use json::to_json;
pub use package::{Entry, EntryFlags, Package, PackageError, table_bytes};
pub use reader::{Field, Fields, parse};
pub use varuint::{read_varuint, write_varuint};
pub use writer::Value;

/// A field's type: the low five bits of its type byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CbType {
    Null = 0x01,
    Object = 0x02,
    UniformObject = 0x03,
    Array = 0x04,
    UniformArray = 0x05,
    Binary = 0x06,
    String = 0x07,
    IntegerPositive = 0x08,
    IntegerNegative = 0x09,
    Float32 = 0x0a,
    Float64 = 0x0b,
    BoolFalse = 0x0c,
    BoolTrue = 0x0d,
    ObjectAttachment = 0x0e,
    BinaryAttachment = 0x0f,
    Hash = 0x10,
    Uuid = 0x11,
    DateTime = 0x12,
    TimeSpan = 0x13,
    ObjectId = 0x14,
    CustomById = 0x1e,
    CustomByName = 0x1f,
}

/// The type byte's flag: the field carries a name.
pub const HAS_NAME: u8 = 0x80;

impl CbType {
    /// The type of a type byte, or why it is not one.
    pub fn from_byte(byte: u8) -> Result<CbType, CbError> {
        if byte & 0x60 != 0 {
            return Err(CbError::TypeFlags(byte));
        }
        use CbType::*;
        Ok(match byte & 0x1f {
            0x01 => Null,
            0x02 => Object,
            0x03 => UniformObject,
            0x04 => Array,
            0x05 => UniformArray,
            0x06 => Binary,
            0x07 => String,
            0x08 => IntegerPositive,
            0x09 => IntegerNegative,
            0x0a => Float32,
            0x0b => Float64,
            0x0c => BoolFalse,
            0x0d => BoolTrue,
            0x0e => ObjectAttachment,
            0x0f => BinaryAttachment,
            0x10 => Hash,
            0x11 => Uuid,
            0x12 => DateTime,
            0x13 => TimeSpan,
            0x14 => ObjectId,
            0x1e => CustomById,
            0x1f => CustomByName,
            _ => return Err(CbError::UnknownType(byte & 0x1f)),
        })
    }

    pub fn is_object(self) -> bool {
        matches!(self, CbType::Object | CbType::UniformObject)
    }

    pub fn is_array(self) -> bool {
        matches!(self, CbType::Array | CbType::UniformArray)
    }

    /// Types whose value is empty: never the item type of a uniform array.
    fn is_empty_value(self) -> bool {
        matches!(self, CbType::Null | CbType::BoolFalse | CbType::BoolTrue)
    }

    /// Size of a fixed-size value, `None` for the variable-size types.
    fn fixed_size(self) -> Option<usize> {
        use CbType::*;
        match self {
            Null | BoolFalse | BoolTrue => Some(0),
            Float32 => Some(4),
            Float64 | DateTime | TimeSpan => Some(8),
            ObjectId => Some(12),
            Uuid => Some(16),
            ObjectAttachment | BinaryAttachment | Hash => Some(20),
            _ => None,
        }
    }
}

/// Why bytes are not valid compact binary. Each names what was wrong, for a 400's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CbError {
    #[error("the data ends inside a field")]
    Truncated,
    #[error("a compact-binary body must be one object (type 0x02 or 0x03), not type {0:#04x}")]
    NotAnObject(u8),
    #[error("{0} bytes follow the object")]
    TrailingBytes(usize),
    #[error("type byte {0:#04x} has reserved flags set")]
    TypeFlags(u8),
    #[error("unknown field type {0:#04x}")]
    UnknownType(u8),
    #[error("an object field has no name, or an array item has one")]
    Naming,
    #[error("an object field has an empty name")]
    EmptyName,
    #[error("a name or string is not UTF-8")]
    Utf8,
    #[error("a uniform array cannot hold empty values (type {0:#04x})")]
    EmptyUniformItem(u8),
    #[error("an array declares {declared} items but holds {found}")]
    ItemCount { declared: u64, found: u64 },
    #[error("a field's value does not fill its container exactly")]
    Size,
    #[error("nesting deeper than {0} levels")]
    TooDeep(usize),
}

/// How deep objects and arrays may nest: hostile input cannot exhaust the stack.
pub const MAX_DEPTH: usize = 256;
