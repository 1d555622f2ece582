//! `tickwire demo`: a gateway, the simulated game servers and bots in one process, with a live
//! one-line-per-second summary. It shows the whole path at work: inputs by RPC to the owning
//! server, the server's patches into the channel, and 50 Hz deltas out to every client. With
//! `--scenario spatial`, nine spatial servers share the world and hand characters over as they
//! walk, and each bot sees the cells around it; with `--scenario lod`, one spatial server runs
//! the `single` arena and each bot sees every cell, the far ones less often.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use tickwire_client::Target;
use tickwire_gateway::{ChannelRouter, Gateway, GatewayConfig, Router, SpatialRouter};
use tickwire_web::{Page, WebView, World};
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Arena;
use super::bots::{BotMode, BotStats};
use super::game::{Game, Scenario, SpatialGame};
use super::spatial_server;

#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub scenario: Scenario,
    pub bots: usize,
    /// Stop after this long (default: run until Ctrl-C).
    pub duration: Option<Duration>,
    pub config: GatewayConfig,
    /// Print the live summary lines.
    pub print: bool,
    /// Serve the live web view here (the gateway's WebSocket listener must be on).
    pub web: Option<SocketAddr>,
}

/// The last second's figures (also what the web view's `/figures.json` answers).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Second {
    /// Sessions the gateway serves, other than the game servers: the bots and any client of
    /// your own.
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
    /// Bytes the gateway wrote, to every session.
    pub bytes_per_s: f64,
    /// The slowest game server's published frames per second: frames the gateway took. A
    /// frame it refused as busy, or one the server held back behind unanswered ones, is
    /// simulated but not counted.
    pub server_fps: f64,
    /// Characters simulated, over every server.
    pub characters: u64,
    /// Scenario `spatial`: entities handed over from one spatial server to another, per second.
    pub handovers_per_s: f64,
    /// The fewest state updates any bot has received since the start.
    pub min_updates: u64,
    /// Updates a bot's replica could not apply, since the start (always 0 unless a bug).
    pub decode_errors: u64,
}

/// A figure of the router's `/metrics`, by name (0 if absent).
fn gauge(router: &dyn Router, name: &str) -> f64 {
    router.gauges().iter().find(|g| g.name == name && g.labels.is_empty()).map_or(0.0, |g| g.value)
}

