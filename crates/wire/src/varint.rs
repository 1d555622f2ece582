//! Unsigned LEB128 varints, the same encoding protobuf uses, read from a bounded slice.

use bytes::{Buf, BufMut};

use crate::WireError;

/// Reads one varint; `kind` names the frame for the error message.
pub(crate) fn get(buf: &mut &[u8], kind: &'static str) -> Result<u64, WireError> {
    let mut value: u64 = 0;
    for i in 0..10 {
        if !buf.has_remaining() {
            return Err(WireError::BadVarint(kind));
        }
        let byte = buf.get_u8();
        if i == 9 && byte > 1 {
            // The tenth byte may only carry the 64th bit.
            return Err(WireError::BadVarint(kind));
        }
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(WireError::BadVarint(kind))
}

pub(crate) fn put(mut value: u64, dst: &mut impl BufMut) {
    while value >= 0x80 {
        dst.put_u8((value as u8) | 0x80);
        value >>= 7;
    }
    dst.put_u8(value as u8);
}

pub(crate) fn len(value: u64) -> usize {
    // 1 byte per started group of 7 bits; 0 still takes one byte.
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(v in any::<u64>()) {
            let mut out = Vec::new();
            put(v, &mut out);
            prop_assert_eq!(out.len(), len(v));
            let mut slice = &out[..];
            prop_assert_eq!(get(&mut slice, "test").unwrap(), v);
            prop_assert!(slice.is_empty());
        }

        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..16)) {
            let mut slice = &bytes[..];
            let _ = get(&mut slice, "test");
        }
    }

    #[test]
    fn rejects_overflow_and_truncation() {
        let mut too_long: &[u8] = &[0xff; 11];
        assert!(get(&mut too_long, "t").is_err());
        let mut tenth_too_big: &[u8] = &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert!(get(&mut tenth_too_big, "t").is_err());
        let mut truncated: &[u8] = &[0x80];
        assert!(get(&mut truncated, "t").is_err());
        let mut max: &[u8] = &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(get(&mut max, "t").unwrap(), u64::MAX);
    }
}
