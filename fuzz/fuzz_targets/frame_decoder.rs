//! Arbitrary bytes through the frame decoder and the protobuf decoders behind it: any result
//! is fine except a panic, and every frame that decodes must re-encode to the same bytes.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use tickwire_wire::{Frame, FrameDecoder, decode_control, decode_envelope};

fuzz_target!(|data: &[u8]| {
    let decoder = FrameDecoder::new(4096);
    let mut buf = BytesMut::from(data);
    loop {
        match decoder.decode(&mut buf) {
            Ok(Some(frame)) => {
                let mut again = BytesMut::new();
                frame.encode(&mut again);
                // Varints may be non-minimal on the wire, so compare by re-decoding.
                let reparsed = decoder.decode(&mut again).expect("re-encoded frame decodes");
                assert_eq!(reparsed.as_ref(), Some(&frame));
                match frame {
                    Frame::Control(body) => {
                        let _ = decode_control(body);
                    }
                    Frame::Data { payload, .. } => {
                        let _ = decode_envelope(payload.into_bytes());
                    }
                    _ => {}
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
});
