//! The spatial world's state, on one task: the cells (one state tree each, holding the entities
//! in the cell), the spatial servers in their slots, and every entity with its owner and the
//! route of its messages. Servers publish their entities; when a publish moves an entity into
//! another server's cell, the world hands it over (release by the old owner, acquire by the new
//! one, `tickwire_spatial::handover::Route` keeping its messages in order). This file holds the
//! world and its servers; what entities do (spawn, publish, handover, messages) is
//! `world/entities.rs`, and what clients see of the cells is `view.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
// foldhash (seeded per process), not SipHash: every publish and pass looks entities and viewers
// up. Entity, viewer and server keys are ids the gateway hands out; `controlled` is keyed by the
// controller connection a spatial server names, which only an authenticated server can choose,
// and there are at most `max_entities` of those.
use hashbrown::{HashMap, HashSet};
use prost::Message;
use tickwire_spatial::handover::Route;
use tickwire_spatial::{Cell, Layout};
use tickwire_state::{PreparedCache, Schema, State, Version};
use tickwire_wire::proto::{
    CellInfo, RegisterResult, RegisterServer, Response, SpatialEvent, SpatialEventKind, Status, Vec3,
};

use super::delivery::{Delivery, Mailbox};
use super::moves::MoveLog;
use super::view::Viewer;
use super::{CELL_BASE, SpatialFigures, SpatialSettings};
use crate::router::{Reply, SessionHandle, error_response};

mod acquires;
mod entities;

/// Root field of a cell's state: the map of entity id to entity value.
pub(super) const ENTITIES_FIELD: u16 = 0;

pub(super) struct CellState {
    pub state: State,
    /// The version before the state's latest change, sealed by a pass: what a viewer that
    /// keeps up holds until its next update.
    pub previous: Version,
    /// Per codec (`frame::codec_index`): the length of the cell's latest snapshot entry encoded
    /// (0: none yet), whatever version it was of. A guide for sending a viewer behind the
    /// snapshot instead of a delta of its own (`frame::base_for`): a cell's size moves slowly,
    /// and a wrong guess sends one of two valid updates where the other would have been smaller.
    pub snapshot_len: [usize; 2],
    /// Per codec: the length of the cell's delta entry from `previous` (its latest change), with
    /// the `previous` it was encoded from; valid only while that is still `previous`.
    pub latest_len: [(Version, usize); 2],
    pub cache: PreparedCache,
    pub entities: HashSet<u64>,
    /// Where the entities that left the cell lately went (`moves.rs`), shared with the passes.
    pub moves: Arc<MoveLog>,
}

/// A message for an entity, as it waits in its route.
#[derive(Debug, Clone)]
pub(super) struct EntityMsg {
    from: u64,
    body: Bytes,
}

impl EntityMsg {
    /// About what it takes in an acquire: its body and `EntityMessage`'s other fields.
    pub fn weight(&self) -> usize {
        self.body.len() + 32
    }
}

pub(super) struct Entity {
    pub cell: u32,
    pub position: [f32; 3],
    /// The last value published, as JSON: what a new owner is given.
    value: String,
    route: Route<EntityMsg>,
    /// The slot of the server that owns the entity (or will, once one registers in it).
    owner_slot: u32,
    pub controller: u64,
    /// The controller's session, once the world has seen it (a message to the entity, or an
    /// area of interest): servers reach the controller through it.
    pub controller_session: Option<SessionHandle>,
    /// The slot a handover under way goes to.
    handing_to: Option<u32>,
    /// The handover id of its ACQUIRE while that waits for room in the new owner's outbox
    /// (`world/acquires.rs`): meanwhile messages to it join that ACQUIRE and it is not handed
    /// on.
    acquire_waits: Option<u64>,
}

