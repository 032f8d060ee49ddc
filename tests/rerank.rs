//! /rerank over real HTTP: a cross-encoder (all-MiniLM-L6-v2 with a fitted
//! [CLS] head, models/prepare.py minilm-reranker) against onnxruntime +
//! tokenizers pair encoding in Python, and an embedding model with
//! rerank = true against the cosine of /v1/embeddings' vectors; the requests
//! Open WebUI and Infinity's client send; and the errors.

mod common;

use common::{cache_dir, model_entry, run_reference, Server};
use serde_json::{json, Value};
use std::time::Duration;

fn reranker_entry(extra: &str) -> String {
    let dir = cache_dir().join("models/minilm-reranker");
    assert!(dir.join("manifest.json").exists(), "{} is missing: run models/prepare.py minilm-reranker", dir.display());
    format!(
        "[[models]]\nid = \"minilm-reranker\"\nkind = \"reranker\"\nengine = \"onnxruntime\"\npooling = \"none\"\nmodel = \"{}\"\ntokenizer = \"{}\"\nmax_tokens = 256\n{extra}\n",
        dir.join("model.onnx").display(),
        dir.join("tokenizer.json").display()
    )
}

fn query_and_documents() -> (String, Vec<String>) {
    let documents = vec![
        "git reset --soft HEAD~1 moves HEAD back one commit and keeps the changes staged.".to_string(),
        "The Eiffel Tower was completed in 1889.".to_string(),
        "def undo():\n    subprocess.run(['git', 'reset', '--soft', 'HEAD~1'])".to_string(),
        "Penguins live mostly in the Southern Hemisphere.".to_string(),
        // Longer than the model's 256 tokens with the query: the document is cut, the query kept.
        "a long document about version control ".repeat(80),
    ];
    ("how do I undo my last git commit".to_string(), documents)
}

fn config(api_key: Option<&str>) -> String {
    let key = api_key.map(|k| format!("[server]\napi_key = \"{k}\"\n")).unwrap_or_default();
    format!("{key}{}{}{}", model_entry("embedder", "all-minilm-l6-v2", ""), model_entry("bi", "all-minilm-l6-v2", "rerank = true"), reranker_entry(""))
}

#[test]
fn cross_encoder_scores_match_python_and_are_sorted() {
    let server = Server::start(Some(&config(None)), &[]);
    let (query, documents) = query_and_documents();
    let want = run_reference(
        "rerank.py",
        &json!({"model_dir": cache_dir().join("models/minilm-reranker"), "max_tokens": 256, "query": query, "documents": documents}),
    );
    let logits = common::f64s(&want["logits"]);
    for raw in [true, false] {
        // No model named: the first reranker entry answers.
        let (status, got) = server.post("/rerank", &json!({"query": query, "documents": documents, "raw_scores": raw, "return_documents": true}));
        assert_eq!(status, 200, "{got}");
        assert_eq!(got["object"], "rerank");
        assert_eq!(got["model"], "minilm-reranker");
        let results = got["results"].as_array().unwrap();
        assert_eq!(results.len(), documents.len());
        let mut worst = 0f64;
        for r in results {
            let i = r["index"].as_u64().unwrap() as usize;
            let expected = if raw { logits[i] } else { 1.0 / (1.0 + (-logits[i]).exp()) };
            worst = worst.max((r["relevance_score"].as_f64().unwrap() - expected).abs());
            assert_eq!(r["document"].as_str().unwrap(), documents[i]);
        }
        println!("cross-encoder, raw_scores {raw}: max |score - Python| {worst:.2e} over {} documents", documents.len());
        assert!(worst < 1e-5, "scores differ from the Python reference by {worst}");
        let scores: Vec<f64> = results.iter().map(|r| r["relevance_score"].as_f64().unwrap()).collect();
        assert!(scores.windows(2).all(|w| w[0] >= w[1]), "not sorted: {scores:?}");
        let tokens: u64 = want["token_counts"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).sum();
        assert_eq!(got["usage"]["total_tokens"].as_u64().unwrap(), tokens, "usage counts the pairs' tokens");
    }
    // The relevant documents rank above the unrelated ones.
    let (_, got) = server.post("/v1/rerank", &json!({"model": "minilm-reranker", "query": query, "documents": documents, "top_n": 2}));
    let top: Vec<u64> = got["results"].as_array().unwrap().iter().map(|r| r["index"].as_u64().unwrap()).collect();
    assert_eq!(top.len(), 2);
    assert!(top.iter().all(|i| [0, 2, 4].contains(i)), "top 2 {top:?}: {got}");
    assert!(got["results"][0].get("document").is_none(), "documents only when asked");
}

#[test]
fn embedding_model_reranks_by_the_cosine_of_its_vectors() {
    let server = Server::start(Some(&config(None)), &[]);
    let (query, documents) = query_and_documents();
    let (status, got) = server.post("/rerank", &json!({"model": "bi", "query": query, "documents": documents}));
    assert_eq!(status, 200, "{got}");
    let texts: Vec<String> = std::iter::once(query.clone()).chain(documents.iter().cloned()).collect();
    let vectors = server.embed(json!(texts), json!({"model": "bi"}));
    let mut worst = 0f64;
    for r in got["results"].as_array().unwrap() {
        let i = r["index"].as_u64().unwrap() as usize;
        let want = common::cosine(&vectors[0], &common::as_f64(&vectors[i + 1]));
        worst = worst.max((r["relevance_score"].as_f64().unwrap() - want).abs());
    }
    println!("bi-encoder rerank vs cosine of /v1/embeddings' vectors: max difference {worst:.2e}");
    assert!(worst < 1e-6, "{worst}");
}

