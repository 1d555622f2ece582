//! What garbage collection ([`crate::gc`]) asks of the metadata store: removing expired refs in
//! small batches, and reading, a page at a time, what the refs that remain name. Kept apart
//! from the request paths in `meta.rs`: nothing here runs on a request.

use std::path::PathBuf;

use rusqlite::{OptionalExtension, params};

use super::{MetaError, MetaStore, hash_of};
use crate::cb::CbType;
use crate::storage::attachment_hashes;
use crate::{IoHash, Name};

/// Where a page of refs ended: the last (bucket, key) read.
pub type RefCursor = (String, String);

/// One page of a namespace's refs, as the collector reads it.
#[derive(Debug, Default)]
pub struct RefPage {
    /// What the page's objects name, each as it is named (binary or object attachment).
    pub attachments: Vec<(CbType, IoHash)>,
    /// Where to start the next page; `None` after the last.
    pub next: Option<RefCursor>,
}

/// A page stops after this many refs or after the object that passes [`PAGE_BYTES`], so that
/// the reader connection (shared with requests) is held briefly.
const PAGE_REFS: usize = 256;
const PAGE_BYTES: usize = 4 << 20;

/// Rows one write transaction of the collector removes at most.
pub const EXPIRE_BATCH: usize = 1000;

impl MetaStore {
    /// Removes at most `limit` refs: finalized ones last read or written before `cut_ms`, and
    /// unfinalized ones before `unfinalized_cut_ms` (milliseconds since the Unix epoch).
    /// Returns how many. Call [`MetaStore::flush_access`] first, so recent reads count.
    pub async fn expire_refs(
        &self,
        cut_ms: i64,
        unfinalized_cut_ms: i64,
        limit: usize,
    ) -> Result<usize, MetaError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.write(move |c| {
            Ok(c.prepare_cached(
                // The LIMIT outside the union, so that the batch is found through the
                // (finalized, last_access) index and each row deleted by its primary key.
                "DELETE FROM refs WHERE (ns, bucket, key) IN (SELECT ns, bucket, key FROM (
                   SELECT ns, bucket, key FROM refs WHERE finalized = 0 AND last_access < ?2
                   UNION ALL
                   SELECT ns, bucket, key FROM refs WHERE finalized = 1 AND last_access < ?1
                 ) LIMIT ?3)",
            )?
            .execute(params![cut_ms, unfinalized_cut_ms, limit])?)
        })
        .await
    }

    /// The attachments named by one page of `ns`'s refs, in key order after `after` (from the
    /// start if `None`), read along the primary key. Objects are parsed in place, not copied
    /// out.
    pub async fn ref_attachments(&self, ns: &Name, after: Option<RefCursor>) -> Result<RefPage, MetaError> {
        let n = ns.as_str().to_owned();
        self.read(move |c| {
            let (bucket, key) = after.unwrap_or_default();
            let mut stmt = c.prepare_cached(
                "SELECT bucket, key, object FROM refs WHERE ns = ?1 AND (bucket, key) > (?2, ?3)
                 ORDER BY bucket, key",
            )?;
            let mut rows = stmt.query(params![n, bucket, key])?;
            let mut page = RefPage::default();
            let (mut refs, mut bytes) = (0, 0);
            while let Some(row) = rows.next()? {
                let object = row.get_ref(2)?.as_blob().map_err(rusqlite::Error::from)?;
                bytes += object.len();
                // Stored objects were parsed when they were put; one that no longer parses names
                // nothing it can keep alive.
                page.attachments.extend(attachment_hashes(object));
                refs += 1;
                if refs == PAGE_REFS || bytes >= PAGE_BYTES {
                    page.next = Some((row.get(0)?, row.get(1)?));
                    break;
                }
            }
            Ok(page)
        })
        .await
    }

    /// The refs of `ns` written (or read, once flushed) at or after `since_ms`, found through
    /// the (finalized, last_access) index without reading their objects.
    pub async fn refs_since(&self, ns: &Name, since_ms: i64) -> Result<Vec<RefCursor>, MetaError> {
        let n = ns.as_str().to_owned();
        self.read(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT bucket, key FROM refs INDEXED BY refs_by_access
                 WHERE ns = ?1 AND finalized IN (0, 1) AND last_access >= ?2",
            )?;
            let keys = stmt.query_map(params![n, since_ms], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(keys.collect::<Result<_, _>>()?)
        })
        .await
    }

    /// The attachments named by the refs `keys` of `ns` (those still there).
    pub async fn attachments_of_refs(
        &self,
        ns: &Name,
        keys: Vec<RefCursor>,
    ) -> Result<Vec<(CbType, IoHash)>, MetaError> {
        let n = ns.as_str().to_owned();
        self.read(move |c| {
            let mut stmt =
                c.prepare_cached("SELECT object FROM refs WHERE ns = ?1 AND bucket = ?2 AND key = ?3")?;
            let mut named = Vec::new();
            for (bucket, key) in keys {
                let mut rows = stmt.query(params![n, bucket, key])?;
                if let Some(row) = rows.next()? {
                    named
                        .extend(attachment_hashes(row.get_ref(0)?.as_blob().map_err(rusqlite::Error::from)?));
                }
            }
            Ok(named)
        })
        .await
    }

    /// The blobs holding the compressed buffers whose raw hashes are `raws` (those stored).
    pub async fn content_blobs(&self, ns: &Name, raws: Vec<IoHash>) -> Result<Vec<IoHash>, MetaError> {
        let n = ns.as_str().to_owned();
        self.read(move |c| {
            let mut stmt = c.prepare_cached("SELECT blob_id FROM content WHERE ns = ?1 AND raw_hash = ?2")?;
            let mut blobs = Vec::new();
            for raw in raws {
                let blob: Option<Vec<u8>> =
                    stmt.query_row(params![n, &raw.as_bytes()[..]], |r| r.get(0)).optional()?;
                if let Some(blob) = blob {
                    blobs.push(hash_of(blob)?);
                }
            }
            Ok(blobs)
        })
        .await
    }

    /// Forgets the content ids that name the blobs `gone` (removed by the collector), each
    /// only if its file (the path given) is still absent when the write runs: an upload of the
    /// same buffer since wrote the blob again, and writes its content id after this write.
    /// How many were forgotten.
    pub async fn forget_content_of(
        &self,
        ns: &Name,
        gone: Vec<(IoHash, PathBuf)>,
    ) -> Result<usize, MetaError> {
        if gone.is_empty() {
            return Ok(0);
        }
        let n = ns.as_str().to_owned();
        self.write(move |c| {
            let tx = c.transaction()?;
            let mut forgotten = 0;
            {
                let mut delete = tx.prepare_cached("DELETE FROM content WHERE ns = ?1 AND blob_id = ?2")?;
                for (blob, path) in gone {
                    if !path.try_exists().unwrap_or(true) {
                        forgotten += delete.execute(params![n, &blob.as_bytes()[..]])?;
                    }
                }
            }
            tx.commit()?;
            Ok(forgotten)
        })
        .await
    }
}

#[cfg(test)]
impl MetaStore {
    /// Sets every ref's last access to `at_ms`, for tests of expiry (writes stamp the time
    /// they commit).
    pub(crate) async fn age_all_refs(&self, at_ms: i64) -> Result<usize, MetaError> {
        self.write(move |c| Ok(c.execute("UPDATE refs SET last_access = ?1", [at_ms])?)).await
    }
}
