//! The window's unit tests, in simulated time: every instant is an argument.

use super::*;

const MS: Duration = Duration::from_millis(1);

fn limits() -> WindowLimits {
    WindowLimits {
        target: 250 * MS,
        min_bytes: 1000,
        initial_bytes: 4000,
        max_bytes: 100_000,
        max_messages: 8,
        ack_delay: 100 * MS,
    }
}

#[test]
fn room_until_the_initial_window_is_full_and_one_may_overshoot() {
    let t = Instant::now();
    let mut w = Window::<u32>::new(limits());
    assert!(w.has_room(t));
    w.queued(t, 1, None, 3999);
    assert!(w.has_room(t), "below the window: one more may go, whatever its size");
    w.queued(t, 1, Some(1), 10_000);
    assert_eq!(w.room(t), Err(Hold::Bytes));
    assert_eq!(w.in_flight(), (2, 13_999));
}

#[test]
fn a_client_is_stalled_only_after_acknowledging_nothing_for_twice_the_longest_wait() {
    let t = Instant::now();
    let mut w = Window::<u32>::new(limits());
    assert!(!w.stalled(t + 10_000 * MS), "nothing in flight");
    w.queued(t, 1, None, 100);
    assert!(w.sent(1));
    // No base flight yet: twice the acknowledgement delay and the target, 700 ms.
    assert!(!w.stalled(t + 700 * MS));
    assert!(w.stalled(t + 701 * MS));
    // Acknowledged after 50 ms (the base flight); the next update, queued into the empty
    // window at 60 ms, is waited for 2 × (50 + 100 + 250) = 800 ms from then.
    w.acked(t + 50 * MS, 1);
    assert!(!w.stalled(t + 10_000 * MS), "everything acknowledged");
    w.queued(t + 60 * MS, 1, Some(1), 100);
    assert!(!w.stalled(t + 860 * MS));
    assert!(w.stalled(t + 861 * MS));
    // A slow reader that acknowledges anything starts the count again, even with an older
    // update still in flight.
    assert!(w.sent(2));
    w.queued(t + 800 * MS, 1, Some(2), 100);
    w.acked(t + 840 * MS, 2);
    assert_eq!(w.in_flight().0, 1);
    // (The update acknowledged travelled alone: its 780 ms are the base flight now, so
    // the wait is 2 × (780 + 100 + 250) = 2,260 ms from the acknowledgement.)
    assert!(!w.stalled(t + 3100 * MS));
    assert!(w.stalled(t + 3101 * MS));
}

#[test]
fn acknowledgements_free_the_window_and_measure_the_rate() {
    let t = Instant::now();
    let mut w = Window::<u32>::new(limits());
    w.queued(t, 1, None, 2000);
    w.queued(t, 1, Some(1), 2000);
    assert!(w.sent(1));
    assert!(w.sent(2));
    assert!(!w.sent(3), "nothing else waits");
    // Both acknowledged 100 ms later: 4000 bytes in 100 ms is 40 kB/s, a 10 kB window.
    w.acked(t + 100 * MS, 2);
    assert_eq!(w.in_flight(), (0, 0));
    let rate = w.rate().unwrap();
    assert!((20_000.0..=40_000.0).contains(&rate), "{rate}");
    assert!(w.limit() >= 5000);
}

#[test]
fn a_slow_reader_shrinks_the_window_to_its_pace() {
    let t = Instant::now();
    let mut w = Window::<u32>::new(limits());
    // 400 bytes acknowledged every 100 ms: 4 kB/s; the base flight time is 100 ms, so the
    // window is 4 kB/s x (100 + 100 ack delay + 250) ms.
    let mut seq = 0;
    for i in 0..40u32 {
        let now = t + 100 * MS * i;
        w.queued(now, 1, Some(u64::from(i)), 400);
        seq += 1;
        w.sent(seq);
        w.acked(now + 100 * MS, seq);
    }
    let rate = w.rate().unwrap();
    assert!((3_000.0..=5_000.0).contains(&rate), "{rate}");
    assert_eq!(w.base_flight(), Some(100 * MS));
    assert_eq!(w.limit(), (rate * 0.45) as usize);
}

#[test]
fn the_ceiling_is_hard_except_for_a_lone_update() {
    let t = Instant::now();
    let mut w = Window::<u32>::new(limits());
    assert!(w.admits(500_000), "alone, even past the ceiling");
    w.queued(t, 1, None, 60_000);
    assert!(w.admits(40_000));
    assert!(!w.admits(40_001), "60 kB + 40,001 B would pass the 100 kB ceiling");
    assert_eq!(w.room(t), Err(Hold::Large), "the large update goes next: nothing else meanwhile");
    w.sent(1);
    w.acked(t + 50 * MS, 1);
    assert!(w.has_room(t) && w.admits(90_000), "alone now");
    w.queued(t + 50 * MS, 1, Some(1), 90_000);
    assert!(w.admits(10_000) && !w.admits(10_001), "the ceiling again");
}

