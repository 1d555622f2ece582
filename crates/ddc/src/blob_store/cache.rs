//! A bounded cache, on this server's disk, of blobs kept in S3: what makes a read of a blob
//! this server has seen a local file read instead of a round trip to the bucket (as Cloud DDC's
//! filesystem layer does in front of its object store).
//!
//! Blobs are content-addressed, so a cached copy is never stale: the bytes under a name never
//! change. What the cache can miss is a delete made through *another* server: this one keeps
//! serving its copy until it evicts it. Deletes through this server remove the copy first.
//!
//! Files live under `<root>/.cache/<namespace>/<aa>/<bb>/<hash>`. An upload's staged file is
//! renamed in once the bucket has it; a read that misses downloads the blob into a staged file
//! and renames it in. The least recently used blobs go when the cache passes its size; a file
//! being read when it goes is read to its end (its name goes, not its bytes). At open, what is
//! on disk is indexed again, oldest first by modification time.

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::fs;

use super::relative_place;
use crate::{IoHash, Name};

const DIR: &str = ".cache";
/// The largest blob a read that misses downloads into the cache before answering; a larger
/// one streams from the bucket (and is cached only by an upload through this server).
pub const FILL_MAX: u64 = 64 << 20;
/// What a cached blob is charged at the least: a file takes a block on disk however small.
const BLOCK: u64 = 4096;
/// The most blobs cached, whatever their size: each costs memory in the index (about 150
/// bytes) and an inode.
const MAX_ENTRIES: usize = 1 << 20;

type Key = (Name, IoHash);

/// The cache's index: each blob's size, least recently used first.
struct Index {
    entries: lru::LruCache<Key, Entry>,
    /// What the entries are charged: each its size, at least a block.
    bytes: u64,
}

/// One cached blob: its size, and which taking of it this is (a read that finds the file gone
/// forgets the entry only if no other taking replaced it meanwhile).
#[derive(Clone, Copy)]
struct Entry {
    size: u64,
    taking: u64,
}

/// Takings, counted, for [`Entry::taking`].
static TAKINGS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What a blob of `size` bytes is charged.
fn charge(size: u64) -> u64 {
    size.max(BLOCK)
}

pub(super) struct DiskCache {
    dir: PathBuf,
    /// The most bytes kept.
    limit: u64,
    index: Mutex<Index>,
    /// Blobs being downloaded into the cache: one download per blob at a time.
    filling: Mutex<HashSet<Key>>,
}

impl std::fmt::Debug for DiskCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskCache").field("dir", &self.dir).field("limit", &self.limit).finish()
    }
}

impl DiskCache {
    /// The cache under `root`, holding at most `limit` bytes, with what is already on disk.
    pub(super) async fn open(root: &Path, limit: u64) -> io::Result<DiskCache> {
        let dir = root.join(DIR);
        fs::create_dir_all(&dir).await?;
        let walked = dir.clone();
        let mut found = tokio::task::spawn_blocking(move || list(&walked)).await.map_err(io::Error::other)?;
        found.sort_by_key(|(_, _, modified)| *modified);
        let cache = DiskCache {
            dir,
            limit,
            index: Mutex::new(Index { entries: lru::LruCache::unbounded(), bytes: 0 }),
            filling: Mutex::default(),
        };
        let mut evicted = Vec::new();
        for (key, size, _) in found {
            evicted.extend(cache.note(key, size));
        }
        cache.remove_files(evicted).await;
        Ok(cache)
    }

