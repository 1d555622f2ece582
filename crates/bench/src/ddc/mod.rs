//! `tickwire bench ddc`: workload B4, the Cloud DDC benchmark suite (vegeta driven by a Python
//! seeder; `ddc-http-api.md` section 8), re-run against `tickwire ddc`.
//!
//! Each test seeds its data once (every seed request must succeed), then sends one kind of
//! request at a fixed rate for a fixed time (or, with `--mode closed`, from N workers back to
//! back). Every answer is verified (blob bodies by hash, packages entry by entry), and its
//! latency counts from when it was due. The server is a child `tickwire ddc` on loopback with
//! a fresh store and a bearer token, unless `--target` names one.

mod data;
mod load;
mod report;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use hyper::Method;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tickwire_ddc::IoHash;

use crate::machine::{Machine, ProcSample};
use crate::server::ChildServer;
use data::Blob;
use load::{Call, Chunks, Client, Expect, Pace, RunLimits};
pub use report::{DdcReport, TestResult};

/// Flags of `tickwire bench ddc`.
#[derive(Debug, Clone, clap::Args)]
pub struct DdcArgs {
    /// Tests to run, comma-separated, or `all`; `report` runs only the ten in the report's
    /// table. Names: healthcheck_ready, healthcheck_live, small_blob_uploads,
    /// small_blob_downloads, large_blob_uploads, large_blob_download, refs_raw_upload,
    /// refs_raw_download, uecb_upload, uecb_download, uecb_pkg_download, game_upload,
    /// game_download.
    #[arg(long, default_value = "report")]
    pub tests: String,
    /// Length of every test (default: the report's, 15 s to 120 s per test).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Requests per second of every test (default: the report's; 50/s where it sets none).
    #[arg(long)]
    pub rate: Option<f64>,
    /// `open`: fixed rate, latency from each request's due time (vegeta's model). `closed`:
    /// `--workers` requests back to back, latency from sending.
    #[arg(long, value_enum, default_value_t = Mode::Open)]
    pub mode: Mode,
    /// Closed loop: requests in flight.
    #[arg(long, default_value_t = 64)]
    pub workers: usize,
    /// Open loop: most requests in flight; a due request waits for a slot, and the wait
    /// counts in its latency.
    #[arg(long, default_value_t = 1024)]
    pub max_in_flight: usize,
    /// Per-request timeout; a request past it is a failure.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// A running DDC to test (e.g. `http://127.0.0.1:8080`) instead of a child `tickwire ddc`.
    #[arg(long)]
    pub target: Option<String>,
    /// Bearer token sent with every request (with `--target`; the child server gets its own).
    #[arg(long)]
    pub token: Option<String>,
    /// Let `--target` be a server beyond this machine (one of your own).
    #[arg(long)]
    pub allow_remote: bool,
    /// Namespace of the test data.
    #[arg(long, default_value = "bench.ddc")]
    pub namespace: String,
    /// Write the results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write charts (SVG) of the latencies beside the report's into this directory.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Upload tests send new content every time (an 8-byte prefix before a seeded payload) to
    /// new keys, so each one is written and fsynced. By default they re-send the seeded data,
    /// as the report's suite does, which the server only hashes ("already have it").
    #[arg(long)]
    pub fresh_uploads: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Open,
    Closed,
}

/// The data a test needs seeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum DataSet {
    None,
    Small,
    Large,
    RefsRaw,
    Uecb,
    Game,
}

/// One test of the suite.
#[derive(Debug, Clone, Copy)]
struct Test {
    name: &'static str,
    data: DataSet,
    /// The report's rate, if it sets one.
    rate: Option<f64>,
    duration: Duration,
    /// The report's p50 and p95, ms, if the test is in its table.
    anchor: Option<(f64, f64)>,
}

