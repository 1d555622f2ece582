//! A real PostgreSQL server for the tests of the Postgres metadata backend: one per test
//! process, started on first use from the system's packages (Debian's `postgresql`, which
//! `scripts/test.sh` installs when it is missing), in a temporary directory, reached only
//! through a Unix socket in that directory (no TCP port, so test processes running at once
//! cannot meet each other's server), except the TLS server below. Each caller gets a database
//! of its own. The server dies
//! with the test process (the thread that started it asks the kernel to send it SIGQUIT then);
//! its directory is removed at exit, and by the next run if the process was killed.
//!
//! [`tls_database`] starts a second server for the tests of TLS: it listens on a free loopback
//! TCP port as well (another is tried if one is taken before the server binds it), takes TCP
//! connections over TLS only (with the certificate the test gives), and serves databases as the
//! first does.
//!
//! Without the server's binaries the tests fail, saying how to install them; set
//! `TICKWIRE_SKIP_POSTGRES=1` to skip the Postgres tests instead (each prints that it was
//! skipped, past the test harness's capture, and passes without testing anything).
//! `TICKWIRE_PG_BIN` names the directory of `initdb` and `postgres` if they are elsewhere.
//!
//! Shared by the crate's unit tests (`meta`, through `#[path]`) and its integration tests
//! (`tests/common`): it uses only std and libc.
#![allow(dead_code)]

use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const PREFIX: &str = "tickwire-pg-";

struct Server {
    /// The socket's directory.
    dir: PathBuf,
    bin: PathBuf,
    user: Option<(u32, u32)>,
    /// The port in the socket's name (`.s.PGSQL.<port>`), and with TLS the TCP port.
    port: u16,
}

/// The port of the server without TLS: only in its socket's name, no TCP listener.
const PORT: u16 = 5432;

/// What the TLS server presents: its certificate chain and key, PEM.
pub struct TlsFiles {
    pub cert_pem: String,
    pub key_pem: String,
}

/// Whether the Postgres tests are skipped (`TICKWIRE_SKIP_POSTGRES=1`).
pub fn skipped() -> bool {
    std::env::var_os("TICKWIRE_SKIP_POSTGRES").is_some_and(|v| v == "1")
}

static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();
static TLS_SERVER: OnceLock<Result<Server, String>> = OnceLock::new();
static NEXT_DB: AtomicUsize = AtomicUsize::new(0);

/// A new, empty database on the test server, as a URL; `None` (after saying so) when the
/// Postgres tests are skipped. Panics when the server cannot be started.
pub fn database() -> Option<String> {
    let server = running(&SERVER, || start(None))?;
    Some(format!(
        "host={} port={PORT} user=postgres dbname={}",
        server.dir.display(),
        server.create_database()
    ))
}

/// A new, empty database on the TLS server (started on first use with `files`; later calls
/// get the same server), as its TCP port and its name; `None` when the Postgres tests are
/// skipped. Connections to it over TCP must use TLS, as user `postgres`, with no password.
pub fn tls_database(files: impl FnOnce() -> TlsFiles) -> Option<(u16, String)> {
    let server = running(&TLS_SERVER, || start(Some(files())))?;
    Some((server.port, server.create_database()))
}

/// The server in `cell`, started with `start` on first use; `None` (after saying so) when the
/// Postgres tests are skipped. Panics when the server cannot be started.
fn running(
    cell: &'static OnceLock<Result<Server, String>>,
    start: impl FnOnce() -> Result<Server, String>,
) -> Option<&'static Server> {
    if skipped() {
        // Not `eprintln!`, which the test harness captures and drops for a passing test.
        use std::io::Write;
        let _ = std::io::stderr().write_all(b"Postgres test skipped: TICKWIRE_SKIP_POSTGRES=1\n");
        return None;
    }
    match cell.get_or_init(start) {
        Ok(server) => Some(server),
        Err(e) => panic!("{e}"),
    }
}

