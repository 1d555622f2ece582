//! Garbage collection of blobs in S3 ([`crate::gc`] decides which blobs no ref names), and
//! what keeps it from removing a blob a write relies on. S3 cannot rename an object aside or
//! delete one only if it was not written since, which is how the local store is safe
//! (`local/collect.rs`), so writes and collections meet in the metadata database
//! (`crate::meta::claims`):
//!
//! - **A write** that relies on a blob being stored (an upload skipped because the blob is
//!   there, a ref's attachment found) and finds it last written more than [`RELY_AFTER`] ago
//!   records that it relies on it, then asks the bucket again. A collection then leaves the
//!   blob alone for its whole grace. While a collection has the blob claimed, the write waits
//!   for it to end (polling the database, backing off to [`WAIT_STEP_MAX`]), then looks again;
//!   a blob it finds gone it uploads again, after the delete, never before it.
//! - **A collection** claims each blob it means to remove (refused if a write relied on it
//!   within the grace, or another collection holds it), asks the bucket once more when it was
//!   written (an upload may have written it again since the listing), and removes it only if
//!   it is still old and the claim is younger than [`CLAIM_DEADLINE`].
//! - A claim older than [`CLAIM_STALE`] belongs to a collection that stopped half way: writes
//!   and other collections take it over. A claim ends within `CLAIM_DEADLINE` (timed from
//!   before its stamp) plus one delete (30 s, never retried), far under that, so servers'
//!   clocks may differ by minutes. A delete that failed leaves its claim to go stale, since it
//!   may still land: writes of that blob wait until then.
//! - An upload that took long is recorded as relied on before it is answered: S3 dates an
//!   object by when its upload began.
//!
//! A blob a write found written less than `RELY_AFTER` ago is safe without a record as long as
//! the write's ref commits before the blob can look old to a collection (one of at least
//! [`MIN_GRACE`]), and a ref is written finalized only if its check took at most
//! [`crate::refs::MAX_CHECK`], half of `RELY_AFTER`. Every server on a bucket must run this
//! version: an older one records nothing, and its writes are not protected. And they must
//! share one metadata store: the bucket records that store's id under its prefix
//! ([`METADATA_MARKER`]), and a server on another store is refused.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use object_store::{ObjectStore, ObjectStoreExt};

use bytes::Bytes;

use super::{S3Blobs, to_io};
use crate::blob_store::StoreError;
use crate::meta::{MetaStore, StillGone, duration_ms as ms, epoch_ms, now_ms};
use crate::{IoHash, Name};

/// A write that relies on a blob last written longer ago than this records it (and so does an
/// upload that took more than half of it).
pub const RELY_AFTER: Duration = Duration::from_secs(10 * 60);
/// The shortest grace a collection of blobs in S3 accepts: three times [`RELY_AFTER`]. A ref
/// whose check found a blob written up to `RELY_AFTER` before (so not recorded) is written
/// within [`crate::refs::MAX_CHECK`] of the check; what is left of the grace (15 minutes) is
/// for that write and for the clocks of the servers and S3 to differ.
pub const MIN_GRACE: Duration = Duration::from_secs(3 * 10 * 60);
/// A claim this old is a collection that stopped: it is taken over. Far above how long a
/// claim can last ([`CLAIM_DEADLINE`] plus one delete's bound), so that servers' clocks may
/// differ by minutes.
pub const CLAIM_STALE: Duration = Duration::from_secs(15 * 60);
/// A collection that held a claim this long (from just before it stamped it) when it is about
/// to send its delete gives the blob up.
pub const CLAIM_DEADLINE: Duration = Duration::from_secs(60);
/// A write that recorded an old blob as relied on this recently does not record it again:
/// the record keeps collections off it for the grace, at least `MIN_GRACE - RELY_AGAIN_AFTER`
/// from the later write.
const RELY_AGAIN_AFTER: Duration = Duration::from_secs(5 * 60);
/// The longest a collection asks the bucket whether a removed blob is still gone, while the
/// blob's content ids are locked.
const STILL_GONE_WITHIN: Duration = Duration::from_secs(5);
/// The longest a write waits for a collection's claim on a blob to end.
const WAIT_FOR_CLAIM: Duration = Duration::from_secs(120);
/// The longest pause between two looks of a write waiting for a claim to end.
pub const WAIT_STEP_MAX: Duration = Duration::from_millis(500);

