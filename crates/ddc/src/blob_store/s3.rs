//! Blobs in an S3 bucket, or any S3-compatible store, through `object_store`: what lets several
//! servers serve one cache (with their metadata in one PostgreSQL database).
//!
//! A blob is the object `<prefix>/<namespace>/<aa>/<bb>/<hash>`, the local store's layout.
//! An upload is first staged in a file under the server's root while it is hashed (S3 cannot
//! take an object back once written, and a body's hash is known only at its end); it goes to
//! the bucket only if it hashes right, is hashed again as it is sent, and is acknowledged once
//! S3 has acknowledged it, which makes it durable. A blob already in the bucket is not sent
//! again. Up to [`PART`] bytes go in one request; larger blobs as a multipart upload of such
//! parts, two in flight while the next is read from disk. At most [`UPLOADS`] uploads send at
//! once, so sends hold at most `UPLOADS × 3 × PART` bytes in memory (outside the API's memory
//! budget). Reads go through a bounded cache on local disk ([`DiskCache`]) when there is one.
//! Garbage collection, and what keeps it off a blob a write relies on, is `s3/collect.rs`.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3;
use object_store::path::Path as Key;
use object_store::{GetOptions, ObjectStore, ObjectStoreExt, WriteMultipart};
use tokio::fs;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::task::TaskTracker;

use super::cache::DiskCache;
use super::{BlobReader, OpenBlob, Source, StoreError, TMP, TmpFile, Usage, copy_hashing, relative_place};
use crate::{IoHash, Name};

mod collect;
mod connect;

pub use collect::MIN_GRACE as MIN_S3_GRACE;

pub use connect::S3Config;

/// The most bytes sent in one request: a blob up to this size is one PUT, a larger one a
/// multipart upload of parts this size (S3 asks at least 5 MiB of every part but the last).
pub const PART: usize = 8 << 20;
/// S3's most parts in one multipart upload.
const MAX_PARTS: u64 = 10_000;
/// The largest blob this store can take: [`MAX_PARTS`] parts of [`PART`] bytes.
pub const MAX_BLOB: u64 = MAX_PARTS * PART as u64;
/// The most uploads sending to the bucket at once; others wait their turn.
pub const UPLOADS: usize = 8;
/// How many blobs found in the bucket (and their sizes) a server remembers, so that a read's
/// presence check of a blob it has seen asks the bucket at most once per [`SEEN_FOR`], not
/// every time (about 100 bytes each).
const SEEN: usize = 1 << 16;
/// How long a blob found in the bucket is taken as there without asking again: a delete
/// through another server (a client's, or a garbage collection's) is seen after this.
const SEEN_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// Blobs in an S3 bucket.
#[derive(Debug)]
pub struct S3Blobs {
    /// For HEAD, GET, LIST and DELETE requests.
    reads: Arc<AmazonS3>,
    /// For PUTs and multipart uploads (a longer bound per request).
    sends: Arc<AmazonS3>,
    /// For a collection's deletes (never retried: `connect::Clients`).
    removals: AmazonS3,
    /// `s3://bucket/prefix`.
    location: String,
    prefix: Key,
    /// The server's root: uploads are staged in its `.tmp`.
    root: PathBuf,
    next_tmp: AtomicU64,
    usage: Arc<Usage>,
    uploads: Arc<tokio::sync::Semaphore>,
    /// Sends and deletes that run on tasks of their own, so that a client going away does not
    /// stop them half done; [`S3Blobs::finish`] waits for them at shutdown.
    detached: TaskTracker,
    cache: Option<Arc<DiskCache>>,
    /// Blobs lately found in the bucket or sent to it, with their sizes and when, the least
    /// recently used forgotten first. It sees a delete through another server only once its
    /// entry is older than [`SEEN_FOR`].
    seen: std::sync::Mutex<lru::LruCache<(Name, IoHash), (u64, std::time::Instant)>>,
    /// Old blobs this server's writes recorded as relied on lately, and when
    /// (`s3/collect.rs`).
    relied: std::sync::Mutex<lru::LruCache<(Name, IoHash), std::time::Instant>>,
    /// Where writes record that they rely on an old blob, and collections claim the blobs they
    /// remove (`s3/collect.rs`): the metadata store, once the server has bound it
    /// ([`super::BlobStore::rely_through`]).
    claims: std::sync::OnceLock<crate::meta::MetaStore>,
}

/// What the bucket says of an object.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stat {
    size: u64,
    /// When it was last written (`Last-Modified`).
    written: std::time::SystemTime,
}