impl Server {
    /// Creates a database of its own for the caller: its name.
    fn create_database(&self) -> String {
        let name = format!("t{}", NEXT_DB.fetch_add(1, Ordering::Relaxed));
        let out = self
            .command("psql")
            .arg("-h")
            .arg(&self.dir)
            .args(["-p", &self.port.to_string(), "-U", "postgres", "-d", "postgres", "-q"])
            .args(["-v", "ON_ERROR_STOP=1", "-c", &format!("CREATE DATABASE {name}")])
            .output()
            .unwrap_or_else(|e| panic!("running psql: {e}"));
        assert!(out.status.success(), "CREATE DATABASE: {}", String::from_utf8_lossy(&out.stderr));
        name
    }

    /// One of the server's programs, run as the server's user.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        let mut cmd = Command::new(if path.exists() { path } else { PathBuf::from(program) });
        as_user(&mut cmd, self.user, false);
        cmd
    }
}

/// Makes `cmd` run as `user` (uid, gid), and with `die_with_parent`, get SIGQUIT (Postgres's
/// immediate shutdown) when the thread that spawned it ends.
fn as_user(cmd: &mut Command, user: Option<(u32, u32)>, die_with_parent: bool) {
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if let Some((uid, gid)) = user
                && (libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0)
            {
                return Err(io::Error::last_os_error());
            }
            // After the change of user, which clears it.
            if die_with_parent && libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGQUIT) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The directory of `initdb` and `postgres`: `TICKWIRE_PG_BIN`, else Debian's newest
/// `/usr/lib/postgresql/<major>/bin`, else the directory on `PATH` that has `initdb`.
fn bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("TICKWIRE_PG_BIN") {
        return Some(dir.into());
    }
    let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| bin.join("initdb").exists())
        .collect();
    debian.sort();
    if let Some((_, bin)) = debian.pop() {
        return Some(bin);
    }
    std::env::split_paths(&std::env::var_os("PATH")?).find(|dir| dir.join("initdb").exists())
}

/// The server's user: `postgres` when running as root (Postgres refuses root), else ours.
fn server_user() -> Result<Option<(u32, u32)>, String> {
    // SAFETY: geteuid has no preconditions; getpwnam's result is read before any other call.
    unsafe {
        if libc::geteuid() != 0 {
            return Ok(None);
        }
        let pw = libc::getpwnam(c"postgres".as_ptr());
        if pw.is_null() {
            return Err("running as root, and there is no `postgres` user to run PostgreSQL as".into());
        }
        Ok(Some(((*pw).pw_uid, (*pw).pw_gid)))
    }
}

/// Where the server's directory goes: `/tmp`, not `$TMPDIR`, which may be too long for the
/// socket's path (at most 107 bytes).
fn socket_parent() -> PathBuf {
    let tmp = Path::new("/tmp");
    if tmp.is_dir() { tmp.to_owned() } else { std::env::temp_dir() }
}

/// Removes what earlier test processes, now gone, left.
fn remove_stale() {
    for entry in std::fs::read_dir(socket_parent()).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else { continue };
        let pid = pid.strip_prefix("tls-").unwrap_or(pid);
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Removes a server's directory when the process exits (the server is sent SIGQUIT as its
/// thread ends; a file it still has open goes when it does).
fn remove_at_exit(root: &Path) {
    static ROOTS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    extern "C" fn remove() {
        for root in ROOTS.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = std::fs::remove_dir_all(root);
        }
    }
    let mut roots = ROOTS.lock().unwrap_or_else(|p| p.into_inner());
    if roots.is_empty() {
        // SAFETY: `remove` is a plain function that stays valid for the life of the process.
        unsafe { libc::atexit(remove) };
    }
    roots.push(root.to_owned());
}

/// A TCP port on loopback that nothing listens on (as of now).
fn free_port() -> Result<u16, String> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("finding a free port: {e}"))?;
    Ok(listener.local_addr().map_err(|e| e.to_string())?.port())
}

