//! The spatial world's state, on one task: the cells (one state tree each, holding the entities
//! in the cell), the spatial servers in their slots, and every entity with its owner and the
//! route of its messages. Servers publish their entities; when a publish moves an entity into
//! another server's cell, the world hands it over (release by the old owner, acquire by the new
//! one, `tickwire_spatial::handover::Route` keeping its messages in order). What clients see of
//! the cells is `view.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
// foldhash (seeded per process), not SipHash: every publish and pass looks entities and viewers
// up. Entity, viewer and server keys are ids the gateway hands out; `controlled` is keyed by the
// controller connection a spatial server names, which only an authenticated server can choose,
// and there are at most `max_entities` of those.
use hashbrown::{HashMap, HashSet};
use prost::Message;
use tickwire_fanout::{Hold, Scheduler};
use tickwire_spatial::handover::{Action, Route};
use tickwire_spatial::{Cell, Layout, Move};
use tickwire_state::{Key, PreparedCache, Schema, State, Step, Version};
use tickwire_wire::proto::{
    CellInfo, ChannelMessage, ChannelSend, Despawn, EntityMessage, EntityState, Handover, HandoverKind,
    Publish, PublishResult, RegisterResult, RegisterServer, Release, Response, SpatialEvent,
    SpatialEventKind, SpawnEntity, SpawnResult, Status, Vec3,
};

use super::view::Viewer;
use super::{CELL_BASE, ENTITY_BASE, HELD_BACK_QUEUE, SpatialFigures, SpatialSettings};
use crate::router::{SessionHandle, error_response};

/// Root field of a cell's state: the map of entity id to entity value.
pub(super) const ENTITIES_FIELD: u16 = 0;

pub(super) struct CellState {
    pub state: State,
    /// The version before the state's latest change, sealed by a pass: what a viewer that
    /// keeps up holds until its next update.
    pub previous: Version,
    /// Per codec (`view::codec_index`): the length of the cell's latest snapshot entry encoded (0:
    /// none yet), whatever version it was of. A guide for sending a viewer behind the snapshot
    /// instead of a delta of its own (`World::tick`): a cell's size moves slowly, and a wrong
    /// guess sends one of two valid updates where the other would have been smaller.
    pub snapshot_len: [usize; 2],
    /// Per codec: the length of the cell's delta entry from `previous` (its latest change), with
    /// the `previous` it was encoded from; valid only while that is still `previous`.
    pub latest_len: [(Version, usize); 2],
    pub cache: PreparedCache,
    pub entities: HashSet<u64>,
}

/// A message for an entity, as it waits in its route.
#[derive(Debug, Clone)]
pub(super) struct EntityMsg {
    from: u64,
    body: Bytes,
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
    /// Connection id of a controller → the entity it controls (the latest spawned for it).
    pub controlled: HashMap<u64, u64>,
    next_entity: u64,
    pub viewers: HashMap<u64, Viewer>,
    /// When each viewer is due; its version is `world_version`.
    pub schedule: Scheduler<u64>,
    /// Bumped whenever any cell changes: a viewer holding it has nothing to receive.
    pub world_version: u64,
    pub cell_schema_json: Arc<str>,
    pub entity_schema_json: Arc<str>,
    pub figures: Arc<SpatialFigures>,
    /// Publishes of each slot since the last pass; those beyond the first are counted in
    /// `spatial_frames_merged`.
    pub publishes_since_pass: Vec<u32>,
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
        let cells = (0..layout.cell_count())
            .map(|_| CellState {
                state: State::with_limits(cell_schema.clone(), limits),
                previous: 0,
                snapshot_len: [0; 2],
                latest_len: [(0, 0); 2],
                cache: PreparedCache::default(),
                entities: HashSet::new(),
            })
            .collect();
        let [sx, sz] = layout.config().servers;
        World {
            slots: vec![None; (sx * sz) as usize],
            publishes_since_pass: vec![0; (sx * sz) as usize],
            layout,
            settings,
            cells,
            servers: HashMap::new(),
            observers: Vec::new(),
            entities: HashMap::new(),
            controlled: HashMap::new(),
            next_entity: 0,
            viewers: HashMap::new(),
            schedule: Scheduler::new(),
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
        // one of the slot's cells.
        let servers = self.slots.iter().flatten().filter(|s| s.conn_id() != conn);
        let viewers = self.viewers_of(|cell| self.slot_of_cell(cell) == slot);
        for to in servers.chain(&self.observers).chain(&viewers) {
            let _ = to.push("spatial.event", body.clone());
        }
    }

