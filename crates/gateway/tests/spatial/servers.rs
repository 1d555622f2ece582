//! Spatial servers over real sockets: a lost server and its slot taken over, the block and
//! border a server sees, values that do not fit, and shutdown.

use super::*;

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
    let entity_id = bare_spawn(&mut doomed, 2, spawn).await;
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

/// Server `s0` in slot 0, a player, and an entity at (5, 0, 5) that `s0` owns and the player
/// controls.
async fn server_and_controlled_entity(gw: &RunningGateway) -> (Arc<Client>, Client, u64) {
    let s0 = server(gw, "s0", Some(0)).await;
    let player = client(gw, "player").await;
    let spawn = SpawnEntity {
        position: v3([5.0, 0.0, 5.0]),
        value_json: r#"{"pos":[5,0,5]}"#.into(),
        controller_connection: player.connection_id(),
    };
    let entity_id = s0.spatial_spawn(spawn).await.unwrap().entity_id;
    (s0, player, entity_id)
}

/// What an entity's server has not processed is bounded in bytes as well as in count, so that
/// an acquire, which carries all of it in one message, always fits the new owner's session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entitys_unprocessed_messages_are_bounded_in_bytes() {
    let gw = common::start(&LAYOUT).await;
    let (s0, player, entity_id) = server_and_controlled_entity(&gw).await;
    // A quarter of the default 1 MiB of unacknowledged data: two of these fit, a third does not.
    let body = Bytes::from(vec![7u8; 100 << 10]);
    player.send_to_entity(entity_id, body.clone()).await.unwrap();
    player.send_to_entity(entity_id, body.clone()).await.unwrap();
    assert_eq!(status(player.send_to_entity(entity_id, body.clone()).await), Status::Unavailable);
    for seq in 1..=2 {
        let m = EntityMessage::decode(common::channels::next(&s0, "spatial.message").await).unwrap();
        assert_eq!((m.seq, m.body.len()), (seq, body.len()));
    }
    // Once the server reports them processed, there is room again.
    let state = EntityState {
        entity_id,
        position: v3([5.0, 0.0, 5.0]),
        value_json: r#"{"pos":[5,0,5]}"#.into(),
        processed_seq: 2,
    };
    assert!(s0.spatial_publish(vec![state]).await.unwrap().ignored.is_empty());
    player.send_to_entity(entity_id, body.clone()).await.unwrap();
    let m = EntityMessage::decode(common::channels::next(&s0, "spatial.message").await).unwrap();
    assert_eq!(m.seq, 3, "the refused one took no number");
}

/// A controller sending to its entity faster than the entity's server reads is told to retry
/// once the server's outbox is short of room; the server is not made a slow consumer, and gets
/// every message the controller was told went, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_flooding_its_entitys_server_is_told_to_retry_and_the_server_stays() {
    let settings: Vec<&str> =
        LAYOUT.iter().copied().chain(["limits.outbox_capacity=8", "limits.message_burst=100000"]).collect();
    let gw = common::start(&settings).await;
    let (s0, player, entity_id) = server_and_controlled_entity(&gw).await;
    // The server reads nothing meanwhile: its client takes 1,024 pushes, its session holds
    // 1,024 unacknowledged, its outbox 8; the fourth quarter of that stays for the gateway.
    let mut sent = 0u64;
    let refused = loop {
        match player.send_to_entity(entity_id, Bytes::from_static(b"move")).await {
            Ok(_) => sent += 1,
            Err(e) => break e,
        }
        assert!(sent < 4000, "never refused");
    };
    assert!(refused.to_string().contains("more messages waiting than it takes from others"), "{refused}");
    assert_eq!(gw.session_count(), 2, "the server's session is still there");
    for seq in 1..=sent {
        let m = EntityMessage::decode(common::channels::next(&s0, "spatial.message").await).unwrap();
        assert_eq!(m.seq, seq, "every message, in order, the refused ones numberless");
    }
    let state = EntityState {
        entity_id,
        position: v3([5.0, 0.0, 5.0]),
        value_json: r#"{"pos":[5,0,5]}"#.into(),
        processed_seq: sent,
    };
    assert!(s0.spatial_publish(vec![state]).await.unwrap().ignored.is_empty());
    player.send_to_entity(entity_id, Bytes::from_static(b"move")).await.unwrap();
    let m = EntityMessage::decode(common::channels::next(&s0, "spatial.message").await).unwrap();
    assert_eq!(m.seq, sent + 1);
}

