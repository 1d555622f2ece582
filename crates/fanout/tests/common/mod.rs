//! What the fan-out simulations share: the channel's schema, a frame counter and a map of
//! positions, as a game's world channel would hold.

use std::sync::Arc;

use tickwire_state::{Field, KeyKind, Schema, SchemaDef, Type};

pub fn schema() -> Arc<Schema> {
    Schema::new(SchemaDef::new([
        Field::new("frame", Type::Int),
        Field::new("pos", Type::map(KeyKind::String, Type::Int)),
    ]))
    .expect("valid schema")
}
