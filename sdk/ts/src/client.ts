// Why this exists: one reliable session with the gateway (§3–§9): the handshake, requests
// answered as promises, pushes as events, and a dropped connection resumed with nothing lost
// or repeated. All timing decisions are the sans-IO `Session`'s; this class only feeds it
// bytes, `now` and one timer.

import { create } from "@bufbuild/protobuf";
import {
  CloseReason,
  CloseSchema,
  HelloSchema,
  PushSchema,
  RequestSchema,
  ResumeRequestSchema,
  Status,
  type Welcome,
} from "./gen/tickwire/v1/control_pb.js";
import { BackpressureError, ClosedError, FrameError, ProtocolError, StatusError, TimeoutError } from "./errors.js";
import { DEFAULT_MAX_FRAME_BYTES, FrameDecoder, PRE_WELCOME_MAX_FRAME_BYTES, encodeFrame, type Frame } from "./frame.js";
import { decodeControl, decodeEnvelope, encodeControl, encodeEnvelope } from "./messages.js";
import { Session, configFromWelcome } from "./session.js";
import type { Connector, Transport } from "./transport.js";
import { emit, rethrowLater, type Report } from "./emit.js";

export interface ClientOptions {
  /** How to reach the gateway: `webSocket(url)`, or `tcp(host, port)` from `@tickwire/client/node`. */
  connect: Connector;
  /** Credentials (§4): a JWT, or in dev mode a player id or `server:NAME`. */
  token?: string;
  /** Free text for the server's logs. */
  clientName?: string;
  /** Default timeout of `call` (ms). */
  requestTimeoutMs?: number;
  /** Resume the session when the connection drops (default true). */
  resume?: boolean;
  /**
   * Where an error thrown by one of your callbacks (events, subscriptions) goes. It never ends
   * the session; by default it is thrown again on its own, as an uncaught error.
   */
  onCallbackError?: (error: unknown) => void;
  /**
   * Calls and pushes kept while the unacknowledged window (§5) is full, for example while the
   * session resumes; beyond this many a call is refused with `BackpressureError` (default 16,384).
   */
  maxWaiting?: number;
  /** The same bound in bytes (default 64 MiB). */
  maxWaitingBytes?: number;
  /**
   * How long one connection attempt may take, from opening it to the Welcome (ms, default
   * 10,000). A resume attempt that takes longer is abandoned and tried again.
   */
  handshakeTimeoutMs?: number;
  /** The clock (ms); tests may pass their own. */
  now?: () => number;
}

export interface ClientEvents {
  /** A push from the gateway (§8): `channel.update`, `channel.message`, `channel.event`, … */
  push: (topic: string, body: Uint8Array) => void;
  /** The connection dropped; the session is being resumed. */
  linkLost: () => void;
  /** A new connection carries the session on; nothing was lost. */
  resumed: () => void;
  /** The session ended. Every pending call has been rejected with the same error. */
  closed: (error: ClosedError) => void;
}

interface Pending {
  method: string;
  resolve: (body: Uint8Array) => void;
  reject: (error: Error) => void;
  timer: ReturnType<typeof setTimeout>;
}

interface Opened {
  transport: Transport;
  decoder: FrameDecoder;
  welcome: Welcome;
  /**
   * What happened between the Welcome and the session taking the connection over: the bytes
   * went on into `decoder`; a close or a bad chunk is kept here for the session to act on.
   */
  early: { closed: boolean; error?: Error };
}

/** A message waiting for room in the unacknowledged window; `id` for a call's request. */
interface Waiting {
  payload: Uint8Array;
  id?: bigint;
}

/** Frame bytes besides a DATA frame's payload, at most: type, and `seq` and `ack` varints (§2). */
const DATA_OVERHEAD = 1 + 10 + 10;

const defaultNow = () => performance.now();

/**
 * Opens a connection, sends a Hello and waits for the Welcome (or the Close refusing it), for
 * at most `handshakeTimeoutMs`. Bytes that follow the Welcome (a resume's resent messages, in
 * the same read or the next) stay in the decoder for the session.
 */
