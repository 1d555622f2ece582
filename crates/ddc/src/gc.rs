//! Garbage collection: what keeps a cache's disk from growing for ever. A run removes the refs
//! nobody has read or written for `ref_ttl` (unfinalized ones after `unfinalized_ttl`), then,
//! namespace by namespace, the blobs no remaining ref names, directly or through object
//! attachments, once they are older than `blob_grace` (an upload waiting for its ref is
//! young). It works in small batches (a thousand refs per write, a page of refs per read, one
//! directory of blobs at a time), so requests never wait long behind it.
//!
//! Every decision takes `now` as an argument, so the tests run it days ahead instead of
//! waiting. Racing a run: a ref written while its blobs are being marked is marked again
//! before the sweep, and a ref is written finalized only if its check was short
//! ([`crate::refs::MAX_CHECK`]). Local blobs: from the first run on, a blob a presence check
//! relies on is marked as written now if it is old ([`crate::LocalBlobs::keep_fresh`]), and
//! the sweep takes each blob out of place and checks its time again before removing it. Blobs
//! in S3: writes record the old blobs they rely on, and the sweep claims each blob before it
//! looks a last time and removes it, both in the metadata store (`blob_store/s3/collect.rs`).
//! docs/ddc.md, "Garbage collection" and "Blobs in S3", say all of it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;

use crate::blob_store::S3Blobs;
use crate::cb::CbType;
use crate::meta::{RefCursor, RefPage, epoch_ms, now_ms};
use crate::storage::{Content, ContentError, MAX_ATTACHED_OBJECT, attachment_hashes};
use crate::{IoHash, LocalBlobs, Name};

/// When refs and blobs expire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcPolicy {
    /// A finalized ref not read or written for this long is removed.
    pub ref_ttl: Duration,
    /// An unfinalized ref not read or written for this long is removed.
    pub unfinalized_ttl: Duration,
    /// A blob no ref names is removed once it was last written at least this long ago.
    pub blob_grace: Duration,
}

impl Default for GcPolicy {
    /// The reference server's: refs 14 days after their last access, unfinalized refs after
    /// 2 hours; unnamed blobs after 1 hour.
    fn default() -> Self {
        GcPolicy {
            ref_ttl: Duration::from_secs(14 * 24 * 3600),
            unfinalized_ttl: Duration::from_secs(2 * 3600),
            blob_grace: Duration::from_secs(3600),
        }
    }
}

/// What one run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GcReport {
    /// Refs removed as expired.
    pub refs_expired: u64,
    /// Blobs removed because no ref names them.
    pub blobs_removed: u64,
    /// Their bytes.
    pub bytes_freed: u64,
    /// Blobs looked at and kept (named, or younger than the grace).
    pub blobs_kept: u64,
    /// Blobs in S3 a sweep could not remove (a request failed; logged): the next run tries
    /// again.
    pub blobs_failed: u64,
}

impl GcReport {
    fn removed(&mut self, bytes: u64) {
        self.blobs_removed += 1;
        self.bytes_freed += bytes;
    }
}

/// What a sweep of blobs in S3 did with one listed blob.
enum Swept {
    Removed(IoHash, u64),
    Kept,
    Failed(IoHash, std::io::Error),
    /// The listing failed.
    Unlisted(std::io::Error),
}

/// How long before a sweep's mark began a ref must have been written to be marked again.
const REMARK_MARGIN_MS: i64 = 60_000;

/// Blobs in S3 a sweep looks at (claims, asks the bucket about, removes) at once.
const SWEEP_S3_AT_ONCE: usize = 8;

/// Removed blobs whose content ids are forgotten in one go.
const FORGET_BATCH: usize = 256;

