//! Live sessions by id, so a resuming connection can find its session's task.
//!
//! The task itself holds the session, attached or not; the registry only holds the resume
//! token and a way to hand the task a new connection. Sharded so that handshakes on different
//! threads rarely meet on one lock.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::BytesMut;
use tickwire_session::{ResumeToken, SessionId};
use tickwire_transport::Conn;
use tokio::sync::mpsc;

use crate::admission::SessionPlace;

const SHARDS: usize = 64;

/// A new connection for an existing session, with what the client said in its Hello.
#[derive(Debug)]
pub(crate) struct Takeover {
    pub(crate) conn: Conn,
    /// Its place in its address's budget of open connections.
    pub(crate) open: crate::admission::Open,
    /// Bytes that arrived after the Hello.
    pub(crate) buf: BytesMut,
    pub(crate) last_received: u64,
}

/// Hands a session's task its new connections. Boxed: a channel allocates its first block of
/// 32 slots up front, and a slot the size of a [`Takeover`] would cost every session about
/// 3 KiB for an event most sessions never see.
pub(crate) type Takeovers = mpsc::Sender<Box<Takeover>>;

struct Entry {
    token: ResumeToken,
    takeover: Takeovers,
    /// The session's place in the session budgets (none for a game server), given back when
    /// it is removed.
    _place: Option<SessionPlace>,
}

/// Why a resume was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ResumeError {
    #[error("no such session (it may have expired)")]
    Unknown,
    #[error("resume token does not match")]
    BadToken,
    #[error("the session is already being resumed")]
    Busy,
}

pub(crate) struct Registry {
    shards: Box<[Mutex<HashMap<SessionId, Entry>>]>,
}

impl Registry {
    pub(crate) fn new() -> Registry {
        Registry { shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect() }
    }

    fn shard(&self, id: &SessionId) -> &Mutex<HashMap<SessionId, Entry>> {
        // Not the first byte: with `--processes`, it names the worker that owns the session
        // (`WorkerSet::stamp`), the same for every session of this process.
        &self.shards[id.0[1] as usize % SHARDS]
    }

    pub(crate) fn insert(
        &self,
        id: SessionId,
        token: ResumeToken,
        takeover: Takeovers,
        place: Option<SessionPlace>,
    ) {
        let entry = Entry { token, takeover, _place: place };
        self.shard(&id).lock().expect("registry lock").insert(id, entry);
    }

    pub(crate) fn remove(&self, id: &SessionId) {
        self.shard(id).lock().expect("registry lock").remove(id);
    }

    /// Hands `takeover` to the session's task if the token matches.
    pub(crate) fn resume(
        &self,
        id: &SessionId,
        token: &[u8],
        takeover: Takeover,
    ) -> Result<(), (ResumeError, Takeover)> {
        let shard = self.shard(id).lock().expect("registry lock");
        let Some(entry) = shard.get(id) else { return Err((ResumeError::Unknown, takeover)) };
        if !entry.token.verify(token) {
            return Err((ResumeError::BadToken, takeover));
        }
        entry.takeover.try_send(Box::new(takeover)).map_err(|e| match e {
            mpsc::error::TrySendError::Full(t) => (ResumeError::Busy, *t),
            mpsc::error::TrySendError::Closed(t) => (ResumeError::Unknown, *t),
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().expect("registry lock").len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One worker of `--processes` stamps the same first byte on every id it makes
    /// (`WorkerSet::stamp`): its sessions still spread over every shard.
    #[test]
    fn the_sessions_of_one_worker_spread_over_the_shards() {
        let registry = Registry::new();
        let (takeover, _rx) = mpsc::channel(1);
        for i in 0..SHARDS * 4 {
            let mut id = SessionId([0; 16]);
            id.0[0] = 3;
            id.0[1..9].copy_from_slice(&(i as u64).to_le_bytes());
            registry.insert(id, ResumeToken([0; 16]), takeover.clone(), None);
        }
        let sizes: Vec<usize> = registry.shards.iter().map(|s| s.lock().unwrap().len()).collect();
        assert_eq!(sizes, vec![4; SHARDS], "four sessions in each shard");
        assert_eq!(registry.len(), SHARDS * 4);
    }
}
