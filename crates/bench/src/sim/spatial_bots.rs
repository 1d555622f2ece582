//! Simulated players of the B3 `spatial` and `lod` scenarios: each bot has its character
//! spawned, sets its area of interest (`spatial`: a 30 m sphere; `lod`: every cell, with
//! level-of-detail bands) that follows the character only when it changes cell (the report's
//! "updated only on handover"), sends its inputs to its entity, and counts the `channel.updates`
//! messages it receives: versions checked per cell (no gap, no repeat), and the age of the
//! first entity in each cell update, read without decoding the rest (`peek_cell`). A bot in
//! [`BotMode::Replica`] also applies every cell update to a replica of the cell, built from the
//! cell schema of the gateway's `spatial.interest` answer: each must decode and apply to the
//! version held (a cell whose replica refused one is skipped until its next snapshot). It
//! counts the entity updates it received.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use prost::Message;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tickwire_client::{ConnectOptions, Connection, Event, Target, response_body};
use tickwire_state::{DecodeError, Replica, Schema, SchemaDef, Version};
use tickwire_wire::proto::{
    ChannelEvent, ChannelMessage, ChannelUpdates, Follow, InterestResult, LodBand, SetInterest, Sphere,
    SubscriptionOptions, Vec3, set_interest,
};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::bot::Bot;
use super::bots::{BotMode, BotStats, Connected, Requests, input_body, next_event, until_stopped};
use super::game::SpatialGame;
use super::server::{BLOCKED, now_us};
use super::spatial_server::{Interest, SpawnRequest, WorldSpec};
use super::world::Input;

/// The `lod` scenario's updates: 20 Hz, its fastest band.
pub const LOD_INTERVAL_MS: u32 = 50;

/// The `lod` scenario's bands (BENCHMARKS.md B3): within 10 m in every update (20 Hz), within
/// 50 m every 100 ms (10 Hz), beyond once a second.
pub fn lod_bands() -> Vec<LodBand> {
    vec![
        LodBand { within: 10.0, interval_ms: 0 },
        LodBand { within: 50.0, interval_ms: 100 },
        LodBand { within: 1000.0, interval_ms: 1000 },
    ]
}

/// The `spatial.interest` of a bot whose character spawned at `at` in `world`.
pub fn interest(world: &WorldSpec, at: [f32; 2]) -> SetInterest {
    let center = Some(Vec3 { x: at[0], y: 0.0, z: at[1] });
    let follow = Follow::Cell as i32;
    match world.interest {
        Interest::Sphere(radius) => {
            let area = set_interest::Area::Sphere(Sphere { center, radius });
            SetInterest { area: Some(area), follow, ..Default::default() }
        }
        Interest::Lod => {
            // Every cell from anywhere: the world's diagonal.
            let radius = 2.0 * world.half_size * std::f32::consts::SQRT_2;
            let area = set_interest::Area::Sphere(Sphere { center, radius });
            let options = SubscriptionOptions { fanout_interval_ms: LOD_INTERVAL_MS, ..Default::default() };
            SetInterest { area: Some(area), follow, options: Some(options), lod: lod_bands() }
        }
    }
}

/// Runs bot `index` until `stop`; `spawners[slot]` spawns characters in that slot's block. An
/// error before `stop` is counted in [`BotStats::errors`] and returned.
pub async fn run_spatial_bot(
    target: Target,
    index: usize,
    mode: BotMode,
    game: SpatialGame,
    stats: Arc<BotStats>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    // Setting up (connect, spawn, interest) waits on the gateway and a server: `stop` ends it
    // too, so an overloaded run still ends.
    until_stopped(&stats, &stop, session(target, index, mode, &game, &stats, &stop)).await
}

