//! The SQLite side of `meta/claims.rs`: writes' records, collections' claims and the store's
//! id, each one statement in the one writer.

use rusqlite::params;

use super::Sqlite;
use crate::IoHash;
use crate::meta::MetaError;
use crate::meta::claims::sql::{CLAIM, ID, MAKE_ID, PRUNE, RELEASE_KEPT, RELEASE_REMOVED, RELY};

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
