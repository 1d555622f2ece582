//! Blobs on the local filesystem (the default): one file per blob in a content-addressed tree,
//! `<root>/<namespace>/<aa>/<bb>/<hash>`.
//!
//! A write streams into a temp file under `<root>/.tmp`, hashing as it goes; the file is
//! fsynced, checked against the expected hash, renamed into place, and the directory fsynced.
//! So a crash at any moment leaves either no blob or the whole blob under its name, and a blob
//! whose bytes do not match its id is stored nowhere. Bodies are never held whole in memory.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::fs;
use tokio::io::{AsyncRead, AsyncWriteExt};

#[cfg(test)]
use super::CHUNK;
use super::{StoreError, TMP, TmpFile, Usage, copy_hashing, relative_place};
use crate::{IoHash, Name};

mod collect;

/// Blobs on the local filesystem.
#[derive(Debug)]
pub struct LocalBlobs {
    root: PathBuf,
    next_tmp: AtomicU64,
    usage: std::sync::Arc<Usage>,
    /// Blobs renamed into place whose directory is not yet fsynced, with how many writers
    /// are settling each: [`LocalBlobs::exists`] calls them absent, so nothing is acknowledged
    /// on the strength of a name a power loss could still undo.
    settling: std::sync::Mutex<std::collections::HashMap<PathBuf, usize>>,
    /// Blob directories this process has seen made durable (their names and their parents'
    /// fsynced): one that merely exists may be another writer's, created a moment ago and not
    /// yet synced. At most one per `<namespace>/aa/bb`.
    durable_dirs: std::sync::Mutex<std::collections::HashSet<PathBuf>>,
    /// While garbage collection runs (milliseconds; 0: it does not), a blob a presence check
    /// finds that was last written longer ago than this is marked as written now, so that a
    /// sweep under way keeps it ([`LocalBlobs::keep_fresh`]).
    fresh_for_ms: AtomicU64,
}

impl LocalBlobs {
    /// Opens (creating if needed) a store under `root`, and removes temp files a crash left.
    pub async fn open(root: impl Into<PathBuf>) -> io::Result<LocalBlobs> {
        let root = root.into();
        let tmp = root.join(TMP);
        fs::create_dir_all(&tmp).await?;
        let mut stale = fs::read_dir(&tmp).await?;
        while let Some(entry) = stale.next_entry().await? {
            // A blob garbage collection had taken out of place goes back: it may have been
            // written again a moment before (the next run decides again).
            if let Some(place) = collect::taken_place(&root, &entry.file_name())
                && !fs::try_exists(&place).await.unwrap_or(true)
                && fs::rename(entry.path(), &place).await.is_ok()
            {
                continue;
            }
            let _ = fs::remove_file(entry.path()).await;
        }
        let usage = std::sync::Arc::new(Usage::default());
        let (walk_root, walk_usage) = (root.clone(), usage.clone());
        tokio::task::spawn_blocking(move || {
            let (blobs, bytes) = walk(&walk_root);
            walk_usage.add(blobs, bytes);
            walk_usage.counted.store(true, Ordering::Relaxed);
        });
        Ok(LocalBlobs {
            root,
            next_tmp: AtomicU64::new(0),
            usage,
            settling: Default::default(),
            durable_dirs: Default::default(),
            fresh_for_ms: AtomicU64::new(0),
        })
    }

    /// The directory the blobs are under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Blobs and bytes stored.
    pub fn usage(&self) -> &Usage {
        &self.usage
    }

    /// Where blob `id` of `ns` is stored.
    pub fn blob_path(&self, ns: &Name, id: &IoHash) -> PathBuf {
        place(&self.root, ns, id)
    }

    /// Stores what `body` yields, at most `limit` bytes. With `expected`, the body must hash to
    /// it. Returns the blob's id and size.
    pub async fn put(
        &self,
        ns: &Name,
        expected: Option<IoHash>,
        mut body: impl AsyncRead + Unpin,
        limit: u64,
    ) -> Result<(IoHash, u64), StoreError> {
        let (tmp, file) = TmpFile::create(&self.root, &self.next_tmp).await?;
        let (actual, size) = write_tmp(file, &mut body, limit).await?;
        if let Some(expected) = expected
            && expected != actual
        {
            return Err(StoreError::HashMismatch { expected, actual });
        }
        let dest = self.blob_path(ns, &actual);
        let dir = dest.parent().expect("blob paths have a parent");
        self.create_dirs_durably(dir).await?;
        let new = !fs::try_exists(&dest).await.unwrap_or(false);
        let settled = {
            let _settling = Settling::start(&self.settling, &dest);
            if let Err(e) = fs::rename(tmp.path(), &dest).await {
                if e.kind() != io::ErrorKind::NotFound {
                    return Err(e.into());
                }
                // Its directory went with a namespace deleted meanwhile: made again, once.
                self.forget_namespace_of(dir);
                self.create_dirs_durably(dir).await?;
                fs::rename(tmp.path(), &dest).await?;
            }
            tmp.keep();
            sync_dir(dir).await
        };
        settled?;
        if new {
            self.usage.add(1, size);
        }
        Ok((actual, size))
    }

