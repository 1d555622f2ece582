//! Clients that hold a connection by doing too little, over real sockets: a socket that never
//! sends a byte, an HTTP/2 client that sits idle between requests while it answers keep-alive
//! pings, readers that stop taking an answer (HTTP/1.1 with the socket full, HTTP/2 with no
//! flow-control credit for the connection or for one stream), and a body that trickles in,
//! each piece well within the allowance but the whole below the minimum rate. Each is cut off
//! and counted; readers and a body that are slow but above the rate are not, however long they
//! take, nor is the rest of an HTTP/2 connection when one of its streams is cut.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tickwire_ddc::IoHash;
use tickwire_ddc::http::Limits;
use tickwire_ddc::pace::MinRate;
use tickwire_ddc::serve::ServeLimits;

use common::{status, url};

/// The size of the blob a reader stops reading: more than the kernel's send buffer may grow to
/// on this machine (`tcp_wmem`'s maximum, 4 MiB by default) twice over, so that the server is
/// left waiting on it.
fn stopped_blob_bytes() -> usize {
    let wmem = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem").unwrap_or_default();
    let max = wmem.split_whitespace().nth(2).and_then(|m| m.parse::<usize>().ok()).unwrap_or(4 << 20);
    (2 * max + (2 << 20)).max(10 << 20)
}

/// A server whose connections go idle after 1 s, whose answers may stall for `allowance` and
/// must then be taken at `send_rate` bytes a second, and whose bodies may stall for 1 s and
/// must then come at 1 KiB/s.
fn server_with(send_rate: u64, allowance: Duration) -> common::Server {
    let limits = ServeLimits {
        header_timeout: Duration::from_secs(1),
        send: MinRate { bytes_per_s: send_rate, allowance },
        ..ServeLimits::default()
    };
    let api = Limits {
        max_blob_bytes: 256 << 20,
        body: MinRate { bytes_per_s: 1024, allowance: Duration::from_secs(1) },
        ..Limits::default()
    };
    common::start_api(limits, api, None)
}

/// [`server_with`] an allowance of 1 s.
fn server(send_rate: u64) -> common::Server {
    server_with(send_rate, Duration::from_secs(1))
}

/// Stores a blob of `len` bytes: its path.
fn put_blob(s: &common::Server, len: usize) -> (String, Vec<u8>) {
    let blob: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let path = format!("/api/v1/blobs/ue.ddc/{}", IoHash::of(&blob).to_hex());
    let put = ureq::put(&url(s, &path)).set("Authorization", "Bearer writer").send_bytes(&blob);
    assert_eq!(status(put), 200);
    (path, blob)
}

/// `ddc_connections_closed_total{reason}`.
fn closed(s: &common::Server, reason: &str) -> u64 {
    let metrics =
        ureq::get(&url(s, "/metrics")).set("Connection", "close").call().unwrap().into_string().unwrap();
    let prefix = format!("ddc_connections_closed_total{{reason=\"{reason}\"}} ");
    metrics.lines().find_map(|line| line.strip_prefix(&prefix)?.parse().ok()).unwrap_or(0)
}

/// `ddc_answers_cut_total`.
fn answers_cut(s: &common::Server) -> u64 {
    let metrics =
        ureq::get(&url(s, "/metrics")).set("Connection", "close").call().unwrap().into_string().unwrap();
    metrics.lines().find_map(|line| line.strip_prefix("ddc_answers_cut_total ")?.parse().ok()).unwrap_or(0)
}

/// Waits up to 10 s for `closed(reason)` to reach `count`.
fn await_closed(s: &common::Server, reason: &str, count: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while closed(s, reason) < count {
        assert!(Instant::now() < deadline, "no connection closed as {reason}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A socket to `s` whose receive buffer is small, so that a reader that stops fills it soon.
fn small_buffered(s: &common::Server) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(64 << 10).unwrap();
    socket.connect(&s.addr.into()).unwrap();
    socket.into()
}

/// Reads an HTTP/1.1 answer whose body is `body_len` bytes, 128 KiB (or what is left) and then
/// a pause of `pause`, over and over: the whole answer, head included. Panics if the server
/// closes first.
fn read_answer(socket: &mut TcpStream, body_len: usize, pause: Duration) -> Vec<u8> {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut piece = vec![0u8; 16 << 10];
    let mut this_period = 0;
    loop {
        let head = got.windows(4).position(|w| w == b"\r\n\r\n").map(|at| at + 4);
        if head.is_some_and(|head| got.len() >= head + body_len) {
            return got;
        }
        let n = socket.read(&mut piece).unwrap();
        assert!(n > 0, "closed after {} bytes, at {:?}", got.len(), started.elapsed());
        got.extend_from_slice(&piece[..n]);
        this_period += n;
        if this_period >= 128 << 10 {
            this_period = 0;
            std::thread::sleep(pause);
        }
    }
}

/// A blob of 1 MiB stored on `s`, and an HTTP/2 connection to it whose streams get 64 KiB of
/// flow-control credit each and `connection_window` in all, taken only as the client reads:
/// the connection's sender, its driver's task, the blob's path and the blob.
async fn h2_with_blob(
    s: &Arc<common::Server>,
    connection_window: u32,
) -> (
    hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    tokio::task::JoinHandle<hyper::Result<()>>,
    String,
    Vec<u8>,
) {
    let (path, blob) = tokio::task::spawn_blocking({
        let s = s.clone();
        move || put_blob(&s, 1 << 20)
    })
    .await
    .unwrap();
    let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(connection_window)
        .handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    (sender, tokio::spawn(conn), path, blob)
}

fn get_request(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer reader\r\n\r\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_with_no_request_in_flight_is_shut_down() {
    let s = server(1024);
    let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp)).await.unwrap();
    let driver = tokio::spawn(conn);
    let request = Request::get(url(&s, "/health/live")).body(Full::<Bytes>::default()).unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    response.into_body().collect().await.unwrap();
    // hyper's client answers the server's keep-alive pings: only the idle deadline ends this.
    let idle_from = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(10), driver).await;
    assert!(ended.is_ok(), "the idle connection is still open");
    assert!(idle_from.elapsed() >= Duration::from_millis(900), "closed before its idle deadline");
    // Counted once the server's task for it ends, a moment after the client sees the close.
    let slow = tokio::task::spawn_blocking(move || {
        await_closed(&s, "idle", 1);
        closed(&s, "slow")
    });
    assert_eq!(slow.await.unwrap(), 0);
}

