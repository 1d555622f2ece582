// Why this exists: every failure the SDK reports is one of these typed errors, so callers can
// tell a refused request (StatusError) from a lost session (ClosedError) or bad bytes.

import { CloseReason, Status } from "./gen/tickwire/v1/control_pb.js";

/** Bytes that are not a valid frame (docs/protocol.md §2); `code` is the spec's error name. */
export class FrameError extends Error {
  constructor(
    readonly code:
      | "EmptyFrame"
      | "UnknownFrameType"
      | "FrameTooLarge"
      | "TrailingBytes"
      | "BadVarint"
      | "MissingKind"
      | "Protobuf",
    message: string,
  ) {
    super(`${code}: ${message}`);
    this.name = "FrameError";
  }
}

/**
 * A call or push refused before it was sent: more messages are already waiting for the
 * gateway's acknowledgements than the client keeps (`ClientOptions.maxWaiting`), or one message
 * alone is larger than the unacknowledged bytes allowed. The session goes on.
 */
export class BackpressureError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "BackpressureError";
  }
}

/** The session broke a rule of §5 (a gap in sequence numbers, an ack out of range). */
export class ProtocolError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ProtocolError";
  }
}

/** A request answered with a status other than OK (§8). */
export class StatusError extends Error {
  constructor(
    readonly status: Status,
    readonly method: string,
    readonly detail: string,
  ) {
    super(`${method}: ${Status[status] ?? status}: ${detail}`);
    this.name = "StatusError";
  }
}

/** A request with no answer within its timeout. The session goes on. */
export class TimeoutError extends Error {
  constructor(readonly method: string, readonly ms: number) {
    super(`${method}: no answer within ${ms} ms`);
    this.name = "TimeoutError";
  }
}

/** The session ended: the server closed it (with `reason`), or it could not be resumed. */
export class ClosedError extends Error {
  constructor(
    readonly reason: CloseReason,
    readonly detail: string,
  ) {
    super(`session closed: ${CloseReason[reason] ?? reason}: ${detail}`);
    this.name = "ClosedError";
  }
}

/** A state update that does not decode (§12.2, "Decode errors"); `code` is the spec's name. */
export class DecodeError extends Error {
  constructor(
    readonly code:
      | "Truncated"
      | "BadVarint"
      | "UnknownKind"
      | "VersionMismatch"
      | "NoField"
      | "BadOp"
      | "UnknownId"
      | "DuplicateEntry"
      | "BadIndex"
      | "BadLength"
      | "BadUtf8"
      | "BadBool"
      | "BadQuant"
      | "BadInt"
      | "Json"
      | "NeedsSnapshot",
    message: string,
  ) {
    super(`${code}: ${message}`);
    this.name = "DecodeError";
  }
}
