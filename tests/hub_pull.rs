//! `eeane pull hf:ORG/NAME` against the Hub look-alike (tests/hub/lookalike.py)
//! on loopback, whose repositories tests/hub/make_repos.py lays out from the
//! project's own weights. Each test starts its own look-alike (faults are per
//! server) and its own HF_HOME.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use common::hub::{files_under, laid_out_once, on_the_cpu, pull_with, python, repo_dir, script, sha256_hex, the_snapshot, LookAlike, Pulled};

use serde_json::Value;

const TOKEN: &str = "hf_lookalike_token";
const MINILM: &str = "sentence-transformers/all-MiniLM-L6-v2";

/// The repositories, built once per test binary into one folder under
/// target/ that each run replaces (a temporary folder in a static is never
/// dropped, so each run left its 1.7 GB of repositories behind).
fn repos() -> &'static Path {
    static REPOS: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    common::minilm_dir();
    let mut make_repos = Command::new(python());
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hub-repos");
    make_repos.arg(script("make_repos.py")).arg("--cache").arg(common::cache_dir()).arg(&dir);
    laid_out_once(&REPOS, dir, make_repos)
}

/// The look-alike serving make_repos.py's repositories.
fn start_hub() -> LookAlike {
    LookAlike::start(repos(), TOKEN)
}

/// Runs `eeane pull --download-only SOURCE` with HF_HOME = `home`, the endpoint and extra environment.
fn pull(home: &Path, endpoint: &str, source: &str, env: &[(&str, &str)]) -> Pulled {
    pull_with(&["--download-only"], home, endpoint, source, env)
}

/// tests/hub/reference.py on a snapshot: vectors for {"texts", "max_tokens"}, logits for {"query", "documents"}.
fn reference(snapshot: &Path, request: &Value) -> Value {
    use std::io::Write;
    let mut child = Command::new(python()).arg(script("reference.py")).arg(snapshot).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(request.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "reference.py failed on {}", snapshot.display());
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Removes the prepared model `{cache}/models/NAME`, so that the test prepares it.
fn unprepared(name: &str) {
    let _ = std::fs::remove_dir_all(common::cache_dir().join("models").join(name));
}

/// What an interrupted or refused download may leave: nothing but `.incomplete` files when asked.
fn leftovers(home: &Path, repo: &str) -> Vec<String> {
    files_under(&repo_dir(home, repo).join("blobs"))
}

#[test]
fn pull_fills_the_hf_cache_as_huggingface_hub_does() {
    let hub = start_hub();
    let ours = tempfile::tempdir().unwrap();
    let pulled = pull(ours.path(), &hub.endpoint, &format!("hf:{MINILM}"), &[]);
    assert!(pulled.ok, "{}", pulled.stderr);
    let snapshot = the_snapshot(ours.path(), MINILM);
    let commit = snapshot.file_name().unwrap().to_string_lossy().into_owned();
    assert!(pulled.stdout.contains(&commit), "{}", pulled.stdout);
    assert_eq!(std::fs::read_to_string(repo_dir(ours.path(), MINILM).join("refs/main")).unwrap(), commit);
    let ours_files = files_under(&snapshot);
    for needed in ["config.json", "modules.json", "1_Pooling/config.json", "model.safetensors", "tokenizer.json", "sentence_bert_config.json"] {
        assert!(ours_files.contains(&needed.to_string()), "{needed} missing: {ours_files:?}");
    }
    assert!(!ours_files.iter().any(|f| f == "README.md"), "{ours_files:?}");

    // The official client, asked for the same files from the same look-alike.
    let theirs = tempfile::tempdir().unwrap();
    let patterns = serde_json::to_string(&ours_files).unwrap();
    let code = format!("from huggingface_hub import snapshot_download\nprint(snapshot_download({MINILM:?}, allow_patterns={patterns}))");
    let out = Command::new(python())
        .args(["-c", &code])
        .env("HF_HOME", theirs.path())
        .env("HF_ENDPOINT", &hub.endpoint)
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "huggingface_hub failed: {}", String::from_utf8_lossy(&out.stderr));
    let their_snapshot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert_eq!(their_snapshot.file_name().unwrap().to_string_lossy(), commit, "the same commit");
    assert_eq!(files_under(&their_snapshot), ours_files, "the same files");
    for file in &ours_files {
        let (a, b) = (snapshot.join(file), their_snapshot.join(file));
        assert_eq!(std::fs::read_link(&a).unwrap(), std::fs::read_link(&b).unwrap(), "{file}: the same link into blobs/");
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), "{file}: the same bytes");
    }
    // The LFS file's blob is named by its sha256, and has that hash.
    let blob = std::fs::canonicalize(snapshot.join("model.safetensors")).unwrap();
    assert_eq!(sha256_hex(&blob), blob.file_name().unwrap().to_string_lossy());

    // Again: nothing is downloaded.
    let before = hub.log().len();
    let again = pull(ours.path(), &hub.endpoint, &format!("hf:{MINILM}"), &[]);
    assert!(again.ok && again.stderr.contains("0.0 MiB downloaded"), "{}", again.stderr);
    assert_eq!(hub.log().len(), before + 2, "only the model info is asked again (for the configs, then for the rest)");
    println!("eeane and huggingface_hub: commit {commit}, {} files, identical links and bytes", ours_files.len());

    // `eeane models` lists the HF cache's repositories with commit and size.
    let models = Command::new(env!("CARGO_BIN_EXE_eeane")).arg("models").env("HF_HOME", ours.path()).output().unwrap();
    let listed = String::from_utf8_lossy(&models.stdout);
    let line = listed.lines().find(|l| l.starts_with(MINILM)).unwrap_or_else(|| panic!("{MINILM} not listed:\n{listed}"));
    assert!(line.contains(&commit[..12]) && line.contains("MiB"), "{line}");
}

#[test]
fn the_token_goes_to_the_hub_and_never_to_storage() {
    let hub = start_hub();
    let home = tempfile::tempdir().unwrap();
    let gated = "eeane-test/gated-minilm";
    let refused = pull(home.path(), &hub.endpoint, &format!("hf:{gated}"), &[]);
    assert!(!refused.ok);
    assert!(refused.stderr.contains("is gated") && refused.stderr.contains("HF_TOKEN"), "{}", refused.stderr);
    assert!(leftovers(home.path(), gated).is_empty());

    let pulled = pull(home.path(), &hub.endpoint, &format!("hf:{gated}"), &[("HF_TOKEN", TOKEN)]);
    assert!(pulled.ok, "{}", pulled.stderr);
    assert!(!pulled.stdout.contains(TOKEN) && !pulled.stderr.contains(TOKEN), "the token was printed");
    let log = hub.log();
    let tokens = |server: &str| log.iter().filter(|r| r["server"] == server).map(|r| r["authorization"].as_bool().unwrap()).collect::<Vec<_>>();
    assert!(tokens("hub").iter().filter(|sent| **sent).count() >= 2, "the Hub got the token: {log:?}");
    let storage = tokens("storage");
    assert!(!storage.is_empty() && storage.iter().all(|sent| !sent), "the storage host got the token: {log:?}");

    // The token file huggingface_hub writes, when HF_TOKEN is unset.
    std::fs::write(home.path().join("token"), format!("{TOKEN}\n")).unwrap();
    let from_file = pull(home.path(), &hub.endpoint, &format!("hf:{gated}"), &[]);
    assert!(from_file.ok, "{}", from_file.stderr);
}

#[test]
fn each_refusal_names_its_cause_and_leaves_nothing() {
    let hub = start_hub();
    let home = tempfile::tempdir().unwrap();
    let revision = format!("hf:{MINILM}@v9");
    let with_token = [("HF_TOKEN", TOKEN)];
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 4] = [
        ("hf:eeane-test/no-such-model", &[], "not found or is private"),
        ("hf:eeane-test/no-such-model", &with_token, "repository not found"),
        (&revision, &[], "has no revision \"v9\""),
        ("hf:not-a-source", &[], "hf:ORG/NAME"),
    ];
    for (source, env, message) in cases {
        let refused = pull(home.path(), &hub.endpoint, source, env);
        assert!(!refused.ok && refused.stderr.contains(message), "{source}: {}", refused.stderr);
    }
    let unreachable = pull(home.path(), "http://127.0.0.1:9", &format!("hf:{MINILM}"), &[]);
    assert!(!unreachable.ok && unreachable.stderr.contains("cannot reach the Hugging Face Hub at http://127.0.0.1:9"), "{}", unreachable.stderr);
    assert!(files_under(&home.path().join("hub")).is_empty(), "{:?}", files_under(&home.path().join("hub")));
}

