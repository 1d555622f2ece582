//! Blobs in an S3 bucket, or any S3-compatible store, through `object_store`: what lets several
//! servers serve one cache (with their metadata in one PostgreSQL database).
//!
//! A blob is the object `<prefix>/<namespace>/<aa>/<bb>/<hash>`, the local store's layout.
//! An upload is first staged in a file under the server's root while it is hashed (S3 cannot
//! take an object back once written, and a body's hash is known only at its end); it goes to
//! the bucket only if it hashes right, and is acknowledged once S3 has acknowledged it, which
//! makes it durable. A blob already in the bucket is not sent again (the same name holds the
//! same bytes). Up to [`PART`] bytes are sent in one request; larger blobs go as a multipart
//! upload of such parts, one part filling while one is sent. At most [`UPLOADS`] uploads send
//! at once, so uploads hold at most `UPLOADS × 2 × PART` bytes in memory.
//!
//! Not built: garbage collection of blobs in S3 (refs still expire; their blobs stay).

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as Key;
use object_store::{ClientOptions, GetOptions, ObjectStore, ObjectStoreExt, RetryConfig, WriteMultipart};
use tokio::fs;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::{BlobReader, StoreError, TMP, TmpFile, Usage, copy_hashing, relative_place};
use crate::{IoHash, Name};

/// The most bytes sent in one request: a blob up to this size is one PUT, a larger one a
/// multipart upload of parts this size (S3 asks at least 5 MiB of every part but the last).
pub const PART: usize = 8 << 20;
/// The most uploads sending to the bucket at once; others wait their turn.
pub const UPLOADS: usize = 8;
/// A request that has sent or received nothing for this long fails (and is retried).
const READ_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Which bucket, and how to reach it. What is left `None` comes from the standard `AWS_*`
/// environment variables (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, ...), as the AWS tools read them.
#[derive(Debug, Clone, Default)]
pub struct S3Config {
    /// `s3://<bucket>` or `s3://<bucket>/<prefix>`.
    pub url: String,
    /// An S3-compatible server's address, e.g. `http://127.0.0.1:9000` (plain HTTP is allowed
    /// only when asked for so).
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
}

impl S3Config {
    /// The bucket and prefix of `s3://<bucket>[/<prefix>]`.
    fn bucket_and_prefix(&self) -> Result<(&str, Key), StoreError> {
        let bad = || StoreError::Config(format!("expected s3://<bucket>[/<prefix>], not {:?}", self.url));
        let rest = self.url.strip_prefix("s3://").ok_or_else(bad)?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad());
        }
        let prefix = Key::parse(prefix.trim_matches('/'))
            .map_err(|e| StoreError::Config(format!("the prefix of {:?}: {e}", self.url)))?;
        Ok((bucket, prefix))
    }
}

/// Blobs in an S3 bucket.
#[derive(Debug)]
pub struct S3Blobs {
    store: Arc<AmazonS3>,
    bucket: String,
    prefix: Key,
    /// The server's root: uploads are staged in its `.tmp`.
    root: PathBuf,
    next_tmp: AtomicU64,
    usage: Arc<Usage>,
    uploads: Arc<tokio::sync::Semaphore>,
}

/// A blob found in the bucket, to be read.
pub(super) struct Object {
    store: Arc<AmazonS3>,
    key: Key,
    size: u64,
    /// Its entity tag when found: a read fails rather than mix two objects' bytes.
    e_tag: Option<String>,
}

impl Object {
    pub(super) fn size(&self) -> u64 {
        self.size
    }

    pub(super) async fn read_range(self, start: u64, len: u64) -> io::Result<BlobReader> {
        if len == 0 {
            return Ok(Box::pin(tokio::io::empty()));
        }
        let options = GetOptions {
            range: Some((start..start + len).into()),
            if_match: self.e_tag,
            ..Default::default()
        };
        let got = self.store.get_opts(&self.key, options).await.map_err(to_io)?;
        let stream = got.into_stream().map_err(to_io);
        Ok(Box::pin(tokio_util::io::StreamReader::new(stream).take(len)))
    }
}

