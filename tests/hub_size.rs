//! Large models, tested with tiny ones (issue 43, "Size"): a checkpoint
//! sharded as save_pretrained shards a large model (two safetensors files
//! and model.safetensors.index.json, in float32 and in bfloat16), pulled
//! through the Hub look-alike (tests/hub/lookalike.py) and served; a graph
//! built with its weights in model.onnx_data (ONNX external data, forced on
//! a tiny model by EEANE_EXTERNAL_DATA_MIN_BYTES=0); the parameter count and
//! memory `eeane check-config` prints; a load refused for want of memory.
//!
//! The repositories are tests/hub/fixtures/qwen3-tiny under names of their
//! own (size-test/...), so that the prepared models these tests make and
//! remove are never the ones tests/hub_pull.rs serves.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::hub::{laid_out_once, on_the_cpu, python, LookAlike};

use serde_json::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// size-test/qwen3-tiny (the fixture's one file), -sharded and -bf16-sharded
/// (tests/hub/make_repos.py's `sharded`), and copies of the first for the
/// external-data build, its in-one-file twin, check-config and a repository
/// no test pulls; built once per run under target/.
fn repos() -> &'static Path {
    static REPOS: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hub-size-repos");
    let code = "import shutil, sys\n\
                    from pathlib import Path\n\
                    sys.path[:0] = [sys.argv[3], sys.argv[4]]\n\
                    import make_repos\n\
                    out = Path(sys.argv[1]) / 'size-test'\n\
                    shutil.copytree(sys.argv[2], out / 'qwen3-tiny', ignore=shutil.ignore_patterns('reference.json'))\n\
                    make_repos.sharded(out / 'qwen3-tiny', out / 'qwen3-tiny-sharded')\n\
                    make_repos.sharded(out / 'qwen3-tiny', out / 'qwen3-tiny-bf16-sharded', bf16=True)\n\
                    for copy in ('qwen3-tiny-external', 'qwen3-tiny-inline', 'qwen3-tiny-counted', 'qwen3-tiny-never-pulled'):\n\
                    \x20   shutil.copytree(out / 'qwen3-tiny', out / copy)\n";
    let mut lay_out = Command::new(python());
    lay_out.args(["-c", code]).arg(&dir).arg(root().join("tests/hub/fixtures/qwen3-tiny")).arg(root().join("tests/hub")).arg(root().join("models"));
    laid_out_once(&REPOS, dir, lay_out)
}

/// The look-alike serving the repositories above (none gated).
fn start_hub() -> LookAlike {
    LookAlike::start(repos(), "hf_lookalike_token")
}

/// The environment a command needs to reach the look-alike with its own HF cache.
fn hub_env<'a>(home: &'a Path, hub: &'a LookAlike) -> Vec<(&'a str, &'a str)> {
    vec![("HF_HOME", home.to_str().unwrap()), ("HF_ENDPOINT", hub.endpoint.as_str())]
}

/// `eeane pull hf:REPO`: its stdout (the entry) when it succeeds, else its stderr.
fn pull(home: &Path, hub: &LookAlike, repo: &str, env: &[(&str, &str)]) -> Result<String, String> {
    pull_with_flags(&[], home, hub, repo, env)
}

/// `pull` for a CUDA device: the GPU's graph made too. The entry's device
/// and precision lines are left out, for the CPU that serves it here.
fn pull_for_the_gpu(home: &Path, hub: &LookAlike, repo: &str, env: &[(&str, &str)]) -> Result<String, String> {
    let entry = pull_with_flags(&["--device", "cuda:H200"], home, hub, repo, env)?;
    assert!(entry.contains("device = \"cuda:H200\"\nprecision = \"auto\""), "{entry}");
    Ok(on_the_cpu(&entry))
}

fn pull_with_flags(flags: &[&str], home: &Path, hub: &LookAlike, repo: &str, env: &[(&str, &str)]) -> Result<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_eeane"))
        .arg("pull")
        .args(flags)
        .arg(format!("hf:{repo}"))
        .envs(hub_env(home, hub))
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_CACHE")
        .env_remove("HUGGINGFACE_HUB_CACHE")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("EEANE_EXTERNAL_DATA_MIN_BYTES")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(stderr)
    }
}

