//! Overload: far more requests than the machine can serve, from this process
//! (a second process to the server) on loopback. Only 200, 429 and 503 may come
//! back, each refusal with Retry-After; memory stays bounded; the admitted
//! requests' latency is reported; right after the load stops the server
//! answers normally. EEANE_OVERLOAD_SECONDS (default 10 here; docs/reliability.md
//! has the 60 s run).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{model_entry, Server};
use serde_json::json;

struct Answer {
    status: u16,
    retry_after: bool,
    seconds: f64,
}

fn hammer(url: &str, clients: usize, seconds: f64) -> Vec<Answer> {
    let answers = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let (url, answers, stop) = (url.to_string(), answers.clone(), stop.clone());
            std::thread::spawn(move || {
                let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let texts: Vec<String> = (0..8).map(|k| format!("overload {c} {i} {k}: fn handle(request: Request) -> Response")).collect();
                    let started = Instant::now();
                    let (status, retry_after) = match client.post(format!("{url}/v1/embeddings")).json(&json!({ "input": texts })).send() {
                        Ok(r) => (r.status().as_u16(), r.headers().contains_key("retry-after")),
                        Err(_) => (0, false),
                    };
                    answers.lock().unwrap().push(Answer { status, retry_after, seconds: started.elapsed().as_secs_f64() });
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    threads.into_iter().for_each(|t| t.join().unwrap());
    Arc::try_unwrap(answers).ok().unwrap().into_inner().unwrap()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[test]
fn ten_times_capacity_gets_only_200_429_503_and_recovers_at_once() {
    let seconds: f64 = std::env::var("EEANE_OVERLOAD_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(10.0);
    let config = format!(
        "[server]\nmax_pending_requests = 16\nqueue_timeout = 2\n{}",
        model_entry("all-minilm-l6-v2", "all-minilm-l6-v2", "load_policy = \"resident\"")
    );
    let server = Server::start(Some(&config), &[]);

    // What the machine serves: 4 clients, never refused.
    let capacity = hammer(&server.url, 4, 3.0);
    assert!(capacity.iter().all(|a| a.status == 200));
    let served_per_second = capacity.len() as f64 / 3.0;
    let rss_before = common::tree_status_kib(server.pid(), "VmRSS:");

    // Overload: 96 clients without pause; refusals come back at once, so the
    // offered rate is many times the capacity.
    let rss_max = Arc::new(std::sync::atomic::AtomicU64::new(rss_before));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (rss_max, sampling, pid) = (rss_max.clone(), sampling.clone(), server.pid());
        std::thread::spawn(move || {
            while sampling.load(Ordering::Relaxed) {
                rss_max.fetch_max(common::tree_status_kib(pid, "VmRSS:"), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let answers = hammer(&server.url, 96, seconds);
    sampling.store(false, Ordering::Relaxed);
    sampler.join().unwrap();

    // At once afterwards: an ordinary request answers, and nothing is pending.
    let started = Instant::now();
    let after = server.embed(json!(["after the storm"]), json!({}));
    let recovery = started.elapsed();
    assert_eq!(after.len(), 1);
    server.wait_for_health("nothing pending", Duration::from_secs(5), |h| h["pending_requests"] == 0);

    let count = |s: u16| answers.iter().filter(|a| a.status == s).count();
    let mut admitted: Vec<f64> = answers.iter().filter(|a| a.status == 200).map(|a| a.seconds).collect();
    admitted.sort_by(f64::total_cmp);
    let offered = answers.len() as f64 / seconds;
    let rss_max = rss_max.load(Ordering::Relaxed);
    println!(
        "overload {seconds} s, 96 clients: {} requests ({offered:.0}/s offered, {:.0}x the {served_per_second:.1}/s served by 4 clients): \
         200: {}, 429: {}, 503: {}, other: {}; admitted latency p50 {:.3} s, p99 {:.3} s, max {:.3} s; \
         RSS {:.1} MiB before, {:.1} MiB at most; first request after: {:.3} s",
        answers.len(),
        offered / served_per_second,
        count(200),
        count(429),
        count(503),
        answers.len() - count(200) - count(429) - count(503),
        percentile(&admitted, 0.5),
        percentile(&admitted, 0.99),
        admitted.last().unwrap(),
        rss_before as f64 / 1024.0,
        rss_max as f64 / 1024.0,
        recovery.as_secs_f64()
    );
    assert!(offered >= 10.0 * served_per_second, "the load was not ten times the capacity");
    assert!(answers.iter().all(|a| matches!(a.status, 200 | 429 | 503)), "statuses other than 200/429/503");
    assert!(answers.iter().filter(|a| a.status != 200).all(|a| a.retry_after), "a refusal without Retry-After");
    assert!(count(200) > 0 && count(429) > 0);
    // Bounded: admission keeps at most 16 requests of 8 texts in the server.
    assert!(rss_max < rss_before + 256 * 1024, "RSS grew from {rss_before} KiB to {rss_max} KiB");
}

/// SIGTERM while 1,024 connections send one text a request, as the model
/// loads on first use and past max_pending_requests: the server drains and
/// exits 0, five times with the engine on the server's threads and five in
/// engine processes. The load comes from wrk (tests/gpu/load.lua), which a
/// Rust client on these cores could not match.
#[test]
fn sigterm_under_overload_while_loading_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let bodies = dir.path().join("one.jsonl");
    let lines: Vec<String> = (0..4000).map(|i| json!({"model": "m", "input": [format!("text {i}: fn stop(server: &Server)")]}).to_string()).collect();
    std::fs::write(&bodies, lines.join("\n") + "\n").unwrap();
    for isolation in ["thread", "process"] {
        for attempt in 1..=5 {
            let entry = model_entry("m", "all-minilm-l6-v2", &format!("isolation = \"{isolation}\"\ndevice = [\"cpu\", \"cpu\"]\nthreads = 1"));
            let mut server = Server::start(Some(&format!("[server]\nmax_pending_requests = 200\n{entry}")), &[]);
            let mut wrk = std::process::Command::new("wrk")
                .args(["-t2", "-c1024", "-d30s", "--timeout", "30s", "-s", concat!(env!("CARGO_MANIFEST_DIR"), "/tests/gpu/load.lua"), &server.url, "--"])
                .arg(&bodies)
                .arg("2")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("wrk is missing: run `bash tests/run.sh` (EEANE_EXTRA_MODELS=wrk bash models/setup.sh)");
            std::thread::sleep(Duration::from_millis(300 * attempt));
            server.signal("TERM");
            let exit = server.wait_exit(Duration::from_secs(90));
            let _ = wrk.kill();
            let _ = wrk.wait();
            let exit = exit.unwrap_or_else(|| panic!("{isolation}, attempt {attempt}: still running 90 s after SIGTERM"));
            assert!(exit.success(), "{isolation}, attempt {attempt}: {exit:?}\n{}", server.stderr().lines().rev().take(20).collect::<Vec<_>>().join("\n"));
        }
        println!("{isolation}: SIGTERM under overload, 5 of 5 exits with status 0");
    }
}
