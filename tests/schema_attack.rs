//! Schema-driven attack: schemathesis generates requests from the server's own
//! /openapi.json (valid ones and deliberately invalid ones) for every operation,
//! with the API key and without, and checks that no answer is a 5xx and that
//! every answer matches the documented status codes, content types, headers
//! and response schemas. The quick run is part of the suite; docs/reliability.md
//! gives the long one (EEANE_SCHEMATHESIS_EXAMPLES).
//!
//! One check is left out, positive_data_acceptance: some schema-valid requests
//! are refused for reasons no static schema holds (token ids to a model that
//! takes none, a model id that names an embedding model on /rerank).

mod common;

use std::process::Command;

use common::{model_entry, Server};
use serde_json::json;

const KEY: &str = "attack-key";

fn schemathesis() -> std::path::PathBuf {
    let bin = common::cache_dir().join("venv-tools/bin/schemathesis");
    assert!(bin.exists(), "{} is missing: run `bash tests/run.sh` (EEANE_EXTRA_MODELS=test-tools bash models/setup.sh)", bin.display());
    bin
}

fn attack(server: &Server, spec: &std::path::Path, key: Option<&str>) -> String {
    let examples = std::env::var("EEANE_SCHEMATHESIS_EXAMPLES").unwrap_or_else(|_| "25".into());
    let mut cmd = Command::new(schemathesis());
    cmd.arg("run")
        .arg(spec)
        .args(["--url", &server.url, "--checks", "all", "--exclude-checks", "positive_data_acceptance"])
        .args(["--max-examples", &examples, "--seed", "20261130", "--no-color"])
        .env("SCHEMATHESIS_HOOKS", "")
        .current_dir(spec.parent().unwrap());
    if let Some(key) = key {
        cmd.args(["-H", &format!("Authorization: Bearer {key}")]);
    }
    let out = cmd.output().expect("run schemathesis");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "schemathesis found problems (key: {}):\n{text}", key.is_some());
    text
}

#[test]
fn schemathesis_finds_no_5xx_and_no_undocumented_answer() {
    let config = format!(
        "[server]\napi_key = \"{KEY}\"\nhealth_rate_limit = 0\n{}{}",
        model_entry("all-minilm-l6-v2", "all-minilm-l6-v2", "load_policy = \"resident\"\nrerank = true"),
        model_entry("minilm-reranker", "minilm-reranker", "kind = \"reranker\"\npooling = \"none\"")
    );
    let server = Server::start(Some(&config), &[]);
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("openapi.json");
    let document = reqwest::blocking::Client::new().get(format!("{}/openapi.json", server.url)).bearer_auth(KEY).send().unwrap().text().unwrap();
    std::fs::write(&spec, document).unwrap();

    for key in [Some(KEY), None] {
        let report = attack(&server, &spec, key);
        let summary: Vec<&str> = report.lines().filter(|l| l.contains("generated") || l.contains("No issues found")).collect();
        println!("schemathesis, key {}: {}", key.is_some(), summary.join(" | "));
    }
    // Still serving, and nothing counted as an engine error.
    let (status, _, body) = server.post_full("/v1/embeddings", &json!({"input": "still here"}), &[("Authorization", &format!("Bearer {KEY}"))]);
    assert_eq!(status, 200, "{body}");
    assert!(server.stderr().lines().all(|l| !l.contains("panicked")), "{}", server.stderr());
}
