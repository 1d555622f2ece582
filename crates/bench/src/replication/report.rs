//! The figures of a replication run: a terminal table, JSON, and PNG charts.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use crate::hold::Hold;
use crate::machine::Machine;

#[derive(Debug, Clone, Serialize)]
pub struct Rate {
    pub mean: f64,
    pub p5: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Tick {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// Microseconds in milliseconds.
fn us_to_ms(us: u64) -> f64 {
    us as f64 / 1e3
}

impl Latency {
    /// The p50 and p99 of a histogram of microseconds, in milliseconds.
    pub fn of_us(h: &hdrhistogram::Histogram<u64>) -> Latency {
        let (p50, p99) = crate::sim::ages::p50_p99_ms(h);
        Latency { p50, p99 }
    }
}

impl Tick {
    /// The p50, p99 and max of a histogram of microseconds, in milliseconds.
    pub fn of_us(h: &hdrhistogram::Histogram<u64>) -> Tick {
        let Latency { p50, p99 } = Latency::of_us(h);
        Tick { p50, p99, max: us_to_ms(h.max()) }
    }
}

/// The figures of a second, or of a whole step (its JSON fields sit inline in both).
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    /// Channel ticks per second, per channel (the world channel's 50 Hz schedule;
    /// `channel_ticks`).
    pub channel_tick_hz: f64,
    /// State updates the gateway queued per subscriber per second (`channel_fanouts` over
    /// `channel_subscribers`).
    pub sent_hz: f64,
    /// State updates each client received per second: the mean, and the 5th percentile over
    /// clients (in a second of the hold: of each client's count in that second; for a step: of
    /// each client's rate over the whole hold, which the hold rule reads).
    pub fanout_hz: Rate,
    /// Update age from server publish to client receipt.
    pub latency_ms: Latency,
    /// Fan-out pass time (tick and after-patch passes), from the gateway's cumulative
    /// histogram: each quantile is the upper bound of its bucket.
    pub tick_ms: Tick,
    pub gateway_cpu_pct: f64,
    pub gateway_rss_bytes: u64,
    pub msgs_in_per_s: f64,
    pub msgs_out_per_s: f64,
    pub bytes_in_per_s: f64,
    pub bytes_out_per_s: f64,
    pub server_fps: f64,
}

/// One second of a hold.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since the hold started.
    pub t_s: f64,
    pub connections: u64,
    pub channels: u64,
    #[serde(flatten)]
    pub figures: Figures,
}

