// Why this exists: the JSON form of updates (docs/protocol.md §12.3) for subscribers that ask
// for `codec: JSON`: a header line, then one `{"op","path","value"}` object per line, applied
// to the same plain-object state as the binary replica keeps. Mirrors the Rust reader
// (crates/state/src/replica/json.rs) with two differences JSON.parse imposes: a key repeated in
// one object is not seen (the last copy wins; the gateway never writes one), and an int may be
// written as `1.0` (JavaScript numbers cannot tell). Errors are `DecodeError` "Json" (or
// BadIndex, BadLength).

import { DecodeError } from "../errors.js";
import { defaultValue, emptyObject, type Type, type Value } from "./schema.js";
import type { Change } from "./replica.js";

const bad = (msg: string) => new DecodeError("Json", msg);

export interface JsonHeader {
  snapshot: boolean;
  from: number;
  to: number;
  body: string;
}

/** One line that must hold a JSON object (a header or an op): parsed, or `DecodeError` Json. */
function objectLine(line: string, what: string): { [key: string]: unknown } {
  let v: unknown;
  try {
    v = JSON.parse(line);
  } catch (e) {
    throw bad((e as Error).message);
  }
  if (v === null || typeof v !== "object" || Array.isArray(v)) throw bad(`${what} must be a JSON object`);
  return v as { [key: string]: unknown };
}

export function jsonHeader(text: string): JsonHeader {
  const end = text.indexOf("\n");
  if (end < 0) throw new DecodeError("Truncated", "JSON header line");
  const h = objectLine(text.slice(0, end), "the header");
  if (h.kind !== "snapshot" && h.kind !== "delta") throw bad(`unknown kind ${JSON.stringify(h.kind)}`);
  if (typeof h.from !== "number" || typeof h.to !== "number") throw bad("from and to must be numbers");
  return { snapshot: h.kind === "snapshot", from: h.from, to: h.to, body: text.slice(end + 1) };
}

function segments(path: string): string[] {
  if (path === "") return [];
  if (!path.startsWith("/")) throw bad(`path ${JSON.stringify(path)} does not start with /`);
  return path
    .slice(1)
    .split("/")
    .map((s) => s.replace(/~1/g, "/").replace(/~0/g, "~"));
}

const I64_MIN = -(1n << 63n);
const I64_MAX = (1n << 63n) - 1n;

/** An int key has one spelling (`-?(0|[1-9][0-9]*)`, no `-0`) and fits an i64, as in Rust. */
function mapKey(kind: "int" | "string", s: string): string {
  const fits = (n: bigint) => n >= I64_MIN && n <= I64_MAX;
  if (kind === "int" && !(/^(0|-?[1-9]\d*)$/.test(s) && fits(BigInt(s)))) throw bad(`bad int key ${JSON.stringify(s)}`);
  return kind === "int" ? String(BigInt(s)) : s;
}

/** A value of type `t` from its JSON form. Missing struct fields are defaults; unknown ones an error. */
export function fromJson(t: Type, v: unknown): Value {
  const mismatch = () => bad(`value ${JSON.stringify(v)} does not fit a ${t.kind}`);
  switch (t.kind) {
    case "int":
      if (typeof v !== "number" || !Number.isInteger(v)) throw mismatch();
      return v;
    case "float":
      if (v === null) return NaN;
      if (typeof v !== "number") throw mismatch();
      return v;
    case "bool":
      if (typeof v !== "boolean") throw mismatch();
      return v;
    case "string":
      if (typeof v !== "string") throw mismatch();
      return v;
    case "bytes": {
      if (typeof v !== "string" || !/^([0-9a-fA-F]{2})*$/.test(v)) throw mismatch();
      return Uint8Array.from(v.match(/../g) ?? [], (b) => parseInt(b, 16));
    }
    case "vec3": {
      // A part that is not finite is written as null, as a float is.
      if (!Array.isArray(v) || v.length !== 3 || !v.every((x) => typeof x === "number" || x === null)) throw mismatch();
      const part = (x: unknown) => (x === null ? NaN : (x as number));
      return [part(v[0]), part(v[1]), part(v[2])];
    }
    case "struct": {
      if (v === null || typeof v !== "object" || Array.isArray(v)) throw mismatch();
      const out = defaultValue(t) as { [key: string]: Value };
      for (const [name, x] of Object.entries(v)) {
        const f = t.fields.find((f) => f.name === name);
        if (!f) throw bad(`no field ${JSON.stringify(name)}`);
        out[name] = fromJson(f.type, x);
      }
      return out;
    }
    case "list":
      if (!Array.isArray(v)) throw mismatch();
      return v.map((x) => fromJson(t.item, x));
    case "map": {
      if (v === null || typeof v !== "object" || Array.isArray(v)) throw mismatch();
      const out = emptyObject();
      for (const [k, x] of Object.entries(v)) out[mapKey(t.key, k)] = fromJson(t.value, x);
      return out;
    }
  }
}

