//! The OpenVINO engine over real HTTP, against ONNX Runtime on the same files:
//! fp32 (ONNX read directly and the prepared IR), the INT8 Q/DQ twin, a model
//! whose pooling eeane does, device lists, and the compile cache.

mod common;

use std::time::Duration;

use common::{as_f64, cosine, e5_dir, fixture_texts, minilm_dir, Server};
use serde_json::{json, Value};

const BUCKETS: &str = "buckets = [{ max_tokens = 32, max_batch = 16 }, { max_tokens = 128, max_batch = 8 }]\n";

fn e5_entry(id: &str, engine: &str, dir: &str, file: &str, extra: &str) -> String {
    let dir = e5_dir(dir);
    format!(
        "[[models]]\nid = \"{id}\"\nengine = \"{engine}\"\nmodel = \"{}\"\ntokenizer = \"{}\"\npooling = \"none\"\nmax_tokens = 512\n\
         long_text = \"window\"\n{BUCKETS}{extra}\n",
        dir.join(file).display(),
        dir.join("sentencepiece.model").display()
    )
}

fn minilm_entry(id: &str, engine: &str) -> String {
    let dir = minilm_dir();
    format!(
        "[[models]]\nid = \"{id}\"\nengine = \"{engine}\"\nmodel = \"{}\"\ntokenizer = \"{}\"\nmax_tokens = 256\n\
         buckets = [{{ max_tokens = 64, max_batch = 16 }}, {{ max_tokens = 256, max_batch = 8 }}]\n",
        dir.join("model.onnx").display(),
        dir.join("tokenizer.json").display()
    )
}

fn embed(server: &Server, model: &str, texts: &[String]) -> Vec<Vec<f32>> {
    let (status, response) = server.post("/v1/embeddings", &json!({"model": model, "input": texts}));
    assert_eq!(status, 200, "{model}: {response}");
    common::vectors(&response)
}

/// Per-text cosines of `a` to `b`, sorted ascending.
fn cosines(a: &[Vec<f32>], b: &[Vec<f32>]) -> Vec<f64> {
    let mut c: Vec<f64> = a.iter().zip(b).map(|(x, y)| cosine(x, &as_f64(y))).collect();
    c.sort_by(f64::total_cmp);
    c
}

fn model_health(server: &Server, id: &str) -> Value {
    server.model_health(id)
}

