//! The replica's decoders on hostile input: random bytes and corrupted real updates are typed
//! errors, never panics (in a replica that counts entries too, whose decoding takes other
//! paths), and a replica that failed accepts no delta until a snapshot.

mod common;

use common::{Rng, compile, player, random_schema, random_write};
use proptest::prelude::*;
use tickwire_state::{Codec, DecodeError, Patch, Replica, State};

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(seed in any::<u64>(), bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let schema = compile(&random_schema(&mut Rng::new(seed)));
        for counting in [false, true] {
            let fresh = || {
                let replica = Replica::new(schema.clone());
                if counting { replica.counting_entries() } else { replica }
            };
            let _ = fresh().apply(&bytes);
            let _ = fresh().apply_json(&bytes);
        }
    }

    #[test]
    fn random_patches_never_panic_and_refused_ones_change_nothing(
        seed in any::<u64>(),
        lines in proptest::collection::vec(
            (prop_oneof!["set", "remove", "push", "cap", "truncate", "nope"], "(/f[0-3]|/p[0-3]|/[0-9]|/x){0,4}", prop_oneof![
                Just("1".to_owned()), Just("\"p1\"".to_owned()), Just("[1,2]".to_owned()), Just("{}".to_owned()),
                Just("{\"f0\":1}".to_owned()), Just("null".to_owned()), Just("-3.5".to_owned()), Just("true".to_owned()),
            ]),
            0..6,
        ),
        junk in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut rng = Rng::new(seed);
        let def = random_schema(&mut rng);
        let schema = compile(&def);
        let mut state = State::new(schema.clone());
        for _ in 0..10 {
            random_write(&mut rng, &def, &mut state);
        }
        state.seal();
        let text: String = lines
            .iter()
            .map(|(op, path, value)| format!("{{\"op\":\"{op}\",\"path\":\"{path}\",\"value\":{value}}}\n"))
            .collect();
        let before = state.get(&[]).unwrap();
        if let Ok(patch) = Patch::parse_json(&schema, text.as_bytes())
            && state.apply_patch(&patch).is_err()
        {
            prop_assert_eq!(state.get(&[]).unwrap(), before);
        }
        let _ = Patch::parse_json(&schema, &junk);
    }

    #[test]
    fn corrupted_updates_never_panic(seed in any::<u64>(), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6), cut in any::<usize>()) {
        let mut rng = Rng::new(seed);
        let def = random_schema(&mut rng);
        let schema = compile(&def);
        let mut state = State::new(schema.clone());
        for _ in 0..20 {
            random_write(&mut rng, &def, &mut state);
        }
        state.seal();
        for codec in [Codec::Binary, Codec::Json] {
            let mut bytes = state.snapshot(codec).unwrap().update_for(&state, &player(0), false).unwrap().to_vec();
            for (at, x) in &flips {
                let n = bytes.len();
                bytes[at % n] ^= x | 1;
            }
            bytes.truncate(cut % (bytes.len() + 1));
            let _ = Replica::new(schema.clone()).apply_codec(codec, &bytes);
            let mut counting = Replica::new(schema.clone()).counting_entries();
            if counting.apply_codec(codec, &bytes).is_err() {
                prop_assert_eq!(counting.entries_applied(), 0, "a refused update counts nothing");
            }
        }
    }
}

#[test]
fn a_failed_replica_needs_a_snapshot() {
    let mut rng = Rng::new(7);
    let def = random_schema(&mut rng);
    let schema = compile(&def);
    let mut state = State::new(schema.clone());
    random_write(&mut rng, &def, &mut state);
    let v1 = state.seal();
    let snapshot =
        state.snapshot(Codec::Binary).unwrap().update_for(&state, &player(0), false).unwrap().to_vec();

    let mut replica = Replica::new(schema);
    // A delta header (kind 1, from 0, to 1) followed by a field tag past the end of any schema.
    assert!(matches!(replica.apply(&[1, 0, 1, 0xff, 0x7f]), Err(DecodeError::NoField(_))));
    assert_eq!(replica.apply(&[1, 0, 1, 0]), Err(DecodeError::NeedsSnapshot));
    assert_eq!(replica.apply(&snapshot), Ok(v1));
    assert_eq!(replica.value(), state.view_for(&player(0)));
    assert_eq!(replica.apply(&[1, 9, 10, 0]), Err(DecodeError::VersionMismatch { from: 9, have: v1 }));
    assert_eq!(replica.apply(&[7, 0, 0]), Err(DecodeError::UnknownKind(7)));
    assert_eq!(replica.apply(&[]), Err(DecodeError::Truncated("update header")));
}
