//! The simulated game server: owns the global channel, simulates one character per client at
//! a fixed 30 frames per second, and publishes every character's transform as a patch.
//!
//! Clients send their input as `channel.send` messages to the owner; the first input of a
//! player spawns its character. When a character hits a wall or an obstacle, the server tells
//! its player with a `channel.send` to that player's connection.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::Bytes;
use prost::Message;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde::{Deserialize, Serialize};
use tickwire_client::{Client, ClientError, ConnectOptions, Target};
use tickwire_wire::proto::{
    ChannelMessage, ChannelSend, ChannelType, CreateChannel, CreateChannelResult, UpdateChannel,
};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::world::{Arena, Character, FPS, Input};

/// The global channel's schema: a publish timestamp, the frame number, and the characters.
pub const SCHEMA: &str = r#"{"fields": [
    {"name": "ts_us", "type": "int"},
    {"name": "frame", "type": "int"},
    {"name": "characters", "player_keyed": true, "type": {"map": {"key": "string", "value": {"struct": [
        {"name": "pos", "type": {"quantized_vec3": {"min": -110.0, "max": 110.0, "precision": 0.01}}},
        {"name": "yaw", "type": {"quantized_float": {"min": 0.0, "max": 6.2832, "precision": 0.001}}},
        {"name": "blocked", "type": "bool"}
    ]}}}}
]}"#;

/// The arena: 200 × 200 m with 60 obstacles, placed by the run's seed.
pub const HALF_SIZE: f32 = 100.0;
pub const OBSTACLES: usize = 60;

/// The arena a server run with `seed` plays in (the first thing it draws from its seed).
pub fn arena(seed: u64) -> Arena {
    Arena::generate(&mut SmallRng::seed_from_u64(seed), HALF_SIZE, OBSTACLES)
}

/// The message the server sends a player whose character hit something.
pub const BLOCKED: &[u8] = b"blocked";

/// Field indexes of SCHEMA, for readers.
pub const TS_FIELD: usize = 0;
pub const CHARACTERS_FIELD: usize = 2;

/// What a client sends its character's server.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InputMessage {
    pub player: String,
    pub forward: bool,
    pub yaw: f32,
    pub jump: bool,
}

/// Frames whose publish the gateway has not answered yet, at most. A server does not wait for
/// the answer before its next frame (a game's frame loop would not), but it does not queue
/// without bound either: with this many unanswered, a frame is simulated and not published.
pub(crate) const MAX_UNANSWERED: usize = 3;

/// A game server's requests whose answers it has not waited for: its frames' publishes (at most
/// [`MAX_UNANSWERED`]) and anything else it hands over ([`Unanswered::spawn`]). The frame loop
/// polls [`Unanswered::next`] beside its timer, so a failed answer ends the server.
pub(crate) struct Unanswered {
    answers: JoinSet<anyhow::Result<()>>,
    permits: Arc<Semaphore>,
}

impl Unanswered {
    pub fn new() -> Unanswered {
        Unanswered { answers: JoinSet::new(), permits: Arc::new(Semaphore::new(MAX_UNANSWERED)) }
    }

    /// Queues a frame's `method` call, unless [`MAX_UNANSWERED`] frames are unanswered: then it
    /// is not sent, `stats.unanswered` counts it, and this returns `false`. An answered frame
    /// counts in `stats.frames`; an error answer goes to `refused`, whose error ends the server.
    pub async fn publish(
        &mut self,
        client: &Client,
        method: &str,
        body: Bytes,
        stats: &Arc<ServerStats>,
        refused: impl FnOnce(ClientError) -> anyhow::Result<()> + Send + 'static,
    ) -> anyhow::Result<bool> {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            stats.unanswered.fetch_add(1, Ordering::Relaxed);
            return Ok(false);
        };
        let answer = client.queue_call(method, body).await?;
        let stats = stats.clone();
        self.answers.spawn(async move {
            let _permit = permit;
            match answer.answer().await {
                Ok(_) => {
                    stats.frames.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                }
                Err(e) => refused(e),
            }
        });
        Ok(true)
    }

    /// Waits for an answer beside the frame loop (a release and its retries, say).
    pub fn spawn(&mut self, waiting: impl Future<Output = anyhow::Result<()>> + Send + 'static) {
        self.answers.spawn(waiting);
    }

    /// The next answer waited for: an error if it failed. Pending while there is none.
    pub async fn next(&mut self) -> anyhow::Result<()> {
        match self.answers.join_next().await {
            Some(answered) => answered?,
            None => std::future::pending().await,
        }
    }
}

/// What a game server counts; the demo and the bench derive frames per second.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Frames the gateway took: `channel.update`s applied (`single`), publishes the world
    /// accepted (`spatial`). A server does not wait for these answers before its next frame.
    pub frames: AtomicU64,
    pub characters: AtomicU64,
    /// `spatial` frames the world refused as busy (UNAVAILABLE): not published.
    pub refused: AtomicU64,
    /// Frames not published because [`MAX_UNANSWERED`] earlier ones were still unanswered.
    pub unanswered: AtomicU64,
    /// `spatial` releases the world refused as busy, and that were sent again.
    pub release_retries: AtomicU64,
}

/// Microseconds since the Unix epoch: the clock both the server and the bots read.
pub fn now_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

pub struct GameServer {
    client: Arc<Client>,
    pub channel_id: u64,
    pub stats: Arc<ServerStats>,
}