/// One ramp step, summed up over its hold.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub clients: usize,
    /// The fewest clients connected in any second of the hold.
    pub connected: usize,
    pub held: bool,
    /// Each condition of the hold rule: measured, required, held.
    pub hold: Hold,
    #[serde(flatten)]
    pub figures: Figures,
    /// CPU of the load (the bench process with the game servers, plus its bot worker
    /// processes) over the hold, in % of one core; the gateway's is `gateway_cpu_pct`.
    pub bench_cpu_pct: f64,
    /// Processes the ramp's bots ran in (`--bot-processes`; 1: the bench process).
    pub bot_processes: usize,
    /// Nice levels the bench's bots ran below the gateway and the game servers (as applied:
    /// `--load-nice`, less near 19).
    pub load_nice: i32,
    /// How late the bots' threads ran over the hold, in ms: a probe due every 10 ms on each,
    /// every due tick counted. Tens of ms at p99 mean the load was short of CPU, and a failed
    /// rate rule may be the load's rather than the gateway's.
    pub load_lag_ms: Tick,
    /// Bot errors (a failed join, or a bot that stopped with an error) in this step's ramp
    /// and hold: from the end of the previous step's hold.
    pub bot_errors: u64,
    /// Updates a client could not read (0 unless something is broken), same span: a header or
    /// timestamp that did not parse, or (the replica sample, since 2026-11-29) an update its
    /// replica refused, counted once per replica dropped.
    pub decode_errors: u64,
    /// Deltas that skipped versions, or repeated versions, that a client had; same span.
    pub version_gaps: u64,
    pub version_repeats: u64,
    /// The slow clients (`--slow-clients`), apart from the ramp's.
    pub slow: Option<GroupFigures>,
    /// The frozen clients (`--frozen-clients`), apart from the ramp's.
    pub frozen: Option<GroupFigures>,
    /// Entity updates a client received per second over the hold: the mean over the replica
    /// bots (`replica_bots` of them, one bot in `sim::bots::REPLICA_EVERY`), which apply the
    /// updates they get to replicas. Each entity an update carries counts once, and a snapshot
    /// counts each of its entities (`Replica::entries_applied`). `single`: the characters of the
    /// world channel; `spatial`: the entities of the cells in view. What channeld's report
    /// gives as the reason its spatial scenario's messages fall under a tenth of `single`'s (a
    /// client no longer receives every other client's data updates); in `spatial` it is about
    /// what the layout alone predicts (docs/benchmarks.md). `None` with no replica bot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entity_updates_per_client_per_s: Option<f64>,
    /// Replica bots in `entity_updates_per_client_per_s`: those that had joined by the end of
    /// the hold. A refusal counts one decode failure, which fails the step; then in `single`
    /// the bot drops its replica and leaves the figure, and in `spatial` the cell's replica is
    /// dropped until the cell's next snapshot. A bot that joined during the hold counts from
    /// its first snapshot, over the whole hold.
    pub replica_bots: usize,
    /// Spatial scenarios: the longest a cell in a client's view waited for an update after one
    /// that carried a character, counting updates that merged several changes of the cell (the
    /// gateway had changes it did not send: level of detail, or a window that held updates
    /// back; a character that stood still and then moved is not counted), over every client
    /// and the hold, in ms, between arrivals. `lod` holds only if it is at most its longest
    /// band's interval and 500 ms. A cell that never gets another update is not counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub longest_cell_wait_ms: Option<f64>,
    /// Scenario `spatial`: handovers completed per second (`spatial_handovers`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handovers_per_s: Option<f64>,
    /// Due updates held back, per client per second (scenario `single`: those of the channel,
    /// `channel_updates_coalesced`; `spatial` and `lod`: the world's, as follows): a viewer
    /// had a change in view at its due pass and nothing was queued, because its window of
    /// updates in flight was full (or a resume's rewind was pending) or its outbox was full
    /// (`spatial_updates_coalesced` over the hold, divided by the clients; the game servers
    /// are viewers too, and theirs count). Each merges into that viewer's next update, so it is
    /// one message fewer: a client reading or acknowledging late shows here, a frame that came
    /// too late for a pass does not. `None` if the gateway did not report the counter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_back_per_client_per_s: Option<f64>,
    /// Scenario `spatial`: `held_back_per_client_per_s` split by what held each update back
    /// (the `reason` label of `spatial_updates_held_back`): a bound of the viewer's window
    /// (`overdue`: its oldest update in flight waited past the base flight time, the
    /// acknowledgement delay and the target; `bytes`: the bytes in flight reached the window;
    /// `messages`: the cap on updates in flight; `large`: a large update waits for the window
    /// to drain; `probe`: the window drains to measure its base flight time again), or
    /// `queue`: the session refused it (outbox full, too large to join what is in flight, a
    /// rewind pending). Reasons with none over the hold are left out.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub held_back_by_reason: BTreeMap<String, f64>,
    /// Scenario `spatial`: the slowest fan-out pass of the world over the hold, in ms (the
    /// upper bound of its histogram bucket; `tick_ms.max`, repeated under the name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tick_ms: Option<f64>,
    /// Scenario `spatial`: the world thread's CPU time per tick pass over the hold, in ms
    /// (bucket bounds): the pass's own work, without the time it waited for a core, which
    /// `tick_ms` includes. `None` when the gateway recorded no pass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass_cpu_ms: Option<Tick>,
    /// The same passes' mean CPU time in ms (from the histogram's sum and count, exact).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass_cpu_mean_ms: Option<f64>,
    /// Scenario `spatial`: cell updates the same passes encoded, on average
    /// (`spatial_cell_encodings` over the passes): one per cell, version sent from and codec
    /// that some due viewer needed, failed ones included. About one per changed cell while every
    /// viewer keeps up, plus a snapshot per cell a viewer entered; a viewer behind needs a
    /// delta from an older version, encoded apart, or gets the cell's snapshot, encoded once
    /// for all of them (`spatial_catch_up_snapshots`; a snapshot may also be encoded only to
    /// learn its size). `None` if the gateway did not report it, or no pass was recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cell_encodings_per_pass: Option<f64>,
    /// Scenario `spatial`: an I/O thread's CPU time per delivery run to the viewers of its
    /// sessions, in ms (bucket bounds): the rest of a pass's work, done on the I/O threads. A run
    /// delivers every pass waiting on its thread: one, unless the thread got to it a tick or
    /// more late (`deliveries_late_per_s`). `None` when none was recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery_cpu_ms: Option<Tick>,
    /// The same deliveries' mean CPU time in ms (exact).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery_cpu_mean_ms: Option<f64>,
    /// Scenario `spatial`: passes per second that a delivery found waiting behind another
    /// when it ran, its I/O thread a tick or more late (`spatial_delivery_passes_waited` over the
    /// hold). Each is still delivered, in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliveries_late_per_s: Option<f64>,
    /// Scenario `spatial`: passes a delivery dropped over the hold, having 8 waiting
    /// (`spatial_delivery_passes_dropped`); their changes reached its viewers merged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passes_dropped: Option<u64>,
    /// Game-server frames of the hold that were simulated but not published, because the
    /// gateway refused them as busy (`spatial`) or three earlier ones were unanswered (the
    /// servers' frame rate counts only frames the gateway took).
    pub frames_not_published: u64,
    /// Scenario `spatial`: publishes per server per second beyond the first between two of the
    /// world's passes (`spatial_frames_merged` over the hold, divided by the servers): frames
    /// that went out in one pass with the frame before them, so a viewer of that server's cells
    /// got one message for both. `None` if the gateway did not report the counter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frames_merged_per_server_per_s: Option<f64>,
    /// Each game server's frames per second over the hold (frames the gateway took), in the
    /// order they started (`spatial`: by slot); the table's `server fps` is the slowest.
    pub server_fps_each: Vec<f64>,
    /// The 5th percentile of updates received over client-seconds (each client's count in each
    /// second of the hold). Reported, not ruled on: a second's count of a 30 Hz stream moves by
    /// one when a delivery lands either side of the second's boundary.
    pub fanout_hz_p5_of_seconds: f64,
    /// Scenario `spatial`: releases the world refused as busy and the servers sent again.
    pub release_retries: u64,
    /// Connections (clients and the game server) and channels, from the gateway's metrics.
    pub gateway_connections: u64,
    pub gateway_channels: u64,
    /// The time series: one sample per second of the hold.
    pub samples: Vec<Sample>,
}

