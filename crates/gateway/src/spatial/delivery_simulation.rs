//! The world's passes and their deliveries in simulated time, against the one oracle that
//! matters to a client: every update it reads applies to the replica it holds (no gap, no
//! repeat, no delta from a version it lacks), and once everyone reads again every replica equals
//! its cell. A delivery here runs when the simulation says, so it lags the world by any number
//! of passes, drops passes past what it holds, and sees view changes (entities moving from cell
//! to cell, which moves their clients' areas) between, before and after passes; clients read
//! when they please, so windows fill and hold updates back. Some clients have level-of-detail
//! bands, so some of their cells wait for later passes.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use tickwire_wire::proto::{DeltaCodec, LodBand, SubscriptionOptions};

use super::harness::WorldHarness;

/// The world: 6 × 6 cells of 20 m over 2 × 2 servers (blocks of 60 m).
const BLOCK: f32 = 60.0;
const CLIENTS: usize = 12;

#[derive(Debug, Clone)]
enum Op {
    /// Every server publishes a frame: each entity moves to a spot of its block picked by
    /// `seed` (often into another cell, never into another block: no handovers here).
    Frame { seed: u32 },
    /// The world's side of the next pass, not delivered yet.
    Pass,
    /// The deliveries run what is waiting.
    Deliver,
    /// The clients in `mask` read what they were sent and acknowledge it.
    Read { mask: u16 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => any::<u32>().prop_map(|seed| Op::Frame { seed }),
        4 => Just(Op::Pass),
        3 => Just(Op::Deliver),
        3 => any::<u16>().prop_map(|mask| Op::Read { mask }),
    ]
}

/// Entity `k`'s spot in block `block` for `seed`: inside it, a metre from its edges.
fn spot(block: [u32; 2], k: usize, seed: u32) -> [f32; 3] {
    let h = |salt: u32| {
        let x = seed.wrapping_mul(2_654_435_761).wrapping_add((k as u32 + 1).wrapping_mul(salt));
        1.0 + (x % 5_800) as f32 / 100.0
    };
    [block[0] as f32 * BLOCK + h(40_503), 0.0, block[1] as f32 * BLOCK + h(97_711)]
}

fn run(ops: &[Op], radii: &[u8]) -> Result<(), TestCaseError> {
    let start = Instant::now();
    let overrides = ["spatial.cell_size=20.0", "spatial.cells=[6, 6]", "spatial.servers=[2, 2]"];
    let mut h = WorldHarness::new(&overrides.map(String::from), start).expect("a harness");
    h.keep_replicas();
    let mut blocks = HashMap::new();
    for (k, &radius) in radii.iter().enumerate() {
        let block = [(k % 2) as u32, ((k / 2) % 2) as u32];
        let radius = 5.0 + f32::from(radius % 30);
        // One client in three reads JSON, one in four at a 60 ms interval.
        let options = SubscriptionOptions {
            codec: if k % 3 == 0 { DeltaCodec::Json } else { DeltaCodec::Binary } as i32,
            fanout_interval_ms: if k % 4 == 1 { 60 } else { 0 },
            ..Default::default()
        };
        // One in five with level-of-detail bands: cells past 10 m every 60 ms, past 30 m every
        // 200 ms.
        let lod = if k % 5 == 2 {
            vec![
                LodBand { within: 10.0, interval_ms: 0 },
                LodBand { within: 30.0, interval_ms: 60 },
                LodBand { within: 1000.0, interval_ms: 200 },
            ]
        } else {
            Vec::new()
        };
        let at = spot(block, k, 0);
        let id = h.spawn_player_lod(at, r#"{"yaw": 0}"#, radius, options, lod, start).expect("spawned");
        blocks.insert(id, (block, k));
    }
    let tick = Duration::from_millis(20);
    let mut passes = 0u32;
    let mut now = start;
    for (frame, op) in (1..).zip(ops) {
        match *op {
            Op::Frame { seed } => {
                h.publish_frame(|id| {
                    let (block, k) = blocks[&id];
                    (spot(block, k, seed), format!(r#"{{"yaw": {frame}}}"#))
                })
                .expect("published");
            }
            Op::Pass => {
                passes += 1;
                now = start + tick * passes;
                h.pass_without_delivery(now);
            }
            Op::Deliver => {
                now += Duration::from_millis(1);
                h.deliver(now);
            }
            Op::Read { mask } => {
                let read = h.drain_clients(now, |i| mask & (1 << (i % 16)) != 0);
                prop_assert!(read.is_ok(), "an update did not apply: {read:?}");
            }
        }
    }
    // Everyone reads again: a few passes bring every replica to its cell (past the longest
    // level-of-detail interval, 200 ms).
    for _ in 0..16 {
        passes += 1;
        now = start + tick * passes;
        h.tick(now);
        let read = h.drain(now);
        prop_assert!(read.is_ok(), "an update did not apply: {read:?}");
    }
    prop_assert_eq!(h.replicas_differ(), None);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_update_applies_and_every_replica_converges_however_late_deliveries_run(
        ops in proptest::collection::vec(op(), 1..120),
        radii in proptest::collection::vec(any::<u8>(), CLIENTS),
    ) {
        run(&ops, &radii)?;
    }
}
