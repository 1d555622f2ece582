// The session rules of docs/protocol.md §5–§7, with simulated time: no test here reads a clock.

import assert from "node:assert/strict";
import { test } from "node:test";
import { DEFAULT_SESSION_CONFIG, Session, configFromWelcome } from "../src/session.js";
import { ProtocolError } from "../src/errors.js";
import type { Frame } from "../src/frame.js";

const data = (seq: number, ack = 0, n = 1): Frame => ({ type: "data", seq: BigInt(seq), ack: BigInt(ack), payload: new Uint8Array(n) });

test("messages are numbered from 1 and delivered once, in order; retransmissions are dropped", () => {
  const s = new Session(DEFAULT_SESSION_CONFIG, 0);
  assert.deepEqual(s.send(0, new Uint8Array([1])), { type: "data", seq: 1n, ack: 0n, payload: new Uint8Array([1]) });
  assert.ok(s.onFrame(1, data(1, 1)));
  assert.equal(s.onFrame(1, data(1, 1)), undefined, "a repeat is dropped");
  assert.throws(() => s.onFrame(1, data(3, 1)), ProtocolError, "a gap is a protocol error");
  assert.deepEqual(s.inFlight, { messages: 0, bytes: 0 }, "ack 1 freed the message");
  assert.throws(() => s.onFrame(1, { type: "ack", ack: 5n }), ProtocolError, "an ack above what was sent");
});

test("a standalone ACK goes out after ackEvery messages, ackBytes bytes, or ackDelay after ackSoon", () => {
  const s = new Session({ ...DEFAULT_SESSION_CONFIG, ackEvery: 3, ackBytes: 100 }, 0);
  s.onFrame(0, data(1));
  s.onFrame(0, data(2));
  assert.equal(s.pollTransmit(0), undefined);
  s.onFrame(0, data(3));
  assert.deepEqual(s.pollTransmit(0), { type: "ack", ack: 3n });
  s.onFrame(0, data(4, 0, 100));
  assert.deepEqual(s.pollTransmit(0), { type: "ack", ack: 4n }, "100 bytes");
  s.onFrame(10, data(5));
  s.ackSoon(10);
  assert.equal(s.pollTimeout(), 10 + DEFAULT_SESSION_CONFIG.ackDelayMs);
  const due = 10 + DEFAULT_SESSION_CONFIG.ackDelayMs;
  assert.equal(s.pollTransmit(due - 1), undefined);
  assert.deepEqual(s.pollTransmit(due), { type: "ack", ack: 5n });
});

test("the Welcome's bounds halve into ackEvery and ackBytes (§5)", () => {
  const c = configFromWelcome({ heartbeatMs: 1000, resumeWindowMs: 5000, ackDelayMs: 50, maxUnackedMessages: 20, maxUnackedBytes: 1000 });
  assert.deepEqual([c.ackEvery, c.ackBytes, c.readTimeoutMs, c.ackDelayMs], [10, 500, 2000, 50]);
  const old = configFromWelcome({ heartbeatMs: 3000, resumeWindowMs: 30000, ackDelayMs: 0, maxUnackedMessages: 0, maxUnackedBytes: 0 });
  assert.deepEqual([old.ackEvery, old.ackBytes, old.ackDelayMs], [16, 1 << 19, 200], "an older server");
});

test("heartbeats after a quiet heartbeat interval; the link is dead after the read timeout", () => {
  const cfg = { ...DEFAULT_SESSION_CONFIG, heartbeatMs: 1000, readTimeoutMs: 2000 };
  const s = new Session(cfg, 0);
  assert.equal(s.pollTimeout(), 1000);
  assert.deepEqual(s.onTimeout(1000), { kind: "transmit", frame: { type: "heartbeat", ack: 0n } });
  s.onFrame(1500, { type: "heartbeat", ack: 0n });
  assert.deepEqual(s.onTimeout(2000), { kind: "transmit", frame: { type: "heartbeat", ack: 0n } });
  assert.deepEqual(s.onTimeout(3499), { kind: "transmit", frame: { type: "heartbeat", ack: 0n } });
  assert.deepEqual(s.onTimeout(3500), { kind: "linkDead" });
});

test("a resume resends exactly what the server lacks, with the original numbers; the window expires", () => {
  const s = new Session({ ...DEFAULT_SESSION_CONFIG, resumeWindowMs: 5000 }, 0);
  for (let i = 1; i <= 5; i++) s.send(0, new Uint8Array([i]));
  s.onFrame(1, { type: "ack", ack: 2n });
  s.detach(10);
  assert.equal(s.send(11, new Uint8Array([6])), undefined, "queued while detached");
  assert.equal(s.pollTimeout(), 5010);
  const resent = s.attach(20, 3);
  assert.deepEqual(
    resent.map((f) => (f.type === "data" ? [Number(f.seq), f.payload[0]] : [])),
    [
      [4, 4],
      [5, 5],
      [6, 6],
    ],
  );
  assert.throws(() => s.attach(21, 1), ProtocolError, "a server cannot un-acknowledge");
  const t = new Session({ ...DEFAULT_SESSION_CONFIG, resumeWindowMs: 5000 }, 0);
  t.detach(0);
  assert.deepEqual(t.onTimeout(4999), { kind: "nothing" });
  assert.deepEqual(t.onTimeout(5000), { kind: "expired" });
});

test("the client refuses to keep more than its bound unacknowledged", () => {
  const s = new Session({ ...DEFAULT_SESSION_CONFIG, maxUnackedMessages: 2 }, 0);
  s.send(0, new Uint8Array(1));
  s.send(0, new Uint8Array(1));
  assert.throws(() => s.send(0, new Uint8Array(1)), ProtocolError);
});