/// Slow or frozen clients over one hold.
#[derive(Debug, Clone, Serialize)]
pub struct GroupFigures {
    pub clients: usize,
    /// Connected and subscribed at the end of the hold.
    pub connected: usize,
    /// Updates each received per second over the hold (mean, and the slowest 5%).
    pub updates_per_s: Rate,
    /// Age of the updates they received, from server publish to client receipt.
    pub age_ms: Tick,
    /// Clients that stopped with an error during the hold (a closed session counts).
    pub errors: u64,
    /// Since the start of the run: updates they could not read, and deltas that skipped a
    /// version.
    pub decode_errors: u64,
    pub version_gaps: u64,
}

/// The JSON's `format`. It changes when a key keeps its name but changes its meaning:
/// - 1: a step's `fanout_hz.p5` is the 5th percentile over client-seconds. Files of format 1
///   have neither a `format` key nor `fanout_hz_p5_of_seconds` in their steps.
/// - 2: a step's `fanout_hz.p5` is the 5th percentile of each client's rate over the whole
///   hold, and the old figure is `fanout_hz_p5_of_seconds`. Files written between that change
///   (ced0d0e) and the `format` key (7a2234c) have the meaning without the key: a step with
///   `fanout_hz_p5_of_seconds` reads as format 2.
pub const REPORT_FORMAT: u32 = 2;

