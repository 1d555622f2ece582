//! The engine's contract, checked on random schemas and random writes: for every player, the
//! snapshot plus every update it received rebuilds exactly what that player may see, whatever its
//! fan-out rate, however many ticks it missed, whichever codec it uses, and whether it skips its
//! own entries in player-keyed maps or receives only some root fields.

mod common;

use common::{PLAYERS, Rng, compile, player, random_schema, random_write, without_own};
use proptest::prelude::*;
use tickwire_state::{Codec, FieldMask, Key, Limits, PreparedCache, Replica, State, Value, Version};

struct Subscriber {
    player: Key,
    /// Fan-out every `rate` ticks.
    rate: u64,
    /// Joins at this tick.
    join: u64,
    /// Percent chance of missing a due fan-out (a slow consumer).
    miss: u64,
    /// Leaves its own entries out of player-keyed maps.
    skip_self: bool,
    /// Receives only these root fields.
    mask: Option<FieldMask>,
    replica: Replica,
    last: Version,
    joined: bool,
}

/// A fresh state holding `state`'s value, written field by field.
fn rebuild(schema: &std::sync::Arc<tickwire_state::Schema>, state: &State) -> State {
    let mut fresh = State::new(schema.clone());
    let Ok(Value::Struct(fields)) = state.get(&[]) else { panic!("the root is a struct") };
    for (i, value) in fields.into_iter().enumerate() {
        fresh.set(&[tickwire_state::Step::Field(i as u16)], value).expect("a value the state held fits");
    }
    fresh
}

fn run(seed: u64, ticks: u64, codec: Codec) -> Result<(), TestCaseError> {
    let mut rng = Rng::new(seed);
    let def = random_schema(&mut rng);
    let schema = compile(&def);
    // Small limits, so old removals fall out of history and lagging players need snapshots.
    let limits =
        Limits { max_tombstones: 1 + rng.below(4) as usize, history: 1 + rng.below(12), ..Limits::default() };
    let mut state = State::with_limits(schema.clone(), limits);
    let mut subs: Vec<Subscriber> = (0..PLAYERS.len())
        .map(|i| Subscriber {
            player: player(i),
            rate: [1, 1, 3, 5][i],
            join: [0, 4, 0, 7][i],
            miss: [0, 20, 0, 40][i],
            skip_self: i == 1 || i == 3,
            mask: None,
            replica: Replica::new(schema.clone()),
            last: 0,
            joined: false,
        })
        .collect();
    // Player 2 receives a random subset of the root fields.
    let names: Vec<&str> = def.fields.iter().map(|f| f.name.as_str()).filter(|_| rng.chance(50)).collect();
    subs[2].mask = Some(FieldMask::from_names(&schema, &names).unwrap());
    let defaults = Replica::new(schema.clone()).value();
    let mut cache = PreparedCache::default();
    for tick in 0..ticks {
        for _ in 0..rng.below(6) {
            random_write(&mut rng, &def, &mut state);
        }
        state.seal();
        // The size the state keeps up write by write equals the size of its value built anew.
        let rebuilt = rebuild(&schema, &state);
        prop_assert_eq!(state.bytes(), rebuilt.bytes(), "tick {} schema {:?}", tick, def);
        for sub in &mut subs {
            let due = tick >= sub.join && tick % sub.rate == 0 && !rng.chance(sub.miss);
            if !due {
                continue;
            }
            let from = if sub.joined { sub.last } else { 0 };
            let prepared = cache.get_masked(&state, from, codec, sub.mask.as_ref()).unwrap();
            let update = prepared.update_for(&state, &sub.player, sub.skip_self).unwrap();
            if sub.joined && !prepared.is_snapshot() && !update.has_changes() {
                continue;
            }
            let bytes = update.to_vec();
            match codec {
                Codec::Binary => {
                    let applied = sub.replica.apply(&bytes);
                    prop_assert!(
                        applied.is_ok(),
                        "tick {tick} {:?}: {applied:?}\n{}",
                        sub.player,
                        hex::encode(&bytes)
                    );
                }
                Codec::Json => {
                    let applied = sub.replica.apply_json(&bytes);
                    prop_assert!(
                        applied.is_ok(),
                        "tick {tick} {:?}: {applied:?}\n{}",
                        sub.player,
                        String::from_utf8_lossy(&bytes)
                    );
                }
            }
            sub.joined = true;
            sub.last = prepared.to();
            let mut expected = state.view_for(&sub.player);
            if sub.skip_self {
                expected = without_own(&def.fields, expected, &sub.player);
            }
            if let (Some(mask), Value::Struct(fields), Value::Struct(default_fields)) =
                (&sub.mask, &mut expected, &defaults)
            {
                for (i, (f, d)) in fields.iter_mut().zip(default_fields).enumerate() {
                    if !mask.contains(i) {
                        *f = d.clone();
                    }
                }
            }
            prop_assert_eq!(
                sub.replica.value(),
                expected,
                "tick {} player {:?} from {} snapshot {} schema {:?}",
                tick,
                sub.player,
                from,
                prepared.is_snapshot(),
                def
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn binary_replicas_converge(seed in any::<u64>()) {
        run(seed, 40, Codec::Binary)?;
    }

    #[test]
    fn json_replicas_converge(seed in any::<u64>()) {
        run(seed, 40, Codec::Json)?;
    }
}
