//! The Postgres side of `meta/claims.rs`: writes' records, collections' claims and the store's
//! id, each one statement (`INSERT ... ON CONFLICT DO UPDATE ... WHERE` locks the row, so a
//! write and a claim on one blob are ordered).

use std::sync::LazyLock;

use tokio_postgres::types::ToSql;

use super::Postgres;
use crate::IoHash;
use crate::meta::MetaError;
use crate::meta::claims::sql;

/// The statements of `meta/claims.rs`, with `$N` parameters.
struct Statements {
    rely: String,
    claim: String,
    release_removed: String,
    release_kept: String,
    prune: String,
    make_id: String,
    id: String,
}

static STATEMENTS: LazyLock<Statements> = LazyLock::new(|| Statements {
    rely: sql::postgres(sql::RELY),
    claim: sql::postgres(sql::CLAIM),
    release_removed: sql::postgres(sql::RELEASE_REMOVED),
    release_kept: sql::postgres(sql::RELEASE_KEPT),
    prune: sql::postgres(sql::PRUNE),
    make_id: sql::postgres(sql::MAKE_ID),
    id: sql::postgres(sql::ID),
});

impl Postgres {
    /// Runs `statement` (prepared once per connection) with `params`; the rows it changed.
    async fn change(&self, statement: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, MetaError> {
        let c = self.client().await?;
        let prepared = c.prepare_cached(statement).await?;
        Ok(c.execute(&prepared, params).await?)
    }

    pub async fn rely_on_blob(&self, n: String, id: IoHash, now: i64, stale: i64) -> Result<bool, MetaError> {
        Ok(self.change(&STATEMENTS.rely, &[&n, &&id.as_bytes()[..], &now, &stale]).await? == 1)
    }

    pub async fn claim_blob(
        &self,
        n: String,
        id: IoHash,
        now: i64,
        relied: i64,
        stale: i64,
    ) -> Result<bool, MetaError> {
        Ok(self.change(&STATEMENTS.claim, &[&n, &&id.as_bytes()[..], &now, &relied, &stale]).await? == 1)
    }

    pub async fn release_blob(
        &self,
        n: String,
        id: IoHash,
        claimed: i64,
        removed: bool,
    ) -> Result<(), MetaError> {
        let statement = if removed { &STATEMENTS.release_removed } else { &STATEMENTS.release_kept };
        self.change(statement, &[&n, &&id.as_bytes()[..], &claimed]).await?;
        Ok(())
    }

    pub async fn prune_blob_claims(&self, n: String, relied: i64, stale: i64) -> Result<usize, MetaError> {
        Ok(self.change(&STATEMENTS.prune, &[&n, &relied, &stale]).await? as usize)
    }

    pub async fn store_id(&self, new: String) -> Result<String, MetaError> {
        self.change(&STATEMENTS.make_id, &[&new]).await?;
        Ok(self.client().await?.query_one(STATEMENTS.id.as_str(), &[]).await?.get(0))
    }
}
