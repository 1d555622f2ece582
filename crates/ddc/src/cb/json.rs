//! The JSON rendering of a compact-binary field (compact-binary.md section 10), for refs read
//! as `.json`: attachments and hashes as lowercase hex, binary as base64, integers over the
//! whole 64-bit range. Where the spec leaves the text open (Uuid, DateTime, TimeSpan, custom
//! types) this follows the test vectors' generator: the usual GUID text, ticks as numbers,
//! custom payloads as base64.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Number, Value as Json};

use super::varuint::read_varuint;
use super::{CbType, Field};

/// A validated field as JSON.
pub fn to_json(field: &Field<'_>) -> Json {
    let v = field.value;
    match field.ty {
        CbType::Null => Json::Null,
        CbType::BoolFalse => Json::Bool(false),
        CbType::BoolTrue => Json::Bool(true),
        CbType::IntegerPositive | CbType::IntegerNegative => match field.as_i128() {
            Some(i) => i64::try_from(i)
                .map(Number::from)
                .or_else(|_| u64::try_from(i).map(Number::from))
                .map_or(Json::Null, Json::Number),
            None => Json::Null,
        },
        CbType::Float32 => float(v.try_into().map(f32::from_be_bytes).map(f64::from).ok()),
        CbType::Float64 => float(v.try_into().map(f64::from_be_bytes).ok()),
        CbType::String => Json::String(field.as_str().unwrap_or_default().to_owned()),
        CbType::Binary => Json::String(STANDARD.encode(field.as_binary().unwrap_or_default())),
        CbType::Hash | CbType::ObjectAttachment | CbType::BinaryAttachment | CbType::ObjectId => {
            Json::String(hex::encode(v))
        }
        CbType::Uuid => {
            let h = hex::encode(v);
            let text = if h.len() == 32 {
                format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
            } else {
                h
            };
            Json::String(text)
        }
        CbType::DateTime | CbType::TimeSpan => {
            v.try_into().map(i64::from_be_bytes).map(|t| Json::Number(t.into())).unwrap_or(Json::Null)
        }
        CbType::CustomById | CbType::CustomByName => {
            Json::String(STANDARD.encode(custom_payload(field.ty, v)))
        }
        CbType::Object | CbType::UniformObject => {
            let mut map = Map::new();
            for child in field.iter() {
                map.insert(child.name.unwrap_or_default().to_owned(), to_json(&child));
            }
            Json::Object(map)
        }
        CbType::Array | CbType::UniformArray => Json::Array(field.iter().map(|f| to_json(&f)).collect()),
    }
}

fn float(f: Option<f64>) -> Json {
    f.and_then(Number::from_f64).map_or(Json::Null, Json::Number)
}

/// The bytes of a custom value after its total size and its sub-type (id or name).
fn custom_payload(ty: CbType, value: &[u8]) -> &[u8] {
    let Ok((_, size_len)) = read_varuint(value) else { return &[] };
    let rest = &value[size_len..];
    let Ok((sub, sub_len)) = read_varuint(rest) else { return &[] };
    // A name's length is untrusted: one past the value reads as no payload, not as a wrap.
    let skip = if ty == CbType::CustomByName {
        usize::try_from(sub).ok().and_then(|n| n.checked_add(sub_len))
    } else {
        Some(sub_len)
    };
    skip.and_then(|skip| rest.get(skip..)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cb::varuint::write_varuint;

    /// A custom-by-name value whose name length is past anything (2^64 − 1) has no payload; it
    /// used to wrap (release) or overflow (debug, fuzz).
    #[test]
    fn a_custom_name_longer_than_the_value_gives_no_payload() {
        let mut value = Vec::new();
        write_varuint(&mut value, 12); // The value's size.
        write_varuint(&mut value, u64::MAX); // The name's length.
        value.extend_from_slice(b"payload");
        assert_eq!(custom_payload(CbType::CustomByName, &value), b"");
        // A name that fits: the payload after it.
        let mut value = Vec::new();
        write_varuint(&mut value, 9);
        write_varuint(&mut value, 2);
        value.extend_from_slice(b"idpayload");
        assert_eq!(custom_payload(CbType::CustomByName, &value), b"payload");
    }
}
