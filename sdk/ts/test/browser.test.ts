// Why this exists: the live web view in a real browser. Starts `tickwire demo` (both scenarios)
// with its web view on a free port, opens the page in headless Chromium (the system's, driven
// by puppeteer-core), waits until the map shows every bot's character, and checks that the
// characters move and the figures panel fills between two screenshots, which it keeps in
// $TICKWIRE_ARTIFACTS (default: sdk/ts/test-artifacts/). Also checks that the committed page
// assets (crates/web/assets) are what `npm run view` builds from view/ today.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import puppeteer, { type Browser } from "puppeteer-core";
import { Channels, Client } from "../src/index.js";
import { tcp } from "../src/node.js";
import { ChannelType } from "../src/gen/tickwire/v1/channel_pb.js";
import { ASSETS_DIR, viewAssets } from "../view/build.js";
import { binary, repo } from "./helpers.js";

const artifacts = process.env.TICKWIRE_ARTIFACTS ?? join(repo, "sdk", "ts", "test-artifacts");

/** The system Chromium: $CHROMIUM, or Debian's `chromium` package (scripts/test.sh installs it). */
function chromium(): string {
  const candidates = [process.env.CHROMIUM, "/usr/bin/chromium", "/usr/bin/chromium-browser"].filter(Boolean) as string[];
  const found = candidates.find((p) => existsSync(p));
  if (!found) throw new Error(`no Chromium at ${candidates.join(", ")}: apt-get install chromium, or set CHROMIUM`);
  return found;
}

test("the committed web view assets are a fresh build of sdk/ts/view", async () => {
  for (const [name, bytes] of await viewAssets()) {
    const committed = new Uint8Array(readFileSync(join(ASSETS_DIR, name)));
    assert.ok(same(bytes, committed), `crates/web/assets/${name} is stale: run \`npm run view\` in sdk/ts`);
  }
});

const same = (a: Uint8Array, b: Uint8Array) => a.length === b.length && a.every((x, i) => x === b[i]);

