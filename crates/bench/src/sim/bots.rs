//! Simulated players over the network: each bot subscribes to the world channel, checks each
//! update's versions, measures how often updates arrive and how old they are, and drives its
//! character with the B3 input pattern (`bot.rs`). A bot in [`BotMode::Replica`] (every demo
//! bot, one B3 bot in [`REPLICA_EVERY`]) also rebuilds the world with a replica.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use prost::Message;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tickwire_client::{Client, ConnectOptions, Connection, Event, Target, response_body};
use tickwire_state::{Replica, Schema, SchemaDef, Version};
use tickwire_wire::proto::{
    ChannelMessage, ChannelSend, ChannelUpdate, Push, Subscribe, SubscriptionOptions,
};
use tokio_util::sync::CancellationToken;

use super::ages::Ages;
use super::bot::Bot;
use super::server::{BLOCKED, InputMessage, SCHEMA, now_us};
use super::world::Input;

/// What every bot adds to. Per-bot update counters give each client's own fan-out rate.
#[derive(Debug)]
pub struct BotStats {
    /// Bots connected and subscribed now.
    pub connected: AtomicU64,
    /// Updates a bot could not read: a header or timestamp that did not parse, or (a replica
    /// bot) an update its replica refused, counted once per replica dropped.
    pub decode_errors: AtomicU64,
    /// Bots that stopped with an error before they were told to stop (connect, subscribe,
    /// send or a lost session), each counted once.
    pub errors: AtomicU64,
    /// Deltas whose `from` was newer than the version the bot held: versions it never saw.
    pub version_gaps: AtomicU64,
    /// Deltas whose `from` was older than the version the bot held: versions it saw twice.
    pub version_repeats: AtomicU64,
    /// Update age (server publish to bot receipt), in microseconds.
    pub latency_us: Ages,
    /// How late the bots' threads ran a probe due every 10 ms, in microseconds
    /// (`load_lag`).
    pub load_lag_us: Ages,
    /// Nice levels the bots' threads were lowered below their process's (`--load-nice`, as
    /// applied).
    pub load_nice: AtomicI32,
    /// Spatial scenarios: the longest a cell in a bot's view whose last update carried a
    /// character waited for an update that merged several of its changes (so the gateway held
    /// changes back), in µs, over the bots, since it was last taken (`fetch_max`).
    pub longest_cell_wait_us: AtomicU64,
    /// Each bot's update counter, with the bot's index.
    per_bot: Counters,
    /// Each replica bot's count of entity updates received ([`Replica::entries_applied`]),
    /// with the bot's index, while it has its replica.
    entities_per_bot: Counters,
}

impl Default for BotStats {
    fn default() -> BotStats {
        BotStats {
            connected: AtomicU64::new(0),
            decode_errors: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            version_gaps: AtomicU64::new(0),
            version_repeats: AtomicU64::new(0),
            latency_us: Ages::default(),
            load_lag_us: Ages::default(),
            load_nice: AtomicI32::new(0),
            longest_cell_wait_us: AtomicU64::new(0),
            per_bot: Mutex::new(Vec::new()),
            entities_per_bot: Mutex::new(Vec::new()),
        }
    }
}

impl BotStats {
    /// Bot `index`'s own update counter.
    pub(crate) fn add_bot(&self, index: usize) -> Arc<AtomicU64> {
        add_counter(&self.per_bot, index)
    }

    /// Replica bot `index`'s count of entity updates received.
    pub(crate) fn add_replica_bot(&self, index: usize) -> Arc<AtomicU64> {
        add_counter(&self.entities_per_bot, index)
    }

    /// Replica bot `index` has lost its replica: its count leaves the figure.
    pub(crate) fn forget_replica_bot(&self, index: usize) {
        if let Ok(mut v) = self.entities_per_bot.lock() {
            v.retain(|(bot, _)| *bot != index);
        }
    }

