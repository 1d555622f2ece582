//! What keeps garbage collection of blobs in S3 from removing a blob a write relies on. A local
//! store gets that from the filesystem (a sweep renames a blob aside, then checks its time
//! again); S3 has no rename and no delete conditional on an object's time, so the servers of
//! one bucket agree through their metadata database instead, one row per blob in `blob_gc`:
//!
//! - a write that relies on a blob last written long ago (an upload skipped, a ref finalized)
//!   records when it did (`relied`), unless a collector has the blob claimed;
//! - a collector claims a blob (`claimed`) before it looks at it a last time and removes it,
//!   and is refused if a write relied on it within the grace, or another collector holds it;
//! - a claim older than [`MetaStore::rely_on_blob`]'s `stale_before_ms` is a collector that
//!   stopped half way: a write takes it over.
//!
//! Each step is one `INSERT ... ON CONFLICT DO UPDATE ... WHERE`, so a write and a claim on the
//! same blob are ordered by the row: whichever comes second sees the first. The protocol built
//! on them is in `crate::blob_store::s3` (writes) and `s3/collect.rs` (the collector); each
//! backend's statements are in its `claims.rs` (`sqlite/`, `postgres/`).
//!
//! All of it holds only among the servers of one metadata store: a collection through another
//! would remove the blobs only this one's refs name. So each store has an id of its own
//! ([`MetaStore::store_id`]), which the bucket records (`s3/collect.rs`).

use super::{Backend, MetaError, MetaStore, on_backend};
use crate::{IoHash, Name};

impl MetaStore {
    /// Records that a write relies on blob `id` of `ns` at `now_ms` (or later, if a write
    /// recorded a later time: a server whose clock is behind never moves it back); false while a collector
    /// holds a claim on it made at or after `stale_before_ms` (the write must wait for the
    /// claim to end, then look at the blob again). An older claim is taken over.
    pub async fn rely_on_blob(
        &self,
        ns: &Name,
        id: IoHash,
        now_ms: i64,
        stale_before_ms: i64,
    ) -> Result<bool, MetaError> {
        let ns = ns.as_str().to_owned();
        on_backend!(self, rely_on_blob(ns, id, now_ms, stale_before_ms))
    }

    /// Claims blob `id` of `ns` for removal at `now_ms`; false if a write relied on it at or
    /// after `relied_before_ms`, or another collector holds a claim made at or after
    /// `stale_before_ms`. A claim is ended by [`MetaStore::release_blob`] with the same `now_ms`.
    pub async fn claim_blob(
        &self,
        ns: &Name,
        id: IoHash,
        now_ms: i64,
        relied_before_ms: i64,
        stale_before_ms: i64,
    ) -> Result<bool, MetaError> {
        let ns = ns.as_str().to_owned();
        on_backend!(self, claim_blob(ns, id, now_ms, relied_before_ms, stale_before_ms))
    }

    /// Ends the claim made at `claimed_ms` (if it is still this one): the row goes with a blob
    /// that was `removed`; a blob kept keeps the time a write relied on it.
    pub async fn release_blob(
        &self,
        ns: &Name,
        id: IoHash,
        claimed_ms: i64,
        removed: bool,
    ) -> Result<(), MetaError> {
        let ns = ns.as_str().to_owned();
        on_backend!(self, release_blob(ns, id, claimed_ms, removed))
    }

    /// This metadata store's id, made (at random) the first time it is asked for.
    pub async fn store_id(&self) -> Result<String, MetaError> {
        let new = {
            use std::hash::BuildHasher;
            let random = || std::collections::hash_map::RandomState::new().hash_one(0u8);
            format!("{:016x}{:016x}", random(), random())
        };
        on_backend!(self, store_id(new))
    }

    /// Forgets `ns`'s rows that protect nothing any more: writes that relied on a blob before
    /// `relied_before_ms` with no claim, and claims made before `stale_before_ms`. How many.
    pub async fn prune_blob_claims(
        &self,
        ns: &Name,
        relied_before_ms: i64,
        stale_before_ms: i64,
    ) -> Result<usize, MetaError> {
        let ns = ns.as_str().to_owned();
        on_backend!(self, prune_blob_claims(ns, relied_before_ms, stale_before_ms))
    }
}

