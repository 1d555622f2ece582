//! Plain values from JSON, typed by the schema: one reader shared by the JSON replica, by
//! patches that game servers send as JSON ops, and by `State::set_json` (entity values). Also
//! JSON Pointer paths resolved against the schema.
//!
//! One reader, so that a value is taken or refused the same way wherever it comes from. It reads
//! the text straight into the schema's type, and refuses an object that names a field or a key
//! twice (`{"hp":1,"hp":2}`), and an int key or list index written another way than the encoders
//! write it (`"01"`, `"+1"`: else `"1"` and `"01"` would name one key twice): which copy would win
//! is not something two readers, or two languages, agree on.

use bytes::Bytes;
use serde::Deserialize;
use serde::de::DeserializeSeed as _;
use serde_json::value::RawValue;

use crate::schema::{KeyKind, Kind, ROOT, Schema, TypeId};
use crate::value::{Key, Value};

/// One line of the JSON format: an op, a JSON Pointer, and maybe a value. Used by the JSON
/// replica (updates) and by patches.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct JsonOp<'a> {
    pub op: String,
    pub path: String,
    /// The value's text, read with [`from_json_str`] against the type at `path`. `null` is a
    /// value (a float that is not finite), not a missing one.
    #[serde(default, borrow, deserialize_with = "present")]
    pub value: Option<&'a RawValue>,
}

/// A field that is there, whatever its value (serde would read `null` as absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

impl JsonOp<'_> {
    /// The value as a count (`len`, `cap`, `truncate`), if it is one.
    pub fn count(&self) -> Option<u64> {
        serde_json::from_str(self.value?.get()).ok()
    }
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

/// Whether `s` is a decimal integer written the one way the encoders write it:
/// `-?(0|[1-9][0-9]*)`, without `-0` (and without a sign at all unless `signed`).
fn canonical_decimal(s: &str, signed: bool) -> bool {
    let digits = if signed { s.strip_prefix('-').unwrap_or(s) } else { s };
    match digits.as_bytes() {
        [b'0'] => digits.len() == s.len(),
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    }
}

/// A map key from its text. An int key must be written the one way the encoders write it
/// (`-?(0|[1-9][0-9]*)`, no `-0`), so that two texts never name the same key.
pub(crate) fn parse_key(kind: KeyKind, s: &str) -> Result<Key, String> {
    match kind {
        KeyKind::Int => match s.parse() {
            Ok(n) if canonical_decimal(s, true) => Ok(Key::Int(n)),
            _ => Err(format!("bad int key {s:?}: not a decimal i64 written without `+` or leading zeros")),
        },
        KeyKind::String => Ok(Key::str(s)),
    }
}

/// A list index from a path segment, written as the encoders write it (`0|[1-9][0-9]*`).
pub(crate) fn parse_index(s: &str) -> Result<u32, String> {
    match s.parse() {
        Ok(i) if canonical_decimal(s, false) => Ok(i),
        _ => Err(format!("bad list index {s:?}")),
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
                steps.push(PathBuf::Index(parse_index(&seg)?));
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

/// A value of type `ty` from its JSON form (as the JSON codec writes it, docs/protocol.md
/// section 12.3): missing struct fields are defaults; unknown or repeated fields, repeated map
/// keys, and text after the value are errors. Read straight from the text, without building a
/// `serde_json::Value` first: game servers send every entity's value as JSON on every frame, and
/// the spatial world reads them all.
pub(crate) fn from_json_str(schema: &Schema, ty: TypeId, text: &str) -> Result<Value, String> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = Typed { schema, ty }.deserialize(&mut de).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    Ok(value)
}

/// The schema type a JSON value must fit, as a serde seed.
#[derive(Clone, Copy)]
struct Typed<'a> {
    schema: &'a Schema,
    ty: TypeId,
}

