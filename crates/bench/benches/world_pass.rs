//! Micro-benchmark of the spatial world's hot path in the B3 `spatial` layout (15×15 cells of
//! 20 m, 3×3 servers, a 30 m sphere of interest per client): one frame of publishes from every
//! server, and one fan-out pass after it, in which every client has a change in view. The
//! system bench runs the world on cores it shares with everything else, where its pass's CPU
//! time varies by 10–20% between runs; this is the quick, steady loop for working on the pass
//! (`tickwire_gateway::WorldHarness`). It leaves out handovers and the wake-ups of session
//! tasks. The `lod_world` group does the same in the B3 `lod` layout (20×20 cells of 10 m, one
//! server, every client seeing every cell with level-of-detail bands at 20 Hz).

use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tickwire_bench::sim::spatial_bots::interest;
use tickwire_bench::sim::spatial_server::{ENTITY_SCHEMA, Interest, LOD, SPATIAL, WorldSpec};
use tickwire_gateway::WorldHarness;
use tickwire_wire::proto::{SetInterest, set_interest};

// The allocator `tickwire` runs with: a pass allocates per client, a publish per entity.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The bench's entity value (as `spatial_server` publishes it) at a position.
fn value_json(frame: u64, at: [f32; 3]) -> String {
    format!(
        r#"{{"ts_us":{},"pos":[{},{},{}],"yaw":1.25,"blocked":false}}"#,
        1_700_000_000_000_000 + frame,
        at[0],
        at[1],
        at[2]
    )
}

/// `players` entities at random places of `spec`'s world at least 1 m inside their cell, each
/// with a client seeing what `spec` says: the report's sphere, or every cell with the `lod`
/// bands.
fn world(
    spec: &WorldSpec,
    players: usize,
    schema: &std::path::Path,
    now: Instant,
) -> (WorldHarness, HashMap<u64, [f32; 3]>) {
    let mut h = WorldHarness::new(&spec.gateway_overrides(schema), now).expect("a B3 layout");
    let mut rng = SmallRng::seed_from_u64(7);
    let mut at = HashMap::new();
    let (half, size) = (spec.half_size, spec.cell_size);
    for _ in 0..players {
        let coord = |rng: &mut SmallRng| {
            let cell = rng.random_range(0..spec.cells) as f32;
            -half + cell * size + rng.random_range(1.0..size - 1.0)
        };
        let p = [coord(&mut rng), 0.0, coord(&mut rng)];
        let id = match spec.interest {
            Interest::Sphere(radius) => h.spawn_player(p, &value_json(0, p), radius, now),
            Interest::Lod => {
                let SetInterest { area: Some(set_interest::Area::Sphere(sphere)), options, lod, .. } =
                    interest(spec, [p[0], p[2]])
                else {
                    unreachable!("the lod scenario's area is a sphere")
                };
                let options = options.unwrap_or_default();
                h.spawn_player_lod(p, &value_json(0, p), sphere.radius, options, lod, now)
            }
        };
        at.insert(id.expect("spawned"), p);
    }
    (h, at)
}

/// Which half of a frame a bench times.
#[derive(Clone, Copy, PartialEq)]
enum Timed {
    /// Every server's publish of the frame.
    Publish,
    /// The fan-out pass after it.
    Pass,
    /// The pass, with one client in [`LAG_EVERY`] reading only every [`LAG_FRAMES`] frames
    /// (staggered): longer than the window lets an update wait, so each of them is held back,
    /// then sent what changed since an older version than the clients that keep up hold (a
    /// merged delta, or the cell's snapshot: every entity moves every frame here).
    PassLagging,
}

/// One client in this many falls behind in [`Timed::PassLagging`]...
const LAG_EVERY: usize = 8;
/// ... and reads once every this many frames (320 ms at 50 Hz).
const LAG_FRAMES: usize = 16;

/// A world, its entities' spawn points, the frames run so far and the instant of frame 0.
struct Run {
    h: WorldHarness,
    at: HashMap<u64, [f32; 3]>,
    frame: u64,
    start: Instant,
}

impl Run {
    /// The next frame: every entity moved (0.2 m along x and back the next frame, never leaving
    /// its cell) and published. Returns the frame's number and the instant its pass is due.
    fn publish_next(&mut self) -> (u64, Instant) {
        self.frame += 1;
        let (frame, at) = (self.frame, &self.at);
        let ignored = self
            .h
            .publish_frame(|id| {
                let p = at[&id];
                let p = [p[0] + if frame % 2 == 1 { 0.2 } else { 0.0 }, p[1], p[2]];
                (p, value_json(frame, p))
            })
            .expect("published");
        assert_eq!(ignored, 0, "an entity left its server");
        (frame, self.start + Duration::from_millis(20 * frame))
    }
}

