//! Text Embeddings Inference's API, so that TEI's clients work unchanged:
//! `POST /embed`, `POST /` (what `huggingface_hub.InferenceClient` posts to a
//! base URL), TEI's shape of `POST /rerank` (`texts` rather than Infinity's
//! `documents`; rerank.rs hands such a body here), `POST /tokenize`,
//! `POST /decode` and `GET /info`. Errors come in TEI's shape and statuses
//! (`Dialect::Tei`). TEI serves one model; here a request may name one with
//! `model`, and otherwise gets the first embedding model (or the default
//! reranker), as the OpenAI routes do.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::{ApiError, Dialect};
use super::openai::{parse_input_field, parse_json, read_body};
use super::pinned::PinnedModel;
use super::AppState;
use crate::serving::{EmbedRequest, Embedded, Inputs, LongInputs, Ranked, RerankRequest as ServeRerank, Token, TokenizeRequest};

fn yes() -> bool {
    true
}

/// Which end of a long input TEI would cut; eeane keeps the start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
pub enum TruncationDirection {
    #[serde(alias = "left")]
    Left,
    #[default]
    #[serde(alias = "right")]
    Right,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct TeiEmbedRequest {
    /// A string, an array of strings, an array of token ids, or an array of
    /// token-id arrays.
    #[schema(value_type = Object, required = true)]
    pub inputs: Option<Value>,
    /// Unit-length vectors (TEI's default). `false` is refused for a model
    /// whose configuration normalizes: its raw vectors are not kept.
    #[serde(default = "yes")]
    pub normalize: bool,
    /// `false` refuses an input longer than the model takes; `true` or
    /// absent embeds it as the model is configured to (`long_text`).
    pub truncate: Option<bool>,
    /// Only `Right` (keep the start).
    pub truncation_direction: Option<TruncationDirection>,
    /// One of the model's prompts, put before each text input.
    pub prompt_name: Option<String>,
    /// Keep the first n dimensions, renormalized.
    #[schema(minimum = 1)]
    pub dimensions: Option<usize>,
    /// eeane's addition: a model id or alias (default: the first embedding model).
    pub model: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct TeiRerankRequest {
    #[schema(min_length = 1, required = true, nullable = false)]
    pub query: Option<String>,
    #[schema(value_type = Vec<String>, required = true)]
    pub texts: Option<Vec<Value>>,
    /// A cross-encoder's logits as they are, rather than through a sigmoid.
    #[serde(default)]
    pub raw_scores: bool,
    /// Return each text beside its score.
    #[serde(default)]
    pub return_text: bool,
    /// Accepted; documents are cut to fit beside the query.
    pub truncate: Option<bool>,
    /// Only `Right` (keep the start).
    pub truncation_direction: Option<TruncationDirection>,
    /// eeane's addition: a reranker's id or alias (default: the first reranker).
    pub model: Option<String>,
    /// eeane's addition: the instruction of a reranker that is a language
    /// model (Qwen3-Reranker), in place of its entry's.
    pub instruction: Option<String>,
}

/// One text's score, as TEI's `/rerank` answers.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Rank {
    pub index: usize,
    pub score: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct TeiTokenizeRequest {
    /// A string or an array of strings.
    #[schema(value_type = Object, required = true)]
    pub inputs: Option<Value>,
    #[serde(default = "yes")]
    pub add_special_tokens: bool,
    pub prompt_name: Option<String>,
    /// eeane's addition: a model id or alias (default: the first embedding model).
    pub model: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct TeiDecodeRequest {
    /// One list of token ids, or a list of them.
    #[schema(value_type = Object, required = true)]
    pub ids: Option<Value>,
    #[serde(default = "yes")]
    pub skip_special_tokens: bool,
    /// eeane's addition: a model id or alias (default: the first embedding model).
    pub model: Option<String>,
}

/// `GET /info`, for the model a request without `model` gets.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Info {
    pub model_id: String,
    pub model_sha: Option<String>,
    pub model_dtype: String,
    /// `{"embedding": {"pooling": ...}}` or `{"reranker": {...}}`.
    #[schema(value_type = Object)]
    pub model_type: Value,
    pub max_concurrent_requests: usize,
    pub max_input_length: usize,
    pub max_batch_tokens: usize,
    pub max_client_batch_size: usize,
    /// Long inputs are cut (or windowed) as the model is configured, unless a
    /// request sends `truncate: false`.
    pub auto_truncate: bool,
    pub tokenization_workers: usize,
    pub version: &'static str,
    pub sha: Option<String>,
    pub docker_label: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct InfoQuery {
    /// eeane's addition: a model id or alias.
    pub model: Option<String>,
}

/// TEI's name of a precision; a graph run as it is, or a model not yet loaded, is float32.
fn dtype(precision: Option<&str>) -> &str {
    match precision {
        Some("fp16" | "f16") => "float16",
        Some("bf16") => "bfloat16",
        Some("int8") => "int8",
        Some("fp32" | "f32" | "as-graph") | None => "float32",
        Some(other) => other,
    }
}

fn tei(e: impl Into<ApiError>) -> ApiError {
    e.into().in_dialect(Dialect::Tei)
}

fn refuse_left(direction: Option<TruncationDirection>) -> Result<(), ApiError> {
    match direction {
        Some(TruncationDirection::Left) => Err(tei(ApiError::invalid_request(
            "unsupported_truncation_direction",
            "truncation_direction Left is not supported: eeane keeps the start of a long input",
        )
        .with_param("truncation_direction"))),
        _ => Ok(()),
    }
}

/// Which keys a body has, read without building its values: it decides
/// between TEI's and Infinity's rerank on one path, and between embed and
/// rerank on `/`.
#[derive(Deserialize, Default)]
struct Keys {
    query: Option<IgnoredAny>,
    texts: Option<IgnoredAny>,
    documents: Option<IgnoredAny>,
}

fn keys(body: &[u8]) -> Keys {
    serde_json::from_slice(body).unwrap_or_default()
}

/// Whether a `/rerank` body is TEI's (`texts`, no `documents`).
pub fn is_tei_rerank(body: &[u8]) -> bool {
    let k = keys(body);
    k.texts.is_some() && k.documents.is_none()
}

/// A TEI embed body checked as far as it can be without a model (the fuzz
/// target `request_bodies` drives this with arbitrary bytes): the request,
/// its inputs (taken out of it) and what it asks of long ones.
pub fn parse_embed(body: &[u8], max_inputs: usize) -> Result<(TeiEmbedRequest, Inputs, LongInputs), ApiError> {
    let mut request: TeiEmbedRequest = parse_json(body).map_err(tei)?;
    refuse_left(request.truncation_direction)?;
    let inputs = parse_input_field(request.inputs.take(), max_inputs, "inputs").map_err(tei)?;
    let long_inputs = if request.truncate == Some(false) { LongInputs::Refuse } else { LongInputs::AsConfigured };
    Ok((request, inputs, long_inputs))
}

/// A TEI rerank body, checked likewise: the request, its query and texts.
pub fn parse_rerank(body: &[u8], max_inputs: usize) -> Result<(TeiRerankRequest, String, Vec<String>), ApiError> {
    let mut request: TeiRerankRequest = parse_json(body).map_err(tei)?;
    refuse_left(request.truncation_direction)?;
    let query = match request.query.take() {
        Some(q) if !q.is_empty() => q,
        Some(_) => return Err(tei(ApiError::invalid_request("empty_query", "query is empty").with_param("query"))),
        None => return Err(tei(ApiError::invalid_request("missing_query", "query is required").with_param("query"))),
    };
    let texts = super::documents::documents(request.texts.take(), max_inputs, "texts").map_err(tei)?;
    Ok((request, query, texts))
}

/// A /tokenize body, checked likewise: the request and its texts.
pub fn parse_tokenize(body: &[u8], max_inputs: usize) -> Result<(TeiTokenizeRequest, Vec<String>), ApiError> {
    let mut request: TeiTokenizeRequest = parse_json(body).map_err(tei)?;
    match parse_input_field(request.inputs.take(), max_inputs, "inputs").map_err(tei)? {
        Inputs::Texts(texts) => Ok((request, texts)),
        _ => Err(tei(ApiError::unprocessable("invalid_type", "inputs must be a string or an array of strings").with_param("inputs"))),
    }
}

/// A /decode body, checked likewise: the request and its lists of ids.
pub fn parse_decode(body: &[u8], max_inputs: usize) -> Result<(TeiDecodeRequest, Vec<Vec<i64>>), ApiError> {
    let mut request: TeiDecodeRequest = parse_json(body).map_err(tei)?;
    match parse_input_field(request.ids.take(), max_inputs, "ids").map_err(tei)? {
        Inputs::TokenIds(ids) => Ok((request, ids)),
        _ => Err(tei(ApiError::unprocessable("invalid_type", "ids must be an array of token ids or of token-id arrays").with_param("ids"))),
    }
}

pub async fn embed_body(app: &AppState, pinned: &PinnedModel, body: &[u8]) -> Result<Response, ApiError> {
    let max_inputs = app.service.live().config.server.max_inputs;
    let (request, inputs, long_inputs) = parse_embed(body, max_inputs)?;
    let embedded = app
        .service
        .embed(EmbedRequest {
            model: pinned.choose(&app.service, request.model).map_err(tei)?,
            inputs,
            prompt_name: request.prompt_name,
            dimensions: request.dimensions,
            keep_alive: None,
            long_inputs,
            unit_length: Some(request.normalize),
        })
        .await
        .map_err(tei)?;
    let Embedded { model, vectors, tokens } = embedded;
    let summary = super::RequestSummary { model, inputs: vectors.len(), tokens };
    Ok((axum::Extension(summary), Json(vectors)).into_response())
}

/// TEI's embed: one vector per input, `[[f32]]`.
#[utoipa::path(post, path = "/embed", operation_id = "tei_embed", tag = "tei", request_body = TeiEmbedRequest,
    responses((status = 200, body = Vec<Vec<f32>>), (status = "4XX", body = super::error::TeiErrorResponse), (status = "5XX", body = super::error::TeiErrorResponse)))]
pub async fn embed(State(app): State<AppState>, pinned: PinnedModel, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    embed_body(&app, &pinned, &read_body(body).map_err(tei)?).await
}

/// TEI's rerank (`/rerank` with a TEI body, or `/` with a query and texts):
/// each text's score, best first.
pub async fn rerank_body(app: &AppState, pinned: &PinnedModel, body: &[u8]) -> Result<Response, ApiError> {
    let max_inputs = app.service.live().config.server.max_inputs;
    let (request, query, texts) = parse_rerank(body, max_inputs)?;
    let returned = request.return_text.then(|| texts.clone());
    let count = texts.len();
    let Ranked { model, scores, tokens } = app
        .service
        .rerank(ServeRerank {
            model: pinned.choose(&app.service, request.model).map_err(tei)?,
            query,
            documents: texts,
            raw_scores: request.raw_scores,
            keep_alive: None,
            instruction: request.instruction,
        })
        .await
        .map_err(tei)?;
    let ranks: Vec<Rank> = super::documents::best_first(&scores)
        .into_iter()
        .map(|index| Rank { index, score: scores[index], text: returned.as_ref().map(|t| t[index].clone()) })
        .collect();
    let summary = super::RequestSummary { model, inputs: count, tokens };
    Ok((axum::Extension(summary), Json(ranks)).into_response())
}

/// `POST /`: what `InferenceClient(base_url=...)` posts. A query and texts
/// are reranked; anything else is embedded.
#[utoipa::path(post, path = "/", operation_id = "tei_root", tag = "tei", request_body = TeiEmbedRequest,
    responses((status = 200, description = "as /embed, or as TEI's /rerank for a body with query and texts", body = Vec<Vec<f32>>),
        (status = "4XX", body = super::error::TeiErrorResponse), (status = "5XX", body = super::error::TeiErrorResponse)))]
