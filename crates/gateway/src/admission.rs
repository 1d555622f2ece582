//! Admission: how many connections may be waiting for their Hello, in all and from one
//! address, how many one address may hold open at all, logged in or not, and how many sessions
//! may live, in all and opened from one address, connected or waiting to resume. A connection
//! past any budget is closed at once with `OVERLOADED`, so sockets opened and left silent (up
//! to the auth timeout each) cannot take every file descriptor and starve the clients that do
//! log in, one address cannot hold every connection slot, and a client that logs in and drops
//! its link in a loop cannot pile up sessions (each waits `session.resume_window` for a
//! resume, holding its memory and its subscriptions). An address is a
//! [`ClientAddress`]: an IPv6 client counts with its whole block (`limits.ipv6_prefix`, a /64
//! by default). When every place for a connection waiting for its Hello is taken, a new one
//! (from an address under its own caps) takes the place of the one that has waited longest, if
//! that one has waited a quarter of the auth timeout, which is told to go
//! ([`Pending::evicted`]): a client that logs in needs a round trip or two, a socket held open
//! silently waits until its auth timeout, so under a flood of silent sockets the ones that go
//! are theirs, and clients still get in; under a storm of clients that all log in, the newest
//! are refused, as they were before, rather than every handshake cut short by the next.
//! Counting only: the caller gives the time, and nothing here touches a socket.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tickwire_transport::{AddressCounts, ClientAddress};
use tokio_util::sync::CancellationToken;

use crate::config::LimitsConfig;

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    #[error("{0} connections are already waiting to log in (limits.max_pending_handshakes)")]
    Total(usize),
    #[error("{1} connections from {0} are already waiting to log in (limits.max_pending_per_ip)")]
    PerIp(ClientAddress, usize),
    #[error("{1} connections from {0} are already open (limits.max_connections_per_ip)")]
    Open(ClientAddress, usize),
    #[error("{0} sessions are already open, connected or not (limits.max_sessions)")]
    Sessions(usize),
    #[error("{1} sessions opened from {0} are still open, connected or not (limits.max_sessions_per_ip)")]
    SessionsPerIp(ClientAddress, usize),
}

#[derive(Debug, Default)]
struct Counts {
    /// Connections waiting for their Hello, those told to go included until they have.
    total: usize,
    /// Those not told to go, oldest first (by admission number), each with when it came and
    /// what tells it to go.
    waiting: BTreeMap<u64, (Instant, CancellationToken)>,
    /// Those told to go that have not yet.
    evicted: usize,
    next: u64,
    per_ip: AddressCounts,
    /// Open connections per address, logged in or not.
    open: AddressCounts,
    /// Live sessions, in all and by the address each was opened from.
    sessions: usize,
    sessions_per_ip: AddressCounts,
}

/// The connection and session budgets of one gateway process.
#[derive(Debug)]
pub(crate) struct Admission {
    max_total: usize,
    max_per_ip: usize,
    max_open_per_ip: usize,
    max_sessions: usize,
    max_sessions_per_ip: usize,
    /// How long a connection waits for its Hello before a newer one may take its place.
    evictable_after: Duration,
    /// What one address is for an IPv6 client: its first this many bits.
    ipv6_prefix: u8,
    counts: Mutex<Counts>,
}

/// A connection's place among its address's open connections, held for as long as the
/// connection lives: it travels with the connection into its session.
#[derive(Debug)]
pub(crate) struct Open {
    admission: Arc<Admission>,
    ip: ClientAddress,
}

/// A session's place among the live sessions and those opened from its address, held for as
/// long as the session lives, connected or not: by the registry, which holds every live session.
#[derive(Debug)]
pub(crate) struct SessionPlace {
    admission: Arc<Admission>,
    ip: ClientAddress,
}

/// A connection's place in the budget, held until its handshake ends (logged in or not).
#[derive(Debug)]
pub(crate) struct Pending {
    admission: Arc<Admission>,
    ip: ClientAddress,
    /// Its admission number, and what tells it to go.
    number: u64,
    evict: CancellationToken,
}

