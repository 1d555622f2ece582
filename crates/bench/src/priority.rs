//! The load's CPU priority. `bench replication` runs its bots on the machine it measures: at
//! the gateway's own priority they take a fair share of the cores from it, and the world's pass
//! waits behind a thousand bots' reads. Raised a few nice levels above the gateway's, they take
//! the cores the gateway leaves. That is not the same as clients on machines of their own: a
//! starved bot reads late, the gateway's window merges what it could not send, and the clients'
//! rate rules (p5, p1) fail the step, a failure that may be the load's rather than the
//! gateway's. Each step reports how late the bots' threads ran (`sim/load_lag.rs`) to tell
//! them apart.

use std::io;

/// Raises the nice value of each runtime's thread (single-threaded runtimes: one thread each)
/// `by` levels above the calling thread's, at most to 19. Threads those threads start later
/// inherit it. Returns the levels actually added (less than `by` near 19; 0 for `by` 0, which
/// changes nothing).
pub async fn lower(runtimes: &[tokio::runtime::Handle], by: i32) -> anyhow::Result<i32> {
    let base = thread_nice()?;
    let target = base.saturating_add(by.max(0)).min(19);
    if target == base {
        return Ok(0);
    }
    for runtime in runtimes {
        let nice = runtime
            .spawn(async move {
                set_thread_nice(target)?;
                thread_nice()
            })
            .await??;
        anyhow::ensure!(nice == target, "a bot thread is at nice {nice}, not {target}");
    }
    Ok(target - base)
}

/// Sets the calling thread's nice value. On Linux the nice value belongs to a thread, and
/// `PRIO_PROCESS` with `who` 0 is the calling thread alone. Raising it needs no privilege.
fn set_thread_nice(nice: i32) -> io::Result<()> {
    // SAFETY: setpriority reads its three integer arguments only.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread's nice value.
pub fn thread_nice() -> io::Result<i32> {
    // SAFETY: getpriority reads its two integer arguments; it may return -1 as a value, so
    // errno is cleared first and read after (errno is thread-local).
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
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
    async fn only_the_runtimes_threads_are_raised_relative_to_the_caller() {
        let before = thread_nice().unwrap();
        let runtimes = tickwire_transport::io_threads(2, "nice-test").unwrap();
        let added = lower(&runtimes, 5).await.unwrap();
        assert_eq!(added, (before + 5).min(19) - before);
        for runtime in &runtimes {
            let nice = runtime.spawn(async { thread_nice() }).await.unwrap().unwrap();
            assert_eq!(nice, before + added);
        }
        assert_eq!(thread_nice().unwrap(), before, "the caller's thread keeps its priority");
        assert_eq!(lower(&runtimes, 0).await.unwrap(), 0, "0 changes nothing");
    }
}