/// Runs the demo on `runtimes` (the gateway's I/O threads; the servers and bots share them).
pub async fn run(mut opts: DemoOptions, runtimes: &[Handle]) -> anyhow::Result<Vec<Second>> {
    // The spatial world's entity schema, in a file the gateway reads.
    let schema_file = tempfile::NamedTempFile::new()?;
    if let Some(world) = opts.scenario.world() {
        std::fs::write(schema_file.path(), spatial_server::ENTITY_SCHEMA)?;
        opts.config.spatial = Some(world.layout());
        let capacity = &mut opts.config.limits.outbox_capacity;
        *capacity = (*capacity).max(world.outbox_capacity());
        opts.config.channels.entity.schema_file = Some(schema_file.path().to_owned());
    }
    // Our own handle on the router, to read the gateway's figures.
    let channels = ChannelRouter::for_gateway(&opts.config)?;
    let router: Arc<dyn Router> = match &opts.config.spatial {
        Some(layout) => Arc::new(SpatialRouter::new(layout.clone(), &opts.config, channels)?),
        None => Arc::new(channels),
    };
    let gateway = Gateway::new(opts.config.clone())?
        .with_router(router.clone())
        .start_on(runtimes)
        .context("starting the gateway")?;
    let addr = *gateway.tcp_addrs().first().context("the demo needs a TCP listener")?;
    let spatial = opts.scenario.world().is_some();
    if opts.print {
        let servers = match opts.scenario {
            Scenario::Single => "a game server",
            Scenario::Spatial => "nine spatial servers (3 x 3 over 15 x 15 cells of 20 m)",
            Scenario::Lod => {
                "one spatial server (20 x 20 cells of 10 m; each bot sees every cell: within 10 m at 20 Hz, \
                 within 50 m at 10 Hz, the rest at 1 Hz)"
            }
        };
        println!("gateway on tcp://{addr}; {servers} and {} bots are joining (Ctrl-C stops)", opts.bots);
        println!("each line, for the last second:");
        println!("  clients   sessions the gateway serves besides the game servers (bots, and yours)");
        println!(
            "  tick      the {} tick rate (its 50 Hz schedule)",
            if spatial { "spatial world's" } else { "world channel's" }
        );
        println!("  updates   state updates the gateway sent, and each bot received, per second (p5: the");
        if opts.scenario == Scenario::Lod {
            println!("            slowest 5% of bots); the bots ask for 20 a second");
        } else {
            println!("            slowest 5% of bots); the world changes 30 times a second, so about 30");
        }
        println!("  age       from the server's publish to the bot's receipt, p50 and p99");
        println!("  KB/s      bytes the gateway wrote");
        println!("  server    the slowest game server's frame rate");
        if spatial {
            println!("  handovers characters handed over from one spatial server to another per second");
        }
        if let Some(m) = gateway.metrics_addr() {
            println!("metrics at http://{m}/metrics");
        }
    }
    let stop = CancellationToken::new();
    let target = Target::Tcp(addr);
    let (game, server_stats, server_tasks) = Game::start(opts.scenario, &target, runtimes, &stop).await?;
    let (fanouts, subscribers) = opts.scenario.fanout_series();
    if opts.print {
        match &game {
            Game::Single { channel_id } => println!(
                "your own client can join: the world is channel {channel_id} (or find it with channel.list, type \
                 GLOBAL); subscribe with channel.subscribe, and play by channel.send to it with the JSON body \
                 {{\"player\":\"<your player id>\",\"forward\":true,\"yaw\":0.0,\"jump\":false}} \
                 (yaw in radians; your character appears with your first input; docs/protocol.md section 13)"
            ),
            Game::Spatial(SpatialGame { world, .. }) => println!(
                "your own client can watch: spatial.interest with a sphere (the world spans {h}..{} m on x and z) \
                 and read channel.updates (docs/protocol.md section 14)",
                world.half_size,
                h = -world.half_size,
            ),
        }
    }

    let (live, live_seen) = watch::channel(serde_json::json!({}));
    let web = match opts.web {
        Some(addr) => {
            let ws =
                gateway.ws_addrs().first().context("the web view needs the gateway's WebSocket listener")?;
            let page = web_page(opts.scenario, ws.port(), &game.arena());
            let view = WebView::bind(addr, page, live_seen)
                .await
                .with_context(|| format!("binding the web view on {addr}"))?;
            if opts.print {
                println!("live view at http://{}/", view.local_addr()?);
            }
            Some(tokio::spawn(view.run(stop.clone())))
        }
        None => None,
    };

    let stats = Arc::new(BotStats::default());
    let mut bots = Vec::with_capacity(opts.bots);
    for i in 0..opts.bots {
        let runtime = &runtimes[i % runtimes.len()];
        bots.push(runtime.spawn(game.bot(&target, i, BotMode::Replica, &stats, &stop)));
    }

    let started = Instant::now();
    let mut seconds = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    let frames = || -> Vec<u64> { server_stats.iter().map(|s| s.frames.load(Ordering::Relaxed)).collect() };
    // Counters of the router, for differences over a second.
    let counters = |router: &dyn Router| {
        [gauge(router, "channel_ticks"), gauge(router, fanouts), gauge(router, "spatial_handovers")]
    };
    let (mut last_counts, mut last_bytes, mut last_frames) = (Vec::new(), 0u64, frames());
    let mut last_figures = counters(&*router);
    let mut last_at = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = tokio::signal::ctrl_c() => break,
        }
        let elapsed = last_at.elapsed().as_secs_f64();
        last_at = Instant::now();
        let counts = stats.updates_per_bot();
        let mut rates = super::bots::rates_between(&last_counts, &counts, elapsed);
        rates.sort_by(f64::total_cmp);
        last_counts = counts;
        let served = gateway.stats().snapshot();
        let bytes = served.bytes_out;
        let frames = frames();
        let ages = stats.latency_us.take();
        let (p50, p99) = super::ages::p50_p99_ms(&ages);
        let figures = counters(&*router);
        let per_s = |i: usize, per: f64| (figures[i] - last_figures[i]) / elapsed / per.max(1.0);
        // The spatial world is one task: its ticks are the world's.
        let channels = if spatial { 1.0 } else { gauge(&*router, "channel_num") };
        let second = Second {
            clients: served.sessions_open.saturating_sub(server_stats.len() as u64),
            channel_tick_hz: per_s(0, channels),
            sent_hz: per_s(1, gauge(&*router, subscribers)),
            fanout_hz_mean: if rates.is_empty() {
                0.0
            } else {
                rates.iter().sum::<f64>() / rates.len() as f64
            },
            fanout_hz_p5: rates.get(rates.len() / 20).copied().unwrap_or(0.0),
            latency_p50_ms: p50,
            latency_p99_ms: p99,
            bytes_per_s: (bytes - last_bytes) as f64 / elapsed,
            server_fps: frames
                .iter()
                .zip(&last_frames)
                .map(|(n, l)| (n - l) as f64 / elapsed)
                .fold(f64::INFINITY, f64::min),
            characters: server_stats.iter().map(|s| s.characters.load(Ordering::Relaxed)).sum(),
            handovers_per_s: per_s(2, 1.0),
            min_updates: last_counts.iter().map(|&(_, n)| n).min().unwrap_or(0),
            decode_errors: stats.decode_errors.load(Ordering::Relaxed),
        };
        (last_bytes, last_frames, last_figures) = (bytes, frames, figures);
        if opts.print {
            println!(
                "{:>4}s  clients {:>4}  tick {:>4.1} Hz  updates sent {:>4.1}/s, received {:>4.1}/s per client (p5 {:>4.1})  age p50 {:>5.2} ms  p99 {:>6.2} ms  {:>7.1} KB/s  server published {:>4.1} fps{}",
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
                if spatial {
                    format!("  {:>5.1} handovers/s", second.handovers_per_s)
                } else {
                    String::new()
                },
            );
        }
        live.send_replace(serde_json::to_value(second)?);
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
    for task in server_tasks {
        if let Ok(Err(e)) = task.await {
            tracing::warn!(error = %e, "a game server stopped early");
        }
    }
    if let Some(web) = web {
        // A page left open holds a connection; it is closed after its request in flight.
        let _ = tokio::time::timeout(Duration::from_secs(2), web).await;
    }
    gateway.shutdown(Duration::from_secs(5)).await;
    if opts.print {
        println!("stopped cleanly");
    }
    Ok(seconds)
}

/// What the web view needs to know of the world that the gateway does not tell it.
fn web_page(scenario: Scenario, ws_port: u16, arena: &Arena) -> Page {
    let obstacles = arena.obstacles.iter().map(|o| [o.min[0], o.min[1], o.max[0], o.max[1]]).collect();
    let h = arena.half_size;
    let world = match scenario.world() {
        Some(spec) => World::spatial(&spec.layout(), obstacles),
        None => World { min: Some([-h, -h]), max: Some([h, h]), obstacles, layout: None },
    };
    let title = format!("demo · {}", scenario.name());
    Page { ws_port, ws_tls: false, scenario: scenario.name().into(), title, world }
}
