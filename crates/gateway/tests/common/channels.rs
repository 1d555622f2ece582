//! Channel helpers for the integration tests: a test schema, connecting as a player or a game
//! server (dev tokens; `server:NAME` is a server), and the `channel.*` calls.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use tickwire_client::{Client, ClientError, ConnectOptions};
use tickwire_gateway::RunningGateway;
use tickwire_state::{Schema, SchemaDef};
use tickwire_wire::proto::{
    ChannelType, CreateChannel, CreateChannelResult, Status, Subscribe, SubscribeResult, SubscriptionOptions,
    UpdateChannel,
};

pub const SCHEMA: &str = r#"{"fields": [
    {"name": "round", "type": "int"},
    {"name": "players", "player_keyed": true, "type": {"map": {"key": "string", "value": {"struct": [{"name": "hp", "type": "int"}]}}}},
    {"name": "hands", "sync": "owner_only", "type": {"map": {"key": "string", "value": {"list": "int"}}}}
]}"#;

pub const WAIT: Duration = Duration::from_secs(5);

pub async fn client(gw: &RunningGateway, player: &str) -> Client {
    let mut opts = ConnectOptions::new(super::tcp_target(gw));
    opts.token = player.into();
    Client::connect(opts).await.unwrap()
}

pub async fn create(server: &Client, ty: ChannelType) -> Result<CreateChannelResult, ClientError> {
    let req = CreateChannel { r#type: ty as i32, name: "test".into(), schema_json: SCHEMA.into() };
    let body = server.call("channel.create", req.encode_to_vec().into()).await?;
    Ok(CreateChannelResult::decode(body).unwrap())
}

pub async fn subscribe(
    c: &Client,
    channel_id: u64,
    options: SubscriptionOptions,
) -> Result<SubscribeResult, ClientError> {
    let req = Subscribe { channel_id, options: Some(options) };
    let body = c.call("channel.subscribe", req.encode_to_vec().into()).await?;
    Ok(SubscribeResult::decode(body).unwrap())
}

pub async fn update(c: &Client, channel_id: u64, patch: &str) -> Result<Bytes, ClientError> {
    let req = UpdateChannel { channel_id, patch: Bytes::copy_from_slice(patch.as_bytes()) };
    c.call("channel.update", req.encode_to_vec().into()).await
}

/// The next push of any topic (no timeout of its own).
pub async fn next_any(c: &Client) -> (String, Bytes) {
    let push = c.next_push().await.expect("session open");
    (push.topic, push.body)
}

/// The next push on `topic`, skipping others, within [`WAIT`].
pub async fn next(c: &Client, topic: &str) -> Bytes {
    tokio::time::timeout(WAIT, async {
        loop {
            let push = c.next_push().await.expect("session open");
            if push.topic == topic {
                return push.body;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {topic} push within {WAIT:?}"))
}

pub fn status(r: Result<impl std::fmt::Debug, ClientError>) -> Status {
    match r {
        Err(ClientError::Status { status, .. }) => status,
        other => panic!("expected an error status, got {other:?}"),
    }
}

pub fn schema() -> Arc<Schema> {
    Schema::new(SchemaDef::parse(SCHEMA, "s.json").unwrap()).unwrap()
}
