//! Ctrl-C for the benches: the first one stops the load (the run's future is dropped, and with
//! it the child processes it started), and the caller keeps and reports what finished.

use std::future::Future;

/// Runs `work` until it ends or Ctrl-C comes; `Ok(true)` if it was interrupted. If Ctrl-C cannot
/// be listened for, the work simply runs to its end.
pub async fn until_interrupted(work: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<bool> {
    tokio::select! {
        done = work => done.map(|()| false),
        Ok(()) = tokio::signal::ctrl_c() => Ok(true),
    }
}
