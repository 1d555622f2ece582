//! Players and game servers are different principals: what a player tried in the outside probe
//! (become master by creating the global channel first, remove a server's channel, claim and
//! write a channel after its server left, create channels by the thousand) is refused with a
//! status, quotas hold per role, and a channel nobody claims after its owner left goes away.

mod common;

use prost::Message;
use tickwire_wire::proto::{
    ChannelEvent, ChannelEventKind, ChannelRef, ChannelType, Status, SubscriptionOptions,
};

use common::channels::{client, create, next, status, subscribe, update};

#[tokio::test]
async fn players_cannot_create_claim_or_remove_channels() {
    let gw = common::start(&[]).await;
    let alice = client(&gw, "alice").await;
    // First to ask, but a player: no global channel, no master.
    for ty in [ChannelType::Global, ChannelType::Subworld, ChannelType::Private, ChannelType::Entity] {
        assert_eq!(status(create(&alice, ty).await), Status::PermissionDenied, "{ty:?}");
    }
    let server = client(&gw, "server:zone-1").await;
    let global = create(&server, ChannelType::Global).await.unwrap();
    assert!(global.master, "the server is the master");
    let sub = create(&server, ChannelType::Subworld).await.unwrap().channel_id;
    subscribe(&alice, sub, SubscriptionOptions::default()).await.unwrap();
    let remove = ChannelRef { channel_id: sub }.encode_to_vec();
    assert_eq!(status(alice.call("channel.remove", remove.into()).await), Status::PermissionDenied);

    // The server's session ends: a player can neither claim the channel nor write to it.
    server.close().await;
    let event = ChannelEvent::decode(next(&alice, "channel.event").await).unwrap();
    assert_eq!(event.kind(), ChannelEventKind::OwnerLost);
    let claim = ChannelRef { channel_id: sub }.encode_to_vec();
    assert_eq!(status(alice.call("channel.claim", claim.clone().into()).await), Status::PermissionDenied);
    let patch = r#"{"op":"set","path":"/round","value":1}"#;
    assert_eq!(status(update(&alice, sub, patch).await), Status::PermissionDenied);
    // Another game server may.
    let successor = client(&gw, "server:zone-2").await;
    successor.call("channel.claim", claim.into()).await.unwrap();
    update(&successor, sub, patch).await.unwrap();
    assert!(gw.shutdown(common::channels::WAIT).await);
}

#[tokio::test]
async fn owned_channels_are_counted_against_a_quota_per_role() {
    let gw = common::start(&[
        "channels.entity.players_may_own=true",
        "channels.max_owned_per_player=2",
        "channels.max_owned_per_server=3",
    ])
    .await;
    let alice = client(&gw, "alice").await;
    let mut mine = Vec::new();
    for _ in 0..2 {
        mine.push(create(&alice, ChannelType::Entity).await.unwrap().channel_id);
    }
    assert_eq!(status(create(&alice, ChannelType::Entity).await), Status::ResourceExhausted);
    assert_eq!(
        status(create(&alice, ChannelType::Subworld).await),
        Status::PermissionDenied,
        "not that type"
    );
    let server = client(&gw, "server:zone-1").await;
    for _ in 0..3 {
        create(&server, ChannelType::Subworld).await.unwrap();
    }
    assert_eq!(status(create(&server, ChannelType::Entity).await), Status::ResourceExhausted);
    // Removing one frees its place.
    let remove = ChannelRef { channel_id: mine[0] }.encode_to_vec();
    alice.call("channel.remove", remove.into()).await.unwrap();
    create(&alice, ChannelType::Entity).await.unwrap();
    assert!(gw.shutdown(common::channels::WAIT).await);
}

#[tokio::test]
async fn a_channel_nobody_claims_after_its_owner_left_is_removed() {
    let gw = common::start(&["channels.orphan_ttl=\"200ms\""]).await;
    let server = client(&gw, "server:zone-1").await;
    let ch = create(&server, ChannelType::Subworld).await.unwrap().channel_id;
    let alice = client(&gw, "alice").await;
    subscribe(&alice, ch, SubscriptionOptions::default()).await.unwrap();
    server.close().await;
    let lost = ChannelEvent::decode(next(&alice, "channel.event").await).unwrap();
    assert_eq!(lost.kind(), ChannelEventKind::OwnerLost);
    let removed = ChannelEvent::decode(next(&alice, "channel.event").await).unwrap();
    assert_eq!(removed.kind(), ChannelEventKind::Removed, "{removed:?}");
    // Gone from the registry too: a late server cannot claim it.
    let late = client(&gw, "server:zone-2").await;
    let claim = ChannelRef { channel_id: ch }.encode_to_vec();
    assert_eq!(status(late.call("channel.claim", claim.into()).await), Status::NotFound);
    assert!(gw.shutdown(common::channels::WAIT).await);
}

#[tokio::test]
async fn subscriptions_per_session_are_bounded() {
    let gw = common::start(&["channels.max_subscriptions_per_session=2"]).await;
    let server = client(&gw, "server:zone-1").await;
    let mut channels = Vec::new();
    for _ in 0..3 {
        channels.push(create(&server, ChannelType::Subworld).await.unwrap().channel_id);
    }
    let alice = client(&gw, "alice").await;
    subscribe(&alice, channels[0], SubscriptionOptions::default()).await.unwrap();
    subscribe(&alice, channels[1], SubscriptionOptions::default()).await.unwrap();
    let third = subscribe(&alice, channels[2], SubscriptionOptions::default()).await;
    assert_eq!(status(third), Status::ResourceExhausted);
    // Subscribing again to change options is not a new subscription.
    let slower = SubscriptionOptions { fanout_interval_ms: 100, ..Default::default() };
    subscribe(&alice, channels[0], slower).await.unwrap();
    assert!(gw.shutdown(common::channels::WAIT).await);
}

