//! Start-up checks. A resident model that cannot load (missing model file,
//! missing runtime library, bad tokenizer) stops `eeane serve` with exit status 2
//! and the reason; an on-demand one fails its own requests with 503 and the
//! reason while the other models serve.

mod common;

use std::process::Command;

fn serve_with(config: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("eeane.toml");
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_eeane"))
        .arg("--config")
        .arg(&path)
        .args(["serve", "--port", "0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A server that starts instead of refusing would run forever: stop it.
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_model_that_cannot_load_stops_startup_with_exit_2_and_the_reason() {
    let model_dir = common::minilm_dir();
    let model = model_dir.join("model.onnx").display().to_string();
    let tokenizer = model_dir.join("tokenizer.json").display().to_string();
    let entry = |model: &str, tokenizer: &str| {
        format!("[[models]]\nid = \"m\"\nload_policy = \"resident\"\nengine = \"onnxruntime\"\nmodel = \"{model}\"\ntokenizer = \"{tokenizer}\"\nmax_tokens = 256\n")
    };
    let cases = [
        (entry("/nonexistent/model.onnx", &tokenizer), "/nonexistent/model.onnx"),
        (entry(&model, "/nonexistent/tokenizer.json"), "/nonexistent/tokenizer.json"),
        (format!("[runtimes]\nonnxruntime = \"/nonexistent/libonnxruntime.so\"\n{}", entry(&model, &tokenizer)), "/nonexistent/libonnxruntime.so"),
        // A file that is not a library must be an error, not a crash.
        (format!("[runtimes]\nonnxruntime = \"{tokenizer}\"\n{}", entry(&model, &tokenizer)), "cannot load ONNX Runtime"),
        (entry(&tokenizer, &tokenizer), "model"),
    ];
    for (config, reason) in cases {
        let (code, stderr) = serve_with(&config);
        eprintln!("{stderr}");
        assert_eq!(code, Some(2), "{config}\n{stderr}");
        assert!(stderr.contains("\"m\"") && stderr.contains(reason), "stderr does not give the reason {reason:?}: {stderr}");
    }
}

#[test]
fn a_broken_on_demand_model_fails_its_requests_while_the_others_serve() {
    let dir = common::minilm_dir();
    let config = format!(
        "[[models]]\nid = \"good\"\nengine = \"onnxruntime\"\nmodel = \"{m}\"\ntokenizer = \"{t}\"\nmax_tokens = 256\n\
         [[models]]\nid = \"broken\"\nengine = \"onnxruntime\"\nmodel = \"/nonexistent/model.onnx\"\ntokenizer = \"{t}\"\nmax_tokens = 256\n",
        m = dir.join("model.onnx").display(),
        t = dir.join("tokenizer.json").display()
    );
    let server = common::Server::start(Some(&config), &[]);
    let (status, health) = server.get("/health");
    assert_eq!(status, 200);
    assert_eq!(health["models"][1]["state"], "failed", "{health}");
    for _ in 0..2 {
        let (status, body) = server.post("/v1/embeddings", &serde_json::json!({"input": "x", "model": "broken"}));
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"]["code"], "model_unavailable");
        assert!(body["error"]["message"].as_str().unwrap().contains("/nonexistent/model.onnx"), "{body}");
        assert_eq!(server.embed(serde_json::json!("x"), serde_json::json!({"model": "good"})).len(), 1);
    }
}

#[test]
fn a_core_ml_model_off_macos_fails_check_config_and_its_own_requests_while_the_others_serve() {
    if cfg!(target_os = "macos") {
        return;
    }
    let dir = common::minilm_dir();
    let tokenizer = dir.join("tokenizer.json");
    let coreml = format!(
        "[[models]]\nid = \"ane\"\nengine = \"coreml\"\nmodel = \"{}\"\ntokenizer = \"{}\"\nmax_tokens = 512\npooling = \"none\"\n\
         artifacts = {{ \"128\" = \"s128.mlmodelc\", \"512\" = \"s512.mlmodelc\" }}\nbatch_artifacts = {{ \"128\" = \"s128_b2.mlmodelc\" }}\n",
        dir.display(),
        tokenizer.display()
    );
    let good = common::model_entry("good", "all-minilm-l6-v2", "");
    let config = format!("{good}{coreml}");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_eeane")).arg("--config").arg(file.path()).arg("check-config").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("\"ane\"") && stderr.contains("needs macOS"), "{stderr}");
    // Served: the Core ML model fails with the same reason; the other serves.
    let server = common::Server::start(Some(&config), &[]);
    let (status, body) = server.post("/v1/embeddings", &serde_json::json!({"input": "x", "model": "ane"}));
    assert_eq!(status, 503, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("needs macOS"), "{body}");
    assert_eq!(server.embed(serde_json::json!("x"), serde_json::json!({"model": "good"})).len(), 1);
    // A resident one stops the start, as any preflight failure does.
    let (code, stderr) = serve_with(&format!("{good}{}", coreml.replace("engine = \"coreml\"", "engine = \"coreml\"\nload_policy = \"resident\"")));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("needs macOS"), "{stderr}");
}
