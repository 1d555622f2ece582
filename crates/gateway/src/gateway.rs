//! Building, starting and stopping a gateway: listeners, the state all sessions share, and
//! graceful shutdown (every session is told why before its connection closes).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tickwire_transport::{Conn, TlsError, TlsServer, WsLimits, WsStream, accept_tls, accept_ws};
use tickwire_wire::FrameDecoder;
use tickwire_wire::proto::CloseReason;
use tokio::net::{TcpListener, TcpSocket};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::{Admission, Refused};
use crate::auth::{AuthProvider, provider_from_config};
use crate::channel::{ChannelConfigError, ChannelRouter};
use crate::close::send_close;
use crate::config::{ConfigError, GatewayConfig};
use crate::handshake::handshake;
use crate::handshake::handshake_with;
use crate::registry::Registry;
use crate::router::{Router, Startup};
use crate::shared::Shared;
use crate::spatial::SpatialRouter;
use crate::stats::Stats;
use crate::workers::{WorkerSet, bind_handoffs, receive_handoff};

/// Pending connections the kernel queues per listener.
const LISTEN_BACKLOG: u32 = 4096;
/// Pause after a failed accept (for example, out of file descriptors) before the next one.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Why a gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Channels(#[from] ChannelConfigError),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("cannot listen for handoffs in {path}: {source}")]
    Handoff { path: std::path::PathBuf, source: io::Error },
    #[error("tls: {0}")]
    Tls(#[from] TlsError),
    #[error("cannot start the router's threads: {source}")]
    Threads { source: io::Error },
    #[error("tls: writing the self-signed certificate to {path}: {source}")]
    TlsCertOut { path: std::path::PathBuf, source: io::Error },
}

/// A configured gateway, not yet listening.
pub struct Gateway {
    config: GatewayConfig,
    auth: Box<dyn AuthProvider>,
    router: Arc<dyn Router>,
    workers: Option<WorkerSet>,
    tls: Option<Tls>,
}

impl Gateway {
    /// A gateway with the auth provider the config names, serving channels (`channel.*`) and
    /// echo.
    pub fn new(config: GatewayConfig) -> Result<Gateway, GatewayError> {
        let auth = provider_from_config(&config.auth)?;
        let channels = ChannelRouter::for_gateway(&config)?;
        let router: Arc<dyn Router> = match &config.spatial {
            Some(layout) => Arc::new(SpatialRouter::new(layout.clone(), &config, channels)?),
            None => Arc::new(channels),
        };
        let tls = tls_from_config(&config)?;
        Ok(Gateway { config, auth, router, workers: None, tls })
    }

    pub fn with_router(mut self, router: Arc<dyn Router>) -> Gateway {
        self.router = router;
        self
    }

    pub fn with_auth(mut self, auth: Box<dyn AuthProvider>) -> Gateway {
        self.auth = auth;
        self
    }

    /// Runs this gateway as one of several worker processes sharing its ports (see
    /// [`WorkerSet`]).
    pub fn with_workers(mut self, workers: WorkerSet) -> Gateway {
        self.workers = Some(workers);
        self
    }

    /// Binds every listener and starts accepting on the current runtime.
    pub async fn start(self) -> Result<RunningGateway, GatewayError> {
        self.start_on(&[Handle::current()])
    }

