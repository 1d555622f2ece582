//! Waking tasks on other I/O threads in batches.
//!
//! Each I/O thread runs a current-thread tokio runtime. A task woken from another thread is
//! queued there with one syscall (the runtime unparks its driver on every wake from outside),
//! so a fan-out pass that queues a message to each of 1,000 sessions costs about 500 syscalls,
//! one per session on the other thread. Inside [`batch`], a wake of a [`deferrable`] waker
//! that belongs to another I/O thread is held back, and when the batch ends each such thread
//! gets one task that wakes all of its sessions: one syscall per thread per batch (a fan-out pass
//! is one batch).
//!
//! Only the wake waits, never the data: what the pass queued is in the queue at once, in
//! order, and the woken task finds it there. A batch lasts as long as the synchronous closure
//! it wraps, and holds one waker per wake in it.

use std::cell::{Cell, RefCell};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Wake, Waker};

use tokio::runtime::Handle;

/// Every I/O thread's runtime, indexed by the number each thread got when it registered.
static THREADS: Mutex<Vec<Handle>> = Mutex::new(Vec::new());

thread_local! {
    /// This thread's index in `THREADS`, if it is an I/O thread.
    static THIS_THREAD: Cell<Option<usize>> = const { Cell::new(None) };
    /// The wakes held back by the [`batch`] running on this thread, per I/O thread.
    static HELD: RefCell<Option<Vec<Vec<Waker>>>> = const { RefCell::new(None) };
}

/// Records the calling thread as an I/O thread running `handle`'s runtime.
pub(crate) fn register(handle: Handle) {
    let mut threads = THREADS.lock().unwrap_or_else(PoisonError::into_inner);
    threads.push(handle);
    THIS_THREAD.set(Some(threads.len() - 1));
}

/// The index of the I/O thread the caller runs on, if it is one.
pub fn io_thread() -> Option<usize> {
    THIS_THREAD.get()
}

/// The runtime of I/O thread `io`, to run a task there.
pub fn io_runtime(io: usize) -> Option<Handle> {
    THREADS.lock().unwrap_or_else(PoisonError::into_inner).get(io).cloned()
}

/// `task`'s waker, in a form that a [`batch`] on another thread may hold back until it ends.
/// Off an I/O thread it is `task` itself. Call it from the task's own poll: the waker is taken
/// to belong to a task of the calling thread's runtime, which is where a held wake is sent.
pub fn deferrable(task: &Waker) -> Waker {
    match io_thread() {
        Some(io) => Waker::from(Arc::new(Deferred { task: task.clone(), io })),
        None => task.clone(),
    }
}

/// Runs `f`; the wakes of deferrable wakers of other I/O threads during it happen when it
/// returns (or unwinds), through one task per thread that has more than one. Nested batches
/// join the outer one.
pub fn batch<R>(f: impl FnOnce() -> R) -> R {
    let outermost = HELD.with(|held| {
        let mut held = held.borrow_mut();
        let outermost = held.is_none();
        held.get_or_insert_with(Vec::new);
        outermost
    });
    if !outermost {
        return f();
    }
    struct Release;
    impl Drop for Release {
        fn drop(&mut self) {
            release(HELD.try_with(|held| held.borrow_mut().take()).ok().flatten().unwrap_or_default());
        }
    }
    let _release = Release;
    f()
}

/// Wakes what a batch held back: each I/O thread with more than one held wake gets one task that
/// wakes them in order.
fn release(held: Vec<Vec<Waker>>) {
    let mut threads: Option<Vec<Handle>> = None;
    for (io, wakers) in held.into_iter().enumerate() {
        if wakers.len() < 2 {
            // One wake costs one syscall either way: wake it at once rather than through a task.
            wakers.into_iter().for_each(Waker::wake);
            continue;
        }
        // Cloned out, so no waker runs under the lock (the list only grows, at start-up).
        let threads =
            threads.get_or_insert_with(|| THREADS.lock().unwrap_or_else(PoisonError::into_inner).clone());
        match threads.get(io) {
            // A runtime that has shut down drops the task, and with it wakers of tasks that
            // are gone too.
            Some(handle) => drop(handle.spawn(async move { wakers.into_iter().for_each(Waker::wake) })),
            None => wakers.into_iter().for_each(Waker::wake),
        }
    }
}

/// Caches [`deferrable`]'s waker for a task that polls one source again and again, so the
/// source sees the same waker each time (and can tell it wakes the same task).
#[derive(Debug, Default)]
pub struct DeferrableWaker {
    /// The task's waker, and its deferrable form.
    cached: Option<(Waker, Waker)>,
}

