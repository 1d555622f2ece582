//! Where blobs live: the one interface the API and garbage collection use, over two backends.
//!
//! - [`LocalBlobs`] (the default): files under the server's root, for one machine;
//! - [`S3Blobs`]: an S3 bucket (or any S3-compatible store), so that several servers, with their
//!   metadata in one PostgreSQL database, serve one cache.
//!
//! Both store a blob under its content hash, check an upload's hash before it is stored under
//! that name, and acknowledge nothing that a crash could still lose. Bodies are never held whole
//! in memory by the local store, and at most three parts (24 MiB) per upload by the S3 store.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use crate::meta::MetaStore;
use crate::{IoHash, Name};

mod cache;
mod local;
mod s3;

pub use local::LocalBlobs;
pub use s3::{MAX_BLOB as MAX_S3_BLOB, MIN_S3_GRACE, PART, S3Blobs, S3Config, UPLOADS};

/// Where uploads are staged while they are hashed, under the server's root.
const TMP: &str = ".tmp";
/// Read size while streaming a body to disk.
const CHUNK: usize = 256 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the body hashes to {actual}, not {expected}")]
    HashMismatch { expected: IoHash, actual: IoHash },
    #[error("the body is larger than the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("storage I/O: {0}")]
    Io(#[from] io::Error),
    #[error("blob storage configuration: {0}")]
    Config(String),
}

/// The store's blobs, in one of its backends.
#[derive(Debug)]
pub struct BlobStore {
    backend: Backend,
    _root: RootLock,
}

/// The server's root is its own: two servers on one root would take each other's staged
/// uploads (and, with local blobs, each other's garbage collection). An exclusive `flock` on
/// `<root>/.lock`, held while the store is open; the kernel drops it when the process ends.
#[derive(Debug)]
struct RootLock(#[allow(dead_code)] std::fs::File);

impl RootLock {
    async fn take(root: &Path) -> Result<RootLock, StoreError> {
        tokio::fs::create_dir_all(root).await?;
        let file =
            std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(root.join(".lock"))?;
        use std::os::fd::AsRawFd;
        // SAFETY: `file` is open for the call; flock takes a descriptor and keeps nothing else.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                return Err(StoreError::Config(format!(
                    "another tickwire ddc server is using {}: one server per root",
                    root.display()
                )));
            }
            return Err(StoreError::Config(format!(
                "cannot lock {} (one server per root; a filesystem without flock cannot hold a store): {e}",
                root.join(".lock").display()
            )));
        }
        Ok(RootLock(file))
    }
}

#[derive(Debug)]
enum Backend {
    Local(LocalBlobs),
    S3(std::sync::Arc<S3Blobs>),
}

/// A stored blob, opened: its size, and its bytes from any offset.
pub struct OpenBlob {
    size: u64,
    source: Source,
}

enum Source {
    File(tokio::fs::File),
    S3(s3::Object),
}

/// Bytes of a blob being read.
pub type BlobReader = Pin<Box<dyn AsyncRead + Send>>;

impl OpenBlob {
    /// The blob's length in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// `len` bytes from offset `start` (within the blob), and never more.
    pub async fn read_range(self, start: u64, len: u64) -> io::Result<BlobReader> {
        debug_assert!(start.saturating_add(len) <= self.size);
        match self.source {
            Source::File(mut file) => {
                if start > 0 {
                    file.seek(io::SeekFrom::Start(start)).await?;
                }
                Ok(Box::pin(file.take(len)))
            }
            Source::S3(object) => object.read_range(start, len).await,
        }
    }

    /// The whole blob.
    pub async fn read_all(self) -> io::Result<BlobReader> {
        let size = self.size;
        self.read_range(0, size).await
    }
}

impl BlobStore {
    /// Blobs as files under `root` ([`LocalBlobs`]).
    pub async fn open(root: impl Into<PathBuf>) -> Result<BlobStore, StoreError> {
        let root = root.into();
        let lock = RootLock::take(&root).await?;
        Ok(BlobStore { backend: Backend::Local(LocalBlobs::open(root).await?), _root: lock })
    }

