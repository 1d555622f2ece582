//! TLS to the Postgres server, as libpq's connection options ask for it: managed databases
//! (RDS, Cloud SQL, Azure) expect it, often require it. `tokio-postgres` reads `sslmode` only
//! as `disable`, `prefer` or `require` and knows no `sslrootcert`, so the options this module
//! reads are taken out of the connection string (URL or `key=value` form, [`split`]) before
//! `tokio-postgres` parses the rest; the connections are then made with rustls
//! ([`tokio_postgres_rustls`]), checking the server's certificate as libpq does:
//!
//! | `sslmode` | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (the default) | if the server offers it | checked as `verify-ca` with `sslrootcert`, else not |
//! | `require` | always | the same |
//! | `verify-ca` | always | signed by a root in `sslrootcert` |
//! | `verify-full` | always | that, and naming the host connected to |
//!
//! `sslrootcert` is a PEM file of trusted roots, or `system` for the machine's, which (as in
//! libpq 16) makes `verify-full` the default and refuses weaker modes. As in libpq, an option the
//! string does not set comes from `PGSSLMODE` or `PGSSLROOTCERT` if set (so a deployment that
//! sets them is not silently weaker); `~/.postgresql/root.crt` is not read. As in libpq, Unix
//! sockets never use TLS, and with `hostaddr` alone the address is the name checked. libpq's
//! `allow` and client certificates (`sslcert`, `sslkey`) are refused, saying so, rather than
//! half done. Without `sslrootcert`, `prefer` and `require` encrypt but do not authenticate the
//! server (as libpq without `~/.postgresql/root.crt`); the server warns at start when a remote
//! host is reached with less than `verify-full` ([`Connect::weakness_across_network`]).

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{
    CryptoProvider, ring::default_provider, verify_tls12_signature, verify_tls13_signature,
};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::meta::MetaError;

/// The options this module reads; the rest of the string goes to `tokio-postgres`.
const TAKEN: [&str; 2] = ["sslmode", "sslrootcert"];
/// libpq's environment variables for the options in [`TAKEN`], read (as libpq reads them) for an
/// option the connection string does not set.
const ENV: [(&str, &str); 2] = [("sslmode", "PGSSLMODE"), ("sslrootcert", "PGSSLROOTCERT")];
/// libpq's options for client certificates, which are not supported.
const CLIENT_CERT: [&str; 3] = ["sslcert", "sslkey", "sslpassword"];

/// How the connections are secured, as libpq's `sslmode` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl FromStr for Mode {
    type Err = MetaError;

    fn from_str(s: &str) -> Result<Mode, MetaError> {
        Ok(match s {
            "disable" => Mode::Disable,
            "prefer" => Mode::Prefer,
            "require" => Mode::Require,
            "verify-ca" => Mode::VerifyCa,
            "verify-full" => Mode::VerifyFull,
            "allow" => {
                return Err(MetaError::Config(
                    "sslmode=allow is not supported (it tries without TLS first): use disable, \
                     prefer, require, verify-ca or verify-full"
                        .into(),
                ));
            }
            other => {
                return Err(MetaError::Config(format!(
                    "sslmode={other:?} is not one of disable, prefer, require, verify-ca, verify-full"
                )));
            }
        })
    }
}

/// A connection string with the options in [`TAKEN`] taken out.
#[derive(Debug, PartialEq, Eq)]
pub struct Split {
    /// The rest, for `tokio-postgres`.
    pub rest: String,
    /// The options taken, decoded, in the order they came (a later one wins).
    pub taken: Vec<(String, String)>,
}

