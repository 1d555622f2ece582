//! The state every connection and session task of one gateway shares, in one leaf module so
//! that the tasks (handshake, sessions, handoffs) depend on it and not on each other.

use std::sync::Arc;

use tickwire_session::SessionConfig;
use tickwire_wire::FrameDecoder;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::Admission;
use crate::auth::AuthProvider;
use crate::config::GatewayConfig;
use crate::registry::Registry;
use crate::router::Router;
use crate::stats::Stats;
use crate::workers::WorkerSet;

/// State every connection and session task shares.
pub(crate) struct Shared {
    /// With `[tls]`: every listener speaks TLS.
    pub(crate) tls: Option<Arc<tickwire_transport::TlsServer>>,
    pub(crate) config: GatewayConfig,
    pub(crate) session_config: SessionConfig,
    pub(crate) decoder: FrameDecoder,
    pub(crate) auth: Box<dyn AuthProvider>,
    pub(crate) router: Arc<dyn Router>,
    pub(crate) registry: Registry,
    pub(crate) stats: Arc<Stats>,
    pub(crate) cancel: CancellationToken,
    pub(crate) tracker: TaskTracker,
    pub(crate) workers: Option<WorkerSet>,
    /// Connections waiting for their Hello, in all and per address.
    pub(crate) admission: Arc<Admission>,
    /// The next SessionHandle::conn_id (starts at 1; 0 means "none" on the wire).
    pub(crate) next_conn_id: std::sync::atomic::AtomicU64,
}
