//! /openapi.json: a valid OpenAPI 3 document (parsed by the oas3 crate) that
//! lists exactly the routes the server answers, each answering as listed.

mod common;

use common::{model_entry, Server};
use serde_json::{json, Value};

/// Every route the router answers (method, path), as a client sees them.
const ROUTES: &[(&str, &str)] = &[
    ("post", "/v1/embeddings"),
    ("post", "/embeddings"),
    ("post", "/v1/rerank"),
    ("post", "/rerank"),
    ("get", "/v1/models"),
    ("get", "/models"),
    ("get", "/health"),
    ("get", "/v1/health"),
    ("get", "/metrics"),
    ("get", "/v1/metrics"),
    ("post", "/admin/reload"),
    ("get", "/openapi.json"),
    // Text Embeddings Inference's
    ("post", "/"),
    ("post", "/embed"),
    ("post", "/tokenize"),
    ("post", "/decode"),
    ("get", "/info"),
    // Ollama's
    ("post", "/api/embed"),
    ("post", "/api/embeddings"),
    ("get", "/api/tags"),
    ("get", "/api/ps"),
    ("get", "/api/version"),
];

#[test]
fn the_document_is_openapi_3_and_lists_every_route() {
    let server = Server::start(Some(&model_entry("m", "all-minilm-l6-v2", "rerank = true")), &[]);
    let text = reqwest::blocking::get(format!("{}/openapi.json", server.url)).unwrap().text().unwrap();
    let spec = oas3::from_json(&text).unwrap_or_else(|e| panic!("not a valid OpenAPI document: {e}"));
    assert!(spec.openapi.starts_with("3."), "{}", spec.openapi);
    let doc: Value = serde_json::from_str(&text).unwrap();
    let mut listed: Vec<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| item.as_object().unwrap().keys().filter(|k| *k != "servers").map(move |m| (m.clone(), path.clone())))
        .collect();
    listed.sort();
    let mut routes: Vec<(String, String)> = ROUTES.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect();
    routes.sort();
    assert_eq!(listed, routes, "the document and the router disagree");
    // The /models/{model} prefix, said once as a server; the routes that serve no model keep the root only.
    assert_eq!(doc["servers"][1]["url"], "/models/{model}", "{}", doc["servers"]);
    for path in ["/health", "/metrics", "/openapi.json", "/admin/reload"] {
        assert_eq!(doc["paths"][path]["servers"], json!([{"url": "/", "description": "the model the body names, else the default"}]), "{path}");
    }
    assert!(doc["paths"]["/v1/embeddings"].get("servers").is_none());
    // Unique operation ids: Swagger UI at /docs finds operations by id.
    let mut ids: Vec<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|item| item.as_object().unwrap().iter().filter(|(k, _)| *k != "servers").map(|(_, op)| op["operationId"].as_str().unwrap()))
        .collect();
    ids.sort();
    let before = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), before, "operation ids repeat: {ids:?}");
    for schema in [
        "EmbeddingsRequest",
        "EmbeddingsResponse",
        "RerankRequest",
        "RerankResponse",
        "ErrorResponse",
        "ModelList",
        "ModelObject",
        "Reloaded",
        "Health",
        "ModelHealth",
        "TeiEmbedRequest",
        "TeiRerankRequest",
        "TeiErrorResponse",
        "Rank",
        "Token",
        "Info",
        "OllamaEmbedRequest",
        "OllamaEmbedResponse",
        "OllamaModels",
        "OllamaErrorResponse",
    ] {
        assert!(doc["components"]["schemas"].get(schema).is_some(), "{schema} missing");
    }
    // Each listed operation is answered (a real answer or a validation error, never "no route").
    let client = reqwest::blocking::Client::new();
    for (method, path) in ROUTES {
        let url = format!("{}{path}", server.url);
        let response = match *method {
            "get" => client.get(&url).send().unwrap(),
            _ => client.post(&url).body(json!({"input": "x", "inputs": "x", "model": "m", "query": "q", "documents": ["d"]}).to_string()).send().unwrap(),
        };
        let status = response.status().as_u16();
        assert!(status != 404 && status != 405, "{method} {path}: {status}");
    }
    let (status, _) = server.get("/docs");
    assert_eq!(status, 200, "the docs page answers");
}
