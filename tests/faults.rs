//! Faults: model files truncated or corrupted, a tokenizer missing, and a
//! SIGKILL in the middle of a model load followed by a restart. Each gives a
//! clear message, the other models keep serving, and nothing left in the cache
//! breaks the next start; a runtime library of the wrong version fails its
//! models by name; an engine process that dies costs only its batch, and
//! engine processes end with their server. (A missing or foreign runtime library: preflight.rs;
//! an absent Vulkan device: ncnn.rs; a disk filling during a download: pull.rs;
//! a NaN-producing model: bad_input.rs.)

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{minilm_dir, Server};
use serde_json::json;

fn entry(id: &str, dir: &Path) -> String {
    format!(
        "[[models]]\nid = \"{id}\"\nengine = \"onnxruntime\"\nmodel = \"{}\"\ntokenizer = \"{}\"\nmax_tokens = 256\n",
        dir.join("model.onnx").display(),
        dir.join("tokenizer.json").display()
    )
}

/// A copy of the default model's directory (manifest included) to damage.
fn copy_of_default(root: &Path, name: &str) -> std::path::PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    for file in std::fs::read_dir(minilm_dir()).unwrap().flatten() {
        if file.path().is_file() {
            std::fs::copy(file.path(), dir.join(file.file_name())).unwrap();
        }
    }
    dir
}

#[test]
fn damaged_model_files_fail_their_model_with_the_reason_while_the_others_serve() {
    let root = tempfile::tempdir().unwrap();
    let flipped = copy_of_default(root.path(), "flipped");
    let mut bytes = std::fs::read(flipped.join("model.onnx")).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01; // one bit of one weight: still a valid ONNX file
    std::fs::write(flipped.join("model.onnx"), &bytes).unwrap();
    let truncated = copy_of_default(root.path(), "truncated");
    std::fs::write(truncated.join("model.onnx"), &bytes[..middle]).unwrap();
    let bare = copy_of_default(root.path(), "truncated-no-manifest");
    std::fs::write(bare.join("model.onnx"), &bytes[..middle]).unwrap();
    std::fs::remove_file(bare.join("manifest.json")).unwrap();
    let no_tokenizer = copy_of_default(root.path(), "no-tokenizer");
    std::fs::remove_file(no_tokenizer.join("tokenizer.json")).unwrap();
    std::fs::remove_file(no_tokenizer.join("manifest.json")).unwrap();

    let config = [
        entry("good", &minilm_dir()),
        entry("flipped", &flipped),
        entry("truncated", &truncated),
        entry("truncated-no-manifest", &bare),
        entry("no-tokenizer", &no_tokenizer),
    ]
    .concat();
    let server = Server::start(Some(&config), &[]);
    let good = server.embed(json!("still serving"), json!({"model": "good"}));
    for (id, reason) in [
        ("flipped", "does not match its manifest"),
        ("truncated", "does not match its manifest"),
        ("truncated-no-manifest", "model.onnx"),
        ("no-tokenizer", "tokenizer.json"),
    ] {
        let (status, body) = server.post("/v1/embeddings", &json!({"input": "x", "model": id}));
        println!("{id}: {status} {}", body["error"]["message"]);
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"]["code"], "model_unavailable");
        assert!(body["error"]["message"].as_str().unwrap().contains(reason), "{id}: {body}");
        assert_eq!(server.embed(json!("still serving"), json!({"model": "good"})), good);
    }
    let (_, health) = server.get("/health");
    assert_eq!(health["models"][0]["state"], "loaded", "{health}");
}

/// Starts `eeane serve` on `config`, returning once its stderr has said `line`
/// (or the process has ended).
fn spawn_until(config: &Path, line: &str) -> (std::process::Child, Instant) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_eeane"))
        .args(["--config", config.to_str().unwrap(), "serve", "--port", "0"])
        .env_remove("EEANE_CONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let line = line.to_string();
    std::thread::spawn(move || {
        let mut said = false;
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !said && l.contains(&line) {
                said = true;
                let _ = tx.send(());
            }
        }
    });
    let _ = rx.recv_timeout(Duration::from_secs(60));
    (child, started)
}

