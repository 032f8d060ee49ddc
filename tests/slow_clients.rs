//! Slow and stalled clients must not lock others out: the server starts with
//! `ulimit -n 1024` (systemd's default) and, phase by phase, 1,100 loopback
//! connections stall in the request head, in the body, and idle between
//! requests; then clients send 2,048 texts and never read the answer. Meanwhile
//! another client asks /health and /v1/embeddings on fresh connections, each
//! with a 2 s limit, and every stalled connection must be closed by the server
//! within its timeout plus 1 s. An honest client sending a 1 MB body at
//! 64 KB/s succeeds. The figures for docs/reliability.md are printed.
//!
//! The attack is bounded (1,100 connections, each phase under a minute) and
//! goes only to the server this test starts on 127.0.0.1.

mod common;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{model_entry, tree_status_kib, Server};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CONNECTIONS: usize = 1_100;
/// Every connection timeout in the test config, in seconds.
const TIMEOUT_S: u64 = 2;
/// What a stalled connection may live past its timeout.
const SLACK: Duration = Duration::from_secs(1);
/// Each probe must be answered within this.
const PROBE_LIMIT: Duration = Duration::from_secs(2);

fn config() -> String {
    format!(
        "[server]\nhealth_rate_limit = 0\nheader_read_timeout = {t}\nbody_read_timeout = {t}\nidle_connection_timeout = {t}\nwrite_timeout = {t}\n\n{}",
        model_entry("minilm", "all-minilm-l6-v2", "load_policy = \"resident\""),
        t = TIMEOUT_S
    )
}

/// Requests from an ordinary client, each on a new connection, for as long as
/// an attack runs: how many, how many failed (no answer within PROBE_LIMIT or
/// not 200), and the slowest.
struct Prober {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(usize, Vec<String>, Duration)>,
}

impl Prober {
    fn start(url: &str) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let (url, flag) = (url.to_string(), stop.clone());
        let thread = std::thread::spawn(move || {
            let client = reqwest::blocking::Client::builder().timeout(PROBE_LIMIT).pool_max_idle_per_host(0).build().unwrap();
            let (mut count, mut failures, mut slowest) = (0, Vec::new(), Duration::ZERO);
            while !flag.load(Ordering::Relaxed) {
                for embed in [false, true] {
                    let started = Instant::now();
                    let result = if embed {
                        client.post(format!("{url}/v1/embeddings")).json(&json!({"input": "is anyone there?"})).send()
                    } else {
                        client.get(format!("{url}/health")).send()
                    };
                    let took = started.elapsed();
                    slowest = slowest.max(took);
                    count += 1;
                    match result {
                        Ok(r) if r.status() == 200 => {}
                        Ok(r) => failures.push(format!("{} after {took:?}", r.status())),
                        Err(e) => failures.push(format!("{e} after {took:?}")),
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            (count, failures, slowest)
        });
        Prober { stop, thread }
    }

    fn finish(self, phase: &str) -> Duration {
        self.stop.store(true, Ordering::Relaxed);
        let (count, failures, slowest) = self.thread.join().unwrap();
        println!("{phase}: ordinary client: {count} requests, {} failed, slowest {slowest:?}", failures.len());
        assert!(count >= 4, "{phase}: the prober ran {count} requests");
        assert!(failures.is_empty(), "{phase}: ordinary requests failed during the attack: {failures:?}");
        slowest
    }
}

fn metric(server: &Server, name_and_labels: &str) -> f64 {
    let (_, text) = server.get_text("/metrics");
    text.lines().find_map(|line| line.strip_prefix(name_and_labels).and_then(|rest| rest.trim().parse::<f64>().ok())).unwrap_or(0.0)
}

/// How a stalled connection opens before it stalls.
#[derive(Clone, Copy, Debug)]
enum Stall {
    /// Part of a request head.
    Head,
    /// A whole head announcing 1,000,000 bytes of body, then 10 of them.
    Body,
    /// A whole request, its whole answer read, then nothing.
    Idle,
}

impl Stall {
    fn opening(self) -> &'static [u8] {
        match self {
            Stall::Head => b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n",
            Stall::Body => b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{\"input\": ",
            Stall::Idle => b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
        }
    }

    fn reason(self) -> &'static str {
        match self {
            Stall::Head => "head_timeout",
            Stall::Body => "body_timeout",
            Stall::Idle => "idle_timeout",
        }
    }
}

/// Reads one HTTP/1.1 answer with a Content-Length (the idle phase's).
async fn read_answer(stream: &mut tokio::net::TcpStream) -> Vec<u8> {
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await.expect("read the answer");
        assert!(n > 0, "closed before the answer was whole");
        answer.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&answer).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let length: usize = text[..end]
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
                .expect("content-length");
            if answer.len() >= end + 4 + length {
                return answer;
            }
        }
    }
}

