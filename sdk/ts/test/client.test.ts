// The Client against a scripted gateway in memory: bytes arrive exactly as a test says (several
// frames in one chunk, chunks back to back before the client has taken the connection over),
// and every frame the client writes is read back. For what a real gateway cannot be made to do
// on cue.

import assert from "node:assert/strict";
import { test } from "node:test";
import { create } from "@bufbuild/protobuf";
import { Client } from "../src/client.js";
import { Channels } from "../src/channels.js";
import { Spatial } from "../src/spatial.js";
import { BackpressureError, ClosedError, TimeoutError } from "../src/errors.js";
import { FrameDecoder, encodeFrame, type Frame } from "../src/frame.js";
import { decodeControl, decodeEnvelope, encode, encodeControl, encodeEnvelope } from "../src/messages.js";
import {
  CloseReason,
  CloseSchema,
  PushSchema,
  ResponseSchema,
  Status,
  WelcomeSchema,
  type Request,
} from "../src/gen/tickwire/v1/control_pb.js";
import { ChannelUpdateSchema, SubscribeResultSchema, SubscribeSchema } from "../src/gen/tickwire/v1/channel_pb.js";
import { fromBinary } from "@bufbuild/protobuf";
import { ChannelUpdatesSchema, InterestResultSchema, SetInterestSchema } from "../src/gen/tickwire/v1/spatial_pb.js";
import type { Transport } from "../src/transport.js";

/** One connection as the gateway's end sees it. */
class Link implements Transport {
  onData: (bytes: Uint8Array) => void = () => {};
  onClose: (error?: Error) => void = () => {};
  closed = false;
  private readonly decoder = new FrameDecoder(1 << 24);
  /** Every frame the client wrote. */
  readonly frames: Frame[] = [];
  /** Called with each frame the client writes. */
  onFrame: (frame: Frame) => void = () => {};
  private seq = 0n;

  write(bytes: Uint8Array): void {
    this.decoder.push(bytes);
    for (let f = this.decoder.next(); f; f = this.decoder.next()) {
      this.frames.push(f);
      this.onFrame(f);
    }
  }

  close(): void {
    this.closed = true;
  }

  /** A DATA frame with the next sequence number. */
  data(envelope: Parameters<typeof encodeEnvelope>[0]): Uint8Array {
    this.seq += 1n;
    return encodeFrame({ type: "data", seq: this.seq, ack: 0n, payload: encodeEnvelope(envelope) });
  }

  push(topic: string, body: Uint8Array = new Uint8Array(0)): Uint8Array {
    return this.data({ case: "push", value: create(PushSchema, { topic, body }) });
  }

  respond(id: bigint, body: Uint8Array = new Uint8Array(0)): Uint8Array {
    return this.data({ case: "response", value: create(ResponseSchema, { id, status: Status.OK, body }) });
  }

  /** The requests among the client's frames. */
  requests(): Request[] {
    return this.frames.flatMap((f) => {
      if (f.type !== "data") return [];
      const e = decodeEnvelope(f.payload);
      return e.kind.case === "request" ? [e.kind.value] : [];
    });
  }
}

function welcome(fields: { maxFrameBytes?: number; resumed?: boolean } = {}): Uint8Array {
  const w = create(WelcomeSchema, {
    sessionId: new Uint8Array(16),
    resumeToken: new Uint8Array(32),
    heartbeatMs: 60_000,
    resumeWindowMs: 60_000,
    maxFrameBytes: 1 << 20,
    ...fields,
  });
  return encodeFrame({ type: "control", body: encodeControl({ case: "welcome", value: w }) });
}

const join = (...parts: Uint8Array[]) => {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
};

/**
 * A client whose connection answers the Hello with `answer(link)`: the chunks it returns are
 * delivered back to back, in one turn, right after the Hello.
 */
async function connect(answer: (link: Link) => Uint8Array[], opts: { handshakeTimeoutMs?: number } = {}) {
  const links: Link[] = [];
  const client = await Client.connect({
    connect: async () => {
      const link = new Link();
      links.push(link);
      link.onFrame = (f) => {
        if (f.type === "control" && decodeControl(f.body).kind.case === "hello") {
          queueMicrotask(() => {
            for (const chunk of answer(link)) link.onData(chunk);
          });
        }
      };
      return link;
    },
    ...opts,
  });
  return { client, links };
}

const tick = () => new Promise((r) => setTimeout(r, 0));