/** Walks `segs` from `node` of type `t`: the node and type at the end. */
function walk(node: Value, t: Type, segs: string[]): [Value, Type] {
  for (const seg of segs) {
    if (t.kind === "struct") {
      const f = t.fields.find((f) => f.name === seg);
      if (!f) throw bad(`no field ${seg}`);
      node = (node as { [key: string]: Value })[seg]!;
      t = f.type;
    } else if (t.kind === "list") {
      const items = node as Value[];
      const index = Number(seg);
      if (!/^(0|[1-9]\d*)$/.test(seg)) throw bad(`bad index ${seg}`);
      if (index >= items.length) throw new DecodeError("BadIndex", `list index ${index} (length ${items.length})`);
      node = items[index]!;
      t = t.item;
    } else if (t.kind === "map") {
      const key = mapKey(t.key, seg);
      const obj = node as { [key: string]: Value };
      if (!(key in obj)) throw bad(`no entry ${key}`);
      node = obj[key]!;
      t = t.value;
    } else {
      throw bad(`path step ${seg} goes through a scalar`);
    }
  }
  return [node, t];
}

/** Applies the op lines of a JSON update to `root` (of type `rootType`). */
export function applyJsonOps(rootType: Type, root: Value, body: string, changes?: Change[]): void {
  for (const line of body.split("\n")) {
    if (line === "") continue;
    const op = objectLine(line, "an op");
    if (typeof op.op !== "string" || typeof op.path !== "string") throw bad("an op needs op and path strings");
    const segs = segments(op.path);
    const value = () => {
      if (!("value" in op)) throw bad(`${op.op} needs a value`);
      return op.value;
    };
    if (op.op === "len") {
      const [node, t] = walk(root, rootType, segs);
      if (t.kind !== "list") throw bad("len applies to lists");
      const items = node as Value[];
      const len = value();
      if (typeof len !== "number" || !Number.isInteger(len)) throw bad("len must be a number");
      if (len < items.length || len > 1 << 24) throw new DecodeError("BadLength", `list length ${len}`);
      while (items.length < len) items.push(defaultValue(t.item));
      changes?.push({ path: segs, op: "len", value: len });
      continue;
    }
    const last = segs.at(-1);
    if (last === undefined) throw bad("empty path");
    const [node, t] = walk(root, rootType, segs.slice(0, -1));
    if (t.kind === "struct" && (op.op === "set" || op.op === "clear")) {
      const f = t.fields.find((f) => f.name === last);
      if (!f) throw bad(`no field ${last}`);
      const obj = node as { [key: string]: Value };
      obj[last] = op.op === "set" ? fromJson(f.type, value()) : defaultValue(f.type);
      changes?.push({ path: segs, op: op.op, value: obj[last] });
    } else if (t.kind === "list" && op.op === "set") {
      const items = node as Value[];
      if (!/^(0|[1-9]\d*)$/.test(last)) throw bad(`bad index ${last}`);
      const index = Number(last);
      if (index >= items.length) throw new DecodeError("BadIndex", `list index ${index} (length ${items.length})`);
      items[index] = fromJson(t.item, value());
      changes?.push({ path: [...segs.slice(0, -1), index], op: "set", value: items[index] });
    } else if (t.kind === "map" && (op.op === "set" || op.op === "remove")) {
      const obj = node as { [key: string]: Value };
      const key = mapKey(t.key, last);
      const path = [...segs.slice(0, -1), key];
      if (op.op === "set") {
        const existed = key in obj;
        obj[key] = fromJson(t.value, value());
        changes?.push({ path, op: existed ? "set" : "insert", value: obj[key] });
      } else {
        if (!(key in obj)) throw bad(`remove of absent key ${key}`);
        delete obj[key];
        changes?.push({ path, op: "remove" });
      }
    } else {
      throw bad(`op ${op.op} does not apply at ${op.path}`);
    }
  }
}