impl S3Blobs {
    pub(super) async fn open(root: impl Into<PathBuf>, config: &S3Config) -> Result<S3Blobs, StoreError> {
        let root = root.into();
        let tmp = root.join(TMP);
        fs::create_dir_all(&tmp).await?;
        // Uploads a crash left half staged.
        let mut stale = fs::read_dir(&tmp).await?;
        while let Some(entry) = stale.next_entry().await? {
            let _ = fs::remove_file(entry.path()).await;
        }
        let (bucket, prefix) = config.bucket_and_prefix()?;
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        let mut client = ClientOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_read_timeout(READ_TIMEOUT)
            // A large blob may take long to send to a slow client: each read is bounded instead.
            .with_timeout_disabled();
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        // Plain HTTP only to an endpoint named with `http://` (however it was given).
        let endpoint = builder.get_config_value(&AmazonS3ConfigKey::Endpoint);
        client = client.with_allow_http(endpoint.is_some_and(|e| e.starts_with("http://")));
        if let Some(region) = &config.region {
            builder = builder.with_region(region);
        }
        if let Some(key) = &config.access_key_id {
            builder = builder.with_access_key_id(key);
        }
        if let Some(secret) = &config.secret_access_key {
            builder = builder.with_secret_access_key(secret);
        }
        let retry =
            RetryConfig { max_retries: 3, retry_timeout: Duration::from_secs(60), ..Default::default() };
        let store = builder
            .with_client_options(client)
            .with_retry(retry)
            .build()
            .map_err(|e| StoreError::Config(e.to_string()))?;
        let blobs = S3Blobs {
            store: Arc::new(store),
            bucket: bucket.to_owned(),
            prefix,
            root,
            next_tmp: AtomicU64::new(0),
            usage: Arc::new(Usage::default()),
            uploads: Arc::new(tokio::sync::Semaphore::new(UPLOADS)),
        };
        // Reachable, and the credentials may list it: better refused at start than at the
        // first request.
        blobs
            .store
            .list_with_delimiter(Some(&blobs.prefix))
            .await
            .map_err(|e| StoreError::Config(format!("cannot list {}: {e}", blobs.describe())))?;
        blobs.count_in_background();
        Ok(blobs)
    }

    pub(super) fn describe(&self) -> String {
        match self.prefix.as_ref() {
            "" => format!("s3://{}", self.bucket),
            prefix => format!("s3://{}/{prefix}", self.bucket),
        }
    }

    pub(super) fn usage(&self) -> &Usage {
        &self.usage
    }

