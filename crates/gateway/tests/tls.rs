//! TLS on the gateway's listeners: clients that trust the certificate get the usual sessions
//! over TLS and WSS; anything else is cut off at the handshake without harming anyone; a
//! reload swaps the certificate for new connections only.

mod common;

use std::path::Path;
use std::time::Duration;

use tickwire_client::{ClientError, ConnectOptions, Connection, Target, TlsClient};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A self-signed certificate for 127.0.0.1: (certificate PEM, key PEM).
fn certificate() -> (String, String) {
    let c = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    (c.cert.pem(), c.signing_key.serialize_pem())
}

fn options(target: Target, trusted_pem: &str) -> ConnectOptions {
    let mut opts = ConnectOptions::new(target);
    opts.tls = Some(TlsClient::new(trusted_pem.as_bytes(), "127.0.0.1").unwrap());
    opts
}

async fn echo_ok(opts: ConnectOptions) {
    let mut conn = Connection::connect(opts).await.expect("a TLS session");
    assert_eq!(common::round_trip(&mut conn, 1, 100).await.body.len(), 100);
}

#[tokio::test]
async fn sessions_run_over_tls_and_wss_and_a_plaintext_peer_is_cut_off() {
    let gw = common::start(&["tls.self_signed=true"]).await;
    assert!(gw.tls_enabled());
    let pem = gw.tls_certificate_pem().expect("a self-signed certificate").to_owned();
    let tcp = gw.tcp_addrs()[0];
    let ws = gw.ws_addrs()[0];

    // A healthy client over TLS stays connected through everything below.
    let mut healthy = Connection::connect(options(Target::Tls(tcp), &pem)).await.unwrap();
    echo_ok(options(Target::parse(&format!("wss://{ws}/")).await.unwrap(), &pem)).await;

    // Plaintext protocol bytes at the TLS port: the TLS handshake fails, the socket is closed.
    let mut plain = tokio::net::TcpStream::connect(tcp).await.unwrap();
    plain.write_all(&common::hello_frame("mallory")).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "closed, not left hanging");
    // At most a TLS alert record (content type 21), never a session protocol frame.
    assert!(answer.is_empty() || answer[0] == 21, "{answer:?}");

    // A client that trusts another certificate refuses the server's.
    let (other, _) = certificate();
    let refused = Connection::connect(options(Target::Tls(tcp), &other)).await;
    assert!(matches!(refused, Err(ClientError::Connect { .. })), "{refused:?}");

    // A tls:// target without TLS settings is a clear error, not a plaintext attempt.
    let bare = Connection::connect(ConnectOptions::new(Target::Tls(tcp))).await;
    assert!(matches!(bare, Err(ClientError::TlsNotConfigured(_))), "{bare:?}");

    assert_eq!(common::round_trip(&mut healthy, 7, 10).await.body.len(), 10);
    assert!(gw.shutdown(Duration::from_secs(5)).await);
}

fn write(dir: &Path, (cert, key): &(String, String)) {
    std::fs::write(dir.join("cert.pem"), cert).unwrap();
    std::fs::write(dir.join("key.pem"), key).unwrap();
}

#[tokio::test]
async fn a_reload_serves_the_new_certificate_to_new_connections_and_keeps_live_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (certificate(), certificate());
    write(dir.path(), &first);
    let cert = format!("tls.cert_file=\"{}\"", dir.path().join("cert.pem").display());
    let key = format!("tls.key_file=\"{}\"", dir.path().join("key.pem").display());
    let gw = common::start(&[&cert, &key]).await;
    let tcp = gw.tcp_addrs()[0];
    let mut live = Connection::connect(options(Target::Tls(tcp), &first.0)).await.unwrap();

    write(dir.path(), &second);
    gw.reload_tls().expect("the new files load");
    echo_ok(options(Target::Tls(tcp), &second.0)).await;
    let old = Connection::connect(options(Target::Tls(tcp), &first.0)).await;
    assert!(matches!(old, Err(ClientError::Connect { .. })), "new connections get the new certificate");
    assert_eq!(common::round_trip(&mut live, 2, 10).await.body.len(), 10, "live connections keep theirs");

    // A broken file is refused and the current certificate stays.
    std::fs::write(dir.path().join("cert.pem"), "not a certificate").unwrap();
    assert!(gw.reload_tls().is_err());
    echo_ok(options(Target::Tls(tcp), &second.0)).await;
    assert!(gw.shutdown(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn a_half_configured_tls_section_is_refused() {
    let err = tickwire_gateway::GatewayConfig::load(None, &["tls.cert_file=\"/tmp/x.pem\"".to_owned()]);
    assert!(err.unwrap_err().to_string().contains("go together"));
}
