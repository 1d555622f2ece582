//! Length-prefixed frames: the unit the session layer sends and receives.
//!
//! ```text
//! frame     = length:u32be type:u8 body
//! length    = 1 + len(body)            (never counts itself)
//! CONTROL   = 0x01 protobuf(Control)
//! DATA      = 0x02 seq:varint ack:varint payload   (payload = protobuf(Envelope))
//! ACK       = 0x03 ack:varint
//! HEARTBEAT = 0x04 ack:varint
//! ```

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;

use crate::proto::{Control, Envelope, control, envelope};
use crate::{Payload, WireError, varint};

/// Bytes taken by the length prefix.
pub const LENGTH_PREFIX_BYTES: usize = 4;
/// Default for the largest accepted value of the length prefix: 1 MiB.
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 1 << 20;

/// The frame type byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameType {
    Control = 0x01,
    Data = 0x02,
    Ack = 0x03,
    Heartbeat = 0x04,
}

impl FrameType {
    fn name(self) -> &'static str {
        match self {
            FrameType::Control => "CONTROL",
            FrameType::Data => "DATA",
            FrameType::Ack => "ACK",
            FrameType::Heartbeat => "HEARTBEAT",
        }
    }
}

impl TryFrom<u8> for FrameType {
    type Error = WireError;
    fn try_from(byte: u8) -> Result<Self, WireError> {
        Ok(match byte {
            0x01 => FrameType::Control,
            0x02 => FrameType::Data,
            0x03 => FrameType::Ack,
            0x04 => FrameType::Heartbeat,
            other => return Err(WireError::UnknownFrameType(other)),
        })
    }
}

/// One frame. Decoded payloads borrow the buffer they were decoded from, and are always
/// [`Payload::Whole`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A protobuf `Control` message, kept encoded; see [`decode_control`].
    Control(Bytes),
    /// One application message with its session sequence number and a piggybacked ack.
    Data { seq: u64, ack: u64, payload: Payload },
    /// A standalone cumulative acknowledgement.
    Ack { ack: u64 },
    /// A liveness signal; it also carries the sender's cumulative ack.
    Heartbeat { ack: u64 },
}

impl Frame {
    /// A CONTROL frame holding `msg`.
    pub fn control(msg: &Control) -> Frame {
        Frame::Control(encode_message(msg))
    }

    pub fn frame_type(&self) -> FrameType {
        match self {
            Frame::Control(_) => FrameType::Control,
            Frame::Data { .. } => FrameType::Data,
            Frame::Ack { .. } => FrameType::Ack,
            Frame::Heartbeat { .. } => FrameType::Heartbeat,
        }
    }

    /// Value of the length prefix this frame encodes to.
    pub fn body_len(&self) -> usize {
        1 + match self {
            Frame::Control(body) => body.len(),
            Frame::Data { seq, ack, payload } => varint::len(*seq) + varint::len(*ack) + payload.len(),
            Frame::Ack { ack } | Frame::Heartbeat { ack } => varint::len(*ack),
        }
    }

    /// Total bytes on the wire, length prefix included.
    pub fn encoded_len(&self) -> usize {
        LENGTH_PREFIX_BYTES + self.body_len()
    }

    /// Appends the frame to `dst`.
    pub fn encode(&self, dst: &mut BytesMut) {
        dst.reserve(self.encoded_len());
        dst.put_u32(self.body_len() as u32);
        dst.put_u8(self.frame_type() as u8);
        match self {
            Frame::Control(body) => dst.put_slice(body),
            Frame::Data { seq, ack, payload } => {
                varint::put(*seq, dst);
                varint::put(*ack, dst);
                payload.put_into(dst);
            }
            Frame::Ack { ack } | Frame::Heartbeat { ack } => varint::put(*ack, dst),
        }
    }

    /// Parses a frame from everything after its length prefix (type byte first).
    pub fn parse(mut body: Bytes) -> Result<Frame, WireError> {
        if body.is_empty() {
            return Err(WireError::EmptyFrame);
        }
        let ty = FrameType::try_from(body.get_u8())?;
        match ty {
            FrameType::Control => Ok(Frame::Control(body)),
            FrameType::Data => {
                let mut cursor = &body[..];
                let seq = varint::get(&mut cursor, ty.name())?;
                let ack = varint::get(&mut cursor, ty.name())?;
                let consumed = body.len() - cursor.len();
                body.advance(consumed);
                Ok(Frame::Data { seq, ack, payload: Payload::Whole(body) })
            }
            FrameType::Ack | FrameType::Heartbeat => {
                let mut cursor = &body[..];
                let ack = varint::get(&mut cursor, ty.name())?;
                if !cursor.is_empty() {
                    return Err(WireError::TrailingBytes { kind: ty.name(), extra: cursor.len() });
                }
                Ok(if ty == FrameType::Ack { Frame::Ack { ack } } else { Frame::Heartbeat { ack } })
            }
        }
    }
}