pub async fn root(State(app): State<AppState>, pinned: PinnedModel, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = read_body(body).map_err(tei)?;
    let k = keys(&body);
    if k.query.is_some() && k.texts.is_some() {
        rerank_body(&app, &pinned, &body).await
    } else {
        embed_body(&app, &pinned, &body).await
    }
}

/// The tokens eeane would embed for each input, with special tokens and byte
/// offsets (not truncated).
#[utoipa::path(post, path = "/tokenize", operation_id = "tei_tokenize", tag = "tei", request_body = TeiTokenizeRequest,
    responses((status = 200, body = Vec<Vec<Token>>), (status = "4XX", body = super::error::TeiErrorResponse), (status = "5XX", body = super::error::TeiErrorResponse)))]
pub async fn tokenize(State(app): State<AppState>, pinned: PinnedModel, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let max_inputs = app.service.live().config.server.max_inputs;
    let (request, texts) = parse_tokenize(&read_body(body).map_err(tei)?, max_inputs)?;
    let model = pinned.choose(&app.service, request.model).map_err(tei)?;
    let request = TokenizeRequest { model, texts, add_special_tokens: request.add_special_tokens, prompt_name: request.prompt_name };
    let (model, tokens) = app.service.tokenize(request).await.map_err(tei)?;
    let summary = super::RequestSummary { model, inputs: tokens.len(), tokens: tokens.iter().map(Vec::len).sum() };
    Ok((axum::Extension(summary), Json(tokens)).into_response())
}