#[test]
fn an_interrupted_download_resumes_and_a_corrupt_one_is_refused() {
    let hub = start_hub();
    let home = tempfile::tempdir().unwrap();
    let weights = repos().join(MINILM).join("model.safetensors");
    let sha = sha256_hex(&weights);
    let size = std::fs::metadata(&weights).unwrap().len();

    hub.fault("truncate_once", &sha);
    let broken = pull(home.path(), &hub.endpoint, &format!("hf:{MINILM}"), &[]);
    assert!(!broken.ok && broken.stderr.contains("run it again to resume"), "{}", broken.stderr);
    let partial = repo_dir(home.path(), MINILM).join(format!("blobs/{sha}.incomplete"));
    let kept = std::fs::metadata(&partial).unwrap().len();
    assert!(kept > 0 && kept < size, "{kept} of {size}");
    assert!(!repo_dir(home.path(), MINILM).join(format!("blobs/{sha}")).exists());

    let resumed = pull(home.path(), &hub.endpoint, &format!("hf:{MINILM}"), &[]);
    assert!(resumed.ok, "{}", resumed.stderr);
    let range = format!("bytes={kept}-");
    assert!(hub.log().iter().any(|r| r["server"] == "storage" && r["range"] == range.as_str()), "no Range {range} request: {:?}", hub.log());
    let snapshot = the_snapshot(home.path(), MINILM);
    assert_eq!(sha256_hex(&snapshot.join("model.safetensors")), sha);
    assert!(!partial.exists());
    println!("resumed from {kept} of {size} bytes");

    // The disk fills during the weights (a 4 MiB file-size limit stands in
    // for a full disk: the write fails the same way): said so, nothing kept.
    let full = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("ulimit -f 4096; exec '{}' pull --download-only hf:{MINILM}", env!("CARGO_BIN_EXE_eeane")))
        .env("HF_HOME", full.path())
        .env("HF_ENDPOINT", &hub.endpoint)
        .env_remove("HF_TOKEN")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("the disk is full") && said.contains("nothing of it is kept"), "{said}");
    assert!(!leftovers(full.path(), MINILM).iter().any(|b| b.starts_with(&sha)), "{:?}", leftovers(full.path(), MINILM));

    // One flipped byte: refused, nothing kept.
    let fresh = tempfile::tempdir().unwrap();
    hub.fault("corrupt", &sha);
    let refused = pull(fresh.path(), &hub.endpoint, &format!("hf:{MINILM}"), &[]);
    assert!(!refused.ok && refused.stderr.contains("nothing kept"), "{}", refused.stderr);
    let blobs = leftovers(fresh.path(), MINILM);
    assert!(!blobs.iter().any(|b| b.starts_with(&sha)), "{blobs:?}");
    let link = repo_dir(fresh.path(), MINILM).join("snapshots");
    assert!(!files_under(&link).iter().any(|f| f.ends_with("model.safetensors")));
}

#[test]
fn offline_a_model_huggingface_hub_fetched_is_used_as_it_is() {
    let home = tempfile::tempdir().unwrap();
    let repo = "eeane-test/minilm-offline";
    unprepared("hf--eeane-test--minilm-offline");
    let snapshot = {
        let hub = start_hub();
        let code = format!("from huggingface_hub import snapshot_download\nprint(snapshot_download({repo:?}))");
        let out = Command::new(python())
            .args(["-c", &code])
            .env("HF_HOME", home.path())
            .env("HF_ENDPOINT", &hub.endpoint)
            .env("HF_HUB_DISABLE_TELEMETRY", "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
        // The look-alike stops here.
    };
    let offline = pull(home.path(), "http://127.0.0.1:9", &format!("hf:{repo}"), &[("HF_HUB_OFFLINE", "1")]);
    assert!(offline.ok, "{}", offline.stderr);
    assert!(offline.stdout.contains(&snapshot), "{} vs {snapshot}", offline.stdout);
    let missing = pull(home.path(), "http://127.0.0.1:9", "hf:eeane-test/minilm-cls-raw", &[("HF_HUB_OFFLINE", "1")]);
    assert!(!missing.ok && missing.stderr.contains("not in the HF cache") && missing.stderr.contains("HF_HUB_OFFLINE"), "{}", missing.stderr);

    // Served from that cache with no Hub at all: read, prepared at the first request, answered.
    let config = format!("[[models]]\nid = \"offline\"\nsource = \"hf:{repo}\"\n");
    let env = [("HF_HOME", home.path().to_str().unwrap()), ("HF_ENDPOINT", "http://127.0.0.1:9"), ("HF_HUB_OFFLINE", "1")];
    let server = common::Server::start(Some(&config), &env);
    let texts = common::fixture_texts();
    let (status, response) = server.post("/v1/embeddings", &serde_json::json!({"model": "offline", "input": texts}));
    assert_eq!(status, 200, "{response}");
    let served = common::vectors(&response);
    let reference = reference(Path::new(&snapshot), &serde_json::json!({"texts": texts, "max_tokens": 256}));
    let worst = served.iter().zip(reference["vectors"].as_array().unwrap()).map(|(v, r)| common::cosine(v, &common::f64s(r))).fold(1.0f64, f64::min);
    println!("served offline from huggingface_hub's cache: min cosine to the reference {worst:.8}");
    assert!(worst >= 0.9999, "{worst}");
}

/// Each pulled model, served from the entry `eeane pull` printed, against the
/// reference on the repository's own files (tests/hub/reference.py).
#[test]
fn pulled_models_serve_what_the_repository_declares() {
    let hub = start_hub();
    let home = tempfile::tempdir().unwrap();
    let repos = [
        MINILM,
        "eeane-test/minilm-cls-raw",
        "eeane-test/minilm-onnx-only",
        "eeane-test/minilm-max",
        "eeane-test/minilm-onnx-external-data",
        "eeane-test/minilm-roberta",
        "eeane-test/minilm-distilbert",
    ];
    let mut config = String::from("[server]\nport = 0\n\n");
    for repo in repos {
        let pulled = pull_with(&[], home.path(), &hub.endpoint, &format!("hf:{repo}"), &[]);
        assert!(pulled.ok, "{repo}: {}", pulled.stderr);
        config += &pulled.stdout;
        config += "\n";
    }
    assert!(
        config.contains("pooling = \"cls\"  # 1_Pooling/config.json") && config.contains("normalize = false  # modules.json (no Normalize module)"),
        "{config}"
    );
    let refused = pull_with(&[], home.path(), &hub.endpoint, "hf:eeane-test/unsupported-arch", &[]);
    assert!(!refused.ok && refused.stderr.contains("GPTNeoXForCausalLM") && refused.stderr.contains("optimum-cli export onnx"), "{}", refused.stderr);
    assert!(
        !files_under(&repo_dir(home.path(), "eeane-test/unsupported-arch")).iter().any(|f| f.ends_with("safetensors")),
        "weights fetched for a refused model"
    );

    // The manifest records the commit and what was read from which file.
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(common::cache_dir().join("models/hf--eeane-test--minilm-cls-raw/manifest.json")).unwrap()).unwrap();
    assert!(manifest["source"]["hub"].as_str().unwrap().starts_with("hf:eeane-test/minilm-cls-raw@"), "{manifest}");
    assert_eq!(manifest["source"]["inferred"]["pooling"], serde_json::json!({"value": "cls", "from": "1_Pooling/config.json"}), "{manifest}");
    // The same prepared graph on OpenVINO (it reads ONNX itself).
    config += &format!("[[models]]\nid = \"openvino\"\nsource = \"hf:{MINILM}\"\nengine = \"openvino\"\ndevice = \"CPU\"\n");
    let server = common::Server::start(Some(&config), &[("HF_HOME", home.path().to_str().unwrap()), ("HF_ENDPOINT", hub.endpoint.as_str())]);
    let texts = common::fixture_texts();
    let mut vectors = Vec::new();
    for (model, repo) in repos.iter().map(|r| (*r, *r)).chain([("openvino", MINILM)]) {
        let (status, response) = server.post("/v1/embeddings", &serde_json::json!({"model": model, "input": texts}));
        assert_eq!(status, 200, "{model}: {response}");
        let served = common::vectors(&response);
        let snapshot = the_snapshot(home.path(), repo);
        let reference = reference(&snapshot, &serde_json::json!({"texts": texts, "max_tokens": 256}));
        let mut worst = 1.0f64;
        for (v, r) in served.iter().zip(reference["vectors"].as_array().unwrap()) {
            let r = common::f64s(r);
            worst = worst.min(common::cosine(v, &r));
            let norm: f64 = v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
            let ref_norm: f64 = r.iter().map(|x| x * x).sum::<f64>().sqrt();
            assert!((norm - ref_norm).abs() / ref_norm < 1e-3, "{repo}: norm {norm} vs the reference's {ref_norm}");
        }
        println!("{model}: {} texts, min cosine to the reference {worst:.8}", served.len());
        assert!(worst >= 0.9999, "{model}: min cosine {worst}");
        vectors.push(served);
    }
    // MiniLM's weights as a RobertaModel and a DistilBertModel compute MiniLM's own vectors.
    for (i, repo) in repos.iter().enumerate().skip(5) {
        let same = vectors[i].iter().zip(&vectors[0]).map(|(a, b)| common::cosine(a, &common::as_f64(b))).fold(1.0f64, f64::min);
        assert!(same > 0.99999, "{repo}: min cosine to MiniLM {same}");
    }
}

