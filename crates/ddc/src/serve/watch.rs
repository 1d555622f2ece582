//! When a connection, or one answer on it, is given up for what its client does not do. hyper
//! closes an HTTP/1.1 connection that is slow to send a request's headers, but not one whose
//! client stops reading, and it has no idle deadline for HTTP/2 at all: a client that answers
//! keep-alive pings holds an HTTP/2 connection for good. Each would let a few clients hold
//! every connection slot, or the memory of the answers they do not take. So each connection has
//! a [`Watch`], told by `paced.rs` what its socket and its answers wait for:
//! - **slow**: the connection *waits on its client* while its socket refuses data or an answer
//!   has handed hyper a piece and not been asked for the next. While it waits, its bank of
//!   waiting time drains; every byte the socket takes pays back ([`crate::pace`]: one bank for
//!   the whole connection, so a slow link carrying many HTTP/2 streams is judged on what it
//!   carries in all). An empty bank drops the connection.
//! - **cut**: an answer whose client takes nothing of it for the send allowance while the
//!   socket takes data (an HTTP/2 client that gives that stream no flow-control credit while
//!   others move), or for ten allowances whatever the socket does (so a client cannot keep an
//!   answer uncut by keeping its socket full), is cut: its body, and the memory it holds, go,
//!   and the connection is shut down gracefully (HTTP/2 GOAWAY: its other answers finish, no
//!   new request starts, once the client acknowledges the GOAWAY). A cut answer's stream stays
//!   open until its client gives it credit or resets it, so the connection keeps waiting on its
//!   client; once every request left in flight is a cut one, it is dropped an allowance later
//!   (time for the last other answer's tail to go out), and in any case when a cut answer's
//!   stream is still open ten allowances after its cut (a client that never acknowledges the
//!   GOAWAY can keep starting requests), whatever the bank holds.
//! - **idle**: with no request in flight and nothing waiting to be sent, for the idle timeout
//!   (from its opening or its last answer), the connection is shut down gracefully (HTTP/2
//!   GOAWAY, HTTP/1.1 close); still open an idle timeout later, it is dropped.
//!
//! Sans-IO: every method takes `now`; the connection's task in `serve/mod.rs` sleeps until
//! [`Watch::arm`] says and acts on what [`Watch::verdict`] returns.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::pace::{MinRate, Pace, after};

/// Why a connection is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Close {
    /// No request in flight, and shut down gracefully, for an idle timeout each.
    Idle,
    /// Its client took what it was sent too slowly, or nothing of any answer in flight.
    Slow,
}

/// What the connection's task does.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Give up these answers (drop their bodies) and shut down gracefully.
    Cut(Vec<u64>),
    /// Shut down gracefully.
    ShutDown,
    /// Drop the connection.
    Drop(Close),
}

/// An answer cut after waiting this many allowances, whatever its socket did; and a
/// connection dropped whose cut answer's stream is still open this many allowances after the
/// cut.
const CUT_OUTRIGHT: u32 = 10;

/// A request in flight.
#[derive(Debug, Default)]
struct Request {
    /// While its answer waits on the client: since when, and the socket's blocked time then.
    waiting: Option<(Instant, Duration)>,
    /// When its answer was cut.
    cut: Option<Instant>,
}

/// One connection's requests in flight and what they wait for (see the module's comment).
#[derive(Debug)]
pub(crate) struct Watch {
    idle_timeout: Duration,
    /// The connection's bank; its allowance is also how long an answer may go untaken.
    pace: Pace,
    requests: HashMap<u64, Request>,
    /// How many of `requests` wait, and how many were cut (so that whether the connection
    /// waits on its client is known without going through them).
    waiting: usize,
    cut: usize,
    next_key: u64,
    /// When the connection opened, its last request ended, its socket last took data with no
    /// request in flight, or it was shut down.
    idle_since: Instant,
    /// Since when the socket refuses data, if it does.
    blocked_since: Option<Instant>,
    /// How long the socket refused data before that.
    blocked_before: Duration,
    shut_down: bool,
    /// Since when every request in flight is one whose answer was cut.
    all_cut_since: Option<Instant>,
    /// The check the connection's task sleeps until.
    armed: Option<Instant>,
}

