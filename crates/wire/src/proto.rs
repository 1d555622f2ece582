//! Protobuf messages generated from `proto/tickwire/v1/control.proto`, `channel.proto` and
//! `spatial.proto`.
//!
//! `bytes` fields are [`bytes::Bytes`], so decoding a message from a `Bytes` buffer slices
//! payloads out of it instead of copying them.
#![allow(missing_docs, clippy::doc_lazy_continuation)]

include!(concat!(env!("OUT_DIR"), "/tickwire.v1.rs"));