/// A blob found in the bucket, to be read.
#[derive(Clone)]
pub(super) struct Object {
    reads: Arc<AmazonS3>,
    key: Key,
    size: u64,
}

impl Object {
    /// `len` bytes from `start`. No `If-Match` on the entity tag: the name holds the same bytes
    /// whoever wrote them, and two writers' tags may differ (SSE-KMS).
    pub(super) async fn read_range(self, start: u64, len: u64) -> io::Result<BlobReader> {
        if len == 0 {
            return Ok(Box::pin(tokio::io::empty()));
        }
        let options = GetOptions { range: Some((start..start + len).into()), ..Default::default() };
        let got = self.reads.get_opts(&self.key, options).await.map_err(to_io)?;
        let stream = got.into_stream().map_err(to_io);
        Ok(Box::pin(tokio_util::io::StreamReader::new(stream).take(len)))
    }
}

impl S3Blobs {
    pub(super) async fn open(root: impl Into<PathBuf>, config: &S3Config) -> Result<S3Blobs, StoreError> {
        let root = root.into();
        let tmp = root.join(TMP);
        fs::create_dir_all(&tmp).await?;
        // Uploads a crash left half staged (the root is this server's alone: see `RootLock`).
        let mut stale = fs::read_dir(&tmp).await?;
        while let Some(entry) = stale.next_entry().await? {
            let _ = fs::remove_file(entry.path()).await;
        }
        let (bucket, prefix) = config.bucket_and_prefix()?;
        let clients = config.clients(bucket)?;
        let blobs = S3Blobs {
            reads: Arc::new(clients.reads),
            sends: Arc::new(clients.sends),
            removals: clients.removals,
            location: config.location()?,
            prefix,
            root: root.clone(),
            next_tmp: AtomicU64::new(0),
            usage: Arc::new(Usage::default()),
            uploads: Arc::new(tokio::sync::Semaphore::new(UPLOADS)),
            detached: TaskTracker::new(),
            seen: std::sync::Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(SEEN).expect("not 0"),
            )),
            relied: std::sync::Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(SEEN).expect("not 0"),
            )),
            claims: std::sync::OnceLock::new(),
            cache: match config.cache_bytes {
                0 => {
                    // Copies left from a run with a cache would be stale when it comes back.
                    DiskCache::remove_all(&root).await?;
                    None
                }
                limit => Some(Arc::new(DiskCache::open(&root, limit).await?)),
            },
        };
        // Reachable, and the credentials may list it: better refused at start than at the
        // first request.
        blobs
            .reads
            .list_with_delimiter(Some(&blobs.prefix))
            .await
            .map_err(|e| StoreError::Config(format!("cannot list {}: {e}", blobs.describe())))?;
        blobs.count_in_background();
        Ok(blobs)
    }

    pub(super) fn describe(&self) -> String {
        self.location.clone()
    }

    pub(super) fn usage(&self) -> &Usage {
        &self.usage
    }

    /// Waits up to `bound` for the sends and deletes still running on their own tasks.
    pub(super) async fn finish(&self, bound: Duration) -> bool {
        self.detached.close();
        tokio::time::timeout(bound, self.detached.wait()).await.is_ok()
    }

    /// Counts what is under the prefix, as the local store walks its tree; a count that fails
    /// is made again a minute later (garbage collection waits for it).
    fn count_in_background(&self) {
        let (reads, prefix, usage) = (self.reads.clone(), self.prefix.clone(), self.usage.clone());
        tokio::spawn(async move {
            loop {
                match count(&reads, &prefix).await {
                    Ok((blobs, bytes)) => {
                        usage.add(blobs, bytes);
                        usage.counted.store(true, Ordering::Relaxed);
                        return;
                    }
                    Err(e) => tracing::warn!(
                        error = %e,
                        "counting the blobs in S3 failed; again in a minute (ddc_store_blobs stays at 0 and blobs are not collected until then)"
                    ),
                }
                tokio::time::sleep(std::time::Duration::from_secs(60)).await;
            }
        });
    }

    fn key(&self, ns: &Name, id: &IoHash) -> Key {
        relative_place(ns, id).into_iter().fold(self.prefix.clone(), |key, part| key.join(part))
    }

    /// Stores a blob (see the module's doc). With `ask_first`, one the bucket already has is
    /// not sent again; without, the caller has just found it missing (`exists`), and it is
    /// sent without asking again (a copy that lands meanwhile holds the same bytes).
    pub(super) async fn put(
        &self,
        ns: &Name,
        expected: Option<IoHash>,
        mut body: impl AsyncRead + Unpin,
        limit: u64,
        ask_first: bool,
    ) -> Result<(IoHash, u64), StoreError> {
        let (tmp, mut file) = TmpFile::create(&self.root, &self.next_tmp).await?;
        let (actual, size) = copy_hashing(&mut body, &mut file, limit.min(MAX_BLOB)).await?;
        tokio::io::AsyncWriteExt::flush(&mut file).await?;
        drop(file);
        if let Some(expected) = expected
            && expected != actual
        {
            return Err(StoreError::HashMismatch { expected, actual });
        }
        // The same name holds the same bytes: one already there (at its size) is not sent
        // again. Asked of the bucket, not of what this server remembers (another server may
        // have deleted it), and kept from collections if it is old.
        let key = self.key(ns, &actual);
        if ask_first && self.stored_for_write(ns, &actual).await? == Some(size) {
            self.note_seen(ns, &actual, size);
            self.keep_staged(tmp, ns, &actual, size).await;
            return Ok((actual, size));
        }
        // The turn is taken here, so that uploads waiting for one stay with their clients (and
        // go when they do); the send then runs on a task of its own, so that a client going
        // away mid-send leaves no half-sent multipart upload in the bucket.
        let turn = self.uploads.clone().acquire_owned().await.map_err(io::Error::other)?;
        if self.detached.is_closed() {
            // Shutting down: a send spawned now might not be waited for.
            return Err(io::Error::other("the server is stopping").into());
        }
        let sends = self.sends.clone();
        let sending = std::time::SystemTime::now();
        let tmp = self
            .detached
            .spawn(async move {
                let _turn = turn;
                send(&sends, &key, &tmp, actual, size).await.map(|()| tmp)
            })
            .await
            .map_err(io::Error::other)??;
        // S3 dates an object by when its upload began: one that took long may already look old
        // enough to collect, so it is kept from collections as a write that relies on it is.
        if self.sent_slowly(sending) && self.relied_on(ns, &actual).await? != Some(size) {
            let gone =
                format!("blob {actual} was removed by a garbage collection while it was uploaded; retry");
            return Err(super::BeingCollected(gone).into_io().into());
        }
        self.usage.add(1, size);
        self.note_seen(ns, &actual, size);
        self.keep_staged(tmp, ns, &actual, size).await;
        Ok((actual, size))
    }

    /// Moves a staged blob the bucket has into the cache (if there is one and it takes it),
    /// made durable first: a cached file is served unchecked, so it must not be half there
    /// after a power loss. On a task of its own, so that it is not cut short half done.
    async fn keep_staged(&self, tmp: TmpFile, ns: &Name, id: &IoHash, size: u64) {
        let Some(cache) = self.cache.clone() else { return };
        let (ns, id) = (ns.clone(), *id);
        let _ = self
            .detached
            .spawn(async move {
                let synced = async { fs::File::open(tmp.path()).await?.sync_all().await };
                if synced.await.is_ok() && cache.take(&ns, &id, tmp.path(), size).await {
                    tmp.keep();
                }
            })
            .await;
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, lru::LruCache<(Name, IoHash), (u64, std::time::Instant)>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn note_seen(&self, ns: &Name, id: &IoHash, size: u64) {
        self.seen().put((ns.clone(), *id), (size, std::time::Instant::now()));
    }

    fn forget_seen(&self, ns: &Name, id: &IoHash) {
        self.seen().pop(&(ns.clone(), *id));
    }

    /// Forgets what this server remembers of a namespace's blobs.
    fn forget_namespace(&self, ns: &Name) {
        let mut seen = self.seen();
        let gone: Vec<_> = seen.iter().filter(|(k, _)| &k.0 == ns).map(|(k, _)| k.clone()).collect();
        for key in gone {
            seen.pop(&key);
        }
    }

    /// The object's size, if it is there.
    async fn head(&self, key: &Key) -> io::Result<Option<u64>> {
        Ok(self.stat(key).await?.map(|stat| stat.size))
    }

    /// The object's size and when it was last written, if it is there.
    async fn stat(&self, key: &Key) -> io::Result<Option<Stat>> {
        match self.reads.head(key).await {
            Ok(meta) => Ok(Some(Stat { size: meta.size, written: meta.last_modified.into() })),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(to_io(e)),
        }
    }

    /// The blob from the cache, else from the bucket: downloaded into the cache first when it
    /// is small enough ([`DiskCache::fills`]) and no other read is downloading it, else read
    /// from the bucket as it is sent.
    /// With `fill` false (garbage collection's reads), a blob not cached is read from the
    /// bucket and not cached.
    pub(super) async fn open_blob(&self, ns: &Name, id: &IoHash, fill: bool) -> io::Result<Option<OpenBlob>> {
        let cached = |(file, size)| OpenBlob { size, source: Source::File(file) };
        if let Some(cache) = &self.cache
            && let Some(found) = cache.open_blob(ns, id).await?
        {
            return Ok(Some(cached(found)));
        }
        let Some(size) = self.size(ns, id).await? else { return Ok(None) };
        let object = Object { reads: self.reads.clone(), key: self.key(ns, id), size };
        if let Some(cache) = &self.cache
            && fill
            && cache.fills(size)
            && let Some(_filling) = cache.start_fill(ns, id)
        {
            match self.fill(cache, &object, ns, id).await {
                Ok(true) => {
                    if let Some(found) = cache.open_blob(ns, id).await? {
                        return Ok(Some(cached(found)));
                    }
                }
                Ok(false) => {}
                // The bucket's copy is damaged: not served.
                Err(e) if e.kind() == io::ErrorKind::InvalidData => return Err(e),
                // A full disk, a failed download: served from the bucket instead.
                Err(e) => tracing::warn!(error = %e, blob = %id, "filling the blob cache failed"),
            }
        }
        Ok(Some(OpenBlob { size, source: Source::S3(object) }))
    }

    /// Downloads `object` (blob `id` of `ns`) into the cache, checking its hash; false if the
    /// cache did not take it. A copy in the bucket that does not hash to its name is an error
    /// (its bytes are not served).
    async fn fill(&self, cache: &DiskCache, object: &Object, ns: &Name, id: &IoHash) -> io::Result<bool> {
        let (tmp, mut file) = TmpFile::create(&self.root, &self.next_tmp).await?;
        let mut reader = object.clone().read_range(0, object.size).await?;
        let (hash, size) = match copy_hashing(&mut reader, &mut file, object.size).await {
            Ok(hashed) => hashed,
            Err(StoreError::Io(e)) => return Err(e),
            Err(e) => return Err(io::Error::other(e)),
        };
        tokio::io::AsyncWriteExt::flush(&mut file).await?;
        if hash != *id || size != object.size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the bucket's copy of blob {id} ({} bytes listed) is {size} bytes hashing to {hash}",
                    object.size
                ),
            ));
        }
        // Durable before it is cached: a cached file is served unchecked.
        file.sync_all().await?;
        drop(file);
        let taken = cache.take(ns, id, tmp.path(), size).await;
        if taken {
            tmp.keep();
        }
        Ok(taken)
    }

    /// Whether the bucket has the blob, asked of it, for a write that relies on the answer
    /// (kept from collections if it is old: [`S3Blobs::stored_for_write`]).
    pub(super) async fn exists(&self, ns: &Name, id: &IoHash) -> io::Result<bool> {
        let size = self.stored_for_write(ns, id).await?;
        match size {
            Some(size) => self.note_seen(ns, id, size),
            None => self.forget_seen(ns, id),
        }
        Ok(size.is_some())
    }

    /// The blob's size: from the cache or what this server found in the bucket lately when
    /// they know it, else asked of the bucket.
    pub(super) async fn size(&self, ns: &Name, id: &IoHash) -> io::Result<Option<u64>> {
        if let Some(size) = self.cache.as_ref().and_then(|c| c.size(ns, id)) {
            return Ok(Some(size));
        }
        if let Some(&(size, found)) = self.seen().get(&(ns.clone(), *id))
            && found.elapsed() < SEEN_FOR
        {
            return Ok(Some(size));
        }
        let size = self.head(&self.key(ns, id)).await?;
        if let Some(size) = size {
            self.note_seen(ns, id, size);
        }
        Ok(size)
    }

    /// Removes the blob from the bucket and from what this server remembers: before the
    /// bucket's delete and again after it (a read or a fill that ran meanwhile may have put it
    /// back), on a task of its own so that a client going away does not stop it half done.
    pub(super) async fn delete(self: &Arc<Self>, ns: &Name, id: &IoHash) -> io::Result<bool> {
        let (this, ns, id) = (self.clone(), ns.clone(), *id);
        self.detached
            .spawn(async move {
                this.forget_blob(&ns, &id).await;
                let key = this.key(&ns, &id);
                // S3 answers a delete of a missing object as a success: look first.
                let found = this.head(&key).await?;
                if let Some(size) = found {
                    match this.reads.delete(&key).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => this.usage.forget(1, size),
                        Err(e) => return Err(to_io(e)),
                    }
                }
                this.forget_blob(&ns, &id).await;
                Ok(found.is_some())
            })
            .await
            .map_err(io::Error::other)?
    }

    async fn forget_blob(&self, ns: &Name, id: &IoHash) {
        self.forget_seen(ns, id);
        if let Some(cache) = &self.cache {
            cache.remove(ns, id).await;
        }
    }

    /// Removes every object under the namespace's prefix, and what this server remembers of
    /// them (before and after, as [`S3Blobs::delete`] does), on a task of its own (it runs to
    /// its end even if the client goes).
    pub(super) async fn delete_namespace(self: &Arc<Self>, ns: &Name) -> io::Result<()> {
        let (this, ns) = (self.clone(), ns.clone());
        self.detached
            .spawn(async move {
                this.forget_namespace_blobs(&ns).await;
                let prefix = this.prefix.clone().join(ns.as_str());
                let found = Arc::new(Usage::default());
                let counted = found.clone();
                let keys = this
                    .reads
                    .list(Some(&prefix))
                    .map_ok(move |meta| {
                        counted.add(1, meta.size);
                        meta.location
                    })
                    .boxed();
                let mut deleted = this.reads.delete_stream(keys);
                let mut failed = None;
                while let Some(result) = deleted.next().await {
                    match result {
                        Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                        Err(e) => failed = failed.or(Some(e)),
                    }
                }
                drop(deleted);
                this.usage.forget(found.blobs.load(Ordering::Relaxed), found.bytes.load(Ordering::Relaxed));
                this.forget_namespace_blobs(&ns).await;
                failed.map_or(Ok(()), |e| Err(to_io(e)))
            })
            .await
            .map_err(io::Error::other)?
    }

    async fn forget_namespace_blobs(&self, ns: &Name) {
        self.forget_namespace(ns);
        if let Some(cache) = &self.cache
            && let Err(e) = cache.remove_namespace(ns).await
        {
            // The bucket's delete goes on: a copy left in the cache is only read.
            tracing::warn!(error = %e, namespace = %ns, "removing a namespace from the blob cache failed");
        }
    }
}

