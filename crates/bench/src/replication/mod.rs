//! `tickwire bench replication`: workload B3, the channeld replication report, re-run on
//! tickwire. Scenario `single`: one game server owns the global channel and simulates one
//! character per client at 30 fps; clients join in steps, each subscribing at the `hifi` 50 Hz
//! fan-out, and every second the bench samples the gateway (a child process, so its CPU and
//! memory are its own), the server and the clients.

mod fleet;
mod report;
mod rule;
mod scrape;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use tickwire_client::Target;
use tokio_util::sync::CancellationToken;

use crate::machine::{Machine, ProcSample};
use crate::server::ChildGateway;
use crate::sim::bots::{BotMode, BotStats, rates_between, run_resuming_bot};
use crate::sim::game::Game;
pub use crate::sim::game::Scenario;
use crate::sim::server::ServerStats;
use crate::sim::slow_link::{Pace, SlowLink};
use crate::sim::spatial_server;
use fleet::{BotSample, Fleet, LoadCpu};
pub use fleet::{WorkerSpec, worker_main};
pub use report::{GroupFigures, ReplicationReport, Step};
use scrape::{Scrape, TickWindow};

fn parse_duration(s: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(s)
}

/// Flags of `tickwire bench replication`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplicationArgs {
    #[arg(long, value_enum, default_value_t = Scenario::Single)]
    pub scenario: Scenario,
    /// Clients at each step, ascending.
    #[arg(long, value_delimiter = ',', default_value = "50,100,150,200")]
    pub clients: Vec<usize>,
    /// A new client joins every RAMP.
    #[arg(long, default_value = "20ms", value_parser = parse_duration)]
    pub ramp: Duration,
    /// How long each step is held and sampled (once per second).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub step_hold: Duration,
    /// Keep ramping after a step that does not hold.
    #[arg(long)]
    pub keep_going: bool,
    /// Write the results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write PNG charts into this directory.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Besides the ramp, this many clients whose link carries the gateway's bytes at only
    /// `--slow-read` bytes per second (their client reads and acknowledges what arrives at
    /// once). They are reported apart and left out of the hold rule.
    #[arg(long, default_value_t = 0)]
    pub slow_clients: usize,
    /// The slow clients' link speed, in bytes per second.
    #[arg(long, default_value_t = 4096.0)]
    pub slow_read: f64,
    /// Besides the ramp, this many clients whose link carries nothing from the gateway for
    /// `--freeze` at the start of each step's hold (their sessions drop and resume), then runs
    /// at full speed. Reported apart, left out of the hold rule.
    #[arg(long, default_value_t = 0)]
    pub frozen_clients: usize,
    /// How long the frozen clients' link stops at the start of each hold.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub freeze: Duration,
    /// A setting for the gateway under test, as its `--set` takes it (repeatable; applied
    /// after the scenario's own), e.g. `--gateway-set channels.entity.tick='"5ms"'`.
    #[arg(long = "gateway-set", value_name = "KEY=VALUE")]
    pub gateway_set: Vec<String>,
    /// Run the ramp's bots in this many worker processes (bot i in worker i mod N) instead of
    /// the bench process; the game servers, and slow and frozen clients, stay in the bench.
    #[arg(long, default_value_t = 1)]
    pub bot_processes: usize,
    /// Nice levels the threads that run bots (in the bench and in its workers) are raised
    /// above the bench's own, which the gateway and the game servers keep (at most to 19):
    /// the load takes the cores the gateway leaves. 0 shares the cores evenly.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(i32).range(0..=19))]
    pub load_nice: i32,
}

/// Clients outside the ramp: slow or frozen ones, with their own figures.
struct Group {
    clients: usize,
    stats: Arc<BotStats>,
    link: SlowLink,
}

impl Group {
    /// Starts `clients` bots behind a [`SlowLink`] of `pace`; their indices start at `first`.
    #[allow(clippy::too_many_arguments)]
    async fn start(
        clients: usize,
        pace: Pace,
        first: usize,
        gateway: SocketAddr,
        channel_id: u64,
        runtimes: &[tokio::runtime::Handle],
        stop: &CancellationToken,
        bots: &mut Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
    ) -> anyhow::Result<Option<Group>> {
        if clients == 0 {
            return Ok(None);
        }
        let link = SlowLink::start(gateway, pace, stop.clone()).await?;
        let stats = Arc::new(BotStats::default());
        for i in 0..clients {
            let target = Target::Tcp(link.addr);
            let bot =
                run_resuming_bot(target, first + i, channel_id, BotMode::Count, stats.clone(), stop.clone());
            bots.push(runtimes[i % runtimes.len()].spawn(bot));
        }
        Ok(Some(Group { clients, stats, link }))
    }
}

