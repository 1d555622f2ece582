//! Malformed input closes only the offending connection, with a clear reason, and the gateway
//! goes on serving everyone else.

mod common;

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use proptest::prelude::*;
use tickwire_wire::proto::CloseReason;

/// A healthy session that must keep working while the bad peers come and go.
async fn assert_healthy(conn: &mut tickwire_client::Connection, id: u64) {
    let r = common::round_trip(conn, id, 71).await;
    assert_eq!(r.body.len(), 71);
}

fn data_frame(seq: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.put_u32((3 + payload.len()) as u32);
    v.extend_from_slice(&[0x02, seq, 0x00]);
    v.extend_from_slice(payload);
    v
}

#[tokio::test]
async fn each_kind_of_bad_input_gets_its_reason() {
    let gw = common::start(&["limits.max_frame_bytes=1024"]).await;
    let addr = gw.tcp_addrs()[0];
    let mut healthy = common::connect(&gw).await;
    let hello = common::hello_frame("");
    let cases: Vec<(&str, Vec<u8>, CloseReason)> = vec![
        ("garbage", b"GET / HTTP/1.1\r\n\r\n".to_vec(), CloseReason::FrameTooLarge),
        ("zero length", vec![0, 0, 0, 0], CloseReason::ProtocolError),
        ("oversized", vec![0, 0, 4, 1, 0x01], CloseReason::FrameTooLarge),
        ("unknown type", vec![0, 0, 0, 1, 0x09], CloseReason::ProtocolError),
        ("data before hello", data_frame(1, b""), CloseReason::ProtocolError),
        ("bad hello protobuf", vec![0, 0, 0, 3, 0x01, 0x0a, 0x7f], CloseReason::ProtocolError),
        ("empty control", vec![0, 0, 0, 1, 0x01], CloseReason::ProtocolError),
        ("wrong version", vec![0, 0, 0, 5, 0x01, 0x0a, 0x02, 0x08, 0x02], CloseReason::ProtocolError),
        (
            "bad envelope after hello",
            [hello.clone(), data_frame(1, &[0x0a, 0x7f])].concat(),
            CloseReason::ProtocolError,
        ),
        ("sequence gap", [hello.clone(), data_frame(5, b"")].concat(), CloseReason::ProtocolError),
        (
            "ack beyond sent",
            [hello.clone(), vec![0, 0, 0, 2, 0x03, 0x09]].concat(),
            CloseReason::ProtocolError,
        ),
        ("hello twice", [hello.clone(), hello.clone()].concat(), CloseReason::ProtocolError),
        (
            "client response",
            [hello.clone(), data_frame(1, &[0x12, 0x02, 0x08, 0x01])].concat(),
            CloseReason::ProtocolError,
        ),
        (
            "oversized after hello",
            [hello.clone(), vec![0, 0, 0x10, 0, 0x02]].concat(),
            CloseReason::FrameTooLarge,
        ),
    ];
    for (i, (name, bytes, want)) in cases.into_iter().enumerate() {
        let close = common::raw_close(addr, &bytes).await;
        assert_eq!(common::reason(&close), Some(want), "case `{name}`: got {close:?}");
        assert!(!close.unwrap().message.is_empty(), "case `{name}` has no message");
        assert_healthy(&mut healthy, i as u64 + 1).await;
    }
    // A truncated frame followed by EOF: the gateway drops the connection without a word.
    let close = common::raw_close_eof(addr, &[0, 0, 0, 9, 0x01, 0x0a]).await;
    assert_eq!(common::reason(&close), None);
    let close = common::raw_close_eof(addr, &[hello.clone(), vec![0, 0, 0, 9, 0x02]].concat()).await;
    assert_eq!(common::reason(&close), None);
    assert_healthy(&mut healthy, 100).await;
}

#[tokio::test]
async fn silent_connections_hit_the_auth_timeout() {
    let gw = common::start(&["limits.auth_timeout=200ms"]).await;
    let close = common::raw_close(gw.tcp_addrs()[0], &[]).await;
    assert_eq!(common::reason(&close), Some(CloseReason::AuthTimeout));
}

