//! Sessions survive dropped connections: a proxy in the test cuts connections at random while
//! thousands of requests flow, and every response must arrive exactly once and in order.

mod common;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rand::{Rng, SeedableRng};
use tickwire_client::{ClientError, ConnectOptions, Connection, Event, Target};
use tickwire_wire::Frame;
use tickwire_wire::proto::{CloseReason, Control, Hello, ResumeRequest, control};

async fn resume_until_ok(conn: &mut Connection) {
    let mut backoff = Duration::from_millis(1);
    for _ in 0..200 {
        match conn.resume().await {
            Ok(()) => return,
            Err(ClientError::Closed { reason, message }) => panic!("session lost: {reason:?} {message}"),
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(50));
            }
        }
    }
    panic!("could not resume");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_in_order_through_random_cuts() {
    const TOTAL: u64 = 30_000;
    const WINDOW: u64 = 64;
    let gw = common::start(&[
        "session.max_unacked_messages=4096",
        "limits.messages_per_second=1000000",
        "limits.message_burst=1000000",
    ])
    .await;
    let proxy = common::ChaosProxy::start(gw.tcp_addrs()[0]).await;
    let mut conn = Connection::connect(ConnectOptions::new(Target::Tcp(proxy.addr))).await.unwrap();

    // Cut every connection at random intervals while the test runs, and also after a random
    // number of responses: a run faster than the timer (30,000 round trips took 0.73 s on one
    // CI run, and the timer cut 8 times) still gets its cuts.
    let seed: u64 = rand::random();
    println!("chaos seed {seed}");
    let mut progress_rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut next_cut = progress_rng.random_range(500..2000u64);
    let cutter = {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let cuts = proxy.cuts.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(rng.random_range(2..25))).await;
                cuts.send_modify(|n| *n += 1);
            }
        })
    };

    let mut sent = 0u64;
    let mut received = Vec::with_capacity(TOTAL as usize);
    let mut link_losses = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while (received.len() as u64) < TOTAL {
        assert!(tokio::time::Instant::now() < deadline, "stalled at {} of {TOTAL}", received.len());
        while sent < TOTAL && sent - received.len() as u64 <= WINDOW {
            sent += 1;
            conn.send_request(sent, "echo", common::echo_body(16, 32)).unwrap();
        }
        conn.flush().await;
        match tokio::time::timeout(Duration::from_secs(10), conn.next_event())
            .await
            .expect("event in time")
            .unwrap()
        {
            Some(Event::Response(r)) => {
                received.push(r.id);
                if received.len() as u64 >= next_cut {
                    proxy.cuts.send_modify(|n| *n += 1);
                    next_cut += progress_rng.random_range(500..2000u64);
                }
            }
            Some(Event::LinkLost) => {
                link_losses += 1;
                resume_until_ok(&mut conn).await;
            }
            Some(other) => panic!("unexpected {other:?}"),
            None => {}
        }
    }
    cutter.abort();
    let expected: Vec<u64> = (1..=TOTAL).collect();
    assert_eq!(received, expected, "responses lost, duplicated or reordered");
    assert!(link_losses >= 10, "the proxy should have cut the link several times, cut {link_losses}");
    println!("{TOTAL} round trips over {link_losses} cut connections");
}

#[tokio::test]
async fn resume_with_a_wrong_token_or_unknown_session_fails() {
    let gw = common::start(&[]).await;
    let conn = common::connect(&gw).await;
    for (id, token) in [
        (conn.session_id().0.to_vec(), vec![0u8; 16]),
        (vec![9u8; 16], vec![0u8; 16]),
        (vec![1u8; 3], vec![]),
    ] {
        let mut buf = BytesMut::new();
        Frame::control(&Control {
            kind: Some(control::Kind::Hello(Hello {
                protocol_version: 1,
                token: String::new(),
                resume: Some(ResumeRequest {
                    session_id: Bytes::from(id),
                    resume_token: Bytes::from(token),
                    last_received: 0,
                }),
                client_name: "thief".into(),
            })),
        })
        .encode(&mut buf);
        let close = common::raw_close(gw.tcp_addrs()[0], &buf).await;
        assert_eq!(common::reason(&close), Some(CloseReason::ResumeFailed), "{close:?}");
    }
}

#[tokio::test]
async fn a_session_expires_after_the_resume_window() {
    let gw = common::start(&["session.resume_window=200ms"]).await;
    let proxy = common::ChaosProxy::start(gw.tcp_addrs()[0]).await;
    let mut conn = Connection::connect(ConnectOptions::new(Target::Tcp(proxy.addr))).await.unwrap();
    assert_eq!(common::round_trip(&mut conn, 1, 8).await.id, 1);
    proxy.cut();
    // The session waits 200 ms for a resume, then ends.
    common::wait_until("the session expired", || gw.session_count() == 0).await;
    match conn.resume().await {
        Err(ClientError::Closed { reason: CloseReason::ResumeFailed, .. }) => {}
        other => panic!("expected RESUME_FAILED, got {other:?}"),
    }
    assert_eq!(gw.session_count(), 0);
}

#[tokio::test]
async fn a_resume_replaces_a_half_open_connection() {
    let gw = common::start(&[]).await;
    let mut conn = common::connect(&gw).await;
    assert_eq!(common::round_trip(&mut conn, 1, 8).await.id, 1);
    // The old connection is still open on the gateway's side; the resume must take over.
    conn.resume().await.unwrap();
    assert_eq!(common::round_trip(&mut conn, 2, 8).await.id, 2);
    assert_eq!(gw.stats().snapshot().sessions_resumed, 1);
}

