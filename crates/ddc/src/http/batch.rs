//! The batch endpoint, `POST /api/v1/refs/{ns}` (spec section 5.3.6): one compact-binary
//! object of GET, HEAD and PUT ops in, one result per op out, matched by `opId`. The editor
//! checks existence of many records this way. Every op is authorized before any runs; one op
//! without access fails the whole request with 403.

use std::collections::HashSet;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;

use super::body::{Held, MemoryBudget, read_body};
use super::sending::held_response;
use super::{ApiError, CB, Ddc, content_type};
use crate::auth::Action;
use crate::cb::{self, CbType, Field, Value};
use crate::meta::MetaError;
use crate::refs::{self, Lookup, PutOutcome, RefAddr, error_object};
use crate::storage::ContentError;
use crate::{IoHash, Name};

/// The most ops one batch may hold (the editor sends one per record it checks).
pub const MAX_OPS: usize = 10_000;

/// What one hash of a PUT op's `needs` takes in the reply, as [`ReplySize::take`] counts it
/// (twice: the tree, then the bytes): a `Value::Hash` in the tree is 32 bytes, 21 in bytes.
const NEEDS_BYTES_PER_HASH: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Get,
    Head,
    Put,
}

/// What the objects a batch's GETs embed in its reply may take: at most the largest body the
/// server buffers (`max_buffered_bytes`, and half of what the request's body leaves of the
/// memory budget), charged to the budget as they are added (twice: the object in the reply's
/// tree, then in its bytes). Once the reply is built, the request's share and this one become
/// the reply's while it is sent. A GET past it gets its own 413 result, and the editor asks
/// again in a smaller batch; the budget running out is the whole batch's 429. Without it,
/// 10,000 GETs of one 1 MiB record built a 10 GiB reply.
struct ReplySize<'a> {
    budget: &'a MemoryBudget,
    held: Held,
    bytes: u64,
    limit: u64,
    /// What the request's body holds of the budget.
    body: usize,
}

impl ReplySize<'_> {
    /// Whether an object of `len` bytes still fits the reply (taking its share of the budget).
    fn take(&mut self, len: usize) -> Result<bool, ApiError> {
        if self.bytes + len as u64 > self.limit {
            return Ok(false);
        }
        self.held.grow(self.budget, len.saturating_mul(2))?;
        self.bytes += len as u64;
        Ok(true)
    }

    /// What the request holds of the budget now: its body and the reply so far.
    fn holds(&self) -> usize {
        self.body + self.held.bytes()
    }

    /// What the budget could ever give an op's reads now.
    fn room(&self) -> usize {
        self.budget.room_beside(self.holds())
    }

    fn too_large(&self) -> (u16, Value) {
        let title =
            format!("the batch's reply would pass {} bytes: ask for this one in another batch", self.limit);
        (413, error_object(&title, 413))
    }
}

/// An op's read of a ref ([`refs::lookup`], charged, within what the batch leaves), or the
/// op's own 413 when the object is past that room.
async fn read(
    ddc: &Ddc,
    addr: &RefAddr,
    resolve: bool,
    size: &ReplySize<'_>,
) -> Result<Result<(Lookup, Held), (u16, Value)>, ApiError> {
    match refs::lookup(&ddc.content, addr, resolve, size.room()).await {
        Err(ContentError::Meta(MetaError::PastRoom { .. }) | ContentError::PastRoom { .. }) => {
            Ok(Err(size.too_large()))
        }
        read => Ok(Ok(read?)),
    }
}

/// One op, borrowing the request's body: a PUT's payload is copied out (and charged) only
/// when that op runs, so that the ops' payloads are never held twice at once.
struct Op<'a> {
    id: i128,
    kind: Kind,
    addr: RefAddr,
    resolve: bool,
    /// PUT: the payload object's field, and the hash it must have.
    payload: Option<(Field<'a>, Option<IoHash>)>,
}

fn invalid(op: usize, what: &str) -> ApiError {
    ApiError::Invalid(format!("ops[{op}]: {what}"))
}

/// A field's bytes as a standalone value (its type byte, then its value).
fn standalone(field: &Field<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + field.value.len());
    out.push(field.ty as u8);
    out.extend_from_slice(field.value);
    out
}