impl Content {
    /// One collection as of `now`: expired refs, then unnamed blobs (see the module's doc).
    /// Blobs are left alone until the count of the store made at start has finished, so that
    /// the count never goes below what is there.
    pub async fn collect(&self, policy: &GcPolicy, now: SystemTime) -> Result<GcReport, ContentError> {
        let mut report = GcReport::default();
        self.meta.flush_access().await?;
        let cut = epoch_ms(now.checked_sub(policy.ref_ttl).unwrap_or(SystemTime::UNIX_EPOCH));
        let unfinalized_cut =
            epoch_ms(now.checked_sub(policy.unfinalized_ttl).unwrap_or(SystemTime::UNIX_EPOCH));
        loop {
            let batch = crate::meta::EXPIRE_BATCH;
            let expired = self.meta.expire_refs(cut, unfinalized_cut, batch).await?;
            report.refs_expired += expired as u64;
            // Until a batch finds nothing: with Postgres, a batch may delete fewer than it
            // found (a ref freshened meanwhile is re-checked and kept) while more remain.
            if expired == 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        let young = now.checked_sub(policy.blob_grace).unwrap_or(SystemTime::UNIX_EPOCH);
        if let Some(local) = self.blobs.local() {
            // From now on, a blob a presence check relies on is never old enough to be swept.
            local.keep_fresh(policy.blob_grace / 2);
            if !local.usage().counted.load(Ordering::Relaxed) {
                return Ok(report);
            }
            for ns in self.meta.namespaces().await? {
                self.sweep(local, &ns, young, &mut report).await?;
            }
        } else if let Some(s3) = self.blobs.s3() {
            let (grace, min) = (policy.blob_grace, self.blobs.min_blob_grace());
            if grace < min {
                return Err(ContentError::GraceTooShort { grace, min });
            }
            // Collections are safe only while this server's own writes record their reliance.
            if !self.blobs.usage().counted.load(Ordering::Relaxed) || !s3.relies_through_metadata() {
                return Ok(report);
            }
            for ns in self.meta.namespaces().await? {
                self.sweep_s3(s3, &ns, young, &mut report).await?;
            }
        }
        Ok(report)
    }

    /// Removes `ns`'s blobs that no ref names and that were last written before `young`.
    async fn sweep(
        &self,
        local: &LocalBlobs,
        ns: &Name,
        young: SystemTime,
        report: &mut GcReport,
    ) -> Result<(), ContentError> {
        let live = self.live(ns).await?;
        for shard in 0..=u8::MAX {
            let mut gone = Vec::new();
            for (id, modified) in local.list_shard(ns, shard).await? {
                if live.keeps(&id) || modified >= young {
                    report.blobs_kept += 1;
                    continue;
                }
                match local.delete_older(ns, &id, young).await? {
                    Some(bytes) => {
                        report.removed(bytes);
                        gone.push(id);
                    }
                    None => report.blobs_kept += 1,
                }
            }
            // A content id goes with its blob, unless the same buffer was uploaded again since
            // (its blob is back, with the same id).
            self.meta.forget_content_of(ns, gone, local.still_gone(ns)).await?;
        }
        Ok(())
    }

    /// [`Content::sweep`] for blobs in S3: the bucket's listing of `ns`, each blob no ref
    /// names and older than `young` removed under a claim in the metadata store
    /// (`blob_store/s3/collect.rs`), [`SWEEP_S3_AT_ONCE`] at a time.
    async fn sweep_s3(
        &self,
        s3: &Arc<S3Blobs>,
        ns: &Name,
        young: SystemTime,
        report: &mut GcReport,
    ) -> Result<(), ContentError> {
        let live = self.live(ns).await?;
        let live = &live;
        // A listing that fails ends with its error (the blobs in flight are still awaited).
        let mut outcomes = s3
            .list_namespace(ns)
            .map(|listed| async move {
                let (id, written) = match listed {
                    Ok(listed) => listed,
                    Err(e) => return Swept::Unlisted(e),
                };
                if live.keeps(&id) || written >= young {
                    return Swept::Kept;
                }
                match s3.delete_older(&self.meta, ns, &id, young).await {
                    Ok(Some(bytes)) => Swept::Removed(id, bytes),
                    Ok(None) => Swept::Kept,
                    Err(e) => Swept::Failed(id, e),
                }
            })
            .buffer_unordered(SWEEP_S3_AT_ONCE);
        // One blob that fails is logged and counted, and the sweep goes on; a listing that fails
        // ends it once the blobs in flight are done. Either way, the blobs removed have their
        // content ids forgotten (unless the metadata store fails too).
        let mut gone = Vec::new();
        let mut unlisted = None;
        while let Some(outcome) = outcomes.next().await {
            match outcome {
                Swept::Removed(id, bytes) => {
                    report.removed(bytes);
                    gone.push(id);
                }
                Swept::Kept => report.blobs_kept += 1,
                Swept::Failed(id, e) => {
                    report.blobs_failed += 1;
                    tracing::warn!(error = %e, namespace = %ns, blob = %id, "garbage collection could not remove a blob");
                }
                Swept::Unlisted(e) => unlisted = Some(e),
            }
            if gone.len() >= FORGET_BATCH {
                self.meta.forget_content_of(ns, std::mem::take(&mut gone), s3.still_gone(ns)).await?;
            }
        }
        drop(outcomes);
        self.meta.forget_content_of(ns, gone, s3.still_gone(ns)).await?;
        s3.prune_claims(&self.meta, ns, young).await?;
        unlisted.map_or(Ok(()), |e| Err(e.into()))
    }

    /// The blobs `ns`'s refs name: every ref's, then again those of refs written while the
    /// first pass ran.
    async fn live(&self, ns: &Name) -> Result<Live, ContentError> {
        // A write is stamped just before it commits: a margin for one that waited long on the
        // disk after its stamp, and for a clock set back a little.
        let started = now_ms() - REMARK_MARGIN_MS;
        let mut live = Live::default();
        let mut after: Option<RefCursor> = None;
        loop {
            let RefPage { attachments, next, .. } = self.meta.ref_attachments(ns, after.take()).await?;
            self.mark(ns, attachments, &mut live).await?;
            match next {
                Some(cursor) => after = Some(cursor),
                None => break,
            }
        }
        // Refs written (or read, and flushed) while the mark ran: their blobs too. Writes stamp
        // the time they commit, so none that committed after the pages above passed its key
        // is missed.
        self.meta.flush_access().await?;
        let since = self.meta.refs_since(ns, started).await?;
        for keys in since.chunks(256) {
            let attachments = self.meta.attachments_of_refs(ns, keys.to_vec()).await?;
            self.mark(ns, attachments, &mut live).await?;
        }
        Ok(live)
    }

    /// Adds to `live` every blob `attachments` name: binary attachments as raw blobs and as
    /// the compressed buffers holding them, and object attachments with all they name in
    /// turn, each object read once.
    async fn mark(
        &self,
        ns: &Name,
        attachments: Vec<(CbType, IoHash)>,
        live: &mut Live,
    ) -> Result<(), ContentError> {
        let mut objects = Vec::new();
        let binaries = live.add(attachments, &mut objects);
        live.keep_all(self.meta.content_blobs(ns, binaries).await?);
        // Object attachments name more, one object read at a time, charged as a presence
        // check's reads are; a chain of them is followed by this loop, not by recursion.
        while let Some(object) = objects.pop() {
            // Not marked as written by this read: it is kept because it is named.
            let read = self.read_blob_marking(ns, &object, MAX_ATTACHED_OBJECT, false).await?;
            let Some((bytes, _held)) = read else { continue };
            let named = attachment_hashes(&bytes).collect();
            drop(bytes);
            let binaries = live.add(named, &mut objects);
            live.keep_all(self.meta.content_blobs(ns, binaries).await?);
        }
        Ok(())
    }
}

/// The blobs a namespace's refs name, found so far, each with how it was named: one map entry
/// per hash (20 bytes and a byte of flags), which is what a run's memory grows with. A hash
/// named as a binary attachment and as an object attachment (a compressed buffer whose payload
/// is the object) is followed both ways.
#[derive(Default)]
struct Live(HashMap<IoHash, u8>);

/// Flags of a hash in [`Live`] (none: kept, as a compressed buffer found through a content id).
const NAMED_AS_BINARY: u8 = 1;
const NAMED_AS_OBJECT: u8 = 2;

impl Live {
    fn keeps(&self, id: &IoHash) -> bool {
        self.0.contains_key(id)
    }

