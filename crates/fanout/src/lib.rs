//! The fan-out scheduler of one channel: at a given instant, which subscribers get an update,
//! and from which version.
//!
//! It exists apart from the channel actor so that the rules that decide *when* are a pure state
//! machine: every method takes `now`, nothing here reads a clock, sleeps or does I/O, and the
//! simulation in `tests/simulation.rs` drives it through thousands of random schedules in
//! simulated time against an oracle. (The first scheduler lived inside the actor and read the
//! clock itself; a subscribe race that dropped patches hid behind a sleep in a test.)
//!
//! The rules:
//! - A subscriber is first due `delay` after it joins, then one `interval` after each update
//!   it was offered. Counting from the previous due time (not from the send) keeps the rate
//!   exact when passes run a little late; a subscriber that had nothing new stays due, so the
//!   next change reaches it at once. So between any two updates `i < j` of one subscriber at
//!   least `(j - i - 1) * interval` passes, and one is never due later than `interval` after
//!   its previous offer.
//! - A caller whose passes run on a timer gives [`Scheduler::due`] and [`Scheduler::record`]
//!   the instant each pass was *due*, not the later one it ran at. Counted from a late pass, a
//!   subscriber's next due time can fall just past the next pass, which then skips it. Counted
//!   from the timer's instants, the bounds above hold between the instants the passes count as.
//!   In real time a pass that ran `L` late sent its updates `L` later, so an update `j` after
//!   one `i` sent by such a pass comes at least `(j - i - 1) * interval - L` after it. The first
//!   update still comes no sooner than `delay` after the join, in real time too (a pass runs no
//!   earlier than it was due). The spatial world and a channel's actor both do this; the
//!   actor's passes after a patch count as the clock when it handles the patch. Its instants
//!   may then go back (an overdue tick after such a pass); that is safe, as `record` at `t`
//!   leaves the subscriber's next due time after `t` (at `t` for interval 0), so a pass at an
//!   earlier instant never serves it again.
//! - Each subscriber has a *base*: the version its replica holds. Without a base it gets a
//!   snapshot. A subscriber that asked to skip the first full state holds the state as of the
//!   moment it joined, so its base is the channel's version at [`Scheduler::join`], never a
//!   later one: a change made between the join and its first update is in that update.
//! - An update the session could not take (its [`Window`] of updates in flight, or its outbox,
//!   is full) leaves the base alone: the next one is a single merged delta from the same base.
//!   State coalesces; it is never queued.
//! - After a resume dropped updates the client never received, the subscriber is *rewound* to
//!   the version its replica holds ([`Scheduler::rewind`]), so it gets one merged delta.

use std::hash::Hash;
use std::time::{Duration, Instant};

// hashbrown's default hasher (foldhash, seeded per process) rather than std's SipHash: a pass
// looks up every due subscriber. It is not made to resist keys chosen to collide, so a
// `Scheduler` must be keyed by ids the caller hands out (the gateway uses connection ids).
use hashbrown::HashMap;

mod window;

pub use window::{Hold, Window, WindowLimits};

/// A channel's state version (`tickwire_state::Version`): it goes up by one per sealed change.
pub type Version = u64;

/// How one subscriber wants its updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// The shortest average time between two updates.
    pub interval: Duration,
    /// No update before this much time has passed since the join.
    pub delay: Duration,
    /// The subscriber already holds the state as of the join: its first update is a delta
    /// from the version at the join, not a snapshot.
    pub skip_first_full_state: bool,
}

/// One update to send in a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due<K> {
    pub id: K,
    /// The version the delta starts from; `None` asks for a snapshot.
    pub from: Option<Version>,
}

/// What became of an update the caller tried to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Queued for the subscriber; it will hold version `to` once it has read it.
    Sent { to: Version },
    /// The subscriber had no room (its window of updates in flight, or its outbox, was full):
    /// nothing was queued, and the next update merges this one.
    Refused,
    /// The delta from the subscriber's base carries nothing for it (for example every change
    /// was in fields it filters out). Nothing was sent; its base and schedule stay as they were.
    Empty,
    /// Nothing was sent: what the subscriber lacks, the caller holds back for now (the spatial
    /// world's level of detail). Its base stays, and it is due again one interval later, even
    /// if the version does not move.
    Deferred,
}

