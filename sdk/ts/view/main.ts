// Why this exists: the live web view's page script (served by `tickwire demo`, or any gateway
// started with `--web ADDR`). It is an ordinary SDK client: it connects to the gateway over
// WebSocket, subscribes to the world (the `single` world channel, or every cell of the spatial
// world through an area of interest) and draws what its replicas hold, 60 times a second. The
// figures beside the map come from `/figures.json` of the process that serves the page.

import uPlot from "uplot";
import { Channels, Client, Spatial, webSocket, type Replica } from "../src/index.js";
import { ChannelType } from "../src/gen/tickwire/v1/channel_pb.js";

interface Layout {
  origin: [number, number];
  cell_size: number;
  cells: [number, number];
  servers: [number, number];
}

interface Page {
  ws_port: number;
  ws_tls: boolean;
  scenario: string;
  title: string;
  /** min/max null: a gateway serving some game; the map fits itself to the characters. */
  world: { min: [number, number] | null; max: [number, number] | null; obstacles: [number, number, number, number][]; layout: Layout | null };
}

/** One character as drawn: its id, position on the floor, heading and full state. */
interface Character {
  id: string;
  x: number;
  z: number;
  yaw: number;
  blocked: boolean;
  state: unknown;
}

const el = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const page: Page = await (await fetch("view.json")).json();
// A spatial world (`spatial`, `lod`, or a gateway with a [spatial] layout): watched cell by cell.
const spatial = page.world.layout !== null;
document.body.classList.toggle("spatial", spatial);
el("scenario").textContent = page.title;

// ---- Connecting -------------------------------------------------------------------------

const status = el("status");
function say(text: string, cls: "" | "live" | "down" = ""): void {
  status.textContent = text;
  status.className = cls;
}

function log(text: string): void {
  const events = el<HTMLOListElement>("events");
  const item = document.createElement("li");
  item.textContent = `${new Date().toLocaleTimeString()} ${text}`;
  events.prepend(item);
  while (events.children.length > 12) events.lastChild?.remove();
}

const params = new URLSearchParams(location.search);
const token = params.get("token") ?? `web-view-${Math.random().toString(36).slice(2, 10)}`;
const url = `${page.ws_tls ? "wss" : "ws"}://${location.hostname}:${page.ws_port}/`;
const client = await Client.connect({ connect: webSocket(url), token, clientName: "tickwire web view" });
client.on("linkLost", () => say("connection lost, resuming…", "down"));
client.on("resumed", () => say(`live (resumed) · ${url}`, "live"));
client.on("closed", (e) => say(`session over: ${e.message}`, "down"));

/** Reads every character the replicas hold now. */
let characters: () => Character[] = () => [];

if (spatial) {
  const view = new Spatial(client);
  const min: [number, number] = page.world.min ?? [-1e5, -1e5];
  const max: [number, number] = page.world.max ?? [1e5, 1e5];
  const cells = await view.interest({ box: { min: [min[0], -1e3, min[1]], max: [max[0], 1e3, max[1]] } });
  view.onEvent((e) => log(`spatial server ${e.slot}: ${e.kind === 1 ? "lost" : "joined"}${e.reason ? ` (${e.reason})` : ""}`));
  view.onError((cell, e) => log(`cell ${cell}: ${e.message}`));
  log(`watching ${cells.length} cells`);
  characters = () => {
    const out: Character[] = [];
    for (const e of view.entities()) out.push(character(e.id, e.value));
    return out;
  };
} else {
  const channels = new Channels(client);
  let replica: Replica | undefined;
  // The characters: the demo's `characters` map, or else the first top-level map whose
  // entries have a `pos` of three numbers.
  const isCharacter = (v: unknown) => typeof v === "object" && v !== null && Array.isArray((v as Record<string, unknown>)["pos"]);
  characters = () => {
    const state = replica?.state ?? {};
    const map = (state["characters"] ??
      Object.values(state).find((v) => typeof v === "object" && v !== null && !Array.isArray(v) && Object.values(v).some(isCharacter))) as
      | Record<string, unknown>
      | undefined;
    const out: Character[] = [];
    for (const [id, v] of Object.entries(map ?? {})) if (isCharacter(v)) out.push(character(id, v as Record<string, unknown>));
    return out;
  };
  const subscribe = async (): Promise<void> => {
    const list = await channels.list(ChannelType.GLOBAL);
    const world = list.find((c) => c.name === "world") ?? list[0];
    if (!world) {
      say("no global channel yet; looking again in 2 s");
      setTimeout(() => void subscribe(), 2000);
      return;
    }
    const sub = await channels.subscribe(world.channelId);
    sub.onEvent((e) => log(`channel event ${e.kind}${e.reason ? `: ${e.reason}` : ""}`));
    sub.onError((e) => log(`update refused: ${e.message}`));
    replica = sub.replica;
    log(`subscribed to channel ${world.channelId} (${world.name})`);
  };
  await subscribe();
}
say(`live · ${url}`, "live");

