//! Specific promises of the engine, one scenario each: key-level tracking, coalescing, encode-once
//! sharing, catch-up and its snapshot fallback, privacy, and writes that do not fit the schema.

use tickwire_state::{
    Codec, Field, Key, KeyKind, Limits, Replica, Schema, SchemaDef, State, StateError, Step, Type, Value,
};

const ROUND: u16 = 0;
const PLAYERS: u16 = 1;
const HANDS: u16 = 2;
const HP: u16 = 1;

fn room() -> std::sync::Arc<Schema> {
    let player = Type::structure([Field::new("name", Type::String), Field::new("hp", Type::Int)]);
    Schema::new(SchemaDef::new([
        Field::new("round", Type::Int),
        Field::new("players", Type::map(KeyKind::String, player)).player_keyed(),
        Field::new("hands", Type::map(KeyKind::String, Type::list(Type::Int))).owner_only(),
        Field::new("seed", Type::Int).server_only(),
    ]))
    .unwrap()
}

fn player_value(name: &str, hp: i64) -> Value {
    Value::Struct(vec![Value::Str(name.into()), Value::Int(hp)])
}

fn with_players(n: usize) -> (State, Vec<Key>) {
    let mut state = State::new(room());
    let keys: Vec<Key> = (0..n).map(|i| Key::str(&format!("player-{i}"))).collect();
    for (i, k) in keys.iter().enumerate() {
        state.set(&[Step::Field(PLAYERS), Step::Key(k)], player_value(&format!("n{i}"), 100)).unwrap();
        state.set(&[Step::Field(HANDS), Step::Key(k)], Value::List(vec![Value::Int(i as i64); 10])).unwrap();
    }
    state.seal();
    (state, keys)
}

fn delta_len(state: &State, from: u64, player: &Key) -> usize {
    state.prepare(from, Codec::Binary).unwrap().update_for(state, player, false).unwrap().len()
}

#[test]
fn one_changed_entry_costs_the_same_at_any_size() {
    let mut sizes = Vec::new();
    for n in [10, 100, 1000] {
        let (mut state, keys) = with_players(n);
        let from = state.version();
        state.set(&[Step::Field(PLAYERS), Step::Key(&keys[3]), Step::Field(HP)], Value::Int(7)).unwrap();
        state.seal();
        sizes.push(delta_len(&state, from, &keys[0]));
    }
    // Ids grow with n, so allow one varint byte of difference.
    assert!(sizes[2] <= sizes[0] + 1, "{sizes:?}");
    assert!(sizes[0] <= 12, "one hp change should be a dozen bytes, got {sizes:?}");
}

#[test]
fn a_set_sends_what_differs_and_a_set_that_changes_nothing_sends_nothing() {
    let (mut state, keys) = with_players(5);
    let entry = [Step::Field(PLAYERS), Step::Key(&keys[2])];
    let start = state.version();
    // The same value again: nothing changes, so nothing is due.
    state.set(&entry, player_value("n2", 100)).unwrap();
    state.set(&[Step::Field(ROUND)], Value::Int(0)).unwrap();
    assert!(!state.is_dirty(), "writing the values already held changes nothing");
    assert_eq!(state.seal(), start);

    // A whole entity written with only hp different costs what setting hp alone costs.
    state.set(&entry, player_value("n2", 7)).unwrap();
    state.seal();
    let whole_write = delta_len(&state, start, &keys[0]);
    let (mut alone, _) = with_players(5);
    alone.set(&[Step::Field(PLAYERS), Step::Key(&keys[2]), Step::Field(HP)], Value::Int(7)).unwrap();
    alone.seal();
    assert_eq!(whole_write, delta_len(&alone, start, &keys[0]));

    // A map written whole with the same keys patches the entries that differ; with other keys it
    // is replaced. A replica following tick by tick and one catching up on both ticks at once
    // end equal to the state.
    let snapshot =
        state.snapshot(Codec::Binary).unwrap().update_for(&state, &keys[0], false).unwrap().to_vec();
    let mut step_by_step = Replica::new(state.schema().clone());
    step_by_step.apply(&snapshot).unwrap();
    let mut catching_up = Replica::new(state.schema().clone());
    catching_up.apply(&snapshot).unwrap();
    let before = state.version();
    let delta = |state: &State, from| {
        state.prepare(from, Codec::Binary).unwrap().update_for(state, &keys[0], false).unwrap().to_vec()
    };
    let Value::Map(mut players) = state.get(&[Step::Field(PLAYERS)]).unwrap() else { panic!("a map") };
    players.insert(keys[3].clone(), player_value("renamed", 100));
    state.set(&[Step::Field(PLAYERS)], Value::Map(players.clone())).unwrap();
    state.seal();
    assert!(delta_len(&state, before, &keys[0]) < 20, "one renamed entry, not the whole map");
    step_by_step.apply(&delta(&state, before)).unwrap();
    players.remove(&keys[4]);
    state.set(&[Step::Field(PLAYERS)], Value::Map(players)).unwrap();
    state.seal();
    step_by_step.apply(&delta(&state, before + 1)).unwrap();
    catching_up.apply(&delta(&state, before)).unwrap();
    assert_eq!(step_by_step.value(), state.view_for(&keys[0]));
    assert_eq!(catching_up.value(), state.view_for(&keys[0]));
}

