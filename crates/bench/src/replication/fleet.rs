//! The bots of a `bench replication` run, in the bench process or spread over worker processes
//! (`--bot-processes`), behind one interface: add a bot, take a sample of the counters, stop.
//!
//! Worker `w` of `n` runs bots `w, w + n, …`, each on one of its own single-threaded runtimes,
//! and talks to the bench over its pipes, one JSON object per line: the bench orders bots and
//! samples; the worker answers samples, and asks for the characters of its `spatial` bots,
//! which the bench's game servers spawn (they live in the bench process). The game servers stay
//! in the bench either way.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tickwire_client::Target;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::machine::ProcSample;
use crate::sim::bots::{BotMode, BotStats};
use crate::sim::game::{Game, Scenario, SpatialGame};
use crate::sim::spatial_server::SpawnRequest;

/// Orders and replies queued per worker pipe; a full queue waits (the bench sends one sample
/// order per second and one order per joining bot).
const PIPE_QUEUE: usize = 1024;
/// How long a bot worker may take to answer a sample order: one alive but stuck must not hang
/// the run.
const SAMPLE_LIMIT: Duration = Duration::from_secs(60);

/// What a worker process needs to know to run its share of the bots.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerSpec {
    pub gateway: SocketAddr,
    pub scenario: Scenario,
    /// Scenario `single`: the world channel.
    pub channel_id: u64,
    /// Single-threaded runtimes in this worker.
    pub threads: usize,
    /// Nice levels their threads are raised above the worker's own (`--load-nice`).
    pub nice: i32,
}

#[derive(Debug, Serialize, Deserialize)]
enum ToWorker {
    /// Start bot `i`.
    Bot(usize),
    /// Answer with a [`BotSample`].
    Sample,
    /// The bench's answer to [`FromWorker::Spawn`]: the entity id, or why not.
    Spawned {
        request: u64,
        entity: Result<u64, String>,
    },
    Stop,
}

#[derive(Debug, Serialize, Deserialize)]
enum FromWorker {
    Sample(BotSample),
    /// A `spatial` bot's character, to be spawned by the server of `slot`.
    Spawn {
        request: u64,
        slot: usize,
        at: [f32; 2],
        yaw: f32,
        controller: u64,
    },
}

/// The bots' counters at one instant, and the update ages recorded since the last sample.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct BotSample {
    pub connected: u64,
    pub errors: u64,
    pub decode_errors: u64,
    pub gaps: u64,
    pub repeats: u64,
    /// Updates received by each bot, as (bot index, count), from every process.
    pub updates_per_bot: Vec<(usize, u64)>,
    /// Entity updates received by each replica bot (`BotMode::for_bot`), the same way.
    pub entities_per_replica_bot: Vec<(usize, u64)>,
    /// Update ages in µs since the last sample, as (value, count) pairs of a histogram.
    pub ages_us: Vec<(u64, u64)>,
    /// The bot threads' lateness in µs since the last sample, the same way (`load_lag`).
    pub load_lag_us: Vec<(u64, u64)>,
    /// Nice levels the bots' threads run below their process's, as applied; merged over
    /// processes, the fewest.
    pub load_nice: Option<i32>,
    /// [`BotStats::longest_cell_wait_us`] since the last sample; merged, the longest.
    pub longest_cell_wait_us: u64,
}

/// A histogram as (value, count) pairs, for the pipe.
fn pairs(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    h.iter_recorded().map(|v| (v.value_iterated_to(), v.count_at_value())).collect()
}

impl BotSample {
    /// Reads `stats`, and takes (resets) the ages recorded since the last read.
    fn read(stats: &BotStats) -> BotSample {
        let ages_us = pairs(&stats.latency_us.take());
        let load_lag_us = pairs(&stats.load_lag_us.take());
        BotSample {
            connected: stats.connected.load(Ordering::Relaxed),
            errors: stats.errors.load(Ordering::Relaxed),
            decode_errors: stats.decode_errors.load(Ordering::Relaxed),
            gaps: stats.version_gaps.load(Ordering::Relaxed),
            repeats: stats.version_repeats.load(Ordering::Relaxed),
            updates_per_bot: stats.updates_per_bot(),
            entities_per_replica_bot: stats.entities_per_replica_bot(),
            ages_us,
            load_lag_us,
            load_nice: Some(stats.load_nice.load(Ordering::Relaxed)),
            longest_cell_wait_us: stats.longest_cell_wait_us.swap(0, Ordering::Relaxed),
        }
    }

