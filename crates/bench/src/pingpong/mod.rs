//! Workload B1, the Qifun BCP ping-pong report: clients join at a fixed ramp, each sends an
//! echo request on an open-loop schedule (fixed interval or random think time), and the bench
//! measures how many sessions hold with 0 errors, 0 lost and p99 RTT within the limit.
//!
//! Every client is one task driving a [`Connection`] directly. Requests fire on schedule
//! whether or not earlier ones were answered, so slow answers show up as latency rather than
//! as a lower request rate (no coordinated omission).
//!
//! `mod.rs` holds the flags and the orchestration (ramp, hold, measure); `client.rs` the
//! simulated client; `loadgen.rs` the load-generator processes; `report.rs` the figures and how
//! they are printed; `floor.rs` the bare responder that `--server floor` loads instead of the
//! gateway.

mod client;
mod floor;
mod loadgen;
mod report;

pub use client::echo_body;
pub use floor::{FloorArgs, main as floor_main};
pub use loadgen::worker_main;
pub use report::{Report, Rtt, Step};

use loadgen::{LoadGen, WorkerSpec};
use report::{print_header, print_row};

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use tickwire_client::Target;
use tokio::runtime::Handle;

use crate::hold::Hold;
use crate::machine::{Machine, ProcSample, process_tree};
use crate::server::ChildGateway;
use tickwire_transport::raise_fd_limit;

/// Most steps one run can have.
const MAX_STEPS: usize = 64;
/// After a hold window, answers still count this long; later ones are lost.
const GRACE: Duration = Duration::from_secs(2);
/// Descriptors each process keeps for things other than client sockets.
const FD_MARGIN: usize = 1000;
/// Shortest think time of the random-think mode, as in the report.
const MIN_THINK: Duration = Duration::from_millis(10);

fn parse_duration(s: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(s)
}

/// Flags of `tickwire bench pingpong`.
#[derive(Debug, Clone, clap::Args)]
pub struct PingPongArgs {
    /// Clients to hold: one step per value, ascending (e.g. 10000,30000,50000).
    #[arg(long, value_delimiter = ',', default_value = "2000")]
    pub clients: Vec<usize>,
    /// A new client joins every RAMP (the report used 50ms).
    #[arg(long, default_value = "1ms", value_parser = parse_duration)]
    pub ramp: Duration,
    /// Time between two requests of one client.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Instead of a fixed interval, think a uniform random time between `--interval` (at least
    /// 10ms, at most this) and this: the report's "interval 1-2 s" rows are `--interval 1s
    /// --max-think 2s`.
    #[arg(long, value_parser = parse_duration)]
    pub max_think: Option<Duration>,
    /// Session heartbeat, set on the gateway and announced to clients.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub heartbeat: Duration,
    /// Size of each request body.
    #[arg(long, default_value_t = 164)]
    pub request_bytes: usize,
    /// Size of each response body.
    #[arg(long, default_value_t = 71)]
    pub response_bytes: u32,
    /// Hold window of each step.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub duration: Duration,
    /// p99 RTT a step must stay within to hold.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub max_p99: Duration,
    /// What the bench starts and loads: the gateway, or `floor`, a bare epoll responder that
    /// answers the same frames with no tasks, timers or routing (what the kernel's loopback TCP
    /// alone costs for the same exchanges; see `crates/bench/src/pingpong/floor.rs`).
    #[arg(long, value_enum, default_value = "gateway")]
    pub server: ServerKind,
    /// A running gateway (host:port) instead of a child process.
    #[arg(long)]
    pub target: Option<String>,
    /// With --target: the gateway's pid, for CPU and memory figures.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Let `--target` be an address beyond this machine (a server of your own).
    #[arg(long)]
    pub allow_remote: bool,
    /// Clients per loopback source address (127.0.0.x). Each address has about 28k ephemeral
    /// ports, but past about 14k connections from one address to one destination the kernel's
    /// port search stalls `connect()`, so the default stays well under that.
    #[arg(long, default_value_t = 10_000)]
    pub clients_per_source: usize,
    /// Load-generator threads, one single-threaded runtime each (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Load-generator processes (default: enough to stay under the open-file limit).
    #[arg(long)]
    pub procs: Option<usize>,
    /// Gateway worker processes when the bench starts the gateway, or floor responder processes
    /// (default: the same rule).
    #[arg(long)]
    pub gateway_processes: Option<u8>,
    /// Keep going after a step that does not hold.
    #[arg(long)]
    pub keep_going: bool,
    /// Run the report's grid of rows instead (each shortened by --duration).
    #[arg(long, value_enum)]
    pub grid: Option<Grid>,
    /// Write the results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write SVG plots into this directory.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerKind {
    /// `tickwire gateway --processes N`.
    Gateway,
    /// The bare responder: the floor under the gateway's figures.
    Floor,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Grid {
    /// The rows of the BCP report.
    Report,
}

/// One row of a run: a fixed send pattern, ramped through the client counts.
#[derive(Debug, Clone)]
struct Row {
    name: String,
    interval: Duration,
    max_think: Option<Duration>,
    heartbeat: Duration,
    request_bytes: usize,
    response_bytes: u32,
}

impl Row {
    /// The think times drawn from with a random one up to `max`: from the interval (at least
    /// 10 ms, at most `max`) to `max` (at least 10 ms).
    fn think_range(&self, max: Duration) -> std::ops::RangeInclusive<Duration> {
        let most = max.max(MIN_THINK);
        self.interval.max(MIN_THINK).min(most)..=most
    }

