//! Slow, frozen and resumed subscribers over real sockets, beside healthy ones
//! (docs/protocol.md 12.2 and 13.3).
//!
//! A game server writes a ~300-byte change at 50 Hz, stamping each with the time it was made.
//! Healthy subscribers read everything; one reads a quarter of the stream's bytes per second
//! and acknowledges what it reads; one stops reading for three seconds, then resumes its
//! session on a new connection. Before the window of updates in flight, the slow one got every
//! update one by one, each older than the last (22 s after 26 s), until RETRANSMIT_OVERFLOW
//! closed it, and the resumed one got its backlog first. With the window set out of reach
//! (`channels.update_window.min_bytes=400000`, `initial_bytes=400000`) this test fails: the
//! slow reader's p99 age is 4.6 s.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::channels::{client, create, next, schema, subscribe};
use prost::Message;
use tickwire_client::{Client, ConnectOptions, Connection, Event, Target};
use tickwire_state::{Replica, Value};
use tickwire_wire::proto::{ChannelType, ChannelUpdate, Push, Subscribe, SubscriptionOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const RUN: Duration = Duration::from_secs(6);
const PERIOD: Duration = Duration::from_millis(20);
const ENTRIES: usize = 40;

/// The `round` field holds the microseconds since `start` at which the change was made.
fn age(replica: &Replica, start: Instant) -> Duration {
    let Value::Struct(fields) = replica.value() else { panic!("a struct") };
    let Value::Int(made) = fields[0] else { panic!("round is an int") };
    start.elapsed().saturating_sub(Duration::from_micros(made as u64))
}

fn patch(start: Instant, round: u64) -> String {
    let mut lines =
        vec![format!(r#"{{"op":"set","path":"/round","value":{}}}"#, start.elapsed().as_micros())];
    for k in 0..ENTRIES {
        let hp = round * 1_000_000 + k as u64;
        lines.push(format!(r#"{{"op":"set","path":"/players/p{k}","value":{{"hp":{hp}}}}}"#));
    }
    lines.join("\n")
}

fn as_update(push: Push) -> Option<ChannelUpdate> {
    (push.topic == "channel.update").then(|| ChannelUpdate::decode(push.body).expect("a ChannelUpdate"))
}

/// A subscriber on the low-level connection, so the test decides when it reads.
async fn raw_subscriber(gw: &tickwire_gateway::RunningGateway, name: &str, ch: u64) -> Connection {
    let mut opts = ConnectOptions::new(common::tcp_target(gw));
    opts.token = name.into();
    let mut conn = Connection::connect(opts).await.unwrap();
    let req = Subscribe { channel_id: ch, options: Some(SubscriptionOptions::default()) };
    conn.send_request(1, "channel.subscribe", req.encode_to_vec().into()).unwrap();
    conn.flush().await;
    conn
}

/// The next channel update on `conn`, answering acks and heartbeats on the way; `None` if the
/// link dropped, or if `within` is given and no update came in that time.
async fn next_update(conn: &mut Connection, within: Option<Duration>) -> Option<ChannelUpdate> {
    loop {
        let event = match within {
            // `next_event` is cancel-safe; the flush below is not, so only the wait is timed.
            Some(within) => tokio::time::timeout(within, conn.next_event()).await.ok()?,
            None => conn.next_event().await,
        };
        conn.flush().await;
        match event.expect("the session goes on") {
            Some(Event::Push(push)) => {
                if let Some(update) = as_update(push) {
                    return Some(update);
                }
            }
            Some(Event::Closed { reason, message }) => panic!("closed: {reason:?} {message}"),
            Some(Event::LinkLost) => return None,
            _ => {}
        }
    }
}

/// A link that carries the gateway's bytes to the client at `bytes_per_s`, in small pieces,
/// and the client's bytes to the gateway at full speed: a slow reader whose client still
/// handles and acknowledges everything as soon as it arrives.
async fn slow_link(upstream: SocketAddr, bytes_per_s: f64) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let Ok((down, _)) = listener.accept().await else { return };
        let Ok(up) = TcpStream::connect(upstream).await else { return };
        let (mut down_read, mut down_write) = down.into_split();
        let (mut up_read, mut up_write) = up.into_split();
        tokio::spawn(async move { tokio::io::copy(&mut down_read, &mut up_write).await });
        let mut piece = [0u8; 64];
        let began = tokio::time::Instant::now();
        let mut carried = 0usize;
        loop {
            let Ok(n) = up_read.read(&mut piece).await else { return };
            if n == 0 || down_write.write_all(&piece[..n]).await.is_err() {
                return;
            }
            carried += n;
            tokio::time::sleep_until(began + Duration::from_secs_f64(carried as f64 / bytes_per_s)).await;
        }
    });
    addr
}

/// Reads and applies updates until `RUN` is over; returns the age of each one read after the
/// first second.
async fn read_all(c: &Client, start: Instant) -> Vec<Duration> {
    let mut replica = Replica::new(schema());
    let mut ages = Vec::new();
    while start.elapsed() < RUN {
        let update = ChannelUpdate::decode(next(c, "channel.update").await).unwrap();
        replica.apply(&update.update).expect("every update applies: no gap, no repeat");
        if start.elapsed() > Duration::from_secs(1) {
            ages.push(age(&replica, start));
        }
    }
    ages
}

fn p99(mut ages: Vec<Duration>) -> Duration {
    ages.sort();
    ages[(ages.len() - 1) * 99 / 100]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_frozen_and_resumed_subscribers_get_fresh_state_beside_healthy_ones() {
    let gw = common::start(&["metrics.listen=\"127.0.0.1:0\""]).await;
    let server = client(&gw, "server:game-server").await;
    let ch = create(&server, ChannelType::Global).await.unwrap().channel_id;
    let start = Instant::now();
    let writer = tokio::spawn(async move {
        let mut round = 0;
        let mut tick = tokio::time::interval(PERIOD);
        while start.elapsed() < RUN + Duration::from_millis(500) {
            tick.tick().await;
            round += 1;
            common::channels::update(&server, ch, &patch(start, round)).await.unwrap();
        }
        round
    });

    // The stream's bytes per second, from one delta's size.
    let probe = client(&gw, "probe").await;
    subscribe(&probe, ch, SubscriptionOptions::default()).await.unwrap();

    let mut healthy = Vec::new();
    for i in 0..3 {
        let c = client(&gw, &format!("healthy-{i}")).await;
        subscribe(&c, ch, SubscriptionOptions::default()).await.unwrap();
        healthy.push(c);
    }
    let mut frozen = raw_subscriber(&gw, "frozen", ch).await;

    let frozen_run = async move {
        // Takes its snapshot, then reads nothing for three seconds (the link stays up: the
        // gateway's read timeout is six), then resumes on a new connection.
        let mut replica = Replica::new(schema());
        let first = next_update(&mut frozen, None).await.unwrap();
        replica.apply(&first.update).unwrap();
        // Everything already read goes to the replica first, so that what comes after the
        // resume is what the gateway sent after it.
        while let Some(update) = next_update(&mut frozen, Some(Duration::from_millis(5))).await {
            replica.apply(&update.update).unwrap();
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        frozen.resume().await.expect("the session resumes");
        let resumed_at = Instant::now();
        let merged = next_update(&mut frozen, None).await.expect("an update after the resume");
        replica.apply(&merged.update).expect("the merged update applies to what the replica held");
        let first_age = age(&replica, start);
        let waited = resumed_at.elapsed();
        // Then live updates, one per change.
        let mut live = 0;
        while start.elapsed() < RUN {
            let update = next_update(&mut frozen, None).await.unwrap();
            replica.apply(&update.update).unwrap();
            live += 1;
        }
        (first_age, waited, live)
    };

    let stream_rate = {
        let first = ChannelUpdate::decode(next(&probe, "channel.update").await);
        assert!(first.is_ok());
        // A delta carries the 20 entries and the stamp: measure one.
        let delta = ChannelUpdate::decode(next(&probe, "channel.update").await).unwrap();
        delta.update.len() as f64 / PERIOD.as_secs_f64()
    };
    assert!(stream_rate > 5_000.0, "a realistic stream: {stream_rate} B/s");
    let mut opts = ConnectOptions::new(Target::Tcp(slow_link(gw.tcp_addrs()[0], stream_rate / 4.0).await));
    opts.token = "slow".into();
    let slow = Client::connect(opts).await.unwrap();
    subscribe(&slow, ch, SubscriptionOptions::default()).await.unwrap();

    let (rounds, healthy_ages, slow_ages, (first_age, waited, live)) = tokio::join!(
        writer,
        futures_util::future::join_all(healthy.iter().map(|c| read_all(c, start))),
        read_all(&slow, start),
        frozen_run,
    );
    let rounds = rounds.expect("the writer ran");
    eprintln!(
        "rounds {rounds}; healthy updates {:?}, p99 age {:?}; slow: {} updates, p99 age {:?}, max {:?}; \
         resumed: first update {first_age:?} old after {waited:?}, then {live} live",
        healthy_ages.iter().map(Vec::len).collect::<Vec<_>>(),
        healthy_ages.iter().map(|a| p99(a.clone())).collect::<Vec<_>>(),
        slow_ages.len(),
        p99(slow_ages.clone()),
        slow_ages.iter().max(),
    );

    // The slow reader was never closed (`next` panics on a closed session), kept getting updates,
    // and they stayed fresh: merged at its pace instead of queued.
    assert!(slow_ages.len() > 20, "the slow reader kept getting updates: {}", slow_ages.len());
    assert!(p99(slow_ages) < Duration::from_secs(1));
    // The resumed subscriber got one merged update with the present state, not its backlog.
    assert!(first_age < Duration::from_millis(500), "first update after the resume {first_age:?} old");
    assert!(live > 20, "live updates after the resume: {live}");
    // The healthy ones got most ticks (the rate itself is the bench's to measure).
    for ages in &healthy_ages {
        assert!(ages.len() as u64 > rounds / 2, "{} of {rounds} updates", ages.len());
    }
    // And the gateway held the slow one's updates back rather than queue them.
    let metrics = common::scrape(gw.metrics_addr().unwrap()).await;
    let coalesced = common::metric(&metrics, "channel_updates_coalesced").expect("the coalesced counter");
    assert!(coalesced > 0.0, "{metrics}");
}
