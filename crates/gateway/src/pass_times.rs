//! A cumulative histogram of fan-out pass times, exported in Prometheus' layout: the channels'
//! wall-clock pass times (`channel_tick_duration_seconds`) and the spatial world's CPU time per
//! pass (`spatial_pass_cpu_seconds`). Nothing resets on a scrape, so any number of readers take
//! their own windows from bucket differences.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::router::Gauge;

/// Bucket bounds: (label in seconds, microseconds). Fine enough that a reader taking windows
/// from bucket differences (as `tickwire bench replication` does) can tell a 1 ms pass from
/// 0.5 and 2 ms, and a 20 ms pass budget from 15 and 30 ms.
const BUCKETS: &[(&str, u64)] = &[
    ("0.0001", 100),
    ("0.00025", 250),
    ("0.0005", 500),
    ("0.001", 1_000),
    ("0.002", 2_000),
    ("0.003", 3_000),
    ("0.005", 5_000),
    ("0.0075", 7_500),
    ("0.01", 10_000),
    ("0.015", 15_000),
    ("0.02", 20_000),
    ("0.03", 30_000),
    ("0.05", 50_000),
    ("0.1", 100_000),
    ("0.25", 250_000),
];

/// The names of one histogram's series.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Names {
    pub bucket: &'static str,
    pub count: &'static str,
    pub sum: &'static str,
}

/// Pass times since the start: a histogram of microseconds (three significant digits) and
/// their exact sum.
#[derive(Debug)]
pub(crate) struct PassTimes {
    micros: Mutex<Histogram<u64>>,
    sum_us: AtomicU64,
}

impl Default for PassTimes {
    fn default() -> PassTimes {
        PassTimes { micros: Mutex::new(Histogram::new(3).expect("valid sigfig")), sum_us: AtomicU64::new(0) }
    }
}

impl PassTimes {
    /// One pass took `elapsed` (a pass under a microsecond counts as one).
    pub(crate) fn record(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        if let Ok(mut h) = self.micros.lock() {
            let _ = h.record(micros.max(1));
        }
        self.sum_us.fetch_add(micros, Ordering::Relaxed);
    }

    /// The buckets (cumulative, `+Inf` last), the count and the sum in seconds.
    pub(crate) fn gauges(&self, names: Names) -> Vec<Gauge> {
        let mut out = Vec::new();
        if let Ok(h) = self.micros.lock() {
            for (le, bound_us) in BUCKETS {
                out.push(Gauge::counter(names.bucket, h.count_between(0, *bound_us)).label("le", *le));
            }
            out.push(Gauge::counter(names.bucket, h.len()).label("le", "+Inf"));
            out.push(Gauge::counter(names.count, h.len()));
        }
        out.push(Gauge::new(names.sum, self.sum_us.load(Ordering::Relaxed) as f64 / 1e6));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_the_sum_is_in_seconds() {
        let t = PassTimes::default();
        for ms in [0.2, 0.9, 4.0, 40.0, 2_000.0] {
            t.record(Duration::from_secs_f64(ms / 1e3));
        }
        let names = Names { bucket: "b", count: "c", sum: "s" };
        let g = t.gauges(names);
        let bucket = |le: &str| {
            g.iter().find(|g| g.name == "b" && g.labels == [("le", le.to_owned())]).map(|g| g.value)
        };
        assert_eq!(bucket("0.00025"), Some(1.0));
        assert_eq!(bucket("0.001"), Some(2.0));
        assert_eq!(bucket("0.005"), Some(3.0));
        assert_eq!(bucket("0.05"), Some(4.0));
        assert_eq!(bucket("0.25"), Some(4.0), "2 s is past the last finite bucket");
        assert_eq!(bucket("+Inf"), Some(5.0));
        assert_eq!(g.iter().find(|g| g.name == "c").map(|g| g.value), Some(5.0));
        let sum = g.iter().find(|g| g.name == "s").map(|g| g.value).unwrap();
        assert!((sum - 2.0451).abs() < 1e-3, "{sum}");
    }
}
