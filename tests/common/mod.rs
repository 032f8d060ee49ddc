//! Test harness: the real `eeane` binary on a free port, the real model from
//! the cache (prepared by models/setup.sh), and the Python reference.
#![allow(dead_code)]

pub mod hub;
pub mod nginx;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

pub fn cache_dir() -> PathBuf {
    // Where models/setup.sh and eeane put it: EEANE_CACHE_DIR, else $XDG_CACHE_HOME/eeane, else ~/.cache/eeane.
    let xdg = || std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache"));
    std::env::var_os("EEANE_CACHE_DIR").map(PathBuf::from).unwrap_or_else(|| xdg().join("eeane"))
}

/// A `[[models]]` entry for a prepared model directory (`all-minilm-l6-v2`,
/// `all-minilm-l6-v2-int8`), with extra TOML lines.
pub fn model_entry(id: &str, dir_name: &str, extra: &str) -> String {
    let dir = cache_dir().join("models").join(dir_name);
    assert!(dir.join("model.onnx").exists(), "{} is missing: run `bash tests/run.sh` first", dir.display());
    format!(
        "[[models]]\nid = \"{id}\"\nengine = \"onnxruntime\"\nmodel = \"{}\"\ntokenizer = \"{}\"\nmax_tokens = 256\n{extra}\n",
        dir.join("model.onnx").display(),
        dir.join("tokenizer.json").display()
    )
}

pub fn minilm_dir() -> PathBuf {
    let dir = cache_dir().join("models/all-minilm-l6-v2");
    assert!(dir.join("model.onnx").exists(), "{} is missing: run `bash tests/run.sh` (or models/setup.sh) first", dir.display());
    dir
}

pub struct Server {
    child: Child,
    pub url: String,
    dir: tempfile::TempDir,
}

impl Server {
    /// Starts `eeane serve --port 0` in an empty directory, with `config` as its
    /// TOML file if given (else the built-in defaults), and waits for it to listen.
    pub fn start(config: Option<&str>, env: &[(&str, &str)]) -> Server {
        Self::start_with(config, env, None)
    }

    /// As `start`, with the server's open-file limit (soft and hard, as
    /// `ulimit -n N` sets them) at `open_files` when given.
    pub fn start_with(config: Option<&str>, env: &[(&str, &str)], open_files: Option<u64>) -> Server {
        Self::launch(config, env, open_files, 0)
    }

    /// As `start`, on a given port (where a test needs addresses that are the
    /// same every run).
    pub fn start_on_port(config: Option<&str>, env: &[(&str, &str)], port: u16) -> Server {
        // A fixed port can be some client's ephemeral port for a moment (a
        // fresh clone's CI once found 47308 taken as a replica started):
        // try again for a few seconds before failing.
        for _ in 0..10 {
            match Self::try_launch(config, env, None, port) {
                Ok(server) => return server,
                Err(log) if log.contains("Address already in use") => std::thread::sleep(Duration::from_millis(500)),
                Err(log) => panic!("eeane did not start listening; stderr:\n{log}"),
            }
        }
        Self::launch(config, env, None, port)
    }

    fn launch(config: Option<&str>, env: &[(&str, &str)], open_files: Option<u64>, port: u16) -> Server {
        Self::try_launch(config, env, open_files, port).unwrap_or_else(|log| panic!("eeane did not start listening; stderr:\n{log}"))
    }

