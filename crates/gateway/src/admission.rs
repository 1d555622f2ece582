//! Admission before login: how many connections may be waiting for their Hello, in all and
//! from one address. A connection past either budget is closed at once with `OVERLOADED`, so
//! sockets opened and left silent (up to the auth timeout each) cannot take every file
//! descriptor and starve the clients that do log in. Counting only: nothing here reads a clock
//! or touches a socket.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    #[error("{0} connections are already waiting to log in (limits.max_pending_handshakes)")]
    Total(usize),
    #[error("{1} connections from {0} are already waiting to log in (limits.max_pending_per_ip)")]
    PerIp(IpAddr, usize),
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_ip: HashMap<IpAddr, usize>,
}

/// The pre-login budget of one gateway process.
#[derive(Debug)]
pub(crate) struct Admission {
    max_total: usize,
    max_per_ip: usize,
    counts: Mutex<Counts>,
}

/// A connection's place in the budget, held until its handshake ends (logged in or not).
#[derive(Debug)]
pub(crate) struct Pending {
    admission: Arc<Admission>,
    ip: IpAddr,
}

impl Admission {
    pub(crate) fn new(max_total: usize, max_per_ip: usize) -> Arc<Admission> {
        Arc::new(Admission { max_total, max_per_ip, counts: Mutex::new(Counts::default()) })
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a place for a new connection from `ip`, or says why there is none.
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Pending, Refused> {
        let mut counts = self.counts();
        if counts.total >= self.max_total {
            return Err(Refused::Total(counts.total));
        }
        // Looked up, not inserted: a refused address leaves nothing behind in the map.
        let from_ip = counts.per_ip.get(&ip).copied().unwrap_or(0);
        if from_ip >= self.max_per_ip {
            return Err(Refused::PerIp(ip, from_ip));
        }
        *counts.per_ip.entry(ip).or_insert(0) += 1;
        counts.total += 1;
        Ok(Pending { admission: self.clone(), ip })
    }

    /// Connections waiting for their Hello now.
    #[cfg(test)]
    fn pending(&self) -> usize {
        self.counts().total
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut counts = self.admission.counts();
        counts.total -= 1;
        if let Some(n) = counts.per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.per_ip.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn budgets_hold_per_address_and_in_all_and_free_on_drop() {
        let a = Admission::new(3, 2);
        let first = a.admit(ip(1)).unwrap();
        let _second = a.admit(ip(1)).unwrap();
        assert_eq!(a.admit(ip(1)).unwrap_err(), Refused::PerIp(ip(1), 2));
        let _other = a.admit(ip(2)).unwrap();
        assert_eq!(a.admit(ip(3)).unwrap_err(), Refused::Total(3));
        drop(first);
        assert_eq!(a.pending(), 2);
        let _again = a.admit(ip(1)).unwrap();
        assert!(a.admit(ip(3)).is_err(), "full again");
    }

    #[test]
    fn an_address_with_nothing_pending_is_forgotten() {
        let a = Admission::new(10, 10);
        drop(a.admit(ip(9)).unwrap());
        assert!(a.counts().per_ip.is_empty());
        assert_eq!(a.pending(), 0);
        // A refused address is not remembered either.
        let none = Admission::new(10, 0);
        assert_eq!(none.admit(ip(9)).unwrap_err(), Refused::PerIp(ip(9), 0));
        assert!(none.counts().per_ip.is_empty());
    }
}