/// The prepared folder of a repository, removed first so that the test prepares it.
fn prepared(repo: &str) -> PathBuf {
    let dir = common::cache_dir().join("models").join(format!("hf--{}", repo.replace('/', "--")));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn manifest(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap()
}

fn listed_files(manifest: &Value) -> Vec<String> {
    manifest["files"].as_object().unwrap().keys().cloned().collect()
}

/// The fixture's texts and sentence-transformers' vectors of them (one text a request).
fn fixture_reference() -> (Vec<Value>, Vec<Vec<f64>>) {
    let reference: Value = serde_json::from_slice(&std::fs::read(root().join("tests/hub/fixtures/qwen3-tiny/reference.json")).unwrap()).unwrap();
    let texts = reference["texts"].as_array().unwrap().clone();
    let vectors = reference["vectors"].as_array().unwrap().iter().map(common::f64s).collect();
    (texts, vectors)
}

fn embed(server: &common::Server, model: &str, texts: &[Value]) -> Vec<Vec<f32>> {
    let (status, response) = server.post("/v1/embeddings", &serde_json::json!({"model": model, "input": texts}));
    assert_eq!(status, 200, "{model}: {response}");
    common::vectors(&response)
}

/// The lowest cosine between two lists of vectors, and the largest |difference|.
fn compare(a: &[Vec<f32>], b: &[Vec<f32>]) -> (f64, f32) {
    let worst = a.iter().zip(b).map(|(x, y)| common::cosine(x, &common::as_f64(y))).fold(1.0f64, f64::min);
    let max_abs = a.iter().zip(b).flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs())).fold(0.0f32, f32::max);
    (worst, max_abs)
}

/// A checkpoint in two shards with an index: the HF cache holds both
/// shards and the index, the graph is built from them, the manifest counts
/// their parameters, and it serves the vectors of the same checkpoint in
/// one file; in bfloat16 (read by eeane's own reader, widened exactly to
/// float32) it serves within bfloat16's rounding of them.
#[test]
fn a_sharded_checkpoint_serves_the_vectors_of_the_same_one_in_one_file() {
    let hub = start_hub();
    let home = tempfile::tempdir().unwrap();
    let names = ["size-test/qwen3-tiny", "size-test/qwen3-tiny-sharded", "size-test/qwen3-tiny-bf16-sharded"];
    let mut config = String::from("[server]\nport = 0\n\n");
    for repo in names {
        let dir = prepared(repo);
        config += &pull(home.path(), &hub, repo, &[]).unwrap_or_else(|e| panic!("{repo}: {e}"));
        config += "\n";
        let manifest = manifest(&dir);
        assert_eq!(manifest["parameters"]["count"], 106_880, "{repo}: {manifest}");
        assert_eq!(listed_files(&manifest), ["model.onnx", "tokenizer.json"], "{repo}: a tiny graph is one file");
    }
    let sharded = manifest(&common::cache_dir().join("models/hf--size-test--qwen3-tiny-sharded"));
    assert_eq!(sharded["parameters"]["from"], "safetensors headers (model.safetensors.index.json's 2 shards)", "{sharded}");
    let snapshots = home.path().join("hub/models--size-test--qwen3-tiny-sharded/snapshots");
    let snapshot = std::fs::read_dir(&snapshots).unwrap().next().unwrap().unwrap().path();
    for file in ["model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"] {
        assert!(snapshot.join(file).is_file(), "{file} was not downloaded");
    }
    let graph = |repo: &str| std::fs::read(common::cache_dir().join(format!("models/hf--{}/model.onnx", repo.replace('/', "--")))).unwrap();
    assert!(graph(names[0]) == graph(names[1]), "the graph built from two shards differs from the one built from one file");

    let server = common::Server::start(Some(&config), &hub_env(home.path(), &hub));
    let (texts, reference) = fixture_reference();
    let whole = embed(&server, names[0], &texts);
    let to_reference = whole.iter().zip(&reference).map(|(v, r)| common::cosine(v, r)).fold(1.0f64, f64::min);
    println!("{}: {} texts, min cosine to sentence-transformers {to_reference:.8}", names[0], texts.len());
    assert!(to_reference >= 0.9999, "{to_reference}");
    let (cosine, max_abs) = compare(&embed(&server, names[1], &texts), &whole);
    println!("{}: vs the one-file checkpoint: min cosine {cosine:.10}, max |difference| {max_abs:.2e}", names[1]);
    assert!(cosine >= 0.99999999, "{cosine}");
    let (cosine, max_abs) = compare(&embed(&server, names[2], &texts), &whole);
    println!("{}: vs the float32 checkpoint: min cosine {cosine:.8}, max |difference| {max_abs:.2e}", names[2]);
    assert!(cosine >= 0.999, "{cosine}");
}

