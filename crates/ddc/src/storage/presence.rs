//! Whether the attachments a ref's object names are present, through the objects it names
//! in turn, within bounds of depth, count and memory: what `PUT` and `finalize` answer with
//! `needs`, and what a read asks before it serves a ref. Apart from the rest of the content
//! store because it is a judgement over many reads, with its own bounds ([`Resolver`]).

use std::collections::{HashMap, HashSet};

use futures_util::StreamExt;

use super::{
    Content, ContentError, LOOKUPS_AT_ONCE, MAX_ATTACHMENTS, MAX_JUDGED_ATTACHMENTS, MAX_OBJECT_DEPTH,
    MAX_RESOLVED_OBJECTS,
};
use crate::cb::{self, CbType};
use crate::{IoHash, Name};

impl Content {
    /// The attachments of `object` (a validated compact-binary object) that are not present,
    /// each once, in the order the object names them. `room` is what the memory budget could
    /// ever give the check: the whole budget, less what the caller's request holds (see
    /// [`Content::present`]).
    pub async fn missing(&self, ns: &Name, object: &[u8], room: usize) -> Result<Vec<IoHash>, ContentError> {
        self.missing_of(ns, attachments_of(object), room).await
    }

    /// Whether every attachment of `object` is present ([`Content::missing`] is empty), judged
    /// only up to the first one that is not: what a read asks.
    pub async fn all_present(&self, ns: &Name, object: &[u8], room: usize) -> Result<bool, ContentError> {
        let mut resolver = Resolver::new(room);
        resolver.first_only = true;
        Ok(self.missing_within(ns, attachments_of(object), resolver).await?.is_empty())
    }

    /// [`Content::missing`], given the object's attachments ([`attachments_of`]).
    pub async fn missing_of(
        &self,
        ns: &Name,
        attachments: Vec<(CbType, [u8; 20])>,
        room: usize,
    ) -> Result<Vec<IoHash>, ContentError> {
        self.missing_within(ns, attachments, Resolver::new(room)).await
    }

    /// [`Content::missing_of`], within the bounds `resolver` starts with.
    async fn missing_within(
        &self,
        ns: &Name,
        attachments: Vec<(CbType, [u8; 20])>,
        mut resolver: Resolver,
    ) -> Result<Vec<IoHash>, ContentError> {
        if !resolver.first_only {
            // Every one is judged: its own binary attachments are looked up at once.
            let binaries: HashSet<IoHash> = attachments
                .iter()
                .filter(|(ty, _)| *ty == CbType::BinaryAttachment)
                .map(|(_, hash)| IoHash::from_bytes(*hash))
                .collect();
            let lookups = binaries.into_iter().map(|hash| async move {
                Ok::<_, ContentError>((hash, self.locate_durably(ns, hash).await?.is_some()))
            });
            let mut found = futures_util::stream::iter(lookups).buffer_unordered(LOOKUPS_AT_ONCE);
            while let Some(looked_up) = found.next().await {
                let (hash, located) = looked_up?;
                resolver.looked_up.insert(hash, located);
            }
        }
        let (mut missing, mut named, mut listed) = (Vec::new(), HashSet::new(), HashSet::new());
        for (ty, hash) in attachments {
            let hash = IoHash::from_bytes(hash);
            if !named.insert((ty, hash)) {
                continue; // Named twice by the ref: listed once.
            }
            resolver.cut_short = false;
            // Judged already if an object attachment named it too: then `present` answers from
            // what it judged, so that a hash is listed even when it was judged missing inside
            // an object first.
            let present = self.present(ns, ty, hash, 0, &mut resolver).await?;
            let mut found = std::mem::take(&mut resolver.absent);
            // What is absent below it, as the reference server lists it: an object attachment
            // that is stored is not listed, the blobs it names that are not stored are. Itself
            // when a bound or a cycle cut the judgement short under it, or when nothing at all
            // was listed yet: `needs` is empty only when every attachment is present. (One
            // judged missing before, under an earlier attachment, is covered by what that one
            // listed: what was absent below it, or itself.)
            if !present && (resolver.cut_short || (found.is_empty() && missing.is_empty())) {
                found.push(hash);
            }
            missing.extend(found.into_iter().filter(|h| listed.insert(*h)));
            if resolver.first_only && !missing.is_empty() {
                break;
            }
        }
        Ok(missing)
    }

