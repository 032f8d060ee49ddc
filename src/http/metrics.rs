//! `GET /metrics`: Prometheus text, rendered by metrics-exporter-prometheus.
//! Histograms (batch rows and tokens, inference and load seconds, HTTP
//! latency) and HTTP counters are recorded where they happen; the per-model
//! counters, loaded state, pending requests and process memory are read at
//! scrape time from the registry and /proc, so they cannot drift.

use std::sync::OnceLock;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use super::AppState;

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process's recorder, installed on first use (one per process: the
/// `metrics` facade has a single global recorder).
pub fn handle() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        // Histograms with fixed buckets, not summaries: their memory is a few
        // counters each, where a summary's rolling sketches are reallocated as
        // they fill and fragment the heap of a long-running server
        // (docs/lifecycle.md, the soak); and buckets add up across replicas
        // behind a load balancer, where quantiles do not.
        let buckets = [
            (Matcher::Suffix("_seconds".into()), &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0][..]),
            (Matcher::Full("eeane_batch_rows".into()), &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0][..]),
            (Matcher::Full("eeane_batch_tokens".into()), &[16.0, 64.0, 256.0, 1024.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0][..]),
        ];
        // The bounds are constants, never empty: the fallback (summaries) is for form's sake.
        let builder = buckets
            .into_iter()
            .try_fold(PrometheusBuilder::new(), |builder, (matcher, bounds)| builder.set_buckets_for_metric(matcher, bounds))
            .unwrap_or_else(|e| {
                tracing::warn!("metrics buckets: {e}");
                PrometheusBuilder::new()
            });
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        // Another recorder already installed (a host program's) leaves ours unused but harmless.
        let _ = metrics::set_global_recorder(recorder);
        // Histogram samples wait in a buffer until drained; without a scraper
        // nothing drains them, and the buffer would grow for the process's life.
        let upkeep = handle.clone();
        let _ = std::thread::Builder::new().name("metrics-upkeep".into()).spawn(move || loop {
            std::thread::sleep(std::time::Duration::from_secs(5));
            upkeep.run_upkeep();
        });
        handle
    })
}

/// Counts every request by route and status, and times it.
pub async fn record_http(request: Request, next: Next) -> Response {
    handle();
    let route = request.extensions().get::<MatchedPath>().map_or("unmatched".to_string(), |p| p.as_str().to_string());
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    if let Some(summary) = response.extensions().get::<super::RequestSummary>().filter(|s| !s.model.is_empty()) {
        metrics::counter!("eeane_model_responses_total", "model" => summary.model.clone(), "status" => status.clone()).increment(1);
    }
    metrics::counter!("eeane_http_requests_total", "route" => route.clone(), "status" => status).increment(1);
    metrics::histogram!("eeane_http_request_seconds", "route" => route).record(started.elapsed().as_secs_f64());
    response
}

fn process_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

/// Prometheus text; behind the API key unless metrics_public.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, content_type = "text/plain", body = String)))]
pub async fn metrics(State(app): State<AppState>) -> impl IntoResponse {
    let handle = handle();
    metrics::gauge!("eeane_pending_requests").set(app.service.pending() as f64);
    for model in app.service.model_states() {
        let id = model.id;
        let c = &model.counters;
        for (name, value) in [
            ("eeane_model_requests_total", c.requests),
            ("eeane_model_inferences_total", c.inferences),
            ("eeane_model_coalesced_total", c.coalesced),
            ("eeane_model_errors_total", c.errors),
            ("eeane_model_loads_total", c.loads),
            ("eeane_model_unloads_total", c.unloads),
            ("eeane_model_evictions_total", c.evictions),
        ] {
            metrics::counter!(name, "model" => id.clone()).absolute(value);
        }
        let waiting = model.loaded_model.as_ref().map_or(0, |m| m.engine_calls.queued_sequences);
        metrics::gauge!("eeane_model_queued_sequences", "model" => id.clone()).set(waiting as f64);
        metrics::gauge!("eeane_model_loaded", "model" => id.clone()).set(if model.status.loaded { 1.0 } else { 0.0 });
        metrics::gauge!("eeane_model_in_flight", "model" => id).set(model.status.in_flight as f64);
    }
    for (name, field) in [("eeane_process_resident_bytes", "VmRSS:"), ("eeane_process_anonymous_bytes", "RssAnon:")] {
        if let Some(kib) = process_kib(field) {
            metrics::gauge!(name).set((kib * 1024) as f64);
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], handle.render())
}
