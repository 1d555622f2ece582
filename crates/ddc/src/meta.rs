//! The metadata store: refs, the content ids of compressed buffers and the namespaces, in one
//! embedded SQLite file (`<root>/.meta/ddc.sqlite`) in WAL mode. Blobs stay on the filesystem
//! ([`crate::BlobStore`]); a ref's object is small and lives inline in its row, so reading a
//! ref is one indexed lookup.
//!
//! Durability: every write is one transaction committed with `synchronous=FULL`, so a write
//! acknowledged to a client survives `kill -9` and power loss, and a crash mid-write leaves the
//! row as it was. Writers order their steps so that a row never names a blob before the blob
//! is durable (the blob store fsyncs before the row is written).
//!
//! SQLite calls block, so they run on tokio's blocking pool. Reads and writes use separate
//! connections: a read never waits behind a write's fsync. Last-access times are not written
//! on each read; reads note them in memory and [`MetaStore::flush_access`] writes them in one
//! transaction (the server calls it every few seconds and at shutdown).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};

use crate::budget::{Held, MemoryBudget, NoRoom};
use crate::{IoHash, Name, RefKey};

mod collect;
pub use collect::{EXPIRE_BATCH, RefCursor, RefPage};

/// Where the metadata lives under the store's root. Names cannot start with `.`, so no
/// namespace directory can collide with it.
pub const META_DIR: &str = ".meta";
const FILE: &str = "ddc.sqlite";

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("metadata store: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("metadata store: {0}")]
    Io(#[from] std::io::Error),
    #[error("metadata store: a blocking task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error("metadata store: a stored hash is {0} bytes, not 20 (the file is damaged)")]
    Damaged(usize),
    #[error(transparent)]
    Busy(#[from] NoRoom),
    #[error("the ref's object is {len} bytes, more than the memory budget can give this request ({room})")]
    PastRoom { len: usize, room: usize },
}

/// One ref as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefRow {
    /// IoHash of `object`.
    pub object_hash: IoHash,
    /// The compact-binary object, exactly as the client sent it (or the wrapper built for a
    /// raw PUT).
    pub object: Vec<u8>,
    /// All its attachments were present when it was last put or finalized.
    pub finalized: bool,
    /// Milliseconds since the Unix epoch of the last write or read (reads are flushed late).
    pub last_access_ms: i64,
}

type RefId = (Name, Name, RefKey);

/// Refs, content ids and namespaces; cheap to clone.
#[derive(Clone)]
pub struct MetaStore {
    writer: Arc<Mutex<Connection>>,
    reader: Arc<Mutex<Connection>>,
    /// Reads not yet written: ref → last access.
    touched: Arc<Mutex<HashMap<RefId, i64>>>,
    /// Namespaces known to exist, so a write to a known one adds no row.
    namespaces: Arc<Mutex<std::collections::HashSet<Name>>>,
}

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
";

fn connect(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(30))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    Ok(conn)
}

fn hash_of(bytes: Vec<u8>) -> Result<IoHash, MetaError> {
    let len = bytes.len();
    <[u8; 20]>::try_from(bytes).map(IoHash::from_bytes).map_err(|_| MetaError::Damaged(len))
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    epoch_ms(std::time::SystemTime::now())
}

