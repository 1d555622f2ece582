//! What garbage collection ([`crate::gc`]) asks of the metadata store: removing expired refs in
//! small batches, and reading, a page at a time, what the refs that remain name. Kept apart
//! from the request paths in `mod.rs`: nothing here runs on a request. Each backend runs these
//! as the methods of the same names.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::{Backend, MetaError, MetaStore, on_backend};
use crate::cb::CbType;
use crate::storage::attachment_hashes;
use crate::{IoHash, Name};

/// Where a page of refs ended: the last (bucket, key) read.
pub type RefCursor = (String, String);

/// One page of a namespace's refs, as the collector reads it.
#[derive(Debug, Default)]
pub struct RefPage {
    /// What the page's objects name, each as it is named (binary or object attachment).
    pub attachments: Vec<(CbType, IoHash)>,
    /// Where to start the next page; `None` after the last.
    pub next: Option<RefCursor>,
    refs: usize,
    bytes: usize,
}

impl RefPage {
    /// Adds what one stored object names; true once the page is full. Stored objects were
    /// parsed when they were put; one that no longer parses names nothing it can keep alive.
    pub(super) fn add(&mut self, object: &[u8]) -> bool {
        self.attachments.extend(attachment_hashes(object));
        self.refs += 1;
        self.bytes = self.bytes.saturating_add(object.len());
        self.refs == PAGE_REFS || self.bytes >= PAGE_BYTES
    }
}

/// Whether a blob the collector removed is still gone: the check
/// [`MetaStore::forget_content_of`] makes with the blob's content ids locked.
#[derive(Clone)]
pub enum StillGone {
    /// A quick look (a local file's absence), made in the write itself.
    Looked(Arc<dyn Fn(&IoHash) -> bool + Send + Sync>),
    /// A request (a HEAD to the bucket), made beside the write.
    Asked(Arc<dyn Fn(IoHash) -> BoxFuture<'static, bool> + Send + Sync>),
}

/// A page stops after this many refs or after the object that passes [`PAGE_BYTES`], so that
/// a connection (shared with requests) is held briefly.
pub(super) const PAGE_REFS: usize = 256;
pub(super) const PAGE_BYTES: usize = 4 << 20;

/// Rows one write transaction of the collector removes at most.
pub const EXPIRE_BATCH: usize = 1000;

impl MetaStore {
    /// Removes at most `limit` refs: finalized ones last read or written before `cut_ms`, and
    /// unfinalized ones before `unfinalized_cut_ms` (milliseconds since the Unix epoch).
    /// Returns how many. Call [`MetaStore::flush_access`] first, so recent reads count.
    pub async fn expire_refs(
        &self,
        cut_ms: i64,
        unfinalized_cut_ms: i64,
        limit: usize,
    ) -> Result<usize, MetaError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        on_backend!(self, expire_refs(cut_ms, unfinalized_cut_ms, limit))
    }

    /// The attachments named by one page of `ns`'s refs, in key order after `after` (from the
    /// start if `None`), read along the primary key.
    pub async fn ref_attachments(&self, ns: &Name, after: Option<RefCursor>) -> Result<RefPage, MetaError> {
        on_backend!(self, ref_attachments(ns.as_str().to_owned(), after))
    }

    /// The refs of `ns` written (or read, once flushed) at or after `since_ms`, found through
    /// the (finalized, last_access) index without reading their objects.
    pub async fn refs_since(&self, ns: &Name, since_ms: i64) -> Result<Vec<RefCursor>, MetaError> {
        on_backend!(self, refs_since(ns.as_str().to_owned(), since_ms))
    }

    /// The attachments named by the refs `keys` of `ns` (those still there).
    pub async fn attachments_of_refs(
        &self,
        ns: &Name,
        keys: Vec<RefCursor>,
    ) -> Result<Vec<(CbType, IoHash)>, MetaError> {
        on_backend!(self, attachments_of_refs(ns.as_str().to_owned(), keys))
    }

    /// The blobs holding the compressed buffers whose raw hashes are `raws` (those stored).
    pub async fn content_blobs(&self, ns: &Name, raws: Vec<IoHash>) -> Result<Vec<IoHash>, MetaError> {
        on_backend!(self, content_blobs(ns.as_str().to_owned(), raws))
    }

    /// Forgets the content ids that name the blobs `gone` (removed by the collector), each
    /// only if `still_gone` says the blob is still absent, asked while its content ids are
    /// locked: an upload of the same buffer since wrote the blob again, and writes its content
    /// id after this write. How many were forgotten.
    pub async fn forget_content_of(
        &self,
        ns: &Name,
        gone: Vec<IoHash>,
        still_gone: StillGone,
    ) -> Result<usize, MetaError> {
        if gone.is_empty() {
            return Ok(0);
        }
        on_backend!(self, forget_content_of(ns.as_str().to_owned(), gone, still_gone))
    }
}

#[cfg(test)]
impl MetaStore {
    /// Sets every ref's last access to `at_ms`, for tests of expiry (writes stamp the time
    /// they commit).
    pub(crate) async fn age_all_refs(&self, at_ms: i64) -> Result<usize, MetaError> {
        on_backend!(self, age_all_refs(at_ms))
    }
}