    fn merge(&mut self, other: BotSample) {
        self.connected += other.connected;
        self.errors += other.errors;
        self.decode_errors += other.decode_errors;
        self.gaps += other.gaps;
        self.repeats += other.repeats;
        self.updates_per_bot.extend(other.updates_per_bot);
        self.entities_per_replica_bot.extend(other.entities_per_replica_bot);
        self.ages_us.extend(other.ages_us);
        self.load_lag_us.extend(other.load_lag_us);
        self.longest_cell_wait_us = self.longest_cell_wait_us.max(other.longest_cell_wait_us);
        self.load_nice = match (self.load_nice, other.load_nice) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// Adds the sample's update ages to `histogram`.
    pub fn record_ages(&self, histogram: &mut Histogram<u64>) -> anyhow::Result<()> {
        record_pairs(&self.ages_us, histogram)
    }

    /// Adds the sample's bot-thread lateness to `histogram`.
    pub fn record_load_lag(&self, histogram: &mut Histogram<u64>) -> anyhow::Result<()> {
        record_pairs(&self.load_lag_us, histogram)
    }
}

fn record_pairs(pairs: &[(u64, u64)], histogram: &mut Histogram<u64>) -> anyhow::Result<()> {
    for &(value, count) in pairs {
        histogram.record_n(value, count)?;
    }
    Ok(())
}

/// The counters of one process's ramp bots, on `runtimes` lowered `load_nice` levels: they
/// carry that level, and a lateness probe runs on each runtime until `stop`.
fn process_stats(
    runtimes: &[tokio::runtime::Handle],
    load_nice: i32,
    stop: &CancellationToken,
) -> Arc<BotStats> {
    let stats = Arc::new(BotStats::default());
    stats.load_nice.store(load_nice, Ordering::Relaxed);
    crate::sim::load_lag::start(runtimes, &stats, stop);
    stats
}

/// One worker process: its orders go through a queue to a task that writes its stdin; its
/// samples come back from the task that reads its stdout.
pub(super) struct Worker {
    child: Child,
    orders: mpsc::Sender<ToWorker>,
    samples: mpsc::Receiver<BotSample>,
}

impl Worker {
    fn start(exe: &std::path::Path, spec: &WorkerSpec, game: &Game) -> anyhow::Result<Worker> {
        let mut child = Command::new(exe)
            .args(["bench", "replication-worker", "--spec", &serde_json::to_string(spec)?])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start a bot worker process")?;
        let mut stdin = child.stdin.take().context("bot worker stdin")?;
        let mut lines = BufReader::new(child.stdout.take().context("bot worker stdout")?).lines();
        let (orders, mut queued) = mpsc::channel::<ToWorker>(PIPE_QUEUE);
        tokio::spawn(async move {
            while let Some(order) = queued.recv().await {
                let Ok(mut line) = serde_json::to_vec(&order) else { break };
                line.push(b'\n');
                if stdin.write_all(&line).await.is_err() {
                    break;
                }
            }
        });
        let (sample_tx, samples) = mpsc::channel(1);
        let spawners = match game {
            Game::Spatial(game) => Some(game.spawners.clone()),
            Game::Single { .. } => None,
        };
        let replies = orders.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<FromWorker>(&line) {
                    Ok(FromWorker::Sample(sample)) => {
                        if sample_tx.send(sample).await.is_err() {
                            break;
                        }
                    }
                    Ok(FromWorker::Spawn { request, slot, at, yaw, controller }) => {
                        let (spawners, replies) = (spawners.clone(), replies.clone());
                        tokio::spawn(async move {
                            let entity = spawn(spawners.as_deref(), slot, at, yaw, controller).await;
                            let _ = replies.send(ToWorker::Spawned { request, entity }).await;
                        });
                    }
                    Err(e) => {
                        eprintln!("bad line from a bot worker ({e}): {line}");
                        break;
                    }
                }
            }
        });
        Ok(Worker { child, orders, samples })
    }
}