pub(super) struct World {
    pub layout: Layout,
    pub settings: SpatialSettings,
    pub cells: Vec<CellState>,
    /// The server in each slot (`column + row * servers_x`).
    slots: Vec<Option<SessionHandle>>,
    /// Connection id of each registered server → its slot (`None`: an observer).
    servers: HashMap<u64, Option<u32>>,
    observers: Vec<SessionHandle>,
    pub entities: HashMap<u64, Entity>,
    /// Connection id of a controller → the entities it controls. Ids only grow, so the set's
    /// order is the order they were spawned in, and its last is the latest, the one an area
    /// is centred on (`set_interest`, `follow`). An entry goes when its last entity is
    /// despawned or when the controller's session ends (so that the end reaches every one of
    /// them); a spawn handled after that end (servers' and players' requests travel in
    /// different inboxes) makes an entry that stays until its entities are despawned, bounded
    /// by `max_entities`.
    pub controlled: HashMap<u64, BTreeSet<u64>>,
    /// Sessions that have set an area of interest, by connection id: an entity spawned for one
    /// of them as controller gets its session at once (a server's messages reach it). Its
    /// entities spawned before are given it at its first `spatial.interest` only, so that later
    /// ones do not scan every entity.
    pub controller_sessions: HashMap<u64, SessionHandle>,
    next_entity: u64,
    pub viewers: HashMap<u64, Viewer>,
    /// Per cell, per codec (`frame::codec_index`): how many viewers see it.
    pub view_count: Vec<[u32; 2]>,
    /// Cells (and codec) whose snapshot the next pass encodes: a viewer entered them or their
    /// band got faster (`view.rs`), or an entity moved into them while a viewer's band holds
    /// them back (`World::log_moves`).
    pub wanted: HashSet<(u32, usize)>,
    /// Per cell, per codec: how many viewers' level of detail holds it back (an interval above
    /// 0).
    pub held_back_count: Vec<[u32; 2]>,
    /// (from, to) of each entity that moved from one cell to another since the last pass,
    /// each pair once: the pass logs them in the cells' [`MoveLog`]s at the versions it seals.
    pub moves_since_pass: HashSet<(u32, u32)>,
    /// With `channels.spatial_delivery = "io_threads"`, the delivery of each I/O thread that
    /// has viewers, by thread (`delivery.rs`).
    pub deliveries: HashMap<usize, Arc<Mailbox>>,
    /// The world's own delivery, run at the end of each pass: every viewer's by default, and
    /// those of sessions on no I/O thread.
    pub inline: Delivery,
    /// Bumped whenever any cell changes: a viewer holding it has nothing to receive.
    pub world_version: u64,
    pub cell_schema_json: Arc<str>,
    pub entity_schema_json: Arc<str>,
    pub figures: Arc<SpatialFigures>,
    /// Publishes of each slot since the last pass; those beyond the first are counted in
    /// `spatial_frames_merged`.
    pub publishes_since_pass: Vec<u32>,
    /// Per slot, the ACQUIREs waiting for room in its server's outbox, in order.
    acquires_waiting: Vec<std::collections::VecDeque<acquires::Waiting>>,
    /// Entities whose RELEASE waits for room in their owner's outbox: asked again each pass.
    releases_put_off: HashSet<u64>,
}

fn ok(id: u64, body: Bytes) -> Response {
    Response { id, status: Status::Ok as i32, body, error: String::new() }
}

fn vec3(v: Option<Vec3>) -> [f32; 3] {
    v.map_or([0.0; 3], |v| [v.x, v.y, v.z])
}

fn to_vec3(p: [f32; 3]) -> Option<Vec3> {
    Some(Vec3 { x: p[0], y: p[1], z: p[2] })
}

impl World {
    pub fn new(
        layout: Layout,
        settings: SpatialSettings,
        cell_schema: Arc<Schema>,
        cell_schema_json: Arc<str>,
        entity_schema_json: Arc<str>,
        figures: Arc<SpatialFigures>,
    ) -> World {
        let limits = settings.limits;
        let cell_count = layout.cell_count() as usize;
        let cells = (0..layout.cell_count())
            .map(|_| CellState {
                state: State::with_limits(cell_schema.clone(), limits),
                previous: 0,
                snapshot_len: [0; 2],
                latest_len: [(0, 0); 2],
                cache: PreparedCache::default(),
                entities: HashSet::new(),
                moves: Arc::default(),
            })
            .collect();
        let [sx, sz] = layout.config().servers;
        World {
            slots: vec![None; (sx * sz) as usize],
            publishes_since_pass: vec![0; (sx * sz) as usize],
            acquires_waiting: (0..sx * sz).map(|_| Default::default()).collect(),
            releases_put_off: HashSet::new(),
            layout,
            settings,
            cells,
            servers: HashMap::new(),
            observers: Vec::new(),
            entities: HashMap::new(),
            controlled: HashMap::new(),
            controller_sessions: HashMap::new(),
            next_entity: 0,
            view_count: vec![[0; 2]; cell_count],
            wanted: HashSet::new(),
            held_back_count: vec![[0; 2]; cell_count],
            moves_since_pass: HashSet::new(),
            deliveries: HashMap::new(),
            inline: Delivery::new(figures.clone(), settings.tick),
            viewers: HashMap::new(),
            world_version: 1,
            cell_schema_json,
            entity_schema_json,
            figures,
        }
    }

