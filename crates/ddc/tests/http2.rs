//! The DDC over HTTP/2, as the editor speaks it by default: prior knowledge on plain TCP (h2c),
//! and ALPN `h2` over TLS. The same routes and answers as over HTTP/1.1.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tickwire_ddc::IoHash;
use tickwire_ddc::serve::{ServeLimits, alpn};
use tickwire_transport::TlsServer;

async fn exchange(
    sender: &mut hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> (u16, Bytes) {
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    (status, response.into_body().collect().await.unwrap().to_bytes())
}

/// A PUT and GET of one blob, and the health check, on one HTTP/2 connection.
async fn round_trip<IO>(io: IO, authority: &str)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io)).await.unwrap();
    tokio::spawn(conn);
    let base = format!("http://{authority}");
    let (status, body) =
        exchange(&mut sender, Request::get(format!("{base}/health/ready")).body(Full::default()).unwrap())
            .await;
    assert_eq!((status, &body[..]), (200, &b"Healthy"[..]));
    let blob = Bytes::from_static(b"over http/2");
    let id = IoHash::of(&blob).to_hex();
    let put = Request::put(format!("{base}/api/v1/blobs/ue.ddc/{id}"))
        .header("authorization", "Bearer writer")
        .header("content-type", "application/octet-stream")
        .body(Full::new(blob.clone()))
        .unwrap();
    assert_eq!(exchange(&mut sender, put).await.0, 200);
    let get = Request::get(format!("{base}/api/v1/blobs/ue.ddc/{id}"))
        .header("authorization", "Bearer reader")
        .body(Full::default())
        .unwrap();
    assert_eq!(exchange(&mut sender, get).await, (200, blob));
}

#[tokio::test]
async fn h2c_with_prior_knowledge() {
    let server = common::start();
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    round_trip(tcp, &server.addr.to_string()).await;
}

#[tokio::test]
async fn h2_over_tls_by_alpn() {
    let (tls, pem) = TlsServer::self_signed_with_alpn(&["127.0.0.1".to_owned()], alpn()).unwrap();
    let server = common::start_full(ServeLimits::default(), Duration::from_secs(30), Some(tls));
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::pem::PemObject::pem_slice_iter(pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let stream = connector.connect(name, tcp).await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]), "the server chose h2");
    round_trip(stream, &server.addr.to_string()).await;
}