#[test]
fn sigkill_during_a_model_load_then_a_restart_serves_the_same_vectors() {
    // OpenVINO writes a compile cache while it loads: the riskiest load to cut.
    let model = common::e5_dir("e5-small-enpt-ov");
    let cache = tempfile::tempdir().unwrap();
    let config_text = format!(
        "[server]\ncache_dir = \"{}\"\n[runtimes]\nopenvino = \"{}\"\n\
         [[models]]\nid = \"ov\"\nengine = \"openvino\"\ndevice = \"CPU\"\nload_policy = \"resident\"\nmodel = \"{}\"\ntokenizer = \"{}\"\n\
         pooling = \"none\"\nmax_tokens = 128\nbuckets = [{{ max_tokens = 32, max_batch = 8 }}, {{ max_tokens = 128, max_batch = 8 }}]\n",
        cache.path().display(),
        common::cache_dir().join("runtimes/openvino/libopenvino_c.so").display(),
        model.join("model.xml").display(),
        model.join("sentencepiece.model").display()
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("eeane.toml");
    std::fs::write(&config, &config_text).unwrap();
    let texts = json!(["def add(a, b): return a + b", "Como faço para ordenar uma lista?"]);

    // A clean start in a fresh cache gives the expected vectors.
    let reference = {
        let clean = tempfile::tempdir().unwrap();
        let text = config_text.replace(&cache.path().display().to_string(), &clean.path().display().to_string());
        let server = Server::start(Some(&text), &[]);
        server.embed(texts.clone(), json!({}))
    };

    // Kill -9 at several points of the load (the compile writes its cache).
    for delay_ms in [0u64, 150, 400, 500, 600, 700, 800, 900, 1200] {
        let (mut child, started) = spawn_until(&config, "loading");
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        let files: Vec<String> = walk(cache.path());
        println!("killed {:.3} s after start; compile cache then: {files:?}", started.elapsed().as_secs_f64());
    }
    let server = Server::start(Some(&config_text), &[]);
    assert_eq!(server.embed(texts, json!({})), reference, "vectors after the killed loads differ from a clean start's");
    // OpenVINO writes its blob in place; a cut one is refused and rewritten,
    // and eeane's lock on the cache keeps this load from mapping a blob that a
    // killed server's engine process is still writing (that was a SIGBUS).
    println!("after the restart: {:?}", walk(cache.path()));
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(format!("{} ({} B)", e.file_name().to_string_lossy(), e.metadata().map(|m| m.len()).unwrap_or(0)));
        }
    }
    out
}

/// ONNX Runtime 1.20.1's library from its PyPI wheel, fetched once into the
/// cache: a real runtime of the wrong version.
fn old_onnxruntime() -> std::path::PathBuf {
    let dir = common::cache_dir().join("downloads/onnxruntime-1.20.1");
    let lib = dir.join("onnxruntime/capi/libonnxruntime.so.1.20.1");
    if !lib.exists() {
        let python = common::cache_dir().join("venv/bin/python");
        let script = format!(
            "import glob, subprocess, sys, zipfile\n\
             d = {dir:?}\n\
             subprocess.run([sys.executable, '-m', 'pip', 'download', '--no-deps', '--only-binary=:all:', '-q', '-d', d, 'onnxruntime==1.20.1'], check=True)\n\
             zipfile.ZipFile(glob.glob(d + '/onnxruntime-1.20.1-*.whl')[0]).extract('onnxruntime/capi/libonnxruntime.so.1.20.1', d)\n",
            dir = dir.display().to_string()
        );
        let status = Command::new(python).arg("-c").arg(script).status().unwrap();
        assert!(status.success() && lib.exists(), "could not fetch onnxruntime 1.20.1 from the package index");
    }
    lib
}

#[test]
fn a_runtime_of_the_wrong_version_fails_its_models_with_both_versions_named() {
    let old = old_onnxruntime();
    let ov = common::e5_dir("e5-small-enpt-ov");
    let config = format!(
        "[runtimes]\nonnxruntime = \"{}\"\n{}\
         [[models]]\nid = \"ov\"\nengine = \"openvino\"\ndevice = \"CPU\"\nmodel = \"{}\"\ntokenizer = \"{}\"\npooling = \"none\"\nmax_tokens = 128\n\
         buckets = [{{ max_tokens = 32, max_batch = 8 }}]\n",
        old.display(),
        entry("ort", &minilm_dir()),
        ov.join("model.xml").display(),
        ov.join("sentencepiece.model").display()
    );
    let server = Server::start(Some(&config), &[]);
    let (status, body) = server.post("/v1/embeddings", &json!({"input": "x", "model": "ort"}));
    println!("ort on 1.20.1: {status} {}", body["error"]["message"]);
    assert_eq!(status, 503, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("1.20.1") && message.contains("expected version"), "{message}");
    // A model on another engine is untouched.
    assert_eq!(server.embed(json!("still serving"), json!({"model": "ov"})).len(), 1);
}

fn engine_pid(server: &Server, model: &str) -> u32 {
    let health = server.model_health(model);
    health["engine_pids"][0].as_u64().unwrap_or_else(|| panic!("no engine process for {model}: {health}")) as u32
}

fn kill_9(pid: u32) {
    assert!(Command::new("kill").arg("-KILL").arg(pid.to_string()).status().unwrap().success());
    let until = Instant::now() + Duration::from_secs(5);
    // Dead once a zombie of one thread: the leader of a killed process turns
    // zombie while its other threads may still be exiting, and until they are
    // gone its parent cannot reap it yet, so it would look alive to the server.
    let dead = |status: &str| status.contains("State:\tZ") && status.contains("Threads:\t1\n");
    while std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| !dead(&s)) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// isolation = "process" (the default): an engine process that dies (here
