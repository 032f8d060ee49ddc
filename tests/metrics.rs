//! GET /metrics over real HTTP: valid Prometheus text whose counters move
//! with traffic; behind the API key unless metrics_public.

mod common;

use common::{model_entry, Server};
use serde_json::json;

fn scrape(server: &Server, key: Option<&str>) -> (u16, prometheus_parse::Scrape) {
    let mut request = reqwest::blocking::Client::new().get(format!("{}/metrics", server.url));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().unwrap();
    let status = response.status().as_u16();
    let text = response.text().unwrap();
    let lines = text.lines().map(|l| Ok(l.to_string()));
    (status, prometheus_parse::Scrape::parse(lines).unwrap_or_else(|e| panic!("not Prometheus text: {e}\n{text}")))
}

fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(ref buckets) => buckets.iter().map(|b| b.count).fold(0.0, f64::max),
            prometheus_parse::Value::Summary(_) => f64::NAN,
        })
        .sum()
}

#[test]
fn metrics_parse_and_move_with_traffic() {
    let config = format!("[server]\napi_key = \"k\"\n{}", model_entry("m", "all-minilm-l6-v2", ""));
    let server = Server::start(Some(&config), &[]);
    let (status, _) = scrape(&server, None);
    assert_eq!(status, 401, "behind the API key");
    let (status, before) = scrape(&server, Some("k"));
    assert_eq!(status, 200);
    assert_eq!(value(&before, "eeane_model_loaded", &[("model", "m")]), 0.0);
    let auth = [("authorization", "Bearer k")];
    for _ in 0..3 {
        let (status, _) = server.post_raw("/v1/embeddings", json!({"model": "m", "input": ["a b c", "d e"]}).to_string().into_bytes(), &auth);
        assert_eq!(status, 200);
    }
    let (status, _) = server.post_raw("/v1/embeddings", json!({"model": "m", "input": []}).to_string().into_bytes(), &auth);
    assert_eq!(status, 400);
    let (_, after) = scrape(&server, Some("k"));
    assert_eq!(value(&after, "eeane_model_requests_total", &[("model", "m")]), 3.0);
    assert_eq!(value(&after, "eeane_model_loads_total", &[("model", "m")]), 1.0);
    assert_eq!(value(&after, "eeane_model_loaded", &[("model", "m")]), 1.0);
    assert_eq!(value(&after, "eeane_http_requests_total", &[("route", "/v1/embeddings"), ("status", "200")]), 3.0);
    assert_eq!(value(&after, "eeane_http_requests_total", &[("route", "/v1/embeddings"), ("status", "400")]), 1.0);
    // The warm-up at load and the three requests each ran at least one batch.
    let batches: f64 = after
        .samples
        .iter()
        .filter(|s| s.metric == "eeane_batch_rows_count" && s.labels.get("model") == Some("m"))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) | prometheus_parse::Value::Gauge(v) => v,
            _ => 0.0,
        })
        .sum();
    assert!(batches >= 4.0, "batch histogram count {batches}");
    assert!(value(&after, "eeane_process_resident_bytes", &[]) > 1e6);
    assert_eq!(value(&after, "eeane_model_queued_sequences", &[("model", "m")]), 0.0);

    // Per model by status: a 400 once the model is known counts for it (the
    // empty input above was refused before a model was chosen).
    let (status, _) = server.post_raw("/v1/embeddings", json!({"model": "m", "input": "x", "dimensions": 9999}).to_string().into_bytes(), &auth);
    assert_eq!(status, 400);
    // keep_alive 0 on the request: the model unloads when it answers.
    let (status, _) = server.post_raw("/v1/embeddings", json!({"model": "m", "input": "x", "keep_alive": 0}).to_string().into_bytes(), &auth);
    assert_eq!(status, 200);
    server.wait_for_health("the unload", std::time::Duration::from_secs(10), |h| h["models"][0]["state"] == "unloaded");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (_, last) = scrape(&server, Some("k"));
    assert_eq!(value(&last, "eeane_model_responses_total", &[("model", "m"), ("status", "200")]), 4.0);
    assert_eq!(value(&last, "eeane_model_responses_total", &[("model", "m"), ("status", "400")]), 1.0);
    assert_eq!(value(&last, "eeane_model_unloads_total", &[("model", "m")]), 1.0);
    assert_eq!(value(&last, "eeane_model_loaded", &[("model", "m")]), 0.0);
    assert_eq!(value(&last, "eeane_model_unload_seconds_count", &[("model", "m")]), 1.0);
    println!("{} samples; batches {batches}", after.samples.len());
}

#[test]
fn metrics_public_opens_only_metrics() {
    // Resident: the model loads (and runs its warm-up batch) before the first request.
    let config = format!("[server]\napi_key = \"k\"\nmetrics_public = true\n{}", model_entry("m", "all-minilm-l6-v2", "load_policy = \"resident\""));
    let server = Server::start(Some(&config), &[]);
    let (status, scraped) = scrape(&server, None);
    assert_eq!(status, 200);
    let warm_up = scraped.samples.iter().any(|s| s.metric == "eeane_batch_rows_count" && s.labels.get("model") == Some("m"));
    assert!(warm_up, "the resident model's warm-up batch is counted");
    let (status, _) = server.post("/v1/embeddings", &json!({"input": "x"}));
    assert_eq!(status, 401);
}
