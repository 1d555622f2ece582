//! Level of detail in the world's passes (docs/protocol.md 14.4): a client with bands hears of
//! each cell at its band's rate, gets every change in the end even once the world stops
//! changing, and has its bands measured again from wherever its area follows it.

use std::collections::HashMap;
use std::time::Duration;

use tickwire_wire::proto::{LodBand, Status};

use super::*;

const MS: Duration = Duration::from_millis(1);

/// A 6×6 world of 20 m cells over 2×2 servers (blocks of 3×3 cells), every server registered
/// at `start`.
fn small_world(start: Instant) -> WorldHarness {
    let overrides = ["spatial.cell_size=20.0", "spatial.cells=[6, 6]", "spatial.servers=[2, 2]"];
    WorldHarness::new(&overrides.map(String::from), start).expect("a harness")
}

/// Its own cell in every update; cells whose nearest point is within 25 m every 100 ms; the
/// rest every 500 ms.
fn bands() -> Vec<LodBand> {
    vec![
        LodBand { within: 0.0, interval_ms: 0 },
        LodBand { within: 25.0, interval_ms: 100 },
        LodBand { within: 1000.0, interval_ms: 500 },
    ]
}

/// Cell `[x, z]`'s index.
fn cell(x: u32, z: u32) -> u32 {
    x + 6 * z
}

