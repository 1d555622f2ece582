//! `Replica::entries_applied`, the count of map entries the updates carried, which the B3 bench
//! reports as entity updates received: exact on a map of entities, and the same whichever codec
//! carried the updates.

mod common;

use common::{PLAYERS, Rng, compile, player, random_schema, random_write};
use proptest::prelude::*;
use tickwire_state::{
    Codec, Field, Key, KeyKind, Replica, Schema, SchemaDef, State, Step, Type, Value, Version,
};

/// Entities keyed by id, each with a position, a heading and a map of tags (not outermost).
fn entities() -> std::sync::Arc<Schema> {
    let entity = Type::Struct(vec![
        Field::new("x", Type::Int),
        Field::new("yaw", Type::Int),
        Field::new("tags", Type::map(KeyKind::String, Type::Int)),
    ]);
    Schema::new(SchemaDef::new([
        Field::new("frame", Type::Int),
        Field::new("entities", Type::map(KeyKind::Int, entity)),
    ]))
    .unwrap()
}

fn set(state: &mut State, id: i64, field: u16, v: i64) {
    let key = Key::Int(id);
    let path = [Step::Field(1), Step::Key(&key)];
    if state.get(&path).is_err() {
        let value = Value::Struct(vec![Value::Int(0), Value::Int(0), Value::Map(Default::default())]);
        state.set(&path, value).unwrap();
    }
    let path = [Step::Field(1), Step::Key(&key), Step::Field(field)];
    state.set(&path, Value::Int(v)).unwrap();
}

fn counting(schema: &std::sync::Arc<Schema>) -> [Replica; 2] {
    [Replica::new(schema.clone()).counting_entries(), Replica::new(schema.clone()).counting_entries()]
}

/// The update from `from` for player 0, in `codec`.
fn update(state: &State, from: Version, codec: Codec) -> Vec<u8> {
    state.prepare(from, codec).unwrap().update_for(state, &Key::Int(0), false).unwrap().to_vec()
}

/// Applies the update from `from` to both replicas (binary, JSON) and returns the version.
fn send(state: &State, from: Version, replicas: &mut [Replica; 2]) -> Version {
    for (replica, codec) in replicas.iter_mut().zip([Codec::Binary, Codec::Json]) {
        replica.apply_codec(codec, &update(state, from, codec)).unwrap();
    }
    state.version()
}

#[test]
fn counts_each_entity_an_update_carries_once_in_both_codecs() {
    let schema = entities();
    let mut state = State::new(schema.clone());
    let mut replicas = counting(&schema);
    let counts = |r: &[Replica; 2]| [r[0].entries_applied(), r[1].entries_applied()];

    for id in 1..=3 {
        set(&mut state, id, 0, id * 10);
    }
    state.seal();
    // A snapshot: each entity once; a root field outside the map adds nothing.
    state.set(&[Step::Field(0)], Value::Int(7)).unwrap();
    state.seal();
    let v = send(&state, 0, &mut replicas);
    assert_eq!(counts(&replicas), [3, 3]);

    // Two entities change, one in two fields: two entries.
    set(&mut state, 1, 0, 11);
    set(&mut state, 1, 1, 90);
    set(&mut state, 2, 1, 45);
    state.set(&[Step::Field(0)], Value::Int(8)).unwrap();
    state.seal();
    let v = send(&state, v, &mut replicas);
    assert_eq!(counts(&replicas), [5, 5]);

    // A map inside an entity is not outermost: its entries count as their entity's one.
    let key = Key::Int(3);
    for tag in ["a", "b"] {
        let tag = Key::str(tag);
        state
            .set(&[Step::Field(1), Step::Key(&key), Step::Field(2), Step::Key(&tag)], Value::Int(1))
            .unwrap();
    }
    state.seal();
    let v = send(&state, v, &mut replicas);
    assert_eq!(counts(&replicas), [6, 6]);

    // A removal and an insert: one each. Only the root field changing: none.
    assert!(state.remove(&[Step::Field(1), Step::Key(&Key::Int(2))]).unwrap());
    set(&mut state, 4, 0, 40);
    state.seal();
    let v = send(&state, v, &mut replicas);
    assert_eq!(counts(&replicas), [8, 8]);
    state.set(&[Step::Field(0)], Value::Int(9)).unwrap();
    state.seal();
    send(&state, v, &mut replicas);
    assert_eq!(counts(&replicas), [8, 8]);

    // An entity removed and inserted again in one update (a new id in binary): one entry.
    let v = state.version();
    assert!(state.remove(&[Step::Field(1), Step::Key(&Key::Int(1))]).unwrap());
    set(&mut state, 1, 0, 12);
    state.seal();
    send(&state, v, &mut replicas);
    assert_eq!(counts(&replicas), [9, 9]);
}

