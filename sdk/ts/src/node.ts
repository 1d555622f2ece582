// Why this exists: Node programs (bots, tools, tests) can use the gateway's TCP listener (§1),
// which costs less than WebSocket. Kept out of the main entry so browsers never load `node:net`.

import { connect as netConnect } from "node:net";
import type { Connector, Transport } from "./transport.js";

export * from "./index.js";

/** Connects over TCP, e.g. `tcp("127.0.0.1", 7400)`. */
export function tcp(host: string, port: number): Connector {
  return () =>
    new Promise<Transport>((resolve, reject) => {
      const socket = netConnect({ host, port });
      socket.setNoDelay(true);
      let open = false;
      let closed = false;
      const transport: Transport = {
        write(bytes) {
          if (!closed) socket.write(bytes);
        },
        close() {
          socket.end();
        },
        onData: () => {},
        onClose: () => {},
      };
      const end = (error?: Error) => {
        if (closed) return;
        closed = true;
        socket.destroy();
        if (open) transport.onClose(error);
        else reject(error ?? new Error(`could not connect to ${host}:${port}`));
      };
      socket.once("connect", () => {
        open = true;
        resolve(transport);
      });
      socket.on("data", (chunk: Buffer) => transport.onData(new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.length)));
      socket.on("error", (e) => end(e));
      socket.on("close", () => end());
    });
}