const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// The suite, in the report's order, with its rates, durations and figures.
const TESTS: [Test; 13] = [
    Test {
        name: "healthcheck_ready",
        data: DataSet::None,
        rate: None,
        duration: secs(15),
        anchor: Some((1.3, 1.8)),
    },
    Test { name: "healthcheck_live", data: DataSet::None, rate: None, duration: secs(15), anchor: None },
    Test { name: "uecb_upload", data: DataSet::Uecb, rate: None, duration: secs(15), anchor: None },
    Test {
        name: "uecb_download",
        data: DataSet::Uecb,
        rate: None,
        duration: secs(15),
        anchor: Some((1.5, 2.0)),
    },
    Test {
        name: "small_blob_uploads",
        data: DataSet::Small,
        rate: Some(100.0),
        duration: secs(60),
        anchor: Some((6.6, 13.0)),
    },
    Test {
        name: "small_blob_downloads",
        data: DataSet::Small,
        rate: Some(100.0),
        duration: secs(60),
        anchor: Some((2.1, 3.0)),
    },
    Test {
        name: "large_blob_uploads",
        data: DataSet::Large,
        rate: Some(10.0),
        duration: secs(60),
        anchor: Some((470.0, 880.0)),
    },
    Test {
        name: "large_blob_download",
        data: DataSet::Large,
        rate: Some(10.0),
        duration: secs(60),
        anchor: Some((34.4, 38.8)),
    },
    Test { name: "refs_raw_upload", data: DataSet::RefsRaw, rate: None, duration: secs(15), anchor: None },
    Test {
        name: "refs_raw_download",
        data: DataSet::RefsRaw,
        rate: None,
        duration: secs(15),
        anchor: Some((5.7, 7.0)),
    },
    Test {
        name: "uecb_pkg_download",
        data: DataSet::Uecb,
        rate: None,
        duration: secs(15),
        anchor: Some((4.9, 5.6)),
    },
    Test {
        name: "game_download",
        data: DataSet::Game,
        rate: None,
        duration: secs(120),
        anchor: Some((3.4, 129.0)),
    },
    Test {
        name: "game_upload",
        data: DataSet::Game,
        rate: None,
        duration: secs(120),
        anchor: Some((42.2, 88.0)),
    },
];

/// The rate where the report sets none (vegeta's default is 50/s).
const DEFAULT_RATE: f64 = 50.0;

fn select(tests: &str) -> anyhow::Result<Vec<Test>> {
    match tests {
        "all" => return Ok(TESTS.to_vec()),
        "report" => return Ok(TESTS.iter().filter(|t| t.anchor.is_some()).copied().collect()),
        _ => {}
    }
    tests
        .split(',')
        .map(|name| {
            let name = name.trim().replace('-', "_");
            TESTS.iter().find(|t| t.name == name).copied().with_context(|| format!("no test named {name:?}"))
        })
        .collect()
}

/// Seeded data: blobs, and for ref tests, the ref key (and object) of each.
struct Seeded {
    blobs: Vec<Blob>,
    keys: Vec<String>,
    /// Ref tests with objects: each blob's single-field object.
    objects: Vec<Bytes>,
}

/// The server under test and how to reach it.
struct Target {
    base: String,
    token: String,
    ns: String,
    _child: Option<ChildServer>,
    _root: Option<tempfile::TempDir>,
    pid: Option<u32>,
}

impl Target {
    fn start(args: &DdcArgs) -> anyhow::Result<Target> {
        if let Some(url) = &args.target {
            return Ok(Target {
                base: url.trim_end_matches('/').to_owned(),
                token: args.token.clone().unwrap_or_default(),
                ns: args.namespace.clone(),
                _child: None,
                _root: None,
                pid: None,
            });
        }
        let root =
            tempfile::Builder::new().prefix("tickwire-bench-ddc").tempdir().context("a temp directory")?;
        let token = format!("bench-{}", IoHash::of(root.path().to_string_lossy().as_bytes()).to_hex());
        let tokens = root.path().join("tokens.toml");
        std::fs::write(
            &tokens,
            format!(
                "[[tokens]]\ntoken = \"{token}\"\nnamespaces = [\"*\"]\nactions = [\"ReadObject\", \"WriteObject\", \"DeleteObject\"]\n"
            ),
        )?;
        let store = root.path().join("store");
        let args_list: Vec<String> = vec![
            "ddc".into(),
            "--root".into(),
            store.display().to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--tokens".into(),
            tokens.display().to_string(),
            "--max-connections".into(),
            "4096".into(),
            // Every connection of the load comes from one address.
            "--max-connections-per-address".into(),
            "4096".into(),
        ];
        let (child, rest) = ChildServer::start(&args_list, "http://")?;
        let addr = rest.split('/').next().unwrap_or_default().to_owned();
        Ok(Target {
            base: format!("http://{addr}"),
            token,
            ns: args.namespace.clone(),
            pid: Some(child.pid()),
            _child: Some(child),
            _root: Some(root),
        })
    }