#[test]
fn a_client_hears_of_each_cell_at_its_bands_rate_and_gets_every_change_once_the_world_is_quiet() {
    let start = Instant::now();
    let mut h = small_world(start);
    h.keep_replicas();
    // Client 0 sees the whole world (a 200 m sphere) from (5, 5), in cell [0, 0]; it also
    // controls entities in cell [1, 0] (15 m away) and [5, 5] (134 m away), none of which moves.
    let options = SubscriptionOptions::default();
    let own = h.spawn_player_lod([5.0, 0.0, 5.0], r#"{"yaw": 0}"#, 200.0, options, bands(), start).unwrap();
    let near = h.spawn_for(0, [25.0, 0.0, 5.0], r#"{"yaw": 0}"#).unwrap();
    let far = h.spawn_for(0, [105.0, 0.0, 105.0], r#"{"yaw": 0}"#).unwrap();
    let at = HashMap::from([(own, [5.0, 0.0, 5.0]), (near, [25.0, 0.0, 5.0]), (far, [105.0, 0.0, 105.0])]);
    let watched = [cell(0, 0), cell(1, 0), cell(5, 5)];
    let mut changed: [Vec<u64>; 3] = Default::default();
    let mut versions = h.replica_versions(0);
    // A frame changing all three cells before each pass up to 900 ms, then none to 1200 ms.
    for pass in 1..=60u32 {
        if pass <= 45 {
            h.publish_frame(|id| (at[&id], format!(r#"{{"yaw": {pass}}}"#))).unwrap();
        }
        let now = start + MS * (20 * pass);
        h.tick(now);
        h.drain(now).expect("every update applies");
        let now_held = h.replica_versions(0);
        for (changed, &cell) in changed.iter_mut().zip(&watched) {
            let channel = CELL_BASE + u64::from(cell);
            if now_held.get(&channel) != versions.get(&channel) {
                changed.push(u64::from(20 * pass));
            }
        }
        versions = now_held;
    }
    // Its own cell at every pass with a frame; the first update of each is its snapshot.
    assert_eq!(changed[0], (1..=45).map(|p| 20 * p).collect::<Vec<_>>());
    // Every 100 ms, counted from the first update's pass instant's schedule (the join).
    assert_eq!(changed[1], [20, 100, 200, 300, 400, 500, 600, 700, 800, 900]);
    // Every 500 ms; the change of 900 ms goes at 1000 ms, though nothing changed since.
    assert_eq!(changed[2], [20, 500, 1000]);
    assert_eq!(h.replicas_differ(), None);
}

#[test]
fn bands_count_from_where_the_area_follows_its_entity() {
    let start = Instant::now();
    let mut h = small_world(start);
    let own = h.spawn_player_lod([5.0, 0.0, 5.0], r#"{"yaw": 0}"#, 200.0, Default::default(), bands(), start);
    let own = own.unwrap();
    let interval_of = |h: &WorldHarness, c: u32| {
        let at = h.view_cells(0).iter().position(|&v| v == c).expect("in view");
        h.view_intervals(0)[at]
    };
    assert_eq!(h.view_intervals(0).len(), 36, "one per cell in view");
    assert_eq!(interval_of(&h, cell(0, 0)), Duration::ZERO);
    assert_eq!(interval_of(&h, cell(2, 2)), MS * 500, "35 m away");
    // The entity walks into cell [2, 2] (the same server's): its own cell is now that one, and
    // [0, 0] is 35 m away.
    h.publish_frame(|id| {
        assert_eq!(id, own);
        ([45.0, 0.0, 45.0], r#"{"yaw": 1}"#.into())
    })
    .unwrap();
    assert_eq!(interval_of(&h, cell(2, 2)), Duration::ZERO);
    assert_eq!(interval_of(&h, cell(0, 0)), MS * 500);
    assert_eq!(interval_of(&h, cell(1, 1)), MS * 100);
    // An area without bands has none.
    let req = SetInterest {
        area: Some(set_interest::Area::Sphere(Sphere { center: v3([5.0, 0.0, 5.0]), radius: 200.0 })),
        ..Default::default()
    };
    assert_eq!(h.set_interest(0, req, start).status, Status::Ok as i32);
    assert!(h.view_intervals(0).is_empty());
}

/// A cell held back for a while whose band gets faster as the area follows its entity goes in
/// the very next update: the pass encodes its snapshot, as for a cell entered, rather than
/// leaving the whole message to wait a pass for an entry no one asked for.
#[test]
fn a_cell_whose_band_gets_faster_goes_in_the_next_update() {
    let start = Instant::now();
    let mut h = small_world(start);
    h.keep_replicas();
    let own = h.spawn_player_lod([5.0, 0.0, 5.0], r#"{"yaw": 0}"#, 200.0, Default::default(), bands(), start);
    let own = own.unwrap();
    // The area follows the latest entity the client controls: this one, in cell [2, 2], 49.5 m
    // from the area's centre (5, 5), every 500 ms.
    let mover = h.spawn_for(0, [45.0, 0.0, 45.0], r#"{"yaw": 0}"#).unwrap();
    let mut at = HashMap::from([(own, [5.0, 0.0, 5.0]), (mover, [45.0, 0.0, 45.0])]);
    let far = CELL_BASE + u64::from(cell(2, 2));
    for pass in 1..=6u32 {
        if pass == 6 {
            // Into cell [2, 1]: the area re-centres on (45, 25), and cell [2, 2] is 15 m away.
            at.insert(mover, [45.0, 0.0, 25.0]);
        }
        h.publish_frame(|id| (at[&id], format!(r#"{{"yaw": {pass}}}"#))).unwrap();
        let now = start + MS * (20 * pass);
        h.tick(now);
        h.drain(now).expect("every update applies");
        let held = h.replica_versions(0)[&far];
        if pass == 1 {
            assert_eq!(held, h.cell_version(cell(2, 2)), "its snapshot");
        } else if pass < 6 {
            assert!(held < h.cell_version(cell(2, 2)), "pass {pass}: held back");
        }
    }
    assert_eq!(h.view_intervals(0)[h.view_cells(0).iter().position(|&c| c == cell(2, 2)).unwrap()], MS * 100);
    // Due from 100 ms on (its interval counts from the join), so at the pass of 120 ms, which
    // carries it and the rest of the update.
    assert_eq!(h.replica_versions(0)[&far], h.cell_version(cell(2, 2)));
    let near = CELL_BASE + u64::from(cell(2, 1));
    assert_eq!(h.replica_versions(0)[&near], h.cell_version(cell(2, 1)));
}

/// An entity that walks from cells the client hears of often into one its band holds back
/// (and back) never vanishes from the client's view: the update that carries its leaving
/// carries the cell it entered too, even before that cell's band lets it go; otherwise the far
/// cell still goes at its band's rate.
#[test]
fn an_entity_walking_into_a_slower_band_never_vanishes() {
    let start = Instant::now();
    let mut h = small_world(start);
    h.keep_replicas();
    let yaw = r#"{"yaw": 0}"#;
    let own = h.spawn_player_lod([5.0, 0.0, 5.0], yaw, 200.0, Default::default(), bands(), start).unwrap();
    // Client 1, far away, controls the walker, so client 0's area stays where it is.
    h.spawn_player([115.0, 0.0, 115.0], yaw, 5.0, start).unwrap();
    let walker = h.spawn_for(1, [15.0, 0.0, 5.0], yaw).unwrap();
    // And an entity that stays in [1, 0], so that the cell changes at every pass: the update
    // that forces it needs it from a version no pass was asked for, and the pass of the move
    // encodes its snapshot.
    let stander = h.spawn_for(1, [30.0, 0.0, 15.0], yaw).unwrap();
    // Along z = 5 m, 1.5 m a pass, from x = 15 to 57 and back: through cell [0, 0] (client 0's
    // own: every update), [1, 0] (15 m away: every 100 ms) and [2, 0] (35 m: every 500 ms).
    let (mut x, mut dx) = (15.0f32, 1.5f32);
    let far = CELL_BASE + u64::from(cell(2, 0));
    let mut far_changes = Vec::new();
    let mut far_version = 0;
    let mut walker_cells = std::collections::BTreeSet::new();
    for pass in 1..=80u32 {
        x += dx;
        if !(6.0..57.0).contains(&x) {
            dx = -dx;
        }
        h.publish_frame(|id| {
            let at = if id == walker {
                [x, 0.0, 5.0]
            } else if id == stander {
                [30.0, 0.0, 15.0]
            } else if id == own {
                [5.0, 0.0, 5.0]
            } else {
                [115.0, 0.0, 115.0]
            };
            (at, format!(r#"{{"yaw": {pass}}}"#))
        })
        .unwrap();
        walker_cells.insert((x / 20.0) as u32);
        let now = start + MS * (20 * pass);
        h.tick(now);
        h.drain(now).expect("every update applies, with both sides of each move");
        assert!(h.replica_entities(0).contains(&walker), "pass {pass}: the walker vanished at x = {x}");
        // Forcing a cell costs no pass: the update with it went at once (its own cell changes
        // at every pass), the pass had what it needed.
        let home = CELL_BASE + u64::from(cell(0, 0));
        assert_eq!(
            h.replica_versions(0)[&home],
            h.cell_version(cell(0, 0)),
            "pass {pass}: an update withheld"
        );
        let version = h.replica_versions(0)[&far];
        if version != far_version {
            far_changes.push(pass);
            far_version = version;
        }
    }
    assert_eq!(walker_cells, [0, 1, 2].into(), "it walked through all three");
    // The far cell, empty until the walker comes, changed in the client's replica at 400 ms,
    // out of its band's turn, with the update that carried the walker's leaving [1, 0] (on that
    // band's turn: the walker had entered the far cell at 340 ms); then at its own band's
    // turns, 500 ms and 1000 ms (which carried the walker's leaving for [1, 0] at 800 ms): the
    // update out of turn did not move its turns.
    assert_eq!(far_changes, [20, 25, 50]);
    // Once the world is quiet, every cell comes to the client.
    for pass in 81..=110u32 {
        let now = start + MS * (20 * pass);
        h.tick(now);
        h.drain(now).expect("every update applies");
    }
    assert_eq!(h.replicas_differ(), None);
}

/// An entity that leaves a cell just as the cell leaves the client's view, for a cell still in
/// view that its band holds back, does not vanish either: the cell it entered goes with the
/// client's next update.
#[test]
fn an_entity_leaving_a_cell_that_leaves_the_view_never_vanishes() {
    leaving_the_view(false);
}

/// The same when the delivery runs late, with two passes waiting: the view change applies
/// before the older pass, whose version of the cell entered predates the entity's arrival.
#[test]
fn an_entity_leaving_a_cell_that_leaves_the_view_never_vanishes_behind_a_late_delivery() {
    leaving_the_view(true);
}

fn leaving_the_view(late: bool) {
    let start = Instant::now();
    let mut h = small_world(start);
    h.keep_replicas();
    let yaw = r#"{"yaw": 0}"#;
    let own = h.spawn_player_lod([5.0, 0.0, 5.0], yaw, 5.0, Default::default(), bands(), start).unwrap();
    h.spawn_player([115.0, 0.0, 115.0], yaw, 5.0, start).unwrap();
    let mover = h.spawn_for(1, [15.0, 0.0, 5.0], yaw).unwrap();
    let stander = h.spawn_for(1, [30.0, 0.0, 15.0], yaw).unwrap();
    // And one that walks into [1, 0] from [1, 1] at pass 8, so that pass encodes [1, 0]'s
    // snapshot: a delivery could send the cell there, before the mover arrives in it.
    let visitor = h.spawn_for(1, [30.0, 0.0, 30.0], yaw).unwrap();
    // Client 0's area, where it is put: around (55, 10), cell [2, 0] every update, [1, 0] (15 m
    // away) every 100 ms, [0, 0] (35 m away) every 500 ms.
    let area = |x: f32, radius: f32| SetInterest {
        area: Some(set_interest::Area::Sphere(Sphere { center: v3([x, 0.0, 10.0]), radius })),
        follow: Follow::Off as i32,
        lod: bands(),
        ..Default::default()
    };
    assert_eq!(h.set_interest(0, area(55.0, 50.0), start).status, Status::Ok as i32);
    let mut mover_at = [15.0, 0.0, 5.0];
    let mut arrived = 0;
    // The pass of the move and of the area's change: with a late delivery, the one after a pass
    // posted and not delivered, so the delivery applies the change, then delivers the older
    // pass (in which [1, 0] predates the mover's arrival), then the newer.
    let change = if late { 9 } else { 8 };
    for pass in 1..=9u32 {
        if pass == change {
            // The mover steps from [0, 0] into [1, 0]; and the area shrinks to a radius of 34
            // m: [0, 0] (35 m away) leaves the view and no cell enters it. [1, 0] (15 m away)
            // goes every 100 ms, last at 100 ms, next at 200 ms, so the updates due at 160 and
            // 180 ms would not carry it.
            mover_at = [25.0, 0.0, 5.0];
        }
        h.publish_frame(|id| {
            let at = match id {
                id if id == mover => mover_at,
                id if id == stander => [30.0, 0.0, 15.0],
                id if id == visitor && pass >= 8 => [30.0, 0.0, 18.0],
                id if id == visitor => [30.0, 0.0, 30.0],
                id if id == own => [5.0, 0.0, 5.0],
                _ => [115.0, 0.0, 115.0],
            };
            (at, format!(r#"{{"yaw": {pass}}}"#))
        })
        .unwrap();
        if pass == change {
            assert_eq!(h.set_interest(0, area(55.0, 34.0), start).status, Status::Ok as i32);
            assert!(!h.view_cells(0).contains(&cell(0, 0)) && h.view_cells(0).contains(&cell(1, 0)));
        }
        let now = start + MS * (20 * pass);
        if late && pass == 8 {
            // Posted, not delivered: the next pass's delivery runs both.
            h.pass_without_delivery(now);
            continue;
        }
        h.tick(now);
        if pass == change {
            arrived = h.cell_version(cell(1, 0));
        }
        h.drain(now).expect("every update applies");
        assert!(h.replica_entities(0).contains(&mover), "pass {pass}: the mover vanished");
    }
    // [1, 0] went out of its turn with the mover's arrival (and, with the change at the last
    // pass, waits for its turn since).
    let held = h.replica_versions(0)[&(CELL_BASE + u64::from(cell(1, 0)))];
    assert!(held >= arrived, "{held}, {arrived}");
    assert!(late || held < h.cell_version(cell(1, 0)), "{held}");
}

#[test]
fn bands_that_do_not_make_sense_are_refused_and_the_area_stays() {
    let start = Instant::now();
    let mut h = small_world(start);
    h.spawn_player([5.0, 0.0, 5.0], r#"{"yaw": 0}"#, 5.0, start).unwrap();
    let area = set_interest::Area::Sphere(Sphere { center: v3([5.0, 0.0, 5.0]), radius: 200.0 });
    let band = |within: f32, interval_ms: u32| LodBand { within, interval_ms };
    let cases = [
        (vec![band(10.0, 0), band(5.0, 100)], "increase"),
        (vec![band(f32::NAN, 0)], "finite"),
        (vec![band(-1.0, 0)], "at least 0"),
        (vec![band(10.0, 60_001)], "interval"),
        (vec![band(10.0, 100), band(50.0, 50)], "shrink"),
        ((0..9).map(|i| band(i as f32, 10)).collect(), "at most 8"),
    ];
    for (lod, says) in cases {
        let req = SetInterest { area: Some(area), lod, ..Default::default() };
        let answer = h.set_interest(0, req, start);
        assert_eq!(answer.status, Status::InvalidArgument as i32, "{says}");
        assert!(answer.error.starts_with("level of detail: "), "{}", answer.error);
        assert!(answer.error.contains(says), "{}", answer.error);
        assert_eq!(h.view_cells(0), [cell(0, 0)], "the area set before stays");
    }
}
