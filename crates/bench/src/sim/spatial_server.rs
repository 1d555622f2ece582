//! The game servers of the B3 scenarios played in the spatial world: `spatial`, a 300 × 300 m
//! world split into 15 × 15 cells of 20 m, owned by 3 × 3 spatial servers; and `lod`, the
//! `single` arena (200 × 200 m) as 20 × 20 cells of 10 m owned by one server ([`WorldSpec`]).
//! Each server simulates the characters in its block at 30 frames per second (the same walk,
//! jump and collisions as `single`) and publishes them with `spatial.publish`; the gateway hands
//! a character over when it walks into another server's block, and the servers release and
//! acquire it (docs/protocol.md section 14).
//!
//! Spawning is the bench harness's job here (a master server's in a game): a bot asks the
//! server of its spawn point, in process, to spawn its character with the bot as controller.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use prost::Message;
use serde::Deserialize;
use tickwire_client::{Client, ClientError, ConnectOptions, Target};
use tickwire_wire::proto::{
    ChannelSend, EntityMessage, EntityState, Handover, HandoverKind, Publish, RegisterServer, Release,
    SpawnEntity, Vec3,
};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::server::{BLOCKED, InputMessage, ServerStats, Unanswered, now_us};
use super::world::{Arena, Character, FPS, Input};
use rand::SeedableRng;
use rand::rngs::SmallRng;

/// A square world centred on the origin, its grid and its servers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorldSpec {
    /// Half the world's side, in metres.
    pub half_size: f32,
    /// Obstacles in the arena.
    pub obstacles: usize,
    /// Servers along each axis, and cells along each axis.
    pub servers: u32,
    pub cells: u32,
    pub cell_size: f32,
    /// What each client sees.
    pub interest: Interest,
}

/// A client's area of interest in a [`WorldSpec`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Interest {
    /// A sphere of this radius around the client's character, re-centred only when the
    /// character changes cell (channeld's report: "updated only on handover").
    Sphere(f32),
    /// Every cell, with BENCHMARKS.md's B3 `lod` bands around the character: updates at 20 Hz,
    /// and in them the cells within 10 m at every one, within 50 m every 100 ms, the rest once
    /// a second; re-centred when the character changes cell.
    Lod,
}

/// The `spatial` world: 300 × 300 m, the `single` arena's density of obstacles (60 per
/// 200 × 200 m), 3 × 3 servers over 15 × 15 cells of 20 m (channeld's report).
pub const SPATIAL: WorldSpec = WorldSpec {
    half_size: 150.0,
    obstacles: 135,
    servers: 3,
    cells: 15,
    cell_size: 20.0,
    interest: Interest::Sphere(30.0),
};

/// The `lod` world: the `single` arena (200 × 200 m, 60 obstacles, the same seed) under one
/// server, in 20 × 20 cells of 10 m, the width of the nearest level-of-detail band.
pub const LOD: WorldSpec = WorldSpec {
    half_size: super::server::HALF_SIZE,
    obstacles: super::server::OBSTACLES,
    servers: 1,
    cells: 20,
    cell_size: 10.0,
    interest: Interest::Lod,
};

/// The seed of the worlds' arenas (`single`'s too).
const ARENA_SEED: u64 = 7;

/// One entity's value: field 0 is the publish time, so a counting client finds it first in
/// every entity op (docs/protocol.md 12.2: a struct's fields come in order).
pub const ENTITY_SCHEMA: &str = r#"{"fields": [
    {"name": "ts_us", "type": "int"},
    {"name": "pos", "type": {"quantized_vec3": {"min": -160.0, "max": 160.0, "precision": 0.01}}},
    {"name": "yaw", "type": {"quantized_float": {"min": 0.0, "max": 6.2832, "precision": 0.001}}},
    {"name": "blocked", "type": "bool"}
]}"#;