impl Typed<'_> {
    fn kind(&self) -> &Kind {
        &self.schema.node(self.ty).kind
    }

    fn at(&self, ty: TypeId) -> Self {
        Typed { schema: self.schema, ty }
    }

    fn mismatch<E: serde::de::Error>(&self, found: &str) -> E {
        E::custom(format!("{found} does not fit {:?}", self.kind()))
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Typed<'_> {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Typed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a JSON value of type {:?}", self.kind())
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Value, E> {
        match self.kind() {
            Kind::Int => Ok(Value::Int(n)),
            Kind::Float(_) => Ok(Value::Float(n as f64)),
            _ => Err(self.mismatch(&format!("number {n}"))),
        }
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Value, E> {
        match (self.kind(), i64::try_from(n)) {
            (Kind::Int, Ok(n)) => Ok(Value::Int(n)),
            (Kind::Float(_), _) => Ok(Value::Float(n as f64)),
            _ => Err(self.mismatch(&format!("number {n}"))),
        }
    }

    fn visit_f64<E: serde::de::Error>(self, x: f64) -> Result<Value, E> {
        match self.kind() {
            Kind::Float(_) => Ok(Value::Float(x)),
            _ => Err(self.mismatch(&format!("number {x}"))),
        }
    }

    fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<Value, E> {
        match self.kind() {
            Kind::Bool => Ok(Value::Bool(b)),
            _ => Err(self.mismatch(&format!("{b}"))),
        }
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Value, E> {
        match self.kind() {
            Kind::Str => Ok(Value::Str(s.to_owned())),
            Kind::Bytes => hex::decode(s)
                .map(|b| Value::Bytes(Bytes::from(b)))
                .map_err(|_| self.mismatch(&format!("string {s:?}"))),
            _ => Err(self.mismatch(&format!("string {s:?}"))),
        }
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
        match self.kind() {
            Kind::Float(_) => Ok(Value::Float(f64::NAN)),
            _ => Err(self.mismatch("null")),
        }
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        match self.kind() {
            Kind::Vec3(_) => {
                let mut c = [0.0; 3];
                for (i, slot) in c.iter_mut().enumerate() {
                    // A part that is not finite is written as `null`, as a float is.
                    let n: Option<Option<serde_json::Number>> = seq.next_element()?;
                    *slot = match n {
                        Some(Some(n)) => n.as_f64(),
                        Some(None) => Some(f64::NAN),
                        None => None,
                    }
                    .ok_or_else(|| self.mismatch(&format!("an array whose item {i} is not a number")))?;
                }
                if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    return Err(self.mismatch("an array of more than 3 items"));
                }
                Ok(Value::Vec3(c))
            }
            Kind::List(item) => {
                let item = self.at(*item);
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
                while let Some(v) = seq.next_element_seed(item)? {
                    items.push(v);
                }
                Ok(Value::List(items))
            }
            _ => Err(self.mismatch("an array")),
        }
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        match self.kind() {
            Kind::Struct(decl) => {
                let mut values: Vec<Option<Value>> = vec![None; decl.len()];
                while let Some(KeyText(name)) = map.next_key()? {
                    let i = decl
                        .iter()
                        .position(|f| *f.name == *name)
                        .ok_or_else(|| serde::de::Error::custom(format!("no field {name:?}")))?;
                    if values[i].is_some() {
                        return Err(serde::de::Error::custom(format!("field {name:?} appears twice")));
                    }
                    values[i] = Some(map.next_value_seed(self.at(decl[i].ty))?);
                }
                let values = values.into_iter().zip(decl.iter());
                Ok(Value::Struct(
                    values.map(|(v, f)| v.unwrap_or_else(|| self.schema.default_value(f.ty))).collect(),
                ))
            }
            Kind::Map { key, value } => {
                let mut out = std::collections::BTreeMap::new();
                while let Some(KeyText(text)) = map.next_key()? {
                    let k = parse_key(*key, &text).map_err(serde::de::Error::custom)?;
                    match out.entry(k) {
                        std::collections::btree_map::Entry::Vacant(slot) => {
                            slot.insert(map.next_value_seed(self.at(*value))?);
                        }
                        std::collections::btree_map::Entry::Occupied(slot) => {
                            let msg = format!("key {text:?} appears twice (as key {})", slot.key());
                            return Err(serde::de::Error::custom(msg));
                        }
                    }
                }
                Ok(Value::Map(out))
            }
            _ => Err(self.mismatch("an object")),
        }
    }
}

/// An object's key, borrowed from the text unless it has escapes.
struct KeyText<'de>(std::borrow::Cow<'de, str>);