/// Has the bench's server for `slot` spawn a character; the error as text, for the pipe.
async fn spawn(
    spawners: Option<&Vec<mpsc::Sender<SpawnRequest>>>,
    slot: usize,
    at: [f32; 2],
    yaw: f32,
    controller: u64,
) -> Result<u64, String> {
    let server = spawners.and_then(|s| s.get(slot)).ok_or_else(|| format!("no spatial server {slot}"))?;
    let (reply, entity) = oneshot::channel();
    server
        .send(SpawnRequest { at, yaw, controller, reply })
        .await
        .map_err(|_| "the spawning server is gone".to_string())?;
    match entity.await {
        Ok(Ok(id)) => Ok(id),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(_) => Err("the spawning server is gone".into()),
    }
}

/// The bots of one run.
pub(super) enum Fleet {
    Local {
        stats: Arc<BotStats>,
        tasks: Vec<JoinHandle<anyhow::Result<()>>>,
        runtimes: Vec<tokio::runtime::Handle>,
    },
    Remote {
        workers: Vec<Worker>,
        bots: usize,
    },
}

impl Fleet {
    /// Bots in this process on `runtimes` (`processes` ≤ 1), or in `processes` workers that
    /// share the machine's cores.
    pub(crate) fn start(
        processes: usize,
        spec: WorkerSpec,
        game: &Game,
        runtimes: &[tokio::runtime::Handle],
        load_nice: i32,
        stop: &CancellationToken,
    ) -> anyhow::Result<Fleet> {
        if processes <= 1 {
            let stats = process_stats(runtimes, load_nice, stop);
            return Ok(Fleet::Local { stats, tasks: Vec::new(), runtimes: runtimes.to_vec() });
        }
        let exe = std::env::current_exe().context("cannot find the tickwire executable")?;
        let workers =
            (0..processes).map(|_| Worker::start(&exe, &spec, game)).collect::<anyhow::Result<_>>()?;
        Ok(Fleet::Remote { workers, bots: 0 })
    }

    /// Bots started so far.
    pub(crate) fn len(&self) -> usize {
        match self {
            Fleet::Local { tasks, .. } => tasks.len(),
            Fleet::Remote { bots, .. } => *bots,
        }
    }

    /// Starts the next bot.
    pub(crate) async fn add(
        &mut self,
        game: &Game,
        target: &Target,
        stop: &CancellationToken,
    ) -> anyhow::Result<()> {
        let i = self.len();
        match self {
            Fleet::Local { stats, tasks, runtimes } => {
                let runtime = &runtimes[i % runtimes.len()];
                tasks.push(runtime.spawn(game.bot(target, i, BotMode::for_bot(i), stats, stop)));
            }
            Fleet::Remote { workers, bots } => {
                let n = workers.len();
                workers[i % n].orders.send(ToWorker::Bot(i)).await.context("a bot worker exited")?;
                *bots += 1;
            }
        }
        Ok(())
    }

    /// The counters of every bot now, and the update ages since the last sample.
    pub(crate) async fn sample(&mut self) -> anyhow::Result<BotSample> {
        match self {
            Fleet::Local { stats, .. } => Ok(BotSample::read(stats)),
            Fleet::Remote { workers, .. } => {
                for worker in workers.iter() {
                    worker.orders.send(ToWorker::Sample).await.context("a bot worker exited")?;
                }
                let mut total = BotSample::default();
                for worker in workers.iter_mut() {
                    let sample =
                        tokio::time::timeout(SAMPLE_LIMIT, worker.samples.recv()).await.map_err(|_| {
                            anyhow::anyhow!("a bot worker did not answer within {SAMPLE_LIMIT:?}")
                        })?;
                    total.merge(sample.context("a bot worker exited")?);
                }
                Ok(total)
            }
        }
    }

    /// The processes running bots, for CPU figures (the bench's own is counted apart).
    pub(crate) fn worker_pids(&self) -> Vec<u32> {
        match self {
            Fleet::Local { .. } => Vec::new(),
            Fleet::Remote { workers, .. } => workers.iter().filter_map(|w| w.child.id()).collect(),
        }
    }

    /// Stops the bots (the caller has cancelled the run's token): local tasks are handed back
    /// to be joined with the servers'; workers are told to stop and waited for, then killed.
    pub(crate) async fn stop(self) -> Vec<JoinHandle<anyhow::Result<()>>> {
        match self {
            Fleet::Local { tasks, .. } => tasks,
            Fleet::Remote { workers, .. } => {
                for worker in &workers {
                    let _ = worker.orders.send(ToWorker::Stop).await;
                }
                for mut worker in workers {
                    if tokio::time::timeout(Duration::from_secs(15), worker.child.wait()).await.is_err() {
                        eprintln!("a bot worker had not stopped 15 s after the run; killed");
                        let _ = worker.child.kill().await;
                    }
                }
                Vec::new()
            }
        }
    }
}

