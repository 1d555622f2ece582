// Why this exists: the client side of reliable sessions (docs/protocol.md §5–§7) as a state
// machine without I/O or clocks: it numbers and keeps what it sends, delivers what it receives
// exactly once, and says when an ACK or a HEARTBEAT is due. The caller passes `now` (ms) in,
// so the rules are tested with simulated time, as crates/session is in Rust.

import { ProtocolError } from "./errors.js";
import type { Frame } from "./frame.js";

export interface SessionConfig {
  /** Send a HEARTBEAT after this long without sending anything (the Welcome's). */
  heartbeatMs: number;
  /** A connection that received nothing for this long is dead (twice the heartbeat). */
  readTimeoutMs: number;
  /** How long the server keeps a session without a connection (the Welcome's). */
  resumeWindowMs: number;
  /** Most messages and payload bytes this side keeps unacknowledged. */
  maxUnackedMessages: number;
  maxUnackedBytes: number;
  /** A standalone ACK after this many messages or bytes arrived without one going back. */
  ackEvery: number;
  ackBytes: number;
  /** ... or this long after a message marked with `ackSoon` arrived. */
  ackDelayMs: number;
}

export const DEFAULT_SESSION_CONFIG: SessionConfig = {
  heartbeatMs: 3000,
  readTimeoutMs: 6000,
  resumeWindowMs: 30000,
  maxUnackedMessages: 1024,
  maxUnackedBytes: 1 << 20,
  ackEvery: 16,
  ackBytes: 1 << 19,
  ackDelayMs: 200,
};

/** The client's settings from a Welcome's fields (0: an older server that does not say). */
export function configFromWelcome(w: {
  heartbeatMs: number;
  resumeWindowMs: number;
  ackDelayMs: number;
  maxUnackedMessages: number;
  maxUnackedBytes: number;
}): SessionConfig {
  const d = DEFAULT_SESSION_CONFIG;
  const heartbeatMs = Math.max(1, w.heartbeatMs || d.heartbeatMs);
  return {
    ...d,
    heartbeatMs,
    readTimeoutMs: heartbeatMs * 2,
    resumeWindowMs: w.resumeWindowMs,
    ackDelayMs: w.ackDelayMs || d.ackDelayMs,
    // Acknowledge by the time half of the server's bound has arrived (§5).
    ackEvery: w.maxUnackedMessages > 0 ? Math.min(d.ackEvery, Math.max(1, Math.floor(w.maxUnackedMessages / 2))) : d.ackEvery,
    ackBytes: w.maxUnackedBytes > 0 ? Math.min(d.ackBytes, Math.max(1, Math.floor(w.maxUnackedBytes / 2))) : d.ackBytes,
  };
}

export type Timeout =
  | { kind: "nothing" }
  | { kind: "transmit"; frame: Frame }
  | { kind: "linkDead" }
  | { kind: "expired" };

export class Session {
  private nextSeq = 1;
  private peerAcked = 0;
  private readonly unacked: Uint8Array[] = [];
  private unackedBytes = 0;
  private lastReceivedSeq = 0;
  private ackSent = 0;
  private unackedSince: number | undefined;
  private receivedBytesUnacked = 0;
  private attached = true;
  private lastRx: number;
  private lastTx: number;
  private detachedSince = 0;

  constructor(
    readonly config: SessionConfig,
    now: number,
  ) {
    this.lastRx = now;
    this.lastTx = now;
  }

  /** Highest sequence number delivered; sent in a resume. */
  get lastReceived(): number {
    return this.lastReceivedSeq;
  }

  get isAttached(): boolean {
    return this.attached;
  }

  /** Messages and bytes sent and not yet acknowledged. */
  get inFlight(): { messages: number; bytes: number } {
    return { messages: this.unacked.length, bytes: this.unackedBytes };
  }

  /** Whether a message of `bytes` fits in the unacknowledged window now. */
  hasRoom(bytes: number): boolean {
    return this.unacked.length + 1 <= this.config.maxUnackedMessages && this.unackedBytes + bytes <= this.config.maxUnackedBytes;
  }

  /** Whether a message of `bytes` could ever fit (the window's byte bound). */
  fits(bytes: number): boolean {
    return bytes <= this.config.maxUnackedBytes;
  }

  /** Queues a message: the DATA frame to write now, or undefined while detached. */
  send(now: number, payload: Uint8Array): Frame | undefined {
    const messages = this.unacked.length + 1;
    const bytes = this.unackedBytes + payload.length;
    if (messages > this.config.maxUnackedMessages || bytes > this.config.maxUnackedBytes) {
      throw new ProtocolError(`${messages} messages / ${bytes} bytes unacknowledged by the server`);
    }
    const seq = this.nextSeq++;
    this.unacked.push(payload);
    this.unackedBytes = bytes;
    if (!this.attached) return undefined;
    this.lastTx = now;
    this.ackedAll();
    return { type: "data", seq: BigInt(seq), ack: BigInt(this.lastReceivedSeq), payload };
  }

