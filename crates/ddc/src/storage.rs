//! Content: raw blobs and compressed buffers, and whether an attachment is present.
//!
//! Both kinds live in the filesystem [`BlobStore`] under the IoHash of their stored bytes. A
//! compressed buffer is also addressed by its raw hash (the hash of its decompressed payload,
//! which is how refs name it); the metadata store maps raw hash → stored blob, written only
//! after the blob is durable. Stored bytes are never re-encoded.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::io::AsyncReadExt;
use tokio::sync::Semaphore;

use crate::budget::{Held, MemoryBudget, NoRoom};
use crate::cb::{self, CbType};
use crate::compressed::{self, BlockTable, CompressedError};
use crate::meta::{MetaError, MetaStore};
use crate::{BlobStore, IoHash, Name, OpenBlob, StoreError};

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

    /// The attachments of `object` (a validated compact-binary object) that are not present,
    /// each once, in the order the object names them. `room` is what the memory budget could
    /// ever give the check: the whole budget, less what the caller's request holds (see
    /// [`Content::present`]).
    pub async fn missing(&self, ns: &Name, object: &[u8], room: usize) -> Result<Vec<IoHash>, ContentError> {
        self.missing_of(ns, attachments_of(object), room).await
    }

    /// Whether every attachment of `object` is present ([`Content::missing`] is empty), judged
    /// only up to the first one that is not: what a read asks.
    pub async fn all_present(&self, ns: &Name, object: &[u8], room: usize) -> Result<bool, ContentError> {
        let mut resolver = Resolver::new(room);
        resolver.first_only = true;
        Ok(self.missing_within(ns, attachments_of(object), resolver).await?.is_empty())
    }

    /// [`Content::missing`], given the object's attachments ([`attachments_of`]).
    pub async fn missing_of(
        &self,
        ns: &Name,
        attachments: Vec<(CbType, [u8; 20])>,
        room: usize,
    ) -> Result<Vec<IoHash>, ContentError> {
        self.missing_within(ns, attachments, Resolver::new(room)).await
    }

    /// [`Content::missing_of`], within the bounds `resolver` starts with.
    async fn missing_within(
        &self,
        ns: &Name,
        attachments: Vec<(CbType, [u8; 20])>,
        mut resolver: Resolver,
    ) -> Result<Vec<IoHash>, ContentError> {
        if !resolver.first_only {
            // Every one is judged: its own binary attachments are looked up at once.
            let binaries: HashSet<IoHash> = attachments
                .iter()
                .filter(|(ty, _)| *ty == CbType::BinaryAttachment)
                .map(|(_, hash)| IoHash::from_bytes(*hash))
                .collect();
            let lookups = binaries.into_iter().map(|hash| async move {
                Ok::<_, ContentError>((hash, self.locate_durably(ns, hash).await?.is_some()))
            });
            let mut found = futures_util::stream::iter(lookups).buffer_unordered(LOOKUPS_AT_ONCE);
            while let Some(looked_up) = found.next().await {
                let (hash, located) = looked_up?;
                resolver.looked_up.insert(hash, located);
            }
        }
        let (mut missing, mut named, mut listed) = (Vec::new(), HashSet::new(), HashSet::new());
        for (ty, hash) in attachments {
            let hash = IoHash::from_bytes(hash);
            if !named.insert((ty, hash)) {
                continue; // Named twice by the ref: listed once.
            }
            resolver.cut_short = false;
            // Judged already if an object attachment named it too: then `present` answers from
            // what it judged, so that a hash is listed even when it was judged missing inside
            // an object first.
            let present = self.present(ns, ty, hash, 0, &mut resolver).await?;
            let mut found = std::mem::take(&mut resolver.absent);
            // What is absent below it, as the reference server lists it: an object attachment
            // that is stored is not listed, the blobs it names that are not stored are. Itself
            // when a bound or a cycle cut the judgement short under it, or when nothing at all
            // was listed yet: `needs` is empty only when every attachment is present. (One
            // judged missing before, under an earlier attachment, is covered by what that one
            // listed: what was absent below it, or itself.)
            if !present && (resolver.cut_short || (found.is_empty() && missing.is_empty())) {
                found.push(hash);
            }
            missing.extend(found.into_iter().filter(|h| listed.insert(*h)));
            if resolver.first_only && !missing.is_empty() {
                break;
            }
        }
        Ok(missing)
    }

    /// Whether one attachment is present: a binary one as a compressed buffer or raw blob, an
    /// object one as a stored, valid object whose own attachments are present. Each hash is
    /// judged once per check, and a check is bounded, so that a hostile object graph cannot
    /// make it expensive:
    /// - it reads at most [`MAX_RESOLVED_OBJECTS`] objects, [`MAX_OBJECT_DEPTH`] deep, one at a
    ///   time (an object's bytes go before its attachments are judged), each charged to the
    ///   memory budget while it is read and parsed, and each at most [`MAX_ATTACHED_OBJECT`]
    ///   (larger ones count as missing); one past the check's room fails the check with
    ///   [`ContentError::PastRoom`], a 413, not a 429 that retries would meet again;
    /// - it judges at most [`MAX_JUDGED_ATTACHMENTS`] hashes reached through object
    ///   attachments (those the ref names itself are not counted);
    /// - an object attachment naming more than [`MAX_ATTACHMENTS`] of its own is not read
    ///   past.
    ///
    /// Past the other bounds, attachments count as missing.
    fn present<'a>(
        &'a self,
        ns: &'a Name,
        ty: CbType,
        hash: IoHash,
        depth: usize,
        resolver: &'a mut Resolver,
    ) -> futures_util::future::BoxFuture<'a, Result<bool, ContentError>> {
        Box::pin(async move {
            if let Some(&known) = resolver.known.get(&(ty, hash)) {
                return Ok(known);
            }
            // Past a bound, a hash counts as missing here but is not remembered as judged: the
            // ref may name it directly too, where it is judged in full.
            if depth > 0 {
                if resolver.judged_left == 0 {
                    resolver.cut_short = true;
                    return Ok(false);
                }
                resolver.judged_left -= 1;
            }
            let present = if ty == CbType::BinaryAttachment {
                let located = match resolver.looked_up.remove(&hash) {
                    Some(located) => located,
                    None => self.locate_as(ns, hash, !resolver.first_only).await?.is_some(),
                };
                if !located {
                    resolver.absent.push(hash);
                }
                located
            } else if depth >= MAX_OBJECT_DEPTH
                || resolver.objects_left == 0
                || resolver.judging.contains(&hash)
            {
                // Past a bound, or a cycle (which cannot be present): not remembered as judged.
                resolver.cut_short = true;
                return Ok(false);
            } else {
                resolver.objects_left -= 1;
                resolver.judging.insert(hash);
                // A write's check asks the store itself whether the object is there before
                // reading it (a read may come from what this server remembers).
                let stored = resolver.first_only || self.blobs.exists(ns, &hash).await?;
                let read = if stored { self.read_attached(ns, &hash, resolver.room).await? } else { None };
                let children = match read {
                    None => None,
                    Some((bytes, _held)) => {
                        cb::parse(&bytes).ok().and_then(|object| object.attachments_within(MAX_ATTACHMENTS))
                    }
                };
                let judged = match children {
                    // Not stored, too large, damaged or naming too many: the object itself.
                    None => {
                        resolver.absent.push(hash);
                        false
                    }
                    // Every child judged (not only up to the first missing), so that `needs`
                    // lists every blob absent below it.
                    Some(children) => {
                        let mut all = true;
                        for (ty, h) in children {
                            all &= self.present(ns, ty, IoHash::from_bytes(h), depth + 1, resolver).await?;
                            if !all && resolver.first_only {
                                break;
                            }
                        }
                        all
                    }
                };
                resolver.judging.remove(&hash);
                judged
            };
            resolver.known.insert((ty, hash), present);
            Ok(present)
        })
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

