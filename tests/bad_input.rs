//! Bad input gets the documented status and error JSON, and the server keeps serving.

mod common;

use common::Server;
use serde_json::{json, Value};

fn assert_error(status: u16, body: &Value, want_status: u16, want_code: &str, want_param: Option<&str>) {
    assert_eq!(status, want_status, "{body}");
    let error = &body["error"];
    assert_eq!(error["code"], want_code, "{body}");
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert!(error["type"].as_str().is_some(), "{body}");
    assert!(error.as_object().unwrap().contains_key("param"), "{body}");
    if let Some(param) = want_param {
        assert_eq!(error["param"], param, "{body}");
    }
}

/// A bad request: what it is, its body, and the status, code and param it must get.
type Case = (&'static str, Vec<u8>, u16, &'static str, Option<&'static str>);

#[test]
fn every_bad_request_is_a_clear_error_and_the_server_keeps_serving() {
    let server = Server::start(None, &[("EEANE_MAX_REQUEST_BYTES", "65536"), ("EEANE_ACCEPT_TOKEN_IDS", "true")]);
    let good = server.embed(json!("still serving"), json!({}));

    let cases: Vec<Case> = vec![
        ("malformed JSON", b"{\"input\": \"x\"".to_vec(), 400, "invalid_json", None),
        ("not JSON at all", b"input=hello".to_vec(), 400, "invalid_json", None),
        ("missing input", br#"{"model": "all-minilm-l6-v2"}"#.to_vec(), 400, "missing_input", Some("input")),
        ("number input", br#"{"input": 5}"#.to_vec(), 422, "invalid_type", Some("input")),
        ("object input", br#"{"input": {"a": 1}}"#.to_vec(), 422, "invalid_type", Some("input")),
        ("mixed list", br#"{"input": ["a", 3]}"#.to_vec(), 422, "invalid_type", Some("input[1]")),
        ("mixed id lists", br#"{"input": [[1, 2], "a"]}"#.to_vec(), 422, "invalid_type", Some("input[1]")),
        ("float token id", br#"{"input": [1, 2.5]}"#.to_vec(), 422, "invalid_token_id", Some("input[1]")),
        ("negative token id", br#"{"input": [[5, -1]]}"#.to_vec(), 422, "invalid_token_id", Some("input[0][1]")),
        ("model not a string", br#"{"input": "a", "model": 7}"#.to_vec(), 422, "invalid_type", Some("model")),
        ("dimensions not a number", br#"{"input": "a", "dimensions": "x"}"#.to_vec(), 422, "invalid_type", Some("dimensions")),
        ("unknown encoding", br#"{"input": "a", "encoding_format": "hex"}"#.to_vec(), 422, "invalid_type", Some("encoding_format")),
        ("empty string", br#"{"input": ""}"#.to_vec(), 400, "empty_input", Some("input")),
        ("empty list", br#"{"input": []}"#.to_vec(), 400, "empty_input", Some("input")),
        ("empty string in list", br#"{"input": ["a", ""]}"#.to_vec(), 400, "empty_input", Some("input[1]")),
        ("empty id list", br#"{"input": [[1], []]}"#.to_vec(), 400, "empty_input", Some("input[1]")),
        ("dimensions zero", br#"{"input": "a", "dimensions": 0}"#.to_vec(), 400, "invalid_dimensions", Some("dimensions")),
        ("dimensions too large", br#"{"input": "a", "dimensions": 385}"#.to_vec(), 400, "invalid_dimensions", Some("dimensions")),
        ("out-of-vocabulary id", br#"{"input": [[101, 2023, 30522]]}"#.to_vec(), 422, "token_id_out_of_vocabulary", Some("input[0][2]")),
        ("tiktoken-sized id", br#"{"input": [9906, 1917, 100257]}"#.to_vec(), 422, "token_id_out_of_vocabulary", Some("input[2]")),
        ("unknown model", br#"{"input": "a", "model": "text-embedding-3-small"}"#.to_vec(), 404, "model_not_found", Some("model")),
    ];
    for (name, body, status, code, param) in cases {
        let (got_status, got) = server.post_raw("/v1/embeddings", body, &[]);
        eprintln!("{name}: {got_status} {got}");
        assert_error(got_status, &got, status, code, param);
    }

    let (status, body) = server.post("/v1/embeddings", &json!({"input": "a", "model": "nope"}));
    assert_error(status, &body, 404, "model_not_found", Some("model"));
    assert!(body["error"]["message"].as_str().unwrap().contains("all-minilm-l6-v2"), "404 lists the servable ids");

    let too_many: Vec<String> = (0..2049).map(|i| format!("t{i}")).collect();
    let (status, body) = server.post("/v1/embeddings", &json!({ "input": too_many }));
    assert_error(status, &body, 413, "too_many_inputs", Some("input"));

    let oversize = json!({"input": "word ".repeat(20_000)}).to_string().into_bytes();
    let (status, body) = server.post_raw("/v1/embeddings", oversize, &[]);
    assert_error(status, &body, 413, "body_too_large", None);

    let (status, body) = server.get("/v1/nothing-here");
    assert_error(status, &body, 404, "not_found", None);
    let (status, body) = server.get("/v1/embeddings");
    assert_error(status, &body, 405, "method_not_allowed", None);

    // Exactly the limit is fine, and the server still answers as before.
    let limit: Vec<String> = (0..2048).map(|i| format!("t{i}")).collect();
    assert_eq!(server.embed(json!(limit), json!({})).len(), 2048);
    // Found by the schema-driven attack's review: a keep_alive longer than a
    // Duration holds panicked the handler; it now means "never unload".
    for huge in [json!(1e300), json!(-1e300), json!("999999999d")] {
        let (status, body) = server.post("/v1/embeddings", &json!({"input": "x", "keep_alive": huge}));
        assert_eq!(status, 200, "keep_alive {huge}: {body}");
    }
    assert_eq!(server.embed(json!("still serving"), json!({})), good);
}

#[test]
fn api_key_guards_everything_but_health() {
    let server = Server::start(None, &[("EEANE_API_KEY", "s3cret")]);
    let (status, body) = server.post("/v1/embeddings", &json!({"input": "a"}));
    assert_error(status, &body, 401, "invalid_api_key", None);
    let (status, body) = server.post_raw("/v1/embeddings", br#"{"input": "a"}"#.to_vec(), &[("authorization", "Bearer wrong")]);
    assert_error(status, &body, 401, "invalid_api_key", None);
    let (status, body) = server.get("/v1/models");
    assert_error(status, &body, 401, "invalid_api_key", None);
    let (status, _) = server.post_raw("/v1/embeddings", br#"{"input": "a"}"#.to_vec(), &[("authorization", "Bearer s3cret")]);
    assert_eq!(status, 200);
    assert_eq!(server.get("/health").0, 200);
}

#[test]
fn a_model_whose_output_is_not_finite_gets_a_500_naming_it_and_the_others_serve() {
    // A real ONNX graph whose states are sqrt(8 - length): NaN past 8 tokens.
    let dir = tempfile::tempdir().unwrap();
    let graph = dir.path().join("nan.onnx");
    let python = std::env::var_os("EEANE_PYTHON").map(std::path::PathBuf::from).unwrap_or_else(|| common::cache_dir().join("venv/bin/python"));
    let made = std::process::Command::new(python).arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/reference/nan_model.py")).arg(&graph).status().unwrap();
    assert!(made.success());
    let config = format!(
        "[[models]]\nid = \"nan-model\"\nengine = \"onnxruntime\"\nmodel = \"{}\"\ntokenizer = \"{}\"\nmax_tokens = 64\nnormalize = false\n{}",
        graph.display(),
        common::minilm_dir().join("tokenizer.json").display(),
        common::model_entry("good", "all-minilm-l6-v2", "")
    );
    let server = Server::start(Some(&config), &[]);
    let (status, body) = server.post("/v1/embeddings", &json!({"model": "nan-model", "input": "hello"}));
    assert_eq!(status, 200, "short inputs are finite: {body}");
    let (status, body) = server.post("/v1/embeddings", &json!({"model": "nan-model", "input": ["hello", "one two three four five six seven eight nine"]}));
    assert_error(status, &body, 500, "engine_error", None);
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("nan-model") && message.contains("non-finite"), "{message}");
    let (status, _) = server.post("/v1/embeddings", &json!({"model": "nan-model", "input": "hello"}));
    assert_eq!(status, 200, "the model itself keeps serving");
    let (status, _) = server.post("/v1/embeddings", &json!({"model": "good", "input": "hello"}));
    assert_eq!(status, 200, "the other model keeps serving");
}