    /// Binds every listener once per runtime (with `SO_REUSEPORT`, so the kernel spreads new
    /// connections over them) and starts accepting. A session lives on the runtime that
    /// accepted it. Pass single-threaded runtimes for a thread-per-core gateway.
    pub fn start_on(self, runtimes: &[Handle]) -> Result<RunningGateway, GatewayError> {
        if self.auth.is_dev() {
            tracing::warn!("auth mode is `dev`: anyone can connect; set auth.mode = \"jwt\" in production");
        }
        let (tls, tls_certificate_pem) = self.tls.map_or((None, None), |(server, pem)| (Some(server), pem));
        let shared = Arc::new(Shared {
            tls,
            session_config: self.config.session.to_session_config(),
            decoder: FrameDecoder::new(self.config.limits.max_frame_bytes),
            auth: self.auth,
            router: self.router,
            registry: Registry::new(),
            stats: Arc::new(Stats::default()),
            cancel: CancellationToken::new(),
            tracker: TaskTracker::new(),
            workers: self.workers,
            next_conn_id: std::sync::atomic::AtomicU64::new(1),
            admission: Admission::new(&self.config.limits),
            config: self.config,
        });
        // A start that fails from here on tells what was started before it to stop: the
        // router's threads and tasks, the worker handoff listener of --processes, and the
        // listeners already accepting. It does not wait for them.
        let stop_if_failed = shared.cancel.clone().drop_guard();
        shared
            .router
            .on_start(&Startup { runtimes, stop: &shared.cancel, tracker: &shared.tracker })
            .map_err(|source| GatewayError::Threads { source })?;
        if let (Some(workers), Some(runtime)) = (&shared.workers, runtimes.first()) {
            listen_for_handoffs(&shared, workers, runtime)
                .map_err(|source| GatewayError::Handoff { path: workers.dir.clone(), source })?;
        }
        let mut tcp_addrs = Vec::new();
        let mut ws_addrs = Vec::new();
        for (addrs, out, ws) in [
            (&shared.config.listen.tcp, &mut tcp_addrs, false),
            (&shared.config.listen.ws, &mut ws_addrs, true),
        ] {
            for &addr in addrs {
                // The first bind resolves port 0; the others share the port it got.
                let mut local = addr;
                for runtime in runtimes {
                    let _guard = runtime.enter();
                    let listener =
                        reuseport_listener(local).map_err(|source| GatewayError::Bind { addr, source })?;
                    local = listener.local_addr().map_err(|source| GatewayError::Bind { addr, source })?;
                    runtime.spawn(shared.tracker.track_future(accept_loop(shared.clone(), listener, ws)));
                }
                // `tickwire gateway` prints the address once on stdout; this is for embedders.
                tracing::debug!(%local, transport = if ws { "ws" } else { "tcp" }, threads = runtimes.len(), "listening");
                out.push(local);
            }
        }
        let metrics_addr = match (shared.config.metrics.listen, runtimes.first()) {
            (Some(addr), Some(runtime)) => {
                // Worker processes share the listeners but not their figures: one port each.
                let offset = shared.workers.as_ref().map_or(0, |w| u16::from(w.index));
                let port = match addr.port() {
                    0 => 0,
                    base => base.checked_add(offset).ok_or_else(|| GatewayError::Bind {
                        addr,
                        source: io::Error::other(format!(
                            "metrics port {base} + worker {offset} is past 65535"
                        )),
                    })?,
                };
                let addr = SocketAddr::new(addr.ip(), port);
                let _guard = runtime.enter();
                let listener = std::net::TcpListener::bind(addr)
                    .and_then(|l| l.set_nonblocking(true).map(|()| l))
                    .and_then(TcpListener::from_std)
                    .map_err(|source| GatewayError::Bind { addr, source })?;
                let local = listener.local_addr().map_err(|source| GatewayError::Bind { addr, source })?;
                runtime.spawn(shared.tracker.track_future(crate::metrics::serve(
                    listener,
                    shared.stats.clone(),
                    shared.router.clone(),
                    shared.cancel.clone(),
                )));
                tracing::info!(%local, "metrics at http://{local}/metrics");
                Some(local)
            }
            _ => None,
        };
        stop_if_failed.disarm();
        Ok(RunningGateway { shared, tcp_addrs, ws_addrs, metrics_addr, tls_certificate_pem })
    }
}

/// The TLS settings when `[tls]` is on, and a self-signed certificate's PEM.
type Tls = (Arc<TlsServer>, Option<String>);

/// The TLS settings `[tls]` asks for, if any; a self-signed certificate's PEM is written where
/// `tls.self_signed_cert_out` says.
fn tls_from_config(config: &GatewayConfig) -> Result<Option<Tls>, GatewayError> {
    let tls = &config.tls;
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        return Ok(Some((TlsServer::from_files(cert, key)?, None)));
    }
    if !tls.self_signed {
        return Ok(None);
    }
    let names = ["localhost", "127.0.0.1", "::1"].map(String::from);
    let (server, pem) = TlsServer::self_signed(&names)?;
    if let Some(path) = &tls.self_signed_cert_out {
        std::fs::write(path, &pem)
            .map_err(|source| GatewayError::TlsCertOut { path: path.clone(), source })?;
    }
    Ok(Some((server, Some(pem))))
}

