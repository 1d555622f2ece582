//! The spatial world (docs/protocol.md section 14): the `spatial.*` methods, entity messages
//! (`channel.send` to an entity) and areas of interest, served by one world task (`world.rs`
//! for the servers, `world/entities.rs` for entities and handovers, `view.rs` for what clients
//! see, `frame.rs` for what a pass encodes), and each pass delivered to the viewers by the
//! world itself or, with `channels.spatial_delivery = "io_threads"`, on the I/O threads of
//! their sessions (`delivery.rs`). Present when the
//! gateway's configuration has a `[spatial]` layout; [`SpatialRouter`] then sits in front of
//! the channel router and passes it everything else.
//!
//! Ids: cells are spatial channels `CELL_BASE + cell index` and entities are entity channels
//! `ENTITY_BASE + n`, both above any id `channel.create` gives out and below 2^53 (exact in
//! JSON and JavaScript).

mod delivery;
#[cfg(test)]
mod delivery_simulation;
mod frame;
#[cfg(any(test, feature = "harness"))]
pub(crate) mod harness;
mod inbox;
mod moves;
mod view;
mod world;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message;
use tickwire_fanout::Hold;
use tickwire_spatial::{Layout, LayoutConfig};
use tickwire_state::{Field, KeyKind, Limits, Schema, SchemaDef, Type};
use tickwire_transport::wake_batch::batch;
use tickwire_wire::proto::{
    ChannelRef, ChannelSend, Despawn, Publish, RegisterServer, Release, Request, Response, SetInterest,
    SpawnEntity, Status, Subscribe, UpdateChannel,
};
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

use crate::auth::Role;
use crate::channel::{ChannelConfigError, ChannelRouter, Figures, SpatialDelivery};
use crate::pass_times::{Names, PassTimes};
use crate::router::{Gauge, Reply, Router, SessionHandle, Startup, error_response};
use inbox::{Inboxes, Taker};
use world::World;

/// Spatial channel (cell) ids start here.
pub(crate) const CELL_BASE: u64 = 1 << 40;
/// Entity channel ids start here.
pub(crate) const ENTITY_BASE: u64 = 1 << 41;
/// The key of the world's `channel.updates` batches in a session's window of updates.
pub(crate) const WORLD_KEY: u64 = (1 << 42) - 1;
/// Ids of the spatial world end here.
const SPATIAL_END: u64 = 1 << 42;

/// Messages that wait for a handover to finish, per entity.
const MAX_WAITING: usize = 1024;
/// Messages an entity's server may leave unprocessed (sent, and not yet reported processed in a
/// publish or release) before senders get UNAVAILABLE.
const MAX_IN_FLIGHT: usize = 4096;
/// The bytes those messages may take, as a share of a session's unacknowledged-data bound: an
/// acquire carries them all in one message, which must fit it beside the entity's state.
const IN_FLIGHT_SHARE_OF_UNACKED: usize = 4;

/// Counters of held-back updates, one per reason: each bound of the window
/// (`tickwire_fanout::Hold`, at `Hold::index`), then `queue` at [`HELD_BACK_QUEUE`].
pub(crate) const HELD_BACK_REASONS: usize = Hold::ALL.len() + 1;

/// The counter of updates the session refused (its outbox full, the update too large to join
/// those in flight, or a resume's rewind pending).
pub(crate) const HELD_BACK_QUEUE: usize = Hold::ALL.len();

/// The `reason` label of `spatial_updates_held_back` for counter `index`.
pub(crate) fn held_back_reason(index: usize) -> &'static str {
    Hold::ALL.get(index).map_or("queue", |hold| hold.as_str())
}

#[cfg(test)]
mod held_back_reasons {
    use tickwire_fanout::Hold;

    use super::{HELD_BACK_QUEUE, HELD_BACK_REASONS, held_back_reason};

    #[test]
    fn name_each_bound_of_the_window_at_its_index_then_the_queue() {
        assert_eq!(HELD_BACK_REASONS, Hold::ALL.len() + 1);
        for hold in Hold::ALL {
            assert_eq!(held_back_reason(hold.index()), hold.as_str());
        }
        assert_eq!(held_back_reason(HELD_BACK_QUEUE), "queue");
        let labels: Vec<_> = (0..HELD_BACK_REASONS).map(held_back_reason).collect();
        assert_eq!(labels, ["probe", "overdue", "messages", "bytes", "large", "queue"]);
    }
}

