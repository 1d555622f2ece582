//! Content: raw blobs and compressed buffers (and, in `presence.rs`, whether the attachments
//! an object names are present).
//!
//! Both kinds live in the filesystem [`BlobStore`] under the IoHash of their stored bytes. A
//! compressed buffer is also addressed by its raw hash (the hash of its decompressed payload,
//! which is how refs name it); the metadata store maps raw hash → stored blob, written only
//! after the blob is durable. Stored bytes are never re-encoded.

use std::sync::Arc;

use bytes::Bytes;
use tokio::io::AsyncReadExt;
use tokio::sync::Semaphore;

use crate::budget::{Held, MemoryBudget, NoRoom};
use crate::compressed::{self, BlockTable, CompressedError};
use crate::meta::{MetaError, MetaStore};
use crate::{BlobStore, IoHash, Name, OpenBlob, StoreError};

mod presence;
pub(crate) use presence::attachment_hashes;
pub use presence::attachments_of;

/// How deep object attachments may reference further objects before the resolver gives up
/// (and calls the attachment missing).
pub const MAX_OBJECT_DEPTH: usize = 16;
/// The largest object attachment the resolver reads into memory.
pub const MAX_ATTACHED_OBJECT: u64 = 16 << 20;
/// The most object attachments one presence check reads.
pub const MAX_RESOLVED_OBJECTS: usize = 1_000;
/// The most attachments a ref's object may name directly when it is put: each is looked up at
/// every check of the ref (its PUT, its finalize, and every read that resolves it). Objects
/// attached to it are bounded by [`MAX_RESOLVED_OBJECTS`] in number and
/// [`MAX_JUDGED_ATTACHMENTS`] in what they name; refs stored before the bound are still
/// served. The editor's records name a handful. An object attachment that names more is not
/// read past by a check (its attachments count as missing).
pub const MAX_ATTACHMENTS: usize = 4_096;
/// The most attachments (binary or object) one presence check judges beyond those the ref
/// names itself; the rest count as missing. Four times what a ref may name directly.
pub const MAX_JUDGED_ATTACHMENTS: usize = 4 * MAX_ATTACHMENTS;
/// A write's check looks up this many of a ref's own binary attachments at once (with blobs in
/// S3, each is a request to the bucket).
const LOOKUPS_AT_ONCE: usize = 8;
/// A compressed buffer whose payload is larger than this is decoded and hashed on the blocking
/// pool, not on the request's runtime thread: an LZ4 buffer decodes to up to 255 times its
/// stored size, and hashing that there would hold up every other request on the thread.
pub const DECODE_INLINE_MAX: u64 = 256 << 10;
/// The buffer a stored block table is read through ([`Content::unchecked`]).
const TABLE_READ: usize = 16 << 10;

/// Decodes of large compressed buffers at once: as many as there are cores, so that they
/// neither take every core nor fill the blocking pool that SQLite and the blob files share
/// (`tokio::fs`); more wait their turn.
#[derive(Debug, Clone)]
pub struct DecodeSlots(Arc<Semaphore>);

impl Default for DecodeSlots {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        DecodeSlots(Arc::new(Semaphore::new(cores)))
    }
}

impl DecodeSlots {
    /// Runs `work` on a compressed buffer (`body`, whose payload is `raw_size` bytes): inline
    /// when the payload is small, else on the blocking pool, in one of the slots
    /// ([`DECODE_INLINE_MAX`]). `keep` (what the caller holds of the memory budget for the
    /// body and its decoding) is moved along and handed back with the result: a request
    /// dropped mid-way (its client gone) does not give the budget back while the work runs on.
    pub async fn decode<T: Send + 'static, K: Send + 'static>(
        &self,
        raw_size: u64,
        body: Bytes,
        keep: K,
        work: fn(&[u8]) -> T,
    ) -> Result<(T, K), std::io::Error> {
        if raw_size <= DECODE_INLINE_MAX {
            return Ok((work(&body), keep));
        }
        let slot = self.0.clone().acquire_owned().await.map_err(std::io::Error::other)?;
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            (work(&body), keep)
        })
        .await
        .map_err(|e| std::io::Error::other(format!("decoding the compressed buffer did not finish: {e}")))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ContentError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Meta(#[from] MetaError),
    #[error("storage I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a valid compressed buffer: {0}")]
    Compressed(#[from] CompressedError),
    #[error("the compressed buffer's raw hash is {header}, but the URL names {url}")]
    RawHashMismatch { header: IoHash, url: IoHash },
    #[error("the object names {count} attachments or more; at most {max}")]
    TooManyAttachments { count: usize, max: usize },
    #[error(
        "an object attachment is {len} bytes, more than the memory budget can give this request beside what it holds ({room})"
    )]
    PastRoom { len: u64, room: u64 },
    #[error(transparent)]
    Busy(#[from] NoRoom),
    #[error(
        "checking the ref's attachments took {0:?}, more than a ref may wait between its check and its write; retry"
    )]
    CheckTooLong(std::time::Duration),
    #[error("a blob grace of {grace:?} is too short for these blobs: at least {min:?}")]
    GraceTooShort { grace: std::time::Duration, min: std::time::Duration },
}

