//! Garbage collection of blobs in S3, through the server's own wiring
//! ([`Ddc::open_with_stores`], which makes writes record the old blobs they rely on), against a
//! real S3 protocol server (`s3s-fs`, `common/s3.rs`): what it removes and keeps with SQLite
//! metadata; with two servers on one Postgres database and one bucket, that a write through
//! one keeps a collection through the other off the blob it relies on; and what a collection
//! does when the bucket fails a delete or a listing (the server refuses the requests a test
//! names).

mod common;

use std::time::{Duration, SystemTime};

use common::s3;
use tickwire_ddc::cb::Value;
use tickwire_ddc::gc::{GcPolicy, GcReport};
use tickwire_ddc::http::{Ddc, Limits};
use tickwire_ddc::meta::{MetaStore, RefRow, now_ms};
use tickwire_ddc::storage::ContentError;
use tickwire_ddc::{Auth, BlobStore, IoHash, Name, RefKey, S3Config};

const HOUR: Duration = Duration::from_secs(3600);

fn ns() -> Name {
    "ue.ddc".parse().unwrap()
}

/// A server's store on `config`'s bucket, with metadata from `meta` (SQLite under its root
/// when `None`).
async fn server(config: &S3Config, meta: Option<&str>) -> (tempfile::TempDir, Ddc) {
    let dir = tempfile::tempdir().unwrap();
    let blobs = BlobStore::open_s3(dir.path(), config).await.unwrap();
    let meta = match meta {
        None => MetaStore::open(dir.path()).await.unwrap(),
        Some(url) => MetaStore::open_postgres_shared(url).await.unwrap(),
    };
    let ddc = Ddc::open_with_stores(blobs, meta, Auth::Dev, Limits::default()).await.unwrap();
    counted(&ddc).await;
    (dir, ddc)
}

