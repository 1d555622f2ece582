//! The HTTP API of Cloud DDC, over axum: the routes of `ddc-http-api.md` (health, raw and
//! compressed blobs, refs, the batch endpoint). Handlers live by resource in [`blobs`],
//! [`refs`] and [`batch`]; what they share is here: the server state ([`Ddc`]), the one
//! mapping from error to status ([`ApiError`]), auth and media types.

mod batch;
mod blobs;
pub mod body;
mod metrics;
mod refs;
pub(crate) mod sending;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde_json::json;

use crate::auth::{Action, Auth, AuthError};
use crate::blob_store::is_busy;
use crate::budget::{MemoryBudget, NoRoom};
use crate::cb::{CbError, PackageError};
use crate::compressed::CompressedError;
use crate::meta::{MetaError, MetaStore};
use crate::pace::MinRate;
use crate::storage::{Content, ContentError};
use crate::{BlobStore, IoHash, Name, StoreError};

/// The header Cloud DDC uses for a body's IoHash.
pub const IOHASH_HEADER: &str = "X-Jupiter-IoHash";
pub const CB: &str = "application/x-ue-cb";
pub const CBPKG: &str = "application/x-ue-cbpkg";
pub const COMP: &str = "application/x-ue-comp";
pub const OCTET: &str = "application/octet-stream";
pub const JSON: &str = "application/json";
pub const INLINE: &str = "application/x-jupiter-inline";

/// Sizes and deadlines of requests.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest blob streamed to disk (raw blob PUTs, raw ref PUTs).
    pub max_blob_bytes: u64,
    /// Largest body checked whole in memory: compressed buffers, compact-binary objects,
    /// packages, batches.
    pub max_buffered_bytes: u64,
    /// Memory requests may hold at once: bodies read whole, what is built from them, and what
    /// they read from storage into memory (refs' objects, object attachments); past it,
    /// requests get 429 (`crate::budget`).
    pub memory_budget: u32,
    /// How slow a request body may come ([`crate::pace`]); a slower one gets 408 and is
    /// stored nowhere.
    pub body: MinRate,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_blob_bytes: 1 << 30,
            max_buffered_bytes: 256 << 20,
            memory_budget: 1 << 30,
            body: MinRate { bytes_per_s: 1024, allowance: Duration::from_secs(30) },
        }
    }
}

/// The server: its content, auth and limits.
pub struct Ddc {
    pub content: Content,
    pub auth: Auth,
    pub limits: Limits,
    /// Whether a PUT may replace a finalized ref holding another object without
    /// `X-Jupiter-Allow-Overwrite: true` (the reference server's default policy allows it).
    pub allow_overwrite: bool,
    /// What the HTTP server did with connections ([`crate::serve::serve`] counts into it).
    pub connections: Arc<crate::serve::Connections>,
    metrics: metrics::Metrics,
}

impl Ddc {
    /// Opens (creating if needed) the store under `root`: blobs on the filesystem, metadata in
    /// `<root>/.meta/ddc.sqlite`.
    pub async fn open(root: &Path, auth: Auth, limits: Limits) -> Result<Ddc, ContentError> {
        let meta = MetaStore::open(root).await?;
        Ddc::open_with_meta(root, meta, auth, limits).await
    }

    /// Opens the store with blobs under `root` and the metadata in `meta` (for example
    /// [`MetaStore::open_postgres`]).
    pub async fn open_with_meta(
        root: &Path,
        meta: MetaStore,
        auth: Auth,
        limits: Limits,
    ) -> Result<Ddc, ContentError> {
        let blobs = BlobStore::open(root).await?;
        Ddc::open_with_stores(blobs, meta, auth, limits).await
    }

    /// Serves the blobs in `blobs` (for example [`BlobStore::open_s3`]) with the metadata in
    /// `meta`, once the metadata has accepted that blob store ([`MetaStore::bind_blob_store`]).
    pub async fn open_with_stores(
        blobs: BlobStore,
        meta: MetaStore,
        auth: Auth,
        limits: Limits,
    ) -> Result<Ddc, ContentError> {
        meta.bind_blob_store(&blobs.location()).await?;
        if blobs.is_shared() {
            blobs.bind_metadata(&meta.store_id().await?).await?;
        }
        blobs.rely_through(&meta);
        Ok(Ddc {
            content: Content {
                blobs,
                meta,
                decodes: Default::default(),
                budget: MemoryBudget::new(limits.memory_budget),
            },
            auth,
            limits,
            allow_overwrite: true,
            connections: Arc::default(),
            metrics: metrics::Metrics::new(),
        })
    }

