//! The channel registry: every channel's inbox, type, name and owner, and what each session
//! owns and is subscribed to. Shared by the router and the channel actors (an orphaned channel
//! removes itself) behind one mutex that no one holds across an await.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tickwire_wire::proto::ChannelType;
use tokio::sync::mpsc;

use super::actor::Msg;

pub(super) struct Entry {
    /// From `CreateChannel.name`, for `channel.list`.
    pub name: Arc<str>,
    pub inbox: mpsc::Sender<Msg>,
    pub ty: ChannelType,
    pub owner: Option<u64>,
}

#[derive(Default)]
pub(super) struct Member {
    pub owned: HashSet<u64>,
    /// Its places in its quota of subscriptions (`channels.max_subscriptions_per_session`),
    /// by channel.
    pub subscribed: HashMap<u64, Place>,
}

/// A session's place in its quota of subscriptions, for one channel. Taken when a subscribe is
/// queued for the channel's actor, given back only when the actor has handled every subscribe
/// queued and does not hold the session as a subscriber: a subscribe the actor refuses (a bad
/// field filter, a full channel) gives it back, and a refused one beside an accepted one to the
/// same channel does not.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Place {
    /// Subscribes queued for the channel's actor that it has not handled yet.
    pub pending: u32,
    /// The actor holds the session as a subscriber, as of the last subscribe or unsubscribe it
    /// handled.
    pub active: bool,
}

#[derive(Default)]
pub(super) struct Registry {
    pub channels: HashMap<u64, Entry>,
    pub members: HashMap<u64, Member>,
    /// The owner of the global channel.
    pub master: Option<u64>,
    pub global: Option<u64>,
}

impl Registry {
    /// The actor of `channel_id` has handled a subscribe (`subscribe`) or an unsubscribe of
    /// session `conn`, and holds it as a subscriber now or not (`active`).
    pub fn handled(&mut self, conn: u64, channel_id: u64, subscribe: bool, active: bool) {
        let Some(member) = self.members.get_mut(&conn) else { return };
        let Some(place) = member.subscribed.get_mut(&channel_id) else { return };
        if subscribe {
            place.pending = place.pending.saturating_sub(1);
        }
        place.active = active;
        if place.pending == 0 && !place.active {
            member.subscribed.remove(&channel_id);
        }
    }

    /// Drops a channel and the bookkeeping that names it (its owner's set, the global slot).
    pub fn forget(&mut self, channel_id: u64) -> Option<Entry> {
        let entry = self.channels.remove(&channel_id)?;
        if self.global == Some(channel_id) {
            self.global = None;
            self.master = None;
        }
        if let Some(owner) = entry.owner.and_then(|o| self.members.get_mut(&o)) {
            owner.owned.remove(&channel_id);
        }
        Some(entry)
    }
}

/// The registry, shared with the channel actors (an orphaned channel removes itself).
pub(super) type SharedRegistry = Arc<Mutex<Registry>>;

pub(super) fn lock(registry: &Mutex<Registry>) -> std::sync::MutexGuard<'_, Registry> {
    // A panic while holding the lock cannot leave the maps half-updated in a way that matters
    // more than stopping every channel call would; keep serving.
    registry.lock().unwrap_or_else(|e| e.into_inner())
}