/// A gateway that is accepting connections.
pub struct RunningGateway {
    shared: Arc<Shared>,
    tcp_addrs: Vec<SocketAddr>,
    ws_addrs: Vec<SocketAddr>,
    metrics_addr: Option<SocketAddr>,
    tls_certificate_pem: Option<String>,
}

impl RunningGateway {
    /// Re-reads the TLS certificate and key files (`tickwire gateway` does on SIGHUP). New
    /// connections get the new certificate; on error the old one stays. Nothing to do without
    /// `[tls]` files.
    pub fn reload_tls(&self) -> Result<(), TlsError> {
        self.shared.tls.as_ref().map_or(Ok(()), |tls| tls.reload())
    }

    /// Whether the listeners speak TLS.
    pub fn tls_enabled(&self) -> bool {
        self.shared.tls.is_some()
    }

    /// With `tls.self_signed`: the certificate clients must trust, in PEM.
    pub fn tls_certificate_pem(&self) -> Option<&str> {
        self.tls_certificate_pem.as_deref()
    }

    /// Where `GET /metrics` is served, if `metrics.listen` is set.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Bound TCP addresses (with real ports when the config asked for port 0).
    pub fn tcp_addrs(&self) -> &[SocketAddr] {
        &self.tcp_addrs
    }

    pub fn ws_addrs(&self) -> &[SocketAddr] {
        &self.ws_addrs
    }

    pub fn stats(&self) -> Arc<Stats> {
        self.shared.stats.clone()
    }

    /// Sessions alive, attached or waiting for a resume.
    pub fn session_count(&self) -> usize {
        self.shared.registry.len()
    }

    /// Stops accepting, closes every session with reason SHUTDOWN, and waits (at most `grace`)
    /// for the sessions, the worker handoff listener and its handshakes (`--processes`), and
    /// the tasks the router runs under [`Startup::tracker`] (the spatial world) to end.
    /// Returns false if some were still running at the deadline.
    pub async fn shutdown(self, grace: Duration) -> bool {
        self.shared.cancel.cancel();
        self.shared.tracker.close();
        tokio::time::timeout(grace, self.shared.tracker.wait()).await.is_ok()
    }
}

