//! /docs is a working API explorer: Debian's headless Chromium (driven by
//! Playwright, tests/tools/explorer.py) opens it on a server with an API key,
//! and the operations and schemas render from /openapi.json, nothing is
//! fetched from another host, and "Try it out" on POST /v1/embeddings with the
//! key typed under "Authorize" gets a 200 with the vectors. The screenshot is
//! kept under target/explorer.png.

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
    let got = run_explorer_retrying_a_hang(&python, &server.url, &screenshot);
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

/// A Chromium that stops answering Playwright (its `newPage` is known to
/// hang on some hosts) is the browser's fault, not the page's: such a hang
/// is tried once more, and said. Any other failure fails at once.
fn run_explorer_retrying_a_hang(python: &Path, url: &str, screenshot: &Path) -> Value {
    match run_explorer(python, url, screenshot) {
        Explorer::Findings(findings) => findings,
        Explorer::Hung(report) => {
            eprintln!("explorer.py hung; trying once more. The hung run:\n{report}");
            match run_explorer(python, url, screenshot) {
                Explorer::Findings(findings) => findings,
                Explorer::Hung(report) | Explorer::Failed(report) => panic!("{report}"),
            }
        }
        Explorer::Failed(report) => panic!("{report}"),
    }
}

enum Explorer {
    Findings(Value),
    /// Stopped by the deadline or by its own watchdog, with nothing printed.
    Hung(String),
    Failed(String),
}

/// Runs tests/tools/explorer.py in a process group of its own, its output in
/// files (a browser process left behind cannot hold a pipe open), for at most
/// two minutes; then the group is killed. The findings line counts when it
/// was printed, even if the browser then hung on its way out: that is
/// Chromium's shutdown, not the page. Anything else fails with the tool's
/// stderr, where a hang inside the tool shows as every thread's stack.
fn run_explorer(python: &Path, url: &str, screenshot: &Path) -> Explorer {
    let dir = tempfile::tempdir().unwrap();
    let (stdout_path, stderr_path) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = Command::new(python)
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/tools/explorer.py"))
        .args([url, "explorer-key"])
        .arg(screenshot)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).unwrap())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // The browser and Playwright's driver go with the group, whatever the tool
    // did (ESRCH when the group is already empty).
    // SAFETY: killpg takes a process group id and a signal, nothing else.
    unsafe { libc::killpg(child.id() as libc::pid_t, libc::SIGKILL) };
    let _ = child.wait();
    let stdout = std::fs::read_to_string(&stdout_path).unwrap();
    let stderr = std::fs::read_to_string(&stderr_path).unwrap();
    let findings = stdout.lines().filter_map(|line| serde_json::from_str::<Value>(line).ok()).find(|v| v.get("operations").is_some());
    let ending = if findings.is_some() { "after printing its findings" } else { "without its findings" };
    let report = format!("explorer.py ended {status:?} {ending}.\nstdout:\n{stdout}\nstderr:\n{stderr}");
    match (status, findings) {
        (Some(status), Some(findings)) if status.success() => Explorer::Findings(findings),
        (None, Some(findings)) => {
            eprintln!("explorer.py printed its findings but had not exited after 120 s; killed. Its stderr:\n{stderr}");
            Explorer::Findings(findings)
        }
        // faulthandler's watchdog writes "Timeout (0:01:40)!" before the stacks.
        (None, None) => Explorer::Hung(report),
        (Some(_), None) if stderr.lines().any(|l| l.starts_with("Timeout (")) => Explorer::Hung(report),
        (Some(_), _) => Explorer::Failed(report),
    }
}
