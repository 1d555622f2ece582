//! TLS for the gateway's and the DDC's listeners and for clients, with rustls (ring).
//!
//! It exists so that tokens and data never travel in cleartext when a deployment does not put
//! a TLS-terminating proxy in front. A server's certificate chain and key come from PEM files
//! and can be re-read while it runs ([`TlsServer::reload`], wired to SIGHUP by the binary): new
//! connections get the new certificate, live ones keep theirs, and a reload that fails keeps
//! the old one. For demos and tests, [`TlsServer::self_signed`] makes a certificate in memory.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::crypto::ring::default_provider;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: rustls_pki_types::pem::Error },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("making a self-signed certificate: {0}")]
    SelfSigned(#[from] rcgen::Error),
    #[error("`{0}` is not a valid TLS server name")]
    ServerName(String),
}

/// Where a server's certificate comes from.
#[derive(Debug, Clone)]
enum Source {
    Files { cert: PathBuf, key: PathBuf },
    SelfSigned,
}

/// A server's TLS settings, swappable while it runs.
pub struct TlsServer {
    source: Source,
    /// Application protocols offered in ALPN, most preferred first (none: no ALPN).
    alpn: Vec<Vec<u8>>,
    acceptor: RwLock<TlsAcceptor>,
}

impl std::fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsServer").field("source", &self.source).finish_non_exhaustive()
    }
}

impl TlsServer {
    /// Reads a certificate chain (PEM, leaf first) and its private key (PEM: PKCS#8, PKCS#1 or
    /// SEC1).
    pub fn from_files(cert: &Path, key: &Path) -> Result<Arc<TlsServer>, TlsError> {
        TlsServer::from_files_with_alpn(cert, key, Vec::new())
    }

    /// [`TlsServer::from_files`], offering `alpn` (e.g. `h2`, `http/1.1`) in the handshake.
    pub fn from_files_with_alpn(
        cert: &Path,
        key: &Path,
        alpn: Vec<Vec<u8>>,
    ) -> Result<Arc<TlsServer>, TlsError> {
        let source = Source::Files { cert: cert.to_owned(), key: key.to_owned() };
        let acceptor = acceptor_from_files(cert, key, &alpn)?;
        Ok(Arc::new(TlsServer { source, alpn, acceptor: RwLock::new(acceptor) }))
    }

    /// A fresh self-signed certificate for `names` (DNS names or IP addresses), for demos and
    /// tests. Returns the certificate in PEM too, for clients to trust.
    pub fn self_signed(names: &[String]) -> Result<(Arc<TlsServer>, String), TlsError> {
        TlsServer::self_signed_with_alpn(names, Vec::new())
    }

    /// [`TlsServer::self_signed`], offering `alpn` in the handshake.
    pub fn self_signed_with_alpn(
        names: &[String],
        alpn: Vec<Vec<u8>>,
    ) -> Result<(Arc<TlsServer>, String), TlsError> {
        let certified = rcgen::generate_simple_self_signed(names.to_vec())?;
        let cert_pem = certified.cert.pem();
        let chain = vec![certified.cert.der().clone()];
        let key = PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
        let acceptor = TlsAcceptor::from(server_config(chain, key, &alpn)?);
        let server = TlsServer { source: Source::SelfSigned, alpn, acceptor: RwLock::new(acceptor) };
        Ok((Arc::new(server), cert_pem))
    }

    /// Re-reads the certificate and key files. On error the current ones stay in use. A
    /// self-signed server has nothing to re-read.
    pub fn reload(&self) -> Result<(), TlsError> {
        let Source::Files { cert, key } = &self.source else { return Ok(()) };
        let acceptor = acceptor_from_files(cert, key, &self.alpn)?;
        *self.acceptor.write().unwrap_or_else(|p| p.into_inner()) = acceptor;
        Ok(())
    }

    /// The acceptor for the next connection.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn acceptor_from_files(cert: &Path, key: &Path, alpn: &[Vec<u8>]) -> Result<TlsAcceptor, TlsError> {
    let chain = read_certificates(cert)?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|source| TlsError::Read { path: key.to_owned(), source })?;
    Ok(TlsAcceptor::from(server_config(chain, key, alpn)?))
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read = |source| TlsError::Read { path: path.to_owned(), source };
    let chain =
        CertificateDer::pem_file_iter(path).map_err(read)?.collect::<Result<Vec<_>, _>>().map_err(read)?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate { path: path.to_owned() });
    }
    Ok(chain)
}

fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    alpn: &[Vec<u8>],
) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = ServerConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = alpn.to_vec();
    Ok(Arc::new(config))
}

/// What a client needs to open TLS connections: the certificates it trusts and the name it
/// expects the server's certificate to carry.
#[derive(Clone)]
pub struct TlsClient {
    pub connector: TlsConnector,
    pub server_name: ServerName<'static>,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient").field("server_name", &self.server_name).finish_non_exhaustive()
    }
}

impl TlsClient {
    /// Trusts the certificates in `roots_pem` (PEM text) and expects `server_name` (a DNS name
    /// or an IP address).
    pub fn new(roots_pem: &[u8], server_name: &str) -> Result<TlsClient, TlsError> {
        let roots = root_store(roots_pem, Path::new("(roots)"))?;
        let config = ClientConfig::builder_with_provider(Arc::new(default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server_name = ServerName::try_from(server_name.to_owned())
            .map_err(|_| TlsError::ServerName(server_name.into()))?;
        Ok(TlsClient { connector: TlsConnector::from(Arc::new(config)), server_name })
    }

    /// [`TlsClient::new`] with the roots read from a PEM file.
    pub fn from_file(roots: &Path, server_name: &str) -> Result<TlsClient, TlsError> {
        TlsClient::new(&read_pem(roots)?, server_name)
    }
}

fn read_pem(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path)
        .map_err(|e| TlsError::Read { path: path.to_owned(), source: rustls_pki_types::pem::Error::Io(e) })
}

/// The roots in `pem` (PEM text, one certificate or more; `label` names it in errors).
fn root_store(pem: &[u8], label: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    let read = |source| TlsError::Read { path: label.to_owned(), source };
    for cert in CertificateDer::pem_slice_iter(pem) {
        roots.add(cert.map_err(read)?)?;
    }
    if roots.is_empty() {
        return Err(TlsError::NoCertificate { path: label.to_owned() });
    }
    Ok(roots)
}

/// The roots in the PEM file at `path`, to trust as a client.
pub fn root_store_from_file(path: &Path) -> Result<RootCertStore, TlsError> {
    root_store(&read_pem(path)?, path)
}

/// Maps a TLS handshake failure to an I/O error, as the rest of the transport reports them.
pub(crate) fn io_error(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}