/// The text of token ids.
#[utoipa::path(post, path = "/decode", operation_id = "tei_decode", tag = "tei", request_body = TeiDecodeRequest,
    responses((status = 200, body = Vec<String>), (status = "4XX", body = super::error::TeiErrorResponse), (status = "5XX", body = super::error::TeiErrorResponse)))]
pub async fn decode(State(app): State<AppState>, pinned: PinnedModel, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let max_inputs = app.service.live().config.server.max_inputs;
    let (request, ids) = parse_decode(&read_body(body).map_err(tei)?, max_inputs)?;
    let model = pinned.choose(&app.service, request.model).map_err(tei)?;
    let (model, texts) = app.service.decode(model.as_deref(), ids, request.skip_special_tokens).await.map_err(tei)?;
    let summary = super::RequestSummary { model, inputs: texts.len(), tokens: 0 };
    Ok((axum::Extension(summary), Json(texts)).into_response())
}

/// The model a request without `model` gets (or `?model=`), as TEI describes
/// the one model it serves.
#[utoipa::path(get, path = "/info", operation_id = "tei_info", tag = "tei", params(InfoQuery),
    responses((status = 200, body = Info), (status = "4XX", body = super::error::TeiErrorResponse)))]
pub async fn info(State(app): State<AppState>, pinned: PinnedModel, Query(mut query): Query<InfoQuery>) -> Result<Json<Info>, ApiError> {
    query.model = pinned.choose(&app.service, query.model).map_err(tei)?;
    let live = app.service.live();
    let states = app.service.model_states();
    let wanted = match query.model.as_deref() {
        Some(name) => states.iter().find(|m| m.id == name || m.aliases.iter().any(|a| a == name)),
        None => states.iter().find(|m| m.kind == "embedding").or(states.first()),
    };
    let Some(model) = wanted else {
        let name = query.model.unwrap_or_default();
        return Err(tei(crate::serving::RequestError::unknown_model(&name, states.iter().map(|m| m.id.as_str()).collect())));
    };
    let config = live.config.models.iter().find(|m| m.id == model.id);
    let model_type = match (model.kind.as_str(), config) {
        ("reranker", _) => serde_json::json!({"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}),
        (_, Some(c)) => serde_json::json!({"embedding": {"pooling": serde_json::to_value(c.pooling).unwrap_or_default()}}),
        _ => serde_json::json!({"embedding": {"pooling": "mean"}}),
    };
    Ok(Json(Info {
        model_id: config.and_then(|c| c.source.clone()).unwrap_or_else(|| model.id.clone()),
        model_sha: None,
        model_dtype: dtype(model.loaded_model.as_ref().map(|l| l.precision.as_str())).to_string(),
        model_type,
        max_concurrent_requests: live.config.server.max_pending_requests,
        max_input_length: model.max_tokens,
        max_batch_tokens: config.map_or(0, |c| c.max_batch_tokens),
        max_client_batch_size: live.config.server.max_inputs,
        auto_truncate: true,
        tokenization_workers: rayon::current_num_threads(),
        version: env!("CARGO_PKG_VERSION"),
        sha: None,
        docker_label: None,
    }))
}