#[derive(Debug, Clone, Serialize)]
pub struct ReplicationReport {
    /// [`REPORT_FORMAT`].
    pub format: u32,
    pub machine: Machine,
    pub scenario: String,
    /// Stopped (Ctrl-C) before every step ran.
    pub incomplete: bool,
    pub max_held_clients: usize,
    pub steps: Vec<Step>,
}

pub(super) fn print_header() {
    println!(
        "| clients | held | channel tick Hz | updates sent / received per client per s (mean / p5 over the hold / p5 of client-seconds) | age p50 / p99 ms | pass p50 / p99 / max ms (bucket bound) | gateway CPU % | load CPU % (bench + bot workers) | RSS MiB | msgs in / out per s | MB/s out | server fps | errors / decode / gaps / repeats |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
}

pub(super) fn print_row(step: &Step) {
    let s = &step.figures;
    println!(
        "| {} | {} | {:.1} | {:.1} / {:.1} / {:.2} / {:.1} | {:.2} / {:.2} | {} / {} / {} | {:.1} | {:.1} | {:.0} | {:.0} / {:.0} | {:.2} | {:.1} | {} / {} / {} / {} |",
        step.clients,
        if step.held { "yes" } else { "no" },
        s.channel_tick_hz,
        s.sent_hz,
        s.fanout_hz.mean,
        s.fanout_hz.p5,
        step.fanout_hz_p5_of_seconds,
        s.latency_ms.p50,
        s.latency_ms.p99,
        ms(s.tick_ms.p50),
        ms(s.tick_ms.p99),
        ms(s.tick_ms.max),
        s.gateway_cpu_pct,
        step.bench_cpu_pct,
        s.gateway_rss_bytes as f64 / (1024.0 * 1024.0),
        s.msgs_in_per_s,
        s.msgs_out_per_s,
        s.bytes_out_per_s / 1e6,
        s.server_fps,
        step.bot_errors,
        step.decode_errors,
        step.version_gaps,
        step.version_repeats,
    );
    if let Some(h) = step.handovers_per_s {
        println!(
            "  spatial: {h:.1} handovers/s, max pass {} ms (bucket bound), {:.1} messages out per client per s, {:.2} held back (full window or outbox) per client per s",
            ms(s.tick_ms.max),
            s.msgs_out_per_s / step.clients.max(1) as f64,
            step.held_back_per_client_per_s.unwrap_or(0.0),
        );
        if let Some(wait) = step.longest_cell_wait_ms {
            println!("  longest wait of a cell for an update that merged its changes: {wait:.0} ms");
        }
        if !step.held_back_by_reason.is_empty() {
            let by: Vec<String> =
                step.held_back_by_reason.iter().map(|(r, n)| format!("{r} {n:.2}")).collect();
            println!("  held back by: {} (per client per s)", by.join(", "));
        }
    }
    if let Some(entities) = step.entity_updates_per_client_per_s {
        println!(
            "  replica sample: {} bots kept a replica; {entities:.0} entity updates received per client per s, in {:.1} messages out per client per s",
            step.replica_bots,
            s.msgs_out_per_s / step.clients.max(1) as f64,
        );
    }
    match (step.pass_cpu_ms, step.pass_cpu_mean_ms) {
        (Some(cpu), Some(mean)) => println!(
            "  world pass CPU time: mean {mean:.2} ms, p50 / p99 / max {} / {} / {} ms (bucket bounds); the pass's work without waiting for a core{}",
            ms(cpu.p50),
            ms(cpu.p99),
            ms(cpu.max),
            step.cell_encodings_per_pass
                .map(|e| format!("; {e:.1} cell updates encoded per pass"))
                .unwrap_or_default(),
        ),
        _ if step.handovers_per_s.is_some() => println!("  world pass CPU time: no passes recorded"),
        _ => {}
    }
    if let (Some(cpu), Some(mean)) = (step.delivery_cpu_ms, step.delivery_cpu_mean_ms) {
        println!(
            "  delivery CPU time per I/O thread per run: mean {mean:.2} ms, p50 / p99 / max {} / {} / {} ms (bucket bounds); the rest of the pass, on the I/O threads; {:.2} passes a second delivered a tick or more late, {} dropped",
            ms(cpu.p50),
            ms(cpu.p99),
            ms(cpu.max),
            step.deliveries_late_per_s.unwrap_or(0.0),
            step.passes_dropped.unwrap_or(0),
        );
    }
    let merged = step
        .frames_merged_per_server_per_s
        .map(|m| format!(", {m:.2} frames merged per server per s (two of a server in one pass)"))
        .unwrap_or_default();
    let each: Vec<String> = step.server_fps_each.iter().map(|fps| format!("{fps:.1}")).collect();
    println!(
        "  servers: {} fps each, {} frames not published{merged}, {} releases retried; bot threads late by p50 / p99 / max {:.1} / {:.1} / {:.1} ms (a probe due every 10 ms)",
        each.join(" "),
        step.frames_not_published,
        step.release_retries,
        step.load_lag_ms.p50,
        step.load_lag_ms.p99,
        step.load_lag_ms.max,
    );
    if !step.held {
        println!("  not held: {}", step.hold.failures());
        if step.load_lag_ms.p99 > LOAD_LAG_NOTE_MS {
            println!(
                "  the bots' threads ran {:.0} ms late at p99: the load was short of CPU, so a failed client-rate rule (p5, p1, fewest) may be the load's; the tick, pass and frame rules are the gateway's own",
                step.load_lag_ms.p99
            );
        }
    }
    for (name, group) in [("slow", &step.slow), ("frozen", &step.frozen)] {
        if let Some(g) = group {
            println!(
                "  {name} clients: {} ({} connected), updates/s mean {:.1} p5 {:.1}, age p50 / p99 / max {:.0} / {:.0} / {:.0} ms, errors {}, decode errors {}, gaps {}",
                g.clients,
                g.connected,
                g.updates_per_s.mean,
                g.updates_per_s.p5,
                g.age_ms.p50,
                g.age_ms.p99,
                g.age_ms.max,
                g.errors,
                g.decode_errors,
                g.version_gaps,
            );
        }
    }
}

/// Bot-thread lateness at p99 past which a failed step says the load may be the limit: one
/// world tick (the `hifi` preset's 20 ms), after which a bot reads a pass's update late. A
/// hint, not a rule: held steps have come close to it (27 ms at p99 in a held 2,000 step).
const LOAD_LAG_NOTE_MS: f64 = 20.0;

/// A bucket bound in milliseconds; `>250` past the last finite bucket.
fn ms(v: f64) -> String {
    if v.is_infinite() { ">250".into() } else { format!("{v}") }
}

/// Writes one chart per curve the issue asks for, against clients.
pub(super) fn plot(dir: &Path, report: &ReplicationReport) -> anyhow::Result<()> {
    let series = |f: fn(&Step) -> f64| -> Vec<(f64, f64)> {
        report.steps.iter().map(|s| (s.clients as f64, f(s))).collect()
    };
    let machine = report.machine.line();
    for (file, title, points) in [
        ("replication-cpu.png", "gateway CPU (% of one core)", series(|s| s.figures.gateway_cpu_pct)),
        ("replication-tick-rate.png", "channel tick rate (Hz)", series(|s| s.figures.channel_tick_hz)),
        (
            "replication-updates.png",
            "updates per client per second over the hold, p5",
            series(|s| s.figures.fanout_hz.p5),
        ),
        ("replication-tick.png", "channel pass p99 (ms)", series(|s| s.figures.tick_ms.p99)),
        ("replication-bytes.png", "bytes out per second (MB/s)", series(|s| s.figures.bytes_out_per_s / 1e6)),
    ] {
        crate::plot::line_chart(dir, file, title, &points, &machine)?;
    }
    Ok(())
}
