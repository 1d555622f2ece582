//! Compressed buffers (`application/x-ue-comp`, compressed-buffer.md): how the editor uploads
//! cache values. A 64-byte big-endian header (magic, CRC, method, sizes, the raw payload's
//! hash), a block-size table, the blocks. [`check`] does every structural check of the spec's
//! section 5 without decompressing; [`decode`] also decompresses (None and LZ4, and blocks
//! stored raw under any method) and checks the payload against the header's raw hash. Oodle
//! blocks cannot be decoded here: [`decode`] says so, and the caller may store the buffer as
//! "payload unverified", as the spec allows.

use crate::IoHash;

const MAGIC: u32 = 0xb775_6362;
const HEADER: usize = 64;

/// How the blocks are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    None,
    Oodle,
    Lz4,
}

impl Method {
    /// The method a header's byte names.
    fn of(byte: u8) -> Result<Method, CompressedError> {
        match byte {
            0 => Ok(Method::None),
            3 => Ok(Method::Oodle),
            4 => Ok(Method::Lz4),
            m => Err(CompressedError::Method(m)),
        }
    }
}

/// The raw size of block `i` of a payload of `total_raw_size` bytes in blocks of `block`:
/// `block`, but the last may be shorter (0 past the end).
fn raw_block_len(block: u64, total_raw_size: u64, i: u64) -> u64 {
    block.min(total_raw_size.saturating_sub(i.saturating_mul(block)))
}

/// A checked header and block table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub method: Method,
    pub compressor: u8,
    pub level: i8,
    pub block_size_exponent: u8,
    pub total_raw_size: u64,
    pub total_compressed_size: u64,
    /// The significant 20 bytes of the raw hash: the content id.
    pub raw_hash: IoHash,
    /// Stored size of each block (empty for method None).
    pub block_sizes: Vec<u32>,
}

/// Why a body is not a valid compressed buffer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompressedError {
    #[error("shorter than its header")]
    Truncated,
    #[error("bad magic {0:#010x}")]
    Magic(u32),
    #[error("unknown compression method {0}")]
    Method(u8),
    #[error("header CRC {found:#010x}, expected {expected:#010x}")]
    Crc { found: u32, expected: u32 },
    #[error("declared size {declared} does not match the body's {actual} bytes")]
    Size { declared: u64, actual: usize },
    #[error("the block table does not match the sizes: {0}")]
    Blocks(&'static str),
    #[error("block {0} does not decompress to its size")]
    Block(usize),
    #[error("the payload does not hash to the header's raw hash")]
    RawHash,
    #[error("Oodle-compressed blocks cannot be decoded by this server")]
    Oodle,
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("in the checked header"))
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("in the checked header"))
}

/// Every check of the spec's section 5 that needs no decompression: magic, method, CRC, sizes
/// (the body must be exactly `TotalCompressedSize` long), block count and table.
pub fn check(body: &[u8]) -> Result<Header, CompressedError> {
    if body.len() < HEADER {
        return Err(CompressedError::Truncated);
    }
    let magic = be32(body, 0);
    if magic != MAGIC {
        return Err(CompressedError::Magic(magic));
    }
    let method = Method::of(body[8])?;
    let exp = body[11];
    let block_count = be32(body, 12) as usize;
    let total_raw_size = be64(body, 16);
    let total_compressed_size = be64(body, 24);
    let table_len = if method == Method::None {
        0
    } else {
        block_count.checked_mul(4).ok_or(CompressedError::Truncated)?
    };
    let header_end = HEADER.checked_add(table_len).ok_or(CompressedError::Truncated)?;
    let header = body.get(..header_end).ok_or(CompressedError::Truncated)?;
    let expected = be32(body, 4);
    let found = crc32fast::hash(&header[8..]);
    if found != expected {
        return Err(CompressedError::Crc { found, expected });
    }
    if total_compressed_size != body.len() as u64 {
        return Err(CompressedError::Size { declared: total_compressed_size, actual: body.len() });
    }
    let block_sizes: Vec<u32> = header[HEADER..].chunks_exact(4).map(|c| be32(c, 0)).collect();
    match method {
        Method::None => {
            if block_count != 1 || Some(total_compressed_size) != total_raw_size.checked_add(HEADER as u64) {
                return Err(CompressedError::Blocks("method None holds one block of the raw size"));
            }
        }
        _ => {
            if exp > 31 {
                return Err(CompressedError::Blocks("block size exponent above 31"));
            }
            let block = 1u64 << exp;
            if block_count == 0 || block_count as u64 != total_raw_size.div_ceil(block) {
                return Err(CompressedError::Blocks("block count does not cover the raw size"));
            }
            let stored: u64 = block_sizes.iter().map(|&s| u64::from(s)).sum();
            if header_end as u64 + stored != total_compressed_size {
                return Err(CompressedError::Blocks("stored sizes do not add up to the body"));
            }
            for (i, &s) in block_sizes.iter().enumerate() {
                let raw = raw_block_len(block, total_raw_size, i as u64);
                if u64::from(s) > raw || (s == 0 && raw > 0) {
                    return Err(CompressedError::Blocks(
                        "a block's stored size is zero or above its raw size",
                    ));
                }
            }
        }
    }
    let raw_hash = IoHash::from_bytes(body[32..52].try_into().expect("20 bytes"));
    Ok(Header {
        method,
        compressor: body[9],
        level: body[10] as i8,
        block_size_exponent: exp,
        total_raw_size,
        total_compressed_size,
        raw_hash,
        block_sizes,
    })
}

