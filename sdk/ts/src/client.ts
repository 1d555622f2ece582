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
import { BackpressureError, ClosedError, ProtocolError, StatusError, TimeoutError } from "./errors.js";
import { DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encodeFrame, type Frame } from "./frame.js";
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
}

const defaultNow = () => performance.now();

/** Opens a connection, sends a Hello and waits for the Welcome (or the Close refusing it). */
async function handshake(options: ClientOptions, resume?: { welcome: Welcome; lastReceived: number }): Promise<Opened> {
  const transport = await options.connect();
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
  transport.write(encodeFrame({ type: "control", body: encodeControl({ case: "hello", value: hello }) }));
  const welcome = await new Promise<Welcome>((resolve, reject) => {
    transport.onClose = (e) => reject(e ?? new Error("the connection closed before the Welcome"));
    transport.onData = (bytes) => {
      try {
        decoder.push(bytes);
        const frame = decoder.next();
        if (!frame) return;
        if (frame.type !== "control") throw new ProtocolError("the first frame is not a Welcome");
        const control = decodeControl(frame.body);
        if (control.kind.case === "welcome") resolve(control.kind.value);
        else if (control.kind.case === "close") reject(new ClosedError(control.kind.value.reason, control.kind.value.message));
        else throw new ProtocolError(`a ${control.kind.case} instead of a Welcome`);
      } catch (e) {
        transport.close();
        reject(e as Error);
      }
    };
  });
  decoder.maxFrameBytes = Math.max(DEFAULT_MAX_FRAME_BYTES, welcome.maxFrameBytes);
  return { transport, decoder, welcome };
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
  private readonly waiting: Uint8Array[] = [];
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
    this.attachLink(opened.transport);
  }

  /** The Welcome that opened the session (§3). */
  readonly welcome: Welcome;

  /** Opens a new session. Rejects with `ClosedError` if the gateway refuses the Hello. */
  static async connect(options: ClientOptions): Promise<Client> {
    const client = new Client(options, await handshake(options));
    client.pump();
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
        reject(new TimeoutError(method, ms));
      }, ms);
      this.pending.set(id, { method, resolve, reject, timer });
      try {
        this.sendPayload(encodeEnvelope({ case: "request", value: create(RequestSchema, { id, method, body }) }));
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

  /** Ends the session: tells the gateway (Close NORMAL) and closes the connection. */
  close(): void {
    if (this.ended) return;
    const close = create(CloseSchema, { reason: CloseReason.NORMAL, message: "bye" });
    this.link?.write(encodeFrame({ type: "control", body: encodeControl({ case: "close", value: close }) }));
    this.end(new ClosedError(CloseReason.NORMAL, "closed by the client"));
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
  private sendPayload(payload: Uint8Array): void {
    if (!this.session.fits(payload.length)) {
      throw new BackpressureError(`a message of ${payload.length} bytes is larger than the unacknowledged window`);
    }
    if (this.waiting.length > 0 || !this.session.hasRoom(payload.length)) {
      if (this.waiting.length >= (this.options.maxWaiting ?? 16_384)) {
        throw new BackpressureError(`${this.waiting.length} messages already wait for the gateway's acknowledgements`);
      }
      this.waiting.push(payload);
      return;
    }
    const frame = this.session.send(this.now(), payload);
    if (frame) this.write(frame);
    this.arm();
  }

  /** Sends what waited, as far as the window has room. */
  private flushWaiting(): void {
    let sent = false;
    while (this.waiting.length > 0 && this.session.hasRoom(this.waiting[0]!.length)) {
      const frame = this.session.send(this.now(), this.waiting.shift()!);
      if (frame) this.write(frame);
      sent = true;
    }
    if (sent) this.arm();
  }

  private write(frame: Frame): void {
    this.link?.write(encodeFrame(frame));
  }

  private attachLink(transport: Transport): void {
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

  /** A protocol violation by the peer: the session cannot go on. */
  private fail(error: Error): void {
    this.end(new ClosedError(CloseReason.PROTOCOL_ERROR, error.message));
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
          opened.transport.close();
          return;
        }
        if (!opened.welcome.resumed) throw new ProtocolError("the Welcome to a resume says resumed = false");
        // Bytes of the old connection are gone with it; the new one starts clean.
        this.decoder = opened.decoder;
        this.attachLink(opened.transport);
        for (const frame of this.session.attach(this.now(), Number(opened.welcome.lastReceived))) this.write(frame);
        emit(this.report, this.listeners.resumed);
        this.pump();
        return;
      } catch (e) {
        if (e instanceof ClosedError || e instanceof ProtocolError) {
          this.end(e instanceof ClosedError ? e : new ClosedError(CloseReason.PROTOCOL_ERROR, e.message));
          return;
        }
        await new Promise((r) => setTimeout(r, backoff));
        backoff = Math.min(backoff * 2, 1000);
      }
    }
  }

  private end(error: ClosedError): void {
    if (this.ended) return;
    this.ended = error;
    if (this.timer !== undefined) clearTimeout(this.timer);
    const link = this.link;
    this.link = undefined;
    if (link) {
      link.onData = () => {};
      link.onClose = () => {};
      link.close();
    }
    for (const p of this.pending.values()) {
      clearTimeout(p.timer);
      p.reject(error);
    }
    this.pending.clear();
    this.waiting.length = 0;
    emit(this.report, this.listeners.closed, error);
  }
}
