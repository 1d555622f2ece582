//! Why a session (or its current connection) cannot go on.

/// A protocol violation by the peer, or a broken bound. All of them end the session except
/// where noted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// More unacknowledged messages or bytes than the configuration allows.
    #[error("retransmit buffer overflow: {messages} messages / {bytes} bytes unacknowledged")]
    RetransmitOverflow { messages: usize, bytes: usize },
    /// A DATA frame skipped sequence numbers; impossible on an ordered transport.
    #[error("sequence gap: expected {expected}, got {got}")]
    SequenceGap { expected: u64, got: u64 },
    /// The peer acknowledged a message that was never sent.
    #[error("ack {ack} is beyond the last sent sequence number {sent}")]
    AckOutOfRange { ack: u64, sent: u64 },
    /// The peer resumed claiming less than it had already acknowledged.
    #[error("resume claims last_received {claimed}, but the peer already acknowledged {acked}")]
    AckWentBackwards { claimed: u64, acked: u64 },
    /// Only DATA, ACK and HEARTBEAT frames belong to the session layer.
    #[error("a CONTROL frame reached the session layer")]
    NotASessionFrame,
    /// A frame arrived while no connection is attached.
    #[error("the session has no connection attached")]
    Detached,
}
