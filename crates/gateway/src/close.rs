//! Ending a connection with a reason: the Close frame every path that drops a peer sends.

use std::time::Duration;

use bytes::BytesMut;
use tickwire_transport::Conn;
use tickwire_wire::Frame;
use tickwire_wire::proto::{Close, CloseReason, Control, control};

/// How long a closing connection gets to take its Close frame.
const CLOSE_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Sends a Close frame (best effort, bounded in time) and closes the connection.
pub(crate) async fn send_close(conn: &mut Conn, reason: CloseReason, message: &str) {
    let close = Control {
        kind: Some(control::Kind::Close(Close { reason: reason as i32, message: message.to_owned() })),
    };
    let mut buf = BytesMut::new();
    Frame::control(&close).encode(&mut buf);
    let _ = tokio::time::timeout(CLOSE_WRITE_TIMEOUT, async {
        let _ = conn.write_all(&buf).await;
        conn.shutdown().await;
    })
    .await;
}