function character(id: string, v: Record<string, unknown>): Character {
  const pos = (v["pos"] as number[] | undefined) ?? [0, 0, 0];
  return { id, x: pos[0] ?? 0, z: pos[2] ?? 0, yaw: Number(v["yaw"] ?? 0), blocked: Boolean(v["blocked"]), state: v };
}

// ---- The map ----------------------------------------------------------------------------

const canvas = el<HTMLCanvasElement>("map");
const ctx = canvas.getContext("2d")!;
const { obstacles, layout } = page.world;
/** The floor shown: the world's, or (unknown) grown to fit every character seen, 10 m around. */
const fixed = page.world.min !== null && page.world.max !== null;
const min: [number, number] = page.world.min ? [...page.world.min] : [-10, -10];
const max: [number, number] = page.world.max ? [...page.world.max] : [10, 10];
function fit(cs: Character[]): void {
  if (fixed) return;
  let grew = false;
  for (const c of cs) {
    if (!Number.isFinite(c.x) || !Number.isFinite(c.z)) continue;
    if (c.x - 10 < min[0]) [min[0], grew] = [c.x - 10, true];
    if (c.z - 10 < min[1]) [min[1], grew] = [c.z - 10, true];
    if (c.x + 10 > max[0]) [max[0], grew] = [c.x + 10, true];
    if (c.z + 10 > max[1]) [max[1], grew] = [c.z + 10, true];
  }
  if (grew) resize();
}
const servers = layout ? layout.servers[0] * layout.servers[1] : 1;
/** Which server slot owns the cell holding (x, z) (§14: blocks of cells per slot). */
function slotOf(x: number, z: number): number {
  if (!layout) return 0;
  const col = Math.floor((x - layout.origin[0]) / layout.cell_size);
  const row = Math.floor((z - layout.origin[1]) / layout.cell_size);
  const bx = layout.cells[0] / layout.servers[0];
  const bz = layout.cells[1] / layout.servers[1];
  const sc = Math.min(layout.servers[0] - 1, Math.max(0, Math.floor(col / bx)));
  const sr = Math.min(layout.servers[1] - 1, Math.max(0, Math.floor(row / bz)));
  return sc + sr * layout.servers[0];
}
const hue = (slot: number) => (slot * 360) / Math.max(servers, 1);

let scale = 1;
let offset = [0, 0];
function resize(): void {
  const r = canvas.getBoundingClientRect();
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.round(r.width * dpr);
  canvas.height = Math.round(r.height * dpr);
  const pad = 16 * dpr;
  scale = Math.min((canvas.width - 2 * pad) / (max[0] - min[0]), (canvas.height - 2 * pad) / (max[1] - min[1]));
  offset = [(canvas.width - scale * (max[0] - min[0])) / 2, (canvas.height - scale * (max[1] - min[1])) / 2];
}
window.addEventListener("resize", resize);
resize();
// x to the right, z up (a map, seen from above).
const sx = (x: number) => offset[0]! + (x - min[0]) * scale;
const sy = (z: number) => canvas.height - offset[1]! - (z - min[1]) * scale;