impl Watch {
    /// A connection opened at `now`, whose client must take answers at `send` (the rate for
    /// the whole connection, the allowance also for each answer).
    pub fn new(now: Instant, idle_timeout: Duration, send: MinRate) -> Watch {
        Watch {
            idle_timeout,
            pace: Pace::new(send),
            requests: HashMap::new(),
            waiting: 0,
            cut: 0,
            next_key: 0,
            idle_since: now,
            blocked_since: None,
            blocked_before: Duration::ZERO,
            shut_down: false,
            all_cut_since: None,
            armed: None,
        }
    }

    /// A request starts: its key.
    pub fn begin(&mut self) -> u64 {
        self.next_key += 1;
        self.requests.insert(self.next_key, Request::default());
        self.all_cut_since = None;
        self.next_key
    }

    /// Request `key` ended at `now` (its answer's body dropped, sent or not). Whether the
    /// connection's task must wake to re-arm.
    pub fn end(&mut self, key: u64, now: Instant) -> bool {
        if let Some(request) = self.requests.remove(&key) {
            self.waiting -= usize::from(request.waiting.is_some());
            self.cut -= usize::from(request.cut.is_some());
        }
        if self.requests.is_empty() {
            self.idle_since = now;
        }
        self.note_all_cut(now);
        self.settle(now);
        self.wakes()
    }

    /// Request `key`'s answer handed hyper a piece at `now`: it waits for the client to take
    /// it. Whether the connection's task must wake.
    pub fn handed(&mut self, key: u64, now: Instant) -> bool {
        let blocked = self.blocked_at(now);
        if let Some(request) = self.requests.get_mut(&key)
            && request.cut.is_none()
        {
            self.waiting += usize::from(request.waiting.is_none());
            request.waiting = Some((now, blocked));
        }
        self.settle(now);
        self.wakes()
    }

    /// Request `key`'s answer was asked for more at `now`: its client took what it was handed
    /// (the bytes are counted as the socket takes them: [`Watch::took`]). Whether the
    /// connection's task must wake.
    pub fn asked(&mut self, key: u64, now: Instant) -> bool {
        if let Some(request) = self.requests.get_mut(&key) {
            self.waiting -= usize::from(request.waiting.take().is_some());
        }
        self.settle(now);
        self.wakes()
    }

    /// The socket refused data at `now`. Whether the connection's task must wake.
    pub fn blocked(&mut self, now: Instant) -> bool {
        self.blocked_since.get_or_insert(now);
        self.settle(now);
        self.wakes()
    }

    /// The socket took data at `now` after refusing it. Whether the connection's task must
    /// wake.
    pub fn unblocked(&mut self, now: Instant) -> bool {
        if let Some(since) = self.blocked_since.take() {
            self.blocked_before += now.saturating_duration_since(since);
        }
        if self.requests.is_empty() {
            // What was left to send went out: the idle time starts now.
            self.idle_since = now;
        }
        self.settle(now);
        self.wakes()
    }

    /// The socket took `bytes` by `now` (counted since the last call): they pay back the bank.
    pub fn took(&mut self, now: Instant, bytes: u64) {
        if bytes > 0 {
            self.pace.moved(now, bytes);
            self.settle(now);
        }
    }

    /// How long an answer may go untaken: the send allowance.
    fn answer_allowance(&self) -> Duration {
        self.pace.rate().allowance
    }

    /// How long the socket has refused data, in all, by `now`.
    fn blocked_at(&self, now: Instant) -> Duration {
        self.blocked_before
            + self.blocked_since.map_or(Duration::ZERO, |since| now.saturating_duration_since(since))
    }

