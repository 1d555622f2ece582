//! The spatial world without sockets, tasks or a clock, for the criterion bench of its hot path
//! (`crates/bench/benches/world_pass.rs`). The system bench (`tickwire bench replication
//! --scenario spatial`) measures the world's pass on two cores shared with the I/O threads and
//! the load, where its CPU time varies by 10–20% from run to run; this drives the same
//! [`World`] code, `publish` and `tick`, on one thread with `now` given, so a change to the
//! pass can be measured to a few percent.
//!
//! Sessions are stand-ins: each has the real bounded outbox and window of updates in flight,
//! and [`WorldHarness::drain`] plays a client that keeps up (it reads every outbox and
//! acknowledges every update at once); [`WorldHarness::drain_clients`] leaves some unread, as
//! clients that fall behind, and [`WorldHarness::keep_replicas`] has clients apply what they
//! read to replicas of their cells, for the tests. Nothing polls the outboxes, so the wake-ups a
//! pass causes in the gateway are not in the figure. Not part of the gateway's API.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;
use prost::Message;
use tickwire_spatial::LayoutConfig;
use tickwire_state::{Replica, Schema};
use tickwire_wire::decode_envelope;
use tickwire_wire::proto::{
    ChannelEvent, ChannelUpdates, DeltaCodec, EntityState, Follow, Publish, RegisterServer, SetInterest,
    SpawnEntity, SpawnResult, Sphere, Status, SubscriptionOptions, Vec3, envelope, set_interest,
};
use tokio::sync::mpsc;

use super::world::World;
use super::{CELL_BASE, HELD_BACK_REASONS, SpatialRouter};
use crate::auth::Role;
use crate::channel::{ChannelConfigError, ChannelRouter, state_codec};
use crate::router::{Outgoing, SessionHandle};

/// A session stand-in: its handle, the receiving end of its outbox, and the sequence number
/// its next message would take.
struct Sink {
    handle: SessionHandle,
    outbox: mpsc::Receiver<Outgoing>,
    seq: u64,
    /// With [`WorldHarness::keep_replicas`]: a replica of each cell in view, built from the
    /// `channel.updates` read, as a client would.
    replicas: Option<HashMap<u64, Replica>>,
}

impl Sink {
    fn new(conn_id: u64, role: Role, config: &crate::GatewayConfig) -> Sink {
        let (handle, outbox) = SessionHandle::unattached(conn_id, role, config);
        Sink { handle, outbox, seq: 0, replicas: None }
    }

    /// Applies a message read to the replicas, if kept.
    fn apply(&mut self, message: Bytes, schema: &Arc<Schema>) -> Result<(), HarnessError> {
        let Some(replicas) = self.replicas.as_mut() else { return Ok(()) };
        let Ok(envelope::Kind::Push(push)) = decode_envelope(message) else {
            return Err(HarnessError::Read("a message that is not a push".into()));
        };
        match push.topic.as_str() {
            "channel.updates" => {
                let batch = ChannelUpdates::decode(push.body)
                    .map_err(|e| HarnessError::Read(format!("channel.updates: {e}")))?;
                for u in batch.updates {
                    let replica =
                        replicas.entry(u.channel_id).or_insert_with(|| Replica::new(schema.clone()));
                    replica
                        .apply_codec(state_codec(u.codec()), &u.update)
                        .map_err(|e| HarnessError::Read(format!("cell {}: {e}", u.channel_id)))?;
                }
            }
            "channel.event" => {
                let event = ChannelEvent::decode(push.body)
                    .map_err(|e| HarnessError::Read(format!("channel.event: {e}")))?;
                replicas.remove(&event.channel_id);
            }
            _ => {}
        }
        Ok(())
    }

