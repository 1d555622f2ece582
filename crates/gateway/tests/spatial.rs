//! The spatial world over real sockets: handovers that lose, duplicate and reorder no entity
//! message; areas of interest that show exactly the entities of the cells they touch; a spatial
//! server lost mid-run, its event, and another server taking its slot over.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::channels::{WAIT, client, status};
use prost::Message;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tickwire_client::Client;
use tickwire_gateway::RunningGateway;
use tickwire_state::{Key, Replica, Schema, SchemaDef, Step, Value};
use tickwire_wire::proto::{
    Box as AreaBox, ChannelEvent, ChannelEventKind, ChannelUpdates, EntityMessage, EntityState, Follow,
    Handover, HandoverKind, RegisterServer, Release, SetInterest, SpatialEvent, SpatialEventKind,
    SpawnEntity, Sphere, Status, Vec3, set_interest,
};
use tokio::sync::watch;

/// A 40 x 40 m world of 4 x 4 cells of 10 m, in 2 x 2 server blocks (slots 0..4); the four
/// blocks meet at (20, 20).
/// Servers here publish at 200 Hz besides their releases: above a player's default rate limit.
const LAYOUT: [&str; 4] = [
    "spatial.cell_size=10.0",
    "spatial.cells=[4, 4]",
    "spatial.servers=[2, 2]",
    "limits.messages_per_second=5000",
];

async fn start() -> RunningGateway {
    common::start(&LAYOUT).await
}

fn v3(p: [f32; 3]) -> Option<Vec3> {
    Some(Vec3 { x: p[0], y: p[1], z: p[2] })
}

fn slot_of(p: [f32; 3]) -> u32 {
    u32::from(p[0] >= 20.0) + 2 * u32::from(p[2] >= 20.0)
}

async fn server(gw: &RunningGateway, name: &str, slot: Option<u32>) -> Arc<Client> {
    let c = client(gw, &format!("server:{name}")).await;
    let r = c.spatial_register(RegisterServer { slot, observe_only: false }).await.unwrap();
    if let Some(slot) = slot {
        assert_eq!(r.slot, slot);
    }
    Arc::new(c)
}

/// Entity `k` walks a circle around the point where the four blocks meet, three turns a
/// second: it crosses into another server's block about twelve times a second.
fn walk(k: usize, t: f32) -> [f32; 3] {
    let r = 3.0 + k as f32 * 0.5;
    let a = std::f32::consts::TAU * 3.0 * t + k as f32;
    [20.0 + r * a.cos(), 0.0, 20.0 + r * a.sin()]
}

/// What the servers processed, checked message by message: every entity's messages must
/// arrive as 1, 2, 3, ... across every server that owned it.
#[derive(Default)]
struct Ledger {
    last: HashMap<u64, u64>,
    processed: u64,
    violations: Vec<String>,
    releases: u64,
    acquires: u64,
}

impl Ledger {
    fn process(&mut self, server: &str, m: &EntityMessage) {
        let n = u64::from_le_bytes(m.body[..8].try_into().unwrap());
        let last = self.last.entry(m.entity_id).or_default();
        if n != *last + 1 || m.seq != n {
            self.violations.push(format!(
                "{server}: entity {} got message {n} (seq {}) after {}",
                m.entity_id, m.seq, *last
            ));
        }
        *last = (*last).max(n);
        self.processed += 1;
    }
}