/// The entity schema when `[channels.entity]` names none: a position, a heading and free data.
const DEFAULT_ENTITY_SCHEMA: &str = r#"{"fields": [
    {"name": "pos", "type": "vec3"},
    {"name": "yaw", "type": "float"},
    {"name": "data", "type": "string"}
]}"#;

/// The bounds and rates the world runs with, from `[channels]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SpatialSettings {
    pub limits: Limits,
    pub tick: Duration,
    pub fanout: Duration,
    pub max_entities: usize,
    pub max_view_cells: usize,
    pub max_waiting: usize,
    pub max_in_flight: usize,
    /// The bytes of an entity's messages in flight (see `IN_FLIGHT_SHARE_OF_UNACKED`).
    pub max_in_flight_bytes: usize,
    /// Where sessions on an I/O thread get their passes delivered.
    pub delivery: SpatialDelivery,
}

/// What the world counts, read by the metrics endpoint.
#[derive(Debug, Default)]
pub(crate) struct SpatialFigures {
    /// Handovers completed (a release answered).
    pub handovers: AtomicU64,
    /// Entities that moved from one cell to another (a handover counts here too).
    pub cell_changes: AtomicU64,
    pub entities: AtomicU64,
    /// Spatial servers registered in a slot.
    pub servers: AtomicU64,
    /// Publishes per slot (a server's frame rate).
    pub publishes: Vec<AtomicU64>,
    /// Publishes of a slot beyond the first between two passes: server frames that went out
    /// in one pass with the one before them, when both changed something (an empty publish
    /// counts too).
    pub frames_merged: AtomicU64,
    /// Entities of publishes that were not applied (not owned by the sender).
    pub ignored: AtomicU64,
    /// Entity messages accepted.
    pub messages: AtomicU64,
    /// `channel.updates` messages queued (one per viewer per pass).
    pub fanouts: AtomicU64,
    /// Passes in which a due viewer's window was full: its changes merge into a later one.
    pub coalesced: AtomicU64,
    /// The same, by what held the update back ([`held_back_reason`] names each).
    pub held_back: [AtomicU64; HELD_BACK_REASONS],
    /// Cell updates encoded by passes: one per cell, version sent from and codec, per pass.
    pub encodings: AtomicU64,
    /// Cell updates queued to a viewer whose version predated the cell's latest change as the
    /// cell's snapshot, instead of a delta of its own (`frame::base_for`).
    pub catch_up_snapshots: AtomicU64,
    pub viewers: AtomicU64,
    /// The world thread's CPU time per tick pass: the pass's work, without the time it waited
    /// for a core (which the wall-clock `channel_tick_duration_seconds` includes).
    pub pass_cpu: PassTimes,
    /// An I/O thread's CPU time per delivery run to the viewers of its sessions (`delivery.rs`):
    /// the rest of a pass's work. A run delivers every pass waiting (one, unless its thread
    /// got to it a tick or more late); runs with no pass or no viewer are not recorded.
    pub delivery_cpu: PassTimes,
    /// Passes an I/O thread's delivery dropped undelivered, having fallen
    /// `delivery::MAX_WAITING_PASSES` behind: its viewers catch up from later passes.
    pub passes_dropped: AtomicU64,
    /// Passes a delivery found waiting behind another when it ran: its I/O thread got to it
    /// a tick or more late.
    pub passes_waited: AtomicU64,
}

/// What the router asks of the world.
// `Left` is small beside a request; boxing requests would allocate per message to save the
// inbox's slots nothing: they are few (`channels.inbox_capacity`).
#[allow(clippy::large_enum_variant)]
enum Msg {
    /// A session's request, with the place held for its answer in the session's outbox.
    Request(SessionHandle, Op, Reply),
    /// A session ended.
    Left(u64),
}

/// A request the world answers.
enum Op {
    Register(RegisterServer),
    Spawn(SpawnEntity),
    Publish(Publish),
    Release(Release),
    Despawn(Despawn),
    Interest(SetInterest),
    Send(ChannelSend),
}

/// The most cells an area may touch with an outbox of `outbox_capacity` messages: leaving every
/// cell at once queues one UNSUBSCRIBED event per cell in the session's outbox, and 16 places
/// (or half the outbox, if that is more) stay for whatever else waits there, the answers the
/// session may be owed among them (`outbox::max_answers_owed`): 240 by default, enough for a
/// view of the report's whole 15 x 15 world.
fn max_view_cells(outbox_capacity: usize) -> usize {
    outbox_capacity.saturating_sub(16).max(outbox_capacity / 2).max(1)
}