    /// The blob's file and size, if it is stored.
    pub async fn open_blob(&self, ns: &Name, id: &IoHash) -> io::Result<Option<(fs::File, u64)>> {
        self.open_marking(ns, id, true).await
    }

    /// [`LocalBlobs::open_blob`]; with `mark`, an old blob is marked as written now while
    /// garbage collection runs ([`LocalBlobs::keep_fresh`]). The collector's own reads do not.
    pub(crate) async fn open_marking(
        &self,
        ns: &Name,
        id: &IoHash,
        mark: bool,
    ) -> io::Result<Option<(fs::File, u64)>> {
        let path = self.blob_path(ns, id);
        match fs::File::open(&path).await {
            Ok(file) => {
                let meta = file.metadata().await?;
                if mark && !self.freshen(&path, &meta).await? {
                    return Ok(None); // Taken by garbage collection as it was opened.
                }
                Ok(Some((file, meta.len())))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A stored blob's size, if it is stored.
    pub async fn size(&self, ns: &Name, id: &IoHash) -> io::Result<Option<u64>> {
        match fs::metadata(self.blob_path(ns, id)).await {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether a blob is stored durably (one still settling counts as absent).
    pub async fn exists(&self, ns: &Name, id: &IoHash) -> io::Result<bool> {
        let path = self.blob_path(ns, id);
        let meta = match fs::metadata(&path).await {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            other => other?,
        };
        // After the look at the file: a writer marks its blob settling before its rename.
        if self.settling.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&path) {
            return Ok(false);
        }
        self.freshen(&path, &meta).await
    }

    /// Removes a blob; false if it was not there.
    pub async fn delete(&self, ns: &Name, id: &IoHash) -> io::Result<bool> {
        let path = self.blob_path(ns, id);
        let size = fs::metadata(&path).await.map(|m| m.len()).unwrap_or(0);
        match fs::remove_file(path).await {
            Ok(()) => {
                self.usage.forget(1, size);
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl LocalBlobs {
    /// Removes every blob of a namespace.
    pub async fn delete_namespace(&self, ns: &Name) -> io::Result<()> {
        let dir = self.root.join(ns.as_str());
        let walked = dir.clone();
        let (blobs, bytes) = tokio::task::spawn_blocking(move || walk(&walked)).await.unwrap_or((0, 0));
        self.usage.forget(blobs, bytes);
        self.forget_durable(&dir);
        match fs::remove_dir_all(dir).await {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// Writes what `body` yields (at most `limit` bytes) into the staged `file`, durably; its hash
/// and size.
async fn write_tmp(
    mut file: fs::File,
    body: &mut (impl AsyncRead + Unpin),
    limit: u64,
) -> Result<(IoHash, u64), StoreError> {
    let hashed = copy_hashing(body, &mut file, limit).await?;
    file.flush().await?;
    file.sync_all().await?;
    Ok(hashed)
}

/// The store's layout: `<root>/<namespace>/<aa>/<bb>/<hash>`.
fn place(root: &Path, ns: &Name, id: &IoHash) -> PathBuf {
    let mut path = root.to_owned();
    path.extend(relative_place(ns, id));
    path
}

/// Files and bytes under `dir`, skipping the store's own `.tmp` and `.meta`.
fn walk(dir: &Path) -> (u64, u64) {
    let mut stack = vec![dir.to_owned()];
    let (mut files, mut bytes) = (0, 0);
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            match entry.metadata() {
                Ok(m) if m.is_dir() => stack.push(entry.path()),
                Ok(m) => {
                    files += 1;
                    bytes += m.len();
                }
                Err(_) => {}
            }
        }
    }
    (files, bytes)
}

/// Marks a blob as settling for as long as it lives.
struct Settling<'a> {
    map: &'a std::sync::Mutex<std::collections::HashMap<PathBuf, usize>>,
    path: PathBuf,
}

impl<'a> Settling<'a> {
    fn start(
        map: &'a std::sync::Mutex<std::collections::HashMap<PathBuf, usize>>,
        path: &Path,
    ) -> Settling<'a> {
        *map.lock().unwrap_or_else(|p| p.into_inner()).entry(path.to_owned()).or_default() += 1;
        Settling { map, path: path.to_owned() }
    }
}

impl Drop for Settling<'_> {
    fn drop(&mut self) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.path) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.path);
            }
        }
    }
}

impl LocalBlobs {
    /// Creates blob directory `dir` (under the root) and any missing parents, and makes each
    /// one's name durable (its parent fsynced), so it is as durable as the blob put in it;
    /// whoever created them, once per directory per process.
    async fn create_dirs_durably(&self, dir: &Path) -> io::Result<()> {
        match self.create_dirs_once(dir).await {
            // A parent thought durable is gone.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.forget_namespace_of(dir);
                self.create_dirs_once(dir).await
            }
            done => done,
        }
    }

