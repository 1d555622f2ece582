//! What garbage collection ([`crate::gc`]) asks of the blob store, and what keeps it from
//! removing a blob in use: listing a namespace's blobs one directory at a time, removing one
//! only if it is still old (taking it out of place first, and putting it back if it was written
//! meanwhile), and marking as written now the blobs that uploads and presence checks rely on.

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use tokio::fs;

use super::{LocalBlobs, Settling, TMP, place, sync_dir};
use crate::{IoHash, Name};

/// Marks the file at `path` as written now: one `utimensat` on the path itself, not through
/// a handle, so that a blob renamed out of place meanwhile is not marked (it is gone: false).
/// `UTIME_NOW` needs only write access, not ownership.
async fn mark_written(path: PathBuf) -> io::Result<bool> {
    let marked = tokio::task::spawn_blocking(move || -> io::Result<()> {
        let path =
            std::ffi::CString::new(path.into_os_string().into_encoded_bytes()).map_err(io::Error::other)?;
        let now = [
            libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
            libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
        ];
        // SAFETY: `path` is a NUL-terminated string and `now` two timespecs, both alive for the
        // call; utimensat reads them and keeps neither.
        if unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), now.as_ptr(), 0) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    })
    .await
    .map_err(io::Error::other)?;
    match marked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// A mark that failed (a read-only store, no write access) has been logged.
static MARK_FAILED_LOGGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Where a blob taken out of place by [`LocalBlobs::delete_older`] belongs, from its name in the
/// temp directory (`<n>.gc.<namespace>.<id>`); `None` for any other temp file.
pub(super) fn taken_place(root: &Path, name: &OsStr) -> Option<PathBuf> {
    let (_, rest) = name.to_str()?.split_once(".gc.")?;
    let (ns, id) = rest.rsplit_once('.')?;
    let (ns, id) = (ns.parse::<Name>().ok()?, id.parse::<IoHash>().ok()?);
    Some(place(root, &ns, &id))
}

impl LocalBlobs {
    /// From now on, a blob a presence check or a read finds (through [`LocalBlobs::exists`] or
    /// [`LocalBlobs::open_blob`]) that was last written more than `age` ago is marked as
    /// written now. Garbage collection sets it to half its grace at its first run, so that a
    /// blob a new ref relies on is never old enough to be swept.
    pub fn keep_fresh(&self, age: Duration) {
        let ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX).max(1);
        self.fresh_for_ms.store(ms, Ordering::Relaxed);
    }

    /// Marks the blob at `path` as written now if [`LocalBlobs::keep_fresh`] asks for it and it
    /// is older; false if it is gone. Failing to mark it (a read-only store, no write access)
    /// is not an error, since the blob is there, but it is logged once: a sweep may then
    /// remove a blob a new ref relies on.
    pub(super) async fn freshen(&self, path: &Path, meta: &std::fs::Metadata) -> io::Result<bool> {
        let ms = self.fresh_for_ms.load(Ordering::Relaxed);
        let Ok(modified) = meta.modified() else { return Ok(true) };
        if ms == 0 || modified + Duration::from_millis(ms) > SystemTime::now() {
            return Ok(true);
        }
        match mark_written(path.to_owned()).await {
            Ok(present) => Ok(present),
            Err(e) => {
                if !MARK_FAILED_LOGGED.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        error = %e,
                        path = %path.display(),
                        "could not mark a blob as written now (logged once); garbage collection may race new refs"
                    );
                }
                Ok(true)
            }
        }
    }

    /// The blobs under one of a namespace's 256 top directories (`<ns>/<aa>/`), with when each
    /// was last written. Files whose names are not blob ids are left out.
    pub async fn list_shard(&self, ns: &Name, shard: u8) -> io::Result<Vec<(IoHash, SystemTime)>> {
        let dir = self.root.join(ns.as_str()).join(format!("{shard:02x}"));
        tokio::task::spawn_blocking(move || {
            let mut found = Vec::new();
            let subdirs = match std::fs::read_dir(&dir) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(found),
                other => other?,
            };
            for subdir in subdirs.flatten() {
                let Ok(files) = std::fs::read_dir(subdir.path()) else { continue };
                for file in files.flatten() {
                    let Some(id) = file.file_name().to_str().and_then(|n| n.parse::<IoHash>().ok()) else {
                        continue;
                    };
                    if let Ok(modified) = file.metadata().and_then(|m| m.modified()) {
                        found.push((id, modified));
                    }
                }
            }
            Ok(found)
        })
        .await
        .map_err(io::Error::other)?
    }

    /// Whether a blob of `ns` the collection removed is still gone: its file is absent.
    pub(crate) fn still_gone(&self, ns: &Name) -> crate::meta::StillGone {
        let (root, ns) = (self.root.clone(), ns.clone());
        crate::meta::StillGone::Looked(std::sync::Arc::new(move |id| {
            !place(&root, &ns, id).try_exists().unwrap_or(true)
        }))
    }

    /// Removes a blob if it was last written before `before`; its size if it was removed.
    /// The blob is first renamed out of its place, then its time checked again: an upload that
    /// renamed a new copy into place (or marked this one as written) a moment before is put
    /// back, one a moment after is left alone, so a blob answered present is not removed by a
    /// check made before. A crash in between leaves it in the temp directory, under a name
    /// that the next start puts back.
    pub async fn delete_older(&self, ns: &Name, id: &IoHash, before: SystemTime) -> io::Result<Option<u64>> {
        let path = self.blob_path(ns, id);
        let meta = match fs::metadata(&path).await {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            other => other?,
        };
        if meta.modified()? >= before {
            return Ok(None);
        }
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let taken = self.root.join(TMP).join(format!(
            "{}-{n}.gc.{}.{}",
            std::process::id(),
            ns.as_str(),
            id.to_hex()
        ));
        match fs::rename(&path, &taken).await {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            other => other?,
        }
        let meta = fs::metadata(&taken).await?;
        if meta.modified()? >= before {
            // Written again meanwhile: back in place (over any copy written since, which holds
            // the same bytes), settling until durable as an upload's rename is. Its namespace
            // deleted meanwhile, it goes with it.
            let _settling = Settling::start(&self.settling, &path);
            match fs::rename(&taken, &path).await {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    let _ = fs::remove_file(&taken).await;
                    return Ok(None);
                }
                other => other?,
            }
            sync_dir(path.parent().expect("blob paths have a parent")).await?;
            return Ok(None);
        }
        fs::remove_file(&taken).await?;
        self.usage.forget(1, meta.len());
        Ok(Some(meta.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_blob_knows_its_place() {
        let root = Path::new("/store");
        let id = IoHash::of(b"x");
        let name = format!("12-3.gc.ue.ddc.{}", id.to_hex());
        assert_eq!(taken_place(root, OsStr::new(&name)), Some(place(root, &"ue.ddc".parse().unwrap(), &id)));
        assert_eq!(taken_place(root, OsStr::new("12-3")), None, "an upload's temp file");
        assert_eq!(taken_place(root, OsStr::new("12-3.gc.ue.ddc.nothex")), None);
    }
}
