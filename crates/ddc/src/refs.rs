//! Refs: (namespace, bucket, key) → one compact-binary object, served only once every
//! attachment it names is present (finalized). The rules of the DDC spec's section 5.3 live
//! here, apart from HTTP, so the ref routes and the batch endpoint share them.

use std::time::{Duration, Instant};

use crate::budget::Held;
use crate::cb::{CbType, Value};
use crate::meta::{RefRow, now_ms};
use crate::storage::{Content, ContentError};
use crate::{IoHash, Name, RefKey};

/// A ref's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefAddr {
    pub ns: Name,
    pub bucket: Name,
    pub key: RefKey,
}

/// What a PUT did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    /// Stored; finalized iff `needs` is empty.
    Stored { needs: Vec<IoHash> },
    /// A different finalized object is there and may not be overwritten (read it with
    /// [`lookup`] to answer with it, once what the put held is freed).
    Conflict,
}

/// What a finalize did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinalizeOutcome {
    NotFound,
    /// The ref holds another object.
    OtherObject {
        stored: IoHash,
    },
    /// Finalized iff `needs` is empty.
    Checked {
        needs: Vec<IoHash>,
    },
}

/// What a read found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Missing,
    /// Stored but not finalized (or, when attachments were asked to be resolved, one is
    /// missing now).
    NotFinalized(RefRow),
    Found(RefRow),
}

/// The longest a ref's check of its attachments may take before the ref is written finalized.
/// Garbage collection leaves alone a blob a check found for a while after the check (half the
/// grace for local blobs, 30 minutes by default; 10 minutes in S3, `blob_store::s3`'s
/// `RELY_AFTER`), and marks only the refs written by then: a ref written after that could name
/// a blob removed meanwhile. Half of S3's, for the write itself and clocks. (A local store run
/// with a grace under 10 minutes has less.)
pub const MAX_CHECK: Duration = Duration::from_secs(5 * 60);

/// Refuses a finalized write whose check began at `checked` more than [`MAX_CHECK`] ago.
fn fresh_enough(finalized: bool, checked: Instant) -> Result<(), ContentError> {
    match checked.elapsed() {
        took if finalized && took > MAX_CHECK => Err(ContentError::CheckTooLong(took)),
        _ => Ok(()),
    }
}

/// Puts `object` (already validated as compact binary, and its hash checked) at `addr`. `held`
/// is what the caller's request holds of the memory budget (the object's body, at least): the
/// attachments' check is bounded by the rest ([`Content::missing_of`]). The stored object is
/// not read: a PUT compares hashes.
pub async fn put(
    content: &Content,
    addr: &RefAddr,
    object: Vec<u8>,
    allow_overwrite: bool,
    held: usize,
) -> Result<PutOutcome, ContentError> {
    let hash = IoHash::of(&object);
    let existing = content.meta.ref_state(&addr.ns, &addr.bucket, &addr.key).await?;
    if let Some((existing, true)) = existing
        && existing != hash
        && !allow_overwrite
    {
        return Ok(PutOutcome::Conflict);
    }
    // Collected no further than the bound: a body of hashes could name millions.
    let max = crate::storage::MAX_ATTACHMENTS;
    let attachments = crate::cb::parse(&object)
        .map(|field| field.attachments_within(max))
        .unwrap_or(Some(Vec::new()))
        .ok_or(ContentError::TooManyAttachments { count: max + 1, max })?;
    let room = content.budget.room_beside(held);
    let checked = Instant::now();
    let needs = content.missing_of(&addr.ns, attachments, room).await?;
    let finalized = needs.is_empty();
    fresh_enough(finalized, checked)?;
    if existing != Some((hash, finalized)) {
        let row = RefRow { object_hash: hash, object, finalized, last_access_ms: now_ms() };
        if !content.meta.put_ref(&addr.ns, &addr.bucket, &addr.key, row, allow_overwrite).await? {
            // Another writer finalized another object since the check above.
            return Ok(PutOutcome::Conflict);
        }
    } else {
        // The same object again: nothing to write, but it was written now (a ref nobody
        // reads that a build keeps putting is not collected as unused).
        content.meta.note_access(&addr.ns, &addr.bucket, &addr.key);
    }
    Ok(PutOutcome::Stored { needs })
}

/// Re-checks the attachments of the ref holding object `hash`: finalizes it if none is
/// missing, and takes a finalized ref back to unfinalized if one has gone.
pub async fn finalize(
    content: &Content,
    addr: &RefAddr,
    hash: IoHash,
) -> Result<FinalizeOutcome, ContentError> {
    let room = content.budget.total();
    let Some((row, _held)) =
        content.meta.get_ref(&addr.ns, &addr.bucket, &addr.key, &content.budget, room).await?
    else {
        return Ok(FinalizeOutcome::NotFound);
    };
    if row.object_hash != hash {
        return Ok(FinalizeOutcome::OtherObject { stored: row.object_hash });
    }
    let checked = Instant::now();
    let needs = content.missing(&addr.ns, &row.object, room.saturating_sub(row.object.len())).await?;
    let finalized = needs.is_empty();
    fresh_enough(finalized, checked)?;
    if finalized != row.finalized
        && !content.meta.set_finalized(&addr.ns, &addr.bucket, &addr.key, hash, finalized).await?
    {
        // Replaced by another PUT since it was read.
        return Ok(FinalizeOutcome::OtherObject { stored: row.object_hash });
    }
    Ok(FinalizeOutcome::Checked { needs })
}

