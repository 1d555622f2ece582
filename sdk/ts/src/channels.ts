// Why this exists: the `channel.*` methods of docs/protocol.md §13 as typed calls, and a
// subscription that keeps a replica of the channel's state up to date from its
// `channel.update` pushes, with per-key callbacks (like Colyseus's onChange/onAdd/onRemove).

import {
  Broadcast,
  ChannelEventSchema,
  ChannelMessageSchema,
  ChannelRefSchema,
  ChannelSendSchema,
  ChannelType,
  ChannelUpdateSchema,
  CreateChannelResultSchema,
  CreateChannelSchema,
  DeltaCodec,
  ListChannelsResultSchema,
  ListChannelsSchema,
  SubscribeResultSchema,
  SubscribeSchema,
  SubscriptionOptionsSchema,
  UpdateChannelSchema,
  type ChannelEvent,
  type ChannelInfo,
  type ChannelMessage,
  type CreateChannelResult,
  type SubscriptionOptions,
} from "./gen/tickwire/v1/channel_pb.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { Client } from "./client.js";
import { DecodeError } from "./errors.js";
import { decodeBody, encode } from "./messages.js";
import { Replica, type Change } from "./state/replica.js";
import { Schema } from "./state/schema.js";
import { call, emit, rethrowLater, type Report } from "./emit.js";

/** Subscription options (§13.2); every field is optional. */
export type SubscribeOptions = Omit<MessageInitShape<typeof SubscriptionOptionsSchema>, "$typeName">;

type Listener<A extends unknown[]> = (...args: A) => void;

/** A subscription to one channel: its replica, and callbacks on what changes. */
export class Subscription {
  private replicaNow: Replica | undefined;
  /** Updates that arrived before the subscribe's answer (same read), applied once it is in. */
  private early: { update: Uint8Array; codec: DeltaCodec }[] | undefined = [];
  private readonly changeListeners = new Set<{ prefix: string[]; fn: Listener<[Change]> }>();
  private readonly updateListeners = new Set<Listener<[Change[]]>>();
  private readonly messageListeners = new Set<Listener<[ChannelMessage]>>();
  private readonly eventListeners = new Set<Listener<[ChannelEvent]>>();
  private readonly errorListeners = new Set<Listener<[DecodeError]>>();
  private closed = false;
  private resyncing = false;

  constructor(
    readonly channelId: bigint,
    private readonly unsubscribeFn: () => Promise<void>,
    private readonly report: Report = rethrowLater,
    private readonly resyncFn?: () => Promise<void>,
  ) {}

  /** The channel's state as this client may see it. */
  get replica(): Replica {
    if (!this.replicaNow) throw new Error("the subscription has no schema yet");
    return this.replicaNow;
  }

  /** @internal The subscribe's answer is in: its schema, then the updates that came first. */
  ready(schema: Schema): void {
    this.replicaNow = new Replica(schema);
    const early = this.early ?? [];
    this.early = undefined;
    for (const u of early) this.applyUpdate(u.update, u.codec);
  }

  /** After each update, with every change it made (a snapshot starts with a `reset`). */
  onUpdate(fn: Listener<[Change[]]>): () => void {
    this.updateListeners.add(fn);
    return () => this.updateListeners.delete(fn);
  }

  /**
   * Each change at or under `path` (a JSON pointer such as `/players/alice`; `""` for all).
   * Map entries added and removed come as changes with op `insert` and `remove`.
   */
  onChange(path: string, fn: Listener<[Change]>): () => void {
    const entry = { prefix: pointer(path), fn };
    this.changeListeners.add(entry);
    return () => this.changeListeners.delete(entry);
  }

  /** An entry inserted in the map at `path` (and, after a snapshot, each entry it holds). */
  onAdd(path: string, fn: Listener<[string, unknown]>): () => void {
    const prefix = pointer(path);
    return this.onUpdate((changes) => {
      for (const c of changes) {
        if (c.op === "insert" && c.path.length === prefix.length + 1 && startsWith(c.path, prefix)) {
          fn(String(c.path[prefix.length]), c.value);
        } else if ((c.op === "reset" || c.op === "set") && startsWith(prefix, c.path)) {
          // The map was replaced whole: each of its entries is new.
          const map = lookup(this.replica.state, prefix);
          if (map && typeof map === "object") for (const [k, v] of Object.entries(map)) fn(k, v);
        }
      }
    });
  }