/// Writes a file the server reads, owned by its user, readable by it alone (Postgres refuses
/// a key others can read).
fn write_private(path: &Path, text: &str, user: Option<(u32, u32)>) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|e| e.to_string())?;
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn start(tls: Option<TlsFiles>) -> Result<Server, String> {
    let bin = bin_dir().ok_or(
        "the Postgres tests need PostgreSQL's server (initdb, postgres): `apt-get install postgresql`, \
         or set TICKWIRE_PG_BIN to their directory, or TICKWIRE_SKIP_POSTGRES=1 to skip these tests",
    )?;
    let user = server_user()?;
    remove_stale();
    let kind = if tls.is_some() { "tls-" } else { "" };
    let root = socket_parent().join(format!("{PREFIX}{kind}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).map_err(|e| format!("creating {}: {e}", root.display()))?;
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(&root, Some(uid), Some(gid))
            .map_err(|e| format!("chown {}: {e}", root.display()))?;
    }
    let data = root.join("data");
    let mut server = Server { dir: root.clone(), bin, user, port: PORT };
    let out = server
        .command("initdb")
        .arg("-D")
        .arg(&data)
        .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--no-locale"])
        .output()
        .map_err(|e| format!("running initdb: {e}"))?;
    if !out.status.success() {
        return Err(format!("initdb failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    remove_at_exit(&root);
    // A test server: nothing here needs to survive a crash. Each HTTP test server keeps its
    // pool open to the end of the process, so more connections than the default 100.
    let mut settings: Vec<String> =
        ["max_connections=500", "fsync=off", "synchronous_commit=off", "full_page_writes=off"]
            .map(String::from)
            .into();
    let Some(files) = tls else {
        settings.push("listen_addresses=".into());
        server.launch(&data, &settings)?;
        return Ok(server);
    };
    // TCP on loopback, over TLS only: no `host` line, so a connection without TLS is refused.
    let (cert, key) = (data.join("server.crt"), data.join("server.key"));
    write_private(&cert, &files.cert_pem, user)?;
    write_private(&key, &files.key_pem, user)?;
    write_private(
        &data.join("pg_hba.conf"),
        "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
        user,
    )?;
    settings.extend(["listen_addresses=127.0.0.1".into(), "ssl=on".into()]);
    settings.push(format!("ssl_cert_file={}", cert.display()));
    settings.push(format!("ssl_key_file={}", key.display()));
    // The port was free when chosen; something else may bind it before the server does.
    for tries_left in (0..5).rev() {
        server.port = free_port()?;
        match server.launch(&data, &settings) {
            Err(e) if e.contains("Address already in use") && tries_left > 0 => continue,
            launched => return launched.map(|()| server),
        }
    }
    unreachable!("the last try returns")
}

impl Server {
    /// Starts `postgres` on `data` with `settings`, on `self.port`, and waits until it takes
    /// connections; its error and log if it stops first.
    fn launch(&self, data: &Path, settings: &[String]) -> Result<(), String> {
        let root = &self.dir;
        let log = std::fs::File::create(root.join("log")).map_err(|e| format!("creating the log: {e}"))?;
        let mut cmd = Command::new(self.bin.join("postgres"));
        cmd.arg("-D").arg(data).arg("-k").arg(root).args(["-p", &self.port.to_string()]);
        for setting in settings {
            cmd.arg("-c").arg(setting);
        }
        cmd.stdin(Stdio::null()).stdout(log.try_clone().map_err(|e| e.to_string())?).stderr(log);
        as_user(&mut cmd, self.user, true);
        // The thread that spawns the server lives as long as the process, waiting for it: the
        // server gets SIGQUIT when this thread ends, that is when the process does.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("test-postgres".into())
            .spawn(move || match cmd.spawn() {
                Ok(mut child) => {
                    let _ = tx.send(Ok(()));
                    let status = child.wait();
                    let _ = tx.send(Err(format!("postgres exited: {status:?}")));
                }
                Err(e) => {
                    let _ = tx.send(Err(format!("starting postgres: {e}")));
                }
            })
            .map_err(|e| e.to_string())?;
        rx.recv().map_err(|e| e.to_string())??;
        let deadline = Instant::now() + Duration::from_secs(30);
        let log = || std::fs::read_to_string(root.join("log")).unwrap_or_default();
        loop {
            if let Ok(Err(e)) = rx.try_recv() {
                return Err(format!("{e}; its log:\n{}", log()));
            }
            let ready = self
                .command("pg_isready")
                .arg("-q")
                .arg("-h")
                .arg(root)
                .args(["-p", &self.port.to_string()])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("postgres did not accept connections within 30 s; its log:\n{}", log()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
