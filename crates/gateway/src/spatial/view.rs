//! What clients see of the spatial world: each client's area of interest, the cells it
//! touches, and the fan-out pass that sends every due client one `channel.updates` message with
//! a delta (or a snapshot) of each cell in its view that changed since the version it holds.
//!
//! One message per client per pass, whatever the number of cells in view: a client near a
//! corner of four cells costs the gateway one write, not four. When a client is due is decided
//! by the pure scheduler of `tickwire-fanout` (fed `now`), and whether it may take more by its
//! session's window of updates in flight, as for any channel: a slow reader gets merged deltas
//! at its pace. A resume that dropped undelivered batches sends the client a snapshot of every
//! cell in its view.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message;
use tickwire_fanout::{Due, Options, Outcome, Version};
use tickwire_spatial::Area;
use tickwire_state::Key;
use tickwire_wire::proto::{
    ChannelEvent, ChannelEventKind, ChannelUpdate, DeltaCodec, Follow, InterestResult, Response, SetInterest,
    Status, set_interest,
};

use super::world::{CellState, World};
use super::{CELL_BASE, SpatialFigures, WORLD_KEY};
use crate::channel::state_codec;
use crate::router::{PushError, PushParts, SessionHandle, error_response, field_len};

/// One cell's update from a version in one codec (`i32`, as the proto): its `ChannelUpdates`
/// entry and the version it leads to, or `None` if it cannot be built (a snapshot is due).
type Encoded = (Version, i32, Option<(Bytes, Version)>);

/// The tag of `ChannelUpdates.updates` (field 1, length-delimited).
const UPDATES_TAG: u8 = 0x0a;

/// A viewer whose version of a cell predates the cell's latest change gets the cell's snapshot
/// instead of a delta of its own when the latest change's delta is at least this fraction
/// (NUM/DEN) of the snapshot's size. A delta from an older version carries at least what the
/// latest change touched, so the snapshot is then at most about twice the bytes of the delta
/// it replaces, and the pass encodes one snapshot per cell instead of one delta per version
/// held. Half, not more: a set sends only the fields that differ (docs/protocol.md 13.4), so
/// characters that all move every frame make deltas well under a snapshot: 54% in binary and
/// 74% in JSON in the harness test of such a world (`..._whose_every_entity_moved`).
const SNAPSHOT_INSTEAD_NUM: usize = 1;
const SNAPSHOT_INSTEAD_DEN: usize = 2;

/// A codec's index in the per-codec arrays of [`CellState`].
pub(super) fn codec_index(codec: DeltaCodec) -> usize {
    match codec {
        DeltaCodec::Binary => 0,
        DeltaCodec::Json => 1,
    }
}

/// The index in `cache` (a cell's entries of this pass) of the cell's update from `base` in
/// `codec`, encoded now if no viewer needed it yet this pass.
fn entry(
    cache: &mut Vec<Encoded>,
    c: &mut CellState,
    cell: u32,
    base: Version,
    codec: DeltaCodec,
    figures: &SpatialFigures,
) -> usize {
    if let Some(at) = cache.iter().position(|(b, k, _)| *b == base && *k == codec as i32) {
        return at;
    }
    figures.encodings.fetch_add(1, Ordering::Relaxed);
    let no_player = Key::Int(0);
    let encoded = c.cache.get(&c.state, base, state_codec(codec)).ok().and_then(|prepared| {
        let update = prepared.update_for(&c.state, &no_player, false).ok()?;
        // Sent even when nothing visible changed: the client's replica must move to the new
        // version, or the next delta would not apply.
        let message = ChannelUpdate {
            channel_id: CELL_BASE + u64::from(cell),
            codec: codec as i32,
            update: update.to_vec().into(),
        };
        // At its exact size: queued updates hold it, and the window counts only its length.
        let mut field = Vec::with_capacity(field_len(message.encoded_len()));
        field.push(UPDATES_TAG);
        message.encode_length_delimited(&mut field).ok()?;
        Some((Bytes::from(field), prepared.to()))
    });
    if let Some((field, _)) = &encoded {
        if base == 0 {
            c.snapshot_len[codec_index(codec)] = field.len();
        } else if base == c.previous {
            c.latest_len[codec_index(codec)] = (base, field.len());
        }
    }
    cache.push((base, codec as i32, encoded));
    cache.len() - 1
}

pub(super) struct Viewer {
    handle: SessionHandle,
    /// As last set (not re-centred).
    area: Area,
    follow: Follow,
    codec: DeltaCodec,
    /// The cells in view, sorted, and the version of each the client holds (`None`: it needs a
    /// snapshot). A few cells (at most `spatial.max_view_cells`), walked on every pass: a
    /// sorted vector, updated in place.
    held: Vec<(u32, Option<Version>)>,
}

