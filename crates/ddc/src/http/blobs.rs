//! Blob routes: raw blobs (`/api/v1/blobs`, and its legacy alias `/api/v1/s`), compressed
//! buffers addressed by raw hash (`/api/v1/compressed-blobs`), and attachment uploads and
//! downloads under a ref (`/api/v1/refs/{ns}/{bucket}/{key}/blobs/{id}`). Raw bodies stream to
//! disk; compressed buffers are checked whole first (spec sections 5.1, 5.2 and 5.3.5).

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::json;
use tokio_util::io::ReaderStream;

use super::body::{Held, body_reader, read_body};
use super::sending::held_response;
use super::{ApiError, COMP, Ddc, IOHASH_HEADER, OCTET, accepted, content_type, hash_value};
use crate::auth::Action;
use crate::storage::Located;
use crate::{IoHash, Name, RefKey};

/// Read size when streaming a blob to a client.
const READ_CHUNK: usize = 256 * 1024;

type Json = axum::Json<serde_json::Value>;

pub fn raw_routes() -> Router<Arc<Ddc>> {
    Router::new()
        .route("/{ns}", post(post_raw))
        .route("/{ns}/exists", post(exists::<false>))
        .route("/{ns}/exist", post(exist::<false>))
        .route("/{ns}/{id}", axum::routing::get(get_raw).head(head_raw).put(put_raw).delete(delete_raw))
}

pub fn compressed_routes() -> Router<Arc<Ddc>> {
    Router::new()
        .route("/{ns}", post(post_compressed))
        .route("/{ns}/exists", post(exists::<true>))
        .route("/{ns}/exist", post(exist::<true>))
        .route(
            "/{ns}/{id}",
            axum::routing::get(get_compressed)
                .head(head_compressed)
                .put(put_compressed)
                .delete(delete_compressed),
        )
}

fn identifier(id: IoHash) -> Json {
    axum::Json(json!({ "identifier": id.to_hex() }))
}

/// Raw uploads take `application/octet-stream` (or no type at all, as `curl -T` sends).
fn require_octet(headers: &HeaderMap) -> Result<(), ApiError> {
    match content_type(headers) {
        None => Ok(()),
        Some(t) if t == OCTET => Ok(()),
        Some(t) => Err(ApiError::MediaType(t)),
    }
}

fn require_comp(headers: &HeaderMap) -> Result<(), ApiError> {
    match content_type(headers) {
        Some(t) if t == COMP => Ok(()),
        other => Err(ApiError::MediaType(other.unwrap_or_default())),
    }
}

