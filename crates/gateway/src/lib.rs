//! The tickwire gateway: the I/O shell around the session state machine.
//!
//! It accepts TCP and WebSocket connections, runs the handshake and auth, and gives every
//! session one task that owns its [`tickwire_session::Session`]. A dropped connection leaves
//! that task waiting for a resume; a resume hands the new connection to the same task, so no
//! state is ever copied between tasks. Application messages go to a [`Router`]; the built-in
//! [`EchoRouter`] answers the `echo` method that the ping-pong bench uses.

mod admission;
mod auth;
mod channel;
mod close;
mod config;
mod flow;
mod gateway;
mod handshake;
mod metrics;
mod outbox;
mod pass_times;
mod rate_limit;
mod registry;
mod reply;
mod router;
mod session_task;
mod shared;
mod spatial;
mod stats;
mod workers;

pub use auth::{
    AuthError, AuthProvider, DEV_SERVER_PREFIX, DevAuth, Identity, JwtAuth, MAX_PLAYER_ID_BYTES, Role,
    check_player_id,
};
pub use channel::{
    Access, ChannelConfigError, ChannelFigures, ChannelRouter, ChannelTypeConfig, ChannelsConfig, Preset,
    SpatialDelivery, UpdateWindowConfig,
};
pub use config::{AuthConfig, AuthMode, ConfigError, GatewayConfig, JwtAlgorithm, MetricsConfig, TlsConfig};
pub use gateway::{Gateway, GatewayError, RunningGateway};
pub use router::{EchoRouter, Gauge, PushError, Reply, Router, SessionHandle, Startup, error_response};
pub use spatial::SpatialRouter;
/// For the criterion bench of the world's pass (the `harness` feature); not part of the API.
#[cfg(feature = "harness")]
#[doc(hidden)]
pub use spatial::harness::{HarnessError, PassCounts, WorldHarness};
pub use stats::{Stats, StatsSnapshot};
pub use workers::WorkerSet;

/// Line prefix `tickwire gateway` (and `tickwire ddc`) print on stdout for each listener, as
/// `listening on tcp://ADDR`: what scripts and `tickwire bench` wait for.
pub const LISTENING_PREFIX: &str = "listening on ";