    /// Answers itself (`None`), because the acquires of a lost server's entities must follow
    /// the answer.
    pub fn register(
        &mut self,
        server: &SessionHandle,
        req: RegisterServer,
        id: u64,
        now: std::time::Instant,
    ) -> Option<Response> {
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
        self.slots[slot as usize] = Some(server.clone());
        self.servers.insert(conn, Some(slot));
        result.slot = slot;
        let [sx, _] = c.servers;
        let server_slot = [slot % sx, slot / sx];
        result.cells =
            self.layout.cells_of(server_slot).map(|cell| self.cell_info(self.cell_index(cell))).collect();
        self.figures.servers.fetch_add(1, Ordering::Relaxed);
        // Answer first: the acquires of entities left by a lost server follow the result.
        let _ = server.respond(ok(id, result.encode_to_vec().into()));
        self.watch_block(server, slot, now);
        let orphans: Vec<u64> =
            self.entities.iter().filter(|(_, e)| e.owner_slot == slot).map(|(&id, _)| id).collect();
        for entity_id in orphans {
            self.take_over(entity_id, slot);
        }
        self.event(SpatialEventKind::ServerJoined, slot, conn, "a spatial server registered");
        None
    }

    /// Gives an entity whose owner is gone to the server now in `slot`, if any.
    fn take_over(&mut self, entity_id: u64, slot: u32) {
        let Some(server) = self.live_server(slot).cloned() else { return };
        let Some(e) = self.entities.get_mut(&entity_id) else { return };
        let from_slot = e.owner_slot;
        e.owner_slot = slot;
        e.handing_to = None;
        let action = e.route.lost(server.conn_id(), e.value.clone().into_bytes());
        self.acquire(entity_id, from_slot, slot, &server, action);
    }

    /// Sends an [`Action::Acquire`] to its new owner.
    fn acquire(
        &self,
        entity_id: u64,
        from_slot: u32,
        to_slot: u32,
        to: &SessionHandle,
        action: Action<EntityMsg>,
    ) {
        let Action::Acquire { handover, state, messages, .. } = action else { return };
        let Some(e) = self.entities.get(&entity_id) else { return };
        let handover = Handover {
            entity_id,
            handover_id: handover,
            kind: HandoverKind::Acquire as i32,
            from_slot,
            to_slot,
            position: to_vec3(e.position),
            value_json: String::from_utf8(state).unwrap_or_default(),
            controller_connection: e.controller,
            messages: messages
                .into_iter()
                .map(|(seq, m)| EntityMessage { entity_id, seq, from_connection: m.from, body: m.body })
                .collect(),
        };
        // Pushed like any message: exactly once, in order, across the server's resumes; a server
        // too slow to take it is closed as a slow consumer, and its entities are taken over.
        let _ = to.push("spatial.handover", handover.encode_to_vec().into());
    }

