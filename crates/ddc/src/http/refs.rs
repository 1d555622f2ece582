//! Ref routes (spec section 5.3): PUT in every body type, finalize, GET in every format, HEAD,
//! multi-ref exists, metadata, deletes and the namespace listing. The rules themselves are in
//! [`crate::refs`]; this file is the HTTP around them: names, media types and headers.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use serde_json::json;
use tokio_util::io::ReaderStream;

use super::body::{Held, read_body};
use super::sending::{Sending, chunks, held_response};
use super::{
    ApiError, CB, CBPKG, Ddc, INLINE, IOHASH_HEADER, JSON, OCTET, accepted, content_type, hash_value,
};
use crate::auth::Action;
use crate::cb::{self, EntryFlags, Package};
use crate::meta::RefRow;
use crate::refs::{self, FinalizeOutcome, Lookup, PutOutcome, RefAddr};
use crate::storage::{Located, MAX_ATTACHED_OBJECT, MAX_OBJECT_DEPTH};
use crate::{IoHash, Name, RefKey};

const LAST_ACCESS_HEADER: &str = "X-Jupiter-LastAccess";
const INLINE_HASH_HEADER: &str = "X-Jupiter-InlinePayloadHash";
const OVERWRITE_HEADER: &str = "X-Jupiter-Allow-Overwrite";

/// Splits `{key}.{fmt}` and checks the names.
fn address(
    ddc: &Ddc,
    headers: &HeaderMap,
    ns: &str,
    bucket: &str,
    key: &str,
    action: Action,
) -> Result<(RefAddr, Option<String>), ApiError> {
    let ns = ddc.authorize(headers, ns, action)?;
    let (key, format) = match key.split_once('.') {
        Some((key, format)) => (key, Some(format.to_ascii_lowercase())),
        None => (key, None),
    };
    let addr = RefAddr { ns, bucket: Name::bucket(bucket)?, key: key.parse::<RefKey>()? };
    Ok((addr, format))
}

/// Whether a `needs` answer is written as compact binary (the path ends in `.uecb`, or
/// `Accept` prefers it) rather than JSON (what the editor reads). Checked before anything is
/// written, so a bad suffix stores nothing.
fn needs_as_cb(format: Option<&str>, headers: &HeaderMap) -> Result<bool, ApiError> {
    match format {
        Some("uecb") => Ok(true),
        Some("json") => Ok(false),
        None => Ok(accepted(headers).iter().find(|t| *t == CB || *t == JSON).is_some_and(|t| t == CB)),
        Some(other) => Err(ApiError::Invalid(format!("unknown format suffix .{other}"))),
    }
}

fn needs_reply(needs: &[IoHash], cb: bool) -> Result<Response, ApiError> {
    if cb {
        return Ok(([(header::CONTENT_TYPE, CB)], refs::needs_object(needs)).into_response());
    }
    let hex: Vec<String> = needs.iter().map(IoHash::to_hex).collect();
    Ok(axum::Json(json!({ "needs": hex })).into_response())
}

/// The required `X-Jupiter-IoHash` of a ref PUT.
fn required_hash(headers: &HeaderMap) -> Result<IoHash, ApiError> {
    super::hash_header(headers, IOHASH_HEADER)?.ok_or(ApiError::MissingHeader(IOHASH_HEADER))
}