/// A server can message the controller of an entity spawned after the controller set its area
/// of interest, before the controller ever sent to it (its session is known from the area).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_reaches_the_controller_of_an_entity_spawned_after_its_area() {
    let gw = common::start(&LAYOUT).await;
    let s0 = server(&gw, "s0", Some(0)).await;
    let player = client(&gw, "player").await;
    let area = set_interest::Area::Box(AreaBox { min: v3([0.0, -1.0, 0.0]), max: v3([9.0, 1.0, 9.0]) });
    player.spatial_interest(SetInterest { area: Some(area), ..SetInterest::default() }).await.unwrap();
    let spawn = SpawnEntity {
        position: v3([5.0, 0.0, 5.0]),
        value_json: r#"{"pos":[5,0,5]}"#.into(),
        controller_connection: player.connection_id(),
    };
    let entity_id = s0.spatial_spawn(spawn).await.unwrap().entity_id;
    let hello = ChannelSend {
        channel_id: entity_id,
        to_connection: player.connection_id(),
        broadcast: 0,
        body: Bytes::from_static(b"welcome"),
    };
    s0.call("channel.send", hello.encode_to_vec().into()).await.unwrap();
    let m = ChannelMessage::decode(common::channels::next(&player, "channel.message").await).unwrap();
    assert_eq!((m.channel_id, &m.body[..]), (entity_id, &b"welcome"[..]));
}

