//! The game of a B3 scenario, shared by `tickwire bench replication` and `tickwire demo`: its
//! game servers (one for `single`, nine spatial servers for `spatial`, one spatial server for
//! `lod`) and how a bot joins it.

use std::sync::Arc;

use tickwire_client::Target;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Arena;
use super::bots::{BotMode, BotStats, run_bot};
use super::server::{GameServer, ServerStats};
use super::spatial_bots::run_spatial_bot;
use super::spatial_server::{self, SpatialServer, SpawnRequest, WorldSpec};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
pub enum Scenario {
    /// One game server, one global channel, every client at 50 Hz.
    Single,
    /// 3 x 3 spatial servers over 15 x 15 cells of 20 m; each client sees a 30 m sphere that
    /// moves with its character when it changes cell.
    Spatial,
    /// One spatial server over the `single` arena in 20 x 20 cells of 10 m; each client sees
    /// every cell, at 20 Hz within 10 m of its character, 10 Hz within 50 m, 1 Hz beyond.
    Lod,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Single => "single",
            Scenario::Spatial => "spatial",
            Scenario::Lod => "lod",
        }
    }

    /// The spatial world the scenario is played in (`None`: a channel, `single`).
    pub fn world(self) -> Option<&'static WorldSpec> {
        match self {
            Scenario::Single => None,
            Scenario::Spatial => Some(&spatial_server::SPATIAL),
            Scenario::Lod => Some(&spatial_server::LOD),
        }
    }

    /// The most updates per second a client asks for, where that is fewer than the servers'
    /// frames (`lod`: 20 Hz, its nearest band's rate); the others take every frame.
    pub fn client_hz(self) -> Option<f64> {
        (self == Scenario::Lod).then(|| 1e3 / f64::from(super::spatial_bots::LOD_INTERVAL_MS))
    }

    /// The longest a cell with characters in a client's view may wait for an update that
    /// merges its changes, in ms (`Step::longest_cell_wait_ms`):
    /// `lod`'s longest band interval and half a second (passes, and the bots' own lateness).
    /// `None`: not a rule (every cell goes at every update).
    pub fn longest_cell_wait_ms(self) -> Option<f64> {
        let longest = super::spatial_bots::lod_bands().iter().map(|b| b.interval_ms).max()?;
        (self == Scenario::Lod).then(|| f64::from(longest) + 500.0)
    }

    /// The gateway counters of updates queued and of the subscribers they went to.
    pub fn fanout_series(self) -> (&'static str, &'static str) {
        match self {
            Scenario::Single => ("channel_fanouts", "channel_subscribers"),
            Scenario::Spatial | Scenario::Lod => ("spatial_fanouts", "spatial_viewers"),
        }
    }
}

/// The `single` game server's seed (its arena and spawn points).
const SINGLE_SEED: u64 = 7;

/// Runs a game server, and says on stderr at once if it stops with an error (its frame rate
/// then reads 0 in the steps that follow).
pub async fn say_if_failed(
    what: String,
    server: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let result = server.await;
    if let Err(e) = &result {
        eprintln!("{what} stopped: {e:#}");
    }
    result
}

/// Runs `connect` on `runtime`: the connection's own tasks (reader, writer, heartbeats) are
/// spawned where it runs, so a server's whole connection lives on the servers' runtime.
async fn on<T: Send + 'static>(
    runtime: &tokio::runtime::Handle,
    connect: impl Future<Output = anyhow::Result<T>> + Send + 'static,
) -> anyhow::Result<T> {
    runtime.spawn(connect).await?
}

/// The game servers of a run and how bots join them.
pub enum Game {
    Single { channel_id: u64 },
    Spatial(SpatialGame),
}

/// Where the bots of a spatial scenario play: the world, its arena, and the spawner of each
/// server slot (`spawners[slot]` spawns characters in that slot's block).
#[derive(Clone)]
pub struct SpatialGame {
    pub world: &'static WorldSpec,
    pub arena: Arc<Arena>,
    pub spawners: Arc<Vec<mpsc::Sender<SpawnRequest>>>,
}

impl Game {
    /// Starts the scenario's game servers on `runtimes`; returns the game, each server's
    /// figures and their tasks.
    pub async fn start(
        scenario: Scenario,
        target: &Target,
        runtimes: &[tokio::runtime::Handle],
        stop: &CancellationToken,
    ) -> anyhow::Result<(Game, Vec<Arc<ServerStats>>, Vec<tokio::task::JoinHandle<anyhow::Result<()>>>)> {
        match scenario.world() {
            None => {
                let server = on(&runtimes[0], GameServer::connect(target.clone())).await?;
                let channel_id = server.channel_id;
                let stats = server.stats.clone();
                let task = runtimes[0]
                    .spawn(say_if_failed("the game server".into(), server.run(SINGLE_SEED, stop.clone())));
                Ok((Game::Single { channel_id }, vec![stats], vec![task]))
            }
            Some(world) => {
                let arena = Arc::new(world.arena());
                let (mut spawners, mut stats, mut tasks) = (Vec::new(), Vec::new(), Vec::new());
                for slot in 0..world.slots() {
                    let runtime = &runtimes[slot as usize % runtimes.len()];
                    let server = on(runtime, SpatialServer::connect(target.clone(), slot)).await?;
                    let (tx, rx) = mpsc::channel(1024);
                    let figures = Arc::new(ServerStats::default());
                    let run = server.run(arena.clone(), rx, figures.clone(), stop.clone());
                    tasks.push(runtime.spawn(say_if_failed(format!("spatial server {slot}"), run)));
                    spawners.push(tx);
                    stats.push(figures);
                }
                let game = SpatialGame { world, arena, spawners: Arc::new(spawners) };
                Ok((Game::Spatial(game), stats, tasks))
            }
        }
    }

    /// The arena the game is played in, as its servers generated it.
    pub fn arena(&self) -> Arena {
        match self {
            Game::Single { .. } => super::server::arena(SINGLE_SEED),
            Game::Spatial(game) => Arena::clone(&game.arena),
        }
    }

    /// Bot `i`. `mode`: what it does with its updates.
    pub fn bot(
        &self,
        target: &Target,
        i: usize,
        mode: BotMode,
        stats: &Arc<BotStats>,
        stop: &CancellationToken,
    ) -> impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static {
        let (target, stats, stop) = (target.clone(), stats.clone(), stop.clone());
        let game = match self {
            Game::Single { channel_id } => Err(*channel_id),
            Game::Spatial(game) => Ok(game.clone()),
        };
        async move {
            match game {
                Err(channel_id) => run_bot(target, i, channel_id, mode, stats, stop).await,
                Ok(game) => run_spatial_bot(target, i, mode, game, stats, stop).await,
            }
        }
    }
}