    /// Counts what is under the prefix, as the local store walks its tree.
    fn count_in_background(&self) {
        let (store, prefix, usage) = (self.store.clone(), self.prefix.clone(), self.usage.clone());
        tokio::spawn(async move {
            let mut listing = store.list(Some(&prefix));
            let (mut blobs, mut bytes) = (0, 0);
            while let Some(item) = listing.next().await {
                match item {
                    Ok(meta) => {
                        blobs += 1;
                        bytes += meta.size;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "counting the blobs in S3 failed; ddc_store_blobs stays at 0");
                        return;
                    }
                }
            }
            usage.add(blobs, bytes);
            usage.counted.store(true, Ordering::Relaxed);
        });
    }

    fn key(&self, ns: &Name, id: &IoHash) -> Key {
        let mut key = self.prefix.clone();
        for part in relative_place(ns, id) {
            key = key.clone().join(part);
        }
        key
    }

    fn namespace_key(&self, ns: &Name) -> Key {
        self.prefix.clone().join(ns.as_str())
    }

    pub(super) async fn put(
        &self,
        ns: &Name,
        expected: Option<IoHash>,
        mut body: impl AsyncRead + Unpin,
        limit: u64,
    ) -> Result<(IoHash, u64), StoreError> {
        let tmp = TmpFile::new(&self.root, &self.next_tmp);
        let (actual, size) = {
            let mut file = fs::File::create(tmp.path()).await?;
            let hashed = copy_hashing(&mut body, &mut file, limit).await?;
            tokio::io::AsyncWriteExt::flush(&mut file).await?;
            hashed
        };
        if let Some(expected) = expected
            && expected != actual
        {
            return Err(StoreError::HashMismatch { expected, actual });
        }
        let key = self.key(ns, &actual);
        if self.head(&key).await?.is_some() {
            return Ok((actual, size)); // The same name holds the same bytes.
        }
        // On a task of its own: a client that goes away mid-send (dropping this future) leaves
        // neither a half-sent multipart upload in the bucket nor an upload slot taken.
        let (store, uploads) = (self.store.clone(), self.uploads.clone());
        tokio::spawn(async move {
            let _turn = uploads.acquire().await.map_err(io::Error::other)?;
            send(&store, &key, &tmp, size).await
        })
        .await
        .map_err(io::Error::other)??;
        self.usage.add(1, size);
        Ok((actual, size))
    }

    /// The object's size and entity tag, if it is there.
    async fn head(&self, key: &Key) -> io::Result<Option<(u64, Option<String>)>> {
        match self.store.head(key).await {
            Ok(meta) => Ok(Some((meta.size, meta.e_tag))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(to_io(e)),
        }
    }

    pub(super) async fn open_object(&self, ns: &Name, id: &IoHash) -> io::Result<Option<Object>> {
        let key = self.key(ns, id);
        Ok(self.head(&key).await?.map(|(size, e_tag)| Object { store: self.store.clone(), key, size, e_tag }))
    }

    pub(super) async fn size(&self, ns: &Name, id: &IoHash) -> io::Result<Option<u64>> {
        Ok(self.head(&self.key(ns, id)).await?.map(|(size, _)| size))
    }

    pub(super) async fn delete(&self, ns: &Name, id: &IoHash) -> io::Result<bool> {
        let key = self.key(ns, id);
        // S3 answers a delete of a missing object as a success: look first.
        let Some((size, _)) = self.head(&key).await? else { return Ok(false) };
        match self.store.delete(&key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                self.usage.forget(1, size);
                Ok(true)
            }
            Err(e) => Err(to_io(e)),
        }
    }

    pub(super) async fn delete_namespace(&self, ns: &Name) -> io::Result<()> {
        let listing = self.store.list(Some(&self.namespace_key(ns)));
        let found = Arc::new(Usage::default());
        let counted = found.clone();
        let keys = listing
            .map_ok(move |meta| {
                counted.add(1, meta.size);
                meta.location
            })
            .boxed();
        let mut deleted = self.store.delete_stream(keys);
        let mut failed = None;
        while let Some(result) = deleted.next().await {
            match result {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        drop(deleted);
        self.usage.forget(found.blobs.load(Ordering::Relaxed), found.bytes.load(Ordering::Relaxed));
        failed.map_or(Ok(()), |e| Err(to_io(e)))
    }
}

/// Sends the staged blob `tmp` of `size` bytes to `key`: in one request, or in parts.
async fn send(store: &AmazonS3, key: &Key, tmp: &TmpFile, size: u64) -> io::Result<()> {
    let mut file = fs::File::open(tmp.path()).await?;
    if size <= PART as u64 {
        let mut bytes = Vec::with_capacity(size as usize);
        (&mut file).take(size).read_to_end(&mut bytes).await?;
        store.put(key, Bytes::from(bytes).into()).await.map_err(to_io)?;
        return Ok(());
    }
    let upload = store.put_multipart(key).await.map_err(to_io)?;
    let mut writer = WriteMultipart::new_with_chunk_size(upload, PART);
    if let Err(e) = send_parts(&mut file, &mut writer).await {
        let _ = writer.abort().await;
        return Err(e);
    }
    writer.finish().await.map_err(to_io)?;
    Ok(())
}

/// Sends the rest of `file` as parts, one filling while the one before is sent.
async fn send_parts(file: &mut fs::File, writer: &mut WriteMultipart) -> io::Result<()> {
    let mut buf = vec![0u8; super::CHUNK];
    loop {
        let n = file.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        writer.wait_for_capacity(1).await.map_err(to_io)?;
        writer.write(&buf[..n]);
    }
}

fn to_io(e: object_store::Error) -> io::Error {
    match e {
        object_store::Error::NotFound { .. } => io::Error::new(io::ErrorKind::NotFound, e),
        e => io::Error::other(e),
    }
}
