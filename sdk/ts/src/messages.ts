// Why this exists: the protobuf bodies of CONTROL and DATA frames (§3, §8), decoded with the
// spec's error names (MissingKind, Protobuf) so that bad input is a typed error.

import { create, fromBinary, toBinary, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import {
  ControlSchema,
  EnvelopeSchema,
  type Control,
  type Envelope,
} from "./gen/tickwire/v1/control_pb.js";
import { FrameError } from "./errors.js";

function decode<D extends DescMessage>(schema: D, bytes: Uint8Array): MessageShape<D> {
  try {
    return fromBinary(schema, bytes);
  } catch (e) {
    throw new FrameError("Protobuf", `${schema.typeName}: ${(e as Error).message}`);
  }
}

/** A CONTROL body: a `Control` with its `kind` set. */
export function decodeControl(body: Uint8Array): Control {
  const control = decode(ControlSchema, body);
  if (control.kind.case === undefined) throw new FrameError("MissingKind", "a Control with no kind");
  return control;
}

/** A DATA payload: an `Envelope` with its `kind` set. */
export function decodeEnvelope(payload: Uint8Array): Envelope {
  const envelope = decode(EnvelopeSchema, payload);
  if (envelope.kind.case === undefined) throw new FrameError("MissingKind", "an Envelope with no kind");
  return envelope;
}

export function encodeControl(kind: Control["kind"]): Uint8Array {
  return toBinary(ControlSchema, create(ControlSchema, { kind }));
}

export function encodeEnvelope(kind: Envelope["kind"]): Uint8Array {
  return toBinary(EnvelopeSchema, create(EnvelopeSchema, { kind }));
}

/** Encodes a message body (a request's or a push's). */
export function encode<D extends DescMessage>(schema: D, init: Parameters<typeof create<D>>[1]): Uint8Array {
  return toBinary(schema, create(schema, init));
}

/** Decodes a message body (a response's or a push's), as a Protobuf error if it does not. */
export function decodeBody<D extends DescMessage>(schema: D, bytes: Uint8Array): MessageShape<D> {
  return decode(schema, bytes);
}