    /// Whether one attachment is present: a binary one as a compressed buffer or raw blob, an
    /// object one as a stored, valid object whose own attachments are present. Each hash is
    /// judged once per check, and a check is bounded, so that a hostile object graph cannot
    /// make it expensive:
    /// - it reads at most [`MAX_RESOLVED_OBJECTS`] objects, [`MAX_OBJECT_DEPTH`] deep, one at a
    ///   time (an object's bytes go before its attachments are judged), each charged to the
    ///   memory budget while it is read and parsed, and each at most [`MAX_ATTACHED_OBJECT`]
    ///   (larger ones count as missing); one past the check's room fails the check with
    ///   [`ContentError::PastRoom`], a 413, not a 429 that retries would meet again;
    /// - it judges at most [`MAX_JUDGED_ATTACHMENTS`] hashes reached through object
    ///   attachments (those the ref names itself are not counted);
    /// - an object attachment naming more than [`MAX_ATTACHMENTS`] of its own is not read
    ///   past.
    ///
    /// Past the other bounds, attachments count as missing.
    fn present<'a>(
        &'a self,
        ns: &'a Name,
        ty: CbType,
        hash: IoHash,
        depth: usize,
        resolver: &'a mut Resolver,
    ) -> futures_util::future::BoxFuture<'a, Result<bool, ContentError>> {
        Box::pin(async move {
            if let Some(&known) = resolver.known.get(&(ty, hash)) {
                return Ok(known);
            }
            // Past a bound, a hash counts as missing here but is not remembered as judged: the
            // ref may name it directly too, where it is judged in full.
            if depth > 0 {
                if resolver.judged_left == 0 {
                    resolver.cut_short = true;
                    return Ok(false);
                }
                resolver.judged_left -= 1;
            }
            let present = if ty == CbType::BinaryAttachment {
                let located = match resolver.looked_up.remove(&hash) {
                    Some(located) => located,
                    None => self.locate_as(ns, hash, !resolver.first_only).await?.is_some(),
                };
                if !located {
                    resolver.absent.push(hash);
                }
                located
            } else if depth >= MAX_OBJECT_DEPTH
                || resolver.objects_left == 0
                || resolver.judging.contains(&hash)
            {
                // Past a bound, or a cycle (which cannot be present): not remembered as judged.
                resolver.cut_short = true;
                return Ok(false);
            } else {
                resolver.objects_left -= 1;
                resolver.judging.insert(hash);
                // A write's check asks the store itself whether the object is there before
                // reading it (a read may come from what this server remembers).
                let stored = resolver.first_only || self.blobs.exists(ns, &hash).await?;
                let read = if stored { self.read_attached(ns, &hash, resolver.room).await? } else { None };
                let children = match read {
                    None => None,
                    Some((bytes, _held)) => {
                        cb::parse(&bytes).ok().and_then(|object| object.attachments_within(MAX_ATTACHMENTS))
                    }
                };
                let judged = match children {
                    // Not stored, too large, damaged or naming too many: the object itself.
                    None => {
                        resolver.absent.push(hash);
                        false
                    }
                    // Every child judged (not only up to the first missing), so that `needs`
                    // lists every blob absent below it.
                    Some(children) => {
                        let mut all = true;
                        for (ty, h) in children {
                            all &= self.present(ns, ty, IoHash::from_bytes(h), depth + 1, resolver).await?;
                            if !all && resolver.first_only {
                                break;
                            }
                        }
                        all
                    }
                };
                resolver.judging.remove(&hash);
                judged
            };
            resolver.known.insert((ty, hash), present);
            Ok(present)
        })
    }
}

/// The attachments a validated compact-binary object names, in order (none if it does not
/// parse).
pub fn attachments_of(object: &[u8]) -> Vec<(CbType, [u8; 20])> {
    cb::parse(object).map(|field| field.attachments()).unwrap_or_default()
}

/// [`attachments_of`], each hash as an [`IoHash`].
pub(crate) fn attachment_hashes(object: &[u8]) -> impl Iterator<Item = (CbType, IoHash)> {
    attachments_of(object).into_iter().map(|(ty, h)| (ty, IoHash::from_bytes(h)))
}

/// One presence check's memory: what each hash was judged, how many more objects it may read
/// and hashes it may judge, and its room in the memory budget.
struct Resolver {
    /// Each hash judged, by the type it was named as: present as a blob does not make it a
    /// valid object.
    known: HashMap<(CbType, IoHash), bool>,
    objects_left: usize,
    judged_left: usize,
    /// What the memory budget could ever give the check.
    room: u64,
    /// Hashes found absent since the ref's current attachment began to be judged, in order:
    /// blobs not stored, and object attachments not stored or not readable.
    absent: Vec<IoHash>,
    /// A bound or a cycle stopped the judgement under the ref's current attachment.
    cut_short: bool,
    /// Where the ref's own binary attachments were found, asked of the store before the
    /// judgement began, [`LOOKUPS_AT_ONCE`] at a time (each a HEAD with blobs in S3); taken by
    /// the judgement in its order, which stays the one source of `absent`.
    looked_up: HashMap<IoHash, bool>,
    /// The object attachments being judged (one met again is a cycle).
    judging: HashSet<IoHash>,
    /// Stop at the first attachment that is not present (a read's yes or no), instead of
    /// listing all that are absent. A read's check may trust what this server remembers of
    /// the blob store; a write's (all the others) asks it ([`Content::locate_durably`]).
    first_only: bool,
}

