//! The one error type of the wire layer. Every way a byte stream can be malformed has its own
//! variant, so the gateway can name the reason when it closes a connection.

/// A frame or message that cannot be decoded.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The length prefix announced a frame above the configured maximum.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge { len: u64, max: u32 },
    /// A length prefix of zero: every frame has at least a type byte.
    #[error("empty frame: the length prefix is 0")]
    EmptyFrame,
    /// The type byte is not one this protocol version defines.
    #[error("unknown frame type 0x{0:02x}")]
    UnknownFrameType(u8),
    /// A varint ran past the end of its frame or past 10 bytes.
    #[error("malformed varint in {0} frame")]
    BadVarint(&'static str),
    /// A fixed-layout frame had bytes left over after its last field.
    #[error("{kind} frame has {extra} trailing bytes")]
    TrailingBytes { kind: &'static str, extra: usize },
    /// A protobuf body did not decode.
    #[error("malformed {what} protobuf: {source}")]
    Protobuf {
        what: &'static str,
        #[source]
        source: prost::DecodeError,
    },
    /// A protobuf message with a `oneof kind` that was not set.
    #[error("{0} message has no kind set")]
    MissingKind(&'static str),
}