/// The statements of both backends, with SQLite's `?N` parameters (the Postgres backend
/// turns them into `$N` once: [`sql::postgres`]).
pub(super) mod sql {
    /// `relied` never moves back: a server whose clock is behind does not undo a later record.
    pub const RELY: &str = "INSERT INTO blob_gc (ns, blob_id, relied, claimed) VALUES (?1, ?2, ?3, NULL)
        ON CONFLICT (ns, blob_id) DO UPDATE SET claimed = NULL, relied = CASE
            WHEN blob_gc.relied > excluded.relied THEN blob_gc.relied ELSE excluded.relied END
        WHERE blob_gc.claimed IS NULL OR blob_gc.claimed < ?4";
    pub const CLAIM: &str = "INSERT INTO blob_gc (ns, blob_id, relied, claimed) VALUES (?1, ?2, 0, ?3)
        ON CONFLICT (ns, blob_id) DO UPDATE SET claimed = excluded.claimed
        WHERE blob_gc.relied < ?4 AND (blob_gc.claimed IS NULL OR blob_gc.claimed < ?5)";
    pub const RELEASE_REMOVED: &str = "DELETE FROM blob_gc WHERE ns = ?1 AND blob_id = ?2 AND claimed = ?3";
    pub const RELEASE_KEPT: &str =
        "UPDATE blob_gc SET claimed = NULL WHERE ns = ?1 AND blob_id = ?2 AND claimed = ?3";
    pub const PRUNE: &str =
        "DELETE FROM blob_gc WHERE ns = ?1 AND ((claimed IS NULL AND relied < ?2) OR claimed < ?3)";
    pub const MAKE_ID: &str = "INSERT INTO store_identity (one, id) VALUES (TRUE, ?1) ON CONFLICT DO NOTHING";
    pub const ID: &str = "SELECT id FROM store_identity";

