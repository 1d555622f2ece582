//! `tickwire demo`: a gateway, the simulated game server and bots in one process, with a live
//! one-line-per-second summary. It shows the whole path at work: inputs by RPC to the owning
//! server, the server's patches into the channel, and 50 Hz deltas out to every client.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use tickwire_client::Target;
use tickwire_gateway::{ChannelRouter, Gateway, GatewayConfig};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use super::bots::{BotMode, BotStats, run_bot};
use super::server::GameServer;

#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub bots: usize,
    /// Stop after this long (default: run until Ctrl-C).
    pub duration: Option<Duration>,
    pub config: GatewayConfig,
    /// Print the live summary lines.
    pub print: bool,
}

/// The last second's figures.
#[derive(Debug, Clone, Copy, Default)]
pub struct Second {
    pub clients: u64,
    /// The world channel's tick rate at the gateway (its 50 Hz schedule).
    pub channel_tick_hz: f64,
    /// State updates the gateway queued per subscriber per second.
    pub sent_hz: f64,
    /// State updates each bot received per second: the mean, and the 5th percentile over bots.
    pub fanout_hz_mean: f64,
    pub fanout_hz_p5: f64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub bytes_per_s: f64,
    pub server_fps: f64,
    pub characters: u64,
    /// The fewest state updates any bot has received since the start.
    pub min_updates: u64,
    /// Updates a bot's replica could not apply, since the start (always 0 unless a bug).
    pub decode_errors: u64,
}

/// Runs the demo on `runtimes` (the gateway's I/O threads; the server and bots share them).
pub async fn run(opts: DemoOptions, runtimes: &[Handle]) -> anyhow::Result<Vec<Second>> {
    // Our own handle on the channel router, to read the gateway's fan-out rate.
    let router = Arc::new(ChannelRouter::for_gateway(&opts.config)?);
    let gateway = Gateway::new(opts.config.clone())?
        .with_router(router.clone())
        .start_on(runtimes)
        .context("starting the gateway")?;
    let addr = *gateway.tcp_addrs().first().context("the demo needs a TCP listener")?;
    if opts.print {
        println!("gateway on tcp://{addr}; a game server and {} bots are joining (Ctrl-C stops)", opts.bots);
        println!(
            "each line: clients connected; the world channel's tick rate (its 50 Hz schedule); state \
             updates the gateway sent and each client received per second (one per server frame: the \
             world changes 30 times a second); their age from server publish to client receipt; bytes \
             to clients; the game server's frame rate"
        );
        if let Some(m) = gateway.metrics_addr() {
            println!("metrics at http://{m}/metrics");
        }
    }
    let stop = CancellationToken::new();
    let server = GameServer::connect(Target::Tcp(addr)).await?;
    let channel_id = server.channel_id;
    let server_stats = server.stats.clone();
    let server_task = runtimes[0].spawn(server.run(1, stop.clone()));

    let stats = Arc::new(BotStats::default());
    let mut bots = Vec::with_capacity(opts.bots);
    for i in 0..opts.bots {
        let runtime = &runtimes[i % runtimes.len()];
        bots.push(runtime.spawn(run_bot(
            Target::Tcp(addr),
            i,
            channel_id,
            BotMode::Replica,
            stats.clone(),
            stop.clone(),
        )));
    }

    let started = Instant::now();
    let mut seconds = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    let (mut last_counts, mut last_bytes, mut last_frames) = (Vec::new(), 0u64, 0u64);
    let mut last_figures = router.figures();
    let mut last_at = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = tokio::signal::ctrl_c() => break,
        }
        let elapsed = last_at.elapsed().as_secs_f64();
        last_at = Instant::now();
        let counts = stats.updates_per_bot();
        let mut rates: Vec<f64> = counts
            .iter()
            .enumerate()
            .map(|(i, &n)| (n - last_counts.get(i).copied().unwrap_or(0)) as f64 / elapsed)
            .collect();
        rates.sort_by(f64::total_cmp);
        last_counts = counts;
        let bytes = stats.bytes.load(Ordering::Relaxed);
        let frames = server_stats.frames.load(Ordering::Relaxed);
        let (p50, p99) = match stats.latency_us.lock() {
            Ok(mut h) => {
                let q = (h.value_at_quantile(0.5) as f64 / 1e3, h.value_at_quantile(0.99) as f64 / 1e3);
                h.reset();
                q
            }
            Err(_) => (0.0, 0.0),
        };
        let figures = router.figures();
        let per_s = |now: u64, then: u64, per: u64| (now - then) as f64 / elapsed / per.max(1) as f64;
        let second = Second {
            clients: stats.connected.load(Ordering::Relaxed),
            channel_tick_hz: per_s(figures.ticks, last_figures.ticks, figures.channels),
            sent_hz: per_s(figures.fanouts, last_figures.fanouts, figures.subscribers),
            fanout_hz_mean: if rates.is_empty() {
                0.0
            } else {
                rates.iter().sum::<f64>() / rates.len() as f64
            },
            fanout_hz_p5: rates.get(rates.len() / 20).copied().unwrap_or(0.0),
            latency_p50_ms: p50,
            latency_p99_ms: p99,
            bytes_per_s: (bytes - last_bytes) as f64 / elapsed,
            server_fps: (frames - last_frames) as f64 / elapsed,
            characters: server_stats.characters.load(Ordering::Relaxed),
            min_updates: last_counts.iter().copied().min().unwrap_or(0),
            decode_errors: stats.decode_errors.load(Ordering::Relaxed),
        };
        (last_bytes, last_frames, last_figures) = (bytes, frames, figures);
        if opts.print {
            println!(
                "{:>4}s  clients {:>4}  tick {:>4.1} Hz  updates sent {:>4.1}/s, received {:>4.1}/s per client (p5 {:>4.1})  age p50 {:>5.2} ms  p99 {:>6.2} ms  {:>7.1} KB/s to clients  server {:>4.1} fps",
                started.elapsed().as_secs(),
                second.clients,
                second.channel_tick_hz,
                second.sent_hz,
                second.fanout_hz_mean,
                second.fanout_hz_p5,
                second.latency_p50_ms,
                second.latency_p99_ms,
                second.bytes_per_s / 1024.0,
                second.server_fps,
            );
        }
        seconds.push(second);
        if opts.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
    }
    stop.cancel();
    for bot in bots {
        if let Ok(Err(e)) = bot.await {
            tracing::warn!(error = %e, "a bot stopped early");
        }
    }
    if let Ok(Err(e)) = server_task.await {
        tracing::warn!(error = %e, "the game server stopped early");
    }
    gateway.shutdown(Duration::from_secs(5)).await;
    if opts.print {
        println!("stopped cleanly");
    }
    Ok(seconds)
}
