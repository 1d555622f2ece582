//! Where the simulated clients live: in this process, or spread over worker processes.
//!
//! One process can only open as many sockets as its open-file limit allows, so a large run is
//! split over several copies of this program (`tickwire bench pingpong-worker`). The
//! orchestrator talks to them over stdin/stdout, one JSON object per line, and merges their
//! counters and RTT histograms. A run that fits in one process uses [`Local`] directly.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tickwire_client::{ConnectOptions, Target};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::runtime::Handle;
use tokio::task::JoinSet;

use super::Row;
use super::client::{Shared, client, echo_body};

/// Longest wait for a ramp's handshakes to finish.
const CONNECT_WAIT: Duration = Duration::from_secs(60);
/// How long a worker may take to answer an order other than a ramp.
const REPLY_LIMIT: Duration = Duration::from_secs(60);

/// What one load generator needs to know; sent to worker processes as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WorkerSpec {
    pub(crate) addr: SocketAddr,
    pub(crate) interval_us: u64,
    pub(crate) max_think_us: Option<u64>,
    pub(crate) request_bytes: usize,
    pub(crate) response_bytes: u32,
    /// Time between two new clients of the whole run.
    pub(crate) ramp_us: u64,
    pub(crate) clients_per_source: usize,
    pub(crate) threads: usize,
    /// This generator's place among `workers`: it runs clients `index, index + workers, ...`.
    pub(crate) index: usize,
    pub(crate) workers: usize,
}

/// A worker's counters; per-step values are for the step asked about.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Counters {
    pub(crate) sent: u64,
    pub(crate) answered: u64,
    pub(crate) duplicated: u64,
    pub(crate) bad_answers: u64,
    pub(crate) errors: u64,
    pub(crate) connected: u64,
    pub(crate) failed: u64,
    pub(crate) bytes_to_server: u64,
    pub(crate) bytes_from_server: u64,
    /// RTT histogram of the step, as (microseconds, count) pairs.
    pub(crate) rtt_us: Vec<(u64, u64)>,
    /// The same from each request's write instead of its due time.
    pub(crate) service_us: Vec<(u64, u64)>,
}

impl Counters {
    fn merge(&mut self, other: Counters) {
        self.sent += other.sent;
        self.answered += other.answered;
        self.duplicated += other.duplicated;
        self.bad_answers += other.bad_answers;
        self.errors += other.errors;
        self.connected += other.connected;
        self.failed += other.failed;
        self.bytes_to_server += other.bytes_to_server;
        self.bytes_from_server += other.bytes_from_server;
        self.rtt_us.extend(other.rtt_us);
        self.service_us.extend(other.service_us);
    }

    /// RTT from the due time.
    pub(crate) fn histogram(&self) -> Histogram<u64> {
        to_histogram(&self.rtt_us)
    }

    /// RTT from the write.
    pub(crate) fn service_histogram(&self) -> Histogram<u64> {
        to_histogram(&self.service_us)
    }
}

fn to_histogram(pairs: &[(u64, u64)]) -> Histogram<u64> {
    let mut h = super::client::new_histogram();
    for &(value, count) in pairs {
        let _ = h.record_n(value, count);
    }
    h
}

fn from_histogram(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    h.iter_recorded().map(|v| (v.value_iterated_to(), v.count_at_value())).collect()
}

/// Orders from the orchestrator to a worker process.
#[derive(Debug, Serialize, Deserialize)]
enum Order {
    /// Grow to this many clients of this worker's own.
    Ramp(usize),
    Hold(usize),
    EndHold,
    Counters(usize),
    Stop,
}

/// Clients running as tasks in this process.
pub(crate) struct Local {
    spec: WorkerSpec,
    row: Row,
    shared: Arc<Shared>,
    tasks: JoinSet<()>,
    runtimes: Vec<Handle>,
    body: Bytes,
}

impl Local {
    pub(crate) fn new(spec: WorkerSpec, runtimes: Vec<Handle>) -> Local {
        let row = Row::from_spec(&spec);
        let body = echo_body(spec.request_bytes, spec.response_bytes);
        Local { spec, row, shared: Arc::new(Shared::new()), tasks: JoinSet::new(), runtimes, body }
    }

