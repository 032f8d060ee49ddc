//! TEI's and Ollama's routes on a started server with the real engine and
//! model: each answers with the vectors of /v1/embeddings for the same text
//! (bit for bit), TEI's rerank with the scores of Infinity's, and each
//! refusal in its API's own shape and status while the server keeps serving.

mod common;

use common::{model_entry, run_reference, vectors, Server};
use serde_json::{json, Value};

const KEY: &str = "surface-key";

fn server() -> Server {
    let config = format!(
        "[server]\napi_key = \"{KEY}\"\n{}{}{}",
        model_entry("all-minilm-l6-v2", "all-minilm-l6-v2", "aliases = [\"minilm\"]\nprompts = { query = \"query: \" }\naccept_token_ids = true"),
        model_entry("minilm-raw", "all-minilm-l6-v2", "normalize = false\nload_policy = \"on_demand\"\nkeep_alive = 0"),
        model_entry("minilm-reranker", "minilm-reranker", "kind = \"reranker\"\npooling = \"none\"")
    );
    Server::start(Some(&config), &[])
}

fn post(server: &Server, path: &str, body: Value) -> (u16, Value) {
    let (status, _, body) = server.post_full(path, &body, &[("Authorization", &format!("Bearer {KEY}"))]);
    (status, body)
}

fn ok(server: &Server, path: &str, body: Value) -> Value {
    let (status, body) = post(server, path, body);
    assert_eq!(status, 200, "{path}: {body}");
    body
}

fn get(server: &Server, path: &str) -> Value {
    let (status, body) = get_status(server, path);
    assert_eq!(status, 200, "{path}: {body}");
    body
}

fn get_status(server: &Server, path: &str) -> (u16, Value) {
    let response = reqwest::blocking::Client::new().get(format!("{}{path}", server.url)).bearer_auth(KEY).send().unwrap();
    (response.status().as_u16(), response.json().unwrap())
}

fn floats(v: &Value) -> Vec<Vec<f32>> {
    serde_json::from_value(v.clone()).unwrap()
}

/// A TEI refusal: its status, `{error, error_type}` and nothing else.
fn tei_refusal(server: &Server, path: &str, body: Value, status: u16, error_type: &str) -> String {
    let (got, body) = post(server, path, body);
    assert_eq!(got, status, "{path}: {body}");
    assert_eq!(body["error_type"], error_type, "{body}");
    assert_eq!(body.as_object().unwrap().len(), 2, "TEI's error has error and error_type only: {body}");
    body["error"].as_str().unwrap().to_string()
}

fn ollama_refusal(server: &Server, path: &str, body: Value, status: u16) -> String {
    let (got, body) = post(server, path, body);
    assert_eq!(got, status, "{path}: {body}");
    assert_eq!(body.as_object().unwrap().len(), 1, "Ollama's error is {{error}}: {body}");
    body["error"].as_str().unwrap().to_string()
}

const TEXTS: [&str; 3] = ["def add(a, b):\n    return a + b", "Vectors for retrieval.", "Como faço para ordenar uma lista?"];

