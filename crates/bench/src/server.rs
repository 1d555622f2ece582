//! Starts the gateway under test as a child process of the bench (the default), so its CPU and
//! memory are measured on their own, and stops it when the bench ends.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use tickwire_gateway::LISTENING_PREFIX;

/// A gateway child process, terminated on drop.
pub struct ChildGateway {
    child: Child,
    pub tcp: SocketAddr,
}

impl ChildGateway {
    /// Runs `<this executable> gateway --processes N --set ...` on a free loopback port and
    /// waits until it prints its TCP address.
    pub fn start(overrides: &[String], processes: u8) -> anyhow::Result<ChildGateway> {
        let exe = std::env::current_exe().context("cannot find the tickwire executable")?;
        let mut cmd = Command::new(exe);
        cmd.arg("gateway")
            .args(["--set", "listen.tcp=[\"127.0.0.1:0\"]", "--set", "listen.ws=[]"])
            .args(["--processes", &processes.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()));
        for o in overrides {
            cmd.args(["--set", o]);
        }
        let mut child = cmd.spawn().context("cannot start the gateway")?;
        let stdout = child.stdout.take().context("gateway stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let tcp = loop {
            let Some(line) = lines.next() else {
                let _ = child.kill();
                bail!("the gateway exited before it was listening");
            };
            let line = line?;
            if let Some(addr) = line.strip_prefix(LISTENING_PREFIX).and_then(|s| s.strip_prefix("tcp://")) {
                break addr.trim().parse().context("gateway printed a bad address")?;
            }
        };
        // Keep draining stdout so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Ok(ChildGateway { child, tcp })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ChildGateway {
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
