//! Where to connect: a TCP address or a WebSocket URL, each with or without TLS.

use std::net::SocketAddr;

use tickwire_transport::{Conn, TlsClient, WsLimits, connect_tcp, connect_tls, connect_ws};

use crate::ClientError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Tcp(SocketAddr),
    /// TLS over TCP; needs [`crate::ConnectOptions::tls`].
    Tls(SocketAddr),
    /// `ws://` or, with [`crate::ConnectOptions::tls`], `wss://`.
    Ws {
        url: String,
        addr: SocketAddr,
    },
}

impl Target {
    /// Parses `host:port`, `tcp://host:port`, `tls://host:port`, `ws://host:port[/path]` or
    /// `wss://host:port[/path]`. Host names are resolved once, here.
    pub async fn parse(s: &str) -> Result<Target, ClientError> {
        let bad = || ClientError::BadTarget(s.to_owned());
        let (scheme, rest) = s.split_once("://").unwrap_or(("tcp", s));
        if !matches!(scheme, "tcp" | "tls" | "ws" | "wss") {
            return Err(bad());
        }
        let hostport = rest.split('/').next().unwrap_or_default();
        let addr = tokio::net::lookup_host(hostport).await.map_err(|_| bad())?.next().ok_or_else(bad)?;
        Ok(match scheme {
            "tcp" => Target::Tcp(addr),
            "tls" => Target::Tls(addr),
            _ => Target::Ws { url: s.to_owned(), addr },
        })
    }

    /// Whether this target needs TLS settings.
    pub fn is_tls(&self) -> bool {
        match self {
            Target::Tcp(_) => false,
            Target::Tls(_) => true,
            Target::Ws { url, .. } => url.starts_with("wss://"),
        }
    }

    /// Connects, from `local` if given; `max_frame_bytes` bounds what a WebSocket peer may
    /// make this side buffer.
    pub(crate) async fn connect(
        &self,
        local: Option<std::net::IpAddr>,
        max_frame_bytes: u32,
        tls: Option<&TlsClient>,
    ) -> Result<Conn, ClientError> {
        if self.is_tls() && tls.is_none() {
            return Err(ClientError::TlsNotConfigured(self.to_string()));
        }
        let tls = tls.filter(|_| self.is_tls());
        let result = match (self, tls) {
            (Target::Tcp(addr), _) => connect_tcp(*addr, local).await.map(Conn::Tcp),
            (Target::Tls(addr), Some(tls)) => connect_tls(*addr, local, tls).await,
            (Target::Ws { url, addr }, tls) => {
                connect_ws(url, *addr, WsLimits::for_frames(max_frame_bytes), tls).await
            }
            (Target::Tls(_), None) => unreachable!("checked above"),
        };
        result.map_err(|source| ClientError::Connect { target: self.to_string(), source })
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Tcp(addr) => write!(f, "tcp://{addr}"),
            Target::Tls(addr) => write!(f, "tls://{addr}"),
            Target::Ws { url, .. } => f.write_str(url),
        }
    }
}
