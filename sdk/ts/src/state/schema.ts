// Why this exists: a state schema (docs/protocol.md §12.1), as the gateway sends it in
// `SubscribeResult.schema_json`, compiled into the shape the replica decodes against: field
// order (a field is named by its index on the wire), types and default values.

export interface Quant {
  min: number;
  max: number;
  precision: number;
}

export type Type =
  | { kind: "int" }
  | { kind: "float"; quant?: Quant }
  | { kind: "bool" }
  | { kind: "string" }
  | { kind: "bytes" }
  | { kind: "vec3"; quant?: Quant }
  | { kind: "struct"; fields: Field[] }
  | { kind: "list"; item: Type }
  | { kind: "map"; key: "int" | "string"; value: Type };

export interface Field {
  name: string;
  type: Type;
}

/** An int: a number when it is exactly representable, a bigint beyond 2^53. */
export type Int = number | bigint;
/** A state value as the replica holds it: structs and maps are objects, lists arrays. */
export type Value = Int | number | boolean | string | Uint8Array | [number, number, number] | Value[] | { [key: string]: Value };

export class SchemaError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "SchemaError";
  }
}

function quant(q: unknown, where: string): Quant {
  const o = q as Partial<Quant>;
  if (typeof o?.min !== "number" || typeof o.max !== "number" || typeof o.precision !== "number") {
    throw new SchemaError(`${where}: a quantized type needs numbers min, max and precision`);
  }
  if (!(o.precision > 0) || !(o.max > o.min)) throw new SchemaError(`${where}: needs min < max and precision > 0`);
  return { min: o.min, max: o.max, precision: o.precision };
}

function parseType(t: unknown, where: string, depth: number): Type {
  if (depth > 32) throw new SchemaError(`${where}: nested too deep`);
  if (typeof t === "string") {
    switch (t) {
      case "int":
      case "bool":
      case "string":
      case "bytes":
        return { kind: t };
      case "float":
      case "vec3":
        return { kind: t };
      default:
        throw new SchemaError(`${where}: unknown type ${JSON.stringify(t)}`);
    }
  }
  if (typeof t !== "object" || t === null || Object.keys(t).length !== 1) {
    throw new SchemaError(`${where}: a type is a name or an object with one key`);
  }
  const [name, arg] = Object.entries(t)[0]!;
  switch (name) {
    case "quantized_float":
      return { kind: "float", quant: quant(arg, where) };
    case "quantized_vec3":
      return { kind: "vec3", quant: quant(arg, where) };
    case "struct":
      return { kind: "struct", fields: parseFields(arg, where, depth + 1) };
    case "list":
      return { kind: "list", item: parseType(arg, `${where}[]`, depth + 1) };
    case "map": {
      const m = arg as { key?: unknown; value?: unknown };
      if (m?.key !== "int" && m?.key !== "string") throw new SchemaError(`${where}: a map key is "int" or "string"`);
      return { kind: "map", key: m.key, value: parseType(m.value, `${where}{}`, depth + 1) };
    }
    default:
      throw new SchemaError(`${where}: unknown type ${JSON.stringify(name)}`);
  }
}

function parseFields(fields: unknown, where: string, depth: number): Field[] {
  if (!Array.isArray(fields)) throw new SchemaError(`${where}: fields must be a list`);
  return fields.map((f: { name?: unknown; type?: unknown }, i) => {
    if (typeof f?.name !== "string") throw new SchemaError(`${where}: field ${i} has no name`);
    return { name: f.name, type: parseType(f.type, `${where}.${f.name}`, depth) };
  });
}

/** A compiled schema: the root struct's fields. */
export class Schema {
  readonly root: Type & { kind: "struct" };

  constructor(readonly fields: Field[]) {
    this.root = { kind: "struct", fields };
  }

  /** Parses the JSON form (`{"fields": [...]}`). */
  static parse(json: string): Schema {
    let doc: unknown;
    try {
      doc = JSON.parse(json);
    } catch (e) {
      throw new SchemaError(`not JSON: ${(e as Error).message}`);
    }
    return new Schema(parseFields((doc as { fields?: unknown })?.fields, "schema", 0));
  }
}

/** Rust's `f64::round`: halves away from zero. */
function round(x: number): number {
  return Math.sign(x) * Math.round(Math.abs(x));
}

export function maxSteps(q: Quant): number {
  return round((q.max - q.min) / q.precision);
}

export function dequantize(q: Quant, steps: number): number {
  return q.min + steps * q.precision;
}

/** What a receiver holds for 0 (a quantized field's default). */
function quantizedZero(q: Quant): number {
  const clamped = Math.min(Math.max(0, q.min), q.max);
  return dequantize(q, Math.min(round((clamped - q.min) / q.precision), maxSteps(q)));
}

/** A map (or struct) object that no key can turn into a prototype change. */
export function emptyObject(): { [key: string]: Value } {
  return Object.create(null) as { [key: string]: Value };
}

export function defaultValue(t: Type): Value {
  switch (t.kind) {
    case "int":
      return 0;
    case "float":
      return t.quant ? quantizedZero(t.quant) : 0;
    case "bool":
      return false;
    case "string":
      return "";
    case "bytes":
      return new Uint8Array(0);
    case "vec3": {
      const d = t.quant ? quantizedZero(t.quant) : 0;
      return [d, d, d];
    }
    case "struct": {
      const o = emptyObject();
      for (const f of t.fields) o[f.name] = defaultValue(f.type);
      return o;
    }
    case "list":
      return [];
    case "map":
      return emptyObject();
  }
}
