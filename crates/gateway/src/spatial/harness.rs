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
    ChannelEvent, ChannelUpdates, DeltaCodec, EntityState, Follow, LodBand, Publish, RegisterServer,
    Response, SetInterest, SpawnEntity, SpawnResult, Sphere, Status, SubscriptionOptions, Vec3, envelope,
    set_interest,
};
use tokio::sync::mpsc;

use super::world::{CellState, World};
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
    /// It has level-of-detail bands: each update it reads is checked to bring, with a cell past
    /// an entity's leaving, the cell in view it went to past its arrival.
    banded: bool,
}

impl Sink {
    fn new(conn_id: u64, role: Role, config: &crate::GatewayConfig) -> Sink {
        let (handle, outbox) = SessionHandle::unattached(conn_id, role, config);
        Sink { handle, outbox, seq: 0, replicas: None, banded: false }
    }

    /// Applies a message read to the replicas, if kept; `cells` are the world's, for their
    /// moves.
    fn apply(
        &mut self,
        message: Bytes,
        schema: &Arc<Schema>,
        cells: &[CellState],
    ) -> Result<(), HarnessError> {
        let Some(replicas) = self.replicas.as_mut() else { return Ok(()) };
        let Ok(envelope::Kind::Push(push)) = decode_envelope(message) else {
            return Err(HarnessError::Read("a message that is not a push".into()));
        };
        match push.topic.as_str() {
            "channel.updates" => {
                let batch = ChannelUpdates::decode(push.body)
                    .map_err(|e| HarnessError::Read(format!("channel.updates: {e}")))?;
                // (cell, the version held before) of each cell held before the update.
                let mut before = Vec::new();
                for u in batch.updates {
                    let replica =
                        replicas.entry(u.channel_id).or_insert_with(|| Replica::new(schema.clone()));
                    if replica.version() > 0 {
                        before.push((u.channel_id, replica.version()));
                    }
                    replica
                        .apply_codec(state_codec(u.codec()), &u.update)
                        .map_err(|e| HarnessError::Read(format!("cell {}: {e}", u.channel_id)))?;
                }
                if self.banded {
                    both_sides_of_each_move(replicas, &before, cells)?;
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
    fn drain(
        &mut self,
        now: Instant,
        schema: &Arc<Schema>,
        cells: &[CellState],
    ) -> Result<(u64, u64), HarnessError> {
        let (mut messages, mut bytes) = (0, 0);
        let flow = self.handle.flow.clone();
        let mut window = flow.lock();
        while let Ok(item) = self.outbox.try_recv() {
            let item = self.handle.signals.took(item);
            self.seq += 1;
            messages += 1;
            let message = match item {
                Outgoing::Message(m) | Outgoing::Answer(m) => m,
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
            self.apply(message, schema, cells)?;
        }
        window.acked(now, self.seq);
        Ok((messages, bytes))
    }
}

/// Every entity that left a cell `before` lists, as of the version the update brought it to,
/// for a cell `replicas` hold: that cell is at or past its arrival (docs/protocol.md 14.4).
/// Moves the world's log no longer reaches are not checked.
fn both_sides_of_each_move(
    replicas: &HashMap<u64, Replica>,
    before: &[(u64, u64)],
    cells: &[CellState],
) -> Result<(), HarnessError> {
    for &(channel, held) in before {
        let now = replicas[&channel].version();
        let Some(moves) = cells[(channel - CELL_BASE) as usize].moves.since(held, now) else { continue };
        for m in moves {
            let to = CELL_BASE + u64::from(m.to);
            match replicas.get(&to) {
                Some(replica) if replica.version() < m.arrived_at => {
                    return Err(HarnessError::MoveTorn(format!(
                        "cell {channel} went from version {held} to {now}, past an entity's leaving \
                         at {}, and cell {to}, which it went to, stayed at {} of {}",
                        m.left_at,
                        replica.version(),
                        m.arrived_at
                    )));
                }
                _ => {}
            }
        }
    }
    Ok(())
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
    #[error("an update showed one side of a move: {0}")]
    MoveTorn(String),
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
            let refused = |r: Response| HarnessError::Refused { what: "a registration", message: r.error };
            let mut reply = server.handle.reply(id).map_err(refused)?;
            if let Some(r) = harness.world.register(&server.handle, req, &mut reply, now) {
                return Err(refused(r));
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
        self.spawn_player_lod(position, value_json, radius, options, Vec::new(), now)
    }

    /// [`WorldHarness::spawn_player_with`], with level-of-detail bands `lod`.
    pub fn spawn_player_lod(
        &mut self,
        position: [f32; 3],
        value_json: &str,
        radius: f32,
        options: SubscriptionOptions,
        lod: Vec<LodBand>,
        now: Instant,
    ) -> Result<u64, HarnessError> {
        let conn = 1_000_000 + self.clients.len() as u64;
        let mut client = Sink::new(conn, Role::Player, &self.config);
        let (entity_id, slot) = self.spawn_entity(position, value_json, conn)?;
        let area = set_interest::Area::Sphere(Sphere { center: v3(position), radius });
        let banded = !lod.is_empty();
        let req = SetInterest { area: Some(area), follow: Follow::Cell as i32, options: Some(options), lod };
        let id = self.request_id();
        let r = self.world.set_interest(&client.handle, req, id, now);
        if r.status != Status::Ok as i32 {
            return Err(HarnessError::Refused { what: "an area of interest", message: r.error });
        }
        self.entities.push((entity_id, slot, self.clients.len()));
        if self.keep_replicas {
            client.banded = banded;
            client.replicas = Some(HashMap::new());
        }
        self.clients.push(client);
        Ok(entity_id)
    }

    /// Spawns another entity at `position`, controlled by client `index` (in spawn order),
    /// without changing its area.
    pub fn spawn_for(
        &mut self,
        index: usize,
        position: [f32; 3],
        value_json: &str,
    ) -> Result<u64, HarnessError> {
        let conn = self.clients[index].handle.conn_id();
        let (entity_id, slot) = self.spawn_entity(position, value_json, conn)?;
        self.entities.push((entity_id, slot, index));
        Ok(entity_id)
    }

    /// The server of `position`'s slot spawns an entity there for controller `conn`: its id
    /// and slot.
    fn spawn_entity(
        &mut self,
        position: [f32; 3],
        value_json: &str,
        conn: u64,
    ) -> Result<(u64, u32), HarnessError> {
        let cell = self.world.layout.cell_of(position).ok_or_else(|| HarnessError::Refused {
            what: "a spawn",
            message: format!("{position:?} is outside"),
        })?;
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
        Ok((entity_id, slot))
    }

    /// The cells client `index` sees, as the world last set them (sorted).
    #[cfg(test)]
    pub fn view_cells(&self, index: usize) -> Vec<u32> {
        let conn = self.clients[index].handle.conn_id();
        self.world.viewers.get(&conn).map(|v| v.cells.clone()).unwrap_or_default()
    }

    /// The level-of-detail interval of each cell client `index` sees, as the world last set
    /// them (in the order of [`WorldHarness::view_cells`]; empty without bands).
    #[cfg(test)]
    pub fn view_intervals(&self, index: usize) -> Vec<std::time::Duration> {
        let conn = self.clients[index].handle.conn_id();
        self.world.viewers.get(&conn).map(|v| v.intervals().to_vec()).unwrap_or_default()
    }

    /// Cell `cell`'s version in the world.
    #[cfg(test)]
    pub fn cell_version(&self, cell: u32) -> u64 {
        self.world.cells[cell as usize].state.version()
    }

    /// The version of each cell replica client `index` keeps (with
    /// [`WorldHarness::keep_replicas`]), by channel id.
    #[cfg(test)]
    pub fn replica_versions(&self, index: usize) -> HashMap<u64, u64> {
        let replicas = self.clients[index].replicas.iter().flatten();
        replicas.map(|(&channel, replica)| (channel, replica.version())).collect()
    }

    /// The entities in the cell replicas client `index` keeps (with
    /// [`WorldHarness::keep_replicas`]): what its client shows.
    #[cfg(test)]
    pub fn replica_entities(&self, index: usize) -> std::collections::BTreeSet<u64> {
        use tickwire_state::{Key, Value};
        let replicas = self.clients[index].replicas.iter().flatten();
        let maps = replicas.filter_map(|(_, replica)| match replica.value() {
            Value::Struct(mut fields) if !fields.is_empty() => match fields.swap_remove(0) {
                Value::Map(map) => Some(map),
                _ => None,
            },
            _ => None,
        });
        let keys = maps.flat_map(|map| map.into_keys());
        keys.filter_map(|key| match key {
            Key::Int(id) => u64::try_from(id).ok(),
            _ => None,
        })
        .collect()
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
            // The answer, as the world gives it: in a place of the server's outbox.
            let no_room = |r: Response| HarnessError::Refused { what: "an answer", message: r.error };
            server.handle.reply(id).map_err(no_room)?.send(r);
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
        self.world.inline.run(now).sent
    }

    /// Client `index` (in spawn order) sends `spatial.interest` with `req` at `now`; the world's
    /// answer.
    pub fn set_interest(
        &mut self,
        index: usize,
        req: SetInterest,
        now: Instant,
    ) -> tickwire_wire::proto::Response {
        let id = self.request_id();
        let banded = !req.lod.is_empty();
        let answer = self.world.set_interest(&self.clients[index].handle, req, id, now);
        if answer.status == tickwire_wire::proto::Status::Ok as i32 && self.clients[index].replicas.is_some()
        {
            self.clients[index].banded = banded;
        }
        answer
    }

    /// Client `index`'s session ends: its outbox closes, so what is offered to it fails. The
    /// world hears of it only through the world's own delivery.
    pub fn close_client(&mut self, index: usize) {
        self.clients[index].outbox.close();
    }

    /// How many viewers (servers included) the world and its own delivery each hold.
    #[cfg(test)]
    fn viewers(&self) -> (usize, usize) {
        (self.world.viewers.len(), self.world.inline.viewer_count())
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
        let cells = &self.world.cells;
        for server in &mut self.servers {
            server.drain(now, &schema, cells)?;
        }
        let (mut messages, mut bytes) = (0, 0);
        for (_, client) in self.clients.iter_mut().enumerate().filter(|&(i, _)| reads(i)) {
            let (m, b) = client.drain(now, &schema, cells)?;
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
mod lod_tests;
#[cfg(test)]
mod tests;
