// Why this exists: the SDK speaks the same byte stream over any transport (§1). A transport
// only moves bytes; the browser's WebSocket is here, Node's TCP socket in `node.ts`.

/** A connected byte stream. Set the callbacks before the first `await` after opening. */
export interface Transport {
  /** Writes bytes (in order; buffering is the transport's). */
  write(bytes: Uint8Array): void;
  /** Closes the connection; `onClose` follows. */
  close(): void;
  onData: (bytes: Uint8Array) => void;
  /** The connection ended (by either side, or an error). Called once. */
  onClose: (error?: Error) => void;
}

/** Opens a new connection to the gateway. Called for the first connection and each resume. */
export type Connector = () => Promise<Transport>;

/** The gateway accepts WebSocket messages of at most 64 KiB (§1). */
const MAX_WS_MESSAGE = 64 * 1024;

/** The shape of the standard WebSocket class (the browser's, Node ≥ 22's, or the `ws` package's). */
export interface WebSocketLike {
  binaryType: string;
  readonly readyState: number;
  send(data: Uint8Array): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: unknown) => void) | null;
  onerror: ((ev: unknown) => void) | null;
}
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- any WebSocket class (browser, `ws`)
export type WebSocketConstructor = new (url: string, ...rest: any[]) => unknown;

/**
 * Connects over WebSocket (`ws://` or `wss://`). In browsers (and Node ≥ 22) the global
 * WebSocket is used; on Node 20 pass one, e.g. `import WebSocket from "ws"`.
 */
export function webSocket(url: string, impl?: WebSocketConstructor): Connector {
  return () =>
    new Promise<Transport>((resolve, reject) => {
      const Ctor = impl ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
      if (!Ctor) {
        reject(new Error("no WebSocket in this runtime: pass one (e.g. from the `ws` package)"));
        return;
      }
      const ws = new Ctor(url) as WebSocketLike;
      ws.binaryType = "arraybuffer";
      let open = false;
      let closed = false;
      const transport: Transport = {
        write(bytes) {
          if (closed || ws.readyState !== 1) return;
          for (let at = 0; at < bytes.length; at += MAX_WS_MESSAGE) {
            ws.send(bytes.subarray(at, at + MAX_WS_MESSAGE));
          }
        },
        close() {
          ws.close(1000);
        },
        onData: () => {},
        onClose: () => {},
      };
      const end = (error?: Error) => {
        if (closed) return;
        closed = true;
        if (open) transport.onClose(error);
        else reject(error ?? new Error(`could not connect to ${url}`));
      };
      ws.onopen = () => {
        open = true;
        resolve(transport);
      };
      ws.onmessage = (ev) => {
        if (!(ev.data instanceof ArrayBuffer)) {
          // Text messages are a protocol error (§1).
          ws.close(1003, "text messages are not part of the protocol");
          end(new Error("the server sent a text message"));
          return;
        }
        transport.onData(new Uint8Array(ev.data));
      };
      ws.onerror = () => end(new Error(`WebSocket error on ${url}`));
      ws.onclose = () => end();
    });
}
