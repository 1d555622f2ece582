//! An S3-compatible server for the tests of the S3 blob backend: `s3s-fs` (the S3 protocol,
//! with its signatures checked, over files) in the test process itself, on a loopback port,
//! on a thread and runtime of its own, started on first use. Each caller gets a bucket of its
//! own. Its files are removed when the test process exits.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use tickwire_ddc::S3Config;

/// The server's one set of credentials.
pub const ACCESS_KEY: &str = "tickwire-test";
pub const SECRET_KEY: &str = "tickwire-test-secret";

struct Server {
    addr: SocketAddr,
    /// One directory per bucket.
    root: PathBuf,
}

static SERVER: OnceLock<Server> = OnceLock::new();
/// The requests the server got, as (bucket, what): the method, `CreateMultipartUpload`,
/// `DeleteObjects` or `ListObjects`. What a test watches to act while a send is under way, or to count what a call
/// asked.
static REQUESTS: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());
/// Requests to refuse, as (bucket, what, after, count): once `after` more requests of `what` to
/// the bucket have been served, the next `count` are answered 500 without reaching the store.
static FAULTS: std::sync::Mutex<Vec<(String, String, usize, usize)>> = std::sync::Mutex::new(Vec::new());

/// How many requests of `what` (as [`REQUESTS`] names them) `config`'s bucket got.
pub fn requests(config: &S3Config, what: &str) -> usize {
    let bucket = config.url.strip_prefix("s3://").unwrap().split('/').next().unwrap();
    REQUESTS.lock().unwrap().iter().filter(|(b, w)| b == bucket && w == what).count()
}

/// From now on, `config`'s bucket serves the next `after` requests of `what` (as
/// [`REQUESTS`] names them), then answers the `count` after them with a 500
/// `InternalError`, storing nothing, as a failing S3 would.
pub fn fail(config: &S3Config, what: &str, after: usize, count: usize) {
    let bucket = config.url.strip_prefix("s3://").unwrap().split('/').next().unwrap();
    FAULTS.lock().unwrap().push((bucket.to_owned(), what.to_owned(), after, count));
}

/// Whether the request is one a test asked [`fail`] to refuse (counting it down).
fn refused(bucket: &str, what: &str) -> bool {
    let mut faults = FAULTS.lock().unwrap();
    let Some(fault) = faults.iter_mut().find(|(b, w, _, count)| b == bucket && w == what && *count > 0)
    else {
        return false;
    };
    if fault.2 > 0 {
        fault.2 -= 1;
        return false;
    }
    fault.3 -= 1;
    true
}

/// How many multipart uploads were started in `config`'s bucket.
pub fn multipart_starts(config: &S3Config) -> usize {
    requests(config, "CreateMultipartUpload")
}
static ROOT: OnceLock<PathBuf> = OnceLock::new();
static NEXT_BUCKET: AtomicUsize = AtomicUsize::new(0);

/// A new, empty bucket on the test server, with blobs under the prefix `cache`.
pub fn bucket() -> S3Config {
    let server = SERVER.get_or_init(start);
    let name = format!("bucket{}", NEXT_BUCKET.fetch_add(1, Ordering::Relaxed));
    std::fs::create_dir(server.root.join(&name)).expect("a bucket's directory");
    S3Config {
        url: format!("s3://{name}/cache"),
        endpoint: Some(format!("http://{}", server.addr)),
        region: Some("us-east-1".into()),
        access_key_id: Some(ACCESS_KEY.into()),
        secret_access_key: Some(SECRET_KEY.into()),
        cache_bytes: 0,
    }
}

/// The files the server keeps for `config`'s bucket, under its prefix.
pub fn files_of(config: &S3Config) -> PathBuf {
    let rest = config.url.strip_prefix("s3://").expect("an s3:// URL");
    SERVER.get().expect("started").root.join(rest)
}

/// Sets when the bucket says blob `id` of `ns` was last written (the server's files' times).
pub fn set_written(
    config: &S3Config,
    ns: &tickwire_ddc::Name,
    id: &tickwire_ddc::IoHash,
    at: std::time::SystemTime,
) {
    let hex = id.to_hex();
    let file = files_of(config).join(ns.as_str()).join(&hex[..2]).join(&hex[2..4]).join(&hex);
    std::fs::File::options().write(true).open(file).expect("the blob's file").set_modified(at).unwrap();
}

