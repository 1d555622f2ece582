//! Typed calls of the spatial world (docs/protocol.md section 14), over [`Client::call`]: what a
//! spatial server sends (register, spawn, publish, release, despawn) and what a client sends
//! (its area of interest, and messages to entities with `channel.send`).

use bytes::Bytes;
use prost::Message;
use tickwire_wire::proto::{
    ChannelSend, Despawn, EntityState, InterestResult, Publish, PublishResult, RegisterResult,
    RegisterServer, Release, SetInterest, SpawnEntity, SpawnResult,
};

use crate::{Client, ClientError};

fn decode<M: Message + Default>(body: Bytes) -> Result<M, ClientError> {
    M::decode(body).map_err(|e| ClientError::Protocol(format!("malformed response: {e}")))
}

impl Client {
    /// `spatial.register`: takes a server slot (`None`: the lowest free one), or with
    /// `observe_only` only subscribes to spatial events.
    pub async fn spatial_register(&self, req: RegisterServer) -> Result<RegisterResult, ClientError> {
        decode(self.call("spatial.register", req.encode_to_vec().into()).await?)
    }

    /// `spatial.spawn`: a new entity in one of this server's cells.
    pub async fn spatial_spawn(&self, req: SpawnEntity) -> Result<SpawnResult, ClientError> {
        decode(self.call("spatial.spawn", req.encode_to_vec().into()).await?)
    }

    /// `spatial.publish`: this server's entities after a frame.
    pub async fn spatial_publish(&self, entities: Vec<EntityState>) -> Result<PublishResult, ClientError> {
        decode(self.call("spatial.publish", Publish { entities }.encode_to_vec().into()).await?)
    }

    /// `spatial.release`: the answer to a RELEASE handover.
    pub async fn spatial_release(&self, req: Release) -> Result<(), ClientError> {
        self.call("spatial.release", req.encode_to_vec().into()).await.map(drop)
    }

    /// `spatial.despawn`: removes an entity this server owns.
    pub async fn spatial_despawn(&self, entity_id: u64) -> Result<(), ClientError> {
        self.call("spatial.despawn", Despawn { entity_id }.encode_to_vec().into()).await.map(drop)
    }

    /// `spatial.interest`: this client's area of interest (no area: none).
    pub async fn spatial_interest(&self, req: SetInterest) -> Result<InterestResult, ClientError> {
        decode(self.call("spatial.interest", req.encode_to_vec().into()).await?)
    }

    /// A message to an entity's owner (`channel.send` to the entity's id).
    pub async fn send_to_entity(&self, entity_id: u64, body: Bytes) -> Result<(), ClientError> {
        let send = ChannelSend { channel_id: entity_id, body, ..ChannelSend::default() };
        self.call("channel.send", send.encode_to_vec().into()).await.map(drop)
    }
}
