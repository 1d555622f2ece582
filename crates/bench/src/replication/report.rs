//! The figures of a replication run: a terminal table, JSON, and PNG charts.

use std::path::Path;

use serde::Serialize;

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

#[derive(Debug, Clone, Serialize)]
pub struct Tick {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// The figures of a second, or of a whole step (its JSON fields sit inline in both).
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    /// Fan-out passes per subscriber per second at the gateway (its 50 Hz schedule).
    pub gateway_fanout_hz: f64,
    /// State updates each client received per second (mean, and the 5th percentile over
    /// client-seconds).
    pub fanout_hz: Rate,
    /// Update age from server publish to client receipt.
    pub latency_ms: Latency,
    /// Fan-out pass time; for a step, the worst one-second sample of the hold.
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
    pub connected: usize,
    pub held: bool,
    #[serde(flatten)]
    pub figures: Figures,
    /// Updates a client replica could not apply (0 unless something is broken).
    pub decode_errors: u64,
    /// Connections (clients and the game server) and channels, from the gateway's metrics.
    pub gateway_connections: u64,
    pub gateway_channels: u64,
    /// The time series: one sample per second of the hold.
    pub samples: Vec<Sample>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReplicationReport {
    pub machine: Machine,
    pub scenario: String,
    pub max_held_clients: usize,
    pub steps: Vec<Step>,
}

pub(super) fn print_header() {
    println!(
        "| clients | held | gateway fan-out Hz | updates/s per client (mean / p5) | age p50 / p99 ms | tick p50 / p99 / max ms | gateway CPU % | RSS MiB | msgs in / out per s | MB/s out | server fps |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
}

pub(super) fn print_row(step: &Step) {
    let s = &step.figures;
    println!(
        "| {} | {} | {:.1} | {:.1} / {:.1} | {:.2} / {:.2} | {:.3} / {:.3} / {:.3} | {:.1} | {:.0} | {:.0} / {:.0} | {:.2} | {:.1} |",
        step.clients,
        if step.held { "yes" } else { "no" },
        s.gateway_fanout_hz,
        s.fanout_hz.mean,
        s.fanout_hz.p5,
        s.latency_ms.p50,
        s.latency_ms.p99,
        s.tick_ms.p50,
        s.tick_ms.p99,
        s.tick_ms.max,
        s.gateway_cpu_pct,
        s.gateway_rss_bytes as f64 / (1024.0 * 1024.0),
        s.msgs_in_per_s,
        s.msgs_out_per_s,
        s.bytes_out_per_s / 1e6,
        s.server_fps,
    );
}

/// Writes one chart per curve the issue asks for, against clients.
pub(super) fn plot(dir: &Path, report: &ReplicationReport) -> anyhow::Result<()> {
    let series = |f: fn(&Step) -> f64| -> Vec<(f64, f64)> {
        report.steps.iter().map(|s| (s.clients as f64, f(s))).collect()
    };
    let machine = report.machine.line();
    for (file, title, points) in [
        ("replication-cpu.png", "gateway CPU (% of one core)", series(|s| s.figures.gateway_cpu_pct)),
        (
            "replication-fanout.png",
            "gateway fan-out per client (Hz)",
            series(|s| s.figures.gateway_fanout_hz),
        ),
        ("replication-tick.png", "channel pass p99 (ms)", series(|s| s.figures.tick_ms.p99)),
        ("replication-bytes.png", "bytes out per second (MB/s)", series(|s| s.figures.bytes_out_per_s / 1e6)),
    ] {
        crate::plot::line_chart(dir, file, title, &points, &machine)?;
    }
    Ok(())
}