    /// Counts a delta from `from` that reached a bot holding `held`: a gap if it starts at a
    /// version the bot never saw, a repeat if at one it had passed. Snapshots start anywhere.
    pub(crate) fn check_chain(&self, snapshot: bool, from: Version, held: Option<Version>) {
        match held {
            Some(have) if !snapshot && from > have => self.version_gaps.fetch_add(1, Ordering::Relaxed),
            Some(have) if !snapshot && from < have => self.version_repeats.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
    }

    /// Updates received so far by each bot, as (bot index, count).
    pub fn updates_per_bot(&self) -> Vec<(usize, u64)> {
        read_counters(&self.per_bot)
    }

    /// Entity updates received so far by each replica bot, as (bot index, count).
    pub fn entities_per_replica_bot(&self) -> Vec<(usize, u64)> {
        read_counters(&self.entities_per_bot)
    }
}

type Counters = Mutex<Vec<(usize, Arc<AtomicU64>)>>;

fn add_counter(counters: &Counters, index: usize) -> Arc<AtomicU64> {
    let counter = Arc::new(AtomicU64::new(0));
    if let Ok(mut v) = counters.lock() {
        v.push((index, counter.clone()));
    }
    counter
}

fn read_counters(counters: &Counters) -> Vec<(usize, u64)> {
    counters
        .lock()
        .map(|v| v.iter().map(|(bot, c)| (*bot, c.load(Ordering::Relaxed))).collect())
        .unwrap_or_default()
}

/// Each bot's updates per second between two readings of [`BotStats::updates_per_bot`] (of one
/// process or several, joined in any order) `seconds` apart. Bots are matched by index; a bot
/// missing from the first reading joined after it and counts from zero.
pub fn rates_between(first: &[(usize, u64)], last: &[(usize, u64)], seconds: f64) -> Vec<f64> {
    let before: std::collections::HashMap<usize, u64> = first.iter().copied().collect();
    last.iter()
        .map(|&(bot, n)| n.saturating_sub(before.get(&bot).copied().unwrap_or(0)) as f64 / seconds)
        .collect()
}

/// How much a bot does with the updates it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BotMode {
    /// Apply every update to a replica of the world (checks that every byte decodes and every
    /// delta applies to the version held; costs CPU), and count the entity updates received.
    /// A replica that refuses an update counts one decode failure and is dropped: a `single`
    /// bot goes on counting without it; a `spatial` bot's cell gets a new one at its next
    /// snapshot. One whose update did not parse at all is dropped the same way, without a
    /// second count.
    Replica,
    /// Count updates and read their timestamp only, as most B3 clients do.
    Count,
}

/// In B3, one bot in this many (bots 0, 100, 200, …) keeps a replica: the sample checks that
/// every update decodes and applies, in order, and counts the entity updates a client
/// receives. A few, because a replica costs the load CPU it shares with the gateway.
pub const REPLICA_EVERY: usize = 100;

impl BotMode {
    /// What B3 bot `index` does: [`BotMode::Replica`] for one in [`REPLICA_EVERY`].
    pub fn for_bot(index: usize) -> BotMode {
        if index.is_multiple_of(REPLICA_EVERY) { BotMode::Replica } else { BotMode::Count }
    }
}

/// Runs bot `index` until `stop`. The bot drives its session's `Connection` itself, with no
/// `Client` task and queues between it and the socket (the load shares the gateway's cores),
/// and sends its inputs without waiting for their answers, which it checks as they come. A lost
/// link is an error: on loopback it should not happen, and a resume would hide it. An error
/// before `stop` is counted in [`BotStats::errors`] and returned.
pub async fn run_bot(
    target: Target,
    index: usize,
    channel_id: u64,
    mode: BotMode,
    stats: Arc<BotStats>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    until_stopped(&stats, &stop, bot_session(target, index, channel_id, mode, &stats, &stop)).await
}

/// [`run_bot`] through a [`Client`], which reconnects and resumes when the link drops: for the
/// slow and frozen clients, whose links the gateway may drop by design.
pub async fn run_resuming_bot(
    target: Target,
    index: usize,
    channel_id: u64,
    mode: BotMode,
    stats: Arc<BotStats>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let session = resuming_bot_session(target, index, channel_id, mode, &stats, &stop);
    until_stopped(&stats, &stop, session).await
}

/// How long a bot's session has after `stop` to close its connection itself.
const CLOSE_GRACE: Duration = Duration::from_millis(500);

/// Runs a bot's `session` until it ends. At `stop` the session, which watches `stop` too, gets
/// [`CLOSE_GRACE`] to close its connection, and is dropped if it is still waiting then (on the
/// gateway while setting up, or on a call or a close over a slow link). An error before `stop`
/// is counted in [`BotStats::errors`] and returned.
pub(crate) async fn until_stopped(
    stats: &BotStats,
    stop: &CancellationToken,
    session: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let mut session = std::pin::pin!(session);
    // Polled only when the token wakes it, not on each of the session's wake-ups: a poll of
    // `cancelled()` locks the token's node and waiter list, which every bot shares.
    let result = tokio::select! {
        biased;
        r = &mut session => r,
        () = tickwire_transport::when_woken(stop.cancelled()) => tokio::time::timeout(CLOSE_GRACE, &mut session).await.unwrap_or(Ok(())),
    };
    if result.is_err() && !stop.is_cancelled() {
        stats.errors.fetch_add(1, Ordering::Relaxed);
    }
    result
}