/// CPU of the bench process and its workers, in % of one core, between two readings.
pub(crate) struct LoadCpu(Vec<ProcSample>);

impl LoadCpu {
    pub(crate) fn read(fleet: &Fleet) -> LoadCpu {
        let pids = std::iter::once(std::process::id()).chain(fleet.worker_pids());
        LoadCpu(pids.filter_map(ProcSample::read).collect())
    }

    pub(crate) fn pct_since(&self, earlier: &LoadCpu) -> f64 {
        self.0.iter().zip(&earlier.0).map(|(now, then)| now.cpu_pct_since(then)).sum()
    }
}

/// `tickwire bench replication-worker`: runs the bots it is told to, answers samples, and asks
/// the bench for its `spatial` bots' characters.
pub async fn worker_main(spec_json: &str) -> anyhow::Result<()> {
    let spec: WorkerSpec = serde_json::from_str(spec_json).context("bad --spec")?;
    // Ctrl-C at a terminal reaches the whole process group. The bench decides when its workers
    // stop (it keeps and writes the finished steps first), so a worker ignores SIGINT: the
    // handler stays installed as long as this stream lives, and it is never read.
    let _sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let runtimes = tickwire_transport::io_threads(spec.threads.max(1), "bench-bots")?;
    let load_nice =
        crate::priority::lower(&runtimes, spec.nice).await.context("lowering the bots' priority")?;
    let target = Target::Tcp(spec.gateway);
    let stop = CancellationToken::new();
    let stats = process_stats(&runtimes, load_nice, &stop);
    let (out, mut outgoing) = mpsc::channel::<FromWorker>(PIPE_QUEUE);
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(message) = outgoing.recv().await {
            let mut line = serde_json::to_vec(&message)?;
            line.push(b'\n');
            stdout.write_all(&line).await?;
            stdout.flush().await?;
        }
        anyhow::Ok(())
    });
    // Spawn requests of this worker's bots wait here for the bench's answer.
    let pending: Arc<Mutex<HashMap<u64, oneshot::Sender<anyhow::Result<u64>>>>> = Arc::default();
    let game = match spec.scenario.world() {
        None => Game::Single { channel_id: spec.channel_id },
        Some(world) => {
            let slots = world.slots() as usize;
            let next = Arc::new(AtomicU64::new(0));
            let mut spawners = Vec::new();
            for _ in 0..slots {
                let (tx, mut rx) = mpsc::channel::<SpawnRequest>(PIPE_QUEUE);
                let (out, pending, next) = (out.clone(), pending.clone(), next.clone());
                tokio::spawn(async move {
                    while let Some(SpawnRequest { at, yaw, controller, reply }) = rx.recv().await {
                        let request = next.fetch_add(1, Ordering::Relaxed);
                        pending.lock().expect("pending spawns").insert(request, reply);
                        let slot = world.slot_of(at);
                        if out.send(FromWorker::Spawn { request, slot, at, yaw, controller }).await.is_err() {
                            break;
                        }
                    }
                });
                spawners.push(tx);
            }
            Game::Spatial(SpatialGame { world, arena: Arc::new(world.arena()), spawners: Arc::new(spawners) })
        }
    };
    let mut tasks = Vec::new();
    let mut orders = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = orders.next_line().await? {
        match serde_json::from_str(&line).with_context(|| format!("bad order: {line}"))? {
            ToWorker::Bot(i) => {
                let bot = game.bot(&target, i, BotMode::for_bot(i), &stats, &stop);
                tasks.push(runtimes[i % runtimes.len()].spawn(bot));
            }
            ToWorker::Sample => out.send(FromWorker::Sample(BotSample::read(&stats))).await?,
            ToWorker::Spawned { request, entity } => {
                if let Some(reply) = pending.lock().expect("pending spawns").remove(&request) {
                    let _ = reply.send(entity.map_err(anyhow::Error::msg));
                }
            }
            ToWorker::Stop => break,
        }
    }
    stop.cancel();
    let all = async {
        for task in tasks {
            let _ = task.await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), all).await;
    drop(out);
    drop(game);
    let _ = tokio::time::timeout(Duration::from_secs(1), writer).await;
    Ok(())
}