impl Resolver {
    /// A check within the default bounds, with `room` of the memory budget.
    fn new(room: usize) -> Resolver {
        Resolver {
            known: HashMap::new(),
            objects_left: MAX_RESOLVED_OBJECTS,
            judged_left: MAX_JUDGED_ATTACHMENTS,
            room: room as u64,
            absent: Vec::new(),
            cut_short: false,
            looked_up: HashMap::new(),
            judging: HashSet::new(),
            first_only: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Held;

    async fn content(dir: &std::path::Path, budget: u32) -> Content {
        Content::open_in(dir, budget).await
    }

    async fn store(content: &Content, ns: &Name, bytes: &[u8]) -> [u8; 20] {
        content.blobs.put(ns, None, bytes, u64::MAX).await.unwrap();
        *IoHash::of(bytes).as_bytes()
    }

    /// An object holding `field` once per hash in `hashes`, as `ty`.
    fn naming(ty: CbType, hashes: &[[u8; 20]]) -> Vec<u8> {
        let value = |h: &[u8; 20]| match ty {
            CbType::ObjectAttachment => cb::Value::ObjectAttachment(*h),
            _ => cb::Value::BinaryAttachment(*h),
        };
        let fields = hashes.iter().enumerate().map(|(i, h)| (format!("f{i}"), value(h))).collect();
        cb::Value::Object(fields).to_bytes()
    }

    /// An object attachment is charged to the memory budget while a check reads it: a budget
    /// without room for it makes the check `Busy` (429), taking nothing; with room, the check
    /// gives every byte back.
    #[tokio::test]
    async fn a_check_charges_each_object_it_reads() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let content = content(dir.path(), 64 << 10).await;
        let payload = store(&content, &ns, b"payload").await;
        // About 20 KB: more than the 10,000 bytes left below.
        let inner = cb::Value::Object(vec![
            ("p".into(), cb::Value::BinaryAttachment(payload)),
            ("pad".into(), cb::Value::Binary(vec![0; 20_000])),
        ])
        .to_bytes();
        let object = store(&content, &ns, &inner).await;
        let attachments = vec![(CbType::ObjectAttachment, object)];
        let taken = Held::take(&content.budget, (64 << 10) - 10_000).unwrap();
        let busy = content.missing_of(&ns, attachments.clone(), 64 << 10).await;
        assert!(matches!(busy, Err(ContentError::Busy(_))), "{busy:?}");
        assert_eq!(content.budget.available(), 10_000, "a refused read takes nothing");
        drop(taken);
        assert_eq!(content.missing_of(&ns, attachments, 64 << 10).await.unwrap(), vec![]);
        assert_eq!(content.budget.available(), 64 << 10, "all given back");
    }

    /// An object attachment naming more than `MAX_ATTACHMENTS` of its own is not read past: it
    /// counts as missing, however present they are. At the bound, it is judged.
    #[tokio::test]
    async fn an_object_naming_too_many_attachments_counts_as_missing() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let content = content(dir.path(), 1 << 30).await;
        let payload = store(&content, &ns, b"payload").await;
        let at_bound =
            store(&content, &ns, &naming(CbType::BinaryAttachment, &[payload; MAX_ATTACHMENTS])).await;
        let past =
            store(&content, &ns, &naming(CbType::BinaryAttachment, &[payload; MAX_ATTACHMENTS + 1])).await;
        let check = |h| content.missing_of(&ns, vec![(CbType::ObjectAttachment, h)], 1 << 30);
        assert_eq!(check(at_bound).await.unwrap(), vec![]);
        assert_eq!(check(past).await.unwrap(), vec![IoHash::from_bytes(past)]);
    }

