//! Every client example in examples/ run against a started server with an API
//! key, each with its real client package (examples/requirements.txt, in
//! {cache}/venv-examples), and its answers compared with the server's own.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{model_entry, vectors, Server};
use serde_json::{json, Value};

const KEY: &str = "example-key";

fn python() -> PathBuf {
    let python = common::cache_dir().join("venv-examples/bin/python");
    assert!(python.exists(), "{} is missing: run `bash tests/run.sh` (EEANE_EXTRA_MODELS=examples bash models/setup.sh)", python.display());
    python
}

fn example(name: &str) -> String {
    format!("{}/examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The default model and the test reranker, behind a key.
fn server() -> Server {
    let config = format!(
        "[server]\napi_key = \"{KEY}\"\n{}{}",
        model_entry("all-minilm-l6-v2", "all-minilm-l6-v2", ""),
        model_entry("minilm-reranker", "minilm-reranker", "kind = \"reranker\"\npooling = \"none\"")
    );
    Server::start(Some(&config), &[])
}

fn run(cmd: &mut Command) -> Value {
    let out = cmd.output().expect("run the example");
    assert!(out.status.success(), "{:?}: {}", cmd, String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn authed(server: &Server, path: &str, body: Value) -> Value {
    let (status, _, response) = server.post_full(path, &body, &[("Authorization", &format!("Bearer {KEY}"))]);
    assert_eq!(status, 200, "{response}");
    response
}

const TEXTS: [&str; 3] = ["def greet(name):\n    return f\"Hello, {name}\"", "Vectors for retrieval.", "Como faço para ordenar uma lista?"];

#[test]
fn curl_script_runs_every_call() {
    let server = server();
    let out = Command::new("bash").arg(example("curl.sh")).env("EEANE_URL", &server.url).env("EEANE_API_KEY", KEY).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    for expected in ["\"object\":\"list\"", "\"object\":\"rerank\"", "\"relevance_score\"", "\"status\":\"ok\""] {
        assert!(stdout.contains(expected), "{expected} missing from:\n{stdout}");
    }
    assert!(!stdout.contains("\"error\""), "{stdout}");
}

#[test]
fn openai_python_float_and_its_default_base64() {
    let server = server();
    let direct = vectors(&authed(&server, "/v1/embeddings", json!({"input": TEXTS})));
    for float in [false, true] {
        let mut cmd = Command::new(python());
        cmd.arg(example("openai_client.py")).arg("--base-url").arg(format!("{}/v1", server.url)).args(TEXTS).env("OPENAI_API_KEY", KEY);
        if float {
            cmd.arg("--float");
        }
        let got: Vec<Vec<f32>> = serde_json::from_value(run(&mut cmd)["vectors"].clone()).unwrap();
        // openai-python decodes base64 itself (default) or parses floats: either way the same bits.
        assert_eq!(got, direct, "float = {float}");
    }
}

#[test]
fn langchain_openai_embeddings_with_text_and_its_token_id_default_refused_by_name() {
    let server = server();
    let direct = vectors(&authed(&server, "/v1/embeddings", json!({"input": TEXTS, "encoding_format": "float"})));
    let got = run(Command::new(python())
        .arg(example("langchain_embeddings.py"))
        .arg("--base-url")
        .arg(format!("{}/v1", server.url))
        .args(TEXTS)
        .env("OPENAI_API_KEY", KEY));
    let documents: Vec<Vec<f32>> = serde_json::from_value(got["documents"].clone()).unwrap();
    let query: Vec<f32> = serde_json::from_value(got["query"].clone()).unwrap();
    assert_eq!(documents, direct);
    assert_eq!(query, direct[0]);

    // What OpenAIEmbeddings sends with its default check_embedding_ctx_length=True:
    // tiktoken (cl100k_base) ids of the texts, as lists, through openai-python
    // (base64). "Hello world" is [9906, 1917] there: ids inside this model's
    // vocabulary, so only refusing token ids by default keeps this from
    // embedding nonsense.
    let (status, _, body) = server.post_full(
        "/v1/embeddings",
        &json!({"input": [[9906, 1917]], "model": "all-minilm-l6-v2", "encoding_format": "base64"}),
        &[("Authorization", &format!("Bearer {KEY}"))],
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "token_ids_not_accepted");
    assert!(body["error"]["message"].as_str().unwrap().contains("check_embedding_ctx_length=False"), "{body}");
}

/// Open WebUI's requests (examples/open_webui_requests.py) with its settings
/// pointed at `server`, `engine` its embedding engine; the embeddings must be
/// /v1/embeddings' own.
fn replay_open_webui(server: &Server, query: &str, engine: &str) -> Value {
    let got = run(Command::new(python())
        .arg(example("open_webui_requests.py"))
        .arg(query)
        .args(TEXTS)
        .env("RAG_EMBEDDING_ENGINE", engine)
        .env("RAG_OPENAI_API_BASE_URL", format!("{}/v1", server.url))
        .env("RAG_OLLAMA_BASE_URL", &server.url)
        .env("RAG_EXTERNAL_RERANKER_URL", format!("{}/v1/rerank", server.url))
        .env("RAG_OPENAI_API_KEY", KEY)
        .env("RAG_OLLAMA_API_KEY", KEY)
        .env("RAG_EXTERNAL_RERANKER_API_KEY", KEY));
    let embeddings: Vec<Vec<f32>> = serde_json::from_value(got["embeddings"].clone()).unwrap();
    assert_eq!(embeddings, vectors(&authed(server, "/v1/embeddings", json!({"input": TEXTS}))), "engine {engine}");
    got
}

#[test]
fn open_webui_settings_embed_and_rerank() {
    let server = server();
    let query = "how do I greet someone in Python?";
    let got = replay_open_webui(&server, query, "openai");
    let reranked = authed(&server, "/v1/rerank", json!({"query": query, "documents": TEXTS, "model": "minilm-reranker"}));
    let mut scores = vec![0.0; TEXTS.len()];
    for r in reranked["results"].as_array().unwrap() {
        scores[r["index"].as_u64().unwrap() as usize] = r["relevance_score"].as_f64().unwrap();
    }
    assert_eq!(got["scores"], json!(scores));
}

#[test]
fn infinity_client_reranks() {
    let server = server();
    let query = "sort a list";
    let got = run(Command::new(python())
        .arg(example("infinity_rerank.py"))
        .arg("--base-url")
        .arg(&server.url)
        .arg("--top-n")
        .arg("2")
        .arg(query)
        .args(TEXTS)
        .env("EEANE_API_KEY", KEY));
    let direct = authed(&server, "/rerank", json!({"query": query, "documents": TEXTS, "top_n": 2, "return_documents": true}));
    let want: Vec<Value> = direct["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| json!({"index": r["index"], "relevance_score": r["relevance_score"], "document": r["document"]}))
        .collect();
    assert_eq!(got["results"], json!(want));
    assert_eq!(want.len(), 2);
}

#[test]
fn tei_clients_inference_client_and_langchain_get_the_openai_routes_vectors() {
    let server = server();
    let direct = vectors(&authed(&server, "/v1/embeddings", json!({"input": TEXTS})));
    let got = run(Command::new(python()).arg(example("tei_clients.py")).arg("--url").arg(&server.url).args(TEXTS).env("HF_TOKEN", KEY));
    let inference_client: Vec<Vec<f32>> = serde_json::from_value(got["inference_client"].clone()).unwrap();
    assert_eq!(inference_client, direct, "InferenceClient(base_url).feature_extraction posts to /");
    // LangChain sends each document with its newlines as spaces.
    let flattened: Vec<String> = TEXTS.iter().map(|t| t.replace('\n', " ")).collect();
    let direct_flat = vectors(&authed(&server, "/v1/embeddings", json!({"input": flattened})));
    let documents: Vec<Vec<f32>> = serde_json::from_value(got["langchain_documents"].clone()).unwrap();
    assert_eq!(documents, direct_flat);
    let query: Vec<f32> = serde_json::from_value(got["langchain_query"].clone()).unwrap();
    let flat_query = vectors(&authed(&server, "/v1/embeddings", json!({"input": [flattened[0].clone()]})));
    assert_eq!(query, flat_query[0], "embed_query sends one text, newlines as spaces");
}

#[test]
fn ollama_client_embed_embeddings_and_list() {
    let server = server();
    let direct = vectors(&authed(&server, "/v1/embeddings", json!({"input": TEXTS})));
    let got = run(Command::new(python()).arg(example("ollama_client.py")).arg("--host").arg(&server.url).args(TEXTS).env("OLLAMA_API_KEY", KEY));
    let embed: Vec<Vec<f32>> = serde_json::from_value(got["embed"].clone()).unwrap();
    assert_eq!(embed, direct, "ollama.embed with the :latest tag");
    let older: Vec<Vec<f32>> = serde_json::from_value(got["embeddings"].clone()).unwrap();
    let one_at_a_time: Vec<Vec<f32>> = TEXTS.iter().flat_map(|t| vectors(&authed(&server, "/v1/embeddings", json!({"input": t})))).collect();
    assert_eq!(older, one_at_a_time, "ollama.embeddings, one prompt a call");
    assert_eq!(got["models"], json!(["all-minilm-l6-v2:latest", "minilm-reranker:latest"]));
    let usage = authed(&server, "/v1/embeddings", json!({"input": TEXTS}))["usage"]["prompt_tokens"].clone();
    assert_eq!(got["prompt_eval_count"], usage);
}

#[test]
fn open_webui_ollama_engine_request() {
    let server = server();
    replay_open_webui(&server, "how do I greet someone in Python?", "ollama");
}

/// A model pinned by the base URL alone (`/models/{id}/...`, as a balancer
/// that hashes on the URL needs): openai-python, the ollama client and TEI's
/// InferenceClient each reach the model the URL names, not the default.
#[test]
fn each_client_reaches_the_model_its_base_url_names() {
    let config = format!(
        "[server]\napi_key = \"{KEY}\"\n{}{}",
        model_entry("all-minilm-l6-v2", "all-minilm-l6-v2", ""),
        model_entry("org/minilm-int8", "all-minilm-l6-v2-int8", "aliases = [\"int8\"]")
    );
    let server = Server::start(Some(&config), &[]);
    let int8 = vectors(&authed(&server, "/v1/embeddings", json!({"input": TEXTS, "model": "org/minilm-int8", "encoding_format": "float"})));
    let default = vectors(&authed(&server, "/v1/embeddings", json!({"input": TEXTS, "encoding_format": "float"})));
    assert_ne!(int8, default, "the pinned model must be told apart from the default");
    for prefix in ["/models/org/minilm-int8", "/models/int8"] {
        let base = format!("{}{prefix}", server.url);
        let openai = run(Command::new(python())
            .arg(example("openai_client.py"))
            .arg("--base-url")
            .arg(format!("{base}/v1"))
            .args(["--model", "org/minilm-int8", "--float"])
            .args(TEXTS)
            .env("OPENAI_API_KEY", KEY));
        assert_eq!(serde_json::from_value::<Vec<Vec<f32>>>(openai["vectors"].clone()).unwrap(), int8, "openai-python, base URL {base}/v1");
        let ollama = run(Command::new(python())
            .arg(example("ollama_client.py"))
            .arg("--host")
            .arg(&base)
            .args(["--model", "org/minilm-int8:latest"])
            .args(TEXTS)
            .env("OLLAMA_API_KEY", KEY));
        assert_eq!(serde_json::from_value::<Vec<Vec<f32>>>(ollama["embed"].clone()).unwrap(), int8, "ollama, host {base}");
        assert_eq!(ollama["models"], json!(["org/minilm-int8:latest"]), "ollama's list under {base}");
        let tei = run(Command::new(python()).arg(example("tei_clients.py")).arg("--url").arg(&base).args(TEXTS).env("HF_TOKEN", KEY));
        assert_eq!(serde_json::from_value::<Vec<Vec<f32>>>(tei["inference_client"].clone()).unwrap(), int8, "InferenceClient, base_url {base}");
    }
}