/// Reads a ref. With `resolve`, a ref whose attachments are not all present now counts as not
/// finalized (every read that serves the object resolves: a ref is never served while an
/// attachment is missing, even one deleted after it was finalized).
///
/// `room` is what the memory budget could ever give this read: the whole budget, less what the
/// caller's request already holds. The row's object is charged before it is read, and the
/// share comes back with it (empty when the ref is missing), to keep as long as the object;
/// an object past `room` is not read ([`MetaError::PastRoom`]), and the attachments' check
/// is bounded by what is left ([`Content::missing`]).
///
/// [`MetaError::PastRoom`]: crate::meta::MetaError::PastRoom
pub async fn lookup(
    content: &Content,
    addr: &RefAddr,
    resolve: bool,
    room: usize,
) -> Result<(Lookup, Held), ContentError> {
    let (ns, bucket, key) = (&addr.ns, &addr.bucket, &addr.key);
    let Some((row, held)) = content.meta.get_ref(ns, bucket, key, &content.budget, room).await? else {
        return Ok((Lookup::Missing, Held::default()));
    };
    if !row.finalized
        || (resolve && !content.all_present(ns, &row.object, room.saturating_sub(row.object.len())).await?)
    {
        return Ok((Lookup::NotFinalized(row), held));
    }
    Ok((Lookup::Found(row), held))
}

/// The object a raw (octet-stream) PUT is stored as: `{RawHash: BinaryAttachment, RawSize}`.
pub fn raw_wrapper(raw_hash: IoHash, size: u64) -> Vec<u8> {
    Value::Object(vec![
        ("RawHash".into(), Value::BinaryAttachment(*raw_hash.as_bytes())),
        ("RawSize".into(), Value::Integer(i128::from(size))),
    ])
    .to_bytes()
}

/// `{needs: [Hash, ...]}`, the compact-binary form of a PUT's or finalize's answer.
pub fn needs_object(needs: &[IoHash]) -> Vec<u8> {
    let hashes = needs.iter().map(|h| Value::Hash(*h.as_bytes())).collect();
    Value::Object(vec![("needs".into(), Value::Array(hashes))]).to_bytes()
}

/// `{title, status}`, the compact-binary error object of batch results and package entries.
pub fn error_object(title: &str, status: u16) -> Value {
    Value::Object(vec![
        ("title".into(), Value::String(title.into())),
        ("status".into(), Value::Integer(status.into())),
    ])
}

/// What the raw and inline formats serve for an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// No attachments: the object itself.
    Object,
    /// Exactly one attachment field, a BinaryAttachment: its content.
    Attachment(IoHash),
    /// More than one attachment, or an object attachment: no single payload.
    Ambiguous,
}

/// The single payload of an object, in the sense of [`Payload`].
pub fn payload(object: &[u8]) -> Payload {
    let attachments = crate::storage::attachments_of(object);
    match attachments.as_slice() {
        [] => Payload::Object,
        [(CbType::BinaryAttachment, h)] => Payload::Attachment(IoHash::from_bytes(*h)),
        _ => Payload::Ambiguous,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A finalized write whose check began more than [`MAX_CHECK`] ago is refused (503: the
    /// client retries); an unfinalized one, which relies on nothing, is not.
    #[test]
    fn a_finalized_write_after_a_long_check_is_refused() {
        let long_ago = Instant::now().checked_sub(MAX_CHECK + Duration::from_secs(1)).unwrap();
        assert!(matches!(fresh_enough(true, long_ago), Err(ContentError::CheckTooLong(_))));
        assert!(fresh_enough(false, long_ago).is_ok());
        assert!(fresh_enough(true, Instant::now()).is_ok());
    }

    fn vector(name: &str) -> Vec<u8> {
        let all: serde_json::Value =
            serde_json::from_str(include_str!("../tests/fixtures/ddc-vectors.json")).unwrap();
        let v = all["cb_objects"].as_array().unwrap().iter().find(|o| o["name"] == name).unwrap();
        hex::decode(v["hex"].as_str().unwrap()).unwrap()
    }

    #[test]
    fn built_objects_match_the_vectors() {
        let raw: IoHash = "d00278ae47eb27b34faecf67b4fe263f82d54129".parse().unwrap();
        assert_eq!(raw_wrapper(raw, 1025), vector("octet-ref-wrapper"));
        assert_eq!(needs_object(&[]), vector("needs-empty-cb"));
        let needs = [
            "d7820f6b18be801fd706aad2903166cd8e130c75".parse().unwrap(),
            "42cf9da4b2236e44b1cfb8ca90a931e887d26747".parse().unwrap(),
        ];
        assert_eq!(needs_object(&needs), vector("put-ref-needs-cb"));
    }

    #[test]
    fn the_single_payload_is_an_attachment_only_when_alone() {
        let raw = "844014ef075c77dc1a0f230df4ead2db2daccfb1".parse().unwrap();
        assert_eq!(payload(&vector("cache-value")), Payload::Attachment(raw));
        assert_eq!(payload(&vector("empty-object")), Payload::Object);
        assert_eq!(payload(&vector("cache-record")), Payload::Ambiguous, "a record has two values");
    }
}
