//! Repositories that ship PyTorch weights only (`pytorch_model.bin`, or its
//! shards and `pytorch_model.bin.index.json`), pulled from the Hub look-alike
//! (tests/hub/lookalike.py) on loopback: their pickle read without running
//! it (models/torch_bin.py), converted to model.safetensors to build the
//! graph from (not kept), served at sentence-transformers' own vectors; a file
//! whose pickle names any global a state dict does not need refused by
//! name, with nothing kept. The repositories come from
//! tests/hub/make_bin_repos.py (tests/hub/fixtures/bert-bin-*, made once
//! with torch by tests/hub/make_bin_fixtures.py, and files crafted with the
//! standard library's pickle); no torch is needed here.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::hub::{files_under, laid_out_once, pull_with, python, script, sha256_hex, the_snapshot, LookAlike};
use serde_json::Value;

/// The repositories, built once per test binary into one folder under target/.
fn repos() -> &'static Path {
    static REPOS: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hub-bin-repos");
    let mut make_bin_repos = Command::new(python());
    make_bin_repos.arg(script("make_bin_repos.py")).arg(&dir);
    laid_out_once(&REPOS, dir, make_bin_repos)
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hub/fixtures").join(name)
}

fn prepared(repo: &str) -> PathBuf {
    common::cache_dir().join("models").join(format!("hf--{}", repo.replace('/', "--")))
}

fn worst(got: &[Vec<f32>], want: &Value) -> f64 {
    got.iter().zip(want.as_array().unwrap()).map(|(v, r)| common::cosine(v, &common::f64s(r))).fold(1.0f64, f64::min)
}

/// models/torch_bin.py on its own (tests/hub/torch_bin_cases.py): torch's
/// own files of views, offsets and every dtype read as torch read them, in
/// its zip and its legacy format; each forbidden global refused by name,
/// whichever opcode names it; malformed files refused; a conversion made
/// once, and none made of a refused shard.
#[test]
fn the_restricted_unpickler_reads_what_torch_wrote_and_refuses_every_other_global() {
    let out = Command::new(python()).arg(script("torch_bin_cases.py")).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    println!("{said}");
    assert!(out.status.success() && said.contains("all cases passed"), "{said}\n{}", String::from_utf8_lossy(&out.stderr));
}

