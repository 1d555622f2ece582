//! A session whose outbox fills up is closed as a slow consumer; nobody waits for it, and the
//! other sessions carry on. A burst that outruns the acknowledgements of a client that keeps up
//! waits for them instead.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tickwire_client::Event;
use tickwire_gateway::{EchoRouter, Gateway, GatewayConfig, PushError, Router, SessionHandle};
use tickwire_wire::proto::{CloseReason, Request, Response};

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
    let gw = Gateway::new(config).unwrap().with_router(Arc::new(Flooder { echo: EchoRouter::new(1024) }));
    let gw = gw.start().await.unwrap();
    let mut healthy = common::connect(&gw).await;
    let mut victim = common::connect(&gw).await;
    victim.send_request(1, "flood", Bytes::new()).unwrap();
    victim.flush().await;
    let closed = loop {
        match victim.next_event().await.unwrap() {
            Some(Event::Closed { reason, message }) => break (reason, message),
            Some(Event::Push(_)) | None => {}
            Some(other) => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(closed.0, CloseReason::SlowConsumer, "{}", closed.1);
    assert_eq!(common::round_trip(&mut healthy, 1, 64).await.body.len(), 64);
}
