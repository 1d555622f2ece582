//! `tickwire bench pingpong --server floor`, run as a user runs it: the bare responder must
//! speak enough of the protocol for the unchanged load generator (handshake, echo answers,
//! heartbeat answers) across two responder processes sharing one port, so that its figures are
//! a floor for the same workload and not a different one.

use std::process::Command;

/// Runs `tickwire bench pingpong --server floor ARGS --json FILE`; returns its exit status,
/// its output and the JSON it wrote.
fn run_floor(args: &[&str]) -> (bool, String, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let out = Command::new(env!("CARGO_BIN_EXE_tickwire"))
        .args(["bench", "pingpong", "--server", "floor"])
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let report = match std::fs::read(&json) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap(),
        Err(e) => panic!("no JSON written ({e}):\n{text}"),
    };
    (out.status.success(), text, report)
}

#[test]
fn the_floor_responder_holds_a_step_of_the_unchanged_load_generator() {
    // Requests every 20 ms: 40 clients × 50 requests/s over a 3 s hold, two responder
    // processes. (At 200 ms the responders' CPU over the hold could stay under the kernel's
    // 10 ms accounting tick and read as 0, which failed the CPU check below once.)
    let (ok, text, report) = run_floor(&[
        "--gateway-processes",
        "2",
        "--clients",
        "40",
        "--interval",
        "20ms",
        "--heartbeat",
        "500ms",
        "--duration",
        "3s",
    ]);
    assert!(ok, "the bench failed:\n{text}");
    assert_eq!(report["server"], "floor");
    let step = &report["steps"][0];
    assert_eq!(step["held"], true, "{}", step["hold"]);
    assert_eq!(step["connected"], 40);
    assert!(step["requests"].as_u64().unwrap() >= 5_000, "{step}");
    assert_eq!(step["lost"], 0);
    assert_eq!(step["bad_answers"], 0);
    // Both responder processes are children of the one the bench started: their CPU counts.
    assert!(step["server_cpu_pct"].as_f64().unwrap() > 0.0, "{step}");
}

#[test]
fn idle_clients_of_the_floor_only_heartbeat_and_are_not_dropped() {
    // Requests an hour apart: the clients only heartbeat (every 300 ms); a responder that did
    // not answer them would see each client drop its link after 600 ms, which counts as an
    // error. (The step need not hold: most likely no request falls in the hold.)
    let (_, text, report) = run_floor(&[
        "--max-p99",
        "1h",
        "--clients",
        "30",
        "--interval",
        "3600s",
        "--heartbeat",
        "300ms",
        "--duration",
        "2s",
    ]);
    let step = &report["steps"][0];
    assert_eq!(step["connected"], 30, "{text}");
    assert_eq!(step["errors"], 0, "{text}");
    // What the clients read is heartbeat answers (6-byte frames): 30 clients every 300 ms make
    // 600 B/s; a responder that stayed silent after the Welcome would show 0.
    assert!(step["bytes_out_per_s"].as_f64().unwrap() > 300.0, "{step}");
}
