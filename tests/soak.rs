//! Soak, run on demand (not in CI):
//!   cargo test --release --test soak -- --ignored --nocapture
//! keep_alive = 0 under concurrent load for EEANE_SOAK_SECONDS (default 600):
//! the model unloads whenever it goes idle and reloads on the next request.
//! Checks: no failed request, vectors bit-identical across reloads, and the
//! unloaded server's RSS grows by no more than 5 %.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{model_entry, Server};
use serde_json::{json, Value};

fn rss_kib(pid: u32) -> u64 {
    common::tree_status_kib(pid, "VmRSS:")
}

#[test]
#[ignore = "runs for 10 minutes; run on demand"]
fn keep_alive_0_under_concurrent_load() {
    let seconds: u64 = std::env::var("EEANE_SOAK_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(600);
    // The default model as shipped (config/default.toml), with keep_alive = 0;
    // EEANE_SOAK_PLAIN=1 uses a plain entry (one 256-token bucket of 32) instead.
    let config = if std::env::var_os("EEANE_SOAK_PLAIN").is_some() {
        format!("[server]\nkeep_alive = 0\n{}", model_entry("all-minilm-l6-v2", "all-minilm-l6-v2", ""))
    } else if let Ok(extra) = std::env::var("EEANE_SOAK_MODEL_EXTRA") {
        // The shipped default model with extra keys, for experiments:
        // EEANE_SOAK_MODEL_EXTRA="threads = 1" creates no ONNX Runtime threads per load.
        include_str!("../config/default.toml").replace("keep_alive = 300", "keep_alive = 0").replace("device = \"cpu\"", &format!("device = \"cpu\"\n{extra}"))
    } else {
        "[server]\nkeep_alive = 0\n".to_string()
    };
    let server = Arc::new(Server::start(Some(&config), &[]));
    let requests: Vec<Value> = vec![
        json!("hello"),
        json!(["def f(x):\n    return x + 1", "a docstring about parsing", "SELECT 1"]),
        json!(common::fixture_texts()),
        json!({"dimensions": 64}),
    ];
    let requests: Vec<Value> =
        requests.into_iter().map(|r| if r.is_object() { json!({"input": "truncated", "dimensions": 64}) } else { json!({"input": r}) }).collect();
    // The expected answer to each request, from a first pass.
    let expected: Vec<Value> = requests.iter().map(|r| server.post("/v1/embeddings", r).1["data"].clone()).collect();

    // Gaps between requests, so that the model goes idle (and unloads) now and then.
    let clients = common::CheckingClients::start(server.clone(), requests, expected, 4, |i, c| i + c, |i, c| (((i + c) * 37 + c * 11) % 60) as u64);
    let pause = clients.pause.clone();

    // Every 30 s: pause the clients, let the model unload, and sample RSS.
    let unloaded_rss = || {
        pause.store(true, Ordering::Relaxed);
        server.wait_for_health("an idle, unloaded model", Duration::from_secs(60), |h| h["pending_requests"] == 0 && h["models"][0]["state"] == "unloaded");
        // The engine thread frees and trims after the slot reads "unloaded":
        // take the settled value, the least of three samples over a second.
        let rss = (0..3)
            .map(|_| {
                thread::sleep(Duration::from_millis(400));
                (rss_kib(server.pid()), common::tree_status_kib(server.pid(), "RssAnon:"), common::tree_status_kib(server.pid(), "RssFile:"))
            })
            .min()
            .unwrap();
        // EEANE_SOAK_SMAPS=DIR keeps each sample's /proc/PID/smaps, to see
        // which mapping (main heap, second arena, stacks, libraries) grew.
        if let Some(dir) = std::env::var_os("EEANE_SOAK_SMAPS") {
            let n = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
            let _ = std::fs::copy(format!("/proc/{}/smaps", server.pid()), std::path::Path::new(&dir).join(format!("smaps.{n:03}")));
        }
        pause.store(false, Ordering::Relaxed);
        rss
    };
    let started = Instant::now();
    let (mut samples, mut anon, mut file) = (Vec::new(), Vec::new(), Vec::new());
    while started.elapsed() < Duration::from_secs(seconds) {
        thread::sleep(Duration::from_secs(30).min(Duration::from_secs(seconds).saturating_sub(started.elapsed())));
        let (rss, a, f) = unloaded_rss();
        samples.push(rss);
        anon.push(a);
        file.push(f);
    }
    let (done, failed) = clients.finish();
    let loads = server.model_health("all-minilm-l6-v2")["counters"]["loads"].as_u64().unwrap();
    let (first, last) = (samples[0], *samples.last().unwrap());
    println!(
        "soak {seconds} s: {} requests, {} failed, {loads} loads; unloaded RSS first {:.1} MiB, last {:.1} MiB ({:+.1} %), max {:.1} MiB",
        done,
        failed,
        first as f64 / 1024.0,
        last as f64 / 1024.0,
        (last as f64 / first as f64 - 1.0) * 100.0,
        *samples.iter().max().unwrap() as f64 / 1024.0
    );
    println!("unloaded RSS samples (KiB, every 30 s): {samples:?}");
    // Anonymous (private) memory and file-backed pages (shared library text
    // and data, reclaimable), apart: a growth in one is not a growth in the other.
    println!("  of which RssAnon: {anon:?}");
    println!("  and RssFile: {file:?}");
    assert_eq!(failed, 0);
    assert!(loads > 10, "the model should have reloaded many times, not {loads}");
    assert!(last as f64 <= first as f64 * 1.05, "RSS grew: {samples:?}");
}