/// A controller's session that ends lets go of every entity it controls, not only the last one
/// spawned for it: a server's message to it is then refused as to no controller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_that_leaves_is_let_go_by_every_entity_it_controls() {
    let gw = common::start(&LAYOUT).await;
    let s0 = server(&gw, "s0", Some(0)).await;
    let player = client(&gw, "player").await;
    let controller = player.connection_id();
    let mut ids = Vec::new();
    for x in [3.0, 6.0] {
        let spawn = SpawnEntity {
            position: v3([x, 0.0, 5.0]),
            value_json: format!(r#"{{"pos":[{x},0,5]}}"#),
            controller_connection: controller,
        };
        ids.push(s0.spatial_spawn(spawn).await.unwrap().entity_id);
    }
    // The area gives both entities the controller's session.
    let area = set_interest::Area::Box(AreaBox { min: v3([0.0, -1.0, 0.0]), max: v3([9.0, 1.0, 9.0]) });
    player.spatial_interest(SetInterest { area: Some(area), ..SetInterest::default() }).await.unwrap();
    let hello = |entity_id: u64| ChannelSend {
        channel_id: entity_id,
        to_connection: controller,
        broadcast: 0,
        body: Bytes::from_static(b"hello"),
    };
    for &id in &ids {
        s0.call("channel.send", hello(id).encode_to_vec().into()).await.unwrap();
        let m = ChannelMessage::decode(common::channels::next(&player, "channel.message").await).unwrap();
        assert_eq!(m.channel_id, id);
    }
    player.close().await;
    // The world hears of the end after the close: wait (bounded) until the last entity lets go.
    let refused = |r: Result<Bytes, tickwire_client::ClientError>| match r {
        Err(tickwire_client::ClientError::Status { status, .. }) => Some(status),
        _ => None,
    };
    let mut last = None;
    for _ in 0..200 {
        last = refused(s0.call("channel.send", hello(ids[1]).encode_to_vec().into()).await);
        if last == Some(Status::NotFound) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(last, Some(Status::NotFound), "the last entity let go of its controller");
    // The first one did too, in the same step.
    let first = refused(s0.call("channel.send", hello(ids[0]).encode_to_vec().into()).await);
    assert_eq!(first, Some(Status::NotFound), "the first entity let go of its controller");
}

/// A handover whose destination server is lost before the owner releases goes nowhere: the
/// release gives the entity back to its owner (an ACQUIRE from and to its own slot, with the
/// message it had not processed), and messages reach it again. (It used to wait for a server in
/// the lost slot, every message refused, though the owner was alive.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_to_a_server_lost_before_the_release_gives_the_entity_back() {
    let mut overrides = LAYOUT.to_vec();
    overrides.push("session.resume_window=\"300ms\"");
    let gw = common::start(&overrides).await;
    let owner = server(&gw, "owner", Some(0)).await;
    let player = client(&gw, "player").await;
    // The destination: a bare connection, so that it can vanish without a goodbye.
    let doomed = bare_server(&gw, "doomed", 1).await;
    let joined = SpatialEvent::decode(common::channels::next(&owner, "spatial.event").await).unwrap();
    assert_eq!((joined.kind(), joined.slot), (SpatialEventKind::ServerJoined, 1));
    let spawn = SpawnEntity {
        position: v3([15.0, 0.0, 5.0]),
        value_json: r#"{"pos":[15,0,5]}"#.into(),
        controller_connection: player.connection_id(),
    };
    let entity_id = owner.spatial_spawn(spawn).await.unwrap().entity_id;
    player.send_to_entity(entity_id, Bytes::from_static(b"one")).await.unwrap();
    let m = EntityMessage::decode(common::channels::next(&owner, "spatial.message").await).unwrap();
    assert_eq!(m.seq, 1);
    // It walks into slot 1's block: the owner is asked to release it.
    let walked = EntityState { entity_id, position: v3([25.0, 0.0, 5.0]), ..EntityState::default() };
    owner.spatial_publish(vec![walked]).await.unwrap();
    let release = Handover::decode(common::channels::next(&owner, "spatial.handover").await).unwrap();
    assert_eq!((release.kind(), release.from_slot, release.to_slot), (HandoverKind::Release, 0, 1));
    // A message sent meanwhile waits for the handover.
    player.send_to_entity(entity_id, Bytes::from_static(b"two")).await.unwrap();
    // The destination dies before the release.
    drop(doomed);
    let lost = SpatialEvent::decode(common::channels::next(&owner, "spatial.event").await).unwrap();
    assert_eq!((lost.kind(), lost.slot), (SpatialEventKind::ServerLost, 1));
    let release = Release {
        entity_id,
        handover_id: release.handover_id,
        processed_seq: 1,
        value_json: String::new(),
        position: None,
    };
    owner.spatial_release(release).await.unwrap();
    let back = Handover::decode(common::channels::next(&owner, "spatial.handover").await).unwrap();
    assert_eq!(
        (back.kind(), back.entity_id, back.from_slot, back.to_slot),
        (HandoverKind::Acquire, entity_id, 0, 0)
    );
    assert_eq!(
        back.messages.iter().map(|m| (m.seq, m.body.clone())).collect::<Vec<_>>(),
        [(2, Bytes::from_static(b"two"))]
    );
    player.send_to_entity(entity_id, Bytes::from_static(b"three")).await.unwrap();
    let m = EntityMessage::decode(common::channels::next(&owner, "spatial.message").await).unwrap();
    assert_eq!((m.seq, &m.body[..]), (3, &b"three"[..]));
}

/// A server lost while one of its entities walks into another server's block: that server
/// acquires the entity, and the ACQUIRE names the slot it came from (it named the destination
/// twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_server_lost_mid_handover_hands_the_entity_on_naming_its_slot() {
    let mut overrides = LAYOUT.to_vec();
    overrides.push("session.resume_window=\"300ms\"");
    let gw = common::start(&overrides).await;
    let heir = server(&gw, "destination", Some(1)).await;
    let mut doomed = bare_server(&gw, "doomed", 0).await;
    let spawn = SpawnEntity { position: v3([15.0, 0.0, 5.0]), ..SpawnEntity::default() };
    let entity_id = bare_spawn(&mut doomed, 2, spawn).await;
    // It walks into slot 1's block, and its server vanishes without releasing it.
    let walked = EntityState { entity_id, position: v3([25.0, 0.0, 5.0]), ..EntityState::default() };
    let publish = tickwire_wire::proto::Publish { entities: vec![walked] };
    doomed.send_request(3, "spatial.publish", publish.encode_to_vec().into()).unwrap();
    doomed.flush().await;
    drop(doomed);
    let h = Handover::decode(common::channels::next(&heir, "spatial.handover").await).unwrap();
    assert_eq!((h.kind(), h.entity_id, h.from_slot, h.to_slot), (HandoverKind::Acquire, entity_id, 0, 1));
}

