//! CB packages (`application/x-ue-cbpkg`, compact-binary.md section 11.1): a ref's object and
//! its attachments in one body. A little-endian header and entry table, then the payloads.
//! Reading checks everything the table claims that can be checked without decompressing:
//! sizes, flags, the root object (valid, and hashing to its entry's hash), raw and object
//! attachments' hashes. Compressed attachments are checked by the compressed-buffer codec.

use super::{CbError, parse};
use crate::IoHash;

const MAGIC: u32 = 0xaa77_aacc;
const HEADER: usize = 16;
const ENTRY: usize = 32;

/// What an entry's payload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryFlags(pub u32);

impl EntryFlags {
    pub const RAW: EntryFlags = EntryFlags(0);
    pub const COMPRESSED: EntryFlags = EntryFlags(1);
    pub const OBJECT: EntryFlags = EntryFlags(2);
    pub const ERROR: EntryFlags = EntryFlags(4);

    pub fn contains(self, other: EntryFlags) -> bool {
        self.0 & other.0 == other.0 && other.0 != 0
    }
}

/// One entry: its hash (raw hash for a compressed payload, object hash for an object, content
/// hash for raw bytes), flags and payload, borrowed from the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    pub hash: [u8; 20],
    pub flags: EntryFlags,
    pub payload: &'a [u8],
}

/// A read package: entry 0 is the root object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package<'a> {
    pub root: Entry<'a>,
    pub attachments: Vec<Entry<'a>>,
}

/// Why a body is not a valid package.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackageError {
    #[error("the package ends early")]
    Truncated,
    #[error("not a package (magic {0:#010x})")]
    Magic(u32),
    #[error("{0} bytes follow the last payload")]
    TrailingBytes(usize),
    #[error("the header's reserved bytes are not zero")]
    Reserved,
    #[error("the first entry must be the root object (flags {0:#x})")]
    Root(u32),
    #[error("entry {index} does not hash to its declared hash")]
    HashMismatch { index: usize },
    #[error("entry {index} is not a valid object: {source}")]
    Object { index: usize, source: CbError },
    #[error("entry {index} has unknown flags {flags:#x}")]
    Flags { index: usize, flags: u32 },
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, PackageError> {
    Ok(u32::from_le_bytes(b.get(at..at + 4).ok_or(PackageError::Truncated)?.try_into().expect("4 bytes")))
}

impl<'a> Package<'a> {
    /// Reads and checks a package body.
    pub fn parse(body: &'a [u8]) -> Result<Package<'a>, PackageError> {
        let magic = u32_at(body, 0)?;
        if magic != MAGIC {
            return Err(PackageError::Magic(magic));
        }
        let count = u32_at(body, 4)? as usize + 1;
        if body.get(8..16).ok_or(PackageError::Truncated)? != [0; 8] {
            return Err(PackageError::Reserved);
        }
        let table_end =
            count.checked_mul(ENTRY).and_then(|t| t.checked_add(HEADER)).ok_or(PackageError::Truncated)?;
        let table = body.get(HEADER..table_end).ok_or(PackageError::Truncated)?;
        let mut at = table_end;
        let mut entries = Vec::with_capacity(count.min(1024));
        for (index, raw) in table.chunks_exact(ENTRY).enumerate() {
            let size = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes"));
            let flags = EntryFlags(u32::from_le_bytes(raw[8..12].try_into().expect("4 bytes")));
            if flags.0 & !7 != 0 {
                return Err(PackageError::Flags { index, flags: flags.0 });
            }
            let hash: [u8; 20] = raw[12..32].try_into().expect("20 bytes");
            let end =
                usize::try_from(size).ok().and_then(|s| at.checked_add(s)).ok_or(PackageError::Truncated)?;
            let payload = body.get(at..end).ok_or(PackageError::Truncated)?;
            at = end;
            let entry = Entry { hash, flags, payload };
            check(index, &entry)?;
            entries.push(entry);
        }
        if at != body.len() {
            return Err(PackageError::TrailingBytes(body.len() - at));
        }
        let root = entries.remove(0);
        if !root.flags.contains(EntryFlags::OBJECT)
            || root.flags.contains(EntryFlags::COMPRESSED)
            || root.flags.contains(EntryFlags::ERROR)
        {
            return Err(PackageError::Root(root.flags.0));
        }
        Ok(Package { root, attachments: entries })
    }

    /// The package's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let all: Vec<&Entry<'_>> = std::iter::once(&self.root).chain(&self.attachments).collect();
        let table: Vec<(u64, EntryFlags, [u8; 20])> =
            all.iter().map(|e| (e.payload.len() as u64, e.flags, e.hash)).collect();
        let mut out = table_bytes(&table);
        out.reserve(all.iter().map(|e| e.payload.len()).sum::<usize>());
        for e in &all {
            out.extend_from_slice(e.payload);
        }
        out
    }
}

/// What can be checked of one entry without decompressing it.
/// The header and entry table of a package whose entries (root first) have these payload
/// sizes, flags and hashes; the payloads follow it in the same order. For writers that stream
/// the payloads from files.
pub fn table_bytes(entries: &[(u64, EntryFlags, [u8; 20])]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + entries.len() * ENTRY);
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&(entries.len().saturating_sub(1) as u32).to_le_bytes());
    out.extend_from_slice(&[0; 8]);
    for (size, flags, hash) in entries {
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&flags.0.to_le_bytes());
        out.extend_from_slice(hash);
    }
    out
}

fn check(index: usize, entry: &Entry<'_>) -> Result<(), PackageError> {
    if entry.flags.contains(EntryFlags::COMPRESSED) {
        return Ok(());
    }
    if entry.flags.contains(EntryFlags::OBJECT) {
        parse(entry.payload).map_err(|source| PackageError::Object { index, source })?;
        if entry.flags.contains(EntryFlags::ERROR) {
            // An error object explains a missing attachment; its hash names the attachment.
            return Ok(());
        }
    }
    if IoHash::of(entry.payload).as_bytes() != &entry.hash {
        return Err(PackageError::HashMismatch { index });
    }
    Ok(())
}