#[tokio::test]
async fn patches_and_lists_past_their_limits_are_refused_whole() {
    let gw = common::start(&["channels.max_patch_bytes=200", "channels.max_list_len=3"]).await;
    let server = client(&gw, "server:zone-1").await;
    let ch = create(&server, ChannelType::Subworld).await.unwrap().channel_id;
    let long = format!(r#"{{"op":"set","path":"/round","value":1}}{}"#, " ".repeat(200));
    assert_eq!(status(update(&server, ch, &long).await), Status::ResourceExhausted);
    let hand = r#"{"op":"set","path":"/hands/a","value":[1,2,3]}"#;
    update(&server, ch, hand).await.unwrap();
    // One more item, in a patch that also changes the round: refused whole.
    let grow = "{\"op\":\"set\",\"path\":\"/round\",\"value\":7}\n{\"op\":\"push\",\"path\":\"/hands/a\",\"value\":4}";
    assert_eq!(status(update(&server, ch, grow).await), Status::ResourceExhausted);
    let alice = client(&gw, "alice").await;
    subscribe(&alice, ch, SubscriptionOptions::default()).await.unwrap();
    let mut replica = tickwire_state::Replica::new(common::channels::schema());
    let first = tickwire_wire::proto::ChannelUpdate::decode(next(&alice, "channel.update").await).unwrap();
    replica.apply(&first.update).unwrap();
    let tickwire_state::Value::Struct(fields) = replica.value() else { panic!("a struct") };
    assert_eq!(fields[0], tickwire_state::Value::Int(0), "the round did not change either");
    assert!(gw.shutdown(common::channels::WAIT).await);
}

#[tokio::test]
async fn a_channel_state_past_its_byte_limit_is_refused_and_the_writer_is_told_why() {
    let gw = common::start(&["channels.max_state_bytes=4000"]).await;
    let server = client(&gw, "server:zone-1").await;
    let ch = create(&server, ChannelType::Subworld).await.unwrap().channel_id;
    // Hands of 100 ints weigh about 800 bytes each: the fifth one does not fit.
    let hand =
        |who: &str| format!(r#"{{"op":"set","path":"/hands/{who}","value":[{}]}}"#, vec!["7"; 100].join(","));
    for who in ["a", "b", "c", "d"] {
        update(&server, ch, &hand(who)).await.unwrap();
    }
    match update(&server, ch, &hand("e")).await {
        Err(tickwire_client::ClientError::Status { status: Status::ResourceExhausted, message }) => {
            assert!(message.contains("channels.max_state_bytes"), "{message}")
        }
        other => panic!("expected RESOURCE_EXHAUSTED, got {other:?}"),
    }
    // Replacing with less is fine, and the session goes on.
    update(&server, ch, r#"{"op":"set","path":"/hands/a","value":[1]}"#).await.unwrap();
    update(&server, ch, &hand("e")).await.unwrap();
    assert!(gw.shutdown(common::channels::WAIT).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_at_its_default_byte_limit_still_serves_late_subscribers_and_everyone_else() {
    let gw = common::start(&[]).await;
    let server = client(&gw, "server:zone-1").await;
    let ch = create(&server, ChannelType::Subworld).await.unwrap().channel_id;
    // 10,000 players, then 10,000-int hands until the state's byte limit refuses one.
    // (A patch holds at most 4,096 ops: four patches of 2,500.)
    for quarter in 0..4 {
        let lines: Vec<String> = (quarter * 2_500..(quarter + 1) * 2_500)
            .map(|i| format!(r#"{{"op":"set","path":"/players/p{i}","value":{{"hp":{i}}}}}"#))
            .collect();
        update(&server, ch, &lines.join("\n")).await.unwrap();
    }
    let hand = |who: &str| {
        format!(r#"{{"op":"set","path":"/hands/{who}","value":[{}]}}"#, vec!["7"; 10_000].join(","))
    };
    update(&server, ch, &hand("late")).await.unwrap();
    let mut refused = false;
    for i in 0..100 {
        if let Err(e) = update(&server, ch, &hand(&format!("h{i}"))).await {
            assert_eq!(status(Err::<(), _>(e)), Status::ResourceExhausted);
            refused = true;
            break;
        }
    }
    assert!(refused, "the state stopped growing at channels.max_state_bytes");

    // A late subscriber gets its whole snapshot, and a client beside it is answered meanwhile.
    let late = client(&gw, "late").await;
    let mut beside = common::connect(&gw).await;
    let (snapshot, rtt) = tokio::join!(
        async {
            subscribe(&late, ch, SubscriptionOptions::default()).await.unwrap();
            tickwire_wire::proto::ChannelUpdate::decode(next(&late, "channel.update").await).unwrap()
        },
        async {
            let started = std::time::Instant::now();
            common::round_trip(&mut beside, 1, 8).await;
            started.elapsed()
        }
    );
    let mut replica = tickwire_state::Replica::new(common::channels::schema());
    replica.apply(&snapshot.update).unwrap();
    let tickwire_state::Value::Struct(fields) = replica.value() else { panic!("a struct") };
    let tickwire_state::Value::Map(players) = &fields[1] else { panic!("a map") };
    assert_eq!(players.len(), 10_000);
    // Generous: an unbounded state stalled a neighbour for 7.6 s before the limit.
    assert!(rtt < std::time::Duration::from_secs(2), "the echo beside took {rtt:?}");
    assert!(gw.shutdown(common::channels::WAIT).await);
}