/// Runs `tickwire bench replication`.
pub async fn run(args: ReplicationArgs) -> anyhow::Result<ReplicationReport> {
    let machine = Machine::detect();
    let metrics_addr = {
        // A free port for the child's metrics endpoint.
        let probe = TcpListener::bind("127.0.0.1:0")?;
        probe.local_addr()?
    };
    anyhow::ensure!(
        args.scenario == Scenario::Single || (args.slow_clients == 0 && args.frozen_clients == 0),
        "--slow-clients and --frozen-clients run with --scenario single only"
    );
    let mut overrides = vec![format!("metrics.listen=\"{metrics_addr}\"")];
    // The spatial world's entity schema, in a file the child gateway reads.
    let schema_file = tempfile::NamedTempFile::new()?;
    if let Some(world) = args.scenario.world() {
        std::fs::write(schema_file.path(), spatial_server::ENTITY_SCHEMA)?;
        overrides.extend(world.gateway_overrides(schema_file.path()));
    }
    overrides.extend(args.gateway_set.iter().cloned());
    let gateway = ChildGateway::start(&overrides, 1)?;
    let target = Target::Tcp(gateway.tcp);
    let runtimes = tickwire_transport::io_threads(machine.cores, "bench-bots")?;
    // The levels applied here (fewer near 19); workers apply `--load-nice` to their own.
    let load_nice =
        crate::priority::lower(&runtimes, args.load_nice).await.context("lowering the bots' priority")?;
    // The game servers get a thread of their own, as they would have a machine of their own:
    // a frame does not wait in a run queue behind a thousand bots' tasks.
    let server_runtime = tickwire_transport::io_threads(1, "bench-servers")?;
    let stop = CancellationToken::new();
    let (game, server_stats, server_tasks) =
        Game::start(args.scenario, &target, &server_runtime, &stop).await?;
    let channel_id = match game {
        Game::Single { channel_id } => channel_id,
        Game::Spatial(_) => 0,
    };
    let spec = WorkerSpec {
        gateway: gateway.tcp,
        scenario: args.scenario,
        channel_id,
        threads: (machine.cores / args.bot_processes.max(1)).max(1),
        nice: args.load_nice,
    };
    let mut fleet = Fleet::start(args.bot_processes, spec, &game, &runtimes, load_nice, &stop)?;
    // Slow and frozen clients join first and stay for every step. Their indices come after any
    // ramp's, so their characters are their own.
    let first = 1_000_000;
    let slow = Pace::BytesPerSecond(args.slow_read);
    let (gw, rt) = (gateway.tcp, &runtimes);
    let mut others = Vec::new();
    let slow = Group::start(args.slow_clients, slow, first, gw, channel_id, rt, &stop, &mut others).await?;
    let frozen_first = first + args.slow_clients;
    let frozen = Group::start(
        args.frozen_clients,
        Pace::Freezable,
        frozen_first,
        gw,
        channel_id,
        rt,
        &stop,
        &mut others,
    )
    .await?;
    let groups = Groups { slow: slow.as_ref(), frozen: frozen.as_ref(), freeze: args.freeze };

    println!("machine: {}", machine.line());
    println!(
        "load: bots in {} process(es), {} nice level(s) below the gateway and the game servers (--load-nice)",
        args.bot_processes.max(1),
        load_nice,
    );
    report::print_header();
    let mut steps = Vec::new();
    // Ctrl-C stops the load: the steps finished so far are kept, written marked incomplete,
    // and the command fails (the child gateway stops when it is dropped below).
    let incomplete = {
        let work = async {
            // Bot errors, decode failures, gaps and repeats count in the step whose ramp or
            // hold they happen in: from the end of the previous hold (from the start, for the
            // first step), so a bot that fails while joining fails the step.
            let mut counted = BotCounts::default();
            for &clients in &args.clients {
                // Progress on stderr, only at a terminal (indicatif hides itself otherwise).
                let bar =
                    ProgressBar::new(clients as u64).with_message(format!("ramping to {clients} clients"));
                bar.set_style(
                    ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len}").expect("template"),
                );
                bar.set_position(fleet.len() as u64);
                while fleet.len() < clients {
                    fleet.add(&game, &target, &stop).await?;
                    bar.set_position(fleet.len() as u64);
                    tokio::time::sleep(args.ramp).await;
                }
                bar.finish_and_clear();
                // Let the last joiners get their snapshot before measuring.
                tokio::time::sleep(Duration::from_secs(1)).await;
                let (step, counts) = hold(
                    &args,
                    clients,
                    metrics_addr,
                    gateway.pid(),
                    &mut fleet,
                    &server_stats,
                    &groups,
                    counted,
                )
                .await?;
                counted = counts;
                report::print_row(&step);
                let held = step.held;
                steps.push(step);
                if !held && !args.keep_going {
                    break;
                }
            }
            anyhow::Ok(())
        };
        crate::interrupt::until_interrupted(work).await?
    };
    if incomplete {
        println!("\ninterrupted: {} step(s) finished", steps.len());
    }
    stop.cancel();
    // Bots and servers stop at their next await. A bot's session still waiting half a second
    // later (on an overloaded gateway, or a call or close over a frozen link) is dropped (a
    // slow or frozen client's `Client` driver task may run on until the process ends); a
    // server task stuck behind an unanswered call is abandoned after a grace period. So the
    // run always ends.
    let bots = fleet.stop().await;
    let tasks: Vec<_> = bots.into_iter().chain(others).chain(server_tasks).collect();
    let aborts: Vec<_> = tasks.iter().map(|t| t.abort_handle()).collect();
    let grace = Duration::from_secs(10);
    let all = async {
        for task in tasks {
            let _ = task.await;
        }
    };
    if tokio::time::timeout(grace, all).await.is_err() {
        let stuck = aborts.iter().filter(|a| !a.is_finished()).count();
        eprintln!("{stuck} bot or server task(s) had not stopped {grace:?} after the run; abandoned");
        aborts.iter().for_each(tokio::task::AbortHandle::abort);
    }
    drop(gateway);

    let max_held_clients = steps.iter().filter(|s| s.held).map(|s| s.clients).max().unwrap_or(0);
    let report = ReplicationReport {
        format: report::REPORT_FORMAT,
        machine,
        scenario: args.scenario.name().into(),
        incomplete,
        max_held_clients,
        steps,
    };
    println!(
        "max held: {max_held_clients} clients (every client connected, no error, gap or repeat, 50 Hz channel \
         tick, every server frame to every client, every server at 30 fps)"
    );
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    if let Some(dir) = &args.plot {
        report::plot(dir, &report)?;
    }
    anyhow::ensure!(!report.incomplete, "interrupted before the last step");
    Ok(report)
}

