//! Checks `docs/test-vectors/frames.json`, the vectors `docs/protocol.md` promises.
//!
//! Each valid vector describes a frame by its fields. The test builds that frame from the
//! description, then checks that the hex decodes to it and that it encodes to the hex. Each
//! invalid vector must fail to decode with the named error.
//!
//! `TICKWIRE_WRITE_VECTORS=1 cargo test -p tickwire-wire --test vectors` fills in missing `hex`
//! fields (for adding a vector); it never overwrites one.

use bytes::{Bytes, BytesMut};
use prost::Message;
use serde_json::Value;
use tickwire_wire::proto::{
    Close, Control, EchoRequest, Envelope, Hello, Push, Request, Response, ResumeRequest, Welcome, control,
    envelope,
};
use tickwire_wire::{Frame, FrameDecoder, WireError, encode_message};

const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/test-vectors/frames.json");

fn s(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_str).unwrap_or_default().to_owned()
}
fn n(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or_default()
}
fn b(v: &Value, k: &str) -> Bytes {
    Bytes::from(hex::decode(s(v, &format!("{k}_hex"))).expect("valid hex field"))
}

fn control_from(v: &Value) -> Control {
    let kind = if let Some(h) = v.get("hello") {
        control::Kind::Hello(Hello {
            protocol_version: n(h, "protocol_version") as u32,
            token: s(h, "token"),
            resume: h.get("resume").map(|r| ResumeRequest {
                session_id: b(r, "session_id"),
                resume_token: b(r, "resume_token"),
                last_received: n(r, "last_received"),
            }),
            client_name: s(h, "client_name"),
        })
    } else if let Some(w) = v.get("welcome") {
        control::Kind::Welcome(Welcome {
            session_id: b(w, "session_id"),
            resume_token: b(w, "resume_token"),
            resumed: w.get("resumed").and_then(Value::as_bool).unwrap_or(false),
            last_received: n(w, "last_received"),
            heartbeat_ms: n(w, "heartbeat_ms") as u32,
            resume_window_ms: n(w, "resume_window_ms") as u32,
            max_frame_bytes: n(w, "max_frame_bytes") as u32,
            player_id: s(w, "player_id"),
            ack_delay_ms: n(w, "ack_delay_ms") as u32,
            connection_id: n(w, "connection_id"),
            max_unacked_messages: n(w, "max_unacked_messages") as u32,
            max_unacked_bytes: n(w, "max_unacked_bytes") as u32,
        })
    } else if let Some(c) = v.get("close") {
        control::Kind::Close(Close { reason: n(c, "reason") as i32, message: s(c, "message") })
    } else {
        panic!("unknown control description {v}");
    };
    Control { kind: Some(kind) }
}

fn envelope_from(v: &Value) -> Envelope {
    let kind = if let Some(r) = v.get("request") {
        let body = match r.get("echo") {
            Some(e) => {
                EchoRequest { response_bytes: n(e, "response_bytes") as u32, padding: b(e, "padding") }
                    .encode_to_vec()
                    .into()
            }
            None => b(r, "body"),
        };
        envelope::Kind::Request(Request { id: n(r, "id"), method: s(r, "method"), body })
    } else if let Some(r) = v.get("response") {
        envelope::Kind::Response(Response {
            id: n(r, "id"),
            status: n(r, "status") as i32,
            body: b(r, "body"),
            error: s(r, "error"),
        })
    } else if let Some(p) = v.get("push") {
        envelope::Kind::Push(Push { topic: s(p, "topic"), body: b(p, "body") })
    } else {
        panic!("unknown envelope description {v}");
    };
    Envelope { kind: Some(kind) }
}

