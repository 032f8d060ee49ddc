//! Adding an engine is one crate and one line. No engine of the build is
//! named in `src/` outside `src/engines.rs` (comments aside): everything
//! else asks the engine list. The test-only engine (backends/testing, Cargo
//! feature `test-engine`, which tests/run.sh turns on) serves over HTTP like
//! any engine: its options checked from the model entry, an engine process,
//! the batcher, pooling, /v1/embeddings and /health.

mod common;

use std::path::Path;

/// Where `code` names `engine`: the word itself (a string, an identifier,
/// a flag) or its crate, on the lines that are not comments; numbered from 1.
fn mentions(code: &str, engine: &str) -> Vec<usize> {
    let word = |line: &str| {
        line.match_indices(engine).any(|(at, _)| {
            let before = line[..at].chars().next_back();
            let after = line[at + engine.len()..].chars().next();
            let part_of_name = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
            // A folder of that name in a path (a Hub repository's openvino/) is not the engine.
            let folder = after == Some('/');
            !part_of_name(before) && !part_of_name(after) && !folder
        })
    };
    let krate = format!("eeane_backend_{engine}");
    code.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .map(|(n, line)| (n + 1, line.split(" // ").next().unwrap_or(line)))
        .filter(|(_, line)| word(line) || line.contains(&krate))
        .map(|(n, _)| n)
        .collect()
}

#[test]
fn engines_are_named_in_src_engines_rs_only() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    let mut dirs = vec![root.join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") && path != root.join("src/engines.rs") {
                let code = std::fs::read_to_string(&path).unwrap();
                for engine in eeane::engines::names() {
                    for line in mentions(&code, engine) {
                        found.push(format!("{}:{line}: {engine}", path.strip_prefix(root).unwrap().display()));
                    }
                }
            }
        }
    }
    found.sort();
    assert!(found.is_empty(), "engines named in src/ outside src/engines.rs (ask the engine list instead):\n{}", found.join("\n"));
    // And src/engines.rs names each, so the check above looks for the right words.
    let listed = std::fs::read_to_string(root.join("src/engines.rs")).unwrap();
    for engine in eeane::engines::names() {
        assert!(!mentions(&listed, engine).is_empty() || listed.contains(&format!("eeane_backend_{engine}")), "{engine} is not in src/engines.rs");
    }
}

#[test]
fn the_name_check_finds_what_it_must() {
    let code = "// the ncnn engine, in a comment\nlet format = \"ncnn\";\nlet x = target.ncnn_like; // ncnn\nuse eeane_backend_ncnn::Ncnn;\nif flag == \"--ncnn\" {}\nlet f = \"ncnn/model.bin\";\n";
    assert_eq!(mentions(code, "ncnn"), [2, 4, 5]);
}

#[cfg(not(feature = "test-engine"))]
#[test]
fn the_test_engine_is_compiled_in() {
    panic!("build the tests with `--features eeane/test-engine` (tests/run.sh does)");
}

#[cfg(feature = "test-engine")]
mod with_test_engine {
    use std::process::Command;

    use serde_json::json;

    use super::common::{minilm_dir, Server};

    fn entry(extra: &str) -> String {
        let tokenizer = minilm_dir().join("tokenizer.json");
        // The engine reads no model file; the entry names one, as every entry must.
        format!("[[models]]\nid = \"hashed\"\nengine = \"testing\"\nmodel = \"{0}\"\ntokenizer = \"{0}\"\nmax_tokens = 64\n{extra}\n", tokenizer.display())
    }

