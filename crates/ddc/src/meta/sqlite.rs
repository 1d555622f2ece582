//! The embedded metadata backend: one SQLite file (`<root>/.meta/ddc.sqlite`) in WAL mode, the
//! default, so that `tickwire ddc` needs no service beside it.
//!
//! Durability: every write is one transaction committed with `synchronous=FULL`, so a write
//! acknowledged to a client survives `kill -9` and power loss, and a crash mid-write leaves the
//! row as it was.
//!
//! SQLite calls block, so they run on tokio's blocking pool. Reads and writes use separate
//! connections: a read never waits behind a write's fsync. There is one writer, so a write's
//! checks and its change are one step no other write can come between.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};

use super::{
    META_DIR, MetaError, RefCursor, RefId, RefPage, RefRow, StillGone, Stored, charge, hash_of, now_ms,
};
use crate::budget::{Held, MemoryBudget};
use crate::storage::attachment_hashes;
use crate::{IoHash, Name};

mod claims;

const FILE: &str = "ddc.sqlite";

/// Blobs a collection asks the bucket about at once while it forgets their content ids.
const ASKED_AT_ONCE: usize = 8;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS namespaces (
    ns TEXT PRIMARY KEY
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS refs (
    ns TEXT NOT NULL,
    bucket TEXT NOT NULL,
    key TEXT NOT NULL,
    object_hash BLOB NOT NULL,
    object BLOB NOT NULL,
    finalized INTEGER NOT NULL,
    last_access INTEGER NOT NULL,
    PRIMARY KEY (ns, bucket, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS refs_by_access ON refs (finalized, last_access);
CREATE TABLE IF NOT EXISTS content (
    ns TEXT NOT NULL,
    raw_hash BLOB NOT NULL,
    blob_id BLOB NOT NULL,
    PRIMARY KEY (ns, raw_hash)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS content_by_blob ON content (ns, blob_id);
CREATE TABLE IF NOT EXISTS blob_gc (
    ns TEXT NOT NULL,
    blob_id BLOB NOT NULL,
    relied INTEGER NOT NULL,
    claimed INTEGER,
    PRIMARY KEY (ns, blob_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS store_identity (
    one BOOLEAN PRIMARY KEY CHECK (one),
    id TEXT NOT NULL
);
";

fn connect(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(30))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    Ok(conn)
}

/// The SQLite backend; cheap to clone.
#[derive(Clone)]
pub(super) struct Sqlite {
    writer: Arc<Mutex<Connection>>,
    reader: Arc<Mutex<Connection>>,
    /// Held by a content id's write, and by the collector while it checks that a blob it
    /// removed is still gone and forgets its content ids: so that an upload of the same buffer
    /// writes its id either before the check (and its blob is seen) or after the forgetting.
    /// Not the writer's lock, which the check (a HEAD, with blobs in S3) would hold up.
    content_ids: Arc<tokio::sync::Mutex<()>>,
}

impl Sqlite {
    /// Opens (creating if needed) the file under `root`; with the namespaces it holds.
    pub async fn open(root: &Path) -> Result<(Sqlite, Vec<Name>), MetaError> {
        let dir = root.join(META_DIR);
        tokio::fs::create_dir_all(&dir).await?;
        let path = dir.join(FILE);
        let (writer, reader, known) = tokio::task::spawn_blocking(move || -> Result<_, MetaError> {
            let writer = connect(&path)?;
            writer.execute_batch(SCHEMA)?;
            let reader = connect(&path)?;
            let known = {
                let mut stmt = writer.prepare("SELECT ns FROM namespaces")?;
                let names = stmt.query_map([], |row| row.get::<_, String>(0))?;
                names.filter_map(|n| n.ok().and_then(|n| n.parse::<Name>().ok())).collect()
            };
            Ok((writer, reader, known))
        })
        .await??;
        let sqlite = Sqlite {
            writer: Arc::new(Mutex::new(writer)),
            reader: Arc::new(Mutex::new(reader)),
            content_ids: Arc::default(),
        };
        Ok((sqlite, known))
    }

    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, MetaError> + Send + 'static,
    ) -> Result<T, MetaError> {
        let conn = self.writer.clone();
        tokio::task::spawn_blocking(move || f(&mut conn.lock().unwrap_or_else(|p| p.into_inner()))).await?
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, MetaError> + Send + 'static,
    ) -> Result<T, MetaError> {
        let conn = self.reader.clone();
        tokio::task::spawn_blocking(move || f(&conn.lock().unwrap_or_else(|p| p.into_inner()))).await?
    }

    pub async fn add_namespace(&self, ns: String) -> Result<(), MetaError> {
        self.write(move |c| {
            c.execute("INSERT OR IGNORE INTO namespaces (ns) VALUES (?1)", [ns])?;
            Ok(())
        })
        .await
    }

    pub async fn get_ref(
        &self,
        (n, b, k): RefId,
        budget: MemoryBudget,
        room: usize,
    ) -> Result<Option<(RefRow, Held)>, MetaError> {
        self.read(move |c| {
            // A transaction a failed rollback left open would pin an old snapshot.
            if !c.is_autocommit() {
                c.execute_batch("ROLLBACK")?;
            }
            let tx = c.unchecked_transaction()?;
            // The columns before the object, and its length (read from the record's header):
            // the object's pages are not read yet.
            let head = tx
                .prepare_cached(
                    "SELECT object_hash, length(object) FROM refs WHERE ns = ?1 AND bucket = ?2 AND key = ?3",
                )?
                .query_row(params![n, b, k], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, i64>(1)?)))
                .optional()?;
            let Some((hash, len)) = head else { return Ok(None) };
            let held = charge(len, &budget, room)?;
            // The same row: both reads are in one transaction.
            let (object, finalized, last_access_ms) = tx
                .prepare_cached(
                    "SELECT object, finalized, last_access FROM refs WHERE ns = ?1 AND bucket = ?2 AND key = ?3",
                )?
                .query_row(params![n, b, k], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get(1)?, r.get(2)?)))?;
            let row = RefRow { object_hash: hash_of(&hash)?, object, finalized, last_access_ms };
            Ok(Some((row, held)))
        })
        .await
    }

    pub async fn ref_state(&self, (n, b, k): RefId) -> Result<Option<(IoHash, bool)>, MetaError> {
        self.read(move |c| {
            let row = c
                .prepare_cached(
                    "SELECT object_hash, finalized FROM refs WHERE ns = ?1 AND bucket = ?2 AND key = ?3",
                )?
                .query_row(params![n, b, k], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, bool>(1)?)))
                .optional()?;
            row.map(|(h, finalized)| Ok((hash_of(&h)?, finalized))).transpose()
        })
        .await
    }

    pub async fn put_ref(&self, (n, b, k): RefId, row: RefRow, overwrite: bool) -> Result<bool, MetaError> {
        self.write(move |c| {
            let written = c.execute(
                "INSERT INTO refs (ns, bucket, key, object_hash, object, finalized, last_access)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (ns, bucket, key) DO UPDATE SET object_hash = excluded.object_hash,
                   object = excluded.object, finalized = excluded.finalized,
                   last_access = excluded.last_access
                 WHERE ?8 OR refs.finalized = 0 OR refs.object_hash = excluded.object_hash",
                params![
                    n,
                    b,
                    k,
                    &row.object_hash.as_bytes()[..],
                    row.object,
                    row.finalized,
                    // When it is written, not when it was built: a garbage collection that
                    // began meanwhile marks it again.
                    now_ms().max(row.last_access_ms),
                    overwrite
                ],
            )?;
            Ok(written == 1)
        })
        .await
    }

    pub async fn set_finalized(
        &self,
        (n, b, k): RefId,
        hash: IoHash,
        finalized: bool,
    ) -> Result<bool, MetaError> {
        self.write(move |c| {
            let changed = c.execute(
                "UPDATE refs SET finalized = ?6, last_access = ?5
                 WHERE ns = ?1 AND bucket = ?2 AND key = ?3 AND object_hash = ?4",
                params![n, b, k, &hash.as_bytes()[..], now_ms(), finalized],
            )?;
            Ok(changed == 1)
        })
        .await
    }

    pub async fn delete_ref(&self, (n, b, k): RefId) -> Result<usize, MetaError> {
        self.write(move |c| {
            Ok(c.execute("DELETE FROM refs WHERE ns = ?1 AND bucket = ?2 AND key = ?3", [n, b, k])?)
        })
        .await
    }

    pub async fn delete_bucket(&self, n: String, b: String) -> Result<usize, MetaError> {
        self.write(move |c| Ok(c.execute("DELETE FROM refs WHERE ns = ?1 AND bucket = ?2", [n, b])?)).await
    }

    pub async fn delete_namespace(&self, n: String) -> Result<bool, MetaError> {
        self.write(move |c| {
            let tx = c.transaction()?;
            tx.execute("DELETE FROM refs WHERE ns = ?1", [&n])?;
            tx.execute("DELETE FROM content WHERE ns = ?1", [&n])?;
            tx.execute("DELETE FROM blob_gc WHERE ns = ?1", [&n])?;
            let existed = tx.execute("DELETE FROM namespaces WHERE ns = ?1", [&n])? == 1;
            tx.commit()?;
            Ok(existed)
        })
        .await
    }

    pub async fn content_blob(&self, n: String, raw: IoHash) -> Result<Option<IoHash>, MetaError> {
        self.read(move |c| {
            let blob: Option<Vec<u8>> = c
                .query_row(
                    "SELECT blob_id FROM content WHERE ns = ?1 AND raw_hash = ?2",
                    params![n, &raw.as_bytes()[..]],
                    |r| r.get(0),
                )
                .optional()?;
            blob.map(|b| hash_of(&b)).transpose()
        })
        .await
    }

    pub async fn put_content(&self, n: String, raw: IoHash, blob: IoHash) -> Result<(), MetaError> {
        let _writing = self.content_ids.lock().await;
        self.write(move |c| {
            c.execute(
                "INSERT OR REPLACE INTO content (ns, raw_hash, blob_id) VALUES (?1, ?2, ?3)",
                params![n, &raw.as_bytes()[..], &blob.as_bytes()[..]],
            )?;
            Ok(())
        })
        .await
    }

    pub async fn delete_content(&self, n: String, raw: IoHash) -> Result<bool, MetaError> {
        self.write(move |c| {
            Ok(c.execute(
                "DELETE FROM content WHERE ns = ?1 AND raw_hash = ?2",
                params![n, &raw.as_bytes()[..]],
            )? == 1)
        })
        .await
    }

    pub async fn flush_access(&self, touched: Arc<[(RefId, i64)]>) -> Result<usize, MetaError> {
        self.write(move |c| {
            let tx = c.transaction()?;
            let mut n = 0;
            {
                let mut stmt = tx.prepare(
                    "UPDATE refs SET last_access = MAX(last_access, ?4) WHERE ns = ?1 AND bucket = ?2 AND key = ?3",
                )?;
                for ((ns, bucket, key), at) in touched.iter() {
                    n += stmt.execute(params![ns, bucket, key, at])?;
                }
            }
            tx.commit()?;
            Ok(n)
        })
        .await
    }

    // What garbage collection asks (`collect.rs` says what each does).

    pub async fn expire_refs(
        &self,
        cut_ms: i64,
        unfinalized_cut_ms: i64,
        limit: i64,
    ) -> Result<usize, MetaError> {
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

    pub async fn ref_attachments(&self, n: String, after: Option<RefCursor>) -> Result<RefPage, MetaError> {
        self.read(move |c| {
            let (bucket, key) = after.unwrap_or_default();
            let mut stmt = c.prepare_cached(
                "SELECT bucket, key, object FROM refs WHERE ns = ?1 AND (bucket, key) > (?2, ?3)
                 ORDER BY bucket, key",
            )?;
            let mut rows = stmt.query(params![n, bucket, key])?;
            let mut page = RefPage::default();
            while let Some(row) = rows.next()? {
                let object = row.get_ref(2)?.as_blob().map_err(rusqlite::Error::from)?;
                // Parsed in place, not copied out.
                if page.add(object) {
                    page.next = Some((row.get(0)?, row.get(1)?));
                    break;
                }
            }
            Ok(page)
        })
        .await
    }

    pub async fn refs_since(&self, n: String, since_ms: i64) -> Result<Vec<RefCursor>, MetaError> {
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

    pub async fn attachments_of_refs(
        &self,
        n: String,
        keys: Vec<RefCursor>,
    ) -> Result<Vec<Stored>, MetaError> {
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

    pub async fn content_blobs(&self, n: String, raws: Vec<IoHash>) -> Result<Vec<IoHash>, MetaError> {
        self.read(move |c| {
            let mut stmt = c.prepare_cached("SELECT blob_id FROM content WHERE ns = ?1 AND raw_hash = ?2")?;
            let mut blobs = Vec::new();
            for raw in raws {
                let blob: Option<Vec<u8>> =
                    stmt.query_row(params![n, &raw.as_bytes()[..]], |r| r.get(0)).optional()?;
                if let Some(blob) = blob {
                    blobs.push(hash_of(&blob)?);
                }
            }
            Ok(blobs)
        })
        .await
    }

    pub async fn forget_content_of(
        &self,
        n: String,
        gone: Vec<IoHash>,
        still_gone: StillGone,
    ) -> Result<usize, MetaError> {
        match still_gone {
            // Looked at in the one writer: no upload's content id can be written between the
            // look and the delete.
            StillGone::Looked(look) => self.forget_content_where(n, gone, move |blob| look(blob)).await,
            StillGone::Asked(ask) => {
                // Content ids' writes wait while the bucket is asked (not the writer, which
                // would hold up every write), so that an upload of the same buffer writes its
                // id either before the question (and its blob is seen) or after the delete. A
                // few blobs at a time, so that they wait at most one round of questions.
                let mut forgotten = 0;
                for chunk in gone.chunks(ASKED_AT_ONCE) {
                    let _forgetting = self.content_ids.lock().await;
                    let (ns, ids) = (n.clone(), chunk.to_vec());
                    let named: Vec<IoHash> = self
                        .read(move |c| {
                            let mut named =
                                c.prepare_cached("SELECT 1 FROM content WHERE ns = ?1 AND blob_id = ?2")?;
                            let mut found = Vec::new();
                            for id in ids {
                                if named.exists(params![ns, &id.as_bytes()[..]])? {
                                    found.push(id);
                                }
                            }
                            Ok(found)
                        })
                        .await?;
                    let answers = futures_util::future::join_all(named.iter().map(|id| ask(*id))).await;
                    let still = named.into_iter().zip(answers).filter_map(|(id, gone)| gone.then_some(id));
                    forgotten += self.forget_content_where(n.clone(), still.collect(), |_| true).await?;
                }
                Ok(forgotten)
            }
        }
    }

    /// Deletes, in one transaction, the content ids naming each blob of `blobs` that `gone`
    /// says is gone (looked at in the writer).
    async fn forget_content_where(
        &self,
        n: String,
        blobs: Vec<IoHash>,
        gone: impl Fn(&IoHash) -> bool + Send + 'static,
    ) -> Result<usize, MetaError> {
        self.write(move |c| {
            let tx = c.transaction()?;
            let mut forgotten = 0;
            {
                let mut delete = tx.prepare_cached("DELETE FROM content WHERE ns = ?1 AND blob_id = ?2")?;
                for blob in blobs {
                    if gone(&blob) {
                        forgotten += delete.execute(params![n, &blob.as_bytes()[..]])?;
                    }
                }
            }
            tx.commit()?;
            Ok(forgotten)
        })
        .await
    }

    #[cfg(test)]
    pub async fn age_all_refs(&self, at_ms: i64) -> Result<usize, MetaError> {
        self.write(move |c| Ok(c.execute("UPDATE refs SET last_access = ?1", [at_ms])?)).await
    }
}