fn parse_op<'a>(ns: &Name, i: usize, op: Field<'a>) -> Result<Op<'a>, ApiError> {
    if !op.ty.is_object() {
        return Err(invalid(i, "not an object"));
    }
    let id = op.get("opId").and_then(|f| f.as_i128()).ok_or_else(|| invalid(i, "opId must be an integer"))?;
    let kind = match op.get("op").and_then(|f| f.as_str()) {
        Some("GET") => Kind::Get,
        Some("HEAD") => Kind::Head,
        Some("PUT") => Kind::Put,
        _ => return Err(invalid(i, "op must be GET, HEAD or PUT")),
    };
    let bucket =
        op.get("bucket").and_then(|f| f.as_str()).ok_or_else(|| invalid(i, "bucket must be a string"))?;
    let key = op.get("key").and_then(|f| f.as_str()).ok_or_else(|| invalid(i, "key must be a string"))?;
    let addr = RefAddr { ns: ns.clone(), bucket: Name::bucket(bucket)?, key: key.parse()? };
    let resolve = op.get("resolveAttachments").is_some_and(|f| f.ty == CbType::BoolTrue);
    let payload = match kind {
        Kind::Put => {
            let object = op.get("payload").filter(|f| f.ty.is_object());
            let hash = op.get("payloadHash").and_then(|f| f.as_hash()).map(IoHash::from_bytes);
            object.map(|o| (o, hash))
        }
        _ => None,
    };
    Ok(Op { id, kind, addr, resolve, payload })
}

pub async fn batch(
    State(ddc): State<Arc<Ddc>>,
    Path(ns): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // Read or write access before the body is read: an anonymous caller cannot make the server
    // buffer and parse a body. Each op is checked again below (a PUT needs WriteObject, a GET
    // or HEAD ReadObject), so a token that may only write can send a batch of PUTs.
    let ns = ddc
        .authorize(&headers, &ns, Action::ReadObject)
        .or_else(|_| ddc.authorize(&headers, &ns, Action::WriteObject))?;
    match content_type(&headers).as_deref() {
        Some(CB) => {}
        other => return Err(ApiError::MediaType(other.unwrap_or_default().to_owned())),
    }
    let body = read_body(body, ddc.limits.max_buffered_bytes, ddc.limits.body, &ddc.content.budget).await?;
    let (bytes, body_held) = body.into_parts();
    let request = cb::parse(&bytes)?;
    let ops = request
        .get("ops")
        .filter(|f| f.ty.is_array())
        .ok_or_else(|| ApiError::Invalid("the request has no ops array".into()))?;
    if ops.iter().nth(MAX_OPS).is_some() {
        return Err(ApiError::Invalid(format!("a batch holds at most {MAX_OPS} ops")));
    }
    let ops: Vec<Op> =
        ops.iter().enumerate().map(|(i, op)| parse_op(&ns, i, op)).collect::<Result<_, _>>()?;
    let mut ids = HashSet::new();
    for op in &ops {
        if !ids.insert(op.id) {
            return Err(ApiError::Invalid(format!("opId {} appears twice", op.id)));
        }
        let action = if op.kind == Kind::Put { Action::WriteObject } else { Action::ReadObject };
        ddc.check(&headers, &ns, action)?;
    }
    let mut results = Vec::with_capacity(ops.len());
    // Twice the reply is charged, beside the request's body: a limit the budget can always
    // give, so a batch past it gets 413s, never a 429 its retries would meet again.
    let room = ddc.content.budget.room_beside(body_held.bytes()) as u64;
    let limit = ddc.limits.max_buffered_bytes.min(room / 2);
    let mut size = ReplySize {
        budget: &ddc.content.budget,
        held: Held::default(),
        bytes: 0,
        limit,
        body: body_held.bytes(),
    };
    for op in ops {
        let (status, response) = run(&ddc, op.kind, &op.addr, op.resolve, op.payload, &mut size).await?;
        results.push(Value::Object(vec![
            ("opId".into(), Value::Integer(op.id)),
            ("response".into(), response),
            ("statusCode".into(), Value::Integer(status.into())),
        ]));
    }
    let reply = Value::Object(vec![("results".into(), Value::Array(results))]).to_bytes();
    drop(bytes);
    // The body's share and the reply's become the reply's while it is sent, cut to its size.
    // Past them (an op's result beyond its embedded object is a few dozen bytes), a growth
    // the budget refuses now keeps what they hold, uncounted beyond: the work is done, and a
    // 429 would make the editor do it all again for a few bytes.
    let mut held = size.held;
    held.join(body_held);
    let _ = held.resize(&ddc.content.budget, reply.len());
    Ok(held_response(CB, reply.into(), held))
}