    /// Removes the cache under `root`, if one was left there.
    pub(super) async fn remove_all(root: &Path) -> io::Result<()> {
        match fs::remove_dir_all(root.join(DIR)).await {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    fn path(&self, ns: &Name, id: &IoHash) -> PathBuf {
        let mut path = self.dir.clone();
        path.extend(relative_place(ns, id));
        path
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cached blob, opened, and its size (and it is now the most recently used).
    pub(super) async fn open_blob(&self, ns: &Name, id: &IoHash) -> io::Result<Option<(fs::File, u64)>> {
        let key = (ns.clone(), *id);
        let Some(entry) = self.lock().entries.get(&key).copied() else { return Ok(None) };
        match fs::File::open(self.path(ns, id)).await {
            Ok(file) => Ok(Some((file, entry.size))),
            // Evicted meanwhile, or removed by hand: forgotten, unless taken again since.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let mut index = self.lock();
                if index.entries.peek(&key).is_some_and(|now| now.taking == entry.taking) {
                    index.entries.pop(&key);
                    index.bytes -= charge(entry.size);
                }
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The cached blob's size, if it is cached.
    pub(super) fn size(&self, ns: &Name, id: &IoHash) -> Option<u64> {
        self.lock().entries.get(&(ns.clone(), *id)).map(|e| e.size)
    }

    /// Moves the complete file `staged` (blob `id` of `ns`, `size` bytes) into the cache, or
    /// leaves it where it is if the cache could not hold it. True if it moved.
    pub(super) async fn take(&self, ns: &Name, id: &IoHash, staged: &Path, size: u64) -> bool {
        if charge(size) > self.limit {
            return false;
        }
        let path = self.path(ns, id);
        let dir = path.parent().expect("cache paths have a parent");
        if fs::create_dir_all(dir).await.is_err() || fs::rename(staged, &path).await.is_err() {
            return false;
        }
        let evicted = self.note((ns.clone(), *id), size);
        self.remove_files(evicted).await;
        true
    }

    /// Indexes a blob now on disk; the blobs evicted to make room.
    fn note(&self, key: Key, size: u64) -> Vec<Key> {
        let mut index = self.lock();
        let taking = TAKINGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(old) = index.entries.put(key, Entry { size, taking }) {
            index.bytes -= charge(old.size);
        }
        index.bytes += charge(size);
        let mut evicted = Vec::new();
        while index.bytes > self.limit || index.entries.len() > MAX_ENTRIES {
            let Some((key, old)) = index.entries.pop_lru() else { break };
            index.bytes -= charge(old.size);
            evicted.push(key);
        }
        evicted
    }

    fn forget(&self, key: &Key) {
        let mut index = self.lock();
        if let Some(old) = index.entries.pop(key) {
            index.bytes -= charge(old.size);
        }
    }

    async fn remove_files(&self, keys: Vec<Key>) {
        for (ns, id) in keys {
            let _ = fs::remove_file(self.path(&ns, &id)).await;
        }
    }

    /// Removes a blob from the cache.
    pub(super) async fn remove(&self, ns: &Name, id: &IoHash) {
        let key = (ns.clone(), *id);
        self.forget(&key);
        self.remove_files(vec![key]).await;
    }

    /// Removes every blob of a namespace from the cache.
    pub(super) async fn remove_namespace(&self, ns: &Name) -> io::Result<()> {
        {
            let mut index = self.lock();
            let gone: Vec<Key> =
                index.entries.iter().filter(|(k, _)| &k.0 == ns).map(|(k, _)| k.clone()).collect();
            for key in gone {
                if let Some(old) = index.entries.pop(&key) {
                    index.bytes -= charge(old.size);
                }
            }
        }
        match fs::remove_dir_all(self.dir.join(ns.as_str())).await {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Marks blob `id` of `ns` as being downloaded into the cache; `None` if it already is.
    pub(super) fn start_fill(self: &Arc<Self>, ns: &Name, id: &IoHash) -> Option<Filling> {
        let key = (ns.clone(), *id);
        let mut filling = self.filling.lock().unwrap_or_else(|p| p.into_inner());
        filling.insert(key.clone()).then(|| Filling { cache: self.clone(), key })
    }

    /// Whether a blob of `size` bytes is worth downloading into the cache before it is read.
    pub(super) fn fills(&self, size: u64) -> bool {
        size <= self.limit.min(FILL_MAX)
    }

    /// Bytes and blobs held.
    #[cfg(test)]
    pub(super) fn held(&self) -> (u64, usize) {
        let index = self.lock();
        (index.bytes, index.entries.len())
    }
}

/// A download into the cache under way; ends when dropped.
pub(super) struct Filling {
    cache: Arc<DiskCache>,
    key: Key,
}

impl Drop for Filling {
    fn drop(&mut self) {
        self.cache.filling.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.key);
    }
}

/// The blobs under the cache's directory: key, size, and when each was last written.
fn list(dir: &Path) -> Vec<(Key, u64, std::time::SystemTime)> {
    let mut found = Vec::new();
    let Ok(namespaces) = std::fs::read_dir(dir) else { return found };
    for ns_entry in namespaces.flatten() {
        let Some(ns) = ns_entry.file_name().to_str().and_then(|n| n.parse::<Name>().ok()) else { continue };
        let mut stack = vec![ns_entry.path()];
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else { continue };
            for entry in entries.flatten() {
                let Ok(meta) = entry.metadata() else { continue };
                if meta.is_dir() {
                    stack.push(entry.path());
                } else if let Some(id) = entry.file_name().to_str().and_then(|n| n.parse::<IoHash>().ok()) {
                    let modified = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
                    found.push(((ns.clone(), id), meta.len(), modified));
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns() -> Name {
        "ue.ddc".parse().unwrap()
    }

    /// Stages `bytes` as a file and moves it into the cache as blob `IoHash::of(bytes)`.
    async fn add(cache: &DiskCache, root: &Path, bytes: &[u8]) -> IoHash {
        let id = IoHash::of(bytes);
        let staged = root.join(format!("staged-{id}"));
        std::fs::write(&staged, bytes).unwrap();
        assert!(cache.take(&ns(), &id, &staged, bytes.len() as u64).await);
        id
    }

    /// The least recently used blobs go first when the cache passes its size, files and all;
    /// a blob larger than the whole cache is not taken.
    #[tokio::test]
    async fn the_least_recently_used_go_first() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(dir.path(), 12_500).await.unwrap();
        let a = add(&cache, dir.path(), &[1; 5000]).await;
        let b = add(&cache, dir.path(), &[2; 5000]).await;
        assert!(cache.open_blob(&ns(), &a).await.unwrap().is_some(), "a is now the most recent");
        let c = add(&cache, dir.path(), &[3; 5000]).await;
        assert_eq!(cache.held(), (10_000, 2));
        assert_eq!(cache.size(&ns(), &b), None, "b was the least recently used");
        assert!(!cache.path(&ns(), &b).exists(), "and its file is gone");
        assert_eq!((cache.size(&ns(), &a), cache.size(&ns(), &c)), (Some(5000), Some(5000)));
        let big = dir.path().join("big");
        std::fs::write(&big, [4; 12_501]).unwrap();
        assert!(!cache.take(&ns(), &IoHash::of(&[4; 12_501]), &big, 12_501).await);
        assert!(big.exists(), "left where it was");
        cache.remove(&ns(), &a).await;
        assert_eq!(cache.held(), (5000, 1));
        assert!(!cache.path(&ns(), &a).exists());
        // A small blob is charged a block: three of 10 bytes fit in 12,500, not a thousand.
        cache.remove(&ns(), &c).await;
        for i in 0..4u8 {
            add(&cache, dir.path(), &[i; 10]).await;
        }
        assert_eq!(cache.held(), (3 * 4096, 3));
    }

    /// What is on disk is indexed again at open, oldest first, within the size given then;
    /// a namespace goes whole.
    #[tokio::test]
    async fn a_reopened_cache_knows_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(dir.path(), 100_000).await.unwrap();
        let old = add(&cache, dir.path(), &[1; 5000]).await;
        let past = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(cache.path(&ns(), &old))
            .unwrap()
            .set_modified(past)
            .unwrap();
        let new = add(&cache, dir.path(), &[2; 5000]).await;
        drop(cache);
        let cache = DiskCache::open(dir.path(), 7_500).await.unwrap();
        assert_eq!(cache.held(), (5000, 1), "only one fits now");
        assert_eq!((cache.size(&ns(), &old), cache.size(&ns(), &new)), (None, Some(5000)), "the older went");
        assert!(!cache.path(&ns(), &old).exists());
        cache.remove_namespace(&ns()).await.unwrap();
        assert_eq!(cache.held(), (0, 0));
        assert!(cache.open_blob(&ns(), &new).await.unwrap().is_none());
    }

    /// Takes, removes, opens and evictions racing on a few blobs from several threads leave the
    /// index's bytes equal to its entries' charges and within the limit, and every file on
    /// disk known to the index (an unindexed file would outlive its delete and be taken back
    /// at the next start; this check sees only what the last operations left).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_takes_and_removes_leave_no_unknown_file() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Arc::new(DiskCache::open(dir.path(), 3 * 4096).await.unwrap());
        let blobs: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 100]).collect();
        let mut tasks = Vec::new();
        for t in 0..8usize {
            let (cache, root, blobs) = (cache.clone(), dir.path().to_owned(), blobs.clone());
            tasks.push(tokio::spawn(async move {
                for step in 0..500usize {
                    let bytes = &blobs[(t * 7 + step * 3) % blobs.len()];
                    let id = IoHash::of(bytes);
                    match (t + step) % 3 {
                        0 => {
                            let staged = root.join(format!("staged-{t}-{step}"));
                            std::fs::write(&staged, bytes).unwrap();
                            if !cache.take(&ns(), &id, &staged, bytes.len() as u64).await {
                                let _ = std::fs::remove_file(&staged);
                            }
                        }
                        1 => cache.remove(&ns(), &id).await,
                        _ => {
                            let _ = cache.open_blob(&ns(), &id).await.unwrap();
                        }
                    }
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let on_disk = list(&cache.dir);
        let index = cache.lock();
        for ((ns, id), _, _) in &on_disk {
            assert!(index.entries.contains(&(ns.clone(), *id)), "a file the index does not know: {id}");
        }
        let charged: u64 = index.entries.iter().map(|(_, e)| charge(e.size)).sum();
        assert_eq!(index.bytes, charged);
        assert!(index.bytes <= cache.limit);
    }

    /// One download per blob at a time.
    #[test]
    fn a_blob_fills_once_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let cache = Arc::new(rt.block_on(DiskCache::open(dir.path(), 1000)).unwrap());
        let id = IoHash::of(b"x");
        let first = cache.start_fill(&ns(), &id);
        assert!(first.is_some());
        assert!(cache.start_fill(&ns(), &id).is_none());
        drop(first);
        assert!(cache.start_fill(&ns(), &id).is_some());
    }
}
