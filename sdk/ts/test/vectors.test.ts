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
import { fromBinary, fromJson, toBinary, type DescMessage } from "@bufbuild/protobuf";
import {
  ChannelUpdatesSchema,
  HandoverSchema,
  PublishSchema,
  ReleaseSchema,
  SetInterestSchema,
  SpawnEntitySchema,
} from "../src/gen/tickwire/v1/spatial_pb.js";
import { hex, plain, toHex, vectors } from "./helpers.js";

/** Each field `fields` describes (nested messages too, such as a Hello's resume) is `value`'s. */
function checkFields(value: any, fields: Record<string, unknown>, path: string): void {
  for (const [k, x] of Object.entries(fields)) {
    const name = k.replace(/_hex$/, "").replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());
    const got = value[name];
    if (x !== null && typeof x === "object") checkFields(got, x as Record<string, unknown>, `${path}.${k}`);
    else if (k.endsWith("_hex")) assert.equal(toHex(got), x, `${path}.${k}`);
    else if (typeof got === "bigint") assert.equal(got, BigInt(x as number), `${path}.${k}`);
    else assert.equal(got, x, `${path}.${k}`);
  }
}

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
      checkFields(control.kind.value, fields, v.name);
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

test("JSON updates: an int map key has one spelling", () => {
  const schema = Schema.parse(JSON.stringify({ fields: [{ name: "m", type: { map: { key: "int", value: "int" } } }] }));
  const update = (key: string) => `{"kind":"snapshot","from":0,"to":1}\n{"op":"set","path":"/m","value":{"${key}":1}}\n`;
  for (const key of ["0", "-1", "7", "9007199254740993", "9223372036854775807", "-9223372036854775808"]) {
    const r = new Replica(schema);
    assert.equal(r.applyJson(update(key)), 1, key);
    assert.deepEqual(Object.keys((r.state as any).m), [key], key);
  }
  // A vec3 part that is not finite arrives as null and is read as NaN.
  const v3 = Schema.parse(JSON.stringify({ fields: [{ name: "v", type: "vec3" }] }));
  const r = new Replica(v3);
  r.applyJson('{"kind":"snapshot","from":0,"to":1}\n{"op":"set","path":"/v","value":[1,null,2]}\n');
  const v = (r.state as any).v;
  assert.ok(v[0] === 1 && Number.isNaN(v[1]) && v[2] === 2, String(v));
  assert.throws(() => new Replica(schema).applyJson('{"kind":"snapshot","from":0,"to":1}\n{"op":"set","path":"/m/01","value":1}\n'), (e: unknown) => e instanceof DecodeError);
  for (const key of ["01", "+7", "-0", "", "1.0", " 1", "0x1", "9223372036854775808", "-9223372036854775809"]) {
    assert.throws(() => new Replica(schema).applyJson(update(key)), (e: unknown) => e instanceof DecodeError && e.code === "Json", key);
  }
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

/** A pseudo-random source, the same on every run. */
function lcg(seed: number): () => number {
  let state = seed;
  return () => (state = (state * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
}

/** Flips a few bytes of `seed`, and sometimes cuts it short. */
function mutate(seed: Uint8Array, rand: () => number, keep = 0): Uint8Array {
  const bytes = seed.slice();
  const span = bytes.length - keep;
  if (span > 0) {
    for (let k = 0; k < 1 + Math.floor(rand() * 4); k++) bytes[keep + Math.floor(rand() * span)] = Math.floor(rand() * 256);
  }
  return rand() < 0.3 ? bytes.subarray(0, keep + Math.floor(rand() * (span + 1))) : bytes;
}

test("random bytes never crash the update decoders: a typed error or a value", () => {
  const doc = vectors("state.json");
  const schema = Schema.parse(JSON.stringify(doc.schema));
  const byName = new Map<string, any>(doc.vectors.map((v: any) => [v.name, v]));
  // A replica holding what `v` applies to: its chain of bases, applied in order.
  const replicaFor = (v: any): Replica => {
    const chain: any[] = [];
    for (let b = v.base; b !== undefined; b = byName.get(b)?.base) chain.unshift(byName.get(b));
    const r = new Replica(schema);
    for (const base of chain) {
      if (base.codec === "json") r.applyJson(base.text ?? hex(base.hex));
      else r.apply(hex(base.hex));
    }
    return r;
  };
  const rand = lcg(42);
  let applied = 0;
  let refused = 0;
  for (let i = 0; i < 20_000; i++) {
    const v = doc.vectors[i % doc.vectors.length];
    if (v.codec !== "binary") continue;
    // The header (kind, from, to) kept whole half the time, so the body's decoder is reached.
    const input = mutate(hex(v.hex), rand, rand() < 0.5 ? 3 : 0);
    try {
      replicaFor(v).apply(input);
      applied++;
    } catch (e) {
      assert.ok(e instanceof DecodeError, `${toHex(input)}: ${e}`);
      refused++;
    }
  }
  // Both outcomes happen: the bodies were decoded, not refused at the header.
  assert.ok(applied > 100 && refused > 100, `${applied} applied, ${refused} refused`);
});

test("random JSON never crashes the JSON update decoder: a DecodeError or a value", () => {
  const doc = vectors("state.json");
  const schema = Schema.parse(JSON.stringify(doc.schema));
  const json = doc.vectors.filter((v: any) => v.codec === "json");
  assert.ok(json.length > 0, "the vectors have JSON updates");
  // Lines that parse as JSON but are not what a line must be, and near-misses of real ops.
  const pool = [
    "null", "1", "[]", "\"x\"", "{}", "true", '{"op":"set"}', '{"op":"set","path":"/nope","value":1}',
    '{"op":"len","path":"/","value":-1}', '{"op":"set","path":3}', '{"kind":"delta","from":"0","to":1}',
    '{"op":"remove","path":"/players/~2"}', '{"op":"len","path":"/log","value":1e300}', "{",
  ];
  const rand = lcg(7);
  let applied = 0;
  let refused = 0;
  for (let i = 0; i < 10_000; i++) {
    const v = json[i % json.length];
    const text: string = v.text ?? new TextDecoder().decode(hex(v.hex));
    const lines = text.split("\n");
    const at = Math.floor(rand() * lines.length);
    if (rand() < 0.6) lines[at] = pool[Math.floor(rand() * pool.length)]!;
    else {
      const l = lines[at]!;
      const c = Math.floor(rand() * (l.length + 1));
      lines[at] = l.slice(0, c) + "{}[],:\"0-e"[Math.floor(rand() * 11)] + l.slice(c + 1);
    }
    const input = lines.join("\n");
    try {
      new Replica(schema).applyJson(input);
      applied++;
    } catch (e) {
      assert.ok(e instanceof DecodeError, `${JSON.stringify(input)}: ${e}`);
      refused++;
    }
  }
  assert.ok(refused > 1000, `${applied} applied, ${refused} refused`);
});

test("random bytes never crash the frame decoder: a FrameError or a frame", () => {
  const doc = vectors("frames.json");
  const seeds: Uint8Array[] = [...doc.valid, ...doc.invalid].map((v: any) => hex(v.hex));
  const rand = lcg(3);
  let frames = 0;
  for (let i = 0; i < 20_000; i++) {
    // The length prefix kept whole (and fixed up after a cut) most of the time, so the body's
    // decoders are reached; otherwise random.
    const keepPrefix = rand() < 0.8;
    const input = mutate(seeds[i % seeds.length]!, rand, keepPrefix ? 4 : 0).slice();
    if (keepPrefix && input.length >= 4) new DataView(input.buffer).setUint32(0, input.length - 4);
    const d = new FrameDecoder(1024);
    d.push(input);
    try {
      const f = d.next();
      if (f?.type === "control") decodeControl(f.body);
      if (f?.type === "data") decodeEnvelope(f.payload);
      if (f) frames++;
    } catch (e) {
      assert.ok(e instanceof FrameError, `${toHex(input)}: ${e}`);
    }
  }
  assert.ok(frames > 1000, `${frames} frames decoded`);
});

test("the generated protobuf encoder writes the echo vector's request body", () => {
  const doc = vectors("frames.json");
  const echo = doc.valid.find((v: any) => v.name === "data_echo_request");
  const body = toBinary(EchoRequestSchema, create(EchoRequestSchema, { responseBytes: 4, padding: hex("5a5a5a5a") }));
  // DATA frame: length (4), type, seq 1, ack 0, then the Envelope whose request body ends it.
  assert.ok(toHex(hex(echo.hex)).endsWith(toHex(body)), `${toHex(body)} in ${echo.hex}`);
  assert.equal(toHex(body), "080412045a5a5a5a");
});

test("spatial.json: every message, built from its description by the SDK's own protobuf, is the vector's bytes", () => {
  const schemas: Record<string, DescMessage> = {
    ChannelUpdates: ChannelUpdatesSchema,
    Handover: HandoverSchema,
    Publish: PublishSchema,
    Release: ReleaseSchema,
    SetInterest: SetInterestSchema,
    SpawnEntity: SpawnEntitySchema,
  };
  // The file writes bytes as `<name>_hex`; protobuf's JSON form wants `<name>` in base64.
  const asProtoJson = (v: any): any => {
    if (Array.isArray(v)) return v.map(asProtoJson);
    if (v === null || typeof v !== "object") return v;
    return Object.fromEntries(
      Object.entries(v).map(([k, x]) =>
        k.endsWith("_hex") ? [k.slice(0, -4), Buffer.from(x as string, "hex").toString("base64")] : [k, asProtoJson(x)],
      ),
    );
  };
  const doc = vectors("spatial.json");
  assert.ok(doc.vectors.length >= 8);
  for (const v of doc.vectors) {
    const schema = schemas[v.message];
    assert.ok(schema, `${v.name}: a message the test knows (${v.message})`);
    const built = fromJson(schema, asProtoJson(v.fields));
    assert.equal(toHex(toBinary(schema, built)), v.hex, v.name);
    assert.deepEqual(fromBinary(schema, hex(v.hex)), built, `${v.name}: the bytes decode to the description`);
  }
});