/// Serves the spatial world in front of the channel router.
pub struct SpatialRouter {
    inbox: Inboxes,
    /// Taken by [`Router::on_start`], which starts the world's task.
    world: Mutex<Option<(World, Taker)>>,
    figures: Arc<SpatialFigures>,
    channel_figures: Arc<Figures>,
    slots: usize,
    cells: u32,
    fallback: Arc<ChannelRouter>,
}

fn is_spatial(id: u64) -> bool {
    (CELL_BASE..SPATIAL_END).contains(&id)
}

impl SpatialRouter {
    /// The world `layout` describes, with the entity schema and bounds of `config.channels`,
    /// in front of `channels`.
    pub fn new(
        layout: LayoutConfig,
        config: &crate::GatewayConfig,
        channels: ChannelRouter,
    ) -> Result<SpatialRouter, ChannelConfigError> {
        let layout = Layout::new(layout).map_err(ChannelConfigError::Layout)?;
        let c = &config.channels;
        let entity_def = match &c.entity.schema_file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| ChannelConfigError::Read { path: path.clone(), source })?;
                SchemaDef::parse(&text, &path.to_string_lossy())
                    .map_err(|source| ChannelConfigError::Schema { path: path.clone(), source })?
            }
            None => {
                SchemaDef::parse(DEFAULT_ENTITY_SCHEMA, "default.json").expect("the default schema parses")
            }
        };
        let entity_json: Arc<str> = serde_json::to_string(&entity_def).expect("schemas serialize").into();
        let cell_def = SchemaDef::new([Field::new(
            "entities",
            Type::map(KeyKind::Int, Type::Struct(entity_def.fields)),
        )]);
        let cell_json: Arc<str> = serde_json::to_string(&cell_def).expect("schemas serialize").into();
        let cell_schema: Arc<Schema> = Schema::new(cell_def).map_err(|source| {
            ChannelConfigError::Schema { path: c.entity.schema_file.clone().unwrap_or_default(), source }
        })?;
        let settings = SpatialSettings {
            limits: Limits { max_len: c.max_list_len, max_bytes: c.max_state_bytes, ..Limits::default() },
            tick: c.entity.tick(),
            fanout: c.entity.fanout(),
            max_entities: c.max_channels,
            max_view_cells: c
                .max_subscriptions_per_session
                .min(max_view_cells(config.limits.outbox_capacity)),
            max_waiting: MAX_WAITING,
            max_in_flight: MAX_IN_FLIGHT,
            max_in_flight_bytes: config.session.max_unacked_bytes / IN_FLIGHT_SHARE_OF_UNACKED,
            delivery: c.spatial_delivery,
        };
        let [sx, sz] = layout.config().servers;
        let slots = (sx * sz) as usize;
        let figures = Arc::new(SpatialFigures {
            publishes: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            ..SpatialFigures::default()
        });
        let cells = layout.cell_count();
        let world = World::new(layout, settings, cell_schema, cell_json, entity_json, figures.clone());
        let (inbox, taker) = Inboxes::new(c.inbox_capacity);
        Ok(SpatialRouter {
            inbox,
            world: Mutex::new(Some((world, taker))),
            figures,
            channel_figures: channels.shared_figures(),
            slots,
            cells,
            fallback: Arc::new(channels),
        })
    }

    /// Queues `msg` from `session` for the world, or answers why not.
    fn to_world(&self, session: &SessionHandle, id: u64, op: Op) -> Option<Response> {
        let permit = match self.inbox.of(session.role()).try_reserve() {
            Ok(permit) => permit,
            Err(mpsc::error::TrySendError::Full(())) => {
                return Some(error_response(
                    id,
                    Status::Unavailable,
                    "the spatial world is busy; retry".into(),
                ));
            }
            Err(mpsc::error::TrySendError::Closed(())) => {
                return Some(error_response(
                    id,
                    Status::Unavailable,
                    "the spatial world is not running".into(),
                ));
            }
        };
        match session.reply(id) {
            Ok(reply) => {
                permit.send(Msg::Request(session.clone(), op, reply));
                None
            }
            Err(refused) => Some(refused),
        }
    }

    fn on_spatial(&self, session: &SessionHandle, request: Request) -> Option<Response> {
        let id = request.id;
        let server = session.role() == Role::Server;
        let servers_only = |what: &str| {
            let msg = format!("{what} is for game servers (log in with a server credential)");
            Some(error_response(id, Status::PermissionDenied, msg))
        };
        macro_rules! decode {
            ($ty:ty) => {
                match <$ty>::decode(request.body) {
                    Ok(m) => m,
                    Err(e) => {
                        let msg = format!("malformed {}: {e}", stringify!($ty));
                        return Some(error_response(id, Status::InvalidArgument, msg));
                    }
                }
            };
        }
        let op = match request.method.as_str() {
            "spatial.interest" => Op::Interest(decode!(SetInterest)),
            method if !server => return servers_only(method),
            "spatial.register" => Op::Register(decode!(RegisterServer)),
            "spatial.spawn" => Op::Spawn(decode!(SpawnEntity)),
            "spatial.publish" => Op::Publish(decode!(Publish)),
            "spatial.release" => Op::Release(decode!(Release)),
            "spatial.despawn" => Op::Despawn(decode!(Despawn)),
            other => return Some(error_response(id, Status::NotFound, format!("unknown method `{other}`"))),
        };
        self.to_world(session, id, op)
    }

    /// The spatial channel a `channel.*` request names, if it names one.
    fn spatial_target(request: &Request) -> Option<u64> {
        let body = request.body.clone();
        let id = match request.method.as_str() {
            "channel.send" => ChannelSend::decode(body).ok()?.channel_id,
            "channel.subscribe" => Subscribe::decode(body).ok()?.channel_id,
            "channel.update" => UpdateChannel::decode(body).ok()?.channel_id,
            "channel.unsubscribe" | "channel.remove" | "channel.claim" => {
                ChannelRef::decode(body).ok()?.channel_id
            }
            _ => return None,
        };
        is_spatial(id).then_some(id)
    }
}

