//! The metadata backend for a database server: refs, content ids and namespaces in PostgreSQL
//! (`tickwire ddc --refs postgres://...`), for a store whose metadata should live in a
//! database that is backed up, replicated and watched like the studio's others, or has
//! outgrown one machine's SQLite file. The same tables and the same rules as the embedded
//! backend (`sqlite.rs`), so the same tests run against both.
//!
//! **One server per database, unless the blobs are in S3.** A server whose blobs are files
//! under its root holds a session-level advisory lock on its database from start to stop
//! ([`session::SERVER_LOCK`], in `postgres/session.rs` with the connections' settings and the
//! schema), so a second one (which would expire and collect against blobs it does not have)
//! is refused at start. Servers whose blobs are in one bucket hold it shared, and serve one
//! cache; the database records where its blobs are and refuses a server that keeps them
//! elsewhere.
//!
//! Durability is Postgres's own: a write is acknowledged once its transaction has committed,
//! so with the server's default `synchronous_commit` it survives a crash of either process.
//!
//! Unlike SQLite's single writer, this server's writes run at once on many connections. Each
//! rule a write checks is therefore part of its one statement (a ref's overwrite rule is the
//! upsert's `WHERE`; an expiry re-checks the row it deletes), or holds a row lock across its
//! check (`forget_content_of`). Writes that change many rows (a flush of read times, an expiry
//! batch, a bucket's or a namespace's delete) can deadlock with each other; Postgres then
//! aborts one, and it is run again ([`RETRIES`]).
//!
//! Connections come from a pool ([`deadpool_postgres`]) with timeouts ([`session::TIMEOUT`]),
//! secured as the connection string's `sslmode` and `sslrootcert` ask, as libpq reads them
//! (`postgres/tls.rs`).

use std::sync::Arc;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime, Timeouts};
use tokio_postgres::IsolationLevel;
use tokio_postgres::error::SqlState;
use tokio_util::sync::CancellationToken;

mod claims;
mod session;
pub mod tls;
use session::{LOCK_LOST, LockSession, TIMEOUT, take_database};

use super::{MetaError, RefCursor, RefId, RefPage, RefRow, StillGone, Stored, charge, hash_of, now_ms};
use crate::budget::{Held, MemoryBudget};
use crate::storage::attachment_hashes;
use crate::{IoHash, Name};

/// How many times a write Postgres aborted for a deadlock or a serialization failure is run
/// again before its error is returned.
const RETRIES: usize = 3;

/// A ref's object at most this long is read with the query that finds it, into a share of
/// the memory budget taken before (`get_ref`).
const INLINE_OBJECT: usize = 64 << 10;

/// Read times one statement of a flush writes at most (a few in the tests, so that they cross
/// chunks).
const FLUSH_CHUNK: usize = if cfg!(test) { 3 } else { 10_000 };

/// Connections the pool opens at most.
const POOL_SIZE: usize = 16;

/// Refs one page of the collector's walk reads at most.
const PAGE_ROWS: i64 = super::collect::PAGE_REFS as i64;

/// The Postgres backend; cheap to clone.
#[derive(Clone)]
pub(super) struct Postgres {
    pool: Pool,
    /// The session holding [`session::SERVER_LOCK`], open as long as a clone of the backend is.
    lock: Arc<LockSession>,
}

/// Whether a write that failed with `e` is run again: after a deadlock or a serialization
/// failure, at most [`RETRIES`] times (`tries` counts them).
fn again(e: &MetaError, tries: &mut usize) -> bool {
    let again = *tries < RETRIES && transient(e);
    *tries += usize::from(again);
    again
}

fn transient(e: &MetaError) -> bool {
    let MetaError::Postgres(e) = e else { return false };
    matches!(e.code(), Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE)
}

/// A `(ns, bucket, key)` list as three arrays, for `unnest`.
fn columns<'a>(keys: impl Iterator<Item = &'a RefId>) -> [Vec<&'a str>; 3] {
    let mut cols: [Vec<&str>; 3] = Default::default();
    for (n, b, k) in keys {
        cols[0].push(n);
        cols[1].push(b);
        cols[2].push(k);
    }
    cols
}

/// A read-only transaction on one snapshot: what its reads see does not move between them.
async fn snapshot(
    c: &mut deadpool_postgres::Object,
) -> Result<deadpool_postgres::Transaction<'_>, MetaError> {
    Ok(c.build_transaction().isolation_level(IsolationLevel::RepeatableRead).read_only(true).start().await?)
}