    /// `statement` with Postgres's `$N` parameters (none of these has a `?` anywhere else).
    pub fn postgres(statement: &str) -> String {
        statement.replace('?', "$")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::testing::{TestBackend, TestPlace, on_each_backend};

    on_each_backend!(
        a_store_keeps_its_id,
        a_write_and_a_claim_exclude_each_other,
        a_stale_claim_is_taken_over,
        a_release_keeps_or_forgets_the_row,
        a_record_never_moves_back,
    );

    const MIN: i64 = 60_000;

    fn ns() -> Name {
        "ue.ddc".parse().unwrap()
    }

    /// A store's id is made once and kept across opens; another store's differs.
    async fn a_store_keeps_its_id(backend: TestBackend) {
        let Some(place) = TestPlace::new(backend) else { return };
        let id = place.open().await.store_id().await.unwrap();
        assert_eq!(id.len(), 32);
        assert_eq!(place.open().await.store_id().await.unwrap(), id);
        let other = TestPlace::new(backend).unwrap();
        assert_ne!(other.open().await.store_id().await.unwrap(), id);
    }

    /// A write that relied on a blob within the grace keeps a collector off it; a blob claimed
    /// makes a write wait (false) until the claim ends; a second collector is refused while
    /// the first holds it.
    async fn a_write_and_a_claim_exclude_each_other(backend: TestBackend) {
        let Some(place) = TestPlace::new(backend) else { return };
        let meta = place.open().await;
        let (a, b) = (IoHash::of(b"a"), IoHash::of(b"b"));
        let t = 1_000 * MIN;
        assert!(meta.rely_on_blob(&ns(), a, t, t - 5 * MIN).await.unwrap());
        assert!(!meta.claim_blob(&ns(), a, t + MIN, t, t - 4 * MIN).await.unwrap(), "relied on at t");
        assert!(meta.claim_blob(&ns(), a, t + MIN, t + 1, t - 4 * MIN).await.unwrap(), "relied on before");

        assert!(meta.claim_blob(&ns(), b, t, t, t - 5 * MIN).await.unwrap(), "no row yet");
        assert!(!meta.claim_blob(&ns(), b, t + 1, t + 1, t - 5 * MIN).await.unwrap(), "held");
        assert!(!meta.rely_on_blob(&ns(), b, t + 2, t - 5 * MIN).await.unwrap(), "claimed: wait");
        meta.release_blob(&ns(), b, t, false).await.unwrap();
        assert!(meta.rely_on_blob(&ns(), b, t + 3, t - 5 * MIN).await.unwrap(), "released");
        assert!(!meta.claim_blob(&ns(), b, t + 4, t + 3, t - 5 * MIN).await.unwrap());
    }

    /// A claim older than the bound is a collector that stopped: a write takes it over, and
    /// so does another collector.
    async fn a_stale_claim_is_taken_over(backend: TestBackend) {
        let Some(place) = TestPlace::new(backend) else { return };
        let meta = place.open().await;
        let (a, b) = (IoHash::of(b"a"), IoHash::of(b"b"));
        let t = 1_000 * MIN;
        for id in [a, b] {
            assert!(meta.claim_blob(&ns(), id, t, t, t - 5 * MIN).await.unwrap());
        }
        let later = t + 6 * MIN;
        assert!(meta.rely_on_blob(&ns(), a, later, later - 5 * MIN).await.unwrap());
        assert!(!meta.claim_blob(&ns(), a, later, later - MIN, later - 5 * MIN).await.unwrap(), "relied");
        assert!(meta.claim_blob(&ns(), b, later, later, later - 5 * MIN).await.unwrap());
        // The stopped collector's release no longer names the claim: it changes nothing.
        meta.release_blob(&ns(), b, t, true).await.unwrap();
        assert!(!meta.rely_on_blob(&ns(), b, later + 1, later - 5 * MIN).await.unwrap(), "still held");
    }

    /// A write stamped earlier than the one recorded (a server whose clock is behind) keeps the
    /// later time.
    async fn a_record_never_moves_back(backend: TestBackend) {
        let Some(place) = TestPlace::new(backend) else { return };
        let meta = place.open().await;
        let a = IoHash::of(b"a");
        let t = 1_000 * MIN;
        assert!(meta.rely_on_blob(&ns(), a, t + 10, t).await.unwrap());
        assert!(meta.rely_on_blob(&ns(), a, t, t).await.unwrap());
        assert!(!meta.claim_blob(&ns(), a, t + 20, t + 5, t).await.unwrap(), "still relied on at t + 10");
    }

    /// A blob removed takes its row with it; one kept keeps when a write relied on it, until
    /// a prune past that time (or past a stale claim) forgets it.
    async fn a_release_keeps_or_forgets_the_row(backend: TestBackend) {
        let Some(place) = TestPlace::new(backend) else { return };
        let meta = place.open().await;
        let (a, b, c) = (IoHash::of(b"a"), IoHash::of(b"b"), IoHash::of(b"c"));
        let t = 1_000 * MIN;
        assert!(meta.rely_on_blob(&ns(), a, t, t).await.unwrap());
        assert!(meta.claim_blob(&ns(), a, t + 1, t + 1, t).await.unwrap());
        meta.release_blob(&ns(), a, t + 1, false).await.unwrap();
        assert!(!meta.claim_blob(&ns(), a, t + 2, t, t).await.unwrap(), "kept: still relied on at t");

        assert!(meta.claim_blob(&ns(), b, t, t, t).await.unwrap());
        meta.release_blob(&ns(), b, t, true).await.unwrap();
        assert!(meta.claim_blob(&ns(), c, t, t, t).await.unwrap(), "stays claimed: stale later");

        assert_eq!(meta.prune_blob_claims(&ns(), t, t).await.unwrap(), 0, "nothing past its time");
        assert_eq!(meta.prune_blob_claims(&ns(), t + 1, t + 1).await.unwrap(), 2, "a's and c's rows");
        assert!(meta.claim_blob(&ns(), a, t + 2, t, t + 2).await.unwrap(), "forgotten");
        meta.delete_namespace(&ns()).await.unwrap();
        assert!(meta.claim_blob(&ns(), a, t + 3, t, t).await.unwrap(), "the namespace's rows went");
    }
}