/// The object under the prefix that names the metadata store whose servers use it. Namespaces
/// cannot start with `.`, so it is no blob.
pub const METADATA_MARKER: &str = ".tickwire-metadata-store";

/// Whether `written` is less than `age` ago.
fn written_lately(written: SystemTime, age: Duration) -> bool {
    written + age > SystemTime::now()
}

/// Ends a claim (a few tries: writes of the blob wait while it stands); if every try fails, the
/// claim goes stale instead, and what was done stands.
async fn release_claim(meta: &MetaStore, ns: &Name, id: IoHash, claimed: i64, gone: bool) {
    let mut pause = Duration::from_millis(100);
    for tries_left in (0..3).rev() {
        match meta.release_blob(ns, id, claimed, gone).await {
            Ok(()) => return,
            Err(e) if tries_left == 0 => {
                tracing::warn!(error = %e, blob = %id, "ending a garbage collection's claim failed; it goes stale in 15 min");
            }
            Err(_) => {
                tokio::time::sleep(pause).await;
                pause *= 4;
            }
        }
    }
}

/// How a removal under a claim ended.
enum Removal {
    Removed(u64),
    /// Gone already, written since the listing, or the claim grew too old.
    Kept,
    /// Nothing was sent to remove it.
    Failed(io::Error),
    /// The delete failed: it may still land.
    Unsure(io::Error),
}