    /// Forgets the directories of blob directory `dir`'s namespace as durable: one of them was
    /// found gone (the namespace was deleted while a put marked them).
    fn forget_namespace_of(&self, dir: &Path) {
        if let Some(ns_dir) = dir.ancestors().take_while(|d| *d != self.root).last() {
            self.forget_durable(ns_dir);
        }
    }

    async fn create_dirs_once(&self, dir: &Path) -> io::Result<()> {
        let durable = |d: &Path| self.durable_dirs.lock().unwrap_or_else(|e| e.into_inner()).contains(d);
        if durable(dir) {
            return Ok(());
        }
        // From the namespace's directory down to `dir`.
        let mut chain: Vec<&Path> = dir.ancestors().take_while(|d| *d != self.root).collect();
        chain.reverse();
        for d in chain {
            if durable(d) {
                continue;
            }
            match fs::create_dir(d).await {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => sync_dir(d.parent().expect("under the root")).await?,
            }
            self.durable_dirs.lock().unwrap_or_else(|e| e.into_inner()).insert(d.to_owned());
        }
        Ok(())
    }

    /// Forgets that the directories under `dir` were made durable: they are being removed.
    fn forget_durable(&self, dir: &Path) {
        self.durable_dirs.lock().unwrap_or_else(|e| e.into_inner()).retain(|d| !d.starts_with(dir));
    }
}

