//! Channels end to end: a game server creates and updates a channel, clients subscribe and
//! rebuild exactly what they may see, access rules and bad patches are refused with a reason,
//! messages route between clients and the owner, and a frozen subscriber stalls nobody.

mod common;

use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use tickwire_client::{Client, ClientError, ConnectOptions, Connection};
use tickwire_gateway::RunningGateway;
use tickwire_state::{Key, Replica, SchemaDef, Value};
use tickwire_wire::proto::{
    Broadcast, ChannelEvent, ChannelEventKind, ChannelMessage, ChannelRef, ChannelSend, ChannelType,
    ChannelUpdate, CreateChannel, DataAccess, Status, Subscribe, SubscriptionOptions,
};

use common::channels::{WAIT, client, create, next, next_any, schema, status, subscribe, update};

#[tokio::test]
async fn subscribers_rebuild_what_they_may_see() {
    let gw = common::start(&[]).await;
    let server = client(&gw, "server:game-server").await;
    let created = create(&server, ChannelType::Global).await.unwrap();
    assert!(created.master);
    let ch = created.channel_id;
    update(
        &server,
        ch,
        r#"{"op":"set","path":"/round","value":1}
           {"op":"set","path":"/players/alice","value":{"hp":10}}
           {"op":"set","path":"/hands/alice","value":[1,2]}
           {"op":"set","path":"/hands/bob","value":[9]}"#,
    )
    .await
    .unwrap();

    let alice = client(&gw, "alice").await;
    let sub = subscribe(&alice, ch, SubscriptionOptions::default()).await.unwrap();
    assert_eq!(SchemaDef::parse(&sub.schema_json, "s.json").unwrap(), schema().def().clone());
    let mut replica = Replica::new(schema());
    let first = ChannelUpdate::decode(next(&alice, "channel.update").await).unwrap();
    assert_eq!(first.channel_id, ch);
    replica.apply(&first.update).unwrap();
    let Value::Struct(fields) = replica.value() else { panic!("a struct") };
    assert_eq!(fields[0], Value::Int(1));
    let Value::Map(hands) = &fields[2] else { panic!("a map") };
    assert_eq!(hands.keys().collect::<Vec<_>>(), [&Key::str("alice")], "only her own hand");

    update(&server, ch, r#"{"op":"set","path":"/round","value":2}"#).await.unwrap();
    let delta = ChannelUpdate::decode(next(&alice, "channel.update").await).unwrap();
    replica.apply(&delta.update).unwrap();
    let Value::Struct(fields) = replica.value() else { panic!("a struct") };
    assert_eq!(fields[0], Value::Int(2));
    assert!(gw.shutdown(WAIT).await);
}

/// docs/protocol.md §12.2, "Versions": a channel never written gives a snapshot from 0 to 0;
/// the first write then comes as a snapshot from 0 (a replica at version 0 has nothing a delta
/// could build on), and deltas follow from version 1 on.
#[tokio::test]
async fn a_channel_never_written_gives_snapshots_until_version_one_then_deltas() {
    let gw = common::start(&[]).await;
    let server = client(&gw, "server:game-server").await;
    let ch = create(&server, ChannelType::Global).await.unwrap().channel_id;
    let alice = client(&gw, "alice").await;
    subscribe(&alice, ch, SubscriptionOptions::default()).await.unwrap();
    let header = |u: &ChannelUpdate| (u.update[0], u.update[1], u.update[2]);
    let mut replica = Replica::new(schema());
    let first = ChannelUpdate::decode(next(&alice, "channel.update").await).unwrap();
    assert_eq!(&first.update[..], [0x02, 0, 0, 0], "snapshot 0 to 0, empty root patch (the vector)");
    replica.apply(&first.update).unwrap();
    update(&server, ch, r#"{"op":"set","path":"/round","value":1}"#).await.unwrap();
    let second = ChannelUpdate::decode(next(&alice, "channel.update").await).unwrap();
    assert_eq!(header(&second), (0x02, 0, 1), "snapshot 0 to 1");
    replica.apply(&second.update).unwrap();
    update(&server, ch, r#"{"op":"set","path":"/round","value":2}"#).await.unwrap();
    let third = ChannelUpdate::decode(next(&alice, "channel.update").await).unwrap();
    assert_eq!(header(&third), (0x01, 1, 2), "delta 1 to 2");
    replica.apply(&third.update).unwrap();
    let Value::Struct(fields) = replica.value() else { panic!("a struct") };
    assert_eq!(fields[0], Value::Int(2));
    assert!(gw.shutdown(WAIT).await);
}

#[tokio::test]
async fn access_rules_and_bad_input_are_refused_with_a_reason() {
    let gw = common::start(&[]).await;
    let server = client(&gw, "server:game-server").await;
    let ch = create(&server, ChannelType::Global).await.unwrap().channel_id;
    let alice = client(&gw, "alice").await;
    subscribe(&alice, ch, SubscriptionOptions::default()).await.unwrap();

    // Clients cannot write, remove, create a second global channel, or ask for write access.
    assert_eq!(
        status(update(&alice, ch, r#"{"op":"set","path":"/round","value":9}"#).await),
        Status::PermissionDenied
    );
    let remove = ChannelRef { channel_id: ch }.encode_to_vec();
    assert_eq!(status(alice.call("channel.remove", remove.clone().into()).await), Status::PermissionDenied);
    assert_eq!(
        status(create(&alice, ChannelType::Global).await),
        Status::PermissionDenied,
        "players never create channels"
    );
    let write = SubscriptionOptions { access: DataAccess::Write as i32, ..Default::default() };
    assert_eq!(status(subscribe(&alice, ch, write).await), Status::PermissionDenied);
    assert_eq!(status(create(&alice, ChannelType::Spatial).await), Status::InvalidArgument);
    assert_eq!(status(subscribe(&alice, 999, SubscriptionOptions::default()).await), Status::NotFound);
    assert_eq!(
        status(alice.call("channel.subscribe", Bytes::from_static(&[0xff, 0xff])).await),
        Status::InvalidArgument
    );
    let bad_schema =
        CreateChannel { r#type: ChannelType::Entity as i32, name: String::new(), schema_json: "{".into() };
    assert_eq!(
        status(alice.call("channel.create", bad_schema.encode_to_vec().into()).await),
        Status::InvalidArgument
    );

    // A malformed or misfit patch changes nothing, and says why.
    update(&server, ch, r#"{"op":"set","path":"/round","value":5}"#).await.unwrap();
    for patch in [
        "not json",
        r#"{"op":"set","path":"/round","value":"five"}"#,
        "{\"op\":\"set\",\"path\":\"/round\",\"value\":6}\n{\"op\":\"set\",\"path\":\"/players/ghost/hp\",\"value\":1}",
    ] {
        match update(&server, ch, patch).await {
            Err(ClientError::Status { status: Status::InvalidArgument, message }) => {
                assert!(message.contains("patch"), "{message}")
            }
            other => panic!("{patch}: {other:?}"),
        }
    }
    let bob = client(&gw, "bob").await;
    subscribe(&bob, ch, SubscriptionOptions::default()).await.unwrap();
    let mut replica = Replica::new(schema());
    replica.apply(&ChannelUpdate::decode(next(&bob, "channel.update").await).unwrap().update).unwrap();
    let Value::Struct(fields) = replica.value() else { panic!("a struct") };
    assert_eq!(fields[0], Value::Int(5), "the refused patches changed nothing");

    // Every refusal left the connections open.
    assert_eq!(alice.call("echo", common::echo_body(3, 0)).await.unwrap().len(), 3);
    assert!(server.call("channel.remove", remove.into()).await.is_ok());
    let event = ChannelEvent::decode(next(&bob, "channel.event").await).unwrap();
    assert_eq!(event.kind(), ChannelEventKind::Removed);
    assert!(gw.shutdown(WAIT).await);
}

#[tokio::test]
async fn messages_route_between_clients_and_the_owner() {
    let gw = common::start(&[]).await;
    let server = client(&gw, "server:game-server").await;
    let ch = create(&server, ChannelType::Subworld).await.unwrap().channel_id;
    let alice = client(&gw, "alice").await;
    let bob = client(&gw, "bob").await;
    let alice_id = subscribe(&alice, ch, SubscriptionOptions::default()).await.unwrap().connection_id;
    subscribe(&bob, ch, SubscriptionOptions::default()).await.unwrap();

    // A client's message goes to the owner, tagged with the client's connection id.
    let to_owner =
        ChannelSend { channel_id: ch, to_connection: 0, broadcast: 0, body: Bytes::from_static(b"jump") };
    alice.call("channel.send", to_owner.encode_to_vec().into()).await.unwrap();
    let msg = ChannelMessage::decode(next(&server, "channel.message").await).unwrap();
    assert_eq!((msg.channel_id, msg.from_connection, &msg.body[..]), (ch, alice_id, &b"jump"[..]));

    // The owner answers one client, then broadcasts to the clients.
    let to_alice = ChannelSend {
        channel_id: ch,
        to_connection: alice_id,
        broadcast: 0,
        body: Bytes::from_static(b"ok"),
    };
    server.call("channel.send", to_alice.encode_to_vec().into()).await.unwrap();
    assert_eq!(&ChannelMessage::decode(next(&alice, "channel.message").await).unwrap().body[..], b"ok");
    let all = ChannelSend {
        channel_id: ch,
        to_connection: 0,
        broadcast: Broadcast::Clients as i32,
        body: Bytes::from_static(b"round over"),
    };
    server.call("channel.send", all.encode_to_vec().into()).await.unwrap();
    for c in [&alice, &bob] {
        assert_eq!(
            &ChannelMessage::decode(next(c, "channel.message").await).unwrap().body[..],
            b"round over"
        );
    }

    // Clients may not broadcast or address other clients.
    let mut sneaky = all.clone();
    sneaky.broadcast = Broadcast::All as i32;
    assert_eq!(
        status(alice.call("channel.send", sneaky.encode_to_vec().into()).await),
        Status::PermissionDenied
    );
    let direct = ChannelSend { channel_id: ch, to_connection: alice_id, broadcast: 0, body: Bytes::new() };
    assert_eq!(
        status(bob.call("channel.send", direct.encode_to_vec().into()).await),
        Status::PermissionDenied
    );

    // The owner leaving is announced; the subworld channel is kept, and another server can take
    // it over (once).
    server.close().await;
    let event = ChannelEvent::decode(next(&alice, "channel.event").await).unwrap();
    assert_eq!(event.kind(), ChannelEventKind::OwnerLost);
    let successor = client(&gw, "server:game-server-2").await;
    let claim = ChannelRef { channel_id: ch }.encode_to_vec();
    successor.call("channel.claim", claim.clone().into()).await.unwrap();
    let event = ChannelEvent::decode(next(&alice, "channel.event").await).unwrap();
    assert_eq!(event.kind(), ChannelEventKind::OwnerRecovered);
    assert_eq!(status(bob.call("channel.claim", claim.into()).await), Status::AlreadyExists);
    update(&successor, ch, r#"{"op":"set","path":"/round","value":7}"#).await.unwrap();
    assert!(gw.shutdown(WAIT).await);
}

#[tokio::test]
async fn a_frozen_subscriber_stalls_nobody() {
    // Hands of 10,001 numbers: over the default list limit, on purpose.
    let gw = common::start(&["metrics.listen=\"127.0.0.1:0\"", "channels.max_list_len=20000"]).await;
    let server = client(&gw, "server:game-server").await;
    let ch = create(&server, ChannelType::Global).await.unwrap().channel_id;
    // A fat entry so that the frozen client's socket and outbox fill quickly.
    let big =
        format!(r#"{{"op":"set","path":"/hands/frozen","value":[{}]}}"#, vec!["123456789"; 2000].join(","));
    update(&server, ch, &big).await.unwrap();

    // The frozen subscriber is a Connection nobody reads from after subscribing.
    let mut opts = ConnectOptions::new(common::tcp_target(&gw));
    opts.token = "frozen".into();
    let mut frozen = Connection::connect(opts).await.unwrap();
    let req = Subscribe { channel_id: ch, options: Some(SubscriptionOptions::default()) };
    frozen.send_request(1, "channel.subscribe", req.encode_to_vec().into()).unwrap();
    frozen.flush().await;

    let healthy: Vec<Client> = futures_join(&gw, ch).await;
    // Each healthy subscriber reads until its replica holds the last round.
    let reading = healthy.iter().map(|c| async move {
        let mut replica = Replica::new(schema());
        let mut updates = 0u32;
        loop {
            replica.apply(&ChannelUpdate::decode(next(c, "channel.update").await).unwrap().update).unwrap();
            updates += 1;
            let Value::Struct(fields) = replica.value() else { panic!("a struct") };
            if fields[0] == Value::Int(99) {
                return updates;
            }
        }
    });
    // Each round replaces the frozen player's 100 KB hand: its socket and outbox fill up.
    let hand = vec!["123456789"; 10_000].join(",");
    let writer = async {
        for round in 0..100 {
            let patch = format!(
                "{{\"op\":\"set\",\"path\":\"/round\",\"value\":{round}}}\n{{\"op\":\"set\",\"path\":\"/hands/frozen\",\"value\":[{round},{hand}]}}"
            );
            update(&server, ch, &patch).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    // Every healthy subscriber reaches the last round: `next` panics if any waits longer than
    // WAIT for an update, so getting past this line is the check that the frozen one held
    // nobody up.
    let (_updates, ()) = tokio::join!(futures_util::future::join_all(reading), writer);
    // The frozen subscriber cost bounded memory: its updates were coalesced while its outbox
    // was full, or its session hit the retransmit bound (1 MiB unacknowledged) and was closed.
    let metrics = common::scrape(gw.metrics_addr().unwrap()).await;
    let figure = |series: &str| -> f64 {
        let line = metrics.lines().find_map(|l| l.strip_prefix(series)).unwrap_or_else(|| panic!("{series}"));
        line.trim().parse().unwrap()
    };
    let bounded = figure("channel_updates_coalesced ") + figure("closes{reason=\"retransmit_overflow\"} ");
    assert!(bounded >= 1.0, "{metrics}");
    drop(frozen);
    assert!(gw.shutdown(WAIT).await);
}

async fn futures_join(gw: &RunningGateway, ch: u64) -> Vec<Client> {
    let mut out = Vec::new();
    for i in 0..4 {
        let c = client(gw, &format!("healthy-{i}")).await;
        subscribe(&c, ch, SubscriptionOptions::default()).await.unwrap();
        out.push(c);
    }
    out
}

#[tokio::test]
async fn field_filters_and_option_changes_take_effect_at_the_next_fan_out() {
    let gw = common::start(&[]).await;
    let server = client(&gw, "server:game-server").await;
    let ch = create(&server, ChannelType::Global).await.unwrap().channel_id;
    update(
        &server,
        ch,
        r#"{"op":"set","path":"/round","value":3}
        {"op":"set","path":"/players/alice","value":{"hp":10}}"#,
    )
    .await
    .unwrap();
    let alice = client(&gw, "alice").await;
    let only_round = SubscriptionOptions { fields: vec!["round".into()], ..Default::default() };
    subscribe(&alice, ch, only_round).await.unwrap();
    let mut replica = Replica::new(schema());
    replica.apply(&ChannelUpdate::decode(next(&alice, "channel.update").await).unwrap().update).unwrap();
    let Value::Struct(fields) = replica.value() else { panic!("a struct") };
    assert_eq!(fields[0], Value::Int(3));
    assert_eq!(fields[1], Value::Map(Default::default()), "players are filtered out");

    // Dropping the filter: the next update is a snapshot with everything.
    subscribe(&alice, ch, SubscriptionOptions::default()).await.unwrap();
    update(&server, ch, r#"{"op":"set","path":"/round","value":4}"#).await.unwrap();
    let fields = loop {
        // The snapshot may come before or after round 4; read until round 4 is in.
        replica.apply(&ChannelUpdate::decode(next(&alice, "channel.update").await).unwrap().update).unwrap();
        let Value::Struct(fields) = replica.value() else { panic!("a struct") };
        if fields[0] == Value::Int(4) {
            break fields;
        }
    };
    let Value::Map(players) = &fields[1] else { panic!("a map") };
    assert_eq!(players.len(), 1, "the snapshot after the change holds the players");

    let unknown = SubscriptionOptions { fields: vec!["nope".into()], ..Default::default() };
    assert_eq!(status(subscribe(&alice, ch, unknown).await), Status::InvalidArgument);
    assert!(gw.shutdown(WAIT).await);
}

#[tokio::test]
async fn private_channels_rates_and_skipping_the_first_state() {
    let gw = common::start(&[]).await;
    let server = client(&gw, "server:game-server").await;
    let private = create(&server, ChannelType::Private).await.unwrap().channel_id;
    let alice = client(&gw, "alice").await;
    // Only the owner may subscribe to a private channel.
    assert_eq!(
        status(subscribe(&alice, private, SubscriptionOptions::default()).await),
        Status::PermissionDenied
    );

    let ch = create(&server, ChannelType::Subworld).await.unwrap().channel_id;
    update(&server, ch, r#"{"op":"set","path":"/round","value":1}"#).await.unwrap();
    // Without the first full state, the first update is a delta from the version at the
    // subscribe (1), and a change made right after the subscribe is in it. (The first
    // scheduler took the version at the first pass instead and lost this change.)
    let opts = SubscriptionOptions { skip_first_full_state: true, ..Default::default() };
    subscribe(&alice, ch, opts).await.unwrap();
    update(&server, ch, r#"{"op":"set","path":"/round","value":2}"#).await.unwrap();
    let first = ChannelUpdate::decode(next(&alice, "channel.update").await).unwrap();
    assert_eq!(&first.update[..3], &[0x01, 1, 2], "a delta (kind 1) from version 1 to 2");

    // A subscriber's interval reaches the scheduler: with a one-minute interval, bob gets
    // his snapshot and nothing more while carol, at the default rate, sees every round.
    let bob = client(&gw, "bob").await;
    let slow = SubscriptionOptions { fanout_interval_ms: 60_000, ..Default::default() };
    subscribe(&bob, ch, slow).await.unwrap();
    let snapshot = ChannelUpdate::decode(next(&bob, "channel.update").await).unwrap();
    assert_eq!(snapshot.update[0], 0x02, "a snapshot first");
    let carol = client(&gw, "carol").await;
    subscribe(&carol, ch, SubscriptionOptions::default()).await.unwrap();
    let mut carols = Replica::new(schema());
    for round in 3..=12 {
        update(&server, ch, &format!(r#"{{"op":"set","path":"/round","value":{round}}}"#)).await.unwrap();
    }
    // Carol reads until she holds the last round: every change has been fanned out by then.
    loop {
        carols.apply(&ChannelUpdate::decode(next(&carol, "channel.update").await).unwrap().update).unwrap();
        let Value::Struct(fields) = carols.value() else { panic!("a struct") };
        if fields[0] == Value::Int(12) {
            break;
        }
    }
    let pending = tokio::time::timeout(Duration::from_millis(50), next_any(&bob)).await;
    assert!(pending.is_err(), "bob got more than his snapshot within his interval: {pending:?}");
    assert!(gw.shutdown(WAIT).await);
}

#[tokio::test]
async fn channel_list_finds_channels_by_type_and_name_and_hides_what_the_caller_may_not_join() {
    use tickwire_wire::proto::{ChannelType, ListChannels, ListChannelsResult};
    let gw = common::start(&[]).await;
    let server = client(&gw, "server:game").await;
    let world = create(&server, ChannelType::Global).await.unwrap().channel_id;
    let room = create(&server, ChannelType::Subworld).await.unwrap().channel_id;
    let secret = create(&server, ChannelType::Private).await.unwrap().channel_id;
    async fn list(c: &Client, ty: ChannelType, name: &str) -> Vec<(u64, i32, u64)> {
        let req = ListChannels { r#type: ty as i32, name: name.into() };
        let body = c.call("channel.list", req.encode_to_vec().into()).await.unwrap();
        let r = ListChannelsResult::decode(body).unwrap();
        assert!(!r.truncated);
        r.channels.iter().map(|c| (c.channel_id, c.r#type, c.owner_connection)).collect()
    }
    let player = client(&gw, "player").await;
    let owner = server.connection_id();
    let (global, subworld) = (ChannelType::Global as i32, ChannelType::Subworld as i32);
    // A player sees the channels it may subscribe to: not the private one.
    assert_eq!(
        list(&player, ChannelType::Unspecified, "").await,
        [(world, global, owner), (room, subworld, owner)]
    );
    assert_eq!(list(&player, ChannelType::Global, "").await, [(world, global, owner)]);
    assert_eq!(list(&player, ChannelType::Unspecified, "test").await.len(), 2, "create() names them `test`");
    assert_eq!(list(&player, ChannelType::Unspecified, "nope").await, []);
    assert!(list(&server, ChannelType::Private, "").await.iter().any(|c| c.0 == secret), "its owner sees it");
    let bad = player.call("channel.list", Bytes::from_static(&[0xff])).await;
    assert_eq!(status(bad), tickwire_wire::proto::Status::InvalidArgument);
}

/// A subscribe the channel refuses (an unknown field in its filter) gives its place in the
/// session's quota back; one refused beside an accepted one to the same channel does not, as
/// the channel holds the session. Before, every refused subscribe kept its place until the
/// channel went or the session ended.
#[tokio::test]
async fn a_subscribe_the_channel_refuses_gives_its_quota_place_back() {
    let gw = common::start(&["channels.max_subscriptions_per_session=1"]).await;
    let server = client(&gw, "server:game-server").await;
    let a = create(&server, ChannelType::Subworld).await.unwrap().channel_id;
    let b = create(&server, ChannelType::Subworld).await.unwrap().channel_id;
    let alice = client(&gw, "alice").await;
    let unknown = SubscriptionOptions { fields: vec!["nope".into()], ..Default::default() };
    assert_eq!(status(subscribe(&alice, a, unknown.clone()).await), Status::InvalidArgument);
    subscribe(&alice, b, SubscriptionOptions::default()).await.expect("a's refusal left the place");
    let unsubscribe = ChannelRef { channel_id: b }.encode_to_vec();
    alice.call("channel.unsubscribe", unsubscribe.into()).await.unwrap();

    // A refused and an accepted subscribe to `a`, back to back: `a` keeps the place.
    let call = |options: SubscriptionOptions| {
        let body = Subscribe { channel_id: a, options: Some(options) }.encode_to_vec();
        alice.queue_call("channel.subscribe", body.into())
    };
    let refused = call(unknown).await.unwrap();
    let accepted = call(SubscriptionOptions::default()).await.unwrap();
    assert_eq!(status(refused.answer().await), Status::InvalidArgument);
    accepted.answer().await.expect("accepted");
    assert_eq!(
        status(subscribe(&alice, b, SubscriptionOptions::default()).await),
        Status::ResourceExhausted,
        "subscribed to a: the quota is full"
    );
    assert!(gw.shutdown(WAIT).await);
}
