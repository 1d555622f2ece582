//! `tickwire ddc` killed with SIGKILL in the middle of concurrent uploads (raw blobs,
//! compressed buffers, refs that name them), then restarted on the same store: every write
//! that was acknowledged reads back byte for byte, and whatever was in flight is either absent
//! or whole (a served blob hashes to its id; a served ref is the exact object, finalized).
//! Once with the embedded metadata, once with it in PostgreSQL (`--refs`).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tickwire_ddc::IoHash;
use tickwire_ddc::cb::Value;
use tickwire_ddc::compressed::encode_none;

#[path = "../../ddc/tests/common/postgres.rs"]
mod postgres;

const NS: &str = "crash";

fn start(root: &std::path::Path, refs: Option<&str>) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tickwire"))
        .args(["ddc", "--dev-auth", "--listen", "127.0.0.1:0", "--root"])
        .arg(root)
        .args(refs.map(|url| ["--refs", url]).into_iter().flatten())
        .env_remove("TICKWIRE_DDC_REFS")
        .env_remove("TICKWIRE_DDC_BLOBS")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let base = loop {
        let line = lines.next().expect("the server printed its address").unwrap();
        if let Some(rest) = line.strip_prefix("listening on http://") {
            break format!("http://{}", rest.split('/').next().unwrap());
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (child, base)
}

/// What one upload was, and whether the server acknowledged it.
#[derive(Clone)]
enum Write {
    Blob { id: IoHash, bytes: Vec<u8> },
    Compressed { raw: IoHash, buffer: Vec<u8> },
    Ref { key: String, object: Vec<u8> },
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn send(base: &str, w: &Write) -> bool {
    let result = match w {
        Write::Blob { id, bytes } => ureq::put(&format!("{base}/api/v1/blobs/{NS}/{id}"))
            .set("Content-Type", "application/octet-stream")
            .send_bytes(bytes),
        Write::Compressed { raw, buffer } => ureq::put(&format!("{base}/api/v1/compressed-blobs/{NS}/{raw}"))
            .set("Content-Type", "application/x-ue-comp")
            .send_bytes(buffer),
        Write::Ref { key, object } => ureq::put(&format!("{base}/api/v1/refs/{NS}/bucket/{key}"))
            .set("Content-Type", "application/x-ue-cb")
            .set("X-Jupiter-IoHash", &IoHash::of(object).to_hex())
            .send_bytes(object),
    };
    // A ref PUT is acknowledged as finalized only with an empty `needs`.
    match (result, w) {
        (Ok(r), Write::Ref { .. }) => r.into_string().unwrap_or_default().contains("\"needs\":[]"),
        (Ok(r), _) => r.status() == 200,
        (Err(_), _) => false,
    }
}

fn get(base: &str, path: &str) -> Option<Vec<u8>> {
    let r = ureq::get(&format!("{base}{path}")).set("Accept", "*/*").call().ok()?;
    let mut out = Vec::new();
    r.into_reader().read_to_end(&mut out).unwrap();
    Some(out)
}

#[test]
fn acknowledged_writes_survive_sigkill_and_nothing_half_written_is_served() {
    survives_sigkill(None);
}

#[test]
fn with_the_metadata_in_postgres_too() {
    if let Some(url) = postgres::database() {
        survives_sigkill(Some(&url));
    }
}

/// A server that cannot reach its Postgres says so and exits, without printing the URL (it
/// may hold a password).
#[test]
fn an_unreachable_postgres_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("postgres://someone:secret@127.0.0.1:{port}/ddc");
    let out = Command::new(env!("CARGO_BIN_EXE_tickwire"))
        .args(["ddc", "--dev-auth", "--listen", "127.0.0.1:0", "--refs", &url, "--root"])
        .arg(dir.path())
        .env_remove("TICKWIRE_DDC_REFS")
        .env_remove("TICKWIRE_DDC_BLOBS")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("opening the Postgres metadata store (--refs)"), "{stderr}");
    assert!(!stderr.contains("secret"), "{stderr}");
}

fn survives_sigkill(refs: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, base) = start(dir.path(), refs);
    let stop = Arc::new(AtomicBool::new(false));
    // (write, acknowledged) for every upload attempted.
    let log: Arc<Mutex<Vec<(Write, bool)>>> = Arc::default();
    let workers: Vec<_> = (0..6u64)
        .map(|t| {
            let (base, stop, log) = (base.clone(), stop.clone(), log.clone());
            std::thread::spawn(move || {
                for i in 0u64.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let seed = t * 1_000_000 + i;
                    let len = 1 + (seed as usize * 7919) % (300 << 10);
                    let payload = bytes(seed, len);
                    // A blob, or a compressed buffer; then a ref naming it.
                    let first = if i % 2 == 0 {
                        Write::Blob { id: IoHash::of(&payload), bytes: payload.clone() }
                    } else {
                        Write::Compressed { raw: IoHash::of(&payload), buffer: encode_none(&payload) }
                    };
                    let acked = send(&base, &first);
                    log.lock().unwrap().push((first, acked));
                    if !acked {
                        continue;
                    }
                    let object = Value::Object(vec![
                        ("RawHash".into(), Value::BinaryAttachment(*IoHash::of(&payload).as_bytes())),
                        ("RawSize".into(), Value::Integer(len as i128)),
                    ])
                    .to_bytes();
                    let w = Write::Ref { key: IoHash::of(&seed.to_le_bytes()).to_hex(), object };
                    let acked = send(&base, &w);
                    log.lock().unwrap().push((w, acked));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    child.kill().unwrap(); // SIGKILL.
    child.wait().unwrap();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }

    let (mut child, base) = start(dir.path(), refs);
    let log = log.lock().unwrap().clone();
    let acked = log.iter().filter(|(_, a)| *a).count();
    assert!(acked > 50, "the load wrote something before the kill: {acked}");
    let (mut unacked_served, mut unacked_absent) = (0, 0);
    for (w, ack) in &log {
        let (path, want) = match w {
            Write::Blob { id, bytes } => (format!("/api/v1/blobs/{NS}/{id}"), bytes.clone()),
            Write::Compressed { raw, buffer } => {
                (format!("/api/v1/compressed-blobs/{NS}/{raw}"), buffer.clone())
            }
            Write::Ref { key, object } => (format!("/api/v1/refs/{NS}/bucket/{key}.uecb"), object.clone()),
        };
        match get(&base, &path) {
            Some(got) => {
                // Served: whole, acknowledged or not.
                assert!(got == want, "{path}: {} bytes served, {} written", got.len(), want.len());
                if !ack {
                    unacked_served += 1;
                }
            }
            None => {
                assert!(!ack, "{path} was acknowledged but is gone after the crash");
                unacked_absent += 1;
            }
        }
    }
    let tmp = std::fs::read_dir(dir.path().join(".tmp")).unwrap().count();
    assert_eq!(tmp, 0, "the restart removed the half-written temp files");
    eprintln!(
        "{acked} acknowledged writes all read back; unacknowledged: {unacked_served} whole, {unacked_absent} absent"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}