pub async fn put_ref(
    State(ddc): State<Arc<Ddc>>,
    Path((ns, bucket, key)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (addr, format) = address(&ddc, &headers, &ns, &bucket, &key, Action::WriteObject)?;
    let cb = needs_as_cb(format.as_deref(), &headers)?;
    let allow_overwrite = ddc.allow_overwrite
        || headers
            .get(OVERWRITE_HEADER)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let (object, budget) = match content_type(&headers).as_deref() {
        Some(CB) => {
            let claimed = required_hash(&headers)?;
            let body =
                read_body(body, ddc.limits.max_buffered_bytes, ddc.limits.body, &ddc.content.budget).await?;
            cb::parse(&body.bytes)?;
            let actual = IoHash::of(&body.bytes);
            if actual != claimed {
                return Err(ApiError::HashMismatch { what: "the object", claimed, actual });
            }
            let (bytes, held) = body.into_parts();
            (bytes, Some(Arc::new(held)))
        }
        // A raw payload (and, as the reference server does, a JSON text): stored as a blob,
        // and the ref is an object naming it.
        Some(OCTET) | Some(JSON) => {
            let claimed = required_hash(&headers)?;
            let (id, size) = super::blobs::store_raw(&ddc, &addr.ns, Some(claimed), body).await?;
            (refs::raw_wrapper(id, size), None)
        }
        Some(CBPKG) => {
            let body =
                read_body(body, ddc.limits.max_buffered_bytes, ddc.limits.body, &ddc.content.budget).await?;
            let (bytes, held) = body.into_parts();
            let held = Arc::new(held);
            (store_package(&ddc, &addr.ns, bytes.into(), &held).await?, Some(held))
        }
        other => return Err(ApiError::MediaType(other.unwrap_or_default().to_owned())),
    };
    let held = budget.as_ref().map_or(0, |b| b.bytes());
    match refs::put(&ddc.content, &addr, object, allow_overwrite, held).await? {
        PutOutcome::Stored { needs } => needs_reply(&needs, cb),
        PutOutcome::Conflict => {
            // The editor adopts the existing record when the 409 body is a valid object: read
            // it (charged, while it is sent) once the body's share is given back.
            drop(budget);
            let (lookup, held) = refs::lookup(&ddc.content, &addr, false, ddc.content.budget.total()).await?;
            let existing = match lookup {
                Lookup::Found(row) | Lookup::NotFinalized(row) => row.object,
                Lookup::Missing => Vec::new(), // Deleted since: an empty 409.
            };
            let mut response = held_response(CB, existing.into(), held);
            *response.status_mut() = StatusCode::CONFLICT;
            Ok(response)
        }
    }
}

/// Stores a package's attachments (each checked against its entry hash) and returns its root
/// object. `held` is the body's share of the memory budget: a check that runs on after the
/// request is dropped keeps it.
async fn store_package(ddc: &Ddc, ns: &Name, body: Bytes, held: &Arc<Held>) -> Result<Vec<u8>, ApiError> {
    let package = Package::parse(&body)?;
    for (i, entry) in package.attachments.iter().enumerate() {
        let hash = IoHash::from_bytes(entry.hash);
        if entry.flags.contains(EntryFlags::ERROR) {
            return Err(ApiError::Invalid(format!("package entry {} is an error entry", i + 1)));
        }
        if entry.flags.contains(EntryFlags::COMPRESSED) {
            let scratch = super::blobs::scratch_budget(ddc, entry.payload, held.bytes())?;
            let budget = (held.clone(), scratch);
            ddc.content.put_compressed(ns, Some(hash), body.slice_ref(entry.payload), budget).await?;
        } else if !ddc.content.blobs.exists(ns, &hash).await? {
            ddc.content.blobs.put(ns, Some(hash), entry.payload, u64::MAX).await?;
        }
    }
    ddc.content.meta.add_namespace(ns).await?;
    Ok(package.root.payload.to_vec())
}

pub async fn finalize(
    State(ddc): State<Arc<Ddc>>,
    Path((ns, bucket, key, hash)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (addr, _) = address(&ddc, &headers, &ns, &bucket, &key, Action::WriteObject)?;
    let (hash, format) = match hash.split_once('.') {
        Some((h, f)) => (h.parse::<IoHash>()?, Some(f.to_ascii_lowercase())),
        None => (hash.parse::<IoHash>()?, None),
    };
    let cb = needs_as_cb(format.as_deref(), &headers)?;
    match refs::finalize(&ddc.content, &addr, hash).await? {
        FinalizeOutcome::NotFound => Err(ApiError::NotFound("ref not found")),
        FinalizeOutcome::OtherObject { stored } => {
            Err(ApiError::Invalid(format!("the ref holds object {stored}, not {hash}")))
        }
        FinalizeOutcome::Checked { needs } => needs_reply(&needs, cb),
    }
}

/// The formats a ref GET can answer in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Cb,
    Raw,
    Json,
    Package,
    Inline,
}

impl Format {
    fn from_suffix(s: &str) -> Result<Format, ApiError> {
        Ok(match s {
            "uecb" => Format::Cb,
            "raw" => Format::Raw,
            "json" => Format::Json,
            "uecbpkg" => Format::Package,
            other => return Err(ApiError::Invalid(format!("unknown format suffix .{other}"))),
        })
    }

    /// By suffix, else the first `Accept` type served, else compact binary.
    fn choose(suffix: Option<&str>, headers: &HeaderMap) -> Result<Format, ApiError> {
        if let Some(s) = suffix {
            return Format::from_suffix(s);
        }
        let accept = accepted(headers);
        if accept.is_empty() {
            return Ok(Format::Cb);
        }
        for t in &accept {
            match t.as_str() {
                CB | "*/*" | "application/*" => return Ok(Format::Cb),
                OCTET => return Ok(Format::Raw),
                JSON => return Ok(Format::Json),
                CBPKG => return Ok(Format::Package),
                INLINE => return Ok(Format::Inline),
                _ => {}
            }
        }
        Err(ApiError::NotAcceptable(accept.join(", ")))
    }
}

/// A finalized ref and its object's share of the budget ([`refs::lookup`]), or the error a
/// read of it gets.
async fn finalized_ref(ddc: &Ddc, addr: &RefAddr) -> Result<(RefRow, Held), ApiError> {
    let (lookup, held) = refs::lookup(&ddc.content, addr, true, ddc.content.budget.total()).await?;
    match lookup {
        Lookup::Found(row) => Ok((row, held)),
        Lookup::Missing => Err(ApiError::NotFound("ref not found")),
        Lookup::NotFinalized(row) if !row.finalized => Err(ApiError::NotFinalized),
        Lookup::NotFinalized(_) => Err(ApiError::NotFound("an attachment of the ref is missing")),
    }
}

fn last_access(ms: i64) -> HeaderValue {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    HeaderValue::from_str(&humantime::format_rfc3339_millis(at).to_string()).expect("ascii")
}

/// The largest object served as JSON (`.json`, `Accept: application/json`); larger ones are
/// served in compact binary only.
const MAX_JSON_OBJECT_BYTES: usize = 4 << 20;
/// What the memory budget is charged per byte of an object rendered as JSON: its tree's worst
/// case (`serde_json::Value` per one-byte null) and the text.
const JSON_BYTES_PER_BYTE: usize = 96;

pub async fn get_ref(
    State(ddc): State<Arc<Ddc>>,
    Path((ns, bucket, key)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (addr, suffix) = address(&ddc, &headers, &ns, &bucket, &key, Action::ReadObject)?;
    let format = Format::choose(suffix.as_deref(), &headers)?;
    let (mut row, mut held) = finalized_ref(&ddc, &addr).await?;
    let mut response = match format {
        // The object, with its share of the budget until it has been sent.
        Format::Cb => held_response(CB, std::mem::take(&mut row.object).into(), held),
        Format::Json => {
            // A JSON tree takes tens of bytes per byte of compact binary (an array of nulls:
            // 80): bounded, and charged while it is built; then its text until it is sent.
            // Past what the budget could ever give: 413, not a 429 its retries would meet again.
            let most = MAX_JSON_OBJECT_BYTES.min(ddc.limits.memory_budget as usize / JSON_BYTES_PER_BYTE);
            if row.object.len() > most {
                return Err(ApiError::TooLarge { limit: most as u64 });
            }
            held.resize(&ddc.content.budget, row.object.len().saturating_mul(JSON_BYTES_PER_BYTE))?;
            let text = cb::to_json(&cb::parse(&row.object)?).to_string();
            // The tree is gone; the text keeps its own size (usually far less than the tree's).
            held.resize(&ddc.content.budget, text.len())?;
            held_response(JSON, text.into(), held)
        }
        // Each takes the object and its share, for an answer that sends the object.
        Format::Raw => raw_payload(&ddc, &addr.ns, &mut row, held).await?,
        Format::Inline => inline_payload(&ddc, &addr.ns, &mut row, held).await?,
        Format::Package => package(&ddc, &addr.ns, &mut row, held).await?,
    };
    let h = response.headers_mut();
    h.insert(IOHASH_HEADER, hash_value(&row.object_hash));
    h.insert(LAST_ACCESS_HEADER, last_access(row.last_access_ms));
    Ok(response)
}

/// `.raw`: the single binary attachment's payload (a raw blob as stored, a compressed one
/// decompressed when it can be), or the object itself when it has no single attachment.
/// `held` is the object's share of the budget: it goes with the object when that is the answer.
async fn raw_payload(ddc: &Ddc, ns: &Name, row: &mut RefRow, held: Held) -> Result<Response, ApiError> {
    let refs::Payload::Attachment(id) = refs::payload(&row.object) else {
        return Ok(held_response(OCTET, std::mem::take(&mut row.object).into(), held));
    };
    // The object is not the answer: it goes with its share.
    drop((std::mem::take(&mut row.object), held));
    // A raw blob of that hash is the payload itself (spec 5.3.3): served before any compressed
    // buffer of it, which may be one this server cannot decode.
    if ddc.content.blobs.known(ns, &id).await? {
        return super::blobs::serve_blob(ddc, ns, id, OCTET, None).await;
    }
    match ddc.content.locate(ns, id).await?.ok_or(ApiError::NotFound("attachment not found"))? {
        Located::Raw(id) => super::blobs::serve_blob(ddc, ns, id, OCTET, None).await,
        Located::Compressed(blob) => {
            // The buffer is charged before it is read, and its payload before it is decoded.
            let too_large = ApiError::NotFound("attachment too large to decompress here");
            let size =
                ddc.content.blobs.size(ns, &blob).await?.ok_or(ApiError::NotFound("attachment not found"))?;
            if size > ddc.limits.max_buffered_bytes {
                return Err(too_large);
            }
            let (bytes, mut budget) = ddc.content.read_blob(ns, &blob, size).await?.ok_or(too_large)?;
            let header = crate::compressed::check(&bytes)?;
            if header.total_raw_size > ddc.limits.max_buffered_bytes {
                return Err(ApiError::NotFound("attachment too large to decompress here"));
            }
            // The buffer, its payload and one decoded block (`compressed::decode`'s scratch)
            // together, beside nothing else: past the whole budget, no retry could get them
            // (413, not a 429 forever).
            let decoding = header.total_raw_size.saturating_add(header.scratch_len());
            let len = size.saturating_add(decoding);
            let room = ddc.content.budget.total() as u64;
            if len > room {
                return Err(ApiError::PastBudget { what: "decompressing this attachment", len, room });
            }
            budget.grow(&ddc.content.budget, decoding as usize)?;
            let decodes = &ddc.content.decodes;
            let (decoded, budget) = decodes
                .decode(header.total_raw_size, bytes.into(), budget, crate::compressed::decode)
                .await?;
            match decoded {
                // The buffer is gone; the payload keeps the whole share until it is sent.
                Ok((_, payload)) => Ok(held_response(OCTET, payload.into(), budget)),
                Err(crate::compressed::CompressedError::Oodle) => Err(ApiError::NotFound(
                    "the attachment is Oodle-compressed and cannot be decompressed here",
                )),
                Err(e) => Err(e.into()),
            }
        }
    }
}

/// `x-jupiter-inline`: the single binary attachment as stored, or the object when it has no
/// attachments. `held` is the object's share of the budget, as for [`raw_payload`].
async fn inline_payload(ddc: &Ddc, ns: &Name, row: &mut RefRow, held: Held) -> Result<Response, ApiError> {
    let mut response = match refs::payload(&row.object) {
        refs::Payload::Ambiguous => {
            return Err(ApiError::Invalid("the ref has more than one attachment, or an object one".into()));
        }
        refs::Payload::Object => {
            let mut r = held_response(INLINE, std::mem::take(&mut row.object).into(), held);
            r.headers_mut().insert(INLINE_HASH_HEADER, hash_value(&row.object_hash));
            r
        }
        refs::Payload::Attachment(id) => {
            drop((std::mem::take(&mut row.object), held));
            let located =
                ddc.content.locate(ns, id).await?.ok_or(ApiError::NotFound("attachment not found"))?;
            // Blobs are content-addressed: the returned bytes hash to the blob's id.
            let mut r = super::blobs::serve_blob(ddc, ns, located.blob(), INLINE, None).await?;
            r.headers_mut().insert(INLINE_HASH_HEADER, hash_value(&located.blob()));
            r.headers_mut().remove(IOHASH_HEADER);
            r
        }
    };
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(INLINE));
    Ok(response)
}

/// One package entry, with its payload in memory or in a file.
struct Part {
    hash: [u8; 20],
    flags: EntryFlags,
    size: u64,
    payload: BoxStream<'static, std::io::Result<Bytes>>,
}

impl Part {
    fn bytes(hash: [u8; 20], flags: EntryFlags, bytes: Vec<u8>) -> Part {
        let size = bytes.len() as u64;
        Part { hash, flags, size, payload: chunks(Bytes::from(bytes)) }
    }

    fn error(hash: [u8; 20], title: &str, status: u16) -> Part {
        let body = refs::error_object(title, status).to_bytes();
        Part::bytes(hash, EntryFlags(EntryFlags::ERROR.0 | EntryFlags::OBJECT.0), body)
    }
}

/// The most entries one package answer holds; an object that reaches more is refused (400).
const MAX_PACKAGE_ENTRIES: usize = 10_000;
/// The most bytes of object attachments one package answer holds in memory.
const MAX_PACKAGE_OBJECT_BYTES: u64 = 64 << 20;

/// A blob's bytes as a stream that opens the file only when the stream reaches it, so a
/// package with many attachments holds one file open at a time.
fn blob_stream(
    ddc: Arc<Ddc>,
    ns: Name,
    blob: IoHash,
    size: u64,
) -> BoxStream<'static, std::io::Result<Bytes>> {
    futures_util::stream::once(async move {
        match ddc.content.blobs.open_blob(&ns, &blob).await {
            Ok(Some(blob)) if blob.size() == size => match blob.read_all().await {
                Ok(reader) => ReaderStream::with_capacity(reader, 256 * 1024).boxed(),
                Err(e) => futures_util::stream::once(async move { Err(e) }).boxed(),
            },
            Ok(Some(_)) => {
                let changed = std::io::Error::other("the blob's size changed while being sent");
                futures_util::stream::once(async move { Err(changed) }).boxed()
            }
            Ok(None) => {
                let gone = std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "the blob was deleted while being sent",
                );
                futures_util::stream::once(async move { Err(gone) }).boxed()
            }
            Err(e) => futures_util::stream::once(async move { Err(e) }).boxed(),
        }
    })
    .flatten()
    .boxed()
}

