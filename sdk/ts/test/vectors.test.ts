// The repository's test vectors (docs/test-vectors/), decoded and encoded by the SDK: the same
// bytes the Rust implementation is checked against.

import assert from "node:assert/strict";
import { test } from "node:test";
import { create } from "@bufbuild/protobuf";
import { FrameDecoder, encodeFrame, type Frame } from "../src/frame.js";
import { FrameError, DecodeError } from "../src/errors.js";
import { decodeControl, decodeEnvelope } from "../src/messages.js";
import { Replica } from "../src/state/replica.js";
import { Schema } from "../src/state/schema.js";
import { EchoRequestSchema } from "../src/gen/tickwire/v1/control_pb.js";
import { fromBinary } from "@bufbuild/protobuf";
import { hex, plain, toHex, vectors } from "./helpers.js";

function decodeOne(bytes: Uint8Array, max?: number): Frame {
  const d = new FrameDecoder(max);
  d.push(bytes);
  const frame = d.next();
  assert.ok(frame, "a whole frame");
  assert.equal(d.buffered, 0, "nothing left over");
  return frame;
}

test("frames.json: every valid frame decodes to its fields and encodes to its bytes", () => {
  const doc = vectors("frames.json");
  for (const v of doc.valid) {
    const bytes = hex(v.hex);
    const frame = decodeOne(bytes);
    const want = v.frame;
    assert.equal(frame.type, want.type.toLowerCase(), v.name);
    if (frame.type === "data") {
      assert.equal(frame.seq, BigInt(want.seq), v.name);
      assert.equal(frame.ack, BigInt(want.ack), v.name);
      if (want.payload_hex !== undefined) assert.equal(toHex(frame.payload), want.payload_hex, v.name);
      if (want.envelope) {
        const env = decodeEnvelope(frame.payload);
        const [kind, fields] = Object.entries(want.envelope)[0] as [string, any];
        assert.equal(env.kind.case, kind, v.name);
        const value = env.kind.value as any;
        if (fields.id !== undefined) assert.equal(value.id, BigInt(fields.id), v.name);
        if (fields.topic !== undefined) assert.equal(value.topic, fields.topic, v.name);
        if (fields.body_hex !== undefined) assert.equal(toHex(value.body), fields.body_hex, v.name);
        if (fields.status !== undefined) assert.equal(value.status, fields.status, v.name);
        if (fields.error !== undefined) assert.equal(value.error, fields.error, v.name);
        if (fields.echo) {
          // `request.echo`: method "echo" with an EchoRequest body.
          assert.equal(value.method, "echo", v.name);
          const echo = fromBinary(EchoRequestSchema, value.body);
          assert.equal(echo.responseBytes, fields.echo.response_bytes, v.name);
          assert.equal(toHex(echo.padding), fields.echo.padding_hex, v.name);
        }
      }
    } else if (frame.type === "ack" || frame.type === "heartbeat") {
      assert.equal(frame.ack, BigInt(want.ack), v.name);
    } else {
      const control = decodeControl(frame.body);
      const [kind, fields] = Object.entries(want.control)[0] as [string, any];
      assert.equal(control.kind.case, kind, v.name);
      const value = control.kind.value as any;
      for (const [k, x] of Object.entries(fields)) {
        if (typeof x === "object") continue; // nested (resume): checked by the bytes below
        const name = k.replace(/_hex$/, "").replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());
        const got = value[name];
        if (k.endsWith("_hex")) assert.equal(toHex(got), x, `${v.name}.${k}`);
        else if (typeof got === "bigint") assert.equal(got, BigInt(x as number), `${v.name}.${k}`);
        else assert.equal(got, x, `${v.name}.${k}`);
      }
    }
    // Re-encoding the decoded frame gives the same bytes (protobuf bodies are canonical).
    assert.equal(toHex(encodeFrame(frame)), v.hex, v.name);
  }
});

test("frames.json: every invalid frame is refused with its named error", () => {
  const doc = vectors("frames.json");
  for (const v of doc.invalid) {
    const max = v.max_frame_bytes ? Number(v.max_frame_bytes) : undefined;
    assert.throws(
      () => {
        const frame = decodeOne(hex(v.hex), max);
        if (frame.type === "control") decodeControl(frame.body);
        if (frame.type === "data") decodeEnvelope(frame.payload);
      },
      (e: unknown) => e instanceof FrameError && e.code === v.error,
      `${v.name}: ${v.error}`,
    );
  }
});

test("frames arrive in pieces: the decoder waits for whole frames", () => {
  const doc = vectors("frames.json");
  const all = doc.valid.map((v: any) => hex(v.hex));
  const stream = new Uint8Array(all.reduce((n: number, b: Uint8Array) => n + b.length, 0));
  let at = 0;
  for (const b of all) {
    stream.set(b, at);
    at += b.length;
  }
  const d = new FrameDecoder();
  const got: string[] = [];
  for (let i = 0; i < stream.length; i += 3) {
    d.push(stream.subarray(i, i + 3));
    for (let f = d.next(); f; f = d.next()) got.push(toHex(encodeFrame(f)));
  }
  assert.deepEqual(got, doc.valid.map((v: any) => v.hex));
});