    /// Starts eeane; its stderr when it does not come to listen.
    fn try_launch(config: Option<&str>, env: &[(&str, &str)], open_files: Option<u64>, port: u16) -> Result<Server, String> {
        minilm_dir();
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_eeane"));
        if let Some(text) = config {
            std::fs::write(dir.path().join("test.toml"), text).unwrap();
            cmd.arg("--config").arg(dir.path().join("test.toml"));
        }
        cmd.args(["serve", "--port", &port.to_string()])
            .current_dir(dir.path())
            .env("XDG_CONFIG_HOME", dir.path())
            .env_remove("EEANE_CONFIG")
            .env_remove("EEANE_API_KEY")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("stderr.log")).unwrap());
        if let Some(limit) = open_files {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe, and only it runs between fork and exec.
            unsafe {
                cmd.pre_exec(move || rlimit::setrlimit(rlimit::Resource::NOFILE, limit, limit));
            }
        }
        let mut child = cmd.spawn().expect("spawn eeane");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("eeane: listening on ") {
                    let _ = tx.send(url.to_string());
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(url) => Ok(Server { child, url, dir }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default())
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The config file the server was started with (tests rewrite it to test reloads).
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("test.toml")
    }

    /// Sends a signal by name ("TERM", "HUP") with kill(1).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill").arg(format!("-{name}")).arg(self.pid().to_string()).status().unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit, up to `limit`; its status, if it did.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let started = std::time::Instant::now();
        while started.elapsed() < limit {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Polls /health until `ready` holds for it, up to `limit`; panics otherwise.
    pub fn wait_for_health(&self, what: &str, limit: Duration, ready: impl Fn(&Value) -> bool) -> Value {
        let started = std::time::Instant::now();
        loop {
            let health = self.health();
            if ready(&health) {
                return health;
            }
            assert!(started.elapsed() < limit, "timed out waiting for {what}; last /health: {health}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// POST returning status, headers and JSON body.
    pub fn post_full(&self, path: &str, body: &Value, headers: &[(&str, &str)]) -> (u16, reqwest::header::HeaderMap, Value) {
        let mut request = client().post(format!("{}{path}", self.url)).body(body.to_string());
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let response = request.send().expect("request");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        (status, headers, response.json().unwrap_or(Value::Null))
    }

    /// The log once a line satisfies `wanted` (the log reaches us a moment
    /// after the response), or as it is after `limit`.
    pub fn log_line(&self, limit: Duration, wanted: impl Fn(&str) -> bool) -> Option<String> {
        let until = std::time::Instant::now() + limit;
        loop {
            if let Some(line) = self.stderr().lines().find(|l| wanted(l)) {
                return Some(line.to_string());
            }
            if std::time::Instant::now() > until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
    }

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, body.to_string().into_bytes(), &[])
    }

    pub fn post_raw(&self, path: &str, body: Vec<u8>, headers: &[(&str, &str)]) -> (u16, Value) {
        let mut request = client().post(format!("{}{path}", self.url)).body(body).header("content-type", "application/json");
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let response = request.send().expect("request");
        let status = response.status().as_u16();
        (status, response.json().unwrap_or(Value::Null))
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        let response = client().get(format!("{}{path}", self.url)).send().expect("request");
        (response.status().as_u16(), response.json().unwrap_or(Value::Null))
    }

    pub fn get_text(&self, path: &str) -> (u16, String) {
        let response = client().get(format!("{}{path}", self.url)).send().expect("request");
        (response.status().as_u16(), response.text().unwrap_or_default())
    }

    /// The /health entry of model `id`.
    /// The least cosine a loaded model's vectors must keep to the fp32
    /// reference, and between forms of the same request: 0.99999 for an fp32
    /// variant; for a reduced precision that `precision = "auto"` chose on
    /// this machine (bf16 where the CPU has it), the gate it passed, 0.9999.
    pub fn fidelity_floor(&self, id: &str) -> f64 {
        let health = self.model_health(id);
        match health["variant"]["chosen"].as_str() {
            Some(chosen) if !chosen.ends_with("fp32") => 0.9999,
            _ => 0.99999,
        }
    }

    /// /health, waiting out its per-client rate limit (60 a minute by
    /// default) when a test that polls it reaches the limit.
    pub fn health(&self) -> Value {
        for _ in 0..120 {
            let response = client().get(format!("{}/health", self.url)).send().expect("request");
            if response.status() != reqwest::StatusCode::TOO_MANY_REQUESTS {
                return response.json().unwrap_or(Value::Null);
            }
            let wait = response.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse::<u64>().ok()).unwrap_or(1);
            std::thread::sleep(Duration::from_secs(wait.max(1)));
        }
        panic!("/health answered 429 for two minutes");
    }

    pub fn model_health(&self, id: &str) -> Value {
        let health = self.health();
        health["models"].as_array().unwrap().iter().find(|m| m["id"] == id).cloned().unwrap_or(Value::Null)
    }

    /// Embeds `input` with extra request fields; panics unless 200.
    pub fn embed(&self, input: Value, extra: Value) -> Vec<Vec<f32>> {
        let mut body = json!({ "input": input });
        body.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
        let (status, response) = self.post("/v1/embeddings", &body);
        assert_eq!(status, 200, "{response}");
        vectors(&response)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder().timeout(Duration::from_secs(300)).build().unwrap()
}

/// The vectors of an embeddings response, float or base64, in `index` order.
pub fn vectors(response: &Value) -> Vec<Vec<f32>> {
    use base64::Engine as _;
    let data = response["data"].as_array().expect("data");
    for (i, item) in data.iter().enumerate() {
        assert_eq!(item["index"], i, "data[{i}].index");
        assert_eq!(item["object"], "embedding");
    }
    data.iter()
        .map(|item| match &item["embedding"] {
            Value::Array(values) => values.iter().map(|v| v.as_f64().unwrap() as f32).collect(),
            Value::String(b64) => {
                base64::engine::general_purpose::STANDARD.decode(b64).unwrap().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
            }
            other => panic!("embedding is {other}"),
        })
        .collect()
}

pub struct Reference {
    pub vectors: Vec<Vec<f64>>,
    pub content_ids: Vec<Vec<i64>>,
    pub token_counts: Vec<usize>,
}

/// Runs a script of tests/reference with the venv's Python, `request` on stdin, JSON back.
pub fn run_reference(script: &str, request: &Value) -> Value {
    let python = std::env::var_os("EEANE_PYTHON").map(PathBuf::from).unwrap_or_else(|| cache_dir().join("venv/bin/python"));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/reference").join(script);
    let mut child = Command::new(&python)
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e} (run `bash tests/run.sh`)", python.display()));
    let mut stdin = child.stdin.take().unwrap();
    let body = request.to_string();
    // Write from a thread: a large answer must be read while the request is still going in.
    let writer = std::thread::spawn(move || stdin.write_all(body.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "{} failed", script.display());
    serde_json::from_slice(&out.stdout).unwrap()
}

pub fn f64s(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// Vectors from tests/reference/embed.py (onnxruntime + tokenizers in Python).
pub fn reference(texts: &[String], max_tokens: usize) -> Reference {
    let v = run_reference("embed.py", &json!({"model_dir": minilm_dir(), "max_tokens": max_tokens, "texts": texts}));
    Reference {
        vectors: v["vectors"].as_array().unwrap().iter().map(f64s).collect(),
        content_ids: v["content_ids"].as_array().unwrap().iter().map(|ids| f64s(ids).into_iter().map(|x| x as i64).collect()).collect(),
        token_counts: v["token_counts"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect(),
    }
}

pub fn cosine(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    dot / (na * nb)
}

pub fn as_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

pub fn fixture_texts() -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/texts.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A `/proc/PID/status` field in KiB, such as "VmRSS:".
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// `field` (VmRSS:, RssAnon:, ...) summed over `pid` and every process under
/// it: the server and its engine processes (isolation = "process"), which
/// together are what the server costs. A process that ends meanwhile counts 0.
pub fn tree_status_kib(pid: u32, field: &str) -> u64 {
    let of = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse::<u64>().ok()))
            .unwrap_or(0)
    };
    descendants(pid).into_iter().map(of).sum::<u64>() + of(pid)
}

/// The processes below `pid`, from /proc/PID/task/*/children.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else { continue };
        for task in tasks.flatten() {
            let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()) {
                found.push(child);
                queue.push(child);
            }
        }
    }
    found
}