#[test]
fn tei_embed_and_root_give_the_openai_vectors() {
    let server = server();
    let direct = vectors(&ok(&server, "/v1/embeddings", json!({"input": TEXTS})));
    assert_eq!(floats(&ok(&server, "/embed", json!({"inputs": TEXTS}))), direct);
    assert_eq!(floats(&ok(&server, "/", json!({"inputs": TEXTS}))), direct, "POST / is /embed for InferenceClient");
    let one = vectors(&ok(&server, "/v1/embeddings", json!({"input": TEXTS[1]})));
    assert_eq!(floats(&ok(&server, "/embed", json!({"inputs": TEXTS[1]}))), one, "a single string");
    // Token ids, dimensions, a prompt and a named model, each as /v1 does them.
    let direct_ids = vectors(&ok(&server, "/v1/embeddings", json!({"input": [[7592, 2088], [2088]], "model": "minilm"})));
    assert_eq!(floats(&ok(&server, "/embed", json!({"inputs": [[7592, 2088], [2088]], "model": "minilm"}))), direct_ids);
    assert_eq!(
        floats(&ok(&server, "/embed", json!({"inputs": TEXTS, "dimensions": 64, "prompt_name": "query"}))),
        vectors(&ok(&server, "/v1/embeddings", json!({"input": TEXTS, "dimensions": 64, "prompt_name": "query"})))
    );
    // normalize: a model that does not normalize gets unit vectors from TEI's
    // default, and its own raw vectors with normalize: false.
    let raw = vectors(&ok(&server, "/v1/embeddings", json!({"input": TEXTS, "model": "minilm-raw"})));
    assert!(raw.iter().all(|v| (v.iter().map(|x| x * x).sum::<f32>().sqrt() - 1.0).abs() > 1e-3), "minilm-raw is not unit length");
    assert_eq!(floats(&ok(&server, "/embed", json!({"inputs": TEXTS, "model": "minilm-raw", "normalize": false}))), raw);
    assert_eq!(floats(&ok(&server, "/embed", json!({"inputs": TEXTS, "model": "minilm-raw"}))), direct, "normalized as the model that normalizes");
    let message = tei_refusal(&server, "/embed", json!({"inputs": TEXTS, "normalize": false}), 422, "Validation");
    assert!(message.contains("normalize"), "{message}");
}

#[test]
fn tei_truncate_false_refuses_what_truncate_true_embeds() {
    let server = server();
    let long = "retrieval ".repeat(400);
    let message = tei_refusal(&server, "/embed", json!({"inputs": [TEXTS[0], long], "truncate": false}), 422, "Validation");
    assert!(message.contains("402 tokens") && message.contains("256"), "{message}");
    let direct = vectors(&ok(&server, "/v1/embeddings", json!({"input": [long]})));
    assert_eq!(floats(&ok(&server, "/embed", json!({"inputs": [long], "truncate": true}))), direct);
    assert_eq!(floats(&ok(&server, "/embed", json!({"inputs": [TEXTS[0]], "truncate": false}))).len(), 1, "a short input passes");
    tei_refusal(&server, "/embed", json!({"inputs": "x", "truncation_direction": "Left"}), 422, "Validation");
    tei_refusal(&server, "/embed", json!({"inputs": []}), 400, "Empty");
}

#[test]
fn tei_rerank_scores_equal_infinity_scores() {
    let server = server();
    let query = "how do I add two numbers?";
    for raw_scores in [false, true] {
        let infinity = ok(&server, "/v1/rerank", json!({"query": query, "documents": TEXTS, "raw_scores": raw_scores}));
        let mut by_index = [0.0; 3];
        for r in infinity["results"].as_array().unwrap() {
            by_index[r["index"].as_u64().unwrap() as usize] = r["relevance_score"].as_f64().unwrap();
        }
        for path in ["/rerank", "/v1/rerank", "/"] {
            let tei = ok(&server, path, json!({"query": query, "texts": TEXTS, "raw_scores": raw_scores, "return_text": true}));
            let ranks = tei.as_array().unwrap_or_else(|| panic!("{path}: {tei}"));
            assert_eq!(ranks.len(), 3);
            let scores: Vec<f64> = ranks.iter().map(|r| r["score"].as_f64().unwrap()).collect();
            assert!(scores.windows(2).all(|w| w[0] >= w[1]), "best first: {tei}");
            for r in ranks {
                let index = r["index"].as_u64().unwrap() as usize;
                assert_eq!(r["score"].as_f64().unwrap(), by_index[index], "{path} raw_scores={raw_scores}");
                assert_eq!(r["text"], TEXTS[index]);
            }
        }
    }
    let without_text = ok(&server, "/rerank", json!({"query": query, "texts": TEXTS}));
    assert!(without_text[0].get("text").is_none(), "{without_text}");
    tei_refusal(&server, "/rerank", json!({"query": query, "texts": []}), 400, "Empty");
    tei_refusal(&server, "/rerank", json!({"query": "", "texts": TEXTS}), 400, "Empty");
    // Infinity's body on the same path keeps Infinity's error shape.
    let (status, body) = post(&server, "/rerank", json!({"query": query, "documents": []}));
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("empty_documents")), "{body}");
}