    pub fn spawn(&mut self, server: &SessionHandle, req: SpawnEntity, id: u64) -> Response {
        let Some(slot) = self.slot_of_server(server.conn_id()) else {
            return error_response(
                id,
                Status::PermissionDenied,
                "spatial.spawn needs a registered spatial server".into(),
            );
        };
        if self.entities.len() >= self.settings.max_entities {
            let msg = format!("the world holds its maximum of {} entities", self.settings.max_entities);
            return error_response(id, Status::ResourceExhausted, msg);
        }
        let position = vec3(req.position);
        let Some(cell) = self.layout.cell_of(position) else {
            return error_response(
                id,
                Status::InvalidArgument,
                format!("position {position:?} is outside the world"),
            );
        };
        let index = self.cell_index(cell);
        let cell_slot = self.slot_of_cell(index);
        if cell_slot != slot {
            let msg = format!(
                "position {position:?} is in cell {cell:?} of slot {cell_slot}, not this server's slot {slot}"
            );
            return error_response(id, Status::FailedPrecondition, msg);
        }
        let value = if req.value_json.is_empty() { "{}" } else { req.value_json.trim() };
        let entity_id = ENTITY_BASE + self.next_entity;
        if let Err(msg) = self.set_in_cell(index, entity_id, value) {
            return error_response(id, Status::InvalidArgument, msg);
        }
        let value = value.to_owned();
        self.next_entity += 1;
        self.cells[index as usize].entities.insert(entity_id);
        let entity = Entity {
            cell: index,
            position,
            value,
            route: Route::new(server.conn_id(), self.settings.max_waiting),
            owner_slot: slot,
            controller: req.controller_connection,
            controller_session: None,
            handing_to: None,
        };
        self.entities.insert(entity_id, entity);
        if req.controller_connection != 0 {
            self.controlled.insert(req.controller_connection, entity_id);
        }
        self.figures.entities.store(self.entities.len() as u64, Ordering::Relaxed);
        let result = SpawnResult { entity_id, cell: Some(self.cell_info(index)) };
        ok(id, result.encode_to_vec().into())
    }

    /// Writes an entity's value, JSON text in the entity schema's form, into a cell's state;
    /// a value that does not fit changes nothing.
    fn set_in_cell(&mut self, index: u32, entity_id: u64, value: &str) -> Result<(), String> {
        let key = Key::Int(entity_id as i64);
        let cell = &mut self.cells[index as usize];
        cell.state
            .set_json(&[Step::Field(ENTITIES_FIELD), Step::Key(&key)], value)
            .map_err(|e| format!("entity {entity_id}: value_json: {e}"))
    }

    fn remove_from_cell(&mut self, index: u32, entity_id: u64) {
        let key = Key::Int(entity_id as i64);
        let cell = &mut self.cells[index as usize];
        let _ = cell.state.remove(&[Step::Field(ENTITIES_FIELD), Step::Key(&key)]);
        cell.entities.remove(&entity_id);
    }

    pub fn publish(&mut self, server: &SessionHandle, req: Publish, id: u64) -> Response {
        let conn = server.conn_id();
        let Some(slot) = self.slot_of_server(conn) else {
            return error_response(
                id,
                Status::PermissionDenied,
                "spatial.publish needs a registered spatial server".into(),
            );
        };
        self.figures.publish(slot);
        if let Some(n) = self.publishes_since_pass.get_mut(slot as usize) {
            *n += 1;
        }
        let mut ignored = Vec::new();
        for update in req.entities {
            if let Err(why) = self.publish_one(conn, &update) {
                if let Some(msg) = why {
                    return error_response(id, Status::InvalidArgument, msg);
                }
                ignored.push(update.entity_id);
            }
        }
        self.figures.ignored.fetch_add(ignored.len() as u64, Ordering::Relaxed);
        ok(id, PublishResult { ignored }.encode_to_vec().into())
    }

