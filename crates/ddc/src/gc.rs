//! Garbage collection: what keeps a cache's disk from growing for ever. A run removes the refs
//! nobody has read or written for `ref_ttl` (unfinalized ones after `unfinalized_ttl`), then,
//! namespace by namespace, the blobs no remaining ref names, directly or through object
//! attachments, once they are older than `blob_grace` (an upload waiting for its ref is
//! young). It works in small batches (a thousand refs per write, a page of refs per read, one
//! directory of blobs at a time), so requests never wait long behind it.
//!
//! Every decision takes `now` as an argument, so the tests run it days ahead instead of
//! waiting. Racing a run costs at most a cache miss, never a wrong answer: a ref written while
//! its blobs are being marked is marked again before the sweep, and a blob removed under a ref
//! written during the sweep makes that ref's next read find it missing (every read checks its
//! attachments) and the editor upload it again.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use crate::cb::{self, CbType};
use crate::meta::{RefCursor, RefPage};
use crate::storage::{Content, ContentError, MAX_ATTACHED_OBJECT};
use crate::{IoHash, Name};

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
}

/// Milliseconds since the Unix epoch of `t` (0 before it).
fn epoch_ms(t: SystemTime) -> i64 {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

impl Content {
    /// One collection as of `now`: expired refs, then unnamed blobs (see the module's doc).
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
            if expired < batch {
                break;
            }
            tokio::task::yield_now().await;
        }
        let young = now.checked_sub(policy.blob_grace).unwrap_or(SystemTime::UNIX_EPOCH);
        for ns in self.meta.namespaces() {
            self.sweep(&ns, young, &mut report).await?;
        }
        Ok(report)
    }

    /// Removes `ns`'s blobs that no ref names and that were last written before `young`.
    async fn sweep(&self, ns: &Name, young: SystemTime, report: &mut GcReport) -> Result<(), ContentError> {
        let started = epoch_ms(SystemTime::now());
        let mut live = Live::default();
        self.mark(ns, None, &mut live).await?;
        // Refs written (or read, and flushed) while the mark ran: their blobs too.
        self.meta.flush_access().await?;
        self.mark(ns, Some(started), &mut live).await?;
        let mut gone = HashSet::new();
        for shard in 0..=u8::MAX {
            for (id, modified) in self.blobs.list_shard(ns, shard).await? {
                if live.blobs.contains(&id) || modified >= young {
                    report.blobs_kept += 1;
                    continue;
                }
                match self.blobs.delete_older(ns, &id, young).await? {
                    Some(bytes) => {
                        report.blobs_removed += 1;
                        report.bytes_freed += bytes;
                        gone.insert(id);
                    }
                    None => report.blobs_kept += 1,
                }
            }
        }
        self.meta.forget_content_of(ns, gone).await?;
        Ok(())
    }

    /// Adds to `live` every blob `ns`'s refs name (those written since `since_ms`, if given):
    /// binary attachments as raw blobs and as the compressed buffers holding them, and object
    /// attachments with all they name in turn, each object read once.
    async fn mark(&self, ns: &Name, since_ms: Option<i64>, live: &mut Live) -> Result<(), ContentError> {
        let mut after: Option<RefCursor> = None;
        loop {
            let RefPage { attachments, next } = self.meta.ref_attachments(ns, after.take(), since_ms).await?;
            self.mark_attachments(ns, attachments, live).await?;
            match next {
                Some(cursor) => after = Some(cursor),
                None => return Ok(()),
            }
        }
    }

    async fn mark_attachments(
        &self,
        ns: &Name,
        attachments: Vec<(CbType, IoHash)>,
        live: &mut Live,
    ) -> Result<(), ContentError> {
        let mut objects = Vec::new();
        let mut binaries = Vec::new();
        for (ty, hash) in attachments {
            if !live.blobs.insert(hash) {
                continue; // Marked already, and what it names with it.
            }
            match ty {
                CbType::ObjectAttachment => objects.push(hash),
                _ => binaries.push(hash),
            }
        }
        live.blobs.extend(self.meta.content_blobs(ns, binaries).await?);
        // Object attachments name more, one object read at a time, charged as a presence
        // check's reads are; a chain of them is followed by the loop, not by recursion.
        while let Some(object) = objects.pop() {
            let Some((bytes, _held)) = self.read_blob(ns, &object, MAX_ATTACHED_OBJECT).await? else {
                continue;
            };
            let named = cb::parse(&bytes).map(|f| f.attachments()).unwrap_or_default();
            drop(bytes);
            let mut binaries = Vec::new();
            for (ty, hash) in named {
                let hash = IoHash::from_bytes(hash);
                if !live.blobs.insert(hash) {
                    continue;
                }
                match ty {
                    CbType::ObjectAttachment => objects.push(hash),
                    _ => binaries.push(hash),
                }
            }
            live.blobs.extend(self.meta.content_blobs(ns, binaries).await?);
        }
        Ok(())
    }
}

/// The blobs a namespace's refs name, found so far.
#[derive(Default)]
struct Live {
    blobs: HashSet<IoHash>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RefKey;
    use crate::cb::Value;
    use crate::meta::{RefRow, now_ms};

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

    /// A run removes the unfinalized ref after two hours and the finalized one after fourteen
    /// days, and with them the blobs only they named; until then, every blob the finalized ref
    /// names is kept: a raw blob, the compressed buffer holding a raw hash (and its content
    /// id), and an object attachment with the blob it names in turn. A blob nobody names goes
    /// once it is older than the grace.
    #[tokio::test]
    async fn a_run_removes_what_no_live_ref_names() {
        let dir = tempfile::tempdir().unwrap();
        let content = Content::open_in(dir.path(), 1 << 30).await;
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
    /// (its access noted in memory, not yet written) is not expired.
    #[tokio::test]
    async fn expiry_runs_in_batches_and_counts_recent_reads() {
        let dir = tempfile::tempdir().unwrap();
        let content = Content::open_in(dir.path(), 1 << 30).await;
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
        let read = format!("{:040x}", 7).parse::<RefKey>().unwrap();
        assert!(
            content.meta.get_ref(&ns(), &bucket, &read, &content.budget, 1 << 30).await.unwrap().is_some()
        );
        let report = content.collect(&GcPolicy::default(), SystemTime::now()).await.unwrap();
        assert_eq!(report.refs_expired, count as u64 - 1);
        assert!(content.meta.ref_state(&ns(), &bucket, &read).await.unwrap().is_some(), "read just now");
    }
}
