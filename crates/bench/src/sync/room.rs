//! The B2 room, exactly as `BENCHMARKS.md` describes SwiftStateTree's benchmark state:
//! a broadcast `round`, a broadcast `players` map of public player states (8 scalars), and an
//! owner-only `hands` map (each player sees only its own hand of cards).
//!
//! `sync_now` is what the report times: compute and encode everything every member must receive
//! this tick, delivered to a counting sink.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tickwire_state::{
    Codec, Field, Key, KeyKind, Replica, Schema, SchemaDef, State, StateError, Step, Type, Update, Value,
    Version,
};

const ROUND: u16 = 0;
const PLAYERS: u16 = 1;
const HANDS: u16 = 2;

// Public player state fields.
const HP: u16 = 1;
const X: u16 = 2;
const Y: u16 = 3;
const Z: u16 = 4;
const FACING: u16 = 5;

/// Cards per hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum StateSize {
    /// 3 cards.
    Small,
    /// 10 cards (the report's figures).
    Medium,
    /// 30 cards.
    Large,
}

impl StateSize {
    pub fn cards(self) -> usize {
        match self {
            StateSize::Small => 3,
            StateSize::Medium => 10,
            StateSize::Large => 30,
        }
    }
}

/// Share of players whose hand changes each tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Dirty {
    /// 5%.
    Low,
    /// 20%.
    Medium,
    /// 80%.
    High,
}

impl Dirty {
    pub fn ratio(self) -> f64 {
        match self {
            Dirty::Low => 0.05,
            Dirty::Medium => 0.20,
            Dirty::High => 0.80,
        }
    }
}

/// What changes each tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// `round` and the dirty share of hands.
    Sync,
    /// The same, and every player's public state (position, facing, hp).
    SyncPlayers,
}

/// The room schema.
pub fn schema() -> Arc<Schema> {
    let pos = || Type::quantized(-1000.0, 1000.0, 0.01);
    let player = Type::structure([
        Field::new("name", Type::String),
        Field::new("hp", Type::Int),
        Field::new("x", pos()),
        Field::new("y", pos()),
        Field::new("z", pos()),
        Field::new("facing", Type::quantized(0.0, 360.0, 0.1)),
        Field::new("status", Type::Int),
        Field::new("level", Type::Int),
    ]);
    let card = Type::structure([
        Field::new("id", Type::Int),
        Field::new("suit", Type::Int),
        Field::new("rank", Type::Int),
    ]);
    Schema::new(SchemaDef::new([
        Field::new("round", Type::Int),
        Field::new("players", Type::map(KeyKind::String, player)).player_keyed(),
        Field::new("hands", Type::map(KeyKind::String, Type::list(card))).owner_only(),
    ]))
    .expect("the room schema is valid")
}

/// Counts what would be sent, so the encoder's output is used and measured.
#[derive(Debug, Default, Clone, Copy)]
pub struct Sink {
    pub bytes: u64,
    pub updates: u64,
    pub segments: u64,
}

/// A player's output did not rebuild that player's view.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("verify: the replicas were not started")]
    NotStarted,
    #[error("verify: {player}'s replica refused its update: {error}")]
    Decode { player: String, error: String },
    #[error("verify: {player}'s replica at version {version} differs from that player's view")]
    Mismatch { player: String, version: Version },
}

pub struct Room {
    state: State,
    players: Vec<Key>,
    /// The updates of the last sync, one per player.
    sent: Vec<Update>,
    /// One per player, for `--verify`.
    replicas: Vec<Replica>,
    cards: usize,
    rng: SmallRng,
    last: Version,
    next_card: i64,
}