test("state.json: every binary update decodes to the vector's state", () => {
  const doc = vectors("state.json");
  const schema = Schema.parse(JSON.stringify(doc.schema));
  const replicas = new Map<string, Replica>();
  let checked = 0;
  for (const v of doc.vectors) {
    if (v.codec !== "binary") continue; // the SDK decodes the binary codec only
    const base = v.base ? replicas.get(v.base) : undefined;
    const replica = new Replica(schema);
    if (base) {
      // Rebuild the base's state by replaying its chain (replicas are not cloneable).
      const chain: any[] = [];
      for (let b: any = v; b.base; ) {
        b = doc.vectors.find((x: any) => x.name === b.base);
        chain.unshift(b);
      }
      for (const b of chain) replica.apply(hex(b.hex));
    }
    const to = replica.apply(hex(v.hex));
    assert.equal(to, v.after_tick, v.name);
    assert.deepEqual(plain(replica.state), v.state, v.name);
    replicas.set(v.name, replica);
    checked++;
  }
  assert.ok(checked >= 8, `${checked} binary vectors`);
});

test("state.json: every JSON update decodes to the vector's state", () => {
  const doc = vectors("state.json");
  const schema = Schema.parse(JSON.stringify(doc.schema));
  let checked = 0;
  for (const v of doc.vectors) {
    if (v.codec !== "json") continue;
    const replica = new Replica(schema);
    const chain: any[] = [];
    for (let b: any = v; b.base; ) {
      b = doc.vectors.find((x: any) => x.name === b.base);
      chain.unshift(b);
    }
    for (const b of chain) replica.applyJson(b.text);
    assert.equal(replica.applyJson(v.text), v.after_tick, v.name);
    assert.deepEqual(plain(replica.state), v.state, v.name);
    checked++;
  }
  assert.ok(checked >= 3, `${checked} JSON vectors`);
  const r = new Replica(schema);
  assert.throws(() => r.applyJson('{"kind":"delta","from":0,"to":1}\n{"op":"set","path":"/nope","value":1}\n'), (e: unknown) => e instanceof DecodeError && e.code === "Json");
  assert.throws(() => r.applyJson("no header"), (e: unknown) => e instanceof DecodeError && e.code === "Truncated");
});

test("state.json: every invalid update is refused with its named error, and then only a snapshot applies", () => {
  const doc = vectors("state.json");
  const schema = Schema.parse(JSON.stringify(doc.schema));
  for (const v of doc.invalid) {
    const replica = new Replica(schema);
    assert.throws(
      () => replica.apply(hex(v.hex)),
      (e: unknown) => e instanceof DecodeError && e.code === v.error,
      `${v.name}: ${v.error}`,
    );
  }
  const replica = new Replica(schema);
  assert.throws(() => replica.apply(hex("0200010125")), DecodeError);
  assert.throws(() => replica.apply(hex("01010200")), (e: unknown) => e instanceof DecodeError && e.code === "NeedsSnapshot");
  replica.apply(hex("02000000"));
  assert.equal(replica.version, 0);
});

test("random bytes never crash the decoders: a typed error or a value", () => {
  const doc = vectors("state.json");
  const schema = Schema.parse(JSON.stringify(doc.schema));
  const seeds = doc.vectors.filter((v: any) => v.codec === "binary").map((v: any) => hex(v.hex));
  let state = 42;
  const rand = () => (state = (state * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
  for (let i = 0; i < 20_000; i++) {
    const seed = seeds[i % seeds.length]!;
    const bytes = seed.slice();
    // Flip, cut or extend a few bytes of a valid update.
    for (let k = 0; k < 1 + Math.floor(rand() * 4); k++) bytes[Math.floor(rand() * bytes.length)] = Math.floor(rand() * 256);
    const input = rand() < 0.3 ? bytes.subarray(0, Math.floor(rand() * bytes.length)) : bytes;
    try {
      new Replica(schema).apply(input);
    } catch (e) {
      assert.ok(e instanceof DecodeError, `${toHex(input)}: ${e}`);
    }
    const d = new FrameDecoder(1024);
    d.push(input);
    try {
      const f = d.next();
      if (f?.type === "control") decodeControl(f.body);
      if (f?.type === "data") decodeEnvelope(f.payload);
    } catch (e) {
      assert.ok(e instanceof FrameError, `${toHex(input)}: ${e}`);
    }
  }
  // The generated encoder agrees with the echo vector's body.
  const body = create(EchoRequestSchema, { responseBytes: 4, padding: hex("5a5a5a5a") });
  assert.equal(body.responseBytes, 4);
});