/// Takes the options in [`TAKEN`] out of `conn`: a `postgres://` or `postgresql://` URL
/// (query parameters, percent-encoded) or libpq's `key=value` form (values quoted with `'`,
/// `\` escaping the next character), read as `tokio-postgres` reads them. What is kept is kept
/// as written.
pub fn split(conn: &str) -> Result<Split, MetaError> {
    let malformed = |why: &str| MetaError::Config(format!("the Postgres connection string: {why}"));
    let mut taken = Vec::new();
    let url = ["postgres://", "postgresql://"]
        .iter()
        .find_map(|prefix| conn.strip_prefix(prefix).map(|_| prefix.len()));
    if let Some(prefix) = url {
        // As tokio-postgres reads it: credentials up to the first `@`, then host and path up to
        // the first `?`, then `&`-separated parameters.
        let after_credentials = conn[prefix..].find('@').map_or(prefix, |at| prefix + at + 1);
        let Some(query) = conn[after_credentials..].find('?').map(|q| after_credentials + q) else {
            return Ok(Split { rest: conn.to_owned(), taken });
        };
        let mut kept = Vec::new();
        for param in conn[query + 1..].split('&').filter(|p| !p.is_empty()) {
            let (key, value) = param.split_once('=').ok_or_else(|| malformed("a parameter without `=`"))?;
            let key = decode(key).ok_or_else(|| malformed("a parameter name is not valid UTF-8"))?;
            if TAKEN.contains(&key.as_str()) {
                let value = decode(value).ok_or_else(|| malformed("a parameter value is not valid UTF-8"))?;
                taken.push((key, value));
            } else {
                kept.push(param);
            }
        }
        let base = &conn[..query];
        let rest = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
        return Ok(Split { rest, taken });
    }
    let mut kept = Vec::new();
    for pair in pairs(conn)? {
        if TAKEN.contains(&pair.key) {
            taken.push((pair.key.to_owned(), pair.value));
        } else {
            kept.push(pair.text);
        }
    }
    Ok(Split { rest: kept.join(" "), taken })
}

fn decode(s: &str) -> Option<String> {
    percent_encoding::percent_decode_str(s).decode_utf8().ok().map(|v| v.into_owned())
}

/// One `key=value` of libpq's key-value form.
#[derive(Debug, PartialEq, Eq)]
struct Pair<'a> {
    key: &'a str,
    value: String,
    /// The pair as written.
    text: &'a str,
}

/// The pairs of a `key=value` connection string, by `tokio-postgres`'s grammar.
fn pairs(conn: &str) -> Result<Vec<Pair<'_>>, MetaError> {
    let malformed = |why: String| MetaError::Config(format!("the Postgres connection string: {why}"));
    let mut out = Vec::new();
    let mut it = conn.char_indices().peekable();
    let skip_ws = |it: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
        while it.next_if(|(_, c)| c.is_whitespace()).is_some() {}
    };
    let at =
        |it: &mut std::iter::Peekable<std::str::CharIndices<'_>>| it.peek().map_or(conn.len(), |&(i, _)| i);
    loop {
        skip_ws(&mut it);
        let start = at(&mut it);
        while it.next_if(|&(_, c)| !c.is_whitespace() && c != '=').is_some() {}
        let key = &conn[start..at(&mut it)];
        if key.is_empty() {
            return match it.peek() {
                None => Ok(out),
                Some(&(i, _)) => Err(malformed(format!("a name was expected at byte {i}"))),
            };
        }
        skip_ws(&mut it);
        if it.next_if(|&(_, c)| c == '=').is_none() {
            return Err(malformed(format!("no `=` after the name at byte {start}")));
        }
        skip_ws(&mut it);
        let mut value = String::new();
        if it.next_if(|&(_, c)| c == '\'').is_some() {
            loop {
                match it.next() {
                    None => {
                        return Err(malformed(format!(
                            "the value of the name at byte {start} has no closing `'`"
                        )));
                    }
                    Some((_, '\'')) => break,
                    Some((_, '\\')) => value.extend(it.next().map(|(_, c)| c)),
                    Some((_, c)) => value.push(c),
                }
            }
        } else {
            while let Some((_, c)) = it.next_if(|(_, c)| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(it.next().map(|(_, c)| c));
                } else {
                    value.push(c);
                }
            }
            if value.is_empty() {
                return Err(malformed(format!("the name at byte {start} has no value")));
            }
        }
        out.push(Pair { key, value, text: &conn[start..at(&mut it)] });
    }
}

/// A connection string read: the configuration for `tokio-postgres`, and how its
/// connections are secured.
pub struct Connect {
    pub config: tokio_postgres::Config,
    pub tls: MakeRustlsConnect,
    pub mode: Mode,
    /// Whether the server's certificate is checked.
    pub checked: bool,
}

impl std::fmt::Debug for Connect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connect")
            .field("mode", &self.mode)
            .field("checked", &self.checked)
            .finish_non_exhaustive()
    }
}