impl Viewer {
    /// The cells in view, in order.
    #[cfg(any(test, feature = "harness"))]
    pub(super) fn cells(&self) -> impl Iterator<Item = u32> + '_ {
        self.held.iter().map(|&(cell, _)| cell)
    }
}

fn point(v: Option<tickwire_wire::proto::Vec3>) -> [f32; 3] {
    v.map_or([0.0; 3], |v| [v.x, v.y, v.z])
}

/// The area a `spatial.interest` asks for (`None`: no area).
fn area_of(req: &SetInterest) -> Option<Area> {
    Some(match req.area.as_ref()? {
        set_interest::Area::Sphere(s) => Area::Sphere { center: point(s.center), radius: s.radius },
        set_interest::Area::Box(b) => Area::Box { min: point(b.min), max: point(b.max) },
        set_interest::Area::Cone(c) => Area::Cone {
            apex: point(c.apex),
            direction: point(c.direction),
            half_angle: c.half_angle,
            range: c.range,
        },
    })
}

impl World {
    /// `spatial.interest`: sets (or clears) the client's area, and with it the cells it sees.
    pub fn set_interest(
        &mut self,
        client: &SessionHandle,
        req: SetInterest,
        id: u64,
        now: Instant,
    ) -> Response {
        let conn = client.conn_id();
        let Some(area) = area_of(&req) else {
            // Every cell leaves the view, and the client is told so (section 14.2).
            self.show(conn, &[]);
            self.leave_view(conn);
            let result =
                InterestResult { cells: Vec::new(), cell_schema_json: self.cell_schema_json.to_string() };
            return Response {
                id,
                status: Status::Ok as i32,
                body: result.encode_to_vec().into(),
                error: String::new(),
            };
        };
        if let Err(e) = area.check() {
            return error_response(id, Status::InvalidArgument, format!("area of interest: {e}"));
        }
        let follow = req.follow();
        let options = req.options.unwrap_or_default();
        for e in self.entities.values_mut().filter(|e| e.controller == conn && e.controller_session.is_none())
        {
            e.controller_session = Some(client.clone());
        }
        let centred = match follow {
            Follow::Off => area,
            _ => self.controlled_position(conn).map_or(area, |p| area.centred_at(p)),
        };
        let cells = self.cells_of_area(&centred);
        if cells.len() > self.settings.max_view_cells {
            let msg = format!(
                "the area touches {} cells; at most {} (spatial.max_view_cells)",
                cells.len(),
                self.settings.max_view_cells
            );
            return error_response(id, Status::ResourceExhausted, msg);
        }
        let interval = match options.fanout_interval_ms {
            0 => self.settings.fanout,
            ms => Duration::from_millis(u64::from(ms)),
        };
        let schedule = Options {
            interval,
            delay: Duration::from_millis(u64::from(options.fanout_delay_ms)),
            skip_first_full_state: false,
        };
        let viewer = self.viewers.entry(conn).or_insert_with(|| Viewer {
            handle: client.clone(),
            area,
            follow,
            codec: options.codec(),
            held: Vec::new(),
        });
        let codec_changed = viewer.codec != options.codec();
        viewer.area = area;
        viewer.follow = follow;
        viewer.codec = options.codec();
        if codec_changed {
            viewer.held.iter_mut().for_each(|(_, held)| *held = None);
        }
        if !self.schedule.set_options(conn, schedule, false) {
            self.schedule.join(conn, schedule, now, self.world_version);
        }
        self.show(conn, &cells);
        let result = InterestResult {
            cells: cells.iter().map(|&c| self.cell_info(c)).collect(),
            cell_schema_json: self.cell_schema_json.to_string(),
        };
        Response { id, status: Status::Ok as i32, body: result.encode_to_vec().into(), error: String::new() }
    }

    fn cells_of_area(&self, area: &Area) -> Vec<u32> {
        area.cells(&self.layout).into_iter().map(|c| self.cell_index(c)).collect()
    }

    /// The position of the entity `conn` controls, if any.
    fn controlled_position(&self, conn: u64) -> Option<[f32; 3]> {
        self.controlled.get(&conn).and_then(|id| self.entities.get(id)).map(|e| e.position)
    }