/// Waits for the count of the bucket made at open (a collection sweeps only once it is done),
/// up to 30 s (1,001 objects on a loaded machine).
async fn counted(ddc: &Ddc) {
    for _ in 0..3000 {
        if ddc.content.blobs.usage().counted.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the count at open did not finish");
}

async fn put(ddc: &Ddc, bytes: &[u8]) -> IoHash {
    ddc.content.blobs.put(&ns(), None, bytes, u64::MAX).await.unwrap().0
}

/// Whether the bucket holds the blob, asked of it directly.
fn in_bucket(config: &S3Config, id: &IoHash) -> bool {
    let hex = id.to_hex();
    s3::files_of(config).join("ue.ddc").join(&hex[..2]).join(&hex[2..4]).join(&hex).exists()
}

/// A finalized ref `key` (one character, repeated) whose object names `named`.
async fn put_ref(ddc: &Ddc, key: &str, named: &[IoHash]) {
    let fields = named.iter().map(|id| (id.to_hex(), Value::BinaryAttachment(*id.as_bytes()))).collect();
    let object = Value::Object(fields).to_bytes();
    let row = RefRow { object_hash: IoHash::of(&object), object, finalized: true, last_access_ms: now_ms() };
    let (bucket, key) = (Name::bucket("b").unwrap(), key.repeat(40).parse::<RefKey>().unwrap());
    assert!(ddc.content.meta.put_ref(&ns(), &bucket, &key, row, true).await.unwrap());
}

async fn collect(ddc: &Ddc, at: SystemTime) -> GcReport {
    ddc.collect_garbage(&GcPolicy::default(), at).await.unwrap()
}

/// A collection removes from the bucket the blobs no ref names once they are older than the
/// grace, with the content ids that name them, and keeps what a ref names; the blob the ref
/// named goes once the ref has expired. A grace shorter than S3's minimum is refused.
#[tokio::test]
async fn a_collection_removes_what_no_ref_names_from_the_bucket() {
    let config = s3::bucket();
    let (_dir, ddc) = server(&config, None).await;
    let named = put(&ddc, b"named by a ref").await;
    let unnamed = put(&ddc, b"named by nothing").await;
    let payload = b"a compressed payload named by nothing";
    let buffer = put(&ddc, &tickwire_ddc::compressed::encode_none(payload)).await;
    ddc.content.meta.put_content(&ns(), IoHash::of(payload), buffer).await.unwrap();
    put_ref(&ddc, "a", &[named]).await;
    let now = SystemTime::now();

    let early = collect(&ddc, now + HOUR / 2).await;
    assert_eq!((early.blobs_removed, early.blobs_kept), (0, 3), "all younger than the grace");

    let report = collect(&ddc, now + 3 * HOUR).await;
    assert_eq!((report.blobs_removed, report.blobs_kept), (2, 1), "{report:?}");
    assert!(in_bucket(&config, &named));
    assert!(!in_bucket(&config, &unnamed) && !in_bucket(&config, &buffer));
    assert_eq!(ddc.content.meta.content_blob(&ns(), IoHash::of(payload)).await.unwrap(), None);
    assert!(!ddc.content.blobs.known(&ns(), &unnamed).await.unwrap(), "not remembered either");

    let late = collect(&ddc, now + 15 * 24 * HOUR).await;
    assert_eq!((late.refs_expired, late.blobs_removed), (1, 1), "{late:?}");
    assert!(!in_bucket(&config, &named));

    let short = GcPolicy { blob_grace: Duration::from_secs(60), ..GcPolicy::default() };
    let refused = ddc.collect_garbage(&short, now).await;
    assert!(matches!(refused, Err(ContentError::GraceTooShort { .. })), "{refused:?}");
}

/// A bucket's prefix serves one metadata store: a server with metadata of its own (here: another
/// root's SQLite file) is refused, saying why; the first store's servers start again. The
/// record is no blob: a count of the bucket leaves it out.
#[tokio::test]
async fn a_bucket_serves_one_metadata_store() {
    let config = s3::bucket();
    let (first_dir, first) = server(&config, None).await;
    drop(first);
    let dir = tempfile::tempdir().unwrap();
    let blobs = BlobStore::open_s3(dir.path(), &config).await.unwrap();
    let meta = MetaStore::open(dir.path()).await.unwrap();
    let refused = Ddc::open_with_stores(blobs, meta, Auth::Dev, Limits::default()).await.err().unwrap();
    assert!(refused.to_string().contains("another metadata store"), "{refused}");
    let blobs = BlobStore::open_s3(first_dir.path(), &config).await.unwrap();
    let meta = MetaStore::open(first_dir.path()).await.unwrap();
    let again = Ddc::open_with_stores(blobs, meta, Auth::Dev, Limits::default()).await.unwrap();
    counted(&again).await;
    let blobs = again.content.blobs.usage().blobs.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(blobs, 0, "the record is no blob");
}

/// Two servers on one database and one bucket: a write through B that relies on an old blob
/// (an upload of it, skipped because the bucket has it) keeps A's collection off it for the
/// grace; after that, A's collection removes it and B's next upload sends it again.
#[tokio::test]
async fn a_write_through_one_server_keeps_another_servers_collection_off_its_blob() {
    let Some(url) = common::postgres::database() else { return };
    let config = s3::bucket();
    let (_a_dir, a) = server(&config, Some(&url)).await;
    let (_b_dir, b) = server(&config, Some(&url)).await;
    let bytes = b"uploaded through a two hours ago, relied on through b now";
    let id = put(&a, bytes).await;
    a.content.meta.add_namespace(&ns()).await.unwrap();
    s3::set_written(&config, &ns(), &id, SystemTime::now() - 2 * HOUR);

    assert_eq!(put(&b, bytes).await, id, "b's upload finds it stored");
    let kept = collect(&a, SystemTime::now()).await;
    assert_eq!((kept.blobs_removed, kept.blobs_kept), (0, 1), "relied on through b: {kept:?}");
    assert!(in_bucket(&config, &id));

    let removed = collect(&a, SystemTime::now() + 2 * HOUR).await;
    assert_eq!(removed.blobs_removed, 1, "{removed:?}");
    assert!(!in_bucket(&config, &id));
    assert_eq!(put(&b, bytes).await, id);
    assert!(in_bucket(&config, &id), "b sent it again");
}

/// A delete the bucket fails is counted, and the sweep goes on with the other blobs. The failed
/// blob's claim stands, since the delete may still land: a write that relies on the blob waits
/// for it, a second collection leaves the blob alone, and its content id is kept.
#[tokio::test]
async fn a_failed_delete_keeps_its_claim_and_the_sweep_goes_on() {
    let config = s3::bucket();
    let (_dir, ddc) = server(&config, None).await;
    // More blobs than a sweep looks at at once, the first delete failing: the others wait for a
    // place behind it.
    let payloads: Vec<Vec<u8>> = (0..20).map(|i| format!("payload {i}").into_bytes()).collect();
    let mut buffers = Vec::new();
    for payload in &payloads {
        let buffer = put(&ddc, &tickwire_ddc::compressed::encode_none(payload)).await;
        ddc.content.meta.put_content(&ns(), IoHash::of(payload), buffer).await.unwrap();
        buffers.push((&payload[..], buffer));
    }
    s3::fail(&config, "DeleteObjects", 0, 1);
    let now = SystemTime::now();

    let report = collect(&ddc, now + 3 * HOUR).await;
    assert_eq!((report.blobs_removed, report.blobs_failed, report.blobs_kept), (19, 1, 0), "{report:?}");
    let kept: Vec<_> = buffers.iter().filter(|(_, buffer)| in_bucket(&config, buffer)).collect();
    let [&(payload, buffer)] = kept[..] else { panic!("one blob left, not {}", kept.len()) };
    for (raw, blob) in &buffers {
        let content = ddc.content.meta.content_blob(&ns(), IoHash::of(raw)).await.unwrap();
        assert_eq!(content.is_some(), *blob == buffer, "only the blob left keeps its content id");
    }

    // The claim stands: a write relying on the blob (old by the bucket's date, so recorded)
    // waits for it to end rather than upload over a delete that may still land.
    s3::set_written(&config, &ns(), &buffer, now - 2 * HOUR);
    let bytes = tickwire_ddc::compressed::encode_none(payload);
    let write = async { ddc.content.blobs.put(&ns(), None, &bytes[..], u64::MAX).await };
    assert!(tokio::time::timeout(Duration::from_secs(1), write).await.is_err(), "the write waits");
    let stale = now_ms() - 15 * 60 * 1000;
    assert!(!ddc.content.meta.rely_on_blob(&ns(), buffer, now_ms(), stale).await.unwrap(), "still claimed");

    let again = collect(&ddc, now + 3 * HOUR).await;
    assert_eq!((again.blobs_removed, again.blobs_failed, again.blobs_kept), (0, 0, 1), "{again:?}");
    assert!(in_bucket(&config, &buffer));
}

/// A listing that fails part way (its second page, every retry) ends the sweep with the error,
/// once the blobs of the first page are done: those are removed, with their content ids, and
/// the blob on the page that failed is kept, with its own. The next collection removes it.
#[tokio::test]
async fn a_listing_that_fails_part_way_ends_the_sweep_with_its_error() {
    let config = s3::bucket();
    // Written straight into the server's files, so that 1,001 blobs (a page of 1,000 and one)
    // take no uploads; counted by the server's count at open.
    let mut blobs: Vec<(IoHash, Vec<u8>)> = (0..1001)
        .map(|i| {
            let bytes = format!("unnamed blob {i}").into_bytes();
            (IoHash::of(&bytes), bytes)
        })
        .collect();
    blobs.sort_by_key(|(id, _)| id.to_hex());
    for (id, bytes) in &blobs {
        let hex = id.to_hex();
        let dir = s3::files_of(&config).join(ns().as_str()).join(&hex[..2]).join(&hex[2..4]);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(&hex), bytes).unwrap();
    }
    let (_dir, ddc) = server(&config, None).await;
    ddc.content.meta.add_namespace(&ns()).await.unwrap();
    // The first page's last blob: its content id is forgotten in the sweep's last batch, the
    // one after the listing failed.
    let (first, last) = (blobs[999].0, blobs[1000].0);
    let (first_raw, last_raw) = (IoHash::of(b"raw of the first page's last"), IoHash::of(b"raw of the last"));
    ddc.content.meta.put_content(&ns(), first_raw, first).await.unwrap();
    ddc.content.meta.put_content(&ns(), last_raw, last).await.unwrap();
    // The first page is served; the second, asked 4 times (3 retries), is refused each time.
    s3::fail(&config, "ListObjects", 1, 4);
    let later = SystemTime::now() + 3 * HOUR;

    let failed = ddc.collect_garbage(&GcPolicy::default(), later).await;
    assert!(failed.is_err(), "the listing's error: {failed:?}");
    assert!(blobs[..1000].iter().all(|(id, _)| !in_bucket(&config, id)), "the first page is removed");
    assert!(in_bucket(&config, &last));
    assert_eq!(ddc.content.meta.content_blob(&ns(), first_raw).await.unwrap(), None);
    assert_eq!(ddc.content.meta.content_blob(&ns(), last_raw).await.unwrap(), Some(last));

    let report = collect(&ddc, later).await;
    assert_eq!((report.blobs_removed, report.blobs_failed), (1, 0), "{report:?}");
    assert!(!in_bucket(&config, &last));
    assert_eq!(ddc.content.meta.content_blob(&ns(), last_raw).await.unwrap(), None);
}