    /// One entity of a publish. `Err(None)`: ignored (not this server's); `Err(Some)`: bad input.
    fn publish_one(&mut self, conn: u64, update: &EntityState) -> Result<(), Option<String>> {
        let entity_id = update.entity_id;
        let owner_slot = self.entities.get(&entity_id).ok_or(None)?.owner_slot;
        let owner_live = self.live_server(owner_slot).is_some_and(|s| s.conn_id() == conn);
        let e = self.entities.get_mut(&entity_id).expect("looked up above");
        if e.route.owner() != conn || !owner_live {
            return Err(None);
        }
        if update.processed_seq > 0 {
            e.route.processed(conn, update.processed_seq);
        }
        let position = vec3(update.position);
        if !position.iter().all(|v| v.is_finite()) {
            return Err(Some(format!("entity {entity_id}: position must be finite")));
        }
        let value = (!update.value_json.is_empty()).then(|| update.value_json.trim());
        let from_position = e.position;
        let from_cell = e.cell;
        let target = match self.layout.classify(from_position, position) {
            Move::Stay | Move::Outside | Move::Left { .. } => from_cell,
            Move::CellChange { to, .. } | Move::Handover { to, .. } | Move::Entered { to } => {
                self.cell_index(to)
            }
        };
        match value {
            Some(value) => self.set_in_cell(target, entity_id, value).map_err(Some)?,
            // Only the position changed; an entity that changes cell goes in whole.
            None if target != from_cell => {
                let value = self.entities[&entity_id].value.clone();
                self.set_in_cell(target, entity_id, &value).map_err(Some)?;
            }
            None => {}
        }
        if target != from_cell {
            self.remove_from_cell(from_cell, entity_id);
            self.cells[target as usize].entities.insert(entity_id);
            self.figures.cell_changes.fetch_add(1, Ordering::Relaxed);
        }
        let e = self.entities.get_mut(&entity_id).expect("looked up above");
        if let Some(value) = value {
            value.clone_into(&mut e.value);
        }
        e.cell = target;
        // Outside the world, an entity stays in its last cell at its last position in the grid.
        if self.layout.cell_of(position).is_some() {
            e.position = position;
        }
        if target != from_cell {
            self.entity_moved_cell(entity_id);
        }
        self.follow(entity_id, target != from_cell);
        Ok(())
    }

    /// After an entity changed cell: a handover if the cell belongs to another slot.
    fn entity_moved_cell(&mut self, entity_id: u64) {
        let cell_slot = {
            let e = &self.entities[&entity_id];
            self.slot_of_cell(e.cell)
        };
        let Some(e) = self.entities.get(&entity_id) else { return };
        if cell_slot == e.owner_slot || e.route.handing_over() || self.live_server(cell_slot).is_none() {
            // Same server; or a handover under way (the acquire goes to the slot the entity is
            // in at release time); or nobody to hand over to (the owner keeps it and the next
            // cell change tries again).
            return;
        }
        self.begin_handover(entity_id, cell_slot);
    }

    fn begin_handover(&mut self, entity_id: u64, to_slot: u32) {
        let Some(to) = self.live_server(to_slot).map(SessionHandle::conn_id) else { return };
        let Some(owner) = self.entities.get(&entity_id).and_then(|e| self.live_server(e.owner_slot)).cloned()
        else {
            return;
        };
        let e = self.entities.get_mut(&entity_id).expect("checked by the caller");
        let Ok(Action::Release { handover, .. }) = e.route.begin_handover(to) else { return };
        e.handing_to = Some(to_slot);
        let push = Handover {
            entity_id,
            handover_id: handover,
            kind: HandoverKind::Release as i32,
            from_slot: e.owner_slot,
            to_slot,
            position: to_vec3(e.position),
            ..Handover::default()
        };
        let _ = owner.push("spatial.handover", push.encode_to_vec().into());
    }