/// The blobs under `prefix`, and their bytes (not the metadata store's record).
async fn count(reads: &AmazonS3, prefix: &Key) -> object_store::Result<(u64, u64)> {
    let mut listing = reads.list(Some(prefix));
    let (mut blobs, mut bytes) = (0, 0);
    while let Some(meta) = listing.next().await.transpose()? {
        if meta.location.filename().is_some_and(|n| n.parse::<IoHash>().is_ok()) {
            blobs += 1;
            bytes += meta.size;
        }
    }
    Ok((blobs, bytes))
}

/// Sends the staged blob `tmp` (`size` bytes hashing to `id`) to `key`: in one request, or in
/// parts. The bytes are hashed again as they are read back: a staged file changed since it was
/// hashed is not stored under `id`.
async fn send(store: &AmazonS3, key: &Key, tmp: &TmpFile, id: IoHash, size: u64) -> io::Result<()> {
    let mut file = fs::File::open(tmp.path()).await?;
    let changed = || io::Error::other(format!("the staged copy of blob {id} changed before it was sent"));
    if size <= PART as u64 {
        let mut bytes = Vec::with_capacity(size as usize);
        (&mut file).take(size).read_to_end(&mut bytes).await?;
        if IoHash::of(&bytes) != id {
            return Err(changed());
        }
        store.put(key, Bytes::from(bytes).into()).await.map_err(to_io)?;
        return Ok(());
    }
    let upload = store.put_multipart(key).await.map_err(to_io)?;
    let mut writer = WriteMultipart::new_with_chunk_size(upload, PART);
    let sent = match send_parts(&mut file, &mut writer).await {
        Ok((hash, len)) if hash == id && len == size => Ok(()),
        Ok(_) => Err(changed()),
        Err(e) => Err(e),
    };
    if let Err(e) = sent {
        let _ = writer.abort().await;
        return Err(e);
    }
    writer.finish().await.map_err(to_io)?;
    Ok(())
}

/// Sends the rest of `file` as parts, two in flight while the next is read; the hash and length
/// of what was sent.
async fn send_parts(file: &mut fs::File, writer: &mut WriteMultipart) -> io::Result<(IoHash, u64)> {
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; super::CHUNK];
    let mut len = 0u64;
    loop {
        let n = file.read(&mut buf).await?;
        if n == 0 {
            return Ok((IoHash::from_hasher(&hasher), len));
        }
        hasher.update(&buf[..n]);
        len += n as u64;
        writer.wait_for_capacity(2).await.map_err(to_io)?;
        writer.write(&buf[..n]);
    }
}

fn to_io(e: object_store::Error) -> io::Error {
    match e {
        object_store::Error::NotFound { .. } => io::Error::new(io::ErrorKind::NotFound, e),
        e => io::Error::other(e),
    }
}
