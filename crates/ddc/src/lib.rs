//! tickwire's derived-data cache, wire-compatible with Unreal Cloud DDC (work in progress).
//!
//! Built so far: content hashes ([`IoHash`]), namespace and bucket names, and the embedded
//! filesystem blob store, whose writes are atomic and verified. The HTTP API, refs, compact
//! binary and compressed buffers wait for their specifications (see the issue note).

mod blob_store;
mod hash;
mod names;

pub use blob_store::{BlobStore, StoreError};
pub use hash::{HashError, IoHash};
pub use names::{Name, NameError};