impl S3Blobs {
    /// Makes the bucket's prefix this metadata store's (`id`, [`MetaStore::store_id`]): recorded
    /// there by the first server, and refused if another store's id is recorded.
    pub(in crate::blob_store) async fn bind_metadata(&self, id: &str) -> Result<(), StoreError> {
        let key = self.prefix.clone().join(METADATA_MARKER);
        let read = || async {
            match self.reads.get(&key).await {
                Ok(got) => Ok(Some(got.bytes().await.map_err(to_io)?)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(to_io(e)),
            }
        };
        let recorded = match read().await? {
            Some(recorded) => recorded,
            None => {
                self.sends.put(&key, Bytes::from(id.to_owned()).into()).await.map_err(to_io)?;
                // Read back: a server on another store may have written its own at once.
                read().await?.unwrap_or_default()
            }
        };
        if recorded == id.as_bytes() {
            return Ok(());
        }
        if recorded.is_empty() {
            return Err(StoreError::Config(format!("{key} in {} could not be read back", self.location)));
        }
        Err(StoreError::Config(format!(
            "{location} is used by the servers of another metadata store (its id is {other:?}; this \
             server's is {id}): garbage collection through one store would remove the blobs only \
             the other's refs name. Use another prefix, or the same --refs database (to give the \
             prefix to this store, delete the object {key} once no server of the other store runs)",
            location = self.location,
            other = String::from_utf8_lossy(&recorded),
        )))
    }

    /// Records writes' reliance and collections' claims in `meta` from now on (once).
    pub(in crate::blob_store) fn rely_through(&self, meta: MetaStore) {
        let _ = self.claims.set(meta);
    }

    /// The blob's size if the bucket has it, for a write that relies on the answer: a blob
    /// last written more than [`RELY_AFTER`] ago is recorded as relied on (waiting while a
    /// collection holds it), then asked of the bucket again. See the module's doc.
    pub(super) async fn stored_for_write(&self, ns: &Name, id: &IoHash) -> io::Result<Option<u64>> {
        let key = self.key(ns, id);
        let Some(found) = self.stat(&key).await? else { return Ok(None) };
        if self.claims.get().is_none()
            || written_lately(found.written, RELY_AFTER)
            || self.relied_lately(ns, id)
        {
            return Ok(Some(found.size));
        }
        self.relied_on(ns, id).await
    }

    /// Records that a write relies on blob `id` (waiting while a collection holds it), then its
    /// size if the bucket has it: a collection may have removed it just before the record.
    pub(super) async fn relied_on(&self, ns: &Name, id: &IoHash) -> io::Result<Option<u64>> {
        self.rely(ns, id).await?;
        self.head(&self.key(ns, id)).await
    }

    /// Whether an upload whose send began at `sending` took long enough that the bucket's date
    /// for it (when its upload began) may soon look old to a collection.
    pub(super) fn sent_slowly(&self, sending: SystemTime) -> bool {
        !written_lately(sending, RELY_AFTER / 2)
    }

    fn relied_lately(&self, ns: &Name, id: &IoHash) -> bool {
        let relied = self.relied.lock().unwrap_or_else(|p| p.into_inner()).get(&(ns.clone(), *id)).copied();
        relied.is_some_and(|at| at.elapsed() < RELY_AGAIN_AFTER)
    }

    /// Records that a write relies on blob `id`, waiting while a collection holds it.
    async fn rely(&self, ns: &Name, id: &IoHash) -> io::Result<()> {
        let Some(meta) = self.claims.get() else { return Ok(()) };
        let waited = Instant::now();
        let mut pause = Duration::from_millis(10);
        loop {
            let (recorded, now) = (Instant::now(), now_ms());
            if meta.rely_on_blob(ns, *id, now, now - ms(CLAIM_STALE)).await.map_err(io::Error::other)? {
                self.relied.lock().unwrap_or_else(|p| p.into_inner()).put((ns.clone(), *id), recorded);
                return Ok(());
            }
            // A claim ends within about a minute, unless its collection stopped or its delete
            // failed: then the write answers "busy, retry" rather than wait for it to go stale.
            if waited.elapsed() >= WAIT_FOR_CLAIM {
                let busy = format!("blob {id} is being removed by a garbage collection; retry");
                return Err(crate::blob_store::BeingCollected(busy).into_io());
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(WAIT_STEP_MAX);
        }
    }

    /// Whether writes record their reliance through a metadata store
    /// ([`S3Blobs::rely_through`]): collections run only then.
    pub(crate) fn relies_through_metadata(&self) -> bool {
        self.claims.get().is_some()
    }

    /// The namespace's blobs as the bucket lists them, with when each was last written
    /// (objects whose names are not blob ids are left out), a page of the listing at a time;
    /// it ends with the first error.
    pub(crate) fn list_namespace(&self, ns: &Name) -> BoxStream<'static, io::Result<(IoHash, SystemTime)>> {
        let prefix = self.prefix.clone().join(ns.as_str());
        self.reads
            .list(Some(&prefix))
            .map_err(to_io)
            .try_filter_map(|meta| async move {
                let id = meta.location.filename().and_then(|name| name.parse::<IoHash>().ok());
                Ok(id.map(|id| (id, meta.last_modified.into())))
            })
            .scan(false, |failed, listed| {
                let next = (!*failed).then(|| {
                    *failed = listed.is_err();
                    listed
                });
                std::future::ready(next)
            })
            .boxed()
    }

    /// Removes blob `id` of `ns` if it was last written before `before` and nothing keeps it
    /// (see the module's doc); its size if it was removed. On a task of its own, so that a
    /// collection stopped mid-way does not leave its claim to go stale.
    pub(crate) async fn delete_older(
        self: &Arc<Self>,
        meta: &MetaStore,
        ns: &Name,
        id: &IoHash,
        before: SystemTime,
    ) -> io::Result<Option<u64>> {
        let (this, meta, ns, id) = (self.clone(), meta.clone(), ns.clone(), *id);
        self.detached
            .spawn(async move {
                // Timed from before the stamp: the deadline covers the claim's own write.
                let started = Instant::now();
                let claimed = now_ms();
                let stale = claimed - ms(CLAIM_STALE);
                let held = meta.claim_blob(&ns, id, claimed, epoch_ms(before), stale).await;
                if !held.map_err(io::Error::other)? {
                    return Ok(None);
                }
                let (removed, release) = match this.remove_claimed(&ns, &id, before, (started, claimed)).await
                {
                    Removal::Removed(size) => (Ok(Some(size)), Some(true)),
                    Removal::Kept => (Ok(None), Some(false)),
                    Removal::Failed(e) => (Err(e), Some(false)),
                    // The claim stays until it is stale: a write of this blob waits until the
                    // delete can no longer land.
                    Removal::Unsure(e) => (Err(e), None),
                };
                if let Some(gone) = release {
                    release_claim(&meta, &ns, id, claimed, gone).await;
                }
                removed
            })
            .await
            .map_err(io::Error::other)?
    }

    /// The part of [`S3Blobs::delete_older`] done under the claim stamped `claimed` (ms since the
    /// epoch) just after `started`: both must be younger than [`CLAIM_DEADLINE`] when the delete
    /// goes (the monotonic clock does not run while the machine is suspended). The delete is
    /// sent once, never retried: a retry after an answer that was lost could land after a write
    /// found the blob gone and uploaded it again.
    async fn remove_claimed(
        &self,
        ns: &Name,
        id: &IoHash,
        before: SystemTime,
        (started, claimed): (Instant, i64),
    ) -> Removal {
        let key = self.key(ns, id);
        let found = match self.stat(&key).await {
            Ok(Some(found)) => found,
            Ok(None) => return Removal::Kept,
            Err(e) => return Removal::Failed(e),
        };
        let late = started.elapsed() > CLAIM_DEADLINE || now_ms() - claimed > ms(CLAIM_DEADLINE);
        if found.written >= before || late {
            return Removal::Kept;
        }
        // (With S3, which answers a delete of a missing object as done, a delete through the
        // API since the look above is counted twice in the usage, until the next start counts
        // again.)
        match self.removals.delete(&key).await {
            Ok(()) => self.usage.forget(1, found.size),
            // Some stores answer 404 for a blob gone since the look above (removed and counted
            // by whoever did it); S3 answers that as done.
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Removal::Unsure(to_io(e)),
        }
        self.forget_blob(ns, id).await;
        Removal::Removed(found.size)
    }

    /// Forgets `ns`'s records that protect nothing any more: writes' that relied on a blob
    /// before `young` (a collection's grace ago), and claims of collections that stopped.
    pub(crate) async fn prune_claims(
        &self,
        meta: &MetaStore,
        ns: &Name,
        young: SystemTime,
    ) -> io::Result<()> {
        let stale = now_ms() - ms(CLAIM_STALE);
        meta.prune_blob_claims(ns, epoch_ms(young), stale).await.map_err(io::Error::other)?;
        Ok(())
    }

    /// Whether a blob of `ns` the collection removed is still gone: asked of the bucket, within
    /// [`STILL_GONE_WITHIN`] (a content id's writes wait meanwhile); no answer counts as "there".
    pub(crate) fn still_gone(self: &Arc<Self>, ns: &Name) -> StillGone {
        let (this, ns) = (self.clone(), ns.clone());
        StillGone::Asked(Arc::new(move |id| {
            let (this, ns) = (this.clone(), ns.clone());
            Box::pin(async move {
                let key = this.key(&ns, &id);
                let asked = tokio::time::timeout(STILL_GONE_WITHIN, this.removals.head(&key)).await;
                matches!(asked, Ok(Err(object_store::Error::NotFound { .. })))
            })
        }))
    }
}

/// The tests' S3 server (`tests/common/s3.rs`).
#[cfg(test)]
#[path = "../../../tests/common/s3.rs"]
mod test_server;

#[cfg(test)]
mod tests {
    use super::test_server as server;
    use super::*;
    use crate::BlobStore;

