//! The spatial world over real sockets: handovers that lose, duplicate and reorder no entity
//! message; areas of interest that show exactly the entities of the cells they touch; a spatial
//! server lost mid-run, its event, and another server taking its slot over.

#[path = "../common/mod.rs"]
mod common;

mod handover;
mod interest;
mod servers;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::channels::{WAIT, client, status};
use prost::Message;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tickwire_client::Client;
use tickwire_gateway::RunningGateway;
use tickwire_state::{Key, Replica, Schema, SchemaDef, Step, Value};
use tickwire_wire::proto::{
    Box as AreaBox, ChannelEvent, ChannelEventKind, ChannelMessage, ChannelSend, ChannelUpdates,
    EntityMessage, EntityState, Follow, Handover, HandoverKind, RegisterServer, Release, SetInterest,
    SpatialEvent, SpatialEventKind, SpawnEntity, Sphere, Status, Vec3, set_interest,
};
use tokio::sync::watch;

/// A 40 x 40 m world of 4 x 4 cells of 10 m, in 2 x 2 server blocks (slots 0..4); the four
/// blocks meet at (20, 20).
/// Servers here publish at 200 Hz besides their releases: above a player's default rate limit.
const LAYOUT: [&str; 4] = [
    "spatial.cell_size=10.0",
    "spatial.cells=[4, 4]",
    "spatial.servers=[2, 2]",
    "limits.messages_per_second=5000",
];

async fn start() -> RunningGateway {
    common::start(&LAYOUT).await
}

/// [`start`] with the sessions on I/O threads, metrics on, and `settings` besides.
async fn start_on_io_threads(settings: &[&str]) -> RunningGateway {
    let metrics = "metrics.listen=\"127.0.0.1:0\"";
    let overrides: Vec<&str> =
        LAYOUT.iter().copied().chain([metrics]).chain(settings.iter().copied()).collect();
    common::start_on_io_threads(&overrides).await
}

fn v3(p: [f32; 3]) -> Option<Vec3> {
    Some(Vec3 { x: p[0], y: p[1], z: p[2] })
}

fn slot_of(p: [f32; 3]) -> u32 {
    u32::from(p[0] >= 20.0) + 2 * u32::from(p[2] >= 20.0)
}

async fn server(gw: &RunningGateway, name: &str, slot: Option<u32>) -> Arc<Client> {
    let c = client(gw, &format!("server:{name}")).await;
    let r = c.spatial_register(RegisterServer { slot, observe_only: false }).await.unwrap();
    if let Some(slot) = slot {
        assert_eq!(r.slot, slot);
    }
    Arc::new(c)
}

/// What a client sees of the world: one replica per cell in view.
struct View {
    schema: Arc<Schema>,
    cells: BTreeMap<u64, Replica>,
}

impl View {
    fn new(cell_schema_json: &str) -> View {
        let schema = Schema::new(SchemaDef::parse(cell_schema_json, "cell.json").unwrap()).unwrap();
        View { schema, cells: BTreeMap::new() }
    }

    /// Applies one push; returns the spatial events among them.
    fn apply(&mut self, topic: &str, body: Bytes) -> Option<SpatialEvent> {
        match topic {
            "channel.updates" => {
                for u in ChannelUpdates::decode(body).unwrap().updates {
                    let replica =
                        self.cells.entry(u.channel_id).or_insert_with(|| Replica::new(self.schema.clone()));
                    replica.apply(&u.update).unwrap_or_else(|e| panic!("cell {}: {e}", u.channel_id));
                }
            }
            "channel.event" => {
                let e = ChannelEvent::decode(body).unwrap();
                assert_eq!(e.kind(), ChannelEventKind::Unsubscribed, "{e:?}");
                self.cells.remove(&e.channel_id);
            }
            "spatial.event" => return Some(SpatialEvent::decode(body).unwrap()),
            other => panic!("unexpected push {other}"),
        }
        None
    }

    /// Every entity in view, with its position.
    fn entities(&self) -> BTreeMap<u64, [f64; 3]> {
        let mut out = BTreeMap::new();
        for replica in self.cells.values() {
            let Some(Value::Map(map)) = replica.get(&[Step::Field(0)]) else { continue };
            for (key, value) in map {
                let (Key::Int(id), Value::Struct(fields)) = (&key, &value) else { panic!("{key:?}") };
                let id = *id;
                let Value::Vec3(p) = fields[0] else { panic!("{fields:?}") };
                out.insert(id as u64, p);
            }
        }
        out
    }

    /// Reads pushes until `done` holds for the view and the spatial events read so far,
    /// within [`WAIT`].
    async fn until(
        &mut self,
        c: &Client,
        what: &str,
        done: impl Fn(&View, &[SpatialEvent]) -> bool,
    ) -> Vec<SpatialEvent> {
        let mut events = Vec::new();
        let deadline = tokio::time::Instant::now() + WAIT;
        while !done(self, &events) {
            let push = tokio::time::timeout_at(deadline, c.next_push())
                .await
                .unwrap_or_else(|_| panic!("timed out waiting until {what}; view: {:?}", self.entities()))
                .expect("session open");
            events.extend(self.apply(&push.topic, push.body));
        }
        events
    }
}
