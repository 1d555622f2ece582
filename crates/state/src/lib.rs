//! tickwire's state-sync engine: what a server must send each tick, to whom, and in how many bytes.
//!
//! A [`State`] is a typed tree ([`Schema`]) whose fields carry sync policies: server-only,
//! broadcast, owner-only (a map keyed by player id, each player seeing its own entry) or custom
//! (a filter). Writes stamp the paths they touch, so dirty tracking is key-level and nothing is
//! ever diffed. Each tick, [`State::prepare`] encodes the changes once per audience: one broadcast
//! segment, plus private segments only for players whose own entries changed. A subscriber's
//! [`Update`] is a few shared [`bytes::Bytes`]. Subscribers that fall behind get one merged delta
//! from their own version, or a snapshot. A [`Replica`] applies updates on the client side.
//!
//! The crate is pure: no I/O, no clocks. The binary format is specified in `docs/protocol.md`.

mod encode;
mod error;
mod replica;
mod schema;
mod state;
mod sync;
mod tree;
mod value;
mod view;

pub use error::{DecodeError, SchemaError, StateError};
pub use replica::Replica;
pub use schema::{Field, Filter, KeyKind, Policy, Schema, SchemaDef, Type};
pub use state::{Limits, State, Step};
pub use sync::{Codec, Prepared, PreparedCache, Update};
pub use tree::Version;
pub use value::{Key, Quant, Value};