    fn ns() -> Name {
        "ue.ddc".parse().unwrap()
    }

    fn set_written(config: &crate::S3Config, id: &IoHash, at: SystemTime) {
        server::set_written(config, &ns(), id, at);
    }

    async fn store() -> (tempfile::TempDir, crate::S3Config, BlobStore, MetaStore) {
        let config = server::bucket();
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open_s3(dir.path(), &config).await.unwrap();
        let meta = MetaStore::open(dir.path()).await.unwrap();
        store.rely_through(&meta);
        (dir, config, store, meta)
    }

    const HOUR: Duration = Duration::from_secs(3600);

    /// A collection removes a blob only if the bucket still says it is old once the claim is
    /// held: one written again since it was listed (here: written now) is kept. And never one
    /// another collection holds.
    #[tokio::test]
    async fn a_blob_written_since_the_listing_or_claimed_elsewhere_is_kept() {
        let (_dir, config, store, meta) = store().await;
        let s3 = store.s3().unwrap();
        let (fresh, _) = store.put(&ns(), None, &b"fresh"[..], u64::MAX).await.unwrap();
        let an_hour_ago = SystemTime::now() - HOUR;
        assert_eq!(s3.delete_older(&meta, &ns(), &fresh, an_hour_ago).await.unwrap(), None);
        assert!(store.exists(&ns(), &fresh).await.unwrap());

        let (old, size) = store.put(&ns(), None, &b"old"[..], u64::MAX).await.unwrap();
        set_written(&config, &old, SystemTime::now() - 2 * HOUR);
        let now = now_ms();
        assert!(meta.claim_blob(&ns(), old, now, now, now - ms(CLAIM_STALE)).await.unwrap());
        assert_eq!(s3.delete_older(&meta, &ns(), &old, an_hour_ago).await.unwrap(), None, "claimed");
        meta.release_blob(&ns(), old, now, false).await.unwrap();
        assert_eq!(s3.delete_older(&meta, &ns(), &old, an_hour_ago).await.unwrap(), Some(size));
        assert!(!store.exists(&ns(), &old).await.unwrap());
        // The claim ended with the blob (a claim still there would not be stale).
        assert!(meta.rely_on_blob(&ns(), old, now_ms(), now_ms() - ms(CLAIM_STALE)).await.unwrap());
    }