    /// Whether the connection waits on its client: its socket refuses data, or an answer waits
    /// to be taken (a cut one waits for good: its stream is still open, and the client must
    /// keep the connection moving with something else).
    fn waits_on_client(&self) -> bool {
        self.blocked_since.is_some() || self.waiting > 0 || self.cut > 0
    }

    /// Starts or ends the bank's wait, as the connection waits on its client or not.
    fn settle(&mut self, now: Instant) {
        match (self.waits_on_client(), self.pace.deadline().is_some()) {
            (true, false) => {
                self.pace.wait(now);
            }
            (false, true) => self.pace.moved(now, 0),
            // Waiting still, after some bytes moved: the wait goes on from now.
            (true, true) => {
                self.pace.moved(now, 0);
                self.pace.wait(now);
            }
            (false, false) => {}
        }
    }

    /// When request `request`'s answer is to be cut: once it has gone untaken for the allowance
    /// while the socket took data (time the socket refused data is the connection's, not the
    /// answer's), or for [`CUT_OUTRIGHT`] allowances in all. `None` if it does not wait.
    fn cut_at(&self, request: &Request) -> Option<Instant> {
        let (since, blocked) = request.waiting?;
        let outright = after(since, self.answer_allowance().saturating_mul(CUT_OUTRIGHT));
        if self.blocked_since.is_some() {
            return Some(outright);
        }
        let paused = self.blocked_before.saturating_sub(blocked);
        Some(after(after(since, self.answer_allowance()), paused).min(outright))
    }

    /// Notes whether every request in flight is a cut one, and since when.
    fn note_all_cut(&mut self, now: Instant) {
        if self.cut > 0 && self.cut == self.requests.len() {
            self.all_cut_since.get_or_insert(now);
        } else {
            self.all_cut_since = None;
        }
    }

    /// When the connection is dropped for having nothing in flight but cut answers, or for a
    /// cut answer's stream left open too long.
    fn drop_cut_at(&self) -> Option<Instant> {
        let left_open = self.requests.values().filter_map(|r| r.cut).min();
        let left_open = left_open.map(|cut| after(cut, self.answer_allowance().saturating_mul(CUT_OUTRIGHT)));
        let all_cut = self.all_cut_since.map(|since| after(since, self.answer_allowance()));
        all_cut.into_iter().chain(left_open).min()
    }

    fn idle_at(&self) -> Option<Instant> {
        (self.requests.is_empty() && self.blocked_since.is_none())
            .then(|| after(self.idle_since, self.idle_timeout))
    }

    /// When the next check is due.
    fn next(&self) -> Option<Instant> {
        let cuts = self.requests.values().filter_map(|r| self.cut_at(r));
        cuts.chain(self.pace.deadline()).chain(self.idle_at()).chain(self.drop_cut_at()).min()
    }