#[test]
fn tei_tokenize_decode_and_info() {
    let server = server();
    let texts = ["Héllo, wörld! def f(x): return x", "Vectors for retrieval."];
    let tokens = ok(&server, "/tokenize", json!({"inputs": texts}));
    let tokenizer = common::minilm_dir().join("tokenizer.json");
    let want = run_reference("hf_ids.py", &json!({"tokenizer": tokenizer, "max_tokens": 512, "texts": texts}));
    for (i, text) in texts.iter().enumerate() {
        let listed = tokens[i].as_array().unwrap();
        let ids: Vec<i64> = listed.iter().map(|t| t["id"].as_i64().unwrap()).collect();
        assert_eq!(json!(ids), want["ids"][i], "the ids Python tokenizers makes of the same file");
        assert_eq!((listed[0]["special"].as_bool(), listed[0]["start"].is_null()), (Some(true), true), "[CLS] first");
        for t in listed.iter().filter(|t| t["special"] == false) {
            let (start, stop) = (t["start"].as_u64().unwrap() as usize, t["stop"].as_u64().unwrap() as usize);
            assert_eq!(t["text"], text[start..stop], "offsets are bytes of the input");
        }
        let decoded = ok(&server, "/decode", json!({"ids": ids}));
        assert_eq!(decoded[0].as_str().unwrap(), ok(&server, "/decode", json!({"ids": [ids.clone()], "skip_special_tokens": true}))[0]);
        assert!(!decoded[0].as_str().unwrap().contains("[CLS]"));
        let with_specials = ok(&server, "/decode", json!({"ids": [ids], "skip_special_tokens": false}));
        assert!(with_specials[0].as_str().unwrap().starts_with("[CLS]"), "{with_specials}");
    }
    let plain = ok(&server, "/tokenize", json!({"inputs": "hello", "add_special_tokens": false}));
    assert_eq!(plain[0].as_array().unwrap().len(), 1, "{plain}");
    let prompted = ok(&server, "/tokenize", json!({"inputs": "hello", "prompt_name": "query", "add_special_tokens": false}));
    assert_eq!(prompted[0][0]["text"], "query");
    tei_refusal(&server, "/decode", json!({"ids": [1_000_000]}), 422, "Tokenizer");
    tei_refusal(&server, "/tokenize", json!({"inputs": []}), 400, "Empty");

    let info = get(&server, "/info");
    assert_eq!(info["model_id"], "all-minilm-l6-v2");
    assert_eq!(info["model_type"], json!({"embedding": {"pooling": "mean"}}));
    assert_eq!((info["max_input_length"].as_u64(), info["model_dtype"].as_str()), (Some(256), Some("float32")));
    assert_eq!(get(&server, "/info?model=minilm-reranker")["model_type"]["reranker"]["id2label"]["0"], "LABEL_0");
}