    /// Blobs in the bucket `config` names ([`S3Blobs`]); uploads are staged under `root`. Fails
    /// if the bucket cannot be listed with the credentials given.
    pub async fn open_s3(root: impl Into<PathBuf>, config: &S3Config) -> Result<BlobStore, StoreError> {
        let root = root.into();
        let lock = RootLock::take(&root).await?;
        let s3 = S3Blobs::open(root, config).await?;
        Ok(BlobStore { backend: Backend::S3(std::sync::Arc::new(s3)), _root: lock })
    }

    /// At shutdown: waits up to `bound` for the work that runs to its end even when its client
    /// goes (sends to S3, namespace deletes there); false if some was still running.
    pub async fn finish(&self, bound: Duration) -> bool {
        match &self.backend {
            Backend::Local(_) => true,
            Backend::S3(s3) => s3.finish(bound).await,
        }
    }

    /// The local store, if that is where blobs are: garbage collection sweeps only it.
    pub fn local(&self) -> Option<&LocalBlobs> {
        match &self.backend {
            Backend::Local(local) => Some(local),
            Backend::S3(_) => None,
        }
    }

    /// Whether blobs are in a store several servers can share.
    pub fn is_shared(&self) -> bool {
        matches!(self.backend, Backend::S3(_))
    }

    /// Where the blobs are, as a Postgres database records it ([`crate::meta::MetaStore::bind_blob_store`]):
    /// `files`, or `s3://bucket/prefix` (the endpoint is not part of it).
    pub fn location(&self) -> String {
        match &self.backend {
            Backend::Local(_) => "files".to_owned(),
            Backend::S3(s3) => s3.describe(),
        }
    }

    /// Where the blobs are, for logs (no credentials).
    pub fn describe(&self) -> String {
        match &self.backend {
            Backend::Local(local) => format!("files under {}", local.root().display()),
            Backend::S3(s3) => s3.describe(),
        }
    }

    /// Blobs and bytes stored.
    pub fn usage(&self) -> &Usage {
        match &self.backend {
            Backend::Local(local) => local.usage(),
            Backend::S3(s3) => s3.usage(),
        }
    }

    /// Stores what `body` yields, at most `limit` bytes. With `expected`, the body must hash to
    /// it. Returns the blob's id and size once the blob is durable.
    pub async fn put(
        &self,
        ns: &Name,
        expected: Option<IoHash>,
        body: impl AsyncRead + Unpin,
        limit: u64,
    ) -> Result<(IoHash, u64), StoreError> {
        match &self.backend {
            Backend::Local(local) => local.put(ns, expected, body, limit).await,
            Backend::S3(s3) => s3.put(ns, expected, body, limit, true).await,
        }
    }

    /// [`BlobStore::put`] of blob `id`, which [`BlobStore::exists`] has just found missing:
    /// with blobs in S3, sent without asking the bucket again (one request fewer per new
    /// upload). The body must hash to `id`.
    pub async fn put_missing(
        &self,
        ns: &Name,
        id: IoHash,
        body: impl AsyncRead + Unpin,
        limit: u64,
    ) -> Result<(IoHash, u64), StoreError> {
        match &self.backend {
            Backend::Local(local) => local.put(ns, Some(id), body, limit).await,
            Backend::S3(s3) => s3.put(ns, Some(id), body, limit, false).await,
        }
    }

    /// The blob, opened, if it is stored.
    pub async fn open_blob(&self, ns: &Name, id: &IoHash) -> io::Result<Option<OpenBlob>> {
        self.open_marking(ns, id, true).await
    }