/// The attachments a validated compact-binary object names, in order (none if it does not
/// parse).
pub fn attachments_of(object: &[u8]) -> Vec<(CbType, [u8; 20])> {
    cb::parse(object).map(|field| field.attachments()).unwrap_or_default()
}

/// [`attachments_of`], each hash as an [`IoHash`].
pub(crate) fn attachment_hashes(object: &[u8]) -> impl Iterator<Item = (CbType, IoHash)> {
    attachments_of(object).into_iter().map(|(ty, h)| (ty, IoHash::from_bytes(h)))
}

/// One presence check's memory: what each hash was judged, how many more objects it may read
/// and hashes it may judge, and its room in the memory budget.
struct Resolver {
    /// Each hash judged, by the type it was named as: present as a blob does not make it a
    /// valid object.
    known: HashMap<(CbType, IoHash), bool>,
    objects_left: usize,
    judged_left: usize,
    /// What the memory budget could ever give the check.
    room: u64,
    /// Hashes found absent since the ref's current attachment began to be judged, in order:
    /// blobs not stored, and object attachments not stored or not readable.
    absent: Vec<IoHash>,
    /// A bound or a cycle stopped the judgement under the ref's current attachment.
    cut_short: bool,
    /// Where the ref's own binary attachments were found, asked of the store before the
    /// judgement began, [`LOOKUPS_AT_ONCE`] at a time (each a HEAD with blobs in S3); taken by
    /// the judgement in its order, which stays the one source of `absent`.
    looked_up: HashMap<IoHash, bool>,
    /// The object attachments being judged (one met again is a cycle).
    judging: HashSet<IoHash>,
    /// Stop at the first attachment that is not present (a read's yes or no), instead of
    /// listing all that are absent. A read's check may trust what this server remembers of
    /// the blob store; a write's (all the others) asks it ([`Content::locate_durably`]).
    first_only: bool,
}