    pub fn cell_index(&self, cell: Cell) -> u32 {
        cell[1] * self.layout.config().cells[0] + cell[0]
    }

    pub fn cell_at(&self, index: u32) -> Cell {
        let w = self.layout.config().cells[0];
        [index % w, index / w]
    }

    pub fn cell_info(&self, index: u32) -> CellInfo {
        let [column, row] = self.cell_at(index);
        CellInfo { channel_id: CELL_BASE + u64::from(index), column, row }
    }

    pub(super) fn slot_of_cell(&self, index: u32) -> u32 {
        let [c, r] = self.layout.server_of(self.cell_at(index));
        r * self.layout.config().servers[0] + c
    }

    fn live_server(&self, slot: u32) -> Option<&SessionHandle> {
        self.slots.get(slot as usize)?.as_ref()
    }

    /// The slot `conn` serves, if it is a registered spatial server.
    fn slot_of_server(&self, conn: u64) -> Option<u32> {
        self.servers.get(&conn).copied().flatten()
    }

    fn event(&self, kind: SpatialEventKind, slot: u32, conn: u64, reason: &str) {
        let body: Bytes =
            SpatialEvent { kind: kind as i32, slot, connection_id: conn, reason: reason.into() }
                .encode_to_vec()
                .into();
        // Every spatial server but the one concerned, the observers, and the clients that see
        // one of the slot's cells: each once (a server or an observer may also see the cells).
        let servers = self.slots.iter().flatten();
        let viewers = self.viewers_of(|cell| self.slot_of_cell(cell) == slot);
        let mut told: HashSet<u64> = HashSet::from_iter([conn]);
        for to in servers.chain(&self.observers).chain(&viewers) {
            if told.insert(to.conn_id()) {
                let _ = to.push("spatial.event", body.clone());
            }
        }
    }

    /// Answers itself (`None`), because the acquires of a lost server's entities must follow
    /// the answer.
    pub fn register(
        &mut self,
        server: &SessionHandle,
        req: RegisterServer,
        reply: &mut Reply,
        now: std::time::Instant,
    ) -> Option<Response> {
        let id = reply.id();
        let conn = server.conn_id();
        if self.servers.contains_key(&conn) {
            return Some(error_response(
                id,
                Status::AlreadyExists,
                "this session is already registered".into(),
            ));
        }
        let c = self.layout.config().clone();
        let mut result = RegisterResult {
            origin_x: c.origin[0],
            origin_z: c.origin[1],
            cell_size: c.cell_size,
            cells_x: c.cells[0],
            cells_z: c.cells[1],
            servers_x: c.servers[0],
            servers_z: c.servers[1],
            entity_schema_json: self.entity_schema_json.to_string(),
            cell_schema_json: self.cell_schema_json.to_string(),
            ..RegisterResult::default()
        };
        if req.observe_only {
            self.servers.insert(conn, None);
            self.observers.push(server.clone());
            return Some(ok(id, result.encode_to_vec().into()));
        }
        let slot = match req.slot {
            Some(slot) if slot as usize >= self.slots.len() => {
                let msg =
                    format!("slot {slot} does not exist: the layout has {} server slots", self.slots.len());
                return Some(error_response(id, Status::InvalidArgument, msg));
            }
            Some(slot) if self.slots[slot as usize].is_some() => {
                let msg = format!("slot {slot} has a server; wait for its server-lost event");
                return Some(error_response(id, Status::AlreadyExists, msg));
            }
            Some(slot) => slot,
            None => match self.slots.iter().position(Option::is_none) {
                Some(slot) => slot as u32,
                None => {
                    let msg = format!("all {} server slots are taken", self.slots.len());
                    return Some(error_response(id, Status::ResourceExhausted, msg));
                }
            },
        };
        // A server sees its block and border as a view: one the view limit cannot hold would
        // flood its outbox with one UNSUBSCRIBED per cell when it sets an area of its own.
        let [sx, _] = c.servers;
        let received = self.layout.cells_received_by([slot % sx, slot / sx]).len();
        if received > self.settings.max_view_cells {
            let msg = format!(
                "slot {slot}'s block and interest border hold {received} cells, more than a view may ({}): \
                 raise limits.outbox_capacity and channels.max_subscriptions_per_session, or use smaller blocks",
                self.settings.max_view_cells
            );
            return Some(error_response(id, Status::ResourceExhausted, msg));
        }
        self.slots[slot as usize] = Some(server.clone());
        self.servers.insert(conn, Some(slot));
        result.slot = slot;
        let server_slot = [slot % sx, slot / sx];
        result.cells =
            self.layout.cells_of(server_slot).map(|cell| self.cell_info(self.cell_index(cell))).collect();
        self.figures.servers.fetch_add(1, Ordering::Relaxed);
        // Answer first: the acquires of entities left by a lost server follow the result.
        reply.send(ok(id, result.encode_to_vec().into()));
        self.watch_block(server, slot, now);
        let mut orphans: Vec<u64> =
            self.entities.iter().filter(|(_, e)| e.owner_slot == slot).map(|(&id, _)| id).collect();
        // In the order they were spawned, from run to run.
        orphans.sort_unstable();
        for entity_id in orphans {
            self.take_over(entity_id, slot, slot);
        }
        self.event(SpatialEventKind::ServerJoined, slot, conn, "a spatial server registered");
        None
    }