    /// [`BlobStore::open_blob`]; with `mark`, a local blob that is old is marked as written
    /// now while garbage collection runs ([`LocalBlobs::keep_fresh`]), and a blob in S3 may be
    /// downloaded into the disk cache. The collector's own reads do neither.
    pub(crate) async fn open_marking(
        &self,
        ns: &Name,
        id: &IoHash,
        mark: bool,
    ) -> io::Result<Option<OpenBlob>> {
        match &self.backend {
            Backend::Local(local) => Ok(local
                .open_marking(ns, id, mark)
                .await?
                .map(|(file, size)| OpenBlob { size, source: Source::File(file) })),
            Backend::S3(s3) => s3.open_blob(ns, id, mark).await,
        }
    }

    /// A stored blob's size, if it is stored (for a read: see [`BlobStore::known`]).
    pub async fn size(&self, ns: &Name, id: &IoHash) -> io::Result<Option<u64>> {
        match &self.backend {
            Backend::Local(local) => local.size(ns, id).await,
            Backend::S3(s3) => s3.size(ns, id).await,
        }
    }

    /// Whether a blob is stored durably, asked of the store itself: what a write that relies
    /// on the answer uses (an upload skipped, a ref finalized).
    pub async fn exists(&self, ns: &Name, id: &IoHash) -> io::Result<bool> {
        match &self.backend {
            Backend::Local(local) => local.exists(ns, id).await,
            Backend::S3(s3) => s3.exists(ns, id).await,
        }
    }

    /// [`BlobStore::exists`] for a read: with blobs in S3, answered from this server's disk
    /// cache and the blobs it found in the bucket lately when they know it, which misses a
    /// delete made through another server.
    pub async fn known(&self, ns: &Name, id: &IoHash) -> io::Result<bool> {
        match &self.backend {
            Backend::Local(local) => local.exists(ns, id).await,
            Backend::S3(s3) => Ok(s3.size(ns, id).await?.is_some()),
        }
    }

    /// Removes a blob; false if it was not there.
    pub async fn delete(&self, ns: &Name, id: &IoHash) -> io::Result<bool> {
        match &self.backend {
            Backend::Local(local) => local.delete(ns, id).await,
            Backend::S3(s3) => s3.delete(ns, id).await,
        }
    }

    /// Removes every blob of a namespace.
    pub async fn delete_namespace(&self, ns: &Name) -> io::Result<()> {
        match &self.backend {
            Backend::Local(local) => local.delete_namespace(ns).await,
            Backend::S3(s3) => s3.delete_namespace(ns).await,
        }
    }

    /// [`LocalBlobs::keep_fresh`]; nothing for blobs in S3, whose writes keep old blobs from
    /// collections through the metadata store instead ([`BlobStore::rely_through`]).
    pub fn keep_fresh(&self, age: Duration) {
        if let Backend::Local(local) = &self.backend {
            local.keep_fresh(age);
        }
    }

    /// With blobs in S3: makes the bucket's prefix the metadata store `id`'s
    /// ([`MetaStore::store_id`]), or refuses it if another store's servers use it. Nothing for
    /// local blobs, whose root is one server's.
    pub async fn bind_metadata(&self, id: &str) -> Result<(), StoreError> {
        match &self.backend {
            Backend::S3(s3) => s3.bind_metadata(id).await,
            Backend::Local(_) => Ok(()),
        }
    }

    /// With blobs in S3: from now on, writes that rely on an old blob record it in `meta`, and
    /// a collection claims there the blobs it removes (`s3/collect.rs`). Garbage collection of
    /// blobs in S3 is safe only once every server on the bucket does this. Nothing for local
    /// blobs.
    pub fn rely_through(&self, meta: &MetaStore) {
        if let Backend::S3(s3) = &self.backend {
            s3.rely_through(meta.clone());
        }
    }

    /// The S3 store, if that is where blobs are: garbage collection sweeps it through the
    /// metadata store's claims.
    pub(crate) fn s3(&self) -> Option<&Arc<S3Blobs>> {
        match &self.backend {
            Backend::S3(s3) => Some(s3),
            Backend::Local(_) => None,
        }
    }

    /// The shortest grace a collection accepts for these blobs: [`s3::MIN_S3_GRACE`] in S3, none
    /// for local blobs.
    pub fn min_blob_grace(&self) -> Duration {
        match &self.backend {
            Backend::S3(_) => s3::MIN_S3_GRACE,
            Backend::Local(_) => Duration::ZERO,
        }
    }
}

