//! Two gateway instances acting as worker processes 0 and 1 share one port. A resume that the
//! kernel sends to the wrong one is handed to its owner, socket and all, and goes on there.

mod common;

use std::time::Duration;

use tickwire_gateway::{Gateway, GatewayConfig, RunningGateway, WorkerSet};

async fn worker(index: u8, port: u16, dir: &std::path::Path) -> RunningGateway {
    let config =
        GatewayConfig::load(None, &[format!("listen.tcp=[\"127.0.0.1:{port}\"]"), "listen.ws=[]".into()])
            .unwrap();
    let workers = WorkerSet { index, count: 2, dir: dir.to_owned() };
    Gateway::new(config).unwrap().with_workers(workers).start().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_find_their_worker_process() {
    let dir = std::env::temp_dir().join(format!("tickwire-workers-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let first = worker(0, 0, &dir).await;
    let port = first.tcp_addrs()[0].port();
    let second = worker(1, port, &dir).await;

    let mut conns = Vec::new();
    for _ in 0..24 {
        conns.push(common::connect(&first).await);
    }
    for (i, conn) in conns.iter_mut().enumerate() {
        assert_eq!(common::round_trip(conn, 1, 8).await.id, 1);
        // A new connection: the kernel picks either worker.
        tokio::time::timeout(Duration::from_secs(10), conn.resume())
            .await
            .expect("resume in time")
            .unwrap_or_else(|e| panic!("client {i}: {e}"));
        assert_eq!(common::round_trip(conn, 2, 8).await.id, 2);
    }
    let (a, b) = (first.stats().snapshot(), second.stats().snapshot());
    assert_eq!(a.sessions_resumed + b.sessions_resumed, 24);
    assert!(a.sessions_open > 0 && b.sessions_open > 0, "the kernel used one worker only: {a:?} {b:?}");
    assert!(a.handoffs_received + b.handoffs_received > 0, "no resume needed a handoff: {a:?} {b:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_stops_taking_handoffs() {
    let dir = std::env::temp_dir().join(format!("tickwire-workers-stop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gateway = worker(0, 0, &dir).await;
    let socket = dir.join("worker-0.sock");
    std::os::unix::net::UnixStream::connect(&socket).expect("the handoff listener is up");
    assert!(gateway.shutdown(Duration::from_secs(5)).await, "shutdown waited for every task");
    // The listener was the handoff task's, and that task has ended and removed its socket.
    let refused = std::os::unix::net::UnixStream::connect(&socket).expect_err("no handoff listener");
    assert_eq!(refused.kind(), std::io::ErrorKind::NotFound, "{refused}");
    let _ = std::fs::remove_dir_all(&dir);
}