fn frame_from(v: &Value) -> Frame {
    match s(v, "type").as_str() {
        "CONTROL" => Frame::control(&control_from(&v["control"])),
        "DATA" => {
            let payload = match v.get("envelope") {
                Some(e) => encode_message(&envelope_from(e)),
                None => b(v, "payload"),
            };
            Frame::Data { seq: n(v, "seq"), ack: n(v, "ack"), payload: payload.into() }
        }
        "ACK" => Frame::Ack { ack: n(v, "ack") },
        "HEARTBEAT" => Frame::Heartbeat { ack: n(v, "ack") },
        other => panic!("unknown frame type {other}"),
    }
}

fn error_name(e: &WireError) -> &'static str {
    match e {
        WireError::FrameTooLarge { .. } => "FrameTooLarge",
        WireError::EmptyFrame => "EmptyFrame",
        WireError::UnknownFrameType(_) => "UnknownFrameType",
        WireError::BadVarint(_) => "BadVarint",
        WireError::TrailingBytes { .. } => "TrailingBytes",
        WireError::Protobuf { .. } => "Protobuf",
        WireError::MissingKind(_) => "MissingKind",
    }
}

#[test]
fn frames_match_their_vectors() {
    let text = std::fs::read_to_string(PATH).expect("test vectors file");
    let mut doc: Value = serde_json::from_str(&text).expect("vectors are JSON");
    let write = std::env::var_os("TICKWIRE_WRITE_VECTORS").is_some();
    let mut filled = false;
    let decoder = FrameDecoder::default();
    for vector in doc["valid"].as_array_mut().expect("valid array") {
        let name = s(vector, "name");
        let frame = frame_from(&vector["frame"]);
        let mut encoded = BytesMut::new();
        frame.encode(&mut encoded);
        let want_hex = hex::encode(&encoded);
        if vector.get("hex").is_none() && write {
            vector["hex"] = Value::String(want_hex.clone());
            filled = true;
        }
        let hex_text = s(vector, "hex").replace(' ', "");
        assert_eq!(hex_text, want_hex, "vector `{name}`: encoding differs");
        let mut buf = BytesMut::from(&hex::decode(&hex_text).unwrap()[..]);
        let decoded = decoder.decode(&mut buf).unwrap_or_else(|e| panic!("vector `{name}`: {e}"));
        assert_eq!(decoded.as_ref(), Some(&frame), "vector `{name}`: decoding differs");
        assert!(buf.is_empty(), "vector `{name}`: bytes left over");
        if let Frame::Control(body) = &frame {
            tickwire_wire::decode_control(body.clone()).unwrap_or_else(|e| panic!("vector `{name}`: {e}"));
        }
        if let Frame::Data { payload, .. } = &frame
            && vector["frame"].get("envelope").is_some()
        {
            tickwire_wire::decode_envelope(payload.clone().into_bytes())
                .unwrap_or_else(|e| panic!("vector `{name}`: {e}"));
        }
    }
    for vector in doc["invalid"].as_array().expect("invalid array") {
        let name = s(vector, "name");
        let max = vector
            .get("max_frame_bytes")
            .and_then(Value::as_u64)
            .unwrap_or(u64::from(tickwire_wire::DEFAULT_MAX_FRAME_BYTES));
        let decoder = FrameDecoder::new(max as u32);
        let mut buf = BytesMut::from(&hex::decode(s(vector, "hex").replace(' ', "")).unwrap()[..]);
        let result = decoder.decode(&mut buf).and_then(|frame| match frame {
            Some(Frame::Control(body)) => tickwire_wire::decode_control(body).map(|_| ()),
            Some(Frame::Data { payload, .. }) => {
                tickwire_wire::decode_envelope(payload.into_bytes()).map(|_| ())
            }
            _ => Ok(()),
        });
        let err = result.expect_err(&format!("invalid vector `{name}` decoded"));
        assert_eq!(error_name(&err), s(vector, "error"), "invalid vector `{name}`: {err}");
    }
    if filled {
        std::fs::write(PATH, serde_json::to_string_pretty(&doc).unwrap() + "\n").unwrap();
    }
}