/// Opens CONNECTIONS stalled connections; returns, per connection, how long
/// after its stall began the server closed it, and the peak of open
/// connections, file descriptors and memory seen while they were held.
fn attack(server: &Server, stall: Stall) -> (Vec<Duration>, f64, usize, u64) {
    let address: std::net::SocketAddr = server.url.trim_start_matches("http://").parse().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let held = held.clone();
            runtime.spawn(async move {
                let mut stream = tokio::net::TcpStream::connect(address).await.expect("connect");
                let mut stalled_at = Instant::now();
                stream.write_all(stall.opening()).await.expect("send");
                if let Stall::Idle = stall {
                    read_answer(&mut stream).await;
                    stalled_at = Instant::now();
                } else if let Stall::Body = stall {
                    stalled_at = Instant::now();
                }
                held.lock().unwrap().push(());
                // Whatever comes (a 408 for the body), until the server closes.
                let mut buf = [0u8; 4096];
                let limit = Duration::from_secs(TIMEOUT_S) + Duration::from_secs(30);
                let closed = tokio::time::timeout(limit, async {
                    loop {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(_) => {}
                        }
                    }
                })
                .await;
                assert!(closed.is_ok(), "{stall:?}: a connection was still open {limit:?} after it stalled");
                stalled_at.elapsed()
            })
        })
        .collect();
    // While they are held: the open connections and the server's memory, sampled.
    let (mut peak_open, mut peak_fds, mut peak_rss) = (0.0f64, 0usize, 0u64);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(TIMEOUT_S) + SLACK && !tasks.iter().all(|t| t.is_finished()) {
        peak_open = peak_open.max(metric(server, "eeane_http_connections_open"));
        peak_fds = peak_fds.max(std::fs::read_dir(format!("/proc/{}/fd", server.pid())).unwrap().count());
        peak_rss = peak_rss.max(common::proc_status_kib(server.pid(), "VmRSS:"));
        std::thread::sleep(Duration::from_millis(100));
    }
    let lifetimes = runtime.block_on(async {
        let mut out = Vec::new();
        for task in tasks {
            out.push(task.await.expect("connection task"));
        }
        out
    });
    assert_eq!(held.lock().unwrap().len(), CONNECTIONS);
    (lifetimes, peak_open, peak_fds, peak_rss)
}

/// Our own process holds the attack's sockets: lift our soft limit to the hard one.
fn room_for_the_attack() {
    let (_, hard) = rlimit::Resource::NOFILE.get().unwrap();
    rlimit::Resource::NOFILE.set(hard, hard).unwrap();
    assert!(hard >= 2 * CONNECTIONS as u64 + 100, "the test needs an open-file limit of {}; the hard limit is {hard}", 2 * CONNECTIONS + 100);
}

