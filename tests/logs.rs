//! Request ids and the request log: an X-Request-Id is kept (or one is made)
//! and returned, and `--log-format json` writes one JSON line per request
//! with id, model, inputs, tokens, status and latency.

mod common;

use common::{model_entry, Server};
use serde_json::{json, Value};

#[test]
fn request_ids_are_returned_and_each_request_is_one_json_log_line() {
    let server = Server::start(Some(&model_entry("m", "all-minilm-l6-v2", "")), &[("EEANE_LOG_FORMAT", "json")]);
    let (status, headers, _) = server.post_full("/v1/embeddings", &json!({"input": ["a b", "c"]}), &[("x-request-id", "trace-123")]);
    assert_eq!(status, 200);
    assert_eq!(headers["x-request-id"], "trace-123");
    let (status, headers, _) = server.post_full("/v1/embeddings", &json!({"input": []}), &[]);
    assert_eq!(status, 400);
    let made = headers["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(made.len(), 16, "a made id: {made}");
    // The log line is written after the response: give it a moment.
    let lines = (0..50)
        .find_map(|_| {
            let lines: Vec<Value> =
                server.stderr().lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).filter(|l| l["target"] == "eeane::request").collect();
            if lines.len() >= 2 {
                Some(lines)
            } else {
                std::thread::sleep(std::time::Duration::from_millis(50));
                None
            }
        })
        .unwrap_or_else(|| panic!("no JSON request lines in: {}", server.stderr()));
    let traced = lines.iter().find(|l| l["fields"]["id"] == "trace-123").expect("the traced request's line");
    assert_eq!(traced["fields"]["model"], "m");
    assert_eq!(traced["fields"]["inputs"], 2);
    assert!(traced["fields"]["tokens"].as_u64().unwrap() >= 5);
    assert_eq!(traced["fields"]["status"], 200);
    assert!(traced["fields"]["latency_ms"].is_string());
    let failed = lines.iter().find(|l| l["fields"]["id"] == made.as_str()).expect("the failed request's line");
    assert_eq!(failed["fields"]["status"], 400);
}
