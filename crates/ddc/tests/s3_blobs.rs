//! The S3 blob backend ([`BlobStore::open_s3`]) against a real S3 protocol server (`s3s-fs`,
//! `common/s3.rs`): what the local store's unit tests check, plus what only S3 has (multipart
//! uploads, refused credentials). The HTTP suites run over it too (`TICKWIRE_DDC_TEST_BLOBS=s3`
//! in `scripts/test.sh`).

mod common;

use common::s3;
use tickwire_ddc::{BlobStore, IoHash, Name, S3Config, StoreError};
use tokio::io::AsyncReadExt;

fn ns() -> Name {
    "ue.ddc".parse().unwrap()
}

async fn open(config: &S3Config) -> (tempfile::TempDir, BlobStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open_s3(dir.path(), config).await.unwrap();
    (dir, store)
}

async fn read(store: &BlobStore, id: &IoHash, start: u64, len: u64) -> Option<Vec<u8>> {
    let blob = store.open_blob(&ns(), id).await.unwrap()?;
    let mut out = Vec::new();
    blob.read_range(start, len).await.unwrap().read_to_end(&mut out).await.unwrap();
    Some(out)
}

async fn read_all(store: &BlobStore, id: &IoHash) -> Option<Vec<u8>> {
    let size = store.size(&ns(), id).await.unwrap()?;
    read(store, id, 0, size).await
}

fn staging_is_empty(dir: &tempfile::TempDir) -> bool {
    std::fs::read_dir(dir.path().join(".tmp")).unwrap().next().is_none()
}

/// A body of `len` bytes that differ from part to part.
fn body(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 ^ (i >> 20) as u8).collect()
}

#[tokio::test]
async fn stores_reads_ranges_and_deletes() {
    let config = s3::bucket();
    let (dir, store) = open(&config).await;
    assert!(store.is_shared());
    let bytes = body(100_000);
    let (id, size) = store.put(&ns(), Some(IoHash::of(&bytes)), &bytes[..], u64::MAX).await.unwrap();
    assert_eq!((id, size), (IoHash::of(&bytes), bytes.len() as u64));
    assert_eq!(read_all(&store, &id).await.unwrap(), bytes);
    assert_eq!(read(&store, &id, 1_000, 5).await.unwrap(), &bytes[1_000..1_005]);
    assert_eq!(read(&store, &id, 99_999, 1).await.unwrap(), &bytes[99_999..]);
    assert_eq!(read(&store, &id, 7, 0).await.unwrap(), b"");
    assert!(store.exists(&ns(), &id).await.unwrap());
    assert_eq!(store.size(&ns(), &id).await.unwrap(), Some(100_000));
    // In the bucket, under the prefix, in the local store's layout.
    let hex = id.to_hex();
    let file = s3::files_of(&config).join("ue.ddc").join(&hex[..2]).join(&hex[2..4]).join(&hex);
    assert_eq!(std::fs::read(&file).unwrap(), bytes);
    // Without an expected hash the store computes it; a second upload changes nothing.
    let (again, _) = store.put(&ns(), None, &bytes[..], u64::MAX).await.unwrap();
    assert_eq!(again, id);
    assert_eq!(store.usage().bytes.load(std::sync::atomic::Ordering::Relaxed), 100_000);
    assert!(store.delete(&ns(), &id).await.unwrap());
    assert!(!store.delete(&ns(), &id).await.unwrap());
    assert!(!store.exists(&ns(), &id).await.unwrap());
    assert!(store.open_blob(&ns(), &id).await.unwrap().is_none());
    assert!(!file.exists());
    assert!(staging_is_empty(&dir), "the staged upload is gone");
}