/// Splits frames off a read buffer, enforcing the maximum frame size before buffering a frame.
#[derive(Debug, Clone, Copy)]
pub struct FrameDecoder {
    max_frame_bytes: u32,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder::new(DEFAULT_MAX_FRAME_BYTES)
    }
}

/// The most a decoder reserves ahead of bytes that have arrived.
const RESERVE_AHEAD: usize = 64 * 1024;

impl FrameDecoder {
    pub fn new(max_frame_bytes: u32) -> Self {
        FrameDecoder { max_frame_bytes }
    }

    pub fn max_frame_bytes(&self) -> u32 {
        self.max_frame_bytes
    }

    /// Takes the next complete frame off the front of `buf`.
    ///
    /// Returns `Ok(None)` when more bytes are needed. An error leaves `buf` unspecified: the
    /// connection is not recoverable and must be closed.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Frame>, WireError> {
        if buf.len() < LENGTH_PREFIX_BYTES {
            return Ok(None);
        }
        let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
        if len == 0 {
            return Err(WireError::EmptyFrame);
        }
        if len > self.max_frame_bytes {
            return Err(WireError::FrameTooLarge { len: u64::from(len), max: self.max_frame_bytes });
        }
        let total = LENGTH_PREFIX_BYTES + len as usize;
        if buf.len() < total {
            // Room for what may come next, never for the whole announced length at once: a
            // peer that announces a large frame and sends nothing costs only what it sent.
            buf.reserve((total - buf.len()).min(RESERVE_AHEAD));
            return Ok(None);
        }
        buf.advance(LENGTH_PREFIX_BYTES);
        let body = buf.split_to(len as usize).freeze();
        Frame::parse(body).map(Some)
    }
}

/// Encodes any protobuf message into a fresh buffer.
pub fn encode_message(msg: &impl Message) -> Bytes {
    let mut buf = BytesMut::with_capacity(msg.encoded_len());
    // Encoding into a buffer with enough capacity cannot fail.
    msg.encode(&mut buf).expect("buffer has capacity for the message");
    buf.freeze()
}

/// Decodes the body of a CONTROL frame; a message with no `kind` is an error.
pub fn decode_control(body: Bytes) -> Result<control::Kind, WireError> {
    Control::decode(body)
        .map_err(|source| WireError::Protobuf { what: "Control", source })?
        .kind
        .ok_or(WireError::MissingKind("Control"))
}

