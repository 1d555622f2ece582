//! The channel router's bookkeeping, driven without sockets: the channels' actors are spawned
//! on this test's single-threaded runtime and never run, so their inboxes fill on demand.

use prost::Message;
use tickwire_wire::proto::{
    ChannelRef, ChannelType, CreateChannel, CreateChannelResult, Request, Response, Status, Subscribe,
};

use super::ChannelRouter;
use crate::auth::Role;
use crate::router::{Router, SessionHandle};

fn request(id: u64, method: &str, body: Vec<u8>) -> Request {
    Request { id, method: method.into(), body: body.into() }
}

/// A router configured by `overrides`, a game server and a player; the receivers keep the
/// sessions' outboxes open.
struct Setup {
    router: ChannelRouter,
    server: SessionHandle,
    player: SessionHandle,
    _outboxes: [tokio::sync::mpsc::Receiver<crate::router::Outgoing>; 2],
}

impl Setup {
    fn new(overrides: &[&str]) -> Setup {
        let overrides: Vec<String> = overrides.iter().map(|o| o.to_string()).collect();
        let config = crate::GatewayConfig::load(None, &overrides).expect("a config");
        let (server, server_rx) = SessionHandle::unattached(1, Role::Server, &config);
        let (player, player_rx) = SessionHandle::unattached(2, Role::Player, &config);
        let router = ChannelRouter::for_gateway(&config).expect("channels");
        Setup { router, server, player, _outboxes: [server_rx, player_rx] }
    }

    /// A subworld channel the server creates.
    fn create(&self, id: u64) -> u64 {
        let req = CreateChannel {
            r#type: ChannelType::Subworld as i32,
            name: format!("c{id}"),
            schema_json: r#"{"fields": []}"#.into(),
        };
        let response = self
            .router
            .on_request(&self.server, request(id, "channel.create", req.encode_to_vec()))
            .expect("answered");
        assert_eq!(response.status(), Status::Ok, "{}", response.error);
        CreateChannelResult::decode(response.body).unwrap().channel_id
    }

    /// The player subscribes: `None` once queued for the channel's actor.
    fn subscribe(&self, id: u64, channel_id: u64) -> Option<Response> {
        let req = Subscribe { channel_id, ..Subscribe::default() };
        self.router.on_request(&self.player, request(id, "channel.subscribe", req.encode_to_vec()))
    }
}

/// An unsubscribe refused because the channel is busy leaves the subscription, and with it its
/// place in the session's quota: before, it gave the place back while the channel kept the
/// subscriber, so a session could pass `max_subscriptions_per_session`.
#[tokio::test]
async fn an_unsubscribe_refused_as_busy_keeps_its_place_in_the_quota() {
    let s = Setup::new(&["channels.inbox_capacity=2", "channels.max_subscriptions_per_session=1"]);
    let (a, b) = (s.create(1), s.create(2));
    // Two subscribes to `a` fill its inbox (the actor never runs here).
    assert_eq!(s.subscribe(3, a), None);
    assert_eq!(s.subscribe(4, a), None);
    let unsubscribe = ChannelRef { channel_id: a }.encode_to_vec();
    let refused = s.router.on_request(&s.player, request(5, "channel.unsubscribe", unsubscribe));
    assert_eq!(refused.map(|r| r.status()), Some(Status::Unavailable), "a's inbox is full");
    let over = s.subscribe(6, b);
    assert_eq!(
        over.map(|r| r.status()),
        Some(Status::ResourceExhausted),
        "still subscribed to a: the quota is full"
    );
}

/// A channel removed while a session is subscribed no longer holds the session's place, whether
/// or not the session unsubscribes (answered NOT_FOUND: the channel is gone).
#[tokio::test]
async fn a_removed_channel_frees_its_subscribers_places() {
    let s = Setup::new(&["channels.max_subscriptions_per_session=1"]);
    let (a, b, c) = (s.create(1), s.create(2), s.create(3));
    assert_eq!(s.subscribe(4, a), None);
    let remove = |id: u64, channel_id: u64| {
        let body = ChannelRef { channel_id }.encode_to_vec();
        assert_eq!(s.router.on_request(&s.server, request(id, "channel.remove", body)), None);
    };
    remove(5, a);
    assert_eq!(s.subscribe(6, b), None, "a's place is free, without an unsubscribe");
    remove(7, b);
    let gone = s.router.on_request(
        &s.player,
        request(8, "channel.unsubscribe", ChannelRef { channel_id: b }.encode_to_vec()),
    );
    assert_eq!(gone.map(|r| r.status()), Some(Status::NotFound));
    assert_eq!(s.subscribe(9, c), None, "b's too");
}

/// The places' bookkeeping in the order a channel's actor reports it: a refused subscribe queued
/// beside an accepted one to the same channel leaves the place (the actor holds the session),
/// one refused alone frees it, and an unsubscribe frees it once nothing else is on its way.
#[tokio::test]
async fn a_place_goes_only_when_nothing_is_queued_and_the_session_is_not_subscribed() {
    let s = Setup::new(&["channels.max_subscriptions_per_session=1"]);
    let (a, b) = (s.create(1), s.create(2));
    let conn = s.player.conn_id();
    // A refused and an accepted subscribe to `a`, queued back to back (the actor never runs).
    assert_eq!(s.subscribe(3, a), None);
    assert_eq!(s.subscribe(4, a), None);
    let full = |s: &Setup, id: u64| s.subscribe(id, b).map(|r| r.status());
    s.router.registry().handled(conn, a, true, false);
    assert_eq!(full(&s, 5), Some(Status::ResourceExhausted), "the accepted one is still on its way");
    s.router.registry().handled(conn, a, true, true);
    assert_eq!(full(&s, 6), Some(Status::ResourceExhausted), "subscribed to a");
    // An unsubscribe with nothing else on its way frees the place when it is queued.
    let unsubscribe = ChannelRef { channel_id: a }.encode_to_vec();
    assert_eq!(s.router.on_request(&s.player, request(7, "channel.unsubscribe", unsubscribe)), None);
    assert_eq!(s.subscribe(8, b), None, "a's place was given back");
    // A subscribe refused alone frees its place.
    s.router.registry().handled(conn, b, true, false);
    assert_eq!(s.subscribe(9, a), None, "b's refusal gave its place back");
}