/// Blobs at the edges of the part size read back whole; past one part, they went as a
/// multipart upload (S3's entity tag says how many parts), and ranges across parts read right.
#[tokio::test]
async fn blobs_of_every_size_round_trip() {
    use object_store::ObjectStoreExt;
    const PART: usize = tickwire_ddc::blob_store::PART;
    let config = s3::bucket();
    let (dir, store) = open(&config).await;
    let bucket = s3::client(&config);
    for (len, parts) in
        [(0, None), (1, None), (PART, None), (PART + 1, Some(2)), (2 * PART + 12_345, Some(3))]
    {
        let bytes = body(len);
        let (id, size) = store.put(&ns(), None, &bytes[..], u64::MAX).await.unwrap();
        assert_eq!((id, size), (IoHash::of(&bytes), len as u64));
        assert!(read_all(&store, &id).await.unwrap() == bytes, "{len} bytes whole");
        let tag = bucket.head(&s3::key(&config, &ns(), &id)).await.unwrap().e_tag.unwrap();
        let sent_in = tag.trim_matches('"').rsplit_once('-').map(|(_, n)| n.parse::<usize>().unwrap());
        assert_eq!(sent_in, parts, "{len} bytes: entity tag {tag}");
        if len > PART + 10 {
            let cross = PART as u64 - 10;
            assert_eq!(
                read(&store, &id, cross, 20).await.unwrap(),
                &bytes[cross as usize..cross as usize + 20]
            );
        }
    }
    assert!(staging_is_empty(&dir));
}

#[tokio::test]
async fn a_mismatched_or_oversized_body_is_stored_nowhere() {
    let config = s3::bucket();
    let (dir, store) = open(&config).await;
    let wrong = IoHash::of(b"something else");
    let err = store.put(&ns(), Some(wrong), &b"the body"[..], u64::MAX).await.unwrap_err();
    assert!(matches!(err, StoreError::HashMismatch { .. }), "{err}");
    let err = store.put(&ns(), None, &[0u8; 100][..], 99).await.unwrap_err();
    assert!(matches!(err, StoreError::TooLarge { limit: 99 }), "{err}");
    assert!(!store.exists(&ns(), &wrong).await.unwrap());
    assert!(!store.exists(&ns(), &IoHash::of(b"the body")).await.unwrap());
    assert!(!store.exists(&ns(), &IoHash::of(&[0u8; 100])).await.unwrap());
    assert!(!s3::files_of(&config).exists(), "nothing reached the bucket");
    assert!(staging_is_empty(&dir));
}

#[tokio::test]
async fn a_namespace_goes_whole_and_usage_is_counted_at_open() {
    let config = s3::bucket();
    let (_dir, store) = open(&config).await;
    let other: Name = "other.ns".parse().unwrap();
    let mut ids = Vec::new();
    for i in 0..5u8 {
        ids.push(store.put(&ns(), None, &[i; 10][..], u64::MAX).await.unwrap().0);
    }
    let kept = store.put(&other, None, &b"kept"[..], u64::MAX).await.unwrap().0;
    // A second server on the same bucket counts what is there.
    let (_dir2, second) = open(&config).await;
    let usage = second.usage();
    for _ in 0..200 {
        if usage.counted.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(usage.blobs.load(std::sync::atomic::Ordering::Relaxed), 6);
    assert_eq!(usage.bytes.load(std::sync::atomic::Ordering::Relaxed), 54);
    // And sees what the first stored.
    assert_eq!(read_all(&second, &ids[0]).await.unwrap(), [0u8; 10]);
    store.delete_namespace(&ns()).await.unwrap();
    // Gone for the store that deleted them and for one that never saw them (the second store
    // remembers the one it read: see `a_blob_found_once_is_not_asked_for_again`).
    let (_dir3, third) = open(&config).await;
    for id in &ids {
        assert!(!store.exists(&ns(), id).await.unwrap());
        assert!(!third.exists(&ns(), id).await.unwrap());
    }
    assert!(third.exists(&other, &kept).await.unwrap(), "another namespace stays");
    assert_eq!(store.usage().blobs.load(std::sync::atomic::Ordering::Relaxed), 1);
}

/// A bucket that cannot be reached or listed is refused when the store opens, with an error
/// that names the bucket and not the secret.
#[tokio::test]
async fn bad_settings_are_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = s3::bucket();
    config.secret_access_key = Some("not-the-secret".into());
    let err = BlobStore::open_s3(dir.path(), &config).await.unwrap_err().to_string();
    assert!(err.contains("cannot list s3://"), "{err}");
    let printed = format!("{config:?}");
    assert!(!printed.contains("not-the-secret") && printed.contains("(set)"), "{printed}");
    let mut missing = s3::bucket();
    missing.url = "s3://no-such-bucket".into();
    let err = BlobStore::open_s3(dir.path(), &missing).await.unwrap_err().to_string();
    assert!(err.contains("s3://no-such-bucket"), "{err}");
    for url in ["http://bucket/x", "s3://", "s3:///prefix"] {
        let bad = S3Config { url: url.into(), ..s3::bucket() };
        let err = BlobStore::open_s3(dir.path(), &bad).await.unwrap_err();
        assert!(matches!(err, StoreError::Config(_)), "{url}: {err}");
    }
}

