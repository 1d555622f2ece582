// Why this exists: the client side of the spatial world (docs/protocol.md §14): set an area of
// interest and keep a replica of every cell it touches from the `channel.updates` pushes, with
// the cells' entities as plain objects, and the `spatial.event` pushes as events.

import type { MessageInitShape } from "@bufbuild/protobuf";
import { ChannelEventKind, ChannelEventSchema, DeltaCodec } from "./gen/tickwire/v1/channel_pb.js";
import {
  ChannelUpdatesSchema,
  Follow,
  InterestResultSchema,
  SetInterestSchema,
  SpatialEventSchema,
  type CellInfo,
  type SpatialEvent,
} from "./gen/tickwire/v1/spatial_pb.js";
import type { Client } from "./client.js";
import { DecodeError } from "./errors.js";
import { decodeBody, encode } from "./messages.js";
import { Replica, type Change } from "./state/replica.js";
import { Schema, type Value } from "./state/schema.js";
import type { SubscribeOptions } from "./channels.js";
import { emit } from "./emit.js";

/** Cell ids are `2^40 + row × cells_x + column` (§14). */
export const FIRST_CELL_ID = 1n << 40n;
/** Entity ids start at `2^41` (§14). */
export const FIRST_ENTITY_ID = 1n << 41n;

type V3 = readonly [number, number, number];
const vec = ([x, y, z]: V3) => ({ x, y, z });

/** An area of interest (§14.4). Positions are `[x, y, z]`, `y` up. */
export type Area =
  | { sphere: { center: V3; radius: number } }
  | { box: { min: V3; max: V3 } }
  | { cone: { apex: V3; direction: V3; halfAngle: number; range: number } };

export interface InterestOptions {
  /** Re-centre the area on this client's entity: per cell change, or per move (default: off). */
  follow?: Follow;
  /** Only `codec`, `fanoutIntervalMs` and `fanoutDelayMs` apply (§14.1). */
  options?: SubscribeOptions;
  /**
   * Level of detail (§14.4), nearest band first: a cell whose nearest point is at most `within`
   * from the area's reference point changes in this client's updates at most once per
   * `intervalMs` (0: in every update); past the last band, the last band's interval.
   */
  lod?: { within: number; intervalMs: number }[];
}

/** One entity in view: its id, the cell it is in, and its value (the entity schema's fields). */
export interface Entity {
  id: string;
  cell: bigint;
  value: { [field: string]: Value };
}

type Listener<A extends unknown[]> = (...args: A) => void;

/**
 * A client's view of the spatial world: `interest(area)`, then `cells` (a replica per cell in
 * view) and `entities()`. Callbacks say when a cell changed or left the view.
 */
export class Spatial {
  /** The replicas of the cells in view, by cell id. */
  readonly cells = new Map<bigint, Replica>();
  private schema: Schema | undefined;
  /** Updates that arrived before the first `spatial.interest` answer (same read), bounded. */
  private early: { channelId: bigint; codec: DeltaCodec; update: Uint8Array }[] = [];
  /** When each cell in view was last updated, as a count of updates applied. */
  private updatedAt = new Map<bigint, number>();
  private applied = 0;
  private readonly cellListeners = new Set<Listener<[bigint, Change[]]>>();
  private readonly leftListeners = new Set<Listener<[bigint]>>();
  private readonly eventListeners = new Set<Listener<[SpatialEvent]>>();
  private readonly errorListeners = new Set<Listener<[bigint, DecodeError]>>();
  /** The area last asked for, for [`resync`](#resync). */
  private last: { area: Area | null; opts: InterestOptions } | undefined;
  private resyncing = false;
  private readonly off: () => void;

  constructor(private readonly client: Client) {
    this.off = client.routePushes((topic, body) => this.route(topic, body));
  }

  /** Stops handling this client's pushes (the cells stop updating). */
  dispose(): void {
    this.off();
    this.cells.clear();
    this.updatedAt.clear();
  }

  /**
   * Starts every cell in view again from a snapshot: the area is cleared and set again (the
   * cells leave the view, then come back whole). Done by itself after a cell update that does
   * not decode (§12.2, "Decode errors").
   */
  async resync(): Promise<void> {
    const last = this.last;
    if (!last || this.resyncing) return;
    this.resyncing = true;
    try {
      await this.interest(null);
      await this.interest(last.area, last.opts);
    } finally {
      this.resyncing = false;
    }
  }

