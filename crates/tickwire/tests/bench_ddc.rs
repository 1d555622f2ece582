//! `tickwire bench ddc` end to end, small: a child `tickwire ddc`, seeded data, every answer
//! verified, and the JSON report carrying what the issue asks of it.

use std::process::Command;

#[test]
fn bench_ddc_runs_verifies_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("ddc.json");
    let out = Command::new(env!("CARGO_BIN_EXE_tickwire"))
        .args(["bench", "ddc", "--tests", "healthcheck_ready,small_blob_uploads,small_blob_downloads,refs_raw_download,uecb_download,uecb_pkg_download"])
        .args(["--duration", "1s", "--rate", "20", "--json"])
        .arg(&json)
        .args(["--plot"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert!(report["machine"]["cores"].as_u64().unwrap() >= 1);
    let tests = report["tests"].as_array().unwrap();
    assert_eq!(tests.len(), 6);
    for t in tests {
        let name = t["name"].as_str().unwrap();
        // 20/s for 1 s: every request sent, answered and verified.
        assert_eq!(t["requests"], 20, "{name}");
        assert_eq!(t["success_ratio"], 1.0, "{name}: {}", t["errors"]);
        let l = &t["latency_ms"];
        let (p50, p95, p99, max) = (
            l["p50"].as_f64().unwrap(),
            l["p95"].as_f64().unwrap(),
            l["p99"].as_f64().unwrap(),
            l["max"].as_f64().unwrap(),
        );
        assert!(0.0 < p50 && p50 <= p95 && p95 <= p99 && p99 <= max, "{name}: {l}");
        assert!(t["throughput_per_s"].as_f64().unwrap() > 0.0);
    }
    assert!(
        tests.iter().any(|t| t["bytes_per_s"].as_f64().unwrap() > 1e6),
        "the 2 MiB downloads move megabytes"
    );
    assert!(std::fs::read_to_string(dir.path().join("ddc-latency.svg")).unwrap().contains("<svg"));
    assert!(stdout.contains("small_blob_downloads"), "{stdout}");
}