#[test]
fn stalled_connections_do_not_lock_users_out() {
    room_for_the_attack();
    let server = Server::start_with(Some(&config()), &[("NO_COLOR", "1")], Some(1024));
    assert!(server.stderr().contains("open-file limit"), "the limits are logged:\n{}", server.stderr());
    let cap = metric(&server, "eeane_http_connections_max");
    assert!(cap > 0.0 && cap < 1024.0, "the connection cap stays below the open-file limit: {cap}");
    let idle_rss = common::proc_status_kib(server.pid(), "VmRSS:");
    println!("open-file limit 1024, connection cap {cap}, server RSS {idle_rss} KiB before the attacks");

    for stall in [Stall::Head, Stall::Body, Stall::Idle] {
        let before = metric(&server, &format!("eeane_http_connections_closed_total{{reason=\"{}\"}}", stall.reason()));
        let evicted_before = metric(&server, "eeane_http_connections_closed_total{reason=\"evicted\"}");
        let baseline = common::proc_status_kib(server.pid(), "VmRSS:");
        let prober = Prober::start(&server.url);
        let (lifetimes, peak_open, peak_fds, peak_rss) = attack(&server, stall);
        let slowest = prober.finish(&format!("{stall:?}"));
        let longest = lifetimes.iter().max().unwrap();
        let timed_out = metric(&server, &format!("eeane_http_connections_closed_total{{reason=\"{}\"}}", stall.reason())) - before;
        let evicted = metric(&server, "eeane_http_connections_closed_total{reason=\"evicted\"}") - evicted_before;
        let per_connection = (peak_rss.saturating_sub(baseline) as f64) / peak_open.max(1.0);
        println!(
            "{stall:?}: {CONNECTIONS} stalled connections; held at most {peak_open} at once ({peak_fds} open files); closed by {} {timed_out}, by the cap {evicted}; \
             longest lived {longest:?} after stalling; server RSS {baseline} -> {peak_rss} KiB ({per_connection:.1} KiB per held connection); slowest ordinary answer {slowest:?}",
            stall.reason()
        );
        assert!(
            *longest <= Duration::from_secs(TIMEOUT_S) + SLACK,
            "{stall:?}: a stalled connection lived {longest:?}, past the timeout ({TIMEOUT_S} s) plus {SLACK:?}"
        );
        // Connections closed at the cap count until their task has run, so the
        // gauge can pass the cap briefly; the descriptors must stay clear of the limit.
        assert!(peak_fds < 1000, "{stall:?}: {peak_fds} files open, near the limit of 1,024");
        // The cap may also have closed an ordinary client's connection idle after its answer.
        assert!(timed_out + evicted >= CONNECTIONS as f64, "{stall:?}: {timed_out} + {evicted} closed by the timeout and the cap");
        assert!(timed_out > 0.0, "{stall:?}: none closed by {}", stall.reason());
    }
    assert!(metric(&server, "eeane_http_connections_open") <= 1.0, "connections left open");

    stalled_writers(&server);
    honest_slow_body(&server);
    assert!(!server.stderr().contains("Too many open files"), "{}", server.stderr());
}

