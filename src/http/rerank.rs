//! Infinity/Cohere-compatible `POST /rerank` (and `/v1/rerank`): a query and
//! documents in, the documents' relevance out, best first. A cross-encoder
//! (`kind = "reranker"`) scores each (query, document) pair; an embedding
//! model with `rerank = true` scores by the cosine of their vectors.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::documents::{best_first, documents};
use super::error::ApiError;
use super::openai::{parse_json, parse_keep_alive, read_body};
use super::pinned::PinnedModel;
use super::AppState;
use crate::serving::{KeepAlive, Ranked, RerankRequest as ServeRerank};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct RerankRequest {
    /// A reranker's id or alias (default: the first reranker, else the first rerank = true model).
    pub model: Option<String>,
    #[schema(min_length = 1, required = true, nullable = false)]
    pub query: Option<String>,
    /// Strings, or Cohere's `{"text": ...}` objects.
    #[schema(schema_with = documents_schema, required = true)]
    pub documents: Option<Vec<Value>>,
    /// Return only the best n (default: all).
    #[schema(minimum = 1)]
    pub top_n: Option<i64>,
    #[serde(default)]
    pub return_documents: bool,
    /// A cross-encoder's logits as they are, rather than through a sigmoid.
    #[serde(default)]
    pub raw_scores: bool,
    #[schema(schema_with = super::openai::keep_alive_schema)]
    pub keep_alive: Option<Value>,
    /// eeane's addition: the instruction of a reranker that is a language
    /// model (Qwen3-Reranker), in place of its entry's `rerank_template.instruction`.
    pub instruction: Option<String>,
}

fn documents_schema() -> utoipa::openapi::schema::Array {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Type};
    let text = || ObjectBuilder::new().schema_type(Type::String).min_length(Some(1));
    ArrayBuilder::new().items(OneOfBuilder::new().item(text()).item(ObjectBuilder::new().property("text", text()).required("text"))).min_items(Some(1)).build()
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct RerankResult {
    index: usize,
    relevance_score: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    document: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = RerankUsage)]
pub struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct RerankResponse {
    object: &'static str,
    model: String,
    results: Vec<RerankResult>,
    usage: Usage,
    id: String,
    created: u64,
}

/// A rerank request checked as far as it can be without a model (the fuzz
/// target `request_bodies` drives this with arbitrary bytes).
pub struct ParsedRerank {
    /// The request, its query, documents and keep_alive taken into the fields below.
    pub request: RerankRequest,
    pub query: String,
    pub docs: Vec<String>,
    pub top_n: usize,
    pub keep_alive: Option<KeepAlive>,
}

pub fn parse_rerank(body: &[u8], max_inputs: usize) -> Result<ParsedRerank, ApiError> {
    let mut request: RerankRequest = parse_json(body)?;
    let query = match request.query.take() {
        Some(q) if !q.is_empty() => q,
        Some(_) => return Err(ApiError::invalid_request("empty_query", "query is empty").with_param("query")),
        None => return Err(ApiError::invalid_request("missing_query", "query is required").with_param("query")),
    };
    let docs = documents(request.documents.take(), max_inputs, "documents")?;
    let top_n = match request.top_n {
        None => docs.len(),
        Some(n) if n >= 1 => (n as usize).min(docs.len()),
        Some(_) => return Err(ApiError::invalid_request("invalid_top_n", "top_n must be at least 1").with_param("top_n")),
    };
    let keep_alive = parse_keep_alive(request.keep_alive.take())?;
    Ok(ParsedRerank { request, query, docs, top_n, keep_alive })
}

/// Either body `/rerank` takes: the keys decide (`texts` without
/// `documents` is TEI's).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum RerankBody {
    Infinity(RerankRequest),
    Tei(super::tei::TeiRerankRequest),
}

/// Either answer: Infinity's for its body, TEI's list of ranks for TEI's.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum RerankAnswer {
    Infinity(RerankResponse),
    Tei(Vec<super::tei::Rank>),
}

/// Either error shape: Infinity's body is refused in OpenAI's, TEI's in TEI's.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum RerankError {
    Infinity(super::error::ErrorResponse),
    Tei(super::error::TeiErrorResponse),
}

/// Infinity/Cohere rerank (`query` and `documents`): the documents'
/// relevance to the query, best first. A body with TEI's `texts` instead is
/// answered in TEI's shape, errors included.
#[utoipa::path(post, path = "/v1/rerank", tag = "rerank", request_body = RerankBody,
    responses((status = 200, body = RerankAnswer), (status = "4XX", body = RerankError), (status = "5XX", body = RerankError)))]
pub async fn rerank(State(app): State<AppState>, pinned: PinnedModel, body: Result<Bytes, BytesRejection>) -> Result<axum::response::Response, ApiError> {
    let body = read_body(body)?;
    if super::tei::is_tei_rerank(&body) {
        return super::tei::rerank_body(&app, &pinned, &body).await;
    }
    let max_inputs = app.service.live().config.server.max_inputs;
    let ParsedRerank { request, query, docs, top_n, keep_alive } = parse_rerank(&body, max_inputs)?;
    // The documents move into the request; a copy is kept only to return them.
    let count = docs.len();
    let returned = request.return_documents.then(|| docs.clone());
    let ranked = app
        .service
        .rerank(ServeRerank {
            model: pinned.choose(&app.service, request.model)?,
            query,
            documents: docs,
            raw_scores: request.raw_scores,
            keep_alive,
            instruction: request.instruction,
        })
        .await?;
    let Ranked { model, scores, tokens } = ranked;
    let results = best_first(&scores)
        .into_iter()
        .take(top_n)
        .map(|index| RerankResult { index, relevance_score: scores[index], document: returned.as_ref().map(|d| d[index].clone()) })
        .collect();
    let summary = super::RequestSummary { model: model.clone(), inputs: count, tokens };
    let response = RerankResponse {
        object: "rerank",
        model,
        results,
        usage: Usage { prompt_tokens: tokens, total_tokens: tokens },
        id: format!("rerank-{:032x}", rand::rng().random::<u128>()),
        created: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
    };
    Ok((axum::Extension(summary), Json(response)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_take_strings_and_cohere_objects_and_refuse_the_rest() {
        let got = documents(Some(vec![Value::from("a"), serde_json::json!({"text": "b"})]), 10, "documents").unwrap();
        assert_eq!(got, ["a", "b"]);
        assert_eq!(documents(Some(vec![]), 10, "documents").unwrap_err().code, "empty_documents");
        assert_eq!(documents(None, 10, "documents").unwrap_err().code, "missing_documents");
        assert_eq!(documents(Some(vec![Value::from("a"); 3]), 2, "documents").unwrap_err().code, "too_many_documents");
        assert_eq!(documents(Some(vec![Value::from(1)]), 2, "texts").unwrap_err().param.as_deref(), Some("texts[0]"));
        assert_eq!(best_first(&[0.1, 0.9, 0.1, 0.5]), [1, 3, 0, 2]);
    }
}
