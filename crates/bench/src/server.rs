//! Starts the server under test (the gateway, or the DDC) as a child process of the bench (the
//! default), so its CPU and memory are measured on their own, and stops it when the bench
//! ends.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use tickwire_gateway::LISTENING_PREFIX;

/// A gateway child process, terminated on drop.
pub struct ChildGateway {
    child: ChildServer,
    pub tcp: SocketAddr,
}

impl ChildGateway {
    /// Runs `<this executable> gateway --processes N --set ...` on a free loopback port and
    /// waits until it prints its TCP address.
    pub fn start(overrides: &[String], processes: u8) -> anyhow::Result<ChildGateway> {
        let mut args: Vec<String> =
            ["gateway", "--set", "listen.tcp=[\"127.0.0.1:0\"]", "--set", "listen.ws=[]"]
                .map(String::from)
                .into();
        args.extend(["--processes".into(), processes.to_string()]);
        for o in overrides {
            args.extend(["--set".into(), o.clone()]);
        }
        let (child, addr) = ChildServer::start(&args, "tcp://")?;
        let tcp = addr.parse().context("gateway printed a bad address")?;
        Ok(ChildGateway { child, tcp })
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// The child process (stopped when dropped) and its TCP address.
    pub fn into_parts(self) -> (ChildServer, SocketAddr) {
        (self.child, self.tcp)
    }
}

/// A child `tickwire` process, terminated (SIGTERM, then SIGKILL) on drop.
pub struct ChildServer {
    child: Child,
}

impl ChildServer {
    /// Runs `<this executable> ARGS` and waits until it prints its listening line for
    /// `scheme` (e.g. `tcp://`); returns the child and the rest of that line, trimmed.
    pub fn start(args: &[String], scheme: &str) -> anyhow::Result<(ChildServer, String)> {
        let exe = std::env::current_exe().context("cannot find the tickwire executable")?;
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
            // A bench's own DDC is on a temp directory: never on a database the caller's
            // environment names (which may be production's).
            .env_remove("TICKWIRE_DDC_REFS")
            .env_remove("TICKWIRE_DDC_BLOBS");
        let mut child = cmd.spawn().with_context(|| format!("cannot start `tickwire {}`", args[0]))?;
        let stdout = child.stdout.take().context("child stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let rest = loop {
            let Some(line) = lines.next() else {
                let _ = child.kill();
                let _ = child.wait();
                bail!("`tickwire {}` exited before it was listening", args[0]);
            };
            let line = line?;
            if let Some(rest) = line.strip_prefix(LISTENING_PREFIX).and_then(|s| s.strip_prefix(scheme)) {
                break rest.trim().to_owned();
            }
        };
        // Keep draining stdout so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Ok((ChildServer { child }, rest))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        // SIGTERM for a graceful stop, then SIGKILL if it lingers.
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
