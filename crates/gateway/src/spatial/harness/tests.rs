//! The harness's own tests: what the world's passes send, counted and replayed into replicas.

use std::time::Duration;

use super::*;

/// A 6×6 world of 20 m cells over 2×2 servers, every server registered at `start`.
fn small_world(start: Instant) -> WorldHarness {
    let overrides = ["spatial.cell_size=20.0", "spatial.cells=[6, 6]", "spatial.servers=[2, 2]"];
    WorldHarness::new(&overrides.map(String::from), start).expect("a harness")
}

#[test]
fn every_client_gets_one_message_per_pass_after_a_frame() {
    let start = Instant::now();
    let mut h = small_world(start);
    let mut spawned = std::collections::HashMap::new();
    for i in 0..40 {
        let at = [5.0 + (i % 10) as f32 * 11.0, 0.0, 5.0 + (i / 10) as f32 * 27.0];
        spawned.insert(h.spawn_player(at, r#"{"yaw": 0.5}"#, 30.0, start).expect("spawned"), at);
    }
    let mut now = start;
    // The first pass gives every viewer its snapshots (the 4 servers see their blocks);
    // every later one a delta.
    for frame in 1..=3 {
        let ignored = h
            .publish_frame(|id| {
                let at = spawned[&id];
                ([at[0] + frame as f32 * 0.1, 0.0, at[2]], format!(r#"{{"yaw": {frame}}}"#))
            })
            .expect("published");
        assert_eq!(ignored, 0, "every entity is its server's");
        now += Duration::from_millis(20);
        assert_eq!(h.tick(now), 44, "frame {frame}: every viewer changed");
        let (messages, bytes) = h.drain(now).expect("read");
        assert_eq!(messages, 40, "frame {frame}: one message per client");
        assert!(bytes > 40 * 10, "frame {frame}: {bytes} bytes");
    }
    now += Duration::from_millis(20);
    assert_eq!(h.tick(now), 0, "nothing changed, nothing sent");
    assert_eq!(h.drain(now).expect("read").0, 0);
    // Frame 3's values published again change nothing either (docs/protocol.md 13.4).
    h.publish_frame(|id| {
        let at = spawned[&id];
        ([at[0] + 0.3, 0.0, at[2]], r#"{"yaw": 3}"#.into())
    })
    .expect("published");
    now += Duration::from_millis(20);
    assert_eq!(h.tick(now), 0, "the same values again: nothing sent");
    // A value that does not fit the schema is refused, not counted as ignored.
    let refused = h.publish_frame(|id| (spawned[&id], r#"{"yaw": "north"}"#.into()));
    assert!(matches!(refused, Err(HarnessError::Refused { what: "a publish", .. })), "{refused:?}");
}

#[test]
fn frames_of_a_server_between_two_passes_after_the_first_count_as_merged() {
    let start = Instant::now();
    let mut h = small_world(start);
    let at = [5.0, 0.0, 5.0];
    h.spawn_player(at, r#"{"yaw": 0.5}"#, 30.0, start).expect("spawned");
    let frame = |h: &mut WorldHarness, yaw: u32| {
        h.publish_frame(|_| (at, format!(r#"{{"yaw": {yaw}}}"#))).expect("published")
    };
    frame(&mut h, 1);
    h.tick(start + Duration::from_millis(20));
    assert_eq!(h.counts().frames_merged, 0, "one frame per server and pass");
    for yaw in 2..=4 {
        frame(&mut h, yaw);
    }
    h.tick(start + Duration::from_millis(40));
    // Each of the 4 servers published 3 frames since the last pass: 2 merged each (3 of
    // them own no entity; their empty publishes count too).
    assert_eq!(h.counts().frames_merged, 8);
    h.tick(start + Duration::from_millis(60));
    assert_eq!(h.counts().frames_merged, 8, "a pass with no frame merges none");
}

#[test]
fn a_pass_that_runs_late_does_not_make_the_next_one_skip_a_client() {
    let start = Instant::now();
    let ms = Duration::from_millis(1);
    let mut h = small_world(start);
    let at = [5.0, 0.0, 5.0];
    assert_eq!(h.tick(start), 4, "the servers' first pass: a snapshot each");
    // The client joins 1 ms into the first tick, so it is due 1 ms after each pass's due
    // instant, and a frame comes before every pass.
    h.spawn_player(at, r#"{"yaw": 0}"#, 30.0, start + ms).expect("spawned");
    let mut served = Vec::new();
    // The pass due at 80 ms runs at 95 ms. Had the schedule run on the clock, the client
    // would next be due at 115 ms, and the pass at 100 ms would skip it. Every client reads
    // and acknowledges each pass's updates as it ends, so no window holds one back.
    for (yaw, (due, ran)) in
        [(20, 20), (40, 40), (60, 60), (80, 95), (100, 100), (120, 120)].into_iter().enumerate()
    {
        h.publish_frame(|_| (at, format!(r#"{{"yaw": {yaw}}}"#))).expect("published");
        served.push(h.tick_late(start + ms * due, start + ms * ran));
        h.drain(start + ms * ran).expect("every update applies");
    }
    // Each pass: the client and the server whose block holds its entity.
    assert_eq!(served, [2; 6]);
}

#[test]
fn a_client_with_a_long_interval_gets_one_merged_update_per_interval() {
    let start = Instant::now();
    let ms = Duration::from_millis(1);
    let mut h = small_world(start);
    h.keep_replicas();
    // Two clients in one cell: one at the default interval (a pass, 20 ms), one at 200 ms
    // (as `lofi`), joined 1 ms in.
    let (fast, slow) = ([5.0, 0.0, 5.0], [8.0, 0.0, 5.0]);
    h.spawn_player(fast, r#"{"yaw": 0}"#, 5.0, start).expect("spawned");
    let lofi = SubscriptionOptions { fanout_interval_ms: 200, ..Default::default() };
    h.spawn_player_with(slow, r#"{"yaw": 0}"#, 5.0, lofi, start + ms).expect("spawned");
    let first: u64 = h.entity_ids().next().expect("spawned");
    let mut got: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
    // A second of frames, each changing both entities, a pass after each.
    for frame in 1..=50u32 {
        let at = |id: u64| if id == first { fast } else { slow };
        h.publish_frame(|id| (at(id), format!(r#"{{"yaw": {frame}}}"#))).expect("published");
        let now = start + ms * (20 * frame);
        h.tick(now);
        for (client, got) in got.iter_mut().enumerate() {
            let (messages, _) = h.drain_clients(now, |i| i == client).expect("every update applies");
            got.extend((0..messages).map(|_| 20 * frame));
        }
    }
    assert_eq!(got[0], (1..=50).map(|f| 20 * f).collect::<Vec<_>>(), "one update a pass");
    // The first at the first pass after the join (20 ms), then one every 200 ms: the due
    // time counts from the previous due time (1 ms in), and each pass serves those due.
    assert_eq!(got[1], [20, 220, 420, 620, 820], "one merged update per 200 ms");
    // Every update applied to the slow client's replica: each was a delta from what it held.
    h.tick(start + ms * 1020);
    h.drain(start + ms * 1020).expect("every update applies");
    assert_eq!(h.replicas_differ(), None);
}

/// A world of 12 clients (each seeing a 30 m sphere, keeping replicas), whose passes are due
/// every 20 ms from `start` and run by the world without being delivered.
struct Lagging {
    h: WorldHarness,
    start: Instant,
    spawned: HashMap<u64, [f32; 3]>,
    passes: u32,
}

impl Lagging {
    fn new() -> Lagging {
        let start = Instant::now();
        let mut h = small_world(start);
        h.keep_replicas();
        let mut spawned = HashMap::new();
        for i in 0..12 {
            // Two rows, both in the blocks of servers 0 and 1.
            let at = [5.0 + (i % 6) as f32 * 19.0, 0.0, 5.0 + (i / 6) as f32 * 50.0];
            spawned.insert(h.spawn_player(at, r#"{"yaw": 0}"#, 30.0, start).expect("spawned"), at);
        }
        Lagging { h, start, spawned, passes: 0 }
    }

    /// `n` more passes, each after a frame that changes every entity, none delivered.
    fn passes(&mut self, n: u32) {
        for _ in 0..n {
            self.passes += 1;
            let (pass, spawned) = (self.passes, &self.spawned);
            self.h.publish_frame(|id| (spawned[&id], format!(r#"{{"yaw": {pass}}}"#))).expect("published");
            self.h.pass_without_delivery(self.start + Duration::from_millis(u64::from(20 * pass)));
        }
    }

    /// A little after the last pass.
    fn now(&self) -> Instant {
        self.start + Duration::from_millis(u64::from(20 * self.passes + 5))
    }
}

fn passes_waiting(passes: u32) -> (WorldHarness, Instant) {
    let mut lagging = Lagging::new();
    lagging.passes(passes);
    (lagging.h, lagging.start)
}

#[test]
fn a_session_found_gone_by_its_delivery_is_forgotten_even_if_its_view_changed_meanwhile() {
    let start = Instant::now();
    let ms = Duration::from_millis(1);
    let mut h = small_world(start);
    let at = [5.0, 0.0, 5.0];
    // In JSON, which no one else reads: once the world forgets it, nothing is encoded for it.
    h.spawn_player_in(at, r#"{"yaw": 0}"#, 5.0, DeltaCodec::Json, start).expect("spawned");
    h.tick(start + ms * 20);
    assert_eq!(h.viewers(), (5, 5), "4 servers and the client");
    // The session ends; the next pass's offer to it fails and its delivery reports it gone...
    h.close_client(0);
    h.publish_frame(|_| (at, r#"{"yaw": 1}"#.into())).expect("published");
    h.tick(start + ms * 40);
    // ... and before the world reads that report, its entity walks into the next cell, which
    // moves its area (a new view posted to the delivery).
    h.publish_frame(|_| ([25.0, 0.0, 5.0], r#"{"yaw": 2}"#.into())).expect("published");
    h.tick(start + ms * 60);
    h.tick(start + ms * 80);
    assert_eq!(h.viewers(), (4, 4), "the client is gone from both");
}

#[test]
fn a_client_that_changes_codec_gets_its_cells_again_in_the_new_one_in_a_quiet_world() {
    let start = Instant::now();
    let ms = Duration::from_millis(1);
    let mut h = small_world(start);
    h.keep_replicas();
    let at = [5.0, 0.0, 5.0];
    h.spawn_player(at, r#"{"yaw": 0}"#, 25.0, start).expect("spawned");
    h.tick(start + ms * 20);
    assert_eq!(h.drain(start + ms * 20).expect("read").0, 1);
    // The same area in JSON; nothing in the world changes from now on.
    let area = set_interest::Area::Sphere(Sphere { center: v3(at), radius: 25.0 });
    let options = SubscriptionOptions { codec: DeltaCodec::Json as i32, ..Default::default() };
    let req = SetInterest {
        area: Some(area),
        follow: Follow::Cell as i32,
        options: Some(options),
        ..Default::default()
    };
    assert_eq!(h.set_interest(0, req, start + ms * 30).status, Status::Ok as i32);
    h.tick(start + ms * 40);
    assert_eq!(h.drain(start + ms * 40).expect("every snapshot applies").0, 1, "its cells in JSON");
    assert_eq!(h.replicas_differ(), None);
}

#[test]
fn a_client_that_leaves_and_comes_back_before_its_delivery_runs_starts_over_with_its_delay() {
    let start = Instant::now();
    let ms = Duration::from_millis(1);
    let mut h = small_world(start);
    h.keep_replicas();
    let at = [5.0, 0.0, 5.0];
    h.spawn_player(at, r#"{"yaw": 0}"#, 5.0, start).expect("spawned");
    h.tick(start + ms * 20);
    assert_eq!(h.drain_clients(start + ms * 20, |_| true).expect("read").0, 1);
    // No area, then an area again with a 200 ms delay, both before the next pass.
    let none = SetInterest { area: None, follow: Follow::Cell as i32, ..Default::default() };
    assert_eq!(h.set_interest(0, none, start + ms * 30).status, Status::Ok as i32);
    let area = set_interest::Area::Sphere(Sphere { center: v3(at), radius: 5.0 });
    let options = SubscriptionOptions { fanout_delay_ms: 200, ..Default::default() };
    let req = SetInterest {
        area: Some(area),
        follow: Follow::Cell as i32,
        options: Some(options),
        ..Default::default()
    };
    assert_eq!(h.set_interest(0, req, start + ms * 30).status, Status::Ok as i32);
    // A new viewer: nothing before its delay (section 13.3), whatever changes; then its cells.
    let mut got = Vec::new();
    for pass in 2..=13u32 {
        h.publish_frame(|_| (at, format!(r#"{{"yaw": {pass}}}"#))).expect("published");
        let now = start + ms * 20 * pass;
        h.tick(now);
        got.push(h.drain_clients(now, |_| true).expect("every update applies").0);
    }
    // Passes at 40..220 ms (the first brings the UNSUBSCRIBED of its cell), then 240 and
    // 260 ms (the delay ends at 230 ms).
    assert_eq!(got, [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1]);
    assert_eq!(h.replicas_differ(), None);
}

#[test]
fn a_delivery_always_more_than_eight_passes_behind_still_brings_every_replica_up_to_date() {
    // Every cell changes every pass, and the delivery runs once every 11 passes: each time, the
    // 3 oldest of the 11 waiting were dropped, among them the first after its last run.
    // 9 is the cadence at which the pass that carries them is the one the next post drops.
    for behind in [9, 10, 11] {
        let mut l = Lagging::new();
        for _ in 0..5 {
            l.passes(behind);
            let now = l.now();
            l.h.deliver(now);
            l.h.drain(now).expect("every update applies");
        }
        assert_eq!(l.h.counts().passes_dropped, u64::from(5 * (behind - 8)), "{behind} behind");
        assert_eq!(l.h.replicas_differ(), None, "{behind} behind");
    }
}

#[test]
fn a_client_due_every_few_ticks_gets_every_cell_when_its_delivery_runs_every_other_pass() {
    let start = Instant::now();
    let ms = Duration::from_millis(1);
    let mut h = small_world(start);
    h.keep_replicas();
    let at = [30.0, 0.0, 30.0];
    let every_four = SubscriptionOptions { fanout_interval_ms: 80, ..Default::default() };
    h.spawn_player_with(at, r#"{"yaw": 0}"#, 25.0, every_four, start).expect("spawned");
    let mut got = 0;
    // 40 passes whose frames change its entity, then 12 quiet ones; the delivery runs after
    // every second pass.
    for pass in 1..=52u32 {
        if pass <= 40 {
            h.publish_frame(|_| (at, format!(r#"{{"yaw": {pass}}}"#))).expect("published");
        }
        h.pass_without_delivery(start + ms * (20 * pass));
        if pass % 2 == 0 {
            let now = start + ms * (20 * pass + 5);
            h.deliver(now);
            got += h.drain(now).expect("every update applies").0;
        }
    }
    // One every 4 passes at most (80 ms), in runs that come every 2: about 12 over 52 passes.
    assert!((10..=13).contains(&got), "{got} messages");
    assert_eq!(h.replicas_differ(), None);
}

#[test]
fn a_delivery_that_runs_late_delivers_the_passes_waiting_in_order() {
    let (mut h, start) = passes_waiting(3);
    let now = start + Duration::from_millis(65);
    // Every viewer was due at each of the 3 passes: the first gives the 12 clients and the
    // 4 servers their snapshots, the others a delta to the clients and the 2 servers whose
    // blocks hold the entities.
    assert_eq!(h.deliver(now), 16 + 2 * 14);
    let (messages, _) = h.drain(now).expect("every update applies, in order");
    assert_eq!(messages, 3 * 12, "a message per client per pass");
    assert_eq!(h.replicas_differ(), None);
    assert_eq!(h.counts().passes_dropped, 0);
}

#[test]
fn passes_past_what_a_delivery_holds_are_dropped_and_their_changes_merge_into_the_next() {
    let (mut h, start) = passes_waiting(11);
    let now = start + Duration::from_millis(225);
    // 8 passes wait at most; the 3 oldest went, the snapshots of the first among them.
    assert_eq!(h.counts().passes_dropped, 3);
    // So the 8 left have nothing a client can apply: nothing is sent, and the snapshots are
    // asked for ...
    assert_eq!(h.deliver(now), 0);
    assert_eq!(h.drain(now).expect("read").0, 0);
    // ... and come with the next pass.
    let later = start + Duration::from_millis(240);
    h.tick(later);
    h.drain(later).expect("every update applies");
    assert_eq!(h.replicas_differ(), None);
}

#[test]
fn a_new_client_due_after_the_pass_that_encoded_its_snapshots_gets_them_all_at_once() {
    let start = Instant::now();
    let ms = Duration::from_millis(1);
    let mut h = small_world(start);
    h.keep_replicas();
    h.spawn_player([5.0, 0.0, 5.0], r#"{"yaw": 0}"#, 5.0, start).expect("spawned");
    // The pass due at 20 ms runs at 22 ms and encodes the snapshots of the cells of two
    // new clients, neither due at it: one joined at 1 ms with a 30 ms delay, the other at
    // 21 ms, after the pass's due instant. Both are first due at the pass at 40 ms, which
    // would encode no snapshot of its own.
    let delayed = SubscriptionOptions { fanout_delay_ms: 30, ..Default::default() };
    h.spawn_player_with([30.0, 0.0, 30.0], r#"{"yaw": 0}"#, 25.0, delayed, start + ms).expect("spawned");
    h.spawn_player([90.0, 0.0, 90.0], r#"{"yaw": 0}"#, 25.0, start + ms * 21).expect("spawned");
    let new = |i: usize| i > 0;
    h.tick_late(start + ms * 20, start + ms * 22);
    assert_eq!(h.drain_clients(start + ms * 22, new).expect("read").0, 0, "not due yet");
    h.tick(start + ms * 40);
    assert_eq!(h.drain_clients(start + ms * 40, new).expect("read").0, 2, "a message each");
    // Each held every cell in view: the replicas match.
    h.drain(start + ms * 40).expect("read");
    assert_eq!(h.replicas_differ(), None);
}

/// 40 clients on a 6×6 world, their entities two by two in 20 cells, one in three reading
/// JSON updates and the others binary ones. One client in four
/// reads once every 20 passes (400 ms: its window fills and holds updates back), in 10
/// phases, so they fall behind from different versions. Every frame publishes
/// `value(frame, i)` for every entity (`i` in spawn order). Checks that every update read
/// applies to the client's replica of its cell, and that once everyone reads, every client
/// holds a replica of each cell in its view, equal to the cell. Returns what the passes
/// counted.
fn clients_behind(value: impl Fn(usize, usize) -> String) -> PassCounts {
    let start = Instant::now();
    let mut h = small_world(start);
    h.keep_replicas();
    let mut spawned = std::collections::HashMap::new();
    // Two by two: each of the 20 cells with an entity holds two.
    for i in 0..40 {
        let x = 5.0 + (i % 10 / 2) as f32 * 20.0 + (i % 2) as f32 * 8.0;
        let at = [x, 0.0, 5.0 + (i / 10) as f32 * 27.0];
        let codec = if i % 3 == 0 { DeltaCodec::Json } else { DeltaCodec::Binary };
        let id = h.spawn_player_in(at, &value(0, i), 30.0, codec, start).expect("spawned");
        spawned.insert(id, (at, i));
    }
    let reads = |frame: usize| move |i: usize| !i.is_multiple_of(4) || (frame + i / 4).is_multiple_of(20);
    let mut now = start;
    for frame in 1..=100usize {
        h.publish_frame(|id| (spawned[&id].0, value(frame, spawned[&id].1))).expect("published");
        now += Duration::from_millis(20);
        h.tick(now);
        h.drain_clients(now, reads(frame)).expect("every update applies to its replica");
    }
    let counts = h.counts();
    assert!(counts.held_back > 0, "the clients behind were held back: {counts:?}");
    // Reading every 400 ms, these clients show a low delivery rate: their windows hold by
    // bytes. Their sessions' queues never refuse an update.
    assert!(counts.held_back_by[tickwire_fanout::Hold::Bytes.index()] > 0, "{counts:?}");
    assert_eq!(counts.held_back_by[super::super::HELD_BACK_QUEUE], 0, "{counts:?}");
    for _ in 0..3 {
        now += Duration::from_millis(20);
        h.tick(now);
        h.drain(now).expect("every update applies to its replica");
    }
    assert_eq!(h.replicas_differ(), None);
    // And the check sees a replica that has not read the latest pass.
    h.publish_frame(|id| (spawned[&id].0, value(1000, spawned[&id].1))).expect("published");
    h.tick(now + Duration::from_millis(20));
    assert!(h.replicas_differ().is_some());
    counts
}

#[test]
fn clients_behind_get_the_snapshot_of_a_cell_whose_every_entity_changed() {
    // Every entity changes every frame: a delta is about a snapshot's size.
    let counts = clients_behind(|frame, _| {
        let f = frame as f32;
        format!(r#"{{"pos": [{f}, {}, 1.5], "yaw": {}, "data": "d{frame}"}}"#, f * 0.5, f * 0.01)
    });
    assert!(counts.catch_up_snapshots > 0, "{counts:?}");
}

#[test]
fn clients_behind_get_the_snapshot_of_a_cell_whose_every_entity_moved() {
    // The B3 bots' shape: every entity moves every frame, its other fields stay. Only the
    // position is sent (docs/protocol.md 13.4), so a delta is under 3/4 of a snapshot's
    // size but over half of it: a viewer behind would need a delta of its own nearly as
    // large as the snapshot that every viewer behind shares.
    let counts = clients_behind(|frame, i| {
        let f = frame as f32;
        format!(r#"{{"pos": [{f}, 0, {}], "yaw": 1.25, "data": "bot-{i:04}-run"}}"#, f * 0.5)
    });
    assert!(counts.catch_up_snapshots > 0, "{counts:?}");
}

#[test]
fn clients_behind_get_a_merged_delta_of_a_cell_that_changed_a_little() {
    // One entity in eight changes each frame, never both of a cell's two; the others publish
    // their position only (an empty value), which changes nothing: a delta is well under
    // half the cell's snapshot (about a fifth).
    let counts = clients_behind(|frame, i| {
        if frame == 0 || (frame + i).is_multiple_of(8) {
            format!(r#"{{"yaw": {}, "data": "{}"}}"#, frame % 6, "x".repeat(50))
        } else {
            String::new()
        }
    });
    assert_eq!(counts.catch_up_snapshots, 0, "{counts:?}");
}

/// Two worlds alike, two clients in one cell: client 0 reads at every pass; client 1 reads at
/// the passes for which `reads` holds in the second world, at every pass in the first. Returns
/// the cell updates each world's passes encoded, the updates held back in the second, and
/// whether its replicas differ at the end.
fn against_a_reader(reads: impl Fn(u32) -> bool, passes: u32) -> (Vec<u64>, Vec<u64>, u64, Option<String>) {
    let run = |reads: &dyn Fn(u32) -> bool| {
        let start = Instant::now();
        let mut h = small_world(start);
        h.keep_replicas();
        let at = [[5.0, 0.0, 5.0], [8.0, 0.0, 5.0]];
        let ids = [
            h.spawn_player(at[0], r#"{"yaw": 0}"#, 5.0, start).expect("spawned"),
            h.spawn_player(at[1], r#"{"yaw": 0}"#, 5.0, start).expect("spawned"),
        ];
        let mut per_pass = Vec::new();
        for frame in 1..=passes {
            let now = start + Duration::from_millis(20 * u64::from(frame));
            h.publish_frame(|id| (at[usize::from(id == ids[1])], format!(r#"{{"yaw": {frame}}}"#)))
                .expect("published");
            let before = h.counts().encodings;
            h.tick(now);
            per_pass.push(h.counts().encodings - before);
            h.drain_clients(now, |i| i == 0 || reads(frame)).expect("every update applies");
        }
        (per_pass, h.counts().held_back, h.replicas_differ())
    };
    let (reading, none_held, _) = run(&|_| true);
    assert_eq!(none_held, 0, "both clients keep up");
    let (other, held, differ) = run(&reads);
    (reading, other, held, differ)
}

/// Per pass, the cell updates `other` encoded beyond what `reading` did.
fn extra(other: &[u64], reading: &[u64]) -> Vec<u64> {
    other.iter().zip(reading).map(|(o, r)| o.saturating_sub(*r)).collect()
}

#[test]
fn a_client_that_stops_reading_stops_costing_encodings_and_catches_up_when_it_reads_again() {
    // Client 1 reads at the first pass, then not until the hundredth: its window fills and it is
    // refused at every pass, then it reads again.
    let (reading, stuck, held, differ) = against_a_reader(|pass| pass == 1 || pass > 100, 110);
    assert!(held > 50, "the stuck client is refused pass after pass: {held}");
    let extra = extra(&stuck, &reading);
    // Refused, it is asked for a pass ahead (a delta from the version it holds) until it looks
    // stopped (`Window::stalled`: nothing acknowledged since the update queued at 40 ms, for
    // twice its 350 ms bound: past 0.74 s, so its last ask is at pass 37, encoded at 38); then
    // no more until it reads at pass 100.
    assert!(extra[..36].iter().sum::<u64>() > 0, "asked for while recent: {extra:?}");
    assert_eq!(extra[38..100].iter().sum::<u64>(), 0, "encodings per pass beyond a reader's: {extra:?}");
    // Reading again, it gets its cells and its replicas converge.
    assert_eq!(differ, None, "after reading again");
}

#[test]
fn a_client_that_reads_slowly_but_acknowledges_is_asked_for_at_every_refusal() {
    // Client 1 reads every 30th pass (600 ms), from the first. Before its second read its
    // window holds updates back (from pass 20 or so), and its oldest update in flight has
    // waited over half a second by pass 28; but it is not stopped (nothing acknowledged for
    // 700 ms), so each refusal, the last ones too, asks a pass ahead.
    let (reading, slow, held, differ) = against_a_reader(|pass| pass % 30 == 1, 61);
    assert!(held > 5, "refused before its second read: {held}");
    let extra = extra(&slow, &reading);
    for asked_at in [27, 28, 29, 30] {
        assert!(extra[asked_at] > 0, "asked at pass {asked_at}, encoded at the next: {extra:?}");
    }
    assert_eq!(differ, None);
}

/// A viewer that enters many large cells at once gets their snapshots over several passes, in
/// messages of at most 256 KiB of entries (one entry more at most), and converges: one message
/// of them all would pass the session's bound on unacknowledged data (1 MiB).
#[test]
fn a_viewer_entering_many_large_cells_gets_them_in_bounded_messages() {
    let start = Instant::now();
    let mut h = small_world(start);
    let data = "x".repeat(30 << 10);
    for i in 0..36 {
        let at = [10.0 + (i % 6) as f32 * 20.0, 0.0, 10.0 + (i / 6) as f32 * 20.0];
        h.spawn_player(at, &format!(r#"{{"data": "{data}"}}"#), 1.0, start).expect("spawned");
    }
    let mut now = start + Duration::from_millis(20);
    h.tick(now);
    h.drain(now).expect("read");
    // A viewer whose area covers the 36 cells: about 1.1 MB of snapshots.
    h.keep_replicas();
    h.spawn_player([60.0, 0.0, 60.0], r#"{"yaw": 0}"#, 200.0, now).expect("spawned");
    let mut passes = 0;
    while h.replicas_differ().is_some() && passes < 40 {
        now += Duration::from_millis(20);
        h.tick(now);
        let (_, bytes) = h.drain(now).expect("read");
        assert!(bytes < (256 << 10) + (32 << 10), "pass {passes}: {bytes} bytes");
        passes += 1;
    }
    assert_eq!(h.replicas_differ(), None, "converged");
    assert!(passes >= 4, "{passes} passes");
}

/// A client controlling two entities has its area follow the latest spawned only: the other's
/// moves do not pull the area back and forth.
#[test]
fn an_area_follows_the_latest_entity_its_client_controls() {
    let start = Instant::now();
    let mut h = small_world(start);
    let first = h.spawn_player([5.0, 0.0, 5.0], r#"{"yaw": 0}"#, 5.0, start).expect("spawned");
    let cell = |x: u32, z: u32| x + 6 * z;
    assert_eq!(h.view_cells(0), [cell(0, 0)]);
    let latest = h.spawn_for(0, [45.0, 0.0, 45.0], r#"{"yaw": 0}"#).expect("spawned");
    // The first walks into the next cell: the area stays.
    let mut at = std::collections::HashMap::from([(first, [25.0, 0.0, 5.0]), (latest, [45.0, 0.0, 45.0])]);
    h.publish_frame(|id| (at[&id], r#"{"yaw": 1}"#.into())).expect("published");
    assert_eq!(h.view_cells(0), [cell(0, 0)], "not the first entity's");
    // The latest walks into the next cell: the area follows it.
    at.insert(latest, [45.0, 0.0, 25.0]);
    h.publish_frame(|id| (at[&id], r#"{"yaw": 2}"#.into())).expect("published");
    assert_eq!(h.view_cells(0), [cell(2, 1)], "the latest entity's");
}