#[derive(Debug, Clone)]
struct Subscriber {
    options: Options,
    next_due: Instant,
    base: Option<Version>,
}

/// The schedule of one channel's subscribers, keyed by `K` (the gateway uses connection ids).
/// Keys must not be chosen by a peer: the map's hasher is fast, not collision-resistant.
#[derive(Debug, Clone)]
pub struct Scheduler<K> {
    subscribers: HashMap<K, Subscriber>,
}

impl<K> Default for Scheduler<K> {
    fn default() -> Self {
        Scheduler { subscribers: HashMap::new() }
    }
}

impl<K: Copy + Eq + Hash> Scheduler<K> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a subscriber at `now`. `version` is the channel's version at this instant: the base
    /// of a subscriber that skips the first full state. Returns `false` (and changes nothing)
    /// if `id` is already subscribed; use [`Scheduler::set_options`] for that.
    pub fn join(&mut self, id: K, options: Options, now: Instant, version: Version) -> bool {
        if self.subscribers.contains_key(&id) {
            return false;
        }
        let base = options.skip_first_full_state.then_some(version);
        self.subscribers.insert(id, Subscriber { options, next_due: now + options.delay, base });
        true
    }

    /// New options for a subscriber, from its next update on. `resnapshot`: what its replica
    /// must hold changed (a new field filter), so it starts again from a snapshot. Returns
    /// `false` if `id` is not subscribed.
    pub fn set_options(&mut self, id: K, options: Options, resnapshot: bool) -> bool {
        let Some(sub) = self.subscribers.get_mut(&id) else { return false };
        sub.options = options;
        if resnapshot {
            sub.base = None;
        }
        true
    }

    /// Sends `id` a snapshot next, whatever its replica holds (for example when its delta
    /// could not be built).
    pub fn resnapshot(&mut self, id: K) {
        if let Some(sub) = self.subscribers.get_mut(&id) {
            sub.base = None;
        }
    }

    /// The subscriber's replica holds `base` after all (`None`: nothing usable), not the
    /// version of the updates it was offered since: those were dropped undelivered. Its next
    /// update starts from there.
    pub fn rewind(&mut self, id: K, base: Option<Version>) {
        if let Some(sub) = self.subscribers.get_mut(&id) {
            sub.base = base;
        }
    }

    /// Removes a subscriber. Returns whether it was there.
    pub fn leave(&mut self, id: K) -> bool {
        self.subscribers.remove(&id).is_some()
    }

    pub fn contains(&self, id: K) -> bool {
        self.subscribers.contains_key(&id)
    }

    pub fn len(&self) -> usize {
        self.subscribers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.subscribers.is_empty()
    }

    /// The version a subscriber's replica holds (or will, once it reads what was queued);
    /// `None` until its first update, or if it is unknown.
    pub fn base(&self, id: K) -> Option<Version> {
        self.subscribers.get(&id)?.base
    }

    /// When a subscriber is next due (if it lacks the version then). A caller that prepares
    /// a subscriber's update ahead of time asks it.
    pub fn next_due(&self, id: K) -> Option<Instant> {
        Some(self.subscribers.get(&id)?.next_due)
    }

    /// Appends to `out` every subscriber that is due at `now` and lacks `version`, the
    /// channel's current (sealed) version. The caller tries to send each one an update from
    /// [`Due::from`] to `version` and reports the outcome with [`Scheduler::record`].
    pub fn due(&self, now: Instant, version: Version, out: &mut Vec<Due<K>>) {
        out.extend(
            self.subscribers
                .iter()
                .filter(|(_, s)| now >= s.next_due && s.base != Some(version))
                .map(|(&id, s)| Due { id, from: s.base }),
        );
    }

    /// What became of the update offered to `id` at `now`.
    pub fn record(&mut self, id: K, now: Instant, outcome: Outcome) {
        let Some(sub) = self.subscribers.get_mut(&id) else { return };
        match outcome {
            Outcome::Empty => return,
            Outcome::Sent { to } => sub.base = Some(to),
            Outcome::Refused | Outcome::Deferred => {}
        }
        // Counted from the due time, so a late pass does not lower the rate (given the pass's
        // due instant as `now`; see the module comment); never later than one interval from now.
        sub.next_due += sub.options.interval;
        if sub.next_due <= now {
            sub.next_due = now + sub.options.interval;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn opts(interval_ms: u32, delay_ms: u32, skip: bool) -> Options {
        Options { interval: MS * interval_ms, delay: MS * delay_ms, skip_first_full_state: skip }
    }

    fn due(s: &Scheduler<u32>, now: Instant, v: Version) -> Vec<Due<u32>> {
        let mut out = Vec::new();
        s.due(now, v, &mut out);
        out.sort_by_key(|d| d.id);
        out
    }

    #[test]
    fn a_new_subscriber_gets_a_snapshot_after_its_delay() {
        let t0 = Instant::now();
        let mut s = Scheduler::new();
        assert!(s.join(1, opts(20, 50, false), t0, 7));
        assert!(!s.join(1, opts(20, 0, false), t0, 7), "a second join changes nothing");
        assert_eq!(due(&s, t0 + 49 * MS, 7), vec![]);
        assert_eq!(due(&s, t0 + 50 * MS, 7), vec![Due { id: 1, from: None }]);
    }

    #[test]
    fn skip_first_full_state_starts_from_the_version_at_the_join() {
        let t0 = Instant::now();
        let mut s = Scheduler::new();
        s.join(1, opts(20, 0, true), t0, 7);
        // Nothing changed since the join: nothing to send.
        assert_eq!(due(&s, t0, 7), vec![]);
        // A change after the join (version 8) goes out as a delta from 7, not lost.
        assert_eq!(due(&s, t0 + MS, 8), vec![Due { id: 1, from: Some(7) }]);
    }

    #[test]
    fn a_late_pass_recorded_at_its_due_instant_does_not_make_the_next_one_skip() {
        // Passes due every 20 ms; the one due at 80 ms runs at 95 ms (later than half a period,
        // which a subscriber counted due half a period early would not mend either). A
        // subscriber due every pass, joined at 1 ms, and a change before every pass.
        let passes = [(20, 20), (40, 40), (60, 60), (80, 95), (100, 100), (120, 120)];
        let served = |on_the_clock: bool| {
            let t = Instant::now();
            let mut s = Scheduler::new();
            s.join(1, opts(20, 0, false), t + MS, 0);
            let mut served = Vec::new();
            for (version, (due_at, ran_at)) in (1..).zip(passes) {
                let at = t + MS * if on_the_clock { ran_at } else { due_at };
                if !due(&s, at, version).is_empty() {
                    s.record(1, at, Outcome::Sent { to: version });
                    served.push(due_at);
                }
            }
            served
        };
        // On the clock, the late pass sets the next due time to 115 ms, after the pass due at
        // 100 ms.
        assert_eq!(served(true), [20, 40, 60, 80, 120]);
        assert_eq!(served(false), [20, 40, 60, 80, 100, 120]);
    }

    #[test]
    fn the_interval_counts_from_the_due_time_and_a_quiet_subscriber_stays_due() {
        let t0 = Instant::now();
        let mut s = Scheduler::new();
        s.join(1, opts(20, 0, false), t0, 1);
        s.record(1, t0 + 3 * MS, Outcome::Sent { to: 1 });
        // Due again at 20 ms (from the due time 0), not at 23 ms.
        assert_eq!(due(&s, t0 + 19 * MS, 2), vec![]);
        assert_eq!(due(&s, t0 + 20 * MS, 2), vec![Due { id: 1, from: Some(1) }]);
        assert_eq!(s.next_due(1), Some(t0 + 20 * MS));
        assert_eq!(s.next_due(2), None);
        // Nothing new for a while: it stays due and the next change goes at once ...
        assert_eq!(due(&s, t0 + 90 * MS, 1), vec![]);
        assert_eq!(due(&s, t0 + 95 * MS, 2).len(), 1);
        s.record(1, t0 + 95 * MS, Outcome::Sent { to: 2 });
        // ... and the one after waits a whole interval from then.
        assert_eq!(due(&s, t0 + 114 * MS, 3), vec![]);
        assert_eq!(due(&s, t0 + 115 * MS, 3).len(), 1);
    }

    #[test]
    fn a_refused_update_keeps_the_base_so_the_next_one_merges() {
        let t0 = Instant::now();
        let mut s = Scheduler::new();
        s.join(1, opts(10, 0, false), t0, 0);
        s.record(1, t0, Outcome::Sent { to: 4 });
        s.record(1, t0 + 10 * MS, Outcome::Refused);
        assert_eq!(s.base(1), Some(4));
        assert_eq!(due(&s, t0 + 15 * MS, 9), vec![]);
        assert_eq!(due(&s, t0 + 20 * MS, 9), vec![Due { id: 1, from: Some(4) }]);
    }

    #[test]
    fn a_deferred_subscriber_is_due_again_one_interval_later_at_the_same_version() {
        let t0 = Instant::now();
        let mut s = Scheduler::new();
        s.join(1, opts(10, 0, false), t0, 0);
        s.record(1, t0, Outcome::Sent { to: 4 });
        s.resnapshot(1);
        s.record(1, t0 + 10 * MS, Outcome::Deferred);
        assert_eq!(s.base(1), None);
        assert_eq!(due(&s, t0 + 15 * MS, 4), vec![], "not at every pass");
        assert_eq!(due(&s, t0 + 20 * MS, 4), vec![Due { id: 1, from: None }], "the version did not move");
    }

    #[test]
    fn an_empty_delta_changes_neither_base_nor_schedule() {
        let t0 = Instant::now();
        let mut s = Scheduler::new();
        s.join(1, opts(10, 0, true), t0, 3);
        s.record(1, t0, Outcome::Empty);
        assert_eq!(s.base(1), Some(3));
        assert_eq!(due(&s, t0, 5), vec![Due { id: 1, from: Some(3) }]);
    }

    #[test]
    fn a_rewound_subscriber_gets_a_delta_from_what_it_holds() {
        let t0 = Instant::now();
        let mut s = Scheduler::new();
        s.join(1, opts(10, 0, false), t0, 0);
        s.record(1, t0, Outcome::Sent { to: 3 });
        s.record(1, t0 + 10 * MS, Outcome::Sent { to: 5 });
        // Nothing changed since version 5, but the update to 5 was dropped on a resume.
        assert_eq!(due(&s, t0 + 20 * MS, 5), vec![]);
        s.rewind(1, Some(3));
        assert_eq!(due(&s, t0 + 20 * MS, 5), vec![Due { id: 1, from: Some(3) }]);
        s.rewind(1, None);
        assert_eq!(due(&s, t0 + 20 * MS, 5), vec![Due { id: 1, from: None }]);
    }

    #[test]
    fn a_new_filter_asks_for_a_snapshot_and_leaving_forgets() {
        let t0 = Instant::now();
        let mut s = Scheduler::new();
        s.join(1, opts(10, 0, false), t0, 0);
        s.record(1, t0, Outcome::Sent { to: 2 });
        assert!(s.set_options(1, opts(10, 0, false), true));
        assert_eq!(due(&s, t0 + 10 * MS, 2), vec![Due { id: 1, from: None }]);
        assert!(s.leave(1));
        assert!(!s.leave(1));
        assert!(!s.set_options(1, opts(10, 0, false), false));
        assert!(s.is_empty());
    }
}