  /** An entry removed from the map at `path`. */
  onRemove(path: string, fn: Listener<[string]>): () => void {
    const prefix = pointer(path);
    return this.onUpdate((changes) => {
      for (const c of changes) {
        if (c.op === "remove" && c.path.length === prefix.length + 1 && startsWith(c.path, prefix)) {
          fn(String(c.path[prefix.length]));
        }
      }
    });
  }

  /** A `channel.send` that reached this client (§13.3). */
  onMessage(fn: Listener<[ChannelMessage]>): () => void {
    this.messageListeners.add(fn);
    return () => this.messageListeners.delete(fn);
  }

  /** OWNER_LOST, OWNER_RECOVERED, REMOVED, UNSUBSCRIBED (§13.3). */
  onEvent(fn: Listener<[ChannelEvent]>): () => void {
    this.eventListeners.add(fn);
    return () => this.eventListeners.delete(fn);
  }

  /**
   * Starts the replica again from a snapshot: unsubscribes and subscribes again with the same
   * options (§12.2, "Decode errors"). Done by itself after an update that does not decode.
   */
  async resync(): Promise<void> {
    if (!this.resyncFn || this.resyncing || this.closed) return;
    this.resyncing = true;
    try {
      await this.resyncFn();
    } finally {
      this.resyncing = false;
    }
  }

  /**
   * An update that did not decode. The replica then takes only a snapshot, and asks for one
   * ([`resync`](#resync)); the changes in between are not reported.
   */
  onError(fn: Listener<[DecodeError]>): () => void {
    this.errorListeners.add(fn);
    return () => this.errorListeners.delete(fn);
  }

  async unsubscribe(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.unsubscribeFn();
  }

  /** @internal */
  applyUpdate(update: Uint8Array, codec: DeltaCodec = DeltaCodec.BINARY): void {
    if (this.early) {
      // Bounded: the gateway sends one snapshot before anything else.
      if (this.early.length < 64) this.early.push({ update, codec });
      return;
    }
    const track = this.updateListeners.size > 0 || this.changeListeners.size > 0;
    const changes: Change[] | undefined = track ? [] : undefined;
    try {
      if (codec === DeltaCodec.JSON) this.replicaNow!.applyJson(update, changes);
      else this.replicaNow!.apply(update, changes);
    } catch (e) {
      if (!(e instanceof DecodeError)) throw e;
      // Deltas sent before a resync's unsubscribe still come, and cannot apply: expected.
      if (this.resyncing) return;
      emit(this.report, this.errorListeners, e);
      // The gateway goes on sending deltas the replica cannot apply: ask for a snapshot.
      void this.resync().catch(() => {});
      return;
    }
    if (!changes) return;
    emit(this.report, this.updateListeners, changes);
    for (const { prefix, fn } of this.changeListeners) {
      for (const c of changes) if (startsWith(c.path, prefix) || c.op === "reset") call(this.report, fn, c);
    }
  }

  /** @internal */
  deliverMessage(m: ChannelMessage): void {
    emit(this.report, this.messageListeners, m);
  }

  /** @internal */
  deliverEvent(e: ChannelEvent): void {
    emit(this.report, this.eventListeners, e);
  }
}

