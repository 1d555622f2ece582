//! Channel settings: a preset (tick and fan-out rates) and access rules per channel type, in
//! the gateway's TOML under `[channels.<type>]`.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tickwire_fanout::WindowLimits;

/// Who may do something to a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    None,
    Owner,
    OwnerOrMaster,
    Any,
}

/// Tick and fan-out rates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Preset {
    /// 50 Hz tick and fan-out.
    Hifi,
    /// 10 Hz tick, 5 Hz fan-out.
    Lofi,
}

impl Preset {
    pub fn tick(self) -> Duration {
        match self {
            Preset::Hifi => Duration::from_millis(20),
            Preset::Lofi => Duration::from_millis(100),
        }
    }

    pub fn fanout(self) -> Duration {
        match self {
            Preset::Hifi => Duration::from_millis(20),
            Preset::Lofi => Duration::from_millis(200),
        }
    }
}

/// Settings of one channel type.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChannelTypeConfig {
    pub preset: Preset,
    /// Overrides the preset's tick.
    #[serde(with = "humantime_serde")]
    pub tick: Option<Duration>,
    /// Overrides the preset's default fan-out interval.
    #[serde(with = "humantime_serde")]
    pub fanout: Option<Duration>,
    /// Who may subscribe (themselves).
    pub subscribe: Access,
    /// Who may subscribe with write access (and so send patches besides the owner).
    pub write: Access,
    /// Who may remove the channel.
    pub remove: Access,
    /// Remove the channel when its owner's session ends, instead of keeping it (with an
    /// owner-lost event) until an owner comes back.
    pub remove_when_owner_lost: bool,
    /// Schema for channels created without one (JSON or TOML, docs/protocol.md 12.1).
    pub schema_file: Option<PathBuf>,
    /// Subscribers one channel accepts.
    pub max_subscribers: usize,
    /// Players (not only game servers) may create, claim and remove channels of this type.
    pub players_may_own: bool,
}

impl ChannelTypeConfig {
    fn new(preset: Preset, subscribe: Access, remove: Access) -> ChannelTypeConfig {
        ChannelTypeConfig {
            preset,
            tick: None,
            fanout: None,
            subscribe,
            write: Access::Owner,
            remove,
            remove_when_owner_lost: false,
            schema_file: None,
            max_subscribers: 10_000,
            players_may_own: false,
        }
    }

    pub fn tick(&self) -> Duration {
        self.tick.unwrap_or(self.preset.tick())
    }

    pub fn fanout(&self) -> Duration {
        self.fanout.unwrap_or(self.preset.fanout())
    }
}

impl Default for ChannelTypeConfig {
    fn default() -> Self {
        ChannelTypeConfig::new(Preset::Hifi, Access::Any, Access::OwnerOrMaster)
    }
}

/// `[channels]`: one table per type, and bounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChannelsConfig {
    pub global: ChannelTypeConfig,
    pub subworld: ChannelTypeConfig,
    pub private: ChannelTypeConfig,
    pub entity: ChannelTypeConfig,
    /// Channels one gateway holds.
    pub max_channels: usize,
    /// Requests queued for one channel before callers get UNAVAILABLE.
    pub inbox_capacity: usize,
    /// Channels one game server's session may own at once (RESOURCE_EXHAUSTED past it).
    pub max_owned_per_server: usize,
    /// Channels one player's session may own at once, where a type lets players own them.
    pub max_owned_per_player: usize,
    /// Channels one session may be subscribed to at once (RESOURCE_EXHAUSTED past it).
    pub max_subscriptions_per_session: usize,
    /// The largest `channel.update` patch, in bytes (RESOURCE_EXHAUSTED past it).
    pub max_patch_bytes: usize,
    /// Items one list, or entries one map, of a channel's state may hold (a patch that would
    /// grow one past it is refused whole with RESOURCE_EXHAUSTED).
    pub max_list_len: usize,
    /// About how many bytes one channel's state may hold (strings at their length, every
    /// number, key, item and entry at 8); a patch that would grow it past this is refused whole
    /// with RESOURCE_EXHAUSTED. A snapshot travels in one frame, so keep it well under
    /// `limits.max_frame_bytes` and `session.max_unacked_bytes`.
    pub max_state_bytes: usize,
    /// A channel whose owner's session ended, and that no server claims within this time, is
    /// removed (its subscribers get REMOVED).
    #[serde(with = "humantime_serde")]
    pub orphan_ttl: Duration,
    /// How much channel state one session may have in flight (docs/protocol.md 12.2).
    pub update_window: UpdateWindowConfig,
    /// Where the spatial world's per-client work of a pass runs.
    pub spatial_delivery: SpatialDelivery,
}