    /// The send pattern a worker process was given (name and heartbeat are the orchestrator's).
    fn from_spec(spec: &WorkerSpec) -> Row {
        Row {
            name: String::new(),
            interval: Duration::from_micros(spec.interval_us),
            max_think: spec.max_think_us.map(Duration::from_micros),
            heartbeat: Duration::ZERO,
            request_bytes: spec.request_bytes,
            response_bytes: spec.response_bytes,
        }
    }
}

/// Runs `tickwire bench pingpong`.
pub async fn run(args: PingPongArgs) -> anyhow::Result<Report> {
    anyhow::ensure!(!args.clients.is_empty(), "--clients needs at least one value");
    anyhow::ensure!(args.clients.len() <= MAX_STEPS, "at most {MAX_STEPS} steps");
    anyhow::ensure!(args.clients.windows(2).all(|w| w[0] < w[1]), "--clients must be ascending");
    let plan = Plan::new(&args);
    let machine = Machine::detect();
    println!("machine: {}", machine.line());
    if args.target.is_none() && args.server == ServerKind::Floor {
        println!("server: floor, a bare epoll responder (no tasks, timers or routing), not the gateway");
    }
    let rows = match args.grid {
        None => vec![Row {
            name: "your flags".into(),
            interval: args.interval,
            max_think: args.max_think,
            heartbeat: args.heartbeat,
            request_bytes: args.request_bytes,
            response_bytes: args.response_bytes,
        }],
        Some(Grid::Report) => report_grid(),
    };
    if plan.loadgen_procs > 1 || plan.gateway_processes > 1 {
        println!(
            "open-file limit {}: {} load-generator and {} gateway processes",
            plan.fd_limit, plan.loadgen_procs, plan.gateway_processes
        );
    }
    let threads = args.threads.unwrap_or(machine.cores);
    let runtimes = tickwire_transport::io_threads(threads, "bench-io")?;
    let mut steps = Vec::new();
    // Ctrl-C stops the load (dropping the run stops the child processes), keeps the steps
    // finished so far, writes them marked incomplete, and fails.
    let incomplete = {
        let work = async {
            for row in &rows {
                run_row(&args, &plan, row, &runtimes, &mut steps).await?;
            }
            anyhow::Ok(())
        };
        crate::interrupt::until_interrupted(work).await?
    };
    if incomplete {
        println!("\ninterrupted: {} step(s) finished", steps.len());
    }
    let max_held_clients = steps.iter().filter(|s| s.held).map(|s| s.clients).max().unwrap_or(0);
    let server = match (&args.target, args.server) {
        (Some(_), _) => "target",
        (None, ServerKind::Gateway) => "gateway",
        (None, ServerKind::Floor) => "floor",
    };
    let report = Report { bench: "pingpong", server, machine, incomplete, max_held_clients, steps };
    println!("max held clients: {max_held_clients} ({})", report.machine.line());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    if let Some(dir) = &args.plot {
        crate::plot::pingpong(dir, &report)?;
        println!("wrote plots to {}", dir.display());
    }
    anyhow::ensure!(!report.incomplete, "interrupted before the last step");
    Ok(report)
}

/// The report's rows: send interval at heartbeat 3s, heartbeat at interval 1–2s, two sizes.
fn report_grid() -> Vec<Row> {
    let ms = Duration::from_millis;
    let mut rows = Vec::new();
    for (req, resp) in [(164, 71), (356, 151)] {
        for interval in [500, 1000, 2000, 3000] {
            rows.push(Row {
                name: format!("interval {interval}ms hb 3s {req}/{resp}B"),
                interval: ms(interval),
                max_think: None,
                heartbeat: ms(3000),
                request_bytes: req,
                response_bytes: resp,
            });
        }
        for hb in [500, 1000, 1500, 6000] {
            rows.push(Row {
                name: format!("interval 1-2s hb {hb}ms {req}/{resp}B"),
                interval: ms(1000),
                max_think: Some(ms(2000)),
                heartbeat: ms(hb),
                request_bytes: req,
                response_bytes: resp,
            });
        }
    }
    rows
}

/// How many processes the run needs, decided once from the open-file limit.
struct Plan {
    fd_limit: usize,
    loadgen_procs: usize,
    gateway_processes: u8,
}

impl Plan {
    fn new(args: &PingPongArgs) -> Plan {
        let fd_limit = raise_fd_limit() as usize;
        // Each process keeps a margin of descriptors for everything that is not a client socket.
        let per_process = fd_limit.saturating_sub(FD_MARGIN).max(1);
        let largest = args.clients.last().copied().unwrap_or(0);
        let needed = largest.div_ceil(per_process).max(1);
        let plan = Plan {
            fd_limit,
            loadgen_procs: args.procs.unwrap_or(needed),
            gateway_processes: args.gateway_processes.unwrap_or(needed.min(64) as u8),
        };
        if plan.loadgen_procs < needed
            || (args.target.is_none() && usize::from(plan.gateway_processes) < needed)
        {
            println!(
                "warning: {largest} clients need {needed} processes on each side at an open-file limit of \
                 {fd_limit}; --procs/--gateway-processes ask for fewer"
            );
        }
        plan
    }
}

async fn run_row(
    args: &PingPongArgs,
    plan: &Plan,
    row: &Row,
    runtimes: &[Handle],
    steps: &mut Vec<Step>,
) -> anyhow::Result<()> {
    let every = match row.max_think {
        Some(max) => {
            let range = row.think_range(max);
            format!("{}-{}", range.start().as_millis(), range.end().as_millis())
        }
        None => row.interval.as_millis().to_string(),
    };
    println!(
        "\n== {}: a request every {every} ms, {} B out, {} B back, heartbeat {} ms ==",
        row.name,
        row.request_bytes,
        row.response_bytes,
        row.heartbeat.as_millis()
    );
    let overrides = vec![
        format!("session.heartbeat=\"{}ms\"", row.heartbeat.as_millis()),
        // The bench's own load is the subject; the per-connection limit must not shape it.
        "limits.messages_per_second=100000".to_owned(),
        "limits.message_burst=100000".to_owned(),
    ];
    let (child, addr, pid) = match &args.target {
        Some(t) => {
            let Target::Tcp(addr) = Target::parse(t).await? else {
                anyhow::bail!("--target must be a TCP address")
            };
            crate::loopback::require_loopback(&addr.ip().to_string(), addr.port(), args.allow_remote).await?;
            (None, addr, args.server_pid)
        }
        None => {
            let (child, addr) = match args.server {
                ServerKind::Gateway => ChildGateway::start(&overrides, plan.gateway_processes)?.into_parts(),
                ServerKind::Floor => floor::start(plan.gateway_processes, row.heartbeat)?,
            };
            let pid = child.pid();
            (Some(child), addr, Some(pid))
        }
    };
    let spec = WorkerSpec {
        addr,
        interval_us: row.interval.as_micros() as u64,
        max_think_us: row.max_think.map(|d| d.as_micros() as u64),
        request_bytes: row.request_bytes,
        response_bytes: row.response_bytes,
        ramp_us: args.ramp.as_micros() as u64,
        clients_per_source: args.clients_per_source,
        threads: runtimes.len(),
        index: 0,
        workers: 1,
    };
    let mut loadgen = LoadGen::start(spec, plan.loadgen_procs, runtimes).await?;
    print_header();
    // A step's errors count from the end of the previous one: its ramp and settling included,
    // when the gateway takes the new clients on and drops are most likely.
    let mut errors_before = loadgen.counters(0).await?.errors;
    for (k, &clients) in args.clients.iter().enumerate() {
        let bar = ProgressBar::new_spinner().with_message(format!("ramping to {clients} clients"));
        bar.enable_steady_tick(Duration::from_millis(200));
        // A ramp takes `--ramp` per client, then up to a minute for the last connects.
        let ramp_limit = args.ramp.saturating_mul(clients as u32) + Duration::from_secs(120);
        loadgen.ramp_to(clients, ramp_limit).await?;
        bar.finish_and_clear();
        // Let every new client reach its steady schedule before measuring.
        tokio::time::sleep(row.max_think.unwrap_or(row.interval).min(Duration::from_secs(3))).await;
        let (step, errors_after) = hold(args, row, &mut loadgen, k, clients, pid, errors_before).await?;
        errors_before = errors_after;
        print_row(&step);
        let held = step.held;
        steps.push(step);
        if !held && !args.keep_going {
            break;
        }
    }
    loadgen.stop().await;
    drop(child);
    Ok(())
}

/// CPU seconds and RSS summed over several processes.
fn sample_all(pids: &[u32]) -> Option<ProcSample> {
    let samples: Vec<ProcSample> = pids.iter().filter_map(|&p| ProcSample::read(p)).collect();
    let first = samples.first()?;
    Some(ProcSample {
        at: first.at,
        cpu_seconds: samples.iter().map(|s| s.cpu_seconds).sum(),
        rss_bytes: samples.iter().map(|s| s.rss_bytes).sum(),
    })
}

async fn hold(
    args: &PingPongArgs,
    row: &Row,
    loadgen: &mut LoadGen,
    k: usize,
    clients: usize,
    pid: Option<u32>,
    errors_before: u64,
) -> anyhow::Result<(Step, u64)> {
    let server = |pid: Option<u32>| pid.and_then(|p| sample_all(&process_tree(p)));
    let before = loadgen.counters(k).await?;
    let cpu0 = server(pid);
    let own0 = sample_all(&loadgen.pids());
    let start = Instant::now();
    loadgen.set_holding(Some(k)).await?;
    let bar = ProgressBar::new(args.duration.as_secs()).with_message(format!("holding {clients} clients"));
    bar.set_style(ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len}s").expect("template"));
    let end = start + args.duration;
    while Instant::now() < end {
        tokio::time::sleep((end - Instant::now()).min(Duration::from_secs(1))).await;
        bar.set_position(start.elapsed().as_secs());
    }
    loadgen.set_holding(None).await?;
    let elapsed = start.elapsed().as_secs_f64();
    let cpu1 = server(pid);
    let own1 = sample_all(&loadgen.pids());
    let mid = loadgen.counters(k).await?;
    bar.finish_and_clear();
    tokio::time::sleep(GRACE).await;
    let after = loadgen.counters(k).await?;
    let hist = after.histogram();
    let ms = |us: u64| us as f64 / 1000.0;
    let rtt = Rtt {
        p50: ms(hist.value_at_quantile(0.5)),
        p99: ms(hist.value_at_quantile(0.99)),
        max: ms(hist.max()),
    };
    let service = after.service_histogram();
    let from_write = Rtt {
        p50: ms(service.value_at_quantile(0.5)),
        p99: ms(service.value_at_quantile(0.99)),
        max: ms(service.max()),
    };
    let errors = after.errors - errors_before;
    let lost = after.sent.saturating_sub(after.answered);
    let duplicated = after.duplicated - before.duplicated;
    let bad_answers = after.bad_answers - before.bad_answers;
    let connected = after.connected as usize;
    let hold = Hold::new()
        .at_least("clients connected", connected as f64, clients as f64, "")
        .none("errors", errors)
        .none("error or wrong-size answers", bad_answers)
        .none("lost", lost)
        .none("duplicated", duplicated)
        .at_least("requests sent", after.sent as f64, 1.0, "")
        .at_most("RTT p99 from the due time", rtt.p99, args.max_p99.as_secs_f64() * 1000.0, "ms");
    let step = Step {
        row: row.name.clone(),
        clients,
        connected,
        interval_ms: row.max_think.is_none().then_some(row.interval.as_millis() as u64),
        max_think_ms: row.max_think.map(|d| d.as_millis() as u64),
        heartbeat_ms: row.heartbeat.as_millis() as u64,
        request_bytes: row.request_bytes,
        response_bytes: row.response_bytes,
        hold_s: elapsed,
        held: hold.held(),
        hold,
        requests: after.answered,
        rps: after.answered as f64 / elapsed,
        rtt_ms: rtt,
        rtt_from_write_ms: from_write,
        errors,
        bad_answers,
        lost,
        duplicated,
        server_cpu_pct: cpu0.zip(cpu1).map(|(a, b)| b.cpu_pct_since(&a)),
        server_rss_bytes: cpu1.map(|s| s.rss_bytes),
        server_kib_per_client: cpu1.map(|s| s.rss_bytes as f64 / 1024.0 / clients.max(1) as f64),
        loadgen_cpu_pct: own0.zip(own1).map(|(a, b)| b.cpu_pct_since(&a)),
        bytes_in_per_s: (mid.bytes_to_server - before.bytes_to_server) as f64 / elapsed,
        bytes_out_per_s: (mid.bytes_from_server - before.bytes_from_server) as f64 / elapsed,
    };
    Ok((step, after.errors))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use tickwire_wire::proto::EchoRequest;

    #[test]
    fn echo_body_has_the_exact_size() {
        for size in [0, 1, 2, 3, 10, 71, 127, 128, 129, 131, 164, 356, 20_000] {
            let body = echo_body(size, 71);
            assert!(body.len() <= size.max(2), "size {size}: got {}", body.len());
            if size >= 5 {
                assert_eq!(body.len(), size, "size {size}");
            }
            assert_eq!(EchoRequest::decode(body).unwrap().response_bytes, 71);
        }
        // 132 would need 128 bytes of padding with a 1-byte length prefix: one byte short.
        assert_eq!(echo_body(132, 71).len(), 131);
    }

    #[test]
    fn the_report_grid_has_sixteen_rows() {
        let rows = report_grid();
        assert_eq!(rows.len(), 16);
        assert!(rows.iter().any(|r| r.heartbeat == Duration::from_millis(500) && r.max_think.is_some()));
        // The heartbeat rows send every 1-2 s, as BENCHMARKS.md's grid says.
        for r in rows.iter().filter(|r| r.max_think.is_some()) {
            assert_eq!(r.think_range(r.max_think.unwrap()), ms(1000)..=ms(2000), "{}", r.name);
        }
    }

    #[test]
    fn a_random_think_time_starts_at_the_interval_within_bounds() {
        let row = |interval: u64| Row {
            name: String::new(),
            interval: ms(interval),
            max_think: None,
            heartbeat: ms(3000),
            request_bytes: 0,
            response_bytes: 0,
        };
        assert_eq!(row(1000).think_range(ms(2000)), ms(1000)..=ms(2000));
        assert_eq!(row(0).think_range(ms(2000)), MIN_THINK..=ms(2000));
        assert_eq!(row(3000).think_range(ms(2000)), ms(2000)..=ms(2000), "never above the most");
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }
}