/// A client of the test server, on `config`'s bucket, to look at what the store wrote.
pub fn client(config: &S3Config) -> object_store::aws::AmazonS3 {
    let bucket = config.url.strip_prefix("s3://").unwrap().split('/').next().unwrap();
    object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(bucket)
        .with_endpoint(config.endpoint.clone().unwrap())
        .with_region("us-east-1")
        .with_access_key_id(ACCESS_KEY)
        .with_secret_access_key(SECRET_KEY)
        .with_allow_http(true)
        .build()
        .unwrap()
}

/// The object key of blob `id` of `ns` in `config`'s bucket.
pub fn key(
    config: &S3Config,
    ns: &tickwire_ddc::Name,
    id: &tickwire_ddc::IoHash,
) -> object_store::path::Path {
    let prefix = config.url.strip_prefix("s3://").unwrap().split_once('/').map_or("", |(_, p)| p);
    let hex = id.to_hex();
    object_store::path::Path::from(format!("{prefix}/{}/{}/{}/{hex}", ns.as_str(), &hex[..2], &hex[2..4]))
}

fn start() -> Server {
    let root = tempfile::Builder::new().prefix("tickwire-s3-").tempdir().expect("a temp dir").keep();
    remove_at_exit(&root);
    let fs = s3s_fs::FileSystem::new(&root).expect("s3s-fs over the temp dir");
    let mut builder = s3s::service::S3ServiceBuilder::new(fs);
    builder.set_auth(s3s::auth::SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
    let service = builder.build();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let addr = listener.local_addr().expect("its address");
    listener.set_nonblocking(true).expect("non-blocking");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
            loop {
                let Ok((socket, _)) = listener.accept().await else { continue };
                let service = service.clone();
                // Notes each request as it arrives, and refuses those a test asked to fail; a
                // CreateMultipartUpload is `POST /bucket/key?uploads`, a listing `GET
                // /bucket?list-type=2&...`, a DeleteObjects (how `object_store` sends even one
                // delete) `POST /bucket?delete`.
                let watched =
                    hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let path = req.uri().path().trim_start_matches('/');
                        let (bucket, object) = path.split_once('/').unwrap_or((path, ""));
                        let query = |name: &str| {
                            req.uri()
                                .query()
                                .is_some_and(|q| q.split('&').any(|p| p.split('=').next() == Some(name)))
                        };
                        let what = if req.method() == hyper::Method::POST && query("uploads") {
                            "CreateMultipartUpload".into()
                        } else if req.method() == hyper::Method::POST && object.is_empty() && query("delete")
                        {
                            "DeleteObjects".into()
                        } else if req.method() == hyper::Method::GET
                            && object.is_empty()
                            && query("list-type")
                        {
                            "ListObjects".into()
                        } else {
                            req.method().to_string()
                        };
                        let refuse = refused(bucket, &what);
                        REQUESTS.lock().unwrap().push((bucket.to_owned(), what));
                        let service = service.clone();
                        async move {
                            if !refuse {
                                return hyper::service::Service::call(&service, req).await;
                            }
                            // Read to its end first, so that the connection stays usable.
                            let _ = http_body_util::BodyExt::collect(req.into_body()).await;
                            Ok(hyper::Response::builder()
                                .status(500)
                                .header("content-type", "application/xml")
                                .body(s3s::Body::from(
                                    "<Error><Code>InternalError</Code><Message>refused by the \
                                     test</Message></Error>"
                                        .to_owned(),
                                ))
                                .expect("a valid response"))
                        }
                    });
                tokio::spawn(async move {
                    let http =
                        hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
                    let _ = http.serve_connection(hyper_util::rt::TokioIo::new(socket), watched).await;
                });
            }
        });
    });
    Server { addr, root }
}

fn remove_at_exit(root: &std::path::Path) {
    extern "C" fn remove() {
        if let Some(root) = ROOT.get() {
            let _ = std::fs::remove_dir_all(root);
        }
    }
    if ROOT.set(root.to_owned()).is_ok() {
        // SAFETY: `remove` is a plain function that stays valid for the life of the process.
        unsafe { libc::atexit(remove) };
    }
}