/// Two servers with one Postgres database and one bucket serve one cache: what is written
/// through one is read through the other, a ref whose attachment one server stored is
/// finalized on the other, and a blob deleted through one is gone for the other's writes: a
/// ref put through it needs the blob again, and an upload through it stores the blob again
/// (it remembered the blob, but writes ask the bucket).
#[test]
fn two_servers_share_one_cache() {
    use common::{Stores, start_on, status, url};
    use tickwire_ddc::cb::Value;
    let Some(meta_url) = common::postgres::database() else { return };
    let stores = Stores { meta_url: Some(meta_url), s3: Some(s3::bucket()) };
    let start = || {
        let api = tickwire_ddc::http::Limits { max_blob_bytes: 1 << 20, ..Default::default() };
        start_on(stores.clone(), Default::default(), api, None, |_| {})
    };
    let (a, b) = (start(), start());
    let call = |s: &common::Server, method: &str, path: &str, token: &str| {
        ureq::request(method, &url(s, path)).set("Authorization", &format!("Bearer {token}"))
    };
    let blob = b"an attachment stored through server a".to_vec();
    let id = IoHash::of(&blob);
    let blob_path = format!("/api/v1/blobs/ue.ddc/{id}");
    assert_eq!(status(call(&a, "PUT", &blob_path, "writer").send_bytes(&blob)), 200);
    let mut got = Vec::new();
    let read = call(&b, "GET", &blob_path, "reader").call().unwrap();
    std::io::Read::read_to_end(&mut read.into_reader(), &mut got).unwrap();
    assert_eq!(got, blob, "b reads what a stored");

    // A ref naming the blob, put through `s`: what it needs.
    let put_ref = |s: &common::Server, path: &str, field: &str| {
        let object = Value::Object(vec![(field.into(), Value::BinaryAttachment(*id.as_bytes()))]).to_bytes();
        let put = call(s, "PUT", path, "writer")
            .set("Content-Type", "application/x-ue-cb")
            .set("Accept", "application/json")
            .set("X-Jupiter-IoHash", &IoHash::of(&object).to_hex())
            .send_bytes(&object)
            .unwrap();
        (object, put.into_json::<serde_json::Value>().unwrap()["needs"].clone())
    };
    let ref_path = "/api/v1/refs/ue.ddc/bucket/0123456789abcdef0123456789abcdef01234567";
    let (object, needs) = put_ref(&b, ref_path, "data");
    assert_eq!(needs, serde_json::json!([]), "b finds the attachment a stored");
    let read = call(&a, "GET", ref_path, "reader").set("Accept", "application/x-ue-cb").call().unwrap();
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut read.into_reader(), &mut got).unwrap();
    assert_eq!(got, object, "a reads the ref b wrote");

    assert_eq!(status(call(&a, "DELETE", &blob_path, "writer").call()), 200);
    assert_eq!(status(call(&b, "GET", &blob_path, "reader").call()), 404, "gone from b too");
    let (_, needs) =
        put_ref(&b, "/api/v1/refs/ue.ddc/bucket/1123456789abcdef0123456789abcdef01234567", "again");
    assert_eq!(needs, serde_json::json!([id.to_hex()]), "b asks the bucket");
    assert_eq!(status(call(&b, "PUT", &blob_path, "writer").send_bytes(&blob)), 200);
    assert_eq!(status(call(&a, "GET", &blob_path, "reader").call()), 200, "b's upload reached the bucket");
}