async function handshake(options: ClientOptions, resume?: { welcome: Welcome; lastReceived: number }): Promise<Opened> {
  const ms = options.handshakeTimeoutMs ?? 10_000;
  let timedOut = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      timedOut = true;
      reject(new TimeoutError("handshake", ms));
    }, ms);
  });
  try {
    const connecting = options.connect();
    // A connection that opens after the deadline is closed at once.
    connecting.then((t) => timedOut && t.close(), () => {});
    const transport = await Promise.race([connecting, deadline]);
    return await Promise.race([greet(transport, options, resume), deadline]).catch((e: unknown) => {
      transport.close();
      throw e;
    });
  } finally {
    clearTimeout(timer);
  }
}

function greet(transport: Transport, options: ClientOptions, resume?: { welcome: Welcome; lastReceived: number }): Promise<Opened> {
  const decoder = new FrameDecoder(DEFAULT_MAX_FRAME_BYTES);
  const hello = create(HelloSchema, {
    protocolVersion: 1,
    token: options.token ?? "",
    clientName: options.clientName ?? "tickwire-ts",
    resume: resume
      ? create(ResumeRequestSchema, {
          sessionId: resume.welcome.sessionId,
          resumeToken: resume.welcome.resumeToken,
          lastReceived: BigInt(resume.lastReceived),
        })
      : undefined,
  });
  const helloFrame = encodeFrame({ type: "control", body: encodeControl({ case: "hello", value: hello }) });
  if (helloFrame.length - 4 > PRE_WELCOME_MAX_FRAME_BYTES) {
    return Promise.reject(
      new FrameError("FrameTooLarge", `a Hello of ${helloFrame.length - 4} bytes; the gateway takes at most ${PRE_WELCOME_MAX_FRAME_BYTES} before its Welcome (is the token that long?)`),
    );
  }
  transport.write(helloFrame);
  return new Promise<Opened>((resolve, reject) => {
    transport.onClose = (e) => reject(e ?? new Error("the connection closed before the Welcome"));
    transport.onData = (bytes) => {
      try {
        decoder.push(bytes);
        const frame = decoder.next();
        if (!frame) return;
        if (frame.type !== "control") throw new ProtocolError("the first frame is not a Welcome");
        const control = decodeControl(frame.body);
        if (control.kind.case === "close") {
          reject(new ClosedError(control.kind.value.reason, control.kind.value.message));
          return;
        }
        if (control.kind.case !== "welcome") throw new ProtocolError(`a ${control.kind.case} instead of a Welcome`);
        const welcome = control.kind.value;
        decoder.maxFrameBytes = Math.max(DEFAULT_MAX_FRAME_BYTES, welcome.maxFrameBytes);
        // From here until the session takes the connection over, bytes only accumulate.
        const early: Opened["early"] = { closed: false };
        transport.onData = (more) => {
          try {
            decoder.push(more);
          } catch (e) {
            early.error ??= e as Error;
          }
        };
        transport.onClose = () => {
          early.closed = true;
        };
        resolve({ transport, decoder, welcome, early });
      } catch (e) {
        transport.close();
        reject(e as Error);
      }
    };
  });
}

export class Client {
  private link: Transport | undefined;
  private decoder: FrameDecoder;
  private readonly session: Session;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private readonly pending = new Map<bigint, Pending>();
  private nextId = 1n;
  private ended: ClosedError | undefined;
  private readonly listeners: { [K in keyof ClientEvents]: Set<ClientEvents[K]> } = {
    push: new Set(),
    linkLost: new Set(),
    resumed: new Set(),
    closed: new Set(),
  };
  private readonly now: () => number;
  /** Messages waiting for room in the unacknowledged window, in order (bounded by maxWaiting). */
  private waiting: Waiting[] = [];
  private waitingBytes = 0;
  /** @internal Reports an error a callback threw (ClientOptions.onCallbackError). */
  readonly report: Report;

  private constructor(
    private readonly options: ClientOptions,
    opened: Opened,
  ) {
    this.now = options.now ?? defaultNow;
    this.report = options.onCallbackError ?? rethrowLater;
    this.welcome = opened.welcome;
    this.session = new Session(configFromWelcome(opened.welcome), this.now());
    this.decoder = opened.decoder;
    this.attachLink(opened);
  }