    /// Whether a change made the next check earlier than the one armed.
    fn wakes(&self) -> bool {
        match (self.next(), self.armed) {
            (Some(next), Some(armed)) => next < armed,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }

    /// The connection's task sleeps until this (forever on `None`, until woken).
    pub fn arm(&mut self) -> Option<Instant> {
        self.armed = self.next();
        self.armed
    }

    /// What the connection's task must do at `now`, if anything.
    pub fn verdict(&mut self, now: Instant) -> Option<Action> {
        if self.pace.is_late(now) || self.drop_cut_at().is_some_and(|at| at <= now) {
            return Some(Action::Drop(Close::Slow));
        }
        let late: Vec<u64> = self
            .requests
            .iter()
            .filter(|(_, r)| self.cut_at(r).is_some_and(|at| at <= now))
            .map(|(k, _)| *k)
            .collect();
        if !late.is_empty() {
            for key in &late {
                if let Some(request) = self.requests.get_mut(key) {
                    self.waiting -= usize::from(request.waiting.take().is_some());
                    self.cut += usize::from(request.cut.replace(now).is_none());
                }
            }
            self.note_all_cut(now);
            self.settle(now);
            return Some(Action::Cut(late));
        }
        if self.idle_at().is_some_and(|at| at <= now) {
            if self.shut_down {
                return Some(Action::Drop(Close::Idle));
            }
            self.shut_down = true;
            self.idle_since = now;
            return Some(Action::ShutDown);
        }
        None
    }

    /// Whether the connection was shut down for being idle.
    pub fn was_shut_down(&self) -> bool {
        self.shut_down
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Duration = Duration::from_secs(10);
    /// 1,000 bytes a second after 30 s.
    const SEND: MinRate = MinRate { bytes_per_s: 1000, allowance: Duration::from_secs(30) };

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    fn watch(t0: Instant) -> Watch {
        Watch::new(t0, IDLE, SEND)
    }

    /// Two requests in flight from `t0`: one whose answer waits on its client from `t0`, and
    /// one whose answer has not started.
    fn stalled_and_moving(t0: Instant) -> (Watch, u64, u64) {
        let mut watch = watch(t0);
        let stalled = watch.begin();
        let moving = watch.begin();
        watch.handed(stalled, t0);
        (watch, stalled, moving)
    }

    /// [`stalled_and_moving`], with the bank paid back at 20 s and the stalled answer cut at
    /// 30 s: the watch and the other request.
    fn cut_at_30_s(t0: Instant) -> (Watch, u64) {
        let (mut watch, stalled, moving) = stalled_and_moving(t0);
        watch.took(t0 + s(20), 20_000);
        assert_eq!(watch.verdict(t0 + s(30)), Some(Action::Cut(vec![stalled])));
        (watch, moving)
    }

    /// A socket full but for the instant `at`, when it takes `bytes`.
    fn socket_takes(watch: &mut Watch, at: Instant, bytes: u64) {
        watch.unblocked(at);
        watch.took(at, bytes);
        watch.blocked(at);
    }

    #[test]
    fn an_idle_connection_is_shut_down_then_dropped() {
        let t0 = Instant::now();
        let mut watch = watch(t0);
        assert_eq!(watch.arm(), Some(t0 + IDLE), "idle from its opening");
        assert_eq!(watch.verdict(t0 + s(9)), None);
        assert_eq!(watch.verdict(t0 + IDLE), Some(Action::ShutDown));
        assert!(watch.was_shut_down());
        assert_eq!(watch.arm(), Some(t0 + IDLE + IDLE), "one more idle timeout");
        assert_eq!(watch.verdict(t0 + IDLE + s(9)), None);
        assert_eq!(watch.verdict(t0 + IDLE + IDLE), Some(Action::Drop(Close::Idle)));
    }

    #[test]
    fn a_request_in_flight_keeps_it_open_however_long_and_its_end_restarts_the_idle_time() {
        let t0 = Instant::now();
        let mut watch = watch(t0);
        watch.arm();
        let first = watch.begin();
        let second = watch.begin();
        assert_eq!(watch.arm(), None, "nothing to check while requests run and wait on nobody");
        assert_eq!(watch.verdict(t0 + s(3600)), None);
        assert!(!watch.end(first, t0 + s(3600)), "one still in flight: nothing to arm");
        assert!(watch.end(second, t0 + s(3700)), "idle now: the task must arm");
        assert_eq!(watch.arm(), Some(t0 + s(3710)));
        assert_eq!(watch.verdict(t0 + s(3709)), None);
        assert_eq!(watch.verdict(t0 + s(3710)), Some(Action::ShutDown));
    }

    #[test]
    fn a_socket_that_refuses_data_keeps_it_from_idling_and_drains_the_bank() {
        let t0 = Instant::now();
        let mut watch = watch(t0);
        let key = watch.begin();
        watch.end(key, t0 + s(1));
        // The answer's last bytes sit in the socket's buffers, which the client does not read.
        assert!(watch.blocked(t0 + s(1)), "the bank's deadline comes before the idle one");
        assert_eq!(watch.arm(), Some(t0 + s(31)), "the bank's, not the idle deadline");
        assert_eq!(watch.verdict(t0 + s(30)), None);
        // It takes 5,000 bytes at 21 s: 20 s drawn, 5 s paid back; then refuses again.
        watch.unblocked(t0 + s(21));
        watch.took(t0 + s(21), 5000);
        assert_eq!(watch.arm(), Some(t0 + s(31)), "idle from when the socket took the last bytes");
        watch.blocked(t0 + s(21));
        assert_eq!(watch.arm(), Some(t0 + s(21) + s(15)));
        assert_eq!(watch.verdict(t0 + s(36)), Some(Action::Drop(Close::Slow)));
    }

    #[test]
    fn the_bank_is_the_connections_so_answers_moving_together_pay_it_back_together() {
        let t0 = Instant::now();
        let mut watch = watch(t0);
        let keys: Vec<u64> = (0..64).map(|_| watch.begin()).collect();
        // 64 answers on a slow link whose socket refuses data but for the instants it takes
        // 1,000 bytes, once a second: each answer is asked for more every 64 s (each far below
        // the rate, and far past the allowance), the link carries the rate in all.
        for key in &keys {
            watch.handed(*key, t0);
        }
        watch.blocked(t0);
        for second in 1..=640u64 {
            let key = keys[(second % 64) as usize];
            let now = t0 + s(second);
            watch.unblocked(now);
            watch.took(now, 1000);
            watch.asked(key, now);
            watch.handed(key, now);
            watch.blocked(now);
            assert_eq!(watch.verdict(now), None, "at {second} s");
        }
        // The link stops: 30 s later the connection is dropped.
        assert_eq!(watch.arm(), Some(t0 + s(670)));
        assert_eq!(watch.verdict(t0 + s(670)), Some(Action::Drop(Close::Slow)));
    }

    #[test]
    fn an_answer_untaken_while_the_socket_moves_is_cut_alone() {
        let t0 = Instant::now();
        let (mut watch, stalled, moving) = stalled_and_moving(t0);
        // The socket refuses data from 10 s to 20 s: those 10 s are not the answer's.
        watch.blocked(t0 + s(10));
        assert_eq!(watch.verdict(t0 + s(19)), None);
        watch.unblocked(t0 + s(20));
        // The other answer moves all along, paying the connection's bank.
        for second in 20..40 {
            watch.handed(moving, t0 + s(second));
            let taken = t0 + s(second) + Duration::from_millis(500);
            watch.took(taken, 2000);
            watch.asked(moving, taken);
        }
        assert_eq!(watch.arm(), Some(t0 + s(40)), "30 s untaken, blocked time aside");
        assert_eq!(watch.verdict(t0 + s(39)), None);
        assert_eq!(watch.verdict(t0 + s(40)), Some(Action::Cut(vec![stalled])));
        assert_eq!(watch.verdict(t0 + s(40)), None, "cut once");
        // The moving answer then stalls too: the connection's bank, full at 40 s, runs out.
        watch.handed(moving, t0 + s(40));
        assert_eq!(watch.verdict(t0 + s(69)), None);
        assert_eq!(watch.verdict(t0 + s(70)), Some(Action::Drop(Close::Slow)));
    }

    #[test]
    fn a_cut_answer_keeps_its_connection_waiting_until_its_request_ends() {
        let t0 = Instant::now();
        let (mut watch, moving) = cut_at_30_s(t0);
        // The other answer ends: what is left of it on its way out pays back as it goes.
        watch.end(moving, t0 + s(31));
        watch.took(t0 + s(32), 5000);
        // The bank: full (30 s) at 20 s; 10 s drawn by 30 s, 2 more by 32 s, 5 paid back: 23.
        assert_eq!(watch.arm(), Some(t0 + s(55)), "the bank, not an idle deadline");
        assert_eq!(watch.verdict(t0 + s(54)), None);
        assert_eq!(watch.verdict(t0 + s(55)), Some(Action::Drop(Close::Slow)));
        // Had the cut request ended (the client reset its stream), the connection would idle.
        let mut watch = self::watch(t0);
        let stalled = watch.begin();
        watch.handed(stalled, t0);
        watch.took(t0 + s(20), 20_000);
        watch.verdict(t0 + s(30));
        watch.end(stalled, t0 + s(31));
        assert_eq!(watch.arm(), Some(t0 + s(41)));
    }

    #[test]
    fn a_socket_kept_full_does_not_keep_an_answer_uncut_and_a_cut_stream_left_open_drops_it() {
        let t0 = Instant::now();
        let (mut watch, stalled, moving) = stalled_and_moving(t0);
        watch.blocked(t0);
        // The socket stays full, taking 1,000 bytes a second of the other answer: the bank stays
        // full, and the stalled answer's own clock is paused, but not for more than 10 allowances.
        for second in 1..300u64 {
            socket_takes(&mut watch, t0 + s(second), 1000);
            assert_eq!(watch.verdict(t0 + s(second)), None, "at {second} s");
        }
        assert_eq!(watch.arm(), Some(t0 + s(300)));
        assert_eq!(watch.verdict(t0 + s(300)), Some(Action::Cut(vec![stalled])));
        // The cut stream stays open (no credit, no reset), the bank kept full (by pings'
        // answers, say), after the other answer ends at 310 s.
        watch.end(moving, t0 + s(310));
        for second in 311..340u64 {
            socket_takes(&mut watch, t0 + s(second), 1000);
            assert_eq!(watch.verdict(t0 + s(second)), None, "at {second} s");
        }
        assert_eq!(watch.arm(), Some(t0 + s(340)));
        assert_eq!(watch.verdict(t0 + s(340)), Some(Action::Drop(Close::Slow)), "an allowance after");
    }

    #[test]
    fn a_cut_stream_left_open_drops_the_connection_though_requests_keep_coming() {
        let t0 = Instant::now();
        let (mut watch, _moving) = cut_at_30_s(t0);
        // A client that ignores the GOAWAY starts and ends a request every 20 s, and keeps
        // the bank full.
        for second in (31..330u64).step_by(20) {
            let key = watch.begin();
            watch.took(t0 + s(second), 30_000);
            watch.end(key, t0 + s(second + 1));
            assert_eq!(watch.verdict(t0 + s(second + 1)), None, "at {second} s");
        }
        assert_eq!(watch.arm(), Some(t0 + s(330)), "ten allowances after the cut");
        assert_eq!(watch.verdict(t0 + s(330)), Some(Action::Drop(Close::Slow)));
    }

    #[test]
    fn an_ended_request_takes_its_wait_with_it() {
        let t0 = Instant::now();
        let mut watch = watch(t0);
        let key = watch.begin();
        watch.handed(key, t0);
        watch.end(key, t0 + s(5));
        assert_eq!(watch.arm(), Some(t0 + s(15)), "idle, nothing waiting");
        assert_eq!(watch.verdict(t0 + s(14)), None);
    }

    #[test]
    fn deadlines_past_what_an_instant_holds_do_not_panic() {
        let t0 = Instant::now();
        let forever = MinRate { bytes_per_s: 0, allowance: Duration::MAX };
        let mut watch = Watch::new(t0, Duration::MAX, forever);
        let key = watch.begin();
        watch.handed(key, t0);
        watch.blocked(t0);
        assert!(watch.arm().is_some());
        assert_eq!(watch.verdict(t0 + s(1)), None);
        watch.end(key, t0 + s(1));
        watch.unblocked(t0 + s(1));
        watch.took(t0 + s(1), 1);
        assert!(watch.arm().is_some());
    }
}