fn connect_options(target: Target, player: &str) -> ConnectOptions {
    let mut opts = ConnectOptions::new(target);
    opts.token = player.to_owned();
    opts.client_name = "tickwire-sim-bot".into();
    opts
}

async fn bot_session(
    target: Target,
    index: usize,
    channel_id: u64,
    mode: BotMode,
    stats: &BotStats,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    let player = format!("bot-{index}");
    let opts = connect_options(target, &player);
    let mut conn = Connection::connect(opts).await.with_context(|| format!("connecting {player}"))?;
    let mut requests = Requests::default();
    let sub = Subscribe { channel_id, options: Some(SubscriptionOptions::default()) };
    // Pushes that come before the answer (none are expected: the channel answers before its
    // first update) are read after it, in order.
    let (_, early) = requests
        .call(&mut conn, &player, "channel.subscribe", sub.encode_to_vec())
        .await
        .context("subscribing")?;
    let mut tally = Tally::new(stats, index, mode)?;
    let _connected = Connected::count(&stats.connected);
    let mut bot = single_bot(index);
    let first = Input { forward: true, yaw: bot.yaw(), jump: false };
    requests.send(&mut conn, "channel.send", input_body(channel_id, &player, first)?)?;
    for push in early {
        if let Some(input) = tally.push(push, &mut bot) {
            requests.send(&mut conn, "channel.send", input_body(channel_id, &player, input)?)?;
        }
    }
    let mut second = tokio::time::interval(Duration::from_secs(1));
    second.tick().await;
    // Made once: a `cancelled()` future made per event registers and drops a waiter each time;
    // and polled only when the token wakes it (see `until_stopped`).
    let cancelled = tickwire_transport::when_woken(stop.cancelled());
    tokio::pin!(cancelled);
    let result = loop {
        conn.flush().await;
        let input = tokio::select! {
            () = &mut cancelled => break Ok(()),
            _ = second.tick() => bot.every_second(),
            event = next_event(&mut conn, &player) => match event? {
                Some(Event::Push(push)) => tally.push(push, &mut bot),
                // An input refused ends the bot, as a failed call did: it is counted as an
                // error.
                Some(Event::Response(r)) => {
                    let id = r.id;
                    response_body(r).with_context(|| format!("{player}: input (request {id}) refused"))?;
                    None
                }
                _ => None,
            },
        };
        if let Some(input) = input {
            requests.send(&mut conn, "channel.send", input_body(channel_id, &player, input)?)?;
        }
    };
    conn.close().await;
    result
}

async fn resuming_bot_session(
    target: Target,
    index: usize,
    channel_id: u64,
    mode: BotMode,
    stats: &BotStats,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    let player = format!("bot-{index}");
    let client = Client::connect(connect_options(target, &player))
        .await
        .with_context(|| format!("connecting {player}"))?;
    let sub = Subscribe { channel_id, options: Some(SubscriptionOptions::default()) };
    client.call("channel.subscribe", sub.encode_to_vec().into()).await.context("subscribing")?;
    let mut tally = Tally::new(stats, index, mode)?;
    let _connected = Connected::count(&stats.connected);

    let mut bot = single_bot(index);
    send_input(&client, channel_id, &player, Input { forward: true, yaw: bot.yaw(), jump: false }).await?;
    let mut second = tokio::time::interval(Duration::from_secs(1));
    second.tick().await;
    // Made once, as in `bot_session`.
    let cancelled = tickwire_transport::when_woken(stop.cancelled());
    tokio::pin!(cancelled);
    let result = loop {
        let input = tokio::select! {
            () = &mut cancelled => break Ok(()),
            _ = second.tick() => bot.every_second(),
            push = client.next_push() => {
                let Some(push) = push else { break Err(anyhow::anyhow!("{player}: the session ended")) };
                tally.push(push, &mut bot)
            }
        };
        if let Some(input) = input {
            send_input(&client, channel_id, &player, input).await?;
        }
    };
    client.close().await;
    result
}

