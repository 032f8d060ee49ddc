//! Churn: three models, keep_alive = 0 and max_loaded_models = 1, under mixed
//! concurrent traffic: every request makes a load (and evicts another model
//! or unloads it when done). No request may fail, every answer must be
//! bit-identical to a run with every model resident, and the unloaded RSS is
//! sampled. EEANE_CHURN_SECONDS (default 20 here; docs/reliability.md has the
//! 10-minute run).

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{e5_dir, model_entry, Server};
use serde_json::{json, Value};

fn models(extra: &str) -> String {
    let e5 = e5_dir("e5-small-enpt");
    [
        model_entry("fp32", "all-minilm-l6-v2", extra),
        format!(
            "[[models]]\nid = \"int8\"\nengine = \"onnxruntime\"\nmodel = \"{}\"\ntokenizer = \"{}\"\nmax_tokens = 256\n{extra}\n",
            common::cache_dir().join("models/all-minilm-l6-v2-int8/model.onnx").display(),
            common::minilm_dir().join("tokenizer.json").display()
        ),
        format!(
            "[[models]]\nid = \"e5\"\nengine = \"onnxruntime\"\nmodel = \"{}\"\ntokenizer = \"{}\"\npooling = \"none\"\nmax_tokens = 512\n{extra}\n",
            e5.join("model.onnx").display(),
            e5.join("sentencepiece.model").display()
        ),
    ]
    .concat()
}

#[test]
fn three_models_one_slot_keep_alive_0_mixed_traffic() {
    let seconds: u64 = std::env::var("EEANE_CHURN_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let requests: Vec<Value> = ["fp32", "int8", "e5"]
        .iter()
        .flat_map(|m| {
            [
                json!({"model": m, "input": "hello"}),
                json!({"model": m, "input": ["def f(x):\n    return x + 1", "Como faço para ordenar uma lista?", "SELECT 1"]}),
                json!({"model": m, "input": common::fixture_texts()}),
            ]
        })
        .collect();
    let expected: Vec<Value> = {
        let resident = Server::start(Some(&models("load_policy = \"resident\"")), &[]);
        requests.iter().map(|r| resident.post("/v1/embeddings", r).1["data"].clone()).collect()
    };
    let config = format!("[server]\nkeep_alive = 0\nmax_loaded_models = 1\n{}", models(""));
    let server = Arc::new(Server::start(Some(&config), &[]));

    let clients = common::CheckingClients::start(server.clone(), requests, expected, 4, |i, c| (i + c * 5) * 7 + c, |_, _| 0);
    let pause = clients.pause.clone();
    let unloaded_rss = || {
        pause.store(true, Ordering::Relaxed);
        server.wait_for_health("every model unloaded", Duration::from_secs(60), |h| {
            h["pending_requests"] == 0 && h["models"].as_array().unwrap().iter().all(|m| m["state"] == "unloaded")
        });
        std::thread::sleep(Duration::from_millis(500));
        let rss = common::tree_status_kib(server.pid(), "VmRSS:");
        pause.store(false, Ordering::Relaxed);
        rss
    };
    let started = Instant::now();
    let mut samples = Vec::new();
    while started.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_secs(10).min(Duration::from_secs(seconds).saturating_sub(started.elapsed())));
        samples.push(unloaded_rss());
    }
    let (done, failed) = clients.finish();
    let (_, health) = server.get("/health");
    let loads: u64 = health["models"].as_array().unwrap().iter().map(|m| m["counters"]["loads"].as_u64().unwrap()).sum();
    println!("churn {seconds} s: {} requests, {} failed, {loads} loads; unloaded RSS every 10 s (KiB): {samples:?}", done, failed);
    assert_eq!(failed, 0);
    assert!(loads >= 6, "the models should have loaded over and over, not {loads} times");
}