    /// Makes `cells` the viewer's view: cells it leaves get an UNSUBSCRIBED event (the client
    /// drops their entities), cells it enters get a snapshot at its next update.
    fn show(&mut self, conn: u64, cells: &[u32]) {
        let Some(viewer) = self.viewers.get_mut(&conn) else { return };
        let wanted: std::collections::BTreeSet<u32> = cells.iter().copied().collect();
        let left: Vec<u32> = viewer.held.iter().map(|&(c, _)| c).filter(|c| !wanted.contains(c)).collect();
        viewer.held.retain(|(c, _)| wanted.contains(c));
        for cell in &left {
            let event = ChannelEvent {
                channel_id: CELL_BASE + u64::from(*cell),
                kind: ChannelEventKind::Unsubscribed as i32,
                reason: "left the area of interest".into(),
            };
            let _ = viewer.handle.push("channel.event", event.encode_to_vec().into());
        }
        let mut entered = false;
        for &cell in cells {
            if let Err(at) = viewer.held.binary_search_by_key(&cell, |&(c, _)| c) {
                viewer.held.insert(at, (cell, None));
                entered = true;
            }
        }
        if entered {
            // Due again even if nothing in the world changed: the new cells need snapshots.
            self.schedule.resnapshot(conn);
        }
    }

    /// After entity `entity_id` moved: the area of the client controlling it follows, if it
    /// asked to (on every move, or only when the entity changed cell).
    pub fn follow(&mut self, entity_id: u64, cell_changed: bool) {
        let Some(e) = self.entities.get(&entity_id) else { return };
        let (conn, position) = (e.controller, e.position);
        let Some(viewer) = self.viewers.get(&conn) else { return };
        let moves = match viewer.follow {
            Follow::Off => false,
            Follow::Cell => cell_changed,
            Follow::Always => true,
        };
        if !moves {
            return;
        }
        let cells = self.cells_of_area(&viewer.area.centred_at(position));
        if cells.len() <= self.settings.max_view_cells {
            self.show(conn, &cells);
        }
    }

    /// A spatial server registered in `slot` sees the cells it receives: its block and
    /// `server_interest_border` cells around it (channeld's server interest), until it sets an
    /// area of its own.
    pub fn watch_block(&mut self, server: &SessionHandle, slot: u32, now: Instant) {
        let [sx, _] = self.layout.config().servers;
        let received = self.layout.cells_received_by([slot % sx, slot / sx]);
        let cells: Vec<u32> = received.iter().map(|&c| self.cell_index(c)).collect();
        let (lo, _) = self.layout.bounds(received[0]);
        let (_, hi) = self.layout.bounds(received[received.len() - 1]);
        let area = Area::Box { min: [lo[0], f32::MIN, lo[1]], max: [hi[0], f32::MAX, hi[1]] };
        let conn = server.conn_id();
        self.viewers.insert(
            conn,
            Viewer {
                handle: server.clone(),
                area,
                follow: Follow::Off,
                codec: DeltaCodec::Binary,
                held: Vec::new(),
            },
        );
        let schedule =
            Options { interval: self.settings.fanout, delay: Duration::ZERO, skip_first_full_state: false };
        self.schedule.join(conn, schedule, now, self.world_version);
        self.show(conn, &cells);
    }

    /// The clients that see at least one cell for which `shown` holds.
    pub fn viewers_of(&self, shown: impl Fn(u32) -> bool) -> Vec<SessionHandle> {
        self.viewers
            .values()
            .filter(|v| v.held.iter().any(|&(c, _)| shown(c)))
            .map(|v| v.handle.clone())
            .collect()
    }

    pub fn leave_view(&mut self, conn: u64) {
        if let Some(viewer) = self.viewers.remove(&conn) {
            viewer.handle.flow.lock().forget(WORLD_KEY);
        }
        self.schedule.leave(conn);
    }