    /// What the engine must serve for `text`: its token states (a fixed
    /// function of the ids), mean-pooled and normalized, computed here from
    /// the tokenizer alone.
    fn expected(text: &str, dimensions: usize) -> Vec<f32> {
        let tokenizer = tokenizers::Tokenizer::from_file(minilm_dir().join("tokenizer.json")).unwrap();
        let encoding = tokenizer.encode(text, true).unwrap();
        // The file pads (to 128); the padding is not the text's.
        let ids: Vec<u32> = encoding.get_ids().iter().zip(encoding.get_attention_mask()).filter(|(_, &m)| m == 1).map(|(&id, _)| id).collect();
        let mut mean = vec![0f64; dimensions];
        for &id in &ids {
            for (j, m) in mean.iter_mut().enumerate() {
                *m += eeane_backend_testing::token_state(id as i64, j) as f64 / ids.len() as f64;
            }
        }
        let norm = mean.iter().map(|x| x * x).sum::<f64>().sqrt();
        mean.iter().map(|x| (x / norm) as f32).collect()
    }

    #[test]
    fn a_test_only_engine_serves_over_http() {
        let server = Server::start(Some(&entry("dimensions = 16")), &[]);
        let texts = ["a test-only engine", "registered in one place", "serves over HTTP without edits elsewhere"];
        let vectors = server.embed(json!(texts), json!({"model": "hashed"}));
        for (text, got) in texts.iter().zip(&vectors) {
            let want = expected(text, 16);
            assert_eq!(got.len(), 16);
            let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst < 1e-6, "{text:?}: max |diff| {worst}\n got {got:?}\nwant {want:?}");
        }
        let health = server.model_health("hashed");
        assert_eq!(health["engine"], "testing", "{health}");
        // The engine's own default isolation: a process, fed through a pipe.
        assert_eq!(health["isolation"], "process", "{health}");
        assert!(health["engine_pids"][0].as_u64().is_some(), "{health}");
    }

    /// A load under way shows in /health and /v1/models as "loading" until
    /// the model serves (the test engine's load takes 2 s).
    #[test]
    fn a_model_shows_as_loading_until_it_serves() {
        let server = Server::start(Some(&entry("load_seconds = 2")), &[]);
        assert_eq!(server.model_health("hashed")["state"], "unloaded");
        let first = {
            let url = server.url.clone();
            std::thread::spawn(move || {
                reqwest::blocking::Client::new()
                    .post(format!("{url}/v1/embeddings"))
                    .json(&json!({"input": "x", "model": "hashed"}))
                    .send()
                    .unwrap()
                    .status()
                    .as_u16()
            })
        };
        let health = server.wait_for_health("the load to start", std::time::Duration::from_secs(10), |h| h["models"][0]["state"] != "unloaded");
        assert_eq!((health["models"][0]["state"].as_str(), health["models"][0]["loaded"].as_bool()), (Some("loading"), Some(false)), "{health}");
        let (_, models) = server.get("/v1/models");
        assert_eq!(models["data"][0]["state"], "loading", "{models}");
        assert_eq!(first.join().unwrap(), 200);
        assert_eq!(server.model_health("hashed")["state"], "loaded");
    }

    fn check_config(config: &str) -> (bool, String, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("eeane.toml");
        std::fs::write(&path, config).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_eeane")).args(["check-config", "--config"]).arg(&path).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    }

    #[test]
    fn its_options_are_checked_once_and_reported() {
        let (ok, stdout, stderr) = check_config(&entry("dimensions = 16"));
        assert!(ok, "{stderr}");
        let resolved: toml::Value = toml::from_str(&stdout).unwrap();
        assert_eq!(resolved["models"][0]["dimensions"].as_integer(), Some(16), "{stdout}");
        // A default the engine fills in is reported too.
        let (ok, stdout, stderr) = check_config(&entry(""));
        assert!(ok, "{stderr}");
        assert!(stdout.contains("dimensions = 8"), "{stdout}");
        for (line, needle) in [("dimensions = 0", "dimensions = 0: use 1 to 4096"), ("dimensionz = 3", "unknown field `dimensionz`"), ("spin = true", "`spin`")]
        {
            let (ok, _, stderr) = check_config(&entry(line));
            assert!(!ok, "{line} passed");
            assert!(stderr.contains(needle) && stderr.contains("models[0]"), "{line}: {stderr}");
        }
    }
}