/// The world's count of due updates it did not queue (window or outbox full, or a rewind
/// pending): `held_back_per_client_per_s`.
const HELD_BACK: &str = "spatial_updates_coalesced";

/// The same, by the `reason` label: `held_back_by_reason`.
const HELD_BACK_BY: &str = "spatial_updates_held_back{reason=\"";

/// The world's count of server frames that went out in one pass with the frame before them:
/// `frames_merged_per_server_per_s`.
const FRAMES_MERGED: &str = "spatial_frames_merged";
/// Passes a delivery found waiting behind another (its I/O thread a tick or more late), and
/// passes it dropped: `deliveries_late_per_s`, `passes_dropped`.
const PASSES_WAITED: &str = "spatial_delivery_passes_waited";
const PASSES_DROPPED: &str = "spatial_delivery_passes_dropped";

/// The world's counter of cell updates encoded (one per cell, version sent from and codec, per
/// pass): `cell_encodings_per_pass`.
const ENCODINGS: &str = "spatial_cell_encodings";

/// The 5th percentile (the value with 5% of them below it), 0 for none. Sorts `values`.
fn p5(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 20).copied().unwrap_or(0.0)
}

/// The mean of `values`, 0 for none (not the -0.0 an empty float sum starts from).
fn mean(values: &[f64]) -> f64 {
    if values.is_empty() { 0.0 } else { values.iter().sum::<f64>() / values.len() as f64 }
}

/// Counters of the bots at one instant, for differences over a step.
#[derive(Debug, Clone, Copy, Default)]
struct BotCounts {
    errors: u64,
    decode_errors: u64,
    gaps: u64,
    repeats: u64,
}