    /// Reads the whole outbox; every update is sent and acknowledged at `now`. Returns the
    /// messages and bytes read.
    fn drain(&mut self, now: Instant, schema: &Arc<Schema>) -> Result<(u64, u64), HarnessError> {
        let (mut messages, mut bytes) = (0, 0);
        let flow = self.handle.flow.clone();
        let mut window = flow.lock();
        while let Ok(item) = self.outbox.try_recv() {
            self.seq += 1;
            messages += 1;
            let message = match item {
                Outgoing::Message(m) => m,
                Outgoing::Update(u) => {
                    window.sent(self.seq);
                    u
                }
                Outgoing::UpdateParts(u) => {
                    window.sent(self.seq);
                    // The bytes the session's task writes.
                    u.into_payload().into_bytes()
                }
            };
            bytes += message.len() as u64;
            self.apply(message, schema)?;
        }
        window.acked(now, self.seq);
        Ok((messages, bytes))
    }
}

/// A world with its servers and clients, each client controlling one entity and seeing a
/// sphere around it, as in the B3 `spatial` scenario.
pub struct WorldHarness {
    world: World,
    config: crate::GatewayConfig,
    /// By slot.
    servers: Vec<Sink>,
    clients: Vec<Sink>,
    /// Entity id, its slot, and the client controlling it (an index in `clients`).
    entities: Vec<(u64, u32, usize)>,
    next_request: u64,
    keep_replicas: bool,
}

/// What a [`WorldHarness`]'s passes counted (the world's metrics of the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassCounts {
    /// Cell updates encoded: one per cell, version sent from and codec, per pass
    /// (`spatial_cell_encodings`).
    pub encodings: u64,
    /// Due viewers held back because their window was full (`spatial_updates_coalesced`).
    pub held_back: u64,
    /// The same by reason (`spatial_updates_held_back`): each bound of the window at its
    /// `tickwire_fanout::Hold::index`, then the session's queue.
    pub held_back_by: [u64; HELD_BACK_REASONS],
    /// Cell snapshots queued to a viewer behind instead of a delta of its own
    /// (`spatial_catch_up_snapshots`).
    pub catch_up_snapshots: u64,
    /// Server frames that went out in one pass with the frame of the same server before them
    /// (`spatial_frames_merged`).
    pub frames_merged: u64,
    /// Passes a delivery dropped undelivered, having too many waiting
    /// (`spatial_delivery_passes_dropped`).
    pub passes_dropped: u64,
}

