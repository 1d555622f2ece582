//! Ctrl-C on every bench, as a user would press it: each bench runs as a child process and gets
//! SIGINT once its first step (test, suite) has finished. It must stop the load and the
//! processes it started, print and write what finished (the JSON marked incomplete), and fail.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// When the first step has finished.
enum FirstStep {
    /// A line of the bench's output says so.
    Printed(fn(&str) -> bool),
    /// A file appears (named from the bench's pid).
    File(fn(u32) -> std::path::PathBuf),
}

/// Runs `tickwire args… --json FILE`, sends SIGINT once its first step has finished, and
/// returns its output and the JSON.
fn interrupt(args: &[&str], first_step: FirstStep) -> (String, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tickwire"))
        .args(args)
        .arg("--json")
        .arg(&json)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = String::new();
    let started = Instant::now();
    match first_step {
        FirstStep::Printed(done) => loop {
            let line = lines
                .recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|_| panic!("no finished step within 120 s:\n{seen}"));
            seen.push_str(&line);
            seen.push('\n');
            if done(&line) {
                break;
            }
        },
        FirstStep::File(path) => {
            let path = path(child.id());
            while !path.exists() {
                assert!(started.elapsed() < Duration::from_secs(120), "no {} within 120 s", path.display());
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    let children = children_of(child.id());
    assert!(started.elapsed() < Duration::from_secs(120));
    // SAFETY: a plain kill(2) of our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let status = wait(&mut child, Duration::from_secs(60));
    reader.join().unwrap();
    seen.extend(lines.try_iter().map(|l| l + "\n"));
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "an interrupted bench must fail\n{seen}{stderr}");
    assert!(stderr.contains("interrupted"), "it says so: {stderr}");
    for pid in children {
        assert!(!alive(pid), "child process {pid} outlived the interrupted bench");
    }
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the JSON is written")).unwrap();
    assert_eq!(report["incomplete"], true, "the JSON is marked incomplete");
    assert!(seen.contains("wrote "), "{seen}");
    (seen, report)
}

fn wait(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the bench did not stop within {limit:?} of Ctrl-C");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The processes whose parent is `pid` (from /proc).
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else { continue };
        // "pid (comm) state ppid …": comm may hold spaces, so split after its last ')'.
        let rest = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
        if rest.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok()) == Some(pid) {
            out.push(child);
        }
    }
    out
}

/// Whether `pid` still runs (a zombie, or no process at all, is not running).
fn alive(pid: u32) -> bool {
    // The orphan of an exited parent is reaped by init; give that a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let running = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s[s.rfind(')')? + 1..].split_whitespace().next().map(|st| st != "Z" && st != "X"))
            .unwrap_or(false);
        if !running || Instant::now() > deadline {
            return running;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A table row of a step with `clients` clients (a line that starts with that count, in a
/// plain or a Markdown table).
fn row_of(line: &str, clients: &str) -> bool {
    let mut cells = line.split(|c: char| c == '|' || c.is_whitespace()).filter(|c| !c.is_empty());
    cells.next() == Some(clients) && cells.count() > 5
}

#[test]
fn ctrl_c_stops_bench_pingpong_and_keeps_the_finished_steps() {
    let (out, report) = interrupt(
        &["bench", "pingpong", "--clients", "20,21,22,23,24,25", "--duration", "2s"],
        FirstStep::Printed(|l| row_of(l, "20")),
    );
    let steps = report["steps"].as_array().unwrap();
    assert!(!steps.is_empty() && steps.len() < 6, "{out}");
    assert_eq!(steps[0]["clients"], 20);
}

#[test]
fn ctrl_c_stops_bench_replication_and_keeps_the_finished_steps() {
    let (out, report) = interrupt(
        &["bench", "replication", "--clients", "20,21,22,23,24", "--step-hold", "2s", "--keep-going"],
        FirstStep::Printed(|l| row_of(l, "20")),
    );
    let steps = report["steps"].as_array().unwrap();
    assert!(!steps.is_empty() && steps.len() < 5, "{out}");
    assert_eq!(steps[0]["clients"], 20);
}

#[test]
fn ctrl_c_stops_bench_replication_with_bot_processes_and_its_workers() {
    let (out, report) = interrupt(
        &[
            "bench",
            "replication",
            "--clients",
            "20,21,22,23,24",
            "--step-hold",
            "2s",
            "--keep-going",
            "--bot-processes",
            "2",
        ],
        FirstStep::Printed(|l| row_of(l, "20")),
    );
    let steps = report["steps"].as_array().unwrap();
    assert!(!steps.is_empty() && steps.len() < 5, "{out}");
    assert_eq!(steps[0]["bot_processes"], 2);
}

#[test]
fn ctrl_c_stops_bench_ddc_and_keeps_the_finished_tests() {
    let (out, report) = interrupt(
        &[
            "bench",
            "ddc",
            "--tests",
            "healthcheck_ready,small_blob_uploads,small_blob_downloads,refs_raw_download",
            "--duration",
            "3s",
            "--rate",
            "20",
        ],
        FirstStep::Printed(|l| l.contains("healthcheck_ready")),
    );
    let tests = report["tests"].as_array().unwrap();
    assert!(!tests.is_empty() && tests.len() < 4, "{out}");
    assert_eq!(tests[0]["name"], "healthcheck_ready");
}

#[test]
fn ctrl_c_stops_bench_sync_report_grid_and_keeps_the_finished_suites() {
    // The grid prints nothing until its end (the progress bar is for terminals only). Each
    // suite is a child process that writes its JSON in the grid's directory: once the second
    // one's file exists, the first has been read.
    let (out, report) = interrupt(
        &["bench", "sync", "--suite", "report", "--iterations", "3000", "--warmup", "2"],
        FirstStep::File(|pid| std::env::temp_dir().join(format!("tickwire-bench-sync-{pid}/suite-1.json"))),
    );
    let suites = report["suites"].as_array().unwrap();
    assert!(suites.len() >= 2 && suites.len() < 48, "{out}");
}
