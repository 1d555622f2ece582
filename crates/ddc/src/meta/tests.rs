//! The metadata store's tests: most run against both backends (`on_each_backend!`), the rest
//! against Postgres alone.

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
    assert!(meta.put_ref(&ns, &bucket, &key, row(b"second", false), false).await.unwrap(), "not finalized");
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
    assert_eq!(meta.content_blob(&ns, IoHash::of(b"raw")).await.unwrap(), Some(IoHash::of(b"compressed")));
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
        assert!(meta.put_ref(&ns, &bucket, key, row(key.as_str().as_bytes(), true), false).await.unwrap());
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
    assert_refused(&second, "another tickwire ddc server");
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
    let refused = MetaStore::open_postgres_shared(url).await;
    assert_refused(&refused, "on local files");
    alone.bind_blob_store("files").await.unwrap();
    drop(alone);
    let a = MetaStore::open_postgres_shared(url).await.unwrap();
    let refused = a.bind_blob_store("s3://bucket/ddc").await;
    assert_refused(&refused, "refs name blobs in files");
    place.move_blob_store("s3://bucket/ddc").await;
    a.bind_blob_store("s3://bucket/ddc").await.unwrap();
    let b = MetaStore::open_postgres_shared(url).await.unwrap();
    b.bind_blob_store("s3://bucket/ddc").await.unwrap();
    let elsewhere = b.bind_blob_store("s3://bucket/other").await;
    assert_refused(&elsewhere, "refs name blobs in s3://bucket/ddc");
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
    assert_refused(&refused, "another tickwire ddc server");
}

/// A database kept by a server from before the blob store was recorded (refs, and no
/// record) is taken as a store of files: a server with blobs in S3 is refused.
#[tokio::test]
async fn an_unrecorded_database_with_refs_is_taken_as_files() {
    let Some(place) = TestPlace::new(TestBackend::Postgres) else { return };
    let url = place.url().unwrap();
    let old = MetaStore::open_postgres(url).await.unwrap();
    let (ns, bucket, key) = names();
    assert!(old.put_ref(&ns, &bucket, &key, row(b"old", true), false).await.unwrap());
    drop(old);
    let s3 = MetaStore::open_postgres_shared(url).await.unwrap();
    let refused = s3.bind_blob_store("s3://bucket/ddc").await;
    assert_refused(&refused, "refs name blobs in files");
}

/// `result` is a refusal whose reason says `why`.
fn assert_refused<T>(result: &Result<T, MetaError>, why: &str) {
    match result {
        Err(MetaError::Config(e)) if e.contains(why) => {}
        Err(e) => panic!("refused, but not for {why:?}: {e}"),
        Ok(_) => panic!("not refused (expected {why:?})"),
    }
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
            tokio::spawn(
                async move { meta.put_ref(&ns, &bucket, &key, row(&[i], true), false).await.unwrap() },
            )
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
    let (mut writer, observer) = (place.session().await, place.session().await);
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
    let ended = place
        .session()
        .await
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