    /// Gives an entity whose owner is gone (it was in `from_slot`) to `slot`: to its server
    /// now if there is one, else to the next one to register there.
    fn take_over(&mut self, entity_id: u64, from_slot: u32, slot: u32) {
        let server = self.live_server(slot).cloned();
        let Some(e) = self.entities.get_mut(&entity_id) else { return };
        e.owner_slot = slot;
        e.handing_to = None;
        e.acquire_waits = None;
        let Some(server) = server else { return };
        let action = e.route.lost(server.conn_id(), e.value.clone().into_bytes());
        self.acquire(entity_id, from_slot, slot, &server, action);
    }

    /// A session ended: a server's slot frees up (its entities wait for the next server in the
    /// slot, or go to the server of the cell they walked into), a viewer's view goes.
    pub fn left(&mut self, conn: u64) {
        self.leave_view(conn);
        self.controller_sessions.remove(&conn);
        // Every entity it controls lets go of its session: a server's message to the controller
        // is then refused as to no controller, and the ended session is not kept alive.
        for id in self.controlled.remove(&conn).unwrap_or_default() {
            if let Some(e) = self.entities.get_mut(&id) {
                e.controller_session = None;
            }
        }
        let Some(slot) = self.servers.remove(&conn) else { return };
        let Some(slot) = slot else {
            self.observers.retain(|o| o.conn_id() != conn);
            return;
        };
        self.slots[slot as usize] = None;
        // Every ACQUIRE waiting for it: its entities are taken over below (their routes name it).
        self.acquires_waiting[slot as usize].clear();
        self.figures.servers.fetch_sub(1, Ordering::Relaxed);
        self.event(SpatialEventKind::ServerLost, slot, conn, "the spatial server's session ended");
        // Entities it owned, and those it was about to be handed: each goes to the server of
        // the cell it is in, if that is someone else; otherwise it waits for the slot.
        let affected: BTreeMap<u64, (u32, u32)> = self
            .entities
            .iter()
            .filter(|(_, e)| e.route.owner() == conn || e.owner_slot == slot)
            .map(|(&id, e)| (id, (e.owner_slot, e.cell)))
            .collect();
        for (entity_id, (from_slot, cell)) in affected {
            self.take_over(entity_id, from_slot, self.slot_of_cell(cell));
        }
        // A handover to it that its owner has not released yet goes nowhere: the owner's
        // release (it must answer its RELEASE) gives the entity back to it, in an ACQUIRE
        // (`release`), instead of to a slot nobody serves.
        for e in self.entities.values_mut().filter(|e| e.handing_to == Some(slot)) {
            e.handing_to = None;
        }
    }
}

impl Drop for World {
    /// The deliveries' tasks end with the world.
    fn drop(&mut self) {
        for mailbox in self.deliveries.values() {
            mailbox.close();
        }
    }
}

impl SpatialFigures {
    fn publish(&self, slot: u32) {
        if let Some(n) = self.publishes.get(slot as usize) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    }
}