/// An update refused, even one whose first entity applied before the error, adds nothing; the
/// snapshot after it counts every entity. A replica that does not count says 0.
#[test]
fn a_refused_update_adds_nothing_in_either_codec() {
    let schema = entities();
    let mut state = State::new(schema.clone());
    for id in 1..=3 {
        set(&mut state, id, 0, id);
    }
    let v1 = state.seal();
    let mut replicas = counting(&schema);
    let mut plain = Replica::new(schema.clone());
    send(&state, 0, &mut replicas);
    plain.apply(&update(&state, 0, Codec::Binary)).unwrap();
    set(&mut state, 1, 1, 5);
    set(&mut state, 2, 1, 5);
    state.seal();
    for (replica, codec) in replicas.iter_mut().zip([Codec::Binary, Codec::Json]) {
        let whole = update(&state, v1, codec);
        // Cut inside the second entity's op: the first applies, then the update fails.
        let cut = match codec {
            Codec::Binary => &whole[..whole.len() - 3],
            Codec::Json => {
                let last_line = whole[..whole.len() - 1].iter().rposition(|&b| b == b'\n').unwrap();
                &whole[..last_line + 10]
            }
        };
        assert!(replica.apply_codec(codec, cut).is_err(), "{codec:?}");
        assert_eq!(replica.entries_applied(), 3, "{codec:?}");
        replica.apply_codec(codec, &update(&state, 0, codec)).unwrap();
        assert_eq!(replica.entries_applied(), 6, "{codec:?}: the snapshot's three");
    }
    assert_eq!(plain.entries_applied(), 0);
}

/// The entries of the outermost maps in `value`.
fn outer_entries(value: &Value) -> u64 {
    match value {
        Value::Map(map) => map.len() as u64,
        Value::Struct(items) | Value::List(items) => items.iter().map(outer_entries).sum(),
        _ => 0,
    }
}

/// On random schemas and writes, every player's binary and JSON replicas count the same entries
/// for the same updates (players 1 and 3 leaving their own entries out of player-keyed maps),
/// and a snapshot counts exactly the outermost entries the replica then holds.
fn same_count_in_both_codecs(seed: u64, ticks: u64) -> Result<(), TestCaseError> {
    let mut rng = Rng::new(seed);
    let def = random_schema(&mut rng);
    let schema = compile(&def);
    let mut state = State::new(schema.clone());
    let mut replicas: Vec<[Replica; 2]> = PLAYERS.iter().map(|_| counting(&schema)).collect();
    let mut plain: Vec<[Replica; 2]> =
        PLAYERS.iter().map(|_| [Replica::new(schema.clone()), Replica::new(schema.clone())]).collect();
    let mut from = 0;
    for tick in 0..ticks {
        for _ in 0..rng.below(6) {
            random_write(&mut rng, &def, &mut state);
        }
        state.seal();
        for (i, pair) in replicas.iter_mut().enumerate() {
            let skip_self = i % 2 == 1;
            let mut counts = [0; 2];
            let mut updates = Vec::new();
            for (k, codec) in [Codec::Binary, Codec::Json].into_iter().enumerate() {
                let bytes = |from| {
                    let prepared = state.prepare(from, codec).unwrap();
                    prepared.update_for(&state, &player(i), skip_self).unwrap().to_vec()
                };
                let update = bytes(from);
                let applied = pair[k].apply_codec(codec, &update);
                prop_assert!(applied.is_ok(), "tick {} {:?}: {:?}", tick, codec, applied);
                counts[k] = pair[k].entries_applied();
                // Counting changes nothing of what a replica holds.
                plain[i][k].apply_codec(codec, &update).unwrap();
                prop_assert_eq!(plain[i][k].value(), pair[k].value(), "tick {} {:?}", tick, codec);
                updates.push(update);
                let mut fresh = Replica::new(schema.clone()).counting_entries();
                fresh.apply_codec(codec, &bytes(0)).unwrap();
                prop_assert_eq!(
                    fresh.entries_applied(),
                    outer_entries(&fresh.value()),
                    "tick {} player {} {:?} snapshot, schema {:?}",
                    tick,
                    i,
                    codec,
                    def
                );
            }
            if counts[0] != counts[1] {
                let json = String::from_utf8_lossy(&updates[1]);
                let shown = format!("binary {}\njson {json}", hex::encode(&updates[0]));
                prop_assert_eq!(
                    counts[0],
                    counts[1],
                    "tick {} player {} schema {:?}\n{}",
                    tick,
                    i,
                    def,
                    shown
                );
            }
        }
        from = state.version();
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn binary_and_json_replicas_count_the_same_entries(seed in any::<u64>()) {
        same_count_in_both_codecs(seed, 30)?;
    }
}