    /// Starts clients until this generator runs `clients`, then waits for their handshakes.
    pub(crate) async fn ramp_to(&mut self, clients: usize) {
        let have = self.tasks.len();
        let every = Duration::from_micros(self.spec.ramp_us * self.spec.workers as u64)
            .max(Duration::from_micros(10));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        for local in have..clients {
            tick.tick().await;
            let global = local * self.spec.workers + self.spec.index;
            let source = Ipv4Addr::new(127, 0, 0, 1 + (global / self.spec.clients_per_source.max(1)) as u8);
            let mut opts = ConnectOptions::new(Target::Tcp(self.spec.addr));
            opts.local_addr = Some(IpAddr::V4(source));
            opts.client_name = format!("bench-{global}");
            let runtime = &self.runtimes[local % self.runtimes.len()];
            let task = client(global as u64, self.shared.clone(), opts, self.row.clone(), self.body.clone());
            self.tasks.spawn_on(task, runtime);
        }
        let deadline = Instant::now() + CONNECT_WAIT;
        while (self.shared.connected.load(Relaxed) + self.shared.failed.load(Relaxed)) < clients as u64
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) fn set_holding(&self, step: Option<usize>) {
        self.shared.set_holding(step, Instant::now());
    }

    pub(crate) fn counters(&self, step: usize) -> Counters {
        let s = &self.shared;
        let hist = s.rtt[step].lock().expect("histogram lock");
        Counters {
            sent: s.sent[step].load(Relaxed),
            answered: s.answered[step].load(Relaxed),
            duplicated: s.duplicated.load(Relaxed),
            bad_answers: s.bad_answers.load(Relaxed),
            errors: s.errors.load(Relaxed),
            connected: s.connected.load(Relaxed),
            failed: s.failed.load(Relaxed),
            bytes_to_server: s.bytes_to_server.load(Relaxed),
            bytes_from_server: s.bytes_from_server.load(Relaxed),
            rtt_us: from_histogram(&hist.due),
            service_us: from_histogram(&hist.write),
        }
    }

    pub(crate) async fn stop(mut self) {
        self.shared.stop.cancel();
        let drain = async { while self.tasks.join_next().await.is_some() {} };
        let _ = tokio::time::timeout(Duration::from_secs(30), drain).await;
    }
}

/// One worker process and its pipes.
pub(crate) struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Worker {
    async fn send(&mut self, order: &Order) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(order)?;
        line.push(b'\n');
        self.stdin.write_all(&line).await.context("a bench worker went away")
    }

    /// The worker's answer to the last order, within `limit`: a worker alive but stuck must
    /// not hang the run.
    async fn reply<T: for<'de> Deserialize<'de>>(&mut self, limit: Duration) -> anyhow::Result<T> {
        let line = tokio::time::timeout(limit, self.stdout.next_line())
            .await
            .map_err(|_| anyhow::anyhow!("a bench worker did not answer within {limit:?}"))??
            .context("a bench worker exited")?;
        serde_json::from_str(&line).with_context(|| format!("bad reply from a bench worker: {line}"))
    }
}

/// The load generators of one run.
pub(crate) enum LoadGen {
    Local(Box<Local>),
    Remote(Vec<Worker>),
}

impl LoadGen {
    /// One local generator, or `procs` worker processes.
    pub(crate) async fn start(
        spec: WorkerSpec,
        procs: usize,
        runtimes: &[Handle],
    ) -> anyhow::Result<LoadGen> {
        if procs <= 1 {
            return Ok(LoadGen::Local(Box::new(Local::new(spec, runtimes.to_vec()))));
        }
        let exe = std::env::current_exe().context("cannot find the tickwire executable")?;
        let threads = (spec.threads / procs).max(1);
        let mut workers = Vec::new();
        for index in 0..procs {
            let spec = WorkerSpec { index, workers: procs, threads, ..spec.clone() };
            let mut child = Command::new(&exe)
                .args(["bench", "pingpong-worker", "--spec", &serde_json::to_string(&spec)?])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .context("cannot start a bench worker")?;
            let stdin = child.stdin.take().context("worker stdin")?;
            let stdout = BufReader::new(child.stdout.take().context("worker stdout")?).lines();
            workers.push(Worker { child, stdin, stdout });
        }
        Ok(LoadGen::Remote(workers))
    }

