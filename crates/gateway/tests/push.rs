//! Server pushes reach the high-level client's push stream, in order.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use tickwire_client::{Client, ConnectOptions};
use tickwire_gateway::{EchoRouter, Gateway, GatewayConfig, Router, SessionHandle};
use tickwire_wire::proto::{Request, Response};

/// Answers `subscribe` by pushing three numbered `tick`s before the response.
struct Ticker;

impl Router for Ticker {
    fn on_request(&self, session: &SessionHandle, request: Request) -> Option<Response> {
        if request.method != "subscribe" {
            return EchoRouter::new(64).on_request(session, request);
        }
        for i in 0..3u8 {
            session.push("tick", Bytes::from(vec![i])).expect("outbox has room");
        }
        Some(Response { id: request.id, ..Default::default() })
    }
}

#[tokio::test]
async fn pushes_arrive_in_order_on_the_client() {
    let config =
        GatewayConfig::load(None, &["listen.tcp=[\"127.0.0.1:0\"]".into(), "listen.ws=[]".into()]).unwrap();
    let gw = Gateway::new(config).unwrap().with_router(Arc::new(Ticker)).start().await.unwrap();
    let client = Client::connect(ConnectOptions::new(common::tcp_target(&gw))).await.unwrap();
    client.call("subscribe", Bytes::new()).await.unwrap();
    for i in 0..3u8 {
        let push = client.next_push().await.expect("a push");
        assert_eq!((push.topic.as_str(), &push.body[..]), ("tick", &[i][..]));
    }
    client.close().await;
}
