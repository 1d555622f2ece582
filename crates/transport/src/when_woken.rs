//! A future that is polled only after it asked to be.
//!
//! `tokio::select!` polls every branch each time its task wakes, whichever branch woke it. For
//! most branches a poll that finds nothing is cheap, but not for a cancellation token's
//! `cancelled()`: each poll locks the token's tree node and then the `Notify` waiter list, both
//! shared by every task that waits on the token. A gateway session waits on the gateway's token
//! in the same `select!` as its socket and outbox, so each message it sends or receives took
//! those two locks, on both cores at once. [`WhenWoken`] wraps such a future: the inner future
//! gets a waker of its own, and is polled again only after that waker fired (or on the first
//! poll); every other poll costs an atomic swap on memory only this future uses.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// Polls `inner` only when its own waker fired since its last poll (and on the first poll).
pub fn when_woken<F: Future>(inner: F) -> WhenWoken<F> {
    WhenWoken { inner: Box::pin(inner), gate: WakeGate::new() }
}

/// See [`when_woken`].
#[derive(Debug)]
pub struct WhenWoken<F> {
    inner: Pin<Box<F>>,
    gate: WakeGate,
}

impl<F: Future> Future for WhenWoken<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        this.gate.poll(cx, |cx| this.inner.as_mut().poll(cx))
    }
}

/// The gate of [`when_woken`], for something polled through a function rather than a future
/// of its own (a channel's `poll_recv` in a `select!` loop).
pub struct WakeGate {
    shared: Arc<Gate>,
    /// `shared` as a waker, made once.
    waker: Waker,
}

impl std::fmt::Debug for WakeGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WakeGate").field("woken", &self.shared.woken.load(Ordering::Relaxed)).finish()
    }
}

impl Default for WakeGate {
    fn default() -> Self {
        WakeGate::new()
    }
}

impl WakeGate {
    pub fn new() -> WakeGate {
        let shared = Arc::new(Gate { woken: AtomicBool::new(true), outer: AtomicWaker::new() });
        WakeGate { waker: Waker::from(shared.clone()), shared }
    }

    /// Calls `poll` with the gate's own waker if that waker fired since the last call, or the
    /// last call was the first or returned `Ready` (there may be more: a `Ready` registers no
    /// waker); `Pending` without calling it otherwise. `cx`'s waker is woken when the gate's
    /// is.
    pub fn poll<T>(&self, cx: &mut Context<'_>, poll: impl FnOnce(&mut Context<'_>) -> Poll<T>) -> Poll<T> {
        // Registered before the flag is read: a wake after the read finds this waker and
        // wakes the task, so none is lost.
        self.shared.outer.register(cx.waker());
        if !self.shared.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        let result = poll(&mut Context::from_waker(&self.waker));
        if result.is_ready() {
            self.shared.woken.store(true, Ordering::Release);
        }
        result
    }
}

/// The inner future's waker: records the wake, and wakes whoever polled the gate last.
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

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
    fn a_gated_channel_is_read_to_the_end_after_one_wake() {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<u32>(4);
        let gate = WakeGate::new();
        let task = Arc::new(Count::default());
        let task_waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&task_waker);
        assert!(gate.poll(&mut cx, |cx| rx.poll_recv(cx)).is_pending(), "empty");
        assert!(gate.poll(&mut cx, |cx| rx.poll_recv(cx)).is_pending(), "not woken");
        tx.try_send(1).unwrap();
        tx.try_send(2).unwrap();
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "the send woke the task through the gate");
        // After a `Ready`, the next poll reaches the channel again: the second item is read
        // without another wake.
        assert_eq!(gate.poll(&mut cx, |cx| rx.poll_recv(cx)), Poll::Ready(Some(1)));
        assert_eq!(gate.poll(&mut cx, |cx| rx.poll_recv(cx)), Poll::Ready(Some(2)));
        assert!(gate.poll(&mut cx, |cx| rx.poll_recv(cx)).is_pending());
        drop(tx);
        assert_eq!(gate.poll(&mut cx, |cx| rx.poll_recv(cx)), Poll::Ready(None), "closing wakes it");
    }

    #[tokio::test]
    async fn a_cancelled_token_ends_a_select_loop_that_polls_it_through_the_gate() {
        let token = tokio_util::sync::CancellationToken::new();
        let cancelled = when_woken(token.clone().cancelled_owned());
        tokio::pin!(cancelled);
        let (tx, mut rx) = tokio::sync::mpsc::channel::<u32>(8);
        let canceller = tokio::spawn({
            let token = token.clone();
            async move {
                for i in 0..3 {
                    tx.send(i).await.unwrap();
                }
                token.cancel();
                // Kept open: the loop must end on the token, not on a closed channel.
                std::future::pending::<()>().await;
            }
        });
        let mut got = Vec::new();
        loop {
            tokio::select! {
                biased;
                () = &mut cancelled => break,
                Some(i) = rx.recv() => got.push(i),
            }
        }
        assert!(token.is_cancelled());
        assert!(got.len() <= 3);
        canceller.abort();
    }
}
