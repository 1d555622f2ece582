//! Handovers over real sockets: many entities walking across server borders, a numbered
//! message to each every frame, and every one counted at the servers.

use super::*;

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
    walk_and_count(&start().await).await;
}

/// The same with the sessions on I/O threads, as the binary runs them (the passes delivered on
/// the world's thread, the default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handovers_lose_no_entity_message_with_sessions_on_io_threads() {
    let gw = start_on_io_threads(&[]).await;
    walk_and_count(&gw).await;
    // The world delivered every pass itself: no delivery ran on an I/O thread.
    let metrics = common::scrape(gw.metrics_addr().expect("metrics on")).await;
    assert_eq!(common::metric(&metrics, "spatial_delivery_cpu_seconds_count"), Some(0.0));
}

/// Walkers cross the servers' borders while their clients send numbered messages to their
/// entities; the servers count every one.
async fn walk_and_count(gw: &RunningGateway) {
    const WALKERS: usize = 16;
    const MESSAGES: u64 = 300;
    let mut servers = Vec::new();
    for slot in 0..4 {
        servers.push(server(gw, &format!("s{slot}"), Some(slot)).await);
    }
    let mut clients = Vec::new();
    for k in 0..WALKERS {
        clients.push(Arc::new(client(gw, &format!("walker{k}")).await));
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
