//! `tickwire bench`: the reference workloads of `BENCHMARKS.md`, re-run against tickwire.
//!
//! Each scenario is a cheap open-loop load generator (thousands of simulated clients as tasks
//! in one process), a sampler of the server's CPU and memory from `/proc`, and a report: a
//! table on the terminal, JSON for scripts, and optional SVG plots.

pub mod ddc;
pub mod hold;
mod interrupt;
mod loopback;
pub mod machine;
pub mod pingpong;
mod plot;
pub mod priority;
pub mod replication;
pub mod server;
pub mod sim;
pub mod sync;