function pointer(path: string): string[] {
  if (path === "" || path === "/") return [];
  return path
    .replace(/^\//, "")
    .split("/")
    .map((s) => s.replace(/~1/g, "/").replace(/~0/g, "~"));
}

function startsWith(path: Change["path"], prefix: Change["path"]): boolean {
  return prefix.length <= path.length && prefix.every((p, i) => String(p) === String(path[i]));
}

function lookup(state: unknown, path: string[]): unknown {
  let node = state;
  for (const p of path) {
    if (node === null || typeof node !== "object") return undefined;
    node = (node as Record<string, unknown>)[p];
  }
  return node;
}

/** The `channel.*` calls of one client, and its subscriptions' replicas. */
export class Channels {
  private readonly subscriptions = new Map<bigint, Subscription>();
  /** Removes the push listener ([`dispose`](#dispose)). */
  private readonly off: () => void;

  constructor(private readonly client: Client) {
    this.off = client.routePushes((topic, body) => this.route(topic, body));
  }

  /** Stops handling this client's pushes (the subscriptions stop updating). */
  dispose(): void {
    this.off();
    this.subscriptions.clear();
  }

  /** `channel.create` (game servers, §13.1). `schemaJson` empty: the type's configured schema. */
  async create(type: ChannelType, name: string, schemaJson = ""): Promise<CreateChannelResult> {
    const body = await this.client.call("channel.create", encode(CreateChannelSchema, { type, name, schemaJson }));
    return decodeBody(CreateChannelResultSchema, body);
  }

  /** `channel.list`: the channels this client may subscribe to (all types and names by default). */
  async list(type: ChannelType = ChannelType.UNSPECIFIED, name = ""): Promise<ChannelInfo[]> {
    const body = await this.client.call("channel.list", encode(ListChannelsSchema, { type, name }));
    return decodeBody(ListChannelsResultSchema, body).channels;
  }

  /** `channel.subscribe`: the replica fills from the snapshot that follows. */
  async subscribe(channelId: bigint, options: SubscribeOptions = {}): Promise<Subscription> {
    const req = encode(SubscribeSchema, { channelId, options: options as SubscriptionOptions });
    // Registered before the call: the snapshot may arrive in the same read as the answer.
    let sub = this.subscriptions.get(channelId);
    const fresh = sub === undefined;
    if (!sub) {
      const ref = encode(ChannelRefSchema, { channelId });
      // A resync must start from a snapshot, whatever the first subscribe asked.
      const again = encode(SubscribeSchema, {
        channelId,
        options: { ...options, skipFirstFullState: false } as SubscriptionOptions,
      });
      sub = new Subscription(
        channelId,
        async () => {
          this.subscriptions.delete(channelId);
          await this.client.call("channel.unsubscribe", ref);
        },
        this.client.report,
        async () => {
          await this.client.call("channel.unsubscribe", ref);
          await this.client.call("channel.subscribe", again);
        },
      );
      this.subscriptions.set(channelId, sub);
    }
    try {
      const result = decodeBody(SubscribeResultSchema, await this.client.call("channel.subscribe", req));
      if (fresh) sub.ready(Schema.parse(result.schemaJson));
    } catch (e) {
      if (fresh) this.subscriptions.delete(channelId);
      throw e;
    }
    return sub;
  }

  /** `channel.update`: a patch of JSON lines (§13.4), by the owner or a WRITE subscriber. */
  async update(channelId: bigint, patch: string): Promise<void> {
    await this.client.call("channel.update", encode(UpdateChannelSchema, { channelId, patch: new TextEncoder().encode(patch) }));
  }

  /** `channel.send`: a message to the owner (clients), or from a server to members (§13.1). */
  async send(channelId: bigint, body: Uint8Array, to: { connection?: bigint; broadcast?: Broadcast } = {}): Promise<void> {
    const req = encode(ChannelSendSchema, {
      channelId,
      body,
      toConnection: to.connection ?? 0n,
      broadcast: to.broadcast ?? Broadcast.NONE,
    });
    await this.client.call("channel.send", req);
  }

  async remove(channelId: bigint): Promise<void> {
    await this.client.call("channel.remove", encode(ChannelRefSchema, { channelId }));
  }

  private route(topic: string, body: Uint8Array): void {
    switch (topic) {
      case "channel.update": {
        const u = decodeBody(ChannelUpdateSchema, body);
        this.subscriptions.get(u.channelId)?.applyUpdate(u.update, u.codec);
        return;
      }
      case "channel.message": {
        const m = decodeBody(ChannelMessageSchema, body);
        this.subscriptions.get(m.channelId)?.deliverMessage(m);
        return;
      }
      case "channel.event": {
        const e = decodeBody(ChannelEventSchema, body);
        this.subscriptions.get(e.channelId)?.deliverEvent(e);
        return;
      }
    }
  }
}
