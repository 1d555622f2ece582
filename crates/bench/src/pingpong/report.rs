//! The figures of a ping-pong run, as JSON and as a table on the terminal.

use serde::Serialize;

use crate::hold::Hold;
use crate::machine::Machine;

/// RTT percentiles in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Rtt {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// One step: a number of clients held for the hold window.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub row: String,
    pub clients: usize,
    pub connected: usize,
    pub interval_ms: Option<u64>,
    pub max_think_ms: Option<u64>,
    pub heartbeat_ms: u64,
    pub request_bytes: usize,
    pub response_bytes: u32,
    pub hold_s: f64,
    pub held: bool,
    /// Each condition of the hold rule: measured, required, held.
    pub hold: Hold,
    /// Requests answered with status OK and a body of the asked size.
    pub requests: u64,
    pub rps: f64,
    /// Round-trip time from when each request was due (its scheduled instant) to its answer:
    /// the figure the hold rule uses. It includes the load generator's lateness, at least its
    /// timer's 1 ms granularity.
    pub rtt_ms: Rtt,
    /// Round-trip time from when each request was written: the gateway's and the network's
    /// share only.
    pub rtt_from_write_ms: Rtt,
    /// Connects that failed, links lost and sessions that ended, since the previous step's
    /// hold (its grace period) ended: this step's ramp, settling, hold and grace.
    pub errors: u64,
    /// Answers with an error status or a body of the wrong size.
    pub bad_answers: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub server_cpu_pct: Option<f64>,
    pub server_rss_bytes: Option<u64>,
    /// The server's RSS divided by the clients held, in KiB (the process's own base included).
    pub server_kib_per_client: Option<f64>,
    /// CPU of the load generator itself (this process), in percent of one core.
    pub loadgen_cpu_pct: Option<f64>,
    /// Bytes the server received per second (what the clients wrote).
    pub bytes_in_per_s: f64,
    /// Bytes the server sent per second (what the clients read).
    pub bytes_out_per_s: f64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub bench: &'static str,
    /// What was loaded: `gateway` (a child gateway), `floor` (the bare responder of
    /// `--server floor`) or `target` (a running server given by `--target`).
    pub server: &'static str,
    pub machine: Machine,
    /// Stopped (Ctrl-C) before every step ran.
    pub incomplete: bool,
    pub max_held_clients: usize,
    pub steps: Vec<Step>,
}

pub(super) fn print_header() {
    println!(
        "RTT is timed from each request's due time (coordinated omission: it includes the load generator's \
         lateness, at least its 1 ms timer granularity); `write p50/p99` from the request's write; cpu and rss \
         are the server's (the gateway or the floor), gen cpu the load generator's"
    );
    println!(
        "{:>8} {:>5} {:>9} {:>8} {:>8} {:>8} {:>15} {:>6} {:>4} {:>5} {:>4} {:>7} {:>9} {:>7} {:>10} {:>10} {:>9}",
        "clients",
        "held",
        "req/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "write p50/p99",
        "errors",
        "bad",
        "lost",
        "dup",
        "cpu %",
        "rss MiB",
        "KiB/cl",
        "in KiB/s",
        "out KiB/s",
        "gen cpu %"
    );
}

pub(super) fn print_row(s: &Step) {
    let opt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
    println!(
        "{:>8} {:>5} {:>9.0} {:>8.2} {:>8.2} {:>8.1} {:>15} {:>6} {:>4} {:>5} {:>4} {:>7} {:>9} {:>7} {:>10.0} {:>10.0} {:>9}",
        s.clients,
        if s.held { "yes" } else { "NO" },
        s.rps,
        s.rtt_ms.p50,
        s.rtt_ms.p99,
        s.rtt_ms.max,
        format!("{:.2}/{:.2}", s.rtt_from_write_ms.p50, s.rtt_from_write_ms.p99),
        s.errors,
        s.bad_answers,
        s.lost,
        s.duplicated,
        opt(s.server_cpu_pct),
        opt(s.server_rss_bytes.map(|b| b as f64 / (1 << 20) as f64)),
        opt(s.server_kib_per_client),
        s.bytes_in_per_s / 1024.0,
        s.bytes_out_per_s / 1024.0,
        opt(s.loadgen_cpu_pct),
    );
    if !s.held {
        println!("  not held: {}", s.hold.failures());
    }
}