/// The time of the next `iters` frames' `timed` half, each frame a publish
/// ([`Run::publish_next`]), a pass, and the clients' reads.
fn frames(run: &mut Run, players: usize, timed: Timed, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let t0 = Instant::now();
        let (frame, now) = run.publish_next();
        if timed == Timed::Publish {
            total += t0.elapsed();
        }
        let h = &mut run.h;
        // The pass seals the frame, so the next one writes over a sealed version.
        let t0 = Instant::now();
        let sent = black_box(h.tick(now));
        if timed != Timed::Publish {
            total += t0.elapsed();
        }
        let lagging = timed == Timed::PassLagging;
        let reads = |i: usize| {
            !lagging
                || !i.is_multiple_of(LAG_EVERY)
                || (frame as usize + i / LAG_EVERY).is_multiple_of(LAG_FRAMES)
        };
        let (messages, _) = h.drain_clients(now, reads).expect("read");
        // Every client has a change in view each frame (a delta, or its snapshots first); one
        // that lags reads what it was sent since it last read, if anything.
        let keeping_up = players - if lagging { players.div_ceil(LAG_EVERY) } else { 0 };
        assert!(
            messages >= keeping_up as u64 && (lagging || messages == players as u64),
            "one message per client per pass: {messages} ({sent} viewers)"
        );
    }
    total
}

fn spatial_world(c: &mut Criterion) {
    let schema = tempfile::NamedTempFile::new().expect("a temp file");
    std::fs::write(schema.path(), ENTITY_SCHEMA).expect("the schema written");
    let mut group = c.benchmark_group("spatial_world");
    group.sample_size(20).measurement_time(Duration::from_secs(6));
    for players in [1000, 3000] {
        let halves =
            [("publish_frame", Timed::Publish), ("pass", Timed::Pass), ("pass_lagging", Timed::PassLagging)];
        for (name, timed) in halves {
            let mut run = None;
            group.bench_function(BenchmarkId::new(name, players), |b| {
                let run = run.get_or_insert_with(|| {
                    let start = Instant::now();
                    let (h, at) = world(&SPATIAL, players, schema.path(), start);
                    Run { h, at, frame: 0, start }
                });
                b.iter_custom(|iters| frames(run, players, timed, iters));
            });
            // A figure the machine's noise does not move, beside the times.
            if let Some(Run { h, frame, .. }) = &run {
                let encodings = h.counts().encodings as f64 / *frame as f64;
                println!(
                    "{name}/{players}: {encodings:.1} cell updates encoded per pass over {frame} passes"
                );
            }
        }
    }
    group.finish();
}

/// The time of the next `iters` passes of the `lod` world, each after a frame
/// ([`Run::publish_next`]); clients read everything. Clients are due every 50 ms, so a pass
/// serves about two in five of them.
fn lod_frames(run: &mut Run, players: usize, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    let mut messages = 0;
    for _ in 0..iters {
        let (_, now) = run.publish_next();
        let t0 = Instant::now();
        black_box(run.h.tick(now));
        total += t0.elapsed();
        messages += run.h.drain(now).expect("read").0;
    }
    // 20 Hz against 50 passes a second: at most one message per client per two passes.
    assert!(messages <= iters.div_ceil(2) * players as u64 + players as u64, "{messages}");
    total
}

fn lod_world(c: &mut Criterion) {
    let schema = tempfile::NamedTempFile::new().expect("a temp file");
    std::fs::write(schema.path(), ENTITY_SCHEMA).expect("the schema written");
    let mut group = c.benchmark_group("lod_world");
    group.sample_size(20).measurement_time(Duration::from_secs(6));
    for players in [1000, 2000] {
        let mut run = None;
        group.bench_function(BenchmarkId::new("pass", players), |b| {
            let run = run.get_or_insert_with(|| {
                let start = Instant::now();
                let (h, at) = world(&LOD, players, schema.path(), start);
                Run { h, at, frame: 0, start }
            });
            b.iter_custom(|iters| lod_frames(run, players, iters));
        });
        if let Some(Run { h, frame, .. }) = &run {
            let encodings = h.counts().encodings as f64 / *frame as f64;
            println!("lod pass/{players}: {encodings:.1} cell updates encoded per pass over {frame} passes");
        }
    }
    group.finish();
}

criterion_group!(benches, spatial_world, lod_world);
criterion_main!(benches);