/// `.uecbpkg`: the object, then every attachment it reaches (object attachments' own ones
/// too), streamed from the blob files; an attachment that cannot be read is an error entry.
///
/// The objects it holds in memory (the ref's and its object attachments) are charged to the
/// memory budget until the answer has been sent (`held` comes in as the ref's object's share);
/// the binary attachments are streamed from disk.
async fn package(ddc: &Arc<Ddc>, ns: &Name, row: &mut RefRow, mut held: Held) -> Result<Response, ApiError> {
    let root = cb::parse(&row.object)?.attachments();
    let object_len = row.object.len() as u64;
    let mut parts =
        vec![Part::bytes(*row.object_hash.as_bytes(), EntryFlags::OBJECT, std::mem::take(&mut row.object))];
    // The object attachments' bytes the answer holds in memory (besides the ref's object).
    let mut object_bytes = 0u64;
    let mut seen = std::collections::HashSet::new();
    let mut pending: Vec<(cb::CbType, [u8; 20], usize)> = root.into_iter().map(|(t, h)| (t, h, 0)).collect();
    pending.reverse();
    while let Some((ty, hash, depth)) = pending.pop() {
        if !seen.insert(hash) {
            continue;
        }
        if parts.len() >= MAX_PACKAGE_ENTRIES {
            return Err(ApiError::Invalid(format!(
                "the ref reaches more than {MAX_PACKAGE_ENTRIES} attachments"
            )));
        }
        let id = IoHash::from_bytes(hash);
        if ty == cb::CbType::BinaryAttachment {
            let Some(located) = ddc.content.locate(ns, id).await? else {
                parts.push(Part::error(hash, "attachment not found", 404));
                continue;
            };
            let flags = match located {
                Located::Compressed(_) => EntryFlags::COMPRESSED,
                Located::Raw(_) => EntryFlags::RAW,
            };
            match ddc.content.blobs.size(ns, &located.blob()).await? {
                Some(size) => parts.push(Part {
                    hash,
                    flags,
                    size,
                    payload: blob_stream(ddc.clone(), ns.clone(), located.blob(), size),
                }),
                None => parts.push(Part::error(hash, "attachment not found", 404)),
            }
            continue;
        }
        // Object attachments never take what the answer holds past half the budget (the ref's
        // object alone may be more: it fits the budget), so that the answer is never a 429 its
        // retries would meet again; an object past it is an error entry.
        let room = (u64::from(ddc.limits.memory_budget) / 2).saturating_sub(object_len);
        let limit = MAX_ATTACHED_OBJECT
            .min(MAX_PACKAGE_OBJECT_BYTES - object_bytes)
            .min(room.saturating_sub(object_bytes));
        let object = match ddc.content.read_blob(ns, &id, limit).await? {
            Some((bytes, share)) if cb::parse(&bytes).is_ok() => {
                held.join(share);
                bytes
            }
            _ => {
                parts.push(Part::error(hash, "object attachment not found or not valid", 404));
                continue;
            }
        };
        if depth + 1 < MAX_OBJECT_DEPTH {
            let children = cb::parse(&object)?.attachments();
            pending.extend(children.into_iter().rev().map(|(t, h)| (t, h, depth + 1)));
        }
        object_bytes += object.len() as u64;
        parts.push(Part::bytes(hash, EntryFlags::OBJECT, object));
    }
    let table: Vec<(u64, EntryFlags, [u8; 20])> = parts.iter().map(|p| (p.size, p.flags, p.hash)).collect();
    let head = cb::table_bytes(&table);
    let length = head.len() as u64 + parts.iter().map(|p| p.size).sum::<u64>();
    let payloads = futures_util::stream::iter(parts.into_iter().map(|p| p.payload)).flatten();
    let stream = futures_util::stream::once(async move { Ok(Bytes::from(head)) }).chain(payloads);
    let mut response = Body::from_stream(Sending::new(stream.boxed(), held)).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(CBPKG));
    response.headers_mut().insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    Ok(response)
}

