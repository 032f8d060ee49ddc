//! /docs is a working API explorer: Debian's headless Chromium (driven by
//! Playwright, tests/tools/explorer.py) opens it on a server with an API key,
//! and the operations and schemas render from /openapi.json, nothing is
//! fetched from another host, and "Try it out" on POST /v1/embeddings with the
//! key typed under "Authorize" gets a 200 with the vectors. The screenshot is
//! kept under target/explorer.png.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{model_entry, Server};
use serde_json::Value;

#[test]
fn docs_renders_every_operation_and_try_it_out_answers_200() {
    let chromium = PathBuf::from("/usr/bin/chromium");
    assert!(chromium.exists(), "Debian's chromium is missing: run `bash tests/run.sh` (EEANE_EXTRA_MODELS=chromium bash models/setup.sh)");
    let python = common::cache_dir().join("venv-tools/bin/python");
    assert!(python.exists(), "{} is missing: run `bash tests/run.sh`", python.display());
    let server = Server::start(Some(&format!("[server]\napi_key = \"explorer-key\"\n{}", model_entry("all-minilm-l6-v2", "all-minilm-l6-v2", ""))), &[]);
    let screenshot = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/explorer.png");
    let _ = std::fs::remove_file(&screenshot);
    let out = Command::new(python)
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/tools/explorer.py"))
        .args([server.url.as_str(), "explorer-key"])
        .arg(&screenshot)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    let operations: Vec<&str> = got["operations"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    for path in ["/v1/embeddings", "/v1/rerank", "/embed", "/tokenize", "/api/embed", "/api/tags", "/health"] {
        assert!(operations.contains(&path), "{path} not rendered: {operations:?}");
    }
    let schemas: Vec<&str> = got["schemas"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    for schema in ["EmbeddingsRequest", "TeiEmbedRequest", "OllamaEmbedRequest", "ErrorResponse"] {
        assert!(schemas.contains(&schema), "{schema} not rendered: {schemas:?}");
    }
    assert_eq!(got["status"], "200", "{got}");
    assert_eq!(got["vectors"], 2, "the answer shown is the embeddings of both inputs: {got}");
    assert_eq!(got["foreign_requests"], serde_json::json!([]), "the page fetched from elsewhere");
    let png = std::fs::read(&screenshot).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 20_000, "screenshot of {} bytes", png.len());
}
