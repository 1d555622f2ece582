// Why this exists: the generated protobuf messages (from proto/ by protoc-gen-es), in one
// namespace, for calls the SDK has no helper for.

export * from "./gen/tickwire/v1/control_pb.js";
export * from "./gen/tickwire/v1/channel_pb.js";
export * from "./gen/tickwire/v1/spatial_pb.js";
export { create, fromBinary, toBinary } from "@bufbuild/protobuf";
