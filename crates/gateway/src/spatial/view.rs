//! What clients see of the spatial world: each client's area of interest and the cells it
//! touches, and the world's side of a fan-out pass: seal the cells, encode what the pass's
//! viewers need ([`Frame`]), and hand it to the deliveries that send every due viewer one
//! `channel.updates` message with a delta (or a snapshot) of each cell in its view that changed
//! since the version it holds (`delivery.rs`).
//!
//! One message per client per pass, whatever the number of cells in view: a client near a
//! corner of four cells costs the gateway one write, not four. When a client is due is decided
//! by the pure scheduler of `tickwire-fanout`, and whether it may take more by its session's
//! window of updates in flight, as for any channel: a slow reader gets merged deltas at its
//! pace. A resume that dropped undelivered batches sends the client a snapshot of every cell in
//! its view.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use prost::Message;
use tickwire_fanout::Options;
use tickwire_spatial::{Area, Band, Bands};
use tickwire_wire::proto::{DeltaCodec, Follow, InterestResult, Response, SetInterest, Status, set_interest};

use super::delivery::{Delivery, Mailbox, View};
use super::frame::{CellFrame, Frame, base_for, codec_index};
use super::world::World;
use crate::channel::SpatialDelivery;
use crate::router::{SessionHandle, error_response};

/// A viewer, as the world keeps it: its area, and the cells and codec the cells' viewer counts
/// hold it under. What it holds of each cell is its delivery's.
pub(super) struct Viewer {
    handle: SessionHandle,
    /// As last set (not re-centred).
    area: Area,
    follow: Follow,
    codec: DeltaCodec,
    options: Options,
    /// The cells in view, sorted (at most `spatial.max_view_cells`).
    pub(super) cells: Vec<u32>,
    /// Level of detail: how often each cell in view may change in its updates, by distance.
    bands: Bands,
    /// The interval of each of `cells` (in order) by `bands`, from the area's reference point
    /// as last centred; empty without bands.
    intervals: Vec<Duration>,
    /// When it became a viewer.
    joined: Instant,
    mailbox: Arc<Mailbox>,
}

impl Viewer {
    /// The cells in view, in order.
    #[cfg(any(test, feature = "harness"))]
    pub(super) fn cells(&self) -> impl Iterator<Item = u32> + '_ {
        self.cells.iter().copied()
    }

    /// The level-of-detail interval of each cell in view, in order (empty without bands).
    #[cfg(test)]
    pub(super) fn intervals(&self) -> &[Duration] {
        &self.intervals
    }
}

fn point(v: Option<tickwire_wire::proto::Vec3>) -> [f32; 3] {
    v.map_or([0.0; 3], |v| [v.x, v.y, v.z])
}