impl WorldSpec {
    /// The gateway settings of the world (`--set` values); `schema_file` holds
    /// [`ENTITY_SCHEMA`]. A client may see every cell (`limits.outbox_capacity`: see
    /// docs/protocol.md 14.4).
    pub fn gateway_overrides(&self, schema_file: &std::path::Path) -> Vec<String> {
        let (h, c, n) = (self.half_size, self.cells, self.servers);
        vec![
            format!("spatial.origin=[{}, {}]", -h, -h),
            format!("spatial.cell_size={}", self.cell_size),
            format!("spatial.cells=[{c}, {c}]"),
            format!("spatial.servers=[{n}, {n}]"),
            "spatial.server_interest_border=0".into(),
            format!("limits.outbox_capacity={}", self.outbox_capacity()),
            format!("channels.entity.schema_file={:?}", schema_file.display().to_string()),
        ]
    }

    /// A session outbox with room for every cell in view, and the events of leaving them all
    /// (docs/protocol.md 14.4: a view holds at most the outbox's capacity less 16 cells), and at
    /// least the gateway's default, 256.
    pub fn outbox_capacity(&self) -> usize {
        (self.cells as usize * self.cells as usize + 16).max(256)
    }

    /// The world's `[spatial]` layout.
    pub fn layout(&self) -> tickwire_spatial::LayoutConfig {
        tickwire_spatial::LayoutConfig {
            origin: [-self.half_size, -self.half_size],
            cell_size: self.cell_size,
            cells: [self.cells, self.cells],
            servers: [self.servers, self.servers],
            server_interest_border: 0,
        }
    }

    /// The server slots.
    pub fn slots(&self) -> u32 {
        self.servers * self.servers
    }

    /// The server slot whose block holds `(x, z)`.
    pub fn slot_of(&self, at: [f32; 2]) -> usize {
        let (h, n) = (self.half_size, self.servers);
        let block = (2.0 * h) / n as f32;
        let along = |v: f32| (((v + h) / block).floor() as i64).clamp(0, i64::from(n) - 1) as usize;
        along(at[1]) * n as usize + along(at[0])
    }

    /// The arena: the same in every process that builds it (the bench and its bot workers).
    pub fn arena(&self) -> Arena {
        Arena::generate(&mut SmallRng::seed_from_u64(ARENA_SEED), self.half_size, self.obstacles)
    }
}

/// A bot's request to its spawn point's server.
pub struct SpawnRequest {
    pub at: [f32; 2],
    pub yaw: f32,
    pub controller: u64,
    pub reply: oneshot::Sender<anyhow::Result<u64>>,
}

/// The value a server publishes, and hands over in a release.
#[derive(Debug, Deserialize)]
struct EntityValue {
    pos: [f32; 3],
    yaw: f32,
}

struct Owned {
    character: Character,
    controller: u64,
    /// The last entity message this server processed.
    processed: u64,
    /// Published at least once since this server took it.
    published: bool,
}

pub struct SpatialServer {
    client: Arc<Client>,
    slot: u32,
}

fn v3(p: [f32; 3]) -> Option<Vec3> {
    Some(Vec3 { x: p[0], y: p[1], z: p[2] })
}

fn value_json(c: &Character, ts: i64) -> String {
    format!(
        r#"{{"ts_us":{ts},"pos":[{},{},{}],"yaw":{},"blocked":{}}}"#,
        c.pos[0], c.pos[1], c.pos[2], c.yaw, c.blocked
    )
}

impl SpatialServer {
    /// Connects and registers in `slot`.
    pub async fn connect(target: Target, slot: u32) -> anyhow::Result<SpatialServer> {
        let mut opts = ConnectOptions::new(target);
        opts.token = format!("server:spatial-{slot}");
        opts.client_name = "tickwire-sim-spatial-server".into();
        let client = Client::connect(opts).await.context("connecting a spatial server")?;
        client
            .spatial_register(RegisterServer { slot: Some(slot), observe_only: false })
            .await
            .with_context(|| format!("registering spatial server {slot}"))?;
        Ok(SpatialServer { client: Arc::new(client), slot })
    }

