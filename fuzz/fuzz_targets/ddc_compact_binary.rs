//! Arbitrary bytes through the compact-binary validator: any result is fine except a panic.
//! What validates must be walkable (attachments, JSON) and re-encode to an object that
//! validates and re-encodes to itself (canonical form is a fixed point).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tickwire_ddc::cb::{Value, parse, to_json};

fuzz_target!(|data: &[u8]| {
    if let Ok(field) = parse(data) {
        let _ = field.attachments();
        let _ = to_json(&field);
        let canonical = Value::from_field(&field).to_bytes();
        let again = parse(&canonical).expect("the writer's output validates");
        assert_eq!(Value::from_field(&again).to_bytes(), canonical);
    }
});
