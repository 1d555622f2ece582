//! The Postgres backend's session with its database: the settings every connection gets
//! (timeouts, keepalives), the lock that makes the database this server's alone (or its blob
//! store's servers', shared), the record of where its blobs are, and the schema. Kept apart from the operations in `postgres.rs`.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_util::sync::CancellationToken;

use crate::meta::MetaError;

/// The tables, created if absent. `CREATE ... IF NOT EXISTS` is not safe to run from two
/// connections at once, so it runs under a transaction-scoped advisory lock (the key is an
/// arbitrary constant: "tickwire ddc schema").
const SCHEMA: &str = "
SELECT pg_advisory_xact_lock(7463917286190101);
CREATE TABLE IF NOT EXISTS namespaces (
    ns TEXT PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS refs (
    ns TEXT NOT NULL,
    bucket TEXT NOT NULL,
    key TEXT NOT NULL,
    object_hash BYTEA NOT NULL,
    object BYTEA NOT NULL,
    finalized BOOLEAN NOT NULL,
    last_access BIGINT NOT NULL,
    PRIMARY KEY (ns, bucket, key)
);
CREATE INDEX IF NOT EXISTS refs_by_access ON refs (finalized, last_access);
CREATE TABLE IF NOT EXISTS content (
    ns TEXT NOT NULL,
    raw_hash BYTEA NOT NULL,
    blob_id BYTEA NOT NULL,
    PRIMARY KEY (ns, raw_hash)
);
CREATE INDEX IF NOT EXISTS content_by_blob ON content (ns, blob_id);
CREATE TABLE IF NOT EXISTS blob_store (
    one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    location TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS blob_gc (
    ns TEXT NOT NULL,
    blob_id BYTEA NOT NULL,
    relied BIGINT NOT NULL,
    claimed BIGINT,
    PRIMARY KEY (ns, blob_id)
);
CREATE TABLE IF NOT EXISTS store_identity (
    one BOOLEAN PRIMARY KEY CHECK (one),
    id TEXT NOT NULL
);
";

/// Tables and indexes whose presence means the schema is there: a role that may only read and
/// write rows can then start the server.
const SCHEMA_PRESENT: &str =
    "SELECT to_regclass('namespaces') IS NOT NULL AND to_regclass('refs') IS NOT NULL
    AND to_regclass('content') IS NOT NULL AND to_regclass('refs_by_access') IS NOT NULL
    AND to_regclass('content_by_blob') IS NOT NULL AND to_regclass('blob_store') IS NOT NULL
    AND to_regclass('blob_gc') IS NOT NULL AND to_regclass('store_identity') IS NOT NULL";

/// The key of the advisory lock a server holds on its database (an arbitrary constant).
pub const SERVER_LOCK: i64 = 7463917286190102;

/// How long a starting server waits for another to release its database (a server restarted
/// at once may find its previous session not yet closed).
const SERVER_LOCK_WAIT: &str = "5s";

/// The longest a connection may take to open, a request may wait for a pooled connection,
/// and a statement may run (unless the URL sets `connect_timeout` or `options` itself): a
/// database that stops answering fails requests with a 500 instead of holding them.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// The session that holds the server's lock on its database, and whether it ended.
pub(super) struct LockSession {
    pub client: tokio_postgres::Client,
    /// Cancelled when the session ended while the store was open: the lock went with it, and
    /// another server may hold the database now, so every operation fails from then on
    /// ([`LOCK_LOST`]).
    pub lost: CancellationToken,
}

/// What every operation answers once the server's lock on its database is gone.
pub const LOCK_LOST: &str =
    "this server lost its lock on the Postgres database (its session ended): restart the server";

/// TCP keepalives, on both ends of every connection unless the URL sets its own: a peer gone
/// without a word (a network cut) is found after the idle time and the probes, about a minute.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_PROBES: u32 = 3;

/// tokio-postgres's own `keepalives_idle` when the URL sets none.
const LIBRARY_KEEPALIVE_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

/// How often the lock's session is checked, so that a connection that died without closing is
/// noticed.
const LOCK_CHECK: Duration = Duration::from_secs(10);

/// Gives `config` the bounds this server relies on, where the URL does not set its own: a
/// connect timeout, a statement timeout, and keepalives.
pub(super) fn configure(config: &mut tokio_postgres::Config) {
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(TIMEOUT);
    }
    let options = config.get_options().unwrap_or_default().to_owned();
    if !options.to_ascii_lowercase().replace('-', "_").contains("statement_timeout") {
        config.options(format!("{options} -c statement_timeout={}", TIMEOUT.as_millis()).trim_start());
    }
    // Unsent data waits at most `TIMEOUT`.
    if config.get_keepalives_idle() == LIBRARY_KEEPALIVE_IDLE {
        config.keepalives_idle(KEEPALIVE_IDLE);
    }
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(KEEPALIVE_INTERVAL);
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(KEEPALIVE_PROBES);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(TIMEOUT);
    }
}

