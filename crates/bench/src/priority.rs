//! The load's CPU priority. `bench replication` runs its bots on the machine it measures: at
//! the gateway's own priority they take a fair share of the cores from it (and the world's
//! pass waits behind a thousand bots' reads); at a higher nice value they take the cores the
//! gateway leaves, as clients on machines of their own would. A starved bot still counts every
//! update it missed and every late one, so a load that cannot keep up fails the step instead of
//! flattering it.

use std::io;

/// Sets the nice value of each runtime's thread (single-threaded runtimes: one thread each) to
/// `nice`. Threads those threads start later inherit it.
pub async fn lower(runtimes: &[tokio::runtime::Handle], nice: i32) -> anyhow::Result<()> {
    for runtime in runtimes {
        runtime.spawn(async move { set_thread_nice(nice) }).await??;
    }
    Ok(())
}

/// Sets the calling thread's nice value. On Linux the nice value belongs to a thread, and
/// `PRIO_PROCESS` with a thread id changes that thread alone. Raising it needs no privilege.
pub fn set_thread_nice(nice: i32) -> io::Result<()> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    // SAFETY: setpriority reads its three integer arguments only.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread's nice value.
pub fn thread_nice() -> io::Result<i32> {
    // SAFETY: as above; getpriority may return -1 as a value, so errno is cleared first.
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t);
        if nice == -1 && *libc::__errno_location() != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(nice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_the_runtimes_threads_are_lowered() {
        let before = thread_nice().unwrap();
        let runtimes = tickwire_transport::io_threads(2, "nice-test").unwrap();
        lower(&runtimes, (before + 5).min(19)).await.unwrap();
        for runtime in &runtimes {
            let nice = runtime.spawn(async { thread_nice() }).await.unwrap().unwrap();
            assert_eq!(nice, (before + 5).min(19));
        }
        assert_eq!(thread_nice().unwrap(), before, "the caller's thread keeps its priority");
    }
}
