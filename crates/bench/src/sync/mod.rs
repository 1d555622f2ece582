//! `tickwire bench sync`: workload B2, SwiftStateTree's state-sync capacity report, re-run on
//! tickwire's state engine.
//!
//! One suite is one combination of players, state size, dirty ratio, scenario, codec and threads.
//! Each thread owns its rooms and times every `syncNow`; the capacity estimate uses the report's
//! formula. `--suite report` runs the report's whole grid, each suite in a fresh process as the
//! report insists, and prints one table.

mod decode;
mod report;
pub mod room;

use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use anyhow::Context;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use tickwire_state::Codec;

use crate::machine::Machine;
pub use report::{SuiteResult, SyncReport};
use room::{Dirty, Room, Scenario, Sink, StateSize};

/// Flags of `tickwire bench sync`.
#[derive(Debug, Clone, clap::Args)]
pub struct SyncArgs {
    /// Players per room.
    #[arg(long, default_value_t = 30)]
    pub players: usize,
    /// Cards per hand: small 3, medium 10, large 30.
    #[arg(long, value_enum, default_value_t = StateSize::Medium)]
    pub state: StateSize,
    /// Share of hands changed per tick: low 5%, medium 20%, high 80%.
    #[arg(long, value_enum, default_value_t = Dirty::Medium)]
    pub dirty: Dirty,
    /// `sync`: round and hands change; `sync-players`: public player states change too.
    #[arg(long, value_enum, default_value_t = Scenario::SyncPlayers)]
    pub scenario: Scenario,
    /// How updates are encoded: `binary` (docs/protocol.md 12.2) or `json` (12.3; the report's
    /// own format is JSON).
    #[arg(long, value_enum, default_value_t = CodecArg::Binary)]
    pub codec: CodecArg,
    /// Threads syncing rooms at once (each owns its rooms).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Timed syncs per room.
    #[arg(long, default_value_t = 100)]
    pub iterations: usize,
    /// Rooms in total, dealt over the threads; each thread syncs its rooms round-robin, so
    /// with many rooms every sync starts with cold caches, as on a loaded server (default: one
    /// per thread).
    #[arg(long)]
    pub rooms: Option<usize>,
    /// Decode every player's output with that player's replica after every timed sync, and
    /// check it against the player's view (not timed). The run fails at the first mismatch.
    #[arg(long)]
    pub verify: bool,
    /// Untimed syncs per room before timing.
    #[arg(long, default_value_t = 20)]
    pub warmup: usize,
    /// Capacity estimate: other server work as a share of sync time.
    #[arg(long, default_value_t = 0.5)]
    pub overhead: f64,
    /// Capacity estimate: syncs per second.
    #[arg(long, default_value_t = 20.0)]
    pub tick_hz: f64,
    /// Capacity estimate: safety factor.
    #[arg(long, default_value_t = 1.0)]
    pub safety: f64,
    /// Run the report's whole grid instead, one process per suite.
    #[arg(long, value_enum)]
    pub suite: Option<SuiteKind>,
    /// Write the results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Instead of timing syncNow: write one player's updates (a snapshot, then `--iterations`
    /// deltas of this room) to this JSON file, and time the Rust replica decoding them
    /// (deltas per second). The TypeScript SDK's `npm run bench` decodes the same file.
    #[arg(long, value_name = "FILE")]
    pub decode_corpus: Option<PathBuf>,
    /// Print nothing (used for the per-suite child processes).
    #[arg(long, hide = true)]
    pub quiet: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SuiteKind {
    /// Every combination of the report: 10/30/50/100 players, medium state, three dirty ratios,
    /// both scenarios, both codecs, 1 and all cores.
    Report,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum CodecArg {
    Binary,
    Json,
}

impl From<CodecArg> for Codec {
    fn from(c: CodecArg) -> Codec {
        match c {
            CodecArg::Binary => Codec::Binary,
            CodecArg::Json => Codec::Json,
        }
    }
}

/// Capacity from the report: `cores * 1000 * 0.8 / (syncMs * (1 + overhead) * tickHz) * safety`.
pub fn rooms_estimate(cores: usize, sync_ms: f64, overhead: f64, tick_hz: f64, safety: f64) -> f64 {
    cores as f64 * 1000.0 * 0.8 / (sync_ms * (1.0 + overhead) * tick_hz) * safety
}

/// Runs `tickwire bench sync`.
pub fn run(args: SyncArgs) -> anyhow::Result<SyncReport> {
    let machine = Machine::detect();
    if let Some(path) = &args.decode_corpus {
        decode::run(&args, &machine, path)?;
        return Ok(SyncReport {
            machine,
            incomplete: false,
            overhead: args.overhead,
            tick_hz: args.tick_hz,
            safety: args.safety,
            suites: Vec::new(),
        });
    }
    let (suites, incomplete) = match args.suite {
        Some(SuiteKind::Report) => run_grid(&args, &machine)?,
        // One suite in this process: Ctrl-C ends it the usual way, with nothing finished.
        None => (vec![run_suite(&args, &machine)?], false),
    };
    let report = SyncReport {
        machine,
        incomplete,
        overhead: args.overhead,
        tick_hz: args.tick_hz,
        safety: args.safety,
        suites,
    };
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if !args.quiet {
        report::print(&report);
        if let Some(path) = &args.json {
            println!("wrote {}", path.display());
        }
    }
    anyhow::ensure!(!report.incomplete, "interrupted before the last suite");
    Ok(report)
}

/// One suite, in this process.
fn run_suite(args: &SyncArgs, machine: &Machine) -> anyhow::Result<SuiteResult> {
    anyhow::ensure!(
        args.players > 0 && args.threads > 0 && args.iterations > 0,
        "players, threads and iterations must be positive"
    );
    let rooms = args.rooms.unwrap_or(args.threads).max(args.threads);
    let codec = Codec::from(args.codec);
    let barrier = Arc::new(Barrier::new(args.threads));
    let handles: Vec<_> = (0..args.threads)
        .map(|t| {
            let args = args.clone();
            let barrier = barrier.clone();
            // Rooms are dealt round-robin to threads.
            let mine = (t..rooms).step_by(args.threads).count();
            std::thread::spawn(move || -> anyhow::Result<ThreadResult> {
                let mut rooms: Vec<Room> =
                    (0..mine).map(|r| Room::new(args.players, args.state, (t * 7919 + r) as u64)).collect();
                let mut sink = Sink::default();
                for _ in 0..args.warmup {
                    for room in &mut rooms {
                        room.mutate(args.scenario, args.dirty);
                        room.sync_now(codec, &mut sink)?;
                    }
                }
                if args.verify {
                    for room in &mut rooms {
                        room.start_replicas(codec)?;
                    }
                }
                let mut sink = Sink::default();
                let mut hist = Histogram::<u64>::new(3)?;
                let (mut total_ns, mut encode_ns, mut mutate_ns, mut verified) = (0u128, 0u128, 0u128, 0u64);
                barrier.wait();
                for _ in 0..args.iterations {
                    for room in &mut rooms {
                        let t0 = Instant::now();
                        room.mutate(args.scenario, args.dirty);
                        mutate_ns += t0.elapsed().as_nanos();
                        let t0 = Instant::now();
                        let encode = room.sync_now(codec, &mut sink)?;
                        let ns = t0.elapsed().as_nanos();
                        total_ns += ns;
                        encode_ns += encode.as_nanos();
                        hist.record(ns.max(1) as u64)?;
                        if args.verify {
                            room.verify(codec)?;
                            verified += room.players() as u64;
                        }
                    }
                }
                Ok(ThreadResult { hist, total_ns, encode_ns, mutate_ns, sink, verified })
            })
        })
        .collect();
    let mut hist = Histogram::<u64>::new(3)?;
    let (mut total_ns, mut encode_ns, mut mutate_ns) = (0u128, 0u128, 0u128);
    let (mut bytes, mut syncs, mut verified) = (0u64, 0u64, 0u64);
    for h in handles {
        let r = h.join().map_err(|_| anyhow::anyhow!("a sync thread panicked"))??;
        hist.add(&r.hist)?;
        total_ns += r.total_ns;
        encode_ns += r.encode_ns;
        mutate_ns += r.mutate_ns;
        bytes += r.sink.bytes;
        syncs += r.hist.len();
        verified += r.verified;
    }
    let mean_ms = total_ns as f64 / syncs as f64 / 1e6;
    let bytes_per_sync = bytes as f64 / syncs as f64;
    Ok(SuiteResult {
        players: args.players,
        state: args.state,
        dirty: args.dirty,
        scenario: args.scenario,
        codec: args.codec,
        threads: args.threads,
        rooms,
        iterations: args.iterations,
        sync_ms: report::SyncMs { mean: mean_ms, p99: hist.value_at_quantile(0.99) as f64 / 1e6 },
        encode_ms: encode_ns as f64 / syncs as f64 / 1e6,
        mutate_ms: mutate_ns as f64 / syncs as f64 / 1e6,
        verified_updates: verified,
        assemble_ns_per_player: (total_ns - encode_ns) as f64 / syncs as f64 / args.players as f64,
        bytes_per_sync,
        bytes_per_player: bytes_per_sync / args.players as f64,
        rooms_estimate: rooms_estimate(machine.cores, mean_ms, 0.5, 20.0, 1.0),
        rooms_estimate_with_writes: rooms_estimate(
            machine.cores,
            mean_ms + mutate_ns as f64 / syncs as f64 / 1e6,
            0.5,
            20.0,
            1.0,
        ),
        rooms_estimate_with_flags: rooms_estimate(
            machine.cores,
            mean_ms,
            args.overhead,
            args.tick_hz,
            args.safety,
        ),
    })
}

struct ThreadResult {
    hist: Histogram<u64>,
    total_ns: u128,
    encode_ns: u128,
    mutate_ns: u128,
    sink: Sink,
    verified: u64,
}

/// The report's grid, one child process per suite. Ctrl-C stops it (the running suite's process
/// is killed) and returns the suites finished so far, with `true` for "interrupted".
fn run_grid(args: &SyncArgs, machine: &Machine) -> anyhow::Result<(Vec<SuiteResult>, bool)> {
    let exe = std::env::current_exe().context("finding the tickwire binary")?;
    let dir = std::env::temp_dir().join(format!("tickwire-bench-sync-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let grid = report_grid(machine.cores);
    let total = grid.len();
    let bar = ProgressBar::new(total as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} suites {msg}").expect("valid template"),
    );
    let mut out = Vec::with_capacity(total);
    let work = async {
        for (i, (players, dirty, scenario, codec, threads)) in grid.into_iter().enumerate() {
            bar.set_message(format!(
                "{players} players, {dirty:?}, {scenario:?}, {codec:?}, {threads} thread(s)"
            ));
            let json = dir.join(format!("suite-{i}.json"));
            let status = tokio::process::Command::new(&exe)
                .args(["bench", "sync", "--quiet"])
                .args(["--players", &players.to_string(), "--threads", &threads.to_string()])
                .args(["--state", "medium", "--dirty", &enum_arg(&dirty), "--scenario", &enum_arg(&scenario)])
                .args(["--codec", &enum_arg(&codec), "--iterations", &args.iterations.to_string()])
                .args(["--warmup", &args.warmup.to_string()])
                .args(args.verify.then_some("--verify"))
                .args(["--overhead", &args.overhead.to_string(), "--tick-hz", &args.tick_hz.to_string()])
                .args(["--safety", &args.safety.to_string()])
                .arg("--json")
                .arg(&json)
                // Dropped on Ctrl-C: the suite in progress stops with the run.
                .kill_on_drop(true)
                .status()
                .await
                .context("starting a suite process")?;
            anyhow::ensure!(status.success(), "suite {i} failed: {status}");
            let child: SyncReport = serde_json::from_slice(&std::fs::read(&json)?)?;
            out.extend(child.suites);
            bar.inc(1);
        }
        anyhow::Ok(())
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let interrupted = runtime.block_on(crate::interrupt::until_interrupted(work))?;
    bar.finish_and_clear();
    let _ = std::fs::remove_dir_all(&dir);
    if interrupted {
        eprintln!("interrupted: {} of {total} suites finished", out.len());
    }
    Ok((out, interrupted))
}

/// The value clap accepts for an enum variant (its kebab-case name).
fn enum_arg<T: clap::ValueEnum>(v: &T) -> String {
    v.to_possible_value().expect("no skipped variants").get_name().to_owned()
}

type GridRow = (usize, Dirty, Scenario, CodecArg, usize);

fn report_grid(cores: usize) -> Vec<GridRow> {
    let mut threads = vec![1];
    if cores > 1 {
        threads.push(cores);
    }
    let mut grid = Vec::new();
    for scenario in [Scenario::Sync, Scenario::SyncPlayers] {
        for codec in [CodecArg::Binary, CodecArg::Json] {
            for dirty in [Dirty::Low, Dirty::Medium, Dirty::High] {
                for players in [10, 30, 50, 100] {
                    for &t in &threads {
                        grid.push((players, dirty, scenario, codec, t));
                    }
                }
            }
        }
    }
    grid
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_matches_the_report() {
        // The report: 12 cores, 1.3832 ms, overhead 0.5, 20 Hz -> about 231 rooms.
        assert_eq!(rooms_estimate(12, 1.3832, 0.5, 20.0, 1.0).round(), 231.0);
        assert_eq!(rooms_estimate(12, 1.6986, 0.5, 20.0, 1.0).round(), 188.0);
    }

    #[test]
    fn the_grid_covers_the_report() {
        assert_eq!(report_grid(2).len(), 2 * 2 * 3 * 4 * 2);
        assert_eq!(report_grid(1).len(), 2 * 2 * 3 * 4);
        assert_eq!(enum_arg(&Scenario::SyncPlayers), "sync-players");
    }
}
