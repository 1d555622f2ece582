//! `tickwire bench replication`: workload B3, the channeld replication report, re-run on
//! tickwire. Scenario `single`: one game server owns the global channel and simulates one
//! character per client at 30 fps; clients join in steps, each subscribing at the `hifi` 50 Hz
//! fan-out, and every second the bench samples the gateway (a child process, so its CPU and
//! memory are its own), the server and the clients.

mod report;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use tickwire_client::Target;
use tokio_util::sync::CancellationToken;

use crate::hold::Hold;
use crate::machine::{Machine, ProcSample};
use crate::server::ChildGateway;
use crate::sim::bots::{BotMode, BotStats, run_bot};
use crate::sim::server::GameServer;
use crate::sim::slow_link::{Pace, SlowLink};
pub use report::{GroupFigures, ReplicationReport, Step};

fn parse_duration(s: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(s)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// One game server, one global channel, every client at 50 Hz.
    Single,
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
            let bot = run_bot(target, first + i, channel_id, BotMode::Count, stats.clone(), stop.clone());
            bots.push(runtimes[i % runtimes.len()].spawn(bot));
        }
        Ok(Some(Group { clients, stats, link }))
    }
}

/// The gateway's `/metrics`, parsed to `name{labels} value` pairs.
struct Scrape(Vec<(String, f64)>);

/// The pass-time histogram's series prefix; its buckets are cumulative, so a window is the
/// difference of two scrapes and no scrape disturbs another reader.
const TICK_BUCKET: &str = "channel_tick_duration_seconds_bucket{le=\"";

impl Scrape {
    fn fetch(addr: SocketAddr) -> anyhow::Result<Scrape> {
        let text = ureq::get(&format!("http://{addr}/metrics"))
            .timeout(Duration::from_secs(2))
            .call()
            .context("scraping the gateway's /metrics")?
            .into_string()?;
        Ok(Scrape::parse(&text))
    }

    fn parse(text: &str) -> Scrape {
        let pairs = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .filter_map(|(k, v)| Some((k.to_owned(), v.trim().parse().ok()?)))
            .collect();
        Scrape(pairs)
    }

    fn get(&self, series: &str) -> f64 {
        self.0.iter().find(|(k, _)| k == series).map_or(0.0, |(_, v)| *v)
    }

    /// (upper bound in seconds, cumulative count) of the pass-time buckets, `+Inf` last.
    fn tick_buckets(&self) -> Vec<(f64, f64)> {
        let mut out: Vec<(f64, f64)> = self
            .0
            .iter()
            .filter_map(|(k, v)| {
                let le = k.strip_prefix(TICK_BUCKET)?.strip_suffix("\"}")?;
                let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
                Some((bound, *v))
            })
            .collect();
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }
}

/// The fan-out passes between two scrapes: (bucket upper bound in seconds, cumulative count),
/// `+Inf` last. Built once per pair of scrapes; each quantile is then a lookup.
struct TickWindow(Vec<(f64, f64)>);

impl TickWindow {
    fn between(before: &Scrape, after: &Scrape) -> TickWindow {
        let b0 = before.tick_buckets();
        let counts = after
            .tick_buckets()
            .into_iter()
            .map(|(bound, n)| (bound, n - b0.iter().find(|(b, _)| *b == bound).map_or(0.0, |(_, m)| *m)))
            .collect();
        TickWindow(counts)
    }

    /// The `q` quantile, in milliseconds: the upper bound of the bucket it falls in (so "p99
    /// 2 ms" reads "99% of passes took at most 2 ms"). `q = 1.0` gives the bound of the
    /// slowest pass's bucket. 0 when there were no passes; infinite when a pass exceeded the
    /// largest finite bucket.
    fn quantile(&self, q: f64) -> f64 {
        let total = self.0.last().map_or(0.0, |(_, n)| *n);
        if total <= 0.0 {
            return 0.0;
        }
        let rank = (q * total).ceil().max(1.0);
        self.0.iter().find(|(_, n)| *n >= rank).map_or(f64::INFINITY, |(bound, _)| bound * 1e3)
    }