async fn session(
    target: Target,
    index: usize,
    mode: BotMode,
    game: &SpatialGame,
    stats: &BotStats,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    let mut opts = ConnectOptions::new(target);
    let player = format!("bot-{index}");
    opts.token = player.clone();
    opts.client_name = "tickwire-sim-spatial-bot".into();
    // The bot drives its session's `Connection` itself, with no `Client` task and queues between
    // it and the socket: the load shares the gateway's two cores, and what the bots save the
    // gateway gets. It never waits for an answer in its loop either (a player's client would
    // not stop reading while its input travels); answers are checked as they come.
    let mut conn = Connection::connect(opts).await.with_context(|| format!("connecting {player}"))?;
    let mut rng = SmallRng::seed_from_u64(index as u64);
    let at = game.arena.spawn(&mut rng);
    let yaw = rng.random_range(0.0..std::f32::consts::TAU);
    let (reply, entity) = oneshot::channel();
    let request = SpawnRequest { at, yaw, controller: conn.welcome().connection_id, reply };
    game.spawners[game.world.slot_of(at)].send(request).await.context("the spawning server is gone")?;
    let entity_id = entity.await.context("the spawning server is gone")?.context("spawning")?;
    let interest = interest(game.world, at);
    let mut requests = Requests::default();
    // Nothing is due to this bot before the answer: its cells' updates come after it. A push
    // before it (none is expected) is dropped.
    let (answer, _) = requests
        .call(&mut conn, &player, "spatial.interest", interest.encode_to_vec())
        .await
        .context("setting the area of interest")?;
    let mut replicas = match mode {
        BotMode::Replica => {
            // The cells' schema as the gateway gives it, as a player's client would use it.
            let result = InterestResult::decode(answer).context("the area of interest's answer")?;
            let schema = SchemaDef::parse(&result.cell_schema_json, "cell.json")
                .map_err(anyhow::Error::from)
                .and_then(|def| Ok(Schema::new(def)?))
                .context("the cell schema in the area of interest's answer")?;
            Some(CellReplicas::new(schema, stats.add_replica_bot(index)))
        }
        BotMode::Count => None,
    };
    let counter = stats.add_bot(index);
    let _connected = Connected::count(&stats.connected);

    let mut bot = Bot::new(SmallRng::seed_from_u64(index as u64 ^ 0x5EED), yaw);
    let input = Input { forward: true, yaw: bot.yaw(), jump: false };
    requests.send(&mut conn, "channel.send", input_body(entity_id, &player, input)?)?;
    let mut second = tokio::time::interval(Duration::from_secs(1));
    second.tick().await;
    // Made once: a `cancelled()` future made per event registers and drops a waiter each time;
    // and polled only when the token wakes it (see `until_stopped`).
    let cancelled = tickwire_transport::when_woken(stop.cancelled());
    tokio::pin!(cancelled);
    // The version of each cell in view this bot holds: a handful of cells (a 30 m sphere over
    // 20 m cells touches at most 16), so a scan of a short list, not a hash map's probes.
    let mut held = Held::default();
    // Ages read from one message, recorded together.
    let mut ages: Vec<u64> = Vec::new();
    let result = loop {
        conn.flush().await;
        let push = tokio::select! {
            () = &mut cancelled => break Ok(()),
            _ = second.tick() => {
                if let Some(input) = bot.every_second() {
                    requests.send(&mut conn, "channel.send", input_body(entity_id, &player, input)?)?;
                }
                continue;
            }
            event = next_event(&mut conn, &player) => match event? {
                Some(Event::Push(push)) => push,
                // An input refused (its entity gone, a busy world) ends the bot, as a failed call
                // did: it is counted as an error.
                Some(Event::Response(r)) => {
                    let id = r.id;
                    response_body(r).with_context(|| format!("{player}: input (request {id}) refused"))?;
                    continue;
                }
                _ => continue,
            },
        };
        match push.topic.as_str() {
            "channel.updates" => {
                // What does not parse is counted here; the replicas that missed it would refuse
                // the next delta, so they go now, without a second count.
                let Ok(batch) = ChannelUpdates::decode(push.body) else {
                    stats.decode_errors.fetch_add(1, Ordering::Relaxed);
                    if let Some(replicas) = &mut replicas {
                        replicas.drop_all();
                    }
                    continue;
                };
                let now = now_us();
                for update in batch.updates {
                    let Some(peeked) = peek_cell(&update.update) else {
                        stats.decode_errors.fetch_add(1, Ordering::Relaxed);
                        if let Some(replicas) = &mut replicas {
                            replicas.drop_cell(update.channel_id);
                        }
                        continue;
                    };
                    stats.check_chain(peeked.snapshot, peeked.from, held.get(update.channel_id));
                    let waited = held.set(update.channel_id, peeked.to, peeked.ts.is_some(), now);
                    if let Some(waited) = waited {
                        stats.longest_cell_wait_us.fetch_max(waited.max(0) as u64, Ordering::Relaxed);
                    }
                    if let Some(replicas) = &mut replicas
                        && replicas.apply(update.channel_id, peeked.snapshot, &update.update).is_err()
                    {
                        stats.decode_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Some(ts) = peeked.ts {
                        ages.push((now - ts).max(1) as u64);
                    }
                }
                stats.latency_us.record(&ages);
                ages.clear();
                counter.fetch_add(1, Ordering::Relaxed);
            }
            "channel.event" => {
                // Left the area: the cell's next update, if it comes back, is a snapshot.
                if let Ok(e) = ChannelEvent::decode(push.body) {
                    held.remove(e.channel_id);
                    if let Some(replicas) = &mut replicas {
                        replicas.remove(e.channel_id);
                    }
                }
            }
            "channel.message" => {
                if ChannelMessage::decode(push.body).is_ok_and(|m| m.body == BLOCKED)
                    && let Some(input) = bot.observe(true, bot.yaw())
                {
                    requests.send(&mut conn, "channel.send", input_body(entity_id, &player, input)?)?;
                }
            }
            _ => {}
        }
    };
    conn.close().await;
    result
}

/// What a bot holds of each cell in its view, sorted by cell: a handful of cells in `spatial`,
/// all 400 in `lod`.
#[derive(Debug, Default)]
struct Held(Vec<HeldCell>);

#[derive(Debug)]
struct HeldCell {
    cell: u64,
    version: Version,
    /// When (µs) its last update arrived, if that update carried a character.
    moving_since: Option<i64>,
}

impl Held {
    fn find(&self, cell: u64) -> Result<usize, usize> {
        self.0.binary_search_by_key(&cell, |h| h.cell)
    }

    fn get(&self, cell: u64) -> Option<Version> {
        self.find(cell).ok().map(|at| self.0[at].version)
    }

    /// Cell `cell`'s update to `version` arrived at `now`, carrying a character or not. Returns
    /// how long (µs) the cell had waited for it, if its previous update carried one and this
    /// one skips versions: the gateway had changes of the cell it did not send (a character
    /// that stood still, and then moved, made one change, and is not counted).
    fn set(&mut self, cell: u64, version: Version, moving: bool, now: i64) -> Option<i64> {
        let moving_since = moving.then_some(now);
        match self.find(cell) {
            Ok(at) => {
                let held = &mut self.0[at];
                let skipped = version > held.version + 1;
                let waited = held.moving_since.filter(|_| skipped).map(|since| now - since);
                (held.version, held.moving_since) = (version, moving_since);
                waited
            }
            Err(at) => {
                self.0.insert(at, HeldCell { cell, version, moving_since });
                None
            }
        }
    }

    fn remove(&mut self, cell: u64) {
        if let Ok(at) = self.find(cell) {
            self.0.remove(at);
        }
    }
}

/// A replica bot's copy of each cell in its view, and its count of entity updates received
/// (over every cell, including those it has left).
struct CellReplicas {
    schema: Arc<Schema>,
    /// Each cell in view (sorted), with its replica; `None` once the replica refused an
    /// update, until the cell's next snapshot.
    cells: Vec<(u64, Option<Replica>)>,
    /// Entity updates received over every replica, dropped ones included: what `entities`
    /// is told.
    total: u64,
    entities: Arc<AtomicU64>,
}

impl CellReplicas {
    fn new(schema: Arc<Schema>, entities: Arc<AtomicU64>) -> CellReplicas {
        CellReplicas { schema, cells: Vec::new(), total: 0, entities }
    }

    /// Applies cell `cell`'s update (`snapshot`: it is one). A cell's first update must be a
    /// snapshot. A refusal is returned once: the cell's replica is dropped, and its updates
    /// are skipped until its next snapshot starts a new one.
    fn apply(&mut self, cell: u64, snapshot: bool, update: &[u8]) -> Result<(), DecodeError> {
        let at = match self.find(cell) {
            Ok(at) => at,
            Err(at) => {
                self.cells.insert(at, (cell, Some(self.fresh())));
                at
            }
        };
        if self.cells[at].1.is_none() && snapshot {
            self.cells[at].1 = Some(self.fresh());
        }
        let applied = match &mut self.cells[at].1 {
            None => Ok(()),
            Some(replica) => {
                let before = replica.entries_applied();
                let applied = replica.apply(update).map(|_| ());
                self.total += replica.entries_applied() - before;
                applied
            }
        };
        if applied.is_err() {
            self.drop_cell(cell);
        }
        self.entities.store(self.total, Ordering::Relaxed);
        applied
    }

    /// Drops cell `cell`'s replica (its count stays in `total`) until the cell's next
    /// snapshot; a cell not seen yet waits for one too.
    fn drop_cell(&mut self, cell: u64) {
        match self.find(cell) {
            Ok(at) => self.cells[at].1 = None,
            Err(at) => self.cells.insert(at, (cell, None)),
        }
    }

    /// Where cell `cell` is in `cells`, or would go.
    fn find(&self, cell: u64) -> Result<usize, usize> {
        self.cells.binary_search_by_key(&cell, |(c, _)| *c)
    }

    /// Drops every cell's replica (an update the bot could not read may have touched any).
    fn drop_all(&mut self) {
        for (_, slot) in &mut self.cells {
            *slot = None;
        }
    }

    fn fresh(&self) -> Replica {
        Replica::new(self.schema.clone()).counting_entries()
    }

    /// Cell `cell` left the view.
    fn remove(&mut self, cell: u64) {
        if let Ok(at) = self.find(cell) {
            self.cells.remove(at);
        }
    }
}

/// What a counting bot reads of one cell's binary update.
#[derive(Debug, PartialEq, Eq)]
pub struct PeekedCell {
    pub snapshot: bool,
    pub from: Version,
    pub to: Version,
    /// The publish time of the first entity the update inserts, sets or patches, if it carries
    /// one.
    pub ts: Option<i64>,
}

/// Reads the header, then the first op of the `entities` map (root field 0) and, inside it,
/// field 0 of the entity (`ts_us`), which comes first whenever it is set (docs/protocol.md
/// 12.2). `None` if the header does not parse.
pub fn peek_cell(update: &[u8]) -> Option<PeekedCell> {
    let varint = |buf: &mut &[u8]| prost::encoding::decode_varint(buf).ok();
    let (&kind, mut buf) = update.split_first()?;
    let snapshot = match kind {
        0x01 => false,
        0x02 => true,
        _ => return None,
    };
    let from = varint(&mut buf)?;
    let to = varint(&mut buf)?;
    let ts = (|| {
        // Root field 0: SET (a whole map: INSERTs) or PATCH (a map patch).
        let ftag = varint(&mut buf)?;
        if ftag != 1 && ftag != 2 {
            return None;
        }
        let etag = varint(&mut buf)?.checked_sub(1)?;
        match etag & 3 {
            // INSERT: the key (a zigzag varint), then the value.
            0 => {
                varint(&mut buf)?;
            }
            // PATCH or SET: the value (or its patch) follows.
            1 | 3 => {}
            _ => return None,
        }
        // The entity's field 0 SET: the timestamp, zigzag.
        if varint(&mut buf)? != 1 {
            return None;
        }
        let z = varint(&mut buf)?;
        Some(((z >> 1) as i64) ^ -((z & 1) as i64))
    })();
    Some(PeekedCell { snapshot, from, to, ts })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::spatial_server::ENTITY_SCHEMA;
    use tickwire_state::{Codec, Field, Key, KeyKind, Patch, Schema, SchemaDef, State, Type};

    fn cell_state() -> State {
        let entity = SchemaDef::parse(ENTITY_SCHEMA, "e.json").unwrap();
        let cell =
            SchemaDef::new([Field::new("entities", Type::map(KeyKind::Int, Type::Struct(entity.fields)))]);
        State::new(Schema::new(cell).unwrap())
    }

    fn set(state: &mut State, id: u64, ts: i64, x: f32) {
        let line = format!(
            r#"{{"op":"set","path":"/entities/{id}","value":{{"ts_us":{ts},"pos":[{x},0,1],"yaw":1,"blocked":false}}}}"#
        );
        state.apply_patch(&Patch::parse_json(state.schema(), line.as_bytes()).unwrap()).unwrap();
    }

    fn update(state: &State, from: Version) -> Vec<u8> {
        state.prepare(from, Codec::Binary).unwrap().update_for(state, &Key::Int(0), false).unwrap().to_vec()
    }

    /// The replica bots' cells: each applies its own updates, a cell's first must be a
    /// snapshot, a refusal is reported once and the cell's deltas are then skipped until its
    /// next snapshot, and the count of entity updates goes on over cells left.
    #[test]
    fn cell_replicas_apply_each_cells_updates_and_count_the_entities() {
        let entities = Arc::new(AtomicU64::new(0));
        let (mut a, mut b) = (cell_state(), cell_state());
        let mut replicas = CellReplicas::new(a.schema().clone(), entities.clone());
        let count = || entities.load(Ordering::Relaxed);
        set(&mut a, 1, 10, 1.0);
        set(&mut a, 2, 10, 2.0);
        let a1 = a.seal();
        set(&mut b, 3, 10, 3.0);
        let b1 = b.seal();
        set(&mut b, 3, 11, 3.5);
        let b2 = b.seal();
        // A delta for a cell the bot has no snapshot of is refused, once; the cell's deltas are
        // then skipped until a snapshot.
        assert!(replicas.apply(8, false, &update(&b, b1)).is_err());
        set(&mut b, 3, 12, 4.0);
        b.seal();
        assert!(replicas.apply(8, false, &update(&b, b2)).is_ok(), "skipped, not refused again");
        assert_eq!(count(), 0);
        replicas.apply(8, true, &update(&b, 0)).unwrap();
        assert_eq!(count(), 1, "the snapshot started a replica");

        replicas.apply(7, true, &update(&a, 0)).unwrap();
        assert_eq!(count(), 3, "two entities in cell 7, one in cell 8");
        set(&mut a, 2, 11, 2.5);
        a.seal();
        let a2 = a.version();
        replicas.apply(7, false, &update(&a, a1)).unwrap();
        assert_eq!(count(), 4);
        // A refusal by a replica that counted keeps what it counted.
        assert!(replicas.apply(7, false, &update(&a, a1)).is_err(), "a repeat");
        assert_eq!(count(), 4);
        replicas.apply(7, true, &update(&a, 0)).unwrap();
        assert_eq!(count(), 6);
        // An update the bot could not read: the cell waits for a snapshot, without a refusal.
        replicas.drop_cell(7);
        set(&mut a, 1, 12, 1.5);
        a.seal();
        assert!(replicas.apply(7, false, &update(&a, a2)).is_ok());
        assert_eq!(count(), 6);
        replicas.drop_cell(9);
        assert!(replicas.apply(9, false, &update(&b, b2)).is_ok(), "a cell not seen yet waits too");
        // Cell 7 leaves the view: its count stays; coming back starts from a snapshot.
        replicas.remove(7);
        assert_eq!(count(), 6);
        assert!(replicas.apply(7, false, &update(&a, a2)).is_err());
        replicas.apply(7, true, &update(&a, 0)).unwrap();
        assert_eq!(count(), 8);
        // Every replica dropped: their counts stay.
        replicas.drop_all();
        assert!(replicas.apply(8, false, &update(&b, b2)).is_ok());
        assert_eq!(count(), 8);
    }

    #[test]
    fn held_versions_are_set_replaced_and_removed_per_cell() {
        let mut held = Held::default();
        assert_eq!(held.get(7), None);
        assert_eq!(held.set(7, 3, true, 1_000), None, "a first update waited for nothing");
        held.set(9, 1, false, 1_000);
        // Versions 4 and 5 merged into one update: it waited.
        assert_eq!(held.set(7, 5, true, 1_400), Some(400));
        assert_eq!((held.get(7), held.get(9), held.0.len()), (Some(5), Some(1), 2));
        // The next version only (the cell did not change meanwhile): it did not wait.
        assert_eq!(held.set(7, 6, true, 9_000), None);
        // Cell 9's last update carried no character: it was not waited for.
        assert_eq!(held.set(9, 4, true, 2_100), None);
        assert_eq!(held.set(9, 8, false, 2_600), Some(500));
        held.remove(7);
        assert_eq!((held.get(7), held.get(9)), (None, Some(8)));
        // An update without a character (the cell emptied) ends the wait.
        assert_eq!(held.set(9, 10, true, 3_000), None);
    }

    #[test]
    fn peek_reads_the_first_entity_timestamp_as_the_gateway_encodes_it() {
        let mut state = cell_state();
        set(&mut state, 1 << 41, 1_700_000_000_000_000, 1.0);
        set(&mut state, (1 << 41) + 1, 5, 2.0);
        let v1 = state.seal();
        // A snapshot: the entities map SET whole, as INSERTs (in the map's own order).
        let p = peek_cell(&update(&state, 0)).unwrap();
        assert_eq!((p.snapshot, p.from, p.to), (true, 0, v1));
        assert!(matches!(p.ts, Some(1_700_000_000_000_000 | 5)), "{p:?}");
        // A delta where the first entity changed: its entry is SET or PATCHed.
        set(&mut state, 1 << 41, 1_700_000_000_000_777, 1.5);
        let v2 = state.seal();
        let p = peek_cell(&update(&state, v1)).unwrap();
        assert_eq!(p, PeekedCell { snapshot: false, from: v1, to: v2, ts: Some(1_700_000_000_000_777) });
        // A new entity: an INSERT with its key.
        set(&mut state, (1 << 41) + 9, 42, 3.0);
        let v3 = state.seal();
        assert_eq!(peek_cell(&update(&state, v2)).unwrap().ts, Some(42));
        // A removal carries no timestamp; the header still reads.
        state
            .remove(&[tickwire_state::Step::Field(0), tickwire_state::Step::Key(&Key::Int(1 << 41))])
            .unwrap();
        let v4 = state.seal();
        assert_eq!(
            peek_cell(&update(&state, v3)).unwrap(),
            PeekedCell { snapshot: false, from: v3, to: v4, ts: None }
        );
        assert_eq!(peek_cell(&[]), None);
        assert_eq!(peek_cell(&[9, 0, 0]), None);
    }
}