#[test]
fn floats_are_compared_bit_for_bit_and_quantized_ones_by_step() {
    let schema = Schema::new(SchemaDef::new([
        Field::new("x", Type::Float),
        Field::new("q", Type::quantized(-10.0, 10.0, 0.5)),
    ]))
    .unwrap();
    let mut state = State::new(schema.clone());
    let mut replica = Replica::new(schema);
    let nobody = Key::str("p");
    let mut write = |state: &mut State, field: u16, value: f64| {
        let from = state.version();
        state.set(&[Step::Field(field)], Value::Float(value)).unwrap();
        let dirty = state.is_dirty();
        state.seal();
        replica
            .apply(
                &state
                    .prepare(from, Codec::Binary)
                    .unwrap()
                    .update_for(state, &nobody, false)
                    .unwrap()
                    .to_vec(),
            )
            .unwrap();
        let Value::Struct(fields) = replica.value() else { panic!("a struct") };
        (dirty, fields[field as usize].clone())
    };
    assert!(!write(&mut state, 0, 0.0).0, "the default again");
    let (dirty, held) = write(&mut state, 0, -0.0);
    assert!(dirty, "-0.0 is not 0.0");
    assert!(matches!(held, Value::Float(f) if f.to_bits() == (-0.0f64).to_bits()), "{held:?}");
    assert!(write(&mut state, 0, f64::NAN).0);
    assert!(!write(&mut state, 0, f64::NAN).0, "a NaN equals itself");
    // Quantized, values are compared by step: 2.1 is 2.0's, and 0.0 and -0.0 are one step.
    assert!(write(&mut state, 1, 2.0).0);
    assert!(!write(&mut state, 1, 2.1).0, "2.1 rounds to the step 2.0 is");
    assert!(write(&mut state, 1, 0.0).0);
    assert!(!write(&mut state, 1, -0.0).0);
}

#[test]
fn writes_in_one_tick_coalesce_and_catch_up_merges_ticks() {
    let (mut state, keys) = with_players(5);
    let start = state.version();
    let hp = [Step::Field(PLAYERS), Step::Key(&keys[1]), Step::Field(HP)];
    for v in 0..10 {
        state.set(&hp, Value::Int(v)).unwrap();
    }
    state.seal();
    assert_eq!(state.version(), start + 1, "ten writes in one tick are one version");
    let one_tick = delta_len(&state, start, &keys[0]);
    for v in 10..20 {
        state.set(&hp, Value::Int(v)).unwrap();
        state.seal();
    }
    // A subscriber eleven ticks behind gets one delta of the same size, holding the latest value.
    let merged = state.prepare(start, Codec::Binary).unwrap();
    assert!(!merged.is_snapshot());
    let update = merged.update_for(&state, &keys[0], false).unwrap();
    assert_eq!(update.len(), one_tick, "one merged change, not eleven");
    let mut replica = Replica::new(state.schema().clone());
    replica
        .apply(&state.snapshot(Codec::Binary).unwrap().update_for(&state, &keys[0], false).unwrap().to_vec())
        .unwrap();
    assert_eq!(replica.value(), state.view_for(&keys[0]));
}