#[tokio::test]
async fn shutdown_tells_every_session_why() {
    let gw = common::start(&[]).await;
    let mut conns = Vec::new();
    for _ in 0..5 {
        conns.push(common::connect(&gw).await);
    }
    assert!(gw.shutdown(Duration::from_secs(5)).await, "sessions did not finish");
    for mut conn in conns {
        let event = loop {
            if let Some(e) = conn.next_event().await.unwrap() {
                break e;
            }
        };
        assert!(matches!(event, Event::Closed { reason: CloseReason::Shutdown, .. }), "{event:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_resumes_by_itself_and_calls_survive_cuts() {
    let gw = common::start(&["limits.messages_per_second=1000000", "limits.message_burst=1000000"]).await;
    let proxy = common::ChaosProxy::start(gw.tcp_addrs()[0]).await;
    let client =
        tickwire_client::Client::connect(ConnectOptions::new(Target::Tcp(proxy.addr))).await.unwrap();
    let cuts = proxy.cuts.clone();
    let cutter = tokio::spawn(async move {
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(15)).await;
            cuts.send_modify(|n| *n += 1);
        }
    });
    let mut calls = 0;
    while !cutter.is_finished() || calls < 500 {
        let size = (calls % 100) as u32;
        let body = client.call("echo", common::echo_body(size, 0)).await.expect("call survives cuts");
        assert_eq!(body.len(), size as usize);
        calls += 1;
    }
    assert!(gw.stats().snapshot().sessions_resumed >= 5, "{:?}", gw.stats().snapshot());
    client.close().await;
}

#[tokio::test]
async fn a_silent_client_is_dropped_after_the_read_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let gw = common::start(&["session.heartbeat=200ms", "session.resume_window=10s"]).await;
    let mut stream = tokio::net::TcpStream::connect(gw.tcp_addrs()[0]).await.unwrap();
    stream.write_all(&common::hello_frame("")).await.unwrap();
    let start = tokio::time::Instant::now();
    // Read the Welcome, then stay silent: no heartbeats.
    let mut sink = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut sink)).await;
    let elapsed = start.elapsed();
    assert!(read.is_ok(), "the gateway never dropped the silent connection");
    assert!(
        elapsed >= Duration::from_millis(400),
        "dropped after {elapsed:?}, before the 400ms read timeout"
    );
    // The connection is gone but the session waits for a resume.
    assert_eq!(gw.session_count(), 1);
    assert_eq!(gw.stats().snapshot().connections_open, 0);
}

#[tokio::test]
async fn a_websocket_session_resumes_too() {
    let gw = common::start(&[]).await;
    let target = Target::parse(&format!("ws://{}/", gw.ws_addrs()[0])).await.unwrap();
    let mut conn = Connection::connect(ConnectOptions::new(target)).await.unwrap();
    assert_eq!(common::round_trip(&mut conn, 1, 32).await.id, 1);
    // Queue a request, then move to a new WebSocket connection before it is flushed.
    conn.send_request(2, "echo", common::echo_body(16, 0)).unwrap();
    conn.resume().await.unwrap();
    assert!(conn.welcome().resumed);
    let mut ids = Vec::new();
    while ids.len() < 2 {
        conn.flush().await;
        if let Some(Event::Response(r)) = conn.next_event().await.unwrap() {
            ids.push(r.id);
            if r.id == 2 {
                conn.send_request(3, "echo", common::echo_body(16, 0)).unwrap();
            }
        }
    }
    assert_eq!(ids, vec![2, 3]);
    assert_eq!(gw.stats().snapshot().sessions_resumed, 1);
}

/// The Welcome tells the client how much the gateway keeps unacknowledged (§3, §5), and the
/// client acknowledges by the time half of it has arrived.
#[tokio::test]
async fn the_welcome_announces_the_unacknowledged_bounds() {
    let gw = common::start(&["session.max_unacked_messages=900", "session.max_unacked_bytes=900000"]).await;
    let conn = common::connect(&gw).await;
    assert_eq!(conn.welcome().max_unacked_messages, 900);
    assert_eq!(conn.welcome().max_unacked_bytes, 900_000);

    let gw = common::start(&[]).await;
    let conn = common::connect(&gw).await;
    assert_eq!(conn.welcome().max_unacked_messages, 1024, "the documented default");
    assert_eq!(conn.welcome().max_unacked_bytes, 1 << 20, "the documented default");
}

/// A resume the gateway refuses before it reads the Hello (`OVERLOADED`: too many connections
/// from the address waiting for theirs) ends that connection, not the session: the client
/// tries again, and the session goes on.
#[tokio::test]
async fn a_resume_refused_as_overloaded_is_tried_again() {
    let gw = common::start(&["limits.max_pending_per_ip=1"]).await;
    let proxy = common::ChaosProxy::start(gw.tcp_addrs()[0]).await;
    let client =
        tickwire_client::Client::connect(ConnectOptions::new(Target::Tcp(proxy.addr))).await.unwrap();
    assert_eq!(client.call("echo", common::echo_body(8, 0)).await.unwrap().len(), 8);
    // A connection that sends no Hello takes the address's one place.
    let blocker = tokio::net::TcpStream::connect(gw.tcp_addrs()[0]).await.unwrap();
    // Seen full: a probe behind it is refused.
    let probe = common::raw_close(gw.tcp_addrs()[0], &common::hello_frame("")).await;
    assert_eq!(common::reason(&probe), Some(CloseReason::Overloaded));
    proxy.cut();
    common::wait_until("a resume refused as overloaded", || {
        gw.stats().snapshot().closes(CloseReason::Overloaded) >= 2
    })
    .await;
    drop(blocker);
    let body = client.call("echo", common::echo_body(16, 0)).await.expect("the session goes on");
    assert_eq!(body.len(), 16);
    assert_eq!(gw.stats().snapshot().sessions_resumed, 1);
    client.close().await;
}
