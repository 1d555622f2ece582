//! Serving the DDC's routes over HTTP/1.1 and HTTP/2 (the editor's default: prior knowledge
//! on plain TCP, ALPN `h2` over TLS) with the limits a public cache needs and `axum::serve`
//! does not set: a cap on open connections, in all and from one client address (so one host
//! cannot take every slot), an idle deadline for every connection (which also bounds the time
//! to send a request's headers), a minimum rate for taking what it is sent, and a cut for an answer
//! its client takes nothing of (`watch.rs`, told by `paced.rs`), HTTP/2 keep-alive
//! pings that drop dead peers, a cap on concurrent HTTP/2 streams, and, in `http/body.rs`, a
//! minimum rate for request bodies. So idle, trickling or stopped sockets cannot hold the
//! server. With TLS settings, every connection speaks HTTPS; its TLS handshake counts against
//! the idle deadline.

mod paced;
mod watch;

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tickwire_transport::{AddressCounts, ClientAddress, TlsServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::pace::MinRate;
use paced::{InFlight, PacedBody, PacedIo, Watched};
use watch::{Action, Close, Watch};

/// Connection limits of the HTTP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Connections open at once; a connection past it gets `503` and is closed (0 refuses
    /// every connection).
    pub max_connections: usize,
    /// Connections one client address may hold open at once; past it, the same (0 refuses
    /// every connection). Behind a reverse proxy every client has the proxy's address: set it
    /// to `max_connections` there.
    pub max_connections_per_address: usize,
    /// What one client address is for an IPv6 client: its first this many bits (64, the block
    /// a site is usually given; 128, each address on its own). See
    /// [`tickwire_transport::ClientAddress`].
    pub ipv6_prefix: u8,
    /// How long a connection may sit with no request in flight and nothing left to send (from
    /// its opening or its last answer) before it is shut down gracefully; it is dropped if still
    /// open one more of it later. So a client has at most twice this to send a request's
    /// headers. Also the HTTP/2 keep-alive ping interval.
    pub header_timeout: Duration,
    /// How slow a client may take an answer before its connection is dropped
    /// ([`crate::pace`]).
    pub send: MinRate,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            max_connections: 1024,
            max_connections_per_address: 256,
            ipv6_prefix: 64,
            header_timeout: Duration::from_secs(10),
            send: MinRate { bytes_per_s: 1024, allowance: Duration::from_secs(30) },
        }
    }
}

/// The application protocols a DDC offers in TLS's ALPN, most preferred first.
pub fn alpn() -> Vec<Vec<u8>> {
    vec![b"h2".to_vec(), b"http/1.1".to_vec()]
}

/// Requests in flight on one HTTP/2 connection (the editor runs up to 64 per category).
const MAX_STREAMS: u32 = 256;

/// What a connection past the cap gets before it is closed.
const BUSY: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

/// What the server did with connections, since it started: for `/metrics`.
#[derive(Debug, Default)]
pub struct Connections {
    /// Open now.
    pub open: AtomicU64,
    /// Turned away because `max_connections` were open.
    pub refused_total: AtomicU64,
    /// Turned away because their address had `max_connections_per_address` open.
    pub refused_per_address: AtomicU64,
    /// Shut down with no request in flight for the idle timeout (`header_timeout`).
    pub closed_idle: AtomicU64,
    /// Dropped because a client took what it was sent slower than `send` allows, or nothing
    /// of any answer in flight.
    pub closed_slow: AtomicU64,
    /// Answers given up because their client took nothing of them for `send.allowance` while
    /// their connection's socket took data (an HTTP/2 stream given no flow-control credit).
    pub answers_cut: AtomicU64,
}

/// Open connections per client address, each address bounded.
#[derive(Debug)]
struct PerAddress {
    max: usize,
    ipv6_prefix: u8,
    open: Mutex<AddressCounts>,
}

/// A connection's place among its address's, given back when dropped.
struct Place {
    of: Arc<PerAddress>,
    address: ClientAddress,
}

impl PerAddress {
    fn new(max: usize, ipv6_prefix: u8) -> Arc<PerAddress> {
        Arc::new(PerAddress { max, ipv6_prefix, open: Mutex::default() })
    }

