//! `GET /metrics` (Prometheus text): requests by route, method and status, their latency as a
//! histogram, request and response body bytes, and the store's size. Routes are the path
//! templates (`/api/v1/refs/{ns}/{bucket}/{key}`), never the names in a URL, so the label set
//! stays small and the endpoint leaks no namespace or key; it is served without a token, like
//! the health checks. The recorder is the server's own, not a process-global one.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use super::Ddc;
use crate::gc::GcReport;
use crate::storage::ContentError;

/// Latency buckets, seconds: from a cached small GET to a large upload.
const BUCKETS: [f64; 14] =
    [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0];

pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// `process_cpu_seconds_total`, `process_resident_memory_bytes`, open fds, threads.
    process: metrics_process::Collector,
}

impl Metrics {
    pub fn new() -> Metrics {
        let recorder =
            PrometheusBuilder::new().set_buckets(&BUCKETS).expect("non-empty buckets").build_recorder();
        let handle = recorder.handle();
        let process = metrics_process::Collector::default();
        metrics::with_local_recorder(&recorder, || {
            process.describe();
            metrics::describe_counter!(
                "ddc_requests_total",
                "Requests answered, by route template, method and status."
            );
            metrics::describe_histogram!(
                "ddc_request_duration_seconds",
                metrics::Unit::Seconds,
                "From a request's head arriving to its answer's head being ready (bodies stream after), by route."
            );
            metrics::describe_counter!(
                "ddc_request_body_bytes_total",
                "Request body bytes, by route (as declared by Content-Length)."
            );
            metrics::describe_counter!(
                "ddc_response_body_bytes_total",
                "Response body bytes, by route (as declared by Content-Length)."
            );
            metrics::describe_counter!(
                "ddc_gc_runs_total",
                "Garbage collections run, by outcome (ok, or failed: retried at the next interval)."
            );
            metrics::describe_counter!("ddc_gc_refs_expired_total", "Refs removed as expired.");
            metrics::describe_counter!(
                "ddc_gc_blobs_removed_total",
                "Blobs removed because no ref names them."
            );
            metrics::describe_counter!("ddc_gc_bytes_freed_total", "Bytes of the blobs removed.");
            metrics::describe_counter!(
                "ddc_gc_blobs_failed_total",
                "Blobs in S3 a sweep could not remove (a request failed); the next run tries again."
            );
            metrics::describe_gauge!(
                "ddc_gc_last_run_seconds",
                metrics::Unit::Seconds,
                "How long the last garbage collection took."
            );
            metrics::describe_gauge!("ddc_connections_open", "HTTP connections open now.");
            metrics::describe_counter!(
                "ddc_connections_refused_total",
                "Connections turned away (503, or closed over TLS), by reason: `total` (--max-connections \
                 open) or `per_address` (--max-connections-per-address open from its address)."
            );
            metrics::describe_counter!(
                "ddc_connections_closed_total",
                "Connections the server closed for what the client did not do, by reason: `idle` (no \
                 request in flight for --header-timeout; shut down gracefully) or `slow` (an answer \
                 taken slower than --min-rate once --send-timeout was spent, or nothing of any answer in \
                 flight; dropped)."
            );
            metrics::describe_counter!(
                "ddc_answers_cut_total",
                "Answers given up because their client took nothing of them for --send-timeout while \
                 its connection took other data (an HTTP/2 stream given no flow-control credit); the \
                 connection lives on."
            );
            metrics::describe_gauge!("ddc_store_blobs", "Blobs stored (raw and compressed).");
            metrics::describe_gauge!("ddc_store_bytes", "Bytes of blobs stored.");
            metrics::describe_gauge!(
                "ddc_store_counted",
                "1 once the walk of the store at start has finished."
            );
        });
        Metrics { recorder, handle, process }
    }

    fn observe(
        &self,
        route: String,
        method: String,
        status: u16,
        seconds: f64,
        bytes_in: u64,
        bytes_out: u64,
    ) {
        metrics::with_local_recorder(&self.recorder, || {
            let labels = [("route", route.clone()), ("method", method), ("status", status.to_string())];
            metrics::counter!("ddc_requests_total", &labels).increment(1);
            metrics::histogram!("ddc_request_duration_seconds", "route" => route.clone()).record(seconds);
            metrics::counter!("ddc_request_body_bytes_total", "route" => route.clone()).increment(bytes_in);
            metrics::counter!("ddc_response_body_bytes_total", "route" => route).increment(bytes_out);
        });
    }

    /// Counts one garbage collection and what it removed.
    pub(super) fn collected(&self, result: &Result<GcReport, ContentError>, seconds: f64) {
        metrics::with_local_recorder(&self.recorder, || {
            let outcome = if result.is_ok() { "ok" } else { "failed" };
            metrics::counter!("ddc_gc_runs_total", "outcome" => outcome).increment(1);
            metrics::gauge!("ddc_gc_last_run_seconds").set(seconds);
            if let Ok(report) = result {
                metrics::counter!("ddc_gc_refs_expired_total").increment(report.refs_expired);
                metrics::counter!("ddc_gc_blobs_removed_total").increment(report.blobs_removed);
                metrics::counter!("ddc_gc_bytes_freed_total").increment(report.bytes_freed);
                metrics::counter!("ddc_gc_blobs_failed_total").increment(report.blobs_failed);
            }
        });
    }

    fn render(&self, ddc: &Ddc) -> String {
        let usage = ddc.content.blobs.usage();
        let connections = &ddc.connections;
        metrics::with_local_recorder(&self.recorder, || {
            self.process.collect();
            metrics::gauge!("ddc_connections_open").set(connections.open.load(Ordering::Relaxed) as f64);
            for (reason, count) in
                [("total", &connections.refused_total), ("per_address", &connections.refused_per_address)]
            {
                metrics::counter!("ddc_connections_refused_total", "reason" => reason)
                    .absolute(count.load(Ordering::Relaxed));
            }
            for (reason, count) in [("idle", &connections.closed_idle), ("slow", &connections.closed_slow)] {
                metrics::counter!("ddc_connections_closed_total", "reason" => reason)
                    .absolute(count.load(Ordering::Relaxed));
            }
            metrics::counter!("ddc_answers_cut_total")
                .absolute(connections.answers_cut.load(Ordering::Relaxed));
            metrics::gauge!("ddc_store_blobs").set(usage.blobs.load(Ordering::Relaxed) as f64);
            metrics::gauge!("ddc_store_bytes").set(usage.bytes.load(Ordering::Relaxed) as f64);
            metrics::gauge!("ddc_store_counted").set(if usage.counted.load(Ordering::Relaxed) {
                1.0
            } else {
                0.0
            });
        });
        self.handle.render()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

fn content_length(headers: &axum::http::HeaderMap) -> u64 {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Middleware: times and counts every request.
pub async fn track(State(ddc): State<Arc<Ddc>>, request: Request, next: Next) -> Response {
    let start = Instant::now();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    // A fixed set: any token is a valid HTTP method, and each label value is a series kept
    // forever.
    let method = match request.method().as_str() {
        m @ ("GET" | "HEAD" | "PUT" | "POST" | "DELETE") => m.to_owned(),
        _ => "other".to_owned(),
    };
    let bytes_in = content_length(request.headers());
    let response = next.run(request).await;
    let bytes_out = content_length(response.headers());
    let seconds = start.elapsed().as_secs_f64();
    ddc.metrics.observe(route, method, response.status().as_u16(), seconds, bytes_in, bytes_out);
    response
}

pub async fn scrape(State(ddc): State<Arc<Ddc>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], ddc.metrics.render(&ddc))
}