fn reuseport_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener, ws: bool) {
    loop {
        let accepted = tokio::select! {
            () = shared.cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (pending, open_slot) = match shared.admission.admit(peer.ip(), std::time::Instant::now()) {
            Ok(admitted) => admitted,
            Err(refused) => {
                refuse(&shared, stream, ws, refused);
                continue;
            }
        };
        let task_shared = shared.clone();
        shared.tracker.spawn(async move {
            // Holds this connection's place in the pre-login budget until the handshake ends,
            // or until a newer connection takes it (`admission.rs`).
            let evicted = pending.evicted();
            let _pending = pending;
            tokio::pin!(evicted);
            // One auth timeout from accept to Hello, TLS handshake and WebSocket upgrade
            // included.
            let deadline = tokio::time::Instant::now() + task_shared.config.limits.auth_timeout;
            let opened = tokio::select! {
                () = &mut evicted => {
                    // Mid-TLS or mid-upgrade: dropped, no Close can go yet.
                    Stats::add(&task_shared.stats.connections_rejected, 1);
                    task_shared.stats.closed(CloseReason::Overloaded);
                    None
                }
                opened = tokio::time::timeout_at(deadline, open(&task_shared, stream, ws)) => opened.ok().flatten(),
            };
            let Some(conn) = opened else { return };
            tokio::select! {
                () = task_shared.cancel.cancelled() => {}
                () = handshake(task_shared.clone(), conn, open_slot, deadline, evicted) => {}
            }
        });
    }
}

/// The TLS handshake (with `[tls]`) and the WebSocket upgrade (on a WebSocket listener) of an
/// accepted connection; `None` if either failed (the peer is just dropped: it has not said who
/// it is, and a malformed handshake gets no answer).
async fn open(shared: &Shared, stream: tokio::net::TcpStream, ws: bool) -> Option<Conn> {
    // Before login, the Hello (in one message or many, each with its WebSocket header).
    let limits = WsLimits::chunked(crate::handshake::MAX_HELLO_FRAME_BYTES as usize + 4 + 1024);
    let result = match (&shared.tls, ws) {
        (None, false) => Ok(Conn::Tcp(stream)),
        (None, true) => accept_ws(WsStream::Plain(stream), limits).await,
        (Some(tls), false) => accept_tls(stream, tls).await.map(Conn::Tls),
        (Some(tls), true) => match accept_tls(stream, tls).await {
            Ok(stream) => accept_ws(WsStream::Tls(stream), limits).await,
            Err(e) => Err(e),
        },
    };
    result.map_err(|e| tracing::debug!(error = %e, "TLS or WebSocket handshake failed")).ok()
}

/// Closes a connection the pre-login budget has no room for: over plain TCP with an OVERLOADED
/// Close (written off the accept loop, bounded in time); over WebSocket or TLS, before their
/// handshake, by dropping it.
fn refuse(shared: &Arc<Shared>, stream: tokio::net::TcpStream, ws: bool, refused: Refused) {
    tracing::debug!(%refused, "connection refused");
    Stats::add(&shared.stats.connections_rejected, 1);
    shared.stats.closed(CloseReason::Overloaded);
    if !ws && shared.tls.is_none() {
        let message = refused.to_string();
        shared.tracker.spawn(async move {
            send_close(&mut Conn::Tcp(stream), CloseReason::Overloaded, &message).await;
        });
    }
}

/// Handoffs read at once; more wait in the listener's backlog. Each holds a thread of the
/// blocking pool until its handoff is read or its deadline passes.
const MAX_HANDOFFS_READING: usize = 32;

/// Starts the task that receives connections other workers hand over (resumes of this
/// worker's sessions) and runs their handshake on `runtime`, until the gateway stops.
fn listen_for_handoffs(shared: &Arc<Shared>, workers: &WorkerSet, runtime: &Handle) -> io::Result<()> {
    let (listener, path) = bind_handoffs(workers)?;
    listener.set_nonblocking(true)?;
    let listener = {
        let _guard = runtime.enter();
        tokio::net::UnixListener::from_std(listener)?
    };
    let stopping = shared.clone();
    shared.tracker.spawn_on(
        async move {
            handoff_loop(stopping, listener).await;
            // No worker can hand this one anything any more.
            let _ = std::fs::remove_file(path);
        },
        runtime,
    );
    Ok(())
}

/// Accepts handoff streams until the gateway stops. Each is read on the blocking pool, all of
/// it within the auth timeout, at most [`MAX_HANDOFFS_READING`] at once, so a stuck peer
/// holds up no other handoff. The auth timeout runs from the handoff's accept to the Hello's
/// answer, the handoff's read included.
async fn handoff_loop(shared: Arc<Shared>, listener: tokio::net::UnixListener) {
    let reading = Arc::new(tokio::sync::Semaphore::new(MAX_HANDOFFS_READING));
    loop {
        let permit = tokio::select! {
            () = shared.cancel.cancelled() => return,
            permit = reading.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            () = shared.cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted.and_then(|(stream, _)| stream.into_std()) {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "handoff accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let task_shared = shared.clone();
        shared.tracker.spawn(async move {
            let deadline = tokio::time::Instant::now() + task_shared.config.limits.auth_timeout;
            let until = deadline.into_std();
            let reading = tokio::task::spawn_blocking(move || {
                let _permit = permit;
                receive_handoff(stream, until)
            });
            // At shutdown the read is left to its deadline on the blocking pool; the socket it
            // may bring is owned there and closes when it ends.
            let received = tokio::select! {
                () = task_shared.cancel.cancelled() => return,
                received = reading => received.map_err(io::Error::other).and_then(|received| received),
            };
            let (stream, buf) = match received.and_then(|(stream, buf)| {
                stream.set_nonblocking(true)?;
                Ok((tokio::net::TcpStream::from_std(stream)?, buf))
            }) {
                Ok(received) => received,
                Err(e) => {
                    tracing::warn!(error = %e, "handoff failed");
                    return;
                }
            };
            Stats::add(&task_shared.stats.handoffs_received, 1);
            let ip = stream.peer_addr().map(|a| a.ip());
            let open = match ip
                .map_err(|e| e.to_string())
                .and_then(|ip| task_shared.admission.open(ip).map_err(|r| r.to_string()))
            {
                Ok(open) => open,
                Err(why) => {
                    tracing::debug!(%why, "handed-over connection refused");
                    return;
                }
            };
            tokio::select! {
                () = task_shared.cancel.cancelled() => {}
                () = handshake_with(task_shared.clone(), Conn::Tcp(stream), open, buf, deadline, std::future::pending()) => {}
            }
        });
    }
}