impl Resolver {
    /// A check within the default bounds, with `room` of the memory budget.
    fn new(room: usize) -> Resolver {
        Resolver {
            known: HashMap::new(),
            objects_left: MAX_RESOLVED_OBJECTS,
            judged_left: MAX_JUDGED_ATTACHMENTS,
            room: room as u64,
            absent: Vec::new(),
            cut_short: false,
            looked_up: HashMap::new(),
            judging: HashSet::new(),
            first_only: false,
        }
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

    async fn content(dir: &std::path::Path, budget: u32) -> Content {
        Content::open_in(dir, budget).await
    }

    async fn store(content: &Content, ns: &Name, bytes: &[u8]) -> [u8; 20] {
        content.blobs.put(ns, None, bytes, u64::MAX).await.unwrap();
        *IoHash::of(bytes).as_bytes()
    }

    /// An object holding `field` once per hash in `hashes`, as `ty`.
    fn naming(ty: CbType, hashes: &[[u8; 20]]) -> Vec<u8> {
        let value = |h: &[u8; 20]| match ty {
            CbType::ObjectAttachment => cb::Value::ObjectAttachment(*h),
            _ => cb::Value::BinaryAttachment(*h),
        };
        let fields = hashes.iter().enumerate().map(|(i, h)| (format!("f{i}"), value(h))).collect();
        cb::Value::Object(fields).to_bytes()
    }

    /// An object attachment is charged to the memory budget while a check reads it: a budget
    /// without room for it makes the check `Busy` (429), taking nothing; with room, the check
    /// gives every byte back.
    #[tokio::test]
    async fn a_check_charges_each_object_it_reads() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let content = content(dir.path(), 64 << 10).await;
        let payload = store(&content, &ns, b"payload").await;
        // About 20 KB: more than the 10,000 bytes left below.
        let inner = cb::Value::Object(vec![
            ("p".into(), cb::Value::BinaryAttachment(payload)),
            ("pad".into(), cb::Value::Binary(vec![0; 20_000])),
        ])
        .to_bytes();
        let object = store(&content, &ns, &inner).await;
        let attachments = vec![(CbType::ObjectAttachment, object)];
        let taken = Held::take(&content.budget, (64 << 10) - 10_000).unwrap();
        let busy = content.missing_of(&ns, attachments.clone(), 64 << 10).await;
        assert!(matches!(busy, Err(ContentError::Busy(_))), "{busy:?}");
        assert_eq!(content.budget.available(), 10_000, "a refused read takes nothing");
        drop(taken);
        assert_eq!(content.missing_of(&ns, attachments, 64 << 10).await.unwrap(), vec![]);
        assert_eq!(content.budget.available(), 64 << 10, "all given back");
    }