impl Pending {
    /// Completes when a newer connection has taken this one's place (the budget was full and
    /// this one had waited longest): its handshake should end.
    pub(crate) fn evicted(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.evict.clone().cancelled_owned()
    }
}

impl Admission {
    pub(crate) fn new(limits: &LimitsConfig) -> Arc<Admission> {
        Arc::new(Admission {
            max_total: limits.max_pending_handshakes,
            max_per_ip: limits.max_pending_per_ip,
            max_open_per_ip: limits.max_connections_per_ip,
            max_sessions: limits.max_sessions,
            max_sessions_per_ip: limits.max_sessions_per_ip,
            evictable_after: limits.auth_timeout / 4,
            ipv6_prefix: limits.ipv6_prefix,
            counts: Mutex::new(Counts::default()),
        })
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a place for a new connection from `ip` (among those waiting to log in, and among
    /// its address's open ones), or says why there is none.
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr, now: Instant) -> Result<(Pending, Open), Refused> {
        let ip = ClientAddress::of(ip, self.ipv6_prefix);
        let mut counts = self.counts();
        let from_ip = counts.per_ip.get(&ip);
        if from_ip >= self.max_per_ip {
            return Err(Refused::PerIp(ip, from_ip));
        }
        let open = counts.open.get(&ip);
        if open >= self.max_open_per_ip {
            return Err(Refused::Open(ip, open));
        }
        if counts.total - counts.evicted >= self.max_total {
            // The longest waiting goes, if it has waited long enough; it is still counted
            // until it has gone, so the budget is passed by at most the connections told to go
            // and not gone yet.
            let waited = |(&number, (since, _)): (&u64, &(Instant, CancellationToken))| {
                (now.saturating_duration_since(*since) >= self.evictable_after).then_some(number)
            };
            let Some(oldest) = counts.waiting.first_key_value().and_then(waited) else {
                return Err(Refused::Total(counts.total));
            };
            if let Some((_, evict)) = counts.waiting.remove(&oldest) {
                evict.cancel();
            }
            counts.evicted += 1;
        }
        counts.per_ip.add(ip);
        counts.open.add(ip);
        counts.total += 1;
        let number = counts.next;
        counts.next += 1;
        let evict = CancellationToken::new();
        counts.waiting.insert(number, (now, evict.clone()));
        let pending = Pending { admission: self.clone(), ip, number, evict };
        Ok((pending, Open { admission: self.clone(), ip }))
    }

    /// Takes a place among `ip`'s open connections only: for a connection another worker
    /// process handed over after its handshake started there.
    pub(crate) fn open(self: &Arc<Self>, ip: IpAddr) -> Result<Open, Refused> {
        let ip = ClientAddress::of(ip, self.ipv6_prefix);
        let mut counts = self.counts();
        let open = counts.open.get(&ip);
        if open >= self.max_open_per_ip {
            return Err(Refused::Open(ip, open));
        }
        counts.open.add(ip);
        Ok(Open { admission: self.clone(), ip })
    }

    /// Open connections from `ip` now.
    #[cfg(test)]
    fn open_from(&self, ip: IpAddr) -> usize {
        self.counts().open.get(&ClientAddress::of(ip, self.ipv6_prefix))
    }

    /// Connections waiting for their Hello now.
    #[cfg(test)]
    fn pending(&self) -> usize {
        self.counts().total
    }
}

impl Open {
    /// Takes a place for a new session opened on this connection, among all live sessions and
    /// those opened from its address, or says why there is none.
    pub(crate) fn session(&self) -> Result<SessionPlace, Refused> {
        let admission = &self.admission;
        let mut counts = admission.counts();
        if counts.sessions >= admission.max_sessions {
            return Err(Refused::Sessions(counts.sessions));
        }
        let from_ip = counts.sessions_per_ip.get(&self.ip);
        if from_ip >= admission.max_sessions_per_ip {
            return Err(Refused::SessionsPerIp(self.ip, from_ip));
        }
        counts.sessions += 1;
        counts.sessions_per_ip.add(self.ip);
        Ok(SessionPlace { admission: admission.clone(), ip: self.ip })
    }
}

impl Drop for SessionPlace {
    fn drop(&mut self) {
        let mut counts = self.admission.counts();
        counts.sessions -= 1;
        counts.sessions_per_ip.remove(&self.ip);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut counts = self.admission.counts();
        counts.total -= 1;
        counts.per_ip.remove(&self.ip);
        if counts.waiting.remove(&self.number).is_none() {
            counts.evicted -= 1;
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.admission.counts().open.remove(&self.ip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The instant the tests admit at, unless they say otherwise.
    fn t0() -> Instant {
        static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *T0.get_or_init(Instant::now)
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    /// Admission with these connection budgets and room for 1,000 sessions.
    fn budgets(pending: usize, pending_per_ip: usize, open_per_ip: usize, ipv6_prefix: u8) -> Arc<Admission> {
        Admission::new(&LimitsConfig {
            max_pending_handshakes: pending,
            max_pending_per_ip: pending_per_ip,
            max_connections_per_ip: open_per_ip,
            ipv6_prefix,
            max_sessions: 1_000,
            max_sessions_per_ip: 1_000,
            ..LimitsConfig::default()
        })
    }

    /// `ip(last)` as the limits count it.
    fn key(last: u8) -> ClientAddress {
        ClientAddress::of(ip(last), 64)
    }

    /// Whether `pending` has been told to go.
    fn is_evicted(pending: &Pending) -> bool {
        pending.evict.is_cancelled()
    }

    #[test]
    fn budgets_hold_per_address_and_in_all_and_free_on_drop() {
        let a = budgets(3, 2, 100, 64);
        let first = a.admit(ip(1), t0()).unwrap();
        let _second = a.admit(ip(1), t0()).unwrap();
        assert_eq!(a.admit(ip(1), t0()).unwrap_err(), Refused::PerIp(key(1), 2));
        let _other = a.admit(ip(2), t0()).unwrap();
        drop(first);
        assert_eq!(a.pending(), 2);
        let _again = a.admit(ip(1), t0()).unwrap();
        assert_eq!(a.admit(ip(1), t0()).unwrap_err(), Refused::PerIp(key(1), 2), "its own cap first");
    }

    /// With every place taken, a new connection takes the place of the one that has waited
    /// longest if it has waited a quarter of the auth timeout (5 s by default), which is told
    /// to go; the told are counted until they have gone. Sooner, the newcomer is refused.
    #[test]
    fn a_full_budget_tells_the_longest_waiting_to_go() {
        let a = budgets(3, 3, 100, 64);
        let later = |ms: u64| t0() + Duration::from_millis(ms);
        let (oldest, _) = a.admit(ip(1), t0()).unwrap();
        let (middle, _) = a.admit(ip(2), later(100)).unwrap();
        let (newest, _) = a.admit(ip(2), later(200)).unwrap();
        assert_eq!(a.admit(ip(3), later(1_000)).unwrap_err(), Refused::Total(3), "none has waited 1.25 s");
        let (fourth, _) = a.admit(ip(3), later(1_250)).unwrap();
        assert!(is_evicted(&oldest) && !is_evicted(&middle) && !is_evicted(&newest) && !is_evicted(&fourth));
        assert_eq!(a.pending(), 4, "the one told is counted until it has gone");
        let (fifth, _) = a.admit(ip(4), later(1_400)).unwrap();
        assert!(is_evicted(&middle) && !is_evicted(&newest), "then the next oldest");
        drop(oldest);
        drop(middle);
        assert_eq!(a.pending(), 3);
        assert_eq!(a.counts().evicted, 0);
        let (sixth, _) = a.admit(ip(5), later(1_500)).unwrap();
        assert!(is_evicted(&newest) && !is_evicted(&fourth) && !is_evicted(&fifth) && !is_evicted(&sixth));
        drop(newest);
        drop((fourth, fifth, sixth));
        let counts = a.counts();
        assert_eq!((counts.total, counts.waiting.len(), counts.evicted), (0, 0, 0));
    }

    #[test]
    fn an_address_with_nothing_pending_is_forgotten() {
        let a = budgets(10, 10, 10, 64);
        drop(a.admit(ip(9), t0()).unwrap());
        assert!(a.counts().per_ip.is_empty());
        assert!(a.counts().open.is_empty());
        assert_eq!(a.pending(), 0);
        // A refused address is not remembered either.
        let none = budgets(10, 0, 10, 64);
        assert_eq!(none.admit(ip(9), t0()).unwrap_err(), Refused::PerIp(key(9), 0));
        assert!(none.counts().per_ip.is_empty() && none.counts().open.is_empty());
    }

    #[test]
    fn open_connections_outlive_the_login_and_are_capped_per_address() {
        let a = budgets(10, 10, 2, 64);
        let (pending, first) = a.admit(ip(1), t0()).unwrap();
        drop(pending);
        let (_, _second) = a.admit(ip(1), t0()).unwrap();
        assert_eq!(a.open_from(ip(1)), 2, "logged in or not, both are open");
        assert_eq!(a.admit(ip(1), t0()).unwrap_err(), Refused::Open(key(1), 2));
        assert_eq!(a.open(ip(1)).unwrap_err(), Refused::Open(key(1), 2));
        assert!(a.admit(ip(2), t0()).is_ok(), "another address has its own budget");
        drop(first);
        let _handed = a.open(ip(1)).unwrap();
        assert_eq!(a.open_from(ip(1)), 2);
    }

    #[test]
    fn an_ipv6_client_counts_with_its_whole_block() {
        let v6 = |s: &str| s.parse::<IpAddr>().unwrap();
        let a = budgets(10, 10, 2, 64);
        let _first = a.admit(v6("2001:db8::1"), t0()).unwrap();
        let _second = a.admit(v6("2001:db8::abcd:2"), t0()).unwrap();
        let refused = a.admit(v6("2001:db8::3"), t0()).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "2 connections from 2001:db8::/64 are already open (limits.max_connections_per_ip)"
        );
        assert!(a.admit(v6("2001:db8:0:1::1"), t0()).is_ok(), "the next /64");
        let _mapped = a.admit(v6("::ffff:127.0.0.1"), t0()).unwrap();
        assert_eq!(a.open_from(ip(1)), 1, "an IPv4 address mapped into IPv6 is that address");
        // With 128, each address on its own.
        let apart = budgets(10, 10, 1, 128);
        let _one = apart.admit(v6("2001:db8::1"), t0()).unwrap();
        assert!(apart.admit(v6("2001:db8::2"), t0()).is_ok());
    }

    #[test]
    fn sessions_are_capped_in_all_and_per_address_connected_or_not() {
        let a = Admission::new(&LimitsConfig {
            max_sessions: 3,
            max_sessions_per_ip: 2,
            ..LimitsConfig::default()
        });
        let (pending, open) = a.admit(ip(1), t0()).unwrap();
        let first = open.session().unwrap();
        // The connection goes (the session waits for a resume): its session keeps its place.
        drop((pending, open));
        let (_, open) = a.admit(ip(1), t0()).unwrap();
        let _second = open.session().unwrap();
        assert_eq!(open.session().unwrap_err(), Refused::SessionsPerIp(key(1), 2));
        let (_, other) = a.admit(ip(2), t0()).unwrap();
        let _third = other.session().unwrap();
        assert_eq!(other.session().unwrap_err(), Refused::Sessions(3));
        drop(first);
        let again = open.session().unwrap();
        assert_eq!(a.counts().sessions, 3);
        drop((again, _second, _third));
        assert_eq!(a.counts().sessions, 0);
        assert!(a.counts().sessions_per_ip.is_empty(), "an address with no session is forgotten");
    }
}