/// A publish without a position changes the value only (the entity stays where it is); an
/// observer's message to an entity reaches its owner; a spawn at a non-finite height is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_without_a_position_keeps_it_and_an_observer_messages_an_entity() {
    let gw = start().await;
    let owner = server(&gw, "owner", Some(0)).await;
    let observer = client(&gw, "server:observer").await;
    observer.spatial_register(RegisterServer { slot: None, observe_only: true }).await.unwrap();
    let bad = SpawnEntity { position: v3([5.0, f32::NAN, 5.0]), ..SpawnEntity::default() };
    assert_eq!(status(owner.spatial_spawn(bad).await), Status::InvalidArgument);
    let spawn = SpawnEntity { position: v3([15.0, 0.0, 5.0]), ..SpawnEntity::default() };
    let entity_id = owner.spatial_spawn(spawn).await.unwrap().entity_id;
    let viewer = client(&gw, "viewer").await;
    // Only the entity's cell, (10..20, 0..10): were it moved to (0, 0, 0), it would leave.
    let area = set_interest::Area::Box(AreaBox { min: v3([11.0, -1.0, 1.0]), max: v3([19.0, 1.0, 9.0]) });
    let result =
        viewer.spatial_interest(SetInterest { area: Some(area), ..SetInterest::default() }).await.unwrap();
    let mut view = View::new(&result.cell_schema_json);
    view.until(&viewer, "the entity shows", |v, _| v.entities().contains_key(&entity_id)).await;
    let value_only =
        EntityState { entity_id, position: None, value_json: r#"{"pos":[1,2,3]}"#.into(), processed_seq: 0 };
    owner.spatial_publish(vec![value_only]).await.unwrap();
    view.until(&viewer, "the value changes", |v, _| v.entities().get(&entity_id) == Some(&[1.0, 2.0, 3.0]))
        .await;
    observer.send_to_entity(entity_id, Bytes::from_static(b"hi")).await.unwrap();
    let m = EntityMessage::decode(common::channels::next(&owner, "spatial.message").await).unwrap();
    assert_eq!(
        (m.entity_id, m.from_connection, &m.body[..]),
        (entity_id, observer.connection_id(), &b"hi"[..])
    );
}

/// A server that registers into a slot where many entities wait (its last server was lost)
/// gets an ACQUIRE for each, paced to what its outbox takes: with an outbox of 16, 100 ACQUIREs
/// at once closed it as a slow consumer, and every entity waited for the next server, which
/// met the same wall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_taking_a_slot_over_gets_every_waiting_entity_without_being_overrun() {
    const ENTITIES: u64 = 100;
    let mut overrides = LAYOUT.to_vec();
    overrides.extend(["session.resume_window=\"300ms\"", "limits.outbox_capacity=16"]);
    let gw = common::start(&overrides).await;
    let master = client(&gw, "server:master").await;
    master.spatial_register(RegisterServer { slot: None, observe_only: true }).await.unwrap();
    let mut doomed = bare_server(&gw, "doomed", 0).await;
    // All at once: more requests than its outbox holds. Their answers are paced to the
    // outbox too (`SessionHandle::reply`); they overran it before.
    for i in 0..ENTITIES {
        let x = 1.0 + (i % 18) as f32;
        let spawn = SpawnEntity { position: v3([x, 0.0, 5.0]), ..SpawnEntity::default() };
        doomed.send_request(2 + i, "spatial.spawn", spawn.encode_to_vec().into()).unwrap();
    }
    doomed.flush().await;
    let mut spawned = BTreeSet::new();
    while spawned.len() < ENTITIES as usize {
        match doomed.next_event().await.unwrap() {
            Some(tickwire_client::Event::Response(r)) if r.id >= 2 => {
                assert_eq!(r.status(), Status::Ok, "{}", r.error);
                spawned.insert(tickwire_wire::proto::SpawnResult::decode(r.body).unwrap().entity_id);
            }
            Some(tickwire_client::Event::Closed { reason, message }) => {
                panic!("closed: {reason:?} {message}")
            }
            Some(_) => {}
            None => doomed.flush().await,
        }
    }
    drop(doomed);
    let lost = |e: &SpatialEvent| e.kind() == SpatialEventKind::ServerLost && e.slot == 0;
    while !lost(&SpatialEvent::decode(common::channels::next(&master, "spatial.event").await).unwrap()) {}
    let heir = server(&gw, "heir", Some(0)).await;
    let mut acquired = BTreeSet::new();
    while acquired.len() < spawned.len() {
        let h = Handover::decode(common::channels::next(&heir, "spatial.handover").await).unwrap();
        assert_eq!((h.kind(), h.from_slot, h.to_slot), (HandoverKind::Acquire, 0, 0));
        assert!(acquired.insert(h.entity_id), "entity {} acquired twice", h.entity_id);
    }
    assert_eq!(acquired, spawned);
    // The heir's session is whole: it owns them all.
    let states: Vec<EntityState> =
        acquired.iter().map(|&entity_id| EntityState { entity_id, ..EntityState::default() }).collect();
    assert!(heir.spatial_publish(states).await.unwrap().ignored.is_empty());
}

