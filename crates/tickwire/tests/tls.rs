//! `tickwire gateway` with `[tls]`: SIGHUP re-reads the certificate, and `--processes` is
//! refused (a resume handed to another worker process cannot carry TLS state).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tickwire_transport::{TlsClient, connect_tls};

fn certificate() -> (String, String) {
    let c = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    (c.cert.pem(), c.signing_key.serialize_pem())
}

fn write(dir: &Path, (cert, key): &(String, String)) {
    std::fs::write(dir.join("cert.pem"), cert).unwrap();
    std::fs::write(dir.join("key.pem"), key).unwrap();
}

fn tls_args(dir: &Path) -> Vec<String> {
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    vec![
        "--set".into(),
        format!("tls.cert_file=\"{}\"", cert.display()),
        "--set".into(),
        format!("tls.key_file=\"{}\"", key.display()),
    ]
}

/// Whether a TLS handshake that trusts only `pem` succeeds.
fn trusted(addr: std::net::SocketAddr, pem: &str) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let tls = TlsClient::new(pem.as_bytes(), "127.0.0.1").unwrap();
    rt.block_on(async { connect_tls(addr, None, &tls).await.is_ok() })
}

#[test]
fn sighup_reloads_the_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (certificate(), certificate());
    write(dir.path(), &first);
    let mut child = Command::new(env!("CARGO_BIN_EXE_tickwire"))
        .args(["gateway", "--tcp", "127.0.0.1:0", "--ws", "127.0.0.1:0"])
        .args(tls_args(dir.path()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines.by_ref().map(Result::unwrap).find(|l| l.contains("tls://")).expect("a TLS listener");
    // Keep reading the rest, as a supervisor would.
    std::thread::spawn(move || lines.for_each(drop));
    let addr: std::net::SocketAddr = line.rsplit("tls://").next().unwrap().trim().parse().unwrap();
    assert!(trusted(addr, &first.0));

    write(dir.path(), &second);
    // SAFETY: signalling the child we started, by its pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGHUP) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !trusted(addr, &second.0) {
        assert!(Instant::now() < deadline, "the new certificate was not served after SIGHUP");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!trusted(addr, &first.0), "the old certificate is gone for new connections");
    assert!(child.try_wait().unwrap().is_none(), "SIGHUP does not stop the gateway");
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
}

#[test]
fn processes_are_refused_with_tls() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &certificate());
    let out = Command::new(env!("CARGO_BIN_EXE_tickwire"))
        .args(["gateway", "--processes", "2", "--tcp", "127.0.0.1:0", "--ws", "127.0.0.1:0"])
        .args(tls_args(dir.path()))
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot be used with [tls]"), "{stderr}");
}
