//! Everything that can go wrong on the client side, typed.

use std::io;

use tickwire_session::SessionError;
use tickwire_wire::WireError;
use tickwire_wire::proto::{CloseReason, Status};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {target}: {source}")]
    Connect { target: String, source: io::Error },
    #[error("connection failed: {0}")]
    Io(#[from] io::Error),
    #[error("handshake timed out")]
    HandshakeTimeout,
    #[error("the server closed the connection during the handshake")]
    HandshakeClosed,
    #[error("protocol violation by the server: {0}")]
    Protocol(String),
    #[error("malformed data from the server: {0}")]
    Wire(#[from] WireError),
    #[error("session error: {0}")]
    Session(#[from] SessionError),
    #[error("the server closed the session ({reason:?}): {message}")]
    Closed { reason: CloseReason, message: String },
    #[error("request failed with {status:?}: {message}")]
    Status { status: Status, message: String },
    #[error("the client has shut down")]
    Shutdown,
    #[error(
        "invalid target `{0}`: expected host:port, tcp://host:port, tls://host:port, ws://host:port/path or wss://host:port/path"
    )]
    BadTarget(String),
    #[error("{0} needs TLS settings (ConnectOptions::tls: the certificates to trust)")]
    TlsNotConfigured(String),
}

impl ClientError {
    /// A Close the gateway sends before it reads the Hello (docs/protocol.md §9: `OVERLOADED`,
    /// too many connections waiting for theirs; `AUTH_TIMEOUT`, the Hello came too late): it
    /// ends the connection, not a session being resumed on it, so a later try may work.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ClientError::Closed { reason: CloseReason::Overloaded | CloseReason::AuthTimeout, .. })
    }
}
