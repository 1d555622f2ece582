//! A relay between bots and the gateway that carries the gateway's bytes slowly, or not at all
//! for a while: slow and frozen clients for `tickwire bench replication`. The client's own
//! protocol engine runs at full speed behind it (it reads, applies and acknowledges everything
//! as soon as it arrives), so what is slow is the link, as on a congested mobile network.
//!
//! Each connection is throttled on its own: the relay reads the gateway's bytes in small pieces
//! only as fast as it passes them on, so the backlog stays where the gateway can see it (its
//! socket and its window of updates in flight), not in the relay.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Bytes passed on per write: small, so a throttled link delivers updates in pieces.
const PIECE: usize = 256;

/// How a [`SlowLink`] carries the gateway's bytes to its clients.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pace {
    /// At most this many bytes per second, per connection.
    BytesPerSecond(f64),
    /// Nothing while frozen (see [`SlowLink::freeze`]), full speed otherwise.
    Freezable,
}

/// A running relay. Dropping it leaves its tasks to `stop`.
#[derive(Debug, Clone)]
pub struct SlowLink {
    pub addr: SocketAddr,
    /// Frozen until this instant, in microseconds since `epoch` (0: not frozen).
    frozen_until_us: Arc<AtomicU64>,
    epoch: Instant,
}

impl SlowLink {
    /// Listens on a free loopback port and relays every connection to `upstream`.
    pub async fn start(
        upstream: SocketAddr,
        pace: Pace,
        stop: CancellationToken,
    ) -> std::io::Result<SlowLink> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let link = SlowLink {
            addr: listener.local_addr()?,
            frozen_until_us: Arc::new(AtomicU64::new(0)),
            epoch: Instant::now(),
        };
        let relay = link.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = stop.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let Ok((down, _)) = accepted else { continue };
                let relay = relay.clone();
                let stop = stop.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = relay.carry(down, upstream, pace) => {}
                    }
                });
            }
        });
        Ok(link)
    }

    /// Stops carrying the gateway's bytes on every connection for `how_long` from now (for
    /// [`Pace::Freezable`] links).
    pub fn freeze(&self, how_long: Duration) {
        let until = (self.epoch.elapsed() + how_long).as_micros() as u64;
        self.frozen_until_us.store(until, Ordering::Relaxed);
    }

    /// How long the link stays frozen from now.
    fn frozen_for(&self) -> Duration {
        let until = Duration::from_micros(self.frozen_until_us.load(Ordering::Relaxed));
        until.saturating_sub(self.epoch.elapsed())
    }

    async fn carry(&self, down: TcpStream, upstream: SocketAddr, pace: Pace) {
        let Ok(up) = TcpStream::connect(upstream).await else { return };
        let _ = (down.set_nodelay(true), up.set_nodelay(true));
        let (mut down_read, mut down_write) = down.into_split();
        let (mut up_read, mut up_write) = up.into_split();
        // The client's bytes go up at full speed.
        let upward = async { tokio::io::copy(&mut down_read, &mut up_write).await };
        let downward = async {
            let mut piece = [0u8; PIECE];
            let began = tokio::time::Instant::now();
            let mut carried = 0usize;
            loop {
                let frozen = self.frozen_for();
                if !frozen.is_zero() {
                    tokio::time::sleep(frozen).await;
                    continue;
                }
                let n = match up_read.read(&mut piece).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if down_write.write_all(&piece[..n]).await.is_err() {
                    return;
                }
                carried += n;
                if let Pace::BytesPerSecond(rate) = pace {
                    let due = began + Duration::from_secs_f64(carried as f64 / rate.max(1.0));
                    tokio::time::sleep_until(due).await;
                }
            }
        };
        tokio::select! {
            _ = upward => {}
            () = downward => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upstream that sends `bytes` zeros to whoever connects, then closes.
    async fn source(bytes: usize) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let _ = s.write_all(&vec![0u8; bytes]).await;
        });
        addr
    }

    async fn read_all(addr: SocketAddr) -> usize {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.unwrap();
        buf.len()
    }

    #[tokio::test]
    async fn a_throttled_link_is_never_faster_than_its_pace() {
        let stop = CancellationToken::new();
        let link = SlowLink::start(source(10_000).await, Pace::BytesPerSecond(20_000.0), stop.clone())
            .await
            .unwrap();
        let started = Instant::now();
        assert_eq!(read_all(link.addr).await, 10_000, "every byte arrives");
        // 10 kB at 20 kB/s: the last piece is due at 0.5 s, less one piece.
        assert!(started.elapsed() >= Duration::from_millis(480), "{:?}", started.elapsed());
        stop.cancel();
    }

    #[tokio::test]
    async fn a_frozen_link_carries_nothing_until_it_thaws() {
        let stop = CancellationToken::new();
        let link = SlowLink::start(source(1_000).await, Pace::Freezable, stop.clone()).await.unwrap();
        link.freeze(Duration::from_millis(300));
        let started = Instant::now();
        let mut s = TcpStream::connect(link.addr).await.unwrap();
        let mut first = [0u8; 1];
        s.read_exact(&mut first).await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(290), "{:?}", started.elapsed());
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest.len(), 999);
        stop.cancel();
    }
}