  /** Handles a DATA, ACK or HEARTBEAT frame: the payload to deliver, if any. */
  onFrame(now: number, frame: Frame): Uint8Array | undefined {
    if (!this.attached) throw new ProtocolError("a frame on a detached session");
    this.lastRx = now;
    switch (frame.type) {
      case "control":
        throw new ProtocolError("a CONTROL frame inside a session");
      case "ack":
      case "heartbeat":
        this.onAck(frame.ack);
        return undefined;
      case "data": {
        this.onAck(frame.ack);
        const expected = BigInt(this.lastReceivedSeq + 1);
        if (frame.seq < expected) return undefined; // a retransmission: already delivered
        if (frame.seq > expected) throw new ProtocolError(`sequence gap: expected ${expected}, got ${frame.seq}`);
        this.lastReceivedSeq += 1;
        this.receivedBytesUnacked += frame.payload.length;
        return frame.payload;
      }
    }
  }

  private onAck(ack: bigint): void {
    const sent = BigInt(this.nextSeq - 1);
    if (ack > sent) throw new ProtocolError(`ack ${ack} above the highest seq sent, ${sent}`);
    while (BigInt(this.peerAcked) < ack) {
      const payload = this.unacked.shift()!;
      this.unackedBytes -= payload.length;
      this.peerAcked += 1;
    }
  }

  /** The message just delivered wants its acknowledgement within `ackDelayMs` (§5). */
  ackSoon(now: number): void {
    if (this.lastReceivedSeq > this.ackSent && this.unackedSince === undefined) this.unackedSince = now;
  }

  private ackedAll(): void {
    this.ackSent = this.lastReceivedSeq;
    this.unackedSince = undefined;
    this.receivedBytesUnacked = 0;
  }

  /** A standalone ACK, if one is due after a batch of incoming frames. */
  pollTransmit(now: number): Frame | undefined {
    if (!this.attached) return undefined;
    const pending = this.lastReceivedSeq - this.ackSent;
    const due =
      pending >= this.config.ackEvery ||
      (pending > 0 && this.receivedBytesUnacked >= this.config.ackBytes) ||
      (this.unackedSince !== undefined && now >= this.unackedSince + this.config.ackDelayMs);
    if (!due) return undefined;
    this.lastTx = now;
    this.ackedAll();
    return { type: "ack", ack: BigInt(this.lastReceivedSeq) };
  }

  /** When `onTimeout` next has something to do (ms, on the caller's clock). */
  pollTimeout(): number {
    if (!this.attached) return this.detachedSince + this.config.resumeWindowMs;
    let next = Math.min(this.lastRx + this.config.readTimeoutMs, this.lastTx + this.config.heartbeatMs);
    if (this.unackedSince !== undefined) next = Math.min(next, this.unackedSince + this.config.ackDelayMs);
    return next;
  }

  onTimeout(now: number): Timeout {
    if (!this.attached) {
      return now >= this.detachedSince + this.config.resumeWindowMs ? { kind: "expired" } : { kind: "nothing" };
    }
    if (now >= this.lastRx + this.config.readTimeoutMs) return { kind: "linkDead" };
    if (now >= this.lastTx + this.config.heartbeatMs) {
      this.lastTx = now;
      const ack = BigInt(this.lastReceivedSeq);
      this.ackedAll();
      return { kind: "transmit", frame: { type: "heartbeat", ack } };
    }
    if (this.unackedSince !== undefined && now >= this.unackedSince + this.config.ackDelayMs) {
      this.lastTx = now;
      const ack = BigInt(this.lastReceivedSeq);
      this.ackedAll();
      return { kind: "transmit", frame: { type: "ack", ack } };
    }
    return { kind: "nothing" };
  }

  /** The connection is gone; the session waits for a resume. */
  detach(now: number): void {
    if (!this.attached) return;
    this.attached = false;
    this.detachedSince = now;
    this.unackedSince = undefined;
  }

  /**
   * A new connection carries the session on (§7): `peerLastReceived` is the Welcome's. Returns
   * every message the server lacks, with its original seq, to write before anything else.
   */
  attach(now: number, peerLastReceived: number): Frame[] {
    if (peerLastReceived < this.peerAcked) {
      throw new ProtocolError(`the server claims ${peerLastReceived}, below its earlier ack ${this.peerAcked}`);
    }
    this.onAck(BigInt(peerLastReceived));
    this.attached = true;
    this.lastRx = now;
    this.lastTx = now;
    this.ackedAll();
    const ack = BigInt(this.lastReceivedSeq);
    return this.unacked.map((payload, i) => ({
      type: "data" as const,
      seq: BigInt(this.peerAcked + 1 + i),
      ack,
      payload,
    }));
  }
}