test("messages right behind the Welcome, over several chunks before the client takes the connection over, all arrive in order", async () => {
  const { client, links } = await connect((l) => [join(welcome(), l.push("a")), join(l.push("b"), l.push("c"))]);
  const got: string[] = [];
  client.on("push", (topic) => got.push(topic));
  let closed: ClosedError | undefined;
  client.on("closed", (e) => (closed = e));
  await tick();
  await tick();
  assert.equal(closed, undefined, `${closed}`);
  // Added after connect() resolved, the listener still saw the pushes that came with the Welcome.
  assert.deepEqual(got, ["a", "b", "c"]);
  assert.equal(links[0]!.closed, false);
  client.close();
});

test("a message too large for the gateway's frames is refused before it is sent, and the session goes on", async () => {
  const { client, links } = await connect(() => [welcome({ maxFrameBytes: 1000 })]);
  assert.throws(() => client.push("big", new Uint8Array(2000)), BackpressureError);
  await assert.rejects(client.call("big", new Uint8Array(2000)), BackpressureError);
  client.push("small", new Uint8Array(10));
  const sent = links[0]!.frames.filter((f) => f.type === "data");
  assert.equal(sent.length, 1, "only the small push left");
  assert.equal(client.closedWith, undefined);
  client.close();
});

test("a call that timed out while waiting for room in the window is never sent", async () => {
  const { client, links } = await connect(() => [welcome()]);
  const link = links[0]!;
  // The first call fills the client's unacknowledged window (1 MiB); the second waits.
  const first = client.call("first", new Uint8Array(700_000), 5_000);
  await assert.rejects(client.call("second", new Uint8Array(700_000), 30), TimeoutError);
  // The gateway acknowledges the first: room again, and nothing waiting to fill it.
  link.onData(join(encodeFrame({ type: "ack", ack: 1n }), link.respond(1n)));
  await first;
  assert.deepEqual(link.requests().map((r) => r.method), ["first"]);
  client.close();
});

test("a handshake with no Welcome times out, and its connection is closed", async () => {
  const links: Link[] = [];
  await assert.rejects(
    Client.connect({
      connect: async () => {
        const link = new Link();
        links.push(link);
        return link;
      },
      handshakeTimeoutMs: 30,
    }),
    TimeoutError,
  );
  assert.equal(links.length, 1);
  assert.ok(links[0]!.closed);
});

test("bytes that break the protocol end the session with a Close to the gateway", async () => {
  const { client, links } = await connect(() => [welcome()]);
  let closed: ClosedError | undefined;
  client.on("closed", (e) => (closed = e));
  const link = links[0]!;
  // A DATA frame whose payload is not an Envelope.
  link.onData(encodeFrame({ type: "data", seq: 1n, ack: 0n, payload: Uint8Array.of(0xff, 0xff) }));
  assert.equal(closed?.reason, CloseReason.PROTOCOL_ERROR);
  const last = link.frames.at(-1)!;
  assert.equal(last.type, "control");
  const control = decodeControl((last as { body: Uint8Array }).body);
  assert.equal(control.kind.case, "close");
  assert.equal(control.kind.case === "close" && control.kind.value.reason, CloseReason.PROTOCOL_ERROR);
  assert.ok(link.closed);
});

test("a subscription whose update does not decode asks for a snapshot: unsubscribe, subscribe again from a snapshot", async () => {
  const { client, links } = await connect(() => [welcome()]);
  const link = links[0]!;
  const channels = new Channels(client);
  const schemaJson = JSON.stringify({ fields: [{ name: "n", type: "int" }] });
  // The gateway answers every request; a subscribe also gets the snapshot of version 1.
  link.onFrame = (f) => {
    if (f.type !== "data") return;
    const e = decodeEnvelope(f.payload);
    if (e.kind.case !== "request") return;
    const r = e.kind.value;
    if (r.method === "channel.subscribe") {
      const result = encode(SubscribeResultSchema, { channelId: 7n, schemaJson });
      const snapshot = encode(ChannelUpdateSchema, { channelId: 7n, update: Uint8Array.of(0x02, 0x00, 0x01) });
      queueMicrotask(() => link.onData(join(link.respond(r.id, result), link.push("channel.update", snapshot))));
    } else {
      queueMicrotask(() => link.onData(link.respond(r.id)));
    }
  };
  const sub = await channels.subscribe(7n, { skipFirstFullState: true });
  await tick();
  assert.equal(sub.replica.version, 1);
  const errors: string[] = [];
  sub.onError((e) => errors.push(e.code));
  // A delta from a version the replica does not hold.
  const bad = encode(ChannelUpdateSchema, { channelId: 7n, update: Uint8Array.of(0x01, 0x05, 0x06) });
  link.onData(link.push("channel.update", bad));
  await tick();
  await tick();
  assert.deepEqual(errors, ["VersionMismatch"]);
  const methods = link.requests().map((r) => r.method);
  assert.deepEqual(methods, ["channel.subscribe", "channel.unsubscribe", "channel.subscribe"]);
  // The second subscribe asks for the full state, whatever the first asked.
  const again = fromBinary(SubscribeSchema, link.requests()[2]!.body);
  assert.equal(again.options?.skipFirstFullState ?? false, false);
  assert.equal(sub.replica.version, 1, "the snapshot that followed applied");
  client.close();
});

