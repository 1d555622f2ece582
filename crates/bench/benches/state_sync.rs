//! Micro-benchmark of the state engine's hot path: one room's `syncNow` (seal, encode once per
//! audience, assemble every player's update) in the B2 room model. `tickwire bench sync` runs
//! the report's whole grid; this is the quick loop for working on the encoder.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tickwire_bench::sync::room::{Dirty, Room, Scenario, Sink, StateSize};
use tickwire_state::Codec;

fn sync_now(c: &mut Criterion) {
    let mut group = c.benchmark_group("sync_now");
    for (scenario, players) in
        [(Scenario::SyncPlayers, 30), (Scenario::SyncPlayers, 50), (Scenario::Sync, 100)]
    {
        for codec in [Codec::Binary, Codec::Json] {
            let id = BenchmarkId::new(format!("{scenario:?}/{codec:?}"), players);
            group.bench_function(id, |b| {
                let mut room = Room::new(players, StateSize::Medium, 1);
                let mut sink = Sink::default();
                // Only syncNow is timed; the tick's game logic (mutate) runs outside the clock.
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        room.mutate(scenario, Dirty::Medium);
                        let t0 = Instant::now();
                        black_box(room.sync_now(codec, &mut sink).expect("sync"));
                        total += t0.elapsed();
                    }
                    total
                });
            });
        }
    }
    group.finish();
}

criterion_group!(benches, sync_now);
criterion_main!(benches);
