//! The `tickwire` command line: parses flags, sets up logging and the runtime, and hands over
//! to the library crates. Errors end up here as `anyhow` reports.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tickwire_ddc::pace::MinRate;
use tickwire_gateway::LISTENING_PREFIX;
use tickwire_gateway::{Gateway, GatewayConfig, WorkerSet};

mod supervisor;
mod web;

/// How long sessions get to hear the shutdown reason before the process exits.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

#[derive(Parser)]
#[command(
    name = "tickwire",
    version,
    about = "A backend for multiplayer games: real-time gateway and benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the real-time gateway.
    ///
    /// Auth is chosen by `auth.mode` in the config (or `--set auth.mode=...`): `dev` (the
    /// default: anyone may connect, the Hello token becomes the player id, and a token
    /// `server:NAME` logs in as a game server) or `jwt` (the token must be a JWT signed with
    /// `auth.jwt_secret` (HS256) or `auth.jwt_public_key_file` (RS256); its `sub` is the player id
    /// and a `role` claim of `server` makes a game server). See docs/protocol.md section 4.
    Gateway(GatewayArgs),
    /// See it all work: a gateway, a simulated game server and bots, with a live summary.
    Demo(DemoArgs),
    /// The derived-data cache (Unreal Cloud DDC's blob API so far), on embedded storage.
    Ddc(DdcArgs),
    /// Re-run a reference benchmark against tickwire.
    Bench {
        #[command(subcommand)]
        bench: Bench,
    },
}

#[derive(clap::Args)]
struct GatewayArgs {
    /// TOML config file (see deploy/tickwire.toml).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Override any config key, e.g. --set session.heartbeat=1s (repeatable; applied last).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// TCP listen address (repeatable); replaces listen.tcp.
    #[arg(long)]
    tcp: Vec<String>,
    /// WebSocket listen address (repeatable); replaces listen.ws.
    #[arg(long)]
    ws: Vec<String>,
    /// Session heartbeat; replaces session.heartbeat.
    #[arg(long)]
    heartbeat: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics; replaces metrics.listen.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Serve the live web view at http://ADDR/: a map of the characters of the global channel
    /// (or, with [spatial], of every cell) and the gateway's figures. Needs a WebSocket
    /// listener; not with --processes.
    #[arg(long, value_name = "ADDR")]
    web: Option<String>,
    /// I/O threads per process, one single-threaded runtime each (default: cores / processes).
    #[arg(long)]
    threads: Option<usize>,
    /// Worker processes sharing the ports; resumes are routed to the process that owns the
    /// session. Use it when one process cannot hold enough connections (its open-file limit).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=64))]
    processes: u8,
    /// Internal: this process is worker INDEX of --workers (started by --processes).
    #[arg(long, hide = true, requires_all = ["workers", "handoff_dir"])]
    worker: Option<u8>,
    #[arg(long, hide = true)]
    workers: Option<u8>,
    #[arg(long, hide = true)]
    handoff_dir: Option<PathBuf>,
}

#[derive(clap::Args)]
struct DemoArgs {
    /// `single`: one game server owns the world channel. `spatial`: nine spatial servers share a
    /// 300 m world and hand characters over as they walk. `lod`: one spatial server, and each
    /// bot sees every cell, the far ones less often (level of detail).
    #[arg(long, value_enum, default_value_t = tickwire_bench::replication::Scenario::Single)]
    scenario: tickwire_bench::replication::Scenario,
    /// Simulated players.
    #[arg(long, default_value_t = 50)]
    bots: usize,
    /// Stop after this long (default: run until Ctrl-C).
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Gateway TCP address (clients can connect to it while the demo runs).
    #[arg(long, default_value = "127.0.0.1:7400")]
    tcp: String,
    /// Gateway WebSocket address.
    #[arg(long, default_value = "127.0.0.1:7401")]
    ws: String,
    /// Prometheus endpoint (`off` to disable).
    #[arg(long, default_value = "127.0.0.1:9400")]
    metrics: String,
    /// The live web view: open http://ADDR/ in a browser (`off` to disable).
    #[arg(long, default_value = "127.0.0.1:7480")]
    web: String,
}

