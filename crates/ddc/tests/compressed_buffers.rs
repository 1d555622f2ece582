//! The compressed-buffer codec against the DDC test vectors: every buffer passes the
//! structural checks with the header the vectors decode, and decodes to its raw payload (None,
//! LZ4 single and multi-block with raw-stored blocks, and an Oodle-method buffer whose blocks
//! are all stored raw). Corruptions are refused with their reason; random input never panics.

use proptest::prelude::*;
use serde_json::Value as Json;
use tickwire_ddc::compressed::{CompressedError, Method, check, decode, encode_none, verify};

fn buffers() -> Vec<(String, Vec<u8>, Json)> {
    let all: Json = serde_json::from_str(include_str!("fixtures/ddc-vectors.json")).unwrap();
    all["compressed_buffers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            let name = b["name"].as_str().unwrap().to_owned();
            (name, hex::decode(b["compressed_hex"].as_str().unwrap()).unwrap(), b.clone())
        })
        .collect()
}

#[test]
fn every_vector_checks_and_decodes_to_its_payload() {
    for (name, body, v) in buffers() {
        let header = check(&body).unwrap_or_else(|e| panic!("{name}: {e}"));
        let h = &v["header"];
        let method = match h["method"].as_u64().unwrap() {
            0 => Method::None,
            3 => Method::Oodle,
            _ => Method::Lz4,
        };
        assert_eq!(header.method, method, "{name}");
        assert_eq!(header.total_raw_size, h["total_raw_size"].as_u64().unwrap(), "{name}");
        assert_eq!(header.raw_hash.to_hex(), v["raw_hash"].as_str().unwrap(), "{name}");
        let sizes: Vec<u64> =
            h["block_sizes"].as_array().unwrap().iter().map(|s| s.as_u64().unwrap()).collect();
        assert_eq!(header.block_sizes.iter().map(|&s| u64::from(s)).collect::<Vec<_>>(), sizes, "{name}");
        let (_, payload) = decode(&body).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(hex::encode(&payload), v["raw_hex"].as_str().unwrap(), "{name}");
        // The streaming check agrees without building the payload.
        assert_eq!(verify(&body), Ok(header), "{name}");
    }
}

#[test]
fn the_none_encoder_writes_the_vectors() {
    for (name, body, v) in buffers().into_iter().filter(|(n, ..)| n.starts_with("none-")) {
        let raw = hex::decode(v["raw_hex"].as_str().unwrap()).unwrap();
        assert_eq!(hex::encode(encode_none(&raw)), hex::encode(&body), "{name}");
    }
}

#[test]
fn corruptions_are_refused_with_their_reason() {
    let (_, body, _) = buffers().into_iter().find(|(n, ..)| n == "lz4-multi-block").unwrap();
    assert_eq!(check(&body[..40]), Err(CompressedError::Truncated));
    let mut magic = body.clone();
    magic[0] = 0;
    assert!(matches!(check(&magic), Err(CompressedError::Magic(_))));
    let mut method = body.clone();
    method[8] = 7;
    assert_eq!(check(&method), Err(CompressedError::Method(7)));
    let mut crc = body.clone();
    crc[23] ^= 1;
    assert!(matches!(check(&crc), Err(CompressedError::Crc { .. })), "a header field changed");
    let mut trailing = body.clone();
    trailing.push(0);
    assert!(matches!(check(&trailing), Err(CompressedError::Size { .. })));
    // A flipped byte inside a block: the structure holds, the payload does not.
    let mut block = body.clone();
    let last = block.len() - 1;
    block[last] ^= 0xff;
    assert!(check(&block).is_ok());
    assert!(matches!(decode(&block), Err(CompressedError::RawHash | CompressedError::Block(_))));
    assert_eq!(verify(&block).err(), decode(&block).err());
}

/// A method-None header whose raw size is near 2^64 is refused, not summed past it.
#[test]
fn a_raw_size_near_the_top_of_u64_is_refused() {
    let mut buffer = encode_none(b"raw");
    buffer[16..24].copy_from_slice(&(u64::MAX - 10).to_be_bytes());
    let crc = crc32fast::hash(&buffer[8..64]);
    buffer[4..8].copy_from_slice(&crc.to_be_bytes());
    assert!(check(&buffer).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn random_and_mutated_buffers_never_panic(
        which in 0usize..5,
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        junk in prop::collection::vec(any::<u8>(), 0..128),
    ) {
        prop_assert_eq!(verify(&junk).is_ok(), decode(&junk).is_ok());
        let buffers = buffers();
        let mut body = buffers[which % buffers.len()].1.clone();
        for (at, b) in flips {
            let n = body.len();
            body[at % n] = b;
        }
        // A mutated buffer is refused, or it still decodes to a payload with its raw hash,
        // and the streaming check always agrees with the decoder.
        match decode(&body) {
            Ok((header, payload)) => {
                prop_assert_eq!(tickwire_ddc::IoHash::of(&payload), header.raw_hash);
                prop_assert_eq!(verify(&body), Ok(header));
            }
            Err(e) => prop_assert_eq!(verify(&body), Err(e)),
        }
    }
}
