//! Shared helpers for the gateway's integration tests: a gateway on loopback port 0, raw
//! sockets for sending malformed bytes, and a client factory.
#![allow(dead_code)]

pub mod channels;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use prost::Message;
use tickwire_client::{ConnectOptions, Connection, Target};
use tickwire_gateway::{Gateway, GatewayConfig, RunningGateway};
use tickwire_wire::proto::{Close, CloseReason, Control, EchoRequest, Hello, control};
use tickwire_wire::{Frame, FrameDecoder, decode_control};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub async fn start(overrides: &[&str]) -> RunningGateway {
    Gateway::new(config(overrides)).expect("gateway").start().await.expect("start")
}

/// [`start`], with the sessions on I/O threads as the binary runs them (each a current-thread
/// runtime; the spatial world's passes are then delivered there, not inline). The two threads
/// are shared by the tests of one binary and run until it exits.
pub async fn start_on_io_threads(overrides: &[&str]) -> RunningGateway {
    static THREADS: std::sync::OnceLock<Vec<tokio::runtime::Handle>> = std::sync::OnceLock::new();
    let runtimes = THREADS.get_or_init(|| tickwire_transport::io_threads(2, "test-io").expect("I/O threads"));
    Gateway::new(config(overrides)).expect("gateway").start_on(runtimes).expect("start")
}

fn config(overrides: &[&str]) -> GatewayConfig {
    let mut all = vec!["listen.tcp=[\"127.0.0.1:0\"]".to_owned(), "listen.ws=[\"127.0.0.1:0\"]".to_owned()];
    all.extend(overrides.iter().map(|s| s.to_string()));
    GatewayConfig::load(None, &all).expect("test config")
}

/// Waits until `done` holds, checking every few milliseconds; panics naming `what` if it has
/// not after 10 s. For conditions the test cannot be told about (a counter, a session ending),
/// instead of sleeping for a guessed time.
pub async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Scrapes `/metrics` until `done` holds for the text, and returns that text.
pub async fn scrape_until(addr: SocketAddr, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = scrape(addr).await;
        if done(&text) {
            return text;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}:\n{text}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub fn tcp_target(gw: &RunningGateway) -> Target {
    Target::Tcp(gw.tcp_addrs()[0])
}

pub async fn connect(gw: &RunningGateway) -> Connection {
    Connection::connect(ConnectOptions::new(tcp_target(gw))).await.expect("connect")
}

pub fn echo_body(response_bytes: u32, padding: usize) -> Bytes {
    EchoRequest { response_bytes, padding: Bytes::from(vec![7u8; padding]) }.encode_to_vec().into()
}

pub fn hello_frame(token: &str) -> Vec<u8> {
    let mut buf = BytesMut::new();
    Frame::control(&Control {
        kind: Some(control::Kind::Hello(Hello {
            protocol_version: 1,
            token: token.into(),
            resume: None,
            client_name: "raw".into(),
        })),
    })
    .encode(&mut buf);
    buf.to_vec()
}

/// Sends `bytes` on a fresh TCP connection and returns the Close the gateway answers with,
/// reading until the gateway closes the socket (bounded by a timeout).
pub async fn raw_close(addr: SocketAddr, bytes: &[u8]) -> Option<Close> {
    raw_exchange(addr, bytes, false).await
}

/// Like [`raw_close`], but half-closes the socket after writing (EOF, possibly mid-frame).
pub async fn raw_close_eof(addr: SocketAddr, bytes: &[u8]) -> Option<Close> {
    raw_exchange(addr, bytes, true).await
}

async fn raw_exchange(addr: SocketAddr, bytes: &[u8], eof: bool) -> Option<Close> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    if eof {
        stream.shutdown().await.unwrap();
    }
    read_close(&mut stream).await
}

/// Reads until the gateway closes `stream` (10 s at most) and returns the Close it sent, if any.
pub async fn read_close(stream: &mut TcpStream) -> Option<Close> {
    let mut data = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut data)).await;
    assert!(read.is_ok(), "gateway did not close the connection");
    let decoder = FrameDecoder::default();
    let mut buf = BytesMut::from(&data[..]);
    let mut close = None;
    while let Ok(Some(frame)) = decoder.decode(&mut buf) {
        if let Frame::Control(body) = frame
            && let Ok(control::Kind::Close(c)) = decode_control(body)
        {
            close = Some(c);
        }
    }
    close
}

pub fn reason(close: &Option<Close>) -> Option<CloseReason> {
    close.as_ref().map(|c| c.reason())
}

/// One request/response round trip on a raw [`Connection`].
pub async fn round_trip(conn: &mut Connection, id: u64, size: u32) -> tickwire_wire::proto::Response {
    conn.send_request(id, "echo", echo_body(size, 0)).unwrap();
    loop {
        conn.flush().await;
        match tokio::time::timeout(Duration::from_secs(10), conn.next_event())
            .await
            .expect("response in time")
            .unwrap()
        {
            Some(tickwire_client::Event::Response(r)) => return r,
            Some(other) => panic!("unexpected event {other:?}"),
            None => {}
        }
    }
}

/// A DATA frame carrying an `echo` request, as raw bytes.
pub fn echo_frame(seq: u64, id: u64) -> Vec<u8> {
    use tickwire_wire::proto::{Envelope, Request, envelope};
    let request = Request { id, method: "echo".into(), body: echo_body(1, 0) };
    let payload = tickwire_wire::encode_message(&Envelope { kind: Some(envelope::Kind::Request(request)) });
    let mut buf = BytesMut::new();
    Frame::Data { seq, ack: 0, payload: payload.into() }.encode(&mut buf);
    buf.to_vec()
}

/// A TCP proxy whose every connection can be cut at once by bumping `cuts`.
pub struct ChaosProxy {
    pub addr: SocketAddr,
    pub cuts: watch::Sender<u64>,
}

impl ChaosProxy {
    pub async fn start(upstream: SocketAddr) -> ChaosProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cuts, watch_rx) = watch::channel(0u64);
        tokio::spawn(async move {
            loop {
                let Ok((mut down, _)) = listener.accept().await else { return };
                let mut cut = watch_rx.clone();
                cut.mark_unchanged();
                tokio::spawn(async move {
                    let Ok(mut up) = TcpStream::connect(upstream).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut down, &mut up) => {}
                        _ = cut.changed() => {}
                    }
                    // Dropping both sockets cuts the connection, possibly mid-frame.
                });
            }
        });
        ChaosProxy { addr, cuts }
    }

    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }
}

/// The value of `series` (a metric's name, with its labels if it has any, as `/metrics`
/// writes them) in a `/metrics` text, if it is there.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// `GET /metrics` over a plain socket; the body with its headers.
pub async fn scrape(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out)).await.unwrap().unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}