/// The level-of-detail bands a `spatial.interest` asks for.
fn bands_of(req: &SetInterest) -> Result<Bands, tickwire_spatial::LodError> {
    let band = |b: &tickwire_wire::proto::LodBand| Band {
        within: b.within,
        interval: Duration::from_millis(u64::from(b.interval_ms)),
    };
    Bands::new(req.lod.iter().map(band))
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
            if let Some(viewer) = self.viewers.get(&conn) {
                viewer.mailbox.clear(conn);
            }
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
        let bands = match bands_of(&req) {
            Ok(bands) => bands,
            Err(e) => return error_response(id, Status::InvalidArgument, format!("level of detail: {e}")),
        };
        let follow = req.follow();
        let options = req.options.unwrap_or_default();
        if !self.controller_sessions.contains_key(&conn) {
            self.controller_sessions.insert(conn, client.clone());
            for id in self.controlled.get(&conn).into_iter().flatten() {
                if let Some(e) = self.entities.get_mut(id).filter(|e| e.controller_session.is_none()) {
                    e.controller_session = Some(client.clone());
                }
            }
        }
        let max_cells = self.settings.max_view_cells;
        let too_many = |what: String| {
            let msg = format!(
                "{what}; a view holds at most {max_cells} (channels.max_subscriptions_per_session, and limits.outbox_capacity less 16)"
            );
            error_response(id, Status::ResourceExhausted, msg)
        };
        // Judged before any cell is built, and for wherever a followed area may go: at most
        // four times the cells a view may hold (a disc touches at least about π/4 of the
        // cells its square spans, so no area that would fit away from the world's edges is
        // refused here).
        let most = area.most_cells(&self.layout);
        if most > 4 * max_cells as u64 {
            return too_many(format!("the area spans up to {most} cells"));
        }
        let centred = match follow {
            Follow::Off => area,
            _ => self.controlled_position(conn).map_or(area, |p| area.centred_at(p)),
        };
        let cells = self.cells_of_area(&centred);
        if cells.len() > max_cells {
            return too_many(format!("the area touches {} cells", cells.len()));
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
        self.set_view(client, area, follow, schedule, bands, now);
        let intervals = self.intervals(conn, &centred, &cells);
        self.show_in(conn, &cells, intervals, options.codec());
        let result = InterestResult {
            cells: cells.iter().map(|&c| self.cell_info(c)).collect(),
            cell_schema_json: self.cell_schema_json.to_string(),
        };
        Response { id, status: Status::Ok as i32, body: result.encode_to_vec().into(), error: String::new() }
    }

    /// Makes `client` a viewer (with no cells yet) unless it is one, with `area`, `follow` and
    /// `options` from now on.
    fn set_view(
        &mut self,
        client: &SessionHandle,
        area: Area,
        follow: Follow,
        options: Options,
        bands: Bands,
        now: Instant,
    ) {
        let conn = client.conn_id();
        if let Some(viewer) = self.viewers.get_mut(&conn) {
            viewer.area = area;
            viewer.follow = follow;
            viewer.options = options;
            viewer.bands = bands;
            return;
        }
        let mailbox = self.mailbox_for(client);
        let viewer = Viewer {
            handle: client.clone(),
            area,
            follow,
            codec: DeltaCodec::Binary,
            options,
            cells: Vec::new(),
            bands,
            intervals: Vec::new(),
            joined: now,
            mailbox,
        };
        self.viewers.insert(conn, viewer);
    }

    /// With `channels.spatial_delivery = "io_threads"`, the mailbox of the delivery for
    /// `client`'s I/O thread, started if it is the first viewer there; otherwise, and for a
    /// session on no I/O thread, the world's own delivery.
    fn mailbox_for(&mut self, client: &SessionHandle) -> Arc<Mailbox> {
        let on_io = self.settings.delivery == SpatialDelivery::IoThreads;
        let Some(io) = client.io.filter(|_| on_io) else { return self.inline.mailbox().clone() };
        if let Some(mailbox) = self.deliveries.get(&io) {
            return mailbox.clone();
        }
        let Some(runtime) = tickwire_transport::wake_batch::io_runtime(io) else {
            return self.inline.mailbox().clone();
        };
        let delivery = Delivery::new(self.figures.clone(), self.settings.tick);
        let mailbox = delivery.mailbox().clone();
        drop(runtime.spawn(delivery.serve()));
        self.deliveries.insert(io, mailbox.clone());
        mailbox
    }

    /// The interval of each of `cells` by viewer `conn`'s bands, from `area`'s reference point
    /// (empty without bands).
    fn intervals(&self, conn: u64, area: &Area, cells: &[u32]) -> Vec<Duration> {
        let Some(viewer) = self.viewers.get(&conn).filter(|v| !v.bands.is_empty()) else { return Vec::new() };
        let cells: Vec<_> = cells.iter().map(|&c| self.cell_at(c)).collect();
        viewer.bands.of_cells(&self.layout, area.reference_point(), &cells)
    }

    /// The cells `area` touches, sorted.
    fn cells_of_area(&self, area: &Area) -> Vec<u32> {
        let mut cells: Vec<u32> = area.cells(&self.layout).into_iter().map(|c| self.cell_index(c)).collect();
        // Already in order (row by row, column by column); sorting sorted input is one scan.
        cells.sort_unstable();
        cells.dedup();
        cells
    }

    /// The position of the entity `conn` controls (the latest spawned of those that exist), if
    /// any.
    fn controlled_position(&self, conn: u64) -> Option<[f32; 3]> {
        let latest = self.controlled.get(&conn)?.last()?;
        self.entities.get(latest).map(|e| e.position)
    }

    /// Makes `cells` (sorted, each once) the viewer's view in `codec`, with `intervals` (one
    /// per cell, or none): its delivery tells the client of the cells it leaves (an
    /// UNSUBSCRIBED event; the client drops their entities), and the next pass encodes a
    /// snapshot of each cell it enters.
    fn show_in(&mut self, conn: u64, cells: &[u32], intervals: Vec<Duration>, codec: DeltaCodec) {
        let World { viewers, view_count, held_back_count, wanted, .. } = self;
        let Some(viewer) = viewers.get_mut(&conn) else { return };
        debug_assert!(cells.windows(2).all(|w| w[0] < w[1]), "sorted, each once");
        let cells = cells.to_vec();
        let (old, new) = (codec_index(viewer.codec), codec_index(codec));
        let interval = |intervals: &[Duration], at: usize| intervals.get(at).copied().unwrap_or_default();
        for (at, &cell) in viewer.cells.iter().enumerate() {
            view_count[cell as usize][old] -= 1;
            held_back_count[cell as usize][old] -= u32::from(!interval(&viewer.intervals, at).is_zero());
        }
        for (at, &cell) in cells.iter().enumerate() {
            view_count[cell as usize][new] += 1;
            held_back_count[cell as usize][new] += u32::from(!interval(&intervals, at).is_zero());
            // A cell entered needs its snapshot; so may one whose level of detail now lets its
            // changes go sooner, held back until now (its entry is then in this pass, not
            // asked for at the next).
            let wants = match viewer.cells.binary_search(&cell) {
                Err(_) => true,
                Ok(was) => old != new || interval(&intervals, at) < interval(&viewer.intervals, was),
            };
            if wants {
                wanted.insert((cell, new));
            }
        }
        viewer.codec = codec;
        viewer.cells = cells;
        viewer.intervals = intervals;
        let view = View {
            handle: viewer.handle.clone(),
            codec,
            options: viewer.options,
            cells: viewer.cells.clone(),
            intervals: viewer.intervals.clone(),
            at: viewer.joined,
        };
        viewer.mailbox.show(conn, view);
    }

    /// After entity `entity_id`, controlled by `conn`, moved to `position`: the area of the
    /// controlling client follows, if it asked to (on every move, or only when the entity
    /// changed cell), and if it is the latest spawned of those the client controls (as
    /// `set_interest` centres on).
    pub fn follow(&mut self, entity_id: u64, conn: u64, position: [f32; 3], cell_changed: bool) {
        // Called for every entity of every publish: the cheap checks first (most entities
        // stay in their cell, and a bench's viewers re-centre only when it changes).
        let Some(viewer) = self.viewers.get(&conn) else { return };
        let moves = match viewer.follow {
            Follow::Off => false,
            Follow::Cell => cell_changed,
            Follow::Always => true,
        };
        if !moves || self.controlled.get(&conn).and_then(|ids| ids.last()) != Some(&entity_id) {
            return;
        }
        let area = viewer.area.centred_at(position);
        let cells = self.cells_of_area(&area);
        if cells.len() > self.settings.max_view_cells {
            return;
        }
        // With bands, the cells' distances moved with the area even if its cells did not;
        // measured again when the entity changes cell, so a client that follows every move
        // (`FOLLOW_ALWAYS`) does not cost a new view per move.
        if !cell_changed && cells == viewer.cells {
            return;
        }
        let intervals = self.intervals(conn, &area, &cells);
        if cells != viewer.cells || intervals != viewer.intervals {
            let codec = viewer.codec;
            self.show_in(conn, &cells, intervals, codec);
        }
    }

    /// A spatial server registered in `slot` sees the cells it receives: its block and
    /// `server_interest_border` cells around it (channeld's server interest), until it sets an
    /// area of its own.
    pub fn watch_block(&mut self, server: &SessionHandle, slot: u32, now: Instant) {
        let [sx, _] = self.layout.config().servers;
        let received = self.layout.cells_received_by([slot % sx, slot / sx]);
        let mut cells: Vec<u32> = received.iter().map(|&c| self.cell_index(c)).collect();
        cells.sort_unstable();
        let (lo, _) = self.layout.bounds(received[0]);
        let (_, hi) = self.layout.bounds(received[received.len() - 1]);
        let area = Area::Box { min: [lo[0], f32::MIN, lo[1]], max: [hi[0], f32::MAX, hi[1]] };
        // Whatever the session set before it registered, a server sees its block.
        let options =
            Options { interval: self.settings.fanout, delay: Duration::ZERO, skip_first_full_state: false };
        self.set_view(server, area, Follow::Off, options, Bands::default(), now);
        self.show_in(server.conn_id(), &cells, Vec::new(), DeltaCodec::Binary);
    }

    /// The clients that see at least one cell for which `shown` holds.
    pub fn viewers_of(&self, shown: impl Fn(u32) -> bool) -> Vec<SessionHandle> {
        self.viewers
            .values()
            .filter(|v| v.cells.iter().any(|&c| shown(c)))
            .map(|v| v.handle.clone())
            .collect()
    }

    /// `conn` is no longer a viewer; its delivery forgets it.
    pub fn leave_view(&mut self, conn: u64) {
        if let Some(viewer) = self.forget_viewer(conn) {
            viewer.mailbox.gone(conn);
        }
    }

    /// Removes the world's record of a viewer, and its cells from the viewer counts.
    fn forget_viewer(&mut self, conn: u64) -> Option<Viewer> {
        let viewer = self.viewers.remove(&conn)?;
        let k = codec_index(viewer.codec);
        for (at, &cell) in viewer.cells.iter().enumerate() {
            self.view_count[cell as usize][k] -= 1;
            let held_back = viewer.intervals.get(at).is_some_and(|i| !i.is_zero());
            self.held_back_count[cell as usize][k] -= u32::from(held_back);
        }
        Some(viewer)
    }

    /// One fan-out pass: seals the cells, encodes what the viewers need, and hands the pass to
    /// every delivery, running the world's own. Returns how many viewers the world's own
    /// delivery queued a message; those of the I/O threads' count in the figures.
    ///
    /// `scheduled` is the instant the pass was due on the world's timer, and the viewers'
    /// schedules (who is due, and when next) run on it; `now` is the clock, for the sessions'
    /// windows and outboxes. A pass that runs late then does not shift a viewer's next due time
    /// past the next pass, which would skip it there: the schedules see passes a whole number
    /// of ticks apart.
    pub fn tick(&mut self, scheduled: Instant, now: Instant) -> u64 {
        self.post_pass(scheduled);
        self.inline.run(now).sent
    }

    /// Logs the moves since the last pass in the cells they left, at the versions just sealed
    /// (in order of cells, so a pass's forced cells come in the same order from run to run).
    /// A viewer whose band holds back a cell an entity entered may get it out of turn, to go
    /// with the cell the entity left (`delivery/forced.rs`), from a version the pass has no
    /// delta from: so the pass encodes that cell's snapshot for such viewers.
    fn log_moves(&mut self) {
        let World { cells, moves_since_pass, wanted, held_back_count, .. } = self;
        let mut moves: Vec<(u32, u32)> = moves_since_pass.drain().collect();
        moves.sort_unstable();
        for (from, to) in moves {
            let arrived_at = cells[to as usize].state.version();
            let c = &mut cells[from as usize];
            let left_at = c.state.version();
            super::moves::record(&mut c.moves, [super::moves::Move { left_at, to, arrived_at }]);
            for k in (0..2).filter(|&k| held_back_count[to as usize][k] > 0) {
                wanted.insert((to, k));
            }
        }
    }

    /// [`World::tick`] but for the world's own delivery: the pass, encoded and handed to every
    /// delivery, the world's own included, which has not run it yet.
    pub fn post_pass(&mut self, scheduled: Instant) {
        self.send_waiting_acquires();
        let mut changed = Vec::new();
        for (index, cell) in self.cells.iter_mut().enumerate() {
            let before = cell.state.version();
            if cell.state.seal() != before {
                cell.previous = before;
                changed.push(index as u32);
            }
        }
        if !changed.is_empty() {
            self.world_version += 1;
        }
        self.log_moves();
        let merged: u32 =
            self.publishes_since_pass.iter_mut().map(|n| std::mem::take(n).saturating_sub(1)).sum();
        self.figures.frames_merged.fetch_add(u64::from(merged), Ordering::Relaxed);
        // What the deliveries found missing at the last pass, and the sessions they found gone.
        let mut wants = hashbrown::HashSet::new();
        let mailboxes: Vec<Arc<Mailbox>> =
            std::iter::once(self.inline.mailbox()).chain(self.deliveries.values()).cloned().collect();
        for mailbox in &mailboxes {
            let report = mailbox.take_report();
            wants.extend(report.wants);
            // Through the mailbox too: a view change posted since the delivery found the
            // session gone must not bring the viewer back there.
            for conn in report.gone {
                self.leave_view(conn);
            }
        }
        let World { cells, view_count, wanted, figures, .. } = self;
        let mut frame: Vec<CellFrame> = cells.iter().map(CellFrame::of).collect();
        let viewed = |cell: u32, k: usize| view_count[cell as usize][k] > 0;
        // The latest change of each cell, for the viewers that keep up.
        for &cell in &changed {
            for k in (0..2).filter(|&k| viewed(cell, k)) {
                let c = &mut cells[cell as usize];
                frame[cell as usize].add(c, cell, c.previous, k, figures);
            }
        }
        // Snapshots of the cells viewers entered, and what the deliveries asked for, chosen
        // as they will choose (after the latest changes above, whose lengths guide it).
        let asked = wanted.drain().map(|(cell, k)| (cell, None, k)).chain(wants);
        for (cell, held, k) in asked.filter(|&(cell, _, k)| viewed(cell, k)) {
            let base = base_for(held, &frame[cell as usize], k);
            frame[cell as usize].add(&mut cells[cell as usize], cell, base, k, figures);
        }
        let frame = Arc::new(Frame {
            scheduled,
            tick: self.settings.tick,
            world_version: self.world_version,
            cells: frame,
        });
        let mut dropped = 0;
        for mailbox in self.deliveries.values() {
            dropped += u64::from(mailbox.pass(frame.clone()));
        }
        dropped += u64::from(self.inline.mailbox().pass(frame));
        self.figures.passes_dropped.fetch_add(dropped, Ordering::Relaxed);
    }
}
