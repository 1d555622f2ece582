//! Process-wide counters the gateway keeps with relaxed atomics: the hot path only increments
//! them; the bench, the tests and the Prometheus endpoint (`metrics.rs`) read them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use tickwire_wire::proto::CloseReason;

/// Close reasons are counted by their protobuf number, 0 to this bound.
pub(crate) const CLOSE_REASONS: usize = 14;

/// Live counters of one gateway.
#[derive(Debug, Default)]
pub struct Stats {
    pub(crate) connections_open: AtomicU64,
    pub(crate) sessions_open: AtomicU64,
    pub(crate) sessions_resumed: AtomicU64,
    pub(crate) messages_in: AtomicU64,
    pub(crate) messages_out: AtomicU64,
    pub(crate) bytes_in: AtomicU64,
    pub(crate) bytes_out: AtomicU64,
    pub(crate) connections_rejected: AtomicU64,
    pub(crate) handoffs_received: AtomicU64,
    /// Closes sent (session ends and rejected handshakes), by reason.
    pub(crate) closes: [AtomicU64; CLOSE_REASONS],
    /// Connections lost without a Close (the session waits for a resume).
    pub(crate) drops: AtomicU64,
}

/// A copy of [`Stats`] at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub connections_open: u64,
    pub sessions_open: u64,
    pub sessions_resumed: u64,
    pub messages_in: u64,
    pub messages_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub connections_rejected: u64,
    /// Resumes passed to this worker process by another one.
    pub handoffs_received: u64,
    /// Closes sent, indexed by `CloseReason as usize`.
    pub closes: [u64; CLOSE_REASONS],
    /// Connections lost without a Close.
    pub drops: u64,
}

impl StatsSnapshot {
    /// Closes sent with `reason`.
    pub fn closes(&self, reason: CloseReason) -> u64 {
        self.closes.get(reason as usize).copied().unwrap_or(0)
    }
}

impl Stats {
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            connections_open: self.connections_open.load(Relaxed),
            sessions_open: self.sessions_open.load(Relaxed),
            sessions_resumed: self.sessions_resumed.load(Relaxed),
            messages_in: self.messages_in.load(Relaxed),
            messages_out: self.messages_out.load(Relaxed),
            bytes_in: self.bytes_in.load(Relaxed),
            bytes_out: self.bytes_out.load(Relaxed),
            connections_rejected: self.connections_rejected.load(Relaxed),
            handoffs_received: self.handoffs_received.load(Relaxed),
            closes: std::array::from_fn(|i| self.closes[i].load(Relaxed)),
            drops: self.drops.load(Relaxed),
        }
    }

    pub(crate) fn closed(&self, reason: CloseReason) {
        if let Some(c) = self.closes.get(reason as usize) {
            c.fetch_add(1, Relaxed);
        }
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    pub(crate) fn sub(counter: &AtomicU64, n: u64) {
        counter.fetch_sub(n, Relaxed);
    }
}