    /// An object attachment naming more than `MAX_ATTACHMENTS` of its own is not read past: it
    /// counts as missing, however present they are. At the bound, it is judged.
    #[tokio::test]
    async fn an_object_naming_too_many_attachments_counts_as_missing() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let content = content(dir.path(), 1 << 30).await;
        let payload = store(&content, &ns, b"payload").await;
        let at_bound =
            store(&content, &ns, &naming(CbType::BinaryAttachment, &[payload; MAX_ATTACHMENTS])).await;
        let past =
            store(&content, &ns, &naming(CbType::BinaryAttachment, &[payload; MAX_ATTACHMENTS + 1])).await;
        let check = |h| content.missing_of(&ns, vec![(CbType::ObjectAttachment, h)], 1 << 30);
        assert_eq!(check(at_bound).await.unwrap(), vec![]);
        assert_eq!(check(past).await.unwrap(), vec![IoHash::from_bytes(past)]);
    }

    /// A hash the ref names directly is listed missing even when an object attachment named
    /// before it names it too (and it was judged missing there, inside the object); a hash
    /// named twice is listed once. The object is stored, so it is not listed: what it names
    /// that is absent is.
    #[tokio::test]
    async fn a_hash_named_by_the_ref_and_by_an_object_is_listed() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let content = content(dir.path(), 1 << 30).await;
        let absent = *IoHash::of(b"never stored").as_bytes();
        let object = store(&content, &ns, &naming(CbType::BinaryAttachment, &[absent])).await;
        let attachments = vec![
            (CbType::ObjectAttachment, object),
            (CbType::BinaryAttachment, absent),
            (CbType::BinaryAttachment, absent),
        ];
        assert_eq!(
            content.missing_of(&ns, attachments, 1 << 30).await.unwrap(),
            vec![IoHash::from_bytes(absent)]
        );
    }

    /// A hash past a check's bound inside an object is not remembered as judged: named by the
    /// ref itself as well, it is judged there in full.
    #[tokio::test]
    async fn a_hash_past_the_bound_inside_an_object_is_judged_when_named_directly() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let content = content(dir.path(), 1 << 30).await;
        let blob = store(&content, &ns, b"present").await;
        let object = store(&content, &ns, &naming(CbType::BinaryAttachment, &[blob])).await;
        let attachments = vec![(CbType::ObjectAttachment, object), (CbType::BinaryAttachment, blob)];
        assert_eq!(
            content.missing_within(&ns, attachments, judging(0)).await.unwrap(),
            vec![IoHash::from_bytes(object)],
            "the blob is present; only the object, past the bound, is missing"
        );
    }

    fn judging(judged: usize) -> Resolver {
        Resolver { objects_left: 10, judged_left: judged, ..Resolver::new(1 << 20) }
    }

    /// A check judges at most its bound of hashes reached through object attachments: past it,
    /// present attachments count as missing, so an object graph naming millions cannot make a
    /// check long. Those the ref names itself are not bounded (its object bounds them).
    #[tokio::test]
    async fn a_check_judges_a_bounded_number_of_hashes() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let content = content(dir.path(), 1 << 30).await;
        let mut blobs = Vec::new();
        for i in 0..3u8 {
            blobs.push(store(&content, &ns, &[i; 8]).await);
        }
        let object = store(&content, &ns, &naming(CbType::BinaryAttachment, &blobs)).await;
        let direct: Vec<_> = blobs.iter().map(|&h| (CbType::BinaryAttachment, h)).collect();
        assert_eq!(content.missing_within(&ns, direct, judging(0)).await.unwrap(), vec![]);
        let nested = vec![(CbType::ObjectAttachment, object)];
        assert_eq!(content.missing_within(&ns, nested.clone(), judging(3)).await.unwrap(), vec![]);
        assert_eq!(
            content.missing_within(&ns, nested, judging(2)).await.unwrap(),
            vec![IoHash::from_bytes(object)],
            "its third child is past the bound"
        );
    }

    /// A chain of object attachments is read one object at a time: three objects of 40% of the
    /// budget each, each naming the next, fit (they would not if an object's bytes were kept
    /// while its attachments are judged). An object past the check's room is a deterministic
    /// error (413), charged nothing: not a 429 its retries would meet again, nor "missing".
    #[tokio::test]
    async fn a_chain_of_objects_is_read_one_at_a_time_within_the_checks_room() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let budget = 100_000u32;
        let content = content(dir.path(), budget).await;
        let padded = |next: Option<[u8; 20]>| {
            let mut fields = vec![("pad".to_string(), cb::Value::Binary(vec![0; 40_000]))];
            fields.extend(next.map(|h| ("next".to_string(), cb::Value::ObjectAttachment(h))));
            cb::Value::Object(fields).to_bytes()
        };
        let last = store(&content, &ns, &padded(None)).await;
        let middle = store(&content, &ns, &padded(Some(last))).await;
        let first = store(&content, &ns, &padded(Some(middle))).await;
        let chain = vec![(CbType::ObjectAttachment, first)];
        assert_eq!(content.missing_of(&ns, chain.clone(), budget as usize).await.unwrap(), vec![]);
        assert_eq!(content.budget.available(), budget as usize);
        let past = content.missing_of(&ns, chain, 30_000).await;
        assert!(matches!(past, Err(ContentError::PastRoom { room: 30_000, .. })), "{past:?}");
        assert_eq!(content.budget.available(), budget as usize, "nothing charged");
    }

    /// `needs` lists what is absent below a stored object attachment, as the reference server
    /// does, not the object (whose upload again would change nothing): every absent blob it
    /// names, at any depth, each once, however many objects name it. An object not stored is
    /// listed itself.
    #[tokio::test]
    async fn needs_lists_the_absent_blobs_below_a_stored_object() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let content = content(dir.path(), 1 << 30).await;
        let (c1, c2) = (*IoHash::of(b"absent one").as_bytes(), *IoHash::of(b"absent two").as_bytes());
        let present = store(&content, &ns, b"present").await;
        let inner = store(&content, &ns, &naming(CbType::BinaryAttachment, &[c2, present])).await;
        let mut fields = vec![
            ("a".to_string(), cb::Value::BinaryAttachment(c1)),
            ("i".to_string(), cb::Value::ObjectAttachment(inner)),
        ];
        let first = store(&content, &ns, &cb::Value::Object(fields.clone()).to_bytes()).await;
        fields.reverse();
        let second = store(&content, &ns, &cb::Value::Object(fields).to_bytes()).await;
        let not_stored = *IoHash::of(b"an object never stored").as_bytes();
        let attachments = vec![
            (CbType::ObjectAttachment, first),
            (CbType::ObjectAttachment, second),
            (CbType::ObjectAttachment, not_stored),
        ];
        let hashes = |hs: &[[u8; 20]]| hs.iter().map(|h| IoHash::from_bytes(*h)).collect::<Vec<_>>();
        assert_eq!(
            content.missing_of(&ns, attachments, 1 << 30).await.unwrap(),
            hashes(&[c1, c2, not_stored])
        );
    }

    /// An object stored under a hash it names itself, and that hash: content addressing
    /// never stores one, so it is written into the store by hand, as a damaged store could
    /// hold it.
    fn self_naming_object(content: &Content, ns: &Name) -> [u8; 20] {
        let o = *IoHash::of(b"a hash the object names").as_bytes();
        let path = content.blobs.local().unwrap().blob_path(ns, &IoHash::from_bytes(o));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, naming(CbType::ObjectAttachment, &[o])).unwrap();
        o
    }

    /// Objects that name each other (all stored) can never be present: the check lists the
    /// ref's attachment, so `needs` is never empty for a ref that is not finalized.
    #[tokio::test]
    async fn a_cycle_of_objects_is_never_present_and_is_listed() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let content = content(dir.path(), 1 << 30).await;
        let o = self_naming_object(&content, &ns);
        let missing = content.missing_of(&ns, vec![(CbType::ObjectAttachment, o)], 1 << 30).await.unwrap();
        assert_eq!(missing, vec![IoHash::from_bytes(o)]);
    }

    /// An attachment whose judgement a bound cut short is listed even when an earlier one
    /// already put something in `needs`: `needs` lists every attachment not present or what
    /// is absent below it.
    #[tokio::test]
    async fn an_attachment_cut_short_is_listed_after_others() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let content = content(dir.path(), 1 << 30).await;
        let absent = *IoHash::of(b"never stored").as_bytes();
        let blob = store(&content, &ns, b"present").await;
        let object = store(&content, &ns, &naming(CbType::BinaryAttachment, &[blob])).await;
        let attachments = vec![(CbType::BinaryAttachment, absent), (CbType::ObjectAttachment, object)];
        assert_eq!(
            content.missing_within(&ns, attachments, judging(0)).await.unwrap(),
            vec![IoHash::from_bytes(absent), IoHash::from_bytes(object)]
        );
    }

    /// A cycle is found by the objects being judged, not by a bound: an object naming itself
    /// is read once.
    #[tokio::test]
    async fn a_cycle_is_read_once() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let content = content(dir.path(), 1 << 30).await;
        let o = self_naming_object(&content, &ns);
        let mut resolver = judging(100);
        let present = content.present(&ns, CbType::ObjectAttachment, IoHash::from_bytes(o), 0, &mut resolver);
        assert!(!present.await.unwrap());
        assert_eq!(resolver.objects_left, 9, "one read of ten");
    }

    /// A read's check stops at the first attachment not present, and answers the same.
    #[tokio::test]
    async fn a_reads_check_stops_at_the_first_absent() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let content = content(dir.path(), 1 << 30).await;
        let (a, b) = (*IoHash::of(b"absent a").as_bytes(), *IoHash::of(b"absent b").as_bytes());
        let object = naming(CbType::BinaryAttachment, &[a, b]);
        assert!(!content.all_present(&ns, &object, 1 << 30).await.unwrap());
        let mut first = Resolver::new(1 << 30);
        first.first_only = true;
        let listed = content.missing_within(&ns, attachments_of(&object), first).await.unwrap();
        assert_eq!(listed, vec![IoHash::from_bytes(a)]);
        let present = store(&content, &ns, b"there").await;
        assert!(
            content.all_present(&ns, &naming(CbType::BinaryAttachment, &[present]), 1 << 30).await.unwrap()
        );
    }
}