impl Connect {
    /// What an attacker on the network between this server and a Postgres server reached
    /// over it (a TCP host other than `localhost` or a loopback address) could do, unless the
    /// mode is `verify-full`: for a warning at start.
    pub fn weakness_across_network(&self) -> Option<&'static str> {
        let remote = |host: &Host| match host {
            Host::Tcp(name) => {
                name != "localhost"
                    && !name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.to_canonical().is_loopback())
            }
            Host::Unix(_) => false,
        };
        let hostaddr_remote = self.config.get_hostaddrs().iter().any(|ip| !ip.to_canonical().is_loopback());
        if !(self.config.get_hosts().iter().any(remote) || hostaddr_remote) {
            return None;
        }
        match (self.mode, self.checked) {
            (Mode::VerifyFull, _) => None,
            (Mode::Disable, _) => Some("nothing is encrypted (sslmode=disable)"),
            (Mode::Prefer, _) => Some("a server that does not offer TLS is used without it (sslmode=prefer)"),
            (Mode::Require, false) => Some("the server's certificate is not checked"),
            (Mode::Require | Mode::VerifyCa, true) => {
                Some("the server's certificate is not checked for its name")
            }
            (Mode::VerifyCa, false) => unreachable!("refused without roots"),
        }
    }
}

/// Reads `conn` (a libpq URL or `key=value` string, see the module's doc), with `PGSSLMODE` and
/// `PGSSLROOTCERT` from the environment for the options it does not set.
pub fn connect(conn: &str) -> Result<Connect, MetaError> {
    connect_with_env(conn, |name| std::env::var(name).ok())
}

/// [`connect`], with `env` for the environment.
fn connect_with_env(conn: &str, env: impl Fn(&str) -> Option<String>) -> Result<Connect, MetaError> {
    let Split { rest, mut taken } = split(conn)?;
    // Where each option came from, for errors: the string, or a variable.
    let mut from_env = Vec::new();
    for (option, variable) in ENV {
        if !taken.iter().any(|(k, _)| k == option)
            && let Some(value) = env(variable).filter(|v| !v.is_empty())
        {
            taken.push((option.to_owned(), value));
            from_env.push((option, variable));
        }
    }
    let named = |error: MetaError, option: &str| match (error, from_env.iter().find(|(o, _)| *o == option)) {
        (MetaError::Config(why), Some((_, variable))) => {
            MetaError::Config(format!("{variable} (from the environment): {why}"))
        }
        (error, _) => error,
    };
    let option = |name: &str| taken.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let system = option("sslrootcert") == Some("system");
    let mode = match option("sslmode") {
        Some(mode) => mode.parse().map_err(|e| named(e, "sslmode"))?,
        // As libpq: with the machine's roots, the default is the one check they make safe.
        None if system => Mode::VerifyFull,
        None => Mode::Prefer,
    };
    if system && mode != Mode::VerifyFull {
        // The machine's roots trust any public certificate: only its name makes it this server's.
        return Err(MetaError::Config(
            "sslrootcert=system needs sslmode=verify-full (its default): any publicly trusted \
             certificate passes a weaker check"
                .into(),
        ));
    }
    let mut config = tokio_postgres::Config::from_str(&rest).map_err(|e| {
        // tokio-postgres says what is wrong in the error's source only.
        let why = std::error::Error::source(&e).map_or_else(|| e.to_string(), ToString::to_string);
        match CLIENT_CERT.iter().find(|name| why == format!("unknown option `{name}`")) {
            Some(name) => MetaError::Config(format!(
                "{name}: client certificates are not supported for Postgres; authenticate with a \
                 password (over sslmode=verify-full)"
            )),
            None => MetaError::Config(format!("the Postgres connection string: {why}")),
        }
    })?;
    let hosts = config.get_hosts();
    let unix_only = !hosts.is_empty() && hosts.iter().all(|h| matches!(h, Host::Unix(_)));
    config.ssl_mode(match mode {
        // As libpq: no TLS over Unix sockets, whatever the mode says.
        _ if unix_only => SslMode::Disable,
        Mode::Disable => SslMode::Disable,
        Mode::Prefer => SslMode::Prefer,
        Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
    });
    // As libpq, addresses alone are the names the certificate is checked for (tokio-postgres
    // checks `host`, and makes no TLS connection without one).
    if config.get_hosts().is_empty() {
        for ip in config.get_hostaddrs().to_vec() {
            config.host(ip.to_string());
        }
    }
    let roots = match option("sslrootcert") {
        None => None,
        Some("system") => Some(system_roots().map_err(|e| named(e, "sslrootcert"))?),
        Some(path) => Some(file_roots(Path::new(path)).map_err(|e| named(e, "sslrootcert"))?),
    };
    if roots.is_none() && matches!(mode, Mode::VerifyCa | Mode::VerifyFull) {
        return Err(MetaError::Config(
            "sslmode=verify-ca and verify-full need sslrootcert: a PEM file of the roots to trust, \
             or `system` for this machine's"
                .into(),
        ));
    }
    let checked = roots.is_some();
    let provider = Arc::new(default_provider());
    let webpki = match roots {
        None => None,
        Some(roots) => Some(
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| MetaError::Config(format!("sslrootcert: {e}")))?,
        ),
    };
    let verifier = Check { webpki, names: mode == Mode::VerifyFull, provider: provider.clone() };
    let mut tls = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| MetaError::Config(format!("TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    // What libpq 17 offers: Postgres 17 requires it of `sslnegotiation=direct`.
    tls.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(Connect { config, tls: MakeRustlsConnect::new(tls), mode, checked })
}

fn file_roots(path: &Path) -> Result<RootCertStore, MetaError> {
    tickwire_transport::root_store_from_file(path).map_err(|e| MetaError::Config(format!("sslrootcert: {e}")))
}

fn system_roots() -> Result<RootCertStore, MetaError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
        return Err(MetaError::Config(format!(
            "sslrootcert=system: this machine has no trusted roots ({})",
            errors.join("; ")
        )));
    }
    Ok(roots)
}