impl Header {
    /// The memory [`verify`] needs besides the buffer: one LZ4 block's raw bytes, as the
    /// largest block's raw size (0 for method None, whose payload is read in place, and for
    /// Oodle, whose compressed blocks are not decoded).
    pub fn scratch_len(&self) -> u64 {
        match self.method {
            Method::Lz4 => (1u64 << self.block_size_exponent.min(63)).min(self.total_raw_size),
            Method::None | Method::Oodle => 0,
        }
    }
}

/// What a stored buffer's header says of its blocks, to tell whether its payload was checked
/// when it was stored without reading it again: only an Oodle buffer can hold blocks this server
/// cannot decode (those not stored raw). Read from a buffer that passed [`check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockTable {
    oodle: bool,
    blocks: u64,
    block: u64,
    total_raw_size: u64,
}

impl BlockTable {
    /// Bytes of the header it is read from.
    pub const HEADER: usize = HEADER;

    /// The table the header describes.
    pub fn of(header: &[u8; HEADER]) -> BlockTable {
        BlockTable {
            oodle: Method::of(header[8]) == Ok(Method::Oodle),
            blocks: u64::from(be32(header, 12)),
            block: 1u64 << header[11].min(63),
            total_raw_size: be64(header, 16),
        }
    }

    /// Bytes of the block table that follows the header and must be read to judge the
    /// blocks: none unless the method is Oodle.
    pub fn table_len(&self) -> u64 {
        if self.oodle { 4 * self.blocks } else { 0 }
    }

    /// Whether block `i`, stored in `stored` bytes, cannot be decoded here: an Oodle block
    /// smaller than its raw size.
    pub fn undecodable(&self, i: u64, stored: u32) -> bool {
        let raw = raw_block_len(self.block, self.total_raw_size, i);
        self.oodle && u64::from(stored) < raw
    }
}

/// [`check`], then the payload: every block decompressed (or copied when stored raw) into
/// the hasher, one block at a time, and the hash compared with the header's raw hash. `Oodle`
/// if an Oodle-compressed block is met. Memory: one block (at most `2^exponent`, and at most
/// 255 times the block's stored size, the most LZ4 can expand).
pub fn verify(body: &[u8]) -> Result<Header, CompressedError> {
    let header = check(body)?;
    let mut hasher = blake3::Hasher::new();
    for_each_block(body, &header, |block| {
        hasher.update(block);
    })?;
    if IoHash::from_hasher(&hasher) != header.raw_hash {
        return Err(CompressedError::RawHash);
    }
    Ok(header)
}

/// [`verify`], keeping the payload. Memory: the payload, allocated at `TotalRawSize` at once
/// (the caller bounds it first; and never past what the body could expand to, 255 times its
/// bytes and 64 per block, so a small body that claims a large payload fails before it takes
/// that much), and one block ([`Header::scratch_len`]).
pub fn decode(body: &[u8]) -> Result<(Header, Vec<u8>), CompressedError> {
    let header = check(body)?;
    let raw_len = usize::try_from(header.total_raw_size).map_err(|_| CompressedError::Truncated)?;
    let most = body.len().saturating_mul(255).saturating_add(64 * header.block_sizes.len());
    let mut payload = Vec::with_capacity(raw_len.min(most));
    for_each_block(body, &header, |block| payload.extend_from_slice(block))?;
    if IoHash::of(&payload) != header.raw_hash {
        return Err(CompressedError::RawHash);
    }
    Ok((header, payload))
}

/// A buffer of method None holding `raw`: what the engine writes when compressing would not
/// help. For tests, tools and the bench.
pub fn encode_none(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + raw.len());
    out.extend_from_slice(&MAGIC.to_be_bytes());
    out.extend_from_slice(&[0; 4]); // The CRC, below.
    out.extend_from_slice(&[0, 0, 0, 0]); // Method None, compressor, level, block size exponent.
    out.extend_from_slice(&1u32.to_be_bytes());
    out.extend_from_slice(&(raw.len() as u64).to_be_bytes());
    out.extend_from_slice(&((HEADER + raw.len()) as u64).to_be_bytes());
    out.extend_from_slice(blake3::hash(raw).as_bytes());
    let crc = crc32fast::hash(&out[8..HEADER]);
    out[4..8].copy_from_slice(&crc.to_be_bytes());
    out.extend_from_slice(raw);
    out
}

/// Hands each block's raw bytes to `sink`, in order.
fn for_each_block(body: &[u8], header: &Header, mut sink: impl FnMut(&[u8])) -> Result<(), CompressedError> {
    if header.method == Method::None {
        sink(&body[HEADER..]);
        return Ok(());
    }
    let block = 1u64 << header.block_size_exponent;
    let mut scratch = Vec::new();
    let mut at = HEADER + 4 * header.block_sizes.len();
    for (i, &stored) in header.block_sizes.iter().enumerate() {
        // Both fit in usize: `check` bounded them by the body's length and 2^31.
        let raw = raw_block_len(block, header.total_raw_size, i as u64) as usize;
        let data = &body[at..at + stored as usize];
        at += stored as usize;
        if stored as usize >= raw {
            sink(data);
            continue;
        }
        match header.method {
            Method::Lz4 => {
                if raw > data.len().saturating_mul(255).saturating_add(64) {
                    return Err(CompressedError::Block(i));
                }
                scratch.resize(raw, 0);
                let n = lz4_flex::block::decompress_into(data, &mut scratch)
                    .map_err(|_| CompressedError::Block(i))?;
                if n != raw {
                    return Err(CompressedError::Block(i));
                }
                sink(&scratch);
            }
            _ => return Err(CompressedError::Oodle),
        }
    }
    Ok(())
}