#[test]
fn a_reader_that_stops_is_dropped_and_a_slow_one_above_the_rate_is_not() {
    let s = server(64 << 10);
    let blob_bytes = stopped_blob_bytes();
    let (path, blob) = put_blob(&s, blob_bytes);

    // Stops after the status line: the kernel's buffers fill and the server waits on it.
    let mut stopped = small_buffered(&s);
    stopped.write_all(get_request(&path).as_bytes()).unwrap();
    let mut first = [0u8; 12];
    stopped.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    await_closed(&s, "slow", 1);
    stopped.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut rest = Vec::new();
    let read = stopped.read_to_end(&mut rest);
    assert!(read.is_ok() || rest.len() < blob_bytes, "the connection was closed: {read:?}");
    assert!(rest.len() < blob_bytes, "the whole answer was sent to a reader that stopped");

    // At most 128 KiB (the socket's buffer) every 50 ms: under 2.7 MB/s, 40 times the rate,
    // for about 4 s: longer than the allowance and the idle timeout, each several times over.
    let mut slow = small_buffered(&s);
    slow.write_all(get_request(&path).as_bytes()).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = Instant::now();
    let got = read_answer(&mut slow, blob.len(), Duration::from_millis(50));
    assert!(got.ends_with(&blob), "the slow reader got the whole blob ({} bytes)", got.len());
    assert!(started.elapsed() > Duration::from_secs(2), "it was not slow: {:?}", started.elapsed());
    assert_eq!(closed(&s, "slow"), 1, "only the stopped reader was dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_reader_that_gives_no_flow_control_credit_is_dropped() {
    let s = Arc::new(server(1024));
    let (mut sender, driver, path, _) = h2_with_blob(&s, 65_535).await;
    let request = Request::get(url(&s, &path))
        .header("authorization", "Bearer reader")
        .body(Full::<Bytes>::default())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    // The body is never read, so no WINDOW_UPDATE goes out; pings are still answered.
    let ended = tokio::time::timeout(Duration::from_secs(10), driver).await;
    assert!(ended.is_ok(), "the stalled connection is still open");
    drop(response);
    tokio::task::spawn_blocking(move || await_closed(&s, "slow", 1)).await.unwrap();
}

/// An answer served from memory keeps its share of the memory budget while it is sent; a
/// reader that stops has its connection dropped after the send allowance, and the share comes
/// back though the reader never closes its socket.
#[test]
fn a_stopped_reader_of_an_answer_from_memory_gives_its_share_back() {
    let limits = ServeLimits {
        send: MinRate { bytes_per_s: 64 << 10, allowance: Duration::from_secs(1) },
        ..ServeLimits::default()
    };
    let api = Limits { memory_budget: 20 << 20, max_buffered_bytes: 16 << 20, ..Limits::default() };
    let s = common::start_api(limits, api, None);
    let (path, _) = common::put_large_object(&s, 12 << 20);
    let head = || status(ureq::head(&url(&s, &path)).set("Authorization", "Bearer writer").call());
    let mut stopped = small_buffered(&s);
    let get = format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer writer\r\nAccept: application/x-ue-cb\r\n\r\n"
    );
    stopped.write_all(get.as_bytes()).unwrap();
    let mut first = [0u8; 12];
    stopped.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    assert_eq!(head(), 429, "the stopped reader's answer holds its share");
    await_closed(&s, "slow", 1);
    assert_eq!(head(), 200, "its connection dropped, the share came back");
    drop(stopped);
}

