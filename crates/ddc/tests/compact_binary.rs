//! The compact-binary reader and writer against the DDC test vectors
//! (`tests/fixtures/ddc-vectors.json`, from an independent implementation; see its README in
//! the DDC specs): every object validates, hashes to its IoHash, yields its attachments, and
//! re-encodes to the same bytes (the non-canonical one to its canonical twin). Random and
//! mutated input never panics.

use proptest::prelude::*;
use serde_json::Value as Json;
use tickwire_ddc::IoHash;
use tickwire_ddc::cb::{
    CbError, CbType, EntryFlags, Package, PackageError, Value, parse, read_varuint, to_json, write_varuint,
};

fn vectors() -> Json {
    serde_json::from_str(include_str!("fixtures/ddc-vectors.json")).expect("valid JSON")
}

fn objects() -> Vec<(String, Vec<u8>, Json)> {
    vectors()["cb_objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["name"].as_str().unwrap().to_owned(),
                hex::decode(o["hex"].as_str().unwrap()).unwrap(),
                o.clone(),
            )
        })
        .collect()
}

#[test]
fn varuint_vectors_encode_and_decode() {
    for v in vectors()["varuint"].as_array().unwrap() {
        let value = v["value"].as_u64().unwrap();
        let mut out = Vec::new();
        write_varuint(&mut out, value);
        assert_eq!(hex::encode(&out), v["encoded_hex"].as_str().unwrap(), "{value:#x}");
        assert_eq!(read_varuint(&out).unwrap(), (value, out.len()));
    }
}