    /// Answers itself (`None`) when it hands the entity on, so the answer precedes the acquire.
    pub fn release(&mut self, server: &SessionHandle, req: Release, id: u64) -> Option<Response> {
        let conn = server.conn_id();
        let entity_id = req.entity_id;
        let Some(e) = self.entities.get_mut(&entity_id) else {
            return Some(error_response(id, Status::NotFound, format!("no entity {entity_id}")));
        };
        if e.route.owner() != conn {
            return Some(error_response(
                id,
                Status::PermissionDenied,
                format!("entity {entity_id} is not this server's"),
            ));
        }
        // A release the route would refuse changes nothing, its value included.
        if let Err(err) = e.route.check_release(req.handover_id, req.processed_seq) {
            return Some(error_response(
                id,
                Status::FailedPrecondition,
                format!("entity {entity_id}: {err}"),
            ));
        }
        // Into the cell first: a value that does not fit changes nothing.
        let (cell, value) = (e.cell, (!req.value_json.is_empty()).then(|| req.value_json.trim()));
        if let Some(value) = value
            && let Err(msg) = self.set_in_cell(cell, entity_id, value)
        {
            return Some(error_response(id, Status::InvalidArgument, msg));
        }
        let e = self.entities.get_mut(&entity_id).expect("looked up above");
        if let Some(value) = value {
            value.clone_into(&mut e.value);
        }
        let state = e.value.clone().into_bytes();
        // Checked above, with nothing changed in the route since.
        let action = match e.route.released(req.handover_id, req.processed_seq, state) {
            Ok(action) => action,
            Err(err) => return Some(error_response(id, Status::Internal, err.to_string())),
        };
        let from_slot = e.owner_slot;
        let to_slot = e.handing_to.take().unwrap_or(from_slot);
        e.owner_slot = to_slot;
        self.figures.handovers.fetch_add(1, Ordering::Relaxed);
        let _ = server.respond(ok(id, Bytes::new()));
        match self.live_server(to_slot).cloned() {
            // The slot's server may have changed since the release was asked for: the route's
            // new owner must be the one that gets the acquire.
            Some(to) if Some(to.conn_id()) == self.entities.get(&entity_id).map(|e| e.route.owner()) => {
                self.acquire(entity_id, from_slot, to_slot, &to, action);
            }
            Some(_) => self.take_over(entity_id, to_slot),
            // Nobody there now: the next server to register in the slot takes it over.
            None => {}
        }
        // The entity may have walked on into a third server's cell meanwhile.
        self.entity_moved_cell(entity_id);
        None
    }

    pub fn despawn(&mut self, server: &SessionHandle, req: Despawn, id: u64) -> Response {
        let entity_id = req.entity_id;
        let Some(e) = self.entities.get(&entity_id) else {
            return error_response(id, Status::NotFound, format!("no entity {entity_id}"));
        };
        if e.route.owner() != server.conn_id() {
            return error_response(
                id,
                Status::PermissionDenied,
                format!("entity {entity_id} is not this server's"),
            );
        }
        let (cell, controller) = (e.cell, e.controller);
        self.remove_from_cell(cell, entity_id);
        self.entities.remove(&entity_id);
        if self.controlled.get(&controller) == Some(&entity_id) {
            self.controlled.remove(&controller);
        }
        self.figures.entities.store(self.entities.len() as u64, Ordering::Relaxed);
        ok(id, Bytes::new())
    }

