//! Arbitrary bytes through the compressed-buffer checks and decoder: any result is fine except
//! a panic; the streaming check and the decoder agree, and a decoded payload has the header's
//! raw hash and size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tickwire_ddc::IoHash;
use tickwire_ddc::compressed::{check, decode, verify};

fuzz_target!(|data: &[u8]| {
    let _ = check(data);
    match decode(data) {
        Ok((header, payload)) => {
            assert_eq!(IoHash::of(&payload), header.raw_hash);
            assert_eq!(payload.len() as u64, header.total_raw_size);
            assert_eq!(verify(data), Ok(header));
        }
        Err(e) => assert_eq!(verify(data), Err(e)),
    }
});