  /** `spatial.interest`: replaces the area (`null`: none, and every cell leaves the view). */
  async interest(area: Area | null, opts: InterestOptions = {}): Promise<CellInfo[]> {
    type Init = MessageInitShape<typeof SetInterestSchema>;
    let req: Init = { follow: opts.follow ?? Follow.OFF, options: opts.options as Init["options"], lod: opts.lod ?? [] };
    if (area && "sphere" in area) {
      req = { ...req, area: { case: "sphere", value: { center: vec(area.sphere.center), radius: area.sphere.radius } } };
    } else if (area && "box" in area) {
      req = { ...req, area: { case: "box", value: { min: vec(area.box.min), max: vec(area.box.max) } } };
    } else if (area && "cone" in area) {
      const c = area.cone;
      req = {
        ...req,
        area: { case: "cone", value: { apex: vec(c.apex), direction: vec(c.direction), halfAngle: c.halfAngle, range: c.range } },
      };
    }
    const result = decodeBody(InterestResultSchema, await this.client.call("spatial.interest", encode(SetInterestSchema, req)));
    this.last = { area, opts };
    if (!this.schema) {
      this.schema = Schema.parse(result.cellSchemaJson);
      const early = this.early;
      this.early = [];
      for (const u of early) this.apply(u.channelId, u.codec, u.update);
    }
    return result.cells;
  }

  /**
   * Every entity of every cell in view, once (filter by position for those inside the area). An
   * entity that crossed from one cell to another may be in both replicas for a while: the
   * cells' updates come at different times with level of detail, or after a message that was
   * full (§14.2, §14.4). The copy from the cell updated last is the one given.
   */
  *entities(): Generator<Entity> {
    const latest = new Map<string, { entity: Entity; at: number }>();
    for (const [cell, replica] of this.cells) {
      const at = this.updatedAt.get(cell) ?? 0;
      const map = replica.state["entities"] as { [id: string]: { [field: string]: Value } } | undefined;
      for (const [id, value] of Object.entries(map ?? {})) {
        const seen = latest.get(id);
        if (!seen || at > seen.at) latest.set(id, { entity: { id, cell, value }, at });
      }
    }
    for (const { entity } of latest.values()) yield entity;
  }

  /** After each update of a cell, with its changes (a snapshot starts with a `reset`). */
  onCell(fn: Listener<[bigint, Change[]]>): () => void {
    this.cellListeners.add(fn);
    return () => this.cellListeners.delete(fn);
  }

  /** A cell left the view (its replica is dropped, its entities with it). */
  onCellLeft(fn: Listener<[bigint]>): () => void {
    this.leftListeners.add(fn);
    return () => this.leftListeners.delete(fn);
  }

  /** `spatial.event`: a spatial server lost or joined. */
  onEvent(fn: Listener<[SpatialEvent]>): () => void {
    this.eventListeners.add(fn);
    return () => this.eventListeners.delete(fn);
  }

  /**
   * A cell's update did not decode. Its replica then takes only a snapshot, and the view asks
   * for one ([`resync`](#resync)).
   */
  onError(fn: Listener<[bigint, DecodeError]>): () => void {
    this.errorListeners.add(fn);
    return () => this.errorListeners.delete(fn);
  }

  private route(topic: string, body: Uint8Array): void {
    switch (topic) {
      case "channel.updates":
        for (const u of decodeBody(ChannelUpdatesSchema, body).updates) this.apply(u.channelId, u.codec, u.update);
        return;
      case "channel.event": {
        const e = decodeBody(ChannelEventSchema, body);
        if (e.channelId >= FIRST_CELL_ID && e.channelId < FIRST_ENTITY_ID && e.kind === ChannelEventKind.UNSUBSCRIBED) {
          this.updatedAt.delete(e.channelId);
          if (this.cells.delete(e.channelId)) emit(this.client.report, this.leftListeners, e.channelId);
        }
        return;
      }
      case "spatial.event": {
        const e = decodeBody(SpatialEventSchema, body);
        emit(this.client.report, this.eventListeners, e);
        return;
      }
    }
  }

  private apply(channelId: bigint, codec: DeltaCodec, update: Uint8Array): void {
    if (!this.schema) {
      // Bounded: before the first answer only the snapshots of its cells (at most 1,000) come.
      if (this.early.length < 4096) this.early.push({ channelId, codec, update });
      return;
    }
    let replica = this.cells.get(channelId);
    if (!replica) {
      replica = new Replica(this.schema);
      this.cells.set(channelId, replica);
    }
    const track = this.cellListeners.size > 0;
    const changes: Change[] | undefined = track ? [] : undefined;
    try {
      if (codec === DeltaCodec.JSON) replica.applyJson(update, changes);
      else replica.apply(update, changes);
    } catch (e) {
      if (!(e instanceof DecodeError)) throw e;
      // Deltas sent before a resync cleared the area still come, and cannot apply: expected.
      if (this.resyncing) return;
      emit(this.client.report, this.errorListeners, channelId, e);
      void this.resync().catch(() => {});
      return;
    }
    this.updatedAt.set(channelId, ++this.applied);
    if (changes) emit(this.client.report, this.cellListeners, channelId, changes);
  }
}