/// An upload dropped mid-body (a client that went away) leaves nothing staged, and a store
/// that opens clears what a crash left staged.
#[tokio::test]
async fn nothing_staged_is_left_behind() {
    let config = s3::bucket();
    let (dir, store) = open(&config).await;
    let (mut tx, rx) = tokio::io::duplex(64);
    tokio::io::AsyncWriteExt::write_all(&mut tx, &[1u8; 64]).await.unwrap();
    let ns = ns();
    let put = store.put(&ns, None, rx, u64::MAX);
    assert!(tokio::time::timeout(std::time::Duration::from_millis(200), put).await.is_err());
    assert!(staging_is_empty(&dir), "the dropped upload's staged file is gone");
    drop(tx);
    std::fs::write(dir.path().join(".tmp").join("999-0"), b"half a blo").unwrap();
    drop(store);
    let _again = BlobStore::open_s3(dir.path(), &config).await.unwrap();
    assert!(staging_is_empty(&dir), "cleared at open");
}

/// With a cache on disk: an upload through the store, and a read that missed, leave a copy
/// there that reads serve without the bucket (shown by removing the bucket's copy behind the
/// store's back); a delete through the store removes both.
#[tokio::test]
async fn a_cache_serves_what_it_has_seen() {
    let config = S3Config { cache_bytes: 1 << 20, ..s3::bucket() };
    let (_dir, store) = open(&config).await;
    let uploaded = store.put(&ns(), None, &body(1_000)[..], u64::MAX).await.unwrap().0;
    let bucket = s3::client(&config);
    // Read through a second store, whose cache is empty: it downloads the blob into it.
    let (_dir2, second) = open(&config).await;
    assert_eq!(read_all(&second, &uploaded).await.unwrap(), body(1_000));
    use object_store::ObjectStoreExt;
    bucket.delete(&s3::key(&config, &ns(), &uploaded)).await.unwrap();
    for (which, store) in [("the uploader", &store), ("the reader", &second)] {
        assert_eq!(read_all(store, &uploaded).await.unwrap(), body(1_000), "{which} reads its copy");
        assert_eq!(read(store, &uploaded, 10, 5).await.unwrap(), &body(1_000)[10..15]);
        assert!(store.known(&ns(), &uploaded).await.unwrap(), "{which} knows it, for reads");
        assert!(!store.exists(&ns(), &uploaded).await.unwrap(), "{which} asks the bucket, for writes");
    }
    // A delete through a store removes its copy too.
    store.delete(&ns(), &uploaded).await.unwrap();
    assert!(!store.exists(&ns(), &uploaded).await.unwrap());
    assert!(store.open_blob(&ns(), &uploaded).await.unwrap().is_none());
}

/// A copy in the bucket that does not hash to its name is not served: the read that would
/// download it into the cache fails.
#[tokio::test]
async fn a_damaged_copy_in_the_bucket_is_not_served() {
    let config = S3Config { cache_bytes: 1 << 20, ..s3::bucket() };
    let (_dir, store) = open(&S3Config { cache_bytes: 0, ..config.clone() }).await;
    let id = store.put(&ns(), None, &body(1_000)[..], u64::MAX).await.unwrap().0;
    use object_store::ObjectStoreExt;
    let damaged = bytes::Bytes::from(body(999));
    s3::client(&config).put(&s3::key(&config, &ns(), &id), damaged.into()).await.unwrap();
    let (_dir2, cached) = open(&config).await;
    let err = cached.open_blob(&ns(), &id).await.err().expect("refused");
    assert!(err.to_string().contains("hashing to"), "{err}");
}

/// One server per root: a second store on the same root is refused while the first is open.
#[tokio::test]
async fn a_root_takes_one_server() {
    let dir = tempfile::tempdir().unwrap();
    let first = BlobStore::open_s3(dir.path(), &s3::bucket()).await.unwrap();
    for second in [BlobStore::open_s3(dir.path(), &s3::bucket()).await, BlobStore::open(dir.path()).await] {
        let err = second.unwrap_err().to_string();
        assert!(err.contains("one server per root"), "{err}");
    }
    drop(first);
    BlobStore::open(dir.path()).await.unwrap();
}