#[test]
fn ollama_embed_embeddings_tags_ps_and_keep_alive() {
    let server = server();
    let direct = vectors(&ok(&server, "/v1/embeddings", json!({"input": TEXTS})));
    for name in ["all-minilm-l6-v2", "all-minilm-l6-v2:latest", "minilm:latest"] {
        let embedded = ok(&server, "/api/embed", json!({"model": name, "input": TEXTS}));
        assert_eq!(floats(&embedded["embeddings"]), direct, "{name}");
        assert_eq!(embedded["model"], "all-minilm-l6-v2");
        assert!(embedded["total_duration"].as_u64().unwrap() > 0 && embedded["prompt_eval_count"].as_u64().unwrap() > 0, "{embedded}");
    }
    let one = vectors(&ok(&server, "/v1/embeddings", json!({"input": TEXTS[2]})));
    assert_eq!(floats(&ok(&server, "/api/embed", json!({"model": "minilm", "input": TEXTS[2]}))["embeddings"]), one);
    let older = ok(&server, "/api/embeddings", json!({"model": "all-minilm-l6-v2:latest", "prompt": TEXTS[2]}));
    assert_eq!(floats(&json!([older["embedding"]])), one);
    assert_eq!(ok(&server, "/api/embeddings", json!({"model": "minilm", "prompt": ""})), json!({"embedding": []}));
    assert_eq!(
        floats(&ok(&server, "/api/embed", json!({"model": "minilm", "input": TEXTS, "dimensions": 32}))["embeddings"]),
        vectors(&ok(&server, "/v1/embeddings", json!({"input": TEXTS, "dimensions": 32})))
    );

    // An on-demand model: its load shows in load_duration, then /api/ps, and
    // keep_alive = 0 on the entry unloads it once idle.
    let first = ok(&server, "/api/embed", json!({"model": "minilm-raw", "input": "x", "keep_alive": "5m"}));
    assert!(first["load_duration"].as_u64().unwrap() > 0, "{first}");
    let ps = get(&server, "/api/ps");
    let raw = ps["models"].as_array().unwrap().iter().find(|m| m["name"] == "minilm-raw:latest").expect("minilm-raw loaded").clone();
    assert_eq!((raw["size_vram"].as_u64(), raw["context_length"].as_u64()), (Some(0), Some(256)));
    assert!(raw["expires_at"].as_str().unwrap().ends_with('Z'));
    let again = ok(&server, "/api/embed", json!({"model": "minilm-raw", "input": "x", "keep_alive": 0}));
    assert_eq!(again["load_duration"], 0, "already loaded: {again}");
    server.wait_for_health("minilm-raw to unload (keep_alive 0)", std::time::Duration::from_secs(30), |h| {
        h["models"].as_array().unwrap().iter().any(|m| m["id"] == "minilm-raw" && m["state"] == "unloaded")
    });
    assert!(get(&server, "/api/ps")["models"].as_array().unwrap().iter().all(|m| m["name"] != "minilm-raw:latest"));

    let tags = get(&server, "/api/tags");
    let names: Vec<&str> = tags["models"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["all-minilm-l6-v2:latest", "minilm-raw:latest", "minilm-reranker:latest"]);
    let model = &tags["models"][0];
    assert_eq!(model["digest"].as_str().unwrap().len(), 64, "the manifest's sha256: {model}");
    assert!(model["size"].as_u64().unwrap() > 1_000_000 && model["details"]["format"] == "onnx", "{model}");
    // all-MiniLM-L6-v2's parameters as its graph holds them (22.7M less the
    // pooler, which sentence-transformers does not use), counted from the graph.
    assert_eq!(model["details"]["parameter_size"], "22.6M", "{model}");
    assert!(get(&server, "/api/version")["version"].is_string());
}

