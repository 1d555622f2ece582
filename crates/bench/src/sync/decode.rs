//! Decode throughput of a client's replica, on a corpus both SDKs can read: one player's
//! updates of a B2 room (a snapshot, then one delta per tick), written to a JSON file with the
//! schema, and decoded here by the Rust replica. The TypeScript SDK's `npm run bench` decodes
//! the same file, so the two figures are over the same bytes.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;
use tickwire_state::{Codec, Replica};

use super::SyncArgs;
use super::room::{Room, Sink, schema};
use crate::machine::Machine;

/// How long the decode loop runs (whole passes over the corpus).
const MEASURE: Duration = Duration::from_secs(2);

pub(super) fn run(args: &SyncArgs, machine: &Machine, path: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(args.players > 0 && args.iterations > 0, "--players and --iterations must be above zero");
    let mut room = Room::new(args.players, args.state, 1);
    let mut updates = vec![room.snapshot_for(0, Codec::Binary)?];
    let mut sink = Sink::default();
    for _ in 0..args.iterations {
        room.mutate(args.scenario, args.dirty);
        room.sync_now(Codec::Binary, &mut sink)?;
        updates.push(room.last_update_for(0));
    }
    let schema = schema();

    // Verified once: the corpus decodes, every delta chaining on the one before, to the state
    // a fresh snapshot of the room gives.
    let mut replica = Replica::new(schema.clone());
    for (i, u) in updates.iter().enumerate() {
        replica.apply(u).with_context(|| format!("update {i} of the corpus does not decode"))?;
    }
    let last = room.snapshot_for(0, Codec::Binary)?;
    let mut fresh = Replica::new(schema.clone());
    fresh.apply(&last).context("the room's last snapshot does not decode")?;
    anyhow::ensure!(
        fresh.value() == replica.value(),
        "the replica after the corpus's deltas differs from the room's last snapshot"
    );

    let deltas = updates.len() - 1;
    let delta_bytes: usize = updates[1..].iter().map(Vec::len).sum();
    let started = Instant::now();
    let (mut passes, mut decode) = (0u64, Duration::ZERO);
    while started.elapsed() < MEASURE {
        let mut replica = Replica::new(schema.clone());
        replica.apply(&updates[0]).expect("verified above");
        let t0 = Instant::now();
        for u in &updates[1..] {
            std::hint::black_box(replica.apply(u).expect("verified above"));
        }
        decode += t0.elapsed();
        passes += 1;
    }
    let per_s = (passes * deltas as u64) as f64 / decode.as_secs_f64();
    let mb_per_s = (passes * delta_bytes as u64) as f64 / decode.as_secs_f64() / 1e6;

    let corpus = json!({
        "about": "One player's updates of a tickwire bench sync room (binary codec, docs/protocol.md 12.2): \
                  updates_hex[0] is a snapshot, each later one a delta from the one before; \
                  last_snapshot_hex is the room's state after the last one, to check a decoder against. \
                  rust is the Rust replica's decode rate over the deltas on the machine named.",
        "players": args.players,
        "scenario": format!("{:?}", args.scenario),
        "state": format!("{:?}", args.state),
        "dirty": format!("{:?}", args.dirty),
        "schema": schema.def(),
        "updates_hex": updates.iter().map(hex::encode).collect::<Vec<_>>(),
        "last_snapshot_hex": hex::encode(&last),
        "rust": {"deltas_per_s": per_s, "mb_per_s": mb_per_s, "machine": machine.line()},
    });
    std::fs::write(path, serde_json::to_vec(&corpus)?)
        .with_context(|| format!("writing {}", path.display()))?;
    if !args.quiet {
        println!("machine: {}", machine.line());
        println!(
            "Rust replica: {per_s:.0} deltas/s ({mb_per_s:.1} MB/s), one player of a {}-player room, {deltas} deltas of {:.0} bytes on average",
            args.players,
            delta_bytes as f64 / deltas as f64
        );
        println!("wrote {}", path.display());
    }
    Ok(())
}