    /// A hash the ref names directly is listed missing even when an object attachment named
    /// before it names it too (and it was judged missing there, inside the object); a hash
    /// named twice is listed once. The object is stored, so it is not listed: what it names
    /// that is absent is.
    #[tokio::test]
    async fn a_hash_named_by_the_ref_and_by_an_object_is_listed() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let content = content(dir.path(), 1 << 30).await;
        let absent = *IoHash::of(b"never stored").as_bytes();
        let object = store(&content, &ns, &naming(CbType::BinaryAttachment, &[absent])).await;
        let attachments = vec![
            (CbType::ObjectAttachment, object),
            (CbType::BinaryAttachment, absent),
            (CbType::BinaryAttachment, absent),
        ];
        assert_eq!(
            content.missing_of(&ns, attachments, 1 << 30).await.unwrap(),
            vec![IoHash::from_bytes(absent)]
        );
    }

    /// A hash past a check's bound inside an object is not remembered as judged: named by the
    /// ref itself as well, it is judged there in full.
    #[tokio::test]
    async fn a_hash_past_the_bound_inside_an_object_is_judged_when_named_directly() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let content = content(dir.path(), 1 << 30).await;
        let blob = store(&content, &ns, b"present").await;
        let object = store(&content, &ns, &naming(CbType::BinaryAttachment, &[blob])).await;
        let attachments = vec![(CbType::ObjectAttachment, object), (CbType::BinaryAttachment, blob)];
        assert_eq!(
            content.missing_within(&ns, attachments, judging(0)).await.unwrap(),
            vec![IoHash::from_bytes(object)],
            "the blob is present; only the object, past the bound, is missing"
        );
    }

    fn judging(judged: usize) -> Resolver {
        Resolver { objects_left: 10, judged_left: judged, ..Resolver::new(1 << 20) }
    }

    /// A check judges at most its bound of hashes reached through object attachments: past it,
    /// present attachments count as missing, so an object graph naming millions cannot make a
    /// check long. Those the ref names itself are not bounded (its object bounds them).
    #[tokio::test]
    async fn a_check_judges_a_bounded_number_of_hashes() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let content = content(dir.path(), 1 << 30).await;
        let mut blobs = Vec::new();
        for i in 0..3u8 {
            blobs.push(store(&content, &ns, &[i; 8]).await);
        }
        let object = store(&content, &ns, &naming(CbType::BinaryAttachment, &blobs)).await;
        let direct: Vec<_> = blobs.iter().map(|&h| (CbType::BinaryAttachment, h)).collect();
        assert_eq!(content.missing_within(&ns, direct, judging(0)).await.unwrap(), vec![]);
        let nested = vec![(CbType::ObjectAttachment, object)];
        assert_eq!(content.missing_within(&ns, nested.clone(), judging(3)).await.unwrap(), vec![]);
        assert_eq!(
            content.missing_within(&ns, nested, judging(2)).await.unwrap(),
            vec![IoHash::from_bytes(object)],
            "its third child is past the bound"
        );
    }

    /// A chain of object attachments is read one object at a time: three objects of 40% of the
    /// budget each, each naming the next, fit (they would not if an object's bytes were kept
    /// while its attachments are judged). An object past the check's room is a deterministic
    /// error (413), charged nothing: not a 429 its retries would meet again, nor "missing".
    #[tokio::test]
    async fn a_chain_of_objects_is_read_one_at_a_time_within_the_checks_room() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let budget = 100_000u32;
        let content = content(dir.path(), budget).await;
        let padded = |next: Option<[u8; 20]>| {
            let mut fields = vec![("pad".to_string(), cb::Value::Binary(vec![0; 40_000]))];
            fields.extend(next.map(|h| ("next".to_string(), cb::Value::ObjectAttachment(h))));
            cb::Value::Object(fields).to_bytes()
        };
        let last = store(&content, &ns, &padded(None)).await;
        let middle = store(&content, &ns, &padded(Some(last))).await;
        let first = store(&content, &ns, &padded(Some(middle))).await;
        let chain = vec![(CbType::ObjectAttachment, first)];
        assert_eq!(content.missing_of(&ns, chain.clone(), budget as usize).await.unwrap(), vec![]);
        assert_eq!(content.budget.available(), budget as usize);
        let past = content.missing_of(&ns, chain, 30_000).await;
        assert!(matches!(past, Err(ContentError::PastRoom { room: 30_000, .. })), "{past:?}");
        assert_eq!(content.budget.available(), budget as usize, "nothing charged");
    }

    /// `needs` lists what is absent below a stored object attachment, as the reference server
    /// does, not the object (whose upload again would change nothing): every absent blob it
    /// names, at any depth, each once, however many objects name it. An object not stored is
    /// listed itself.
    #[tokio::test]
    async fn needs_lists_the_absent_blobs_below_a_stored_object() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let content = content(dir.path(), 1 << 30).await;
        let (c1, c2) = (*IoHash::of(b"absent one").as_bytes(), *IoHash::of(b"absent two").as_bytes());
        let present = store(&content, &ns, b"present").await;
        let inner = store(&content, &ns, &naming(CbType::BinaryAttachment, &[c2, present])).await;
        let mut fields = vec![
            ("a".to_string(), cb::Value::BinaryAttachment(c1)),
            ("i".to_string(), cb::Value::ObjectAttachment(inner)),
        ];
        let first = store(&content, &ns, &cb::Value::Object(fields.clone()).to_bytes()).await;
        fields.reverse();
        let second = store(&content, &ns, &cb::Value::Object(fields).to_bytes()).await;
        let not_stored = *IoHash::of(b"an object never stored").as_bytes();
        let attachments = vec![
            (CbType::ObjectAttachment, first),
            (CbType::ObjectAttachment, second),
            (CbType::ObjectAttachment, not_stored),
        ];
        let hashes = |hs: &[[u8; 20]]| hs.iter().map(|h| IoHash::from_bytes(*h)).collect::<Vec<_>>();
        assert_eq!(
            content.missing_of(&ns, attachments, 1 << 30).await.unwrap(),
            hashes(&[c1, c2, not_stored])
        );
    }

    /// An object stored under a hash it names itself, and that hash: content addressing
    /// never stores one, so it is written into the store by hand, as a damaged store could
    /// hold it.
    fn self_naming_object(content: &Content, ns: &Name) -> [u8; 20] {
        let o = *IoHash::of(b"a hash the object names").as_bytes();
        let path = content.blobs.local().unwrap().blob_path(ns, &IoHash::from_bytes(o));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, naming(CbType::ObjectAttachment, &[o])).unwrap();
        o
    }

    /// Objects that name each other (all stored) can never be present: the check lists the
    /// ref's attachment, so `needs` is never empty for a ref that is not finalized.
    #[tokio::test]
    async fn a_cycle_of_objects_is_never_present_and_is_listed() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let content = content(dir.path(), 1 << 30).await;
        let o = self_naming_object(&content, &ns);
        let missing = content.missing_of(&ns, vec![(CbType::ObjectAttachment, o)], 1 << 30).await.unwrap();
        assert_eq!(missing, vec![IoHash::from_bytes(o)]);
    }

    /// An attachment whose judgement a bound cut short is listed even when an earlier one
    /// already put something in `needs`: `needs` lists every attachment not present or what
    /// is absent below it.
    #[tokio::test]
    async fn an_attachment_cut_short_is_listed_after_others() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let content = content(dir.path(), 1 << 30).await;
        let absent = *IoHash::of(b"never stored").as_bytes();
        let blob = store(&content, &ns, b"present").await;
        let object = store(&content, &ns, &naming(CbType::BinaryAttachment, &[blob])).await;
        let attachments = vec![(CbType::BinaryAttachment, absent), (CbType::ObjectAttachment, object)];
        assert_eq!(
            content.missing_within(&ns, attachments, judging(0)).await.unwrap(),
            vec![IoHash::from_bytes(absent), IoHash::from_bytes(object)]
        );
    }

    /// A cycle is found by the objects being judged, not by a bound: an object naming itself
    /// is read once.
    #[tokio::test]
    async fn a_cycle_is_read_once() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let content = content(dir.path(), 1 << 30).await;
        let o = self_naming_object(&content, &ns);
        let mut resolver = judging(100);
        let present = content.present(&ns, CbType::ObjectAttachment, IoHash::from_bytes(o), 0, &mut resolver);
        assert!(!present.await.unwrap());
        assert_eq!(resolver.objects_left, 9, "one read of ten");
    }

    /// A read's check stops at the first attachment not present, and answers the same.
    #[tokio::test]
    async fn a_reads_check_stops_at_the_first_absent() {
        let dir = tempfile::tempdir().unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let content = content(dir.path(), 1 << 30).await;
        let (a, b) = (*IoHash::of(b"absent a").as_bytes(), *IoHash::of(b"absent b").as_bytes());
        let object = naming(CbType::BinaryAttachment, &[a, b]);
        assert!(!content.all_present(&ns, &object, 1 << 30).await.unwrap());
        let mut first = Resolver::new(1 << 30);
        first.first_only = true;
        let listed = content.missing_within(&ns, attachments_of(&object), first).await.unwrap();
        assert_eq!(listed, vec![IoHash::from_bytes(a)]);
        let present = store(&content, &ns, b"there").await;
        assert!(
            content.all_present(&ns, &naming(CbType::BinaryAttachment, &[present]), 1 << 30).await.unwrap()
        );
    }
}