impl Router for SpatialRouter {
    fn on_request(&self, session: &SessionHandle, request: Request) -> Option<Response> {
        if request.method.starts_with("spatial.") {
            return self.on_spatial(session, request);
        }
        let Some(target) = Self::spatial_target(&request) else {
            return self.fallback.on_request(session, request);
        };
        let id = request.id;
        if request.method == "channel.send"
            && target >= ENTITY_BASE
            && let Ok(send) = ChannelSend::decode(request.body.clone())
        {
            return self.to_world(session, id, Op::Send(send));
        }
        let msg = format!(
            "channel {target} belongs to the spatial world: clients see cells through spatial.interest, \
             servers change entities with spatial.publish, and messages go to entities with channel.send"
        );
        Some(error_response(id, Status::InvalidArgument, msg))
    }

    fn on_push(&self, session: &SessionHandle, push: tickwire_wire::proto::Push) {
        self.fallback.on_push(session, push);
    }

    fn on_start(&self, startup: &Startup<'_>) -> std::io::Result<()> {
        self.fallback.on_start(startup)?;
        let Some((world, rx)) = self.world.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Ok(());
        };
        // Off the I/O threads: the world's publishes and passes would hold up every session of
        // the thread they ran on. A pass encodes the cells and delivers them itself or, with
        // `io_threads`, hands them to one delivery per I/O thread (`delivery.rs`). (Requests
        // to the world cross threads, one wake each: a few thousand a second.) Tracked, so the
        // gateway's shutdown waits for the world to stop.
        let task = run(world, rx, self.channel_figures.clone(), startup.stop.clone());
        tickwire_transport::dedicated_thread("tickwire-world", startup.tracker.track_future(task))
    }

    fn on_session_closed(&self, session: &SessionHandle) {
        let inbox = self.inbox.of(session.role()).clone();
        let conn = session.conn_id();
        // Delivered even when the inbox is momentarily full; never blocks this task.
        tokio::spawn(async move {
            let _ = inbox.send(Msg::Left(conn)).await;
        });
        self.fallback.on_session_closed(session);
    }

    fn gauges(&self) -> Vec<Gauge> {
        let f = &self.figures;
        let get = |n: &AtomicU64| n.load(Ordering::Relaxed);
        let mut out = self.fallback.gauges();
        out.extend([
            Gauge::new("spatial_cells", f64::from(self.cells)),
            Gauge::new("spatial_entities", get(&f.entities) as f64),
            Gauge::new("spatial_servers", get(&f.servers) as f64),
            Gauge::new("spatial_server_slots", self.slots as f64),
            Gauge::new("spatial_viewers", get(&f.viewers) as f64),
            Gauge::counter("spatial_handovers", get(&f.handovers)),
            Gauge::counter("spatial_cell_changes", get(&f.cell_changes)),
            Gauge::counter("spatial_publishes_ignored_entities", get(&f.ignored)),
            Gauge::counter("spatial_entity_messages", get(&f.messages)),
            Gauge::counter("spatial_fanouts", get(&f.fanouts)),
            Gauge::counter("spatial_updates_coalesced", get(&f.coalesced)),
            Gauge::counter("spatial_frames_merged", get(&f.frames_merged)),
            Gauge::counter("spatial_cell_encodings", get(&f.encodings)),
            Gauge::counter("spatial_catch_up_snapshots", get(&f.catch_up_snapshots)),
            Gauge::counter("spatial_delivery_passes_dropped", get(&f.passes_dropped)),
            Gauge::counter("spatial_delivery_passes_waited", get(&f.passes_waited)),
            // 0 once the world's task has stopped (and dropped its inbox): at shutdown, or if
            // it died.
            Gauge::new("spatial_world_running", if self.inbox.servers.is_closed() { 0.0 } else { 1.0 }),
        ]);
        out.extend(f.pass_cpu.gauges(Names {
            bucket: "spatial_pass_cpu_seconds_bucket",
            count: "spatial_pass_cpu_seconds_count",
            sum: "spatial_pass_cpu_seconds_sum",
        }));
        out.extend(f.delivery_cpu.gauges(Names {
            bucket: "spatial_delivery_cpu_seconds_bucket",
            count: "spatial_delivery_cpu_seconds_count",
            sum: "spatial_delivery_cpu_seconds_sum",
        }));
        for (i, n) in f.held_back.iter().enumerate() {
            out.push(
                Gauge::counter("spatial_updates_held_back", get(n)).label("reason", held_back_reason(i)),
            );
        }
        for (slot, n) in f.publishes.iter().enumerate() {
            out.push(Gauge::counter("spatial_server_publishes", get(n)).label("slot", slot.to_string()));
        }
        out
    }
}