/// A spatial server: simulates the entities it owns (publishing [`walk`] every 5 ms with the
/// last message it processed), processes their messages, releases and acquires on handover.
async fn run_server(
    name: String,
    c: Arc<Client>,
    spawned: Vec<(u64, usize)>,
    ledger: Arc<Mutex<Ledger>>,
    t0: Instant,
    frozen: Arc<Mutex<Option<f32>>>,
    mut stop: watch::Receiver<bool>,
) {
    // The walkers' clock: stopped once the test has what it needs, so handovers can drain.
    let now = || frozen.lock().unwrap().unwrap_or_else(|| t0.elapsed().as_secs_f32());
    // Entity id → (walker index, last processed seq).
    let mut owned: BTreeMap<u64, (usize, u64)> = spawned.into_iter().map(|(id, k)| (id, (k, 0))).collect();
    let mut frame = tokio::time::interval(Duration::from_millis(5));
    let walker = |value: &str| -> usize { value.parse().unwrap() };
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            push = c.next_push() => {
                let Some(push) = push else { return };
                match push.topic.as_str() {
                    "spatial.message" => {
                        let m = EntityMessage::decode(push.body).unwrap();
                        let mut l = ledger.lock().unwrap();
                        match owned.get_mut(&m.entity_id) {
                            Some((_, processed)) => {
                                l.process(&name, &m);
                                *processed = m.seq;
                            }
                            None => l.violations.push(format!("{name}: message for entity {} it does not own", m.entity_id)),
                        }
                    }
                    "spatial.handover" => {
                        let h = Handover::decode(push.body).unwrap();
                        if h.kind() == HandoverKind::Release {
                            let Some((k, processed)) = owned.remove(&h.entity_id) else {
                                ledger.lock().unwrap().violations.push(format!("{name}: release of unowned {}", h.entity_id));
                                continue;
                            };
                            ledger.lock().unwrap().releases += 1;
                            let release = Release {
                                entity_id: h.entity_id,
                                handover_id: h.handover_id,
                                processed_seq: processed,
                                value_json: format!(r#"{{"data":"{k}"}}"#),
                                position: v3(walk(k, now())),
                            };
                            c.spatial_release(release).await.unwrap();
                        } else {
                            let value: serde_json::Value = serde_json::from_str(&h.value_json).unwrap();
                            let k = walker(value["data"].as_str().unwrap());
                            let mut l = ledger.lock().unwrap();
                            l.acquires += 1;
                            let mut processed = 0;
                            for m in &h.messages {
                                l.process(&name, m);
                                processed = m.seq;
                            }
                            if processed == 0 {
                                processed = l.last.get(&h.entity_id).copied().unwrap_or(0);
                            }
                            owned.insert(h.entity_id, (k, processed));
                        }
                    }
                    _ => {}
                }
            }
            _ = frame.tick() => {
                let t = now();
                let entities = owned.iter().map(|(&entity_id, &(k, processed))| EntityState {
                    entity_id,
                    position: v3(walk(k, t)),
                    value_json: String::new(),
                    processed_seq: processed,
                }).collect();
                c.spatial_publish(entities).await.unwrap();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handovers_lose_duplicate_and_reorder_no_entity_message() {
    const WALKERS: usize = 16;
    const MESSAGES: u64 = 300;
    let gw = start().await;
    let mut servers = Vec::new();
    for slot in 0..4 {
        servers.push(server(&gw, &format!("s{slot}"), Some(slot)).await);
    }
    let mut clients = Vec::new();
    for k in 0..WALKERS {
        clients.push(Arc::new(client(&gw, &format!("walker{k}")).await));
    }
    // Spawn each walker's entity from the server whose block holds its start.
    let t0 = Instant::now();
    let mut entities = Vec::new();
    for (k, c) in clients.iter().enumerate() {
        let p = walk(k, 0.0);
        let spawn = SpawnEntity {
            position: v3(p),
            value_json: format!(r#"{{"data":"{k}"}}"#),
            controller_connection: c.connection_id(),
        };
        entities.push((servers[slot_of(p) as usize].spatial_spawn(spawn).await.unwrap().entity_id, k));
    }
    // A spawn in another server's block is refused.
    let foreign = SpawnEntity { position: v3([35.0, 0.0, 35.0]), ..SpawnEntity::default() };
    assert_eq!(status(servers[0].spatial_spawn(foreign).await), Status::FailedPrecondition);

    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let (stop_tx, stop) = watch::channel(false);
    let frozen = Arc::new(Mutex::new(None));
    let mut tasks = Vec::new();
    for (slot, c) in servers.iter().enumerate() {
        let spawned: Vec<(u64, usize)> =
            entities.iter().copied().filter(|&(_, k)| slot_of(walk(k, 0.0)) == slot as u32).collect();
        let run = run_server(
            format!("s{slot}"),
            c.clone(),
            spawned,
            ledger.clone(),
            t0,
            frozen.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(run));
    }
    // Each walker's client sends numbered messages to its entity, one every 4 ms, retrying
    // only what the gateway refused (a refused message took no number).
    let mut senders = Vec::new();
    for (&(entity_id, _), c) in entities.iter().zip(&clients) {
        let c = c.clone();
        senders.push(tokio::spawn(async move {
            let mut refused = 0u64;
            let mut tick = tokio::time::interval(Duration::from_millis(4));
            for n in 1..=MESSAGES {
                tick.tick().await;
                loop {
                    match c.send_to_entity(entity_id, Bytes::copy_from_slice(&n.to_le_bytes())).await {
                        Ok(()) => break,
                        Err(tickwire_client::ClientError::Status { status: Status::Unavailable, .. }) => {
                            refused += 1;
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        Err(e) => panic!("entity {entity_id}, message {n}: {e}"),
                    }
                }
            }
            refused
        }));
    }
    let mut refused = 0;
    for s in senders {
        refused += s.await.unwrap();
    }
    let total = WALKERS as u64 * MESSAGES;
    common::wait_until("the servers processed every message (or found one wrong)", || {
        let l = ledger.lock().unwrap();
        l.processed >= total || !l.violations.is_empty()
    })
    .await;
    // The walkers stand still; handovers under way finish (each release has its acquire).
    *frozen.lock().unwrap() = Some(t0.elapsed().as_secs_f32());
    common::wait_until("every handover under way completed", || {
        let l = ledger.lock().unwrap();
        l.acquires == l.releases || !l.violations.is_empty()
    })
    .await;
    stop_tx.send(true).unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let l = ledger.lock().unwrap();
    println!(
        "{total} messages, {} processed, {} releases, {} acquires, {refused} refusals retried, {} violations",
        l.processed,
        l.releases,
        l.acquires,
        l.violations.len()
    );
    assert!(l.violations.is_empty(), "{:#?}", &l.violations[..l.violations.len().min(20)]);
    assert_eq!(l.processed, total, "every message processed exactly once");
    for &(entity_id, _) in &entities {
        assert_eq!(l.last.get(&entity_id), Some(&MESSAGES), "entity {entity_id}'s last message");
    }
    assert!(
        l.releases >= 100 && l.acquires == l.releases,
        "{} releases, {} acquires",
        l.releases,
        l.acquires
    );
}

/// What a client sees of the world: one replica per cell in view.
struct View {
    schema: Arc<Schema>,
    cells: BTreeMap<u64, Replica>,
}

impl View {
    fn new(cell_schema_json: &str) -> View {
        let schema = Schema::new(SchemaDef::parse(cell_schema_json, "cell.json").unwrap()).unwrap();
        View { schema, cells: BTreeMap::new() }
    }

    /// Applies one push; returns the spatial events among them.
    fn apply(&mut self, topic: &str, body: Bytes) -> Option<SpatialEvent> {
        match topic {
            "channel.updates" => {
                for u in ChannelUpdates::decode(body).unwrap().updates {
                    let replica =
                        self.cells.entry(u.channel_id).or_insert_with(|| Replica::new(self.schema.clone()));
                    replica.apply(&u.update).unwrap_or_else(|e| panic!("cell {}: {e}", u.channel_id));
                }
            }
            "channel.event" => {
                let e = ChannelEvent::decode(body).unwrap();
                assert_eq!(e.kind(), ChannelEventKind::Unsubscribed, "{e:?}");
                self.cells.remove(&e.channel_id);
            }
            "spatial.event" => return Some(SpatialEvent::decode(body).unwrap()),
            other => panic!("unexpected push {other}"),
        }
        None
    }

    /// Every entity in view, with its position.
    fn entities(&self) -> BTreeMap<u64, [f64; 3]> {
        let mut out = BTreeMap::new();
        for replica in self.cells.values() {
            let Some(Value::Map(map)) = replica.get(&[Step::Field(0)]) else { continue };
            for (key, value) in map {
                let (Key::Int(id), Value::Struct(fields)) = (&key, &value) else { panic!("{key:?}") };
                let id = *id;
                let Value::Vec3(p) = fields[0] else { panic!("{fields:?}") };
                out.insert(id as u64, p);
            }
        }
        out
    }

    /// Reads pushes until `done` holds for the view and the spatial events read so far,
    /// within [`WAIT`].
    async fn until(
        &mut self,
        c: &Client,
        what: &str,
        done: impl Fn(&View, &[SpatialEvent]) -> bool,
    ) -> Vec<SpatialEvent> {
        let mut events = Vec::new();
        let deadline = tokio::time::Instant::now() + WAIT;
        while !done(self, &events) {
            let push = tokio::time::timeout_at(deadline, c.next_push())
                .await
                .unwrap_or_else(|_| panic!("timed out waiting until {what}; view: {:?}", self.entities()))
                .expect("session open");
            events.extend(self.apply(&push.topic, push.body));
        }
        events
    }
}

fn layout() -> tickwire_spatial::Layout {
    tickwire_spatial::Layout::new(tickwire_spatial::LayoutConfig {
        origin: [0.0, 0.0],
        cell_size: 10.0,
        cells: [4, 4],
        servers: [2, 2],
        server_interest_border: 0,
    })
    .unwrap()
}

fn random_area(rng: &mut SmallRng) -> (tickwire_spatial::Area, set_interest::Area) {
    let p = [rng.random_range(-5.0..45.0), rng.random_range(-5.0..5.0), rng.random_range(-5.0..45.0)];
    let size: f32 = rng.random_range(0.5..25.0);
    match rng.random_range(0..3) {
        0 => (
            tickwire_spatial::Area::Sphere { center: p, radius: size },
            set_interest::Area::Sphere(Sphere { center: v3(p), radius: size }),
        ),
        1 => {
            let max = [p[0] + size, p[1] + size, p[2] + size * 0.5];
            (
                tickwire_spatial::Area::Box { min: p, max },
                set_interest::Area::Box(AreaBox { min: v3(p), max: v3(max) }),
            )
        }
        _ => {
            let a: f32 = rng.random_range(0.0..std::f32::consts::TAU);
            let direction = [a.cos(), 0.0, a.sin()];
            let half_angle = rng.random_range(0.1..3.1);
            (
                tickwire_spatial::Area::Cone { apex: p, direction, half_angle, range: size },
                set_interest::Area::Cone(tickwire_wire::proto::Cone {
                    apex: v3(p),
                    direction: v3(direction),
                    half_angle,
                    range: size,
                }),
            )
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_area_shows_exactly_the_entities_of_the_cells_it_touches_and_no_area_none() {
    let gw = start().await;
    let mut servers = Vec::new();
    for slot in 0..4 {
        servers.push(server(&gw, &format!("s{slot}"), Some(slot)).await);
    }
    let layout = layout();
    let mut rng = SmallRng::seed_from_u64(12);
    // Entity id → its position.
    let mut placed: BTreeMap<u64, [f32; 3]> = BTreeMap::new();
    for _ in 0..80 {
        let p = [rng.random_range(0.0..40.0), 0.0, rng.random_range(0.0..40.0)];
        let spawn = SpawnEntity {
            position: v3(p),
            value_json: format!(r#"{{"pos":[{},0,{}]}}"#, p[0], p[2]),
            ..SpawnEntity::default()
        };
        placed.insert(servers[slot_of(p) as usize].spatial_spawn(spawn).await.unwrap().entity_id, p);
    }
    let viewer = client(&gw, "viewer").await;
    let mut view: Option<View> = None;
    for round in 0..30 {
        let (area, wire) = random_area(&mut rng);
        let req = SetInterest { area: Some(wire), follow: Follow::Off as i32, options: None };
        let result = viewer.spatial_interest(req).await.unwrap();
        let view = view.get_or_insert_with(|| View::new(&result.cell_schema_json));
        let cells: BTreeSet<[u32; 2]> = area.cells(&layout).into_iter().collect();
        let got: BTreeSet<[u32; 2]> = result.cells.iter().map(|c| [c.column, c.row]).collect();
        assert_eq!(got, cells, "round {round}: the cells of {area:?}");
        // Brute force: every entity whose cell the area touches, and nothing else.
        let expected: BTreeSet<u64> = placed
            .iter()
            .filter(|(_, p)| layout.cell_of(**p).is_some_and(|c| cells.contains(&c)))
            .map(|(&id, _)| id)
            .collect();
        for (id, p) in &placed {
            if area.contains(*p) {
                assert!(expected.contains(id), "round {round}: entity {id} at {p:?} is inside {area:?}");
            }
        }
        let ids: BTreeSet<u64> = result.cells.iter().map(|c| c.channel_id).collect();
        view.until(&viewer, &format!("round {round} shows {} entities", expected.len()), |v, _| {
            v.cells.keys().copied().collect::<BTreeSet<_>>() == ids
                && v.entities().keys().copied().collect::<BTreeSet<_>>() == expected
        })
        .await;
        for (id, p) in view.entities() {
            let q = placed[&id];
            assert!(
                (p[0] - f64::from(q[0])).abs() < 1e-3 && (p[2] - f64::from(q[2])).abs() < 1e-3,
                "{id}: {p:?} {q:?}"
            );
        }
    }
    // The whole world, then no area: every cell leaves the view, and the client is told
    // (UNSUBSCRIBED per cell).
    let view = view.as_mut().expect("a view after 30 rounds");
    let all = AreaBox { min: v3([0.0, 0.0, 0.0]), max: v3([40.0, 0.0, 40.0]) };
    let req =
        SetInterest { area: Some(set_interest::Area::Box(all)), follow: Follow::Off as i32, options: None };
    assert_eq!(viewer.spatial_interest(req).await.unwrap().cells.len(), 16);
    view.until(&viewer, "all 16 cells in view", |v, _| v.cells.len() == 16).await;
    let none = SetInterest { area: None, follow: Follow::Off as i32, options: None };
    assert!(viewer.spatial_interest(none).await.unwrap().cells.is_empty());
    view.until(&viewer, "every cell to leave the view", |v, _| v.cells.is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_spatial_server_raises_its_event_and_another_takes_its_slot_over() {
    let mut overrides = LAYOUT.to_vec();
    overrides.push("session.resume_window=\"300ms\"");
    let gw = common::start(&overrides).await;
    let master = client(&gw, "server:master").await;
    master.spatial_register(RegisterServer { slot: None, observe_only: true }).await.unwrap();
    let player = client(&gw, "player").await;
    // The doomed server: a bare connection, so that it can vanish without a goodbye.
    let mut opts = tickwire_client::ConnectOptions::new(common::tcp_target(&gw));
    opts.token = "server:doomed".into();
    let mut doomed = tickwire_client::Connection::connect(opts).await.unwrap();
    let call = |method: &str, body: Vec<u8>| (method.to_owned(), Bytes::from(body));
    let (method, body) =
        call("spatial.register", RegisterServer { slot: Some(0), observe_only: false }.encode_to_vec());
    doomed.send_request(1, &method, body).unwrap();
    let spawn = SpawnEntity {
        position: v3([5.0, 0.0, 5.0]),
        value_json: r#"{"pos":[5,0,5]}"#.into(),
        controller_connection: player.connection_id(),
    };
    let (method, body) = call("spatial.spawn", spawn.encode_to_vec());
    doomed.send_request(2, &method, body).unwrap();
    doomed.flush().await;
    let mut entity_id = 0;
    while entity_id == 0 {
        match doomed.next_event().await.unwrap() {
            Some(tickwire_client::Event::Response(r)) if r.id == 2 => {
                assert_eq!(r.status(), Status::Ok, "{}", r.error);
                entity_id = tickwire_wire::proto::SpawnResult::decode(r.body).unwrap().entity_id;
            }
            Some(_) => {}
            None => panic!("closed"),
        }
    }
    player.send_to_entity(entity_id, Bytes::from_static(b"one")).await.unwrap();
    // A client watching the doomed server's cell.
    let viewer = client(&gw, "viewer").await;
    let area = set_interest::Area::Box(AreaBox { min: v3([0.0, -1.0, 0.0]), max: v3([9.0, 1.0, 9.0]) });
    let result =
        viewer.spatial_interest(SetInterest { area: Some(area), ..SetInterest::default() }).await.unwrap();
    let mut view = View::new(&result.cell_schema_json);
    view.until(&viewer, "the entity shows", |v, _| v.entities().contains_key(&entity_id)).await;

    // The server dies: its connection drops, and its session expires after the resume window.
    drop(doomed);
    let lost = |e: &SpatialEvent| e.kind() == SpatialEventKind::ServerLost && e.slot == 0;
    let mut events = Vec::new();
    while !events.iter().any(lost) {
        events.push(SpatialEvent::decode(common::channels::next(&master, "spatial.event").await).unwrap());
    }
    // The master heard the doomed server join, then leave.
    assert_eq!(
        events.iter().map(|e| (e.kind(), e.slot)).collect::<Vec<_>>()[..],
        [(SpatialEventKind::ServerJoined, 0), (SpatialEventKind::ServerLost, 0)]
    );
    view.until(&viewer, "the viewer hears of it", |_, events| events.iter().any(lost)).await;
    // Nobody owns the entity now: its messages are refused, not lost.
    assert_eq!(
        status(player.send_to_entity(entity_id, Bytes::from_static(b"two")).await),
        Status::Unavailable
    );

    // Another server takes slot 0: it acquires the entity, with the message the dead one never
    // reported processed (delivery across a lost server is at least once).
    let heir = server(&gw, "heir", Some(0)).await;
    let h = Handover::decode(common::channels::next(&heir, "spatial.handover").await).unwrap();
    assert_eq!((h.kind(), h.entity_id, h.from_slot, h.to_slot), (HandoverKind::Acquire, entity_id, 0, 0));
    assert_eq!(h.controller_connection, player.connection_id());
    assert_eq!(
        h.messages.iter().map(|m| (m.seq, m.body.clone())).collect::<Vec<_>>(),
        [(1, Bytes::from_static(b"one"))]
    );
    let joined = SpatialEvent::decode(common::channels::next(&master, "spatial.event").await).unwrap();
    assert_eq!((joined.kind(), joined.slot), (SpatialEventKind::ServerJoined, 0));
    // It simulates the entity: the viewer sees it move, and the player's messages reach it.
    let moved = EntityState {
        entity_id,
        position: v3([6.0, 0.0, 6.0]),
        value_json: r#"{"pos":[6,0,6]}"#.into(),
        processed_seq: 1,
    };
    assert!(heir.spatial_publish(vec![moved]).await.unwrap().ignored.is_empty());
    view.until(&viewer, "the entity moves again", |v, _| {
        v.entities().get(&entity_id).is_some_and(|p| p[0] == 6.0)
    })
    .await;
    player.send_to_entity(entity_id, Bytes::from_static(b"three")).await.unwrap();
    let m = EntityMessage::decode(common::channels::next(&heir, "spatial.message").await).unwrap();
    assert_eq!(
        (m.entity_id, m.seq, m.from_connection, &m.body[..]),
        (entity_id, 2, player.connection_id(), &b"three"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spatial_server_sees_its_block_and_its_interest_border() {
    let mut overrides = LAYOUT.to_vec();
    overrides.push("spatial.server_interest_border=1");
    let gw = common::start(&overrides).await;
    let s0 = server(&gw, "s0", Some(0)).await;
    let s1 = server(&gw, "s1", Some(1)).await;
    let s3 = server(&gw, "s3", Some(3)).await;
    let spawn = |x: f32, z: f32| SpawnEntity {
        position: v3([x, 0.0, z]),
        value_json: format!(r#"{{"pos":[{x},0,{z}]}}"#),
        ..SpawnEntity::default()
    };
    // Cell [2, 0] is slot 1's, one cell beyond slot 0's block; cell [3, 3] is two cells away.
    let near = s1.spatial_spawn(spawn(25.0, 5.0)).await.unwrap().entity_id;
    let far = s3.spatial_spawn(spawn(35.0, 35.0)).await.unwrap().entity_id;
    let own = s0.spatial_spawn(spawn(5.0, 5.0)).await.unwrap().entity_id;
    let schema = SchemaDef::parse(
        r#"{"fields": [{"name": "pos", "type": "vec3"}, {"name": "yaw", "type": "float"}, {"name": "data", "type": "string"}]}"#,
        "e.json",
    )
    .unwrap();
    let cell = SchemaDef::new([tickwire_state::Field::new(
        "entities",
        tickwire_state::Type::map(tickwire_state::KeyKind::Int, tickwire_state::Type::Struct(schema.fields)),
    )]);
    let mut view = View::new(&serde_json::to_string(&cell).unwrap());
    view.until(&s0, "slot 0's server sees its own entity and the one across its border", |v, _| {
        let seen = v.entities();
        seen.contains_key(&own) && seen.contains_key(&near)
    })
    .await;
    // 3 x 3 cells: its 2 x 2 block and a border of one, clipped to the 4 x 4 world.
    assert_eq!(view.cells.len(), 9, "{:?}", view.cells.keys().collect::<Vec<_>>());
    assert!(!view.entities().contains_key(&far), "two cells away is beyond the border");
}

/// Entity values are JSON in the entity schema's form; one that does not fit (not JSON, not an
/// object, an unknown field, a wrong type, text after the object) is refused with
/// INVALID_ARGUMENT by spawn, publish and release alike, and the world keeps what it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entity_values_that_do_not_fit_the_schema_are_refused() {
    let gw = start().await;
    let s0 = server(&gw, "s0", Some(0)).await;
    const BAD: [&str; 7] = [
        "not json",
        "[1]",
        r#"{"nope": 1}"#,
        r#"{"pos": "x"}"#,
        r#"{"pos": [1, 2]}"#,
        r#"{"data": "a"} {"data": "b"}"#,
        r#"{"data": "a"},"path":"/entities/9""#,
    ];
    let spawn = |value: &str| SpawnEntity {
        position: v3([5.0, 0.0, 5.0]),
        value_json: value.into(),
        ..SpawnEntity::default()
    };
    for value in BAD {
        let r = s0.spatial_spawn(spawn(value)).await;
        assert_eq!(status(r), Status::InvalidArgument, "spawn {value}");
    }
    let entity_id = s0.spatial_spawn(spawn(r#" {"pos": [5, 0, 5], "data": "a"} "#)).await.unwrap().entity_id;
    // A second entity in the same cell: a change to it carries the cell's state, the first
    // entity's value included, at a version after everything sent before it.
    let other = s0.spatial_spawn(spawn(r#"{"pos": [5, 0, 5], "data": "b0"}"#)).await.unwrap().entity_id;
    let viewer = client(&gw, "viewer").await;
    let area = set_interest::Area::Box(AreaBox { min: v3([0.0, -1.0, 0.0]), max: v3([9.0, 1.0, 9.0]) });
    let result =
        viewer.spatial_interest(SetInterest { area: Some(area), ..SetInterest::default() }).await.unwrap();
    let mut view = View::new(&result.cell_schema_json);
    let data_of = |v: &View, entity_id: u64| -> Option<String> {
        v.cells.values().find_map(|replica| {
            let key = Key::Int(entity_id as i64);
            match replica.get(&[Step::Field(0), Step::Key(&key), Step::Field(2)]) {
                Some(Value::Str(s)) => Some(s),
                _ => None,
            }
        })
    };
    let data = |v: &View| data_of(v, entity_id);
    view.until(&viewer, "the entity shows", |v, _| data(v).as_deref() == Some("a")).await;
    for value in BAD {
        let update = EntityState {
            entity_id,
            position: v3([6.0, 0.0, 5.0]),
            value_json: value.into(),
            processed_seq: 0,
        };
        match s0.spatial_publish(vec![update]).await {
            Err(tickwire_client::ClientError::Status { status, message, .. }) => {
                assert_eq!(status, Status::InvalidArgument, "publish {value}");
                assert!(message.contains("value_json"), "{message}");
            }
            other => panic!("publish {value}: {other:?}"),
        }
    }
    // No handover is under way: a release is refused, and its value (one that fits) is not
    // taken either.
    let release =
        Release { entity_id, handover_id: 1, value_json: r#"{"data": "z"}"#.into(), ..Release::default() };
    assert_eq!(status(s0.spatial_release(release).await), Status::FailedPrecondition);
    let nudge = EntityState {
        entity_id: other,
        position: v3([5.0, 0.0, 5.0]),
        value_json: r#"{"pos": [5, 0, 5], "data": "b1"}"#.into(),
        processed_seq: 0,
    };
    assert!(s0.spatial_publish(vec![nudge]).await.unwrap().ignored.is_empty());
    view.until(&viewer, "the other entity's change shows", |v, _| data_of(v, other).as_deref() == Some("b1"))
        .await;
    assert_eq!(data(&view).as_deref(), Some("a"), "nothing refused reached the cell");
    // A value that fits goes through, and the viewer sees it; nothing refused got in between.
    let good = EntityState {
        entity_id,
        position: v3([6.0, 0.0, 5.0]),
        value_json: r#"{"pos": [6, 0, 5], "data": "c"}"#.into(),
        processed_seq: 0,
    };
    assert!(s0.spatial_publish(vec![good]).await.unwrap().ignored.is_empty());
    view.until(&viewer, "the good value shows", |v, _| {
        let now = data(v);
        let done = now.as_deref() == Some("c");
        if !done {
            assert_ne!(now.as_deref(), Some("z"), "a refused release's value showed");
        }
        done
    })
    .await;
}

/// Once the gateway's shutdown returns, the world has stopped (its inbox is closed), with a
/// spatial server connected when it began. (That shutdown waits for what a router tracks is
/// tests/shutdown.rs; that the world is tracked, the unit test in src/spatial/mod.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_returns_once_the_world_has_stopped() {
    use tickwire_gateway::{ChannelRouter, Gateway, GatewayConfig, Router, SpatialRouter};
    let mut overrides = vec!["listen.tcp=[\"127.0.0.1:0\"]".to_owned(), "listen.ws=[]".to_owned()];
    overrides.extend(LAYOUT.iter().map(|s| s.to_string()));
    let config = GatewayConfig::load(None, &overrides).unwrap();
    let channels = ChannelRouter::for_gateway(&config).unwrap();
    let layout = config.spatial.clone().unwrap();
    let router = Arc::new(SpatialRouter::new(layout, &config, channels).unwrap());
    let gw = Gateway::new(config).unwrap().with_router(router.clone()).start().await.unwrap();
    let _server = server(&gw, "a", Some(0)).await;
    let running = || router.gauges().into_iter().find(|g| g.name == "spatial_world_running").map(|g| g.value);
    assert_eq!(running(), Some(1.0));
    assert!(gw.shutdown(Duration::from_secs(10)).await, "everything stopped within the grace");
    assert_eq!(running(), Some(0.0), "shutdown returned before the world had stopped");
}
