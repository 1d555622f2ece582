//! What peers can take from the gateway around login, tried as an attacker would,
//! over real sockets against a gateway in this process: a WebSocket ping flood from a client
//! that never reads, an unfinished WebSocket message far larger than a frame, TCP length
//! prefixes that announce 1 MiB frames, silent sockets that hold the pre-login budget, and one
//! address holding more open connections (logged in or not) than its budget.
//! Each attacker is cut off, memory stays bounded (the process's RSS, with a generous bound),
//! and a well-behaved client beside it is still answered.

mod common;

use std::time::{Duration, Instant};

use futures_util::SinkExt;
use tickwire_client::{ConnectOptions, Connection};
use tickwire_gateway::RunningGateway;
use tickwire_wire::Frame;
use tickwire_wire::proto::CloseReason;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

/// The resident memory of this process (the gateway runs inside it).
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("procfs");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kib * 1024
}

/// After an attack: this process's memory grew by less than 100 MiB since `rss_before`, and a
/// well-behaved client's echo is answered, within 5 s.
async fn assert_unharmed(gw: &RunningGateway, rss_before: u64) {
    let grown = rss_bytes().saturating_sub(rss_before);
    assert!(grown < 100 * MIB, "RSS grew by {} MiB", grown / MIB);
    let mut conn = common::connect(gw).await;
    let t0 = Instant::now();
    assert_eq!(common::round_trip(&mut conn, 1, 16).await.id, 1);
    let rtt = t0.elapsed();
    assert!(rtt < Duration::from_secs(5), "a healthy client waited {rtt:?}");
}

const MIB: u64 = 1024 * 1024;

/// The tests that measure this process's memory take turns, so one's figure is not another's.
static MEMORY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_ping_flood_from_a_client_that_never_reads_is_cut_off() {
    let _turn = MEMORY.lock().await;
    let gw = common::start(&[]).await;
    let addr = gw.ws_addrs()[0];
    let before = rss_bytes();
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(format!("ws://{addr}/"), stream).await.unwrap();
    // Pings with the largest control payload, never reading the pongs; before the Hello.
    let mut sent = 0u32;
    let deadline = Instant::now() + Duration::from_secs(10);
    let cut_off = loop {
        if ws.send(Message::Ping(vec![0x55; 125].into())).await.is_err() {
            break true;
        }
        sent += 1;
        if sent >= 200_000 || Instant::now() > deadline {
            break false;
        }
    };
    assert!(cut_off, "the gateway took {sent} pings without closing the connection");
    assert_unharmed(&gw, before).await;
}

