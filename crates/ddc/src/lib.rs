//! tickwire's derived-data cache, wire-compatible with Unreal Cloud DDC.
//!
//! Layers, bottom up: content hashes ([`IoHash`]) and names; the wire formats (compact binary
//! in [`cb`], compressed buffers in [`compressed`]); storage (blobs on the filesystem, refs
//! and content ids in SQLite or PostgreSQL: [`meta`], joined in [`storage`], charging what it reads to the
//! memory [`budget`]); the ref rules ([`refs`]);
//! auth; and the HTTP API ([`http`]) served with connection limits ([`serve`]).

// The test harness of `tests/common/s3.rs`, shared with the unit tests, names this crate.
#[cfg(test)]
extern crate self as tickwire_ddc;

pub mod auth;
pub mod blob_store;
pub mod budget;
pub mod cb;
pub mod compressed;
pub mod gc;
mod hash;
pub mod http;
pub mod meta;
mod names;
pub mod pace;
pub mod refs;
pub mod serve;
pub mod storage;

pub use auth::{Action, Auth, AuthError};
pub use blob_store::{BlobStore, LocalBlobs, OpenBlob, S3Config, StoreError};
pub use hash::{HashError, IoHash};
pub use names::{Name, NameError, RefKey};
