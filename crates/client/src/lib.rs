//! The Rust client for a tickwire gateway.
//!
//! Two layers, like the gateway:
//! - [`Connection`] drives one session in the caller's own task: no background task, no
//!   channels. The bench runs tens of thousands of them in one process.
//! - [`Client`] puts a `Connection` in a background task and adds what an application wants:
//!   RPC calls with futures, a stream of pushes, and automatic reconnect-and-resume, so a
//!   dropped connection loses no message in either direction.

mod client;
mod connection;
mod error;
mod spatial;
mod target;

pub use client::{Client, Reply, response_body};
pub use connection::{ConnectOptions, Connection, Event};
pub use error::ClientError;
pub use target::Target;
pub use tickwire_transport::{TlsClient, TlsError};
pub use tickwire_wire::proto;