/// A Hello with `token`, then `n` echo requests, as one write.
fn echo_flood(token: &str, n: u64) -> Vec<u8> {
    let mut flood = common::hello_frame(token);
    for seq in 1..=n {
        flood.extend(common::echo_frame(seq, seq));
    }
    flood
}

#[tokio::test]
async fn a_flooding_client_is_rate_limited_alone() {
    let gw = common::start(&["limits.messages_per_second=10", "limits.message_burst=20"]).await;
    let mut healthy = common::connect(&gw).await;
    let flood = echo_flood("", 40);
    let close = common::raw_close(gw.tcp_addrs()[0], &flood).await;
    assert_eq!(common::reason(&close), Some(CloseReason::RateLimited));
    assert_healthy(&mut healthy, 1).await;
}

#[tokio::test]
async fn a_game_server_has_a_rate_limit_of_its_own() {
    // The flood that closes a player (above) is well within a game server's limit: it speaks
    // for all of its players. Every echo is answered and the connection stays open.
    let gw = common::start(&["limits.messages_per_second=10", "limits.message_burst=20"]).await;
    let flood = echo_flood("server:gs", 40);
    let mut stream = tokio::net::TcpStream::connect(gw.tcp_addrs()[0]).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stream, &flood).await.unwrap();
    let decoder = tickwire_wire::FrameDecoder::default();
    let mut buf = BytesMut::new();
    let mut answers = 0;
    while answers < 40 {
        let read = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::io::AsyncReadExt::read_buf(&mut stream, &mut buf),
        );
        let n = read.await.expect("answers in time").unwrap();
        assert!(n > 0, "the gateway closed a game server's connection after {answers} answers");
        while let Some(frame) = decoder.decode(&mut buf).unwrap() {
            match frame {
                tickwire_wire::Frame::Data { .. } => answers += 1,
                tickwire_wire::Frame::Control(body) => {
                    let kind = tickwire_wire::decode_control(body).unwrap();
                    assert!(
                        !matches!(kind, tickwire_wire::proto::control::Kind::Close(_)),
                        "closed: {kind:?}"
                    );
                }
                _ => {}
            }
        }
    }
}

#[tokio::test]
async fn a_flooding_game_server_is_rate_limited_at_its_own_limit() {
    let gw = common::start(&["limits.server_messages_per_second=10", "limits.server_message_burst=20"]).await;
    let flood = echo_flood("server:gs", 40);
    let close = common::raw_close(gw.tcp_addrs()[0], &flood).await;
    assert_eq!(common::reason(&close), Some(CloseReason::RateLimited));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random bytes after a valid Hello never take the gateway down: either the gateway closes
    /// the connection with a reason, or it is still waiting for more bytes; and a healthy
    /// session keeps getting answers.
    #[test]
    fn random_bytes_after_hello_only_hurt_their_sender(noise in proptest::collection::vec(any::<u8>(), 1..200)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let gw = common::start(&["limits.max_frame_bytes=512"]).await;
            let mut healthy = common::connect(&gw).await;
            let mut stream = tokio::net::TcpStream::connect(gw.tcp_addrs()[0]).await.unwrap();
            let mut bytes = BytesMut::from(&common::hello_frame("")[..]);
            bytes.extend_from_slice(&noise);
            tokio::io::AsyncWriteExt::write_all(&mut stream, &bytes).await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
            assert_healthy(&mut healthy, 1).await;
            drop(stream);
            assert_healthy(&mut healthy, 2).await;
        });
    }
}

#[tokio::test]
async fn a_heartbeat_flood_is_rate_limited_too() {
    let gw = common::start(&["limits.messages_per_second=10", "limits.message_burst=20"]).await;
    let mut flood = common::hello_frame("");
    for _ in 0..40 {
        flood.extend_from_slice(&[0, 0, 0, 2, 0x04, 0x00]);
    }
    let close = common::raw_close(gw.tcp_addrs()[0], &flood).await;
    assert_eq!(common::reason(&close), Some(CloseReason::RateLimited));
}