/// A model directory prepared by `models/prepare.py NAME` (e5-small-enpt and its twins).
pub fn e5_dir(name: &str) -> PathBuf {
    let dir = cache_dir().join("models").join(name);
    assert!(dir.join("manifest.json").exists(), "{} is missing: run `bash tests/run.sh` first", dir.display());
    dir
}

/// Bytes of every file under `dir`, as `eeane models` counts them.
pub fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| if e.path().is_dir() { dir_bytes(&e.path()) } else { e.metadata().map(|m| m.len()).unwrap_or(0) }).sum())
        .unwrap_or(0)
}

/// Clients that post requests in a loop until stopped, pausing while asked to,
/// and check every answer's `data` against the expected one (soak, churn).
pub struct CheckingClients {
    pub stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub pause: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub done: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pub failed: std::sync::Arc<std::sync::atomic::AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl CheckingClients {
    /// `count` clients; client `c` sends request `pick(i, c)` as its i-th, then
    /// sleeps `gap_ms(i, c)` milliseconds.
    pub fn start(
        server: std::sync::Arc<Server>,
        requests: Vec<Value>,
        expected: Vec<Value>,
        count: usize,
        pick: fn(usize, usize) -> usize,
        gap_ms: fn(usize, usize) -> u64,
    ) -> CheckingClients {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::sync::Arc;
        let (stop, pause) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let (done, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let threads = (0..count)
            .map(|c| {
                let (server, requests, expected) = (server.clone(), requests.clone(), expected.clone());
                let (stop, pause, done, failed) = (stop.clone(), pause.clone(), done.clone(), failed.clone());
                std::thread::spawn(move || {
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        if pause.load(Ordering::Relaxed) {
                            std::thread::sleep(Duration::from_millis(20));
                            continue;
                        }
                        let k = pick(i, c) % requests.len();
                        let (status, body) = server.post("/v1/embeddings", &requests[k]);
                        if status != 200 || body["data"] != expected[k] {
                            failed.fetch_add(1, Ordering::Relaxed);
                            eprintln!("request {k}: status {status}, identical {}, {}", body["data"] == expected[k], body["error"]);
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                        i += 1;
                        std::thread::sleep(Duration::from_millis(gap_ms(i, c)));
                    }
                })
            })
            .collect();
        CheckingClients { stop, pause, done, failed, threads }
    }

    /// Stops the clients and waits for them: (requests, failed).
    pub fn finish(self) -> (u64, u64) {
        use std::sync::atomic::Ordering;
        self.stop.store(true, Ordering::Relaxed);
        self.threads.into_iter().for_each(|t| t.join().unwrap());
        (self.done.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed))
    }
}

/// The GPU's graph at `graph` (model.fp16.onnx of a CUDA-prepared model) in
/// the form the CPU runs, written into `dir`: each of eeane's CUDA operators
/// back to what computes the same function on the CPU (GemmFastGelu to
/// MatMul and FastGelu, GemmBias to MatMul and Add: models/gpu_graph.py's
/// expand_cuda_operators), weights inline.
/// Returns its path and how many operators were written back.
pub fn gpu_graph_for_the_cpu(graph: &Path, dir: &Path) -> (PathBuf, usize) {
    let out = dir.join(format!("{}.cpu.onnx", graph.file_stem().unwrap().to_string_lossy()));
    let models = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models");
    let program = "import sys; sys.path.insert(0, sys.argv[1]); import onnx, gpu_graph; \
                   m = onnx.load(sys.argv[2]); print(gpu_graph.expand_cuda_operators(m)); onnx.save_model(m, sys.argv[3])";
    let python = std::env::var_os("EEANE_PYTHON").map(PathBuf::from).unwrap_or_else(|| cache_dir().join("venv/bin/python"));
    let done = Command::new(&python).args(["-c", program]).arg(&models).arg(graph).arg(&out).output().unwrap();
    assert!(done.status.success(), "{}: {}", graph.display(), String::from_utf8_lossy(&done.stderr));
    let count = String::from_utf8_lossy(&done.stdout).trim().parse().unwrap();
    (out, count)
}
