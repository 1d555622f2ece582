//! A DDC server for the integration tests: a temporary root, two tokens, on its own thread.
#![allow(dead_code)]

pub mod postgres;
pub mod s3;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tickwire_ddc::http::{Ddc, Limits, router};
use tickwire_ddc::meta::MetaStore;
use tickwire_ddc::serve::{ServeLimits, serve};
use tickwire_ddc::{Auth, BlobStore};

pub const TOKENS: &str = r#"
[[tokens]]
token = "writer"
namespaces = ["ue.ddc"]
actions = ["ReadObject", "WriteObject", "DeleteObject", "DeleteBucket", "DeleteNamespace"]

[[tokens]]
token = "reader"
namespaces = ["ue.ddc"]
actions = ["ReadObject"]

[[tokens]]
token = "putter"
namespaces = ["ue.ddc"]
actions = ["WriteObject"]
"#;

/// With `postgres` in it, every server keeps its metadata in a database of its own on the
/// test Postgres server (`postgres.rs`) instead of SQLite: `scripts/test.sh` runs the refs
/// suite so a second time.
pub const META_ENV: &str = "TICKWIRE_DDC_TEST_META";

/// With `s3` in it, every server keeps its blobs in a bucket of its own on the test S3 server
/// (`s3.rs`) instead of files; with `s3-cached`, with a cache of 64 MiB on disk in front:
/// `scripts/test.sh` runs the suites so once more.
pub const BLOBS_ENV: &str = "TICKWIRE_DDC_TEST_BLOBS";

pub struct Server {
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

/// A server with the default limits.
pub fn start() -> Server {
    start_with(ServeLimits::default(), Duration::from_secs(30))
}

/// A server on its own thread and runtime, so the tests can use a blocking client.
/// A request body may stall for `body_allowance` (at the default minimum rate).
pub fn start_with(limits: ServeLimits, body_allowance: Duration) -> Server {
    start_full(limits, body_allowance, None)
}

/// [`start_with`], serving HTTPS with `tls`.
pub fn start_full(
    limits: ServeLimits,
    body_allowance: Duration,
    tls: Option<Arc<tickwire_transport::TlsServer>>,
) -> Server {
    let defaults = Limits::default();
    let body = tickwire_ddc::pace::MinRate { allowance: body_allowance, ..defaults.body };
    start_api(limits, Limits { max_blob_bytes: 1 << 20, body, ..defaults }, tls)
}

/// A server with the API's limits as given.
pub fn start_api(
    limits: ServeLimits,
    api_limits: Limits,
    tls: Option<Arc<tickwire_transport::TlsServer>>,
) -> Server {
    start_configured(limits, api_limits, tls, |_| {})
}

/// [`start_api`], with `configure` applied to the server's settings before it serves.
pub fn start_configured(
    limits: ServeLimits,
    api_limits: Limits,
    tls: Option<Arc<tickwire_transport::TlsServer>>,
    configure: fn(&mut Ddc),
) -> Server {
    let meta_url = if std::env::var_os(META_ENV).is_some_and(|v| v == "postgres") {
        assert!(
            !postgres::skipped(),
            "{META_ENV}=postgres, but TICKWIRE_SKIP_POSTGRES=1: nothing would test Postgres"
        );
        postgres::database()
    } else {
        None
    };
    let s3 = match std::env::var(BLOBS_ENV).as_deref() {
        Ok("s3") => Some(s3::bucket()),
        Ok("s3-cached") => Some(tickwire_ddc::S3Config { cache_bytes: 64 << 20, ..s3::bucket() }),
        Ok("") | Err(_) => None,
        Ok(other) => panic!("{BLOBS_ENV}={other}: expected s3 or s3-cached"),
    };
    start_on(Stores { meta_url, s3 }, limits, api_limits, tls, configure)
}

/// Where a test server keeps its metadata and blobs; by default, under its temporary root.
#[derive(Clone, Default)]
pub struct Stores {
    /// A Postgres database (shared with other servers when the blobs are in S3).
    pub meta_url: Option<String>,
    /// An S3 bucket.
    pub s3: Option<tickwire_ddc::S3Config>,
}

/// A server with its data in `stores`.
pub fn start_on(
    stores: Stores,
    limits: ServeLimits,
    api_limits: Limits,
    tls: Option<Arc<tickwire_transport::TlsServer>>,
    configure: fn(&mut Ddc),
) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_owned();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let meta = match (stores.meta_url, &stores.s3) {
                (Some(url), Some(_)) => MetaStore::open_postgres_shared(&url).await.unwrap(),
                (Some(url), None) => MetaStore::open_postgres(&url).await.unwrap(),
                (None, _) => MetaStore::open(&root).await.unwrap(),
            };
            let blobs = match stores.s3 {
                Some(config) => BlobStore::open_s3(&root, &config).await.unwrap(),
                None => BlobStore::open(&root).await.unwrap(),
            };
            let auth = Auth::from_toml(TOKENS).unwrap();
            let mut ddc = Ddc::open_with_stores(blobs, meta, auth, api_limits).await.unwrap();
            configure(&mut ddc);
            let ddc = Arc::new(ddc);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let connections = ddc.connections.clone();
            serve(listener, router(ddc), limits, tls, connections, std::future::pending()).await.unwrap();
        });
    });
    Server { addr: rx.recv().unwrap(), _dir: dir }
}

pub fn url(s: &Server, path: &str) -> String {
    format!("http://{}{path}", s.addr)
}

pub fn status(r: Result<ureq::Response, ureq::Error>) -> u16 {
    match r {
        Ok(resp) => resp.status(),
        Err(ureq::Error::Status(code, _)) => code,
        Err(e) => panic!("transport error: {e}"),
    }
}

/// Puts a ref whose object is one binary field of `bytes` bytes (read whole into memory by
/// every read of the ref): its path, and the object.
pub fn put_large_object(s: &Server, bytes: usize) -> (String, Vec<u8>) {
    let field = tickwire_ddc::cb::Value::Binary(vec![5u8; bytes]);
    let object = tickwire_ddc::cb::Value::Object(vec![("Payload".into(), field)]).to_bytes();
    let path = "/api/v1/refs/ue.ddc/bucket/0123456789abcdef0123456789abcdef01234567";
    let put = ureq::put(&url(s, path))
        .set("Authorization", "Bearer writer")
        .set("Content-Type", "application/x-ue-cb")
        .set("X-Jupiter-IoHash", &tickwire_ddc::IoHash::of(&object).to_hex())
        .send_bytes(&object);
    assert_eq!(status(put), 200);
    (path.to_owned(), object)
}

/// A batch PUT op `id`: `object` under `bucket/key`, with its hash.
pub fn put_op(id: i128, bucket: &str, key: &str, object: &[u8]) -> tickwire_ddc::cb::Value {
    use tickwire_ddc::cb::Value;
    Value::Object(vec![
        ("opId".into(), Value::Integer(id)),
        ("op".into(), Value::String("PUT".into())),
        ("bucket".into(), Value::String(bucket.into())),
        ("key".into(), Value::String(key.into())),
        ("payload".into(), Value::embed_object(object).expect("a compact-binary object")),
        ("payloadHash".into(), Value::Hash(*tickwire_ddc::IoHash::of(object).as_bytes())),
    ])
}