  /** The Welcome that opened the session (§3). */
  readonly welcome: Welcome;

  /**
   * Opens a new session. Rejects with `ClosedError` if the gateway refuses the Hello, and with
   * `TimeoutError` if no Welcome comes within `handshakeTimeoutMs`. Pushes that came with the
   * Welcome are delivered on the next turn of the event loop, so listeners added as soon as
   * this resolves see them.
   */
  static async connect(options: ClientOptions): Promise<Client> {
    const client = new Client(options, await handshake(options));
    // Bytes that broke the protocol right after the Welcome ended it already.
    if (client.ended) throw client.ended;
    setTimeout(() => client.pump(), 0);
    return client;
  }

  /** How servers see this session (`ChannelMessage.from_connection`, §14's controller). */
  get connectionId(): bigint {
    return this.welcome.connectionId;
  }

  get playerId(): string {
    return this.welcome.playerId;
  }

  /** Whether the session has a live connection now. */
  get connected(): boolean {
    return this.link !== undefined;
  }

  /** The error the session ended with, if it has. */
  get closedWith(): ClosedError | undefined {
    return this.ended;
  }

  on<K extends keyof ClientEvents>(event: K, listener: ClientEvents[K]): () => void {
    this.listeners[event].add(listener);
    return () => this.listeners[event].delete(listener);
  }