#[test]
fn openvino_matches_onnxruntime_per_text() {
    let texts = {
        let mut t = fixture_texts();
        t.push("Long inputs become windows of 128 tokens on both engines. ".repeat(20));
        t
    };
    let config = [
        e5_entry("e5-ort", "onnxruntime", "e5-small-enpt", "model.onnx", ""),
        e5_entry("e5-ov-onnx", "openvino", "e5-small-enpt", "model.onnx", "device = \"CPU\""),
        e5_entry("e5-ov-ir", "openvino", "e5-small-enpt-ov", "model.xml", "device = [\"GPU\", \"CPU\"]"),
        e5_entry("e5-int8-ort", "onnxruntime", "e5-small-enpt-int8", "model.onnx", ""),
        e5_entry("e5-int8-ov", "openvino", "e5-small-enpt-int8-ov", "model.xml", "precision = \"int8\""),
        e5_entry("e5-ov-bf16", "openvino", "e5-small-enpt-ov", "model.xml", "precision = \"bf16\""),
        e5_entry("e5-npu-only", "openvino", "e5-small-enpt-ov", "model.xml", "device = [\"NPU\"]"),
        // Two CPU workers of one thread each: two devices pulling from one pool.
        e5_entry("e5-ov-two", "openvino", "e5-small-enpt-ov", "model.xml", "device = [\"CPU\", \"GPU\", \"CPU\"]\nthreads = 1"),
        minilm_entry("minilm-ort", "onnxruntime"),
        minilm_entry("minilm-ov", "openvino"),
    ]
    .concat();
    let server = Server::start(Some(&config), &[]);

    let ort = embed(&server, "e5-ort", &texts);
    for id in ["e5-ov-onnx", "e5-ov-ir"] {
        let c = cosines(&embed(&server, id, &texts), &ort);
        println!("{id} vs onnxruntime, {} texts: min cosine {:.8}, median {:.8}", texts.len(), c[0], c[c.len() / 2]);
        // f32 for real (not OpenVINO's bf16 default on AVX512-BF16 CPUs): 1e-6, not 1e-4.
        assert!(c[0] >= 0.999999, "{id}: min cosine {} to ONNX Runtime", c[0]);
    }
    let minilm = cosines(&embed(&server, "minilm-ov", &texts), &embed(&server, "minilm-ort", &texts));
    println!("minilm-ov (token states pooled by eeane) vs onnxruntime: min cosine {:.8}", minilm[0]);
    assert!(minilm[0] >= 0.999999, "minilm-ov: min cosine {}", minilm[0]);

    let int8_ort = embed(&server, "e5-int8-ort", &texts);
    let int8_ov = embed(&server, "e5-int8-ov", &texts);
    let (vs_ort, vs_fp32, ort_vs_fp32) = (cosines(&int8_ov, &int8_ort), cosines(&int8_ov, &ort), cosines(&int8_ort, &ort));
    println!(
        "INT8 Q/DQ, {} texts: OpenVINO vs ONNX Runtime min {:.4} median {:.4}; OpenVINO INT8 vs fp32 min {:.4} median {:.4}; \
         ONNX Runtime INT8 vs fp32 min {:.4} median {:.4}",
        texts.len(),
        vs_ort[0],
        vs_ort[vs_ort.len() / 2],
        vs_fp32[0],
        vs_fp32[vs_fp32.len() / 2],
        ort_vs_fp32[0],
        ort_vs_fp32[ort_vs_fp32.len() / 2]
    );
    assert!(vs_ort[0] > 0.98 && vs_fp32[0] > 0.98, "INT8 on OpenVINO drifts: {} / {}", vs_ort[0], vs_fp32[0]);
    let bf16 = cosines(&embed(&server, "e5-ov-bf16", &texts), &ort);
    println!("precision = \"bf16\" vs fp32 onnxruntime: min cosine {:.6}", bf16[0]);

    let many: Vec<String> = (0..48).map(|i| format!("{} {i}", texts[i % texts.len()])).collect();
    let two = embed(&server, "e5-ov-two", &many);
    let one = embed(&server, "e5-ort", &many);
    let c = cosines(&two, &one);
    let calls = model_health(&server, "e5-ov-two");
    println!("two CPU workers: {} ({}), min cosine to ONNX Runtime {:.8}", calls["device"], calls["engine_calls"]["per_device"], c[0]);
    assert!(c[0] >= 0.999999);
    // Each CPU engine on its own share of the cores: "CPU (cpus 0) + CPU (cpus 1) (missing: GPU)".
    let device = calls["device"].as_str().unwrap();
    assert!(device.starts_with("CPU (cpus ") && device.contains(" + CPU (cpus ") && device.ends_with(" (missing: GPU)"), "{device}");
    let per_device: Vec<u64> = calls["engine_calls"]["per_device"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).collect();
    assert!(per_device.len() == 2 && per_device.iter().all(|&n| n > 0), "both workers should run batches: {per_device:?}");

    let health = model_health(&server, "e5-ov-ir");
    assert_eq!(health["engine"], "openvino");
    assert!(health["device"].as_str().unwrap().starts_with("CPU") && health["device"].as_str().unwrap().contains("missing: GPU"), "{health}");
    assert_eq!(model_health(&server, "e5-int8-ov")["precision"], "int8");
    let (status, response) = server.post("/v1/embeddings", &json!({"model": "e5-npu-only", "input": "x"}));
    assert_eq!(status, 503, "{response}");
    assert!(response["error"]["message"].as_str().unwrap().contains("NPU"), "{response}");
    assert_eq!(embed(&server, "e5-ov-ir", &texts[..2]).len(), 2, "a failed model leaves the others serving");
}

#[test]
fn a_reload_after_unload_compiles_from_the_cache() {
    let cache = tempfile::tempdir().unwrap();
    let config = format!(
        "[server]\ncache_dir = \"{}\"\n[runtimes]\nopenvino = \"{}\"\nonnxruntime = \"{}\"\n{}",
        cache.path().display(),
        common::cache_dir().join("runtimes/openvino/libopenvino_c.so").display(),
        common::cache_dir().join("runtimes/onnxruntime/libonnxruntime.so").display(),
        e5_entry("e5-ov", "openvino", "e5-small-enpt-int8-ov", "model.xml", "precision = \"int8\"")
    );
    let server = Server::start(Some(&config), &[]);
    let texts = vec!["hello".to_string()];
    let first = embed(&server, "e5-ov", &texts);
    let cold_ms = model_health(&server, "e5-ov")["load_ms"].as_u64().unwrap();
    let compiled = cache.path().join("compiled/openvino");
    let blobs = std::fs::read_dir(&compiled).map(|d| d.count()).unwrap_or(0);
    assert!(blobs > 0, "nothing was written to the compile cache {}", compiled.display());
    let (status, _) = server.post("/v1/embeddings", &json!({"model": "e5-ov", "input": "bye", "keep_alive": 0}));
    assert_eq!(status, 200);
    server
        .wait_for_health("the unload", Duration::from_secs(10), |h| h["models"].as_array().unwrap().iter().any(|m| m["id"] == "e5-ov" && m["loaded"] == false));
    let again = embed(&server, "e5-ov", &texts);
    let warm_ms = model_health(&server, "e5-ov")["load_ms"].as_u64().unwrap();
    assert_eq!(first, again, "the cached compile gives the same vectors");
    println!("openvino e5-small-enpt-int8 IR, 2 buckets: load with a cold compile cache {cold_ms} ms, reload after unload (cache warm) {warm_ms} ms; {blobs} cached blobs");
}

