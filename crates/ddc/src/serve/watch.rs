//! When a connection is closed for what its client does not do. hyper closes an HTTP/1.1
//! connection that is slow to send a request's headers, but not one whose client stops
//! reading the answer, and it has no idle deadline for HTTP/2 at all: a client that answers
//! keep-alive pings holds an HTTP/2 connection for good. Each would let a few clients hold
//! every connection slot. So each connection has a [`Watch`]:
//! - **idle**: with no request in flight for the idle timeout (from its opening, or from its
//!   last answer), the connection is shut down gracefully (HTTP/2 GOAWAY, HTTP/1.1 close);
//!   still open an idle timeout later (its client not taking the last bytes), it is dropped;
//! - **slow**: a response whose client takes its bytes slower than the minimum rate for longer
//!   than the send allowance ([`crate::pace`], one bank per response) drops the connection.
//!
//! Sans-IO: every method takes `now`; the connection's task in `serve/mod.rs` sleeps until
//! [`Watch::arm`] says and asks [`Watch::verdict`], and `serve/paced.rs` reports each request
//! and its waits.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// Why a connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Close {
    /// No request in flight for the idle timeout.
    Idle,
    /// A response's client ran out of its allowance.
    Slow,
}

/// One connection's requests in flight and their responses' waits on the client.
#[derive(Debug)]
pub(crate) struct Watch {
    idle_timeout: Duration,
    in_flight: usize,
    /// When the connection opened or its last request ended; the idle timeout runs from here
    /// while no request is in flight.
    idle_since: Instant,
    /// The responses waiting on their client now, by request: when each wait runs out.
    waits: HashMap<u64, Instant>,
    next_key: u64,
    /// The check the connection's task sleeps until.
    armed: Option<Instant>,
}

impl Watch {
    /// A connection opened at `now`.
    pub fn new(now: Instant, idle_timeout: Duration) -> Watch {
        Watch { idle_timeout, in_flight: 0, idle_since: now, waits: HashMap::new(), next_key: 0, armed: None }
    }

    /// A request starts: its key.
    pub fn begin(&mut self) -> u64 {
        self.in_flight += 1;
        self.next_key += 1;
        self.next_key
    }

    /// Request `key` ended at `now` (its answer sent, or dropped). Whether the connection's
    /// task must wake to re-arm.
    pub fn end(&mut self, key: u64, now: Instant) -> bool {
        self.waits.remove(&key);
        self.in_flight = self.in_flight.saturating_sub(1);
        if self.in_flight == 0 {
            self.idle_since = now;
        }
        self.wakes()
    }

    /// Request `key`'s answer waits on the client until `until`, or (`None`) no longer waits.
    /// Whether the connection's task must wake to re-arm.
    pub fn waiting(&mut self, key: u64, until: Option<Instant>) -> bool {
        match until {
            Some(until) => self.waits.insert(key, until),
            None => self.waits.remove(&key),
        };
        self.wakes()
    }

    /// When the next check is due: the earliest wait's end, or the idle deadline if no request
    /// is in flight.
    fn next(&self) -> Option<Instant> {
        let idle = (self.in_flight == 0).then(|| self.idle_since + self.idle_timeout);
        self.waits.values().copied().chain(idle).min()
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

    /// Whether the connection must close at `now`, and why.
    pub fn verdict(&self, now: Instant) -> Option<Close> {
        if self.waits.values().any(|until| *until <= now) {
            return Some(Close::Slow);
        }
        (self.in_flight == 0 && now >= self.idle_since + self.idle_timeout).then_some(Close::Idle)
    }

    /// The connection was shut down gracefully at `now`: the idle timeout runs again, and its
    /// next expiry drops the connection.
    pub fn shut_down(&mut self, now: Instant) {
        self.idle_since = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Duration = Duration::from_secs(10);

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn a_connection_with_no_request_is_idle_from_its_opening() {
        let t0 = Instant::now();
        let mut watch = Watch::new(t0, IDLE);
        assert_eq!(watch.arm(), Some(t0 + IDLE));
        assert_eq!(watch.verdict(t0 + s(9)), None);
        assert_eq!(watch.verdict(t0 + IDLE), Some(Close::Idle));
    }

    #[test]
    fn a_request_in_flight_keeps_it_open_however_long_and_its_end_restarts_the_idle_time() {
        let t0 = Instant::now();
        let mut watch = Watch::new(t0, IDLE);
        watch.arm();
        let first = watch.begin();
        let second = watch.begin();
        assert_eq!(watch.arm(), None, "nothing to check while requests run and wait on nobody");
        assert_eq!(watch.verdict(t0 + s(3600)), None);
        assert!(!watch.end(first, t0 + s(3600)), "one still in flight: nothing to arm");
        assert_eq!(watch.verdict(t0 + s(3601)), None);
        assert!(watch.end(second, t0 + s(3700)), "idle now: the task must arm");
        assert_eq!(watch.arm(), Some(t0 + s(3710)));
        assert_eq!(watch.verdict(t0 + s(3709)), None);
        assert_eq!(watch.verdict(t0 + s(3710)), Some(Close::Idle));
    }

    #[test]
    fn a_response_past_its_wait_closes_it_and_the_earliest_wait_is_armed() {
        let t0 = Instant::now();
        let mut watch = Watch::new(t0, IDLE);
        watch.arm();
        let a = watch.begin();
        let b = watch.begin();
        assert!(!watch.waiting(a, Some(t0 + s(30))), "the idle check armed comes first");
        assert_eq!(watch.arm(), Some(t0 + s(30)), "the task found no verdict then and re-armed");
        assert!(!watch.waiting(a, None));
        assert_eq!(watch.arm(), None);
        assert!(watch.waiting(a, Some(t0 + s(30))), "with nothing armed, the first wait wakes");
        assert_eq!(watch.arm(), Some(t0 + s(30)));
        assert!(!watch.waiting(b, Some(t0 + s(40))), "a later one need not wake the task");
        assert!(watch.waiting(b, Some(t0 + s(20))), "an earlier one must");
        assert_eq!(watch.arm(), Some(t0 + s(20)));
        assert_eq!(watch.verdict(t0 + s(19)), None);
        assert!(!watch.waiting(b, None), "b's client moved");
        assert_eq!(watch.verdict(t0 + s(29)), None);
        assert_eq!(watch.verdict(t0 + s(30)), Some(Close::Slow), "a's did not");
        watch.end(a, t0 + s(25));
        watch.end(b, t0 + s(25));
        assert_eq!(watch.verdict(t0 + s(34)), None, "an ended request's wait goes with it");
    }

    #[test]
    fn a_graceful_shutdown_gets_one_more_idle_timeout() {
        let t0 = Instant::now();
        let mut watch = Watch::new(t0, IDLE);
        assert_eq!(watch.verdict(t0 + IDLE), Some(Close::Idle));
        watch.shut_down(t0 + IDLE);
        assert_eq!(watch.arm(), Some(t0 + IDLE + IDLE));
        assert_eq!(watch.verdict(t0 + IDLE + s(5)), None);
        assert_eq!(watch.verdict(t0 + IDLE + IDLE), Some(Close::Idle));
    }
}