/// The world's task: messages as they come, a fan-out pass every tick, until the gateway stops
/// or every sender is gone. Each pass is scheduled at the instant its tick was due on the timer,
/// not at the (later) instant it ran: see [`World::tick`]. The world's part of each pass
/// (encoding it and handing it to the deliveries, plus its own delivery: every viewer's by
/// default, and always those of sessions on no I/O thread) goes into the channels' `channel_tick_duration_seconds` as wall-clock time (the
/// world is one channel actor there) and into `spatial_pass_cpu_seconds` as this thread's CPU
/// time; the deliveries on the I/O threads record theirs in `spatial_delivery_cpu_seconds`.
/// What is ready is taken in this order: the stop, a due pass, then the inboxes' next message
/// (a game server's before a player's, with a turn for a waiting player every 32 servers'
/// messages: `inbox.rs`).
async fn run(
    mut world: World,
    mut inbox: Taker,
    figures: Arc<Figures>,
    stop: tokio_util::sync::CancellationToken,
) {
    // Made once: a `cancelled()` future per turn would register a waiter on the gateway-wide
    // token each time. And polled only when the token wakes it: each poll locks the token's
    // node and its waiter list, shared with every session.
    let stopped = tickwire_transport::when_woken(stop.cancelled_owned());
    tokio::pin!(stopped);
    let mut ticker = tokio::time::interval(world.settings.tick);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            biased;
            () = &mut stopped => break,
            due = ticker.tick() => {
                let started = Instant::now();
                let cpu = tickwire_transport::thread_cpu_time();
                batch(|| world.tick(due.into_std(), started));
                let elapsed = started.elapsed();
                if let (Some(before), Some(after)) = (cpu, tickwire_transport::thread_cpu_time()) {
                    world.figures.pass_cpu.record(after.saturating_sub(before));
                }
                world.figures.viewers.store(world.viewers.len() as u64, Ordering::Relaxed);
                figures.record_pass(elapsed);
            }
            msg = inbox.next() => match msg {
                Some(msg) => batch(|| on_msg(&mut world, msg, Instant::now())),
                None => break,
            },
        }
    }
}