/// A config serving each of `repos`, from the entries `eeane pull` prints.
fn pulled_config(hub: &LookAlike, home: &Path, repos: &[impl AsRef<str>]) -> String {
    pulled_config_with(&[], hub, home, repos)
}

fn pulled_config_with(flags: &[&str], hub: &LookAlike, home: &Path, repos: &[impl AsRef<str>]) -> String {
    let mut config = String::from("[server]\nport = 0\n\n");
    for repo in repos.iter().map(AsRef::as_ref) {
        let pulled = pull_with(flags, home, &hub.endpoint, &format!("hf:{repo}"), &[]);
        assert!(pulled.ok, "{repo}: {}", pulled.stderr);
        config += &pulled.stdout;
        config += "\n";
    }
    config
}

/// Decoder embedders and encoders built from safetensors (tests/hub/fixtures:
/// tiny random Qwen3 (also with its weights in bfloat16 on disk), Qwen2,
/// Mistral, Llama, Gemma, Gemma2, Gemma3, MPNet and ModernBERT written by
/// transformers,
/// their vectors by sentence-transformers itself):
/// last-token pooling with the end-of-text token the tokenizer appends;
/// Gemma3 shaped as EmbeddingGemma (bidirectional, a sliding-window layer,
/// mean pooling, two Dense modules); ModernBERT's global and local layers;
/// MPNet's relative position buckets; the query prompt. One text a request,
/// one padded batch of mixed lengths, and with the prompt, each against
/// sentence-transformers' own vectors, on ONNX Runtime and OpenVINO.
///
/// Pulled for a CUDA device, as a GPU user would: each family's GPU graph
/// (models/gpu_graph.py: fused attention, fp16, pooled inside) is made
/// beside its fp32 graph, and served here by ONNX Runtime on the CPU (no
/// GPU in CI) held to the same vectors: fusion, fp16 and the pooling inside
/// all checked on a real engine over HTTP.
#[test]
fn families_built_from_safetensors_serve_sentence_transformers_vectors() {
    let hub = start_hub();
    let home = tempfile::tempdir().unwrap();
    let families = [
        "qwen3-tiny",
        "qwen3-bf16-tiny",
        "qwen2-tiny",
        "mistral-tiny",
        "llama-tiny",
        "gemma-tiny",
        "gemma2-tiny",
        "gemma3-tiny",
        "mpnet-tiny",
        "modernbert-tiny",
    ];
    let config = pulled_config_with(&["--device", "cuda:H200"], &hub, home.path(), &families.map(|f| format!("eeane-test/{f}")));
    // The entries printed for the GPU measure its graph there; CI has no GPU,
    // so they are served on the CPU (their fp32 graph) below.
    assert_eq!(config.matches("device = \"cuda:H200\"\nprecision = \"auto\"").count(), families.len(), "{config}");
    let mut config = on_the_cpu(&config);
    for family in families {
        let prepared = common::cache_dir().join("models").join(format!("hf--eeane-test--{family}"));
        let manifest: Value = serde_json::from_slice(&std::fs::read(prepared.join("manifest.json")).unwrap()).unwrap();
        let gpu = &manifest["checks"]["cuda_fp16"];
        println!(
            "{family}: GPU graph {}, attention {}, fp16 on the CPU vs numpy {}",
            gpu["graph"], gpu["attention"], gpu["fp16_min_cosine_vs_numpy_float64_on_cpu"]
        );
        assert_eq!(gpu["graph"], "model.fp16.onnx", "{family}: {gpu}");
        let fused = gpu["attention"].as_str().unwrap();
        assert!(fused.contains("Attention") || (family == "mpnet-tiny" && fused.starts_with("unfused")), "{family}: {gpu}");
        // The CPU's form of the GPU graph: eeane's CUDA operator written back.
        let cpu_dir = home.path().join(format!("{family}-gpu-graph"));
        std::fs::create_dir_all(&cpu_dir).unwrap();
        let (graph, written_back) = common::gpu_graph_for_the_cpu(&prepared.join("model.fp16.onnx"), &cpu_dir);
        let fused = gpu["gemm_fast_gelu"].as_u64().unwrap_or(0) + gpu["gemm_bias"].as_u64().unwrap_or(0);
        assert_eq!(written_back as u64, fused, "{family}: {gpu}");
        config +=
            &format!("[[models]]\nid = \"{family}-gpu-graph\"\nsource = \"hf:eeane-test/{family}\"\nmodel = \"{}\"\npooling = \"none\"\n", graph.display());
    }
    // Seven decoders pool by their last token; the encoders by the mean, and
    // Gemma3 by the mean inside its graph, before its Dense modules.
    assert_eq!(config.matches("pooling = \"last_token\"").count(), 7, "{config}");
    assert!(config.contains("pooling = \"none\"  # 1_Pooling/config.json (mean) and 2_Dense, 3_Dense"), "{config}");
    for (repo, architecture) in
        [("qwen3-tiny", "Qwen3Model"), ("gemma3-tiny", "Gemma3TextModel"), ("mpnet-tiny", "MPNetModel"), ("modernbert-tiny", "ModernBertModel")]
    {
        let refused = pull_with(&["--engine", "ncnn"], home.path(), &hub.endpoint, &format!("hf:eeane-test/{repo}"), &[]);
        assert!(!refused.ok && refused.stderr.contains(architecture), "{}", refused.stderr);
    }
    // Each family on OpenVINO as well, from the same prepared graph.
    for family in families {
        config += &format!("[[models]]\nid = \"{family}-openvino\"\nsource = \"hf:eeane-test/{family}\"\nengine = \"openvino\"\ndevice = \"CPU\"\n");
    }
    // precision = "auto" on a Hub decoder: the variants this CPU offers, gated against its fp32 graph.
    config += "[[models]]\nid = \"qwen3-auto\"\nsource = \"hf:eeane-test/qwen3-tiny\"\nprecision = \"auto\"\n";
    forget_kept_survey("hf--eeane-test--qwen3-tiny", "qwen3-auto");
    let server = common::Server::start(Some(&config), &[("HF_HOME", home.path().to_str().unwrap()), ("HF_ENDPOINT", hub.endpoint.as_str())]);
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hub/fixtures");
    let served = families
        .map(|f| (format!("eeane-test/{f}"), f))
        .into_iter()
        .chain(families.map(|f| (format!("{f}-openvino"), f)))
        .chain(families.map(|f| (format!("{f}-gpu-graph"), f)));
    for (model, fixture) in served {
        let model = model.as_str();
        let reference: Value = serde_json::from_slice(&std::fs::read(fixtures.join(fixture).join("reference.json")).unwrap()).unwrap();
        let texts = reference["texts"].as_array().unwrap();
        let embed = |body: Value| {
            let (status, response) = server.post("/v1/embeddings", &body);
            assert_eq!(status, 200, "{model}: {response}");
            common::vectors(&response)
        };
        let worst =
            |got: &[Vec<f32>], want: &Value| got.iter().zip(want.as_array().unwrap()).map(|(v, r)| common::cosine(v, &common::f64s(r))).fold(1.0f64, f64::min);
        let one: Vec<Vec<f32>> = texts.iter().flat_map(|t| embed(serde_json::json!({"model": model, "input": [t]}))).collect();
        let batch = embed(serde_json::json!({"model": model, "input": texts}));
        let query = embed(serde_json::json!({"model": model, "input": texts, "prompt_name": "query"}));
        let batch_vs_one = batch.iter().zip(&one).map(|(a, b)| common::cosine(a, &common::as_f64(b))).fold(1.0f64, f64::min);
        let figures = [
            ("one text a request vs sentence-transformers", worst(&one, &reference["vectors"])),
            ("one padded batch vs sentence-transformers' batch", worst(&batch, &reference["batch"])),
            ("the query prompt vs sentence-transformers'", worst(&query, &reference["query"])),
            ("one padded batch vs one text a request", batch_vs_one),
        ];
        for (what, cosine) in figures {
            println!("{model}: {what}, {} texts: min cosine {cosine:.8}", texts.len());
            assert!(cosine >= 0.9999, "{model}: {what}: min cosine {cosine}");
        }
    }
    let reference: Value = serde_json::from_slice(&std::fs::read(fixtures.join("qwen3-tiny/reference.json")).unwrap()).unwrap();
    surveyed_auto_entry(&server, "qwen3-auto", reference["texts"].as_array().unwrap(), reference["batch"].as_array().unwrap());
}

