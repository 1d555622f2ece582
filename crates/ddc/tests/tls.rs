//! The DDC over HTTPS: a client that trusts the certificate gets answers; a plaintext HTTP
//! request to the HTTPS port gets none and is closed, and does not disturb the server.

mod common;

use std::time::Duration;

use bytes::BytesMut;
use tickwire_ddc::serve::ServeLimits;
use tickwire_transport::{TlsClient, TlsServer, connect_tls};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const HEALTH: &[u8] = b"GET /health/live HTTP/1.1\r\nHost: ddc\r\nConnection: close\r\n\r\n";

async fn https_get(addr: std::net::SocketAddr, pem: &str) -> String {
    let tls = TlsClient::new(pem.as_bytes(), "127.0.0.1").unwrap();
    let mut conn = connect_tls(addr, None, &tls).await.expect("a TLS connection");
    conn.write_all(HEALTH).await.unwrap();
    let mut answer = BytesMut::new();
    while tokio::time::timeout(Duration::from_secs(5), conn.read(&mut answer)).await.unwrap().unwrap_or(0) > 0
    {
    }
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn health_over_https_and_plaintext_gets_nothing() {
    let (tls, pem) = TlsServer::self_signed(&["127.0.0.1".to_owned()]).unwrap();
    let server = common::start_full(ServeLimits::default(), Duration::from_secs(30), Some(tls));

    let answer = https_get(server.addr, &pem).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("Healthy"), "{answer}");

    let mut plain = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    plain.write_all(HEALTH).await.unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(15), plain.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "closed, not left hanging");
    assert!(!got.starts_with(b"HTTP/"), "no HTTP answer in plaintext: {got:?}");

    assert!(https_get(server.addr, &pem).await.starts_with("HTTP/1.1 200"), "the server is unharmed");
}
