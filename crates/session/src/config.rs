//! Tunables of a session, shared by both roles.

use std::time::Duration;

/// Limits and timers of one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionConfig {
    /// A client sends a HEARTBEAT after this long without sending anything.
    pub heartbeat: Duration,
    /// A connection that received nothing for this long is dead (the session lives on).
    pub read_timeout: Duration,
    /// How long a session without a connection waits to be resumed.
    pub resume_window: Duration,
    /// Most messages sent but not yet acknowledged by the peer.
    pub max_unacked_messages: usize,
    /// Most payload bytes sent but not yet acknowledged by the peer.
    pub max_unacked_bytes: usize,
    /// Send a standalone ACK once this many messages arrived without one going back...
    pub ack_every: u64,
    /// ... or once their payloads add up to this many bytes. Each must stay under the peer's
    /// bound on what it keeps unacknowledged (a client learns the server's from the Welcome:
    /// half of each, see [`SessionConfig::acking_within`]).
    pub ack_bytes: usize,
    /// ... or, for a message the application marks with [`crate::Session::ack_soon`], once it
    /// arrived this long ago. The gateway paces channel state by how fast acknowledgements of
    /// its `channel.update` pushes come back.
    pub ack_delay: Duration,
}

impl Default for SessionConfig {
    fn default() -> Self {
        let heartbeat = Duration::from_secs(3);
        SessionConfig {
            heartbeat,
            read_timeout: heartbeat * 2,
            resume_window: Duration::from_secs(30),
            max_unacked_messages: 1024,
            max_unacked_bytes: 1 << 20,
            ack_every: 16,
            ack_bytes: 1 << 19,
            ack_delay: Duration::from_millis(200),
        }
    }
}

impl SessionConfig {
    /// Acknowledges often enough for a peer that keeps at most `messages` messages and `bytes`
    /// payload bytes unacknowledged (the Welcome's `max_unacked_*`; 0, from an older server,
    /// leaves the setting as it is): at half of each, so an ACK is on its way well before the
    /// peer's buffer is full.
    pub fn acking_within(mut self, messages: u32, bytes: u32) -> Self {
        if messages > 0 {
            self.ack_every = self.ack_every.min(u64::from(messages / 2).max(1));
        }
        if bytes > 0 {
            self.ack_bytes = self.ack_bytes.min((bytes as usize / 2).max(1));
        }
        self
    }

    /// Sets the heartbeat and the read timeout that goes with it (twice the heartbeat).
    pub fn with_heartbeat(mut self, heartbeat: Duration) -> Self {
        self.heartbeat = heartbeat;
        self.read_timeout = heartbeat * 2;
        self
    }
}