/// While an entity's ACQUIRE waits for room in its new owner's outbox, a message to the entity
/// is taken (not refused) and goes in that ACQUIRE, numbered after what was there; nothing
/// about the entity reaches the owner before its ACQUIRE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_to_an_entity_whose_acquire_waits_goes_in_the_acquire() {
    const ENTITIES: u64 = 60;
    let mut overrides = LAYOUT.to_vec();
    // A server that acknowledges nothing holds 16 messages in flight and 16 in its outbox.
    overrides.extend([
        "session.resume_window=\"300ms\"",
        "limits.outbox_capacity=16",
        "session.max_unacked_messages=16",
        "channels.update_window.max_updates=8",
    ]);
    let gw = common::start(&overrides).await;
    let master = client(&gw, "server:master").await;
    master.spatial_register(RegisterServer { slot: None, observe_only: true }).await.unwrap();
    let player = client(&gw, "player").await;
    let doomed = server(&gw, "doomed", Some(0)).await;
    let mut spawned = Vec::new();
    for i in 0..ENTITIES {
        let spawn = SpawnEntity {
            position: v3([1.0 + (i % 18) as f32, 0.0, 5.0]),
            controller_connection: player.connection_id(),
            ..SpawnEntity::default()
        };
        spawned.push(doomed.spatial_spawn(spawn).await.unwrap().entity_id);
    }
    // The doomed server's session ends (its Client is dropped, and with it the connection).
    drop(doomed);
    let lost = |e: &SpatialEvent| e.kind() == SpatialEventKind::ServerLost && e.slot == 0;
    while !lost(&SpatialEvent::decode(common::channels::next(&master, "spatial.event").await).unwrap()) {}
    // The heir registers and then reads nothing for a while: its ACQUIREs back up.
    let mut heir = bare_server(&gw, "heir", 0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The ACQUIREs go in spawn order: the last ones wait. A message to one of those is taken.
    let last = *spawned.last().unwrap();
    player.send_to_entity(last, Bytes::from_static(b"while it waits")).await.unwrap();
    // Now the heir reads (and acknowledges): every ACQUIRE, the last one carrying the message.
    let mut acquired = BTreeSet::new();
    let mut carried = None;
    while acquired.len() < spawned.len() {
        match tokio::time::timeout(WAIT, heir.next_event()).await.expect("the ACQUIREs come").unwrap() {
            Some(tickwire_client::Event::Push(p)) if p.topic == "spatial.handover" => {
                let h = Handover::decode(p.body).unwrap();
                assert_eq!(h.kind(), HandoverKind::Acquire);
                if h.entity_id == last {
                    carried = Some(h.messages.iter().map(|m| (m.seq, m.body.clone())).collect::<Vec<_>>());
                }
                acquired.insert(h.entity_id);
            }
            Some(tickwire_client::Event::Push(p)) if p.topic == "spatial.message" => {
                let m = EntityMessage::decode(p.body).unwrap();
                panic!("a message for entity {} before its ACQUIRE", m.entity_id);
            }
            Some(tickwire_client::Event::Closed { reason, message }) => {
                panic!("closed: {reason:?} {message}")
            }
            Some(_) => {}
            None => heir.flush().await,
        }
    }
    assert_eq!(carried, Some(vec![(1, Bytes::from_static(b"while it waits"))]));
}