#[test]
fn a_far_client_that_keeps_up_is_not_held_back() {
    // 300 ms from the gateway, acknowledging 100 ms after it reads: 400 ms of flight. It
    // takes 300 bytes every 20 ms (15 kB/s), so 6 kB are in flight at any time, more than
    // the 250 ms target alone would allow.
    let t = Instant::now();
    let mut w = Window::<u32>::new(WindowLimits { max_messages: 512, ..limits() });
    let mut sent: Vec<(u64, Instant)> = Vec::new();
    let mut held = 0;
    for i in 0..500u32 {
        let now = t + 20 * MS * i;
        // Everything queued 400 ms ago or earlier is acknowledged by now.
        if let Some(&(acked, _)) = sent.iter().rev().find(|(_, at)| now >= *at + 400 * MS) {
            w.acked(now, acked);
        }
        if w.has_room(now) && w.admits(300) {
            w.queued(now, 1, None, 300);
            let seq = sent.len() as u64 + 1;
            w.sent(seq);
            sent.push((seq, now));
        } else if i > 100 {
            held += 1;
        }
    }
    assert_eq!(held, 0, "limit {}, base flight {:?}", w.limit(), w.base_flight());
    assert!(w.base_flight().unwrap() >= 380 * MS);
}

#[test]
fn an_update_waiting_past_the_base_flight_ack_delay_and_target_holds_the_next() {
    let t = Instant::now();
    let mut w = Window::<u32>::new(limits());
    // Alone, acknowledged after 50 ms: the base flight time.
    w.queued(t, 1, None, 100);
    w.sent(1);
    w.acked(t + 50 * MS, 1);
    w.queued(t + 60 * MS, 1, Some(1), 100);
    w.sent(2);
    // 50 ms base + 100 ms acknowledgement delay + 250 ms target.
    assert_eq!(w.room(t + 460 * MS), Ok(()));
    assert_eq!(w.room(t + 461 * MS), Err(Hold::Overdue));
}

#[test]
fn a_window_that_held_back_drains_once_its_base_flight_time_is_stale() {
    // 100 bytes every 20 ms, each acknowledged 200 ms after it is queued: about 10 in
    // flight, so the window never empties and no update after the first travels alone.
    // With no target and no acknowledgement delay, the window is the rate times the base
    // flight time, about those 10 updates: it holds some back all along (bytes). Once the
    // base (measured by the first update, at 200 ms) is older than BASE_FLIGHT_MEMORY, the
    // window drains for a new measurement, then opens again.
    let t = Instant::now();
    let limits =
        WindowLimits { target: Duration::ZERO, ack_delay: Duration::ZERO, min_bytes: 100, ..limits() };
    let mut w = Window::<u32>::new(WindowLimits { max_messages: 512, ..limits });
    let mut sent: Vec<(u64, Instant)> = Vec::new();
    let mut holds = Vec::new();
    for i in 0..700u32 {
        let now = t + 20 * MS * i;
        if let Some(&(acked, _)) = sent.iter().rev().find(|(_, at)| now >= *at + 200 * MS) {
            w.acked(now, acked);
        }
        match w.room(now) {
            Ok(()) => {
                w.queued(now, 1, None, 100);
                let seq = sent.len() as u64 + 1;
                w.sent(seq);
                sent.push((seq, now));
            }
            Err(hold) => holds.push((now - t, hold)),
        }
    }
    let first = |hold| holds.iter().find(|(_, h)| *h == hold).map(|&(at, _)| at);
    let bytes = first(Hold::Bytes).expect("the window held updates back");
    let probe = first(Hold::Probe).expect("a drain for a new base");
    assert!(bytes < probe && probe > 200 * MS + BASE_FLIGHT_MEMORY, "{holds:?}");
    assert!(
        holds.iter().all(|&(at, h)| h != Hold::Probe || at < probe + 220 * MS),
        "the drain lasts one flight: {holds:?}"
    );
    assert!(holds.iter().all(|&(_, h)| matches!(h, Hold::Bytes | Hold::Probe)), "{holds:?}");
    // And it opens again: updates go out after the drain, the first of them alone.
    let after = sent.iter().filter(|&&(_, at)| at > t + probe + 220 * MS).count();
    assert!(after > 50, "{after} sent after the drain");
}

#[test]
fn the_message_cap_holds_whatever_the_bytes() {
    let t = Instant::now();
    let mut w = Window::<u32>::new(limits());
    for _ in 0..8 {
        w.queued(t, 1, None, 1);
    }
    assert_eq!(w.room(t), Err(Hold::Messages));
}

#[test]
fn resume_drops_what_the_client_lacks_and_rewinds_each_channel_once() {
    let t = Instant::now();
    let mut w = Window::<u32>::new(limits());
    // Channel 1: 0 -> 1 (seq 1, delivered), 1 -> 2 (seq 3), 2 -> 3 (in the outbox).
    // Channel 2: snapshot (seq 2, not delivered).
    w.queued(t, 1, Some(0), 10);
    w.queued(t, 2, None, 10);
    w.queued(t, 1, Some(1), 10);
    w.queued(t, 1, Some(2), 10);
    for seq in 1..=3 {
        w.sent(seq);
    }
    w.resume(1);
    assert_eq!(w.in_flight(), (0, 0));
    assert!(w.has_rewinds());
    assert_eq!(w.take_rewind(2), Some(None), "its snapshot never arrived");
    assert_eq!(w.take_rewind(1), Some(Some(1)));
    assert_eq!(w.take_rewind(1), None);
    assert!(!w.has_rewinds());
    assert!(w.has_room(t));
}

#[test]
fn a_forgotten_channel_is_not_rewound() {
    let t = Instant::now();
    let mut w = Window::<u32>::new(limits());
    w.queued(t, 1, Some(4), 10);
    w.forget(1);
    w.queued(t, 1, None, 10);
    w.resume(0);
    assert_eq!(w.take_rewind(1), Some(None), "the new subscription's snapshot, not version 4");
}