impl Postgres {
    /// Connects to `url` (a libpq URL or key=value string), takes the database for this
    /// server ([`session::SERVER_LOCK`]) and creates the tables if absent; with the namespaces stored.
    pub async fn open(url: &str, shared: bool) -> Result<(Postgres, Vec<Name>), MetaError> {
        let connect = tls::connect(url)?;
        if let Some(weakness) = connect.weakness_across_network() {
            tracing::warn!(
                "connections to Postgres across a network: {weakness}; set sslmode=verify-full and \
                 sslrootcert to encrypt them and authenticate the server"
            );
        }
        let tls::Connect { mut config, tls, .. } = connect;
        session::configure(&mut config);
        let lock = take_database(&config, tls.clone(), shared).await?;
        let manager =
            Manager::from_config(config, tls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let timeouts = Timeouts { wait: Some(TIMEOUT), create: Some(TIMEOUT), recycle: Some(TIMEOUT) };
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .timeouts(timeouts)
            .build()
            .map_err(|e| MetaError::Config(format!("the Postgres pool: {e}")))?;
        let backend = Postgres { pool, lock };
        let mut client = backend.client().await?;
        session::create_schema(&mut client).await?;
        let known = backend.namespaces().await?;
        Ok((backend, known))
    }

    /// Records the blob store the refs name, or refuses another ([`session::check_blob_store`]).
    pub async fn bind_blob_store(&self, location: &str) -> Result<(), MetaError> {
        session::check_blob_store(&self.client().await?, location).await
    }

    /// The namespaces stored.
    pub async fn namespaces(&self) -> Result<Vec<Name>, MetaError> {
        let rows = self.client().await?.query("SELECT ns FROM namespaces", &[]).await?;
        Ok(rows.iter().filter_map(|r| r.get::<_, &str>(0).parse::<Name>().ok()).collect())
    }

    /// Cancelled when this server lost its lock on the database.
    pub fn lost(&self) -> &CancellationToken {
        &self.lock.lost
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, MetaError> {
        if self.lock.lost.is_cancelled() {
            return Err(MetaError::Config(LOCK_LOST.into()));
        }
        self.pool.get().await.map_err(|e| match e {
            // Postgres's own error (connection refused, authentication failed), not the pool's.
            deadpool_postgres::PoolError::Backend(e) => MetaError::Postgres(e),
            e => MetaError::Pool(e),
        })
    }

    /// Runs `op` again while Postgres aborts it for a deadlock or a serialization failure, at
    /// most [`RETRIES`] more times.
    async fn retrying<T, F: Future<Output = Result<T, MetaError>>>(
        &self,
        mut op: impl FnMut() -> F,
    ) -> Result<T, MetaError> {
        let mut tries = 0;
        loop {
            match op().await {
                Err(e) if again(&e, &mut tries) => {}
                done => return done,
            }
        }
    }

    pub async fn add_namespace(&self, ns: String) -> Result<(), MetaError> {
        let c = self.client().await?;
        c.execute("INSERT INTO namespaces (ns) VALUES ($1) ON CONFLICT DO NOTHING", &[&ns]).await?;
        Ok(())
    }

    pub async fn get_ref(
        &self,
        (n, b, k): RefId,
        budget: MemoryBudget,
        room: usize,
    ) -> Result<Option<(RefRow, Held)>, MetaError> {
        let mut c = self.client().await?;
        // Most objects are small: one query brings one back, read into a share taken before
        // it and then cut to its length. When the budget cannot lend that share now, or the
        // object is longer, the object is charged at its length first (below).
        if let Ok(mut held) = Held::take(&budget, INLINE_OBJECT.min(room)) {
            let inline = i64::try_from(held.bytes()).unwrap_or(i64::MAX);
            let row = c
                .query_opt(
                    &c.prepare_cached(
                        "SELECT object_hash, finalized, last_access,
                       CASE WHEN octet_length(object) <= $4::BIGINT THEN object END
                     FROM refs WHERE ns = $1 AND bucket = $2 AND key = $3",
                    )
                    .await?,
                    &[&n, &b, &k, &inline],
                )
                .await?;
            let Some(row) = row else { return Ok(None) };
            if let Some(object) = row.get::<_, Option<Vec<u8>>>(3) {
                held.resize(&budget, object.len())?;
                let row = RefRow {
                    object_hash: hash_of(row.get(0))?,
                    object,
                    finalized: row.get(1),
                    last_access_ms: row.get(2),
                };
                return Ok(Some((row, held)));
            }
        }
        // One snapshot for both reads: the object read is the one whose length was charged.
        let tx = snapshot(&mut c).await?;
        // `octet_length` reads the stored value's size, not the value.
        let head = tx
            .query_opt(
                "SELECT object_hash, octet_length(object)::BIGINT FROM refs WHERE ns = $1 AND bucket = $2 AND key = $3",
                &[&n, &b, &k],
            )
            .await?;
        let Some(head) = head else { return Ok(None) };
        let held = charge(head.get(1), &budget, room)?;
        let row = tx
            .query_one(
                "SELECT object, finalized, last_access FROM refs WHERE ns = $1 AND bucket = $2 AND key = $3",
                &[&n, &b, &k],
            )
            .await?;
        tx.commit().await?;
        let row = RefRow {
            object_hash: hash_of(head.get(0))?,
            object: row.get(0),
            finalized: row.get(1),
            last_access_ms: row.get(2),
        };
        Ok(Some((row, held)))
    }

    pub async fn ref_state(&self, (n, b, k): RefId) -> Result<Option<(IoHash, bool)>, MetaError> {
        let c = self.client().await?;
        let row = c
            .query_opt(
                &c.prepare_cached(
                    "SELECT object_hash, finalized FROM refs WHERE ns = $1 AND bucket = $2 AND key = $3",
                )
                .await?,
                &[&n, &b, &k],
            )
            .await?;
        row.map(|r| Ok((hash_of(r.get(0))?, r.get(1)))).transpose()
    }

    pub async fn put_ref(&self, (n, b, k): RefId, row: RefRow, overwrite: bool) -> Result<bool, MetaError> {
        let c = self.client().await?;
        let hash = &row.object_hash.as_bytes()[..];
        let written = c
            .execute(
                // The overwrite rule is the upsert's own condition: two writers racing past an
                // earlier read cannot both replace a finalized ref.
                &c.prepare_cached(
                    "INSERT INTO refs (ns, bucket, key, object_hash, object, finalized, last_access)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (ns, bucket, key) DO UPDATE SET object_hash = excluded.object_hash,
                   object = excluded.object, finalized = excluded.finalized,
                   last_access = excluded.last_access
                 WHERE $8 OR NOT refs.finalized OR refs.object_hash = excluded.object_hash",
                )
                .await?,
                // Stamped as it is sent, not when it was built: a garbage collection that began
                // meanwhile marks it again (its re-mark reaches a minute back).
                &[
                    &n,
                    &b,
                    &k,
                    &hash,
                    &row.object,
                    &row.finalized,
                    &now_ms().max(row.last_access_ms),
                    &overwrite,
                ],
            )
            .await?;
        Ok(written == 1)
    }

    pub async fn set_finalized(
        &self,
        (n, b, k): RefId,
        hash: IoHash,
        finalized: bool,
    ) -> Result<bool, MetaError> {
        let c = self.client().await?;
        let changed = c
            .execute(
                &c.prepare_cached(
                    "UPDATE refs SET finalized = $6, last_access = $5
                 WHERE ns = $1 AND bucket = $2 AND key = $3 AND object_hash = $4",
                )
                .await?,
                &[&n, &b, &k, &&hash.as_bytes()[..], &now_ms(), &finalized],
            )
            .await?;
        Ok(changed == 1)
    }

    pub async fn delete_ref(&self, (n, b, k): RefId) -> Result<usize, MetaError> {
        let c = self.client().await?;
        let gone =
            c.execute("DELETE FROM refs WHERE ns = $1 AND bucket = $2 AND key = $3", &[&n, &b, &k]).await?;
        Ok(gone as usize)
    }

    pub async fn delete_bucket(&self, n: String, b: String) -> Result<usize, MetaError> {
        const DELETE: &[&str] = &["DELETE FROM refs WHERE ns = $1 AND bucket = $2"];
        Ok(self.delete_all(DELETE, vec![n, b]).await?[0] as usize)
    }

    pub async fn delete_namespace(&self, n: String) -> Result<bool, MetaError> {
        const DELETE: &[&str] = &[
            "DELETE FROM refs WHERE ns = $1",
            "DELETE FROM content WHERE ns = $1",
            "DELETE FROM blob_gc WHERE ns = $1",
            "DELETE FROM namespaces WHERE ns = $1",
        ];
        Ok(self.delete_all(DELETE, vec![n]).await?[3] == 1)
    }

    /// Runs `statements`, each with `params`, in one transaction without the statement timeout
    /// (a bucket or a namespace has no bound on its rows), again after a deadlock (the failed
    /// try was rolled back); how many rows each removed. On a task of its own: a request
    /// dropped mid-way (its client gone) neither abandons a long delete half-way nor hands its
    /// connection, still busy with it, back to the pool.
    async fn delete_all(
        &self,
        statements: &'static [&'static str],
        params: Vec<String>,
    ) -> Result<Vec<u64>, MetaError> {
        let mut c = self.client().await?;
        let work = async move {
            let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                params.iter().map(|p| p as &(dyn tokio_postgres::types::ToSql + Sync)).collect();
            let mut tries = 0;
            loop {
                let attempt = async {
                    let tx = c.transaction().await?;
                    tx.batch_execute("SET LOCAL statement_timeout = 0").await?;
                    let mut removed = Vec::with_capacity(statements.len());
                    for statement in statements {
                        removed.push(tx.execute(*statement, &params).await?);
                    }
                    tx.commit().await?;
                    Ok(removed)
                };
                match attempt.await {
                    Err(e) if again(&e, &mut tries) => {}
                    done => return done,
                }
            }
        };
        tokio::spawn(work).await?
    }

    pub async fn content_blob(&self, n: String, raw: IoHash) -> Result<Option<IoHash>, MetaError> {
        let c = self.client().await?;
        let row = c
            .query_opt(
                &c.prepare_cached("SELECT blob_id FROM content WHERE ns = $1 AND raw_hash = $2").await?,
                &[&n, &&raw.as_bytes()[..]],
            )
            .await?;
        row.map(|r| hash_of(r.get(0))).transpose()
    }

    pub async fn put_content(&self, n: String, raw: IoHash, blob: IoHash) -> Result<(), MetaError> {
        let c = self.client().await?;
        c.execute(
            "INSERT INTO content (ns, raw_hash, blob_id) VALUES ($1, $2, $3)
             ON CONFLICT (ns, raw_hash) DO UPDATE SET blob_id = excluded.blob_id",
            &[&n, &&raw.as_bytes()[..], &&blob.as_bytes()[..]],
        )
        .await?;
        Ok(())
    }

    pub async fn delete_content(&self, n: String, raw: IoHash) -> Result<bool, MetaError> {
        let c = self.client().await?;
        let gone = c
            .execute("DELETE FROM content WHERE ns = $1 AND raw_hash = $2", &[&n, &&raw.as_bytes()[..]])
            .await?;
        Ok(gone == 1)
    }

    pub async fn flush_access(&self, touched: Arc<[(RefId, i64)]>) -> Result<usize, MetaError> {
        let c = self.client().await?;
        let statement = "UPDATE refs SET last_access = GREATEST(refs.last_access, t.at)
             FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::BIGINT[]) AS t(ns, bucket, key, at)
             WHERE refs.ns = t.ns AND refs.bucket = t.bucket AND refs.key = t.key";
        let mut written = 0;
        // In chunks, each well within the statement timeout however many reads were noted (a
        // chunk written before a later one fails is written again by the next flush: times
        // only move forward).
        for chunk in touched.chunks(FLUSH_CHUNK) {
            let [ns, buckets, keys] = columns(chunk.iter().map(|(id, _)| id));
            let at: Vec<i64> = chunk.iter().map(|(_, at)| *at).collect();
            written += self
                .retrying(|| async { Ok(c.execute(statement, &[&ns, &buckets, &keys, &at]).await?) })
                .await?;
        }
        Ok(written as usize)
    }