#[test]
fn broadcast_bytes_are_shared_not_copied() {
    let (mut state, keys) = with_players(30);
    let from = state.version();
    state.set(&[Step::Field(ROUND)], Value::Int(2)).unwrap();
    state.set(&[Step::Field(HANDS), Step::Key(&keys[4]), Step::Index(0)], Value::Int(99)).unwrap();
    state.seal();
    let prepared = state.prepare(from, Codec::Binary).unwrap();
    let a = prepared.update_for(&state, &keys[0], false).unwrap();
    let b = prepared.update_for(&state, &keys[1], false).unwrap();
    assert_eq!(a.segments[1].as_ptr(), b.segments[1].as_ptr(), "one broadcast buffer for everyone");
    assert_eq!(a.segments.len(), 2, "player 0's hand did not change: header and broadcast only");
    let owner = prepared.update_for(&state, &keys[4], false).unwrap();
    assert_eq!(owner.segments.len(), 3, "player 4 also gets its own hand");
    assert_eq!(prepared.private_players().collect::<Vec<_>>(), [&keys[4]]);
}

#[test]
fn skip_self_slices_out_the_own_entry() {
    let (mut state, keys) = with_players(3);
    let from = state.version();
    for k in &keys {
        state.set(&[Step::Field(PLAYERS), Step::Key(k), Step::Field(HP)], Value::Int(1)).unwrap();
    }
    state.seal();
    let prepared = state.prepare(from, Codec::Binary).unwrap();
    let full = prepared.update_for(&state, &keys[1], false).unwrap();
    let skipped = prepared.update_for(&state, &keys[1], true).unwrap();
    assert!(skipped.len() < full.len());
    // The slices point into the same broadcast buffer.
    let base = prepared.broadcast().as_ptr() as usize;
    let range = base..base + prepared.broadcast().len();
    assert!(skipped.segments[1..].iter().all(|s| range.contains(&(s.as_ptr() as usize))));
}

#[test]
fn owner_only_and_server_only_never_reach_others() {
    let (mut state, keys) = with_players(3);
    let from = state.version();
    let secret = 0x5EC2E7_i64;
    state.set(&[Step::Field(HANDS), Step::Key(&keys[2]), Step::Index(5)], Value::Int(secret)).unwrap();
    state.set(&[Step::Field(3)], Value::Int(secret)).unwrap();
    state.seal();
    let needle = {
        let mut v = Vec::new();
        prost::encoding::encode_varint(((secret << 1) ^ (secret >> 63)) as u64, &mut v);
        v
    };
    for codec in [Codec::Binary, Codec::Json] {
        for from in [0, from] {
            let prepared = state.prepare(from, codec).unwrap();
            for k in &keys[..2] {
                let bytes = prepared.update_for(&state, k, false).unwrap().to_vec();
                assert!(!bytes.windows(needle.len()).any(|w| w == needle), "binary secret leaked to {k}");
                assert!(
                    !String::from_utf8_lossy(&bytes).contains(&secret.to_string()),
                    "JSON secret leaked to {k}"
                );
            }
            let own = prepared.update_for(&state, &keys[2], false).unwrap().to_vec();
            let found = own.windows(needle.len()).any(|w| w == needle)
                || String::from_utf8_lossy(&own).contains(&secret.to_string());
            assert!(found, "the owner gets its own hand ({codec:?}, from {from})");
        }
    }
}

#[test]
fn lost_removal_history_means_a_snapshot() {
    let schema = room();
    let mut state =
        State::with_limits(schema, Limits { max_tombstones: 2, history: 1000, ..Limits::default() });
    let keys: Vec<Key> = (0..5).map(|i| Key::Int(i).to_string()).map(|s| Key::str(&s)).collect();
    for k in &keys {
        state.set(&[Step::Field(PLAYERS), Step::Key(k)], player_value("x", 1)).unwrap();
    }
    let old = state.seal();
    for k in &keys[..2] {
        state.remove(&[Step::Field(PLAYERS), Step::Key(k)]).unwrap();
        state.seal();
    }
    assert!(!state.prepare(old, Codec::Binary).unwrap().is_snapshot(), "two tombstones are kept");
    state.remove(&[Step::Field(PLAYERS), Step::Key(&keys[2])]).unwrap();
    state.seal();
    assert!(state.floor() > old);
    let p = state.prepare(old, Codec::Binary).unwrap();
    assert!(p.is_snapshot(), "the first removal was forgotten, so {old} gets a snapshot");
    assert!(!state.prepare(old + 1, Codec::Binary).unwrap().is_snapshot());
}

