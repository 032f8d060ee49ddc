//! Scale-out behind a standard balancer: two eeane replicas and nginx on
//! loopback, configured by examples/deploy/nginx.conf (its upstream and listen
//! lines pointed at the test's ports). Shows both replicas serving, one stopped
//! (SIGTERM) under load with no request lost, 429 and Retry-After passed
//! through, and the throughput of one replica against two (printed, never
//! asserted).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::nginx::Nginx;
use common::{model_entry, Server};
use serde_json::{json, Value};

/// nginx with examples/deploy/nginx.conf over `replicas` (host:port).
fn nginx(replicas: &[&str]) -> Nginx {
    common::nginx::start("nginx.conf", replicas, &[], &[])
}

fn address(server: &Server) -> String {
    server.url.trim_start_matches("http://").to_string()
}

fn requests_served(server: &Server) -> u64 {
    server.model_health("all-minilm-l6-v2")["counters"]["requests"].as_u64().unwrap()
}

/// `clients` threads posting embeddings to `url` until `stop` (or `count`
/// requests in all); statuses counted.
fn load(url: &str, clients: usize, count: Option<u64>, stop: Arc<AtomicBool>) -> (Vec<u16>, Duration) {
    let statuses = Arc::new(Mutex::new(Vec::new()));
    let sent = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let (url, stop, statuses, sent) = (url.to_string(), stop.clone(), statuses.clone(), sent.clone());
            std::thread::spawn(move || {
                let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(120)).build().unwrap();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    if count.is_some_and(|n| sent.fetch_add(1, Ordering::Relaxed) >= n) {
                        break;
                    }
                    let texts: Vec<String> = (0..8).map(|k| format!("replica test {c} {i} {k}: fn parse(input: &str) -> Result<Ast, Error>")).collect();
                    let status = client.post(format!("{url}/v1/embeddings")).json(&json!({ "input": texts })).send().map(|r| r.status().as_u16()).unwrap_or(0);
                    statuses.lock().unwrap().push(status);
                    i += 1;
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let elapsed = started.elapsed();
    let statuses = statuses.lock().unwrap().clone();
    (statuses, elapsed)
}

fn replica() -> Server {
    // One intra-op thread per replica: two replicas can then use this
    // machine's two cores, which is what "where the cores allow" means here.
    Server::start(Some(&model_entry("all-minilm-l6-v2", "all-minilm-l6-v2", "threads = 1\nload_policy = \"resident\"")), &[])
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|&&s| s == status).count()
}

#[test]
fn two_replicas_behind_nginx() {
    let (a, mut b) = (replica(), replica());

    // Throughput: the same load through nginx over one replica, then two.
    let requests = 240;
    let one = nginx(&[&address(&a)]);
    load(&one.url, 2, Some(16), Arc::new(AtomicBool::new(false))); // warm-up
    let (statuses, t1) = load(&one.url, 8, Some(requests), Arc::new(AtomicBool::new(false)));
    assert_eq!(count(&statuses, 200), requests as usize);
    drop(one);
    let both = nginx(&[&address(&a), &address(&b)]);
    let (before_a, before_b) = (requests_served(&a), requests_served(&b));
    let (statuses, t2) = load(&both.url, 8, Some(requests), Arc::new(AtomicBool::new(false)));
    assert_eq!(count(&statuses, 200), requests as usize);
    let (served_a, served_b) = (requests_served(&a) - before_a, requests_served(&b) - before_b);
    let (r1, r2) = (requests as f64 / t1.as_secs_f64(), requests as f64 / t2.as_secs_f64());
    println!(
        "through nginx, {requests} requests of 8 texts, 8 clients: one replica {r1:.1} req/s, two replicas {r2:.1} req/s ({:.2}x); \
         split {served_a} / {served_b}; {} cores",
        r2 / r1,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    // Least connections spreads the load over both.
    assert!(served_a >= requests / 5 && served_b >= requests / 5, "split {served_a} / {served_b}");

    // One replica stopped under load: every request still answered 200.
    let stop = Arc::new(AtomicBool::new(false));
    let runner = {
        let (url, stop) = (both.url.clone(), stop.clone());
        std::thread::spawn(move || load(&url, 6, None, stop))
    };
    std::thread::sleep(Duration::from_millis(1500));
    let at_stop = requests_served(&a);
    b.signal("TERM");
    let exit = b.wait_exit(Duration::from_secs(60)).expect("replica b drained and exited");
    assert!(exit.success(), "{exit:?}");
    std::thread::sleep(Duration::from_millis(2500));
    stop.store(true, Ordering::Relaxed);
    let (statuses, _) = runner.join().unwrap();
    let after = requests_served(&a) - at_stop;
    println!("stopping one replica under load: {} requests, {} answered 200, {after} by the survivor after the stop", statuses.len(), count(&statuses, 200));
    assert_eq!(count(&statuses, 200), statuses.len(), "statuses other than 200: {:?}", statuses.iter().filter(|&&s| s != 200).collect::<Vec<_>>());
    assert!(after > 0);
    drop(both);

    // 429 and Retry-After pass through unchanged.
    let tight = Server::start(Some(&model_entry("all-minilm-l6-v2", "all-minilm-l6-v2", "load_policy = \"resident\"")), &[("EEANE_MAX_PENDING_REQUESTS", "1")]);
    let proxy = nginx(&[&address(&tight)]);
    let seen = Arc::new(Mutex::new(Vec::<(u16, Option<String>, Value)>::new()));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (url, seen) = (proxy.url.clone(), seen.clone());
            std::thread::spawn(move || {
                let client = reqwest::blocking::Client::new();
                for _ in 0..4 {
                    let texts: Vec<String> = (0..64).map(|k| format!("a longer text to keep the replica busy for a while {k} ").repeat(4)).collect();
                    let r = client.post(format!("{url}/v1/embeddings")).json(&json!({ "input": texts })).send().unwrap();
                    let status = r.status().as_u16();
                    let retry = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
                    seen.lock().unwrap().push((status, retry, r.json().unwrap_or(Value::Null)));
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let seen = seen.lock().unwrap();
    let refused: Vec<_> = seen.iter().filter(|(s, _, _)| *s == 429).collect();
    println!("through nginx to a replica with max_pending_requests = 1: {} requests, {} answered 429", seen.len(), refused.len());
    assert!(seen.iter().all(|(s, _, _)| *s == 200 || *s == 429), "{:?}", seen.iter().map(|(s, _, _)| s).collect::<Vec<_>>());
    assert!(!refused.is_empty());
    for (_, retry, body) in refused {
        assert!(retry.as_deref().is_some_and(|r| r.parse::<u64>().is_ok()), "Retry-After: {retry:?}");
        assert_eq!(body["error"]["code"], "too_many_pending_requests", "{body}");
    }
}