async fn put_raw(
    State(ddc): State<Arc<Ddc>>,
    Path(path): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json, ApiError> {
    let (ns, id) = blob_path(&ddc, &headers, path, Action::WriteObject)?;
    require_octet(&headers)?;
    if let Some(claimed) = super::hash_header(&headers, IOHASH_HEADER)?
        && claimed != id
    {
        return Err(ApiError::Invalid(format!("{IOHASH_HEADER} says {claimed} but the URL says {id}")));
    }
    store_raw(&ddc, &ns, Some(id), body).await.map(|(id, _)| identifier(id))
}

async fn post_raw(
    State(ddc): State<Arc<Ddc>>,
    Path(ns): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json, ApiError> {
    let ns = ddc.authorize(&headers, &ns, Action::WriteObject)?;
    require_octet(&headers)?;
    let expected = super::hash_header(&headers, IOHASH_HEADER)?;
    store_raw(&ddc, &ns, expected, body).await.map(|(id, _)| identifier(id))
}

/// Streams a body into the blob store (checked against `expected` when given); its id and
/// size.
pub(super) async fn store_raw(
    ddc: &Ddc,
    ns: &Name,
    expected: Option<IoHash>,
    body: Body,
) -> Result<(IoHash, u64), ApiError> {
    let reader = body_reader(body, ddc.limits.body);
    let limit = ddc.limits.max_blob_bytes;
    let checked = std::time::Instant::now();
    let stored = match expected {
        Some(id) if ddc.content.blobs.exists(ns, &id).await? => {
            // Already stored: a re-upload is hashed (so a wrong body is still a 400) but not
            // written (and kept from garbage collection, as `exists` does for a write).
            let (actual, size) = crate::blob_store::hash_stream(reader, limit).await?;
            if actual != id {
                return Err(ApiError::HashMismatch { what: "the body", claimed: id, actual });
            }
            // A body that took long: what kept the blob from garbage collection may have run
            // out, so it is asked again before the answer says "stored".
            if checked.elapsed() > crate::refs::MAX_CHECK && !ddc.content.blobs.exists(ns, &id).await? {
                let gone = "the blob was removed while its body was read; upload it again";
                return Err(ApiError::Io(crate::blob_store::BeingCollected(gone.into()).into_io()));
            }
            return Ok((id, size));
        }
        Some(id) => ddc.content.blobs.put_missing(ns, id, reader, limit).await?,
        None => ddc.content.blobs.put(ns, None, reader, limit).await?,
    };
    ddc.content.meta.add_namespace(ns).await?;
    Ok(stored)
}

async fn get_raw(
    State(ddc): State<Arc<Ddc>>,
    Path(path): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (ns, id) = blob_path(&ddc, &headers, path, Action::ReadObject)?;
    serve_blob(&ddc, &ns, id, OCTET, headers.get(header::RANGE)).await
}

/// A stored blob as a response: whole (200, with `X-Jupiter-IoHash`), or one byte range
/// (206, without it) when `range` asks for one.
pub(super) async fn serve_blob(
    ddc: &Ddc,
    ns: &Name,
    id: IoHash,
    media_type: &'static str,
    range: Option<&HeaderValue>,
) -> Result<Response, ApiError> {
    let blob = ddc.content.blobs.open_blob(ns, &id).await?.ok_or(ApiError::NotFound("blob not found"))?;
    let size = blob.size();
    let range = match range.and_then(|r| r.to_str().ok()) {
        None => None,
        Some(r) => match http_range_header::parse_range_header(r).and_then(|p| p.validate(size)) {
            Ok(ranges) if ranges.len() == 1 => Some(ranges[0].clone()),
            // Several ranges: the whole blob, as RFC 9110 allows.
            Ok(_) => None,
            Err(_) => {
                let mut response = StatusCode::RANGE_NOT_SATISFIABLE.into_response();
                response
                    .headers_mut()
                    .insert(header::CONTENT_RANGE, format!("bytes */{size}").parse().expect("ascii"));
                return Ok(response);
            }
        },
    };
    let (status, start, len) = match &range {
        Some(r) => (StatusCode::PARTIAL_CONTENT, *r.start(), r.end() - r.start() + 1),
        None => (StatusCode::OK, 0, size),
    };
    let stream = ReaderStream::with_capacity(blob.read_range(start, len).await?, READ_CHUNK);
    let mut response = (status, Body::from_stream(stream)).into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(media_type));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    match range {
        Some(r) => {
            let value = format!("bytes {}-{}/{size}", r.start(), r.end());
            h.insert(header::CONTENT_RANGE, value.parse().expect("ascii"));
        }
        None => {
            h.insert(IOHASH_HEADER, hash_value(&id));
        }
    }
    Ok(response)
}

async fn head_raw(
    State(ddc): State<Arc<Ddc>>,
    Path(path): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let (ns, id) = blob_path(&ddc, &headers, path, Action::ReadObject)?;
    if ddc.content.blobs.known(&ns, &id).await? {
        Ok(StatusCode::OK)
    } else {
        Err(ApiError::NotFound("blob not found"))
    }
}

async fn delete_raw(
    State(ddc): State<Arc<Ddc>>,
    Path(path): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let (ns, id) = blob_path(&ddc, &headers, path, Action::DeleteObject)?;
    // 200 whether it was stored or not (docs/ddc.md, as a ref's DELETE): gone either way.
    ddc.content.blobs.delete(&ns, &id).await?;
    Ok(StatusCode::OK)
}

/// The ids of a query string's `id=` pairs.
fn query_ids(query: Option<String>) -> Result<Vec<IoHash>, ApiError> {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .filter(|(k, _)| k == "id")
        .map(|(_, v)| v.parse().map_err(ApiError::from))
        .collect()
}

/// One id of a JSON array of ids, parsed as it is read: a body of anything else is refused at
/// its first element, before it costs more than its own bytes.
struct JsonId(IoHash);

impl<'de> serde::Deserialize<'de> for JsonId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<JsonId, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = JsonId;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a 40-digit hex id")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<JsonId, E> {
                s.parse().map(JsonId).map_err(E::custom)
            }
        }
        d.deserialize_str(Visit)
    }
}