/// The compile cache keeps weightless blobs, one folder per compiled model,
/// and its bound removes the least recently used folder, never the one just loaded.
#[test]
fn the_compile_cache_is_small_and_bounded() {
    let cache = tempfile::tempdir().unwrap();
    let entry = |id: &str, buckets: &str, extra: &str| {
        let dir = minilm_dir();
        format!(
            "[[models]]\nid = \"{id}\"\nengine = \"openvino\"\nmodel = \"{}\"\ntokenizer = \"{}\"\nmax_tokens = 256\nbuckets = {buckets}\n{extra}\n",
            dir.join("model.onnx").display(),
            dir.join("tokenizer.json").display()
        )
    };
    let config = format!(
        "[server]\ncache_dir = \"{}\"\ncompile_cache_max_mib = 1\n[runtimes]\nopenvino = \"{}\"\nonnxruntime = \"{}\"\n{}{}{}",
        cache.path().display(),
        common::cache_dir().join("runtimes/openvino/libopenvino_c.so").display(),
        common::cache_dir().join("runtimes/onnxruntime/libonnxruntime.so").display(),
        entry("small", "[{ max_tokens = 64, max_batch = 16 }, { max_tokens = 256, max_batch = 8 }]", ""),
        entry("other", "[{ max_tokens = 32, max_batch = 16 }, { max_tokens = 256, max_batch = 8 }]", ""),
        entry("speed", "[{ max_tokens = 64, max_batch = 16 }, { max_tokens = 256, max_batch = 8 }]", "compile_cache = \"speed\""),
    );
    let server = Server::start(Some(&config), &[]);
    let compiled = cache.path().join("compiled/openvino");
    let folders = || -> Vec<(String, u64)> {
        let mut f: Vec<(String, u64)> = std::fs::read_dir(&compiled)
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| (e.file_name().to_string_lossy().into_owned(), common::dir_bytes(&e.path())))
            .collect();
        f.sort();
        f
    };
    let model_bytes = std::fs::metadata(minilm_dir().join("model.onnx")).unwrap().len();
    let texts = vec!["hello".to_string()];
    let want = embed(&server, "small", &texts);
    let first = folders();
    assert_eq!(first.len(), 1, "{first:?}");
    println!("weightless compile cache, 2 buckets: {} bytes (the model: {model_bytes})", first[0].1);
    assert!(first[0].1 * 10 < model_bytes, "a weightless blob carries the weights: {first:?}");
    // A second compiled model over the bound: the first (least recently used) goes.
    embed(&server, "other", &texts);
    let second = folders();
    assert_eq!(second.len(), 1, "the bound left {second:?}");
    assert_ne!(second[0].0, first[0].0, "the folder just compiled stays, the older one goes");
    // Blobs with their weights, for comparison: bigger, the same vectors.
    let fast = embed(&server, "speed", &texts);
    let speed = folders();
    println!("with weights (compile_cache = \"speed\"), 2 buckets: {} bytes", speed[0].1);
    assert!(speed[0].1 > model_bytes, "{speed:?}");
    assert_eq!(fast, want);
}

#[test]
fn a_missing_openvino_library_fails_only_its_models() {
    let config = format!(
        "[runtimes]\nopenvino = \"/nonexistent/libopenvino_c.so\"\n{}{}",
        minilm_entry("minilm-ort", "onnxruntime"),
        minilm_entry("minilm-ov", "openvino")
    );
    let server = Server::start(Some(&config), &[]);
    let (status, response) = server.post("/v1/embeddings", &json!({"model": "minilm-ov", "input": "x"}));
    assert_eq!(status, 503, "{response}");
    let message = response["error"]["message"].as_str().unwrap();
    assert!(message.contains("/nonexistent/libopenvino_c.so"), "{message}");
    assert_eq!(embed(&server, "minilm-ort", &["x".to_string()]).len(), 1, "the ONNX Runtime model keeps serving");
}

