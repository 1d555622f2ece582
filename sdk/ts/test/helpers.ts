// Why this exists: what the tests share: the repository's test vectors, and a real gateway
// started as a child process (the binary `cargo build` made) for each test file.

import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { createServer, connect, type Server, type Socket } from "node:net";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..");

export function vectors(name: string): any {
  // Integers past 2^53 (a u64 ack) stay exact as strings, for BigInt().
  const text = readFileSync(join(repo, "docs", "test-vectors", name), "utf8").replace(/:\s*(\d{16,})\b/g, ': "$1"');
  return JSON.parse(text);
}

export function hex(s: string): Uint8Array {
  return Uint8Array.from(s.match(/../g) ?? [], (b) => parseInt(b, 16));
}

export function toHex(b: Uint8Array): string {
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

/** The tickwire binary: $TICKWIRE_BIN, or the newest of target/{debug,release}/tickwire. */
export function binary(): string {
  const env = process.env.TICKWIRE_BIN;
  if (env) return env;
  for (const p of [join(repo, "target", "debug", "tickwire"), join(repo, "target", "release", "tickwire")]) {
    if (existsSync(p)) return p;
  }
  throw new Error("no tickwire binary: run `cargo build` first, or set TICKWIRE_BIN");
}

export interface Gateway {
  tcp: { host: string; port: number };
  ws: string;
  stop(): Promise<void>;
}

/** Starts `tickwire gateway` on free loopback ports and waits for its listening lines. */
export async function startGateway(settings: string[] = []): Promise<Gateway> {
  const args = ["gateway", "--tcp", "127.0.0.1:0", "--ws", "127.0.0.1:0"];
  for (const s of settings) args.push("--set", s);
  const child: ChildProcess = spawn(binary(), args, { stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  const addrs = await new Promise<{ tcp: string; ws: string }>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the gateway did not start: ${out}`)), 20_000);
    child.stdout!.on("data", (chunk: Buffer) => {
      out += chunk.toString();
      const tcp = /listening on tcp:\/\/(\S+)/.exec(out);
      const ws = /listening on (ws:\/\/\S+)/.exec(out);
      if (tcp && ws) {
        clearTimeout(timer);
        resolve({ tcp: tcp[1]!, ws: ws[1]! });
      }
    });
    child.once("exit", (code) => reject(new Error(`the gateway exited (${code}): ${out}`)));
  });
  const [host, port] = addrs.tcp.split(":");
  return {
    tcp: { host: host!, port: Number(port) },
    ws: addrs.ws,
    stop: () =>
      new Promise<void>((resolve) => {
        if (child.exitCode !== null) return resolve();
        child.once("exit", () => resolve());
        child.kill("SIGTERM");
      }),
  };
}

/** A TCP proxy in front of the gateway whose connections the test can cut (no Close frame). */
export class CutProxy {
  private readonly pairs = new Set<[Socket, Socket]>();
  private constructor(private readonly server: Server, readonly port: number) {}

  static async start(upstream: { host: string; port: number }): Promise<CutProxy> {
    const server = createServer();
    const proxy = await new Promise<CutProxy>((resolve) =>
      server.listen(0, "127.0.0.1", () => resolve(new CutProxy(server, (server.address() as { port: number }).port))),
    );
    server.on("connection", (down) => {
      const up = connect(upstream.port, upstream.host);
      const pair: [Socket, Socket] = [down, up];
      proxy.pairs.add(pair);
      down.pipe(up);
      up.pipe(down);
      const end = () => {
        proxy.pairs.delete(pair);
        down.destroy();
        up.destroy();
      };
      down.on("error", end).on("close", end);
      up.on("error", end).on("close", end);
    });
    return proxy;
  }

  /** Cuts every connection through the proxy at once, both ways. */
  cut(): void {
    for (const [down, up] of this.pairs) {
      down.destroy();
      up.destroy();
    }
    this.pairs.clear();
  }

  close(): Promise<void> {
    this.cut();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }
}

/** Resolves when `done()` holds, checking every few ms; rejects after `ms`. */
export async function until(what: string, done: () => boolean, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!done()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** A replica value as JSON the vectors use: bytes as hex, maps and structs as plain objects. */
export function plain(v: unknown): unknown {
  if (v instanceof Uint8Array) return toHex(v);
  if (Array.isArray(v)) return v.map(plain);
  if (typeof v === "bigint") return Number(v);
  if (v !== null && typeof v === "object") {
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, plain(x)]));
  }
  return v;
}