impl Room {
    pub fn new(players: usize, size: StateSize, seed: u64) -> Room {
        let mut room = Room {
            state: State::new(schema()),
            players: (0..players).map(|i| Key::str(&format!("player-{i:05}"))).collect(),
            cards: size.cards(),
            rng: SmallRng::seed_from_u64(seed),
            sent: Vec::with_capacity(players),
            replicas: Vec::new(),
            last: 0,
            next_card: 0,
        };
        for i in 0..players {
            let key = room.players[i].clone();
            let public = Value::Struct(vec![
                Value::Str(format!("Player {i}")),
                Value::Int(100),
                Value::Float(room.rng.random_range(-500.0..500.0)),
                Value::Float(0.0),
                Value::Float(room.rng.random_range(-500.0..500.0)),
                Value::Float(room.rng.random_range(0.0..360.0)),
                Value::Int(1),
                Value::Int(room.rng.random_range(1..60)),
            ]);
            room.state.set(&[Step::Field(PLAYERS), Step::Key(&key)], public).expect("fits the schema");
            let hand = (0..room.cards).map(|_| room.card()).collect();
            room.state
                .set(&[Step::Field(HANDS), Step::Key(&key)], Value::List(hand))
                .expect("fits the schema");
        }
        room.last = room.state.seal();
        room
    }

    fn card(&mut self) -> Value {
        self.next_card += 1;
        Value::Struct(vec![
            Value::Int(self.next_card),
            Value::Int(self.rng.random_range(0..4)),
            Value::Int(self.rng.random_range(1..14)),
        ])
    }

    /// One tick of game logic: the writes, with the engine's dirty tracking (timed on its own,
    /// apart from `sync_now`).
    pub fn mutate(&mut self, scenario: Scenario, dirty: Dirty) {
        let n = self.players.len();
        let round = self.state.version() as i64 + 1;
        self.state.set(&[Step::Field(ROUND)], Value::Int(round)).expect("fits the schema");

        // The dirty share of hands: one card replaced (3 leaves, to its owner only).
        let changed = ((n as f64 * dirty.ratio()).round() as usize).max(1);
        let start = self.rng.random_range(0..n);
        for j in 0..changed {
            let key = self.players[(start + j) % n].clone();
            let slot = self.rng.random_range(0..self.cards) as u32;
            let card = self.card();
            self.state
                .set(&[Step::Field(HANDS), Step::Key(&key), Step::Index(slot)], card)
                .expect("fits the schema");
        }

        if scenario == Scenario::SyncPlayers {
            // Everyone walks and turns; hp changes: 5 leaves per player, to every player.
            for i in 0..n {
                let key = self.players[i].clone();
                let base = [Step::Field(PLAYERS), Step::Key(&key)];
                let at = |f: u16| [base[0], base[1], Step::Field(f)];
                let step: f64 = self.rng.random_range(-0.3..0.3);
                for (field, value) in [
                    (X, Value::Float(step * 1.0 + i as f64 * 0.01)),
                    (Y, Value::Float(self.rng.random_range(0.0..2.0))),
                    (Z, Value::Float(step * 2.0 + round as f64 * 0.05)),
                    (FACING, Value::Float(self.rng.random_range(0.0..360.0))),
                    (HP, Value::Int(self.rng.random_range(1..101))),
                ] {
                    self.state.set(&at(field), value).expect("fits the schema");
                }
            }
        }
    }

    /// The timed part: seal the tick, encode once per audience, assemble every player's update
    /// and hand it to the sink (it keeps the updates, as a transport's queue would, until
    /// [`Room::verify`] or the next sync). Returns the time spent encoding (the rest is
    /// assembly: pointer work per player).
    pub fn sync_now(&mut self, codec: Codec, sink: &mut Sink) -> Result<Duration, StateError> {
        let t0 = Instant::now();
        let to = self.state.seal();
        let prepared = self.state.prepare(self.last, codec)?;
        let encode = t0.elapsed();
        self.sent.clear();
        for player in &self.players {
            let update = prepared.update_for(&self.state, player, false)?;
            sink.bytes += update.len() as u64;
            sink.segments += update.segments.len() as u64;
            sink.updates += 1;
            self.sent.push(update);
        }
        black_box(&self.sent);
        self.last = to;
        Ok(encode)
    }