#[test]
fn rejected_writes_change_nothing() {
    let (mut state, keys) = with_players(2);
    let before = state.view_for(&keys[0]);
    let v = state.version();
    let ghost = Key::str("ghost");
    let cases: Vec<(Vec<Step<'_>>, Value)> = vec![
        (vec![Step::Field(ROUND)], Value::Str("not an int".into())),
        (vec![Step::Field(9)], Value::Int(1)),
        (vec![Step::Field(PLAYERS), Step::Key(&ghost), Step::Field(HP)], Value::Int(1)),
        (vec![Step::Field(PLAYERS), Step::Key(&Key::Int(1))], player_value("int key", 1)),
        (vec![Step::Field(PLAYERS), Step::Key(&keys[0])], Value::Struct(vec![Value::Int(1)])),
        (vec![Step::Field(HANDS), Step::Key(&keys[0]), Step::Index(10)], Value::Int(1)),
        (vec![Step::Field(ROUND), Step::Index(0)], Value::Int(1)),
        (vec![], Value::Int(1)),
    ];
    for (path, value) in cases {
        assert!(state.set(&path, value).is_err(), "{path:?}");
    }
    assert_eq!(state.push(&[Step::Field(ROUND)], Value::Int(1)), Err(StateError::WrongTarget("list")));
    assert!(state.remove(&[Step::Field(ROUND)]).is_err());
    assert_eq!(state.remove(&[Step::Field(PLAYERS), Step::Key(&ghost)]), Ok(false));
    assert!(!state.is_dirty());
    assert_eq!(state.seal(), v);
    assert_eq!(state.view_for(&keys[0]), before);
}