    /// A write that finds a blob written long ago records that it relies on it, which keeps a
    /// collection off it; one written lately records nothing.
    #[tokio::test]
    async fn a_write_relying_on_an_old_blob_keeps_collections_off_it() {
        let (_dir, config, store, meta) = store().await;
        let s3 = store.s3().unwrap();
        let (young, _) = store.put(&ns(), None, &b"young"[..], u64::MAX).await.unwrap();
        let (old, _) = store.put(&ns(), None, &b"old"[..], u64::MAX).await.unwrap();
        set_written(&config, &old, SystemTime::now() - 2 * HOUR);
        assert!(store.exists(&ns(), &young).await.unwrap());
        assert!(store.exists(&ns(), &old).await.unwrap());
        let an_hour_ago = SystemTime::now() - HOUR;
        assert_eq!(s3.delete_older(&meta, &ns(), &old, an_hour_ago).await.unwrap(), None, "relied on");
        assert!(store.exists(&ns(), &old).await.unwrap());
        // The young one has no record: a claim refused for any record at all gets it.
        let now = now_ms();
        assert!(meta.claim_blob(&ns(), young, now, 1, now - ms(CLAIM_STALE)).await.unwrap());
        assert!(!meta.claim_blob(&ns(), old, now, 1, now - ms(CLAIM_STALE)).await.unwrap(), "recorded");
    }