impl<'de> Deserialize<'de> for KeyText<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = KeyText<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, s: &'de str) -> Result<KeyText<'de>, E> {
                Ok(KeyText(std::borrow::Cow::Borrowed(s)))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<KeyText<'de>, E> {
                Ok(KeyText(std::borrow::Cow::Owned(s.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use serde_json::Value as J;

    use super::*;
    use crate::schema::{Field, SchemaDef, Type};

    /// The reference reader for the property tests: the same rules over a parsed
    /// `serde_json::Value`, written as plainly as possible. It cannot see a key repeated in the
    /// text (parsing keeps one copy), so those cases are written out in
    /// [`repeated_fields_and_keys_are_refused`].
    fn from_json(schema: &Schema, ty: TypeId, v: &J) -> Result<Value, String> {
        let mismatch = || format!("value {v} does not fit {:?}", schema.node(ty).kind);
        Ok(match (&schema.node(ty).kind, v) {
            (Kind::Int, J::Number(n)) => Value::Int(n.as_i64().ok_or_else(mismatch)?),
            (Kind::Float(_), J::Number(n)) => Value::Float(n.as_f64().ok_or_else(mismatch)?),
            (Kind::Float(_), J::Null) => Value::Float(f64::NAN),
            (Kind::Bool, J::Bool(b)) => Value::Bool(*b),
            (Kind::Str, J::String(s)) => Value::Str(s.clone()),
            (Kind::Bytes, J::String(s)) => Value::Bytes(Bytes::from(hex::decode(s).map_err(|_| mismatch())?)),
            (Kind::Vec3(_), J::Array(a)) if a.len() == 3 => {
                let c =
                    |i: usize| if a[i].is_null() { Ok(f64::NAN) } else { a[i].as_f64().ok_or_else(mismatch) };
                Value::Vec3([c(0)?, c(1)?, c(2)?])
            }
            (Kind::Struct(decl), J::Object(obj)) => {
                let mut values: Vec<Value> = decl.iter().map(|f| schema.default_value(f.ty)).collect();
                for (name, fv) in obj {
                    let i = decl
                        .iter()
                        .position(|f| &*f.name == name)
                        .ok_or_else(|| format!("no field {name:?}"))?;
                    values[i] = from_json(schema, decl[i].ty, fv)?;
                }
                Value::Struct(values)
            }
            (Kind::List(item), J::Array(a)) => {
                Value::List(a.iter().map(|x| from_json(schema, *item, x)).collect::<Result<_, _>>()?)
            }
            (Kind::Map { key, value }, J::Object(obj)) => {
                let mut out = std::collections::BTreeMap::new();
                for (k, x) in obj {
                    if out.insert(parse_key(*key, k)?, from_json(schema, *value, x)?).is_some() {
                        return Err(format!("key {k:?} appears twice"));
                    }
                }
                Value::Map(out)
            }
            _ => return Err(mismatch()),
        })
    }

    fn schema() -> std::sync::Arc<Schema> {
        let entity = Type::Struct(vec![
            Field::new("pos", Type::Vec3),
            Field::new("yaw", Type::Float),
            Field::new("tags", Type::list(Type::String)),
        ]);
        Schema::new(SchemaDef::new([
            Field::new("i", Type::Int),
            Field::new("f", Type::Float),
            Field::new("b", Type::Bool),
            Field::new("s", Type::String),
            Field::new("by", Type::Bytes),
            Field::new("v", Type::Vec3),
            Field::new("l", Type::list(Type::Int)),
            Field::new("m", Type::map(KeyKind::Int, entity)),
            Field::new("n", Type::map(KeyKind::String, Type::Float)),
        ]))
        .unwrap()
    }

    /// Both readers on one text: `Some(debug form)` if it fits, `None` if not (NaN compares by
    /// its debug form).
    fn both(schema: &Schema, text: &str) -> (Option<String>, Option<String>) {
        let direct = from_json_str(schema, ROOT, text).ok().map(|v| format!("{v:?}"));
        let via_value = serde_json::from_str::<J>(text)
            .ok()
            .and_then(|j| from_json(schema, ROOT, &j).ok())
            .map(|v| format!("{v:?}"));
        (direct, via_value)
    }

    fn json_value() -> impl Strategy<Value = J> {
        let key = prop::sample::select(vec![
            "i", "f", "b", "s", "by", "v", "l", "m", "n", "pos", "yaw", "tags", "7", "-3", "07", "+7", "x",
        ]);
        let leaf = prop_oneof![
            Just(J::Null),
            any::<bool>().prop_map(J::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            (i64::MAX as u64..=u64::MAX).prop_map(|n| json!(n)),
            (-1e6f64..1e6).prop_map(|x| json!(x)),
            prop::sample::select(vec!["", "0aff", "zz", "héllo"]).prop_map(|s| json!(s)),
        ];
        leaf.prop_recursive(4, 48, 5, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(J::Array),
                prop::collection::vec((key.clone(), inner), 0..5)
                    .prop_map(|kv| J::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
            ]
        })
    }

    /// JSON that fits [`schema`] more often than not, so the agreeing `Ok` case is exercised.
    fn fitting() -> impl Strategy<Value = J> {
        let entity =
            (any::<[i16; 3]>(), prop::option::of(-4.0f64..4.0), prop::collection::vec("[a-z]{0,3}", 0..3))
                .prop_map(|(p, yaw, tags)| json!({"pos": p, "yaw": yaw, "tags": tags}));
        (
            any::<i64>(),
            prop::option::of(any::<f32>().prop_filter("finite", |x| x.is_finite())),
            any::<bool>(),
            "\\PC{0,6}",
            prop::collection::vec(any::<u8>(), 0..4),
            prop::collection::vec(-9i64..9, 0..4),
            prop::collection::btree_map(any::<i32>(), entity, 0..4),
            prop::collection::btree_map("[a-z\"\\\\/]{0,4}", -1.0f64..1.0, 0..3),
        )
            .prop_map(|(i, f, b, s, by, l, m, n)| {
                let m: serde_json::Map<String, J> = m.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
                json!({"i": i, "f": f, "b": b, "s": s, "by": hex::encode(by), "v": [1, -2.5, 3e3],
                       "l": l, "m": m, "n": n})
            })
    }

    proptest! {
        #[test]
        fn the_direct_reader_agrees_with_the_value_reader_on_any_json(j in json_value()) {
            let schema = schema();
            let text = j.to_string();
            let (direct, via_value) = both(&schema, &text);
            prop_assert_eq!(direct, via_value, "{}", text);
        }

        #[test]
        fn the_direct_reader_reads_what_fits(j in fitting()) {
            let schema = schema();
            let text = j.to_string();
            let (direct, via_value) = both(&schema, &text);
            prop_assert!(direct.is_some(), "{}", text);
            prop_assert_eq!(direct, via_value, "{}", text);
        }
    }

    #[test]
    fn escapes_whitespace_and_trailing_text() {
        let schema = schema();
        // An escaped key is the same key; whitespace around the value is fine.
        let (direct, via_value) = both(&schema, " {\"\\u0069\": 3, \"m\": {\"5\": {\"yaw\": null}}}\n");
        assert!(direct.is_some());
        assert_eq!(direct, via_value);
        // Text after the value, a second value, or a non-object is refused.
        for text in
            ["{} x", "{}{}", "[1]", "", "{\"i\": 1.5}", "{\"nope\": 1}", "{\"v\": [1, 2]}", "{\"by\": \"0\"}"]
        {
            assert!(from_json_str(&schema, ROOT, text).is_err(), "{text}");
        }
    }

    #[test]
    fn repeated_fields_and_keys_are_refused() {
        let schema = schema();
        for text in [
            r#"{"i": 1, "i": 2}"#,
            r#"{"i": 1, "\u0069": 1}"#,
            r#"{"m": {"5": {}, "5": {}}}"#,
            r#"{"m": {"5": {"yaw": 1, "yaw": 1}}}"#,
            r#"{"n": {"a": 1, "a": 1}}"#,
        ] {
            let err = from_json_str(&schema, ROOT, text).unwrap_err();
            assert!(err.contains("appears twice"), "{text}: {err}");
        }
        // Int keys have one spelling, so no two texts name the same key.
        for key in ["01", "+7", "-0", "", "-", "1.0", " 1", "9223372036854775808", "0x1"] {
            let text = format!(r#"{{"m": {{"{key}": {{}}}}}}"#);
            let err = from_json_str(&schema, ROOT, &text).unwrap_err();
            assert!(err.contains("bad int key"), "{text}: {err}");
        }
        for key in ["0", "-1", "9223372036854775807", "-9223372036854775808"] {
            let text = format!(r#"{{"m": {{"{key}": {{}}}}}}"#);
            assert!(from_json_str(&schema, ROOT, &text).is_ok(), "{text}");
        }
        // A vec3 part that is not finite is written as null and read as NaN.
        let Value::Struct(fields) = from_json_str(&schema, ROOT, r#"{"v": [1, null, 2]}"#).unwrap() else {
            panic!("a struct")
        };
        assert!(matches!(fields[5], Value::Vec3([1.0, y, 2.0]) if y.is_nan()), "{:?}", fields[5]);
        assert!(from_json_str(&schema, ROOT, r#"{"v": [1, true, 2]}"#).is_err());
        // The same key in two different objects is fine.
        assert!(from_json_str(&schema, ROOT, r#"{"m": {"1": {"yaw": 1}, "2": {"yaw": 1}}}"#).is_ok());
    }
}