/** Handovers seen (an entity's position moved into another server's block), to flash. */
const flashes: { x: number; z: number; at: number }[] = [];
const lastSlot = new Map<string, number>();
let selected: string | undefined;
let shown: Character[] = [];

function draw(now: number): void {
  shown = characters();
  fit(shown);
  ctx.fillStyle = "#0b0e11";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  if (layout) {
    for (let row = 0; row < layout.cells[1]; row++) {
      for (let col = 0; col < layout.cells[0]; col++) {
        const x0 = layout.origin[0] + col * layout.cell_size;
        const z0 = layout.origin[1] + row * layout.cell_size;
        ctx.fillStyle = `hsl(${hue(slotOf(x0 + 1e-3, z0 + 1e-3))} 35% 18%)`;
        ctx.fillRect(sx(x0), sy(z0 + layout.cell_size), layout.cell_size * scale - 1, layout.cell_size * scale - 1);
      }
    }
  } else {
    ctx.fillStyle = "#1b232b";
    ctx.fillRect(sx(min[0]), sy(max[1]), (max[0] - min[0]) * scale, (max[1] - min[1]) * scale);
  }
  ctx.fillStyle = "#3a444e";
  for (const [x0, z0, x1, z1] of obstacles) ctx.fillRect(sx(x0), sy(z1), (x1 - x0) * scale, (z1 - z0) * scale);

  const r = Math.max(2, 0.9 * scale);
  for (const c of shown) {
    const slot = slotOf(c.x, c.z);
    if (layout) {
      const before = lastSlot.get(c.id);
      if (before !== undefined && before !== slot) flashes.push({ x: c.x, z: c.z, at: now });
      lastSlot.set(c.id, slot);
    }
    ctx.fillStyle = c.blocked ? "#f07a6a" : layout ? `hsl(${hue(slot)} 80% 68%)` : "#8fd3ff";
    ctx.beginPath();
    ctx.arc(sx(c.x), sy(c.z), r, 0, 2 * Math.PI);
    ctx.fill();
    ctx.strokeStyle = ctx.fillStyle;
    ctx.beginPath();
    ctx.moveTo(sx(c.x), sy(c.z));
    ctx.lineTo(sx(c.x + Math.sin(c.yaw) * 2.2), sy(c.z + Math.cos(c.yaw) * 2.2));
    ctx.stroke();
    if (c.id === selected) {
      ctx.strokeStyle = "#ffffff";
      ctx.lineWidth = 2;
      ctx.beginPath();
      ctx.arc(sx(c.x), sy(c.z), r + 5, 0, 2 * Math.PI);
      ctx.stroke();
      ctx.lineWidth = 1;
    }
  }
  while (flashes.length > 0 && now - flashes[0]!.at > 700) flashes.shift();
  for (const f of flashes) {
    const t = (now - f.at) / 700;
    ctx.strokeStyle = `rgba(255, 240, 120, ${1 - t})`;
    ctx.lineWidth = 2;
    ctx.beginPath();
    ctx.arc(sx(f.x), sy(f.z), r + 4 + 14 * t, 0, 2 * Math.PI);
    ctx.stroke();
    ctx.lineWidth = 1;
  }
  el("characters").textContent = String(shown.length);
  requestAnimationFrame(draw);
}
requestAnimationFrame(draw);

canvas.addEventListener("click", (ev) => {
  const dpr = window.devicePixelRatio || 1;
  const rect = canvas.getBoundingClientRect();
  const px = (ev.clientX - rect.left) * dpr;
  const py = (ev.clientY - rect.top) * dpr;
  let best: Character | undefined;
  let bestD = (12 * dpr) ** 2;
  for (const c of shown) {
    const d = (sx(c.x) - px) ** 2 + (sy(c.z) - py) ** 2;
    if (d < bestD) [best, bestD] = [c, d];
  }
  selected = best?.id;
});
const plain = (_: string, v: unknown) => (typeof v === "bigint" ? Number(v) : v);
setInterval(() => {
  const c = shown.find((c) => c.id === selected);
  el("selected").textContent = c ? `${c.id}\n${JSON.stringify(c.state, plain, 1)}` : "click a character";
}, 250);