    /// Runs the server until `stop`: spawns what `spawns` asks for, simulates and publishes
    /// its characters every frame, processes their inputs, releases and acquires them.
    pub async fn run(
        self,
        arena: Arc<Arena>,
        mut spawns: mpsc::Receiver<SpawnRequest>,
        stats: Arc<ServerStats>,
        stop: CancellationToken,
    ) -> anyhow::Result<()> {
        let client = &self.client;
        // Publishes and releases whose answers are waited for beside the frame loop.
        let mut unanswered = Unanswered::new();
        // Entities of frames not published (the world refused them as busy, or too many were
        // unanswered): the world does not have their last values, so the next frame publishes
        // them whether they moved or not.
        let not_taken: Arc<std::sync::Mutex<Vec<u64>>> = Arc::default();
        let mut owned: HashMap<u64, Owned> = HashMap::new();
        let dt = 1.0 / FPS as f32;
        let mut frame_timer = tokio::time::interval(Duration::from_secs(1) / FPS);
        frame_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut hits = Vec::new();
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                answered = unanswered.next() => answered?,
                Some(req) = spawns.recv() => {
                    let c = Character::new(req.at, req.yaw);
                    let spawn = SpawnEntity {
                        position: v3(c.pos),
                        value_json: value_json(&c, now_us()),
                        controller_connection: req.controller,
                    };
                    let result = client.spatial_spawn(spawn).await.map(|r| r.entity_id);
                    if let Ok(id) = &result {
                        owned.insert(*id, Owned { character: c, controller: req.controller, processed: 0, published: false });
                    }
                    let _ = req.reply.send(result.map_err(anyhow::Error::from));
                }
                push = client.next_push() => {
                    let Some(push) = push else { anyhow::bail!("spatial server {}: the session ended", self.slot) };
                    match push.topic.as_str() {
                        "spatial.message" => {
                            let m = EntityMessage::decode(push.body)?;
                            if let Some(o) = owned.get_mut(&m.entity_id) {
                                apply_input(o, &m);
                            }
                        }
                        "spatial.handover" => {
                            let h = Handover::decode(push.body)?;
                            match h.kind() {
                                HandoverKind::Release => {
                                    let Some(o) = owned.remove(&h.entity_id) else { continue };
                                    let release = Release {
                                        entity_id: h.entity_id,
                                        handover_id: h.handover_id,
                                        processed_seq: o.processed,
                                        value_json: value_json(&o.character, now_us()),
                                        position: v3(o.character.pos),
                                    };
                                    // Queued now, in order with the frames' publishes; its
                                    // answer is waited for beside the frame loop. A busy world
                                    // refuses with UNAVAILABLE: retry, as the protocol says (the
                                    // release is what the handover waits on).
                                    let first = client.queue_call("spatial.release", release.encode_to_vec().into()).await?;
                                    let (client, stats) = (client.clone(), stats.clone());
                                    unanswered.spawn(async move {
                                        let mut answer = first.answer().await.map(drop);
                                        let mut backoff = Duration::from_millis(1);
                                        while let Err(e) = answer {
                                            if !is_busy(&e) {
                                                return Err(e).context("releasing");
                                            }
                                            stats.release_retries.fetch_add(1, Ordering::Relaxed);
                                            tokio::time::sleep(backoff).await;
                                            backoff = (backoff * 2).min(Duration::from_millis(64));
                                            answer = client.spatial_release(release.clone()).await;
                                        }
                                        Ok(())
                                    });
                                }
                                HandoverKind::Acquire => {
                                    let v: EntityValue = serde_json::from_str(&h.value_json).context("an acquired value")?;
                                    let mut c = Character::new([v.pos[0], v.pos[2]], v.yaw);
                                    c.pos[1] = v.pos[1];
                                    let mut o = Owned { character: c, controller: h.controller_connection, processed: 0, published: false };
                                    for m in &h.messages {
                                        apply_input(&mut o, m);
                                    }
                                    owned.insert(h.entity_id, o);
                                }
                                HandoverKind::Unspecified => {}
                            }
                        }
                        _ => {}
                    }
                }
                _ = frame_timer.tick() => {
                    let ts = now_us();
                    let refused = std::mem::take(&mut *not_taken.lock().expect("not poisoned"));
                    for id in refused {
                        if let Some(o) = owned.get_mut(&id) {
                            o.published = false;
                        }
                    }
                    let mut entities = Vec::with_capacity(owned.len());
                    for (&entity_id, o) in owned.iter_mut() {
                        let c = &mut o.character;
                        let before = (c.pos, c.yaw, c.blocked);
                        c.step(&arena, dt);
                        if c.blocked && !before.2 {
                            hits.push((entity_id, o.controller));
                        }
                        if (c.pos, c.yaw, c.blocked) != before || !o.published {
                            o.published = true;
                            entities.push(EntityState {
                                entity_id,
                                position: v3(c.pos),
                                value_json: value_json(c, ts),
                                processed_seq: o.processed,
                            });
                        }
                    }
                    // Published without waiting for the answer; the frame counts once the world
                    // took it. A frame past MAX_UNANSWERED, or one a busy world refuses, is lost
                    // to the clients and counted (a step with one does not hold); its entities go
                    // out again in the next frame that is published.
                    let ids: Vec<u64> = entities.iter().map(|e| e.entity_id).collect();
                    let publish = Publish { entities }.encode_to_vec().into();
                    let refused = {
                        let (stats, not_taken, ids) = (stats.clone(), not_taken.clone(), ids.clone());
                        move |e: ClientError| {
                            if !is_busy(&e) {
                                return Err(e).context("publishing a frame");
                            }
                            not_taken.lock().expect("not poisoned").extend(ids);
                            stats.refused.fetch_add(1, Ordering::Relaxed);
                            Ok(())
                        }
                    };
                    if !unanswered.publish(client, "spatial.publish", publish, &stats, refused).await? {
                        not_taken.lock().expect("not poisoned").extend(ids);
                    }
                    for (entity_id, to_connection) in hits.drain(..) {
                        let send = ChannelSend { channel_id: entity_id, to_connection, broadcast: 0, body: Bytes::from_static(BLOCKED) };
                        // The player may have left, or not be known to the world yet: the answer
                        // does not matter.
                        drop(client.queue_call("channel.send", send.encode_to_vec().into()).await?);
                    }
                    stats.characters.store(owned.len() as u64, Ordering::Relaxed);
                }
            }
        }
    }
}