  /**
   * Sends a request and resolves with the response body. Rejects with `StatusError` (a non-OK
   * status), `TimeoutError` (no answer in time; the session goes on) or `ClosedError`.
   */
  call(method: string, body: Uint8Array = new Uint8Array(0), timeoutMs?: number): Promise<Uint8Array> {
    if (this.ended) return Promise.reject(this.ended);
    const id = this.nextId++;
    const ms = timeoutMs ?? this.options.requestTimeoutMs ?? 10_000;
    return new Promise<Uint8Array>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        // A call that never left is not sent later: the caller was told it failed.
        this.unwait(id);
        reject(new TimeoutError(method, ms));
      }, ms);
      this.pending.set(id, { method, resolve, reject, timer });
      try {
        this.sendPayload(encodeEnvelope({ case: "request", value: create(RequestSchema, { id, method, body }) }), id);
      } catch (e) {
        clearTimeout(timer);
        this.pending.delete(id);
        reject(e as Error);
      }
    });
  }

  /** Sends a one-way push (§8). */
  push(topic: string, body: Uint8Array = new Uint8Array(0)): void {
    if (this.ended) throw this.ended;
    this.sendPayload(encodeEnvelope({ case: "push", value: create(PushSchema, { topic, body }) }));
  }

  /**
   * Ends the session: tells the gateway (Close NORMAL) and closes the connection. While the
   * connection is down there is nobody to tell: a resume under way that succeeds later carries
   * the Close; otherwise the gateway ends the session when its resume window passes.
   */
  close(): void {
    this.end(new ClosedError(CloseReason.NORMAL, "closed by the client"), true);
  }

  /**
   * Drops the connection as a network failure would (no Close). The session resumes on a new
   * one if `resume` is on. For tests, and for a "reconnect now" after the network changed.
   */
  dropConnection(): void {
    this.loseLink();
  }

  /**
   * Sends a message, or keeps it behind those waiting when the unacknowledged window is full
   * (they go as acknowledgements arrive). Throws `BackpressureError` when it cannot be kept.
   */
  private sendPayload(payload: Uint8Array, id?: bigint): void {
    if (!this.session.fits(payload.length)) {
      throw new BackpressureError(`a message of ${payload.length} bytes is larger than the unacknowledged window`);
    }
    const frameMax = this.welcome.maxFrameBytes || DEFAULT_MAX_FRAME_BYTES;
    if (payload.length + DATA_OVERHEAD > frameMax) {
      // The gateway would end the session on it (FRAME_TOO_LARGE, §2).
      throw new BackpressureError(`a message of ${payload.length} bytes does not fit in the gateway's largest frame (${frameMax} bytes)`);
    }
    if (this.waiting.length > 0 || !this.session.hasRoom(payload.length)) {
      if (this.waiting.length >= (this.options.maxWaiting ?? 16_384)) {
        throw new BackpressureError(`${this.waiting.length} messages already wait for the gateway's acknowledgements`);
      }
      if (this.waitingBytes + payload.length > (this.options.maxWaitingBytes ?? 64 << 20)) {
        throw new BackpressureError(`${this.waitingBytes} bytes already wait for the gateway's acknowledgements`);
      }
      this.waiting.push({ payload, id });
      this.waitingBytes += payload.length;
      return;
    }
    const frame = this.session.send(this.now(), payload);
    if (frame) this.write(frame);
    this.arm();
  }

  /** Sends what waited, as far as the window has room. */
  private flushWaiting(): void {
    let sent = false;
    while (this.waiting.length > 0 && this.session.hasRoom(this.waiting[0]!.payload.length)) {
      const { payload } = this.waiting.shift()!;
      this.waitingBytes -= payload.length;
      const frame = this.session.send(this.now(), payload);
      if (frame) this.write(frame);
      sent = true;
    }
    if (sent) this.arm();
  }

  /** Takes call `id`'s request out of the waiting messages, if it is still there. */
  private unwait(id: bigint): void {
    const at = this.waiting.findIndex((w) => w.id === id);
    if (at < 0) return;
    this.waitingBytes -= this.waiting[at]!.payload.length;
    this.waiting.splice(at, 1);
  }

  private write(frame: Frame): void {
    this.link?.write(encodeFrame(frame));
  }

  /** Takes a connection over from the handshake, with what happened on it since the Welcome. */
  private attachLink({ transport, early }: Opened): void {
    this.link = transport;
    transport.onData = (bytes) => {
      if (this.link !== transport) return;
      try {
        this.decoder.push(bytes);
      } catch (e) {
        this.fail(e as Error);
        return;
      }
      this.pump();
    };
    transport.onClose = () => {
      if (this.link === transport) this.loseLink();
    };
    if (early.error) this.fail(early.error);
    else if (early.closed) queueMicrotask(() => this.link === transport && this.loseLink());
  }

  /**
   * @internal Listens to pushes with `route`, which decodes their bodies: a body that does not
   * decode (`FrameError`) means the gateway broke the protocol, and ends the session (§9).
   */
  routePushes(route: (topic: string, body: Uint8Array) => void): () => void {
    return this.on("push", (topic, body) => {
      try {
        route(topic, body);
      } catch (e) {
        if (e instanceof FrameError) this.fail(e);
        else throw e;
      }
    });
  }

  /** Handles every whole frame received, then writes an ACK if one is due. */
  private pump(): void {
    const now = this.now();
    try {
      for (let frame = this.decoder.next(); frame; frame = this.decoder.next()) {
        if (frame.type === "control") {
          const control = decodeControl(frame.body);
          if (control.kind.case !== "close") throw new ProtocolError(`a ${control.kind.case} inside a session`);
          this.end(new ClosedError(control.kind.value.reason, control.kind.value.message));
          return;
        }
        const payload = this.session.onFrame(now, frame);
        if (payload) this.deliver(now, payload);
        if (this.ended || !this.link) return;
      }
      // Acknowledgements may have made room.
      this.flushWaiting();
      const ack = this.session.pollTransmit(now);
      if (ack) this.write(ack);
    } catch (e) {
      this.fail(e as Error);
      return;
    }
    this.arm();
  }

  private deliver(now: number, payload: Uint8Array): void {
    const envelope = decodeEnvelope(payload);
    switch (envelope.kind.case) {
      case "response": {
        const r = envelope.kind.value;
        const p = this.pending.get(r.id);
        if (!p) return; // timed out already
        this.pending.delete(r.id);
        clearTimeout(p.timer);
        if (r.status === Status.OK) p.resolve(r.body);
        else p.reject(new StatusError(r.status, p.method, r.error));
        return;
      }
      case "push": {
        const { topic, body } = envelope.kind.value;
        // The gateway paces channel state by these acknowledgements (§5).
        if (topic === "channel.update" || topic === "channel.updates") this.session.ackSoon(now);
        emit(this.report, this.listeners.push, topic, body);
        return;
      }
      case "request":
        // The gateway sends no requests to clients; a server's requests are not answered here.
        return;
    }
  }

  /** One timer, at the session's next deadline. */
  private arm(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    if (this.ended) return;
    const delay = Math.max(0, this.session.pollTimeout() - this.now());
    this.timer = setTimeout(() => this.onTimer(), delay);
  }

  private onTimer(): void {
    this.timer = undefined;
    const t = this.session.onTimeout(this.now());
    switch (t.kind) {
      case "transmit":
        this.write(t.frame);
        break;
      case "linkDead":
        this.loseLink();
        return;
      case "expired":
        this.end(new ClosedError(CloseReason.RESUME_FAILED, "no connection within the resume window"));
        return;
      case "nothing":
        break;
    }
    this.arm();
  }

  /** A protocol violation by the peer: the session cannot go on, and the gateway is told. */
  private fail(error: Error): void {
    this.end(new ClosedError(CloseReason.PROTOCOL_ERROR, error.message), true);
  }

  private loseLink(): void {
    if (this.ended || !this.link) return;
    const old = this.link;
    this.link = undefined;
    old.onData = () => {};
    old.onClose = () => {};
    old.close();
    this.session.detach(this.now());
    emit(this.report, this.listeners.linkLost);
    if (this.options.resume === false) {
      this.end(new ClosedError(CloseReason.UNSPECIFIED, "the connection dropped"));
      return;
    }
    void this.resumeLoop();
  }

  /** Tries to resume until it works, the gateway refuses, or the resume window passes (§7). */
  private async resumeLoop(): Promise<void> {
    this.arm(); // the resume window's deadline
    let backoff = 25;
    while (!this.ended) {
      try {
        const opened = await handshake(this.options, { welcome: this.welcome, lastReceived: this.session.lastReceived });
        if (this.ended) {
          // Closed meanwhile: the session is resumed only to be ended properly.
          sayClose(opened.transport, this.ended);
          opened.transport.close();
          return;
        }
        if (!opened.welcome.resumed) throw new ProtocolError("the Welcome to a resume says resumed = false");
        // Bytes of the old connection are gone with it; the new one starts clean.
        this.decoder = opened.decoder;
        this.attachLink(opened);
        if (this.ended) return;
        for (const frame of this.session.attach(this.now(), Number(opened.welcome.lastReceived))) this.write(frame);
        emit(this.report, this.listeners.resumed);
        this.pump();
        return;
      } catch (e) {
        // Refused, or bytes that break the protocol: trying again would not help. But a Close
        // sent before the gateway read the Hello (§9: OVERLOADED, AUTH_TIMEOUT) ends only that
        // connection: the session is still there for the next try.
        const beforeHello =
          e instanceof ClosedError && (e.reason === CloseReason.OVERLOADED || e.reason === CloseReason.AUTH_TIMEOUT);
        if (!beforeHello && (e instanceof ClosedError || e instanceof ProtocolError || e instanceof FrameError)) {
          this.end(e instanceof ClosedError ? e : new ClosedError(CloseReason.PROTOCOL_ERROR, e.message));
          return;
        }
        await new Promise((r) => setTimeout(r, backoff));
        backoff = Math.min(backoff * 2, 1000);
      }
    }
  }

  /** Ends the session with `error`; `tell`: our decision, so the gateway gets a Close (§9). */
  private end(error: ClosedError, tell = false): void {
    if (this.ended) return;
    this.ended = error;
    if (this.timer !== undefined) clearTimeout(this.timer);
    const link = this.link;
    this.link = undefined;
    if (link) {
      if (tell) sayClose(link, error);
      link.onData = () => {};
      link.onClose = () => {};
      link.close();
    }
    for (const p of this.pending.values()) {
      clearTimeout(p.timer);
      p.reject(error);
    }
    this.pending.clear();
    this.waiting = [];
    this.waitingBytes = 0;
    emit(this.report, this.listeners.closed, error);
  }
}

/** Writes a Close with the reason the session ended for (§9). */
function sayClose(transport: Transport, error: ClosedError): void {
  const close = create(CloseSchema, { reason: error.reason, message: error.detail });
  transport.write(encodeFrame({ type: "control", body: encodeControl({ case: "close", value: close }) }));
}
