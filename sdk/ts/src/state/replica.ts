// Why this exists: a client's copy of a channel's state, built from the binary updates of
// docs/protocol.md §12.2 (a snapshot, then deltas), held as plain objects, with the changes of
// each update reported so that a UI can react per key. Every length is checked against the
// bytes left before anything is allocated; bad input is a typed DecodeError, after which the
// replica accepts only a snapshot (as the Rust reference decoder does).

import { DecodeError } from "../errors.js";
import { applyJsonOps, jsonHeader } from "./json.js";
import { Schema, dequantize, defaultValue, emptyObject, maxSteps, type Type, type Value } from "./schema.js";

/** One change an update made, at `path` (field names, map keys as text, list indexes). */
export interface Change {
  path: (string | number)[];
  /**
   * `reset`: a snapshot replaced everything (path []); `set`: a value replaced; `clear`: a
   * field back to its default; `insert` / `remove`: a map entry added / removed (the last path
   * element is its key); `len`: a list grew to `value` items.
   */
  op: "reset" | "set" | "clear" | "insert" | "remove" | "len";
  value?: Value;
}

const KIND_DELTA = 0x01;
const KIND_SNAPSHOT = 0x02;
const TWO_POW_53 = 2 ** 53;
const utf8 = new TextDecoder("utf-8", { fatal: true });

/** Map entry ids (§12.2, "Interned keys") of each map object the replica holds. */
type Ids = Map<number, string>;

class Reader {
  pos = 0;
  constructor(readonly buf: Uint8Array) {}

  get left(): number {
    return this.buf.length - this.pos;
  }

  u8(what: string): number {
    const b = this.buf[this.pos];
    if (b === undefined) throw new DecodeError("Truncated", what);
    this.pos++;
    return b;
  }

  /** An unsigned varint: a number below 2^53, a bigint above. */
  varint(what: string): number | bigint {
    let n = 0;
    let scale = 1;
    for (let i = 0; i < 10; i++) {
      const b = this.buf[this.pos + i];
      if (b === undefined) throw new DecodeError("BadVarint", what);
      if (i === 9 && b > 1) throw new DecodeError("BadVarint", what);
      n += (b & 0x7f) * scale;
      scale *= 128;
      if (b < 0x80) {
        if (n < TWO_POW_53) {
          this.pos += i + 1;
          return n;
        }
        return this.bigVarint(what);
      }
    }
    throw new DecodeError("BadVarint", what);
  }

  private bigVarint(what: string): bigint {
    let n = 0n;
    for (let i = 0; i < 10; i++) {
      const b = this.buf[this.pos + i]!;
      n |= BigInt(b & 0x7f) << BigInt(7 * i);
      if (b < 0x80) {
        this.pos += i + 1;
        return n;
      }
    }
    throw new DecodeError("BadVarint", what);
  }

  /** A varint used as a count, index or tag: past 2^53 it cannot be one. */
  small(what: string, tooBig: (n: bigint) => DecodeError): number {
    const v = this.varint(what);
    if (typeof v === "bigint") throw tooBig(v);
    return v;
  }

  take(n: number, what: string): Uint8Array {
    if (n > this.left) throw new DecodeError("Truncated", what);
    const out = this.buf.subarray(this.pos, this.pos + n);
    this.pos += n;
    return out;
  }
}