/// Clients that send 2,048 texts and never read the answer: others are
/// served meanwhile, and each such connection is cut by the write timeout.
fn stalled_writers(server: &Server) {
    const WRITERS: usize = 2;
    let before = metric(server, "eeane_http_connections_closed_total{reason=\"write_timeout\"}");
    let inferences_before = metric(server, "eeane_model_inferences_total{model=\"minilm\"}");
    // Different texts per writer, so that each is computed (identical requests would share one inference).
    let request = |writer: usize| {
        let texts: Vec<String> = (0..2048).map(|i| format!("text number {i} of writer {writer}'s large request")).collect();
        let body = json!({ "model": "minilm", "input": texts }).to_string();
        format!("POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len())
    };
    let address = server.url.trim_start_matches("http://").to_string();
    let prober = Prober::start(&server.url);
    let sent = Instant::now();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let sockets: Vec<std::net::TcpStream> = (0..WRITERS)
        .map(|writer| {
            // A small receive window, as a client that stopped reading soon has:
            // loopback's would otherwise take much of the answer.
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.set_recv_buffer_size(4096).unwrap();
            let stream = runtime.block_on(socket.connect(address.parse().unwrap())).unwrap().into_std().unwrap();
            stream.set_nonblocking(false).unwrap();
            (&stream).write_all(request(writer).as_bytes()).unwrap();
            stream
        })
        .collect();
    // The answers (~8 MB of JSON each) fill the socket buffers and stop; the
    // server cuts each after write_timeout without progress.
    let started = Instant::now();
    while metric(server, "eeane_http_connections_closed_total{reason=\"write_timeout\"}") - before < WRITERS as f64 {
        assert!(started.elapsed() < Duration::from_secs(120), "stalled writers not cut: {}", server.stderr());
        std::thread::sleep(Duration::from_millis(100));
    }
    let cut_after = sent.elapsed();
    let slowest = prober.finish("stalled writers");
    let inferences = metric(server, "eeane_model_inferences_total{model=\"minilm\"}") - inferences_before;
    // The handler's own time for each (request log), to tell compute from the stall.
    let log = server.stderr();
    let handled_ms: Vec<f64> = log
        .lines()
        .filter(|l| l.contains("eeane::request") && l.contains("inputs=2048"))
        .filter_map(|l| l.split("latency_ms=").nth(1).and_then(|v| v.split_whitespace().next()).and_then(|v| v.trim_matches('"').parse().ok()))
        .collect();
    assert_eq!(handled_ms.len(), WRITERS, "request log lines of the 2,048-text requests:\n{log}");
    let computed = Duration::from_secs_f64(handled_ms.iter().cloned().fold(0.0, f64::max) / 1e3);
    println!(
        "stalled writers: {WRITERS} x 2,048 texts never read; answers computed in at most {computed:?}; cut by write_timeout {cut_after:?} after sending; {inferences} inferences; slowest ordinary answer {slowest:?}"
    );
    assert!(
        cut_after <= computed + Duration::from_secs(TIMEOUT_S) + SLACK + Duration::from_millis(300),
        "cut {cut_after:?} after sending; computed in {computed:?}"
    );
    // The server closed them: reading now ends (after whatever was buffered).
    for mut socket in sockets {
        socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut sink = Vec::new();
        let read = socket.read_to_end(&mut sink);
        assert!(read.is_ok() || read.as_ref().unwrap_err().kind() == std::io::ErrorKind::ConnectionReset, "{read:?}");
        assert!(sink.len() < 2048 * 384 * 8, "the whole answer was delivered ({} bytes)", sink.len());
    }
    let used = tree_status_kib(server.pid(), "VmRSS:");
    println!("server and engine RSS after the stalled writers: {used} KiB");
}

/// 1 MB of body at 64 KB/s: slower than any timeout in total, never stalled.
fn honest_slow_body(server: &Server) {
    let texts: Vec<String> = (0..64).map(|i| format!("document {i} ") + &"words of a long page ".repeat(780)).collect();
    let body = json!({ "model": "minilm", "input": texts }).to_string();
    assert!(body.len() >= 1_000_000, "{}", body.len());
    let address = server.url.trim_start_matches("http://").to_string();
    let mut stream = std::net::TcpStream::connect(&address).unwrap();
    let started = Instant::now();
    write!(stream, "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len())
        .unwrap();
    for chunk in body.as_bytes().chunks(4096) {
        stream.write_all(chunk).unwrap();
        // 4 KiB every 62.5 ms: 64 KiB/s.
        std::thread::sleep(Duration::from_micros(62_500));
    }
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let took = started.elapsed();
    assert!(answer.starts_with("HTTP/1.1 200"), "{}", &answer[..answer.len().min(500)]);
    let json: serde_json::Value = serde_json::from_str(&answer[answer.find("\r\n\r\n").unwrap() + 4..]).unwrap();
    assert_eq!(json["data"].as_array().unwrap().len(), 64);
    println!("honest slow client: {} bytes at 64 KiB/s, answered 200 after {took:?}", body.len());
    assert!(took > Duration::from_secs(TIMEOUT_S * 4), "the body took longer than any timeout in total");
}