// ---- Figures ----------------------------------------------------------------------------

const HISTORY = 120;
const xs: number[] = [];
const series: Record<string, (number | null)[]> = {};
function chart(title: string, names: [string, string][]): { plot: uPlot; keys: string[] } {
  const keys = names.map(([k]) => k);
  for (const k of keys) series[k] = [];
  const colors = ["#8fd3ff", "#f0b35a", "#7fd67f"];
  const plot = new uPlot(
    {
      title,
      width: 330,
      height: 120,
      scales: { x: { time: true } },
      legend: { live: false },
      axes: [{ stroke: "#8a98a6", grid: { stroke: "#26303a" } }, { stroke: "#8a98a6", grid: { stroke: "#26303a" }, size: 60 }],
      series: [{}, ...names.map(([, label], i) => ({ label, stroke: colors[i], width: 1.5 }))],
    },
    [xs, ...keys.map((k) => series[k]!)],
    el("charts"),
  );
  return { plot, keys };
}
const charts = [
  chart("updates per client per second", [["fanout_hz_mean", "mean"], ["fanout_hz_p5", "p5"]]),
  chart("update age (ms)", [["latency_p50_ms", "p50"], ["latency_p99_ms", "p99"]]),
  chart("gateway out (KB/s)", [["kb_per_s", "KB/s"]]),
];

const fmt = (v: unknown, digits = 1) => (typeof v === "number" ? v.toFixed(digits) : "–");
/** Sets a figure's text; a figure the serving process does not have hides its row. */
function show(name: string, text: string, known: boolean): void {
  const cell = document.querySelector<HTMLElement>(`[data-figure="${name}"]`);
  if (!cell) return;
  cell.textContent = text;
  cell.parentElement!.hidden = !known;
}

async function poll(): Promise<void> {
  try {
    const f = (await (await fetch("figures.json", { cache: "no-store" })).json()) as Record<string, number>;
    if (typeof f["clients"] === "number") {
      const has = (k: string) => typeof f[k] === "number";
      show("clients", String(f["clients"]), true);
      show("fanout", `${fmt(f["fanout_hz_mean"])} /s (p5 ${fmt(f["fanout_hz_p5"])})`, has("fanout_hz_mean"));
      show("age", `${fmt(f["latency_p50_ms"], 2)} / ${fmt(f["latency_p99_ms"], 2)} ms`, has("latency_p50_ms"));
      show("bytes", `${fmt((f["bytes_per_s"] ?? 0) / 1024)} KB/s`, has("bytes_per_s"));
      show("fps", `${fmt(f["server_fps"])} fps`, has("server_fps"));
      show("handovers", `${fmt(f["handovers_per_s"])} /s`, has("handovers_per_s"));
      xs.push(Date.now() / 1000);
      if (typeof f["bytes_per_s"] === "number") f["kb_per_s"] = f["bytes_per_s"] / 1024;
      for (const k of Object.keys(series)) series[k]!.push(typeof f[k] === "number" ? f[k] : null);
      if (xs.length > HISTORY) {
        xs.shift();
        for (const s of Object.values(series)) s.shift();
      }
      for (const { plot, keys } of charts) {
        plot.setData([xs, ...keys.map((k) => series[k]!)]);
        plot.root.style.display = keys.some(has) ? "" : "none";
      }
    }
  } catch {
    // The serving process may be stopping; the next poll tries again.
  }
}
setInterval(() => void poll(), 1000);
void poll();

/** For tests and curious people in the console: what the map shows now. */
(window as unknown as { tickwireView: unknown }).tickwireView = {
  characters: () => shown.map(({ id, x, z }) => ({ id, x, z })),
};