/// `single` bot `index`'s walker, the same whichever way the bot is connected.
fn single_bot(index: usize) -> Bot {
    Bot::new(SmallRng::seed_from_u64(index as u64), (index as f32 * 0.7) % std::f32::consts::TAU)
}

/// A bot's requests, numbered; sent without waiting for their answers.
#[derive(Debug, Default)]
pub(crate) struct Requests {
    last: u64,
}

impl Requests {
    /// Queues request `method` and returns its id.
    pub(crate) fn send(&mut self, conn: &mut Connection, method: &str, body: Vec<u8>) -> anyhow::Result<u64> {
        self.last += 1;
        conn.send_request(self.last, method, body.into())?;
        Ok(self.last)
    }

    /// Sends request `method` and waits for its answer, for a bot setting up, before anything
    /// else is outstanding: an answer to any other id is an error, and so is a refusal. Returns
    /// the answer's body and the pushes that came before it, in order.
    pub(crate) async fn call(
        &mut self,
        conn: &mut Connection,
        player: &str,
        method: &str,
        body: Vec<u8>,
    ) -> anyhow::Result<(Bytes, Vec<Push>)> {
        let id = self.send(conn, method, body)?;
        let mut early = Vec::new();
        loop {
            conn.flush().await;
            match next_event(conn, player).await? {
                Some(Event::Response(r)) if r.id == id => return Ok((response_body(r)?, early)),
                Some(Event::Response(r)) => {
                    anyhow::bail!("{player}: an answer to request {} it never sent", r.id)
                }
                Some(Event::Push(push)) => early.push(push),
                _ => {}
            }
        }
    }
}

/// The session's next event; the link dropping or the gateway closing the session is an error
/// (on loopback neither should happen, and a resume would hide it), and so is a request from
/// the gateway (servers may not send clients requests; the `Client` refuses them too).
/// `None`: housekeeping only.
pub(crate) async fn next_event(conn: &mut Connection, player: &str) -> anyhow::Result<Option<Event>> {
    match conn.next_event().await.with_context(|| format!("{player}: the session"))? {
        Some(Event::LinkLost) => anyhow::bail!("{player}: the connection dropped"),
        Some(Event::Request(r)) => anyhow::bail!("{player}: the gateway sent a request ({})", r.method),
        Some(Event::Closed { reason, message }) => {
            anyhow::bail!("{player}: the gateway closed the session ({reason:?}: {message})")
        }
        event => Ok(event),
    }
}

/// What a `single` bot reads of the world channel: each update checked against the version it
/// holds, counted, and aged; in [`BotMode::Replica`], applied to a replica too.
struct Tally<'a> {
    stats: &'a BotStats,
    index: usize,
    counter: Arc<AtomicU64>,
    /// In [`BotMode::Replica`], until it refuses an update: the replica, and where its count of
    /// entity updates goes.
    replica: Option<(Replica, Arc<AtomicU64>)>,
    /// The version this bot's copy of the world is at (None before the first snapshot).
    held: Option<Version>,
}