    /// A write that meets a claimed blob waits for the claim to end, then asks the bucket
    /// again: a blob removed meanwhile is reported gone, and an upload of it sends it again.
    #[tokio::test]
    async fn a_write_waits_for_a_claim_then_sees_the_blob_gone() {
        let (_dir, config, store, meta) = store().await;
        let store = Arc::new(store);
        let (old, _) = store.put(&ns(), None, &b"claimed"[..], u64::MAX).await.unwrap();
        set_written(&config, &old, SystemTime::now() - 2 * HOUR);
        let now = now_ms();
        assert!(meta.claim_blob(&ns(), old, now, now, now - ms(CLAIM_STALE)).await.unwrap());
        let check = tokio::spawn({
            let store = store.clone();
            async move { store.exists(&ns(), &old).await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!check.is_finished(), "the write waits while the blob is claimed");
        server::client(&config).delete(&server::key(&config, &ns(), &old)).await.unwrap();
        meta.release_blob(&ns(), old, now, true).await.unwrap();
        let found = tokio::time::timeout(Duration::from_secs(10), check).await.unwrap().unwrap();
        assert!(!found, "removed while the write waited");
        store.put(&ns(), Some(old), &b"claimed"[..], u64::MAX).await.unwrap();
        let head = server::client(&config).head(&server::key(&config, &ns(), &old)).await;
        assert!(head.is_ok(), "sent again");
    }

    /// A collection that held its claim past the deadline when it is about to delete gives the
    /// blob up: the claim may be close to stale for writes.
    #[tokio::test]
    async fn a_claim_held_past_its_deadline_removes_nothing() {
        let (_dir, config, store, _meta) = store().await;
        let s3 = store.s3().unwrap();
        let (old, _) = store.put(&ns(), None, &b"old"[..], u64::MAX).await.unwrap();
        set_written(&config, &old, SystemTime::now() - 2 * HOUR);
        let an_hour_ago = SystemTime::now() - HOUR;
        let long_ago = Instant::now().checked_sub(CLAIM_DEADLINE + Duration::from_secs(1)).unwrap();
        assert!(matches!(
            s3.remove_claimed(&ns(), &old, an_hour_ago, (long_ago, now_ms())).await,
            Removal::Kept
        ));
        let stamped_long_ago = now_ms() - ms(CLAIM_DEADLINE) - 1_000;
        let late = s3.remove_claimed(&ns(), &old, an_hour_ago, (Instant::now(), stamped_long_ago)).await;
        assert!(matches!(late, Removal::Kept), "stamped too long ago");
        assert!(store.exists(&ns(), &old).await.unwrap());
        assert!(matches!(
            s3.remove_claimed(&ns(), &old, an_hour_ago, (Instant::now(), now_ms())).await,
            Removal::Removed(3)
        ));
    }

    /// A claim older than its stale bound (a collection that stopped) does not hold a write up:
    /// the write takes it over.
    #[tokio::test]
    async fn a_write_takes_a_stale_claim_over() {
        let (_dir, config, store, meta) = store().await;
        let (old, _) = store.put(&ns(), None, &b"abandoned"[..], u64::MAX).await.unwrap();
        set_written(&config, &old, SystemTime::now() - 2 * HOUR);
        let then = now_ms() - ms(CLAIM_STALE) - 1_000;
        assert!(meta.claim_blob(&ns(), old, then, then, then - ms(CLAIM_STALE)).await.unwrap());
        let found = tokio::time::timeout(Duration::from_secs(10), store.exists(&ns(), &old)).await;
        assert!(found.expect("not held up").unwrap());
        let now = now_ms();
        assert!(
            !meta.claim_blob(&ns(), old, now, now - 1_000, now - ms(CLAIM_STALE)).await.unwrap(),
            "relied on"
        );
    }

    /// A content id goes with its blob only if the bucket still has no such blob: one uploaded
    /// again (here: never removed) keeps it.
    #[tokio::test]
    async fn a_content_id_stays_while_its_blob_is_there() {
        let (_dir, _config, store, meta) = store().await;
        let s3 = store.s3().unwrap();
        let (blob, _) = store.put(&ns(), None, &b"a compressed buffer"[..], u64::MAX).await.unwrap();
        let raw = IoHash::of(b"its payload");
        meta.put_content(&ns(), raw, blob).await.unwrap();
        assert_eq!(meta.forget_content_of(&ns(), vec![blob], s3.still_gone(&ns())).await.unwrap(), 0);
        assert_eq!(meta.content_blob(&ns(), raw).await.unwrap(), Some(blob));
        store.delete(&ns(), &blob).await.unwrap();
        assert_eq!(meta.forget_content_of(&ns(), vec![blob], s3.still_gone(&ns())).await.unwrap(), 1);
        assert_eq!(meta.content_blob(&ns(), raw).await.unwrap(), None);

        // More than one round of questions, in any order: each answer goes with its own blob.
        let mut gone = Vec::new();
        for i in 0..20u8 {
            let (blob, _) = store.put(&ns(), None, &[i; 3][..], u64::MAX).await.unwrap();
            meta.put_content(&ns(), IoHash::of(&[i]), blob).await.unwrap();
            if i % 3 != 0 {
                store.delete(&ns(), &blob).await.unwrap();
            }
            gone.push(blob);
        }
        assert_eq!(meta.forget_content_of(&ns(), gone, s3.still_gone(&ns())).await.unwrap(), 13);
        for i in 0..20u8 {
            let kept = meta.content_blob(&ns(), IoHash::of(&[i])).await.unwrap().is_some();
            assert_eq!(kept, i % 3 == 0, "{i}");
        }
    }

    /// A write that gives up on a claim says so with its own error (the API answers 503); an
    /// I/O error of the same kind from elsewhere (EBUSY) is not taken for it.
    #[test]
    fn only_a_collection_makes_a_write_busy() {
        use crate::blob_store::{BeingCollected, is_busy};
        assert!(is_busy(&BeingCollected("claimed".into()).into_io()));
        assert!(!is_busy(&io::Error::from(io::ErrorKind::ResourceBusy)));
        assert!(!is_busy(&io::Error::other("other")));
    }
}
