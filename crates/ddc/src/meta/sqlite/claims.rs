//! The SQLite side of `meta/claims.rs`: writes' records, collections' claims and the store's
//! id, each one statement in the one writer.

use rusqlite::params;

use super::Sqlite;
use crate::IoHash;
use crate::meta::MetaError;

const RELY: &str = "INSERT INTO blob_gc (ns, blob_id, relied, claimed) VALUES (?1, ?2, ?3, NULL)
    ON CONFLICT (ns, blob_id) DO UPDATE SET relied = MAX(blob_gc.relied, excluded.relied), claimed = NULL
    WHERE blob_gc.claimed IS NULL OR blob_gc.claimed < ?4";
const CLAIM: &str = "INSERT INTO blob_gc (ns, blob_id, relied, claimed) VALUES (?1, ?2, 0, ?3)
    ON CONFLICT (ns, blob_id) DO UPDATE SET claimed = excluded.claimed
    WHERE blob_gc.relied < ?4 AND (blob_gc.claimed IS NULL OR blob_gc.claimed < ?5)";
const RELEASE_REMOVED: &str = "DELETE FROM blob_gc WHERE ns = ?1 AND blob_id = ?2 AND claimed = ?3";
const RELEASE_KEPT: &str =
    "UPDATE blob_gc SET claimed = NULL WHERE ns = ?1 AND blob_id = ?2 AND claimed = ?3";
const PRUNE: &str =
    "DELETE FROM blob_gc WHERE ns = ?1 AND ((claimed IS NULL AND relied < ?2) OR claimed < ?3)";
const MAKE_ID: &str = "INSERT INTO store_identity (one, id) VALUES (TRUE, ?1) ON CONFLICT DO NOTHING";
const ID: &str = "SELECT id FROM store_identity";

impl Sqlite {
    pub async fn rely_on_blob(&self, n: String, id: IoHash, now: i64, stale: i64) -> Result<bool, MetaError> {
        self.write(move |c| {
            Ok(c.prepare_cached(RELY)?.execute(params![n, &id.as_bytes()[..], now, stale])? == 1)
        })
        .await
    }

    pub async fn claim_blob(
        &self,
        n: String,
        id: IoHash,
        now: i64,
        relied: i64,
        stale: i64,
    ) -> Result<bool, MetaError> {
        self.write(move |c| {
            Ok(c.prepare_cached(CLAIM)?.execute(params![n, &id.as_bytes()[..], now, relied, stale])? == 1)
        })
        .await
    }

    pub async fn release_blob(
        &self,
        n: String,
        id: IoHash,
        claimed: i64,
        removed: bool,
    ) -> Result<(), MetaError> {
        let statement = if removed { RELEASE_REMOVED } else { RELEASE_KEPT };
        self.write(move |c| {
            Ok(c.prepare_cached(statement)?.execute(params![n, &id.as_bytes()[..], claimed]).map(drop)?)
        })
        .await
    }

    pub async fn prune_blob_claims(&self, n: String, relied: i64, stale: i64) -> Result<usize, MetaError> {
        self.write(move |c| Ok(c.execute(PRUNE, params![n, relied, stale])?)).await
    }

    pub async fn store_id(&self, new: String) -> Result<String, MetaError> {
        self.write(move |c| {
            c.execute(MAKE_ID, [new])?;
            Ok(c.query_row(ID, [], |row| row.get(0))?)
        })
        .await
    }
}
