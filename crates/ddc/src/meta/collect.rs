//! What garbage collection ([`crate::gc`]) asks of the metadata store: removing expired refs in
//! small batches, and reading, a page at a time, what the refs that remain name. Kept apart
//! from the request paths in `meta.rs`: nothing here runs on a request.

use std::collections::HashSet;

use rusqlite::{OptionalExtension, params};

use super::{MetaError, MetaStore, hash_of};
use crate::cb::{self, CbType};
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
                "DELETE FROM refs WHERE (ns, bucket, key) IN (
                   SELECT ns, bucket, key FROM refs WHERE finalized = 0 AND last_access < ?2
                   UNION ALL
                   SELECT ns, bucket, key FROM refs WHERE finalized != 0 AND last_access < ?1
                   LIMIT ?3)",
            )?
            .execute(params![cut_ms, unfinalized_cut_ms, limit])?)
        })
        .await
    }

    /// The attachments named by one page of `ns`'s refs, in key order after `after` (from the
    /// start if `None`). With `since_ms`, only refs written or read since then (flushed reads).
    /// Objects are parsed in place, not copied out.
    pub async fn ref_attachments(
        &self,
        ns: &Name,
        after: Option<RefCursor>,
        since_ms: Option<i64>,
    ) -> Result<RefPage, MetaError> {
        let n = ns.as_str().to_owned();
        self.read(move |c| {
            let (bucket, key) = after.unwrap_or_default();
            let mut stmt = c.prepare_cached(
                "SELECT bucket, key, object FROM refs
                 WHERE ns = ?1 AND (bucket, key) > (?2, ?3) AND last_access >= ?4
                 ORDER BY bucket, key",
            )?;
            let mut rows = stmt.query(params![n, bucket, key, since_ms.unwrap_or(i64::MIN)])?;
            let mut page = RefPage::default();
            let (mut refs, mut bytes) = (0, 0);
            while let Some(row) = rows.next()? {
                let object = row.get_ref(2)?.as_blob().map_err(rusqlite::Error::from)?;
                bytes += object.len();
                // Stored objects were parsed when they were put; one that no longer parses names
                // nothing it can keep alive.
                if let Ok(field) = cb::parse(object) {
                    page.attachments
                        .extend(field.attachments().into_iter().map(|(ty, h)| (ty, IoHash::from_bytes(h))));
                }
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

    /// Forgets the content ids whose blobs are in `gone` (removed by the collector); how many.
    /// The table is read on the reader connection, and the rows deleted a batch at a time, each
    /// only if it still names the removed blob, so that writers wait for no scan.
    pub async fn forget_content_of(&self, ns: &Name, gone: HashSet<IoHash>) -> Result<usize, MetaError> {
        if gone.is_empty() {
            return Ok(0);
        }
        let n = ns.as_str().to_owned();
        let stale = self
            .read(move |c| {
                let mut stmt = c.prepare("SELECT raw_hash, blob_id FROM content WHERE ns = ?1")?;
                let mut rows = stmt.query([&n])?;
                let mut stale = Vec::new();
                while let Some(row) = rows.next()? {
                    let blob = row.get_ref(1)?.as_blob().map_err(rusqlite::Error::from)?;
                    if blob.len() == 20
                        && gone.contains(&IoHash::from_bytes(blob.try_into().expect("20 bytes")))
                    {
                        stale.push((row.get::<_, Vec<u8>>(0)?, blob.to_vec()));
                    }
                }
                Ok((n, stale))
            })
            .await?;
        let (n, stale) = stale;
        let mut forgotten = 0;
        for batch in stale.chunks(EXPIRE_BATCH).map(<[_]>::to_vec) {
            let n = n.clone();
            forgotten += self
                .write(move |c| {
                    let tx = c.transaction()?;
                    let mut deleted = 0;
                    {
                        let mut delete = tx.prepare_cached(
                            "DELETE FROM content WHERE ns = ?1 AND raw_hash = ?2 AND blob_id = ?3",
                        )?;
                        for (raw, blob) in batch {
                            deleted += delete.execute(params![n, raw, blob])?;
                        }
                    }
                    tx.commit()?;
                    Ok(deleted)
                })
                .await?;
        }
        Ok(forgotten)
    }
}
