// Why this exists: the frame layer of docs/protocol.md §2 (length-prefixed CONTROL, DATA, ACK
// and HEARTBEAT frames with LEB128 varints), as a pure encoder and an incremental decoder that
// never reserves memory for a length it has not received.

import { FrameError } from "./errors.js";

export const DEFAULT_MAX_FRAME_BYTES = 1 << 20;
/** Frames a server accepts before its Welcome (§2). */
export const PRE_WELCOME_MAX_FRAME_BYTES = 16 * 1024;

export type Frame =
  | { type: "control"; body: Uint8Array }
  | { type: "data"; seq: bigint; ack: bigint; payload: Uint8Array }
  | { type: "ack"; ack: bigint }
  | { type: "heartbeat"; ack: bigint };

const CONTROL = 0x01;
const DATA = 0x02;
const ACK = 0x03;
const HEARTBEAT = 0x04;

/** Appends `v` (0 ≤ v < 2^64) as an unsigned LEB128 varint. */
export function putVarint(out: number[], v: bigint | number): void {
  let x = BigInt(v);
  if (x < 0n || x >= 1n << 64n) throw new RangeError(`varint out of range: ${x}`);
  while (x >= 0x80n) {
    out.push(Number(x & 0x7fn) | 0x80);
    x >>= 7n;
  }
  out.push(Number(x));
}

/** Reads a varint at `pos`: its value and the position after it, or a BadVarint error. */
export function readVarint(buf: Uint8Array, pos: number): [bigint, number] {
  let result = 0n;
  for (let i = 0; i < 10; i++) {
    const b = buf[pos + i];
    if (b === undefined) throw new FrameError("BadVarint", "a varint runs past the end");
    if (i === 9 && b > 1) throw new FrameError("BadVarint", "a varint longer than 64 bits");
    result |= BigInt(b & 0x7f) << BigInt(7 * i);
    if (b < 0x80) return [result, pos + i + 1];
  }
  throw new FrameError("BadVarint", "a varint longer than 10 bytes");
}

/** The bytes of one frame, length prefix included. */
export function encodeFrame(frame: Frame): Uint8Array {
  const head: number[] = [];
  let tail: Uint8Array = new Uint8Array(0);
  switch (frame.type) {
    case "control":
      head.push(CONTROL);
      tail = frame.body;
      break;
    case "data":
      head.push(DATA);
      putVarint(head, frame.seq);
      putVarint(head, frame.ack);
      tail = frame.payload;
      break;
    case "ack":
      head.push(ACK);
      putVarint(head, frame.ack);
      break;
    case "heartbeat":
      head.push(HEARTBEAT);
      putVarint(head, frame.ack);
      break;
  }
  const length = head.length + tail.length;
  const out = new Uint8Array(4 + length);
  new DataView(out.buffer).setUint32(0, length);
  out.set(head, 4);
  out.set(tail, 4 + head.length);
  return out;
}

/** Decodes one frame's type and body (the bytes after the length prefix). */
export function decodeFrameBody(body: Uint8Array): Frame {
  const type = body[0];
  switch (type) {
    case CONTROL:
      return { type: "control", body: body.subarray(1) };
    case DATA: {
      const [seq, p] = readVarint(body, 1);
      const [ack, q] = readVarint(body, p);
      return { type: "data", seq, ack, payload: body.subarray(q) };
    }
    case ACK:
    case HEARTBEAT: {
      const [ack, p] = readVarint(body, 1);
      if (p !== body.length) throw new FrameError("TrailingBytes", "bytes after the ack");
      return { type: type === ACK ? "ack" : "heartbeat", ack };
    }
    default:
      throw new FrameError("UnknownFrameType", `frame type ${type}`);
  }
}

/**
 * Cuts a byte stream into frames. Bytes are appended as they arrive (`push`); `next` returns
 * the next whole frame or `undefined`. A length above `maxFrameBytes` is refused from the
 * prefix alone.
 */
export class FrameDecoder {
  private buf = new Uint8Array(0);
  private start = 0;
  private end = 0;

  constructor(public maxFrameBytes = DEFAULT_MAX_FRAME_BYTES) {}

  push(bytes: Uint8Array): void {
    if (this.end + bytes.length > this.buf.length) {
      const live = this.end - this.start;
      const size = Math.max(live + bytes.length, Math.min(this.buf.length * 2, live + bytes.length + 65536));
      const next = new Uint8Array(size);
      next.set(this.buf.subarray(this.start, this.end));
      this.buf = next;
      this.start = 0;
      this.end = live;
    }
    this.buf.set(bytes, this.end);
    this.end += bytes.length;
  }

  /** Bytes received and not yet part of a returned frame. */
  get buffered(): number {
    return this.end - this.start;
  }

  next(): Frame | undefined {
    if (this.end - this.start < 4) return undefined;
    const length = new DataView(this.buf.buffer, this.buf.byteOffset + this.start, 4).getUint32(0);
    if (length === 0) throw new FrameError("EmptyFrame", "a frame of length 0");
    if (length > this.maxFrameBytes) {
      throw new FrameError("FrameTooLarge", `a frame of ${length} bytes; at most ${this.maxFrameBytes}`);
    }
    if (this.end - this.start < 4 + length) return undefined;
    // Copied out, so the frame outlives the buffer's reuse.
    const body = this.buf.slice(this.start + 4, this.start + 4 + length);
    this.start += 4 + length;
    if (this.start === this.end) this.start = this.end = 0;
    return decodeFrameBody(body);
  }
}
