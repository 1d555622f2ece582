// Why this exists: the SDK's replica decode rate (deltas per second) on the corpus that
// `tickwire bench sync --decode-corpus FILE` writes, beside the Rust replica's on the same
// bytes. Usage: npm run bench -- FILE
//
// Run it on an idle machine: it times wall clock over whole passes (≥ 2 s).

import { deepStrictEqual } from "node:assert/strict";
import { readFileSync } from "node:fs";
import { cpus } from "node:os";
import { Replica } from "../src/state/replica.js";
import { Schema } from "../src/state/schema.js";

const file = process.argv[2];
if (!file) {
  console.error("usage: npm run bench -- CORPUS.json (from `tickwire bench sync --players 30 --scenario sync-players --decode-corpus CORPUS.json`)");
  process.exit(2);
}
const corpus = JSON.parse(readFileSync(file, "utf8"));
const schema = Schema.parse(JSON.stringify(corpus.schema));
const fromHex = (h: string) => Uint8Array.from(h.match(/../g) ?? [], (b) => parseInt(b, 16));
const updates: Uint8Array[] = corpus.updates_hex.map(fromHex);
const deltas = updates.slice(1);
const bytes = deltas.reduce((n, u) => n + u.length, 0);

// Verified once (the deltas lead to the room's last snapshot), then timed.
const check = new Replica(schema);
for (const u of updates) check.apply(u);
const last = new Replica(schema);
last.apply(fromHex(corpus.last_snapshot_hex));
deepStrictEqual(check.state, last.state, "the replica after the deltas differs from the room's last snapshot");

let passes = 0;
let ns = 0n;
const started = Date.now();
while (Date.now() - started < 2000 || passes < 3) {
  const r = new Replica(schema);
  r.apply(updates[0]!);
  const t0 = process.hrtime.bigint();
  for (const u of deltas) r.apply(u);
  ns += process.hrtime.bigint() - t0;
  passes++;
}
const seconds = Number(ns) / 1e9;
const perS = (passes * deltas.length) / seconds;
const cpu = cpus()[0]?.model ?? "unknown";
console.log(`machine: ${cpus().length} cores, ${cpu}; Node ${process.version}`);
console.log(
  `TypeScript replica: ${perS.toFixed(0)} deltas/s (${((passes * bytes) / seconds / 1e6).toFixed(1)} MB/s), ` +
    `one player of a ${corpus.players}-player room (${corpus.scenario}), ${deltas.length} deltas of ${(bytes / deltas.length).toFixed(0)} bytes on average`,
);
console.log(
  `Rust replica on the same corpus: ${Number(corpus.rust.deltas_per_s).toFixed(0)} deltas/s (${corpus.rust.machine}); ` +
    `TypeScript/Rust: ${(perS / corpus.rust.deltas_per_s).toFixed(2)}`,
);