/// A graph built with its weights streamed to model.onnx_data (the bound
/// forced to 0 bytes) serves the same vectors as the same repository built
/// in one file, on ONNX Runtime and OpenVINO; the manifest lists the data
/// file (a changed byte fails the load). The GPU's fp16 graph (pulled for
/// a CUDA device) has its own data file and serves the one-file fp16
/// graph's vectors (on the CPU here). Prepared again in one file, the
/// folder loses the data files, and a leftover build folder is cleared.
#[test]
fn a_graph_with_external_data_serves_the_vectors_of_the_one_file_graph() {
    let hub = start_hub();
    let home = tempfile::tempdir().unwrap();
    let (external, inline) = ("size-test/qwen3-tiny-external", "size-test/qwen3-tiny-inline");
    let (external_dir, inline_dir) = (prepared(external), prepared(inline));
    let mut config = String::from("[server]\nport = 0\n\n");
    config += &pull_for_the_gpu(home.path(), &hub, external, &[("EEANE_EXTERNAL_DATA_MIN_BYTES", "0")]).unwrap();
    config += "\n";
    config += &pull_for_the_gpu(home.path(), &hub, inline, &[]).unwrap();
    config += &format!("\n[[models]]\nid = \"external-openvino\"\nsource = \"hf:{external}\"\nengine = \"openvino\"\ndevice = \"CPU\"\n");
    for (id, repo, dir) in [("external-gpu-graph", external, &external_dir), ("inline-gpu-graph", inline, &inline_dir)] {
        let graph = dir.join("model.fp16.onnx");
        config += &format!("\n[[models]]\nid = \"{id}\"\nsource = \"hf:{repo}\"\nmodel = \"{}\"\npooling = \"none\"\n", graph.display());
    }
    let listed = listed_files(&manifest(&external_dir));
    assert_eq!(
        listed,
        ["model.fp16.onnx", "model.fp16.onnx_data", "model.onnx", "model.onnx_data", "tokenizer.json"],
        "the manifest must cover the data files"
    );
    assert_eq!(listed_files(&manifest(&inline_dir)), ["model.fp16.onnx", "model.onnx", "tokenizer.json"]);
    let size = |name: &str| std::fs::metadata(external_dir.join(name)).unwrap().len();
    let (graph_bytes, data_bytes, fp16_data_bytes) = (size("model.onnx"), size("model.onnx_data"), size("model.fp16.onnx_data"));
    println!("{external}: model.onnx {graph_bytes} bytes, model.onnx_data {data_bytes} bytes, model.fp16.onnx_data {fp16_data_bytes} bytes");
    // The data file holds the weights (norms under 1 KiB stay in the graph);
    // the GPU graph's, the same weights in fp16.
    assert!(data_bytes > 400_000 && graph_bytes < 64 << 10, "{graph_bytes} {data_bytes}");
    assert!(fp16_data_bytes > data_bytes / 3 && fp16_data_bytes < data_bytes * 2 / 3, "{fp16_data_bytes} {data_bytes}");

    let (texts, _) = fixture_reference();
    {
        let server = common::Server::start(Some(&config), &hub_env(home.path(), &hub));
        let one_file = embed(&server, inline, &texts);
        for model in [external, "external-openvino"] {
            let (cosine, max_abs) = compare(&embed(&server, model, &texts), &one_file);
            println!("{model}: external data vs the one-file graph: min cosine {cosine:.10}, max |difference| {max_abs:.2e}");
            assert!(cosine >= 0.99999999, "{model}: {cosine}");
        }
        let (cosine, max_abs) = compare(&embed(&server, "external-gpu-graph", &texts), &embed(&server, "inline-gpu-graph", &texts));
        println!("the GPU graph: external data vs one file: min cosine {cosine:.10}, max |difference| {max_abs:.2e}");
        assert!(cosine >= 0.99999999, "{cosine}");
        // Ollama's list counts the graph with its external data, and the parameters the manifest records.
        let (_, tags) = server.get("/api/tags");
        let listed = tags["models"].as_array().unwrap().iter().find(|m| m["name"] == format!("{external}:latest")).unwrap().clone();
        assert_eq!(listed["size"].as_u64(), Some(graph_bytes + data_bytes), "{listed}");
        assert_eq!(listed["details"]["parameter_size"], "106.9K", "{listed}");
    }

    // Again, in one file: what an interrupted run left (.build) and the
    // data file the new graph does not use are gone; the manifest lists
    // only what is there.
    std::fs::remove_file(external_dir.join("manifest.json")).unwrap();
    std::fs::create_dir_all(external_dir.join(".build")).unwrap();
    std::fs::write(external_dir.join(".build/model.onnx_data"), b"half-written").unwrap();
    pull(home.path(), &hub, external, &[]).unwrap();
    let mut left: Vec<String> = std::fs::read_dir(&external_dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    left.sort();
    assert_eq!(left, ["manifest.json", "model.onnx", "tokenizer.json"]);
    assert_eq!(listed_files(&manifest(&external_dir)), ["model.onnx", "tokenizer.json"]);
}

/// check-config prints, as comments its output reads back through, each
/// entry's parameter count with where it came from and the memory of its
/// weights per precision; a source not pulled yet says so; an entry whose
/// weights cannot fit is named on stderr, and its load is refused with the
/// memory needed, the memory available and the fix, the others serving.
#[test]
fn check_config_counts_parameters_and_a_model_too_large_is_refused_at_load() {
    let hub = start_hub();
    let home = tempfile::tempdir().unwrap();
    let counted = "size-test/qwen3-tiny-counted";
    let _ = prepared(counted);
    let _ = prepared("size-test/qwen3-tiny-never-pulled");
    let mut config = String::from("[server]\nport = 0\n\n");
    config += &pull(home.path(), &hub, counted, &[]).unwrap();
    config += "\n[[models]]\nid = \"never-pulled\"\nsource = \"hf:size-test/qwen3-tiny-never-pulled\"\n";

    // A model whose manifest says it holds 10^13 parameters: 40 TB in fp32,
    // more than any machine has; its graph is all-MiniLM-L6-v2's, never loaded.
    let huge = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(common::minilm_dir().join("model.onnx"), huge.path().join("model.onnx")).unwrap();
    std::fs::write(huge.path().join("manifest.json"), r#"{"parameters": {"count": 10000000000000, "from": "a test's manifest"}}"#).unwrap();
    config += &format!(
        "\n[[models]]\nid = \"huge\"\nengine = \"onnxruntime\"\nmodel = \"{}\"\ntokenizer = \"{}\"\nmax_tokens = 128\n",
        huge.path().join("model.onnx").display(),
        common::minilm_dir().join("tokenizer.json").display()
    );

    let check = |text: &str| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("eeane.toml"), text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_eeane"))
            .args(["check-config", "--config"])
            .arg(dir.path().join("eeane.toml"))
            .envs(hub_env(home.path(), &hub))
            .env_remove("EEANE_API_KEY")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
    };
    let (printed, said) = check(&config);
    println!("{}", printed.lines().filter(|l| l.starts_with('#')).collect::<Vec<_>>().join("\n"));
    let expected = [
        format!("# {counted}: 106,880 parameters, from safetensors headers (model.safetensors), recorded in manifest.json\n"),
        format!("# {counted}: memory of its weights: fp32 418 KiB (as configured)\n"),
        "# never-pulled: not pulled yet".to_string(),
        "# huge: 10,000,000,000,000 parameters (10.00 trillion), from a test's manifest, recorded in manifest.json\n".to_string(),
    ];
    for line in &expected {
        assert!(printed.contains(line.as_str()), "{line:?} is not in:\n{printed}");
    }
    assert!(said.contains("eeane: warning: model \"huge\" needs about 37252.9 GiB of memory for its weights"), "{said}");
    let (again, _) = check(&printed);
    assert_eq!(again, printed, "check-config's output does not read back to itself");

    // The load is refused with the figures; the other models serve.
    let server = common::Server::start(Some(&config), &hub_env(home.path(), &hub));
    let (status, response) = server.post("/v1/embeddings", &serde_json::json!({"model": "huge", "input": ["hello"]}));
    let message = response["error"]["message"].as_str().unwrap_or_default();
    println!("huge: {status}: {message}");
    assert_eq!(status, 503, "{response}");
    for words in [
        "needs about 37252.9 GiB of memory for its weights",
        "x 4 bytes in fp32",
        "GiB available (",
        "serve a smaller model",
        "bf16 or fp16",
        "or give it more memory",
    ] {
        assert!(message.contains(words), "{words:?} is not in: {message}");
    }
    assert_eq!(embed(&server, counted, &[Value::from("hello")]).len(), 1);
}