/// Every bucket list that eeane ships (the default config, the catalog's
/// snippets, the examples), with every precision the OpenVINO engine offers
/// for an fp32 graph, on the default model: each bucket is filled to its
/// exact shape, and the vectors are held against ONNX Runtime fp32.
#[test]
fn every_shipped_bucket_list_runs_in_every_precision() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut lists: Vec<Vec<(usize, usize)>> = Vec::new();
    let mut add = |models: &toml::Value| {
        for model in models.as_array().into_iter().flatten() {
            let Some(buckets) = model.get("buckets").and_then(|b| b.as_array()) else { continue };
            let list: Vec<(usize, usize)> = buckets
                .iter()
                .map(|b| (b["max_tokens"].as_integer().unwrap() as usize, b["max_batch"].as_integer().unwrap() as usize))
                .filter(|&(tokens, _)| tokens <= 256)
                .collect();
            if !list.is_empty() && !lists.contains(&list) {
                lists.push(list);
            }
        }
    };
    let read = |path: &str| -> toml::Value { toml::from_str(&std::fs::read_to_string(root.join(path)).unwrap()).unwrap() };
    add(&read("config/default.toml")["models"]);
    add(&read("examples/openvino-buckets.toml")["models"]);
    for entry in read("models/catalog.toml")["model"].as_array().unwrap() {
        if let Some(snippet) = entry.get("snippet").and_then(|s| s.as_str()) {
            add(&toml::from_str::<toml::Value>(snippet).unwrap()["models"]);
        }
    }
    assert!(lists.len() >= 2, "shipped bucket lists: {lists:?}");

    let cache = tempfile::tempdir().unwrap();
    let dir = minilm_dir();
    let runtimes = common::cache_dir().join("runtimes");
    let entry = |id: &str, engine: &str, precision: &str, list: &[(usize, usize)]| {
        let buckets: Vec<String> = list.iter().map(|(t, b)| format!("{{ max_tokens = {t}, max_batch = {b} }}")).collect();
        format!(
            "[[models]]\nid = \"{id}\"\nengine = \"{engine}\"\nmodel = \"{}\"\ntokenizer = \"{}\"\nmax_tokens = 256\n{precision}buckets = [{}]\n",
            dir.join("model.onnx").display(),
            dir.join("tokenizer.json").display(),
            buckets.join(", ")
        )
    };
    let precisions = ["f32", "bf16", "f16"];
    // Its own cache, for the compile cache's blobs; the runtimes from the real one.
    let mut config = format!(
        "[server]\ncache_dir = \"{}\"\n[runtimes]\nopenvino = \"{}\"\nonnxruntime = \"{}\"\n",
        cache.path().display(),
        runtimes.join("openvino/libopenvino_c.so").display(),
        runtimes.join("onnxruntime/libonnxruntime.so").display()
    );
    config += &entry("ort", "onnxruntime", "", &[(256, 64)]);
    for (l, list) in lists.iter().enumerate() {
        for precision in precisions {
            config += &entry(&format!("ov-{l}-{precision}"), "openvino", &format!("device = \"CPU\"\nprecision = \"{precision}\"\n"), list);
        }
    }
    let server = Server::start(Some(&config), &[]);
    let words = ["the", "cat", "sat", "on", "a", "mat", "and", "ran"];
    for (l, list) in lists.iter().enumerate() {
        for &(tokens, rows) in list {
            // `rows` texts of exactly `tokens` tokens ([CLS] and [SEP] included).
            let texts: Vec<String> =
                (0..rows).map(|i| (0..tokens - 2).map(|j| words[(i * 3 + j * (i % 5 + 1)) % words.len()]).collect::<Vec<_>>().join(" ")).collect();
            let reference = embed(&server, "ort", &texts);
            for precision in precisions {
                let id = format!("ov-{l}-{precision}");
                let (status, response) = server.post("/v1/embeddings", &json!({"model": id, "input": texts}));
                assert_eq!(status, 200, "{id}, bucket {tokens} x {rows}: {response}");
                assert_eq!(response["usage"]["prompt_tokens"], tokens * rows, "{id}: the bucket should be full");
                let c = cosines(&common::vectors(&response), &reference);
                println!("{id} {list:?}, bucket {tokens} x {rows}: min cosine to ONNX Runtime fp32 {:.7}", c[0]);
                // A reduced precision is served at 0.9999 or better. (A CPU
                // without f16 arithmetic runs the f16 hint in f32: 1.0000000.)
                let floor = if precision == "f32" { 0.999999 } else { 0.9999 };
                assert!(c[0] >= floor, "{id}, bucket {tokens} x {rows}: min cosine {}", c[0]);
            }
        }
    }
}