/// Makes a rename durable: fsync the directory that holds the new name.
async fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir).await?.sync_all().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn store() -> (tempfile::TempDir, LocalBlobs) {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalBlobs::open(dir.path()).await.unwrap();
        (dir, store)
    }

    fn ns() -> Name {
        "ue.ddc".parse().unwrap()
    }

    async fn read_all(store: &LocalBlobs, id: &IoHash) -> Option<Vec<u8>> {
        let (mut file, size) = store.open_blob(&ns(), id).await.unwrap()?;
        let mut out = Vec::new();
        file.read_to_end(&mut out).await.unwrap();
        assert_eq!(out.len() as u64, size);
        Some(out)
    }

    fn tmp_is_empty(dir: &Path) -> bool {
        std::fs::read_dir(dir.join(TMP)).unwrap().next().is_none()
    }

    #[tokio::test]
    async fn stores_and_reads_back_by_content_hash() {
        let (dir, store) = store().await;
        let body = vec![7u8; 3 * CHUNK + 5];
        let (id, size) = store.put(&ns(), Some(IoHash::of(&body)), &body[..], u64::MAX).await.unwrap();
        assert_eq!((id, size), (IoHash::of(&body), body.len() as u64));
        assert_eq!(read_all(&store, &id).await.unwrap(), body);
        assert!(store.exists(&ns(), &id).await.unwrap());
        // Without an expected hash the store computes it.
        let (again, _) = store.put(&ns(), None, &body[..], u64::MAX).await.unwrap();
        assert_eq!(again, id);
        assert!(store.delete(&ns(), &id).await.unwrap());
        assert!(!store.delete(&ns(), &id).await.unwrap());
        assert!(read_all(&store, &id).await.is_none());
        assert!(tmp_is_empty(dir.path()));
    }

    #[tokio::test]
    async fn a_mismatched_or_oversized_body_is_stored_nowhere() {
        let (dir, store) = store().await;
        let wrong = IoHash::of(b"something else");
        let err = store.put(&ns(), Some(wrong), &b"the body"[..], u64::MAX).await.unwrap_err();
        assert!(matches!(err, StoreError::HashMismatch { .. }), "{err}");
        assert!(read_all(&store, &wrong).await.is_none());
        assert!(read_all(&store, &IoHash::of(b"the body")).await.is_none());
        let err = store.put(&ns(), None, &[0u8; 100][..], 99).await.unwrap_err();
        assert!(matches!(err, StoreError::TooLarge { limit: 99 }), "{err}");
        assert!(read_all(&store, &IoHash::of(&[0u8; 100])).await.is_none());
        assert!(tmp_is_empty(dir.path()), "no temp file left behind");
    }

    /// An upload whose task is dropped mid-body (hyper drops the handler when an HTTP/2 client
    /// resets its stream) leaves no temp file behind.
    #[tokio::test]
    async fn an_upload_dropped_mid_way_leaves_nothing() {
        let (dir, store) = store().await;
        // A body that sends one chunk, then never ends.
        let (mut tx, rx) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut tx, &[1u8; 64]).await.unwrap();
        let ns = ns();
        let put = store.put(&ns, None, rx, u64::MAX);
        assert!(tokio::time::timeout(std::time::Duration::from_millis(200), put).await.is_err());
        assert!(tmp_is_empty(dir.path()), "the dropped upload's temp file is gone");
        drop(tx);
    }

    /// A blob's directory is made durable once per process, and made again after its
    /// namespace is deleted, even if this process thought it durable (a put racing the delete).
    #[tokio::test]
    async fn a_namespace_deleted_under_a_known_directory_is_made_again() {
        let (_dir, store) = store().await;
        let (id, _) = store.put(&ns(), None, &b"one"[..], u64::MAX).await.unwrap();
        let blob_dir = store.blob_path(&ns(), &id).parent().unwrap().to_owned();
        assert!(store.durable_dirs.lock().unwrap().contains(&blob_dir));
        store.delete_namespace(&ns()).await.unwrap();
        assert!(!store.durable_dirs.lock().unwrap().contains(&blob_dir), "forgotten with it");
        // As if a put had marked them durable again between the forgetting and the removal.
        for d in blob_dir.ancestors().take(3) {
            store.durable_dirs.lock().unwrap().insert(d.to_owned());
        }
        assert!(!blob_dir.exists());
        let (again, _) = store.put(&ns(), None, &b"one"[..], u64::MAX).await.unwrap();
        assert_eq!(read_all(&store, &again).await.unwrap(), b"one");
        // The same with a blob in another directory under the stale parents.
        store.delete_namespace(&ns()).await.unwrap();
        for d in blob_dir.ancestors().take(3) {
            store.durable_dirs.lock().unwrap().insert(d.to_owned());
        }
        let other = (0u32..)
            .map(|i| i.to_be_bytes())
            .find(|b| store.blob_path(&ns(), &IoHash::of(b)).parent() != Some(blob_dir.as_path()));
        let other = other.unwrap();
        let (id, _) = store.put(&ns(), None, &other[..], u64::MAX).await.unwrap();
        assert_eq!(read_all(&store, &id).await.unwrap(), other);
    }

    #[tokio::test]
    async fn a_blob_still_settling_is_not_reported_present() {
        let (_dir, store) = store().await;
        let (id, _) = store.put(&ns(), None, &b"settled"[..], u64::MAX).await.unwrap();
        assert!(store.exists(&ns(), &id).await.unwrap());
        // Between its rename and its directory's fsync, a blob is not acknowledged by others.
        let settling = Settling::start(&store.settling, &store.blob_path(&ns(), &id));
        assert!(!store.exists(&ns(), &id).await.unwrap());
        let twice = Settling::start(&store.settling, &store.blob_path(&ns(), &id));
        drop(settling);
        assert!(!store.exists(&ns(), &id).await.unwrap(), "a second writer is still settling it");
        drop(twice);
        assert!(store.exists(&ns(), &id).await.unwrap());
    }

    #[tokio::test]
    async fn reopening_clears_what_a_crash_left_half_written() {
        let (dir, store) = store().await;
        let (id, _) = store.put(&ns(), None, &b"kept"[..], u64::MAX).await.unwrap();
        // A crash mid-write leaves a temp file, never a file under a blob's name.
        std::fs::write(dir.path().join(TMP).join("999-0"), b"half a blo").unwrap();
        drop(store);
        let store = LocalBlobs::open(dir.path()).await.unwrap();
        assert!(tmp_is_empty(dir.path()));
        assert_eq!(read_all(&store, &id).await.unwrap(), b"kept");
    }
}
