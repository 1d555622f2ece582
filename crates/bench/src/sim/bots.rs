//! Simulated players over the network: each bot subscribes to the world channel, rebuilds it
//! with a replica, measures how often updates arrive and how old they are, and drives its
//! character with the B3 input pattern (`bot.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use hdrhistogram::Histogram;
use prost::Message;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tickwire_client::{Client, ConnectOptions, Target};
use tickwire_state::{Replica, Schema, SchemaDef, Step, Value};
use tickwire_wire::proto::{ChannelMessage, ChannelSend, ChannelUpdate, Subscribe, SubscriptionOptions};
use tokio_util::sync::CancellationToken;

use super::bot::Bot;
use super::server::{BLOCKED, InputMessage, SCHEMA, TS_FIELD, now_us};
use super::world::Input;

/// What every bot adds to. Per-bot update counters give each client's own fan-out rate.
#[derive(Debug)]
pub struct BotStats {
    pub connected: AtomicU64,
    pub bytes: AtomicU64,
    pub decode_errors: AtomicU64,
    /// Update age (server publish to bot receipt), in microseconds.
    pub latency_us: Mutex<Histogram<u64>>,
    per_bot: Mutex<Vec<Arc<AtomicU64>>>,
}

impl Default for BotStats {
    fn default() -> BotStats {
        BotStats {
            connected: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            decode_errors: AtomicU64::new(0),
            latency_us: Mutex::new(Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds")),
            per_bot: Mutex::new(Vec::new()),
        }
    }
}

impl BotStats {
    /// Updates received so far by each bot.
    pub fn updates_per_bot(&self) -> Vec<u64> {
        self.per_bot.lock().map(|v| v.iter().map(|c| c.load(Ordering::Relaxed)).collect()).unwrap_or_default()
    }
}

/// How much a bot does with the updates it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BotMode {
    /// Apply every update to a replica of the world (checks every byte; costs CPU).
    Replica,
    /// Count updates and read their timestamp only, as the B3 clients do.
    Count,
}

/// Runs bot `index` until `stop`.
pub async fn run_bot(
    target: Target,
    index: usize,
    channel_id: u64,
    mode: BotMode,
    stats: Arc<BotStats>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let mut opts = ConnectOptions::new(target);
    let player = format!("bot-{index}");
    opts.token = player.clone();
    opts.client_name = "tickwire-sim-bot".into();
    let client = Client::connect(opts).await.with_context(|| format!("connecting {player}"))?;
    let sub = Subscribe { channel_id, options: Some(SubscriptionOptions::default()) };
    client.call("channel.subscribe", sub.encode_to_vec().into()).await.context("subscribing")?;
    let schema = Schema::new(SchemaDef::parse(SCHEMA, "world.json")?)?;
    let mut replica = Replica::new(schema);
    let counter = Arc::new(AtomicU64::new(0));
    if let Ok(mut v) = stats.per_bot.lock() {
        v.push(counter.clone());
    }
    stats.connected.fetch_add(1, Ordering::Relaxed);

    let mut bot =
        Bot::new(SmallRng::seed_from_u64(index as u64), (index as f32 * 0.7) % std::f32::consts::TAU);
    send_input(&client, channel_id, &player, Input { forward: true, yaw: bot.yaw(), jump: false }).await?;
    let mut second = tokio::time::interval(Duration::from_secs(1));
    second.tick().await;
    let result = loop {
        tokio::select! {
            () = stop.cancelled() => break Ok(()),
            _ = second.tick() => {
                if let Some(input) = bot.every_second() {
                    send_input(&client, channel_id, &player, input).await?;
                }
            }
            push = client.next_push() => {
                let Some(push) = push else { break Err(anyhow::anyhow!("{player}: the session ended")) };
                if push.topic == "channel.message" {
                    // The server says our character hit something: turn around.
                    if ChannelMessage::decode(push.body).is_ok_and(|m| m.body == BLOCKED)
                        && let Some(input) = bot.observe(true, bot.yaw())
                    {
                        send_input(&client, channel_id, &player, input).await?;
                    }
                    continue;
                }
                if push.topic != "channel.update" {
                    continue;
                }
                let Ok(update) = ChannelUpdate::decode(push.body) else { continue };
                stats.bytes.fetch_add(update.update.len() as u64, Ordering::Relaxed);
                let ts = match mode {
                    BotMode::Replica => {
                        if replica.apply(&update.update).is_err() {
                            stats.decode_errors.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        match replica.get(&[Step::Field(TS_FIELD as u16)]) {
                            Some(Value::Int(ts)) => Some(ts),
                            _ => None,
                        }
                    }
                    BotMode::Count => peek_ts(&update.update),
                };
                counter.fetch_add(1, Ordering::Relaxed);
                if let Some(ts) = ts
                    && let Ok(mut h) = stats.latency_us.lock()
                {
                    let _ = h.record((now_us() - ts).max(1) as u64);
                }
            }
        }
    };
    stats.connected.fetch_sub(1, Ordering::Relaxed);
    client.close().await;
    result
}

/// The publish timestamp of an update without decoding the rest: the header (kind, from, to),
/// then the root patch's first op, which is field 0 (`ts_us`) SET whenever it changed, since
/// the ops of a struct patch come in field order (docs/protocol.md 12.2).
fn peek_ts(update: &[u8]) -> Option<i64> {
    let mut buf = update.get(1..)?;
    prost::encoding::decode_varint(&mut buf).ok()?;
    prost::encoding::decode_varint(&mut buf).ok()?;
    let tag = prost::encoding::decode_varint(&mut buf).ok()?;
    if tag != 1 {
        return None;
    }
    let z = prost::encoding::decode_varint(&mut buf).ok()?;
    Some(((z >> 1) as i64) ^ -((z & 1) as i64))
}

async fn send_input(client: &Client, channel_id: u64, player: &str, input: Input) -> anyhow::Result<()> {
    let msg =
        InputMessage { player: player.to_owned(), forward: input.forward, yaw: input.yaw, jump: input.jump };
    let send =
        ChannelSend { channel_id, to_connection: 0, broadcast: 0, body: serde_json::to_vec(&msg)?.into() };
    client.call("channel.send", send.encode_to_vec().into()).await.context("sending input")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tickwire_state::{Codec, State};

    #[test]
    fn peek_ts_reads_the_timestamp_the_replica_sees() {
        let schema = Schema::new(SchemaDef::parse(SCHEMA, "world.json").unwrap()).unwrap();
        let mut state = State::new(schema);
        for ts in [0i64, 1, 1_700_000_000_000_000, -5] {
            state.set(&[Step::Field(TS_FIELD as u16)], Value::Int(ts)).unwrap();
            let v = state.seal();
            let update =
                state.prepare(v - 1, Codec::Binary).unwrap().update_for(&state, &"p".into(), false).unwrap();
            assert_eq!(peek_ts(&update.to_vec()), Some(ts), "{ts}");
        }
        assert_eq!(peek_ts(&[]), None);
        assert_eq!(peek_ts(&[1, 0]), None);
    }
}