/// One op: its status and response object. Storage failures fail the whole request (500);
/// everything about the op itself is its own result.
async fn run(
    ddc: &Ddc,
    kind: Kind,
    addr: &RefAddr,
    resolve: bool,
    payload: Option<(Field<'_>, Option<IoHash>)>,
    size: &mut ReplySize<'_>,
) -> Result<(u16, Value), ApiError> {
    match kind {
        // A GET serves the object: its attachments are always resolved. The ref's object is
        // charged while it is read and judged (the read's share), then twice once it is in
        // the reply (in its tree, then in its bytes).
        Kind::Get => {
            let (lookup, held) = match read(ddc, addr, true, size).await? {
                Ok(read) => read,
                Err(result) => return Ok(result),
            };
            Ok(match lookup {
                Lookup::Found(row) => {
                    drop(held);
                    if !size.take(row.object.len())? {
                        size.too_large()
                    } else {
                        match Value::embed_object(&row.object) {
                            Some(object) => (200, object),
                            None => (500, error_object("the stored object is damaged", 500)),
                        }
                    }
                }
                Lookup::Missing => (404, error_object("Object not found", 404)),
                Lookup::NotFinalized(row) if !row.finalized => {
                    (400, error_object("Object is not finalized", 400))
                }
                Lookup::NotFinalized(_) => (404, error_object("An attachment is missing", 404)),
            })
        }
        Kind::Head => {
            let found = match read(ddc, addr, resolve, size).await? {
                Ok((lookup, _)) => matches!(lookup, Lookup::Found(_)),
                Err(result) => return Ok(result),
            };
            let status = if found { 200 } else { 404 };
            Ok((status, Value::Object(vec![("exists".into(), Value::Bool(found))])))
        }
        Kind::Put => {
            let Some((field, Some(claimed))) = payload else {
                return Ok((400, error_object("a PUT op needs payload and payloadHash", 400)));
            };
            // The payload's copy, charged beside what the request holds; past what the budget
            // could ever give it, this op's own 413.
            let len = 1 + field.value.len();
            if len > size.room() {
                let title = "the server cannot hold this payload beside the batch: send it in another batch";
                return Ok((413, error_object(title, 413)));
            }
            // No room now: the whole batch's 429, as for any of its reads; the editor retries
            // the batch, and its PUTs that ran already are the same object again (200).
            let _copy = Held::take(size.budget, len)?;
            let object = standalone(&field);
            if let Err(e) = cb::parse(&object) {
                return Ok((400, error_object(&format!("payload: {e}"), 400)));
            }
            let actual = IoHash::of(&object);
            if actual != claimed {
                let title = format!("Incorrect hash: the payload hashes to {actual}, not {claimed}");
                return Ok((400, error_object(&title, 400)));
            }
            let holds = size.holds() + len;
            let outcome = match refs::put(&ddc.content, addr, object, ddc.allow_overwrite, holds).await {
                Err(e @ ContentError::TooManyAttachments { .. }) => {
                    return Ok((400, error_object(&e.to_string(), 400)));
                }
                Err(ContentError::PastRoom { .. }) => return Ok(size.too_large()),
                outcome => outcome?,
            };
            let PutOutcome::Stored { needs } = outcome else {
                // The editor adopts the existing record when the 409 is a valid object.
                let conflict = || (409, error_object("the ref exists with another object", 409));
                let (lookup, held) = match read(ddc, addr, false, size).await? {
                    Ok(read) => read,
                    Err(_) => return Ok(conflict()),
                };
                let (Lookup::Found(row) | Lookup::NotFinalized(row)) = lookup else { return Ok(conflict()) };
                drop(held);
                if !size.take(row.object.len())? {
                    return Ok(conflict());
                }
                return Ok(Value::embed_object(&row.object).map_or_else(conflict, |object| (409, object)));
            };
            // A small op can list thousands of hashes (what is absent below its object
            // attachments): charged to the reply as an embedded object is. Past the reply's
            // bound, this op's 413 (stored already; the editor asks again in another batch).
            if !size.take(needs.len().saturating_mul(NEEDS_BYTES_PER_HASH))? {
                return Ok(size.too_large());
            }
            let hashes = needs.iter().map(|h| Value::Hash(*h.as_bytes())).collect();
            Ok((200, Value::Object(vec![("needs".into(), Value::Array(hashes))])))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hash of `needs` is charged at least what it takes in the reply's tree.
    #[test]
    fn a_needs_hash_is_charged_at_least_its_place_in_the_tree() {
        assert!(std::mem::size_of::<Value>() <= NEEDS_BYTES_PER_HASH);
    }
}