/// Where the bytes of a binary attachment (or a blob asked for by id) are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Located {
    /// A compressed buffer, stored as this blob.
    Compressed(IoHash),
    /// A raw blob with exactly this id.
    Raw(IoHash),
}

impl Located {
    pub fn blob(self) -> IoHash {
        match self {
            Located::Compressed(b) | Located::Raw(b) => b,
        }
    }
}

/// Blobs plus the metadata that indexes them.
pub struct Content {
    pub blobs: BlobStore,
    pub meta: MetaStore,
    pub decodes: DecodeSlots,
    /// What requests may hold in memory at once. A ref's object ([`MetaStore::get_ref`]) and a
    /// blob read whole ([`Content::read_blob`]) are charged to it before they are read.
    pub budget: MemoryBudget,
}

impl Content {
    /// Validates and stores a compressed buffer that must have raw hash `id` (when given).
    /// Checks, in the order of the spec: header and block table, raw hash against `id`, and,
    /// when the blocks can be decoded here, the decoded payload against the raw hash. Returns
    /// the raw hash.
    ///
    /// A large payload is verified on the blocking pool ([`DecodeSlots::decode`]). `budget` (the
    /// caller's share of the memory budget for the body and its check) is held until the
    /// buffer is stored or refused, even if the caller's request is dropped meanwhile.
    pub async fn put_compressed<K: Send + 'static>(
        &self,
        ns: &Name,
        id: Option<IoHash>,
        body: Bytes,
        budget: K,
    ) -> Result<IoHash, ContentError> {
        let header = compressed::check(&body)?;
        let raw = header.raw_hash;
        if let Some(url) = id
            && url != raw
        {
            return Err(ContentError::RawHashMismatch { header: raw, url });
        }
        // The budget is kept until the buffer is stored: the body is written below.
        // With the check, the blob id the body would have (its hash), off the runtime thread
        // for a large one as the check is.
        let ((verified, blob_id), _budget) = self
            .decodes
            .decode(header.total_raw_size, body.clone(), budget, |b| (compressed::verify(b), IoHash::of(b)))
            .await?;
        let checked = match verified {
            Ok(_) => true,
            Err(CompressedError::Oodle) => false,
            Err(e) => return Err(e.into()),
        };
        if let Some(Located::Compressed(stored)) = self.locate_durably(ns, raw).await? {
            // Already stored: an idempotent re-upload (looking for it marked it as written now
            // if it was old and collections run, so a sweep under way keeps it), unless the
            // stored copy's payload was never checked and this one's was: then this one takes
            // its place, so that a first unverifiable upload (right or wrong) is not final.
            // The same bytes need no look (most re-uploads: a package's shared attachments);
            // a failed look keeps what is stored.
            if !checked || stored == blob_id {
                return Ok(raw);
            }
            match self.unchecked(ns, &stored).await {
                Ok(true) => {}
                Ok(false) => return Ok(raw),
                Err(e) => {
                    tracing::warn!(error = %e, %raw, "cannot read a stored buffer's header: kept as it is");
                    return Ok(raw);
                }
            }
        }
        let (blob, _) = self.blobs.put(ns, None, &body[..], u64::MAX).await?;
        self.meta.put_content(ns, raw, blob).await?;
        Ok(raw)
    }

    /// Whether the stored compressed buffer `blob` holds a block this server cannot decode
    /// (Oodle), so that its payload was never checked against its raw hash: read from its
    /// header and as much of its block table as it takes, a bounded buffer at a time. A blob
    /// gone meanwhile counts as checked (there is nothing to replace).
    async fn unchecked(&self, ns: &Name, blob: &IoHash) -> Result<bool, ContentError> {
        let Some(open) = self.blobs.open_blob(ns, blob).await? else { return Ok(false) };
        let mut header = [0; BlockTable::HEADER];
        open.read_range(0, header.len() as u64).await?.read_exact(&mut header).await?;
        let table = BlockTable::of(&header);
        if table.table_len() == 0 {
            return Ok(false);
        }
        let Some(open) = self.blobs.open_blob(ns, blob).await? else { return Ok(false) };
        let reader = open.read_range(header.len() as u64, table.table_len()).await?;
        let mut sizes = tokio::io::BufReader::with_capacity(TABLE_READ, reader);
        for i in 0..table.table_len() / 4 {
            if table.undecodable(i, sizes.read_u32().await?) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Where the content named `id` is, for a read: a compressed buffer with that raw hash
    /// first, else a raw blob with that id. With blobs in S3 the answer may come from what this
    /// server remembers ([`BlobStore::known`]).
    pub async fn locate(&self, ns: &Name, id: IoHash) -> Result<Option<Located>, ContentError> {
        self.locate_as(ns, id, false).await
    }

    /// [`Content::locate`] for a write that relies on the answer (a write skipped, a ref
    /// finalized): asked of the blob store itself ([`BlobStore::exists`]).
    pub async fn locate_durably(&self, ns: &Name, id: IoHash) -> Result<Option<Located>, ContentError> {
        self.locate_as(ns, id, true).await
    }

    async fn locate_as(&self, ns: &Name, id: IoHash, durably: bool) -> Result<Option<Located>, ContentError> {
        let stored = |blob: IoHash| async move {
            if durably { self.blobs.exists(ns, &blob).await } else { self.blobs.known(ns, &blob).await }
        };
        if let Some(blob) = self.meta.content_blob(ns, id).await?
            && stored(blob).await?
        {
            return Ok(Some(Located::Compressed(blob)));
        }
        if stored(id).await? {
            return Ok(Some(Located::Raw(id)));
        }
        Ok(None)
    }

    /// A stored blob, whole, if it is at most `limit` bytes (`None` if missing or larger),
    /// charged to the memory budget by its size before it is read ([`ContentError::Busy`] if
    /// the budget cannot hold it now). Keep the share as long as the bytes.
    pub async fn read_blob(
        &self,
        ns: &Name,
        id: &IoHash,
        limit: u64,
    ) -> Result<Option<(Vec<u8>, Held)>, ContentError> {
        self.read_blob_marking(ns, id, limit, true).await
    }

    /// [`Content::read_blob`]; without `mark`, an old blob is not marked as written now
    /// ([`BlobStore::open_marking`]): the collector's own reads.
    pub(crate) async fn read_blob_marking(
        &self,
        ns: &Name,
        id: &IoHash,
        limit: u64,
        mark: bool,
    ) -> Result<Option<(Vec<u8>, Held)>, ContentError> {
        let Some(blob) = self.blobs.open_marking(ns, id, mark).await? else { return Ok(None) };
        if blob.size() > limit {
            return Ok(None);
        }
        self.read_charged(blob).await.map(Some)
    }

    /// An object attachment's bytes, charged ([`Content::read_blob`]): `None` if missing or
    /// larger than [`MAX_ATTACHED_OBJECT`] (it counts as missing); [`ContentError::PastRoom`]
    /// if the check's `room` cannot hold it (a deterministic 413, never a verdict of
    /// "missing" that would unfinalize a ref whose attachments are all there).
    async fn read_attached(
        &self,
        ns: &Name,
        id: &IoHash,
        room: u64,
    ) -> Result<Option<(Vec<u8>, Held)>, ContentError> {
        let Some(blob) = self.blobs.open_blob(ns, id).await? else { return Ok(None) };
        let len = blob.size();
        if len > MAX_ATTACHED_OBJECT {
            return Ok(None);
        }
        if len > room {
            return Err(ContentError::PastRoom { len, room });
        }
        self.read_charged(blob).await.map(Some)
    }

    /// The whole of an open blob, charged to the memory budget before it is read.
    async fn read_charged(&self, blob: OpenBlob) -> Result<(Vec<u8>, Held), ContentError> {
        let size = blob.size();
        let len = usize::try_from(size).map_err(|_| NoRoom { bytes: usize::MAX })?;
        let held = Held::take(&self.budget, len)?;
        let mut out = Vec::with_capacity(len);
        // Never more than was charged (blobs are content-addressed: it is the whole blob).
        blob.read_all().await?.read_to_end(&mut out).await?;
        Ok((out, held))
    }
}

#[cfg(test)]
impl Content {
    /// A store under `dir` with a memory budget of `budget` bytes, for tests.
    pub(crate) async fn open_in(dir: &std::path::Path, budget: u32) -> Content {
        let meta = MetaStore::open(dir).await.unwrap();
        Content::open_with(dir, meta, budget).await
    }

    /// A store in a test's place, on its metadata backend ([`crate::meta::testing`]).
    pub(crate) async fn open_at(place: &crate::meta::testing::TestPlace, budget: u32) -> Content {
        Content::open_with(place.dir(), place.open().await, budget).await
    }

    async fn open_with(dir: &std::path::Path, meta: MetaStore, budget: u32) -> Content {
        let blobs = BlobStore::open(dir).await.unwrap();
        Content { blobs, meta, decodes: DecodeSlots::default(), budget: MemoryBudget::new(budget) }
    }
}

#[cfg(test)]
mod tests {
    use std::thread::ThreadId;

    use super::*;

    fn thread(_: &[u8]) -> ThreadId {
        std::thread::current().id()
    }

    /// On a runtime of one thread, a small payload's work runs there and a large one's on
    /// another (the blocking pool), with what the caller keeps handed back.
    #[tokio::test(flavor = "current_thread")]
    async fn a_large_payload_is_decoded_off_the_runtime_thread() {
        let here = std::thread::current().id();
        let slots = DecodeSlots::default();
        let (small, kept) = slots.decode(DECODE_INLINE_MAX, Bytes::new(), 7u8, thread).await.unwrap();
        assert_eq!((small, kept), (here, 7));
        let (large, kept) = slots.decode(DECODE_INLINE_MAX + 1, Bytes::new(), 8u8, thread).await.unwrap();
        assert_ne!(large, here);
        assert_eq!(kept, 8);
    }
}