    /// A place for a connection from `ip`, counted under its [`ClientAddress`].
    fn take(self: &Arc<Self>, ip: IpAddr) -> Option<Place> {
        let address = ClientAddress::of(ip, self.ipv6_prefix);
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.get(&address) >= self.max {
            return None;
        }
        open.add(address);
        Some(Place { of: self.clone(), address })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.of.open.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.address);
    }
}

/// Counts a connection open for as long as it lives.
struct Counted(Arc<Connections>);

impl Counted {
    fn new(connections: &Arc<Connections>) -> Counted {
        connections.open.fetch_add(1, Ordering::Relaxed);
        Counted(connections.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves `app` on `listener` until `shutdown` completes; then stops accepting (open
/// connections finish their current request on their own tasks). With `tls`, over HTTPS.
/// What it does with connections goes into `connections`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServeLimits,
    tls: Option<Arc<TlsServer>>,
    connections: Arc<Connections>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let per_address = PerAddress::new(limits.max_connections_per_address, limits.ipv6_prefix);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, for example: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Answers go out in several writes (headers, then body chunks): without this, Nagle's
        // algorithm and the client's delayed ACK hold the last small write for ~40 ms.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "setting TCP_NODELAY failed");
        }
        let admitted = match per_address.take(peer.ip()) {
            None => Err(&connections.refused_per_address),
            Some(place) => slots
                .clone()
                .try_acquire_owned()
                .map(|slot| (slot, place))
                .map_err(|_| &connections.refused_total),
        };
        let (slot, place) = match admitted {
            Ok(admitted) => admitted,
            Err(refused) => {
                refused.fetch_add(1, Ordering::Relaxed);
                // Over TLS, a 503 would need a handshake first: the connection is just closed.
                if tls.is_none() {
                    tokio::spawn(turn_away(stream));
                }
                continue;
            }
        };
        let counted = Counted::new(&connections);
        let watched = Watched::new(Watch::new(Instant::now(), limits.header_timeout, limits.send));
        let inner = TowerToHyperService::new(app.clone());
        let service = {
            let watched = watched.clone();
            hyper::service::service_fn(move |request| {
                let in_flight = InFlight::begin(&watched);
                let call = hyper::service::Service::call(&inner, request);
                async move {
                    let response = call.await?;
                    Ok::<_, std::convert::Infallible>(
                        response.map(|body| axum::body::Body::new(PacedBody::new(body, in_flight))),
                    )
                }
            })
        };
        let tls = tls.clone();
        let connections = connections.clone();
        tokio::spawn(async move {
            let _held = (slot, place, counted);
            let mut http = auto::Builder::new(TokioExecutor::new());
            // No header deadline of hyper's own: it would start when an answer's last piece is
            // buffered, not sent, and cut the answer's tail short on a slow link. The watch's
            // idle rule covers a slow head (shut down after one header timeout, dropped after
            // two), and waits for what is left to send.
            http.http1().timer(TokioTimer::new()).header_read_timeout(None);
            http.http2()
                .timer(TokioTimer::new())
                .max_concurrent_streams(MAX_STREAMS)
                // What h2 queues for a stream beyond what its client has taken: one piece (it
                // takes a whole piece when it has room for a byte, so up to two; hyper holds a
                // third). hyper's default is 400 KiB a stream, all outside the memory budget.
                .max_send_buf_size(crate::http::sending::CHUNK)
                .keep_alive_interval(Some(limits.header_timeout))
                // A ping's answer may queue behind a socket full of answers: as long as the
                // client may take to make room.
                .keep_alive_timeout(limits.header_timeout.max(limits.send.allowance));
            let closed = match tls {
                None => {
                    let io = TokioIo::new(PacedIo::new(stream, watched.clone()));
                    watch_over(http.serve_connection(io, service), &watched, &connections).await
                }
                Some(tls) => {
                    let deadline = Instant::now() + limits.header_timeout;
                    let handshake = tickwire_transport::accept_tls(stream, &tls);
                    match tokio::time::timeout_at(deadline, handshake).await {
                        Ok(Ok(stream)) => {
                            let io = TokioIo::new(PacedIo::new(stream, watched.clone()));
                            watch_over(http.serve_connection(io, service), &watched, &connections).await
                        }
                        Ok(Err(e)) => return tracing::debug!(error = %e, "TLS handshake failed"),
                        Err(_) => return tracing::debug!("TLS handshake timed out"),
                    }
                }
            };
            match closed {
                Ok(None) => {}
                Ok(Some(Close::Idle)) => {
                    connections.closed_idle.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Some(Close::Slow)) => {
                    connections.closed_slow.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("a client took what it was sent too slowly: connection dropped");
                }
                Err(e) => tracing::debug!(error = %e, "connection ended with an error"),
            }
        });
    }
}

/// Runs a connection under its watch (`watch.rs`), doing what the watch says: cutting
/// answers, shutting down gracefully, dropping the connection. Why the server closed it, if it
/// did.
async fn watch_over<I, S, B>(
    conn: auto::Connection<'_, I, S, TokioExecutor>,
    watched: &Watched,
    connections: &Connections,
) -> Result<Option<Close>, Box<dyn std::error::Error + Send + Sync>>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::Service<hyper::Request<hyper::body::Incoming>, Response = hyper::Response<B>>,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::pin!(conn);
    loop {
        let check = watched.lock(Instant::now()).arm();
        let due = async {
            match check {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ended = conn.as_mut() => {
                // After a graceful shutdown for idling, the connection was closed for idling: one
                // that never sent a byte ends its protocol sniffing with an error ("Cancelled").
                let idle = watched.lock(Instant::now()).was_shut_down();
                return match ended {
                    Err(_) if idle => Ok(Some(Close::Idle)),
                    Err(e) => Err(e),
                    Ok(()) => Ok(idle.then_some(Close::Idle)),
                };
            }
            () = watched.wake.notified() => continue,
            () = due => {}
        }
        let now = Instant::now();
        let verdict = watched.lock(now).verdict(now);
        match verdict {
            None => {}
            Some(Action::Cut(keys)) => {
                connections.answers_cut.fetch_add(keys.len() as u64, Ordering::Relaxed);
                tracing::debug!(answers = keys.len(), "answers untaken for the send allowance: cut");
                watched.cut(&keys);
                // No new request on a connection whose client leaves an answer untaken.
                conn.as_mut().graceful_shutdown();
            }
            Some(Action::ShutDown) => {
                tracing::debug!("no request in flight for the idle timeout: shutting down");
                conn.as_mut().graceful_shutdown();
            }
            Some(Action::Drop(close)) => return Ok(Some(close)),
        }
    }
}

/// Answers 503 and closes gracefully: the client's request is read and dropped (up to a
/// second and 64 KiB) so that closing does not reset the connection before the client has
/// read the answer.
async fn turn_away(mut stream: TcpStream) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(BUSY).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        let mut left: usize = 64 * 1024;
        while left > 0 {
            match stream.read(&mut sink).await? {
                0 => break,
                n => left = left.saturating_sub(n),
            }
        }
        io::Result::Ok(())
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_address_has_its_own_bound_and_an_ipv6_host_its_whole_64() {
        let per = PerAddress::new(2, 64);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let first = per.take(ip("10.0.0.1")).unwrap();
        let _second = per.take(ip("::ffff:10.0.0.1")).expect("the same address, mapped into IPv6");
        assert!(per.take(ip("10.0.0.1")).is_none(), "its bound");
        assert!(per.take(ip("10.0.0.2")).is_some(), "another address");
        drop(first);
        let _again = per.take(ip("10.0.0.1")).expect("a place given back");
        let _a = per.take(ip("2001:db8::1")).unwrap();
        let _b = per.take(ip("2001:db8::ffff:1")).unwrap();
        assert!(per.take(ip("2001:db8::2")).is_none(), "one /64");
        assert!(per.take(ip("2001:db8:0:1::1")).is_some(), "the next /64");
        let refused_only = PerAddress::new(0, 64);
        assert!(refused_only.take(ip("10.0.0.3")).is_none());
        assert!(refused_only.open.lock().unwrap().is_empty(), "a refused address leaves nothing behind");
    }
}