fn on_msg(world: &mut World, msg: Msg, now: Instant) {
    let (s, op, mut reply) = match msg {
        Msg::Request(s, op, reply) => (s, op, reply),
        Msg::Left(conn) => return world.left(conn),
    };
    let id = reply.id();
    let response = match op {
        // These two answer themselves when what follows the answer must come after it.
        Op::Register(req) => world.register(&s, req, &mut reply, now),
        Op::Release(req) => world.release(&s, req, &mut reply),
        Op::Spawn(req) => Some(world.spawn(&s, req, id)),
        Op::Publish(req) => Some(world.publish(&s, req, id)),
        Op::Despawn(req) => Some(world.despawn(&s, req, id)),
        Op::Interest(req) => Some(world.set_interest(&s, req, id, now)),
        Op::Send(send) => Some(world.send(&s, send, id)),
    };
    if let Some(response) = response {
        reply.send(response);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;

    use super::*;

    /// A view's UNSUBSCRIBED events and the answers a session may be owed fit its outbox
    /// together, whatever its size (from 2: an outbox of 1 holds one or the other).
    #[test]
    fn a_views_events_and_the_answers_owed_fit_the_outbox() {
        for outbox in 2..=(1 << 20) {
            let both = max_view_cells(outbox) + crate::outbox::max_answers_owed(outbox);
            assert!(both <= outbox, "outbox {outbox}: {both}");
        }
    }

    #[tokio::test]
    async fn the_world_runs_as_a_tracked_task_until_stopped() {
        let overrides = ["spatial.cell_size=10.0", "spatial.cells=[2, 2]", "spatial.servers=[1, 1]"];
        let config =
            crate::GatewayConfig::load(None, &overrides.map(String::from)).expect("a spatial config");
        let layout = config.spatial.clone().expect("a layout");
        let channels = ChannelRouter::for_gateway(&config).expect("channels");
        let router = SpatialRouter::new(layout, &config, channels).expect("the router");
        let (stop, tracker) = (CancellationToken::new(), TaskTracker::new());
        let runtimes = [tokio::runtime::Handle::current()];
        router.on_start(&Startup { runtimes: &runtimes, stop: &stop, tracker: &tracker }).expect("started");
        assert_eq!(tracker.len(), 1, "the world's task is tracked");
        tracker.close();
        assert!(
            tokio::time::timeout(Duration::from_millis(200), tracker.wait()).await.is_err(),
            "the world runs until the gateway stops"
        );
        // About ten 20 ms passes ran, each with its CPU time recorded.
        let count = router.gauges().into_iter().find(|g| g.name == "spatial_pass_cpu_seconds_count");
        assert!(count.as_ref().is_some_and(|g| g.value >= 1.0), "{count:?}");
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), tracker.wait())
            .await
            .expect("the world's task ends when stopped");
        let running = router.gauges().into_iter().find(|g| g.name == "spatial_world_running");
        assert_eq!(running.map(|g| g.value), Some(0.0), "the world's inbox is closed");
    }

    /// With the default outbox, an area can see the report's whole world (15 x 15 cells: the
    /// live view does); a small outbox keeps half its places for the leaving events.
    #[test]
    fn the_default_outbox_lets_an_area_see_the_reports_whole_world() {
        let outbox = crate::GatewayConfig::default().limits.outbox_capacity;
        assert!(max_view_cells(outbox) >= 15 * 15, "{}", max_view_cells(outbox));
        assert_eq!(max_view_cells(16), 8);
    }

    /// Players that fill the world's inbox (here: a world not running, with room for 4) get
    /// UNAVAILABLE; a game server's requests still go through.
    #[tokio::test]
    async fn players_cannot_fill_the_inbox_game_servers_use() {
        let overrides = [
            "spatial.cell_size=10.0",
            "spatial.cells=[2, 2]",
            "spatial.servers=[1, 1]",
            "channels.inbox_capacity=4",
        ];
        let config =
            crate::GatewayConfig::load(None, &overrides.map(String::from)).expect("a spatial config");
        let layout = config.spatial.clone().expect("a layout");
        let router =
            SpatialRouter::new(layout, &config, ChannelRouter::for_gateway(&config).expect("channels"))
                .expect("the router");
        let (player, _player_rx) = SessionHandle::unattached(1, Role::Player, &config);
        let (server, _server_rx) = SessionHandle::unattached(2, Role::Server, &config);
        let request =
            |id: u64, method: &str, body: Vec<u8>| Request { id, method: method.into(), body: body.into() };
        let interest = SetInterest::default().encode_to_vec();
        for id in 0..4 {
            assert_eq!(router.on_request(&player, request(id, "spatial.interest", interest.clone())), None);
        }
        let refused = router.on_request(&player, request(4, "spatial.interest", interest));
        assert_eq!(refused.map(|r| r.status()), Some(Status::Unavailable), "the players' inbox is full");
        let publish = Publish::default().encode_to_vec();
        for id in 5..9 {
            assert_eq!(router.on_request(&server, request(id, "spatial.publish", publish.clone())), None);
        }
    }
}