/// Milliseconds since the Unix epoch of `t` (0 before it).
pub fn epoch_ms(t: std::time::SystemTime) -> i64 {
    let since = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

impl MetaStore {
    /// Opens (creating if needed) the metadata under `root`.
    pub async fn open(root: &Path) -> Result<MetaStore, MetaError> {
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
        Ok(MetaStore {
            writer: Arc::new(Mutex::new(writer)),
            reader: Arc::new(Mutex::new(reader)),
            touched: Arc::default(),
            namespaces: Arc::new(Mutex::new(known)),
        })
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

    /// Records that `ns` exists (first write to it creates it).
    pub async fn add_namespace(&self, ns: &Name) -> Result<(), MetaError> {
        if self.namespaces.lock().unwrap_or_else(|p| p.into_inner()).contains(ns) {
            return Ok(());
        }
        let name = ns.as_str().to_owned();
        self.write(move |c| {
            c.execute("INSERT OR IGNORE INTO namespaces (ns) VALUES (?1)", [name])?;
            Ok(())
        })
        .await?;
        self.namespaces.lock().unwrap_or_else(|p| p.into_inner()).insert(ns.clone());
        Ok(())
    }

    /// Every namespace, sorted.
    pub fn namespaces(&self) -> Vec<Name> {
        let mut all: Vec<Name> =
            self.namespaces.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect();
        all.sort();
        all
    }

    /// Reads a ref, its object charged to `budget` before it is read: its length comes first,
    /// in the same read transaction. An object longer than `room` (what the budget could ever
    /// give the caller: the whole budget, less what the request already holds) is not read
    /// ([`MetaError::PastRoom`], a deterministic answer, not a 429 its retries would meet
    /// again); one the budget cannot hold now fails with [`MetaError::Busy`]. The share comes
    /// back with the row; keep it as long as the object.
    pub async fn get_ref(
        &self,
        ns: &Name,
        bucket: &Name,
        key: &RefKey,
        budget: &MemoryBudget,
        room: usize,
    ) -> Result<Option<(RefRow, Held)>, MetaError> {
        let (n, b, k) = (ns.as_str().to_owned(), bucket.as_str().to_owned(), key.as_str().to_owned());
        let budget = budget.clone();
        let row = self
            .read(move |c| {
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
                let len = usize::try_from(len).unwrap_or(usize::MAX);
                if len > room {
                    return Err(MetaError::PastRoom { len, room });
                }
                let held = Held::take(&budget, len)?;
                // The same row: both reads are in one transaction.
                let (object, finalized, last_access_ms) = tx
                    .prepare_cached(
                        "SELECT object, finalized, last_access FROM refs WHERE ns = ?1 AND bucket = ?2 AND key = ?3",
                    )?
                    .query_row(params![n, b, k], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get(1)?, r.get(2)?)))?;
                let row = RefRow { object_hash: hash_of(hash)?, object, finalized, last_access_ms };
                Ok(Some((row, held)))
            })
            .await?;
        if let Some((row, _)) = &row {
            let mut touched = self.touched.lock().unwrap_or_else(|p| p.into_inner());
            touched.insert((ns.clone(), bucket.clone(), key.clone()), now_ms().max(row.last_access_ms));
        }
        Ok(row)
    }

    /// A ref's object hash and whether it is finalized, without its object (a PUT compares
    /// these only). Not a read of the ref: its last access is not noted.
    pub async fn ref_state(
        &self,
        ns: &Name,
        bucket: &Name,
        key: &RefKey,
    ) -> Result<Option<(IoHash, bool)>, MetaError> {
        let (n, b, k) = (ns.as_str().to_owned(), bucket.as_str().to_owned(), key.as_str().to_owned());
        self.read(move |c| {
            let row = c
                .prepare_cached(
                    "SELECT object_hash, finalized FROM refs WHERE ns = ?1 AND bucket = ?2 AND key = ?3",
                )?
                .query_row(params![n, b, k], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, bool>(1)?)))
                .optional()?;
            row.map(|(h, finalized)| Ok((hash_of(h)?, finalized))).transpose()
        })
        .await
    }

    /// Stores a ref, replacing any previous one.
    /// Writes the ref. Without `overwrite`, a finalized ref holding another object is left as
    /// it is, in the same statement (two writers cannot both pass a check made before it), and
    /// the answer is false.
    pub async fn put_ref(
        &self,
        ns: &Name,
        bucket: &Name,
        key: &RefKey,
        row: RefRow,
        overwrite: bool,
    ) -> Result<bool, MetaError> {
        self.add_namespace(ns).await?;
        let (n, b, k) = (ns.as_str().to_owned(), bucket.as_str().to_owned(), key.as_str().to_owned());
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

    /// Marks the ref finalized (or not) if it still holds the object `hash`; false if it
    /// does not.
    pub async fn set_finalized(
        &self,
        ns: &Name,
        bucket: &Name,
        key: &RefKey,
        hash: IoHash,
        finalized: bool,
    ) -> Result<bool, MetaError> {
        let (n, b, k) = (ns.as_str().to_owned(), bucket.as_str().to_owned(), key.as_str().to_owned());
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

    /// Removes one ref; how many were removed (0 or 1).
    pub async fn delete_ref(&self, ns: &Name, bucket: &Name, key: &RefKey) -> Result<usize, MetaError> {
        let (n, b, k) = (ns.as_str().to_owned(), bucket.as_str().to_owned(), key.as_str().to_owned());
        self.write(move |c| {
            Ok(c.execute("DELETE FROM refs WHERE ns = ?1 AND bucket = ?2 AND key = ?3", [n, b, k])?)
        })
        .await
    }

    /// Removes a bucket's refs; how many.
    pub async fn delete_bucket(&self, ns: &Name, bucket: &Name) -> Result<usize, MetaError> {
        let (n, b) = (ns.as_str().to_owned(), bucket.as_str().to_owned());
        self.write(move |c| Ok(c.execute("DELETE FROM refs WHERE ns = ?1 AND bucket = ?2", [n, b])?)).await
    }

    /// Removes a namespace's refs, content ids and its name; false if it did not exist.
    pub async fn delete_namespace(&self, ns: &Name) -> Result<bool, MetaError> {
        let n = ns.as_str().to_owned();
        let existed = self
            .write(move |c| {
                let tx = c.transaction()?;
                tx.execute("DELETE FROM refs WHERE ns = ?1", [&n])?;
                tx.execute("DELETE FROM content WHERE ns = ?1", [&n])?;
                let existed = tx.execute("DELETE FROM namespaces WHERE ns = ?1", [&n])? == 1;
                tx.commit()?;
                Ok(existed)
            })
            .await?;
        self.namespaces.lock().unwrap_or_else(|p| p.into_inner()).remove(ns);
        Ok(existed)
    }

    /// The blob holding the compressed buffer whose raw hash is `raw`, if one was stored.
    pub async fn content_blob(&self, ns: &Name, raw: IoHash) -> Result<Option<IoHash>, MetaError> {
        let n = ns.as_str().to_owned();
        self.read(move |c| {
            let blob: Option<Vec<u8>> = c
                .query_row(
                    "SELECT blob_id FROM content WHERE ns = ?1 AND raw_hash = ?2",
                    params![n, &raw.as_bytes()[..]],
                    |r| r.get(0),
                )
                .optional()?;
            blob.map(hash_of).transpose()
        })
        .await
    }

    /// Records that the compressed buffer with raw hash `raw` is the blob `blob`. The blob
    /// must already be durable.
    pub async fn put_content(&self, ns: &Name, raw: IoHash, blob: IoHash) -> Result<(), MetaError> {
        self.add_namespace(ns).await?;
        let n = ns.as_str().to_owned();
        self.write(move |c| {
            c.execute(
                "INSERT OR REPLACE INTO content (ns, raw_hash, blob_id) VALUES (?1, ?2, ?3)",
                params![n, &raw.as_bytes()[..], &blob.as_bytes()[..]],
            )?;
            Ok(())
        })
        .await
    }

    /// Forgets a content id; false if there was none.
    pub async fn delete_content(&self, ns: &Name, raw: IoHash) -> Result<bool, MetaError> {
        let n = ns.as_str().to_owned();
        self.write(move |c| {
            Ok(c.execute(
                "DELETE FROM content WHERE ns = ?1 AND raw_hash = ?2",
                params![n, &raw.as_bytes()[..]],
            )? == 1)
        })
        .await
    }

    /// Writes the last-access times noted by reads since the last flush, in one transaction.
    /// Returns how many refs were updated.
    pub async fn flush_access(&self) -> Result<usize, MetaError> {
        let touched = std::mem::take(&mut *self.touched.lock().unwrap_or_else(|p| p.into_inner()));
        if touched.is_empty() {
            return Ok(0);
        }
        self.write(move |c| {
            let tx = c.transaction()?;
            let mut n = 0;
            {
                let mut stmt = tx.prepare(
                    "UPDATE refs SET last_access = MAX(last_access, ?4) WHERE ns = ?1 AND bucket = ?2 AND key = ?3",
                )?;
                for ((ns, bucket, key), at) in touched {
                    n += stmt.execute(params![ns.as_str(), bucket.as_str(), key.as_str(), at])?;
                }
            }
            tx.commit()?;
            Ok(n)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> (Name, Name, RefKey) {
        ("ue.ddc".parse().unwrap(), Name::bucket("bucket").unwrap(), "a".repeat(40).parse().unwrap())
    }

    /// A read with room to spare in its budget.
    async fn get(meta: &MetaStore, ns: &Name, bucket: &Name, key: &RefKey) -> Option<RefRow> {
        let budget = MemoryBudget::new(1 << 20);
        meta.get_ref(ns, bucket, key, &budget, budget.total()).await.unwrap().map(|(row, _)| row)
    }

    fn row(object: &[u8], finalized: bool) -> RefRow {
        RefRow { object_hash: IoHash::of(object), object: object.to_vec(), finalized, last_access_ms: 1 }
    }

    /// Without overwriting, a finalized ref keeps its object: the write itself checks, so two
    /// writers racing past an earlier read cannot both succeed.
    #[tokio::test]
    async fn a_finalized_ref_is_replaced_only_when_overwriting() {
        let dir = tempfile::tempdir().unwrap();
        let (ns, bucket, key) = names();
        let meta = MetaStore::open(dir.path()).await.unwrap();
        assert!(meta.put_ref(&ns, &bucket, &key, row(b"first", false), false).await.unwrap());
        assert!(
            meta.put_ref(&ns, &bucket, &key, row(b"second", false), false).await.unwrap(),
            "not finalized"
        );
        assert!(meta.put_ref(&ns, &bucket, &key, row(b"first", true), false).await.unwrap());
        assert!(!meta.put_ref(&ns, &bucket, &key, row(b"second", false), false).await.unwrap());
        assert_eq!(get(&meta, &ns, &bucket, &key).await.unwrap().object, b"first");
        assert!(meta.put_ref(&ns, &bucket, &key, row(b"first", true), false).await.unwrap(), "the same one");
        assert!(meta.put_ref(&ns, &bucket, &key, row(b"second", true), true).await.unwrap());
        assert_eq!(get(&meta, &ns, &bucket, &key).await.unwrap().object, b"second");
    }

    /// A ref's object is charged before it is read: a budget without room for it now gets
    /// `Busy` and keeps all it had; an object past the caller's room is not charged at all;
    /// a budget with room lends exactly the object's length until the share is dropped.
    #[tokio::test]
    async fn a_refs_object_is_charged_to_the_budget_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let (ns, bucket, key) = names();
        let meta = MetaStore::open(dir.path()).await.unwrap();
        let object = vec![7u8; 1000];
        assert!(meta.put_ref(&ns, &bucket, &key, row(&object, true), false).await.unwrap());
        let budget = MemoryBudget::new(1500);
        let other = Held::take(&budget, 501).unwrap();
        let refused = meta.get_ref(&ns, &bucket, &key, &budget, 1500).await;
        assert!(matches!(refused, Err(MetaError::Busy(NoRoom { bytes: 1000 }))), "{refused:?}");
        assert_eq!(budget.available(), 999);
        let past = meta.get_ref(&ns, &bucket, &key, &budget, 999).await;
        assert!(matches!(past, Err(MetaError::PastRoom { len: 1000, room: 999 })), "{past:?}");
        drop(other);
        let (got, held) = meta.get_ref(&ns, &bucket, &key, &budget, 1500).await.unwrap().unwrap();
        assert_eq!((got.object, held.bytes(), budget.available()), (object, 1000, 500));
        drop(held);
        assert_eq!(budget.available(), 1500);
        assert_eq!(meta.ref_state(&ns, &bucket, &key).await.unwrap(), Some((IoHash::of(&[7u8; 1000]), true)));
        let other = Name::bucket("other").unwrap();
        assert!(meta.get_ref(&ns, &other, &key, &budget, 1500).await.unwrap().is_none());
        assert_eq!(meta.ref_state(&ns, &other, &key).await.unwrap(), None);
    }

    #[tokio::test]
    async fn refs_survive_reopening_and_finalize_only_their_own_object() {
        let dir = tempfile::tempdir().unwrap();
        let (ns, bucket, key) = names();
        let meta = MetaStore::open(dir.path()).await.unwrap();
        assert_eq!(get(&meta, &ns, &bucket, &key).await, None);
        assert!(meta.put_ref(&ns, &bucket, &key, row(b"first", false), false).await.unwrap());
        assert!(!meta.set_finalized(&ns, &bucket, &key, IoHash::of(b"other"), true).await.unwrap());
        assert!(meta.set_finalized(&ns, &bucket, &key, IoHash::of(b"first"), true).await.unwrap());
        assert_eq!(meta.flush_access().await.unwrap(), 0, "nothing was read yet");
        let got = get(&meta, &ns, &bucket, &key).await.unwrap();
        assert!(got.finalized);
        assert_eq!(meta.flush_access().await.unwrap(), 1);
        meta.put_content(&ns, IoHash::of(b"raw"), IoHash::of(b"compressed")).await.unwrap();
        drop(meta);

        let meta = MetaStore::open(dir.path()).await.unwrap();
        let got = get(&meta, &ns, &bucket, &key).await.unwrap();
        assert_eq!((got.object.as_slice(), got.finalized), (&b"first"[..], true));
        assert!(got.last_access_ms > 1, "the flushed read time was kept");
        assert_eq!(meta.namespaces(), vec![ns.clone()]);
        assert_eq!(
            meta.content_blob(&ns, IoHash::of(b"raw")).await.unwrap(),
            Some(IoHash::of(b"compressed"))
        );
        assert_eq!(meta.delete_bucket(&ns, &bucket).await.unwrap(), 1);
        assert_eq!(meta.delete_ref(&ns, &bucket, &key).await.unwrap(), 0);
        assert!(meta.delete_namespace(&ns).await.unwrap());
        assert_eq!(meta.content_blob(&ns, IoHash::of(b"raw")).await.unwrap(), None);
        assert!(meta.namespaces().is_empty());
    }
}