/// Why the harness could not be set up or driven, or a client could not read what it got.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("a client could not read what it was sent: {0}")]
    Read(String),
    #[error("the configuration: {0}")]
    Config(#[from] crate::ConfigError),
    #[error("the world: {0}")]
    World(#[from] ChannelConfigError),
    #[error("the configuration has no [spatial] layout")]
    NoLayout,
    #[error("{what} was refused: {message}")]
    Refused { what: &'static str, message: String },
}

fn v3(p: [f32; 3]) -> Option<Vec3> {
    Some(Vec3 { x: p[0], y: p[1], z: p[2] })
}

impl WorldHarness {
    /// The world of a gateway started with `overrides` (`--set` values, which must include a
    /// `[spatial]` layout), with a server registered in every slot, at `now`.
    pub fn new(overrides: &[String], now: Instant) -> Result<WorldHarness, HarnessError> {
        let config = crate::GatewayConfig::load(None, overrides)?;
        let layout: LayoutConfig = config.spatial.clone().ok_or(HarnessError::NoLayout)?;
        let slots = layout.servers[0] * layout.servers[1];
        let router = SpatialRouter::new(layout, &config, ChannelRouter::for_gateway(&config)?)?;
        let (world, _inbox) = router.world.lock().expect("not poisoned").take().expect("not started");
        let mut harness = WorldHarness {
            world,
            config,
            servers: Vec::new(),
            clients: Vec::new(),
            entities: Vec::new(),
            next_request: 1,
            keep_replicas: false,
        };
        for slot in 0..slots {
            let server = Sink::new(u64::from(slot) + 1, Role::Server, &harness.config);
            let req = RegisterServer { slot: Some(slot), observe_only: false };
            let id = harness.request_id();
            if let Some(r) = harness.world.register(&server.handle, req, id, now) {
                return Err(HarnessError::Refused { what: "a registration", message: r.error });
            }
            harness.servers.push(server);
        }
        Ok(harness)
    }

    fn request_id(&mut self) -> u64 {
        self.next_request += 1;
        self.next_request
    }

    /// Spawns an entity at `position` with `value_json`, controlled by a new client whose area
    /// of interest is a sphere of `radius` around it that follows it from cell to cell, with
    /// updates in the binary codec.
    pub fn spawn_player(
        &mut self,
        position: [f32; 3],
        value_json: &str,
        radius: f32,
        now: Instant,
    ) -> Result<u64, HarnessError> {
        self.spawn_player_in(position, value_json, radius, DeltaCodec::Binary, now)
    }

    /// [`WorldHarness::spawn_player`], with the client's updates in `codec`.
    pub fn spawn_player_in(
        &mut self,
        position: [f32; 3],
        value_json: &str,
        radius: f32,
        codec: DeltaCodec,
        now: Instant,
    ) -> Result<u64, HarnessError> {
        let options = SubscriptionOptions { codec: codec as i32, ..Default::default() };
        self.spawn_player_with(position, value_json, radius, options, now)
    }

    /// [`WorldHarness::spawn_player`], with the client's area set with `options`.
    pub fn spawn_player_with(
        &mut self,
        position: [f32; 3],
        value_json: &str,
        radius: f32,
        options: SubscriptionOptions,
        now: Instant,
    ) -> Result<u64, HarnessError> {
        let conn = 1_000_000 + self.clients.len() as u64;
        let mut client = Sink::new(conn, Role::Player, &self.config);
        let Some(cell) = self.world.layout.cell_of(position) else {
            return Err(HarnessError::Refused {
                what: "a spawn",
                message: format!("{position:?} is outside"),
            });
        };
        let slot = self.world.slot_of_cell(self.world.cell_index(cell));
        let req = SpawnEntity {
            position: v3(position),
            value_json: value_json.into(),
            controller_connection: conn,
        };
        let id = self.request_id();
        let r = self.world.spawn(&self.servers[slot as usize].handle, req, id);
        if r.status != Status::Ok as i32 {
            return Err(HarnessError::Refused { what: "a spawn", message: r.error });
        }
        let entity_id = SpawnResult::decode(r.body)
            .map_err(|e| HarnessError::Refused { what: "a spawn", message: e.to_string() })?
            .entity_id;
        let area = set_interest::Area::Sphere(Sphere { center: v3(position), radius });
        let req = SetInterest { area: Some(area), follow: Follow::Cell as i32, options: Some(options) };
        let id = self.request_id();
        let r = self.world.set_interest(&client.handle, req, id, now);
        if r.status != Status::Ok as i32 {
            return Err(HarnessError::Refused { what: "an area of interest", message: r.error });
        }
        self.entities.push((entity_id, slot, self.clients.len()));
        if self.keep_replicas {
            client.replicas = Some(HashMap::new());
        }
        self.clients.push(client);
        Ok(entity_id)
    }

    /// The entities spawned, in order.
    pub fn entity_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.entities.iter().map(|&(id, _, _)| id)
    }

    /// One frame of every server: each publishes all its entities, `state(entity_id)` giving
    /// each one's position and value; each publish is answered to its server, as the world's
    /// task does. The entities must stay in their spawn slot (no handovers here). Returns the
    /// entities the world ignored, or the first publish it refused.
    pub fn publish_frame(
        &mut self,
        mut state: impl FnMut(u64) -> ([f32; 3], String),
    ) -> Result<usize, HarnessError> {
        let mut ignored = 0;
        for slot in 0..self.servers.len() {
            let entities: Vec<EntityState> = self
                .entities
                .iter()
                .filter(|&&(_, s, _)| s as usize == slot)
                .map(|&(entity_id, _, _)| {
                    let (position, value_json) = state(entity_id);
                    EntityState { entity_id, position: v3(position), value_json, processed_seq: 0 }
                })
                .collect();
            let id = self.request_id();
            let server = &self.servers[slot];
            let r = self.world.publish(&server.handle, Publish { entities }, id);
            if r.status != Status::Ok as i32 {
                return Err(HarnessError::Refused { what: "a publish", message: r.error });
            }
            let result = tickwire_wire::proto::PublishResult::decode(r.body.clone())
                .map_err(|e| HarnessError::Refused { what: "a publish", message: e.to_string() })?;
            ignored += result.ignored.len();
            let _ = server.handle.respond(r);
        }
        Ok(ignored)
    }

    /// One fan-out pass at `now`, run on time; how many viewers got a message.
    pub fn tick(&mut self, now: Instant) -> u64 {
        self.world.tick(now, now)
    }

    /// One fan-out pass due at `scheduled` that runs at `now` (late, when `now` is later).
    pub fn tick_late(&mut self, scheduled: Instant, now: Instant) -> u64 {
        self.world.tick(scheduled, now)
    }

    /// The world's side of a pass due at `scheduled`: encoded and handed to the deliveries,
    /// but not delivered yet, as when the I/O threads get to it late. [`WorldHarness::deliver`]
    /// delivers what is waiting.
    pub fn pass_without_delivery(&mut self, scheduled: Instant) {
        self.world.post_pass(scheduled);
    }

    /// Delivers the passes waiting (in order) at `now`; how many viewers got a message.
    pub fn deliver(&mut self, now: Instant) -> u64 {
        self.world.inline.run(now)
    }

    /// Reads every session's outbox, as clients that keep up would, acknowledging each update
    /// at `now`. Returns the messages and bytes the clients (not the servers) received, or
    /// the first update a kept replica could not apply.
    pub fn drain(&mut self, now: Instant) -> Result<(u64, u64), HarnessError> {
        self.drain_clients(now, |_| true)
    }

    /// [`WorldHarness::drain`] for the servers and the clients for which `reads(index)` holds
    /// (index in spawn order); the others read nothing now, as clients that fell behind, and
    /// their windows fill.
    pub fn drain_clients(
        &mut self,
        now: Instant,
        mut reads: impl FnMut(usize) -> bool,
    ) -> Result<(u64, u64), HarnessError> {
        let schema = self.world.cells[0].state.schema().clone();
        for server in &mut self.servers {
            server.drain(now, &schema)?;
        }
        let (mut messages, mut bytes) = (0, 0);
        for (_, client) in self.clients.iter_mut().enumerate().filter(|&(i, _)| reads(i)) {
            let (m, b) = client.drain(now, &schema)?;
            messages += m;
            bytes += b;
        }
        Ok((messages, bytes))
    }

    /// Clients spawned from now on keep a replica of each cell in view, built from what they
    /// read (off by default: it costs the bench's loop time).
    pub fn keep_replicas(&mut self) {
        self.keep_replicas = true;
    }

    /// Whether every client keeping replicas holds one of each cell in its view and no other,
    /// each equal to its cell: a message naming the first that does not, if any.
    pub fn replicas_differ(&self) -> Option<String> {
        for (i, client) in self.clients.iter().enumerate() {
            let Some(replicas) = &client.replicas else { continue };
            let mut in_view: Vec<u64> = self
                .world
                .viewers
                .get(&client.handle.conn_id())
                .map(|v| v.cells().map(|c| CELL_BASE + u64::from(c)).collect())
                .unwrap_or_default();
            let mut held: Vec<u64> = replicas.keys().copied().collect();
            in_view.sort_unstable();
            held.sort_unstable();
            if in_view != held {
                return Some(format!("client {i}: replicas of cells {held:?}, cells in view {in_view:?}"));
            }
            for (&channel, replica) in replicas {
                let cell = &self.world.cells[(channel - CELL_BASE) as usize].state;
                if replica.version() != cell.version() || Some(replica.value()) != cell.get(&[]).ok() {
                    return Some(format!(
                        "client {i}, cell {channel}: replica at version {}, cell at {}",
                        replica.version(),
                        cell.version()
                    ));
                }
            }
        }
        None
    }

    /// What the passes counted so far.
    pub fn counts(&self) -> PassCounts {
        let f = &self.world.figures;
        PassCounts {
            encodings: f.encodings.load(Ordering::Relaxed),
            held_back: f.coalesced.load(Ordering::Relaxed),
            held_back_by: std::array::from_fn(|i| f.held_back[i].load(Ordering::Relaxed)),
            catch_up_snapshots: f.catch_up_snapshots.load(Ordering::Relaxed),
            frames_merged: f.frames_merged.load(Ordering::Relaxed),
            passes_dropped: f.passes_dropped.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A 6×6 world of 20 m cells over 2×2 servers, every server registered at `start`.
    fn small_world(start: Instant) -> WorldHarness {
        let overrides = ["spatial.cell_size=20.0", "spatial.cells=[6, 6]", "spatial.servers=[2, 2]"];
        WorldHarness::new(&overrides.map(String::from), start).expect("a harness")
    }

    #[test]
    fn every_client_gets_one_message_per_pass_after_a_frame() {
        let start = Instant::now();
        let mut h = small_world(start);
        let mut spawned = std::collections::HashMap::new();
        for i in 0..40 {
            let at = [5.0 + (i % 10) as f32 * 11.0, 0.0, 5.0 + (i / 10) as f32 * 27.0];
            spawned.insert(h.spawn_player(at, r#"{"yaw": 0.5}"#, 30.0, start).expect("spawned"), at);
        }
        let mut now = start;
        // The first pass gives every viewer its snapshots (the 4 servers see their blocks);
        // every later one a delta.
        for frame in 1..=3 {
            let ignored = h
                .publish_frame(|id| {
                    let at = spawned[&id];
                    ([at[0] + frame as f32 * 0.1, 0.0, at[2]], format!(r#"{{"yaw": {frame}}}"#))
                })
                .expect("published");
            assert_eq!(ignored, 0, "every entity is its server's");
            now += Duration::from_millis(20);
            assert_eq!(h.tick(now), 44, "frame {frame}: every viewer changed");
            let (messages, bytes) = h.drain(now).expect("read");
            assert_eq!(messages, 40, "frame {frame}: one message per client");
            assert!(bytes > 40 * 10, "frame {frame}: {bytes} bytes");
        }
        now += Duration::from_millis(20);
        assert_eq!(h.tick(now), 0, "nothing changed, nothing sent");
        assert_eq!(h.drain(now).expect("read").0, 0);
        // Frame 3's values published again change nothing either (docs/protocol.md 13.4).
        h.publish_frame(|id| {
            let at = spawned[&id];
            ([at[0] + 0.3, 0.0, at[2]], r#"{"yaw": 3}"#.into())
        })
        .expect("published");
        now += Duration::from_millis(20);
        assert_eq!(h.tick(now), 0, "the same values again: nothing sent");
        // A value that does not fit the schema is refused, not counted as ignored.
        let refused = h.publish_frame(|id| (spawned[&id], r#"{"yaw": "north"}"#.into()));
        assert!(matches!(refused, Err(HarnessError::Refused { what: "a publish", .. })), "{refused:?}");
    }

    #[test]
    fn frames_of_a_server_between_two_passes_after_the_first_count_as_merged() {
        let start = Instant::now();
        let mut h = small_world(start);
        let at = [5.0, 0.0, 5.0];
        h.spawn_player(at, r#"{"yaw": 0.5}"#, 30.0, start).expect("spawned");
        let frame = |h: &mut WorldHarness, yaw: u32| {
            h.publish_frame(|_| (at, format!(r#"{{"yaw": {yaw}}}"#))).expect("published")
        };
        frame(&mut h, 1);
        h.tick(start + Duration::from_millis(20));
        assert_eq!(h.counts().frames_merged, 0, "one frame per server and pass");
        for yaw in 2..=4 {
            frame(&mut h, yaw);
        }
        h.tick(start + Duration::from_millis(40));
        // Each of the 4 servers published 3 frames since the last pass: 2 merged each (3 of
        // them own no entity; their empty publishes count too).
        assert_eq!(h.counts().frames_merged, 8);
        h.tick(start + Duration::from_millis(60));
        assert_eq!(h.counts().frames_merged, 8, "a pass with no frame merges none");
    }

    #[test]
    fn a_pass_that_runs_late_does_not_make_the_next_one_skip_a_client() {
        let start = Instant::now();
        let ms = Duration::from_millis(1);
        let mut h = small_world(start);
        let at = [5.0, 0.0, 5.0];
        assert_eq!(h.tick(start), 4, "the servers' first pass: a snapshot each");
        // The client joins 1 ms into the first tick, so it is due 1 ms after each pass's due
        // instant, and a frame comes before every pass.
        h.spawn_player(at, r#"{"yaw": 0}"#, 30.0, start + ms).expect("spawned");
        let mut served = Vec::new();
        // The pass due at 80 ms runs at 95 ms. Had the schedule run on the clock, the client
        // would next be due at 115 ms, and the pass at 100 ms would skip it. Every client reads
        // and acknowledges each pass's updates as it ends, so no window holds one back.
        for (yaw, (due, ran)) in
            [(20, 20), (40, 40), (60, 60), (80, 95), (100, 100), (120, 120)].into_iter().enumerate()
        {
            h.publish_frame(|_| (at, format!(r#"{{"yaw": {yaw}}}"#))).expect("published");
            served.push(h.tick_late(start + ms * due, start + ms * ran));
            h.drain(start + ms * ran).expect("every update applies");
        }
        // Each pass: the client and the server whose block holds its entity.
        assert_eq!(served, [2; 6]);
    }

    #[test]
    fn a_client_with_a_long_interval_gets_one_merged_update_per_interval() {
        let start = Instant::now();
        let ms = Duration::from_millis(1);
        let mut h = small_world(start);
        h.keep_replicas();
        // Two clients in one cell: one at the default interval (a pass, 20 ms), one at 200 ms
        // (as `lofi`), joined 1 ms in.
        let (fast, slow) = ([5.0, 0.0, 5.0], [8.0, 0.0, 5.0]);
        h.spawn_player(fast, r#"{"yaw": 0}"#, 5.0, start).expect("spawned");
        let lofi = SubscriptionOptions { fanout_interval_ms: 200, ..Default::default() };
        h.spawn_player_with(slow, r#"{"yaw": 0}"#, 5.0, lofi, start + ms).expect("spawned");
        let first: u64 = h.entity_ids().next().expect("spawned");
        let mut got: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
        // A second of frames, each changing both entities, a pass after each.
        for frame in 1..=50u32 {
            let at = |id: u64| if id == first { fast } else { slow };
            h.publish_frame(|id| (at(id), format!(r#"{{"yaw": {frame}}}"#))).expect("published");
            let now = start + ms * (20 * frame);
            h.tick(now);
            for (client, got) in got.iter_mut().enumerate() {
                let (messages, _) = h.drain_clients(now, |i| i == client).expect("every update applies");
                got.extend((0..messages).map(|_| 20 * frame));
            }
        }
        assert_eq!(got[0], (1..=50).map(|f| 20 * f).collect::<Vec<_>>(), "one update a pass");
        // The first at the first pass after the join (20 ms), then one every 200 ms: the due
        // time counts from the previous due time (1 ms in), and each pass serves those due.
        assert_eq!(got[1], [20, 220, 420, 620, 820], "one merged update per 200 ms");
        // Every update applied to the slow client's replica: each was a delta from what it held.
        h.tick(start + ms * 1020);
        h.drain(start + ms * 1020).expect("every update applies");
        assert_eq!(h.replicas_differ(), None);
    }

    /// A world whose 12 clients (each seeing a 30 m sphere) keep replicas, with a frame
    /// changing every entity published before each of `passes` passes, the world's side of
    /// each due 20 ms apart from `start`, none delivered yet.
    fn passes_waiting(passes: u32) -> (WorldHarness, Instant) {
        let start = Instant::now();
        let mut h = small_world(start);
        h.keep_replicas();
        let mut spawned = HashMap::new();
        for i in 0..12 {
            // Two rows, both in the blocks of servers 0 and 1.
            let at = [5.0 + (i % 6) as f32 * 19.0, 0.0, 5.0 + (i / 6) as f32 * 50.0];
            spawned.insert(h.spawn_player(at, r#"{"yaw": 0}"#, 30.0, start).expect("spawned"), at);
        }
        let ms = Duration::from_millis(1);
        for pass in 1..=passes {
            h.publish_frame(|id| (spawned[&id], format!(r#"{{"yaw": {pass}}}"#))).expect("published");
            h.pass_without_delivery(start + ms * (20 * pass));
        }
        (h, start)
    }

    #[test]
    fn a_delivery_that_runs_late_delivers_the_passes_waiting_in_order() {
        let (mut h, start) = passes_waiting(3);
        let now = start + Duration::from_millis(65);
        // Every viewer was due at each of the 3 passes: the first gives the 12 clients and the
        // 4 servers their snapshots, the others a delta to the clients and the 2 servers whose
        // blocks hold the entities.
        assert_eq!(h.deliver(now), 16 + 2 * 14);
        let (messages, _) = h.drain(now).expect("every update applies, in order");
        assert_eq!(messages, 3 * 12, "a message per client per pass");
        assert_eq!(h.replicas_differ(), None);
        assert_eq!(h.counts().passes_dropped, 0);
    }

    #[test]
    fn passes_past_what_a_delivery_holds_are_dropped_and_their_changes_merge_into_the_next() {
        let (mut h, start) = passes_waiting(11);
        let now = start + Duration::from_millis(225);
        // 8 passes wait at most; the 3 oldest went, the snapshots of the first among them.
        assert_eq!(h.counts().passes_dropped, 3);
        // So the 8 left have nothing a client can apply: nothing is sent, and the snapshots are
        // asked for ...
        assert_eq!(h.deliver(now), 0);
        assert_eq!(h.drain(now).expect("read").0, 0);
        // ... and come with the next pass.
        let later = start + Duration::from_millis(240);
        h.tick(later);
        h.drain(later).expect("every update applies");
        assert_eq!(h.replicas_differ(), None);
    }

    #[test]
    fn a_new_client_due_after_the_pass_that_encoded_its_snapshots_gets_them_all_at_once() {
        let start = Instant::now();
        let ms = Duration::from_millis(1);
        let mut h = small_world(start);
        h.keep_replicas();
        h.spawn_player([5.0, 0.0, 5.0], r#"{"yaw": 0}"#, 5.0, start).expect("spawned");
        // The pass due at 20 ms runs at 22 ms and encodes the snapshots of the cells of two
        // new clients, neither due at it: one joined at 1 ms with a 30 ms delay, the other at
        // 21 ms, after the pass's due instant. Both are first due at the pass at 40 ms, which
        // would encode no snapshot of its own.
        let delayed = SubscriptionOptions { fanout_delay_ms: 30, ..Default::default() };
        h.spawn_player_with([30.0, 0.0, 30.0], r#"{"yaw": 0}"#, 25.0, delayed, start + ms).expect("spawned");
        h.spawn_player([90.0, 0.0, 90.0], r#"{"yaw": 0}"#, 25.0, start + ms * 21).expect("spawned");
        let new = |i: usize| i > 0;
        h.tick_late(start + ms * 20, start + ms * 22);
        assert_eq!(h.drain_clients(start + ms * 22, new).expect("read").0, 0, "not due yet");
        h.tick(start + ms * 40);
        assert_eq!(h.drain_clients(start + ms * 40, new).expect("read").0, 2, "a message each");
        // Each held every cell in view: the replicas match.
        h.drain(start + ms * 40).expect("read");
        assert_eq!(h.replicas_differ(), None);
    }

    /// 40 clients on a 6×6 world, their entities two by two in 20 cells, one in three reading
    /// JSON updates and the others binary ones. One client in four
    /// reads once every 20 passes (400 ms: its window fills and holds updates back), in 10
    /// phases, so they fall behind from different versions. Every frame publishes
    /// `value(frame, i)` for every entity (`i` in spawn order). Checks that every update read
    /// applies to the client's replica of its cell, and that once everyone reads, every client
    /// holds a replica of each cell in its view, equal to the cell. Returns what the passes
    /// counted.
    fn clients_behind(value: impl Fn(usize, usize) -> String) -> PassCounts {
        let start = Instant::now();
        let mut h = small_world(start);
        h.keep_replicas();
        let mut spawned = std::collections::HashMap::new();
        // Two by two: each of the 20 cells with an entity holds two.
        for i in 0..40 {
            let x = 5.0 + (i % 10 / 2) as f32 * 20.0 + (i % 2) as f32 * 8.0;
            let at = [x, 0.0, 5.0 + (i / 10) as f32 * 27.0];
            let codec = if i % 3 == 0 { DeltaCodec::Json } else { DeltaCodec::Binary };
            let id = h.spawn_player_in(at, &value(0, i), 30.0, codec, start).expect("spawned");
            spawned.insert(id, (at, i));
        }
        let reads = |frame: usize| move |i: usize| !i.is_multiple_of(4) || (frame + i / 4).is_multiple_of(20);
        let mut now = start;
        for frame in 1..=100usize {
            h.publish_frame(|id| (spawned[&id].0, value(frame, spawned[&id].1))).expect("published");
            now += Duration::from_millis(20);
            h.tick(now);
            h.drain_clients(now, reads(frame)).expect("every update applies to its replica");
        }
        let counts = h.counts();
        assert!(counts.held_back > 0, "the clients behind were held back: {counts:?}");
        // Reading every 400 ms, these clients show a low delivery rate: their windows hold by
        // bytes. Their sessions' queues never refuse an update.
        assert!(counts.held_back_by[tickwire_fanout::Hold::Bytes.index()] > 0, "{counts:?}");
        assert_eq!(counts.held_back_by[super::super::HELD_BACK_QUEUE], 0, "{counts:?}");
        for _ in 0..3 {
            now += Duration::from_millis(20);
            h.tick(now);
            h.drain(now).expect("every update applies to its replica");
        }
        assert_eq!(h.replicas_differ(), None);
        // And the check sees a replica that has not read the latest pass.
        h.publish_frame(|id| (spawned[&id].0, value(1000, spawned[&id].1))).expect("published");
        h.tick(now + Duration::from_millis(20));
        assert!(h.replicas_differ().is_some());
        counts
    }

    #[test]
    fn clients_behind_get_the_snapshot_of_a_cell_whose_every_entity_changed() {
        // Every entity changes every frame: a delta is about a snapshot's size.
        let counts = clients_behind(|frame, _| {
            let f = frame as f32;
            format!(r#"{{"pos": [{f}, {}, 1.5], "yaw": {}, "data": "d{frame}"}}"#, f * 0.5, f * 0.01)
        });
        assert!(counts.catch_up_snapshots > 0, "{counts:?}");
    }

    #[test]
    fn clients_behind_get_the_snapshot_of_a_cell_whose_every_entity_moved() {
        // The B3 bots' shape: every entity moves every frame, its other fields stay. Only the
        // position is sent (docs/protocol.md 13.4), so a delta is under 3/4 of a snapshot's
        // size but over half of it: a viewer behind would need a delta of its own nearly as
        // large as the snapshot that every viewer behind shares.
        let counts = clients_behind(|frame, i| {
            let f = frame as f32;
            format!(r#"{{"pos": [{f}, 0, {}], "yaw": 1.25, "data": "bot-{i:04}-run"}}"#, f * 0.5)
        });
        assert!(counts.catch_up_snapshots > 0, "{counts:?}");
    }

    #[test]
    fn clients_behind_get_a_merged_delta_of_a_cell_that_changed_a_little() {
        // One entity in eight changes each frame, never both of a cell's two; the others publish
        // their position only (an empty value), which changes nothing: a delta is well under
        // half the cell's snapshot (about a fifth).
        let counts = clients_behind(|frame, i| {
            if frame == 0 || (frame + i).is_multiple_of(8) {
                format!(r#"{{"yaw": {}, "data": "{}"}}"#, frame % 6, "x".repeat(50))
            } else {
                String::new()
            }
        });
        assert_eq!(counts.catch_up_snapshots, 0, "{counts:?}");
    }
}
