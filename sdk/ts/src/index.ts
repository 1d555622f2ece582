// Why this exists: the package's entry point for browsers and Node (Node's TCP transport is in
// `@tickwire/client/node`).

export { Client, type ClientOptions, type ClientEvents } from "./client.js";
export { webSocket, type Connector, type Transport, type WebSocketConstructor } from "./transport.js";
export { BackpressureError, ClosedError, DecodeError, FrameError, ProtocolError, StatusError, TimeoutError } from "./errors.js";
export { Replica, type Change } from "./state/replica.js";
export { Schema, SchemaError, type Type, type Value } from "./state/schema.js";
export { Channels, Subscription, type SubscribeOptions } from "./channels.js";
export { FrameDecoder, encodeFrame, type Frame } from "./frame.js";
export { Session, type SessionConfig } from "./session.js";
export * as proto from "./proto.js";
export { Spatial, FIRST_CELL_ID, FIRST_ENTITY_ID, type Area, type Entity, type InterestOptions } from "./spatial.js";