#[test]
fn ollama_refusals_in_its_shape_and_the_server_keeps_serving() {
    let server = server();
    assert!(ollama_refusal(&server, "/api/embed", json!({"model": "nope", "input": "x"}), 404).contains("nope"));
    assert!(ollama_refusal(&server, "/api/embed", json!({"input": "x"}), 400).contains("model"));
    assert!(ollama_refusal(&server, "/api/embed", json!({"model": "minilm", "input": []}), 400).contains("empty"));
    assert!(ollama_refusal(&server, "/api/embed", json!({"model": "minilm", "input": [1, 2]}), 400).contains("string"));
    assert!(ollama_refusal(&server, "/api/embed", json!({"model": "minilm-reranker", "input": "x"}), 400).contains("reranker"));
    let long = "retrieval ".repeat(400);
    assert!(ollama_refusal(&server, "/api/embed", json!({"model": "minilm", "input": long, "truncate": false}), 400).contains("tokens"));
    assert!(ollama_refusal(&server, "/api/embeddings", json!({"model": "nope", "prompt": ""}), 404).contains("nope"));
    let (status, body) = server.post_raw("/api/embed", b"{\"model\": ".to_vec(), &[("Authorization", &format!("Bearer {KEY}"))]);
    assert_eq!((status, body.as_object().map(|o| o.len())), (400, Some(1)), "{body}");
    let (status, body) = server.post_raw("/embed", b"{\"inputs\": ".to_vec(), &[("Authorization", &format!("Bearer {KEY}"))]);
    assert_eq!((status, body["error_type"].as_str()), (422, Some("Validation")), "{body}");
    // Without the key: 401 in each API's shape.
    let (status, _, body) = server.post_full("/api/embed", &json!({"model": "minilm", "input": "x"}), &[]);
    assert_eq!((status, body.as_object().map(|o| o.len())), (401, Some(1)), "{body}");
    let (status, _, body) = server.post_full("/embed", &json!({"inputs": "x"}), &[]);
    assert_eq!((status, body["error_type"].as_str()), (401, Some("Validation")), "{body}");
    let (status, _, body) = server.post_full("/v1/embeddings", &json!({"input": "x"}), &[]);
    assert_eq!((status, body["error"]["code"].as_str()), (401, Some("invalid_api_key")), "{body}");
    // Still serving, every model.
    assert_eq!(floats(&ok(&server, "/api/embed", json!({"model": "minilm", "input": "x"}))["embeddings"]).len(), 1);
    assert_eq!(ok(&server, "/rerank", json!({"query": "q", "texts": ["a"]})).as_array().unwrap().len(), 1);
    let metrics = reqwest::blocking::Client::new().get(format!("{}/metrics", server.url)).bearer_auth(KEY).send().unwrap().text().unwrap();
    for route in ["route=\"/api/embed\",status=\"404\"", "route=\"/embed\",status=\"422\"", "route=\"/rerank\",status=\"200\""] {
        assert!(metrics.contains(route), "{route} missing from /metrics");
    }
}

/// The required fields and JSON types of TEI's published schemas (its
/// docs/openapi.json at 1.9.3: Info, SimpleToken, Rank, ErrorResponse), held
/// against eeane's answers.
#[test]
fn tei_answers_have_the_fields_of_teis_schemas() {
    let server = server();
    let kind = |v: &Value| match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_u64() || n.is_i64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    let fields = |what: &str, value: &Value, required: &[(&str, &str)]| {
        for (field, want) in required {
            let got = value.get(field).map(kind);
            assert!(got == Some(want) || (*want == "number" && got == Some("integer")), "{what}.{field}: {got:?}, TEI's schema says {want}: {value}");
        }
    };
    let info = get(&server, "/info");
    fields(
        "Info",
        &info,
        &[
            ("model_id", "string"),
            ("model_dtype", "string"),
            ("model_type", "object"),
            ("max_concurrent_requests", "integer"),
            ("max_input_length", "integer"),
            ("max_batch_tokens", "integer"),
            ("max_client_batch_size", "integer"),
            ("auto_truncate", "boolean"),
            ("tokenization_workers", "integer"),
            ("version", "string"),
        ],
    );
    for token in ok(&server, "/tokenize", json!({"inputs": "hello world"}))[0].as_array().unwrap() {
        fields("SimpleToken", token, &[("id", "integer"), ("text", "string"), ("special", "boolean")]);
    }
    for rank in ok(&server, "/rerank", json!({"query": "q", "texts": ["a", "b"], "return_text": true})).as_array().unwrap() {
        fields("Rank", rank, &[("index", "integer"), ("score", "number"), ("text", "string")]);
    }
    let (_, error) = post(&server, "/embed", json!({"inputs": []}));
    fields("ErrorResponse", &error, &[("error", "string"), ("error_type", "string")]);
    let types = ["Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"];
    assert!(types.contains(&error["error_type"].as_str().unwrap()), "ErrorType is one of TEI's: {error}");
    let vectors = ok(&server, "/embed", json!({"inputs": ["a"]}));
    assert!(vectors[0].as_array().unwrap().iter().all(|x| x.is_f64()), "EmbedResponse is [[number]]");
}