function launch(): Promise<Browser> {
  return puppeteer.launch({
    executablePath: chromium(),
    headless: true,
    // Root in a container has no user namespace for Chromium's sandbox.
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
}

interface Demo {
  url: string;
  stop(): Promise<number | null>;
}

/** `tickwire demo` on free loopback ports; resolves with the web view's address. */
function startDemo(scenario: string, bots: number): Promise<Demo> {
  const args = ["demo", "--scenario", scenario, "--bots", String(bots), "--duration", "120s"];
  args.push("--tcp", "127.0.0.1:0", "--ws", "127.0.0.1:0", "--metrics", "off", "--web", "127.0.0.1:0");
  return start(args);
}

/** Runs the binary with `args` until it prints its web view's address. */
async function start(args: string[]): Promise<Demo & { tcp?: { host: string; port: number } }> {
  const child = spawn(binary(), args, { stdio: ["ignore", "pipe", "inherit"] });
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  let out = "";
  let tcpAddr: { host: string; port: number } | undefined;
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the demo did not start its web view: ${out}`)), 60_000);
    child.stdout!.on("data", (chunk: Buffer) => {
      out += chunk.toString();
      const m = /live view at (http:\/\/\S+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]!);
      }
      const t = /listening on tcp:\/\/(\S+):(\d+)/.exec(out);
      if (t) tcpAddr = { host: t[1]!, port: Number(t[2]) };
    });
    void exited.then((code) => reject(new Error(`the demo exited (${code}): ${out}`)));
  });
  return {
    url,
    tcp: tcpAddr,
    async stop() {
      child.kill("SIGINT");
      return exited;
    },
  };
}

for (const { scenario, bots } of [
  { scenario: "single", bots: 60 },
  { scenario: "spatial", bots: 60 },
]) {
  test(`the live view of \`tickwire demo --scenario ${scenario} --bots ${bots}\` in headless Chromium`, { timeout: 150_000 }, async () => {
    mkdirSync(artifacts, { recursive: true });
    const demo = await startDemo(scenario, bots);
    const browser = await launch();
    const pageErrors: string[] = [];
    let exit: number | null = null;
    try {
      const page = await browser.newPage();
      page.on("pageerror", (e) => pageErrors.push(String(e)));
      await page.setViewport({ width: 1280, height: 800 });
      await page.goto(demo.url, { waitUntil: "load" });
      // Every bot's character on the map (they join over a few seconds).
      await page.waitForFunction((n) => Number(document.getElementById("characters")?.textContent) === n, { timeout: 90_000, polling: 250 }, bots);
      // The figures panel has a second of figures: the bots and the view itself are clients.
      await page.waitForFunction(
        (n) => Number(document.querySelector('[data-figure="clients"]')?.textContent) >= n,
        { timeout: 30_000, polling: 250 },
        bots + 1,
      );
      type Seen = { id: string; x: number; z: number }[];
      const read = () => page.evaluate(() => (window as unknown as { tickwireView: { characters(): Seen } }).tickwireView.characters());
      const before = await read();
      const first = await page.screenshot({ path: join(artifacts, `live-view-${scenario}-1.png`) });
      await new Promise((r) => setTimeout(r, 1500));
      const after = await read();
      const second = await page.screenshot({ path: join(artifacts, `live-view-${scenario}-2.png`) });

      assert.equal(after.length, bots, "the map still shows every bot");
      const was = new Map(before.map((c) => [c.id, c]));
      const moved = after.filter((c) => {
        const b = was.get(c.id);
        return b !== undefined && Math.hypot(c.x - b.x, c.z - b.z) > 0.5;
      });
      // Bots walk at 6 m/s and turn now and then; a few may stand against a wall.
      assert.ok(moved.length >= bots / 2, `${moved.length} of ${bots} characters moved more than 0.5 m in 1.5 s`);
      assert.ok(!same(new Uint8Array(first), new Uint8Array(second)), "the two screenshots differ");
      assert.deepEqual(pageErrors, [], "no errors in the page");
      writeFileSync(
        join(artifacts, `live-view-${scenario}.json`),
        JSON.stringify({ url: demo.url, bots, shown: after.length, moved: moved.length }, null, 1),
      );
    } finally {
      await browser.close();
      exit = await demo.stop();
    }
    assert.equal(exit, 0, "the demo stops cleanly on Ctrl-C");
  });
}

test("`tickwire gateway --web` draws the characters of some game's global channel, fitted to the map", { timeout: 90_000 }, async () => {
  mkdirSync(artifacts, { recursive: true });
  const gw = await start(["gateway", "--tcp", "127.0.0.1:0", "--ws", "127.0.0.1:0", "--web", "127.0.0.1:0"]);
  assert.ok(gw.tcp, "the gateway printed its TCP address before the web view's");
  const server = await Client.connect({ connect: tcp(gw.tcp.host, gw.tcp.port), token: "server:some-game" });
  const schema = JSON.stringify({
    fields: [
      { name: "tick", type: "int" },
      { name: "units", type: { map: { key: "string", value: { struct: [{ name: "pos", type: "vec3" }, { name: "hp", type: "int" }] } } } },
    ],
  });
  const owner = new Channels(server);
  const { channelId } = await owner.create(ChannelType.GLOBAL, "arena", schema);
  // Five units far from the origin: the map must grow to show them.
  const place = (t: number) =>
    [0, 1, 2, 3, 4].map((i) => JSON.stringify({ op: "set", path: `/units/u${i}`, value: { pos: [400 + 30 * i + t, 0, -250 + t], hp: 100 - i } })).join("\n");
  await owner.update(channelId, place(0));
  const browser = await launch();
  let exit: number | null = null;
  try {
    const page = await browser.newPage();
    const errors: string[] = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    await page.setViewport({ width: 1000, height: 700 });
    await page.goto(gw.url, { waitUntil: "load" });
    await page.waitForFunction(() => document.getElementById("characters")?.textContent === "5", { timeout: 30_000, polling: 100 });
    type Seen = { id: string; x: number; z: number }[];
    const read = () => page.evaluate(() => (window as unknown as { tickwireView: { characters(): Seen } }).tickwireView.characters());
    const before = await read();
    assert.deepEqual(before.map((c) => Math.round(c.x)).sort((a, b) => a - b), [400, 430, 460, 490, 520]);
    await owner.update(channelId, place(20));
    await page.waitForFunction(
      () => (window as unknown as { tickwireView: { characters(): Seen } }).tickwireView.characters().every((c) => c.z > -240),
      { timeout: 10_000, polling: 100 },
    );
    // The figures panel has the gateway's counts: the game server and the page.
    await page.waitForFunction(() => Number(document.querySelector('[data-figure="clients"]')?.textContent) >= 2, { timeout: 10_000 });
    await page.screenshot({ path: join(artifacts, "live-view-gateway.png") });
    assert.deepEqual(errors, [], "no errors in the page");
  } finally {
    await browser.close();
    server.close();
    exit = await gw.stop();
  }
  assert.equal(exit, 0, "the gateway stops cleanly on Ctrl-C");
});