impl BotCounts {
    fn of(sample: &BotSample) -> BotCounts {
        BotCounts {
            errors: sample.errors,
            decode_errors: sample.decode_errors,
            gaps: sample.gaps,
            repeats: sample.repeats,
        }
    }
}

/// The clients outside the ramp, if any.
struct Groups<'a> {
    slow: Option<&'a Group>,
    frozen: Option<&'a Group>,
    freeze: Duration,
}

/// A group's counters at the start of a hold.
struct GroupStart {
    counts: Vec<(usize, u64)>,
    errors: u64,
}

impl GroupStart {
    fn read(group: &Group) -> GroupStart {
        group.stats.latency_us.take();
        GroupStart {
            counts: group.stats.updates_per_bot(),
            errors: group.stats.errors.load(Ordering::Relaxed),
        }
    }

    /// The group's figures over the `seconds` since `self` was read.
    fn figures(&self, group: &Group, seconds: f64) -> GroupFigures {
        let stats = &group.stats;
        let mut rates = rates_between(&self.counts, &stats.updates_per_bot(), seconds);
        let rates_p5 = p5(&mut rates);
        GroupFigures {
            clients: group.clients,
            connected: stats.connected.load(Ordering::Relaxed) as usize,
            updates_per_s: report::Rate { mean: mean(&rates), p5: rates_p5 },
            age_ms: report::Tick::of_us(&stats.latency_us.merged()),
            errors: stats.errors.load(Ordering::Relaxed) - self.errors,
            decode_errors: stats.decode_errors.load(Ordering::Relaxed),
            version_gaps: stats.version_gaps.load(Ordering::Relaxed),
        }
    }
}