/// A spatial server on a bare connection (it reads and acknowledges only when the test does,
/// and can vanish without a goodbye), registering in `slot` (request 1, sent).
async fn bare_server(gw: &RunningGateway, name: &str, slot: u32) -> tickwire_client::Connection {
    let mut opts = tickwire_client::ConnectOptions::new(common::tcp_target(gw));
    opts.token = format!("server:{name}");
    let mut conn = tickwire_client::Connection::connect(opts).await.unwrap();
    let register = RegisterServer { slot: Some(slot), observe_only: false }.encode_to_vec();
    conn.send_request(1, "spatial.register", register.into()).unwrap();
    conn.flush().await;
    conn
}

/// Spawns on a bare connection as request `id`, and waits for the entity's id (the server's
/// other messages are skipped).
async fn bare_spawn(conn: &mut tickwire_client::Connection, id: u64, spawn: SpawnEntity) -> u64 {
    conn.send_request(id, "spatial.spawn", spawn.encode_to_vec().into()).unwrap();
    conn.flush().await;
    loop {
        match conn.next_event().await.unwrap() {
            Some(tickwire_client::Event::Response(r)) if r.id == id => {
                assert_eq!(r.status(), Status::Ok, "{}", r.error);
                return tickwire_wire::proto::SpawnResult::decode(r.body).unwrap().entity_id;
            }
            Some(tickwire_client::Event::Closed { reason, message }) => {
                panic!("closed: {reason:?} {message}")
            }
            Some(_) => {}
            None => conn.flush().await,
        }
    }
}

/// A server sees its block (and border) as a view: a slot whose block is more cells than a
/// view may hold is refused at register, with what to change, instead of flooding the server
/// with one UNSUBSCRIBED per cell when it later sets an area.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_whose_block_is_larger_than_a_view_is_refused_at_register() {
    let mut overrides = LAYOUT.to_vec();
    // A view of at most 2 cells; a block is 2 x 2.
    overrides.push("limits.outbox_capacity=4");
    let gw = common::start(&overrides).await;
    let c = client(&gw, "server:big-block").await;
    match c.spatial_register(RegisterServer { slot: Some(0), observe_only: false }).await {
        Err(tickwire_client::ClientError::Status { status, message, .. }) => {
            assert_eq!(status, Status::ResourceExhausted);
            assert!(
                message.contains("hold 4 cells") && message.contains("limits.outbox_capacity"),
                "{message}"
            );
        }
        other => panic!("expected RESOURCE_EXHAUSTED, got {other:?}"),
    }
    // An observer (no block) is still taken.
    c.spatial_register(RegisterServer { slot: None, observe_only: true }).await.unwrap();
}

/// A spatial event reaches each session once: a server that also sees the slot's cells (its
/// interest border) is told once, and a joining server is not told of its own join. And a
/// spawn into a cell past the cell's limit of entities is RESOURCE_EXHAUSTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spatial_event_reaches_each_session_once_and_a_full_cell_is_resource_exhausted() {
    let mut overrides = LAYOUT.to_vec();
    overrides.extend(["spatial.server_interest_border=1", "channels.max_list_len=2"]);
    let gw = common::start(&overrides).await;
    let s0 = server(&gw, "s0", Some(0)).await;
    let s1 = server(&gw, "s1", Some(1)).await;
    // The fence: slot 3's join, which s0 also sees (its border reaches cell [2, 2]).
    let _s3 = server(&gw, "s3", Some(3)).await;
    let mut joins = Vec::new();
    loop {
        let e = SpatialEvent::decode(common::channels::next(&s0, "spatial.event").await).unwrap();
        assert_eq!(e.kind(), SpatialEventKind::ServerJoined);
        joins.push(e.slot);
        if e.slot == 3 {
            break;
        }
    }
    assert_eq!(joins, [1, 3], "each join once, never s0's own");
    let first = SpatialEvent::decode(common::channels::next(&s1, "spatial.event").await).unwrap();
    assert_eq!(first.slot, 3, "s1 was not told of its own join");
    // Two entities fill cell [0, 0]; a third is refused as past the cell's limits.
    let spawn = || SpawnEntity { position: v3([5.0, 0.0, 5.0]), ..SpawnEntity::default() };
    s0.spatial_spawn(spawn()).await.unwrap();
    s0.spatial_spawn(spawn()).await.unwrap();
    assert_eq!(status(s0.spatial_spawn(spawn()).await), Status::ResourceExhausted);
}