#[test]
fn every_object_vector_validates_hashes_and_lists_its_attachments() {
    for (name, bytes, v) in objects() {
        let field = parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(IoHash::of(&bytes).to_hex(), v["iohash"].as_str().unwrap(), "{name}");
        let found: Vec<(String, String)> =
            field.attachments().into_iter().map(|(ty, h)| (format!("{ty:?}"), hex::encode(h))).collect();
        let want: Vec<(String, String)> = v["attachments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| (a["type"].as_str().unwrap().to_owned(), a["hash"].as_str().unwrap().to_owned()))
            .collect();
        assert_eq!(found, want, "{name}");
    }
}

#[test]
fn objects_reencode_byte_for_byte_and_the_non_canonical_one_to_its_twin() {
    let all = objects();
    let canonical_twin = &all.iter().find(|(n, ..)| n == "bench-singlefield-canonical-0x03").unwrap().1;
    for (name, bytes, _) in &all {
        let value = Value::from_field(&parse(bytes).unwrap());
        let again = value.to_bytes();
        if name == "bench-singlefield-object-0x02" {
            // The benchmark sends a one-field object as 0x02; the engine's writer makes it 0x03.
            assert_eq!(&again, canonical_twin, "{name}");
        } else {
            assert_eq!(hex::encode(&again), hex::encode(bytes), "{name}");
        }
    }
}

#[test]
fn objects_render_as_the_vectors_json() {
    for (name, bytes, v) in objects() {
        let json = to_json(&parse(&bytes).unwrap());
        assert_eq!(json, v["json"], "{name}");
        // Field order is kept.
        if let (Json::Object(got), Json::Object(want)) = (&json, &v["json"]) {
            assert!(got.keys().eq(want.keys()), "{name}: field order");
        }
    }
}

#[test]
fn the_package_vector_reads_checks_and_writes_back() {
    let packages = vectors()["packages"].as_array().unwrap().clone();
    let vector = packages.iter().find(|p| p["name"] == "http-cbpkg-record").unwrap();
    let body = hex::decode(vector["hex"].as_str().unwrap()).unwrap();
    let package = Package::parse(&body).unwrap();
    assert_eq!(hex::encode(package.root.hash), vector["root_hash"].as_str().unwrap());
    let entries = vector["entries"].as_array().unwrap();
    assert_eq!(package.attachments.len() + 1, entries.len());
    for (entry, want) in std::iter::once(&package.root).chain(&package.attachments).zip(entries) {
        assert_eq!(hex::encode(entry.hash), want["hash"].as_str().unwrap());
        assert_eq!(u64::from(entry.flags.0), want["flags"].as_u64().unwrap());
        assert_eq!(entry.payload.len() as u64, want["size"].as_u64().unwrap());
    }
    assert!(package.attachments.iter().all(|a| a.flags.contains(EntryFlags::COMPRESSED)));
    assert_eq!(package.to_bytes(), body, "written back byte for byte");

    // What a reader must refuse.
    assert_eq!(Package::parse(&body[..10]), Err(PackageError::Truncated));
    assert!(matches!(Package::parse(&[0u8; 16]), Err(PackageError::Magic(0))));
    let mut trailing = body.clone();
    trailing.push(0);
    assert_eq!(Package::parse(&trailing), Err(PackageError::TrailingBytes(1)));
    let mut bad_root = body.clone();
    let root_payload = 16 + 3 * 32;
    bad_root[root_payload + 5] ^= 0xff;
    assert!(Package::parse(&bad_root).is_err(), "a changed root object is refused");
}

#[test]
fn fields_read_in_place() {
    let (_, bytes, _) = objects().into_iter().find(|(n, ..)| n == "cache-record").unwrap();
    let record = parse(&bytes).unwrap();
    let key = record.get("Key").expect("a Key");
    assert_eq!(key.get("Bucket").and_then(|b| b.as_str()), Some("LegacyConformance"));
    let values: Vec<_> = record.get("Values").unwrap().iter().collect();
    assert_eq!(values.len(), 2);
    assert_eq!(values[0].get("RawHash").unwrap().ty, CbType::BinaryAttachment);
    assert!(values[0].get("RawSize").and_then(|s| s.as_u64()).is_some());
}

#[test]
fn malformed_bodies_are_refused_with_a_reason() {
    assert_eq!(parse(&[]), Err(CbError::Truncated));
    assert_eq!(parse(&[0x04, 0x01, 0x00]), Err(CbError::NotAnObject(0x04)), "an array is not a body");
    assert_eq!(parse(&[0x02, 0x00, 0x00]), Err(CbError::TrailingBytes(1)));
    assert_eq!(parse(&[0x02, 0x05]), Err(CbError::Truncated));
    // A field of type 0x15 (unassigned), and one with the reserved 0x40 flag.
    assert_eq!(parse(&[0x02, 0x03, 0x95, 0x01, b'a']), Err(CbError::UnknownType(0x15)));
    assert_eq!(parse(&[0x02, 0x03, 0xc1, 0x01, b'a']), Err(CbError::TypeFlags(0xc1)));
    // An object field without a name.
    assert_eq!(parse(&[0x02, 0x01, 0x01]), Err(CbError::Naming));
    // An array that declares two items and holds one.
    assert_eq!(
        parse(&[0x02, 0x06, 0x84, 0x01, b'a', 0x02, 0x02, 0x01]),
        Err(CbError::ItemCount { declared: 2, found: 1 })
    );
    // A string that is not UTF-8.
    assert_eq!(parse(&[0x02, 0x05, 0x87, 0x01, b's', 0x01, 0xff]), Err(CbError::Utf8));
    // Deep nesting is bounded: 300 objects, each the only field of the one around it.
    let nested = |levels: usize| {
        let mut value = vec![0x00u8];
        for _ in 0..levels {
            let mut field = vec![0x82, 0x01, b'x'];
            field.extend_from_slice(&value);
            value.clear();
            write_varuint(&mut value, field.len() as u64);
            value.extend_from_slice(&field);
        }
        [vec![0x02], value].concat()
    };
    assert!(parse(&nested(100)).is_ok(), "100 levels are fine");
    assert_eq!(parse(&nested(300)), Err(CbError::TooDeep(256)));
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|i| Value::Integer(i128::from(i))),
        any::<u64>().prop_map(|i| Value::Integer(i128::from(i))),
        any::<f32>().prop_filter("not NaN", |f| !f.is_nan()).prop_map(|f| Value::Float(f64::from(f))),
        "[a-z]{0,8}".prop_map(Value::String),
        prop::collection::vec(any::<u8>(), 0..16).prop_map(Value::Binary),
        any::<[u8; 20]>().prop_map(Value::BinaryAttachment),
        any::<[u8; 20]>().prop_map(Value::Hash),
        any::<i64>().prop_map(Value::DateTime),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(("[a-z]{1,6}", inner), 0..6).prop_map(Value::Object),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = parse(&bytes);
        let mut framed = vec![0x02];
        write_varuint(&mut framed, bytes.len() as u64);
        framed.extend_from_slice(&bytes);
        if let Ok(field) = parse(&framed) {
            let _ = (field.attachments(), Value::from_field(&field));
        }
    }

    #[test]
    fn mutated_vectors_never_panic(which in 0usize..12, flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..4)) {
        let objects = objects();
        let mut bytes = objects[which % objects.len()].1.clone();
        for (at, b) in flips {
            let n = bytes.len();
            bytes[at % n] = b;
        }
        // A flipped object is refused, or it is still an object whose canonical encoding
        // validates and is a fixed point of reading and writing.
        if let Ok(field) = parse(&bytes) {
            let _ = field.attachments();
            let canonical = Value::from_field(&field).to_bytes();
            let again = parse(&canonical).map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert_eq!(Value::from_field(&again).to_bytes(), canonical);
        }
    }

    #[test]
    fn random_packages_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let mut body = vec![0xcc, 0xaa, 0x77, 0xaa];
        body.extend_from_slice(&bytes);
        // What parses writes back to the same bytes.
        if let Ok(package) = Package::parse(&body) {
            prop_assert_eq!(package.to_bytes(), body);
        }
    }

    #[test]
    fn written_objects_read_back_the_same(fields in prop::collection::vec(("[a-z]{1,6}", value()), 0..6)) {
        let object = Value::Object(fields);
        let bytes = object.to_bytes();
        let field = parse(&bytes).map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(Value::from_field(&field), object);
    }
}