    /// Decodes every player's update of the last sync with that player's replica and checks
    /// the replica against what the player may see. The replicas start from a snapshot on the
    /// first call. Not timed.
    pub fn verify(&mut self, codec: Codec) -> Result<(), VerifyError> {
        if self.replicas.is_empty() {
            return Err(VerifyError::NotStarted);
        }
        for ((player, replica), update) in self.players.iter().zip(&mut self.replicas).zip(&self.sent) {
            let applied = replica.apply_codec(codec, &update.to_vec());
            applied.map_err(|e| VerifyError::Decode { player: player.to_string(), error: e.to_string() })?;
            if replica.value() != self.state.view_for(player) {
                return Err(VerifyError::Mismatch { player: player.to_string(), version: replica.version() });
            }
        }
        Ok(())
    }

    /// Gives every player a replica built from a snapshot of the state as it is now, for
    /// [`Room::verify`]. Call between syncs.
    pub fn start_replicas(&mut self, codec: Codec) -> Result<(), StateError> {
        let snapshot = self.state.snapshot(codec)?;
        self.replicas.clear();
        for player in &self.players {
            let mut replica = Replica::new(self.state.schema().clone());
            let bytes = snapshot.update_for(&self.state, player, false)?.to_vec();
            replica.apply_codec(codec, &bytes).expect("a fresh replica applies the state's own snapshot");
            self.replicas.push(replica);
        }
        Ok(())
    }

    pub fn players(&self) -> usize {
        self.players.len()
    }

    /// Player `i`'s snapshot of the state as it is now.
    pub fn snapshot_for(&self, i: usize, codec: Codec) -> Result<Vec<u8>, StateError> {
        Ok(self.state.snapshot(codec)?.update_for(&self.state, &self.players[i], false)?.to_vec())
    }

    /// Player `i`'s update of the last sync.
    pub fn last_update_for(&self, i: usize) -> Vec<u8> {
        self.sent[i].to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_player_rebuilds_its_own_view() {
        for scenario in [Scenario::Sync, Scenario::SyncPlayers] {
            let mut room = Room::new(12, StateSize::Small, 1);
            let schema = room.state.schema().clone();
            let mut replicas: Vec<Replica> = (0..12).map(|_| Replica::new(schema.clone())).collect();
            for (r, p) in replicas.iter_mut().zip(&room.players) {
                let snap = room.state.snapshot(Codec::Binary).unwrap();
                r.apply(&snap.update_for(&room.state, p, false).unwrap().to_vec()).unwrap();
            }
            for _ in 0..5 {
                room.mutate(scenario, Dirty::Medium);
                let from = room.last;
                let to = room.state.seal();
                let prepared = room.state.prepare(from, Codec::Binary).unwrap();
                for (r, p) in replicas.iter_mut().zip(&room.players) {
                    r.apply(&prepared.update_for(&room.state, p, false).unwrap().to_vec()).unwrap();
                    assert_eq!(r.value(), room.state.view_for(p));
                }
                room.last = to;
            }
        }
    }

    #[test]
    fn verify_passes_on_the_real_output_and_fails_on_a_stale_one() {
        for codec in [Codec::Binary, Codec::Json] {
            let mut room = Room::new(10, StateSize::Small, 3);
            assert!(matches!(room.verify(codec), Err(VerifyError::NotStarted)));
            room.start_replicas(codec).unwrap();
            let mut sink = Sink::default();
            for _ in 0..5 {
                room.mutate(Scenario::SyncPlayers, Dirty::High);
                room.sync_now(codec, &mut sink).unwrap();
                room.verify(codec).unwrap();
            }
            // The same updates again: every replica is past them, so the check must fail.
            assert!(matches!(room.verify(codec), Err(VerifyError::Decode { .. })), "{codec:?}");
        }
    }

    #[test]
    fn the_sink_counts_one_update_per_player() {
        let mut room = Room::new(30, StateSize::Medium, 2);
        room.mutate(Scenario::SyncPlayers, Dirty::Medium);
        let mut sink = Sink::default();
        room.sync_now(Codec::Binary, &mut sink).unwrap();
        assert_eq!(sink.updates, 30);
        // Header + broadcast for everyone, plus a private segment for the 6 changed hands.
        assert_eq!(sink.segments, 30 * 2 + 6);
    }
}
