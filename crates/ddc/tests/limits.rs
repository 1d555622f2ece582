//! The HTTP server's limits, tried as an attacker would, over real sockets: idle sockets that
//! never send a request, more connections than the cap, a body that stalls halfway, and a
//! non-text `X-Jupiter-IoHash`. The attacker is cut off with a status or a closed socket, and
//! a health check and an authenticated upload beside it still succeed.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{start_with, status, url};
use tickwire_ddc::IoHash;
use tickwire_ddc::serve::ServeLimits;

/// Reads what the server sends until it closes the socket, within `limit`.
fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> Option<String> {
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut out = Vec::new();
    match stream.read_to_end(&mut out) {
        Ok(_) => Some(String::from_utf8_lossy(&out).into_owned()),
        Err(_) => None,
    }
}

fn health(s: &common::Server) -> u16 {
    status(ureq::get(&url(s, "/health/live")).timeout(Duration::from_secs(5)).call())
}

#[test]
fn idle_and_surplus_connections_cannot_hold_the_server() {
    let limits = ServeLimits { max_connections: 20, header_timeout: Duration::from_secs(2) };
    let s = start_with(limits, Duration::from_secs(30));
    // 30 sockets that never send a request: 20 take every slot and are closed (with nothing
    // sent) once their header deadline passes; the other 10 get 503 at once (a whole answer
    // and a clean close, not a reset). Which ones is up to the order the server accepts them
    // in. The 2 s deadline leaves a loaded machine ample time to accept all 30 first.
    let mut sockets: Vec<TcpStream> = (0..30).map(|_| TcpStream::connect(s.addr).unwrap()).collect();
    let answers: Vec<String> = sockets
        .iter_mut()
        .map(|socket| read_until_closed(socket, Duration::from_secs(5)).expect("a socket stayed open"))
        .collect();
    let busy = answers.iter().filter(|a| a.starts_with("HTTP/1.1 503")).count();
    let reaped = answers.iter().filter(|a| a.is_empty()).count();
    assert_eq!((busy, reaped), (10, 20), "{answers:?}");
    // The server serves again.
    assert_eq!(health(&s), 200);
}

#[test]
fn a_body_that_stalls_gets_408_and_is_stored_nowhere() {
    let s = start_with(ServeLimits::default(), Duration::from_millis(300));
    let data = b"0123456789".repeat(100);
    let id = IoHash::of(&data).to_hex();
    let mut stream = TcpStream::connect(s.addr).unwrap();
    let head = format!(
        "PUT /api/v1/blobs/ue.ddc/{id} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer writer\r\nContent-Length: {}\r\n\r\n",
        data.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&data[..10]).unwrap();
    // ... and nothing more.
    let answer = read_until_closed(&mut stream, Duration::from_secs(5)).expect("answered and closed");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    let get = ureq::get(&url(&s, &format!("/api/v1/blobs/ue.ddc/{id}")))
        .set("Authorization", "Bearer writer")
        .call();
    assert_eq!(status(get), 404, "nothing was stored");
    // A whole upload beside it works.
    let put = ureq::put(&url(&s, &format!("/api/v1/blobs/ue.ddc/{id}")))
        .set("Authorization", "Bearer writer")
        .send_bytes(&data);
    assert_eq!(status(put), 200);
}

#[test]
fn a_non_text_iohash_header_is_a_bad_request() {
    let s = start_with(ServeLimits::default(), Duration::from_secs(30));
    let data = b"abc";
    let id = IoHash::of(data).to_hex();
    let mut stream = TcpStream::connect(s.addr).unwrap();
    let mut request = format!(
        "PUT /api/v1/blobs/ue.ddc/{id} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer writer\r\nContent-Length: 3\r\nConnection: close\r\nX-Jupiter-IoHash: "
    )
    .into_bytes();
    request.extend_from_slice(&[0xff, 0xfe, 0x80]);
    request.extend_from_slice(b"\r\n\r\nabc");
    stream.write_all(&request).unwrap();
    let answer = read_until_closed(&mut stream, Duration::from_secs(5)).expect("answered");
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    assert_eq!(health(&s), 200);
}
