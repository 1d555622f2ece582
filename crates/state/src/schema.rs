//! Schemas: what a state tree may hold, and who may see each part of it.
//!
//! A schema is declared once, either in Rust with the builder functions below or in a JSON/TOML
//! file (the same serde types), so a game server in any language can register one. It is then
//! compiled into a flat table of type nodes that the tree, the encoders and the replica index by
//! small integers; field indexes are the paths of the binary delta format.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::SchemaError;
use crate::value::{Key, Quant, Value};

/// The deepest nesting a schema may have; it bounds the decoder's recursion.
pub const MAX_DEPTH: usize = 32;
/// The most fields one struct may have.
pub const MAX_FIELDS: usize = 1 << 12;

/// What kind of key a map has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyKind {
    Int,
    String,
}

/// A declared type.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Type {
    Int,
    /// An f64, sent as 8 bytes.
    Float,
    /// An f64 sent as a varint step count; see [`Quant`].
    QuantizedFloat(Quant),
    Bool,
    String,
    Bytes,
    /// Three f64s.
    Vec3,
    /// Three quantized floats sharing one range.
    QuantizedVec3(Quant),
    Struct(Vec<Field>),
    List(Box<Type>),
    Map {
        key: KeyKind,
        value: Box<Type>,
    },
}

impl Type {
    pub fn structure(fields: impl IntoIterator<Item = Field>) -> Type {
        Type::Struct(fields.into_iter().collect())
    }

    pub fn list(item: Type) -> Type {
        Type::List(Box::new(item))
    }

    pub fn map(key: KeyKind, value: Type) -> Type {
        Type::Map { key, value: Box::new(value) }
    }

    pub fn quantized(min: f64, max: f64, precision: f64) -> Type {
        Type::QuantizedFloat(Quant { min, max, precision })
    }
}

/// Who receives a field.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Never leaves the server.
    ServerOnly,
    /// Everyone subscribed sees it.
    #[default]
    Broadcast,
    /// A map keyed by player id: each player sees only its own entry.
    OwnerOnly,
    /// A filter registered under this name maps (player, value) to value-or-nothing.
    Custom(String),
}

/// A struct field.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Field {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: Type,
    #[serde(default)]
    pub sync: Policy,
    /// A map keyed by player id, whose entries a subscriber can skip cheaply ("all but my own").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub player_keyed: bool,
}

impl Field {
    pub fn new(name: &str, ty: Type) -> Field {
        Field { name: name.to_owned(), ty, sync: Policy::Broadcast, player_keyed: false }
    }

    pub fn server_only(mut self) -> Field {
        self.sync = Policy::ServerOnly;
        self
    }

    pub fn owner_only(mut self) -> Field {
        self.sync = Policy::OwnerOnly;
        self
    }

    pub fn custom(mut self, filter: &str) -> Field {
        self.sync = Policy::Custom(filter.to_owned());
        self
    }

    pub fn player_keyed(mut self) -> Field {
        self.player_keyed = true;
        self
    }
}

/// A schema declaration: the root struct's fields. This is also the schema file format.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SchemaDef {
    pub fields: Vec<Field>,
}

impl SchemaDef {
    pub fn new(fields: impl IntoIterator<Item = Field>) -> SchemaDef {
        SchemaDef { fields: fields.into_iter().collect() }
    }

    /// Parses a schema file: JSON, or TOML when `path_hint` ends in `.toml`.
    pub fn parse(text: &str, path_hint: &str) -> Result<SchemaDef, SchemaError> {
        if path_hint.ends_with(".toml") {
            toml::from_str(text).map_err(|e| SchemaError::Parse(e.to_string()))
        } else {
            serde_json::from_str(text).map_err(|e| SchemaError::Parse(e.to_string()))
        }
    }
}

/// The root fields one subscriber receives: a field filter. Fields left out stay at their
/// defaults in its replica.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FieldMask(Vec<bool>);

impl FieldMask {
    /// The mask of the named root fields.
    pub fn from_names<S: AsRef<str>>(schema: &Schema, names: &[S]) -> Result<FieldMask, SchemaError> {
        let mut bits = vec![false; schema.fields(ROOT).len()];
        for name in names {
            let i = schema
                .field(name.as_ref())
                .ok_or_else(|| SchemaError::BadFieldName(format!("/{}", name.as_ref())))?;
            bits[i as usize] = true;
        }
        Ok(FieldMask(bits))
    }

    pub fn contains(&self, index: usize) -> bool {
        self.0.get(index).copied().unwrap_or(false)
    }
}

