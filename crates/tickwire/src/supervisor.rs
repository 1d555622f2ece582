//! `tickwire gateway --processes N`: runs N gateway worker processes on the same ports.
//!
//! The supervisor reserves each listening address (resolving port 0) with a bound but
//! never-listening `SO_REUSEPORT` socket, starts the workers on those ports, and prints the
//! addresses once every worker listens. It forwards SIGINT/SIGTERM to them, and if one worker
//! dies it stops the others and fails: a half-running gateway would strand that worker's
//! sessions without saying so.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use socket2::Socket;
use tickwire_gateway::GatewayConfig;
use tickwire_gateway::LISTENING_PREFIX;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// How long workers get to start listening, and to stop after SIGTERM.
const WORKER_START: Duration = Duration::from_secs(15);
const WORKER_STOP: Duration = Duration::from_secs(15);

/// Worker `i` serves metrics on the configured port + `i`: checks, before any worker starts,
/// that every one of those ports exists and is free, and names the first that is not.
fn check_metrics_ports(config: &GatewayConfig, processes: u8) -> anyhow::Result<()> {
    let Some(base) = config.metrics.listen else { return Ok(()) };
    if base.port() == 0 {
        return Ok(());
    }
    for index in 0..processes {
        let port = base.port().checked_add(u16::from(index)).with_context(|| {
            format!(
                "metrics port {} + worker {index} is past 65535; pick a lower metrics.listen port",
                base.port()
            )
        })?;
        let addr = SocketAddr::new(base.ip(), port);
        std::net::TcpListener::bind(addr).with_context(|| {
            format!(
                "metrics port {port} for worker {index} (metrics.listen {base} + {index}) is not free; \
                 with --processes {processes}, ports {}..={} must be",
                base.port(),
                u32::from(base.port()) + u32::from(processes) - 1
            )
        })?;
    }
    Ok(())
}

/// Binds (without listening) so the port stays ours while the workers bind it too.
fn reserve(addr: SocketAddr) -> anyhow::Result<(SocketAddr, Socket)> {
    let socket =
        tickwire_transport::reuse_port_socket(addr).with_context(|| format!("cannot bind {addr}"))?;
    let local = socket.local_addr()?.as_socket().context("not an IP socket")?;
    Ok((local, socket))
}

/// The directory of the workers' handoff sockets, through which they hand each other
/// sessions (a resume's socket and its Hello, resume token included): a fresh, unguessable
/// name made with mode 0700, so that no other local user can put a socket of its own there or
/// connect to ours. Removed when dropped.
fn handoff_dir() -> std::io::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("tickwire-gateway-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir()
}

/// Runs the workers until a signal arrives or one of them dies.
pub async fn run(
    config: &GatewayConfig,
    passthrough: &[String],
    processes: u8,
    threads: usize,
) -> anyhow::Result<()> {
    let mut reserved = Vec::new();
    let mut tcp = Vec::new();
    let mut ws = Vec::new();
    for (addrs, out) in [(&config.listen.tcp, &mut tcp), (&config.listen.ws, &mut ws)] {
        for &addr in addrs {
            let (local, socket) = reserve(addr)?;
            reserved.push(socket);
            out.push(local);
        }
    }
    check_metrics_ports(config, processes)?;
    let handoff = handoff_dir().context("creating the workers' handoff directory")?;
    let dir = handoff.path().to_owned();
    let exe = std::env::current_exe().context("cannot find the tickwire executable")?;
    let (exited_tx, mut exited) =
        mpsc::channel::<(u8, std::io::Result<std::process::ExitStatus>)>(processes as usize);
    let mut pids = Vec::new();
    for index in 0..processes {
        let mut child: Child = Command::new(&exe)
            .arg("gateway")
            .args(passthrough)
            .args([
                "--set",
                &format!("listen.tcp={}", crate::toml_list(&tcp)),
                "--set",
                &format!("listen.ws={}", crate::toml_list(&ws)),
            ])
            .args(["--worker", &index.to_string(), "--workers", &processes.to_string()])
            .arg("--handoff-dir")
            .arg(&dir)
            .args(["--threads", &threads.to_string()])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start a gateway worker")?;
        pids.push(child.id().context("worker has no pid")?);
        let stdout = child.stdout.take().context("worker stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let expected = tcp.len() + ws.len();
        let ready = async {
            let mut seen = 0;
            while seen < expected {
                match lines.next_line().await? {
                    Some(line) if line.starts_with(LISTENING_PREFIX) => seen += 1,
                    Some(_) => {}
                    None => bail!("worker {index} exited before listening"),
                }
            }
            anyhow::Ok(())
        };
        tokio::time::timeout(WORKER_START, ready).await.context("a worker did not start in time")??;
        let tx = exited_tx.clone();
        tokio::spawn(async move {
            // Drain the worker's stdout so it never blocks on a full pipe.
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            let status = child.wait().await;
            let _ = tx.send((index, status)).await;
        });
    }
    for addr in &tcp {
        crate::announce(&format!("{LISTENING_PREFIX}tcp://{addr}"));
    }
    for addr in &ws {
        crate::announce(&format!("{LISTENING_PREFIX}ws://{addr}/"));
    }
    tracing::info!(processes, "gateway workers running");
    let result = tokio::select! {
        r = crate::wait_for_signal() => r,
        Some((index, status)) = exited.recv() => Err(anyhow::anyhow!("gateway worker {index} exited unexpectedly: {status:?}")),
    };
    for &pid in &pids {
        // SAFETY: signalling our own children by pid.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    let stopped = async {
        for _ in 0..pids.len() {
            if exited.recv().await.is_none() {
                break;
            }
        }
    };
    if tokio::time::timeout(WORKER_STOP, stopped).await.is_err() {
        tracing::warn!("some workers did not stop in time");
    }
    let _ = handoff.close();
    drop(reserved);
    result
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn the_handoff_directory_is_private_and_fresh() {
        let (a, b) = (handoff_dir().unwrap(), handoff_dir().unwrap());
        assert_ne!(a.path(), b.path());
        let mode = std::fs::metadata(a.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{mode:o}");
    }
}