    /// Grows the whole run to `clients`; a worker must be done within `limit`.
    pub(crate) async fn ramp_to(&mut self, clients: usize, limit: Duration) -> anyhow::Result<()> {
        match self {
            LoadGen::Local(local) => local.ramp_to(clients).await,
            LoadGen::Remote(workers) => {
                let n = workers.len();
                for (index, worker) in workers.iter_mut().enumerate() {
                    // Worker `index` runs the clients `index, index + n, ...` below `clients`.
                    worker.send(&Order::Ramp((clients + n - 1 - index) / n)).await?;
                }
                for worker in workers.iter_mut() {
                    let _: Counters = worker.reply(limit).await?;
                }
            }
        }
        Ok(())
    }

    pub(crate) async fn set_holding(&mut self, step: Option<usize>) -> anyhow::Result<()> {
        match self {
            LoadGen::Local(local) => local.set_holding(step),
            LoadGen::Remote(workers) => {
                let order = match step {
                    Some(k) => Order::Hold(k),
                    None => Order::EndHold,
                };
                for worker in workers.iter_mut() {
                    worker.send(&order).await?;
                }
                for worker in workers.iter_mut() {
                    let _: Counters = worker.reply(REPLY_LIMIT).await?;
                }
            }
        }
        Ok(())
    }

    /// Counters of every generator, merged.
    pub(crate) async fn counters(&mut self, step: usize) -> anyhow::Result<Counters> {
        match self {
            LoadGen::Local(local) => Ok(local.counters(step)),
            LoadGen::Remote(workers) => {
                for worker in workers.iter_mut() {
                    worker.send(&Order::Counters(step)).await?;
                }
                let mut total = Counters::default();
                for worker in workers.iter_mut() {
                    total.merge(worker.reply(REPLY_LIMIT).await?);
                }
                Ok(total)
            }
        }
    }

    /// Processes doing the load generation, for CPU figures.
    pub(crate) fn pids(&self) -> Vec<u32> {
        let mut pids = vec![std::process::id()];
        if let LoadGen::Remote(workers) = self {
            pids.extend(workers.iter().filter_map(|w| w.child.id()));
        }
        pids
    }

    pub(crate) async fn stop(self) {
        match self {
            LoadGen::Local(local) => local.stop().await,
            LoadGen::Remote(mut workers) => {
                for worker in workers.iter_mut() {
                    let _ = worker.send(&Order::Stop).await;
                }
                for mut worker in workers {
                    let _ = tokio::time::timeout(Duration::from_secs(30), worker.child.wait()).await;
                }
            }
        }
    }
}

/// `tickwire bench pingpong-worker`: runs one share of a run's clients, taking orders on
/// stdin and answering each with its counters on stdout.
pub async fn worker_main(spec_json: &str) -> anyhow::Result<()> {
    let spec: WorkerSpec = serde_json::from_str(spec_json).context("bad --spec")?;
    let runtimes = tickwire_transport::io_threads(spec.threads, "bench-io")?;
    let mut local = Local::new(spec, runtimes);
    let mut orders = BufReader::new(tokio::io::stdin()).lines();
    let mut stdout = tokio::io::stdout();
    while let Some(line) = orders.next_line().await? {
        let order: Order = serde_json::from_str(&line).with_context(|| format!("bad order: {line}"))?;
        let step = match order {
            Order::Ramp(clients) => {
                local.ramp_to(clients).await;
                0
            }
            Order::Hold(k) => {
                local.set_holding(Some(k));
                k
            }
            Order::EndHold => {
                local.set_holding(None);
                0
            }
            Order::Counters(k) => k,
            Order::Stop => break,
        };
        let mut reply = serde_json::to_vec(&local.counters(step))?;
        reply.push(b'\n');
        stdout.write_all(&reply).await?;
        stdout.flush().await?;
    }
    local.stop().await;
    Ok(())
}
