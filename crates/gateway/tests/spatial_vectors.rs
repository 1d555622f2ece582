//! The spatial world's test vectors (`docs/test-vectors/spatial.json`, docs/protocol.md 14.5):
//! each is a message of `spatial.proto` described field by field, and its exact bytes. This
//! test builds every message, checks that it encodes to the file's bytes and decodes back, and
//! that the file describes it as here. `TICKWIRE_BLESS=1` rewrites the file.

use bytes::Bytes;
use prost::Message;
use serde_json::{Value, json};
use tickwire_state::{Codec, Field, Key, KeyKind, Patch, Schema, SchemaDef, State, Type};
use tickwire_wire::proto::{
    ChannelUpdate, ChannelUpdates, EntityMessage, EntityState, Follow, Handover, HandoverKind, LodBand,
    Publish, Release, SetInterest, SpawnEntity, Sphere, SubscriptionOptions, Vec3, set_interest,
};

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/test-vectors/spatial.json");
const ENTITY: u64 = 1 << 41;
const CELL: u64 = (1 << 40) + 3;

fn v3(x: f32, y: f32, z: f32) -> Option<Vec3> {
    Some(Vec3 { x, y, z })
}

/// A snapshot of a cell holding one entity at (5, 0, 5), in the default entity schema
/// (`pos`, `yaw`, `data`), as the gateway sends it.
fn cell_snapshot() -> Vec<u8> {
    let entity = SchemaDef::parse(
        r#"{"fields": [{"name": "pos", "type": "vec3"}, {"name": "yaw", "type": "float"}, {"name": "data", "type": "string"}]}"#,
        "e.json",
    )
    .unwrap();
    let cell = SchemaDef::new([Field::new("entities", Type::map(KeyKind::Int, Type::Struct(entity.fields)))]);
    let mut state = State::new(Schema::new(cell).unwrap());
    let line = format!(r#"{{"op":"set","path":"/entities/{ENTITY}","value":{{"pos":[5,0,5],"data":"a"}}}}"#);
    state.apply_patch(&Patch::parse_json(state.schema(), line.as_bytes()).unwrap()).unwrap();
    state.seal();
    state.prepare(0, Codec::Binary).unwrap().update_for(&state, &Key::Int(0), false).unwrap().to_vec()
}

/// (name, message type, fields, encoding) of every vector.
fn vectors() -> Vec<(&'static str, &'static str, Value, Vec<u8>)> {
    let value = r#"{"pos":[5,0,5],"data":"a"}"#;
    let snapshot = cell_snapshot();
    vec![
        (
            "interest_sphere_follow_cell",
            "SetInterest",
            json!({"sphere": {"center": {"x": 10.0, "z": -20.0}, "radius": 30.0}, "follow": "FOLLOW_CELL"}),
            SetInterest {
                area: Some(set_interest::Area::Sphere(Sphere { center: v3(10.0, 0.0, -20.0), radius: 30.0 })),
                follow: Follow::Cell as i32,
                options: None,
                lod: Vec::new(),
            }
            .encode_to_vec(),
        ),
        (
            // BENCHMARKS.md's B3 `lod` bands: 20 Hz updates, cells within 10 m in each, within
            // 50 m every other one (100 ms), the rest once a second.
            "interest_sphere_lod",
            "SetInterest",
            json!({"sphere": {"center": {"x": 10.0, "z": -20.0}, "radius": 100.0}, "follow": "FOLLOW_CELL",
                   "options": {"fanout_interval_ms": 50},
                   "lod": [{"within": 10.0}, {"within": 50.0, "interval_ms": 100},
                           {"within": 100.0, "interval_ms": 1000}]}),
            SetInterest {
                area: Some(set_interest::Area::Sphere(Sphere {
                    center: v3(10.0, 0.0, -20.0),
                    radius: 100.0,
                })),
                follow: Follow::Cell as i32,
                options: Some(SubscriptionOptions { fanout_interval_ms: 50, ..Default::default() }),
                lod: vec![
                    LodBand { within: 10.0, interval_ms: 0 },
                    LodBand { within: 50.0, interval_ms: 100 },
                    LodBand { within: 100.0, interval_ms: 1000 },
                ],
            }
            .encode_to_vec(),
        ),
        (
            "spawn",
            "SpawnEntity",
            json!({"position": {"x": 5.0, "z": 5.0}, "value_json": value, "controller_connection": 7}),
            SpawnEntity { position: v3(5.0, 0.0, 5.0), value_json: value.into(), controller_connection: 7 }
                .encode_to_vec(),
        ),
        (
            "publish",
            "Publish",
            json!({"entities": [{"entity_id": ENTITY, "position": {"x": 6.0, "z": 5.0}, "value_json": r#"{"pos":[6,0,5]}"#, "processed_seq": 3}]}),
            Publish {
                entities: vec![EntityState {
                    entity_id: ENTITY,
                    position: v3(6.0, 0.0, 5.0),
                    value_json: r#"{"pos":[6,0,5]}"#.into(),
                    processed_seq: 3,
                }],
            }
            .encode_to_vec(),
        ),
        (
            "handover_release",
            "Handover",
            json!({"entity_id": ENTITY, "handover_id": 1, "kind": "HANDOVER_KIND_RELEASE", "from_slot": 0, "to_slot": 1, "position": {"x": 20.5, "z": 5.0}}),
            Handover {
                entity_id: ENTITY,
                handover_id: 1,
                kind: HandoverKind::Release as i32,
                from_slot: 0,
                to_slot: 1,
                position: v3(20.5, 0.0, 5.0),
                ..Handover::default()
            }
            .encode_to_vec(),
        ),
        (
            "release",
            "Release",
            json!({"entity_id": ENTITY, "handover_id": 1, "processed_seq": 3, "position": {"x": 20.5, "z": 5.0}}),
            Release {
                entity_id: ENTITY,
                handover_id: 1,
                processed_seq: 3,
                value_json: String::new(),
                position: v3(20.5, 0.0, 5.0),
            }
            .encode_to_vec(),
        ),
        (
            "handover_acquire",
            "Handover",
            json!({"entity_id": ENTITY, "handover_id": 1, "kind": "HANDOVER_KIND_ACQUIRE", "from_slot": 0, "to_slot": 1,
                   "position": {"x": 20.5, "z": 5.0}, "value_json": value, "controller_connection": 7,
                   "messages": [{"entity_id": ENTITY, "seq": 4, "from_connection": 7, "body_hex": "6a756d70"}]}),
            Handover {
                entity_id: ENTITY,
                handover_id: 1,
                kind: HandoverKind::Acquire as i32,
                from_slot: 0,
                to_slot: 1,
                position: v3(20.5, 0.0, 5.0),
                value_json: value.into(),
                controller_connection: 7,
                messages: vec![EntityMessage {
                    entity_id: ENTITY,
                    seq: 4,
                    from_connection: 7,
                    body: Bytes::from_static(b"jump"),
                }],
            }
            .encode_to_vec(),
        ),
        (
            "channel_updates_one_cell_snapshot",
            "ChannelUpdates",
            json!({"updates": [{"channel_id": CELL, "codec": "DELTA_CODEC_BINARY", "update_hex": hex(&snapshot)}]}),
            ChannelUpdates {
                updates: vec![ChannelUpdate { channel_id: CELL, codec: 0, update: snapshot.clone().into() }],
            }
            .encode_to_vec(),
        ),
    ]
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn file_from(vectors: &[(&str, &str, Value, Vec<u8>)]) -> Value {
    json!({
        "about": "tickwire spatial world vectors (docs/protocol.md section 14): request and push bodies of proto/tickwire/v1/spatial.proto, each described field by field (fields at their proto3 default are left out; a Vec3's zero components too) and its exact protobuf bytes, canonical encoding. *_hex fields are byte strings.",
        "vectors": vectors.iter().map(|(name, ty, fields, bytes)| json!({
            "name": name, "message": ty, "fields": fields, "hex": hex(bytes),
        })).collect::<Vec<_>>(),
    })
}

#[test]
fn spatial_messages_match_their_vectors() {
    let vectors = vectors();
    let expected = file_from(&vectors);
    if std::env::var_os("TICKWIRE_BLESS").is_some() {
        std::fs::write(FILE, serde_json::to_string_pretty(&expected).unwrap() + "\n").unwrap();
    }
    let file: Value = serde_json::from_str(&std::fs::read_to_string(FILE).unwrap()).unwrap();
    assert_eq!(
        file, expected,
        "docs/test-vectors/spatial.json is out of date (TICKWIRE_BLESS=1 rewrites it)"
    );
    // And the bytes decode back to the messages.
    for (name, ty, _, bytes) in &vectors {
        let again = match *ty {
            "SetInterest" => SetInterest::decode(&bytes[..]).unwrap().encode_to_vec(),
            "SpawnEntity" => SpawnEntity::decode(&bytes[..]).unwrap().encode_to_vec(),
            "Publish" => Publish::decode(&bytes[..]).unwrap().encode_to_vec(),
            "Handover" => Handover::decode(&bytes[..]).unwrap().encode_to_vec(),
            "Release" => Release::decode(&bytes[..]).unwrap().encode_to_vec(),
            "ChannelUpdates" => ChannelUpdates::decode(&bytes[..]).unwrap().encode_to_vec(),
            other => panic!("{name}: no decoder for {other}"),
        };
        assert_eq!(&again, bytes, "{name}");
    }
}
