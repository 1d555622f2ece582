//! The echo service over TCP and WebSocket, and RPC error statuses.

mod common;

use bytes::Bytes;
use tickwire_client::{Client, ClientError, ConnectOptions, Target};
use tickwire_wire::proto::Status;

#[tokio::test]
async fn echo_over_tcp_returns_the_requested_size() {
    let gw = common::start(&[]).await;
    let client = Client::connect(ConnectOptions::new(common::tcp_target(&gw))).await.unwrap();
    for size in [0u32, 1, 71, 151, 4096] {
        let body = client.call("echo", common::echo_body(size, 164)).await.unwrap();
        assert_eq!(body.len(), size as usize);
    }
    assert!(client.player_id().starts_with("anon-"));
    client.close().await;
    assert!(gw.shutdown(std::time::Duration::from_secs(5)).await);
}

#[tokio::test]
async fn echo_over_websocket() {
    let gw = common::start(&[]).await;
    let url = format!("ws://{}/", gw.ws_addrs()[0]);
    let target = Target::parse(&url).await.unwrap();
    let mut opts = ConnectOptions::new(target);
    opts.token = "alice".into();
    let client = Client::connect(opts).await.unwrap();
    assert_eq!(client.player_id(), "alice");
    let body = client.call("echo", common::echo_body(300, 10)).await.unwrap();
    assert_eq!(body.len(), 300);
    client.close().await;
}

#[tokio::test]
async fn unknown_method_and_bad_body_get_error_statuses_and_the_session_lives_on() {
    let gw = common::start(&[]).await;
    let client = Client::connect(ConnectOptions::new(common::tcp_target(&gw))).await.unwrap();
    let err = client.call("nope", Bytes::new()).await.unwrap_err();
    assert!(matches!(err, ClientError::Status { status: Status::NotFound, .. }), "{err}");
    let err = client.call("echo", Bytes::from_static(&[0x0a, 0xff])).await.unwrap_err();
    assert!(matches!(err, ClientError::Status { status: Status::InvalidArgument, .. }), "{err}");
    let err = client.call("echo", common::echo_body(u32::MAX, 0)).await.unwrap_err();
    assert!(matches!(err, ClientError::Status { status: Status::InvalidArgument, .. }), "{err}");
    assert_eq!(client.call("echo", common::echo_body(5, 0)).await.unwrap().len(), 5);
}

#[tokio::test]
async fn target_parsing() {
    assert!(matches!(Target::parse("127.0.0.1:1").await.unwrap(), Target::Tcp(_)));
    assert!(matches!(Target::parse("tcp://127.0.0.1:1").await.unwrap(), Target::Tcp(_)));
    assert!(matches!(Target::parse("ws://127.0.0.1:1/x").await.unwrap(), Target::Ws { .. }));
    assert!(matches!(Target::parse("http://127.0.0.1:1").await, Err(ClientError::BadTarget(_))));
    assert!(matches!(Target::parse("nonsense").await, Err(ClientError::BadTarget(_))));
}

/// Calls queued without waiting each get their own answer, whichever order the answers are
/// waited for in; a reply that is dropped takes nothing from the others.
#[tokio::test]
async fn queued_calls_each_get_their_own_answer() {
    let gw = common::start(&[]).await;
    let client = Client::connect(ConnectOptions::new(common::tcp_target(&gw))).await.unwrap();
    let mut replies = Vec::new();
    for size in 0..50u32 {
        let reply = client.queue_call("echo", common::echo_body(size, 3)).await.unwrap();
        if size % 7 == 3 {
            drop(reply);
        } else {
            replies.push((size, reply));
        }
    }
    let bad = client.queue_call("nope", Bytes::new()).await.unwrap();
    // A lost answer fails the test instead of hanging it.
    let within = |f| tokio::time::timeout(std::time::Duration::from_secs(10), f);
    while let Some((size, reply)) = replies.pop() {
        assert_eq!(within(reply.answer()).await.expect("answered").unwrap().len(), size as usize);
    }
    let err = within(bad.answer()).await.expect("answered").unwrap_err();
    assert!(matches!(err, ClientError::Status { status: Status::NotFound, .. }), "{err}");
    client.close().await;
}

/// A gateway with frames of up to 4 MiB answers an echo of 2 MiB (half a frame); the client
/// takes frames up to the Welcome's maximum, not only its own 1 MiB default.
#[tokio::test]
async fn a_client_takes_frames_up_to_the_gateways_maximum() {
    let gw = common::start(&["limits.max_frame_bytes=4194304", "session.max_unacked_bytes=8388608"]).await;
    let client = Client::connect(ConnectOptions::new(common::tcp_target(&gw))).await.unwrap();
    let body = client.call("echo", common::echo_body(2 << 20, 0)).await.unwrap();
    assert_eq!(body.len(), 2 << 20);
    client.close().await;
}