#[test]
fn json_writes_that_do_not_fit_change_nothing() {
    let (mut state, keys) = with_players(2);
    let before = state.view_for(&keys[0]);
    let (v, bytes) = (state.version(), state.bytes());
    let ghost = Key::str("ghost");
    let player = |k| vec![Step::Field(PLAYERS), Step::Key(k)];
    let cases: Vec<(Vec<Step<'_>>, &str)> = vec![
        (vec![Step::Field(ROUND)], r#""not an int""#),
        (vec![Step::Field(ROUND)], "1.5"),
        (vec![Step::Field(ROUND)], "1 2"),
        (player(&keys[0]), r#"{"hp": 1, "hp": 2}"#),
        (player(&keys[0]), r#"{"nope": 1}"#),
        (player(&keys[0]), r#"{"hp": "x"}"#),
        (player(&ghost), r#"{"name": "g", "hp": 1"#),
        (vec![Step::Field(HANDS), Step::Key(&keys[0])], "[1, 2, null]"),
        (vec![Step::Field(PLAYERS), Step::Key(&ghost), Step::Field(HP)], "1"),
    ];
    for (path, json) in cases {
        assert!(state.set_json(&path, json).is_err(), "{path:?} {json}");
    }
    assert!(!state.is_dirty());
    assert_eq!((state.seal(), state.bytes()), (v, bytes));
    assert_eq!(state.view_for(&keys[0]), before);
    // And one that fits is taken, as `set` would take it.
    state.set_json(&player(&ghost), r#"{"name": "g"}"#).unwrap();
    assert_eq!(state.get(&player(&ghost)), Ok(player_value("g", 0)));
}

#[test]
fn a_float_that_is_not_finite_reaches_a_json_replica_as_nan() {
    let schema =
        Schema::new(SchemaDef::new([Field::new("f", Type::Float), Field::new("v", Type::Vec3)])).unwrap();
    let mut state = State::new(schema.clone());
    let mut replica = Replica::new(schema);
    for value in [f64::INFINITY, f64::NAN] {
        let held = replica.version();
        state.set(&[Step::Field(0)], Value::Float(value)).unwrap();
        state.set(&[Step::Field(1)], Value::Vec3([1.0, value, 2.0])).unwrap();
        state.seal();
        let update = state
            .prepare(held, Codec::Json)
            .unwrap()
            .update_for(&state, &Key::Int(0), false)
            .unwrap()
            .to_vec();
        assert!(String::from_utf8_lossy(&update).contains("null"), "{}", String::from_utf8_lossy(&update));
        replica.apply_json(&update).unwrap();
        let Some(Value::Float(got)) = replica.get(&[Step::Field(0)]) else { panic!("a float") };
        assert!(got.is_nan(), "{value} arrives as null, read as NaN; got {got}");
        let Some(Value::Vec3([1.0, got, 2.0])) = replica.get(&[Step::Field(1)]) else { panic!("a vec3") };
        assert!(got.is_nan(), "a vec3 part {value} arrives as null, read as NaN; got {got}");
    }
}

#[test]
fn views_cut_owner_only_maps_to_the_own_entry() {
    let (state, keys) = with_players(3);
    let Value::Struct(fields) = state.view_for(&keys[1]) else { panic!("root is a struct") };
    let Value::Map(hands) = &fields[HANDS as usize] else { panic!("hands is a map") };
    assert_eq!(hands.keys().collect::<Vec<_>>(), [&keys[1]]);
    assert_eq!(fields[3], Value::Int(0), "server-only fields stay at their default");
    let Value::Map(players) = &fields[PLAYERS as usize] else { panic!("players is a map") };
    assert_eq!(players.len(), 3);
}

#[test]
fn lists_and_maps_past_the_length_limit_are_refused_and_change_nothing() {
    let limits = Limits { max_len: 3, ..Limits::default() };
    let mut state = State::with_limits(room(), limits);
    let keys: Vec<Key> = (0..3).map(|i| Key::str(&format!("p{i}"))).collect();
    for k in &keys {
        state.set(&[Step::Field(PLAYERS), Step::Key(k)], player_value("n", 1)).unwrap();
    }
    let hand = [Step::Field(HANDS), Step::Key(&keys[0])];
    state.set(&hand, Value::List(vec![Value::Int(1); 3])).unwrap();
    let v = state.seal();
    let before = state.view_for(&keys[0]);
    let fourth = Key::str("p3");
    assert_eq!(
        state.set(&[Step::Field(PLAYERS), Step::Key(&fourth)], player_value("n", 1)),
        Err(StateError::TooLong { len: 4, max: 3 }),
        "a fourth map entry"
    );
    assert_eq!(state.push(&hand, Value::Int(2)), Err(StateError::TooLong { len: 4, max: 3 }));
    assert_eq!(
        state.set(&hand, Value::List(vec![Value::Int(1); 4])),
        Err(StateError::TooLong { len: 4, max: 3 })
    );
    // Replacing an existing entry is not growth.
    state.set(&[Step::Field(PLAYERS), Step::Key(&keys[1])], player_value("m", 2)).unwrap();
    state.remove(&[Step::Field(PLAYERS), Step::Key(&keys[2])]).unwrap();
    state.set(&[Step::Field(PLAYERS), Step::Key(&fourth)], player_value("n", 1)).unwrap();
    assert!(state.seal() > v);
    let Value::Struct(fields) = state.view_for(&keys[0]) else { panic!("a struct") };
    let Value::Struct(old) = before else { panic!("a struct") };
    assert_eq!(fields[HANDS as usize], old[HANDS as usize], "the refused writes left the hand alone");
}

#[test]
fn a_state_past_its_byte_limit_is_refused_and_changes_nothing() {
    let mut state = State::new(room());
    let empty = state.bytes();
    let big = |n: usize| player_value(&"x".repeat(n), 1);
    let key = Key::str("p0");
    state.set(&[Step::Field(PLAYERS), Step::Key(&key)], big(100)).unwrap();
    let one = state.bytes() - empty;
    assert!(one >= 100, "a 100-byte name weighs at least 100: {one}");
    let limits = Limits { max_bytes: empty + 2 * one, ..Limits::default() };
    let mut state = State::with_limits(room(), limits);
    for i in 0..2 {
        state.set(&[Step::Field(PLAYERS), Step::Key(&Key::str(&format!("p{i}")))], big(100)).unwrap();
    }
    let full = state.bytes();
    let third = Key::str("p2");
    assert!(matches!(
        state.set(&[Step::Field(PLAYERS), Step::Key(&third)], big(100)),
        Err(StateError::TooBig { .. })
    ));
    assert!(matches!(
        state.set(&[Step::Field(PLAYERS), Step::Key(&Key::str("p0"))], big(200)),
        Err(StateError::TooBig { .. })
    ));
    assert_eq!(state.bytes(), full, "refused writes change nothing");
    // Shrinking is always allowed, and frees room.
    assert!(state.remove(&[Step::Field(PLAYERS), Step::Key(&Key::str("p1"))]).unwrap());
    assert!(state.bytes() < full);
    state.set(&[Step::Field(PLAYERS), Step::Key(&third)], big(100)).unwrap();
    assert_eq!(state.bytes(), full);
}
