//! A future that is polled only after it asked to be.
//!
//! `tokio::select!` polls every branch each time its task wakes, whichever branch woke it. For
//! most branches a poll that finds nothing touches only the task's own memory, but not for a
//! cancellation token's `cancelled()`: in tokio-util 0.7 each poll locks the token's tree node
//! and then the waiter list of its `Notify`, both shared by every task that waits on the token.
//! A gateway session waits on the gateway's token in the same `select!` as its socket and its
//! outbox, so each message it sent or received took those two process-wide locks, from both
//! cores. [`WhenWoken`] gives the inner future a waker of its own and polls it again only after
//! that waker fired (or on the first poll); any other poll registers the task's waker and swaps
//! one flag, on memory only this future uses.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// Polls `inner` only when its own waker fired since its last poll, on the first poll, and
/// after it returned `Ready`.
pub fn when_woken<F: Future>(inner: F) -> WhenWoken<F> {
    let gate = Arc::new(Gate { woken: AtomicBool::new(true), outer: AtomicWaker::new() });
    WhenWoken { inner: Box::pin(inner), waker: Waker::from(gate.clone()), gate }
}

/// See [`when_woken`].
pub struct WhenWoken<F> {
    inner: Pin<Box<F>>,
    gate: Arc<Gate>,
    /// `gate` as a waker, made once.
    waker: Waker,
}

impl<F> std::fmt::Debug for WhenWoken<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WhenWoken").field("woken", &self.gate.woken.load(Ordering::Relaxed)).finish()
    }
}

/// The inner future's waker: records the wake, and wakes whoever polled the wrapper last.
struct Gate {
    woken: AtomicBool,
    outer: AtomicWaker,
}

impl Wake for Gate {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.outer.wake();
    }
}

impl<F: Future> Future for WhenWoken<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        // Registered before the flag is read: a wake after the read finds this waker and
        // wakes the task, so none is lost. (`&mut self`: one poller at a time.)
        this.gate.outer.register(cx.waker());
        if !this.gate.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        let result = this.inner.as_mut().poll(&mut Context::from_waker(&this.waker));
        if result.is_ready() {
            // A `Ready` registers no waker: a poll after it reaches the inner future again, as
            // if there were no gate (a `cancelled()` answers `Ready` again; what another
            // future does when polled after it completed is its own contract).
            this.gate.woken.store(true, Ordering::Release);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use super::*;

    /// Counts its polls and keeps the last waker; ready once `ready` is set.
    #[derive(Default)]
    struct Probe {
        polls: AtomicUsize,
        ready: AtomicBool,
        waker: std::sync::Mutex<Option<Waker>>,
    }

    struct ProbeFuture(Arc<Probe>);

    impl Future for ProbeFuture {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.0.polls.fetch_add(1, Ordering::SeqCst);
            if self.0.ready.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            *self.0.waker.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    /// A waker that counts its wakes.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_inner_future_is_polled_only_after_its_waker_fired() {
        let probe = Arc::new(Probe::default());
        let task = Arc::new(Count::default());
        let task_waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&task_waker);
        let mut fut = when_woken(ProbeFuture(probe.clone()));
        let mut fut = Pin::new(&mut fut);

        assert!(fut.as_mut().poll(&mut cx).is_pending());
        assert_eq!(probe.polls.load(Ordering::SeqCst), 1, "the first poll reaches the inner future");
        for _ in 0..5 {
            assert!(fut.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(probe.polls.load(Ordering::SeqCst), 1, "polls without a wake stop at the gate");

        probe.ready.store(true, Ordering::SeqCst);
        assert!(fut.as_mut().poll(&mut cx).is_pending(), "ready, but not woken: not polled");
        let inner_waker = probe.waker.lock().unwrap().take().expect("the inner future kept a waker");
        inner_waker.wake();
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "the inner wake woke the task");
        assert!(fut.as_mut().poll(&mut cx).is_ready());
        assert_eq!(probe.polls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_wake_reaches_the_latest_task_waker() {
        let probe = Arc::new(Probe::default());
        let (first, second) = (Arc::new(Count::default()), Arc::new(Count::default()));
        let mut fut = when_woken(ProbeFuture(probe.clone()));
        let mut fut = Pin::new(&mut fut);
        let w1 = Waker::from(first.clone());
        assert!(fut.as_mut().poll(&mut Context::from_waker(&w1)).is_pending());
        // Polled again from another task (as a future moved between tasks would be).
        let w2 = Waker::from(second.clone());
        assert!(fut.as_mut().poll(&mut Context::from_waker(&w2)).is_pending());
        probe.waker.lock().unwrap().take().unwrap().wake();
        assert_eq!((first.0.load(Ordering::SeqCst), second.0.load(Ordering::SeqCst)), (0, 1));
    }

    #[test]
    fn a_poll_after_ready_reaches_the_inner_future_again() {
        let token = tokio_util::sync::CancellationToken::new();
        token.cancel();
        let task = Arc::new(Count::default());
        let waker = Waker::from(task);
        let mut cx = Context::from_waker(&waker);
        let mut fut = when_woken(token.cancelled_owned());
        assert!(Pin::new(&mut fut).poll(&mut cx).is_ready());
        assert!(Pin::new(&mut fut).poll(&mut cx).is_ready(), "as a bare cancelled() would");
    }

    /// A token cancelled from another thread while a `select!` loop is kept busy by a producer
    /// that never pauses, so the cancel lands while the loop polls the gate, many times over:
    /// every loop ends, none waits for a wake that was lost. (It does not force the few
    /// instructions between the registration and the flag's read; the tests above pin what
    /// each does.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 3)]
    async fn a_token_cancelled_during_a_busy_loop_always_ends_it() {
        for round in 0..300u32 {
            let token = tokio_util::sync::CancellationToken::new();
            let (tx, mut rx) = tokio::sync::mpsc::channel::<u32>(64);
            let producing = tokio_util::sync::CancellationToken::new();
            let producer = tokio::spawn({
                let producing = producing.clone();
                async move {
                    let mut i = 0u32;
                    while !producing.is_cancelled() {
                        if tx.try_send(i).is_ok() {
                            i = i.wrapping_add(1);
                        }
                        tokio::task::yield_now().await;
                    }
                }
            });
            let looping = tokio::spawn({
                let token = token.clone();
                async move {
                    let cancelled = when_woken(token.cancelled_owned());
                    tokio::pin!(cancelled);
                    let mut got = 0u64;
                    loop {
                        tokio::select! {
                            biased;
                            () = &mut cancelled => return got,
                            Some(_) = rx.recv() => got += 1,
                        }
                    }
                }
            });
            // Cancel at a different point of the loop's work each round.
            for _ in 0..(round % 7) {
                tokio::task::yield_now().await;
            }
            token.cancel();
            tokio::time::timeout(Duration::from_secs(5), looping)
                .await
                .unwrap_or_else(|_| panic!("round {round}: the loop missed the cancel"))
                .unwrap();
            producing.cancel();
            producer.await.unwrap();
        }
    }
}