    // What garbage collection asks (`collect.rs` says what each does).

    pub async fn expire_refs(
        &self,
        cut_ms: i64,
        unfinalized_cut_ms: i64,
        limit: i64,
    ) -> Result<usize, MetaError> {
        let c = self.client().await?;
        // The condition twice: once to find the batch, and once on each row as it is deleted.
        // A row a write changed after the batch was found (a ref put, finalized or read just
        // now) is deleted only if it is still expired: under READ COMMITTED, the DELETE waits
        // for that write and then re-checks its own WHERE against the new row, not the
        // subquery's.
        let statement = "DELETE FROM refs WHERE (ns, bucket, key) IN (SELECT ns, bucket, key FROM (
               SELECT ns, bucket, key FROM refs WHERE NOT finalized AND last_access < $2
               UNION ALL
               SELECT ns, bucket, key FROM refs WHERE finalized AND last_access < $1
             ) AS expired LIMIT $3)
             AND CASE WHEN finalized THEN last_access < $1 ELSE last_access < $2 END";
        let n = self
            .retrying(|| async { Ok(c.execute(statement, &[&cut_ms, &unfinalized_cut_ms, &limit]).await?) })
            .await?;
        Ok(n as usize)
    }

    pub async fn ref_attachments(&self, n: String, after: Option<RefCursor>) -> Result<RefPage, MetaError> {
        let (bucket, key) = after.unwrap_or_default();
        let mut c = self.client().await?;
        let tx = snapshot(&mut c).await?;
        // The page's keys and sizes first, so that objects are fetched only as far as the
        // page's byte bound (the rows of one query would all come to this process at once).
        let heads = tx
            .query(
                "SELECT bucket, key, octet_length(object)::BIGINT FROM refs
                 WHERE ns = $1 AND (bucket, key) > ($2, $3) ORDER BY bucket, key LIMIT $4",
                &[&n, &bucket, &key, &PAGE_ROWS],
            )
            .await?;
        let mut bytes = 0usize;
        let taken = heads
            .iter()
            .map(|r| usize::try_from(r.get::<_, i64>(2)).unwrap_or(usize::MAX))
            .take_while(|len| {
                let fits = bytes < super::collect::PAGE_BYTES;
                bytes = bytes.saturating_add(*len);
                fits
            })
            .count();
        let Some(last) = heads.get(taken.saturating_sub(1)) else { return Ok(RefPage::default()) };
        let (last_bucket, last_key): (&str, &str) = (last.get(0), last.get(1));
        let rows = tx
            .query(
                "SELECT object FROM refs WHERE ns = $1 AND (bucket, key) > ($2, $3) AND (bucket, key) <= ($4, $5)
                 ORDER BY bucket, key",
                &[&n, &bucket, &key, &last_bucket, &last_key],
            )
            .await?;
        tx.commit().await?;
        let mut page = RefPage::default();
        for row in &rows {
            page.add(row.get(0));
        }
        // Another page when this one stopped short of the rows there were.
        let full = taken < heads.len() || heads.len() as i64 == PAGE_ROWS;
        page.next = full.then(|| (last_bucket.to_owned(), last_key.to_owned()));
        Ok(page)
    }

    pub async fn refs_since(&self, n: String, since_ms: i64) -> Result<Vec<RefCursor>, MetaError> {
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT bucket, key FROM refs WHERE ns = $1 AND finalized IN (FALSE, TRUE) AND last_access >= $2",
                &[&n, &since_ms],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    pub async fn attachments_of_refs(
        &self,
        n: String,
        keys: Vec<RefCursor>,
    ) -> Result<Vec<Stored>, MetaError> {
        let (buckets, keys): (Vec<String>, Vec<String>) = keys.into_iter().unzip();
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT object FROM refs JOIN unnest($2::TEXT[], $3::TEXT[]) AS t(bucket, key)
                   ON refs.bucket = t.bucket AND refs.key = t.key
                 WHERE refs.ns = $1",
                &[&n, &buckets, &keys],
            )
            .await?;
        Ok(rows.iter().flat_map(|r| attachment_hashes(r.get(0)).collect::<Vec<_>>()).collect())
    }

    pub async fn content_blobs(&self, n: String, raws: Vec<IoHash>) -> Result<Vec<IoHash>, MetaError> {
        let raws: Vec<&[u8]> = raws.iter().map(|r| &r.as_bytes()[..]).collect();
        let c = self.client().await?;
        let rows =
            c.query("SELECT blob_id FROM content WHERE ns = $1 AND raw_hash = ANY($2)", &[&n, &raws]).await?;
        rows.iter().map(|r| hash_of(r.get(0))).collect()
    }

    pub async fn forget_content_of(
        &self,
        n: String,
        gone: Vec<IoHash>,
        still_gone: StillGone,
    ) -> Result<usize, MetaError> {
        let mut c = self.client().await?;
        let mut forgotten = 0;
        for id in gone {
            let blob = &id.as_bytes()[..];
            let tx = c.transaction().await?;
            // The rows locked before the blob is checked: an upload of the same buffer writes
            // its blob, then its content id, which waits here until this commits, so it is
            // either seen by the check below or written after the delete.
            let locked = tx
                .query("SELECT raw_hash FROM content WHERE ns = $1 AND blob_id = $2 FOR UPDATE", &[&n, &blob])
                .await?;
            let gone = !locked.is_empty()
                && match &still_gone {
                    StillGone::Looked(look) => {
                        let look = look.clone();
                        tokio::task::spawn_blocking(move || look(&id)).await.unwrap_or(false)
                    }
                    StillGone::Asked(ask) => ask(id).await,
                };
            if gone {
                let gone =
                    tx.execute("DELETE FROM content WHERE ns = $1 AND blob_id = $2", &[&n, &blob]).await?;
                forgotten += gone as usize;
            }
            tx.commit().await?;
        }
        Ok(forgotten)
    }

    #[cfg(test)]
    pub async fn age_all_refs(&self, at_ms: i64) -> Result<usize, MetaError> {
        let c = self.client().await?;
        Ok(c.execute("UPDATE refs SET last_access = $1", &[&at_ms]).await? as usize)
    }
}
