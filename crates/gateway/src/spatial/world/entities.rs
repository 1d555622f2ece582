//! The entities of the spatial world: spawned by a server into one of its cells, published
//! every frame (which moves them from cell to cell), handed over when a move crosses into
//! another server's cells, despawned, and sent messages through their route. The servers and
//! their slots, which these act on, are the parent module's.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use prost::Message;
use tickwire_spatial::Move;
use tickwire_spatial::handover::{Action, Route};
use tickwire_state::{Key, StateError, Step};
use tickwire_wire::proto::{
    ChannelMessage, ChannelSend, Despawn, EntityMessage, EntityState, Handover, HandoverKind, Publish,
    PublishResult, Release, Response, SpawnEntity, SpawnResult, Status,
};

use super::{ENTITIES_FIELD, Entity, EntityMsg, World, acquires, ok, to_vec3, vec3};
use crate::router::{Reply, SessionHandle, error_response};
use crate::spatial::ENTITY_BASE;

impl World {
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
        if !position.iter().all(|v| v.is_finite()) {
            return error_response(
                id,
                Status::InvalidArgument,
                format!("position {position:?} must be finite"),
            );
        }
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
        if let Err((status, msg)) = self.set_in_cell(index, entity_id, value) {
            return error_response(id, status, msg);
        }
        let value = value.to_owned();
        self.next_entity += 1;
        self.cells[index as usize].entities.insert(entity_id);
        let entity = Entity {
            cell: index,
            position,
            value,
            route: Route::with_weight(server.conn_id(), self.settings.max_waiting, EntityMsg::weight),
            owner_slot: slot,
            controller: req.controller_connection,
            controller_session: self.controller_sessions.get(&req.controller_connection).cloned(),
            handing_to: None,
            acquire_waits: None,
        };
        self.entities.insert(entity_id, entity);
        if req.controller_connection != 0 {
            self.controlled.entry(req.controller_connection).or_default().insert(entity_id);
        }
        self.figures.entities.store(self.entities.len() as u64, Ordering::Relaxed);
        let result = SpawnResult { entity_id, cell: Some(self.cell_info(index)) };
        ok(id, result.encode_to_vec().into())
    }

    /// Writes an entity's value, JSON text in the entity schema's form, into a cell's state;
    /// a value that does not fit changes nothing. The error's status: `RESOURCE_EXHAUSTED` when
    /// the cell is past its limits (too many entities, too many bytes), else
    /// `INVALID_ARGUMENT` (the value is malformed or does not fit the schema).
    fn set_in_cell(&mut self, index: u32, entity_id: u64, value: &str) -> Result<(), (Status, String)> {
        let key = Key::Int(entity_id as i64);
        let cell = &mut self.cells[index as usize];
        cell.state.set_json(&[Step::Field(ENTITIES_FIELD), Step::Key(&key)], value).map_err(|e| {
            let status = match e {
                StateError::TooLong { .. } | StateError::TooBig { .. } => Status::ResourceExhausted,
                _ => Status::InvalidArgument,
            };
            (status, format!("entity {entity_id} in cell {index}: value_json: {e}"))
        })
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
                if let Some((status, msg)) = why {
                    return error_response(id, status, msg);
                }
                ignored.push(update.entity_id);
            }
        }
        self.figures.ignored.fetch_add(ignored.len() as u64, Ordering::Relaxed);
        ok(id, PublishResult { ignored }.encode_to_vec().into())
    }

    /// One entity of a publish. `Err(None)`: ignored (not this server's); `Err(Some)`: refused
    /// (bad input, or a cell past its limits). Without a position, the entity stays where it is.
    fn publish_one(&mut self, conn: u64, update: &EntityState) -> Result<(), Option<(Status, String)>> {
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
        let position = update.position.map_or(e.position, |p| vec3(Some(p)));
        if !position.iter().all(|v| v.is_finite()) {
            return Err(Some((
                Status::InvalidArgument,
                format!("entity {entity_id}: position must be finite"),
            )));
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
            self.moves_since_pass.insert((from_cell, target));
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
        let (controller, at) = (e.controller, e.position);
        // At every publish, not only on a cell change: a handover put off for room in the
        // owner's outbox (`begin_handover`) is tried again.
        self.entity_moved_cell(entity_id);
        self.follow(entity_id, controller, at, target != from_cell);
        Ok(())
    }

    /// After a publish: a handover if the entity's cell belongs to another slot.
    pub(super) fn entity_moved_cell(&mut self, entity_id: u64) {
        let Some(e) = self.entities.get(&entity_id) else { return };
        let cell_slot = self.slot_of_cell(e.cell);
        if cell_slot == e.owner_slot
            || e.route.handing_over()
            || e.acquire_waits.is_some()
            || self.live_server(cell_slot).is_none()
        {
            // Same server; or a handover under way (the acquire goes to the slot the entity is
            // in at release time), or its ACQUIRE not sent yet; or nobody to hand over to (the
            // owner keeps it and the next publish tries again).
            return;
        }
        self.begin_handover(entity_id, cell_slot);
    }

    /// Asks the owner to release the entity, if its outbox has room to spare; else the next
    /// publish asks again (a crowd crossing a border must not make its server a slow consumer).
    fn begin_handover(&mut self, entity_id: u64, to_slot: u32) {
        let Some(to) = self.live_server(to_slot).map(SessionHandle::conn_id) else { return };
        let Some(owner) = self.entities.get(&entity_id).and_then(|e| self.live_server(e.owner_slot)).cloned()
        else {
            return;
        };
        // A RELEASE: a few numbers.
        let Ok(place) = owner.paced(64) else {
            // Asked again at the next pass (`send_waiting_acquires`).
            self.releases_put_off.insert(entity_id);
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
        place.push("spatial.handover", push.encode_to_vec().into());
    }

    /// Answers itself (`None`) when it hands the entity on, so the answer precedes the acquire.
    pub fn release(&mut self, server: &SessionHandle, req: Release, reply: &mut Reply) -> Option<Response> {
        let id = reply.id();
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
            && let Err((status, msg)) = self.set_in_cell(cell, entity_id, value)
        {
            return Some(error_response(id, status, msg));
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
        reply.send(ok(id, Bytes::new()));
        match self.live_server(to_slot).cloned() {
            // The slot's server may have changed since the release was asked for: the route's
            // new owner must be the one that gets the acquire.
            Some(to) if Some(to.conn_id()) == self.entities.get(&entity_id).map(|e| e.route.owner()) => {
                self.acquire(entity_id, from_slot, to_slot, &to, action);
            }
            Some(_) => self.take_over(entity_id, from_slot, to_slot),
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
        if let Some(ids) = self.controlled.get_mut(&controller) {
            ids.remove(&entity_id);
            if ids.is_empty() {
                self.controlled.remove(&controller);
            }
        }
        self.figures.entities.store(self.entities.len() as u64, Ordering::Relaxed);
        ok(id, Bytes::new())
    }

    /// `channel.send` to an entity: to its owner, numbered, through any handover; or, from a
    /// server with `to_connection` set, to the entity's controller.
    pub fn send(&mut self, from: &SessionHandle, send: ChannelSend, id: u64) -> Response {
        let (entity_id, body) = (send.channel_id, send.body);
        // A registered server, observers (the master) included: its messages take a place in
        // the owner's outbox like anyone's, so none can flood the owner.
        let server = self.servers.contains_key(&from.conn_id());
        let max_in_flight = self.settings.max_in_flight;
        let max_in_flight_bytes = self.settings.max_in_flight_bytes;
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
        let message = EntityMsg { from: from.conn_id(), body };
        if e.route.in_flight_bytes() + message.weight() > max_in_flight_bytes {
            let msg = format!(
                "entity {entity_id}'s messages its server has not processed would pass \
                 {max_in_flight_bytes} bytes; retry"
            );
            return error_response(id, Status::Unavailable, msg);
        }
        // Where it goes: while the entity's ACQUIRE waits for room, into that ACQUIRE, found
        // before the message takes a number (so that a number never goes to a message that
        // goes nowhere); else to the owner, in a place it holds in the owner's outbox first: a
        // client (or another server) sending faster than the entity's server reads is told to
        // retry, and never makes that server a slow consumer (`SessionHandle::relay`). (Held
        // for a handover under way, it needs no place: the acquire carries it.)
        let (waits, owner_slot) = (e.acquire_waits.is_some(), e.owner_slot);
        let acquire = if waits {
            let Some(at) = self.waiting_acquire(owner_slot, entity_id) else {
                let msg = format!("entity {entity_id} is being handed to its new server; retry");
                return error_response(id, Status::Unavailable, msg);
            };
            Some((owner_slot, at))
        } else {
            None
        };
        let e = self.entities.get_mut(&entity_id).expect("looked up above");
        let place = if acquire.is_some() || e.route.handing_over() {
            None
        } else {
            // The push: the message's body, and its entity, number and sender.
            let Ok(place) = owner.relay(message.body.len() + 32) else {
                let msg = format!(
                    "entity {entity_id}'s server has more messages waiting than it takes from others; retry"
                );
                return error_response(id, Status::Unavailable, msg);
            };
            Some(place)
        };
        match e.route.send(message) {
            Ok(Some(Action::Deliver { seq, message, .. })) => {
                if let Some(waiting) = acquire {
                    acquires::join(&mut self.acquires_waiting, waiting, seq, message);
                } else {
                    let m =
                        EntityMessage { entity_id, seq, from_connection: message.from, body: message.body };
                    let body = m.encode_to_vec().into();
                    match place {
                        Some(place) => place.push("spatial.message", body),
                        // Not reached: a route handing over holds what it is sent.
                        None => {
                            let _ = owner.push("spatial.message", body);
                        }
                    }
                }
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
}