/// Checks the server's certificate: not at all without roots; else its chain to them, and its
/// name only with `names` (`verify-full`). Handshake signatures are always checked.
#[derive(Debug)]
struct Check {
    webpki: Option<Arc<WebPkiServerVerifier>>,
    names: bool,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Check {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(webpki) = &self.webpki else { return Ok(ServerCertVerified::assertion()) };
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.names => Ok(ServerCertVerified::assertion()),
            checked => checked,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn taken(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn urls_lose_the_options_taken_and_keep_the_rest_as_written() {
        let split = split("postgres://u:p%3F@db.example:5433/ddc?sslmode=verify-full&application_name=a%20b&sslrootcert=%2Fetc%2Fca.pem").unwrap();
        assert_eq!(split.rest, "postgres://u:p%3F@db.example:5433/ddc?application_name=a%20b");
        assert_eq!(split.taken, taken(&[("sslmode", "verify-full"), ("sslrootcert", "/etc/ca.pem")]));
        let only = super::split("postgresql://host/db?sslmode=require").unwrap();
        assert_eq!(
            (only.rest.as_str(), only.taken),
            ("postgresql://host/db", taken(&[("sslmode", "require")]))
        );
        let none = super::split("postgres://host/db").unwrap();
        assert_eq!((none.rest.as_str(), none.taken.len()), ("postgres://host/db", 0));
        // A `?` in the password is before the `@`: not the query.
        let odd = super::split("postgres://u:a?b@host/db?sslmode=disable").unwrap();
        assert_eq!(odd.rest, "postgres://u:a?b@host/db");
        assert!(super::split("postgres://host/db?sslmode").is_err());
    }

    #[test]
    fn key_value_strings_lose_the_options_taken_and_keep_the_rest_as_written() {
        let split =
            split(r"host=/tmp  sslmode = verify-ca user='o\'brien x' sslrootcert='/a b/ca.pem' dbname=d\ b")
                .unwrap();
        assert_eq!(split.rest, r"host=/tmp user='o\'brien x' dbname=d\ b");
        assert_eq!(split.taken, taken(&[("sslmode", "verify-ca"), ("sslrootcert", "/a b/ca.pem")]));
        for bad in ["host", "host=", "host='x", "=x", "host=x ="] {
            assert!(super::split(bad).is_err(), "{bad:?}");
        }
        assert_eq!(super::split("  ").unwrap().rest, "");
    }

    /// [`super::connect`] with an empty environment: the tests do not depend on the machine's.
    fn connect(conn: &str) -> Result<Connect, MetaError> {
        connect_with_env(conn, |_| None)
    }

    #[test]
    fn pgsslmode_and_pgsslrootcert_fill_in_what_the_string_does_not_set() {
        let dir = tempfile::tempdir().unwrap();
        certificates(dir.path());
        let ca = dir.path().join("ca.pem").to_str().unwrap().to_owned();
        let env = |mode: &'static str, root: Option<String>| {
            move |name: &str| match name {
                "PGSSLMODE" => Some(mode.to_owned()),
                "PGSSLROOTCERT" => root.clone(),
                _ => None,
            }
        };
        let strict = connect_with_env("host=h", env("verify-full", Some(ca.clone()))).unwrap();
        assert_eq!((strict.mode, strict.checked), (Mode::VerifyFull, true));
        // The string wins over the environment, option by option.
        let stated =
            connect_with_env("host=h sslmode=require", env("verify-full", Some(ca.clone()))).unwrap();
        assert_eq!((stated.mode, stated.checked), (Mode::Require, true));
        let url = connect_with_env("postgres://h/d?sslmode=disable", env("verify-full", None)).unwrap();
        assert_eq!(url.mode, Mode::Disable);
        // An empty variable is unset, as in libpq.
        assert_eq!(connect_with_env("host=h", env("", None)).unwrap().mode, Mode::Prefer);
        // Errors name the variable.
        let e = connect_with_env("host=h", env("sometimes", None)).unwrap_err().to_string();
        assert!(e.contains("PGSSLMODE (from the environment): sslmode=\"sometimes\""), "{e}");
        let e = connect_with_env("host=h", env("verify-full", None)).unwrap_err().to_string();
        assert!(e.contains("need sslrootcert"), "{e}");
        let e =
            connect_with_env("host=h", env("require", Some("/no/such.pem".into()))).unwrap_err().to_string();
        assert!(e.contains("PGSSLROOTCERT (from the environment): sslrootcert: reading /no/such.pem"), "{e}");
    }

    #[test]
    fn modes_are_read_as_libpq_names_them_and_the_unsupported_are_refused() {
        let mode = |conn: &str| connect(conn).map(|c| (c.mode, c.checked, c.config.get_ssl_mode()));
        assert_eq!(mode("host=h").unwrap(), (Mode::Prefer, false, SslMode::Prefer));
        assert_eq!(mode("host=h sslmode=disable").unwrap(), (Mode::Disable, false, SslMode::Disable));
        assert_eq!(mode("postgres://h/d?sslmode=require").unwrap(), (Mode::Require, false, SslMode::Require));
        let refused = |conn: &str, says: &str| {
            let e = connect(conn).unwrap_err().to_string();
            assert!(e.contains(says), "{conn}: {e}");
        };
        let warned = |conn: &str| connect(conn).unwrap().weakness_across_network();
        assert_eq!(
            warned("host=db.example sslmode=require"),
            Some("the server's certificate is not checked")
        );
        assert!(warned("postgres://db.example/d").unwrap().contains("sslmode=prefer"));
        assert!(warned("hostaddr=10.1.2.3 sslmode=disable").unwrap().contains("nothing is encrypted"));
        assert!(warned("host=/run/postgresql").is_none());
        assert!(warned("host=localhost,127.0.0.1 sslmode=require").is_none(), "on this machine");
        // Over a Unix socket, no TLS whatever the mode (as libpq).
        let unix = connect("host=/run/postgresql sslmode=require").unwrap();
        assert_eq!(unix.config.get_ssl_mode(), SslMode::Disable);
        // An address alone is the name checked.
        let by_address = connect("hostaddr=10.1.2.3 sslmode=require").unwrap();
        assert_eq!(by_address.config.get_hosts(), [Host::Tcp("10.1.2.3".into())]);
        refused(
            "host=h sslrootcert=system sslmode=verify-ca",
            "sslrootcert=system needs sslmode=verify-full",
        );
        refused("host=h sslrootcert=system sslmode=require", "sslrootcert=system needs sslmode=verify-full");
        refused("host=h sslmode=verify-full", "need sslrootcert");
        refused("host=h sslmode=allow", "sslmode=allow is not supported");
        refused("host=h sslmode=sometimes", "is not one of");
        refused("host=h sslcert=/c.pem", "client certificates are not supported");
        refused(
            "host=h sslrootcert=/no/such/file.pem sslmode=verify-ca",
            "sslrootcert: reading /no/such/file.pem",
        );
        refused("host=h colour=blue", "the Postgres connection string: unknown option `colour`");
    }

    /// A CA and a server certificate it signed, for `localhost` only (the TLS test server's),
    /// and another CA; both CAs' certificates written under `dir` as `ca.pem` and `other.pem`.
    fn certificates(dir: &Path) -> crate::meta::testing::TlsFiles {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let ca = |name: &str| {
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(rcgen::DnType::CommonName, name);
            let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
            std::fs::write(dir.join(format!("{name}.pem")), issuer.pem()).unwrap();
            issuer
        };
        let (ours, _other) = (ca("ca"), ca("other"));
        let key = KeyPair::generate().unwrap();
        let cert =
            CertificateParams::new(vec!["localhost".to_owned()]).unwrap().signed_by(&key, &ours).unwrap();
        crate::meta::testing::TlsFiles { cert_pem: cert.pem(), key_pem: key.serialize_pem() }
    }

    /// Whether a session made from `conn` is over TLS, as the server sees it; the error, with
    /// its causes, if none could be made.
    async fn over_tls(conn: &str) -> Result<bool, String> {
        let chain = |e: &dyn std::error::Error| {
            let mut text = e.to_string();
            let mut cause = e.source();
            while let Some(c) = cause {
                text += &format!(": {c}");
                cause = c.source();
            }
            text
        };
        let Connect { config, tls, .. } = connect(conn).map_err(|e| chain(&e))?;
        let (client, connection) = config.connect(tls).await.map_err(|e| chain(&e))?;
        tokio::spawn(connection);
        let row = client
            .query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[])
            .await
            .map_err(|e| chain(&e))?;
        Ok(row.get(0))
    }

