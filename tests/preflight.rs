//! `eeane serve` refuses to start, with exit status 2 and the reason, when a
//! model cannot load: a missing model file, a missing runtime library, a bad tokenizer.

mod common;

use std::process::Command;

fn serve_with(config: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("eeane.toml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_eeane"))
        .arg("--config")
        .arg(&path)
        .args(["serve", "--port", "0"])
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_model_that_cannot_load_stops_startup_with_exit_2_and_the_reason() {
    let model_dir = common::minilm_dir();
    let model = model_dir.join("model.onnx").display().to_string();
    let tokenizer = model_dir.join("tokenizer.json").display().to_string();
    let entry = |model: &str, tokenizer: &str| {
        format!("[[models]]\nid = \"m\"\nengine = \"onnxruntime\"\nmodel = \"{model}\"\ntokenizer = \"{tokenizer}\"\nmax_tokens = 256\n")
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