/// Without a cache, a blob found in the bucket once is known to be there for reads: the next
/// read's presence check does not ask again (shown by removing it behind the store's back),
/// while a write's asks, and so does a store that never saw it. A read of it then finds it
/// gone (404 material).
#[tokio::test]
async fn a_blob_found_once_is_not_asked_for_again() {
    use object_store::ObjectStoreExt;
    let config = s3::bucket();
    let (_dir, store) = open(&config).await;
    let id = store.put(&ns(), None, &b"seen"[..], u64::MAX).await.unwrap().0;
    s3::client(&config).delete(&s3::key(&config, &ns(), &id)).await.unwrap();
    assert!(store.known(&ns(), &id).await.unwrap(), "remembered, for reads");
    let (_dir2, fresh) = open(&config).await;
    assert!(!fresh.known(&ns(), &id).await.unwrap(), "asked, and gone");
    let blob = store.open_blob(&ns(), &id).await.unwrap().expect("remembered");
    let err = blob.read_all().await.err().expect("gone from the bucket");
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
    assert!(!store.exists(&ns(), &id).await.unwrap(), "a write's check asks the bucket");
    assert!(!store.known(&ns(), &id).await.unwrap(), "and what it found is remembered");
}

/// A send to the bucket goes on when its client goes away: an upload dropped once its
/// multipart upload has started still lands in the bucket (and leaves nothing staged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_outlives_its_client() {
    use object_store::ObjectStoreExt;
    let config = s3::bucket();
    let (dir, store) = open(&config).await;
    let store = std::sync::Arc::new(store);
    let bytes = body(2 * tickwire_ddc::blob_store::PART + 1);
    let id = IoHash::of(&bytes);
    let uploading = {
        let (store, bytes) = (store.clone(), bytes.clone());
        tokio::spawn(async move { store.put(&ns(), None, &bytes[..], u64::MAX).await })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while s3::multipart_starts(&config) == 0 {
        assert!(std::time::Instant::now() < deadline, "the send never started");
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    uploading.abort(); // The client goes away mid-send.
    let bucket = s3::client(&config);
    loop {
        match bucket.head(&s3::key(&config, &ns(), &id)).await {
            Ok(meta) => {
                assert_eq!(meta.size, bytes.len() as u64);
                break;
            }
            Err(_) => assert!(std::time::Instant::now() < deadline, "the send stopped with its client"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(store.finish(std::time::Duration::from_secs(20)).await, "nothing left running");
    assert!(staging_is_empty(&dir));
}

/// An upload of a blob the caller has just found missing (`exists`, as the API's PUT and POST
/// do when the client names the hash) is sent without asking the bucket again; a plain put asks
/// once; a body that does not hash to the id it was found missing as is stored nowhere.
#[tokio::test]
async fn a_blob_found_missing_is_sent_without_asking_again() {
    let config = s3::bucket();
    let (_dir, store) = open(&config).await;
    let heads = || s3::requests(&config, "HEAD");
    let body = b"found missing a moment ago";
    let id = IoHash::of(body);
    let before = heads();
    assert_eq!(store.put_missing(&ns(), id, &body[..], u64::MAX).await.unwrap(), (id, body.len() as u64));
    assert_eq!(heads(), before, "not asked again");
    assert_eq!(read_all(&store, &id).await.unwrap(), body);
    let before = heads();
    store.put(&ns(), None, &b"not checked by the caller"[..], u64::MAX).await.unwrap();
    assert_eq!(heads(), before + 1, "asked once");
    let wrong = store.put_missing(&ns(), IoHash::of(b"other"), &body[..], u64::MAX).await.unwrap_err();
    assert!(matches!(wrong, StoreError::HashMismatch { .. }), "{wrong}");
    assert!(!store.exists(&ns(), &IoHash::of(b"other")).await.unwrap());
}
