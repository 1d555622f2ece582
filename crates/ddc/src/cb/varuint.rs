//! VarUInt: 1 to 9 bytes, the count of leading one-bits of the first byte is the count of extra
//! bytes, the value big-endian in what remains (compact-binary.md section 2).

use super::CbError;

/// Appends the shortest encoding of `value`.
pub fn write_varuint(out: &mut Vec<u8>, value: u64) {
    let n = varuint_len(value);
    let bytes = value.to_be_bytes();
    if n == 9 {
        // The first byte is all prefix; the value follows whole.
        out.push(0xff);
        out.extend_from_slice(&bytes);
        return;
    }
    let start = out.len();
    out.extend_from_slice(&bytes[8 - n..]);
    if n > 1 {
        out[start] |= (0xff_u16 << (9 - n)) as u8;
    }
}

/// The length of the shortest encoding of `value`.
pub fn varuint_len(value: u64) -> usize {
    match value {
        0..=0x7f => 1,
        _ if value < 1 << 14 => 2,
        _ if value < 1 << 21 => 3,
        _ if value < 1 << 28 => 4,
        _ if value < 1 << 35 => 5,
        _ if value < 1 << 42 => 6,
        _ if value < 1 << 49 => 7,
        _ if value < 1 << 56 => 8,
        _ => 9,
    }
}

/// Reads one VarUInt from the front of `data`: (value, bytes used). Any length is accepted.
pub fn read_varuint(data: &[u8]) -> Result<(u64, usize), CbError> {
    let first = *data.first().ok_or(CbError::Truncated)?;
    let n = first.leading_ones() as usize + 1;
    let rest = data.get(1..n).ok_or(CbError::Truncated)?;
    let mut value = if n >= 8 { 0 } else { u64::from(first & (0xff >> n)) };
    for &b in rest {
        value = (value << 8) | u64::from(b);
    }
    Ok((value, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_examples() {
        for (value, hex) in [
            (0x7f_u64, "7f"),
            (0x80, "8080"),
            (0x123, "8123"),
            (0x1234, "9234"),
            (0x12345, "c12345"),
            (0x123456789, "f123456789"),
            (0x123456789ab, "f923456789ab"),
            (u64::MAX, "ffffffffffffffffff"),
        ] {
            let mut out = Vec::new();
            write_varuint(&mut out, value);
            assert_eq!(hex::encode(&out), hex, "{value:#x}");
            assert_eq!(read_varuint(&out), Ok((value, out.len())));
        }
        assert_eq!(read_varuint(&[0x81]), Err(CbError::Truncated));
        assert_eq!(read_varuint(&[]), Err(CbError::Truncated));
    }
}
