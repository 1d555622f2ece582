// Against a real gateway (the repository's binary, started here): the handshake, RPC, a
// session resumed through cut connections with nothing lost or repeated, and a replica that
// equals the server's state after thousands of random patches.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import WebSocket from "ws";
import { create, fromBinary } from "@bufbuild/protobuf";
import { BackpressureError, Client, ClosedError, StatusError, webSocket } from "../src/index.js";
import { tcp } from "../src/node.js";
import { Channels } from "../src/channels.js";
import { CloseReason, EchoRequestSchema, Status, toBinary } from "../src/proto.js";
import { ChannelType, DeltaCodec } from "../src/gen/tickwire/v1/channel_pb.js";
import { CutProxy, plain, startGateway, until, type Gateway } from "./helpers.js";

let gw: Gateway;
before(async () => {
  gw = await startGateway(["session.resume_window=\"5s\"", "limits.messages_per_second=100000", "limits.message_burst=100000"]);
});
after(async () => {
  await gw.stop();
});

const echo = (responseBytes: number) => toBinary(EchoRequestSchema, create(EchoRequestSchema, { responseBytes }));

test("handshake and echo over TCP and over WebSocket", async () => {
  for (const connect of [tcp(gw.tcp.host, gw.tcp.port), webSocket(gw.ws, WebSocket)]) {
    const c = await Client.connect({ connect, token: "alice" });
    assert.equal(c.playerId, "alice");
    assert.equal(c.welcome.maxUnackedMessages, 1024);
    const body = await c.call("echo", echo(100));
    assert.equal(body.length, 100);
    await assert.rejects(c.call("nope"), (e: unknown) => e instanceof StatusError && e.status === Status.NOT_FOUND);
    c.close();
    await assert.rejects(c.call("echo", echo(1)), ClosedError);
  }
});

test("a bad token in jwt mode is refused with AUTH_FAILED", async () => {
  const jwt = await startGateway(['auth.mode="jwt"', 'auth.jwt_secret="s3cret-s3cret-s3cret-s3cret-s3cret"']);
  try {
    await assert.rejects(
      Client.connect({ connect: tcp(jwt.tcp.host, jwt.tcp.port), token: "not-a-jwt" }),
      (e: unknown) => e instanceof ClosedError && e.reason === CloseReason.AUTH_FAILED,
    );
  } finally {
    await jwt.stop();
  }
});

test("a session resumes through cut connections: every response once, in order", async () => {
  const proxy = await CutProxy.start(gw.tcp);
  try {
    const c = await Client.connect({ connect: tcp("127.0.0.1", proxy.port), token: "bob" });
    let resumed = 0;
    c.on("resumed", () => resumed++);
    const answers: number[] = [];
    const calls: Promise<void>[] = [];
    let cuts = 0;
    for (let i = 0; i < 2000; i++) {
      // The response size tells the answers apart.
      calls.push(c.call("echo", echo(1 + (i % 97)), 20_000).then((b) => void answers.push(b.length)));
      if (i % 250 === 125) {
        // Cut with answers in flight; the next 75 calls are made while the session resumes.
        await new Promise((r) => setTimeout(r, 5));
        proxy.cut();
        cuts++;
      }
      if (i % 250 === 200) await until(`resume ${cuts}`, () => resumed === cuts, 15_000);
      if (i % 50 === 0) await new Promise((r) => setImmediate(r));
    }
    await Promise.all(calls);
    assert.equal(answers.length, 2000, "none lost");
    assert.deepEqual(answers, Array.from({ length: 2000 }, (_, i) => 1 + (i % 97)), "in order, none repeated");
    assert.equal(resumed, 8, "one resume per cut");
    c.close();
  } finally {
    await proxy.close();
  }
});

test("calls beyond the unacknowledged window wait for acknowledgements, bounded: 3,000 made while the link is down", async () => {
  const c = await Client.connect({ connect: tcp(gw.tcp.host, gw.tcp.port), token: "burst", maxWaiting: 2000 });
  const windowSize = 1024; // DEFAULT_SESSION_CONFIG.maxUnackedMessages
  c.dropConnection();
  const answers: number[] = [];
  const calls: Promise<void>[] = [];
  // All at once, while the session resumes: 1,024 fill the window, the rest wait.
  for (let i = 0; i < windowSize + 2000; i++) {
    calls.push(c.call("echo", echo(1 + (i % 89)), 20_000).then((b) => void answers.push(b.length)));
  }
  // One more than maxWaiting: refused at once, typed; the session goes on.
  await assert.rejects(c.call("echo", echo(1)), (e: unknown) => e instanceof BackpressureError);
  await Promise.all(calls);
  assert.deepEqual(answers, Array.from({ length: windowSize + 2000 }, (_, i) => 1 + (i % 89)), "all answered once, in order");
  assert.equal((await c.call("echo", echo(2))).length, 2);
  c.close();
});