    fn call(
        &self,
        method: Method,
        path: &str,
        headers: &[(&'static str, String)],
        body: Chunks,
        expect: Expect,
    ) -> Call {
        let mut all = vec![("authorization", format!("Bearer {}", self.token))];
        all.extend_from_slice(headers);
        Call { method, url: format!("{}{path}", self.base), headers: all, body, expect }
    }

    fn blob_path(&self, id: &IoHash) -> String {
        format!("/api/v1/blobs/{}/{}", self.ns, id.to_hex())
    }

    fn ref_path(&self, key: &str) -> String {
        format!("/api/v1/refs/{}/default/{key}", self.ns)
    }

    fn put_blob(&self, blob: &Blob) -> Call {
        let octet = [("content-type", "application/octet-stream".to_owned())];
        self.call(Method::PUT, &self.blob_path(&blob.id), &octet, blob.body(), Expect::Status)
    }

    fn put_raw_ref(&self, key: &str, blob: &Blob) -> Call {
        let headers =
            [("content-type", "application/octet-stream".to_owned()), ("x-jupiter-iohash", blob.id.to_hex())];
        self.call(Method::PUT, &self.ref_path(key), &headers, blob.body(), Expect::Status)
    }

    fn put_object_ref(&self, key: &str, object: &Bytes) -> Call {
        let headers = [
            ("content-type", "application/x-ue-cb".to_owned()),
            ("x-jupiter-iohash", IoHash::of(object).to_hex()),
        ];
        self.call(Method::PUT, &self.ref_path(key), &headers, object.clone().into(), Expect::Status)
    }
}

/// Creates a data set on the server: every request must succeed.
async fn seed(client: &Client, target: &Target, set: DataSet, timeout: Duration) -> anyhow::Result<Seeded> {
    let (seed, count, size): (u64, usize, fn(&mut rand::rngs::StdRng) -> usize) = match set {
        DataSet::None => return Ok(Seeded { blobs: vec![], keys: vec![], objects: vec![] }),
        DataSet::Small => (1, 100, |_| 64 << 10),
        DataSet::Large => (2, 100, |_| 20 << 20),
        DataSet::RefsRaw => (3, 50, |_| 2 << 20),
        DataSet::Uecb => (4, 10, |_| 2 << 20),
        DataSet::Game => (5, 1000, data::game_asset_size),
    };
    let blobs = tokio::task::spawn_blocking(move || data::blobs(seed, count, size)).await?;
    let keys: Vec<String> = blobs.iter().map(|b| data::ref_key(&b.id)).collect();
    let objects: Vec<Bytes> = blobs.iter().map(|b| Bytes::from(data::single_field_object(&b.id))).collect();
    let calls = blobs
        .iter()
        .zip(&keys)
        .map(
            |(blob, key)| {
                if set == DataSet::RefsRaw { target.put_raw_ref(key, blob) } else { target.put_blob(blob) }
            },
        )
        .collect();
    run_all(client, calls, timeout).await.context("seeding blobs")?;
    if matches!(set, DataSet::Uecb | DataSet::Game) {
        let refs = keys.iter().zip(&objects).map(|(k, o)| target.put_object_ref(k, o)).collect();
        run_all(client, refs, timeout).await.context("seeding refs")?;
    }
    Ok(Seeded { blobs, keys, objects })
}

/// Runs calls eight at a time; the first failure ends it.
async fn run_all(client: &Client, calls: Vec<Call>, timeout: Duration) -> anyhow::Result<()> {
    let mut pending = calls.into_iter();
    loop {
        let batch: Vec<Call> = pending.by_ref().take(8).collect();
        if batch.is_empty() {
            return Ok(());
        }
        let handles: Vec<_> = batch
            .into_iter()
            .map(|call| {
                let client = client.clone();
                tokio::spawn(async move { (load::execute(&client, &call, timeout).await, call.url) })
            })
            .collect();
        for h in handles {
            let (result, url) = h.await?;
            if let Err(e) = result {
                bail!("{url}: {e}");
            }
        }
    }
}

/// Request `i`'s fresh version of a seeded blob: an 8-byte prefix (the run and `i`) before it.
fn fresh(blob: &Blob, run: u64, i: u64) -> Blob {
    let prefix = Bytes::from((run ^ i.rotate_left(32)).to_le_bytes().to_vec());
    let mut hasher = blake3::Hasher::new();
    hasher.update(&prefix);
    hasher.update(&blob.bytes);
    Blob { id: IoHash::from_hasher(&hasher), bytes: blob.bytes.clone(), prefix }
}

/// The measured request of a test, for request `i`.
fn measured(
    test: &Test,
    target: &Arc<Target>,
    data: &Arc<Seeded>,
    fresh_uploads: bool,
) -> Arc<dyn Fn(u64) -> Call + Send + Sync> {
    let (t, d) = (target.clone(), data.clone());
    let n = data.blobs.len().max(1);
    let pick = move |i: u64| (i as usize) % n;
    // Distinct per run, so a second run against the same --target writes new data too.
    let run =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos()
            as u64;
    if fresh_uploads {
        match test.name {
            "small_blob_uploads" | "large_blob_uploads" => {
                return Arc::new(move |i| t.put_blob(&fresh(&d.blobs[pick(i)], run, i)));
            }
            "refs_raw_upload" => {
                return Arc::new(move |i| {
                    let blob = fresh(&d.blobs[pick(i)], run, i);
                    t.put_raw_ref(&data::ref_key(&blob.id), &blob)
                });
            }
            "uecb_upload" | "game_upload" => {
                return Arc::new(move |i| {
                    let key = IoHash::of(format!("fresh-{run}-{i}").as_bytes()).to_hex();
                    t.put_object_ref(&key, &d.objects[pick(i)])
                });
            }
            _ => {}
        }
    }
    match test.name {
        "healthcheck_ready" | "healthcheck_live" => {
            let path = if test.name == "healthcheck_ready" { "/health/ready" } else { "/health/live" };
            let healthy = IoHash::of(b"Healthy");
            Arc::new(move |_| t.call(Method::GET, path, &[], Chunks::default(), Expect::BodyHash(healthy)))
        }
        "small_blob_uploads" | "large_blob_uploads" => Arc::new(move |i| t.put_blob(&d.blobs[pick(i)])),
        "small_blob_downloads" | "large_blob_download" => Arc::new(move |i| {
            let id = d.blobs[pick(i)].id;
            t.call(Method::GET, &t.blob_path(&id), &[], Chunks::default(), Expect::BodyHash(id))
        }),
        "refs_raw_upload" => Arc::new(move |i| t.put_raw_ref(&d.keys[pick(i)], &d.blobs[pick(i)])),
        "refs_raw_download" => Arc::new(move |i| {
            let path = format!("{}.raw", t.ref_path(&d.keys[pick(i)]));
            t.call(Method::GET, &path, &[], Chunks::default(), Expect::BodyHash(d.blobs[pick(i)].id))
        }),
        "uecb_upload" | "game_upload" => {
            Arc::new(move |i| t.put_object_ref(&d.keys[pick(i)], &d.objects[pick(i)]))
        }
        "uecb_download" => Arc::new(move |i| {
            let path = format!("{}.uecb", t.ref_path(&d.keys[pick(i)]));
            t.call(
                Method::GET,
                &path,
                &[],
                Chunks::default(),
                Expect::BodyHash(IoHash::of(&d.objects[pick(i)])),
            )
        }),
        _ => Arc::new(move |i| {
            // uecb_pkg_download, game_download: the object and its one raw attachment.
            let path = format!("{}.uecbpkg", t.ref_path(&d.keys[pick(i)]));
            let expect =
                Expect::Package { root: IoHash::of(&d.objects[pick(i)]), attachment: d.blobs[pick(i)].id };
            t.call(Method::GET, &path, &[], Chunks::default(), expect)
        }),
    }
}

/// Runs the selected tests and reports them. Ctrl-C stops the run: the finished tests are
/// printed and written (marked incomplete), and the command fails.
pub async fn run(args: DdcArgs) -> anyhow::Result<DdcReport> {
    let tests = select(&args.tests)?;
    anyhow::ensure!(
        args.workers > 0 && args.max_in_flight > 0,
        "--workers and --max-in-flight must be positive"
    );
    let machine = Machine::detect();
    if let Some(url) = &args.target {
        let uri: hyper::Uri = url.parse().with_context(|| format!("--target {url}: not a URL"))?;
        let host = uri.host().with_context(|| format!("--target {url}: no host"))?;
        let port = uri.port_u16().unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
        crate::loopback::require_loopback(host, port, args.allow_remote).await?;
    }
    let target = Arc::new(Target::start(&args)?);
    let client = load::client();
    println!("tickwire bench ddc: {} tests against {} ({})", tests.len(), target.base, machine.line());
    let mut report = DdcReport { machine, mode: args.mode, incomplete: false, tests: Vec::new() };
    let work = async {
        let mut seeded: Option<(DataSet, Arc<Seeded>)> = None;
        for test in &tests {
            let data = match &seeded {
                Some((set, data)) if *set == test.data => data.clone(),
                _ => {
                    drop(seeded.take()); // Free the previous set first: the large one is 2 GiB.
                    let spinner =
                        ProgressBar::new_spinner().with_message(format!("seeding for {}", test.name));
                    spinner.enable_steady_tick(Duration::from_millis(200));
                    let data = Arc::new(seed(&client, &target, test.data, args.timeout).await?);
                    spinner.finish_and_clear();
                    seeded = Some((test.data, data.clone()));
                    data
                }
            };
            let result = run_test(&args, test, &client, &target, &data).await;
            report::print_row(&result);
            report.tests.push(result);
        }
        anyhow::Ok(())
    };
    report.incomplete = crate::interrupt::until_interrupted(work).await?;
    if report.incomplete {
        eprintln!("interrupted: {} of {} tests finished", report.tests.len(), tests.len());
    }
    report::print_footer(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    if let Some(dir) = &args.plot {
        crate::plot::ddc(dir, &report)?;
        println!("wrote {}", dir.join("ddc-latency.svg").display());
    }
    if report.incomplete {
        bail!("interrupted before the last test");
    }
    Ok(report)
}

async fn run_test(
    args: &DdcArgs,
    test: &Test,
    client: &Client,
    target: &Arc<Target>,
    data: &Arc<Seeded>,
) -> TestResult {
    let duration = args.duration.unwrap_or(test.duration);
    let rate = args.rate.or(test.rate).unwrap_or(DEFAULT_RATE);
    let pace = match args.mode {
        Mode::Open => Pace::Open { rate },
        Mode::Closed => Pace::Closed { workers: args.workers },
    };
    let limits = RunLimits { duration, max_in_flight: args.max_in_flight, timeout: args.timeout };
    let bar = ProgressBar::new(duration.as_secs().max(1)).with_message(test.name);
    bar.set_style(
        ProgressStyle::with_template("{msg:22} [{bar:30}] {pos}/{len} s")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let before = target.pid.and_then(ProcSample::read);
    let tally = load::run(client, pace, limits, measured(test, target, data, args.fresh_uploads), &bar).await;
    bar.finish_and_clear();
    let server_cpu_pct = match (before, target.pid.and_then(ProcSample::read)) {
        (Some(a), Some(b)) => Some(b.cpu_pct_since(&a)),
        _ => None,
    };
    TestResult::new(test.name, test.anchor, args.mode, rate, duration, &tally, server_cpu_pct)
}
