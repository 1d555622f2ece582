//! The first exchange on every connection: read the Hello within the auth timeout, then either
//! open a new session (after auth) or hand the connection to the session it resumes.

use std::io;
use std::sync::Arc;

use bytes::BytesMut;
use tickwire_session::{ResumeToken, SessionId};
use tickwire_transport::Conn;
use tickwire_wire::proto::{CloseReason, Control, Hello, control};
use tickwire_wire::{Frame, FrameDecoder, WireError, decode_control};

use crate::admission::Open;
use crate::close::send_close;
use crate::registry::Takeover;
use crate::session_task::{NewSession, SessionTask};
use crate::shared::Shared;
use crate::stats::Stats;
use crate::workers::{WorkerSet, hand_off};

/// The only protocol version this gateway speaks.
pub(crate) const PROTOCOL_VERSION: u32 = 1;

/// The largest frame accepted before the Hello (docs/protocol.md section 2): a Hello with a
/// long JWT is a few KiB. A peer that has not logged in cannot make the gateway buffer more.
pub(crate) const MAX_HELLO_FRAME_BYTES: u32 = 16 * 1024;

#[derive(Debug, thiserror::Error)]
enum HelloError {
    #[error("connection closed before the Hello")]
    Closed,
    #[error("read failed: {0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("the first frame must be a CONTROL Hello")]
    NotHello,
}

impl HelloError {
    fn reason(&self) -> CloseReason {
        match self {
            HelloError::Wire(WireError::FrameTooLarge { .. }) => CloseReason::FrameTooLarge,
            _ => CloseReason::ProtocolError,
        }
    }
}

async fn read_hello(
    conn: &mut Conn,
    buf: &mut BytesMut,
    decoder: &FrameDecoder,
) -> Result<Hello, HelloError> {
    loop {
        if let Some(frame) = decoder.decode(buf)? {
            return match frame {
                Frame::Control(body) => match decode_control(body)? {
                    control::Kind::Hello(hello) => Ok(hello),
                    _ => Err(HelloError::NotHello),
                },
                _ => Err(HelloError::NotHello),
            };
        }
        if conn.read(buf).await? == 0 {
            return Err(HelloError::Closed);
        }
    }
}

async fn reject(shared: &Shared, mut conn: Conn, reason: CloseReason, message: String) {
    tracing::debug!(?reason, %message, "connection rejected");
    Stats::add(&shared.stats.connections_rejected, 1);
    shared.stats.closed(reason);
    send_close(&mut conn, reason, &message).await;
}

/// Runs the handshake on a freshly accepted connection; the Hello must arrive by `deadline`
/// (set at accept, so a WebSocket upgrade and the Hello share one auth timeout).
/// `open` is the connection's place in its address's budget: it goes with the connection.
/// `evicted` completes if a newer connection takes this one's place in the pre-login budget
/// before its Hello arrives.
pub(crate) async fn handshake(
    shared: Arc<Shared>,
    conn: Conn,
    open: Open,
    deadline: tokio::time::Instant,
    evicted: impl Future<Output = ()>,
) {
    handshake_with(shared, conn, open, BytesMut::new(), deadline, evicted).await;
}

/// Runs the handshake on a connection of which `buf` was already read (a handoff from another
/// worker process).
pub(crate) async fn handshake_with(
    shared: Arc<Shared>,
    mut conn: Conn,
    open: Open,
    mut buf: BytesMut,
    deadline: tokio::time::Instant,
    evicted: impl Future<Output = ()>,
) {
    let limit = shared.config.limits.auth_timeout;
    let pre_login = FrameDecoder::new(MAX_HELLO_FRAME_BYTES.min(shared.decoder.max_frame_bytes()));
    let read = tokio::select! {
        read = tokio::time::timeout_at(deadline, read_hello(&mut conn, &mut buf, &pre_login)) => read,
        () = evicted => {
            let msg = "every place for a connection waiting to log in is taken, and this one had waited \
                       longest (limits.max_pending_handshakes)";
            return reject(&shared, conn, CloseReason::Overloaded, msg.to_owned()).await;
        }
    };
    let hello = match read {
        Err(_) => {
            let msg = format!("no Hello within {} ms", limit.as_millis());
            return reject(&shared, conn, CloseReason::AuthTimeout, msg).await;
        }
        Ok(Err(HelloError::Closed)) => return,
        Ok(Err(e)) => return reject(&shared, conn, e.reason(), e.to_string()).await,
        Ok(Ok(hello)) => hello,
    };
    if hello.protocol_version != PROTOCOL_VERSION {
        let msg =
            format!("protocol version {} is not supported (want {PROTOCOL_VERSION})", hello.protocol_version);
        return reject(&shared, conn, CloseReason::ProtocolError, msg).await;
    }
    if let Some(resume) = &hello.resume {
        let Some(id) = SessionId::from_slice(&resume.session_id) else {
            let msg = "session_id must be 16 bytes".to_owned();
            return reject(&shared, conn, CloseReason::ResumeFailed, msg).await;
        };
        if let Some(workers) = &shared.workers {
            let owner = workers.owner(&id);
            if owner != workers.index {
                return forward(&shared, workers, owner, conn, hello, buf).await;
            }
        }
        let takeover = Takeover { conn, open, buf, last_received: resume.last_received };
        if let Err((e, takeover)) = shared.registry.resume(&id, &resume.resume_token, takeover) {
            return reject(&shared, takeover.conn, CloseReason::ResumeFailed, e.to_string()).await;
        }
        return;
    }
    let identity = match shared.auth.authenticate(&hello.token) {
        Ok(identity) => identity,
        Err(e) => return reject(&shared, conn, CloseReason::AuthFailed, e.to_string()).await,
    };
    // Game servers (role `server`, an authenticated token) are not counted: players filling
    // the budgets must not lock out a server coming back.
    let place = match identity.role {
        crate::auth::Role::Server => None,
        crate::auth::Role::Player => match open.session() {
            Ok(place) => Some(place),
            Err(refused) => return reject(&shared, conn, CloseReason::Overloaded, refused.to_string()).await,
        },
    };
    let mut id = SessionId(rand::random());
    if let Some(workers) = &shared.workers {
        workers.stamp(&mut id);
    }
    let token = ResumeToken(rand::random());
    let player_id = if identity.player_id.is_empty() {
        format!("anon-{}", &id.to_string()[..12])
    } else {
        identity.player_id
    };
    let new = NewSession { id, token, player_id, role: identity.role, place };
    SessionTask::spawn(shared, (conn, open), buf, new);
}

/// Passes a resume to the worker process that owns the session, with the Hello re-encoded in
/// front of whatever followed it.
async fn forward(shared: &Shared, workers: &WorkerSet, owner: u8, conn: Conn, hello: Hello, rest: BytesMut) {
    let Conn::Tcp(stream) = conn else {
        let msg = "resuming a WebSocket session on another worker process is not supported yet".to_owned();
        return reject(shared, conn, CloseReason::ResumeFailed, msg).await;
    };
    let mut data = BytesMut::new();
    Frame::control(&Control { kind: Some(control::Kind::Hello(hello)) }).encode(&mut data);
    data.extend_from_slice(&rest);
    if let Err(e) = hand_off(workers, owner, stream, data).await {
        tracing::warn!(error = %e, owner, "could not hand a resume to its worker");
    }
}