impl DeferrableWaker {
    /// The deferrable form of `task`.
    pub fn get(&mut self, task: &Waker) -> &Waker {
        if !self.cached.as_ref().is_some_and(|(cached, _)| cached.will_wake(task)) {
            self.cached = None;
        }
        let (_, deferred) = self.cached.get_or_insert_with(|| (task.clone(), deferrable(task)));
        deferred
    }
}

/// A task's waker, remembered with the I/O thread the task runs on.
struct Deferred {
    task: Waker,
    io: usize,
}

impl Wake for Deferred {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // `try_with`: during thread-local teardown there is no batch; wake at once.
        let held = HELD.try_with(|held| {
            // Busy only if waking re-entered this code (tokio's wakers do not).
            let Ok(mut held) = held.try_borrow_mut() else { return false };
            match held.as_mut() {
                Some(per_thread) if io_thread() != Some(self.io) => {
                    if per_thread.len() <= self.io {
                        per_thread.resize_with(self.io + 1, Vec::new);
                    }
                    per_thread[self.io].push(self.task.clone());
                    true
                }
                // No batch here, or the task is on this thread (a local wake costs nothing).
                _ => false,
            }
        });
        if !held.unwrap_or(false) {
            self.task.wake_by_ref();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// Counts its wakes.
    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counter() -> (Arc<Counter>, Waker) {
        let counter = Arc::new(Counter(AtomicUsize::new(0)));
        let task = Waker::from(counter.clone());
        (counter, task)
    }

    /// Runs `f` in a task on the I/O thread `thread` and returns what it returned, once the
    /// thread has run everything queued to it before.
    fn run_on<T: Send + 'static>(thread: &Handle, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        thread.spawn(async move {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(10)).unwrap()
    }

    /// `task`'s deferrable waker, made on the I/O thread `thread` as a session's task would.
    fn made_on(thread: &Handle, task: &Waker) -> Waker {
        let task = task.clone();
        run_on(thread, move || deferrable(&task))
    }

    /// Returns once `thread` has run everything queued to it before this call.
    fn settle(thread: &Handle) {
        run_on(thread, || ());
    }

    #[test]
    fn off_an_io_thread_the_waker_is_the_tasks_own() {
        let (counter, task) = counter();
        assert!(deferrable(&task).will_wake(&task));
        batch(|| deferrable(&task).wake());
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_batch_holds_wakes_for_another_thread_until_it_ends() {
        let threads = crate::io_threads(1, "wake-batch-test").unwrap();
        let (counter, task) = counter();
        let deferred = made_on(&threads[0], &task);
        assert!(!deferred.will_wake(&task));
        batch(|| {
            deferred.wake_by_ref();
            deferred.wake_by_ref();
            batch(|| deferred.wake_by_ref());
            settle(&threads[0]);
            // Not yet: the wakes wait for the outermost batch to end.
            assert_eq!(counter.0.load(Ordering::SeqCst), 0);
        });
        settle(&threads[0]);
        assert_eq!(counter.0.load(Ordering::SeqCst), 3);
        // Outside a batch the wake is immediate.
        deferred.wake_by_ref();
        assert_eq!(counter.0.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn a_wake_on_the_tasks_own_thread_is_not_held() {
        let threads = crate::io_threads(1, "wake-batch-local").unwrap();
        let (counter, task) = counter();
        let deferred = made_on(&threads[0], &task);
        let during = run_on(&threads[0], move || {
            batch(|| {
                deferred.wake_by_ref();
                counter.0.load(Ordering::SeqCst)
            })
        });
        assert_eq!(during, 1);
    }

    #[test]
    fn a_batch_that_unwinds_still_wakes() {
        let threads = crate::io_threads(1, "wake-batch-unwind").unwrap();
        let (counter, task) = counter();
        let deferred = made_on(&threads[0], &task);
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            batch(|| {
                deferred.wake_by_ref();
                panic!("the pass failed");
            })
        }));
        assert!(unwound.is_err());
        settle(&threads[0]);
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        // The next batch starts empty, and a wake in it is held again.
        batch(|| {
            deferred.wake_by_ref();
            assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        });
        settle(&threads[0]);
        assert_eq!(counter.0.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn the_cached_waker_is_made_once_per_task() {
        let threads = crate::io_threads(1, "wake-batch-cache").unwrap();
        let (_, task) = counter();
        let (_, other) = counter();
        let seen = run_on(&threads[0], move || {
            let mut cache = DeferrableWaker::default();
            let first = cache.get(&task).clone();
            let again = cache.get(&task).will_wake(&first);
            let changed = cache.get(&other).will_wake(&first);
            (again, changed)
        });
        assert_eq!(seen, (true, false));
    }
}