    /// p50, p99 and max, as the report shows them.
    fn tick(&self) -> report::Tick {
        report::Tick { p50: self.quantile(0.5), p99: self.quantile(0.99), max: self.quantile(1.0) }
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
    let gateway = ChildGateway::start(&[format!("metrics.listen=\"{metrics_addr}\"")], 1)?;
    let target = Target::Tcp(gateway.tcp);
    let runtimes = tickwire_transport::io_threads(machine.cores, "bench-bots")?;
    let stop = CancellationToken::new();
    let server = GameServer::connect(target.clone()).await?;
    let channel_id = server.channel_id;
    let server_stats = server.stats.clone();
    let server_task = runtimes[0].spawn(server.run(7, stop.clone()));
    let bot_stats = Arc::new(BotStats::default());
    let mut bots = Vec::new();
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
    report::print_header();
    let mut steps = Vec::new();
    // Ctrl-C stops the load: the steps finished so far are kept, written marked incomplete,
    // and the command fails (the child gateway stops when it is dropped below).
    let incomplete = {
        let work = async {
            for &clients in &args.clients {
                while bots.len() < clients {
                    let i = bots.len();
                    let runtime = &runtimes[i % runtimes.len()];
                    bots.push(runtime.spawn(run_bot(
                        target.clone(),
                        i,
                        channel_id,
                        BotMode::Count,
                        bot_stats.clone(),
                        stop.clone(),
                    )));
                    tokio::time::sleep(args.ramp).await;
                }
                // Let the last joiners get their snapshot before measuring.
                tokio::time::sleep(Duration::from_secs(1)).await;
                let step =
                    hold(&args, clients, metrics_addr, gateway.pid(), &bot_stats, &server_stats, &groups)
                        .await?;
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
    for bot in bots.into_iter().chain(others) {
        let _ = bot.await;
    }
    let _ = server_task.await;
    drop(gateway);

    let max_held_clients = steps.iter().filter(|s| s.held).map(|s| s.clients).max().unwrap_or(0);
    let report =
        ReplicationReport { machine, scenario: "single".into(), incomplete, max_held_clients, steps };
    println!(
        "max held: {max_held_clients} clients (every client connected, no error, gap or repeat, 50 Hz channel \
         tick, every server frame to every client)"
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

/// Counters of the bots at one instant, for differences over a step.
#[derive(Debug, Clone, Copy)]
struct BotCounts {
    errors: u64,
    decode_errors: u64,
    gaps: u64,
    repeats: u64,
}

impl BotCounts {
    fn read(bots: &BotStats) -> BotCounts {
        BotCounts {
            errors: bots.errors.load(Ordering::Relaxed),
            decode_errors: bots.decode_errors.load(Ordering::Relaxed),
            gaps: bots.version_gaps.load(Ordering::Relaxed),
            repeats: bots.version_repeats.load(Ordering::Relaxed),
        }
    }
}

/// The channel's schedule: 50 Hz ticks (the `hifi` preset the world channel uses).
const TICK_HZ: f64 = 50.0;
/// The simulated game server's frame rate.
const SERVER_FPS: f64 = 30.0;
/// The longest a fan-out pass may take: one tick.
const PASS_BUDGET_MS: f64 = 1e3 / TICK_HZ;

/// The clients outside the ramp, if any.
struct Groups<'a> {
    slow: Option<&'a Group>,
    frozen: Option<&'a Group>,
    freeze: Duration,
}

/// A group's counters at the start of a hold.
struct GroupStart {
    counts: Vec<u64>,
    errors: u64,
}

impl GroupStart {
    fn read(group: &Group) -> GroupStart {
        if let Ok(mut h) = group.stats.latency_us.lock() {
            h.reset();
        }
        GroupStart {
            counts: group.stats.updates_per_bot(),
            errors: group.stats.errors.load(Ordering::Relaxed),
        }
    }

    /// The group's figures over the `seconds` since `self` was read.
    fn figures(&self, group: &Group, seconds: f64) -> GroupFigures {
        let stats = &group.stats;
        let mut rates: Vec<f64> = stats
            .updates_per_bot()
            .iter()
            .zip(self.counts.iter().chain(std::iter::repeat(&0)))
            .map(|(n, l)| (n - l) as f64 / seconds)
            .collect();
        rates.sort_by(f64::total_cmp);
        let age = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1e3;
        let (p50, p99, max) = match stats.latency_us.lock() {
            Ok(h) => (age(&h, 0.5), age(&h, 0.99), h.max() as f64 / 1e3),
            Err(_) => (0.0, 0.0, 0.0),
        };
        GroupFigures {
            clients: group.clients,
            connected: stats.connected.load(Ordering::Relaxed) as usize,
            updates_per_s: report::Rate {
                mean: rates.iter().sum::<f64>() / rates.len().max(1) as f64,
                p5: rates.get(rates.len() / 20).copied().unwrap_or(0.0),
            },
            age_ms: report::Tick { p50, p99, max },
            errors: stats.errors.load(Ordering::Relaxed) - self.errors,
            decode_errors: stats.decode_errors.load(Ordering::Relaxed),
            version_gaps: stats.version_gaps.load(Ordering::Relaxed),
        }
    }
}

/// Holds one step for `--step-hold`, sampling every second, and sums it up.
async fn hold(
    args: &ReplicationArgs,
    clients: usize,
    metrics_addr: SocketAddr,
    gateway_pid: u32,
    bots: &BotStats,
    server: &crate::sim::server::ServerStats,
    groups: &Groups<'_>,
) -> anyhow::Result<Step> {
    let scrape = || tokio::task::spawn_blocking(move || Scrape::fetch(metrics_addr));
    let slow0 = groups.slow.map(GroupStart::read);
    let frozen0 = groups.frozen.map(GroupStart::read);
    if let Some(frozen) = groups.frozen {
        frozen.link.freeze(groups.freeze);
    }
    let first = scrape().await??;
    let first_totals = Scrape(first.0.clone());
    let counts0 = BotCounts::read(bots);
    let cpu0 = ProcSample::read(gateway_pid).context("the gateway process is gone")?;
    let frames0 = server.frames.load(Ordering::Relaxed);
    let mut last_counts = bots.updates_per_bot();
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    if let Ok(mut h) = bots.latency_us.lock() {
        h.reset();
    }
    let mut rates = Vec::new();
    let mut fewest_connected = bots.connected.load(Ordering::Relaxed);
    let started = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.tick().await;
    let mut last_at = Instant::now();
    let (mut prev, mut prev_cpu, mut prev_frames) = (first, cpu0, frames0);
    let mut samples = Vec::new();
    while started.elapsed() < args.step_hold {
        ticker.tick().await;
        let dt = last_at.elapsed().as_secs_f64();
        last_at = Instant::now();
        fewest_connected = fewest_connected.min(bots.connected.load(Ordering::Relaxed));
        let counts = bots.updates_per_bot();
        let mut second: Vec<f64> = counts
            .iter()
            .zip(last_counts.iter().chain(std::iter::repeat(&0)))
            .map(|(n, l)| (n - l) as f64 / dt)
            .collect();
        second.sort_by(f64::total_cmp);
        last_counts = counts;
        let (lat_p50, lat_p99) = match bots.latency_us.lock() {
            Ok(mut h) => {
                latency.add(&*h)?;
                let q = (h.value_at_quantile(0.5) as f64 / 1e3, h.value_at_quantile(0.99) as f64 / 1e3);
                h.reset();
                q
            }
            Err(_) => (0.0, 0.0),
        };
        let s = scrape().await??;
        let cpu = ProcSample::read(gateway_pid).context("the gateway process is gone")?;
        let frames = server.frames.load(Ordering::Relaxed);
        let rate = |name: &str| (s.get(name) - prev.get(name)) / dt;
        let sample = report::Sample {
            t_s: started.elapsed().as_secs_f64(),
            connections: s.get("connection_num") as u64,
            channels: s.get("channel_num") as u64,
            figures: report::Figures {
                channel_tick_hz: rate("channel_ticks") / s.get("channel_num").max(1.0),
                sent_hz: rate("channel_fanouts") / s.get("channel_subscribers").max(1.0),
                fanout_hz: report::Rate {
                    mean: second.iter().sum::<f64>() / second.len().max(1) as f64,
                    p5: second.get(second.len() / 20).copied().unwrap_or(0.0),
                },
                latency_ms: report::Latency { p50: lat_p50, p99: lat_p99 },
                tick_ms: TickWindow::between(&prev, &s).tick(),
                gateway_cpu_pct: cpu.cpu_pct_since(&prev_cpu),
                gateway_rss_bytes: cpu.rss_bytes,
                msgs_in_per_s: rate("messages_in"),
                msgs_out_per_s: rate("messages_out"),
                bytes_in_per_s: rate("bytes_in"),
                bytes_out_per_s: rate("bytes_out"),
                server_fps: (frames - prev_frames) as f64 / dt,
            },
        };
        rates.extend(second);
        samples.push(sample);
        (prev, prev_cpu, prev_frames) = (s, cpu, frames);
    }
    let last = scrape().await??;
    let cpu1 = ProcSample::read(gateway_pid).context("the gateway process is gone")?;
    let counts1 = BotCounts::read(bots);
    let seconds = started.elapsed().as_secs_f64();
    let server_fps = (server.frames.load(Ordering::Relaxed) - frames0) as f64 / seconds;
    rates.sort_by(f64::total_cmp);
    let fanout_mean = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
    let fanout_p5 = rates.get(rates.len() / 20).copied().unwrap_or(0.0);
    let per_s = |name: &str| (last.get(name) - first_totals.get(name)) / seconds;
    let tick_ms = TickWindow::between(&first_totals, &last).tick();
    let channel_tick_hz = per_s("channel_ticks") / last.get("channel_num").max(1.0);
    // Every server frame changes every character, so a client can get at most one update per
    // frame: the rate to hold is the server's frame rate (the 50 Hz fan-out never throttles it).
    let hold = Hold::new()
        .at_least("clients connected (fewest in any second)", fewest_connected as f64, clients as f64, "")
        .none("bot errors", counts1.errors - counts0.errors)
        .none("decode failures", counts1.decode_errors - counts0.decode_errors)
        .none("version gaps", counts1.gaps - counts0.gaps)
        .none("version repeats", counts1.repeats - counts0.repeats)
        .at_least("channel tick rate", channel_tick_hz, 0.95 * TICK_HZ, "Hz")
        .at_least("updates per client, p5", fanout_p5, 0.95 * server_fps, "/s")
        .at_most("pass time p99", tick_ms.p99, PASS_BUDGET_MS, "ms")
        .at_least("server frame rate", server_fps, 0.95 * SERVER_FPS, "fps");
    Ok(Step {
        clients,
        connected: fewest_connected as usize,
        held: hold.held(),
        hold,
        figures: report::Figures {
            channel_tick_hz,
            sent_hz: per_s("channel_fanouts") / last.get("channel_subscribers").max(1.0),
            fanout_hz: report::Rate { mean: fanout_mean, p5: fanout_p5 },
            latency_ms: report::Latency {
                p50: latency.value_at_quantile(0.5) as f64 / 1e3,
                p99: latency.value_at_quantile(0.99) as f64 / 1e3,
            },
            tick_ms,
            gateway_cpu_pct: cpu1.cpu_pct_since(&cpu0),
            gateway_rss_bytes: cpu1.rss_bytes,
            msgs_in_per_s: per_s("messages_in"),
            msgs_out_per_s: per_s("messages_out"),
            bytes_in_per_s: per_s("bytes_in"),
            bytes_out_per_s: per_s("bytes_out"),
            server_fps,
        },
        bot_errors: counts1.errors - counts0.errors,
        decode_errors: counts1.decode_errors - counts0.decode_errors,
        version_gaps: counts1.gaps - counts0.gaps,
        version_repeats: counts1.repeats - counts0.repeats,
        slow: groups.slow.zip(slow0.as_ref()).map(|(g, start)| start.figures(g, seconds)),
        frozen: groups.frozen.zip(frozen0.as_ref()).map(|(g, start)| start.figures(g, seconds)),
        gateway_connections: last.get("connection_num") as u64,
        gateway_channels: last.get("channel_num") as u64,
        samples,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(buckets: &[(&str, f64)]) -> Scrape {
        let text: String =
            buckets.iter().map(|(le, n)| format!("{TICK_BUCKET}{le}\"}} {n}\n")).collect::<String>();
        Scrape::parse(&text)
    }

    #[test]
    fn window_quantiles_come_from_bucket_differences() {
        let before = scrape(&[("0.001", 90.0), ("0.002", 95.0), ("0.02", 100.0), ("+Inf", 100.0)]);
        // 100 passes in the window: 10 under 1 ms, 89 more under 2 ms, 1 at 20 ms.
        let after = scrape(&[("0.001", 100.0), ("0.002", 184.0), ("0.02", 200.0), ("+Inf", 200.0)]);
        let window = TickWindow::between(&before, &after);
        assert_eq!(window.quantile(0.05), 1.0);
        assert_eq!(window.quantile(0.5), 2.0);
        assert_eq!(window.quantile(0.99), 20.0);
        assert_eq!(window.quantile(1.0), 20.0);
        assert_eq!(TickWindow::between(&after, &after).quantile(0.99), 0.0, "no passes");
        let slow = scrape(&[("0.001", 100.0), ("0.002", 184.0), ("0.02", 200.0), ("+Inf", 201.0)]);
        assert!(TickWindow::between(&before, &slow).quantile(1.0).is_infinite(), "past the last bucket");
    }
}
