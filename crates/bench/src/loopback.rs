//! Where a load test may go: this machine. A bench pointed at a running server (`--target`)
//! sends it thousands of connections or 20 MiB uploads at a fixed rate; aimed by mistake at a
//! shared host, that is an attack. So a target must resolve to loopback addresses only, unless
//! `--allow-remote` says the server is the caller's own.

use anyhow::bail;

/// Fails unless every address `host` resolves to (with `port`) is a loopback address, or
/// `allow_remote` is set.
pub async fn require_loopback(host: &str, port: u16, allow_remote: bool) -> anyhow::Result<()> {
    if allow_remote {
        return Ok(());
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host, port)).await?.collect();
    if addrs.is_empty() {
        bail!("--target {host}: resolves to no address");
    }
    if let Some(remote) = addrs.iter().find(|a| !a.ip().is_loopback()) {
        bail!(
            "--target {host} resolves to {}, not a loopback address: load tests run against this \
             machine only; pass --allow-remote to load a server of your own elsewhere",
            remote.ip()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_loopback_targets_pass_unless_remote_is_allowed() {
        require_loopback("127.0.0.1", 80, false).await.unwrap();
        require_loopback("[::1]", 80, false).await.unwrap();
        require_loopback("localhost", 80, false).await.unwrap();
        let refused = require_loopback("192.0.2.7", 80, false).await.unwrap_err();
        assert!(refused.to_string().contains("not a loopback address"), "{refused}");
        require_loopback("192.0.2.7", 80, true).await.unwrap();
    }
}
