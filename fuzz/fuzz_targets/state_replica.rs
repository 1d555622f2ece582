//! Arbitrary bytes as state updates (binary, or JSON when the first byte is odd) applied to a
//! replica of a schema that uses every type: any result is fine except a panic.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use tickwire_state::{Replica, Schema, SchemaDef};

const SCHEMA: &str = r#"{"fields": [
    {"name": "i", "type": "int"},
    {"name": "f", "type": "float"},
    {"name": "q", "type": {"quantized_float": {"min": -10.0, "max": 10.0, "precision": 0.5}}},
    {"name": "b", "type": "bool"},
    {"name": "s", "type": "string"},
    {"name": "y", "type": "bytes"},
    {"name": "v", "type": "vec3"},
    {"name": "qv", "type": {"quantized_vec3": {"min": 0.0, "max": 1.0, "precision": 0.1}}},
    {"name": "l", "type": {"list": {"struct": [{"name": "a", "type": "int"}, {"name": "b", "type": {"list": "string"}}]}}},
    {"name": "m", "player_keyed": true, "type": {"map": {"key": "string", "value": {"map": {"key": "int", "value": "int"}}}}},
    {"name": "o", "sync": "owner_only", "type": {"map": {"key": "string", "value": {"list": "int"}}}}
]}"#;

fn schema() -> Arc<Schema> {
    static SCHEMA_CELL: OnceLock<Arc<Schema>> = OnceLock::new();
    SCHEMA_CELL
        .get_or_init(|| Schema::new(SchemaDef::parse(SCHEMA, "fuzz.json").unwrap()).unwrap())
        .clone()
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    // Bit 1: a replica that counts entries, whose decoding takes other paths.
    let mut replica = Replica::new(schema());
    if mode & 2 != 0 {
        replica = replica.counting_entries();
    }
    // Apply the input twice: as a first update, then on top of whatever it built.
    for _ in 0..2 {
        let result = if mode & 1 == 0 { replica.apply(rest) } else { replica.apply_json(rest) };
        if result.is_ok() {
            let _ = replica.value();
        }
    }
});