/// The ids of a JSON array body, and the memory they and the answer hold. An id takes at least
/// 43 bytes of JSON (`"<40 digits>",`) and 20 parsed, and at most 43 in the answer: charged
/// before parsing at the body's length, with the body's own share.
async fn body_ids(ddc: &Ddc, body: Body) -> Result<(Vec<IoHash>, Held), ApiError> {
    let body = read_body(body, 16 << 20, ddc.limits.body, &ddc.content.budget).await?;
    let (bytes, mut held) = body.into_parts();
    let need = bytes.len() + NEEDS_OVERHEAD;
    let room = ddc.content.budget.room_beside(held.bytes());
    if need > room {
        // Refused for good (413), not for now: no retry could find the room.
        let what = "the ids and the answer beside the body";
        return Err(ApiError::PastBudget { what, len: need as u64, room: room as u64 });
    }
    held.grow(&ddc.content.budget, need)?;
    let ids: Vec<JsonId> = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::Invalid(format!("expected a JSON array of ids: {e}")))?;
    // Collected in place (`JsonId` is an `IoHash`), and trimmed of the growth's slack.
    let mut ids: Vec<IoHash> = ids.into_iter().map(|JsonId(id)| id).collect();
    ids.shrink_to_fit();
    Ok((ids, held))
}

/// The bytes of `{"needs":[]}` and a little more.
const NEEDS_OVERHEAD: usize = 64;

/// `{"needs": [...]}`: the ids that are not stored (`any`: as a compressed buffer or a raw
/// blob; otherwise as a raw blob), written as found, held in `held` (which has room for it)
/// until the client has read it.
async fn needs(ddc: &Ddc, ns: &Name, ids: Vec<IoHash>, any: bool, held: Held) -> Result<Response, ApiError> {
    // At its largest at once (what was charged): it never grows by doubling.
    let mut out = String::with_capacity(NEEDS_OVERHEAD + 43 * ids.len());
    out.push_str("{\"needs\":[");
    for id in ids {
        let present = if any {
            ddc.content.locate_durably(ns, id).await?.is_some()
        } else {
            ddc.content.blobs.exists(ns, &id).await?
        };
        if !present {
            if !out.ends_with('[') {
                out.push(',');
            }
            out.push('"');
            out.push_str(&id.to_hex());
            out.push('"');
        }
    }
    out.push_str("]}");
    Ok(held_response("application/json", out.into(), held))
}

/// `POST .../exists?id=..&id=..`. `ANY`: present as a compressed buffer or a raw blob (the
/// compressed-blob routes); otherwise as a raw blob.
async fn exists<const ANY: bool>(
    State(ddc): State<Arc<Ddc>>,
    Path(ns): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let ns = ddc.authorize(&headers, &ns, Action::ReadObject)?;
    let ids = query_ids(query)?;
    // The query came in the request's head, bounded by the server's header limit.
    let held = Held::take(&ddc.content.budget, ids.len() * 43 + NEEDS_OVERHEAD)?;
    needs(&ddc, &ns, ids, ANY, held).await
}

/// `POST .../exist` with a JSON array of ids; `ANY` as for [`exists`].
async fn exist<const ANY: bool>(
    State(ddc): State<Arc<Ddc>>,
    Path(ns): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let ns = ddc.authorize(&headers, &ns, Action::ReadObject)?;
    let (ids, held) = body_ids(&ddc, body).await?;
    needs(&ddc, &ns, ids, ANY, held).await
}

/// Reads and stores one compressed buffer; its raw hash must be `id` when given.
async fn store_compressed(ddc: &Ddc, ns: &Name, id: Option<IoHash>, body: Body) -> Result<IoHash, ApiError> {
    let body = read_body(body, ddc.limits.max_buffered_bytes, ddc.limits.body, &ddc.content.budget).await?;
    let scratch = scratch_budget(ddc, &body.bytes, body.bytes.capacity())?;
    let (bytes, held) = body.into_parts();
    Ok(ddc.content.put_compressed(ns, id, bytes.into(), (held, scratch)).await?)
}

/// The memory budget for verifying compressed buffer `body` (one decoded block: up to 2 GiB for
/// a small body that claims a large block), taken before it is verified; none if its header is
/// invalid (verifying it then fails before decoding anything). `holds` is what the request
/// already holds of the budget (its body): a block the rest of the budget could never hold is
/// 413, the same on every try, not a 429 that retries would meet forever.
pub(super) fn scratch_budget(ddc: &Ddc, body: &[u8], holds: usize) -> Result<super::body::Held, ApiError> {
    let mut held = super::body::Held::default();
    if let Ok(header) = crate::compressed::check(body) {
        let room = ddc.content.budget.room_beside(holds);
        let len = header.scratch_len();
        if len > room as u64 {
            return Err(ApiError::PastBudget {
                what: "verifying this buffer's largest block",
                len,
                room: room as u64,
            });
        }
        held.grow(&ddc.content.budget, len as usize)?;
    }
    Ok(held)
}