/// A blob a write needs is being removed by a garbage collection (or was, while the write ran):
/// the request can be tried again. Carried inside an [`io::Error`]; [`is_busy`] finds it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BeingCollected(pub String);

impl BeingCollected {
    pub fn into_io(self) -> io::Error {
        io::Error::other(self)
    }
}

/// Whether `e` is a [`BeingCollected`].
pub fn is_busy(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<BeingCollected>())
}

/// How many blobs and bytes the store holds: counted when the store opens (in the background)
/// and kept up to date by this server's writes and deletes. Two identical uploads racing may
/// count one blob twice until the next start; with a store shared by several servers, the
/// others' writes are counted only at the next start.
#[derive(Debug, Default)]
pub struct Usage {
    pub blobs: AtomicU64,
    pub bytes: AtomicU64,
    /// The count at open has finished.
    pub counted: std::sync::atomic::AtomicBool,
}

impl Usage {
    /// `blobs` more blobs of `bytes` in all.
    fn add(&self, blobs: u64, bytes: u64) {
        self.blobs.fetch_add(blobs, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// `blobs` blobs of `bytes` in all are gone. Never below zero: a count that raced an
    /// upload's may have missed it.
    fn forget(&self, blobs: u64, bytes: u64) {
        let less = |by: u64| move |n: u64| Some(n.saturating_sub(by));
        let _ = self.blobs.fetch_update(Ordering::Relaxed, Ordering::Relaxed, less(blobs));
        let _ = self.bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, less(bytes));
    }
}

/// A temporary file being written, removed when dropped: on every error, and when the upload's
/// task is dropped mid-way (a client that resets its HTTP/2 stream). Forgotten once renamed
/// into place.
struct TmpFile(Option<PathBuf>);

impl TmpFile {
    /// A new file in `root`'s staging directory, under a name no other file has.
    async fn create(root: &Path, counter: &AtomicU64) -> io::Result<(TmpFile, tokio::fs::File)> {
        loop {
            let n = counter.fetch_add(1, Ordering::Relaxed);
            let path = root.join(TMP).join(format!("{}-{n}", std::process::id()));
            match tokio::fs::OpenOptions::new().write(true).create_new(true).open(&path).await {
                Ok(file) => return Ok((TmpFile(Some(path)), file)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn path(&self) -> &Path {
        self.0.as_deref().expect("kept only after the last use")
    }

    /// It was renamed into place: nothing to remove.
    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for TmpFile {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            // One unlink, in place: nothing to wait for.
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The key of blob `id` of `ns` under a store's root: `<namespace>/<aa>/<bb>/<hash>`.
fn relative_place(ns: &Name, id: &IoHash) -> [String; 4] {
    let hex = id.to_hex();
    [ns.as_str().to_owned(), hex[..2].to_owned(), hex[2..4].to_owned(), hex]
}

/// The hash and size of what `body` yields (at most `limit` bytes), stored nowhere.
pub async fn hash_stream(mut body: impl AsyncRead + Unpin, limit: u64) -> Result<(IoHash, u64), StoreError> {
    copy_hashing(&mut body, &mut tokio::io::sink(), limit).await
}

/// Copies what `body` yields (at most `limit` bytes) into `out`, hashing it on the way; the
/// hash and size.
async fn copy_hashing(
    body: &mut (impl AsyncRead + Unpin),
    out: &mut (impl tokio::io::AsyncWrite + Unpin),
    limit: u64,
) -> Result<(IoHash, u64), StoreError> {
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; CHUNK];
    let mut size = 0u64;
    loop {
        let n = body.read(&mut buf).await?;
        if n == 0 {
            return Ok((IoHash::from_hasher(&hasher), size));
        }
        size += n as u64;
        if size > limit {
            return Err(StoreError::TooLarge { limit });
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).await?;
    }
}
