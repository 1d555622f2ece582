//! The results of `tickwire bench ddc`: one row per test beside the report's p50 and p95, and
//! JSON (`machine`, `tests` with `name`, `requests`, `success_ratio`, `latency_ms`,
//! `throughput_per_s`, `bytes_per_s`, and what else a reader needs to trust them).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::Mode;
use super::load::Tally;
use crate::machine::Machine;

#[derive(Debug, Clone, Serialize)]
pub struct LatencyMs {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

/// The report's figures for a test (64-core client, 100 Gbit).
#[derive(Debug, Clone, Serialize)]
pub struct Anchor {
    pub p50_ms: f64,
    pub p95_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct TestResult {
    pub name: String,
    /// Requests sent in the measured phase (seeding excluded).
    pub requests: u64,
    /// Requests that got a 2xx and whose body verified, over all requests.
    pub success_ratio: f64,
    /// Of every request (a failed one at the moment it failed); open loop: from each
    /// request's due time to the end of its response body, so queueing behind a slow server
    /// counts.
    pub latency_ms: LatencyMs,
    /// Successful requests per second of wall time.
    pub throughput_per_s: f64,
    /// Request plus response body bytes per second.
    pub bytes_per_s: f64,
    /// Failed requests by kind.
    pub errors: BTreeMap<String, u64>,
    /// Open loop: the rate asked for; closed loop: 0.
    pub rate_per_s: f64,
    pub duration_s: f64,
    /// The child server's CPU over the test, in % of one core (none with `--target`).
    pub server_cpu_pct: Option<f64>,
    pub report: Option<Anchor>,
    /// Both p50 and p95 at or below the report's.
    pub beats_report: Option<bool>,
}

impl TestResult {
    pub(super) fn new(
        name: &str,
        anchor: Option<(f64, f64)>,
        mode: Mode,
        rate: f64,
        duration: Duration,
        tally: &Tally,
        server_cpu_pct: Option<f64>,
    ) -> TestResult {
        let h = &tally.latency_us;
        let ms = |us: u64| us as f64 / 1000.0;
        let latency_ms = if h.is_empty() {
            LatencyMs { p50: 0.0, p95: 0.0, p99: 0.0, max: 0.0 }
        } else {
            LatencyMs {
                p50: ms(h.value_at_quantile(0.50)),
                p95: ms(h.value_at_quantile(0.95)),
                p99: ms(h.value_at_quantile(0.99)),
                max: ms(h.max()),
            }
        };
        let requests = tally.requests();
        let secs = tally.elapsed.as_secs_f64().max(1e-9);
        let success_ratio = if requests == 0 { 0.0 } else { tally.ok as f64 / requests as f64 };
        let report = anchor.map(|(p50_ms, p95_ms)| Anchor { p50_ms, p95_ms });
        let beats_report = report.as_ref().map(|a| {
            requests > 0 && success_ratio == 1.0 && latency_ms.p50 <= a.p50_ms && latency_ms.p95 <= a.p95_ms
        });
        TestResult {
            name: name.to_owned(),
            requests,
            success_ratio,
            latency_ms,
            throughput_per_s: tally.ok as f64 / secs,
            bytes_per_s: (tally.bytes_in + tally.bytes_out) as f64 / secs,
            errors: tally.errors.clone(),
            rate_per_s: if mode == Mode::Open { rate } else { 0.0 },
            duration_s: duration.as_secs_f64(),
            server_cpu_pct,
            report,
            beats_report,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct DdcReport {
    pub machine: Machine,
    pub mode: Mode,
    /// Stopped (Ctrl-C) before every test ran.
    pub incomplete: bool,
    pub tests: Vec<TestResult>,
}

const HEADER: &str = "test                   requests    ok%     p50 ms    p95 ms    p99 ms    max ms   req/s     MB/s  cpu%  | report p50   p95  beat";

/// One row, printed when its test ends (the header before the first).
pub(super) fn print_row(r: &TestResult) {
    static HEADER_ONCE: std::sync::Once = std::sync::Once::new();
    HEADER_ONCE.call_once(|| println!("{HEADER}"));
    let anchor = match (&r.report, r.beats_report) {
        (Some(a), Some(beat)) => {
            format!("{:>9.1} {:>6.1}  {}", a.p50_ms, a.p95_ms, if beat { "yes" } else { "NO" })
        }
        _ => format!("{:>9} {:>6}  {}", "-", "-", "-"),
    };
    let cpu = r.server_cpu_pct.map_or("-".to_owned(), |c| format!("{c:.0}"));
    println!(
        "{:<22} {:>8} {:>6.2} {:>10.2} {:>9.2} {:>9.2} {:>9.2} {:>7.1} {:>8.1} {:>5} | {anchor}",
        r.name,
        r.requests,
        r.success_ratio * 100.0,
        r.latency_ms.p50,
        r.latency_ms.p95,
        r.latency_ms.p99,
        r.latency_ms.max,
        r.throughput_per_s,
        r.bytes_per_s / 1e6,
        cpu,
    );
    for (kind, n) in &r.errors {
        println!("    {n} failed: {kind}");
    }
}

pub(super) fn print_footer(report: &DdcReport) {
    let anchored: Vec<&TestResult> = report.tests.iter().filter(|t| t.beats_report.is_some()).collect();
    let beaten = anchored.iter().filter(|t| t.beats_report == Some(true)).count();
    println!(
        "{} of {} tests with a report figure beat its p50 and p95 with every request successful. Latency: {}. Report: 64-core client, 100 Gbit; here: {}.",
        beaten,
        anchored.len(),
        match report.mode {
            Mode::Open => "open loop, from each request's due time to the end of its body",
            Mode::Closed => "closed loop, from send to the end of the body",
        },
        report.machine.line()
    );
}
