//! tickwire's derived-data cache, wire-compatible with Unreal Cloud DDC (work in progress).
//!
//! Built so far: content hashes ([`IoHash`]), namespace and bucket names, the embedded
//! filesystem blob store (atomic, verified writes), bearer-token auth, and the blob endpoints
//! over HTTP with connection limits and timeouts (`serve`), and the compact-binary reader and
//! writer ([`cb`]), and the compressed-buffer codec ([`compressed`]). Refs and the batch
//! endpoint are not built yet.

pub mod auth;
mod blob_store;
pub mod cb;
pub mod compressed;
mod hash;
pub mod http;
mod names;
pub mod serve;

pub use auth::{Action, Auth, AuthError};
pub use blob_store::{BlobStore, StoreError};
pub use hash::{HashError, IoHash};
pub use names::{Name, NameError};