#[test]
fn iohash_vectors() {
    for v in vectors()["iohash"].as_array().unwrap() {
        let size = v["input_size"].as_u64().unwrap() as usize;
        // Inputs over 64 bytes are the pattern i % 251 (see the vectors' README).
        let input = match v["input_hex"].as_str() {
            Some(hex) => hex::decode(hex).unwrap(),
            None => (0..size).map(|i| (i % 251) as u8).collect(),
        };
        assert_eq!(input.len(), size);
        assert_eq!(IoHash::of(&input).to_hex(), v["iohash"].as_str().unwrap(), "{}", v["label"]);
        assert_eq!(hex::encode(blake3::hash(&input).as_bytes()), v["blake3_256"].as_str().unwrap());
    }
}

/// The engine's internal field-stream form of the record package (never an HTTP body): a Hash
/// field with the root's hash, the root object, one Binary field per attachment in hash order,
/// then Null. Written here with the writer from the same content, byte for byte.
#[test]
fn the_engine_field_stream_package_vector() {
    let all = vectors();
    let find = |group: &str, name: &str| {
        all[group].as_array().unwrap().iter().find(|o| o["name"] == name).unwrap().clone()
    };
    let record = hex::decode(find("cb_objects", "cache-record")["hex"].as_str().unwrap()).unwrap();
    let mut buffers: Vec<(String, Vec<u8>)> = ["none-small", "lz4-multi-block"]
        .iter()
        .map(|n| {
            let b = find("compressed_buffers", n);
            (
                b["raw_hash"].as_str().unwrap().to_owned(),
                hex::decode(b["compressed_hex"].as_str().unwrap()).unwrap(),
            )
        })
        .collect();
    buffers.sort();
    let mut stream = Value::Hash(*IoHash::of(&record).as_bytes()).to_bytes();
    stream.extend_from_slice(&record);
    for (_, buffer) in buffers {
        stream.extend(Value::Binary(buffer).to_bytes());
    }
    stream.extend(Value::Null.to_bytes());
    let vector = find("packages", "engine-field-stream-package");
    assert_eq!(hex::encode(&stream), vector["hex"].as_str().unwrap());
    assert_eq!(stream.len() as u64, vector["size"].as_u64().unwrap());
}