/// Every model route under `/models/{id}` (one segment, a Hub id's two, or
/// its slash as %2F; an alias too) serves the model the URL names, with or
/// without `model` in the body; a body that names another model is refused
/// in each API's shape, naming both; the listings show that one model.
#[test]
fn routes_under_models_id_serve_the_model_the_url_names() {
    let config = format!(
        "[server]\napi_key = \"{KEY}\"\n{}{}{}",
        model_entry("all-minilm-l6-v2", "all-minilm-l6-v2", ""),
        model_entry("org/minilm-raw", "all-minilm-l6-v2", "normalize = false\naliases = [\"raw\"]"),
        model_entry("minilm-reranker", "minilm-reranker", "kind = \"reranker\"\npooling = \"none\"")
    );
    let server = Server::start(Some(&config), &[]);
    let raw = vectors(&ok(&server, "/v1/embeddings", json!({"input": TEXTS, "model": "org/minilm-raw", "encoding_format": "float"})));
    let default = vectors(&ok(&server, "/v1/embeddings", json!({"input": TEXTS, "encoding_format": "float"})));
    assert_ne!(raw, default, "the pinned model must be told apart from the default");
    for prefix in ["/models/org/minilm-raw", "/models/org%2Fminilm-raw", "/models/raw"] {
        for body_model in [Value::Null, json!("org/minilm-raw"), json!("raw")] {
            let body = json!({"input": TEXTS, "model": body_model, "encoding_format": "float"});
            let response = ok(&server, &format!("{prefix}/v1/embeddings"), body.clone());
            assert_eq!((vectors(&response), response["model"].as_str()), (raw.clone(), Some("org/minilm-raw")), "{prefix}, model {body_model}");
            assert_eq!(vectors(&ok(&server, &format!("{prefix}/embeddings"), body)), raw, "{prefix}/embeddings");
        }
        let tei = json!({"inputs": TEXTS, "normalize": false});
        assert_eq!(floats(&ok(&server, &format!("{prefix}/embed"), tei.clone())), raw, "{prefix}/embed");
        assert_eq!(floats(&ok(&server, prefix, tei)), raw, "{prefix} (TEI's root)");
        let ollama = ok(&server, &format!("{prefix}/api/embed"), json!({"input": TEXTS}));
        assert_eq!((floats(&ollama["embeddings"]), ollama["model"].as_str()), (raw.clone(), Some("org/minilm-raw")), "{prefix}/api/embed");
        let listed: Vec<Value> = get(&server, &format!("{prefix}/v1/models"))["data"].as_array().unwrap().iter().map(|m| m["id"].clone()).collect();
        assert_eq!(listed, [json!("org/minilm-raw")], "{prefix}/v1/models");
        let tags: Vec<Value> = get(&server, &format!("{prefix}/api/tags"))["models"].as_array().unwrap().iter().map(|m| m["name"].clone()).collect();
        assert_eq!(tags, [json!("org/minilm-raw:latest")], "{prefix}/api/tags");
        assert_eq!(get(&server, &format!("{prefix}/info"))["model_id"], "org/minilm-raw", "{prefix}/info");
        let tokens = ok(&server, &format!("{prefix}/tokenize"), json!({"inputs": "hello"}));
        assert_eq!(tokens[0].as_array().unwrap().len(), 3, "{tokens}");
    }
    // Rerank under the reranker's prefix, Infinity's body and TEI's.
    let scores = ok(&server, "/v1/rerank", json!({"model": "minilm-reranker", "query": "sort a list", "documents": TEXTS}));
    assert_eq!(ok(&server, "/models/minilm-reranker/v1/rerank", json!({"query": "sort a list", "documents": TEXTS}))["results"], scores["results"]);
    let tei = ok(&server, "/models/minilm-reranker/rerank", json!({"query": "sort a list", "texts": TEXTS}));
    assert_eq!(tei.as_array().unwrap().len(), 3, "{tei}");

    // Another model in the body: each API's own refusal, naming both.
    let (status, body) = post(&server, "/models/raw/v1/embeddings", json!({"input": "x", "model": "all-minilm-l6-v2"}));
    assert_eq!((status, body["error"]["code"].as_str(), body["error"]["param"].as_str()), (400, Some("model_mismatch"), Some("model")), "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("\"raw\"") && message.contains("\"all-minilm-l6-v2\""), "{message}");
    let message = tei_refusal(&server, "/models/raw/embed", json!({"inputs": "x", "model": "all-minilm-l6-v2"}), 422, "Validation");
    assert!(message.contains("all-minilm-l6-v2"), "{message}");
    let message = ollama_refusal(&server, "/models/raw/api/embed", json!({"input": "x", "model": "all-minilm-l6-v2"}), 400);
    assert!(message.contains("all-minilm-l6-v2"), "{message}");
    // A model the server does not have, named by the URL: the usual 404.
    let (status, body) = post(&server, "/models/nope/v1/embeddings", json!({"input": "x"}));
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("model_not_found")), "{body}");
    // And by a list route: a 404 naming it, not an empty list (a client
    // pointed at a misspelt model would otherwise see no models at all).
    let (status, body) = get_status(&server, "/models/nope/v1/models");
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("model_not_found")), "{body}");
    for route in ["/models/nope/api/tags", "/models/nope/api/ps"] {
        let (status, body) = get_status(&server, route);
        assert_eq!((status, body.as_object().map(|o| o.len())), (404, Some(1)), "{route}: {body}");
        assert!(body["error"].as_str().unwrap().contains("nope"), "{route}: {body}");
    }
    // An unknown route under the prefix answers in its API's shape; the server keeps serving.
    let (status, body) = post(&server, "/models/raw/api/nothing", json!({}));
    assert_eq!((status, body.as_object().map(|o| o.len())), (404, Some(1)), "{body}");
    assert!(body["error"].as_str().unwrap().contains(r#""raw" has no route "api/nothing""#), "{body}");
    // A route no model has, after a model's id: a 404 naming both, and the
    // routes there are, not "the model "minilm-reranker/embed_sparse" does
    // not exist" (an id may hold a slash). TEI's `/` is what the path
    // matches, so TEI's shape answers.
    for (path, model) in [("/models/minilm-reranker/embed_sparse", "minilm-reranker"), ("/models/org%2Fminilm-raw/embed_sparse", "org/minilm-raw")] {
        let message = tei_refusal(&server, path, json!({"inputs": "x"}), 404, "Validation");
        assert!(message.contains(&format!("The model {model:?} has no route \"embed_sparse\"")) && message.contains("/v1/embeddings, "), "{message}");
    }
    // GET matches the same POST-only route: a 404 too, not a 405.
    let (status, body) = get_status(&server, "/models/minilm-reranker/embed_sparse");
    assert_eq!((status, body["error_type"].as_str()), (404, Some("Validation")), "{body}");
    assert!(body["error"].as_str().unwrap().contains(r#""minilm-reranker" has no route "embed_sparse""#), "{body}");
    // Matching no route at all, or another API's route: OpenAI's shape.
    for (path, model, route) in
        [("/models/org/minilm-raw/embed_sparse", "org/minilm-raw", "embed_sparse"), ("/models/raw/extra/v1/embeddings", "raw", "extra/v1/embeddings")]
    {
        let (status, body) = post(&server, path, json!({"input": "x"}));
        assert_eq!((status, body["error"]["code"].as_str()), (404, Some("not_found")), "{path}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("The model {model:?} has no route {route:?}")), "{path}: {message}");
    }
    // Without the key, a 404 outside every route names no model: the key
    // guards which models exist.
    let (status, _, body) = server.post_full("/models/org/minilm-raw/embed_sparse", &json!({}), &[]);
    assert_eq!((status, body["error"]["message"].as_str()), (404, Some("No route /models/org/minilm-raw/embed_sparse")), "{body}");
    // A path that starts with no model's id keeps the unknown model's 404.
    let message = tei_refusal(&server, "/models/nope/embed_sparse", json!({"inputs": "x"}), 404, "Validation");
    assert!(message.contains(r#"The model "nope/embed_sparse" does not exist"#), "{message}");
    assert_eq!(vectors(&ok(&server, "/models/raw/v1/embeddings", json!({"input": TEXTS, "encoding_format": "float"}))), raw);
}
