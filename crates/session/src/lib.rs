//! Reliable sessions that outlive their connections.
//!
//! A [`Session`] is a deterministic state machine: it is fed `(now, frame)` and timer events,
//! and it answers with frames to send and payloads to deliver. It never touches a socket or a
//! clock, so the gateway, the client library and the simulation tests drive the very same code.
//! The I/O shells around it live in `tickwire-gateway` and `tickwire-client`.
//!
//! What it guarantees: every application message handed to [`Session::send`] is delivered to the
//! peer's application exactly once and in order, across any number of dropped connections, as
//! long as the peer resumes within the resume window and the unacknowledged backlog stays within
//! its bounds. When either bound is broken the session ends with a typed reason.

mod config;
mod error;
mod ids;
mod session;

pub use config::SessionConfig;
pub use error::SessionError;
pub use ids::{ResumeToken, SessionId};
pub use session::{Received, Role, Session, Timeout};
