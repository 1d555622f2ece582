//! The metadata store: refs, the content ids of compressed buffers and the namespaces. Blobs
//! live apart ([`crate::BlobStore`]); a ref's object is small and lives inline in its row, so
//! reading a ref is one indexed lookup.
//!
//! Two backends hold the same tables under the same rules: SQLite in the store's root, the
//! default (`sqlite.rs`), and PostgreSQL for scale-out (`postgres.rs`). [`MetaStore`] is what
//! the rest of the crate sees; it picks the backend, and keeps what is not a backend's business
//! in memory: the namespaces known to exist, and the last-access times reads noted.
//!
//! Writers order their steps so that a row never names a blob before the blob is durable (the
//! blob store fsyncs before the row is written). Last-access times are not written on each
//! read; reads note them in memory and [`MetaStore::flush_access`] writes them in one
//! transaction (the server calls it every few seconds and at shutdown).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::budget::{Held, MemoryBudget, NoRoom};
use crate::cb::CbType;
use crate::{IoHash, Name, RefKey};

mod claims;
mod collect;
mod postgres;
mod sqlite;
#[cfg(test)]
pub(crate) mod testing;
pub use collect::{EXPIRE_BATCH, RefCursor, RefPage, StillGone};

/// Where the embedded metadata lives under the store's root. Names cannot start with `.`, so
/// no namespace directory can collide with it.
pub const META_DIR: &str = ".meta";

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("metadata store: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("metadata store (Postgres): {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("metadata store (Postgres): no connection: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("metadata store: {0}")]
    Config(String),
    #[error("metadata store: {0}")]
    Io(#[from] std::io::Error),
    #[error("metadata store: a blocking task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error("metadata store: a stored hash is {0} bytes, not 20 (the store is damaged)")]
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

/// A ref as the backends name it: (namespace, bucket, key).
type RefId = (String, String, String);

/// An attachment as a stored object names it.
type Stored = (CbType, IoHash);

fn ref_id(ns: &Name, bucket: &Name, key: &RefKey) -> RefId {
    (ns.as_str().to_owned(), bucket.as_str().to_owned(), key.as_str().to_owned())
}

/// Where the metadata is kept.
#[derive(Clone)]
enum Backend {
    Sqlite(sqlite::Sqlite),
    Postgres(postgres::Postgres),
}

/// Runs one backend operation, whichever backend it is.
macro_rules! on_backend {
    ($store:expr, $op:ident($($arg:expr),*)) => {
        match &$store.backend {
            Backend::Sqlite(b) => b.$op($($arg),*).await,
            Backend::Postgres(b) => b.$op($($arg),*).await,
        }
    };
}
use on_backend;

/// Refs, content ids and namespaces; cheap to clone.
#[derive(Clone)]
pub struct MetaStore {
    backend: Backend,
    /// Reads not yet written: ref → last access.
    touched: Arc<Mutex<HashMap<RefId, i64>>>,
    /// Namespaces known to exist, so a write to a known one adds no row. Not trusted when the
    /// database is shared: another server may have deleted one since.
    namespaces: Arc<Mutex<HashSet<Name>>>,
    /// Other servers use the same database ([`MetaStore::open_postgres_shared`]).
    shared: bool,
    /// Held by a flush of read times: one at a time, so that a flush that fails puts its times
    /// back before the next (the collector's, say) takes the notes.
    flushing: Arc<tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for MetaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaStore").field("backend", &self.backend_name()).finish_non_exhaustive()
    }
}

fn hash_of(bytes: &[u8]) -> Result<IoHash, MetaError> {
    let len = bytes.len();
    <[u8; 20]>::try_from(bytes).map(IoHash::from_bytes).map_err(|_| MetaError::Damaged(len))
}

/// Takes the share of `budget` for a stored object of `len` bytes: refused for good past
/// `room` (what the budget could ever give the caller), refused for now when the budget has
/// not got it.
fn charge(len: i64, budget: &MemoryBudget, room: usize) -> Result<Held, MetaError> {
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    if len > room {
        return Err(MetaError::PastRoom { len, room });
    }
    Ok(Held::take(budget, len)?)
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    epoch_ms(std::time::SystemTime::now())
}

/// Milliseconds since the Unix epoch of `t` (0 before it).
pub fn epoch_ms(t: std::time::SystemTime) -> i64 {
    duration_ms(t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default())
}

/// `d` in milliseconds, as the metadata stores keep times (`i64::MAX` past it).
pub fn duration_ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl MetaStore {
    /// Opens (creating if needed) the embedded metadata under `root`
    /// (`<root>/.meta/ddc.sqlite`).
    pub async fn open(root: &Path) -> Result<MetaStore, MetaError> {
        let (backend, known) = sqlite::Sqlite::open(root).await?;
        Ok(MetaStore::with(Backend::Sqlite(backend), known))
    }

    /// Connects to the Postgres database at `url` (`postgres://user@host:port/db`, or libpq's
    /// `key=value` form), takes it for this server alone (a second server on one database is
    /// refused: its blobs are local files, which others cannot see) and creates its tables if
    /// absent.
    pub async fn open_postgres(url: &str) -> Result<MetaStore, MetaError> {
        let (backend, known) = postgres::Postgres::open(url, false).await?;
        Ok(MetaStore::with(Backend::Postgres(backend), known))
    }

    /// [`MetaStore::open_postgres`] for a server whose blobs are in S3: the database is shared
    /// with the other servers on that bucket (and refused while a server with local blobs
    /// holds it, and the other way round; [`MetaStore::bind_blob_store`] refuses a server
    /// whose blobs are elsewhere).
    pub async fn open_postgres_shared(url: &str) -> Result<MetaStore, MetaError> {
        let (backend, known) = postgres::Postgres::open(url, true).await?;
        let mut meta = MetaStore::with(Backend::Postgres(backend), known);
        meta.shared = true;
        Ok(meta)
    }

    /// Binds a Postgres database to the blob store its refs name (`location`, as
    /// [`crate::BlobStore::location`] gives it): recorded by the first server, and a server
    /// whose blobs are elsewhere is refused. Nothing for SQLite, whose file is one root's.
    /// Called once the blob store has opened, so a store that fails to open is never recorded.
    pub async fn bind_blob_store(&self, location: &str) -> Result<(), MetaError> {
        match &self.backend {
            Backend::Postgres(pg) => pg.bind_blob_store(location).await,
            Backend::Sqlite(_) => Ok(()),
        }
    }

    fn with(backend: Backend, known: Vec<Name>) -> MetaStore {
        MetaStore {
            shared: false,
            backend,
            touched: Arc::default(),
            namespaces: Arc::new(Mutex::new(known.into_iter().collect())),
            flushing: Arc::default(),
        }
    }

    /// Which backend holds the metadata: `sqlite` or `postgres`.
    pub fn backend_name(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// Completes when this store can no longer be used: with Postgres, when the server lost its
    /// lock on the database (another server may hold it now); never with SQLite. A server
    /// should stop then, so that its supervisor starts it again.
    pub fn lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let token = match &self.backend {
            Backend::Postgres(b) => Some(b.lost().clone()),
            Backend::Sqlite(_) => None,
        };
        async move {
            match token {
                Some(token) => token.cancelled_owned().await,
                None => std::future::pending().await,
            }
        }
    }

    /// Whether [`MetaStore::lost`] has completed.
    pub fn is_lost(&self) -> bool {
        matches!(&self.backend, Backend::Postgres(b) if b.lost().is_cancelled())
    }

    /// Records that `ns` exists (first write to it creates it).
    pub async fn add_namespace(&self, ns: &Name) -> Result<(), MetaError> {
        if !self.shared && self.namespaces.lock().unwrap_or_else(|p| p.into_inner()).contains(ns) {
            return Ok(());
        }
        on_backend!(self, add_namespace(ns.as_str().to_owned()))?;
        self.namespaces.lock().unwrap_or_else(|p| p.into_inner()).insert(ns.clone());
        Ok(())
    }

    /// Every namespace, sorted. A server alone on its metadata (SQLite's file is its own; a
    /// Postgres database is locked to it) remembers all there is; a shared database is asked.
    pub async fn namespaces(&self) -> Result<Vec<Name>, MetaError> {
        let mut all: Vec<Name> = match &self.backend {
            Backend::Postgres(pg) if self.shared => pg.namespaces().await?,
            _ => self.namespaces.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect(),
        };
        all.sort();
        Ok(all)
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
        let id = ref_id(ns, bucket, key);
        let row = on_backend!(self, get_ref(id.clone(), budget.clone(), room))?;
        if let Some((row, _)) = &row {
            let mut touched = self.touched.lock().unwrap_or_else(|p| p.into_inner());
            touched.insert(id, now_ms().max(row.last_access_ms));
        }
        Ok(row)
    }

    /// Notes an access to a ref now, as a read does (written with the others, in the
    /// background): for a PUT of the object the ref already holds, which writes nothing.
    pub fn note_access(&self, ns: &Name, bucket: &Name, key: &RefKey) {
        let mut touched = self.touched.lock().unwrap_or_else(|p| p.into_inner());
        touched.insert(ref_id(ns, bucket, key), now_ms());
    }

    /// A ref's object hash and whether it is finalized, without its object (a PUT compares
    /// these only). Not a read of the ref: its last access is not noted.
    pub async fn ref_state(
        &self,
        ns: &Name,
        bucket: &Name,
        key: &RefKey,
    ) -> Result<Option<(IoHash, bool)>, MetaError> {
        on_backend!(self, ref_state(ref_id(ns, bucket, key)))
    }

    /// Writes the ref. Without `overwrite`, a finalized ref holding another object is left as
    /// it is, in the same statement (two writers cannot both pass a check made before it), and
    /// the answer is false. The row's last access is the time it is written.
    pub async fn put_ref(
        &self,
        ns: &Name,
        bucket: &Name,
        key: &RefKey,
        row: RefRow,
        overwrite: bool,
    ) -> Result<bool, MetaError> {
        self.add_namespace(ns).await?;
        on_backend!(self, put_ref(ref_id(ns, bucket, key), row, overwrite))
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
        on_backend!(self, set_finalized(ref_id(ns, bucket, key), hash, finalized))
    }

    /// Removes one ref; how many were removed (0 or 1).
    pub async fn delete_ref(&self, ns: &Name, bucket: &Name, key: &RefKey) -> Result<usize, MetaError> {
        on_backend!(self, delete_ref(ref_id(ns, bucket, key)))
    }

    /// Removes a bucket's refs; how many.
    pub async fn delete_bucket(&self, ns: &Name, bucket: &Name) -> Result<usize, MetaError> {
        on_backend!(self, delete_bucket(ns.as_str().to_owned(), bucket.as_str().to_owned()))
    }

    /// Removes a namespace's refs, content ids and its name; false if it did not exist.
    pub async fn delete_namespace(&self, ns: &Name) -> Result<bool, MetaError> {
        let existed = on_backend!(self, delete_namespace(ns.as_str().to_owned()))?;
        self.namespaces.lock().unwrap_or_else(|p| p.into_inner()).remove(ns);
        Ok(existed)
    }

    /// The blob holding the compressed buffer whose raw hash is `raw`, if one was stored.
    pub async fn content_blob(&self, ns: &Name, raw: IoHash) -> Result<Option<IoHash>, MetaError> {
        on_backend!(self, content_blob(ns.as_str().to_owned(), raw))
    }

    /// Records that the compressed buffer with raw hash `raw` is the blob `blob`. The blob
    /// must already be durable.
    pub async fn put_content(&self, ns: &Name, raw: IoHash, blob: IoHash) -> Result<(), MetaError> {
        self.add_namespace(ns).await?;
        on_backend!(self, put_content(ns.as_str().to_owned(), raw, blob))
    }

    /// Forgets a content id; false if there was none.
    pub async fn delete_content(&self, ns: &Name, raw: IoHash) -> Result<bool, MetaError> {
        on_backend!(self, delete_content(ns.as_str().to_owned(), raw))
    }

    /// Writes the last-access times noted by reads since the last flush, in one transaction.
    /// Returns how many refs were updated. A time is never moved back.
    pub async fn flush_access(&self) -> Result<usize, MetaError> {
        let _one_at_a_time = self.flushing.lock().await;
        let touched = std::mem::take(&mut *self.touched.lock().unwrap_or_else(|p| p.into_inner()));
        if touched.is_empty() {
            return Ok(0);
        }
        // Shared with the backend, not copied: kept to be noted again if the write fails.
        let noted: Arc<[(RefId, i64)]> = touched.into_iter().collect();
        let result = on_backend!(self, flush_access(noted.clone()));
        if result.is_err() {
            // Noted again for the next flush (keeping any later read's time), so that a failed
            // write does not let read refs expire.
            let mut touched = self.touched.lock().unwrap_or_else(|p| p.into_inner());
            for (id, at) in noted.iter() {
                let kept = touched.entry(id.clone()).or_insert(*at);
                *kept = (*kept).max(*at);
            }
        }
        result
    }
}

#[cfg(test)]
mod tests;