function unzigzag(u: number | bigint): number | bigint {
  if (typeof u === "number") return u % 2 === 0 ? u / 2 : -(u + 1) / 2;
  const v = (u >> 1n) ^ -(u & 1n);
  return v >= -BigInt(Number.MAX_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;
}

/** A replica of one channel's state. `state` is the live root object (read it, don't write). */
export class Replica {
  private root: { [key: string]: Value };
  private ids = new WeakMap<object, Ids>();
  private poisoned = false;
  private versionNow = 0;

  constructor(readonly schema: Schema) {
    this.root = defaultValue(schema.root) as { [key: string]: Value };
  }

  get state(): { [key: string]: Value } {
    return this.root;
  }

  /** The version of the last update applied (0: the empty state). */
  get version(): number {
    return this.versionNow;
  }

  /**
   * Applies one binary update. Pass `changes` to have every change appended to it. On error
   * the replica may be partly updated; it then accepts only a snapshot.
   */
  apply(update: Uint8Array, changes?: Change[]): number {
    const r = new Reader(update);
    const kind = r.u8("update header");
    const from = Number(r.varint("update header"));
    const to = Number(r.varint("update header"));
    if (kind !== KIND_SNAPSHOT && kind !== KIND_DELTA) throw new DecodeError("UnknownKind", `update kind ${kind}`);
    return this.applyWith(kind === KIND_SNAPSHOT, from, to, changes, "BadOp", () => {
      while (r.left > 0) this.patch(this.schema.root, this.root, r, changes ? [] : undefined, changes);
    });
  }

  /** Applies one JSON update (§12.3): a header line, then one op per line. */
  applyJson(update: Uint8Array | string, changes?: Change[]): number {
    let text: string;
    try {
      text = typeof update === "string" ? update : utf8.decode(update);
    } catch {
      throw new DecodeError("BadUtf8", "a JSON update that is not UTF-8");
    }
    const h = jsonHeader(text);
    return this.applyWith(h.snapshot, h.from, h.to, changes, "Json", () => applyJsonOps(this.schema.root, this.root, h.body, changes));
  }

  /** `code`: the error any failure of `body` other than a `DecodeError` is reported as. */
  private applyWith(
    snapshot: boolean,
    from: number,
    to: number,
    changes: Change[] | undefined,
    code: "BadOp" | "Json",
    body: () => void,
  ): number {
    if (snapshot) {
      this.root = defaultValue(this.schema.root) as { [key: string]: Value };
      this.ids = new WeakMap();
      changes?.push({ path: [], op: "reset" });
    } else if (this.poisoned) {
      throw new DecodeError("NeedsSnapshot", "the replica failed an earlier update");
    } else if (from !== this.versionNow) {
      throw new DecodeError("VersionMismatch", `a delta from ${from} to a replica at ${this.versionNow}`);
    }
    try {
      body();
    } catch (e) {
      this.poisoned = true;
      throw e instanceof DecodeError ? e : new DecodeError(code, e instanceof Error ? e.message : String(e));
    }
    this.versionNow = to;
    this.poisoned = false;
    return to;
  }

  private patch(t: Type, node: Value, r: Reader, path: Change["path"] | undefined, changes?: Change[]): void {
    if (t.kind === "struct") this.structPatch(t.fields, node as { [key: string]: Value }, r, path, changes);
    else if (t.kind === "list") this.listPatch(t.item, node as Value[], r, path, changes);
    else if (t.kind === "map") this.mapPatch(t, node as { [key: string]: Value }, r, path, changes);
    else throw new DecodeError("BadOp", "PATCH of a scalar");
  }

  private structPatch(
    fields: { name: string; type: Type }[],
    obj: { [key: string]: Value },
    r: Reader,
    path: Change["path"] | undefined,
    changes?: Change[],
  ): void {
    for (;;) {
      const tag = r.small("struct patch", (n) => new DecodeError("NoField", `field tag ${n}`));
      if (tag === 0) return;
      const index = Math.floor((tag - 1) / 4);
      const op = (tag - 1) % 4;
      const field = fields[index];
      if (!field) throw new DecodeError("NoField", `no field ${index} in this struct`);
      const at = path && [...path, field.name];
      switch (op) {
        case 0:
          obj[field.name] = this.value(field.type, r);
          if (at) changes!.push({ path: at, op: "set", value: obj[field.name] });
          break;
        case 1:
          this.patch(field.type, obj[field.name]!, r, at, changes);
          break;
        case 2:
          obj[field.name] = defaultValue(field.type);
          if (at) changes!.push({ path: at, op: "clear", value: obj[field.name] });
          break;
        default:
          throw new DecodeError("BadOp", `operation ${op} on a struct field`);
      }
    }
  }

  private listPatch(item: Type, items: Value[], r: Reader, path: Change["path"] | undefined, changes?: Change[]): void {
    const header = r.small("list patch", (n) => new DecodeError("BadLength", `${n}`));
    if (header > 0) {
      const len = header - 1;
      // A list only grows in a patch, and each new item is set below (>= 1 byte each).
      if (len < items.length || len - items.length > r.left) throw new DecodeError("BadLength", `list length ${len}`);
      while (items.length < len) items.push(defaultValue(item));
      if (path) changes!.push({ path, op: "len", value: len });
    }
    for (;;) {
      const tag = r.small("list patch", (n) => new DecodeError("BadIndex", `item tag ${n}`));
      if (tag === 0) return;
      const index = Math.floor((tag - 1) / 2);
      if (index >= items.length) throw new DecodeError("BadIndex", `list index ${index} (length ${items.length})`);
      const at = path && [...path, index];
      if ((tag - 1) % 2 === 0) {
        items[index] = this.value(item, r);
        if (at) changes!.push({ path: at, op: "set", value: items[index] });
      } else {
        this.patch(item, items[index]!, r, at, changes);
      }
    }
  }

  private idsOf(obj: object): Ids {
    let ids = this.ids.get(obj);
    if (!ids) {
      ids = new Map();
      this.ids.set(obj, ids);
    }
    return ids;
  }

  private mapPatch(
    t: Type & { kind: "map" },
    obj: { [key: string]: Value },
    r: Reader,
    path: Change["path"] | undefined,
    changes?: Change[],
  ): void {
    const ids = this.idsOf(obj);
    for (;;) {
      const tag = r.small("map patch", (n) => new DecodeError("UnknownId", `entry tag ${n}`));
      if (tag === 0) return;
      const id = Math.floor((tag - 1) / 4);
      const op = (tag - 1) % 4;
      if (op === 0) {
        const key = this.key(t.key, r);
        const value = this.value(t.value, r);
        if (ids.has(id) || key in obj) throw new DecodeError("DuplicateEntry", `map entry id ${id} or key ${key}`);
        ids.set(id, key);
        obj[key] = value;
        if (path) changes!.push({ path: [...path, key], op: "insert", value });
        continue;
      }
      const key = ids.get(id);
      if (key === undefined) throw new DecodeError("UnknownId", `map entry id ${id}`);
      const at = path && [...path, key];
      if (op === 1) {
        this.patch(t.value, obj[key]!, r, at, changes);
      } else if (op === 2) {
        ids.delete(id);
        delete obj[key];
        if (at) changes!.push({ path: at, op: "remove" });
      } else {
        obj[key] = this.value(t.value, r);
        if (at) changes!.push({ path: at, op: "set", value: obj[key] });
      }
    }
  }

  private key(kind: "int" | "string", r: Reader): string {
    if (kind === "int") return String(unzigzag(r.varint("map key")));
    const len = r.small("map key", () => new DecodeError("Truncated", "map key"));
    return this.text(r.take(len, "map key"));
  }

  private text(bytes: Uint8Array): string {
    try {
      return utf8.decode(bytes);
    } catch {
      throw new DecodeError("BadUtf8", "a string that is not UTF-8");
    }
  }

  private float(quant: { min: number; max: number; precision: number } | undefined, r: Reader): number {
    if (quant) {
      const steps = r.varint("quantized float");
      if (typeof steps === "bigint" || steps > maxSteps(quant)) throw new DecodeError("BadQuant", `${steps} steps`);
      return dequantize(quant, steps);
    }
    const b = r.take(8, "float");
    return new DataView(b.buffer, b.byteOffset, 8).getFloat64(0, true);
  }

  private value(t: Type, r: Reader): Value {
    switch (t.kind) {
      case "int":
        return unzigzag(r.varint("int"));
      case "float":
        return this.float(t.quant, r);
      case "bool": {
        const b = r.u8("bool");
        if (b > 1) throw new DecodeError("BadBool", `bool byte ${b}`);
        return b === 1;
      }
      case "string": {
        const len = r.small("string", () => new DecodeError("Truncated", "string"));
        return this.text(r.take(len, "string"));
      }
      case "bytes": {
        const len = r.small("bytes", () => new DecodeError("Truncated", "bytes"));
        return r.take(len, "bytes").slice();
      }
      case "vec3":
        return [this.float(t.quant, r), this.float(t.quant, r), this.float(t.quant, r)];
      case "struct": {
        const obj = defaultValue(t) as { [key: string]: Value };
        this.structPatch(t.fields, obj, r, undefined);
        return obj;
      }
      case "list": {
        const n = r.small("list", (v) => new DecodeError("BadLength", `${v}`));
        if (n > r.left) throw new DecodeError("BadLength", `a list of ${n} in ${r.left} bytes`);
        const items: Value[] = [];
        for (let i = 0; i < n; i++) items.push(this.value(t.item, r));
        return items;
      }
      case "map": {
        const obj = emptyObject();
        this.mapPatch(t, obj, r, undefined);
        return obj;
      }
    }
  }
}