    /// Keeps these blobs (compressed buffers found through content ids).
    fn keep_all(&mut self, ids: impl IntoIterator<Item = IoHash>) {
        for id in ids {
            self.0.entry(id).or_default();
        }
    }

    /// Keeps what `named` names; pushes the object attachments not followed yet onto
    /// `objects`, and returns the binary attachments not looked up yet (their compressed
    /// buffers are kept too).
    fn add(&mut self, named: Vec<(CbType, IoHash)>, objects: &mut Vec<IoHash>) -> Vec<IoHash> {
        let mut binaries = Vec::new();
        for (ty, hash) in named {
            let object = ty == CbType::ObjectAttachment;
            let how = if object { NAMED_AS_OBJECT } else { NAMED_AS_BINARY };
            let flags = self.0.entry(hash).or_default();
            if *flags & how != 0 {
                continue;
            }
            *flags |= how;
            if object {
                objects.push(hash);
            } else {
                binaries.push(hash);
            }
        }
        binaries
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RefKey;
    use crate::cb::Value;
    use crate::meta::RefRow;
    use crate::meta::testing::{TestBackend, TestPlace, on_each_backend};

    on_each_backend!(
        a_run_removes_what_no_live_ref_names,
        expiry_runs_in_batches_and_counts_recent_reads,
        a_hash_named_both_ways_is_followed_as_an_object,
        a_reupload_restarts_the_grace,
        refs_written_since_a_time_are_found,
        a_blob_a_check_relies_on_is_kept_fresh,
        a_run_does_not_mark_what_it_reads,
    );

    const HOUR: Duration = Duration::from_secs(3600);
    const DAY: Duration = Duration::from_secs(24 * 3600);

    fn ns() -> Name {
        "ue.ddc".parse().unwrap()
    }

    async fn blob(content: &Content, bytes: &[u8]) -> IoHash {
        content.blobs.put(&ns(), None, bytes, u64::MAX).await.unwrap().0
    }

    async fn put_ref(content: &Content, key: &str, object: Vec<u8>, finalized: bool) {
        let row = RefRow { object_hash: IoHash::of(&object), object, finalized, last_access_ms: now_ms() };
        let (bucket, key) = (Name::bucket("b").unwrap(), key.repeat(40).parse::<RefKey>().unwrap());
        assert!(content.meta.put_ref(&ns(), &bucket, &key, row, true).await.unwrap());
    }

    async fn has(content: &Content, id: IoHash) -> bool {
        content.blobs.exists(&ns(), &id).await.unwrap()
    }

    /// Sets when the file at `path` was last written.
    fn set_written(path: &std::path::Path, at: SystemTime) {
        std::fs::File::options().write(true).open(path).unwrap().set_modified(at).unwrap();
    }

    /// A store whose count of blobs at start has finished (a collection sweeps only then).
    async fn store(place: &TestPlace) -> Content {
        let content = Content::open_at(place, 1 << 30).await;
        for _ in 0..500 {
            if content.blobs.usage().counted.load(std::sync::atomic::Ordering::Relaxed) {
                return content;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the count at start did not finish");
    }

    /// A run removes the unfinalized ref after two hours and the finalized one after fourteen
    /// days, and with them the blobs only they named; until then, every blob the finalized ref
    /// names is kept: a raw blob, the compressed buffer holding a raw hash (and its content
    /// id), and an object attachment with the blob it names in turn. A blob nobody names goes
    /// once it is older than the grace.
    async fn a_run_removes_what_no_live_ref_names(backend: TestBackend) {
        let Some(place) = TestPlace::new(backend) else { return };
        let content = store(&place).await;
        let raw = blob(&content, b"raw blob").await;
        let payload = b"compressed payload";
        let raw_hash = IoHash::of(payload);
        let buffer = blob(&content, &crate::compressed::encode_none(payload)).await;
        content.meta.put_content(&ns(), raw_hash, buffer).await.unwrap();
        let nested = blob(&content, b"named by an object attachment").await;
        let object = blob(
            &content,
            &Value::Object(vec![("n".into(), Value::BinaryAttachment(*nested.as_bytes()))]).to_bytes(),
        )
        .await;
        let only_unfinalized = blob(&content, b"named by an unfinalized ref").await;
        let unnamed = blob(&content, b"named by nothing").await;
        let names = |fields: Vec<(&str, Value)>| {
            Value::Object(fields.into_iter().map(|(n, v)| (n.to_owned(), v)).collect()).to_bytes()
        };
        put_ref(
            &content,
            "a",
            names(vec![
                ("raw", Value::BinaryAttachment(*raw.as_bytes())),
                ("comp", Value::BinaryAttachment(*raw_hash.as_bytes())),
                ("obj", Value::ObjectAttachment(*object.as_bytes())),
            ]),
            true,
        )
        .await;
        put_ref(
            &content,
            "b",
            names(vec![("w", Value::BinaryAttachment(*only_unfinalized.as_bytes()))]),
            false,
        )
        .await;
        let policy = GcPolicy::default();
        let now = SystemTime::now();

        let early = content.collect(&policy, now + HOUR / 2).await.unwrap();
        assert_eq!((early.refs_expired, early.blobs_removed, early.blobs_kept), (0, 0, 6), "all young");

        let report = content.collect(&policy, now + 3 * HOUR).await.unwrap();
        assert_eq!((report.refs_expired, report.blobs_removed), (1, 2), "{report:?}");
        assert!(!has(&content, unnamed).await && !has(&content, only_unfinalized).await);
        for kept in [raw, buffer, object, nested] {
            assert!(has(&content, kept).await, "{kept} is named by the live ref");
        }
        assert_eq!(content.meta.content_blob(&ns(), raw_hash).await.unwrap(), Some(buffer));

        let late = content.collect(&policy, now + 15 * DAY).await.unwrap();
        assert_eq!((late.refs_expired, late.blobs_removed, late.blobs_kept), (1, 4, 0), "{late:?}");
        assert_eq!(content.meta.content_blob(&ns(), raw_hash).await.unwrap(), None, "its content id too");
        assert_eq!(content.blobs.usage().blobs.load(std::sync::atomic::Ordering::Relaxed), 0);
    }

    /// Expired refs are removed a batch at a time, all of them in one run; a ref read since
    /// (its access noted in memory, not yet written) is not expired, nor one PUT again with the
    /// object it holds (which writes nothing).
    async fn expiry_runs_in_batches_and_counts_recent_reads(backend: TestBackend) {
        let Some(place) = TestPlace::new(backend) else { return };
        let content = store(&place).await;
        let empty = Value::Object(vec![]).to_bytes();
        let old = now_ms() - 20 * 24 * 3600 * 1000;
        let bucket = Name::bucket("b").unwrap();
        let count = crate::meta::EXPIRE_BATCH + 5;
        for i in 0..count {
            let key = format!("{i:040x}").parse::<RefKey>().unwrap();
            let row = RefRow {
                object_hash: IoHash::of(&empty),
                object: empty.clone(),
                finalized: true,
                last_access_ms: old,
            };
            content.meta.put_ref(&ns(), &bucket, &key, row, true).await.unwrap();
        }
        assert_eq!(content.meta.age_all_refs(old).await.unwrap(), count);
        let read = format!("{:040x}", 7).parse::<RefKey>().unwrap();
        assert!(
            content.meta.get_ref(&ns(), &bucket, &read, &content.budget, 1 << 30).await.unwrap().is_some()
        );
        let again = format!("{:040x}", 8).parse::<RefKey>().unwrap();
        let addr = crate::refs::RefAddr { ns: ns(), bucket: bucket.clone(), key: again.clone() };
        let put = crate::refs::put(&content, &addr, empty.clone(), false, 0).await.unwrap();
        assert!(matches!(put, crate::refs::PutOutcome::Stored { ref needs } if needs.is_empty()));
        let report = content.collect(&GcPolicy::default(), SystemTime::now()).await.unwrap();
        assert_eq!(report.refs_expired, count as u64 - 2);
        assert!(content.meta.ref_state(&ns(), &bucket, &read).await.unwrap().is_some(), "read just now");
        assert!(
            content.meta.ref_state(&ns(), &bucket, &again).await.unwrap().is_some(),
            "put again just now"
        );
    }

    /// A hash named as a binary attachment by one ref (a compressed buffer whose payload is an
    /// object) and as an object attachment by another is followed both ways: what the object
    /// names is kept.
    async fn a_hash_named_both_ways_is_followed_as_an_object(backend: TestBackend) {
        let Some(place) = TestPlace::new(backend) else { return };
        let content = store(&place).await;
        let child = blob(&content, b"named by the object").await;
        let object = Value::Object(vec![("c".into(), Value::BinaryAttachment(*child.as_bytes()))]).to_bytes();
        let hash = blob(&content, &object).await;
        let buffer = blob(&content, &crate::compressed::encode_none(&object)).await;
        content.meta.put_content(&ns(), hash, buffer).await.unwrap();
        // Key order: the binary name is met first.
        put_ref(
            &content,
            "a",
            Value::Object(vec![("v".into(), Value::BinaryAttachment(*hash.as_bytes()))]).to_bytes(),
            true,
        )
        .await;
        put_ref(
            &content,
            "b",
            Value::Object(vec![("o".into(), Value::ObjectAttachment(*hash.as_bytes()))]).to_bytes(),
            true,
        )
        .await;
        let report = content.collect(&GcPolicy::default(), SystemTime::now() + 3 * HOUR).await.unwrap();
        assert_eq!((report.blobs_removed, report.blobs_kept), (0, 3), "{report:?}");
        assert!(has(&content, child).await);
    }

    /// The live set follows each hash once per way it is named, whatever was kept before: a
    /// hash kept as a compressed buffer (through a content id) and then named is still
    /// followed, and one named both ways is followed both ways.
    #[test]
    fn the_live_set_follows_each_way_a_hash_is_named_once() {
        let (a, b) = (IoHash::of(b"a"), IoHash::of(b"b"));
        let mut live = Live::default();
        live.keep_all([a, b]);
        assert!(live.keeps(&a) && !live.keeps(&IoHash::of(b"c")));
        let mut objects = Vec::new();
        let binaries =
            live.add(vec![(CbType::ObjectAttachment, a), (CbType::BinaryAttachment, b)], &mut objects);
        assert_eq!((objects.clone(), binaries), (vec![a], vec![b]), "kept before, followed now");
        let again =
            live.add(vec![(CbType::ObjectAttachment, a), (CbType::BinaryAttachment, b)], &mut objects);
        assert_eq!((objects.len(), again.len()), (1, 0), "each way once");
        let other_way =
            live.add(vec![(CbType::BinaryAttachment, a), (CbType::ObjectAttachment, b)], &mut objects);
        assert_eq!((objects, other_way), (vec![a, b], vec![a]), "the other way too");
    }

    /// From the first run on, an upload of a blob already stored (not written again) that is
    /// older than half the grace restarts its grace.
    async fn a_reupload_restarts_the_grace(backend: TestBackend) {
        let Some(place) = TestPlace::new(backend) else { return };
        let content = store(&place).await;
        content.collect(&GcPolicy::default(), SystemTime::now()).await.unwrap();
        let id = blob(&content, b"uploaded twice").await;
        content.meta.add_namespace(&ns()).await.unwrap();
        let path = content.blobs.local().unwrap().blob_path(&ns(), &id);
        let age = || set_written(&path, SystemTime::now() - 2 * HOUR);
        age();
        // What an upload of it does before it answers.
        assert!(content.blobs.exists(&ns(), &id).await.unwrap());
        let kept = content.collect(&GcPolicy::default(), SystemTime::now()).await.unwrap();
        assert_eq!((kept.blobs_removed, kept.blobs_kept), (0, 1));
        age();
        let removed = content.collect(&GcPolicy::default(), SystemTime::now()).await.unwrap();
        assert_eq!(removed.blobs_removed, 1);
        assert!(!content.blobs.exists(&ns(), &id).await.unwrap());
    }

    /// Writes stamp the time they commit, and the refs written since a time are found without
    /// reading the others (what a collection marks again before it sweeps).
    async fn refs_written_since_a_time_are_found(backend: TestBackend) {
        let Some(place) = TestPlace::new(backend) else { return };
        let content = store(&place).await;
        let empty = Value::Object(vec![]).to_bytes();
        put_ref(&content, "a", empty.clone(), true).await;
        put_ref(&content, "b", empty.clone(), false).await;
        content.meta.age_all_refs(now_ms() - 1000).await.unwrap();
        let since = now_ms();
        assert_eq!(content.meta.refs_since(&ns(), since).await.unwrap(), vec![]);
        // Built with an old time, written now: stamped now.
        let row =
            RefRow { object_hash: IoHash::of(&empty), object: empty, finalized: true, last_access_ms: 0 };
        let key = "c".repeat(40).parse::<RefKey>().unwrap();
        content.meta.put_ref(&ns(), &Name::bucket("b").unwrap(), &key, row, true).await.unwrap();
        assert_eq!(
            content.meta.refs_since(&ns(), since).await.unwrap(),
            vec![("b".to_owned(), "c".repeat(40))]
        );
    }

    /// From the first run on, a blob a presence check finds that was last written more than
    /// half the grace ago is marked as written now, so a sweep under way keeps what a new ref
    /// relies on. Before the first run, nothing is marked.
    async fn a_blob_a_check_relies_on_is_kept_fresh(backend: TestBackend) {
        let Some(place) = TestPlace::new(backend) else { return };
        let content = store(&place).await;
        let id = blob(&content, b"relied on").await;
        let path = content.blobs.local().unwrap().blob_path(&ns(), &id);
        let two_hours_ago = SystemTime::now() - 2 * HOUR;
        let set = |t: SystemTime| set_written(&path, t);
        let modified = || std::fs::metadata(&path).unwrap().modified().unwrap();
        set(two_hours_ago);
        assert!(has(&content, id).await);
        assert_eq!(modified(), two_hours_ago, "no collection yet: not marked");
        content.collect(&GcPolicy::default(), SystemTime::now()).await.unwrap();
        set(two_hours_ago);
        assert!(has(&content, id).await);
        assert!(modified() > SystemTime::now() - HOUR / 2, "found by a check: marked as written now");
        set(two_hours_ago);
        assert!(content.blobs.open_blob(&ns(), &id).await.unwrap().is_some());
        assert!(modified() > SystemTime::now() - HOUR / 2, "read by a check: marked too");
    }

    /// A blob a sweep had taken out of place when the process stopped is put back at the
    /// next start (it may have been written again a moment before); other temp files go.
    #[tokio::test]
    async fn a_taken_blob_is_put_back_at_start() {
        let dir = TestPlace::new(TestBackend::Sqlite).unwrap();
        let content = store(&dir).await;
        let id = blob(&content, b"taken out").await;
        let place = content.blobs.local().unwrap().blob_path(&ns(), &id);
        let taken = dir.dir().join(".tmp").join(format!("1-1.gc.ue.ddc.{}", id.to_hex()));
        std::fs::rename(&place, &taken).unwrap();
        std::fs::write(dir.dir().join(".tmp").join("1-2"), b"an upload cut short").unwrap();
        drop(content);
        let content = store(&dir).await;
        assert!(has(&content, id).await, "back in place");
        assert_eq!(std::fs::read_dir(dir.dir().join(".tmp")).unwrap().count(), 0);
    }

    /// The collector's own reads of object attachments do not mark them as written: a named
    /// object is kept because it is named, and a run writes no inode times.
    async fn a_run_does_not_mark_what_it_reads(backend: TestBackend) {
        let Some(place) = TestPlace::new(backend) else { return };
        let content = store(&place).await;
        let object = blob(&content, &Value::Object(vec![("n".into(), Value::Integer(1))]).to_bytes()).await;
        put_ref(
            &content,
            "a",
            Value::Object(vec![("o".into(), Value::ObjectAttachment(*object.as_bytes()))]).to_bytes(),
            true,
        )
        .await;
        let path = content.blobs.local().unwrap().blob_path(&ns(), &object);
        let two_hours_ago = SystemTime::now() - 2 * HOUR;
        set_written(&path, two_hours_ago);
        for _ in 0..2 {
            let report = content.collect(&GcPolicy::default(), SystemTime::now()).await.unwrap();
            assert_eq!((report.blobs_removed, report.blobs_kept), (0, 1));
        }
        assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), two_hours_ago);
    }
}
