//! The default model over real HTTP against the independent Python reference.

mod common;

use common::{as_f64, cosine, fixture_texts, reference, Server};
use serde_json::json;

const MAX_TOKENS: usize = 256;

#[test]
fn vectors_match_the_python_reference_in_every_form() {
    let texts = fixture_texts();
    assert!(texts.len() >= 30);
    let expected = reference(&texts, MAX_TOKENS);
    assert!(expected.token_counts.iter().any(|&n| n > 200) && expected.token_counts.iter().any(|&n| n <= 3));
    // Token-id input is off by default (LangChain's tiktoken ids); on for this test.
    let server = Server::start(None, &[("EEANE_ACCEPT_TOKEN_IDS", "true")]);

    // One request with every text, float encoding.
    let (status, response) = server.post("/v1/embeddings", &json!({"input": texts, "model": "all-minilm-l6-v2"}));
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["object"], "list");
    assert_eq!(response["model"], "all-minilm-l6-v2");
    let total: usize = expected.token_counts.iter().sum();
    assert_eq!(response["usage"]["prompt_tokens"], total);
    assert_eq!(response["usage"]["total_tokens"], total);
    let batch = common::vectors(&response);
    let floor = server.fidelity_floor("all-minilm-l6-v2");
    let mut worst = 1.0f64;
    for (i, (got, want)) in batch.iter().zip(&expected.vectors).enumerate() {
        assert_eq!(got.len(), 384);
        let norm: f64 = got.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "text {i}: norm {norm}");
        let c = cosine(got, want);
        assert!(c >= floor, "text {i} ({} tokens): cosine {c} to the reference", expected.token_counts[i]);
        worst = worst.min(c);
    }
    println!("min cosine to the Python reference over {} texts: {worst:.10} (1 - cos = {:.2e})", texts.len(), 1.0 - worst);

    // base64 gives bit-identical vectors.
    let b64 = server.embed(json!(texts), json!({"encoding_format": "base64"}));
    assert_eq!(b64, batch, "base64 and float differ");

    // One text per request gives the same vectors as the batch.
    let mut worst_single = 1.0f64;
    for (i, text) in texts.iter().enumerate() {
        let single = server.embed(json!(text), json!({}));
        assert_eq!(single.len(), 1);
        let c = cosine(&single[0], &as_f64(&batch[i]));
        assert!(c >= floor, "text {i}: single vs batch cosine {c}");
        worst_single = worst_single.min(c);
    }
    println!("min cosine single-request vs batched: {worst_single:.10} (1 - cos = {:.2e})", 1.0 - worst_single);

    // Token ids (the model's own, without special tokens) give the text's vectors.
    let by_ids = server.embed(json!(expected.content_ids), json!({}));
    for (i, (got, want)) in by_ids.iter().zip(&batch).enumerate() {
        let c = cosine(got, &as_f64(want));
        assert!(c >= floor, "text {i}: token-id vs text cosine {c}");
    }
    let flat = server.embed(json!(expected.content_ids[3]), json!({}));
    assert!(cosine(&flat[0], &as_f64(&batch[3])) >= floor);

    // dimensions=128 is the renormalized prefix.
    let short = server.embed(json!(texts), json!({"dimensions": 128}));
    for (got, full) in short.iter().zip(&batch) {
        assert_eq!(got.len(), 128);
        let prefix = &full[..128];
        let norm = prefix.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
        for (g, p) in got.iter().zip(prefix) {
            assert!((*g as f64 - *p as f64 / norm).abs() < 1e-6);
        }
    }
}

#[test]
fn aliases_unprefixed_routes_models_and_health() {
    let server = Server::start(None, &[]);
    let a = server.embed(json!("same text"), json!({"model": "sentence-transformers/all-MiniLM-L6-v2"}));
    let (status, response) = server.post("/embeddings", &json!({"input": "same text"}));
    assert_eq!(status, 200);
    assert_eq!(common::vectors(&response), a);
    for path in ["/v1/models", "/models"] {
        let (status, models) = server.get(path);
        assert_eq!(status, 200);
        assert_eq!(models["object"], "list");
        assert_eq!(models["data"][0]["id"], "all-minilm-l6-v2");
        assert_eq!(models["data"][0]["dimensions"], 384);
    }
    let (status, health) = server.get("/health");
    assert_eq!(status, 200);
    assert_eq!(health["models"][0]["state"], "loaded");
    // The default model is precision = "auto": the engine is the one its survey chose on this machine.
    let chosen = health["models"][0]["variant"]["chosen"].as_str().expect("the default model's variant");
    assert_eq!(health["models"][0]["engine"], chosen.split(' ').next().unwrap(), "{health}");
}