pub async fn head_ref(
    State(ddc): State<Arc<Ddc>>,
    Path((ns, bucket, key)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (addr, _) = address(&ddc, &headers, &ns, &bucket, &key, Action::ReadObject)?;
    let (lookup, _held) = refs::lookup(&ddc.content, &addr, true, ddc.content.budget.total()).await?;
    let (status, hash) = match lookup {
        Lookup::Found(row) => (StatusCode::OK, Some(row.object_hash)),
        Lookup::NotFinalized(row) => (StatusCode::NOT_FOUND, Some(row.object_hash)),
        Lookup::Missing => (StatusCode::NOT_FOUND, None),
    };
    let mut response = status.into_response();
    if let Some(hash) = hash {
        response.headers_mut().insert(IOHASH_HEADER, hash_value(&hash));
    }
    Ok(response)
}

/// `GET /api/v1/refs/{ns}/exists?names=bucket.key&...`: the refs that are missing, not
/// finalized, or lack an attachment.
pub async fn exists(
    State(ddc): State<Arc<Ddc>>,
    Path(ns): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    let ns = ddc.authorize(&headers, &ns, Action::ReadObject)?;
    let mut missing = Vec::new();
    for (k, name) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if k != "names" {
            continue;
        }
        let (bucket, key) =
            name.split_once('.').ok_or_else(|| ApiError::Invalid(format!("{name:?} is not bucket.key")))?;
        let addr = RefAddr { ns: ns.clone(), bucket: Name::bucket(bucket)?, key: key.parse()? };
        let room = ddc.content.budget.total();
        if !matches!(refs::lookup(&ddc.content, &addr, true, room).await?.0, Lookup::Found(_)) {
            missing.push(json!({ "bucket": addr.bucket.as_str(), "key": addr.key.as_str() }));
        }
    }
    Ok(axum::Json(json!({ "missing": missing })))
}