#[derive(clap::Args)]
struct DdcArgs {
    /// Where blobs (files) and metadata (`.meta/ddc.sqlite`) are stored; with --blobs, where
    /// uploads are staged.
    #[arg(long, default_value = "tickwire-ddc-data")]
    root: PathBuf,
    /// Keep blobs in S3 (or an S3-compatible store) instead of under --root:
    /// `s3://BUCKET[/PREFIX]`. The endpoint, region and credentials come from the usual
    /// `AWS_*` variables (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, ...). With --refs too, several servers can serve one cache
    /// (all on one metadata store: garbage collection removes what its refs do not name).
    #[arg(long, value_name = "URL", env = "TICKWIRE_DDC_BLOBS")]
    blobs: Option<String>,
    /// With --blobs: the most MiB of blobs kept under --root/.cache to read without asking the
    /// bucket (least recently used go first); 0 for none.
    #[arg(long, default_value_t = 10240)]
    blob_cache_mib: u64,
    /// Keep refs, content ids and namespaces in PostgreSQL instead of `ROOT/.meta/ddc.sqlite`:
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DB` (or libpq's `key=value` form). Its tables are
    /// created if absent; one server per database, unless every server on it keeps its blobs
    /// in S3 (--blobs). TLS as libpq's `sslmode` and `sslrootcert` say (default `prefer`; use
    /// `sslmode=verify-full&sslrootcert=CA.pem` across a network; docs/ddc.md). A URL with a
    /// password belongs in the environment variable, not on the command line, where every local
    /// user can read it.
    #[arg(long, value_name = "URL", env = "TICKWIRE_DDC_REFS", hide_env_values = true)]
    refs: Option<String>,
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: std::net::SocketAddr,
    /// Bearer tokens and their grants: TOML `[[tokens]]` (token, namespaces, actions) and/or a
    /// `[jwt]` key set with scopes (see docs/ddc.md).
    #[arg(long, conflicts_with = "dev_auth")]
    tokens: Option<PathBuf>,
    /// No auth at all: anyone may read, write and delete. For a local try-out only.
    #[arg(long)]
    dev_auth: bool,
    /// Largest blob accepted, in MiB (raw blobs stream to disk).
    #[arg(long, default_value_t = 1024)]
    max_blob_mib: u64,
    /// Largest body checked whole in memory (compressed buffers, compact-binary objects,
    /// packages, batches), in MiB.
    #[arg(long, default_value_t = 256)]
    max_buffered_mib: u64,
    /// Memory all such bodies may hold at once, in MiB; past it, requests get 429 (which the
    /// editor retries).
    #[arg(long, default_value_t = 1024)]
    memory_budget_mib: u64,
    /// Connections open at once; more get 503 and are closed (over TLS, closed).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// Connections one client address may hold open at once; more get 503 and are closed
    /// (over TLS, closed). Editors behind one NAT share an address: raise it for a large
    /// office; behind a reverse proxy every client has the proxy's address: set it to
    /// --max-connections.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections_per_address: u32,
    /// What one client address is for an IPv6 client in --max-connections-per-address: its
    /// first this many bits (64, the block a site is usually given; 128, each address apart).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u8).range(0..=128))]
    ipv6_prefix: u8,
    /// How long a connection (HTTP/1.1 or HTTP/2) may sit with no request in flight and
    /// nothing left to send before it is shut down gracefully (dropped one more later; so a
    /// client has at most twice this to send a request's headers). Also the HTTP/2 keep-alive
    /// ping interval.
    #[arg(long, default_value = "10s", value_parser = client_timeout)]
    header_timeout: std::time::Duration,
    /// How long a request body may stall outright; beyond it, the body must keep up
    /// --min-rate on average or get 408.
    #[arg(long, default_value = "30s", value_parser = client_timeout)]
    body_timeout: std::time::Duration,
    /// How long a client may stop taking an answer outright; beyond it, it must keep up
    /// --min-rate on average or its connection is dropped.
    #[arg(long, default_value = "30s", value_parser = client_timeout)]
    send_timeout: std::time::Duration,
    /// The slowest rate, in bytes a second, at which a client may send a request body or take
    /// an answer once its --body-timeout or --send-timeout is spent (time the server spends on
    /// its own work is not counted); 0 sets no rate, only those timeouts between pieces.
    #[arg(long, default_value_t = 1024)]
    min_rate: u64,
    /// A PUT may not replace a finalized ref holding another object unless it sends
    /// `X-Jupiter-Allow-Overwrite: true`: it gets 409 with the stored object, which the editor
    /// adopts. By default overwrites are allowed, as on the reference server.
    #[arg(long)]
    deny_overwrite: bool,
    /// How often garbage collection runs: expired refs, then blobs no ref names.
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
    gc_interval: std::time::Duration,
    /// No garbage collection: refs and blobs stay until deleted.
    #[arg(long)]
    no_gc: bool,
    /// A finalized ref nobody has read or written for this long is removed.
    #[arg(long, default_value = "14d", value_parser = humantime::parse_duration)]
    ref_ttl: std::time::Duration,
    /// An unfinalized ref nobody has read or written for this long is removed.
    #[arg(long, default_value = "2h", value_parser = humantime::parse_duration)]
    unfinalized_ttl: std::time::Duration,
    /// A blob no ref names is removed once it was last written this long ago (at least 30m
    /// with --blobs).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    blob_grace: std::time::Duration,
    /// Serve HTTPS with this certificate chain (PEM, leaf first); re-read on SIGHUP.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Bench {
    /// B1: ping-pong sessions held (the Qifun BCP report).
    Pingpong(Box<tickwire_bench::pingpong::PingPongArgs>),
    /// B3: channel replication with a simulated game server and clients (the channeld report).
    Replication(tickwire_bench::replication::ReplicationArgs),
    /// B2: state-sync cost per room tick and rooms per machine (the SwiftStateTree report).
    Sync(tickwire_bench::sync::SyncArgs),
    /// B4: the Cloud DDC benchmark suite against a child `tickwire ddc` (the DDC report).
    Ddc(tickwire_bench::ddc::DdcArgs),
    /// Internal: one load-generator process of a large pingpong run.
    #[command(hide = true)]
    PingpongWorker {
        #[arg(long)]
        spec: String,
    },
    /// Internal: the bare responder `bench pingpong --server floor` loads.
    #[command(hide = true)]
    PingpongFloor(tickwire_bench::pingpong::FloorArgs),
    /// Internal: one bot process of `bench replication --bot-processes N`.
    #[command(hide = true)]
    ReplicationWorker {
        #[arg(long)]
        spec: String,
    },
}

/// A deadline on what a client does (`--header-timeout`, `--body-timeout`, `--send-timeout`):
/// at least a millisecond (zero would cut off every client at once) and at most a day.
fn client_timeout(s: &str) -> Result<Duration, String> {
    let timeout = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if timeout < Duration::from_millis(1) || timeout > Duration::from_secs(86_400) {
        return Err(format!("{s} is not between 1 ms and 1 day"));
    }
    Ok(timeout)
}

/// Errors end the process with one line (the error and its causes), never a backtrace, even
/// with RUST_BACKTRACE set.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let default_level = match cli.command {
        Command::Gateway(_) => "info",
        Command::Demo(_) => "warn",
        Command::Ddc(_) => "info",
        Command::Bench { .. } => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_level.into()),
        )
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, and never when NO_COLOR is set.
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none(),
        )
        .init();
    if let Command::Bench { bench: Bench::Sync(args) } = cli.command {
        // Pure CPU work on plain threads: no runtime.
        return tickwire_bench::sync::run(args).map(|_| ());
    }
    if let Command::Bench { bench: Bench::PingpongFloor(args) } = &cli.command {
        // Its own epoll loop: no runtime.
        return tickwire_bench::pingpong::floor_main(args);
    }
    tickwire_transport::raise_fd_limit();
    // The gateway's main runtime only coordinates; its heavy lifting runs on per-core I/O
    // threads. The DDC server is plain request/response work: a runtime with a worker per
    // core. Load generators stay on one thread (the DDC bench verifies large bodies on the
    // blocking pool), which keeps their timing steady.
    let runtime = match cli.command {
        Command::Ddc(_) => tokio::runtime::Builder::new_multi_thread().enable_all().build()?,
        _ => tokio::runtime::Builder::new_current_thread().enable_all().build()?,
    };
    runtime.block_on(async move {
        match cli.command {
            Command::Gateway(args) => gateway(args).await,
            Command::Demo(args) => demo(args).await,
            Command::Ddc(args) => ddc(args).await,
            Command::Bench { bench: Bench::Pingpong(args) } => {
                tickwire_bench::pingpong::run(*args).await.map(|_| ())
            }
            Command::Bench { bench: Bench::PingpongWorker { spec } } => {
                tickwire_bench::pingpong::worker_main(&spec).await
            }
            Command::Bench { bench: Bench::ReplicationWorker { spec } } => {
                tickwire_bench::replication::worker_main(&spec).await
            }
            Command::Bench { bench: Bench::Replication(args) } => {
                tickwire_bench::replication::run(args).await.map(|_| ())
            }
            Command::Bench { bench: Bench::Ddc(args) } => tickwire_bench::ddc::run(args).await.map(|_| ()),
            Command::Bench { bench: Bench::Sync(_) | Bench::PingpongFloor(_) } => {
                unreachable!("handled before the runtime starts")
            }
        }
    })
}

/// Formats values as a TOML array of strings, for `--set key=[...]` overrides.
pub(crate) fn toml_list<T: std::fmt::Display>(values: &[T]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| format!("\"{v}\"")).collect();
    format!("[{}]", quoted.join(","))
}

async fn gateway(args: GatewayArgs) -> anyhow::Result<()> {
    let mut overrides = Vec::new();
    if !args.tcp.is_empty() {
        overrides.push(format!("listen.tcp={}", toml_list(&args.tcp)));
    }
    if !args.ws.is_empty() {
        overrides.push(format!("listen.ws={}", toml_list(&args.ws)));
    }
    if let Some(hb) = &args.heartbeat {
        overrides.push(format!("session.heartbeat=\"{hb}\""));
    }
    if let Some(addr) = &args.metrics {
        overrides.push(format!("metrics.listen=\"{addr}\""));
    }
    overrides.extend(args.overrides);
    let config = GatewayConfig::load(args.config.as_deref(), &overrides).context("loading configuration")?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = args.threads.unwrap_or_else(|| (cores / usize::from(args.processes)).max(1));
    if args.processes > 1 && config.tls.enabled() {
        // A resume is handed to the worker that owns its session as a raw socket; a TLS
        // connection's state cannot follow it.
        anyhow::bail!(
            "--processes {} cannot be used with [tls]: run one process, or terminate TLS in front",
            args.processes
        );
    }
    if args.processes > 1 && args.web.is_some() {
        anyhow::bail!("--web cannot be used with --processes: each worker sees only its own sessions");
    }
    if args.processes > 1 && args.worker.is_none() {
        let mut passthrough = Vec::new();
        if let Some(path) = &args.config {
            passthrough.extend(["--config".to_owned(), path.display().to_string()]);
        }
        for o in &overrides {
            passthrough.extend(["--set".to_owned(), o.clone()]);
        }
        return supervisor::run(&config, &passthrough, args.processes, threads).await;
    }
    let runtimes = tickwire_transport::io_threads(threads, "tickwire-io")?;
    let spatial = config.spatial.clone();
    let mut gateway = Gateway::new(config)?;
    if let (Some(index), Some(count), Some(dir)) = (args.worker, args.workers, args.handoff_dir) {
        gateway = gateway.with_workers(WorkerSet { index, count, dir });
    }
    let gateway = gateway.start_on(&runtimes)?;
    // Listening for SIGHUP before the listening lines go out, so that a script that reacts to
    // them cannot send one while its default action (exit) still applies.
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let tls = gateway.tls_enabled();
    for addr in gateway.tcp_addrs() {
        announce(&format!("{LISTENING_PREFIX}{}://{addr}", if tls { "tls" } else { "tcp" }));
    }
    for addr in gateway.ws_addrs() {
        announce(&format!("{LISTENING_PREFIX}{}://{addr}/", if tls { "wss" } else { "ws" }));
    }
    let web_stop = tokio_util::sync::CancellationToken::new();
    let web = match &args.web {
        Some(addr) => Some(web::start(addr, &gateway, spatial.as_ref(), web_stop.clone()).await?),
        None => None,
    };
    tokio::select! {
        r = wait_for_signal() => r?,
        // Without TLS there is nothing to reload: SIGHUP is received and ignored.
        () = reload_on_sighup(hangups, || gateway.reload_tls()), if tls => {}
    }
    web_stop.cancel();
    if let Some(web) = web {
        // A page left open holds a connection; it is closed after its request in flight.
        let _ = tokio::time::timeout(Duration::from_secs(2), web).await;
    }
    tracing::info!(sessions = gateway.session_count(), "shutting down");
    if !gateway.shutdown(SHUTDOWN_GRACE).await {
        tracing::warn!(
            "some sessions or router tasks did not stop within {}",
            humantime::format_duration(SHUTDOWN_GRACE)
        );
    }
    Ok(())
}

/// Runs a garbage collection every `every` (the first one `every` after start), for as long
/// as the server runs. A run that fails is logged and counted, and the next one tries again.
async fn collect_garbage(
    ddc: std::sync::Arc<tickwire_ddc::http::Ddc>,
    policy: tickwire_ddc::gc::GcPolicy,
    every: std::time::Duration,
) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match ddc.collect_garbage(&policy, std::time::SystemTime::now()).await {
            Ok(report) if report.refs_expired + report.blobs_removed + report.blobs_failed == 0 => {
                tracing::debug!(blobs_kept = report.blobs_kept, "garbage collection removed nothing")
            }
            Ok(report) => tracing::info!(
                refs_expired = report.refs_expired,
                blobs_removed = report.blobs_removed,
                bytes_freed = report.bytes_freed,
                blobs_kept = report.blobs_kept,
                blobs_failed = report.blobs_failed,
                "garbage collected"
            ),
            Err(e) => tracing::warn!(error = %e, "garbage collection failed; retrying at the next interval"),
        }
    }
}

async fn ddc(args: DdcArgs) -> anyhow::Result<()> {
    use tickwire_ddc::{Auth, http};
    let auth = match (&args.tokens, args.dev_auth) {
        (Some(path), _) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            Auth::from_toml(&text).with_context(|| format!("parsing {}", path.display()))?
        }
        (None, true) => {
            tracing::warn!("--dev-auth: anyone can read, write and delete; use --tokens in production");
            Auth::Dev
        }
        (None, false) => {
            anyhow::bail!("no auth configured: pass --tokens FILE, or --dev-auth for a local try-out")
        }
    };
    anyhow::ensure!(
        args.max_buffered_mib <= args.memory_budget_mib,
        "--max-buffered-mib ({}) must not exceed --memory-budget-mib ({}): such bodies could never be read",
        args.max_buffered_mib,
        args.memory_budget_mib
    );
    // A request may hold two buffered objects at once (a PUT's body and an object attachment its
    // check reads, up to 16 MiB; a `.raw` answer's stored buffer and its decoded payload), so a
    // smaller budget refuses some requests every time.
    let together = 2 * args.max_buffered_mib + (tickwire_ddc::storage::MAX_ATTACHED_OBJECT >> 20);
    if args.memory_budget_mib < together {
        tracing::warn!(
            "--memory-budget-mib {} is below twice --max-buffered-mib plus 16 ({together}): some requests on large objects will be refused on every try (413)",
            args.memory_budget_mib
        );
    }
    let limits = http::Limits {
        max_blob_bytes: args.max_blob_mib << 20,
        max_buffered_bytes: args.max_buffered_mib << 20,
        memory_budget: u32::try_from(args.memory_budget_mib << 20)
            .context("--memory-budget-mib must be below 4096")?,
        body: MinRate { bytes_per_s: args.min_rate, allowance: args.body_timeout },
    };
    // The metadata first: a server refused the database (another holds it) must not touch
    // the root or the bucket (a restart overlapping the old process's last seconds).
    let cache_bytes = args
        .blob_cache_mib
        .checked_mul(1 << 20)
        .context("--blob-cache-mib is past what a 64-bit count of bytes holds")?;
    let s3 = args.blobs.as_ref().map(|url| tickwire_ddc::S3Config {
        url: url.clone(),
        cache_bytes,
        ..Default::default()
    });
    let meta = match (&args.refs, &s3) {
        // The URL is not repeated: it may hold a password.
        (Some(url), Some(_)) => tickwire_ddc::meta::MetaStore::open_postgres_shared(url)
            .await
            .context("opening the Postgres metadata store (--refs)")?,
        (Some(url), None) => tickwire_ddc::meta::MetaStore::open_postgres(url)
            .await
            .context("opening the Postgres metadata store (--refs)")?,
        (None, _) => tickwire_ddc::meta::MetaStore::open(&args.root)
            .await
            .with_context(|| format!("opening the metadata in {}", args.root.display()))?,
    };
    let blobs = match &s3 {
        Some(config) => {
            anyhow::ensure!(
                limits.max_blob_bytes <= tickwire_ddc::blob_store::MAX_S3_BLOB,
                "--max-blob-mib {} is past what S3 takes in one multipart upload ({} MiB)",
                args.max_blob_mib,
                tickwire_ddc::blob_store::MAX_S3_BLOB >> 20
            );
            tickwire_ddc::BlobStore::open_s3(&args.root, config)
                .await
                .context("opening the S3 blob store (--blobs)")?
        }
        None => tickwire_ddc::BlobStore::open(&args.root)
            .await
            .with_context(|| format!("opening the blob store in {}", args.root.display()))?,
    };
    let mut ddc =
        http::Ddc::open_with_stores(blobs, meta, auth, limits).await.context("checking the blob store")?;
    ddc.allow_overwrite = !args.deny_overwrite;
    let ddc = std::sync::Arc::new(ddc);
    // Last-access times of reads are written in batches.
    let flusher = ddc.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            every.tick().await;
            if let Err(e) = flusher.flush_access().await {
                tracing::warn!(error = %e, "writing last-access times failed");
            }
        }
    });
    if !args.no_gc {
        anyhow::ensure!(!args.gc_interval.is_zero(), "--gc-interval must be more than 0 (or use --no-gc)");
        let min = ddc.content.blobs.min_blob_grace();
        anyhow::ensure!(
            args.blob_grace >= min,
            "--blob-grace {} is too short for blobs in S3: at least {} (writes that rely on a blob need the time to commit their refs)",
            humantime::format_duration(args.blob_grace),
            humantime::format_duration(min)
        );
        let policy = tickwire_ddc::gc::GcPolicy {
            ref_ttl: args.ref_ttl,
            unfinalized_ttl: args.unfinalized_ttl,
            blob_grace: args.blob_grace,
        };
        tokio::spawn(collect_garbage(ddc.clone(), policy, args.gc_interval));
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            Some(tickwire_transport::TlsServer::from_files_with_alpn(cert, key, tickwire_ddc::serve::alpn())?)
        }
        _ => None,
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    // Before the listening line, as for the gateway.
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    announce(&format!(
        "{LISTENING_PREFIX}{scheme}://{}/ (blobs: {}; metadata in {})",
        listener.local_addr()?,
        ddc.content.blobs.describe(),
        ddc.content.meta.backend_name()
    ));
    let limits = tickwire_ddc::serve::ServeLimits {
        max_connections: args.max_connections as usize,
        max_connections_per_address: args.max_connections_per_address as usize,
        ipv6_prefix: args.ipv6_prefix,
        header_timeout: args.header_timeout,
        send: MinRate { bytes_per_s: args.min_rate, allowance: args.send_timeout },
    };
    let reload = tls.clone();
    let lost = ddc.content.meta.lost();
    let connections = ddc.connections.clone();
    tickwire_ddc::serve::serve(listener, http::router(ddc.clone()), limits, tls, connections, async move {
        tokio::select! {
            _ = wait_for_signal() => {}
            () = reload_on_sighup(hangups, || reload.as_ref().map_or(Ok(()), |tls| tls.reload())) => {}
            // With Postgres: another server may hold the database now. Exit (non-zero), so a
            // supervisor starts this one again, taking the lock anew.
            () = lost => {}
        }
    })
    .await?;
    if ddc.content.meta.is_lost() {
        anyhow::bail!("stopped: this server lost its lock on the Postgres database (its session ended)");
    }
    ddc.flush_access().await.context("writing last-access times at shutdown")?;
    if !ddc.content.blobs.finish(std::time::Duration::from_secs(30)).await {
        tracing::warn!("stopped with sends to S3 still running after 30 s: they are abandoned");
    }
    Ok(())
}

async fn demo(args: DemoArgs) -> anyhow::Result<()> {
    let mut overrides = vec![
        format!("listen.tcp={}", toml_list(&[args.tcp])),
        format!("listen.ws={}", toml_list(&[args.ws])),
    ];
    if args.metrics != "off" {
        overrides.push(format!("metrics.listen=\"{}\"", args.metrics));
    }
    let config = GatewayConfig::load(None, &overrides).context("demo configuration")?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let runtimes = tickwire_transport::io_threads(cores, "tickwire-io")?;
    let opts = tickwire_bench::sim::demo::DemoOptions {
        scenario: args.scenario,
        bots: args.bots,
        duration: args.duration,
        config,
        print: true,
        web: match args.web.as_str() {
            "off" => None,
            addr => Some(
                addr.parse().with_context(|| format!("--web {addr}: not an address like 127.0.0.1:7480"))?,
            ),
        },
    };
    tickwire_bench::sim::demo::run(opts, &runtimes).await.map(drop)
}

/// Prints one line for whoever started us (scripts wait for the listening lines). A closed
/// stdout is not a reason to stop serving, so a failed write is ignored (`println!` would
/// panic).
pub(crate) fn announce(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// Calls `reload` on every SIGHUP in `hangups`, logging the outcome.
async fn reload_on_sighup<E: std::fmt::Display>(
    mut hangups: tokio::signal::unix::Signal,
    reload: impl Fn() -> Result<(), E>,
) {
    while hangups.recv().await.is_some() {
        match reload() {
            Ok(()) => tracing::info!("SIGHUP: TLS certificate reloaded"),
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: TLS reload failed; the old certificate stays in use")
            }
        }
    }
}

pub(crate) async fn wait_for_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    Ok(())
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(test)]
mod client_timeouts {
    use super::client_timeout;

    #[test]
    fn zero_and_past_a_day_are_refused() {
        assert_eq!(client_timeout("30s"), Ok(std::time::Duration::from_secs(30)));
        assert_eq!(client_timeout("1ms"), Ok(std::time::Duration::from_millis(1)));
        assert!(client_timeout("0s").unwrap_err().contains("not between"));
        assert!(client_timeout("25h").is_err());
        assert!(client_timeout("999us").is_err());
        assert!(client_timeout("soon").is_err());
    }
}