impl<'a> Tally<'a> {
    fn new(stats: &'a BotStats, index: usize, mode: BotMode) -> anyhow::Result<Tally<'a>> {
        let replica = match mode {
            BotMode::Replica => {
                let schema = Schema::new(SchemaDef::parse(SCHEMA, "world.json")?)?;
                Some((Replica::new(schema).counting_entries(), stats.add_replica_bot(index)))
            }
            BotMode::Count => None,
        };
        let counter = stats.add_bot(index);
        Ok(Tally { stats, index, counter, replica, held: None })
    }

    /// Drops the replica for good, and its count from the figure, so that the figure keeps to
    /// bots that applied everything (the channel would send a snapshot only on a resume or a
    /// filter change).
    fn drop_replica(&mut self) {
        if self.replica.take().is_some() {
            self.stats.forget_replica_bot(self.index);
        }
    }

    /// Reads one push; returns the input the bot sends in answer, if any (the server says its
    /// character hit something: turn around).
    fn push(&mut self, push: Push, bot: &mut Bot) -> Option<Input> {
        match push.topic.as_str() {
            "channel.message" => ChannelMessage::decode(push.body)
                .is_ok_and(|m| m.body == BLOCKED)
                .then(|| bot.observe(true, bot.yaw()))
                .flatten(),
            "channel.update" => {
                self.update(push.body);
                None
            }
            _ => None,
        }
    }

    fn update(&mut self, body: Bytes) {
        let stats = self.stats;
        // An update that does not parse is counted here; the replica, which missed it, would
        // refuse the next delta: it goes now, without a second count.
        let parsed = ChannelUpdate::decode(body).ok().and_then(|u| peek(&u.update).map(|p| (u, p)));
        let Some((update, peeked)) = parsed else {
            stats.decode_errors.fetch_add(1, Ordering::Relaxed);
            self.drop_replica();
            return;
        };
        let now = now_us();
        // Each delta must start where the previous update ended.
        stats.check_chain(peeked.snapshot, peeked.from, self.held);
        self.held = Some(peeked.to);
        if let Some((replica, entities)) = &mut self.replica {
            match replica.apply(&update.update) {
                Ok(_) => entities.store(replica.entries_applied(), Ordering::Relaxed),
                Err(_) => {
                    stats.decode_errors.fetch_add(1, Ordering::Relaxed);
                    self.drop_replica();
                }
            }
        }
        // Every frame of the simulated server sets the timestamp, snapshots too.
        let Some(ts) = peeked.ts else {
            stats.decode_errors.fetch_add(1, Ordering::Relaxed);
            return;
        };
        self.counter.fetch_add(1, Ordering::Relaxed);
        stats.latency_us.record(&[(now - ts).max(1) as u64]);
    }
}

/// Holds one place in [`BotStats::connected`] for as long as it lives, however the bot ends.
pub(crate) struct Connected<'a>(&'a AtomicU64);

