//! The CUDA path on a machine without CUDA (CI has no GPU): `check-config`
//! exits 2 naming what is missing, a `cuda:` model's requests get a 503 that
//! says the same while a CPU model beside it serves, and the GPU variants'
//! preparation (fused attention, pooling inside, fp16) with its self-check,
//! whose graphs are held here on the CPU against the Python reference.

mod common;

use std::path::Path;
use std::process::Command;

use common::{cache_dir, cosine, fixture_texts, reference, Server};
use serde_json::{json, Value};

/// A machine with the NVIDIA driver is not the machine these tests describe.
fn has_nvidia_driver() -> bool {
    Path::new("/dev/nvidiactl").exists()
}

fn cuda_entry(id: &str, extra: &str) -> String {
    let dir = cache_dir().join("models/all-minilm-l6-v2-cuda");
    format!(
        "[[models]]\nid = \"{id}\"\nengine = \"onnxruntime\"\ndevice = \"cuda:H200\"\nmodel = \"{}\"\ntokenizer = \"{}\"\nprecision = \"fp16\"\npooling = \"none\"\nmax_tokens = 256\n{extra}\n",
        dir.join("model.fp16.onnx").display(),
        dir.join("tokenizer.json").display()
    )
}

fn check_config(config: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("eeane.toml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_eeane")).args(["check-config", "--config"]).arg(&path).output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn check_config_names_what_a_machine_without_cuda_lacks() {
    if has_nvidia_driver() {
        eprintln!("skipped: this machine has the NVIDIA driver");
        return;
    }
    let runtime_dir = tempfile::tempdir().unwrap();
    let missing = runtime_dir.path().join("absent/libonnxruntime.so");
    let config = format!("[runtimes]\nonnxruntime-cuda = \"{}\"\n{}", missing.display(), cuda_entry("minilm-cuda", ""));
    let (code, stderr) = check_config(&config);
    assert_eq!(code, Some(2), "{stderr}");
    for needle in ["models \"minilm-cuda\"", "the NVIDIA driver (libcuda.so.1", "NVML (libnvidia-ml.so.1", "eeane pull all-minilm-l6-v2-cuda"] {
        assert!(stderr.contains(needle), "{needle:?} not in: {stderr}");
    }
    assert!(stderr.contains(&missing.display().to_string()), "{stderr}");

    // A runtime library without its CUDA provider beside it: the provider is named.
    let library = runtime_dir.path().join("libonnxruntime.so");
    std::fs::write(&library, b"not a library").unwrap();
    let config = format!("[runtimes]\nonnxruntime-cuda = \"{}\"\n{}", library.display(), cuda_entry("minilm-cuda", ""));
    let (code, stderr) = check_config(&config);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("libonnxruntime_providers_cuda.so"), "{stderr}");
    assert!(stderr.contains("libcudart.so.13") || stderr.contains("libcudnn.so.9"), "the CUDA libraries are named: {stderr}");

    // An index is refused, whatever the machine.
    let (code, stderr) = check_config(&cuda_entry("by-index", "").replace("cuda:H200", "cuda:0"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("not by an index"), "{stderr}");

    // So is a CUDA graph size out of range, by its key.
    let (code, stderr) = check_config(&cuda_entry("graphs", "cuda_graph_rows = 0"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("cuda_graph_rows = 0: it takes 1 to 256 rows"), "{stderr}");
}

#[test]
fn a_cuda_model_fails_alone_with_the_same_words_while_a_cpu_model_serves() {
    if has_nvidia_driver() {
        eprintln!("skipped: this machine has the NVIDIA driver");
        return;
    }
    let config = format!("{}{}", common::model_entry("minilm", "all-minilm-l6-v2", ""), cuda_entry("minilm-cuda", ""));
    let server = Server::start(Some(&config), &[]);
    let (status, body) = server.post("/v1/embeddings", &json!({"model": "minilm-cuda", "input": "hello"}));
    assert_eq!(status, 503, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    for needle in ["CUDA device \"cuda:H200\" cannot be used on this machine", "libcuda.so.1", "libnvidia-ml.so.1"] {
        assert!(message.contains(needle), "{needle:?} not in: {message}");
    }
    for _ in 0..2 {
        let (status, body) = server.post("/v1/embeddings", &json!({"model": "minilm", "input": ["hello", "world"]}));
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["data"].as_array().unwrap().len(), 2);
    }
    let (status, again) = server.post("/v1/embeddings", &json!({"model": "minilm-cuda", "input": "hello"}));
    assert_eq!(status, 503, "{again}");
    assert_eq!(again["error"]["message"].as_str(), Some(message), "the same words each time");
    let health = server.model_health("minilm-cuda");
    assert_eq!(health["state"], "failed", "{health}");
    assert!(health["error"].as_str().unwrap().contains("libnvidia-ml.so.1"), "{health}");
}

#[test]
fn gpu_variants_are_prepared_and_checked_on_the_cpu() {
    let dir = cache_dir().join("models/all-minilm-l6-v2-cuda");
    assert!(dir.join("manifest.json").exists(), "{} is missing: run `bash tests/run.sh`", dir.display());
    let manifest: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let checks = &manifest["checks"];
    // One fused attention per layer, SkipLayerNormalization and BiasGelu;
    // in the fp16 graph each layer's GELU in its matmul's epilogue.
    assert_eq!(checks["fused_operators"]["Attention"], 6, "{checks}");
    assert!(checks["fused_operators"]["SkipLayerNormalization"].as_u64().unwrap() >= 12, "{checks}");
    assert!(checks["fp32_min_cosine_vs_numpy_float64"].as_f64().unwrap() >= 0.99999, "{checks}");
    assert!(checks["fp16_min_cosine_vs_numpy_float64"].as_f64().unwrap() >= 0.9999, "{checks}");
    assert_eq!(checks["gemm_fast_gelu"], 6, "{checks}");
    // Attention as Q, K and V matmuls (their bias in the epilogue) and one
    // MultiHeadAttention, each layer.
    assert_eq!(checks["attention_qkv_apart"], 6, "{checks}");
    assert_eq!(checks["gemm_bias"], 18, "{checks}");
    assert!(manifest["files"].get("model.fp16.onnx").is_some(), "the fp16 variant passed its check and is published: {manifest}");

    // The fp32 graph served on the CPU (the fused operators have CPU
    // kernels), and the fp16 graph in the CPU's form (its CUDA-only
    // operators written back as MatMul + FastGelu and MatMul + Add, the same
    // functions), held
    // against the Python reference of the plain fp32 model. The published
    // fp16 graph itself is refused on the CPU, naming the fix, while the
    // others serve.
    let work = tempfile::tempdir().unwrap();
    let (fp16_for_the_cpu, written_back) = common::gpu_graph_for_the_cpu(&dir.join("model.fp16.onnx"), work.path());
    assert_eq!(written_back, 6 + 18);
    let texts = fixture_texts();
    let expected = reference(&texts, 256);
    let entry = |id: &str, file: &Path| {
        format!(
            "[[models]]\nid = \"{id}\"\nengine = \"onnxruntime\"\nmodel = \"{}\"\ntokenizer = \"{}\"\npooling = \"none\"\nmax_tokens = 256\n",
            file.display(),
            dir.join("tokenizer.json").display()
        )
    };
    let config = [("fused-fp32", dir.join("model.onnx")), ("fused-fp16", fp16_for_the_cpu), ("gpu-graph-on-the-cpu", dir.join("model.fp16.onnx"))]
        .map(|(id, file)| entry(id, &file))
        .concat();
    let server = Server::start(Some(&config), &[]);
    let (status, body) = server.post("/v1/embeddings", &json!({"model": "gpu-graph-on-the-cpu", "input": ["one text"]}));
    assert_eq!(status, 503, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("made for CUDA devices") && message.contains("model.onnx beside it"), "{message}");
    for (id, floor) in [("fused-fp32", 0.99999), ("fused-fp16", 0.9999)] {
        let vectors = server.embed(json!(texts), json!({"model": id}));
        let worst = vectors.iter().zip(&expected.vectors).map(|(v, r)| cosine(v, r)).fold(f64::INFINITY, f64::min);
        eprintln!("{id}: min cosine to the reference over {} texts: {worst:.8}", texts.len());
        assert!(worst >= floor, "{id}: min cosine {worst} under {floor}");
    }
}