    /// One garbage collection as of `now` ([`Content::collect`]), counted in `/metrics`.
    pub async fn collect_garbage(
        &self,
        policy: &crate::gc::GcPolicy,
        now: std::time::SystemTime,
    ) -> Result<crate::gc::GcReport, ContentError> {
        let started = std::time::Instant::now();
        let result = self.content.collect(policy, now).await;
        self.metrics.collected(&result, started.elapsed().as_secs_f64());
        result
    }

    /// Writes the last-access times reads have noted; call every few seconds and at shutdown.
    pub async fn flush_access(&self) -> Result<usize, MetaError> {
        self.content.meta.flush_access().await
    }

    fn authorize(&self, headers: &HeaderMap, ns: &str, action: Action) -> Result<Name, ApiError> {
        let ns: Name = ns.parse()?;
        self.check(headers, &ns, action)?;
        Ok(ns)
    }

    fn check(&self, headers: &HeaderMap, ns: &Name, action: Action) -> Result<(), ApiError> {
        let header = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        Ok(self.auth.check(header, ns, action)?)
    }
}

/// Why a request failed, and the status it gets.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error("bad name: {0}")]
    Name(#[from] crate::NameError),
    #[error("bad hash: {0}")]
    Hash(#[from] crate::HashError),
    #[error("Incorrect hash: {what} hashes to {actual}, not {claimed}")]
    HashMismatch { what: &'static str, claimed: IoHash, actual: IoHash },
    #[error("the {0} header is required")]
    MissingHeader(&'static str),
    #[error("the {0} header is not valid")]
    BadHeader(&'static str),
    #[error("Content-Type {0:?} is not accepted here")]
    MediaType(String),
    #[error("none of the types in Accept can be served here: {0:?}")]
    NotAcceptable(String),
    #[error("not valid compact binary: {0}")]
    Cb(#[from] CbError),
    #[error("not a valid package: {0}")]
    Package(#[from] PackageError),
    #[error("bad request: {0}")]
    Invalid(String),
    #[error("the body is larger than the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("the body {0}")]
    BodyTooSlow(MinRate),
    #[error("the body broke off: {0}")]
    BodyBroken(String),
    #[error("the server is busy; retry")]
    Busy,
    /// What no retry could get: more memory than the budget can give the request (413).
    #[error("{what} needs {len} bytes of memory, more than the memory budget can give this request ({room})")]
    PastBudget { what: &'static str, len: u64, room: u64 },
    #[error("{0}")]
    NotFound(&'static str),
    #[error("the ref is not finalized: attachments are missing")]
    NotFinalized,
    #[error(transparent)]
    Content(#[from] ContentError),
    #[error("storage I/O: {0}")]
    Io(#[from] std::io::Error),
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::Content(e.into())
    }
}

impl From<NoRoom> for ApiError {
    fn from(_: NoRoom) -> Self {
        ApiError::Busy
    }
}

impl From<MetaError> for ApiError {
    fn from(e: MetaError) -> Self {
        ApiError::Content(e.into())
    }
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        use std::io::ErrorKind;
        match self {
            ApiError::Auth(AuthError::Unauthorized) => StatusCode::UNAUTHORIZED,
            ApiError::Auth(AuthError::Forbidden(_)) => StatusCode::FORBIDDEN,
            ApiError::Name(_)
            | ApiError::Hash(_)
            | ApiError::HashMismatch { .. }
            | ApiError::MissingHeader(_)
            | ApiError::BadHeader(_)
            | ApiError::Cb(_)
            | ApiError::Package(_)
            | ApiError::Invalid(_)
            | ApiError::BodyBroken(_)
            | ApiError::NotFinalized => StatusCode::BAD_REQUEST,
            ApiError::MediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::NotAcceptable(_) => StatusCode::NOT_ACCEPTABLE,
            ApiError::TooLarge { .. }
            | ApiError::PastBudget { .. }
            | ApiError::Content(ContentError::Store(StoreError::TooLarge { .. })) => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            ApiError::BodyTooSlow(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Busy => StatusCode::TOO_MANY_REQUESTS,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Content(c) => match c {
                ContentError::Store(StoreError::HashMismatch { .. })
                | ContentError::Compressed(_)
                | ContentError::RawHashMismatch { .. }
                | ContentError::TooManyAttachments { .. } => StatusCode::BAD_REQUEST,
                ContentError::Busy(_) | ContentError::Meta(MetaError::Busy(_)) => {
                    StatusCode::TOO_MANY_REQUESTS
                }
                ContentError::CheckTooLong(_) => StatusCode::SERVICE_UNAVAILABLE,
                ContentError::Io(e) | ContentError::Store(StoreError::Io(e)) if is_busy(e) => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                // An object larger than the whole memory budget: no retry would get it.
                ContentError::Meta(MetaError::PastRoom { .. }) | ContentError::PastRoom { .. } => {
                    StatusCode::PAYLOAD_TOO_LARGE
                }
                ContentError::Store(StoreError::Io(e)) if e.kind() == ErrorKind::TimedOut => {
                    StatusCode::REQUEST_TIMEOUT
                }
                ContentError::Store(StoreError::Io(e)) if e.kind() == ErrorKind::UnexpectedEof => {
                    StatusCode::BAD_REQUEST
                }
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            },
            // A blob gone between finding it and reading it (deleted meanwhile).
            ApiError::Io(e) if e.kind() == ErrorKind::NotFound => StatusCode::NOT_FOUND,
            // A blob a garbage collection is removing: retry.
            ApiError::Io(e) if is_busy(e) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<CompressedError> for ApiError {
    fn from(e: CompressedError) -> Self {
        ApiError::Content(e.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
        }
        // A server error's detail (paths, the bucket's URLs, S3's own messages) is for the
        // log above, not for the client.
        let title = match &self {
            _ if status.is_server_error() => "the server failed to answer; its log says why".to_owned(),
            // Storage's own text names paths and the bucket's URLs.
            ApiError::Io(_) if status == StatusCode::NOT_FOUND => "blob not found".to_owned(),
            _ => self.to_string(),
        };
        let body = json!({ "title": title, "status": status.as_u16() });
        let mut response = (status, body.to_string()).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if status == StatusCode::TOO_MANY_REQUESTS {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// Ready unless the metadata store can no longer be used ([`MetaStore::lost`]).
async fn ready(axum::extract::State(ddc): axum::extract::State<Arc<Ddc>>) -> Response {
    if ddc.content.meta.is_lost() {
        let body = "Unhealthy: the metadata store's database lock is lost";
        return (StatusCode::SERVICE_UNAVAILABLE, [(header::CONTENT_TYPE, "text/plain")], body)
            .into_response();
    }
    ([(header::CONTENT_TYPE, "text/plain")], "Healthy").into_response()
}

/// The routes, over a shared [`Ddc`].
pub fn router(ddc: Arc<Ddc>) -> Router {
    let healthy = || async { ([(header::CONTENT_TYPE, "text/plain")], "Healthy") };
    let raw = blobs::raw_routes();
    Router::new()
        .route("/health/live", get(healthy))
        .route("/health/ready", get(ready))
        .nest("/api/v1/blobs", raw.clone())
        .nest("/api/v1/s", raw)
        .nest("/api/v1/compressed-blobs", blobs::compressed_routes())
        .route("/api/v1/refs", get(refs::namespaces))
        .route("/api/v1/refs/{ns}", post(batch::batch).delete(refs::delete_namespace))
        .route("/api/v1/refs/{ns}/exists", get(refs::exists))
        .route("/api/v1/refs/{ns}/{bucket}", axum::routing::delete(refs::delete_bucket))
        .route(
            "/api/v1/refs/{ns}/{bucket}/{key}",
            get(refs::get_ref).head(refs::head_ref).put(refs::put_ref).delete(refs::delete_ref),
        )
        .route("/api/v1/refs/{ns}/{bucket}/{key}/metadata", get(refs::metadata))
        .route("/api/v1/refs/{ns}/{bucket}/{key}/finalize/{hash}", post(refs::finalize))
        .route(
            "/api/v1/refs/{ns}/{bucket}/{key}/blobs/{id}",
            put(blobs::put_ref_blob).get(blobs::get_ref_blob),
        )
        .route("/metrics", get(metrics::scrape))
        .route_layer(axum::middleware::from_fn_with_state(ddc.clone(), metrics::track))
        .with_state(ddc)
}

/// A request's `Content-Type` without parameters, lower-cased; `None` if absent.
fn content_type(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    Some(value.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
}

/// The media types a request's `Accept` lists, in order, without parameters; empty if absent.
fn accepted(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect()
}

/// An `X-Jupiter-IoHash`-style header as a hash: `None` if absent, 400 if malformed.
fn hash_header(headers: &HeaderMap, name: &'static str) -> Result<Option<IoHash>, ApiError> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => {
            let text = v.to_str().map_err(|_| ApiError::BadHeader(name))?.trim();
            if text.is_empty() {
                return Ok(None);
            }
            text.parse().map(Some).map_err(|_| ApiError::BadHeader(name))
        }
    }
}

fn hash_value(h: &IoHash) -> HeaderValue {
    HeaderValue::from_str(&h.to_hex()).expect("hex is a valid header value")
}