/// Holds one step for `--step-hold`, sampling every second, and sums it up. The bots' error
/// counts are taken since `counted` (where the previous step's ended, so this step's ramp
/// counts); the step's own end is returned with it.
#[allow(clippy::too_many_arguments)]
async fn hold(
    args: &ReplicationArgs,
    clients: usize,
    metrics_addr: SocketAddr,
    gateway_pid: u32,
    fleet: &mut Fleet,
    servers: &[Arc<ServerStats>],
    groups: &Groups<'_>,
    counted: BotCounts,
) -> anyhow::Result<(Step, BotCounts)> {
    let frames = || -> Vec<u64> { servers.iter().map(|s| s.frames.load(Ordering::Relaxed)).collect() };
    let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
    let unpublished = || -> u64 { servers.iter().map(|s| load(&s.refused) + load(&s.unanswered)).sum() };
    let release_retries = || -> u64 { servers.iter().map(|s| load(&s.release_retries)).sum() };
    // Each server's frame rate between two readings, and the slowest.
    let each = |now: &[u64], before: &[u64], dt: f64| -> Vec<f64> {
        now.iter().zip(before).map(|(n, b)| (n - b) as f64 / dt).collect()
    };
    let slowest = |now: &[u64], before: &[u64], dt: f64| -> f64 {
        each(now, before, dt).into_iter().fold(f64::INFINITY, f64::min)
    };
    let (fanouts, subscribers) = args.scenario.fanout_series();
    // Played in the spatial world (`spatial`, `lod`): its figures are reported.
    let spatial = args.scenario.world().is_some();
    let scrape = || tokio::task::spawn_blocking(move || Scrape::fetch(metrics_addr));
    let slow0 = groups.slow.map(GroupStart::read);
    let frozen0 = groups.frozen.map(GroupStart::read);
    if let Some(frozen) = groups.frozen {
        frozen.link.freeze(groups.freeze);
    }
    let first = scrape().await??;
    let first_totals = first.clone();
    // Update ages recorded before the hold are dropped with this first sample.
    let sample0 = fleet.sample().await?;
    let counting_from = Instant::now();
    let counts0 = counted;
    let cpu0 = ProcSample::read(gateway_pid).context("the gateway process is gone")?;
    let load0 = LoadCpu::read(fleet);
    let frames0 = frames();
    let (unpublished0, release_retries0) = (unpublished(), release_retries());
    let hold_counts0 = sample0.updates_per_bot.clone();
    let hold_entities0 = sample0.entities_per_replica_bot.clone();
    let mut last_counts = sample0.updates_per_bot;
    let mut latency = crate::sim::ages::histogram();
    let mut load_lag = crate::sim::ages::histogram();
    let mut rates = Vec::new();
    let mut fewest_connected = sample0.connected;
    // The longest a cell waited for an update that merged its changes, over the hold (the
    // first sample took what the ramp recorded).
    let mut longest_cell_wait_us = 0;
    let started = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    // A late second is followed by a full one, not by a burst of short ones.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    // When the bots' counters were last read: each second's rates are over the time between
    // two readings, not between two ticks (a reading waits on the bot workers' pipes).
    let mut last_at = counting_from;
    let (mut prev, mut prev_cpu, mut prev_frames) = (first, cpu0, frames0.clone());
    let mut samples = Vec::new();
    let bar = ProgressBar::new(args.step_hold.as_secs()).with_message(format!("holding {clients} clients"));
    bar.set_style(ProgressStyle::with_template("{msg} [{bar:20}] {pos}/{len}s").expect("template"));
    while started.elapsed() < args.step_hold {
        ticker.tick().await;
        let sample = fleet.sample().await?;
        let dt = last_at.elapsed().as_secs_f64();
        last_at = Instant::now();
        fewest_connected = fewest_connected.min(sample.connected);
        longest_cell_wait_us = longest_cell_wait_us.max(sample.longest_cell_wait_us);
        let mut second = rates_between(&last_counts, &sample.updates_per_bot, dt);
        let second_p5 = p5(&mut second);
        let mut ages = crate::sim::ages::histogram();
        sample.record_ages(&mut ages)?;
        latency.add(&ages)?;
        sample.record_load_lag(&mut load_lag)?;
        let second_latency = report::Latency::of_us(&ages);
        last_counts = sample.updates_per_bot;
        let s = scrape().await??;
        let cpu = ProcSample::read(gateway_pid).context("the gateway process is gone")?;
        let frames = frames();
        let rate = |name: &str| (s.get(name) - prev.get(name)) / dt;
        let sample = report::Sample {
            t_s: started.elapsed().as_secs_f64(),
            connections: s.get("connection_num") as u64,
            channels: s.get("channel_num") as u64,
            figures: report::Figures {
                channel_tick_hz: rate("channel_ticks") / s.get("channel_num").max(1.0),
                sent_hz: rate(fanouts) / s.get(subscribers).max(1.0),
                fanout_hz: report::Rate { mean: mean(&second), p5: second_p5 },
                latency_ms: second_latency,
                tick_ms: TickWindow::between(&prev, &s).tick(),
                gateway_cpu_pct: cpu.cpu_pct_since(&prev_cpu),
                gateway_rss_bytes: cpu.rss_bytes,
                msgs_in_per_s: rate("messages_in"),
                msgs_out_per_s: rate("messages_out"),
                bytes_in_per_s: rate("bytes_in"),
                bytes_out_per_s: rate("bytes_out"),
                server_fps: slowest(&frames, &prev_frames, dt),
            },
        };
        bar.set_position(started.elapsed().as_secs());
        bar.set_message(format!(
            "holding {clients} clients: {:.1} updates/s per client (p5 {:.1}), age p99 {:.0} ms, gateway {:.0}% of a core",
            sample.figures.fanout_hz.mean,
            sample.figures.fanout_hz.p5,
            sample.figures.latency_ms.p99,
            sample.figures.gateway_cpu_pct
        ));
        rates.extend(second);
        samples.push(sample);
        (prev, prev_cpu, prev_frames) = (s, cpu, frames);
    }
    bar.finish_and_clear();
    let last = scrape().await??;
    let cpu1 = ProcSample::read(gateway_pid).context("the gateway process is gone")?;
    let load1 = LoadCpu::read(fleet);
    let sample1 = fleet.sample().await?;
    let counted_for = counting_from.elapsed().as_secs_f64();
    sample1.record_ages(&mut latency)?;
    sample1.record_load_lag(&mut load_lag)?;
    let counts1 = BotCounts::of(&sample1);
    longest_cell_wait_us = longest_cell_wait_us.max(sample1.longest_cell_wait_us);
    let longest_cell_wait_ms = longest_cell_wait_us as f64 / 1e3;
    let seconds = started.elapsed().as_secs_f64();
    let frames1 = frames();
    let server_fps = slowest(&frames1, &frames0, seconds);
    let server_fps_each = each(&frames1, &frames0, seconds);
    let fanout_mean = mean(&rates);
    let p5_of_seconds = p5(&mut rates);
    // `rates` is sorted now. A client that gets nothing for half a second keeps its rate over
    // the hold, but not its count in that second: this catches stalls the rule's figure hides.
    let p1_of_seconds = rates.get(rates.len() / 100).copied().unwrap_or(0.0);
    // The rule's figure: each client's rate over the whole hold. A count in one second moves
    // by one either way when a delivery lands a few milliseconds either side of the second's
    // boundary, and that alone is 3% of 30 Hz; over the hold it is a third of a percent.
    let mut hold_rates = rates_between(&hold_counts0, &sample1.updates_per_bot, counted_for);
    let fanout_p5 = p5(&mut hold_rates);
    let entity_rates = rates_between(&hold_entities0, &sample1.entities_per_replica_bot, counted_for);
    // Sorted by `p5`: the client that got the fewest. The p5 and p1 rules let a few clients
    // get nothing at all; this one does not.
    let fewest_rate = hold_rates.first().copied().unwrap_or(0.0);
    let per_s = |name: &str| (last.get(name) - first_totals.get(name)) / seconds;
    let tick_window = TickWindow::between(&first_totals, &last);
    let tick_ms = tick_window.tick();
    // A CPU-time histogram of the spatial world over the hold, with its exact mean in ms (from
    // the series' sum and count; `None`: nothing recorded, or not the spatial scenario).
    let cpu_window = |bucket: &str, sum: &str| {
        spatial
            .then(|| TickWindow::of(bucket, &first_totals, &last))
            .filter(|window| window.passes() > 0.0)
            .map(|window| {
                let mean_ms = (last.get(sum) - first_totals.get(sum)) / window.passes() * 1e3;
                (window, mean_ms)
            })
    };
    // The world's CPU time per pass, and the cell updates a pass encoded on average.
    let pass_cpu =
        cpu_window(scrape::PASS_CPU_BUCKET, "spatial_pass_cpu_seconds_sum").map(|(window, mean_ms)| {
            let encodings = last
                .has(ENCODINGS)
                .then(|| (last.get(ENCODINGS) - first_totals.get(ENCODINGS)) / window.passes());
            (window, mean_ms, encodings)
        });
    // The I/O threads' CPU time per delivery run (each run delivers the passes waiting on its
    // thread: one, unless the thread was a tick late; `None` for a gateway with no deliveries).
    let delivery_cpu = cpu_window(scrape::DELIVERY_CPU_BUCKET, "spatial_delivery_cpu_seconds_sum")
        .map(|(window, mean_ms)| (window.tick(), mean_ms));
    let passes_dropped = (last.get(PASSES_DROPPED) - first_totals.get(PASSES_DROPPED)).max(0.0) as u64;
    let channel_tick_hz = per_s("channel_ticks") / last.get("channel_num").max(1.0);
    // Every server frame changes every character, so a client can get at most one update per
    // frame: the rate to hold is the server's frame rate (the 50 Hz fan-out never throttles it;
    // `lod`'s clients ask for 20 Hz, which does, and hold that).
    // That rate counts the frames the gateway took, so a frame it refused (or left unanswered)
    // fails the step on its own: it must not lower the p5 target.
    let frames_not_published = unpublished() - unpublished0;
    // Updates merged into a later one because a viewer's window or outbox was full: not a
    // loss (the later update carries the newest state) but one message fewer, which the rate
    // rules below count; reported, not a rule of its own.
    let coalesced = if spatial { HELD_BACK } else { "channel_updates_coalesced" };
    let hold = rule::step_hold(
        &rule::Measured {
            clients,
            fewest_connected,
            bot_errors: counts1.errors - counts0.errors,
            decode_errors: counts1.decode_errors - counts0.decode_errors,
            version_gaps: counts1.gaps - counts0.gaps,
            version_repeats: counts1.repeats - counts0.repeats,
            frames_not_published,
            channel_tick_hz,
            fanout_p5,
            fewest_rate,
            p1_of_seconds,
            passes_timed: tick_window.passes(),
            pass_p99_ms: tick_ms.p99,
            server_fps,
            passes_dropped: spatial.then_some(passes_dropped),
            longest_cell_wait_ms,
        },
        args.scenario,
    );
    let step = Step {
        clients,
        connected: fewest_connected as usize,
        held: hold.held(),
        hold,
        figures: report::Figures {
            channel_tick_hz,
            sent_hz: per_s(fanouts) / last.get(subscribers).max(1.0),
            fanout_hz: report::Rate { mean: fanout_mean, p5: fanout_p5 },
            latency_ms: report::Latency::of_us(&latency),
            tick_ms,
            gateway_cpu_pct: cpu1.cpu_pct_since(&cpu0),
            gateway_rss_bytes: cpu1.rss_bytes,
            msgs_in_per_s: per_s("messages_in"),
            msgs_out_per_s: per_s("messages_out"),
            bytes_in_per_s: per_s("bytes_in"),
            bytes_out_per_s: per_s("bytes_out"),
            server_fps,
        },
        bench_cpu_pct: load1.pct_since(&load0),
        bot_processes: args.bot_processes.max(1),
        load_nice: sample1.load_nice.unwrap_or(0),
        load_lag_ms: report::Tick::of_us(&load_lag),
        bot_errors: counts1.errors - counts0.errors,
        decode_errors: counts1.decode_errors - counts0.decode_errors,
        version_gaps: counts1.gaps - counts0.gaps,
        version_repeats: counts1.repeats - counts0.repeats,
        slow: groups.slow.zip(slow0.as_ref()).map(|(g, start)| start.figures(g, seconds)),
        frozen: groups.frozen.zip(frozen0.as_ref()).map(|(g, start)| start.figures(g, seconds)),
        entity_updates_per_client_per_s: (!entity_rates.is_empty()).then(|| mean(&entity_rates)),
        replica_bots: entity_rates.len(),
        handovers_per_s: spatial.then(|| per_s("spatial_handovers")),
        longest_cell_wait_ms: spatial.then_some(longest_cell_wait_ms),
        held_back_per_client_per_s: last.has(coalesced).then(|| per_s(coalesced) / clients.max(1) as f64),
        held_back_by_reason: last
            .series(HELD_BACK_BY)
            .filter_map(|(series, _)| {
                let reason = series.strip_prefix(HELD_BACK_BY)?.strip_suffix("\"}")?;
                let n = per_s(series) / clients.max(1) as f64;
                (n > 0.0).then(|| (reason.to_owned(), n))
            })
            .collect(),
        max_tick_ms: spatial.then_some(tick_ms.max),
        pass_cpu_ms: pass_cpu.as_ref().map(|(window, ..)| window.tick()),
        pass_cpu_mean_ms: pass_cpu.as_ref().map(|(_, mean, _)| *mean),
        cell_encodings_per_pass: pass_cpu.as_ref().and_then(|(.., encodings)| *encodings),
        delivery_cpu_ms: delivery_cpu.map(|(tick, _)| tick),
        deliveries_late_per_s: (spatial && last.has(PASSES_WAITED)).then(|| per_s(PASSES_WAITED)),
        passes_dropped: (spatial && last.has(PASSES_DROPPED)).then_some(passes_dropped),
        delivery_cpu_mean_ms: delivery_cpu.map(|(_, mean)| mean),
        frames_not_published,
        server_fps_each,
        frames_merged_per_server_per_s: (spatial && last.has(FRAMES_MERGED))
            .then(|| per_s(FRAMES_MERGED) / f64::from(args.scenario.world().map_or(1, |w| w.slots()))),
        fanout_hz_p5_of_seconds: p5_of_seconds,
        release_retries: release_retries() - release_retries0,
        gateway_connections: last.get("connection_num") as u64,
        gateway_channels: last.get("channel_num") as u64,
        samples,
    };
    Ok((step, counts1))
}

#[cfg(test)]
mod tests {
    use super::{mean, p5, rates_between};

    #[test]
    fn a_clients_rate_is_its_count_over_the_whole_window() {
        // Three bots over 10 s; bot 7 joined after the first reading, and the second reading
        // lists the bots in another order (two processes joined the other way round).
        let rates = rates_between(&[(3, 100), (5, 50)], &[(7, 290), (5, 340), (3, 400)], 10.0);
        assert_eq!(rates, vec![29.0, 29.0, 30.0]);
        // Twenty bots: 5% of them (one) may be below the p5; the second lowest is the p5.
        let mut twenty: Vec<f64> = (0..20).map(|i| 30.0 - f64::from(i)).collect();
        assert_eq!(p5(&mut twenty), 12.0);
        assert_eq!(p5(&mut []), 0.0);
    }

    #[test]
    fn the_mean_of_nothing_is_a_plain_zero() {
        // An empty `f64` sum is -0.0, which the JSON printed as "-0.0".
        assert!(mean(&[]).is_sign_positive());
        assert_eq!(mean(&[1.0, 2.0, 6.0]), 3.0);
    }
}