pub async fn metadata(
    State(ddc): State<Arc<Ddc>>,
    Path((ns, bucket, key)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (addr, _) = address(&ddc, &headers, &ns, &bucket, &key, Action::ReadObject)?;
    let (row, mut held) = ddc
        .content
        .meta
        .get_ref(&addr.ns, &addr.bucket, &addr.key, &ddc.content.budget, ddc.content.budget.total())
        .await?
        .ok_or(ApiError::NotFound("ref not found"))?;
    // The answer keeps its text while it is sent: a text past the whole budget is a 413 (no
    // retry could get it), known before it is built from the base64's length.
    let room = ddc.content.budget.total();
    let too_large = |len: usize| ApiError::PastBudget {
        what: "this ref's metadata (its object in base64)",
        len: len as u64,
        room: room as u64,
    };
    let base64_len = row.object.len().div_ceil(3).saturating_mul(4);
    if base64_len > room {
        return Err(too_large(base64_len));
    }
    // The object (charged before it was read), its base64 text and the JSON around it (4/3 of
    // it): at most the whole budget (an answer no retry could ever get would be a 429 forever).
    let answer = row.object.len().saturating_mul(3).min(room);
    held.resize(&ddc.content.budget, answer.max(held.bytes()))?;
    use base64::Engine;
    let text = json!({
        "ns": addr.ns.as_str(),
        "bucket": addr.bucket.as_str(),
        "name": addr.key.as_str(),
        "payloadIdentifier": row.object_hash.to_hex(),
        "lastAccess": last_access(row.last_access_ms).to_str().unwrap_or_default(),
        "isFinalized": row.finalized,
        "inlinePayload": base64::engine::general_purpose::STANDARD.encode(&row.object),
    })
    .to_string();
    drop(row);
    if text.len() > room {
        return Err(too_large(text.len()));
    }
    // The text keeps its own size while it is sent.
    held.resize(&ddc.content.budget, text.len())?;
    Ok(held_response(JSON, text.into(), held))
}

pub async fn namespaces(
    State(ddc): State<Arc<Ddc>>,
    headers: HeaderMap,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    let readable: Vec<String> = ddc
        .content
        .meta
        .namespaces()
        .await?
        .into_iter()
        .filter(|ns| ddc.check(&headers, ns, Action::ReadObject).is_ok())
        .map(|ns| ns.as_str().to_owned())
        .collect();
    if readable.is_empty() {
        // Tell an anonymous caller to authenticate rather than that it may read nothing.
        ddc.check(&headers, &"any".parse().expect("valid"), Action::ReadObject)?;
    }
    Ok(axum::Json(json!({ "namespaces": readable })))
}

pub async fn delete_ref(
    State(ddc): State<Arc<Ddc>>,
    Path((ns, bucket, key)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    let (addr, _) = address(&ddc, &headers, &ns, &bucket, &key, Action::DeleteObject)?;
    let n = ddc.content.meta.delete_ref(&addr.ns, &addr.bucket, &addr.key).await?;
    Ok(axum::Json(json!({ "deletedCount": n })))
}

pub async fn delete_bucket(
    State(ddc): State<Arc<Ddc>>,
    Path((ns, bucket)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    let ns = ddc.authorize(&headers, &ns, Action::DeleteBucket)?;
    let n = ddc.content.meta.delete_bucket(&ns, &Name::bucket(&bucket)?).await?;
    Ok(axum::Json(json!({ "countOfDeletedRecords": n })))
}

pub async fn delete_namespace(
    State(ddc): State<Arc<Ddc>>,
    Path(ns): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let ns = ddc.authorize(&headers, &ns, Action::DeleteNamespace)?;
    // Names first: a crash in between leaves unnamed blobs, never names of missing ones.
    ddc.content.meta.delete_namespace(&ns).await?;
    ddc.content.blobs.delete_namespace(&ns).await?;
    Ok(StatusCode::NO_CONTENT)
}