test("a spatial view whose cell update does not decode asks for snapshots: the area is cleared and set again", async () => {
  const { client, links } = await connect(() => [welcome()]);
  const link = links[0]!;
  const spatial = new Spatial(client);
  const cellSchemaJson = JSON.stringify({ fields: [{ name: "entities", type: { map: { key: "int", value: "int" } } }] });
  const cell = (1n << 40n) + 3n;
  link.onFrame = (f) => {
    if (f.type !== "data") return;
    const e = decodeEnvelope(f.payload);
    if (e.kind.case !== "request") return;
    const id = e.kind.value.id;
    const result = encode(InterestResultSchema, { cellSchemaJson });
    queueMicrotask(() => link.onData(link.respond(id, result)));
  };
  await spatial.interest({ sphere: { center: [0, 0, 0], radius: 5 } });
  const snapshot = encode(ChannelUpdatesSchema, { updates: [{ channelId: cell, update: Uint8Array.of(0x02, 0x00, 0x01) }] });
  link.onData(link.push("channel.updates", snapshot));
  assert.equal(spatial.cells.get(cell)?.version, 1);
  const errors: bigint[] = [];
  spatial.onError((id) => errors.push(id));
  const bad = encode(ChannelUpdatesSchema, { updates: [{ channelId: cell, update: Uint8Array.of(0x01, 0x07, 0x08) }] });
  link.onData(link.push("channel.updates", bad));
  for (let i = 0; i < 4; i++) await tick();
  assert.deepEqual(errors, [cell]);
  const areas = link.requests().map((r) => fromBinary(SetInterestSchema, r.body).area.case);
  assert.deepEqual(areas, ["sphere", undefined, "sphere"]);
  client.close();
});

test("a push whose body does not decode ends the session with PROTOCOL_ERROR, told to the gateway", async () => {
  const { client, links } = await connect(() => [welcome()]);
  const link = links[0]!;
  new Channels(client);
  let closed: ClosedError | undefined;
  client.on("closed", (e) => (closed = e));
  link.onData(link.push("channel.update", Uint8Array.of(0x0a, 0xff)));
  assert.equal(closed?.reason, CloseReason.PROTOCOL_ERROR, `${closed}`);
  const last = link.frames.at(-1)!;
  assert.ok(last.type === "control" && decodeControl(last.body).kind.case === "close");
});

test("a resume refused before the gateway read its Hello (OVERLOADED) is tried again, and the session goes on", async () => {
  const overloaded = encodeFrame({
    type: "control",
    body: encodeControl({ case: "close", value: create(CloseSchema, { reason: CloseReason.OVERLOADED, message: "busy" }) }),
  });
  let hellos = 0;
  const { client, links } = await connect(() => {
    hellos += 1;
    // The first Hello opens the session; the first resume is refused; the second is welcomed.
    if (hellos === 2) return [overloaded];
    return [welcome({ resumed: hellos > 1 })];
  });
  let closed: ClosedError | undefined;
  client.on("closed", (e) => (closed = e));
  let resumed = 0;
  client.on("resumed", () => resumed++);
  links[0]!.onClose(new Error("cut"));
  const deadline = Date.now() + 5000;
  while (resumed === 0 && closed === undefined && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
  assert.equal(closed, undefined, `${closed}`);
  assert.equal(resumed, 1);
  assert.equal(links.length, 3, "the session, the refused resume, the resume");
  client.close();
});