fn is_busy(e: &ClientError) -> bool {
    matches!(e, ClientError::Status { status: tickwire_wire::proto::Status::Unavailable, .. })
}

fn apply_input(o: &mut Owned, m: &EntityMessage) {
    if let Ok(input) = serde_json::from_slice::<InputMessage>(&m.body) {
        o.character.apply(Input { forward: input.forward, yaw: input.yaw, jump: input.jump });
    }
    o.processed = m.seq;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_the_report_blocks() {
        let slot_of = |at| SPATIAL.slot_of(at);
        assert_eq!(slot_of([-149.0, -149.0]), 0);
        assert_eq!(slot_of([-50.1, -149.0]), 0);
        assert_eq!(slot_of([-49.9, -149.0]), 1);
        assert_eq!(slot_of([149.0, -149.0]), 2);
        assert_eq!(slot_of([0.0, 0.0]), 4);
        assert_eq!(slot_of([149.0, 149.0]), 8);
        assert_eq!(slot_of([-149.0, 60.0]), 6);
        assert_eq!(LOD.slot_of([99.0, -99.0]), 0, "one server");
    }

    #[test]
    fn the_lod_world_is_the_single_arena() {
        assert_eq!(LOD.arena().obstacles.len(), super::super::server::arena(ARENA_SEED).obstacles.len());
        let (a, b) = (LOD.arena(), super::super::server::arena(ARENA_SEED));
        assert!(a.obstacles.iter().zip(&b.obstacles).all(|(x, y)| x.min == y.min && x.max == y.max));
        assert_eq!(a.half_size, b.half_size);
        // Every one of the 400 cells fits a session's outbox, with room for its events.
        let overrides = LOD.gateway_overrides(std::path::Path::new("e.json"));
        assert!(overrides.contains(&"limits.outbox_capacity=416".to_string()), "{overrides:?}");
        assert!(
            SPATIAL
                .gateway_overrides(std::path::Path::new("e.json"))
                .contains(&"limits.outbox_capacity=256".into())
        );
    }
}