/// A custom sync filter: what `player` may see of `value`, or nothing.
pub type Filter = Arc<dyn Fn(&Key, &Value) -> Option<Value> + Send + Sync>;

/// Index of a compiled type node.
pub(crate) type TypeId = u32;

/// Effective visibility of a field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Vis {
    ServerOnly,
    Broadcast,
    OwnerOnly,
    Custom(u32),
}

#[derive(Debug)]
pub(crate) struct FieldNode {
    pub name: Box<str>,
    pub ty: TypeId,
    pub vis: Vis,
    pub player_keyed: bool,
}

#[derive(Debug)]
pub(crate) enum Kind {
    Int,
    Float(Option<Quant>),
    Bool,
    Str,
    Bytes,
    Vec3(Option<Quant>),
    Struct(Box<[FieldNode]>),
    List(TypeId),
    Map { key: KeyKind, value: TypeId },
}

#[derive(Debug)]
pub(crate) struct TypeNode {
    pub kind: Kind,
    /// Some field at or below this type is owner-only or custom.
    pub has_private: bool,
}

/// A compiled schema: cheap to share (`Arc`) between a state, its encoders and replicas.
pub struct Schema {
    pub(crate) types: Vec<TypeNode>,
    pub(crate) filters: Vec<Filter>,
    def: SchemaDef,
}

impl fmt::Debug for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schema").field("def", &self.def).finish_non_exhaustive()
    }
}

/// The root type is always node 0.
pub(crate) const ROOT: TypeId = 0;

impl Schema {
    /// Compiles a declaration. Every `custom` policy must name a filter in `filters`.
    pub fn compile(def: SchemaDef, filters: HashMap<String, Filter>) -> Result<Arc<Schema>, SchemaError> {
        let mut c = Compiler { types: Vec::new(), filter_names: Vec::new(), filters: Vec::new() };
        c.types.push(TypeNode { kind: Kind::Int, has_private: false }); // placeholder for the root
        let root = c.compile_struct(&def.fields, Context::Public, 1, "", &filters)?;
        c.types[ROOT as usize] = root;
        Ok(Arc::new(Schema { types: c.types, filters: c.filters, def }))
    }

    /// Compiles a declaration that uses no custom filters.
    pub fn new(def: SchemaDef) -> Result<Arc<Schema>, SchemaError> {
        Schema::compile(def, HashMap::new())
    }

    pub fn def(&self) -> &SchemaDef {
        &self.def
    }

    pub(crate) fn node(&self, ty: TypeId) -> &TypeNode {
        &self.types[ty as usize]
    }

    pub(crate) fn fields(&self, ty: TypeId) -> &[FieldNode] {
        match &self.node(ty).kind {
            Kind::Struct(fields) => fields,
            _ => &[],
        }
    }

    /// The index of a root field, for building paths.
    pub fn field(&self, name: &str) -> Option<u16> {
        self.field_in(ROOT, name)
    }

    /// The index of field `name` inside the struct reached by following `path` of field names
    /// (map values and list items are stepped through with `"*"`).
    pub fn field_at(&self, path: &[&str], name: &str) -> Option<u16> {
        let mut ty = ROOT;
        for step in path {
            ty = match &self.node(ty).kind {
                Kind::Struct(_) => self.fields(ty)[self.field_in(ty, step)? as usize].ty,
                Kind::List(item) if *step == "*" => *item,
                Kind::Map { value, .. } if *step == "*" => *value,
                _ => return None,
            };
        }
        self.field_in(ty, name)
    }

    fn field_in(&self, ty: TypeId, name: &str) -> Option<u16> {
        self.fields(ty).iter().position(|f| &*f.name == name).map(|i| i as u16)
    }