/// SIGKILL, as the kernel's OOM killer or a segfaulting runtime would end it)
/// costs at most the batch it was running: that request gets a 500 naming the
/// model, the server and the other models carry on, and the engine starts
/// again with its model's next batch, giving the same vectors.
#[test]
fn a_killed_engine_process_fails_only_its_batch_and_starts_again() {
    let config =
        [common::model_entry("victim", "all-minilm-l6-v2", "keep_alive = -1"), common::model_entry("bystander", "all-minilm-l6-v2-int8", "keep_alive = -1")]
            .concat();
    let server = Server::start(Some(&config), &[]);
    let texts = json!(["a killed engine", "starts again", "with the same vectors"]);
    let expected = server.embed(texts.clone(), json!({"model": "victim"}));
    let bystander = server.embed(texts.clone(), json!({"model": "bystander"}));

    // Killed while idle: the next request starts it again and is answered.
    let first = engine_pid(&server, "victim");
    assert!(common::descendants(server.pid()).contains(&first), "the engine runs in a child of the server");
    kill_9(first);
    assert_eq!(server.embed(texts.clone(), json!({"model": "victim"})), expected, "bit-identical after the restart");
    let second = engine_pid(&server, "victim");
    assert_ne!(first, second);
    assert_eq!(server.model_health("victim")["engine_restarts"], 1);

    // Killed in the middle of a long request: that request fails, with a reason.
    let long: Vec<String> = (0..160).map(|i| format!("text {i} {}", "lorem ipsum dolor sit amet ".repeat(60))).collect();
    let batches_before = server.model_health("victim")["engine_calls"]["batches"].as_u64().unwrap();
    let url = server.url.clone();
    let request = std::thread::spawn(move || {
        let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(300)).build().unwrap();
        let response = client.post(format!("{url}/v1/embeddings")).json(&json!({"input": long, "model": "victim"})).send().unwrap();
        (response.status().as_u16(), response.json::<serde_json::Value>().unwrap())
    });
    server.wait_for_health("the long request under way", Duration::from_secs(30), |h| {
        h["models"].as_array().unwrap().iter().any(|m| m["id"] == "victim" && m["engine_calls"]["batches"].as_u64() > Some(batches_before))
    });
    kill_9(second);
    let (status, body) = request.join().unwrap();
    println!("killed mid-request: {status} {}", body["error"]["message"]);
    assert_eq!(status, 500, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("\"victim\"") && message.contains("engine process") && message.contains("SIGKILL"), "{message}");
    // The other model never noticed; the victim serves again, unchanged.
    assert_eq!(server.embed(texts.clone(), json!({"model": "bystander"})), bystander);
    assert_eq!(server.embed(texts.clone(), json!({"model": "victim"})), expected);
    assert_eq!(server.model_health("victim")["engine_restarts"], 2);
    let (_, metrics) = server.get_text("/metrics");
    assert!(metrics.contains("eeane_engine_restarts_total{model=\"victim\"} 2"), "{metrics}");
    assert_eq!(common::descendants(server.pid()).len(), 2, "one engine process per loaded model, no strays");
}

/// isolation = "thread" runs the engine inside the server: same vectors, bit
/// for bit, and no engine process.
#[test]
fn thread_isolation_serves_the_same_vectors_without_a_process() {
    let config =
        [common::model_entry("in-process", "all-minilm-l6-v2", "isolation = \"thread\""), common::model_entry("in-child", "all-minilm-l6-v2", "")].concat();
    let server = Server::start(Some(&config), &[]);
    let texts = json!(common::fixture_texts());
    let in_process = server.embed(texts.clone(), json!({"model": "in-process"}));
    assert_eq!(common::descendants(server.pid()), Vec::<u32>::new());
    let health = server.model_health("in-process");
    assert_eq!((health["isolation"].as_str(), health.get("engine_pids")), (Some("thread"), None), "{health}");
    assert_eq!(server.embed(texts, json!({"model": "in-child"})), in_process);
    assert_eq!(server.model_health("in-child")["isolation"], "process");
}

/// The engine processes end with the server however it ends, SIGKILL
/// included: their input closes, and they exit instead of lingering.
#[test]
fn engine_processes_end_when_the_server_is_killed() {
    let mut server = Server::start(Some(&common::model_entry("m", "all-minilm-l6-v2", "")), &[]);
    server.embed(json!("load it"), json!({}));
    let engine = engine_pid(&server, "m");
    server.signal("KILL");
    assert!(server.wait_exit(Duration::from_secs(10)).is_some());
    let until = Instant::now() + Duration::from_secs(10);
    let alive = || std::fs::read_to_string(format!("/proc/{engine}/stat")).is_ok_and(|s| !s.contains(") Z "));
    while alive() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(), "engine process {engine} outlived its server");
}
