//! `tickwire gateway --processes N --metrics ADDR`: worker i serves metrics on the port + i, so
//! a taken port among them is a clear error naming it, before any worker starts.

use std::process::Command;

#[test]
fn a_taken_metrics_port_is_named_before_any_worker_starts() {
    // Two free neighbouring ports: take the second one.
    let (base, _taken) = loop {
        let first = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = first.local_addr().unwrap().port();
        drop(first);
        if let Some(next) = port.checked_add(1)
            && let Ok(taken) = std::net::TcpListener::bind(("127.0.0.1", next))
        {
            break (port, taken);
        }
    };
    let out = Command::new(env!("CARGO_BIN_EXE_tickwire"))
        .args(["gateway", "--processes", "2", "--tcp", "127.0.0.1:0", "--ws", "127.0.0.1:0"])
        .args(["--metrics", &format!("127.0.0.1:{base}")])
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("metrics port {} for worker 1", base + 1)), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("listening on"), "no worker started");
}
