//! The gateway's `/metrics` as the replication bench reads it: counters whose differences over a
//! window give rates, and the cumulative pass-time histograms whose bucket differences give a
//! window's quantiles (so scraping resets nothing and other readers are undisturbed).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;

use super::report;

/// The gateway's `/metrics`, parsed to `name{labels} value` pairs.
#[derive(Clone)]
pub(super) struct Scrape(Vec<(String, f64)>);

/// The wall-clock pass-time histogram's series prefix; its buckets are cumulative, so a window
/// is the difference of two scrapes and no scrape disturbs another reader.
pub(super) const TICK_BUCKET: &str = "channel_tick_duration_seconds_bucket{le=\"";

/// The spatial world's CPU time per pass, in the same layout.
pub(super) const PASS_CPU_BUCKET: &str = "spatial_pass_cpu_seconds_bucket{le=\"";

/// An I/O thread's CPU time per delivery of a world pass, in the same layout.
pub(super) const DELIVERY_CPU_BUCKET: &str = "spatial_delivery_cpu_seconds_bucket{le=\"";

impl Scrape {
    pub(super) fn fetch(addr: SocketAddr) -> anyhow::Result<Scrape> {
        let text = ureq::get(&format!("http://{addr}/metrics"))
            .timeout(Duration::from_secs(2))
            .call()
            .context("scraping the gateway's /metrics")?
            .into_string()?;
        Ok(Scrape::parse(&text))
    }

    pub(super) fn parse(text: &str) -> Scrape {
        let pairs = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .filter_map(|(k, v)| Some((k.to_owned(), v.trim().parse().ok()?)))
            .collect();
        Scrape(pairs)
    }

    /// Whether the gateway reported `series` at all ([`Scrape::get`] reads a missing one as 0).
    pub(super) fn has(&self, series: &str) -> bool {
        self.0.iter().any(|(k, _)| k == series)
    }

    /// The series whose name (with labels) starts with `prefix`, and their values.
    pub(super) fn series<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
        self.0.iter().filter(move |(k, _)| k.starts_with(prefix)).map(|(k, v)| (k.as_str(), *v))
    }

    pub(super) fn get(&self, series: &str) -> f64 {
        self.0.iter().find(|(k, _)| k == series).map_or(0.0, |(_, v)| *v)
    }

    /// (upper bound in seconds, cumulative count) of the buckets of the histogram whose
    /// series start with `prefix`, `+Inf` last.
    fn buckets(&self, prefix: &str) -> Vec<(f64, f64)> {
        let mut out: Vec<(f64, f64)> = self
            .0
            .iter()
            .filter_map(|(k, v)| {
                let le = k.strip_prefix(prefix)?.strip_suffix("\"}")?;
                let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
                Some((bound, *v))
            })
            .collect();
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }
}

/// The fan-out passes between two scrapes: (bucket upper bound in seconds, cumulative count),
/// `+Inf` last. Built once per pair of scrapes; each quantile is then a lookup.
pub(super) struct TickWindow(Vec<(f64, f64)>);

impl TickWindow {
    /// The wall-clock pass times between two scrapes.
    pub(super) fn between(before: &Scrape, after: &Scrape) -> TickWindow {
        TickWindow::of(TICK_BUCKET, before, after)
    }

    /// The histogram whose bucket series start with `prefix`, between two scrapes.
    pub(super) fn of(prefix: &str, before: &Scrape, after: &Scrape) -> TickWindow {
        let b0 = before.buckets(prefix);
        let counts = after
            .buckets(prefix)
            .into_iter()
            .map(|(bound, n)| (bound, n - b0.iter().find(|(b, _)| *b == bound).map_or(0.0, |(_, m)| *m)))
            .collect();
        TickWindow(counts)
    }

    /// How many passes the window holds.
    pub(super) fn passes(&self) -> f64 {
        self.0.last().map_or(0.0, |(_, n)| *n)
    }

    /// The `q` quantile, in milliseconds: the upper bound of the bucket it falls in (so "p99
    /// 2 ms" reads "99% of passes took at most 2 ms"). `q = 1.0` gives the bound of the
    /// slowest pass's bucket. 0 when there were no passes; infinite when a pass exceeded the
    /// largest finite bucket.
    fn quantile(&self, q: f64) -> f64 {
        let total = self.passes();
        if total <= 0.0 {
            return 0.0;
        }
        let rank = (q * total).ceil().max(1.0);
        self.0.iter().find(|(_, n)| *n >= rank).map_or(f64::INFINITY, |(bound, _)| bound * 1e3)
    }

    /// p50, p99 and max, as the report shows them.
    pub(super) fn tick(&self) -> report::Tick {
        report::Tick { p50: self.quantile(0.5), p99: self.quantile(0.99), max: self.quantile(1.0) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(buckets: &[(&str, f64)]) -> Scrape {
        let text: String =
            buckets.iter().map(|(le, n)| format!("{TICK_BUCKET}{le}\"}} {n}\n")).collect::<String>();
        Scrape::parse(&text)
    }

    #[test]
    fn window_quantiles_come_from_bucket_differences() {
        let before = scrape(&[("0.001", 90.0), ("0.002", 95.0), ("0.02", 100.0), ("+Inf", 100.0)]);
        // 100 passes in the window: 10 under 1 ms, 89 more under 2 ms, 1 at 20 ms.
        let after = scrape(&[("0.001", 100.0), ("0.002", 184.0), ("0.02", 200.0), ("+Inf", 200.0)]);
        let window = TickWindow::between(&before, &after);
        assert_eq!(window.quantile(0.05), 1.0);
        assert_eq!(window.quantile(0.5), 2.0);
        assert_eq!(window.quantile(0.99), 20.0);
        assert_eq!(window.quantile(1.0), 20.0);
        assert_eq!(TickWindow::between(&after, &after).quantile(0.99), 0.0, "no passes");
        let slow = scrape(&[("0.001", 100.0), ("0.002", 184.0), ("0.02", 200.0), ("+Inf", 201.0)]);
        assert!(TickWindow::between(&before, &slow).quantile(1.0).is_infinite(), "past the last bucket");
    }

    #[test]
    fn each_histogram_is_read_by_its_own_prefix() {
        let text = format!(
            "{TICK_BUCKET}0.02\"}} 4\n{TICK_BUCKET}+Inf\"}} 4\n\
             {PASS_CPU_BUCKET}0.001\"}} 3\n{PASS_CPU_BUCKET}0.002\"}} 4\n{PASS_CPU_BUCKET}+Inf\"}} 4\n"
        );
        let (empty, after) = (Scrape::parse(""), Scrape::parse(&text));
        assert_eq!(TickWindow::between(&empty, &after).quantile(0.5), 20.0);
        let cpu = TickWindow::of(PASS_CPU_BUCKET, &empty, &after);
        assert_eq!((cpu.quantile(0.5), cpu.quantile(1.0), cpu.passes()), (1.0, 2.0, 4.0));
        assert_eq!(TickWindow::of(PASS_CPU_BUCKET, &empty, &empty).passes(), 0.0, "no series");
    }
}
