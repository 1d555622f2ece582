//! tickwire's derived-data cache, wire-compatible with Unreal Cloud DDC (work in progress).
//!
//! Built so far: content hashes ([`IoHash`]), namespace and bucket names, the embedded
//! filesystem blob store (atomic, verified writes), bearer-token auth, and the blob endpoints
//! over HTTP with connection limits and timeouts (`serve`). Refs, compact binary and compressed buffers wait for their specifications.

pub mod auth;
mod blob_store;
mod hash;
pub mod http;
mod names;
pub mod serve;

pub use auth::{Action, Auth, AuthError};
pub use blob_store::{BlobStore, StoreError};
pub use hash::{HashError, IoHash};
pub use names::{Name, NameError};