    /// Against a server that takes TCP connections over TLS only, with a certificate for
    /// `localhost` signed by a CA of the test's: each mode encrypts, and checks the server's
    /// certificate as libpq's does; the metadata store opens over TLS from a URL.
    #[tokio::test]
    async fn each_mode_encrypts_and_checks_the_server_as_libpq_does() {
        let dir = tempfile::tempdir().unwrap();
        let files = certificates(dir.path());
        let Some((port, db)) = crate::meta::testing::tls_database(|| files) else { return };
        let (ca, other) = (dir.path().join("ca.pem"), dir.path().join("other.pem"));
        let (ca, other) = (ca.display(), other.display());
        // `localhost` by name, reached at 127.0.0.1 whatever the machine resolves it to (the
        // server listens there only).
        let conn = |host: &str, tls: &str| {
            format!("host={host} hostaddr=127.0.0.1 port={port} user=postgres dbname={db} {tls}")
        };

        assert_eq!(over_tls(&conn("127.0.0.1", "")).await, Ok(true), "prefer: TLS, offered");
        assert_eq!(over_tls(&conn("127.0.0.1", "sslmode=require")).await, Ok(true), "no roots: no check");
        let full = format!("sslmode=verify-full sslrootcert={ca}");
        assert_eq!(over_tls(&conn("localhost", &full)).await, Ok(true));
        let by_ca = format!("sslmode=verify-ca sslrootcert={ca}");
        assert_eq!(
            over_tls(&conn("127.0.0.1", &by_ca)).await,
            Ok(true),
            "verify-ca: the name is not checked"
        );

        let refused = |result: Result<bool, String>, says: &str| {
            let e = result.expect_err("refused");
            assert!(e.contains(says), "expected {says:?} in: {e}");
        };
        refused(over_tls(&conn("127.0.0.1", &full)).await, "certificate not valid for name");
        // An address alone is the name checked (as libpq).
        let by_address = format!("hostaddr=127.0.0.1 port={port} user=postgres dbname={db} {full}");
        refused(over_tls(&by_address).await, "certificate not valid for name");
        refused(
            over_tls(&conn("localhost", &format!("sslmode=verify-full sslrootcert={other}"))).await,
            "UnknownIssuer",
        );
        // With roots, `require` checks the chain, as libpq's does with a root file.
        refused(
            over_tls(&conn("localhost", &format!("sslmode=require sslrootcert={other}"))).await,
            "UnknownIssuer",
        );
        refused(over_tls(&conn("127.0.0.1", "sslmode=disable")).await, "no pg_hba.conf entry");

        let encoded = |path: &str| {
            percent_encoding::utf8_percent_encode(path, percent_encoding::NON_ALPHANUMERIC).to_string()
        };
        let url = format!(
            "postgres://postgres@localhost:{port}/{db}?hostaddr=127.0.0.1&sslmode=verify-full&sslrootcert={}",
            encoded(&ca.to_string())
        );
        let store = crate::meta::MetaStore::open_postgres(&url).await.unwrap();
        let ns: crate::Name = "ue.ddc".parse().unwrap();
        store.add_namespace(&ns).await.unwrap();
        assert_eq!(store.namespaces().await.unwrap(), vec![ns]);
    }