    /// One fan-out pass: seals the cells, and sends every due viewer one message with what
    /// changed in its view. Returns how many viewers got one.
    ///
    /// `scheduled` is the instant the pass was due on the world's timer, and the schedule (who
    /// is due, and when next) runs on it; `now` is the clock, for the sessions' windows and
    /// outboxes. A pass that runs late then does not shift a viewer's next due time past the
    /// next pass, which would skip it there: the schedule sees passes a whole number of ticks
    /// apart.
    pub fn tick(&mut self, scheduled: Instant, now: Instant) -> u64 {
        let mut changed = false;
        for cell in &mut self.cells {
            let before = cell.state.version();
            if cell.state.seal() != before {
                cell.previous = before;
                changed = true;
            }
        }
        if changed {
            self.world_version += 1;
        }
        let merged: u32 =
            self.publishes_since_pass.iter_mut().map(|n| std::mem::take(n).saturating_sub(1)).sum();
        self.figures.frames_merged.fetch_add(u64::from(merged), Ordering::Relaxed);
        let World { cells, viewers, schedule, figures, world_version, .. } = self;
        for (&conn, viewer) in viewers.iter_mut() {
            if viewer.handle.flow.take_rewind(WORLD_KEY).is_some() {
                viewer.held.iter_mut().for_each(|(_, held)| *held = None);
                schedule.rewind(conn, None);
            }
        }
        let mut due = Vec::new();
        schedule.due(scheduled, *world_version, &mut due);
        // Each cell's update from each version, encoded once per pass as its entry of
        // `ChannelUpdates.updates` (tag, length, message) and shared by every viewer at that
        // version: a viewer's message is these entries end to end.
        let mut encoded: Vec<Vec<Encoded>> = vec![Vec::new(); cells.len()];
        let mut gone = Vec::new();
        let mut sent = 0;
        let mut parts: Vec<Bytes> = Vec::new();
        // (index in `held`, version reached; `None`: a snapshot is due). A cell no entity has
        // touched is at version 0, and a viewer that got its snapshot holds `Some(0)`.
        let mut advanced: Vec<(usize, Option<Version>)> = Vec::new();
        for Due { id: conn, from } in due {
            let Some(viewer) = viewers.get_mut(&conn) else { continue };
            // The window is asked only when a cell in view moved on: a pass finds nothing new
            // for a viewer in about a third of passes (50 Hz passes, 30 fps servers), and the
            // window's lock is shared with the viewer's session on an I/O thread. A viewer
            // without room is refused before any of its deltas is encoded.
            let stale =
                viewer.held.iter().any(|&(cell, held)| held != Some(cells[cell as usize].state.version()));
            if stale && let Err(hold) = viewer.handle.flow.room(now) {
                figures.count_held_back(Some(hold));
                schedule.record(conn, scheduled, Outcome::Refused);
                continue;
            }
            parts.clear();
            advanced.clear();
            // Cells this viewer gets the snapshot of in place of its own delta, counted once sent.
            let mut catch_up = 0;
            for (at_held, &(cell, held)) in viewer.held.iter().enumerate() {
                let c = &mut cells[cell as usize];
                let version = c.state.version();
                if held == Some(version) {
                    continue;
                }
                let cache = &mut encoded[cell as usize];
                // A viewer whose version predates the cell's latest change (its window held it
                // back, or it is due less often than the cell changes) would need a delta of its
                // own, from that version. When the latest change alone was at least half a
                // snapshot (characters that all move every frame), such a delta would be at
                // least that large: the viewer gets the cell's snapshot, which every such viewer
                // shares. So catching up costs one encoding per cell and pass, however many
                // versions the viewers behind hold. The latest change's size is known once its
                // delta was encoded (for the viewers that keep up); until then, and when no
                // viewer keeps up, a viewer behind gets its own delta.
                let mut base = held.unwrap_or(0);
                let k = codec_index(viewer.codec);
                if base != 0 && base < c.previous && c.latest_len[k].0 == c.previous {
                    if c.snapshot_len[k] == 0 {
                        entry(cache, c, cell, 0, viewer.codec, figures);
                    }
                    let full = c.snapshot_len[k];
                    if full > 0 && c.latest_len[k].1 * SNAPSHOT_INSTEAD_DEN >= full * SNAPSHOT_INSTEAD_NUM {
                        base = 0;
                        catch_up += 1;
                    }
                }
                let at = entry(cache, c, cell, base, viewer.codec, figures);
                match &cache[at].2 {
                    Some((field, to)) => {
                        parts.push(field.clone());
                        advanced.push((at_held, Some(*to)));
                    }
                    // The history for a delta from `held` is gone: a snapshot next pass.
                    None => advanced.push((at_held, None)),
                }
            }
            if parts.is_empty() {
                for &(at, to) in &advanced {
                    viewer.held[at].1 = to;
                }
                let outcome =
                    if from.is_some() { Outcome::Empty } else { Outcome::Sent { to: *world_version } };
                schedule.record(conn, scheduled, outcome);
                continue;
            }
            let next = Vec::with_capacity(parts.len());
            let update = PushParts { topic: "channel.updates", parts: std::mem::replace(&mut parts, next) };
            match viewer.handle.offer_update_parts(now, WORLD_KEY, from, update) {
                Ok(()) => {
                    for &(at, to) in &advanced {
                        viewer.held[at].1 = to;
                    }
                    figures.fanouts.fetch_add(1, Ordering::Relaxed);
                    figures.catch_up_snapshots.fetch_add(catch_up, Ordering::Relaxed);
                    sent += 1;
                    schedule.record(conn, scheduled, Outcome::Sent { to: *world_version });
                }
                Err(PushError::Full) => {
                    figures.count_held_back(None);
                    schedule.record(conn, scheduled, Outcome::Refused);
                }
                Err(PushError::Closed) => gone.push(conn),
            }
        }
        for conn in gone {
            self.leave_view(conn);
        }
        sent
    }
}