/// One masked client frame of `len` zero bytes: the first fragment of a binary message, or a
/// continuation; never final.
fn fragment(first: bool, len: u64) -> Vec<u8> {
    let mut frame = vec![if first { 0x02 } else { 0x00 }, 0x80 | 127];
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&[1, 2, 3, 4]);
    frame.resize(frame.len() + len as usize, 0);
    frame
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_fragmented_websocket_message_is_refused_past_one_frame() {
    let _turn = MEMORY.lock().await;
    let gw = common::start(&[]).await;
    let addr = gw.ws_addrs()[0];
    let before = rss_bytes();
    // 20 connections each send 10 MiB of one never-finished message, in 512 KiB fragments
    // (each fragment is under the frame limit; the message is far over it).
    let mut streams = Vec::new();
    for _ in 0..20 {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut ws, _) = tokio_tungstenite::client_async(format!("ws://{addr}/"), stream).await.unwrap();
        let raw = ws.get_mut();
        for i in 0..20 {
            if raw.write_all(&fragment(i == 0, 512 * 1024)).await.is_err() {
                break;
            }
        }
        streams.push(ws);
    }
    for mut ws in streams {
        // The gateway closed the connection: reading reaches the end (or a reset) in time.
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(4), ws.get_mut().read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "the gateway kept a connection with a 10 MiB unfinished message");
    }
    assert_unharmed(&gw, before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_length_prefix_before_the_hello_is_refused_at_once() {
    let _turn = MEMORY.lock().await;
    let gw = common::start(&[]).await;
    let addr = gw.tcp_addrs()[0];
    let before = rss_bytes();
    // 200 connections each announce a 1 MiB frame (the post-login limit) and send 100 bytes.
    let mut bytes = (1u32 << 20).to_be_bytes().to_vec();
    bytes.push(0x01);
    bytes.extend_from_slice(&[0u8; 100]);
    let attempts = (0..200).map(|_| common::raw_close(addr, &bytes));
    let closes = futures_util::future::join_all(attempts).await;
    for close in &closes {
        // Refused from the prefix (not after the auth timeout, which would say AUTH_TIMEOUT).
        assert_eq!(common::reason(close), Some(CloseReason::FrameTooLarge), "{close:?}");
    }
    assert_unharmed(&gw, before).await;
}

/// Opens `n` sockets from `source` that never send a Hello.
async fn silent(addr: std::net::SocketAddr, source: [u8; 4], n: usize) -> Vec<TcpStream> {
    let mut out = Vec::new();
    for _ in 0..n {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind((std::net::Ipv4Addr::from(source), 0).into()).unwrap();
        out.push(socket.connect(addr).await.unwrap());
    }
    out
}

/// The Close each socket got, as reasons.
async fn reasons(mut sockets: Vec<TcpStream>) -> Vec<Option<CloseReason>> {
    let reads = sockets.iter_mut().map(|s| async move { common::reason(&common::read_close(s).await) });
    futures_util::future::join_all(reads).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_sockets_from_one_address_cannot_starve_the_others() {
    let gw = common::start(&["limits.max_pending_per_ip=8", "limits.auth_timeout=\"2s\""]).await;
    let addr = gw.tcp_addrs()[0];
    // Nine silent sockets from 127.0.0.1: the address's budget is eight.
    let attackers = silent(addr, [127, 0, 0, 1], 9).await;
    // Meanwhile a player from another address logs in and is answered.
    let mut opts = ConnectOptions::new(common::tcp_target(&gw));
    opts.local_addr = Some([127, 0, 0, 2].into());
    let mut conn = Connection::connect(opts).await.unwrap();
    assert_eq!(common::round_trip(&mut conn, 1, 8).await.id, 1);
    let got = reasons(attackers).await;
    let overloaded = got.iter().filter(|r| **r == Some(CloseReason::Overloaded)).count();
    let timed_out = got.iter().filter(|r| **r == Some(CloseReason::AuthTimeout)).count();
    assert_eq!((overloaded, timed_out), (1, 8), "{got:?}");
}

/// The pre-login budget holds across addresses: with every place taken, a new connection is
/// refused while the longest waiting has waited less than a quarter of the auth timeout, and
/// then takes its place (it is closed with `OVERLOADED`). So silent sockets from several
/// addresses cannot keep a client out: it logs in while they wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pre_login_budget_holds_across_addresses_and_gives_way_to_the_newest() {
    // Silent sockets may be evicted after 2 s.
    let gw = common::start(&["limits.max_pending_handshakes=4", "limits.auth_timeout=\"8s\""]).await;
    let addr = gw.tcp_addrs()[0];
    let started = Instant::now();
    let mut sockets = silent(addr, [127, 0, 0, 3], 2).await;
    sockets.extend(silent(addr, [127, 0, 0, 4], 2).await);
    let from = |last: u8| {
        let mut opts = ConnectOptions::new(common::tcp_target(&gw));
        opts.local_addr = Some([127, 0, 0, last].into());
        opts
    };
    // Every place is taken, none for 2 s yet: refused.
    match Connection::connect(from(5)).await {
        Err(tickwire_client::ClientError::Closed { reason, .. }) => {
            assert_eq!(reason, CloseReason::Overloaded)
        }
        other => panic!("expected OVERLOADED, got {:?}", other.map(|_| ())),
    }
    assert!(started.elapsed() < Duration::from_secs(2), "the test ran late: {:?}", started.elapsed());
    // After 2 s, the client from a fifth address gets the oldest's place, and logs in.
    tokio::time::sleep_until((started + Duration::from_millis(2_300)).into()).await;
    let mut conn = Connection::connect(from(5)).await.unwrap();
    assert_eq!(common::round_trip(&mut conn, 1, 8).await.id, 1);
    assert!(started.elapsed() < Duration::from_secs(8), "in before the silent ones timed out");
    let got = reasons(sockets).await;
    assert_eq!(got[0], Some(CloseReason::Overloaded), "the longest waiting went: {got:?}");
    assert_eq!(got[1..], [Some(CloseReason::AuthTimeout); 3], "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_hold_more_open_connections_than_its_budget_logged_in_or_not() {
    let gw = common::start(&["limits.max_connections_per_ip=3"]).await;
    let from = |last: u8| {
        let mut opts = ConnectOptions::new(common::tcp_target(&gw));
        opts.local_addr = Some([127, 0, 0, last].into());
        opts
    };
    // Three logged-in sessions from 127.0.0.6 fill its budget.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(Connection::connect(from(6)).await.unwrap());
    }
    // The fourth, and a silent socket, are closed with OVERLOADED before any handshake.
    match Connection::connect(from(6)).await {
        Err(tickwire_client::ClientError::Closed { reason, .. }) => {
            assert_eq!(reason, CloseReason::Overloaded)
        }
        other => panic!("expected OVERLOADED, got {:?}", other.map(|_| ())),
    }
    assert_eq!(
        reasons(silent(gw.tcp_addrs()[0], [127, 0, 0, 6], 1).await).await,
        vec![Some(CloseReason::Overloaded)]
    );
    // Another address is not affected, and the held sessions still work.
    let mut other = Connection::connect(from(7)).await.unwrap();
    assert_eq!(common::round_trip(&mut other, 1, 8).await.id, 1);
    assert_eq!(common::round_trip(&mut held[0], 1, 8).await.id, 1);
    // A connection that ends frees its place.
    held.pop().unwrap().close().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut again = loop {
        match Connection::connect(from(6)).await {
            Ok(conn) => break conn,
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("the freed place was not given back: {e}"),
        }
    };
    assert_eq!(common::round_trip(&mut again, 2, 8).await.id, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_pings_after_login_count_against_the_frame_rate_limit() {
    use futures_util::StreamExt;
    use tickwire_wire::{Frame, FrameDecoder, decode_control};
    let gw = common::start(&["limits.messages_per_second=50", "limits.message_burst=100"]).await;
    let addr = gw.ws_addrs()[0];
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(format!("ws://{addr}/"), stream).await.unwrap();
    ws.send(Message::Binary(common::hello_frame("pinger").into())).await.unwrap();
    // 60 pings (under the 64-in-a-row bound) and one heartbeat, twice: 122 frames, past the
    // burst of 100. (Nothing more is sent, so the gateway's close meets no data in flight and
    // its Close is not lost to a reset.)
    let mut heartbeat = bytes::BytesMut::new();
    Frame::Heartbeat { ack: 0 }.encode(&mut heartbeat);
    for _ in 0..2 {
        for _ in 0..60 {
            ws.send(Message::Ping(vec![1; 8].into())).await.unwrap();
        }
        ws.send(Message::Binary(heartbeat.to_vec().into())).await.unwrap();
    }
    // The gateway's last word is a Close: RATE_LIMITED.
    let decoder = FrameDecoder::new(1 << 20);
    let mut buf = bytes::BytesMut::new();
    let mut reason = None;
    while let Ok(Some(Ok(msg))) = tokio::time::timeout(Duration::from_secs(5), ws.next()).await {
        if let Message::Binary(data) = msg {
            buf.extend_from_slice(&data);
            while let Ok(Some(frame)) = decoder.decode(&mut buf) {
                if let Frame::Control(body) = frame
                    && let Ok(tickwire_wire::proto::control::Kind::Close(close)) = decode_control(body)
                {
                    reason = Some(close.reason());
                }
            }
        }
    }
    assert_eq!(reason, Some(CloseReason::RateLimited));
    let mut healthy = common::connect(&gw).await;
    assert_eq!(common::round_trip(&mut healthy, 1, 8).await.id, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_pile_up_sessions_by_dropping_its_links() {
    let gw = common::start(&["limits.max_sessions_per_ip=2"]).await;
    let from = |last: u8| {
        let mut opts = ConnectOptions::new(common::tcp_target(&gw));
        opts.local_addr = Some([127, 0, 0, last].into());
        opts
    };
    let mut kept = Connection::connect(from(8)).await.unwrap();
    // Dropped without a Close: its session waits a resume window for the client to come back,
    // and keeps its place though its connection is gone.
    drop(Connection::connect(from(8)).await.unwrap());
    match Connection::connect(from(8)).await {
        Err(tickwire_client::ClientError::Closed { reason, message }) => {
            assert_eq!(reason, CloseReason::Overloaded);
            assert!(message.contains("limits.max_sessions_per_ip"), "{message}");
        }
        other => panic!("expected OVERLOADED, got {:?}", other.map(|_| ())),
    }
    // A game server is not counted: players filling the budget do not lock it out.
    let mut as_server = from(8);
    as_server.token = "server:zone-1".into();
    let mut server = Connection::connect(as_server).await.unwrap();
    assert_eq!(common::round_trip(&mut server, 1, 8).await.id, 1);
    // Another address is not affected, and the live session still works.
    let mut other = Connection::connect(from(9)).await.unwrap();
    assert_eq!(common::round_trip(&mut other, 1, 8).await.id, 1);
    assert_eq!(common::round_trip(&mut kept, 1, 8).await.id, 1);
    // A session that ends (a Close) gives its place back.
    kept.close().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut again = loop {
        match Connection::connect(from(8)).await {
            Ok(conn) => break conn,
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("the freed place was not given back: {e}"),
        }
    };
    assert_eq!(common::round_trip(&mut again, 2, 8).await.id, 2);
}

/// A DATA frame carrying an `echo` request padded to about `padding` bytes.
fn padded_echo(seq: u64, padding: usize) -> Vec<u8> {
    use tickwire_wire::proto::{Envelope, Request, envelope};
    let request = Request { id: seq, method: "echo".into(), body: common::echo_body(1, padding) };
    let payload = tickwire_wire::encode_message(&Envelope { kind: Some(envelope::Kind::Request(request)) });
    let mut buf = bytes::BytesMut::new();
    Frame::Data { seq, ack: 0, payload: payload.into() }.encode(&mut buf);
    buf.to_vec()
}

/// Reads a raw WebSocket's messages as frames until `done` says so of what came, or the
/// connection ends (10 s at most); returns every frame read.
async fn ws_frames<S>(
    ws: &mut tokio_tungstenite::WebSocketStream<S>,
    mut done: impl FnMut(&[Frame]) -> bool,
) -> Vec<Frame>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures_util::StreamExt;
    let decoder = tickwire_wire::FrameDecoder::default();
    let mut buf = bytes::BytesMut::new();
    let mut frames = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done(&frames) {
        match tokio::time::timeout_at(deadline, ws.next()).await.expect("the gateway answers in time") {
            Some(Ok(Message::Binary(data))) => {
                buf.extend_from_slice(&data);
                while let Some(frame) = decoder.decode(&mut buf).unwrap() {
                    frames.push(frame);
                }
            }
            Some(Ok(_)) => {}
            Some(Err(_)) | None => break,
        }
    }
    frames
}

/// Before login a WebSocket peer is read only up to about a Hello's worth of bytes (17 KiB),
/// in frames that fit what it has left of them, so a connection that has not logged in holds a
/// few tens of KiB, not three buffers of up to 64 KiB (tungstenite's frame buffer, which it
/// reserves from a frame's header, its message in progress, the frame buffer). A frame longer
/// than that is refused from its header (`PROTOCOL_ERROR`), at once. A client that sends its
/// Hello alone and pipelines requests after it, past the bound, has every one answered: login
/// lifts the bound. So has one whose Hello follows its upgrade request before the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_login_a_websocket_peer_is_read_only_up_to_a_hellos_worth() {
    let gw = common::start(&["limits.auth_timeout=\"5s\""]).await;
    let addr = gw.ws_addrs()[0];
    let closed_for = |frames: &[Frame]| {
        frames.iter().find_map(|f| match f {
            Frame::Control(body) => match tickwire_wire::decode_control(body.clone()) {
                Ok(tickwire_wire::proto::control::Kind::Close(c)) => Some(c.reason()),
                _ => None,
            },
            _ => None,
        })
    };
    // A Hello with 30 KiB of requests after it, in one message.
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut greedy, _) = tokio_tungstenite::client_async(format!("ws://{addr}/"), stream).await.unwrap();
    let mut message = common::hello_frame("greedy");
    for seq in 1..=100 {
        message.extend(padded_echo(seq, 300));
    }
    assert!(message.len() > 30 << 10);
    let sent = Instant::now();
    greedy.send(Message::Binary(message.into())).await.unwrap();
    let frames = ws_frames(&mut greedy, |frames| closed_for(frames).is_some()).await;
    assert_eq!(closed_for(&frames), Some(CloseReason::ProtocolError), "{} frames came", frames.len());
    assert!(sent.elapsed() < Duration::from_secs(4), "refused at once, not at the login deadline");

    // The same requests, each in a message of its own after the Hello's, all sent at once.
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut polite, _) = tokio_tungstenite::client_async(format!("ws://{addr}/"), stream).await.unwrap();
    polite.feed(Message::Binary(common::hello_frame("polite").into())).await.unwrap();
    for seq in 1..=100 {
        polite.feed(Message::Binary(padded_echo(seq, 300).into())).await.unwrap();
    }
    polite.flush().await.unwrap();
    let answered = |frames: &[Frame]| frames.iter().filter(|f| matches!(f, Frame::Data { .. })).count();
    let frames =
        ws_frames(&mut polite, |frames| answered(frames) == 100 || closed_for(frames).is_some()).await;
    assert_eq!((answered(&frames), closed_for(&frames)), (100, None), "every request answered, none closed");

    // The upgrade request and the start of the Hello in one write, before the gateway's
    // answer, and the rest a moment later: the frame scan starts at the Hello's header, not
    // where the second write begins (there the token's bytes read as a header announcing an
    // 8 EiB frame).
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut bytes = b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        .to_vec();
    let hello = {
        use tickwire_wire::proto::{Control, Hello, control};
        let hello = Hello {
            protocol_version: 1,
            token: "eager".into(),
            resume: None,
            client_name: "eager\x7fzzzzzzzz".into(),
        };
        let mut buf = bytes::BytesMut::new();
        Frame::control(&Control { kind: Some(control::Kind::Hello(hello)) }).encode(&mut buf);
        buf.to_vec()
    };
    // One masked binary frame (a zero mask leaves the payload as it is).
    bytes.extend_from_slice(&[0x82, 0x80 | 126]);
    bytes.extend_from_slice(&(hello.len() as u16).to_be_bytes());
    bytes.extend_from_slice(&[0, 0, 0, 0]);
    let cut = bytes.len() + hello.iter().position(|&b| b == 0x7f).unwrap() - 1;
    bytes.extend_from_slice(&hello);
    stream.write_all(&bytes[..cut]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    stream.write_all(&bytes[cut..]).await.unwrap();
    // The answer's head, a byte at a time so as to read nothing after it.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(stream.read_u8().await.unwrap());
    }
    assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
    let mut eager = tokio_tungstenite::WebSocketStream::from_raw_socket(
        stream,
        tokio_tungstenite::tungstenite::protocol::Role::Client,
        None,
    )
    .await;
    let frames = ws_frames(&mut eager, |frames| !frames.is_empty()).await;
    let welcome = match &frames[0] {
        Frame::Control(body) => tickwire_wire::decode_control(body.clone()).unwrap(),
        other => panic!("not a control frame: {other:?}"),
    };
    assert!(matches!(welcome, tickwire_wire::proto::control::Kind::Welcome(_)), "{welcome:?}");
}
