//! A session whose outbox fills up is closed as a slow consumer; nobody waits for it, and the
//! other sessions carry on. A burst that outruns the acknowledgements of a client that keeps up
//! waits for them instead.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use tickwire_client::{ConnectOptions, Connection, Event};
use tickwire_gateway::{EchoRouter, Gateway, GatewayConfig, PushError, Router, SessionHandle};
use tickwire_wire::proto::{
    ChannelType, CloseReason, CreateChannel, CreateChannelResult, Request, Response, Status, UpdateChannel,
};
use tokio::io::AsyncWriteExt;

/// Answers `burst` with three pushes of 400 KiB: more than the session's resend buffer (1 MiB)
/// holds before the client's acknowledgement of the first can arrive.
struct Burster {
    echo: EchoRouter,
}

const BURST: usize = 400 << 10;

impl Router for Burster {
    fn on_request(&self, session: &SessionHandle, request: Request) -> Option<Response> {
        if request.method == "burst" {
            for i in 0..3u8 {
                session.push("burst", Bytes::from(vec![i; BURST])).expect("the outbox has room");
            }
            return None;
        }
        self.echo.on_request(session, request)
    }
}

#[tokio::test]
async fn a_burst_past_the_resend_buffer_waits_for_the_clients_acknowledgements() {
    let config =
        GatewayConfig::load(None, &["listen.tcp=[\"127.0.0.1:0\"]".into(), "listen.ws=[]".into()]).unwrap();
    assert_eq!(config.session.max_unacked_bytes, 1 << 20, "the burst is sized for the default");
    let gw = Gateway::new(config).unwrap().with_router(Arc::new(Burster { echo: EchoRouter::new(1024) }));
    let gw = gw.start().await.unwrap();
    let mut client = common::connect(&gw).await;
    client.send_request(1, "burst", Bytes::new()).unwrap();
    let mut got = Vec::new();
    while got.len() < 3 {
        // Writes the acknowledgements the client owes.
        client.flush().await;
        let event = tokio::time::timeout(Duration::from_secs(10), client.next_event()).await;
        match event.expect("the burst arrives").unwrap() {
            Some(Event::Push(push)) => {
                assert_eq!(push.body.len(), BURST);
                got.push(push.body[0]);
            }
            Some(Event::Closed { reason, message }) => panic!("closed: {reason:?}: {message}"),
            Some(_) | None => {}
        }
    }
    assert_eq!(got, [0, 1, 2], "all of it, in order");
    assert_eq!(common::round_trip(&mut client, 2, 64).await.body.len(), 64, "and the session goes on");
}

/// Answers `flood` by pushing more messages than the outbox holds; everything else is echo.
struct Flooder {
    echo: EchoRouter,
}

impl Router for Flooder {
    fn on_request(&self, session: &SessionHandle, request: Request) -> Option<Response> {
        if request.method == "flood-bytes" {
            // 40 messages of 100 KiB: far fewer than the outbox's places, twice its bytes.
            let refused = (0..40)
                .filter(|_| session.push("flood", Bytes::from(vec![7u8; 100 << 10])) == Err(PushError::Full))
                .count();
            assert!(refused > 0, "an outbox of 2 MiB cannot take 4 MiB");
            return None;
        }
        if request.method == "trickle" {
            let _ = session.push("trickle", Bytes::from(vec![7u8; 100 << 10]));
            return None;
        }
        if request.method == "flood" {
            let mut refused = 0;
            for _ in 0..100 {
                if session.push("flood", Bytes::from_static(b"x")) == Err(PushError::Full) {
                    refused += 1;
                }
            }
            assert!(refused > 0, "an outbox of 8 cannot take 100 pushes");
            return None;
        }
        self.echo.on_request(session, request)
    }
}

#[tokio::test]
async fn a_full_outbox_closes_only_that_session() {
    let config = GatewayConfig::load(
        None,
        &["listen.tcp=[\"127.0.0.1:0\"]".into(), "listen.ws=[]".into(), "limits.outbox_capacity=8".into()],
    )
    .unwrap();
    let (reason, message) = flooded(config, "flood").await;
    assert_eq!(reason, CloseReason::SlowConsumer, "{message}");
}

