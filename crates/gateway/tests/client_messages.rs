//! A client's messages to a game server never harm the server: a client that sends faster than
//! the server reads is told to retry (`UNAVAILABLE`) instead of making the server's session a
//! slow consumer, and a client may send only to a channel it may subscribe to.

mod common;

use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use tickwire_client::{ConnectOptions, Connection, Event};
use tickwire_wire::proto::{
    ChannelMessage, ChannelSend, ChannelType, CreateChannel, CreateChannelResult, Response, Status,
};

use common::channels::{SCHEMA, client, create, status};

/// Calls `method` on a raw connection and returns the response (pushes are skipped).
async fn call(conn: &mut Connection, id: u64, method: &str, body: Bytes) -> Response {
    conn.send_request(id, method, body).unwrap();
    loop {
        conn.flush().await;
        let event = tokio::time::timeout(Duration::from_secs(10), conn.next_event()).await;
        match event.expect("a response in time").unwrap() {
            Some(Event::Response(r)) if r.id == id => return r,
            Some(Event::Closed { reason, message }) => panic!("closed: {reason:?}: {message}"),
            _ => {}
        }
    }
}

#[tokio::test]
async fn a_client_flooding_a_channels_owner_is_told_to_retry_and_the_owner_stays() {
    let gw = common::start(&["limits.outbox_capacity=8"]).await;
    // The owner, on a raw connection that reads (and so acknowledges) only when the test says.
    let mut opts = ConnectOptions::new(common::tcp_target(&gw));
    opts.token = "server:room".into();
    let mut owner = Connection::connect(opts).await.unwrap();
    let create = CreateChannel {
        r#type: ChannelType::Subworld as i32,
        name: "room".into(),
        schema_json: SCHEMA.into(),
    };
    let created = call(&mut owner, 1, "channel.create", create.encode_to_vec().into()).await;
    assert_eq!(created.status, Status::Ok as i32, "{}", created.error);
    let channel_id = CreateChannelResult::decode(created.body).unwrap().channel_id;

    // 100 KiB messages: the owner's 1 MiB of unacknowledged data holds ten, its outbox of 8
    // takes six more from clients (a quarter stays for the gateway), then the client is told
    // to retry.
    let player = client(&gw, "flooder").await;
    let body = Bytes::from(vec![1u8; 100 << 10]);
    let mut sent = 0u32;
    let refused = loop {
        let send = ChannelSend { channel_id, to_connection: 0, broadcast: 0, body: body.clone() };
        match player.call("channel.send", send.encode_to_vec().into()).await {
            Ok(_) => sent += 1,
            Err(e) => break e,
        }
        assert!(sent < 100, "never refused");
    };
    assert_eq!(status(Err::<(), _>(refused)), Status::Unavailable);
    assert!(sent >= 10, "refused after {sent}");
    assert_eq!(gw.session_count(), 2, "the owner's session is still there");

    // The owner reads: every message the client was told went, in order, and its session goes
    // on.
    let mut got = 0;
    while got < sent {
        owner.flush().await;
        let event = tokio::time::timeout(Duration::from_secs(10), owner.next_event()).await;
        match event.expect("the messages arrive").unwrap() {
            Some(Event::Push(push)) => {
                assert_eq!(push.topic, "channel.message");
                assert_eq!(ChannelMessage::decode(push.body).unwrap().body.len(), body.len());
                got += 1;
            }
            Some(Event::Closed { reason, message }) => panic!("the owner was closed: {reason:?}: {message}"),
            _ => {}
        }
    }
    assert_eq!(common::round_trip(&mut owner, 2, 8).await.body.len(), 8);
    // And the client can send again.
    let send = ChannelSend { channel_id, to_connection: 0, broadcast: 0, body: Bytes::from_static(b"hi") };
    player.call("channel.send", send.encode_to_vec().into()).await.unwrap();
}

#[tokio::test]
async fn a_client_may_send_only_to_a_channel_it_may_subscribe_to() {
    let gw = common::start(&[]).await;
    let server = client(&gw, "server:game").await;
    let private = create(&server, ChannelType::Private).await.unwrap().channel_id;
    let open = create(&server, ChannelType::Subworld).await.unwrap().channel_id;
    let player = client(&gw, "player").await;
    let send = |channel_id| ChannelSend {
        channel_id,
        to_connection: 0,
        broadcast: 0,
        body: Bytes::from_static(b"x"),
    };
    let refused = player.call("channel.send", send(private).encode_to_vec().into()).await;
    assert_eq!(status(refused), Status::PermissionDenied);
    player.call("channel.send", send(open).encode_to_vec().into()).await.unwrap();
    // The owner may send on its private channel (to itself, here).
    server.call("channel.send", send(private).encode_to_vec().into()).await.unwrap();
}