async fn put_compressed(
    State(ddc): State<Arc<Ddc>>,
    Path(path): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json, ApiError> {
    let (ns, id) = blob_path(&ddc, &headers, path, Action::WriteObject)?;
    require_comp(&headers)?;
    store_compressed(&ddc, &ns, Some(id), body).await.map(identifier)
}

async fn post_compressed(
    State(ddc): State<Arc<Ddc>>,
    Path(ns): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json, ApiError> {
    let ns = ddc.authorize(&headers, &ns, Action::WriteObject)?;
    require_comp(&headers)?;
    store_compressed(&ddc, &ns, None, body).await.map(identifier)
}

/// The content named `id` as the compressed-blob GET serves it: the stored compressed buffer
/// (`application/x-ue-comp`), or else a raw blob with that id (`application/octet-stream`).
async fn serve_content(ddc: &Ddc, ns: &Name, id: IoHash, headers: &HeaderMap) -> Result<Response, ApiError> {
    let located = ddc.content.locate(ns, id).await?.ok_or(ApiError::NotFound("blob not found"))?;
    let media_type = match located {
        Located::Compressed(_) => COMP,
        Located::Raw(_) => OCTET,
    };
    let accept = accepted(headers);
    if !accept.is_empty() && !accept.iter().any(|t| t == "*/*" || t == media_type) {
        return Err(ApiError::MediaType(format!("Accept names neither */* nor {media_type}")));
    }
    serve_blob(ddc, ns, located.blob(), media_type, headers.get(header::RANGE)).await
}

async fn get_compressed(
    State(ddc): State<Arc<Ddc>>,
    Path(path): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (ns, id) = blob_path(&ddc, &headers, path, Action::ReadObject)?;
    serve_content(&ddc, &ns, id, &headers).await
}

async fn head_compressed(
    State(ddc): State<Arc<Ddc>>,
    Path(path): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let (ns, id) = blob_path(&ddc, &headers, path, Action::ReadObject)?;
    match ddc.content.locate(&ns, id).await? {
        Some(_) => Ok(StatusCode::OK),
        None => Err(ApiError::NotFound("blob not found")),
    }
}

async fn delete_compressed(
    State(ddc): State<Arc<Ddc>>,
    Path(path): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let (ns, id) = blob_path(&ddc, &headers, path, Action::DeleteObject)?;
    match ddc.content.meta.content_blob(&ns, id).await? {
        Some(blob) => {
            // The content id first: a crash in between leaves an unnamed blob, never a name
            // for a missing one.
            ddc.content.meta.delete_content(&ns, id).await?;
            ddc.content.blobs.delete(&ns, &blob).await?;
            Ok(StatusCode::OK)
        }
        // As a raw blob's DELETE: gone either way.
        None => Ok(StatusCode::OK),
    }
}

/// The names in a ref's attachment path, checked (the bucket and key are only hints, but a
/// malformed one is still a 400).
fn ref_blob_path(
    ddc: &Ddc,
    headers: &HeaderMap,
    parts: (String, String, String, String),
    action: Action,
) -> Result<(Name, IoHash), ApiError> {
    let (ns, bucket, key, id) = parts;
    let named = blob_path(ddc, headers, (ns, id), action)?;
    Name::bucket(&bucket)?;
    key.parse::<RefKey>()?;
    Ok(named)
}

/// The namespace (authorized for `action`) and blob id of a `{ns}/{id}` path.
fn blob_path(
    ddc: &Ddc,
    headers: &HeaderMap,
    (ns, id): (String, String),
    action: Action,
) -> Result<(Name, IoHash), ApiError> {
    let ns = ddc.authorize(headers, &ns, action)?;
    Ok((ns, id.parse()?))
}

pub(super) async fn put_ref_blob(
    State(ddc): State<Arc<Ddc>>,
    Path(parts): Path<(String, String, String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json, ApiError> {
    let (ns, id) = ref_blob_path(&ddc, &headers, parts, Action::WriteObject)?;
    match content_type(&headers).as_deref() {
        Some(COMP) => store_compressed(&ddc, &ns, Some(id), body).await.map(identifier),
        None | Some(OCTET) => store_raw(&ddc, &ns, Some(id), body).await.map(|(id, _)| identifier(id)),
        Some(other) => Err(ApiError::MediaType(other.to_owned())),
    }
}

pub(super) async fn get_ref_blob(
    State(ddc): State<Arc<Ddc>>,
    Path(parts): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (ns, id) = ref_blob_path(&ddc, &headers, parts, Action::ReadObject)?;
    serve_content(&ddc, &ns, id, &headers).await
}
