//! Where to connect: a TCP address, or a WebSocket URL.

use std::net::SocketAddr;

use tickwire_transport::{Conn, WsLimits, connect_tcp, connect_ws};

use crate::ClientError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Tcp(SocketAddr),
    Ws { url: String, addr: SocketAddr },
}

impl Target {
    /// Parses `host:port`, `tcp://host:port` or `ws://host:port[/path]`. Host names are
    /// resolved once, here.
    pub async fn parse(s: &str) -> Result<Target, ClientError> {
        let bad = || ClientError::BadTarget(s.to_owned());
        let (ws, rest) = match s.split_once("://") {
            Some(("ws", rest)) => (true, rest),
            Some(("tcp", rest)) => (false, rest),
            Some(_) => return Err(bad()),
            None => (false, s),
        };
        let hostport = rest.split('/').next().unwrap_or_default();
        let addr = tokio::net::lookup_host(hostport).await.map_err(|_| bad())?.next().ok_or_else(bad)?;
        Ok(if ws { Target::Ws { url: s.to_owned(), addr } } else { Target::Tcp(addr) })
    }

    /// Connects, from `local` if given; `max_frame_bytes` bounds what a WebSocket peer may
    /// make this side buffer.
    pub(crate) async fn connect(
        &self,
        local: Option<std::net::IpAddr>,
        max_frame_bytes: u32,
    ) -> Result<Conn, ClientError> {
        let result = match self {
            Target::Tcp(addr) => connect_tcp(*addr, local).await.map(Conn::Tcp),
            Target::Ws { url, addr } => connect_ws(url, *addr, WsLimits::for_frames(max_frame_bytes)).await,
        };
        result.map_err(|source| ClientError::Connect { target: self.to_string(), source })
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Tcp(addr) => write!(f, "tcp://{addr}"),
            Target::Ws { url, .. } => f.write_str(url),
        }
    }
}
