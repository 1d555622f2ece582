//! The Prometheus endpoint, `GET /metrics`.
//!
//! The hot path only bumps the relaxed atomics in [`Stats`]; a scrape copies them into a
//! Prometheus recorder of this gateway's own (not a process-global one, so several gateways in
//! one process each report their own) and renders it. Names follow channeld's where they fit,
//! so its Grafana dashboards carry over: `connection_num`, `messages_in`, `bytes_out`, …

use std::sync::Arc;

use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use tickwire_wire::proto::CloseReason;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::router::Router;
use crate::stats::{CLOSE_REASONS, Stats};

struct Exporter {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// `process_cpu_seconds_total`, `process_resident_memory_bytes`, open fds, threads.
    process: metrics_process::Collector,
}

impl Exporter {
    fn new() -> Exporter {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let process = metrics_process::Collector::default();
        metrics::with_local_recorder(&recorder, || {
            process.describe();
            metrics::describe_gauge!("connection_num", "Connections open (clients and game servers).");
            metrics::describe_gauge!("session_num", "Sessions alive, attached or waiting for a resume.");
            metrics::describe_counter!("messages_in", "Frames received.");
            metrics::describe_counter!("messages_out", "Frames sent.");
            metrics::describe_counter!("bytes_in", "Bytes received.");
            metrics::describe_counter!("bytes_out", "Bytes sent.");
            metrics::describe_counter!("sessions_resumed", "Sessions resumed on a new connection.");
            metrics::describe_counter!(
                "connections_rejected",
                "Handshakes refused (auth, protocol, timeout)."
            );
            metrics::describe_counter!("closes", "Close frames sent, by reason.");
            metrics::describe_counter!("connection_drops", "Connections lost without a Close.");
        });
        Exporter { recorder, handle, process }
    }

    fn render(&self, stats: &Stats, router: &dyn Router) -> String {
        let s = stats.snapshot();
        let gauges = router.gauges();
        metrics::with_local_recorder(&self.recorder, || {
            self.process.collect();
            metrics::gauge!("connection_num").set(s.connections_open as f64);
            metrics::gauge!("session_num").set(s.sessions_open as f64);
            metrics::counter!("messages_in").absolute(s.messages_in);
            metrics::counter!("messages_out").absolute(s.messages_out);
            metrics::counter!("bytes_in").absolute(s.bytes_in);
            metrics::counter!("bytes_out").absolute(s.bytes_out);
            metrics::counter!("sessions_resumed").absolute(s.sessions_resumed);
            metrics::counter!("connections_rejected").absolute(s.connections_rejected);
            metrics::counter!("connection_drops").absolute(s.drops);
            for g in &gauges {
                let labels: Vec<metrics::Label> =
                    g.labels.iter().map(|(k, v)| metrics::Label::new(*k, v.clone())).collect();
                if g.counter {
                    metrics::counter!(g.name, labels).absolute(g.value as u64);
                } else {
                    metrics::gauge!(g.name, labels).set(g.value);
                }
            }
            for (i, &n) in s.closes.iter().enumerate().take(CLOSE_REASONS).skip(1) {
                if let Ok(reason) = CloseReason::try_from(i as i32) {
                    metrics::counter!("closes", "reason" => reason_label(reason)).absolute(n);
                }
            }
        });
        self.handle.render()
    }
}

/// `CLOSE_REASON_SLOW_CONSUMER` → `slow_consumer`.
fn reason_label(reason: CloseReason) -> String {
    let name = reason.as_str_name();
    name.strip_prefix("CLOSE_REASON_").unwrap_or(name).to_ascii_lowercase()
}

/// Serves `/metrics` on `listener` until `cancel`: the gateway's counters and the router's
/// own figures.
pub(crate) async fn serve(
    listener: TcpListener,
    stats: Arc<Stats>,
    router: Arc<dyn Router>,
    cancel: CancellationToken,
) {
    let exporter = Arc::new(Exporter::new());
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let (exporter, stats, router) = (exporter.clone(), stats.clone(), router.clone());
            async move { exporter.render(&stats, &*router) }
        }),
    );
    if let Err(e) = axum::serve(tickwire_web::bounded::BoundedListener::new(listener), app)
        .with_graceful_shutdown(cancel.cancelled_owned())
        .await
    {
        tracing::warn!(error = %e, "metrics endpoint stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn renders_every_counter_with_channeld_names() {
        let stats = Stats::default();
        Stats::add(&stats.messages_in, 7);
        Stats::add(&stats.connections_open, 3);
        stats.closed(CloseReason::SlowConsumer);
        stats.closed(CloseReason::SlowConsumer);
        let echo = crate::EchoRouter::new(0);
        let text = Exporter::new().render(&stats, &echo);
        assert!(text.contains("messages_in 7"), "{text}");
        assert!(text.contains("connection_num 3"), "{text}");
        assert!(text.contains("closes{reason=\"slow_consumer\"} 2"), "{text}");
        assert!(text.contains("closes{reason=\"shutdown\"} 0"), "{text}");
        assert!(text.contains("# HELP bytes_out"), "{text}");
        assert!(text.contains("process_resident_memory_bytes"), "{text}");
        // Two gateways in one process do not share figures.
        assert!(Exporter::new().render(&Stats::default(), &echo).contains("messages_in 0"));
        assert_eq!(stats.messages_in.load(Relaxed), 7);
    }
}