    /// `channel.send` to an entity: to its owner, numbered, through any handover; or, from a
    /// server with `to_connection` set, to the entity's controller.
    pub fn send(&mut self, from: &SessionHandle, send: ChannelSend, id: u64) -> Response {
        let (entity_id, body) = (send.channel_id, send.body);
        let server = self.servers.contains_key(&from.conn_id());
        let max_in_flight = self.settings.max_in_flight;
        let Some(e) = self.entities.get_mut(&entity_id) else {
            return error_response(id, Status::NotFound, format!("no entity {entity_id}"));
        };
        if send.to_connection != 0 {
            if !server {
                let msg = "clients may only send to the entity's owner (to_connection 0)".to_owned();
                return error_response(id, Status::PermissionDenied, msg);
            }
            let to = e.controller_session.as_ref().filter(|c| c.conn_id() == send.to_connection);
            let Some(to) = to else {
                let msg = format!(
                    "connection {} is not entity {entity_id}'s controller, or has not sent to it or set an area of interest yet",
                    send.to_connection
                );
                return error_response(id, Status::NotFound, msg);
            };
            let message = ChannelMessage { channel_id: entity_id, from_connection: from.conn_id(), body };
            return match to.push("channel.message", message.encode_to_vec().into()) {
                Ok(()) => ok(id, Bytes::new()),
                Err(e) => error_response(id, Status::Unavailable, format!("controller: {e}")),
            };
        }
        if e.controller == from.conn_id() && e.controller_session.is_none() {
            e.controller_session = Some(from.clone());
        }
        if !server && e.controller != from.conn_id() {
            let msg = format!("only entity {entity_id}'s controller and servers may send to it");
            return error_response(id, Status::PermissionDenied, msg);
        }
        let Some(owner) = self.slots.get(e.owner_slot as usize).and_then(Option::as_ref) else {
            let msg = format!("entity {entity_id}'s server is gone (slot {}); retry", e.owner_slot);
            return error_response(id, Status::Unavailable, msg);
        };
        if e.route.in_flight() >= max_in_flight {
            let msg = format!(
                "entity {entity_id} has {max_in_flight} messages its server has not processed; retry"
            );
            return error_response(id, Status::Unavailable, msg);
        }
        match e.route.send(EntityMsg { from: from.conn_id(), body }) {
            Ok(Some(Action::Deliver { seq, message, .. })) => {
                let m = EntityMessage { entity_id, seq, from_connection: message.from, body: message.body };
                let _ = owner.push("spatial.message", m.encode_to_vec().into());
                self.figures.messages.fetch_add(1, Ordering::Relaxed);
                ok(id, Bytes::new())
            }
            // Held for the handover under way; the acquire carries it.
            Ok(_) => {
                self.figures.messages.fetch_add(1, Ordering::Relaxed);
                ok(id, Bytes::new())
            }
            Err(e) => error_response(id, Status::Unavailable, format!("entity {entity_id}: {e}; retry")),
        }
    }

    /// A session ended: a server's slot frees up (its entities wait for the next server in the
    /// slot, or go to the server of the cell they walked into), a viewer's view goes.
    pub fn left(&mut self, conn: u64) {
        self.leave_view(conn);
        if let Some(e) = self.controlled.get(&conn).and_then(|id| self.entities.get_mut(id)) {
            e.controller_session = None;
        }
        let Some(slot) = self.servers.remove(&conn) else { return };
        let Some(slot) = slot else {
            self.observers.retain(|o| o.conn_id() != conn);
            return;
        };
        self.slots[slot as usize] = None;
        self.figures.servers.fetch_sub(1, Ordering::Relaxed);
        self.event(SpatialEventKind::ServerLost, slot, conn, "the spatial server's session ended");
        // Entities it owned, and those it was about to be handed: each goes to the server of
        // the cell it is in, if that is someone else; otherwise it waits for the slot.
        let affected: BTreeMap<u64, u32> = self
            .entities
            .iter()
            .filter(|(_, e)| e.route.owner() == conn || e.owner_slot == slot)
            .map(|(&id, e)| (id, e.cell))
            .collect();
        for (entity_id, cell) in affected {
            let cell_slot = self.slot_of_cell(cell);
            if let Some(e) = self.entities.get_mut(&entity_id) {
                e.owner_slot = cell_slot;
                e.handing_to = None;
            }
            self.take_over(entity_id, cell_slot);
        }
    }
}

impl SpatialFigures {
    /// A due viewer's update was held back by `hold`, a bound of its window (`None`: the
    /// session's queue refused it).
    pub(super) fn count_held_back(&self, hold: Option<Hold>) {
        self.coalesced.fetch_add(1, Ordering::Relaxed);
        let at = hold.map_or(HELD_BACK_QUEUE, Hold::index);
        self.held_back[at].fetch_add(1, Ordering::Relaxed);
    }

    fn publish(&self, slot: u32) {
        if let Some(n) = self.publishes.get(slot as usize) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    }
}
