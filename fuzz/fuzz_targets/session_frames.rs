//! Arbitrary frames and timer events fed to a server session: a peer can make it return
//! errors, never panic, and its unacknowledged buffer never exceeds its bounds.
#![no_main]

use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use tickwire_session::{Role, Session, SessionConfig};
use tickwire_wire::FrameDecoder;

fuzz_target!(|data: &[u8]| {
    let start = Instant::now();
    let config = SessionConfig { max_unacked_messages: 8, max_unacked_bytes: 256, ..SessionConfig::default() };
    let mut session = Session::new(Role::Server, config.clone(), start);
    let decoder = FrameDecoder::new(1024);
    let mut now = start;
    let mut input = data;
    while let Some((&op, rest)) = input.split_first() {
        input = rest;
        match op % 6 {
            0 => {
                let _ = session.send(now, Bytes::from_static(b"payload"));
            }
            1 => now += Duration::from_millis(u64::from(op)),
            2 => {
                let _ = session.on_timeout(now);
            }
            3 => {
                session.detach(now);
                let _ = session.attach(now, u64::from(op >> 3));
            }
            _ => {
                // Next bytes: a frame body of up to 16 bytes.
                let len = (op as usize >> 3).min(input.len()).min(16);
                let (body, rest) = input.split_at(len);
                input = rest;
                let mut buf = BytesMut::new();
                buf.put_u32(body.len() as u32);
                buf.put_slice(body);
                if let Ok(Some(frame)) = decoder.decode(&mut buf) {
                    let _ = session.on_frame(now, frame);
                    let _ = session.poll_transmit(now);
                }
            }
        }
        let (messages, bytes) = session.unacked();
        assert!(messages <= config.max_unacked_messages && bytes <= config.max_unacked_bytes);
    }
});