/// Starts a [`Flooder`] gateway with `config`, has a victim call `method` beside a healthy
/// client, and returns how the victim was closed, once the healthy client is still answered.
async fn flooded(config: GatewayConfig, method: &str) -> (CloseReason, String) {
    let gw = Gateway::new(config).unwrap().with_router(Arc::new(Flooder { echo: EchoRouter::new(1024) }));
    let gw = gw.start().await.unwrap();
    let mut healthy = common::connect(&gw).await;
    let mut victim = common::connect(&gw).await;
    victim.send_request(1, method, Bytes::new()).unwrap();
    victim.flush().await;
    let closed = loop {
        match victim.next_event().await.unwrap() {
            Some(Event::Closed { reason, message }) => break (reason, message),
            Some(Event::Push(_)) | None => {}
            Some(other) => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(common::round_trip(&mut healthy, 1, 64).await.body.len(), 64);
    closed
}

/// The outbox is bounded in bytes too (twice the larger of the resend buffer and the largest
/// frame: 2 MiB by default), not only in places: pushes of 4 MiB at once close the session as
/// a slow consumer though they take 40 of its 256 places. The other sessions carry on.
#[tokio::test]
async fn an_outbox_full_in_bytes_closes_only_that_session() {
    let config =
        GatewayConfig::load(None, &["listen.tcp=[\"127.0.0.1:0\"]".into(), "listen.ws=[]".into()]).unwrap();
    assert_eq!(config.limits.outbox_capacity, 256, "the places are the default's");
    let (reason, message) = flooded(config, "flood-bytes").await;
    assert_eq!(reason, CloseReason::SlowConsumer, "{message}");
}

/// What waits for a client that acknowledges nothing is bounded in bytes too: one that asks for
/// one 100 KiB push at a time is closed once its 1 MiB resend buffer is full and about 2 MiB
/// wait in its outbox, not after 256 of them (25 MiB).
#[tokio::test]
async fn what_waits_for_a_client_that_does_not_acknowledge_is_bounded_in_bytes() {
    use tickwire_wire::proto::{Envelope, envelope};
    let config =
        GatewayConfig::load(None, &["listen.tcp=[\"127.0.0.1:0\"]".into(), "listen.ws=[]".into()]).unwrap();
    let gw = Gateway::new(config).unwrap().with_router(Arc::new(Flooder { echo: EchoRouter::new(1024) }));
    let gw = gw.start().await.unwrap();
    let mut stream = tokio::net::TcpStream::connect(gw.tcp_addrs()[0]).await.unwrap();
    let mut bytes = common::hello_frame("hoarder");
    for seq in 1..=60u64 {
        let request = Request { id: seq, method: "trickle".into(), body: Bytes::new() };
        let payload =
            tickwire_wire::encode_message(&Envelope { kind: Some(envelope::Kind::Request(request)) });
        let mut frame = bytes::BytesMut::new();
        tickwire_wire::Frame::Data { seq, ack: 0, payload: payload.into() }.encode(&mut frame);
        bytes.extend_from_slice(&frame);
    }
    stream.write_all(&bytes).await.unwrap();
    let close = common::read_close(&mut stream).await;
    assert_eq!(common::reason(&close), Some(CloseReason::SlowConsumer), "{close:?}");
    let message = close.unwrap().message;
    assert!(message.contains("outbox is full (256 messages, or 2097152 bytes"), "{message}");
}

/// Answers every request with `REPLY` bytes, and counts the requests it was given.
struct Replier {
    handled: Arc<AtomicUsize>,
}

const REPLY: usize = 400 << 10;

impl Router for Replier {
    fn on_request(&self, _session: &SessionHandle, request: Request) -> Option<Response> {
        self.handled.fetch_add(1, Ordering::SeqCst);
        let body = Bytes::from(vec![request.id as u8; REPLY]);
        Some(Response { id: request.id, status: Status::Ok as i32, body, error: String::new() })
    }
}

fn replier_gateway(handled: &Arc<AtomicUsize>) -> Gateway {
    replier_gateway_with(handled, &[])
}

fn replier_gateway_with(handled: &Arc<AtomicUsize>, overrides: &[&str]) -> Gateway {
    let mut all = vec!["listen.tcp=[\"127.0.0.1:0\"]".to_owned(), "listen.ws=[]".to_owned()];
    all.extend(overrides.iter().map(|o| o.to_string()));
    let config = GatewayConfig::load(None, &all).unwrap();
    assert_eq!(config.session.max_unacked_bytes, 1 << 20, "the replies are sized for the default");
    Gateway::new(config).unwrap().with_router(Arc::new(Replier { handled: handled.clone() }))
}

/// A client that sends requests and does not acknowledge their replies gets no more handled
/// than the replies its session can hold: the first two (800 KiB of the 1 MiB resend buffer)
/// and the one that waits for room. So a small request for a large reply cannot make the
/// gateway hold a large reply per request. Once it reads, it gets every reply, in order.
#[tokio::test]
async fn requests_wait_while_a_reply_waits_for_room() {
    let handled = Arc::new(AtomicUsize::new(0));
    let gw = replier_gateway(&handled).start().await.unwrap();
    let mut client = common::connect(&gw).await;
    for id in 1..=10 {
        client.send_request(id, "big", Bytes::new()).unwrap();
    }
    // Written without reading: no acknowledgement goes.
    client.flush().await;
    common::wait_until("three requests handled", || handled.load(Ordering::SeqCst) >= 3).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(handled.load(Ordering::SeqCst), 3, "the fourth waits for the third's reply to go");
    let mut got = Vec::new();
    while got.len() < 10 {
        // Writes the acknowledgements the client owes.
        client.flush().await;
        let event = tokio::time::timeout(Duration::from_secs(10), client.next_event()).await;
        match event.expect("the replies arrive").unwrap() {
            Some(Event::Response(r)) => {
                assert_eq!(r.body.len(), REPLY);
                got.push(r.id);
            }
            Some(Event::Closed { reason, message }) => panic!("closed: {reason:?}: {message}"),
            Some(_) | None => {}
        }
    }
    assert_eq!(got, (1..=10).collect::<Vec<_>>(), "every reply, in order");
    assert_eq!(handled.load(Ordering::SeqCst), 10);
}

/// A Hello as `player`, then `n` requests, as raw bytes: a client that pipelines and reads
/// (and so acknowledges) nothing.
fn hello_and_requests(player: &str, n: u64) -> Vec<u8> {
    let mut bytes = common::hello_frame(player);
    for seq in 1..=n {
        bytes.extend(common::echo_frame(seq, seq));
    }
    bytes
}

/// More requests waiting than the outbox holds (256 by default) from a client that does not
/// acknowledge: it is closed as slow, having had three handled while it was served and the 256
/// that waited (the session had acknowledged them) as it ended; not the 41 it sent past them.
#[tokio::test]
async fn a_client_that_keeps_asking_without_acknowledging_is_closed_as_slow() {
    let handled = Arc::new(AtomicUsize::new(0));
    let gw = replier_gateway(&handled).start().await.unwrap();
    let mut stream = tokio::net::TcpStream::connect(gw.tcp_addrs()[0]).await.unwrap();
    let bytes = hello_and_requests("greedy", 300);
    stream.write_all(&bytes).await.unwrap();
    let close = common::read_close(&mut stream).await;
    assert_eq!(common::reason(&close), Some(CloseReason::SlowConsumer), "{close:?}");
    assert!(close.unwrap().message.contains("does not acknowledge"));
    common::wait_until("the session ended", || gw.session_count() == 0).await;
    assert_eq!(handled.load(Ordering::SeqCst), 3 + 256);
}

/// Messages a client sent before its Close were acknowledged: they are handled even when they
/// waited for a reply's room, though their own replies cannot go. So are those of a client that
/// vanishes, when its resume window ends.
#[tokio::test]
async fn what_waited_before_a_close_is_handled() {
    use tickwire_wire::proto::{Close, Control, control};
    let handled = Arc::new(AtomicUsize::new(0));
    let gw = replier_gateway(&handled).start().await.unwrap();
    let mut stream = tokio::net::TcpStream::connect(gw.tcp_addrs()[0]).await.unwrap();
    let mut bytes = hello_and_requests("leaver", 8);
    let close = Control {
        kind: Some(control::Kind::Close(Close { reason: CloseReason::Normal as i32, message: "bye".into() })),
    };
    let mut buf = bytes::BytesMut::new();
    tickwire_wire::Frame::control(&close).encode(&mut buf);
    bytes.extend_from_slice(&buf);
    stream.write_all(&bytes).await.unwrap();
    common::wait_until("all eight handled", || handled.load(Ordering::SeqCst) == 8).await;
    common::wait_until("the session ended", || gw.session_count() == 0).await;

    // A client that vanishes with requests waiting: they are handled when its resume window
    // ends.
    let handled = Arc::new(AtomicUsize::new(0));
    let gw = replier_gateway_with(&handled, &["session.resume_window=\"300ms\""]).start().await.unwrap();
    let mut stream = tokio::net::TcpStream::connect(gw.tcp_addrs()[0]).await.unwrap();
    stream.write_all(&hello_and_requests("vanisher", 8)).await.unwrap();
    common::wait_until("three handled", || handled.load(Ordering::SeqCst) == 3).await;
    drop(stream);
    common::wait_until("the session ended", || gw.session_count() == 0).await;
    assert_eq!(handled.load(Ordering::SeqCst), 8);
}

/// A game server that pipelines far more requests to a channel than its outbox holds gets
/// every answer, in order, and stays. Each request handed to the channel's actor holds a place
/// in the outbox for its answer (`SessionHandle::reply`), and the session hands on no more
/// than half its outbox's worth at a time: it leaves the rest of the client's frames unread.
/// Before, the actor's burst of answers outran the session's task and closed it as a slow
/// consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_to_a_channel_get_every_answer_in_order() {
    // Within the client's own window of unacknowledged messages (1,024).
    const REQUESTS: u64 = 1_000;
    let gw = common::start(&["limits.outbox_capacity=8"]).await;
    let mut opts = ConnectOptions::new(common::tcp_target(&gw));
    opts.token = "server:pipeliner".into();
    let mut conn = Connection::connect(opts).await.unwrap();
    let create = CreateChannel {
        r#type: ChannelType::Global as i32,
        name: "pipelined".into(),
        schema_json: common::channels::SCHEMA.into(),
    };
    conn.send_request(1, "channel.create", create.encode_to_vec().into()).unwrap();
    conn.flush().await;
    let channel_id = loop {
        match conn.next_event().await.unwrap() {
            Some(Event::Response(r)) => {
                assert_eq!(r.status(), Status::Ok, "{}", r.error);
                break CreateChannelResult::decode(r.body).unwrap().channel_id;
            }
            Some(Event::Closed { reason, message }) => panic!("closed: {reason:?}: {message}"),
            Some(_) => {}
            None => conn.flush().await,
        }
    };
    for i in 0..REQUESTS {
        let patch = format!(r#"{{"op":"set","path":"/round","value":{i}}}"#);
        let update = UpdateChannel { channel_id, patch: patch.into_bytes().into() };
        conn.send_request(2 + i, "channel.update", update.encode_to_vec().into()).unwrap();
    }
    conn.flush().await;
    let mut next = 2;
    while next < 2 + REQUESTS {
        let event = tokio::time::timeout(Duration::from_secs(10), conn.next_event()).await;
        match event.expect("the answers keep coming").unwrap() {
            Some(Event::Response(r)) => {
                assert_eq!((r.id, r.status()), (next, Status::Ok), "{}", r.error);
                next += 1;
            }
            Some(Event::Closed { reason, message }) => panic!("closed after {next}: {reason:?}: {message}"),
            Some(_) => {}
            None => conn.flush().await,
        }
    }
}
