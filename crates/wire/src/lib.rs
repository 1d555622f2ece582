//! Framing and message codec for the tickwire session protocol.
//!
//! This crate owns the bytes on the wire and nothing else: it has no sockets, no clocks and no
//! state beyond what one frame needs. Everything here is specified in `docs/protocol.md`, and the
//! test vectors in `docs/test-vectors/frames.json` are checked against it.
//!
//! Decoding is zero-copy: a frame's payload is a [`bytes::Bytes`] slice of the read buffer. A
//! payload sent may be assembled from shared pieces ([`Payload::Parts`]), copied once into the
//! write buffer.

mod error;
mod frame;
mod payload;
pub mod proto;
mod varint;

pub use error::WireError;
pub use frame::{
    DEFAULT_MAX_FRAME_BYTES, Frame, FrameDecoder, FrameType, LENGTH_PREFIX_BYTES, decode_control,
    decode_envelope, encode_message,
};
pub use payload::{Parts, Payload};