/// A survey kept in a prepared model's manifest by an earlier run would be
/// read instead of run: the test's run starts from none.
fn forget_kept_survey(prepared: &str, id: &str) {
    let manifest_path = common::cache_dir().join("models").join(prepared).join("manifest.json");
    // Not prepared yet (fetched at first load): no survey is kept.
    let Ok(bytes) = std::fs::read(&manifest_path) else { return };
    let mut manifest: Value = serde_json::from_slice(&bytes).unwrap();
    if let Some(kept) = manifest.get_mut("variants").and_then(Value::as_object_mut) {
        kept.remove(id);
    }
    std::fs::write(&manifest_path, serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
}

/// An auto entry: served at once by its fp32 reference, then by the variant
/// its survey chose within cosine 0.9999, both held to the reference
/// vectors. Returns the variant chosen.
fn surveyed_auto_entry(server: &common::Server, model: &str, texts: &[Value], want: &[Value]) -> String {
    let cosine_to_reference = || {
        let (status, response) = server.post("/v1/embeddings", &serde_json::json!({"model": model, "input": texts}));
        assert_eq!(status, 200, "{model}: {response}");
        common::vectors(&response).iter().zip(want).map(|(v, r)| common::cosine(v, &common::f64s(r))).fold(1.0f64, f64::min)
    };
    let first = cosine_to_reference();
    let mut health = server.model_health(model);
    for _ in 0..1200 {
        if health["survey"]["state"] != "running" {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
        health = server.model_health(model);
    }
    assert_eq!(health["survey"]["state"], "done", "{health}");
    let after = cosine_to_reference();
    let variant = &server.model_health(model)["variant"];
    println!("{model}: fp32 reference first, min cosine {first:.8}; then {}, min cosine {after:.8}: {}", variant["chosen"], variant["reason"]);
    assert!(first >= 0.9999 && after >= 0.9999, "{first} {after}");
    assert!(health["survey"]["variants"].as_u64().unwrap() >= 2, "{health}");
    variant["chosen"].as_str().unwrap_or_default().to_string()
}

/// Repositories whose tokenizer is only vocabulary files (tests/hub/fixtures,
/// made by make_vocab_fixtures.py): microsoft/unixcoder-base's shape (a
/// RoBERTa with only pytorch_model.bin, vocab.json + merges.txt and no
/// modules.json, so mean pooling without normalizing, as
/// sentence-transformers does), served on ONNX Runtime, OpenVINO and ncnn;
/// BERT's vocab.txt with do_lower_case; XLM-R's sentencepiece.bpe.model.
/// Over HTTP: /tokenize gives transformers' own ids, and the vectors are
/// sentence-transformers'.
#[test]
fn repositories_with_vocabulary_files_only_tokenize_as_transformers() {
    let hub = start_hub();
    let home = tempfile::tempdir().unwrap();
    let fixtures = ["roberta-vocab-tiny", "bert-vocab-tiny", "xlmr-spm-tiny"];
    let mut config = pulled_config(&hub, home.path(), &fixtures.map(|f| format!("eeane-test/{f}")));
    assert_eq!(config.matches("pooling = \"mean\"").count(), 3, "{config}");
    config += "[[models]]\nid = \"unixcoder-shaped-openvino\"\nsource = \"hf:eeane-test/roberta-vocab-tiny\"\nengine = \"openvino\"\ndevice = \"CPU\"\n";
    let _ = std::fs::remove_dir_all(common::cache_dir().join("models/hf--eeane-test--roberta-vocab-tiny--ncnn"));
    let ncnn = pull_with(&["--engine", "ncnn"], home.path(), &hub.endpoint, "hf:eeane-test/roberta-vocab-tiny", &[]);
    assert!(ncnn.ok, "{}", ncnn.stderr);
    config += &ncnn.stdout.replace("id = \"eeane-test/roberta-vocab-tiny\"", "id = \"unixcoder-shaped-ncnn\"");
    let server = common::Server::start(Some(&config), &[("HF_HOME", home.path().to_str().unwrap()), ("HF_ENDPOINT", hub.endpoint.as_str())]);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hub/fixtures");
    let served = fixtures
        .map(|f| (format!("eeane-test/{f}"), f))
        .into_iter()
        .chain([("unixcoder-shaped-openvino".to_string(), "roberta-vocab-tiny"), ("unixcoder-shaped-ncnn".to_string(), "roberta-vocab-tiny")]);
    for (model, fixture) in served {
        let reference: Value = serde_json::from_slice(&std::fs::read(dir.join(fixture).join("reference.json")).unwrap()).unwrap();
        let texts = reference["texts"].as_array().unwrap();
        let (status, tokens) = server.post("/tokenize", &serde_json::json!({"model": model, "inputs": texts}));
        assert_eq!(status, 200, "{model}: {tokens}");
        let mut compared = 0;
        for ((text, served), want) in texts.iter().zip(tokens.as_array().unwrap()).zip(reference["ids"].as_array().unwrap()) {
            let served: Vec<u64> = served.as_array().unwrap().iter().map(|t| t["id"].as_u64().unwrap()).collect();
            let want: Vec<u64> = want.as_array().unwrap().iter().map(|i| i.as_u64().unwrap()).collect();
            // transformers' ids were cut at 128 tokens; compare what both hold whole.
            if want.len() < 128 {
                assert_eq!(served, want, "{model}: {text}");
                compared += 1;
            }
        }
        assert!(compared + 1 >= texts.len(), "{model}: {compared} of {} texts compared", texts.len());
        let (status, response) = server.post("/v1/embeddings", &serde_json::json!({"model": model, "input": texts}));
        assert_eq!(status, 200, "{model}: {response}");
        let worst = common::vectors(&response)
            .iter()
            .zip(reference["batch"].as_array().unwrap())
            .map(|(v, r)| common::cosine(v, &common::f64s(r)))
            .fold(1.0f64, f64::min);
        println!("{model}: ids equal transformers' on {compared} texts; vectors vs sentence-transformers, {} texts: min cosine {worst:.8}", texts.len());
        assert!(worst >= 0.9999, "{model}: min cosine {worst}");
    }
}

/// Rerankers that are language models, laid out as Qwen/Qwen3-Reranker-0.6B
/// (tests/hub/fixtures/qwen3-reranker-tiny: a tiny random Qwen3ForCausalLM
/// with tied embeddings and no sentence-transformers files) and as
/// BAAI/bge-reranker-v2-gemma (bge-gemma-reranker-tiny: a GemmaForCausalLM
/// with one key/value head). Served on /v1/rerank and TEI's /rerank, in one
/// batch of mixed lengths, their scores equal their model cards' own code
/// (transformers, left-padded): p("yes") within 1e-4, with the default
/// instruction and with one from the request; for the Gemma one, also with a
/// document longer than the card's max_length and a query longer than its
/// query cap, both cut as the card cuts them.
#[test]
fn language_model_rerankers_score_as_their_model_card() {
    let hub = start_hub();
    let home = tempfile::tempdir().unwrap();
    let models = ["eeane-test/qwen3-reranker-tiny", "eeane-test/bge-gemma-reranker-tiny"];
    let config = pulled_config(&hub, home.path(), &models);
    assert_eq!(config.matches("kind = \"reranker\"").count(), 2, "{config}");
    assert!(config.contains("query_tokens = 768, pair_tokens = 1024 }"), "bge-reranker-v2-gemma's cuts: {config}");
    let server = common::Server::start(Some(&config), &[("HF_HOME", home.path().to_str().unwrap()), ("HF_ENDPOINT", hub.endpoint.as_str())]);
    for model in models {
        let fixture = model.trim_start_matches("eeane-test/");
        let reference: Value =
            serde_json::from_slice(&std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/hub/fixtures/{fixture}/reference.json"))).unwrap())
                .unwrap();
        let documents = &reference["documents"];
        let worst = |served: &[(usize, f64)], want: &Value| {
            let want = common::f64s(want);
            assert_eq!(served.len(), want.len());
            served.iter().map(|(index, score)| (score - want[*index]).abs()).fold(0.0f64, f64::max)
        };
        let cohere = |query: &Value, extra: Value| {
            let mut body = serde_json::json!({"model": model, "query": query, "documents": documents});
            body.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
            let (status, response) = server.post("/v1/rerank", &body);
            assert_eq!(status, 200, "{response}");
            response["results"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| (r["index"].as_u64().unwrap() as usize, r["relevance_score"].as_f64().unwrap()))
                .collect::<Vec<_>>()
        };
        let query = &reference["query"];
        let (status, tei) = server.post("/rerank", &serde_json::json!({"model": model, "query": query, "texts": documents}));
        assert_eq!(status, 200, "{tei}");
        let tei: Vec<(usize, f64)> = tei.as_array().unwrap().iter().map(|r| (r["index"].as_u64().unwrap() as usize, r["score"].as_f64().unwrap())).collect();
        let mut figures = vec![
            ("/v1/rerank, the default instruction", worst(&cohere(query, Value::Null), &reference["scores"])),
            ("TEI's /rerank, the default instruction", worst(&tei, &reference["scores"])),
            (
                "/v1/rerank, the request's instruction",
                worst(&cohere(query, serde_json::json!({"instruction": reference["instruction"]})), &reference["scores_with_instruction"]),
            ),
        ];
        if !reference["long_query"].is_null() {
            figures.push(("/v1/rerank, a query past the card's cap", worst(&cohere(&reference["long_query"], Value::Null), &reference["scores_long_query"])));
        }
        for (what, diff) in figures {
            println!("{model}: {what}, {} documents: max |score - the model card's| {diff:.2e}", documents.as_array().unwrap().len());
            assert!(diff <= 1e-4, "{model}: {what}: {diff}");
        }
        // The instruction changes the scores: the test above can tell them apart.
        let moved =
            common::f64s(&reference["scores"]).iter().zip(common::f64s(&reference["scores_with_instruction"])).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(moved > 1e-3, "{model}: {moved}");
    }
}

/// A Dense module after pooling (tests/hub/make_repos.py: 384 -> 128, tanh,
/// then Normalize), from safetensors and from the repository's own ONNX,
/// applied inside the prepared graph on ONNX Runtime and OpenVINO; a
/// CamemBERT built as RoBERTa. Each against the reference on the
/// repository's own files, which applies the Dense module itself. Pulled
/// for a CUDA device: the BERT family's GPU graph (the optimizer's fused
/// Attention, fp16, pooling and the Dense module inside) held to the same
/// reference on the CPU; the repository's own ONNX gets none, and says why.
#[test]
fn dense_modules_and_camembert_serve_what_the_repository_declares() {
    let hub = start_hub();
    let home = tempfile::tempdir().unwrap();
    let repos = ["eeane-test/minilm-dense", "eeane-test/minilm-dense-onnx-only", "eeane-test/minilm-camembert"];
    let pulled = pulled_config_with(&["--device", "cuda:H200"], &hub, home.path(), &repos);
    let mut config = on_the_cpu(&pulled);
    let mut gpu_graphs = Vec::new();
    for repo in repos {
        let prepared = common::cache_dir().join("models").join(format!("hf--{}", repo.replace('/', "--")));
        let manifest: Value = serde_json::from_slice(&std::fs::read(prepared.join("manifest.json")).unwrap()).unwrap();
        let gpu = &manifest["checks"]["cuda_fp16"];
        println!("{repo}: GPU graph {gpu}");
        if repo.ends_with("onnx-only") {
            assert!(gpu["graph"].is_null() && gpu["why"].as_str().unwrap().contains("own ONNX"), "{repo}: {gpu}");
            continue;
        }
        assert_eq!(gpu["graph"], "model.fp16.onnx", "{repo}: {gpu}");
        assert!(gpu["attention"].as_str().unwrap().starts_with("Attention"), "{repo}: {gpu}");
        let id = format!("{}-gpu-graph", repo.trim_start_matches("eeane-test/"));
        // The CPU's form of the GPU graph: each feed-forward's matmul with its
        // GELU in cuBLASLt's epilogue, written back as MatMul + FastGelu.
        let cpu_dir = home.path().join(&id);
        std::fs::create_dir_all(&cpu_dir).unwrap();
        let (graph, written_back) = common::gpu_graph_for_the_cpu(&prepared.join("model.fp16.onnx"), &cpu_dir);
        // Attention's Q, K and V apart, their bias in the epilogue (GemmBias,
        // written back as MatMul + Add), three a layer.
        let layers = gpu["gemm_fast_gelu"].as_u64().unwrap();
        assert!(layers > 0 && gpu["gemm_bias"].as_u64() == Some(3 * layers), "{repo}: {gpu}");
        assert_eq!(written_back as u64, 4 * layers, "{repo}: {gpu}");
        config += &format!("[[models]]\nid = \"{id}\"\nsource = \"hf:{repo}\"\nmodel = \"{}\"\npooling = \"none\"\n", graph.display());
        gpu_graphs.push((id, repo));
    }
    assert!(config.contains("pooling = \"none\"  # 1_Pooling/config.json (mean) and 2_Dense"), "{config}");
    // ncnn's converted graph does not carry Dense modules: refused before the weights come.
    let refused = pull_with(&["--engine", "ncnn"], home.path(), &hub.endpoint, "hf:eeane-test/minilm-dense", &[]);
    assert!(!refused.ok && refused.stderr.contains("Dense"), "{}", refused.stderr);
    config += "[[models]]\nid = \"dense-openvino\"\nsource = \"hf:eeane-test/minilm-dense\"\nengine = \"openvino\"\ndevice = \"CPU\"\n";
    // precision = "auto" on a Hub model with real weights (MiniLM's) and a
    // Dense module: a reduced variant where this CPU has one within the gate.
    config += "[[models]]\nid = \"dense-auto\"\nsource = \"hf:eeane-test/minilm-dense\"\nprecision = \"auto\"\n";
    forget_kept_survey("hf--eeane-test--minilm-dense", "dense-auto");
    config += "[[models]]\nid = \"minilm-auto\"\nsource = \"hf:sentence-transformers/all-MiniLM-L6-v2\"\nprecision = \"auto\"\n";
    forget_kept_survey("hf--sentence-transformers--all-MiniLM-L6-v2", "minilm-auto");
    let server = common::Server::start(Some(&config), &[("HF_HOME", home.path().to_str().unwrap()), ("HF_ENDPOINT", hub.endpoint.as_str())]);
    let texts = common::fixture_texts();
    let width = |repo: &str| if repo.contains("dense") { 128 } else { 384 };
    let served = repos.iter().map(|r| (*r, *r)).chain([("dense-openvino", repos[0])]).chain(gpu_graphs.iter().map(|(id, repo)| (id.as_str(), *repo)));
    for (model, repo) in served {
        let width = width(repo);
        let (status, response) = server.post("/v1/embeddings", &serde_json::json!({"model": model, "input": texts}));
        assert_eq!(status, 200, "{model}: {response}");
        let served = common::vectors(&response);
        assert!(served.iter().all(|v| v.len() == width), "{model}: {} dimensions, not {width}", served[0].len());
        let reference = reference(&the_snapshot(home.path(), repo), &serde_json::json!({"texts": texts, "max_tokens": 256}));
        let worst = served.iter().zip(reference["vectors"].as_array().unwrap()).map(|(v, r)| common::cosine(v, &common::f64s(r))).fold(1.0f64, f64::min);
        println!("{model}: {} texts of {width} dimensions, min cosine to the reference {worst:.8}", served.len());
        assert!(worst >= 0.9999, "{model}: min cosine {worst}");
    }
    let dense = reference(&the_snapshot(home.path(), repos[0]), &serde_json::json!({"texts": texts, "max_tokens": 256}));
    let chosen =
        surveyed_auto_entry(&server, "dense-auto", &texts.iter().map(|t| Value::from(t.as_str())).collect::<Vec<_>>(), dense["vectors"].as_array().unwrap());
    let minilm: Vec<Value> = common::reference(&texts, 256).vectors.into_iter().map(Value::from).collect();
    surveyed_auto_entry(&server, "minilm-auto", &texts.iter().map(|t| Value::from(t.as_str())).collect::<Vec<_>>(), &minilm);
    // A CPU with bf16 (as variants::Machine reads /proc/cpuinfo) has OpenVINO bf16 measured.
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    if cpuinfo.split_whitespace().any(|f| f == "avx512_bf16" || f == "amx_bf16") {
        let reason = server.model_health("dense-auto")["variant"]["reason"].to_string();
        assert!(chosen.contains("bf16") || reason.contains("bf16"), "{chosen}: {reason}");
    }
}

/// `source = "hf:..."` entries: read from the repository unless the entry
/// says otherwise (check-config names each value's file), fetched and
/// prepared at the first request, a gated one failing alone; with
/// hub_downloads = false nothing is fetched and the model says so.
#[test]
fn source_entries_are_read_fetched_at_first_load_and_overridable() {
    let hub = start_hub();
    let home = tempfile::tempdir().unwrap();
    let first = "eeane-test/minilm-at-first-load";
    unprepared("hf--eeane-test--minilm-at-first-load");
    let config = format!(
        "[[models]]\nid = \"first\"\nsource = \"hf:{first}\"\n\n\
         [[models]]\nid = \"mean-as-cls\"\nsource = \"hf:{MINILM}\"\npooling = \"cls\"\n\n\
         [[models]]\nid = \"gated\"\nsource = \"hf:eeane-test/gated-minilm\"\n\n{}",
        common::model_entry("local", "all-minilm-l6-v2", "")
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("eeane.toml");
    std::fs::write(&file, &config).unwrap();
    let env = [("HF_HOME", home.path().to_str().unwrap()), ("HF_ENDPOINT", hub.endpoint.as_str()), ("NO_COLOR", "1")];

    let check = Command::new(env!("CARGO_BIN_EXE_eeane")).arg("--config").arg(&file).arg("check-config").envs(env).env_remove("HF_TOKEN").output().unwrap();
    let said = String::from_utf8_lossy(&check.stderr);
    for line in [
        "models \"first\": pooling = \"cls\"  (from 1_Pooling/config.json)",
        "models \"first\": normalize = false  (from modules.json (no Normalize module))",
        "models \"first\": max_tokens = 256  (from sentence_bert_config.json (max_seq_length))",
        "models \"mean-as-cls\": normalize = true  (from modules.json (a Normalize module))",
        "models \"gated\": hf:eeane-test/gated-minilm: eeane-test/gated-minilm is gated",
    ] {
        assert!(said.contains(line), "check-config does not say {line:?}:\n{said}");
    }
    assert!(!said.contains("models \"mean-as-cls\": pooling"), "the entry's own pooling is not inferred:\n{said}");
    assert!(!files_under(&repo_dir(home.path(), first)).iter().any(|f| f.ends_with(".safetensors")), "weights fetched before the first load");

    let server = common::Server::start(Some(&config), &env);
    let texts = common::fixture_texts();
    let embed = |model: &str| {
        let (status, response) = server.post("/v1/embeddings", &serde_json::json!({"model": model, "input": texts}));
        (status, response)
    };
    let (status, response) = embed("first");
    assert_eq!(status, 200, "{response}");
    let served = common::vectors(&response);
    assert!(server.stderr().contains("fetching and preparing a Hub model") && server.stderr().contains("downloading"), "{}", server.stderr());
    // CLS without Normalize, as the repository declares: raw vectors.
    let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    assert!(served.iter().all(|v| (norm(v) - 1.0).abs() > 0.01), "vectors were normalized");
    // The override: the mean model's weights, CLS-pooled, normalized (its Normalize module).
    let (status, response) = embed("mean-as-cls");
    assert_eq!(status, 200, "{response}");
    for (overridden, raw) in common::vectors(&response).iter().zip(&served) {
        let cos = common::cosine(overridden, &common::as_f64(raw));
        assert!(cos > 0.99999 && (norm(overridden) - 1.0).abs() < 1e-4, "cosine {cos}, norm {}", norm(overridden));
    }
    let (status, response) = embed("gated");
    assert_eq!(status, 503, "{response}");
    assert!(response["error"]["message"].as_str().unwrap().contains("HF_TOKEN"), "{response}");
    assert_eq!(embed("local").0, 200, "the other models serve");

    // hub_downloads = false, an empty HF cache: nothing is fetched, the model says why, the rest serve.
    let offline_home = tempfile::tempdir().unwrap();
    let offline_config = format!("[server]\nhub_downloads = false\n\n{config}");
    let offline_env = [("HF_HOME", offline_home.path().to_str().unwrap()), ("HF_ENDPOINT", hub.endpoint.as_str())];
    let before = hub.log().len();
    let offline = common::Server::start(Some(&offline_config), &offline_env);
    let (status, response) = offline.post("/v1/embeddings", &serde_json::json!({"model": "first", "input": "x"}));
    assert_eq!(status, 503, "{response}");
    assert!(response["error"]["message"].as_str().unwrap().contains("hub_downloads = false"), "{response}");
    assert_eq!(offline.post("/v1/embeddings", &serde_json::json!({"model": "local", "input": "x"})).0, 200);
    assert_eq!(hub.log().len(), before, "the Hub was asked despite hub_downloads = false");

    // `eeane pull --config FILE`: everything it can, and the reason for the rest.
    let pulled = Command::new(env!("CARGO_BIN_EXE_eeane")).arg("pull").arg("--config").arg(&file).envs(env).env_remove("HF_TOKEN").output().unwrap();
    let said = String::from_utf8_lossy(&pulled.stderr);
    assert!(!pulled.status.success(), "{said}");
    assert!(
        said.contains("first: hf:eeane-test/minilm-at-first-load ready")
            && said.contains("mean-as-cls: hf:")
            && said.contains("gated: eeane-test/gated-minilm is gated"),
        "{said}"
    );
}

/// Prompts from config_sentence_transformers.json (or the entry): a request's
/// prompt_name puts one before each text, the default applies without one,
/// and usage counts its tokens.
#[test]
fn prompts_are_read_applied_and_counted() {
    let hub = start_hub();
    let home = tempfile::tempdir().unwrap();
    let config = format!(
        "[[models]]\nid = \"prompts\"\nsource = \"hf:eeane-test/minilm-prompts\"\n\n{}\n{}",
        common::model_entry("local", "all-minilm-l6-v2", ""),
        common::model_entry("toml-prompts", "all-minilm-l6-v2", "prompts = { q = \"q: \" }")
    );
    let server = common::Server::start(Some(&config), &[("HF_HOME", home.path().to_str().unwrap()), ("HF_ENDPOINT", hub.endpoint.as_str())]);
    let embed = |model: &str, input: &str, prompt: Option<&str>| {
        let mut body = serde_json::json!({"model": model, "input": [input]});
        if let Some(p) = prompt {
            body["prompt_name"] = p.into();
        }
        let (status, response) = server.post("/v1/embeddings", &body);
        assert_eq!(status, 200, "{model} {input:?} {prompt:?}: {response}");
        (common::vectors(&response).remove(0), response["usage"]["prompt_tokens"].as_u64().unwrap())
    };
    let same = |(a, ta): (Vec<f32>, u64), (b, tb): (Vec<f32>, u64), what: &str| {
        let cos = common::cosine(&a, &common::as_f64(&b));
        assert!(cos > 0.99999 && ta == tb, "{what}: cosine {cos}, tokens {ta} vs {tb}");
    };
    let text = "how do I reset my password";
    same(embed("prompts", text, Some("query")), embed("local", &format!("query: {text}"), None), "prompt_name = query");
    same(embed("prompts", text, None), embed("local", &format!("passage: {text}"), None), "the default prompt");
    same(embed("toml-prompts", text, Some("q")), embed("local", &format!("q: {text}"), None), "a prompt set in TOML");
    same(embed("toml-prompts", text, None), embed("local", text, None), "no default prompt");
    let (status, response) = server.post("/v1/embeddings", &serde_json::json!({"model": "prompts", "input": "x", "prompt_name": "nope"}));
    assert_eq!(status, 400, "{response}");
    assert_eq!(response["error"]["code"], "unknown_prompt");
    assert!(response["error"]["message"].as_str().unwrap().contains("passage, query"), "{response}");
}

/// A *ForSequenceClassification with one label (BERT's pooler and
/// classifier, XLM-RoBERTa's classifier.dense and out_proj, DistilBERT's
/// pre_classifier and ReLU): read as a reranker, its graph built from
/// safetensors, its /rerank scores held to the float64 numpy reference on
/// the repository's own weights.
#[test]
fn cross_encoders_are_served_on_rerank() {
    let hub = start_hub();
    let home = tempfile::tempdir().unwrap();
    let repos = [
        ("ce", "eeane-test/minilm-cross-encoder"),
        ("xlmr-ce", "eeane-test/e5-enpt-cross-encoder"),
        ("distilbert-ce", "eeane-test/minilm-distilbert-cross-encoder"),
    ];
    let mut config = String::new();
    for (id, repo) in repos {
        unprepared(&format!("hf--{}", repo.replace('/', "--")));
        config += &format!("[[models]]\nid = \"{id}\"\nsource = \"hf:{repo}\"\nload_policy = \"resident\"\n\n");
    }
    let env = [("HF_HOME", home.path().to_str().unwrap()), ("HF_ENDPOINT", hub.endpoint.as_str())];
    let server = common::Server::start(Some(&config), &env);
    let (_, models) = server.get("/v1/models");
    assert!(models["data"].as_array().unwrap().iter().all(|m| m["kind"] == "reranker"), "{models}");
    let rows: Value = serde_json::from_str(&std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/models/rerank_pairs.json")).unwrap()).unwrap();
    for (id, repo) in repos {
        // Resident models are fetched and loaded after the server listens: a
        // request waits for this one's load, so its weights are all there
        // before the reference reads them.
        let (status, response) = server.post("/v1/rerank", &serde_json::json!({"model": id, "query": "q", "documents": ["d"]}));
        assert_eq!(status, 200, "{id}: {response}");
        let mut worst = (0.0f64, 0.0f64);
        let mut first_right = 0;
        for row in rows.as_array().unwrap().iter().take(8) {
            let query = row["query"].as_str().unwrap();
            let mut documents = vec![row["relevant"].as_str().unwrap().to_string()];
            documents.extend(row["irrelevant"].as_array().unwrap().iter().map(|d| d.as_str().unwrap().to_string()));
            let reference = reference(&the_snapshot(home.path(), repo), &serde_json::json!({"query": query, "documents": documents}));
            let logits: Vec<f64> = common::f64s(&reference["logits"]);
            for raw in [false, true] {
                let (status, response) =
                    server.post("/v1/rerank", &serde_json::json!({"model": id, "query": query, "documents": documents, "raw_scores": raw}));
                assert_eq!(status, 200, "{response}");
                let results = response["results"].as_array().unwrap();
                if !raw && results[0]["index"] == 0 {
                    first_right += 1;
                }
                for r in results {
                    let (index, score) = (r["index"].as_u64().unwrap() as usize, r["relevance_score"].as_f64().unwrap());
                    let want = if raw { logits[index] } else { 1.0 / (1.0 + (-logits[index]).exp()) };
                    let slot = if raw { &mut worst.1 } else { &mut worst.0 };
                    *slot = slot.max((score - want).abs());
                }
            }
        }
        println!(
            "{repo}: max |score - reference| {:.2e} (sigmoid), {:.2e} (raw logits); relevant ranked first on {first_right} of 8 queries",
            worst.0, worst.1
        );
        assert!(worst.0 <= 1e-4 && worst.1 <= 1e-4, "{repo}: {worst:?}");
        // A cross-encoder reads no instruction: one sent is refused, not dropped.
        let (status, refused) = server.post("/v1/rerank", &serde_json::json!({"model": id, "query": "q", "documents": ["d"], "instruction": "i"}));
        assert_eq!(status, 422, "{refused}");
        assert!(refused.to_string().contains("instruction"), "{refused}");
    }
}

/// An XLM-RoBERTa repository in safetensors only (SentencePiece unigram
/// tokenizer.json, positions from pad + 1, query/passage prompts): its graph
/// built and checked at pull, its vectors over HTTP held to the numpy
/// reference with each prompt, on ONNX Runtime and OpenVINO.
#[test]
fn an_xlm_roberta_with_prompts_is_built_from_safetensors() {
    let hub = start_hub();
    let home = tempfile::tempdir().unwrap();
    let repo = "eeane-test/multilingual-e5-small-enpt";
    unprepared("hf--eeane-test--multilingual-e5-small-enpt");
    let pulled = pull_with(&[], home.path(), &hub.endpoint, &format!("hf:{repo}"), &[]);
    assert!(pulled.ok, "{}", pulled.stderr);
    for line in [
        "pooling = \"mean\"  # 1_Pooling/config.json",
        "normalize = true",
        "max_tokens = 512  # sentence_bert_config.json",
        "prompts = { \"passage\" = \"passage: \", \"query\" = \"query: \" }",
        "XLMRobertaModel, graph built from model.safetensors",
    ] {
        assert!(pulled.stdout.contains(line), "the entry does not say {line:?}:\n{}", pulled.stdout);
    }
    let config = format!("{}\n[[models]]\nid = \"openvino\"\nsource = \"hf:{repo}\"\nengine = \"openvino\"\ndevice = \"CPU\"\n", pulled.stdout);
    let server = common::Server::start(Some(&config), &[("HF_HOME", home.path().to_str().unwrap()), ("HF_ENDPOINT", hub.endpoint.as_str())]);
    let texts = common::fixture_texts();
    let snapshot = the_snapshot(home.path(), repo);
    for prompt in [None, Some("query"), Some("passage")] {
        let prefixed: Vec<String> = texts.iter().map(|t| format!("{}{t}", prompt.map(|p| format!("{p}: ")).unwrap_or_default())).collect();
        let reference = reference(&snapshot, &serde_json::json!({"texts": prefixed, "max_tokens": 512}));
        for model in [repo, "openvino"] {
            let mut body = serde_json::json!({"model": model, "input": texts});
            if let Some(p) = prompt {
                body["prompt_name"] = p.into();
            }
            let (status, response) = server.post("/v1/embeddings", &body);
            assert_eq!(status, 200, "{model} {prompt:?}: {response}");
            let worst = common::vectors(&response)
                .iter()
                .zip(reference["vectors"].as_array().unwrap())
                .map(|(v, r)| common::cosine(v, &common::f64s(r)))
                .fold(1.0f64, f64::min);
            println!("{model}, prompt {prompt:?}: {} texts, min cosine to the reference {worst:.8}", texts.len());
            assert!(worst >= 0.9999, "{model} {prompt:?}: min cosine {worst}");
            // usage counts the prompt's tokens: the same as sending the prefixed texts.
            let (_, plain) = server.post("/v1/embeddings", &serde_json::json!({"model": model, "input": prefixed}));
            assert_eq!(response["usage"]["prompt_tokens"], plain["usage"]["prompt_tokens"], "{model} {prompt:?}");
        }
    }
}

/// onnx_file picks one of the repository's ONNX variants; it is served only
/// when its cosine to the fp32 graph is at least 0.9999.
#[test]
fn an_onnx_variant_is_served_only_within_0_9999_of_fp32() {
    let hub = start_hub();
    let home = tempfile::tempdir().unwrap();
    let repo = "eeane-test/minilm-onnx-variants";
    for dir in ["hf--eeane-test--minilm-onnx-variants--model_O2", "hf--eeane-test--minilm-onnx-variants--model_quantized"] {
        unprepared(dir);
    }
    let config = format!(
        "[[models]]\nid = \"optimized\"\nsource = \"hf:{repo}\"\nonnx_file = \"onnx/model_O2.onnx\"\n\n\
         [[models]]\nid = \"int8\"\nsource = \"hf:{repo}\"\nonnx_file = \"onnx/model_quantized.onnx\"\n"
    );
    let server = common::Server::start(Some(&config), &[("HF_HOME", home.path().to_str().unwrap()), ("HF_ENDPOINT", hub.endpoint.as_str())]);
    let texts = common::fixture_texts();
    let (status, response) = server.post("/v1/embeddings", &serde_json::json!({"model": "optimized", "input": texts}));
    assert_eq!(status, 200, "{response}");
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(common::cache_dir().join("models/hf--eeane-test--minilm-onnx-variants--model_O2/manifest.json")).unwrap())
            .unwrap();
    let measured = manifest["checks"]["min_cosine_vs_fp32"].as_f64().unwrap();
    assert!(measured >= 0.9999, "{manifest}");
    let (status, response) = server.post("/v1/embeddings", &serde_json::json!({"model": "int8", "input": "x"}));
    assert_eq!(status, 503, "{response}");
    let message = response["error"]["message"].as_str().unwrap();
    assert!(message.contains("drifts from the fp32 graph (min cosine 0.99") && message.contains("< 0.9999"), "{message}");
    assert!(server.stderr().contains("drifts from the fp32 graph (min cosine 0.99"), "{}", server.stderr());
    println!(
        "optimized variant: min cosine {measured:.8} to fp32, served; int8 variant refused: {}",
        server.stderr().lines().find(|l| l.contains("drifts")).unwrap_or("")
    );
    assert!(!common::cache_dir().join("models/hf--eeane-test--minilm-onnx-variants--model_quantized/model.onnx").exists(), "the refused variant was kept");
}

/// engine = "ncnn" on a Hub entry: the same graph builder's graph, made
/// ncnn-friendly and converted by pnnx from the repository's safetensors,
/// served on the CPU and on a Vulkan device (lavapipe) and held to the numpy
/// reference; a cross-encoder or an onnx_file is refused for ncnn by name.
#[test]
fn a_hub_model_converts_to_ncnn_from_the_same_graph() {
    let hub = start_hub();
    let home = tempfile::tempdir().unwrap();
    let repo = "eeane-test/multilingual-e5-small-enpt";
    unprepared("hf--eeane-test--multilingual-e5-small-enpt--ncnn");
    let config = format!(
        "[[models]]\nid = \"cpu\"\nsource = \"hf:{repo}\"\nengine = \"ncnn\"\ndevice = \"cpu\"\n\n\
         [[models]]\nid = \"vulkan\"\nsource = \"hf:{repo}\"\nengine = \"ncnn\"\ndevice = \"vulkan:llvmpipe\"\n\n\
         [[models]]\nid = \"ce\"\nsource = \"hf:eeane-test/minilm-cross-encoder\"\nengine = \"ncnn\"\n\n\
         [[models]]\nid = \"variant\"\nsource = \"hf:eeane-test/minilm-onnx-variants\"\nengine = \"ncnn\"\nonnx_file = \"onnx/model_O2.onnx\"\n"
    );
    let server = common::Server::start(Some(&config), &[("HF_HOME", home.path().to_str().unwrap()), ("HF_ENDPOINT", hub.endpoint.as_str())]);
    let texts = common::fixture_texts();
    let mut reference_vectors = None;
    for model in ["cpu", "vulkan"] {
        let (status, response) = server.post("/v1/embeddings", &serde_json::json!({"model": model, "input": texts}));
        assert_eq!(status, 200, "{model}: {response}");
        // The weights are in the HF cache once the first model has loaded.
        let reference =
            reference_vectors.get_or_insert_with(|| reference(&the_snapshot(home.path(), repo), &serde_json::json!({"texts": texts, "max_tokens": 512})));
        let worst = common::vectors(&response)
            .iter()
            .zip(reference["vectors"].as_array().unwrap())
            .map(|(v, r)| common::cosine(v, &common::f64s(r)))
            .fold(1.0f64, f64::min);
        println!("ncnn {model}: {} texts, min cosine to the reference {worst:.8}", texts.len());
        assert!(worst >= 0.9999, "{model}: min cosine {worst}");
    }
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(common::cache_dir().join("models/hf--eeane-test--multilingual-e5-small-enpt--ncnn/manifest.json")).unwrap())
            .unwrap();
    assert!(manifest["source"]["hub"].as_str().unwrap().starts_with(&format!("hf:{repo}@")), "{manifest}");
    for (model, says) in [("ce", "cross-encoder"), ("variant", "onnx_file")] {
        let (status, response) = server.post("/v1/embeddings", &serde_json::json!({"model": model, "input": "x"}));
        assert_eq!(status, 503, "{model}: {response}");
        assert!(response["error"]["message"].as_str().unwrap().contains(says), "{model}: {response}");
    }
}

/// A server's first load and `eeane pull` of one repository at once: one
/// fetches and prepares it while the other waits on its lock, so no file is
/// fetched twice and both end with the same prepared model.
#[test]
fn a_repository_is_prepared_once_by_a_server_and_a_pull_at_once() {
    let hub = start_hub();
    let home = tempfile::tempdir().unwrap();
    let repo = "eeane-test/minilm-two-entries";
    unprepared("hf--eeane-test--minilm-two-entries");
    let config = format!("[[models]]\nid = \"a\"\nsource = \"hf:{repo}\"\n");
    let env = [("HF_HOME", home.path().to_str().unwrap()), ("HF_ENDPOINT", hub.endpoint.as_str())];
    let server = common::Server::start(Some(&config), &env);
    let (status, pulled) = std::thread::scope(|scope| {
        let serve = scope.spawn(|| server.post("/v1/embeddings", &serde_json::json!({"model": "a", "input": "hello"})).0);
        let pulled = pull_with(&[], home.path(), &hub.endpoint, &format!("hf:{repo}"), &[]);
        (serve.join().unwrap(), pulled)
    });
    assert_eq!(status, 200, "{}", server.stderr());
    assert!(pulled.ok, "{}", pulled.stderr);
    let fetched: Vec<String> =
        hub.log().iter().filter(|r| r["server"] == "storage" && r["method"] == "GET").map(|r| r["path"].as_str().unwrap().to_string()).collect();
    let mut distinct = fetched.clone();
    distinct.sort();
    distinct.dedup();
    assert!(!fetched.is_empty() && fetched.len() == distinct.len(), "a file was fetched twice: {fetched:?}");
}

/// A lay-out that fails is run once, and each caller fails with its stderr.
#[test]
fn a_failed_lay_out_runs_once_and_names_its_cause() {
    static FAILED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let tries = tempfile::tempdir().unwrap();
    let try_once = || {
        let mut failing = Command::new("sh");
        failing.arg("-c").arg("echo try >> \"$0\"; echo 'No space left on device' >&2; exit 3").arg(tries.path().join("tries"));
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| laid_out_once(&FAILED, tries.path().join("never"), failing).to_path_buf())).unwrap_err()
    };
    for _ in 0..2 {
        let cause = try_once();
        let cause = cause.downcast_ref::<String>().unwrap();
        assert!(cause.contains("No space left on device") && cause.contains("exit status: 3"), "{cause}");
    }
    assert_eq!(std::fs::read_to_string(tries.path().join("tries")).unwrap(), "try\n");
}
