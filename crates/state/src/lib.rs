//! tickwire's state-sync engine: what a server must send each tick, to whom, and in how many bytes.
//!
//! A [`State`] is a typed tree ([`Schema`]) whose fields carry sync policies: server-only,
//! broadcast, owner-only (a map keyed by player id, each player seeing its own entry) or custom
//! (a filter). Writes stamp the paths they change, so dirty tracking is key-level and no state is
//! ever diffed against another; a set compares only the value it writes with the one it replaces,
//! so a whole entity written with one field changed costs one field. Each tick,
//! [`State::prepare`] encodes the changes once per audience: one broadcast segment, plus
//! private segments only for players whose own entries changed. A subscriber's
//! [`Update`] is a few shared [`bytes::Bytes`]. Subscribers that fall behind get one merged delta
//! from their own version, or a snapshot. A [`Replica`] applies updates on the client side.
//!
//! The crate is pure: no I/O, no clocks. The binary format is specified in `docs/protocol.md`.
//!
//! ```
//! use tickwire_state::{Codec, Field, Key, KeyKind, Replica, Schema, SchemaDef, State, Step, Type, Value};
//!
//! // Declare the state (or load the same shape from a JSON/TOML file with `SchemaDef::parse`).
//! let schema = Schema::new(SchemaDef::new([
//!     Field::new("round", Type::Int),
//!     Field::new("hands", Type::map(KeyKind::String, Type::list(Type::Int))).owner_only(),
//! ]))?;
//! let (round, hands) = (schema.field("round").unwrap(), schema.field("hands").unwrap());
//! let (alice, bob) = (Key::str("alice"), Key::str("bob"));
//!
//! let mut state = State::new(schema.clone());
//! state.set(&[Step::Field(hands), Step::Key(&alice)], Value::List(vec![Value::Int(7)]))?;
//! state.set(&[Step::Field(hands), Step::Key(&bob)], Value::List(vec![Value::Int(9)]))?;
//! let v1 = state.seal();
//!
//! // Bob joins: a snapshot, which holds his hand and not Alice's.
//! let mut replica = Replica::new(schema.clone());
//! replica.apply(&state.snapshot(Codec::Binary)?.update_for(&state, &bob, false)?.to_vec())?;
//!
//! // Next tick: encode once, then each subscriber's update is a few shared segments.
//! state.set(&[Step::Field(round)], Value::Int(2))?;
//! state.push(&[Step::Field(hands), Step::Key(&alice)], Value::Int(3))?;
//! state.seal();
//! let prepared = state.prepare(v1, Codec::Binary)?;
//! let update = prepared.update_for(&state, &bob, false)?;
//! assert_eq!(update.segments.len(), 2, "header and broadcast: Alice's hand is not Bob's business");
//! replica.apply(&update.to_vec())?;
//! assert_eq!(replica.value(), state.view_for(&bob));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod encode;
mod error;
mod json_value;
mod patch;
mod replica;
mod schema;
mod state;
mod sync;
mod tree;
mod value;
mod view;

pub use error::{DecodeError, SchemaError, StateError};
pub use json_value::PathBuf;
pub use patch::{MAX_PATCH_OPS, Patch, PatchError, PatchOp};
pub use replica::Replica;
pub use schema::{Field, FieldMask, Filter, KeyKind, Policy, Schema, SchemaDef, Type};
pub use state::{Limits, State, Step};
pub use sync::{Codec, Prepared, PreparedCache, Update};
pub use tree::Version;
pub use value::{Key, Quant, Value};