#[test]
fn open_webui_and_infinity_requests_work() {
    let server = Server::start(Some(&config(Some("s3cret"))), &[]);
    let (query, documents) = query_and_documents();
    // Open WebUI's external reranker: model, query, documents, top_n = len(documents), a bearer key.
    let body = json!({"model": "minilm-reranker", "query": query, "documents": documents, "top_n": documents.len()}).to_string().into_bytes();
    let (status, got) = server.post_raw("/v1/rerank", body.clone(), &[("authorization", "Bearer s3cret")]);
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["results"].as_array().unwrap().len(), documents.len());
    let (status, got) = server.post_raw("/v1/rerank", body, &[]);
    assert_eq!(status, 401, "{got}");
    // The request log keeps the model a refused request asked for.
    let logged = server.log_line(Duration::from_secs(5), |l| l.contains("status=401") && l.contains("model=minilm-reranker"));
    assert!(logged.is_some(), "no 401 log line names the model:\n{}", server.stderr());
    // Infinity's client: /rerank with return_documents and raw_scores spelled out; Cohere-style {text} documents too.
    let infinity = json!({"model": "minilm-reranker", "query": query, "documents": documents, "return_documents": false, "raw_scores": false, "top_n": 3});
    let (status, got) = server.post_raw("/rerank", infinity.to_string().into_bytes(), &[("authorization", "Bearer s3cret")]);
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["results"].as_array().unwrap().len(), 3);
    assert!(got["id"].as_str().unwrap().starts_with("rerank-") && got["created"].as_u64().unwrap() > 0);
    let cohere = json!({"query": query, "documents": documents.iter().map(|d| json!({"text": d})).collect::<Vec<_>>()});
    let (status, got) = server.post_raw("/rerank", cohere.to_string().into_bytes(), &[("authorization", "Bearer s3cret")]);
    assert_eq!(status, 200, "{got}");
}

#[test]
fn bad_rerank_requests_get_the_error_json_and_the_server_keeps_serving() {
    let server = Server::start(Some(&format!("[server]\nmax_inputs = 4\n{}", config(None).replace("[server]\n", ""))), &[]);
    let docs = json!(["a", "b"]);
    let cases: Vec<(Value, &str, u16, &str)> = vec![
        (json!({"query": "q", "documents": []}), "/rerank", 400, "empty_documents"),
        (json!({"query": "q", "documents": ["a", "b", "c", "d", "e"]}), "/rerank", 413, "too_many_documents"),
        (json!({"query": "q", "documents": docs, "top_n": 0}), "/rerank", 400, "invalid_top_n"),
        (json!({"query": "q", "documents": docs, "top_n": -3}), "/rerank", 400, "invalid_top_n"),
        (json!({"query": "q", "documents": docs, "model": "nope"}), "/rerank", 404, "model_not_found"),
        (json!({"documents": docs}), "/rerank", 400, "missing_query"),
        (json!({"query": "q", "documents": ["a", ""]}), "/rerank", 400, "empty_document"),
        (json!({"query": "q", "documents": docs, "model": "embedder"}), "/rerank", 400, "not_a_reranker"),
        (json!({"query": "word ".repeat(400), "documents": docs}), "/rerank", 400, "query_too_long"),
        (json!({"input": "x", "model": "minilm-reranker"}), "/v1/embeddings", 400, "not_an_embedding_model"),
    ];
    for (body, path, status, code) in cases {
        let (got_status, got) = server.post(path, &body);
        assert_eq!(got_status, status, "{body}: {got}");
        assert_eq!(got["error"]["code"], code, "{body}: {got}");
        assert!(got["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{got}");
    }
    let (_, got) = server.post("/rerank", &json!({"query": "q", "documents": docs, "model": "embedder"}));
    assert!(got["error"]["message"].as_str().unwrap().contains("/v1/embeddings"), "names the right endpoint: {got}");
    let (_, got) = server.post("/v1/embeddings", &json!({"input": "x", "model": "minilm-reranker"}));
    assert!(got["error"]["message"].as_str().unwrap().contains("/v1/rerank"), "{got}");
    // An unknown model's 404 lists the models that answer that route, and the
    // request log keeps the name that was asked for.
    let (_, got) = server.post("/v1/embeddings", &json!({"input": "x", "model": "no-such-embedder"}));
    let listed = got["error"]["message"].as_str().unwrap();
    assert!(listed.contains("embedder") && !listed.contains("minilm-reranker"), "{got}");
    let (_, got) = server.post("/rerank", &json!({"query": "q", "documents": docs, "model": "no-such-reranker"}));
    assert!(got["error"]["message"].as_str().unwrap().contains("minilm-reranker"), "{got}");
    for name in ["no-such-embedder", "no-such-reranker"] {
        let logged = server.log_line(Duration::from_secs(5), |l| l.contains("status=404") && l.contains(&format!("model={name}")));
        assert!(logged.is_some(), "no 404 log line names {name}:\n{}", server.stderr());
    }
    assert!(!server.stderr().contains('\u{1b}'), "the log to a pipe carries ANSI colour codes");
    let (status, _) = server.post("/rerank", &json!({"query": "q", "documents": docs}));
    assert_eq!(status, 200, "still serving");
}