    /// A value as `key=value` writes it: quoted, with `'` and `\` escaped.
    fn quote(value: &str) -> String {
        format!("'{}'", value.replace('\\', r"\\").replace('\'', r"\'"))
    }

    proptest! {
        /// Any string of pairs: the taken ones come out decoded and in order, and the rest,
        /// read again, is exactly the other pairs.
        #[test]
        fn key_value_pairs_split_exactly(
            written in proptest::collection::vec(
                (prop_oneof![Just("sslmode"), Just("sslrootcert"), Just("host"), Just("user"), Just("dbname")],
                 "[ -~]{0,12}", any::<bool>()),
                0..8,
            ),
            gap in "[ \t]{1,3}",
        ) {
            let conn: Vec<String> = written.iter().map(|(k, v, spaced)| {
                let eq = if *spaced { " = " } else { "=" };
                format!("{k}{eq}{}", quote(v))
            }).collect();
            let split = split(&conn.join(&gap)).unwrap();
            let expected: Vec<(String, String)> = written.iter()
                .filter(|(k, _, _)| TAKEN.contains(k))
                .map(|(k, v, _)| ((*k).to_owned(), v.clone()))
                .collect();
            prop_assert_eq!(split.taken, expected);
            let kept: Vec<(String, String)> = pairs(&split.rest).unwrap().into_iter()
                .map(|p| (p.key.to_owned(), p.value)).collect();
            let others: Vec<(String, String)> = written.iter()
                .filter(|(k, _, _)| !TAKEN.contains(k))
                .map(|(k, v, _)| ((*k).to_owned(), v.clone()))
                .collect();
            prop_assert_eq!(kept, others);
        }

        /// Against tokio-postgres itself: a string of pairs (quoted or not, with escapes) and a
        /// URL of them (percent-encoded) read, after the split, as the same string without
        /// the taken pairs reads.
        #[test]
        fn the_rest_reads_as_the_string_without_the_taken_pairs(
            written in proptest::collection::vec(
                (prop_oneof![Just("sslmode"), Just("sslrootcert"), Just("user"), Just("dbname"),
                             Just("application_name"), Just("password"), Just("options")],
                 "[!-~]{1,10}", any::<bool>()),
                0..7,
            ),
        ) {
            let value = |v: &str, quoted: bool| if quoted { quote(v) } else { v.replace('\\', r"\\").replace('\'', r"\'") };
            let pairs_of = |keep: &dyn Fn(&str) -> bool| written.iter()
                .filter(|(k, _, _)| keep(k))
                .map(|(k, v, quoted)| format!("{k}={}", value(v, *quoted)))
                .collect::<Vec<_>>().join(" ");
            let all = format!("host=h {}", pairs_of(&|_| true));
            let others = format!("host=h {}", pairs_of(&|k| !TAKEN.contains(&k)));
            let rest = split(&all).unwrap().rest;
            prop_assert_eq!(
                tokio_postgres::Config::from_str(&rest).ok(),
                tokio_postgres::Config::from_str(&others).ok()
            );
            let encode = |v: &str| percent_encoding::utf8_percent_encode(v, percent_encoding::NON_ALPHANUMERIC).to_string();
            let query = |keep: &dyn Fn(&str) -> bool| written.iter()
                .filter(|(k, _, _)| keep(k))
                .map(|(k, v, _)| format!("{k}={}", encode(v)))
                .collect::<Vec<_>>().join("&");
            let all = format!("postgres://u:p%40ss@h:5433/d?{}", query(&|_| true));
            let others = format!("postgres://u:p%40ss@h:5433/d?{}", query(&|k| !TAKEN.contains(&k)));
            let split = split(&all).unwrap();
            prop_assert_eq!(
                tokio_postgres::Config::from_str(&split.rest).ok(),
                tokio_postgres::Config::from_str(others.trim_end_matches('?')).ok()
            );
            let taken: Vec<(String, String)> = written.iter()
                .filter(|(k, _, _)| TAKEN.contains(k))
                .map(|(k, v, _)| ((*k).to_owned(), v.clone()))
                .collect();
            prop_assert_eq!(split.taken, taken);
        }

        /// Any input: an answer or an error, never a panic.
        #[test]
        fn any_string_splits_or_is_refused(conn in "\\PC{0,40}") {
            let _ = split(&conn);
            let _ = split(&format!("postgres://{conn}"));
        }
    }
}