test("a replica equals the server's state after thousands of random patches", async () => {
  const schema = JSON.stringify({
    fields: [
      { name: "round", type: "int" },
      { name: "label", type: "string" },
      {
        name: "players",
        type: {
          map: {
            key: "string",
            value: {
              struct: [
                { name: "hp", type: "int" },
                { name: "pos", type: { quantized_vec3: { min: -100, max: 100, precision: 0.5 } } },
                { name: "tags", type: { list: "string" } },
              ],
            },
          },
        },
      },
      { name: "scores", type: { map: { key: "int", value: "float" } } },
    ],
  });
  const server = await Client.connect({ connect: tcp(gw.tcp.host, gw.tcp.port), token: "server:game" });
  const owner = new Channels(server);
  const { channelId } = await owner.create(ChannelType.SUBWORLD, "random", schema);
  const viewer = await Client.connect({ connect: webSocket(gw.ws, WebSocket), token: "viewer" });
  const sub = await new Channels(viewer).subscribe(channelId, { fanoutIntervalMs: 5 });
  const jsonViewer = await Client.connect({ connect: tcp(gw.tcp.host, gw.tcp.port), token: "json-viewer" });
  const jsonSub = await new Channels(jsonViewer).subscribe(channelId, { codec: DeltaCodec.JSON, fanoutIntervalMs: 7 });
  let updates = 0;
  sub.onUpdate(() => updates++);

  // The expected state, kept by applying the same patches here.
  const expect: any = { round: 0, label: "", players: {}, scores: {} };
  let seed = 7;
  const rand = (n: number) => (seed = (seed * 1103515245 + 12345) % 2 ** 31) % n;
  const names = ["ann", "bo", "cy", "di", "ed", "fay"];
  for (let i = 0; i < 3000; i++) {
    const lines: string[] = [];
    const op = rand(8);
    const who = names[rand(names.length)]!;
    if (op === 0) {
      expect.round = rand(1000) - 500;
      lines.push(JSON.stringify({ op: "set", path: "/round", value: expect.round }));
    } else if (op === 1) {
      expect.label = `l${rand(100)}é`;
      lines.push(JSON.stringify({ op: "set", path: "/label", value: expect.label }));
    } else if (op === 2 || (op === 3 && !expect.players[who])) {
      const p = { hp: rand(100), pos: [rand(400) / 2 - 100, 0, rand(400) / 2 - 100], tags: [] as string[] };
      expect.players[who] = p;
      lines.push(JSON.stringify({ op: "set", path: `/players/${who}`, value: p }));
    } else if (op === 3) {
      expect.players[who].hp = rand(100);
      lines.push(JSON.stringify({ op: "set", path: `/players/${who}/hp`, value: expect.players[who].hp }));
    } else if (op === 4 && expect.players[who]) {
      delete expect.players[who];
      lines.push(JSON.stringify({ op: "remove", path: `/players/${who}` }));
    } else if (op === 5 && expect.players[who]) {
      const tag = `t${rand(10)}`;
      expect.players[who].tags.push(tag);
      lines.push(JSON.stringify({ op: "push", path: `/players/${who}/tags`, value: tag }));
    } else if (op === 6) {
      const k = String(rand(20) - 10);
      expect.scores[k] = rand(1000) / 8;
      lines.push(JSON.stringify({ op: "set", path: `/scores/${k}`, value: expect.scores[k] }));
    } else {
      const k = String(rand(20) - 10);
      if (k in expect.scores) {
        delete expect.scores[k];
        lines.push(JSON.stringify({ op: "remove", path: `/scores/${k}` }));
      }
    }
    if (lines.length) await owner.update(channelId, lines.join("\n"));
  }
  const caughtUp = (state: unknown) => JSON.stringify(plain(state)) === JSON.stringify(expect);
  await until("the replicas catch up", () => caughtUp(sub.replica.state) && caughtUp(jsonSub.replica.state), 15_000).catch(() => {});
  assert.deepEqual(plain(sub.replica.state), expect, "binary");
  assert.deepEqual(plain(jsonSub.replica.state), expect, "JSON");
  jsonViewer.close();
  assert.ok(updates > 10, `${updates} updates`);
  viewer.close();
  server.close();
});

test("a callback that throws ends nothing: the other callbacks run, the session goes on, the error is reported", async () => {
  const schema = JSON.stringify({ fields: [{ name: "n", type: "int" }] });
  const server = await Client.connect({ connect: tcp(gw.tcp.host, gw.tcp.port), token: "server:thrower" });
  const owner = new Channels(server);
  const { channelId } = await owner.create(ChannelType.SUBWORLD, "throws", schema);
  const errors: unknown[] = [];
  const c = await Client.connect({ connect: tcp(gw.tcp.host, gw.tcp.port), token: "careless", onCallbackError: (e) => errors.push(e) });
  const sub = await new Channels(c).subscribe(channelId, { fanoutIntervalMs: 5 });
  let seen = 0;
  sub.onUpdate(() => {
    throw new Error("a bug in the game's callback");
  });
  sub.onUpdate(() => seen++);
  for (let n = 1; n <= 5; n++) {
    await owner.update(channelId, JSON.stringify({ op: "set", path: "/n", value: n }));
    await until(`update ${n}`, () => sub.replica.state["n"] === n);
  }
  assert.ok(seen >= 5, `the second callback ran on every update (${seen})`);
  assert.equal(errors.length, seen, "each throw was reported once");
  assert.ok(errors.every((e) => e instanceof Error && e.message === "a bug in the game's callback"));
  assert.equal((await c.call("echo", echo(3))).length, 3, "the session goes on");
  c.close();
  server.close();
});
