//! Refs: (namespace, bucket, key) → one compact-binary object, served only once every
//! attachment it names is present (finalized). The rules of the DDC spec's section 5.3 live
//! here, apart from HTTP, so the ref routes and the batch endpoint share them.

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
    /// A different finalized object is there and may not be overwritten: the existing one.
    Conflict { existing: Vec<u8> },
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

/// Puts `object` (already validated as compact binary, and its hash checked) at `addr`.
pub async fn put(
    content: &Content,
    addr: &RefAddr,
    object: Vec<u8>,
    allow_overwrite: bool,
) -> Result<PutOutcome, ContentError> {
    let hash = IoHash::of(&object);
    // The stored row's object is charged while it is compared.
    let existing = content.meta.get_ref(&addr.ns, &addr.bucket, &addr.key, &content.budget).await?;
    let existing = existing.map(|(row, _held)| row);
    if let Some(existing) = &existing
        && existing.finalized
        && existing.object_hash != hash
        && !allow_overwrite
    {
        return Ok(PutOutcome::Conflict { existing: existing.object.clone() });
    }
    let attachments = crate::storage::attachments_of(&object);
    if attachments.len() > crate::storage::MAX_ATTACHMENTS {
        let (count, max) = (attachments.len(), crate::storage::MAX_ATTACHMENTS);
        return Err(ContentError::TooManyAttachments { count, max });
    }
    let needs = content.missing_of(&addr.ns, attachments).await?;
    let finalized = needs.is_empty();
    let unchanged = existing.is_some_and(|e| e.object_hash == hash && e.finalized == finalized);
    if !unchanged {
        let row = RefRow { object_hash: hash, object, finalized, last_access_ms: now_ms() };
        if !content.meta.put_ref(&addr.ns, &addr.bucket, &addr.key, row, allow_overwrite).await? {
            // Another writer finalized another object since the check above.
            let existing = content.meta.get_ref(&addr.ns, &addr.bucket, &addr.key, &content.budget).await?;
            return Ok(PutOutcome::Conflict {
                existing: existing.map(|(e, _)| e.object).unwrap_or_default(),
            });
        }
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
    let Some((row, _held)) = content.meta.get_ref(&addr.ns, &addr.bucket, &addr.key, &content.budget).await?
    else {
        return Ok(FinalizeOutcome::NotFound);
    };
    if row.object_hash != hash {
        return Ok(FinalizeOutcome::OtherObject { stored: row.object_hash });
    }
    let needs = content.missing(&addr.ns, &row.object).await?;
    let finalized = needs.is_empty();
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
/// attachment is missing, even one deleted after it was finalized). The row's object is
/// charged to the memory budget before it is read ([`MetaStore::get_ref`]); the share comes
/// back with it (empty when the ref is missing), to keep as long as the object.
///
/// [`MetaStore::get_ref`]: crate::meta::MetaStore::get_ref
pub async fn lookup(
    content: &Content,
    addr: &RefAddr,
    resolve: bool,
) -> Result<(Lookup, Held), ContentError> {
    let Some((row, held)) = content.meta.get_ref(&addr.ns, &addr.bucket, &addr.key, &content.budget).await?
    else {
        return Ok((Lookup::Missing, Held::default()));
    };
    if !row.finalized || (resolve && !content.missing(&addr.ns, &row.object).await?.is_empty()) {
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