/// A BertForMaskedLM (its decoder tied to the word embeddings) in one
/// pytorch_model.bin and in two shards with an index: each pulled, its
/// snapshot left as the repository ships it, converted to
/// model.safetensors with the sources' sha256 in the manifest, and served
/// over HTTP at sentence-transformers' vectors (computed by it from the same
/// .bin), one text a request and as one padded batch; the sharded one on
/// ncnn as well.
#[test]
fn pytorch_model_bin_and_its_shards_serve_sentence_transformers_vectors() {
    let hub = LookAlike::start(repos(), "hf_lookalike_token");
    let home = tempfile::tempdir().unwrap();
    let cases = [
        ("bert-bin-tiny", vec!["pytorch_model.bin"], "pytorch_model.bin"),
        ("bert-bin-sharded-tiny", vec!["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"], "pytorch_model.bin.index.json"),
    ];
    let mut config = String::from("[server]\nport = 0\n\n");
    for (name, files, named_by) in &cases {
        let repo = format!("eeane-test/{name}");
        let _ = std::fs::remove_dir_all(prepared(&repo));
        let pulled = pull_with(&[], home.path(), &hub.endpoint, &format!("hf:{repo}"), &[]);
        assert!(pulled.ok, "{repo}: {}", pulled.stderr);
        assert!(pulled.stderr.contains("without running pickled code"), "{}", pulled.stderr);
        let weights = format!("{named_by}, converted to model.safetensors without running its pickle");
        assert!(pulled.stdout.contains(&format!("graph built from {weights}")), "{}", pulled.stdout);
        config += &pulled.stdout;
        config += "\n";

        // The HF cache holds the repository's files as it ships them, and no safetensors.
        let snapshot = the_snapshot(home.path(), &repo);
        let held = files_under(&snapshot);
        assert!(!held.iter().any(|f| f.ends_with(".safetensors")), "{held:?}");
        for file in files.iter().chain([named_by, &"config.json", &"tokenizer.json"]) {
            assert!(held.contains(&file.to_string()), "{file} not fetched: {held:?}");
            assert_eq!(sha256_hex(&snapshot.join(file)), sha256_hex(&fixture(name).join(file)), "{file} changed in the HF cache");
        }
        // The prepared folder: the graph, and the converted sources' sha256 in the manifest.
        let dir = prepared(&repo);
        let manifest: Value = serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
        let converted = &manifest["source"]["converted_weights"];
        let sources: serde_json::Map<String, Value> = files.iter().map(|f| (f.to_string(), Value::from(sha256_hex(&fixture(name).join(f))))).collect();
        assert_eq!(converted["from"], Value::Object(sources), "{manifest}");
        assert_eq!(converted["to"], "model.safetensors");
        // The converted weights are not kept once the graph holds them.
        assert!(manifest["files"]["model.onnx"].is_string() && manifest["files"].get("model.safetensors").is_none(), "{manifest}");
        assert!(!dir.join("model.safetensors").exists(), "{:?}", files_under(&dir));
        assert_eq!(manifest["source"]["inferred"]["weights"], weights.as_str(), "{manifest}");
        assert!(!files_under(&dir).iter().any(|f| f.ends_with(".tmp")), "{:?}", files_under(&dir));
        println!("{repo}: {} tensors from {} ({}), converted to model.safetensors", converted["tensors"], files.join(", "), converted["dtypes"]);
    }
    // Pulled again: nothing to convert or build.
    let again = pull_with(&[], home.path(), &hub.endpoint, "hf:eeane-test/bert-bin-tiny", &[]);
    assert!(again.ok && again.stderr.contains("up to date"), "{}", again.stderr);
    // For ncnn: the shards converted again, in ncnn's own prepared folder, then by pnnx.
    let _ = std::fs::remove_dir_all(prepared("eeane-test/bert-bin-sharded-tiny--ncnn"));
    let ncnn = pull_with(&["--engine", "ncnn"], home.path(), &hub.endpoint, "hf:eeane-test/bert-bin-sharded-tiny", &[]);
    assert!(ncnn.ok && ncnn.stderr.contains("without running pickled code"), "{}", ncnn.stderr);
    config += &ncnn.stdout.replace("id = \"eeane-test/bert-bin-sharded-tiny\"", "id = \"sharded-ncnn\"");

    let server = common::Server::start(Some(&config), &[("HF_HOME", home.path().to_str().unwrap()), ("HF_ENDPOINT", hub.endpoint.as_str())]);
    let mut served = Vec::new();
    for (model, name) in cases.iter().map(|(name, _, _)| (format!("eeane-test/{name}"), *name)).chain([("sharded-ncnn".to_string(), "bert-bin-sharded-tiny")]) {
        let reference: Value = serde_json::from_slice(&std::fs::read(fixture(name).join("reference.json")).unwrap()).unwrap();
        let texts = reference["texts"].as_array().unwrap();
        let embed = |input: &[Value]| {
            let (status, response) = server.post("/v1/embeddings", &serde_json::json!({"model": model, "input": input}));
            assert_eq!(status, 200, "{model}: {response}");
            common::vectors(&response)
        };
        let one: Vec<Vec<f32>> = texts.iter().flat_map(|t| embed(std::slice::from_ref(t))).collect();
        let batch = embed(texts);
        for (what, cosine) in [
            ("one text a request vs sentence-transformers", worst(&one, &reference["vectors"])),
            ("one padded batch vs sentence-transformers' batch", worst(&batch, &reference["batch"])),
        ] {
            println!("{model}: {what}, {} texts: min cosine {cosine:.8}", texts.len());
            assert!(cosine >= 0.9999, "{model}: {what}: min cosine {cosine}");
        }
        served.push(batch);
    }
    let same = served[0].iter().zip(&served[1]).map(|(a, b)| common::cosine(a, &common::as_f64(b))).fold(1.0f64, f64::min);
    println!("sharded vs one file, served: min cosine {same:.8}");
    assert!(same >= 0.99999, "{same}");
}

/// A pytorch_model.bin whose pickle calls os.system (torch's zip), a
/// sharded one whose second shard calls builtins.eval, and one in torch's
/// legacy format calling __builtin__.exec: each refused naming the global;
/// no payload ran (its marker file is absent) and no model file is kept.
#[test]
fn a_bin_naming_any_other_global_is_refused_and_nothing_is_kept() {
    let hub = LookAlike::start(repos(), "hf_lookalike_token");
    let home = tempfile::tempdir().unwrap();
    for (name, global, file) in [
        ("bin-os-system", "os.system", "pytorch_model.bin"),
        ("bin-sharded-eval", "builtins.eval", "pytorch_model-00002-of-00002.bin"),
        ("bin-legacy-exec", "__builtin__.exec", "pytorch_model.bin"),
    ] {
        let repo = format!("eeane-test/{name}");
        let dir = prepared(&repo);
        let _ = std::fs::remove_dir_all(&dir);
        let refused = pull_with(&[], home.path(), &hub.endpoint, &format!("hf:{repo}"), &[]);
        let why = refused.stderr.lines().rev().find(|l| l.contains("refused")).unwrap_or_default().to_string();
        assert!(!refused.ok && why.contains(&format!("{file}: its pickle names the global {global}")), "{repo}: {}", refused.stderr);
        assert!(!repos().join(format!("PWNED-{name}")).exists(), "{repo}: its payload ran");
        let kept = files_under(&dir);
        assert!(!dir.exists(), "{repo}: the prepared folder was made: {kept:?}");
        println!("{repo}: {why}");
    }
}
