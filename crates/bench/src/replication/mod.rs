//! `tickwire bench replication`: workload B3, the channeld replication report, re-run on
//! tickwire. Scenario `single`: one game server owns the global channel and simulates one
//! character per client at 30 fps; clients join in steps, each subscribing at the `hifi` 50 Hz
//! fan-out, and every second the bench samples the gateway (a child process, so its CPU and
//! memory are its own), the server and the clients.

mod fleet;
mod report;
mod rule;
mod scrape;
mod step;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use tickwire_client::Target;
use tokio_util::sync::CancellationToken;

use crate::machine::Machine;
use crate::server::ChildGateway;
use crate::sim::bots::{BotMode, BotStats, run_resuming_bot};
use crate::sim::game::Game;
pub use crate::sim::game::Scenario;
use crate::sim::slow_link::{Pace, SlowLink};
use crate::sim::spatial_server;
use fleet::Fleet;
pub use fleet::{WorkerSpec, worker_main};
pub use report::{GroupFigures, ReplicationReport, Step};
use step::{BotCounts, Groups, hold};

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