/// Creates the tables and indexes unless all are there.
pub(super) async fn create_schema(client: &mut deadpool_postgres::Object) -> Result<(), MetaError> {
    if !client.query_one(SCHEMA_PRESENT, &[]).await?.get::<_, bool>(0) {
        let tx = client.transaction().await?;
        tx.batch_execute(SCHEMA).await?;
        tx.commit().await?;
    }
    Ok(())
}

/// Records where the blobs the refs name are (`files`, or `s3://bucket/prefix`) if the database
/// does not say yet, and refuses a server that keeps them elsewhere: its answers about them
/// would be wrong. A database with refs but no record (kept by a server from before the record
/// existed, whose blobs were files) is taken as `files`.
pub(super) async fn check_blob_store(
    client: &deadpool_postgres::Object,
    location: &str,
) -> Result<(), MetaError> {
    const STORED: &str = "SELECT location FROM blob_store";
    if client.query_opt(STORED, &[]).await?.is_none() {
        let has_refs: bool = client.query_one("SELECT EXISTS (SELECT 1 FROM refs)", &[]).await?.get(0);
        let first = if has_refs { LOCAL_BLOBS } else { location };
        client
            .execute("INSERT INTO blob_store (location) VALUES ($1) ON CONFLICT DO NOTHING", &[&first])
            .await?;
    }
    let stored: String = client.query_one(STORED, &[]).await?.get(0);
    if stored == location {
        return Ok(());
    }
    Err(MetaError::Config(format!(
        "this database's refs name blobs in {stored}, and this server keeps its blobs in {location}: \
         start it with the same blob store (or copy the blobs there, then run \
         `UPDATE blob_store SET location = '{location}'` in the database)"
    )))
}

/// What the database records when the blobs are files under the server's root.
pub(super) const LOCAL_BLOBS: &str = "files";

/// A session of its own that holds the database's [`SERVER_LOCK`] (waiting a little for a
/// previous server's session to close): alone, or with `shared`, shared with other servers
/// that share their blobs (in S3); refused while a server holds it in the other way. Its `lost`
/// is cancelled when the session ends while the store holds it. A session that stops answering
/// is ended by the keepalives (about a minute); a check every [`LOCK_CHECK`] keeps traffic on
/// it and logs a check that does not answer.
pub(super) async fn take_database(
    config: &tokio_postgres::Config,
    tls: MakeRustlsConnect,
    shared: bool,
) -> Result<Arc<LockSession>, MetaError> {
    let (client, connection) = config.connect(tls).await?;
    let (tx, held) = tokio::sync::oneshot::channel::<std::sync::Weak<LockSession>>();
    tokio::spawn(async move {
        let result = connection.await;
        // Only while the store still holds the session: a store dropped (or refused at start)
        // ends it on purpose.
        if let Some(session) = held.await.ok().and_then(|weak| weak.upgrade()) {
            session.lost.cancel();
            tracing::error!(error = ?result.err(), "{LOCK_LOST}");
        }
    });
    // The session sits idle: no idle timeout may end it, and Postgres finds a dead peer within
    // a minute by its keepalives.
    let _ = client.batch_execute("SET idle_session_timeout = 0").await; // Postgres 14 and later.
    client
        .batch_execute(&format!(
            "SET tcp_keepalives_idle = {}; SET tcp_keepalives_interval = {}; SET tcp_keepalives_count = {};
             SET lock_timeout = '{SERVER_LOCK_WAIT}'; SET statement_timeout = 0",
            KEEPALIVE_IDLE.as_secs(),
            KEEPALIVE_INTERVAL.as_secs(),
            KEEPALIVE_PROBES
        ))
        .await?;
    let take = if shared { "SELECT pg_advisory_lock_shared($1)" } else { "SELECT pg_advisory_lock($1)" };
    match client.execute(take, &[&SERVER_LOCK]).await {
        Ok(_) => {}
        Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
            return Err(MetaError::Config(if shared {
                "a tickwire ddc server with its blobs on local files is using this database: servers share a \
                 database only when they all keep their blobs in S3"
                    .into()
            } else {
                "another tickwire ddc server is using this database: one server per database unless every \
                 server keeps its blobs in S3"
                    .into()
            }));
        }
        Err(e) => return Err(e.into()),
    }
    let session = Arc::new(LockSession { client, lost: CancellationToken::new() });
    let _ = tx.send(Arc::downgrade(&session));
    let check = Arc::downgrade(&session);
    tokio::spawn(async move {
        let mut every = tokio::time::interval(LOCK_CHECK);
        every.tick().await;
        loop {
            every.tick().await;
            let Some(session) = check.upgrade() else { return }; // The store is gone.
            if session.lost.is_cancelled() {
                return;
            }
            // A slow answer is not a lost lock: only the session's end is (above).
            match tokio::time::timeout(TIMEOUT, session.client.simple_query("SELECT 1")).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "checking this server's database lock session failed")
                }
                Err(_) => {
                    tracing::warn!("this server's database lock session did not answer a check in 30 s")
                }
            }
        }
    });
    Ok(session)
}
