//! The Postgres side of `meta/claims.rs`: writes' records, collections' claims and the store's
//! id, each one statement (`INSERT ... ON CONFLICT DO UPDATE ... WHERE` locks the row, so a
//! write and a claim on one blob are ordered).

use tokio_postgres::types::ToSql;

use super::Postgres;
use crate::IoHash;
use crate::meta::MetaError;

const RELY: &str = "INSERT INTO blob_gc (ns, blob_id, relied, claimed) VALUES ($1, $2, $3, NULL)
    ON CONFLICT (ns, blob_id) DO UPDATE SET relied = GREATEST(blob_gc.relied, excluded.relied), claimed = NULL
    WHERE blob_gc.claimed IS NULL OR blob_gc.claimed < $4";
const CLAIM: &str = "INSERT INTO blob_gc (ns, blob_id, relied, claimed) VALUES ($1, $2, 0, $3)
    ON CONFLICT (ns, blob_id) DO UPDATE SET claimed = excluded.claimed
    WHERE blob_gc.relied < $4 AND (blob_gc.claimed IS NULL OR blob_gc.claimed < $5)";
const RELEASE_REMOVED: &str = "DELETE FROM blob_gc WHERE ns = $1 AND blob_id = $2 AND claimed = $3";
const RELEASE_KEPT: &str =
    "UPDATE blob_gc SET claimed = NULL WHERE ns = $1 AND blob_id = $2 AND claimed = $3";
const PRUNE: &str =
    "DELETE FROM blob_gc WHERE ns = $1 AND ((claimed IS NULL AND relied < $2) OR claimed < $3)";
const MAKE_ID: &str = "INSERT INTO store_identity (one, id) VALUES (TRUE, $1) ON CONFLICT DO NOTHING";
const ID: &str = "SELECT id FROM store_identity";

impl Postgres {
    /// Runs `statement` (prepared once per connection) with `params`; the rows it changed.
    async fn change(&self, statement: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, MetaError> {
        let c = self.client().await?;
        let prepared = c.prepare_cached(statement).await?;
        Ok(c.execute(&prepared, params).await?)
    }

    pub async fn rely_on_blob(&self, n: String, id: IoHash, now: i64, stale: i64) -> Result<bool, MetaError> {
        Ok(self.change(RELY, &[&n, &&id.as_bytes()[..], &now, &stale]).await? == 1)
    }

    pub async fn claim_blob(
        &self,
        n: String,
        id: IoHash,
        now: i64,
        relied: i64,
        stale: i64,
    ) -> Result<bool, MetaError> {
        Ok(self.change(CLAIM, &[&n, &&id.as_bytes()[..], &now, &relied, &stale]).await? == 1)
    }

    pub async fn release_blob(
        &self,
        n: String,
        id: IoHash,
        claimed: i64,
        removed: bool,
    ) -> Result<(), MetaError> {
        let statement = if removed { RELEASE_REMOVED } else { RELEASE_KEPT };
        self.change(statement, &[&n, &&id.as_bytes()[..], &claimed]).await?;
        Ok(())
    }

    pub async fn prune_blob_claims(&self, n: String, relied: i64, stale: i64) -> Result<usize, MetaError> {
        Ok(self.change(PRUNE, &[&n, &relied, &stale]).await? as usize)
    }

    pub async fn store_id(&self, new: String) -> Result<String, MetaError> {
        self.change(MAKE_ID, &[&new]).await?;
        Ok(self.client().await?.query_one(ID, &[]).await?.get(0))
    }
}