/// Decodes the payload of a DATA frame; an envelope with no `kind` is an error.
pub fn decode_envelope(payload: Bytes) -> Result<envelope::Kind, WireError> {
    Envelope::decode(payload)
        .map_err(|source| WireError::Protobuf { what: "Envelope", source })?
        .kind
        .ok_or(WireError::MissingKind("Envelope"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Parts;
    use proptest::prelude::*;

    /// `bytes` whole (no cuts), or cut into a head and parts at the positions in `cuts`.
    fn cut(bytes: Bytes, cuts: &[usize]) -> Payload {
        let Some((&first, rest)) = cuts.split_first() else { return Payload::Whole(bytes) };
        let mut at: Vec<usize> = rest.iter().map(|c| c % (bytes.len() + 1)).collect();
        at.sort_unstable();
        let head =
            (first % (bytes.len() + 1)).min(Parts::MAX_HEAD).min(at.first().copied().unwrap_or(usize::MAX));
        let mut parts = Vec::new();
        let mut from = head;
        for to in at.into_iter().chain([bytes.len()]) {
            parts.push(bytes.slice(from..to.max(from)));
            from = to.max(from);
        }
        Payload::from(Parts::new(&bytes[..head], parts).expect("a head within the maximum"))
    }

    fn arb_frame() -> impl Strategy<Value = Frame> {
        let bytes = proptest::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from);
        prop_oneof![
            bytes.clone().prop_map(Frame::Control),
            // Sent whole or as a head and parts (cut at `cuts`); decoded, it is whole and equal.
            (any::<u64>(), any::<u64>(), bytes, proptest::collection::vec(any::<usize>(), 0..4))
                .prop_map(|(seq, ack, payload, cuts)| Frame::Data { seq, ack, payload: cut(payload, &cuts) }),
            any::<u64>().prop_map(|ack| Frame::Ack { ack }),
            any::<u64>().prop_map(|ack| Frame::Heartbeat { ack }),
        ]
    }

    proptest! {
        #[test]
        fn frames_round_trip_in_any_split(frames in proptest::collection::vec(arb_frame(), 1..8), cut in any::<prop::sample::Index>()) {
            let mut wire = BytesMut::new();
            for f in &frames {
                f.encode(&mut wire);
            }
            // Feed the stream in two pieces, cut at an arbitrary point.
            let wire = wire.freeze();
            let at = cut.index(wire.len() + 1);
            let decoder = FrameDecoder::default();
            let mut buf = BytesMut::from(&wire[..at]);
            let mut out = Vec::new();
            while let Some(f) = decoder.decode(&mut buf).unwrap() {
                out.push(f);
            }
            buf.extend_from_slice(&wire[at..]);
            while let Some(f) = decoder.decode(&mut buf).unwrap() {
                out.push(f);
            }
            prop_assert_eq!(out, frames);
            prop_assert!(buf.is_empty());
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let decoder = FrameDecoder::new(128);
            let mut buf = BytesMut::from(&bytes[..]);
            while let Ok(Some(frame)) = decoder.decode(&mut buf) {
                if let Frame::Control(body) = &frame {
                    let _ = decode_control(body.clone());
                }
                if let Frame::Data { payload, .. } = frame {
                    let _ = decode_envelope(payload.into_bytes());
                }
            }
        }
    }

    #[test]
    fn oversized_frame_is_rejected_before_buffering() {
        let decoder = FrameDecoder::new(16);
        let mut buf = BytesMut::from(&[0x00, 0x00, 0x00, 0x11, 0x02][..]);
        assert!(matches!(decoder.decode(&mut buf), Err(WireError::FrameTooLarge { len: 17, max: 16 })));
    }

    #[test]
    fn zero_length_unknown_type_and_trailing_bytes_are_typed_errors() {
        let decoder = FrameDecoder::default();
        let mut empty = BytesMut::from(&[0, 0, 0, 0][..]);
        assert!(matches!(decoder.decode(&mut empty), Err(WireError::EmptyFrame)));
        let mut unknown = BytesMut::from(&[0, 0, 0, 1, 0x7f][..]);
        assert!(matches!(decoder.decode(&mut unknown), Err(WireError::UnknownFrameType(0x7f))));
        let mut trailing = BytesMut::from(&[0, 0, 0, 3, 0x03, 0x01, 0x00][..]);
        assert!(matches!(
            decoder.decode(&mut trailing),
            Err(WireError::TrailingBytes { kind: "ACK", extra: 1 })
        ));
        let mut truncated_varint = BytesMut::from(&[0, 0, 0, 2, 0x02, 0x80][..]);
        assert!(matches!(decoder.decode(&mut truncated_varint), Err(WireError::BadVarint("DATA"))));
    }

    #[test]
    fn an_announced_length_reserves_only_a_bounded_amount() {
        let decoder = FrameDecoder::default();
        // A 1 MiB frame announced, 5 bytes sent: the buffer does not grow to 1 MiB.
        let mut buf = BytesMut::from(&[0x00, 0x10, 0x00, 0x00, 0x02][..]);
        assert_eq!(decoder.decode(&mut buf).unwrap(), None);
        assert!(buf.capacity() <= RESERVE_AHEAD + 64, "reserved {}", buf.capacity());
    }

    #[test]
    fn partial_frame_waits_for_more() {
        let decoder = FrameDecoder::default();
        let mut buf = BytesMut::from(&[0, 0, 0, 2, 0x03][..]);
        assert_eq!(decoder.decode(&mut buf).unwrap(), None);
        buf.put_u8(0x05);
        assert_eq!(decoder.decode(&mut buf).unwrap(), Some(Frame::Ack { ack: 5 }));
    }

    #[test]
    fn empty_control_and_bad_protobuf_are_errors() {
        assert!(matches!(decode_control(Bytes::new()), Err(WireError::MissingKind("Control"))));
        assert!(matches!(
            decode_envelope(Bytes::from_static(&[0x0a, 0x05, 0x01])),
            Err(WireError::Protobuf { what: "Envelope", .. })
        ));
    }
}
