//! The HTTP API: the blob endpoints of Cloud DDC (`/api/v1/blobs/{ns}/{id}`) and the health
//! checks, over axum. Every error is mapped to its status in one place ([`ApiError`]); bodies
//! stream to and from disk, never whole in memory.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::{StreamExt, TryStreamExt};
use serde_json::json;
use tokio_util::io::{ReaderStream, StreamReader};

use crate::auth::{Action, Auth, AuthError};
use crate::{BlobStore, IoHash, Name, StoreError};

/// The header Cloud DDC uses for a body's IoHash.
pub const IOHASH_HEADER: &str = "X-Jupiter-IoHash";

pub struct Ddc {
    pub store: BlobStore,
    pub auth: Auth,
    /// Largest blob accepted, in bytes.
    pub max_blob_bytes: u64,
    /// The longest wait for the next piece of a request body; a body that stalls longer gets
    /// 408 and is stored nowhere.
    pub body_timeout: std::time::Duration,
}

/// Why a request failed, and the status it gets.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error("bad namespace: {0}")]
    Name(#[from] crate::NameError),
    #[error("bad blob id: {0}")]
    Hash(#[from] crate::HashError),
    #[error("{IOHASH_HEADER} says {header} but the URL says {url}")]
    HeaderMismatch { header: String, url: IoHash },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("not found")]
    NotFound,
    #[error("storage I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("the {0} header is not valid UTF-8")]
    BadHeader(&'static str),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self {
            ApiError::Auth(AuthError::Unauthorized) => StatusCode::UNAUTHORIZED,
            ApiError::Auth(AuthError::Forbidden(_)) => StatusCode::FORBIDDEN,
            ApiError::Name(_)
            | ApiError::Hash(_)
            | ApiError::HeaderMismatch { .. }
            | ApiError::BadHeader(_) => StatusCode::BAD_REQUEST,
            ApiError::Store(StoreError::Io(e)) if e.kind() == std::io::ErrorKind::TimedOut => {
                StatusCode::REQUEST_TIMEOUT
            }
            ApiError::Store(StoreError::HashMismatch { .. }) => StatusCode::BAD_REQUEST,
            ApiError::Store(StoreError::TooLarge { .. }) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Store(StoreError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                StatusCode::BAD_REQUEST
            }
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::Store(StoreError::Io(_)) | ApiError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
        }
        (status, axum::Json(json!({ "title": self.to_string(), "status": status.as_u16() }))).into_response()
    }
}

/// The routes, over a shared [`Ddc`].
pub fn router(ddc: Arc<Ddc>) -> Router {
    Router::new()
        .route("/health/live", get(|| async { "ok" }))
        .route("/health/ready", get(|| async { "ok" }))
        .route("/api/v1/blobs/{ns}", post(post_blob))
        .route("/api/v1/blobs/{ns}/exists", post(exists))
        .route("/api/v1/blobs/{ns}/{id}", get(get_blob).head(head_blob).put(put_blob).delete(delete_blob))
        .with_state(ddc)
}

fn authorize(ddc: &Ddc, headers: &HeaderMap, ns: &str, action: Action) -> Result<Name, ApiError> {
    let ns: Name = ns.parse()?;
    let header = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    ddc.auth.check(header, &ns, action)?;
    Ok(ns)
}

/// The request body as a reader. A body that breaks off (the client stopped sending) reads as
/// `UnexpectedEof`, and one whose next piece takes longer than `timeout` as `TimedOut`: both
/// the client's fault (400 and 408), not the disk's.
fn body_reader(body: Body, timeout: std::time::Duration) -> impl tokio::io::AsyncRead + Unpin {
    let chunks =
        body.into_data_stream().map_err(|e| std::io::Error::new(std::io::ErrorKind::UnexpectedEof, e));
    let paced = futures_util::stream::unfold(Some(chunks), move |chunks| async move {
        let mut chunks = chunks?;
        match tokio::time::timeout(timeout, chunks.next()).await {
            Ok(Some(chunk)) => Some((chunk, Some(chunks))),
            Ok(None) => None,
            Err(_) => {
                let stalled = std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no body data for {} ms", timeout.as_millis()),
                );
                // End the stream after the error.
                Some((Err(stalled), None))
            }
        }
    });
    StreamReader::new(Box::pin(paced))
}

/// The `X-Jupiter-IoHash` header, if present; 400 if it is not text.
fn iohash_header(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    headers.get(IOHASH_HEADER).map(|v| v.to_str().map_err(|_| ApiError::BadHeader(IOHASH_HEADER))).transpose()
}

async fn get_blob(
    State(ddc): State<Arc<Ddc>>,
    Path((ns, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let ns = authorize(&ddc, &headers, &ns, Action::ReadObject)?;
    let id: IoHash = id.parse()?;
    let (file, size) = ddc.store.open_blob(&ns, &id).await?.ok_or(ApiError::NotFound)?;
    let mut response = Body::from_stream(ReaderStream::new(file)).into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    h.insert(IOHASH_HEADER, HeaderValue::from_str(&id.to_hex()).expect("hex is a valid header"));
    Ok(response)
}

async fn head_blob(
    State(ddc): State<Arc<Ddc>>,
    Path((ns, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let ns = authorize(&ddc, &headers, &ns, Action::ReadObject)?;
    let id: IoHash = id.parse()?;
    if ddc.store.exists(&ns, &id).await? { Ok(StatusCode::OK) } else { Err(ApiError::NotFound) }
}

async fn put_blob(
    State(ddc): State<Arc<Ddc>>,
    Path((ns, id)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    let ns = authorize(&ddc, &headers, &ns, Action::WriteObject)?;
    let id: IoHash = id.parse()?;
    if let Some(claimed) = iohash_header(&headers)?
        && claimed.parse::<IoHash>().ok() != Some(id)
    {
        return Err(ApiError::HeaderMismatch { header: claimed.chars().take(64).collect(), url: id });
    }
    store_body(&ddc, &ns, Some(id), body).await
}

async fn post_blob(
    State(ddc): State<Arc<Ddc>>,
    Path(ns): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    let ns = authorize(&ddc, &headers, &ns, Action::WriteObject)?;
    let expected = match iohash_header(&headers)? {
        Some(h) => Some(h.parse::<IoHash>()?),
        None => None,
    };
    store_body(&ddc, &ns, expected, body).await
}

/// Streams a request body into the store and answers with the blob's id.
async fn store_body(
    ddc: &Ddc,
    ns: &Name,
    expected: Option<IoHash>,
    body: Body,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    let (stored, _) =
        ddc.store.put(ns, expected, body_reader(body, ddc.body_timeout), ddc.max_blob_bytes).await?;
    Ok(axum::Json(json!({ "identifier": stored.to_hex() })))
}

async fn delete_blob(
    State(ddc): State<Arc<Ddc>>,
    Path((ns, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let ns = authorize(&ddc, &headers, &ns, Action::DeleteObject)?;
    let id: IoHash = id.parse()?;
    if ddc.store.delete(&ns, &id).await? { Ok(StatusCode::NO_CONTENT) } else { Err(ApiError::NotFound) }
}

/// `POST .../exists?id=..&id=..`: the ids the server lacks.
async fn exists(
    State(ddc): State<Arc<Ddc>>,
    Path(ns): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    let ns = authorize(&ddc, &headers, &ns, Action::ReadObject)?;
    let mut needs = Vec::new();
    for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if key == "id" {
            let id: IoHash = value.parse()?;
            if !ddc.store.exists(&ns, &id).await? {
                needs.push(id.to_hex());
            }
        }
    }
    Ok(axum::Json(json!({ "needs": needs })))
}