impl GameServer {
    /// Connects to the gateway and creates the global channel.
    pub async fn connect(target: Target) -> anyhow::Result<GameServer> {
        let mut opts = ConnectOptions::new(target);
        opts.token = "server:game-server".into();
        opts.client_name = "tickwire-sim-server".into();
        let client = Client::connect(opts).await.context("connecting the game server")?;
        let create = CreateChannel {
            r#type: ChannelType::Global as i32,
            name: "world".into(),
            schema_json: SCHEMA.into(),
        };
        let body = client
            .call("channel.create", create.encode_to_vec().into())
            .await
            .context("creating the channel")?;
        let channel_id = CreateChannelResult::decode(body)?.channel_id;
        // The timestamp is set before anyone can subscribe: a bot reads one from every update,
        // snapshots included, and one that joined before the first frame was applied would
        // otherwise get an empty snapshot (seen once in a ramp, as a decode failure).
        let first = format!("{{\"op\":\"set\",\"path\":\"/ts_us\",\"value\":{}}}\n", now_us());
        let update = UpdateChannel { channel_id, patch: Bytes::from(first) };
        client.call("channel.update", update.encode_to_vec().into()).await.context("the first update")?;
        Ok(GameServer { client: Arc::new(client), channel_id, stats: Arc::default() })
    }

    /// Runs the simulation until `stop`.
    pub async fn run(self, seed: u64, stop: CancellationToken) -> anyhow::Result<()> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let arena = Arena::generate(&mut rng, HALF_SIZE, OBSTACLES);
        let (inputs_tx, mut inputs) = mpsc::channel::<(u64, InputMessage)>(4096);
        let reader = self.client.clone();
        let reading = stop.clone();
        tokio::spawn(async move {
            loop {
                let push = tokio::select! {
                    () = reading.cancelled() => return,
                    push = reader.next_push() => push,
                };
                let Some(push) = push else { return };
                if push.topic != "channel.message" {
                    continue;
                }
                let Ok(msg) = ChannelMessage::decode(push.body) else { continue };
                if let Ok(input) = serde_json::from_slice::<InputMessage>(&msg.body) {
                    // Inputs are rare (a few per client per second); if the queue is full the
                    // frame loop is far behind and dropping one is harmless.
                    let _ = inputs_tx.try_send((msg.from_connection, input));
                }
            }
        });

        let dt = 1.0 / FPS as f32;
        let mut characters: HashMap<String, Character> = HashMap::new();
        // Each character's player connection, to tell it when it hits something.
        let mut connections: HashMap<String, u64> = HashMap::new();
        let mut hits = Vec::new();
        let mut frame_timer = tokio::time::interval(Duration::from_secs(1) / FPS);
        frame_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut frame: u64 = 0;
        let mut unanswered = Unanswered::new();
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                answered = unanswered.next() => {
                    answered?;
                    continue;
                }
                _ = frame_timer.tick() => {}
            }
            while let Ok((conn, input)) = inputs.try_recv() {
                connections.insert(input.player.clone(), conn);
                let c = characters
                    .entry(input.player.clone())
                    .or_insert_with(|| Character::new(arena.spawn(&mut rng), input.yaw));
                c.apply(Input { forward: input.forward, yaw: input.yaw, jump: input.jump });
            }
            frame += 1;
            let mut patch = String::with_capacity(64 * (characters.len() + 2));
            patch.push_str(&format!("{{\"op\":\"set\",\"path\":\"/ts_us\",\"value\":{}}}\n", now_us()));
            patch.push_str(&format!("{{\"op\":\"set\",\"path\":\"/frame\",\"value\":{frame}}}\n"));
            for (player, c) in characters.iter_mut() {
                let before = (c.pos, c.yaw, c.blocked);
                c.step(&arena, dt);
                if c.blocked && !before.2 {
                    hits.push(player.clone());
                }
                if (c.pos, c.yaw, c.blocked) != before || frame == 1 {
                    let escaped = player.replace('~', "~0").replace('/', "~1");
                    let key = serde_json::to_string(&format!("/characters/{escaped}")).expect("a string");
                    patch.push_str(&format!(
                        "{{\"op\":\"set\",\"path\":{key},\"value\":{{\"pos\":[{},{},{}],\"yaw\":{},\"blocked\":{}}}}}\n",
                        c.pos[0], c.pos[1], c.pos[2], c.yaw, c.blocked
                    ));
                }
            }
            // Published without waiting for the answer, as a game's frame loop would; the frame
            // counts once the gateway applied it. Past MAX_UNANSWERED, a frame is not published.
            let update = UpdateChannel { channel_id: self.channel_id, patch: Bytes::from(patch) };
            let body = update.encode_to_vec().into();
            let refused = |e: ClientError| Err(e).context("publishing a frame");
            unanswered.publish(&self.client, "channel.update", body, &self.stats, refused).await?;
            // Tell each player whose character just hit a wall or an obstacle (server to client).
            for player in hits.drain(..) {
                if let Some(&to_connection) = connections.get(&player) {
                    let send = ChannelSend {
                        channel_id: self.channel_id,
                        to_connection,
                        broadcast: 0,
                        body: Bytes::from_static(BLOCKED),
                    };
                    // The player may have left; that is not the server's problem: the answer
                    // does not matter.
                    drop(self.client.queue_call("channel.send", send.encode_to_vec().into()).await?);
                }
            }
            self.stats.characters.store(characters.len() as u64, Ordering::Relaxed);
        }
    }
}
