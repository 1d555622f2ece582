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

mod collect;
mod postgres;
mod sqlite;
#[cfg(test)]
pub(crate) mod testing;
pub use collect::{EXPIRE_BATCH, RefCursor, RefPage};

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

/// What a Postgres database records as its blob store when the blobs are files.
const LOCAL_BLOBS: &str = "files";

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
    let since = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
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
        let (backend, known) = postgres::Postgres::open(url, LOCAL_BLOBS, false).await?;
        Ok(MetaStore::with(Backend::Postgres(backend), known))
    }

    /// [`MetaStore::open_postgres`] for a server whose blobs are in S3 at `blobs`
    /// (`s3://bucket/prefix`, as [`crate::S3Config::location`] gives it): the database is
    /// shared with the other servers on that bucket and prefix (and refused while a server
    /// with local blobs holds it, and the other way round; a server whose blobs are
    /// elsewhere is refused).
    pub async fn open_postgres_shared(url: &str, blobs: &str) -> Result<MetaStore, MetaError> {
        let (backend, known) = postgres::Postgres::open(url, blobs, true).await?;
        let mut meta = MetaStore::with(Backend::Postgres(backend), known);
        meta.shared = true;
        Ok(meta)
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
mod tests {
    use super::testing::{TestBackend, TestPlace, on_each_backend};
    use super::*;

    on_each_backend!(
        a_finalized_ref_is_replaced_only_when_overwriting,
        a_refs_object_is_charged_to_the_budget_before_it_is_read,
        refs_survive_reopening_and_finalize_only_their_own_object,
        a_long_object_is_charged_at_its_length,
        racing_writers_one_wins,
        every_noted_read_is_flushed,
    );

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
    async fn a_finalized_ref_is_replaced_only_when_overwriting(backend: TestBackend) {
        let Some(place) = TestPlace::new(backend) else { return };
        let (ns, bucket, key) = names();
        let meta = place.open().await;
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
    async fn a_refs_object_is_charged_to_the_budget_before_it_is_read(backend: TestBackend) {
        let Some(place) = TestPlace::new(backend) else { return };
        let (ns, bucket, key) = names();
        let meta = place.open().await;
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

    async fn refs_survive_reopening_and_finalize_only_their_own_object(backend: TestBackend) {
        let Some(place) = TestPlace::new(backend) else { return };
        let (ns, bucket, key) = names();
        let meta = place.open().await;
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

        let meta = place.open().await;
        let got = get(&meta, &ns, &bucket, &key).await.unwrap();
        assert_eq!((got.object.as_slice(), got.finalized), (&b"first"[..], true));
        assert!(got.last_access_ms > 1, "the flushed read time was kept");
        assert_eq!(meta.namespaces().await.unwrap(), vec![ns.clone()]);
        assert_eq!(
            meta.content_blob(&ns, IoHash::of(b"raw")).await.unwrap(),
            Some(IoHash::of(b"compressed"))
        );
        assert_eq!(meta.delete_bucket(&ns, &bucket).await.unwrap(), 1);
        assert_eq!(meta.delete_ref(&ns, &bucket, &key).await.unwrap(), 0);
        assert!(meta.delete_namespace(&ns).await.unwrap());
        assert_eq!(meta.content_blob(&ns, IoHash::of(b"raw")).await.unwrap(), None);
        assert!(meta.namespaces().await.unwrap().is_empty());
    }

    /// An object longer than what a read charges up front (Postgres reads short ones with the
    /// query that finds them) is charged at its length, and read whole.
    async fn a_long_object_is_charged_at_its_length(backend: TestBackend) {
        let Some(place) = TestPlace::new(backend) else { return };
        let meta = place.open().await;
        let (ns, bucket, key) = names();
        let object: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        assert!(meta.put_ref(&ns, &bucket, &key, row(&object, true), false).await.unwrap());
        let budget = MemoryBudget::new(1 << 20);
        let (got, held) = meta.get_ref(&ns, &bucket, &key, &budget, 1 << 20).await.unwrap().unwrap();
        assert_eq!((got.object == object, held.bytes()), (true, object.len()));
        assert_eq!(budget.available(), (1 << 20) - object.len());
        let past = meta.get_ref(&ns, &bucket, &key, &budget, object.len() - 1).await;
        assert!(matches!(past, Err(MetaError::PastRoom { .. })), "{past:?}");
    }

    /// A flush writes every read noted since the last, however many (Postgres writes them in
    /// chunks: three at a time in the tests), and never moves a time back.
    async fn every_noted_read_is_flushed(backend: TestBackend) {
        let Some(place) = TestPlace::new(backend) else { return };
        let meta = place.open().await;
        let (ns, bucket, _) = names();
        let keys: Vec<RefKey> = (0..7).map(|i| format!("{i:040x}").parse().unwrap()).collect();
        for key in &keys {
            assert!(
                meta.put_ref(&ns, &bucket, key, row(key.as_str().as_bytes(), true), false).await.unwrap()
            );
        }
        meta.age_all_refs(1).await.unwrap();
        for key in &keys {
            assert!(get(&meta, &ns, &bucket, key).await.is_some());
        }
        assert_eq!(meta.flush_access().await.unwrap(), keys.len());
        assert_eq!(meta.expire_refs(2, 2, 100).await.unwrap(), 0, "every read time was written");
    }

    /// One server per Postgres database: a second is refused while the first holds it (after
    /// waiting a little for it), and the database is free again once the first is gone.
    #[tokio::test]
    async fn a_second_server_on_one_postgres_database_is_refused() {
        let Some(place) = TestPlace::new(TestBackend::Postgres) else { return };
        let first = place.open().await;
        let second = MetaStore::open_postgres(place.url().unwrap()).await;
        assert!(matches!(&second, Err(MetaError::Config(e)) if e.contains("another tickwire ddc server")));
        drop(first);
        let again = MetaStore::open_postgres(place.url().unwrap()).await;
        assert!(again.is_ok(), "{:?}", again.err());
    }

    /// Servers whose blobs are in S3 share a database: each sees what the others write, and
    /// the namespaces that the others add and delete. A server with local blobs is refused
    /// while they hold it, and they are refused while it does.
    #[tokio::test]
    async fn servers_with_shared_blobs_share_a_database() {
        let Some(place) = TestPlace::new(TestBackend::Postgres) else { return };
        let url = place.url().unwrap();
        let alone = MetaStore::open_postgres(url).await.unwrap();
        let refused = MetaStore::open_postgres_shared(url, "s3://bucket/ddc").await;
        assert!(
            matches!(&refused, Err(MetaError::Config(e)) if e.contains("on local files")),
            "{:?}",
            refused.err()
        );
        drop(alone);
        let a = MetaStore::open_postgres_shared(url, "s3://bucket/ddc").await;
        assert!(
            matches!(&a, Err(MetaError::Config(e)) if e.contains("refs name blobs in files")),
            "the database was a server's with local blobs: {:?}",
            a.err()
        );
        place.move_blob_store("s3://bucket/ddc").await;
        let a = MetaStore::open_postgres_shared(url, "s3://bucket/ddc").await.unwrap();
        let b = MetaStore::open_postgres_shared(url, "s3://bucket/ddc").await.unwrap();
        let elsewhere = MetaStore::open_postgres_shared(url, "s3://bucket/other").await;
        assert!(
            matches!(&elsewhere, Err(MetaError::Config(e)) if e.contains("refs name blobs in s3://bucket/ddc")),
            "{:?}",
            elsewhere.err()
        );
        let (ns, bucket, key) = names();
        assert!(a.put_ref(&ns, &bucket, &key, row(b"from a", true), false).await.unwrap());
        a.add_namespace(&ns).await.unwrap();
        assert_eq!(get(&b, &ns, &bucket, &key).await.unwrap().object, b"from a");
        assert_eq!(b.namespaces().await.unwrap(), vec![ns.clone()], "b lists what a added");
        // b knows the namespace (it wrote to it); a deletes it; b writes to it again: it is
        // listed again.
        b.add_namespace(&ns).await.unwrap();
        assert!(a.delete_namespace(&ns).await.unwrap());
        assert!(b.namespaces().await.unwrap().is_empty());
        b.add_namespace(&ns).await.unwrap();
        assert_eq!(a.namespaces().await.unwrap(), vec![ns.clone()]);
        let refused = MetaStore::open_postgres(url).await;
        assert!(matches!(&refused, Err(MetaError::Config(e)) if e.contains("another tickwire ddc server")));
    }

    /// Writers racing to put different finalized objects under one new key, each on a
    /// connection of its own: exactly one wins (the rule is checked in the write itself, not
    /// before it as SQLite's single writer may).
    async fn racing_writers_one_wins(backend: TestBackend) {
        let Some(place) = TestPlace::new(backend) else { return };
        let meta = place.open().await;
        let (ns, bucket, key) = names();
        let writers: Vec<_> = (0..16u8)
            .map(|i| {
                let (meta, ns, bucket, key) = (meta.clone(), ns.clone(), bucket.clone(), key.clone());
                tokio::spawn(async move {
                    meta.put_ref(&ns, &bucket, &key, row(&[i], true), false).await.unwrap()
                })
            })
            .collect();
        let mut won = 0;
        for writer in writers {
            won += usize::from(writer.await.unwrap());
        }
        assert_eq!(won, 1, "exactly one writer put its object");
    }

    /// An expiry batch that found a ref, then waited for a write that made it fresh, leaves
    /// it: the delete re-checks the row it deletes. The write here is a transaction held open
    /// on its own connection until the expiry is seen waiting for it.
    #[tokio::test]
    async fn expiry_leaves_a_ref_written_while_it_waited() {
        let Some(place) = TestPlace::new(TestBackend::Postgres) else { return };
        let meta = place.open().await;
        let (ns, bucket, key) = names();
        assert!(meta.put_ref(&ns, &bucket, &key, row(b"old", true), false).await.unwrap());
        meta.age_all_refs(1).await.unwrap();
        let (mut writer, connection) =
            tokio_postgres::connect(place.url().unwrap(), tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let (observer, connection) =
            tokio_postgres::connect(place.url().unwrap(), tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let write = writer.transaction().await.unwrap();
        write.execute("UPDATE refs SET last_access = $1", &[&now_ms()]).await.unwrap();
        let expiry = tokio::spawn({
            let meta = meta.clone();
            async move { meta.expire_refs(now_ms() - 1000, now_ms() - 1000, 10).await.unwrap() }
        });
        let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
            AND query LIKE 'DELETE FROM refs%' AND datname = current_database()";
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while observer.query_one(waiting, &[]).await.unwrap().get::<_, i64>(0) == 0 {
            assert!(std::time::Instant::now() < deadline, "the expiry never waited for the write");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        write.commit().await.unwrap();
        assert_eq!(expiry.await.unwrap(), 0, "the ref was written while the expiry waited");
        assert!(get(&meta, &ns, &bucket, &key).await.is_some());
    }

    /// A server whose lock on its database is gone (its session ended: here it is ended from
    /// another session, by the query docs/ddc.md gives) fails every operation from then on,
    /// and a failed flush keeps the read times it could not write.
    #[tokio::test]
    async fn a_server_that_lost_its_database_lock_stops() {
        let Some(place) = TestPlace::new(TestBackend::Postgres) else { return };
        let meta = place.open().await;
        let (ns, bucket, key) = names();
        assert!(meta.put_ref(&ns, &bucket, &key, row(b"read", true), false).await.unwrap());
        assert!(get(&meta, &ns, &bucket, &key).await.is_some());
        let (admin, connection) =
            tokio_postgres::connect(place.url().unwrap(), tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let ended = admin
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_locks
                 WHERE locktype = 'advisory' AND classid = 1737828 AND objid = 2860117014 AND objsubid = 1
                   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(ended.len(), 1, "the query in the docs finds the server's lock");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            match meta.ref_state(&ns, &bucket, &key).await {
                Err(MetaError::Config(e)) if e.contains("lost its lock") => break,
                other => assert!(std::time::Instant::now() < deadline, "still served: {other:?}"),
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(meta.is_lost());
        tokio::time::timeout(std::time::Duration::from_secs(5), meta.lost()).await.expect("lost() completed");
        assert!(meta.flush_access().await.is_err());
        assert_eq!(meta.touched.lock().unwrap().len(), 1, "the read time is kept for a later flush");
    }
}
