//! IoHash: BLAKE3 truncated to 20 bytes, written as 40 lowercase hex characters. Blob ids and
//! content ids are IoHashes.

use std::fmt;
use std::str::FromStr;

/// A 20-byte content hash.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IoHash([u8; 20]);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HashError {
    #[error("an IoHash is 40 hex characters, got {0:?}")]
    BadHex(String),
}

impl IoHash {
    pub fn of(bytes: &[u8]) -> IoHash {
        IoHash::from_hasher(blake3::Hasher::new().update(bytes))
    }

    /// The hash of everything fed to `hasher` (for streamed bodies).
    pub fn from_hasher(hasher: &blake3::Hasher) -> IoHash {
        let full = hasher.finalize();
        let mut out = [0u8; 20];
        out.copy_from_slice(&full.as_bytes()[..20]);
        IoHash(out)
    }

    /// The hash with these bytes.
    pub fn from_bytes(bytes: [u8; 20]) -> IoHash {
        IoHash(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 20] {
        &self.0
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl FromStr for IoHash {
    type Err = HashError;

    fn from_str(s: &str) -> Result<IoHash, HashError> {
        let bad = || HashError::BadHex(s.chars().take(64).collect());
        if s.len() != 40 {
            return Err(bad());
        }
        let mut out = [0u8; 20];
        hex::decode_to_slice(s, &mut out).map_err(|_| bad())?;
        Ok(IoHash(out))
    }
}

impl fmt::Display for IoHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for IoHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IoHash({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn matches_the_reference_value() {
        // research/cloud-ddc-overview.md: IoHash("test").
        assert_eq!(IoHash::of(b"test").to_hex(), "4878ca0425c739fa427f7eda20fe845f6b2e46ba");
    }

    #[test]
    fn parses_only_40_hex_characters() {
        let h = IoHash::of(b"x");
        assert_eq!(h.to_hex().parse::<IoHash>(), Ok(h));
        assert_eq!(h.to_hex().to_uppercase().parse::<IoHash>(), Ok(h), "hex is case-insensitive on input");
        for bad in ["", "abc", &"g".repeat(40), &"a".repeat(41), "../../etc/passwd"] {
            assert!(bad.parse::<IoHash>().is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn streamed_and_whole_hashes_agree(data in proptest::collection::vec(any::<u8>(), 0..4096), cut in any::<usize>()) {
            let cut = cut % (data.len() + 1);
            let mut h = blake3::Hasher::new();
            h.update(&data[..cut]);
            h.update(&data[cut..]);
            prop_assert_eq!(IoHash::from_hasher(&h), IoHash::of(&data));
        }

        #[test]
        fn parsing_never_panics(s in ".{0,64}") {
            let _ = s.parse::<IoHash>();
        }
    }
}
