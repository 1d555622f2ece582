// The SDK's spatial view (§14) against a real gateway with a [spatial] layout: a watcher's
// cells fill from its area of interest, an entity a server spawns and moves shows in the cell
// it is in (and leaves the one it was in), a smaller area drops the cells it no longer touches,
// and no area drops them all.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Client, FIRST_CELL_ID, Spatial, StatusError } from "../src/index.js";
import { tcp } from "../src/node.js";
import { PublishSchema, RegisterServerSchema, SpawnEntitySchema, SpawnResultSchema, Status } from "../src/proto.js";
import { startGateway, until, type Gateway } from "./helpers.js";

// 10 × 10 cells of 20 m from (-100, -100); 2 × 2 servers, each a block of 5 × 5 cells.
const CELLS_X = 10;
const cellId = (column: number, row: number) => FIRST_CELL_ID + BigInt(row * CELLS_X + column);

let gw: Gateway;
before(async () => {
  gw = await startGateway([
    "spatial.origin=[-100.0, -100.0]",
    "spatial.cell_size=20.0",
    "spatial.cells=[10, 10]",
    "spatial.servers=[2, 2]",
  ]);
});
after(async () => {
  await gw.stop();
});

test("a watcher's area of interest: cells, an entity that moves, areas that shrink and go", async () => {
  const server = await Client.connect({ connect: tcp(gw.tcp.host, gw.tcp.port), token: "server:slot-0" });
  await server.call("spatial.register", toBinary(RegisterServerSchema, create(RegisterServerSchema, { slot: 0 })));
  const spawned = fromBinary(
    SpawnResultSchema,
    await server.call(
      "spatial.spawn",
      toBinary(
        SpawnEntitySchema,
        create(SpawnEntitySchema, { position: { x: -90, y: 0, z: -90 }, valueJson: '{"pos": [-90, 0, -90], "yaw": 1.5, "data": "hello"}' }),
      ),
    ),
  );
  const id = String(spawned.entityId);
  assert.equal(spawned.cell?.channelId, cellId(0, 0));

  const watcher = await Client.connect({ connect: tcp(gw.tcp.host, gw.tcp.port), token: "watcher" });
  const view = new Spatial(watcher);
  const left: bigint[] = [];
  view.onCellLeft((cell) => left.push(cell));
  const cells = await view.interest({ box: { min: [-100, 0, -100], max: [100, 0, 100] } });
  assert.equal(cells.length, 100, "the whole world: 10 × 10 cells");

  const where = () => [...view.entities()].filter((e) => e.id === id);
  await until("the entity in view", () => where().length === 1);
  let [e] = where();
  assert.equal(e!.cell, cellId(0, 0));
  assert.equal(e!.value["data"], "hello");
  assert.deepEqual((e!.value["pos"] as number[]).map(Math.round), [-90, 0, -90]);

  // Moved within the server's own block: a cell change only. (The position places the entity;
  // the value is the game's, here with a `pos` of its own.)
  const value = '{"pos": [-50, 0, -90], "yaw": 1.5, "data": "moved"}';
  const move = create(PublishSchema, { entities: [{ entityId: spawned.entityId, position: { x: -50, y: 0, z: -90 }, valueJson: value }] });
  await server.call("spatial.publish", toBinary(PublishSchema, move));
  await until("the entity in its new cell", () => where().length === 1 && where()[0]!.cell === cellId(2, 0));
  [e] = where();
  assert.deepEqual((e!.value["pos"] as number[]).map(Math.round), [-50, 0, -90]);
  assert.equal(e!.value["data"], "moved");
  assert.equal(where().length, 1, "in one cell only");

  // A sphere of 5 m around it touches one cell: the 99 others leave the view.
  const now = await view.interest({ sphere: { center: [-50, 0, -90], radius: 5 } });
  assert.deepEqual(now.map((c) => c.channelId), [cellId(2, 0)]);
  await until("99 cells to leave", () => left.length === 99);
  assert.deepEqual([...view.cells.keys()], [cellId(2, 0)]);
  assert.equal(where().length, 1);

  await view.interest(null);
  await until("every cell to leave", () => view.cells.size === 0);
  assert.equal([...view.entities()].length, 0);
  watcher.close();
  server.close();
});

test("level of detail: a far cell's changes come later, an entity that crossed shows once, bad bands are refused", async () => {
  const server = await Client.connect({ connect: tcp(gw.tcp.host, gw.tcp.port), token: "server:slot-3" });
  await server.call("spatial.register", toBinary(RegisterServerSchema, create(RegisterServerSchema, { slot: 3 })));
  const spawn = create(SpawnEntitySchema, { position: { x: 90, y: 0, z: 90 }, valueJson: '{"data": "far"}' });
  const spawned = fromBinary(SpawnResultSchema, await server.call("spatial.spawn", toBinary(SpawnEntitySchema, spawn)));
  const id = String(spawned.entityId);

  const watcher = await Client.connect({ connect: tcp(gw.tcp.host, gw.tcp.port), token: "lod-watcher" });
  const view = new Spatial(watcher);
  // The box's reference point is its centre, (0, 0): cell [5, 5] (0..20 m) is at distance 0,
  // in every update; cell [9, 9], where the entity is, 113 m away: once every 4 s (counted from
  // the join: long enough for the steps below to end well inside it on a loaded machine).
  const lod = [
    { within: 10, intervalMs: 0 },
    { within: 50, intervalMs: 100 },
    { within: 1000, intervalMs: 4000 },
  ];
  const cells = await view.interest({ box: { min: [-100, 0, -100], max: [100, 0, 100] } }, { lod });
  assert.equal(cells.length, 100);
  const copies = () => [...view.cells].filter(([, r]) => id in ((r.state["entities"] as object | undefined) ?? {}));
  await until("the far entity in view", () => copies().length === 1);

  // It walks into the near cell: that cell's update comes at once, the far cell's removal up to
  // 4 s later. Meanwhile both replicas hold it, and `entities()` gives it once, as the near
  // cell has it.
  const move = create(PublishSchema, { entities: [{ entityId: spawned.entityId, position: { x: 10, y: 0, z: 10 }, valueJson: '{"data": "near"}' }] });
  await server.call("spatial.publish", toBinary(PublishSchema, move));
  const near = () => [...view.entities()].filter((e) => e.id === id);
  await until("the entity in the near cell", () => near().some((e) => e.cell === cellId(5, 5)));
  assert.equal(copies().length, 2, "the far cell's removal is held back");
  assert.deepEqual(near().map((e) => [e.cell, e.value["data"]]), [[cellId(5, 5), "near"]]);
  // The held-back removal comes in the end.
  await until("the far cell's removal", () => copies().length === 1);
  assert.deepEqual(copies().map(([cell]) => cell), [cellId(5, 5)]);

  await assert.rejects(
    view.interest({ sphere: { center: [0, 0, 0], radius: 5 } }, { lod: [{ within: 50, intervalMs: 0 }, { within: 10, intervalMs: 100 }] }),
    (e: unknown) => e instanceof StatusError && e.status === Status.INVALID_ARGUMENT && e.detail.startsWith("level of detail: "),
  );
  watcher.close();
  server.close();
});
