//! The bots' update ages, one histogram per bot thread. Every bot records the age of every
//! update it reads; with one shared histogram, the bot threads took turns on one lock, and its
//! cache line crossed between the cores on nearly every message. A reading merges the shards.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use hdrhistogram::Histogram;

/// Shards, more than the bot threads of any machine this runs on; threads beyond share.
const SHARDS: usize = 16;

/// The largest age recorded, in µs (a minute); larger ones are clamped to it.
const MAX_AGE_US: u64 = 60_000_000;

/// Update ages in microseconds, recorded per thread and read merged.
#[derive(Debug)]
pub struct Ages {
    shards: Vec<Shard>,
}

/// One thread's histogram, on cache lines of its own.
#[derive(Debug)]
#[repr(align(128))]
struct Shard(Mutex<Histogram<u64>>);

/// An empty histogram of ages.
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_AGE_US, 3).expect("valid bounds")
}

/// The p50 and p99 of a histogram of ages in µs, in milliseconds.
pub(crate) fn p50_p99_ms(h: &Histogram<u64>) -> (f64, f64) {
    let ms = |q| h.value_at_quantile(q) as f64 / 1e3;
    (ms(0.5), ms(0.99))
}

/// The calling thread's shard: threads are numbered as they first record.
fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    INDEX.with(|i| *i)
}

impl Default for Ages {
    fn default() -> Ages {
        Ages { shards: (0..SHARDS).map(|_| Shard(Mutex::new(histogram()))).collect() }
    }
}

impl Ages {
    /// Records `ages` (µs; 0 counts as 1) in the calling thread's histogram.
    pub fn record(&self, ages: &[u64]) {
        if ages.is_empty() {
            return;
        }
        if let Ok(mut h) = self.shards[shard_index()].0.lock() {
            for &age in ages {
                h.saturating_record(age.clamp(1, MAX_AGE_US));
            }
        }
    }

    /// Everything recorded so far, merged.
    pub fn merged(&self) -> Histogram<u64> {
        let mut all = histogram();
        for shard in &self.shards {
            if let Ok(h) = shard.0.lock() {
                let _ = all.add(&*h);
            }
        }
        all
    }

    /// Everything recorded so far, merged; the shards start again empty. Each shard is
    /// swapped for an empty one under its lock and read after, so a recording thread waits
    /// for a swap only.
    pub fn take(&self) -> Histogram<u64> {
        let mut all = histogram();
        for shard in &self.shards {
            let mut taken = histogram();
            if let Ok(mut h) = shard.0.lock() {
                std::mem::swap(&mut *h, &mut taken);
            }
            let _ = all.add(&taken);
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn ages_from_many_threads_merge_and_reset() {
        let ages = Arc::new(Ages::default());
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let ages = ages.clone();
                std::thread::spawn(move || {
                    for i in 0..250 {
                        ages.record(&[t * 1000 + i, 0]);
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let merged = ages.merged();
        assert_eq!(merged.len(), 2000, "every record of every thread");
        assert_eq!(merged.min(), 1, "0 counts as 1");
        assert!(merged.max() >= 3249 && merged.max() < 3260, "{}", merged.max());
        assert_eq!(ages.take().len(), 2000);
        assert_eq!(ages.merged().len(), 0, "take empties every shard");
        ages.record(&[u64::MAX]);
        assert!(ages.merged().max() >= MAX_AGE_US, "a huge age is clamped, not lost");
    }
}