    /// The default value of a type: zero, empty, false, or a struct of defaults.
    pub(crate) fn default_value(&self, ty: TypeId) -> Value {
        match &self.node(ty).kind {
            Kind::Int => Value::Int(0),
            Kind::Float(q) => Value::Float(q.map_or(0.0, |q| q.round_trip(0.0))),
            Kind::Bool => Value::Bool(false),
            Kind::Str => Value::Str(String::new()),
            Kind::Bytes => Value::Bytes(bytes::Bytes::new()),
            Kind::Vec3(q) => Value::Vec3([q.map_or(0.0, |q| q.round_trip(0.0)); 3]),
            Kind::Struct(fields) => Value::Struct(fields.iter().map(|f| self.default_value(f.ty)).collect()),
            Kind::List(_) => Value::List(Vec::new()),
            Kind::Map { .. } => Value::Map(Default::default()),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    /// Policies apply as declared.
    Public,
    /// Inside an owner-only entry or a custom field: only `broadcast` (inherit) and `server_only`.
    Private,
}

struct Compiler {
    types: Vec<TypeNode>,
    filter_names: Vec<String>,
    filters: Vec<Filter>,
}

impl Compiler {
    fn push(&mut self, node: TypeNode) -> TypeId {
        self.types.push(node);
        (self.types.len() - 1) as TypeId
    }

    fn compile_type(
        &mut self,
        ty: &Type,
        ctx: Context,
        depth: usize,
        at: &str,
        filters: &HashMap<String, Filter>,
    ) -> Result<TypeId, SchemaError> {
        if depth > MAX_DEPTH {
            return Err(SchemaError::TooDeep(at.to_owned()));
        }
        let node = match ty {
            Type::Int => TypeNode { kind: Kind::Int, has_private: false },
            Type::Float => TypeNode { kind: Kind::Float(None), has_private: false },
            Type::QuantizedFloat(q) => {
                check_quant(q, at)?;
                TypeNode { kind: Kind::Float(Some(*q)), has_private: false }
            }
            Type::Bool => TypeNode { kind: Kind::Bool, has_private: false },
            Type::String => TypeNode { kind: Kind::Str, has_private: false },
            Type::Bytes => TypeNode { kind: Kind::Bytes, has_private: false },
            Type::Vec3 => TypeNode { kind: Kind::Vec3(None), has_private: false },
            Type::QuantizedVec3(q) => {
                check_quant(q, at)?;
                TypeNode { kind: Kind::Vec3(Some(*q)), has_private: false }
            }
            Type::Struct(fields) => self.compile_struct(fields, ctx, depth + 1, at, filters)?,
            Type::List(item) => {
                let item = self.compile_type(item, ctx, depth + 1, &format!("{at}/*"), filters)?;
                let has_private = self.types[item as usize].has_private;
                TypeNode { kind: Kind::List(item), has_private }
            }
            Type::Map { key, value } => {
                let value = self.compile_type(value, ctx, depth + 1, &format!("{at}/*"), filters)?;
                let has_private = self.types[value as usize].has_private;
                TypeNode { kind: Kind::Map { key: *key, value }, has_private }
            }
        };
        Ok(self.push(node))
    }

    fn compile_struct(
        &mut self,
        fields: &[Field],
        ctx: Context,
        depth: usize,
        at: &str,
        filters: &HashMap<String, Filter>,
    ) -> Result<TypeNode, SchemaError> {
        if fields.len() > MAX_FIELDS {
            return Err(SchemaError::TooManyFields(at.to_owned()));
        }
        let mut names = HashSet::new();
        let mut out = Vec::with_capacity(fields.len());
        let mut has_private = false;
        for field in fields {
            let path = format!("{at}/{}", field.name);
            if field.name.is_empty() || !names.insert(field.name.as_str()) {
                return Err(SchemaError::BadFieldName(path));
            }
            let is_map = matches!(field.ty, Type::Map { .. });
            if field.player_keyed && !is_map {
                return Err(SchemaError::NotAMap { path, what: "player_keyed" });
            }
            if field.player_keyed && ctx == Context::Private {
                return Err(SchemaError::NestedPrivate(path));
            }
            let (vis, inner_ctx) = match (&field.sync, ctx) {
                (Policy::ServerOnly, _) => (Vis::ServerOnly, ctx),
                (Policy::Broadcast, _) => (Vis::Broadcast, ctx),
                (Policy::OwnerOnly | Policy::Custom(_), Context::Private) => {
                    return Err(SchemaError::NestedPrivate(path));
                }
                (Policy::OwnerOnly, Context::Public) => {
                    if !is_map {
                        return Err(SchemaError::NotAMap { path, what: "owner_only" });
                    }
                    (Vis::OwnerOnly, Context::Private)
                }
                (Policy::Custom(name), Context::Public) => {
                    let id = match self.filter_names.iter().position(|n| n == name) {
                        Some(id) => id,
                        None => {
                            let f = filters.get(name).ok_or_else(|| SchemaError::UnknownFilter {
                                path: path.clone(),
                                name: name.clone(),
                            })?;
                            self.filter_names.push(name.clone());
                            self.filters.push(f.clone());
                            self.filters.len() - 1
                        }
                    };
                    (Vis::Custom(id as u32), Context::Private)
                }
            };
            let ty = self.compile_type(&field.ty, inner_ctx, depth, &path, filters)?;
            has_private |= matches!(vis, Vis::OwnerOnly | Vis::Custom(_))
                || (vis == Vis::Broadcast && self.types[ty as usize].has_private);
            out.push(FieldNode {
                name: field.name.as_str().into(),
                ty,
                vis,
                player_keyed: field.player_keyed,
            });
        }
        Ok(TypeNode { kind: Kind::Struct(out.into_boxed_slice()), has_private })
    }
}

fn check_quant(q: &Quant, at: &str) -> Result<(), SchemaError> {
    let ok = q.min.is_finite()
        && q.max.is_finite()
        && q.precision.is_finite()
        && q.precision > 0.0
        && q.min < q.max
        && (q.max - q.min) / q.precision < (1u64 << 53) as f64;
    if ok { Ok(()) } else { Err(SchemaError::BadQuantization(at.to_owned())) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hand() -> Type {
        Type::list(Type::structure([Field::new("id", Type::Int), Field::new("rank", Type::Int)]))
    }

    #[test]
    fn parses_the_file_format() {
        let text = r#"{"fields": [
            {"name": "round", "type": "int"},
            {"name": "players", "player_keyed": true, "type": {"map": {"key": "string", "value": {"struct": [
                {"name": "x", "type": {"quantized_float": {"min": -100.0, "max": 100.0, "precision": 0.01}}},
                {"name": "secret", "type": "string", "sync": "server_only"}
            ]}}}},
            {"name": "hands", "sync": "owner_only", "type": {"map": {"key": "string", "value": {"list": "int"}}}}
        ]}"#;
        let def = SchemaDef::parse(text, "room.json").unwrap();
        let schema = Schema::new(def.clone()).unwrap();
        assert_eq!(schema.field("hands"), Some(2));
        assert_eq!(schema.field_at(&["players", "*"], "secret"), Some(1));
        let back = serde_json::to_string(&def).unwrap();
        assert_eq!(SchemaDef::parse(&back, "x.json").unwrap(), def);
    }

    #[test]
    fn parses_toml_too() {
        let text = r#"
            [[fields]]
            name = "round"
            type = "int"

            [[fields]]
            name = "hands"
            sync = "owner_only"
            type = { map = { key = "string", value = { list = "int" } } }
        "#;
        let def = SchemaDef::parse(text, "room.toml").unwrap();
        assert_eq!(def.fields[1].sync, Policy::OwnerOnly);
        assert!(Schema::new(def).is_ok());
        assert!(matches!(SchemaDef::parse("fields = 3", "x.toml"), Err(SchemaError::Parse(_))));
    }

    #[test]
    fn rejects_bad_declarations() {
        let owner_not_map = SchemaDef::new([Field::new("a", Type::Int).owner_only()]);
        assert!(matches!(Schema::new(owner_not_map), Err(SchemaError::NotAMap { .. })));

        let nested = SchemaDef::new([Field::new(
            "a",
            Type::map(
                KeyKind::String,
                Type::structure([Field::new("b", Type::map(KeyKind::Int, Type::Int)).owner_only()]),
            ),
        )
        .owner_only()]);
        assert!(matches!(Schema::new(nested), Err(SchemaError::NestedPrivate(_))));

        let dup = SchemaDef::new([Field::new("a", Type::Int), Field::new("a", Type::Bool)]);
        assert!(matches!(Schema::new(dup), Err(SchemaError::BadFieldName(_))));

        let filter = SchemaDef::new([Field::new("a", hand()).custom("nope")]);
        assert!(matches!(Schema::new(filter), Err(SchemaError::UnknownFilter { .. })));

        let quant = SchemaDef::new([Field::new("a", Type::quantized(1.0, 1.0, 0.1))]);
        assert!(matches!(Schema::new(quant), Err(SchemaError::BadQuantization(_))));

        let mut deep = Type::Int;
        for _ in 0..40 {
            deep = Type::list(deep);
        }
        assert!(matches!(Schema::new(SchemaDef::new([Field::new("a", deep)])), Err(SchemaError::TooDeep(_))));
    }

    #[test]
    fn marks_private_content() {
        let def = SchemaDef::new([
            Field::new(
                "pub",
                Type::structure([Field::new("h", Type::map(KeyKind::String, hand())).owner_only()]),
            ),
            Field::new("plain", Type::Int),
        ]);
        let schema = Schema::new(def).unwrap();
        assert!(schema.node(ROOT).has_private);
        let fields = schema.fields(ROOT);
        assert!(schema.node(fields[0].ty).has_private);
        assert!(!schema.node(fields[1].ty).has_private);
    }
}