#[test]
fn a_socket_that_never_sends_a_byte_is_closed_and_counted_idle() {
    let s = server(1024);
    let mut silent = TcpStream::connect(s.addr).unwrap();
    silent.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = Instant::now();
    let mut got = Vec::new();
    let read = silent.read_to_end(&mut got);
    assert!(read.is_ok() && got.is_empty(), "closed, nothing sent: {read:?} {got:?}");
    assert!(started.elapsed() >= Duration::from_millis(900), "{:?}", started.elapsed());
    await_closed(&s, "idle", 1);
}

/// A reader at about two and a half times the rate, for five times the idle timeout: the bytes
/// its socket takes keep the connection's bank full (without them it runs out: checked by
/// mutation), and it is served whole.
#[test]
fn a_reader_near_the_rate_is_served_whole() {
    let s = server_with(512 << 10, Duration::from_secs(5));
    let (path, blob) = put_blob(&s, 6 << 20);
    let mut reader = small_buffered(&s);
    reader.write_all(get_request(&path).as_bytes()).unwrap();
    reader.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = Instant::now();
    // At most 128 KiB every 100 ms: about 1.3 MB/s, for about 5 s.
    let got = read_answer(&mut reader, blob.len(), Duration::from_millis(100));
    assert!(got.ends_with(&blob));
    assert!(started.elapsed() > Duration::from_secs(3), "{:?}", started.elapsed());
    assert_eq!(closed(&s, "slow"), 0);
}

/// Two answers on one HTTP/2 connection: the client gives one's stream no flow-control credit
/// and reads the other slowly. The first is cut after the allowance (3 s); the second is not,
/// and comes whole. Then nothing on the connection moves, and it is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_given_no_credit_is_cut_and_the_others_go_on() {
    let s = Arc::new(server_with(1024, Duration::from_secs(3)));
    let (mut sender, driver, path, blob) = h2_with_blob(&s, 16 << 20).await;
    let get = || {
        Request::get(url(&s, &path))
            .header("authorization", "Bearer reader")
            .body(Full::<Bytes>::default())
            .unwrap()
    };
    let stalled = sender.send_request(get()).await.unwrap();
    let moving = sender.send_request(get()).await.unwrap();
    assert_eq!((stalled.status().as_u16(), moving.status().as_u16()), (200, 200));
    // The cut, seen from outside while the moving answer is read.
    let cut_seen = tokio::task::spawn_blocking({
        let s = s.clone();
        move || {
            let deadline = Instant::now() + Duration::from_secs(15);
            while answers_cut(&s) < 1 {
                assert!(Instant::now() < deadline, "no answer was cut");
                std::thread::sleep(Duration::from_millis(50));
            }
            Instant::now()
        }
    });
    // A frame (at most 16 KiB) every 100 ms: 1 MiB in 6.4 s at least, 3.4 s past the cut.
    let mut body = moving.into_body();
    let mut got = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("the moving answer was not cut");
        if let Some(data) = frame.data_ref() {
            got.extend_from_slice(data);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let moving_ended = Instant::now();
    assert_eq!(got, blob);
    assert!(cut_seen.await.unwrap() < moving_ended, "the stalled answer was cut while the other moved");
    let ended = tokio::time::timeout(Duration::from_secs(10), driver).await;
    assert!(ended.is_ok(), "the connection is still open with nothing moving");
    drop(stalled);
    let cut = tokio::task::spawn_blocking(move || {
        await_closed(&s, "slow", 1);
        answers_cut(&s)
    });
    assert_eq!(cut.await.unwrap(), 1, "one answer cut; the connection dropped with the cut stream left open");
}

/// PUTs `len` bytes in pieces of `piece` bytes every 100 ms: the answer's status line.
fn trickle_put(s: &common::Server, len: usize, piece: usize) -> (String, Duration) {
    let blob: Vec<u8> = (0..len).map(|i| (i % 7) as u8).collect();
    let id = IoHash::of(&blob).to_hex();
    let mut stream = TcpStream::connect(s.addr).unwrap();
    let head = format!(
        "PUT /api/v1/blobs/ue.ddc/{id} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer writer\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let started = Instant::now();
    let trickle = std::thread::spawn(move || {
        for chunk in blob.chunks(piece) {
            if writer.write_all(chunk).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let took = started.elapsed();
    trickle.join().unwrap();
    (answer.lines().next().unwrap_or_default().to_owned(), took)
}

#[test]
fn a_body_below_the_minimum_rate_gets_408_though_no_piece_is_late() {
    let s = server(1024);
    // 20 bytes every 100 ms: 200 B/s, a fifth of the rate; no gap near the 1 s allowance. The
    // bank drains 0.8 s a second: cut off after about 1.25 s.
    let (status, took) = trickle_put(&s, 10_000, 20);
    assert_eq!(status, "HTTP/1.1 408 Request Timeout");
    assert!(took >= Duration::from_secs(1) && took < Duration::from_secs(5), "{took:?}");
    // 500 bytes every 100 ms (5 KB/s) for 2 s: slow, longer than the allowance, above the rate.
    let (status, took) = trickle_put(&s, 10_000, 500);
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(took >= Duration::from_millis(1900), "{took:?}");
}