impl<'a> Connected<'a> {
    pub(crate) fn count(counter: &'a AtomicU64) -> Connected<'a> {
        counter.fetch_add(1, Ordering::Relaxed);
        Connected(counter)
    }
}

impl Drop for Connected<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a bot reads of a binary update without decoding the rest.
#[derive(Debug, PartialEq, Eq)]
struct Peeked {
    snapshot: bool,
    from: Version,
    to: Version,
    /// The publish timestamp, if the update sets it.
    ts: Option<i64>,
}

/// Reads the header (kind, from, to) and then the root patch's first op, which is field 0
/// (`ts_us`) SET whenever it changed, since the ops of a struct patch come in field order
/// (docs/protocol.md 12.2). `None` if the header does not parse.
fn peek(update: &[u8]) -> Option<Peeked> {
    let (&kind, mut buf) = update.split_first()?;
    let snapshot = match kind {
        0x01 => false,
        0x02 => true,
        _ => return None,
    };
    let from = prost::encoding::decode_varint(&mut buf).ok()?;
    let to = prost::encoding::decode_varint(&mut buf).ok()?;
    let ts = (|| {
        let tag = prost::encoding::decode_varint(&mut buf).ok()?;
        if tag != 1 {
            return None;
        }
        let z = prost::encoding::decode_varint(&mut buf).ok()?;
        Some(((z >> 1) as i64) ^ -((z & 1) as i64))
    })();
    Some(Peeked { snapshot, from, to, ts })
}

pub(crate) async fn send_input(
    client: &Client,
    channel_id: u64,
    player: &str,
    input: Input,
) -> anyhow::Result<()> {
    client
        .call("channel.send", input_body(channel_id, player, input)?.into())
        .await
        .context("sending input")?;
    Ok(())
}

/// The `channel.send` body of a player's `input` to `channel_id` (the `single` channel, or a
/// spatial bot's entity).
pub(crate) fn input_body(channel_id: u64, player: &str, input: Input) -> anyhow::Result<Vec<u8>> {
    let msg =
        InputMessage { player: player.to_owned(), forward: input.forward, yaw: input.yaw, jump: input.jump };
    let send =
        ChannelSend { channel_id, to_connection: 0, broadcast: 0, body: serde_json::to_vec(&msg)?.into() };
    Ok(send.encode_to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::server::TS_FIELD;
    use tickwire_state::{Codec, State, Step, Value};

    /// A replica bot counts every character's change; a replica that refuses an update counts
    /// one decode failure and is dropped (it leaves the entity figure), and the bot goes on
    /// counting updates without it.
    #[test]
    fn a_replica_bot_counts_entities_and_drops_a_replica_that_refuses_an_update() {
        let schema = Schema::new(SchemaDef::parse(SCHEMA, "world.json").unwrap()).unwrap();
        let mut state = State::new(schema);
        let frame = |state: &mut State, ts: i64, players: &[&str]| {
            state.set(&[Step::Field(TS_FIELD as u16)], Value::Int(ts)).unwrap();
            for p in players {
                let key = tickwire_state::Key::str(p);
                let blocked = [Step::Field(2), Step::Key(&key), Step::Field(2)];
                if state.get(&blocked).is_err() {
                    let character =
                        Value::Struct(vec![Value::Vec3([0.0; 3]), Value::Float(0.0), Value::Bool(false)]);
                    state.set(&blocked[..2], character).unwrap();
                }
                state
                    .set(&[Step::Field(2), Step::Key(&key), Step::Field(1)], Value::Float(ts as f64 / 100.0))
                    .unwrap();
            }
            state.seal()
        };
        let push = |state: &State, from: Version| {
            let update =
                state.prepare(from, Codec::Binary).unwrap().update_for(state, &"p9".into(), false).unwrap();
            ChannelUpdate { channel_id: 1, codec: 0, update: update.to_vec().into() }.encode_to_vec().into()
        };
        let stats = BotStats::default();
        let mut tally = Tally::new(&stats, 0, BotMode::Replica).unwrap();
        let v1 = frame(&mut state, 1, &["a", "b", "c"]);
        tally.update(push(&state, 0));
        frame(&mut state, 2, &["a", "b"]);
        tally.update(push(&state, v1));
        assert_eq!(stats.entities_per_replica_bot(), [(0, 5)], "three in the snapshot, then two");
        // A delta from a version the bot never had: a gap, and the replica refuses it, once.
        let v3 = frame(&mut state, 3, &["a"]);
        frame(&mut state, 4, &["c"]);
        tally.update(push(&state, v3));
        assert_eq!(stats.version_gaps.load(Ordering::Relaxed), 1);
        assert_eq!(stats.decode_errors.load(Ordering::Relaxed), 1);
        assert!(stats.entities_per_replica_bot().is_empty(), "the bot left the entity figure");
        let v5 = frame(&mut state, 5, &["b"]);
        tally.update(push(&state, v5 - 1));
        assert_eq!(stats.decode_errors.load(Ordering::Relaxed), 1, "no replica, no more refusals");
        assert_eq!(stats.updates_per_bot(), [(0, 4)], "every update counted");

        // An update that does not parse is one failure: the replica, which missed it, goes
        // with it instead of refusing the next delta.
        let stats = BotStats::default();
        let mut tally = Tally::new(&stats, 100, BotMode::Replica).unwrap();
        tally.update(push(&state, 0));
        let v6 = frame(&mut state, 6, &["a"]);
        tally.update(Bytes::from_static(&[0x1a, 0x02, 0xff, 0xff]));
        frame(&mut state, 7, &["a"]);
        tally.update(push(&state, v6));
        assert_eq!(stats.decode_errors.load(Ordering::Relaxed), 1);
        assert_eq!(stats.version_gaps.load(Ordering::Relaxed), 1, "the version it missed");
        assert!(stats.entities_per_replica_bot().is_empty());
    }

    #[test]
    fn peek_reads_the_header_and_the_timestamp_the_replica_sees() {
        let schema = Schema::new(SchemaDef::parse(SCHEMA, "world.json").unwrap()).unwrap();
        let mut state = State::new(schema);
        // Each differs from the one before (a write of the value held is no change).
        for ts in [1i64, 0, 1_700_000_000_000_000, -5] {
            state.set(&[Step::Field(TS_FIELD as u16)], Value::Int(ts)).unwrap();
            let v = state.seal();
            let update =
                state.prepare(v - 1, Codec::Binary).unwrap().update_for(&state, &"p".into(), false).unwrap();
            let peeked = peek(&update.to_vec()).unwrap();
            // A delta from version 0 is a snapshot.
            assert_eq!(peeked, Peeked { snapshot: v == 1, from: v - 1, to: v, ts: Some(ts) }, "{ts}");
        }
        let snapshot =
            state.prepare(0, Codec::Binary).unwrap().update_for(&state, &"p".into(), false).unwrap();
        let peeked = peek(&snapshot.to_vec()).unwrap();
        assert!(peeked.snapshot && peeked.from == 0 && peeked.to == state.version());
        assert_eq!(peek(&[]), None);
        assert_eq!(peek(&[1, 0]), None, "cut header");
        assert_eq!(peek(&[7, 0, 0]), None, "unknown kind");
    }
}