/// `channels.spatial_delivery`: which threads do the per-client half of the spatial world's
/// fan-out pass (checking each client's window, gathering its message, queueing it). The other
/// half, encoding each changed cell once for every client, is always the world's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpatialDelivery {
    /// The world's thread, at the end of its pass. On 2 cores the clients' p5 update rate at
    /// 3,000 was the higher in 4 of 6 paired rounds (docs/spatial-history.md, fourteenth session).
    #[default]
    World,
    /// Each session's I/O thread, from a frame the world hands over: the world's pass is about a
    /// third as long, and the per-client work is spread over the I/O threads, which also do all
    /// the sessions' reads and writes.
    IoThreads,
}

/// `[channels.update_window]`: each session's window of channel updates queued or sent and not
/// yet acknowledged. Past it, updates are held and merged into the next one.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpdateWindowConfig {
    /// The window holds what the client acknowledges in this time at its measured rate: about
    /// how old an update gets behind the others in flight.
    #[serde(with = "humantime_serde")]
    pub target: Duration,
    /// The window's floor, in bytes.
    pub min_bytes: usize,
    /// The window before the client's first acknowledgement, in bytes.
    pub initial_bytes: usize,
    /// The window's ceiling, in bytes: what one session's channel updates may hold in memory
    /// (plus one update). Must be below `session.max_unacked_bytes`.
    pub max_bytes: usize,
    /// Updates in flight at most. Must be below `session.max_unacked_messages`.
    pub max_updates: usize,
}

impl Default for UpdateWindowConfig {
    fn default() -> Self {
        let d = WindowLimits::default();
        UpdateWindowConfig {
            target: d.target,
            min_bytes: d.min_bytes,
            initial_bytes: d.initial_bytes,
            max_bytes: d.max_bytes,
            max_updates: d.max_messages,
        }
    }
}

impl UpdateWindowConfig {
    pub fn limits(&self) -> WindowLimits {
        WindowLimits {
            target: self.target,
            min_bytes: self.min_bytes,
            initial_bytes: self.initial_bytes,
            max_bytes: self.max_bytes,
            max_messages: self.max_updates,
            ..WindowLimits::default()
        }
    }
}

impl Default for ChannelsConfig {
    fn default() -> Self {
        ChannelsConfig {
            global: ChannelTypeConfig::default(),
            subworld: ChannelTypeConfig::default(),
            private: ChannelTypeConfig::new(Preset::Lofi, Access::Owner, Access::Owner),
            entity: ChannelTypeConfig::new(Preset::Hifi, Access::Any, Access::OwnerOrMaster),
            max_channels: 100_000,
            inbox_capacity: 1024,
            max_owned_per_server: 10_000,
            max_owned_per_player: 16,
            max_subscriptions_per_session: 1_000,
            max_patch_bytes: 512 * 1024,
            max_list_len: 10_000,
            max_state_bytes: 512 * 1024,
            orphan_ttl: Duration::from_secs(60),
            update_window: UpdateWindowConfig::default(),
            spatial_delivery: SpatialDelivery::default(),
        }
    }
}
