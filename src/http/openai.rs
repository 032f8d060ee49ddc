//! OpenAI-compatible `POST /v1/embeddings` and `GET /v1/models`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};

use super::error::ApiError;
use super::pinned::PinnedModel;
use super::AppState;
use crate::serving::{EmbedRequest, Embedded, Inputs, KeepAlive};
use std::time::Duration;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct EmbeddingsRequest {
    /// A string, an array of strings, an array of token ids, or an array of
    /// token-id arrays (token ids only for a model with accept_token_ids).
    #[schema(schema_with = input_schema, required = true)]
    pub input: Option<Value>,
    /// A model id or alias (default: the first embedding model).
    pub model: Option<String>,
    pub encoding_format: Option<EncodingFormat>,
    /// Keep the first n dimensions, renormalized (at most the model's width).
    #[schema(minimum = 1)]
    pub dimensions: Option<usize>,
    /// How long the model stays loaded after this request (Ollama's field):
    /// seconds, or a duration such as "5m"; 0 unloads at once, negative never.
    #[schema(schema_with = keep_alive_schema)]
    pub keep_alive: Option<Value>,
    /// One of the model's prompts (sentence-transformers' and TEI's
    /// `prompt_name`), put before each text input; without it the model's
    /// default prompt, if it has one. Counted in `usage`.
    pub prompt_name: Option<String>,
    /// Accepted for compatibility; unused.
    #[allow(dead_code)]
    pub user: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    #[default]
    Float,
    Base64,
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum EmbeddingValue {
    Float(Vec<f32>),
    /// Little-endian f32 bytes, as openai-python requests by default.
    Base64(String),
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct EmbeddingData {
    object: &'static str,
    index: usize,
    embedding: EmbeddingValue,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct EmbeddingsResponse {
    object: &'static str,
    data: Vec<EmbeddingData>,
    model: String,
    usage: Usage,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

/// The body, or the error for one too large or unreadable.
pub fn read_body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::too_large("body_too_large", "The request body is larger than the server accepts (server.max_request_bytes)"),
        _ if stalled(&rejection) => ApiError::body_timeout(),
        _ => ApiError::invalid_request("unreadable_body", rejection.body_text()),
    })
}

/// Whether the body failed because no byte came within server.body_read_timeout.
fn stalled(rejection: &BytesRejection) -> bool {
    super::error::caused_by(rejection, |e| e.is::<tower_http::timeout::TimeoutError>())
}

/// Reads a JSON body: syntax errors are 400, wrong types 422 naming the field.
pub fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => ApiError::unprocessable("invalid_type", format!("{path}: {inner}")).with_param(path),
            _ => ApiError::invalid_request("invalid_json", format!("The body is not valid JSON: {inner}")),
        }
    })
}

fn non_empty_string() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String).min_length(Some(1))
}

fn token_id() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(0))
}

fn input_schema() -> Schema {
    Schema::OneOf(
        OneOfBuilder::new()
            .item(non_empty_string())
            .item(ArrayBuilder::new().items(non_empty_string()).min_items(Some(1)))
            .item(ArrayBuilder::new().items(token_id()).min_items(Some(1)))
            .item(ArrayBuilder::new().items(ArrayBuilder::new().items(token_id()).min_items(Some(1))).min_items(Some(1)))
            .build(),
    )
}

/// Seconds, or a duration string ("30s", "5m", "-1").
pub fn keep_alive_schema() -> Schema {
    Schema::OneOf(
        OneOfBuilder::new()
            .item(ObjectBuilder::new().schema_type(Type::Number))
            .item(ObjectBuilder::new().schema_type(Type::String).pattern(Some(r"^-?[0-9]{1,9}(\.[0-9]{1,9})?$|^-?[0-9]{1,9}(ms|s|m|h|d)$")))
            .item(ObjectBuilder::new().schema_type(Type::Null))
            .build(),
    )
}

const INPUT_SHAPES: &str = "input must be a string, an array of strings, an array of token ids, or an array of token-id arrays";

/// Turns the `input` value into texts or token-id lists, rejecting empty and mixed inputs.
pub fn parse_input(input: Option<Value>, max_inputs: usize) -> Result<Inputs, ApiError> {
    parse_input_field(input, max_inputs, "input")
}

/// As `parse_input`, for a field of another name (TEI's `inputs`).
pub fn parse_input_field(input: Option<Value>, max_inputs: usize, field: &str) -> Result<Inputs, ApiError> {
    parse_input_as(input, max_inputs).map_err(|mut e| {
        if field != "input" {
            e.param = e.param.map(|p| p.replacen("input", field, 1));
            if e.message.starts_with("input") {
                e.message = e.message.replacen("input", field, 1);
            }
        }
        e
    })
}

fn parse_input_as(input: Option<Value>, max_inputs: usize) -> Result<Inputs, ApiError> {
    let empty = |param: String| {
        ApiError::invalid_request("empty_input", format!("{param} is empty; every input needs at least one character or token")).with_param(param)
    };
    let items = match input {
        None | Some(Value::Null) => return Err(ApiError::invalid_request("missing_input", "input is required").with_param("input")),
        Some(Value::String(s)) if s.is_empty() => return Err(empty("input".into())),
        Some(Value::String(s)) => return Ok(Inputs::Texts(vec![s])),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(ApiError::unprocessable("invalid_type", INPUT_SHAPES).with_param("input")),
    };
    if items.is_empty() {
        return Err(ApiError::invalid_request("empty_input", "input is an empty list").with_param("input"));
    }
    if items.len() > max_inputs {
        return Err(ApiError::too_large("too_many_inputs", format!("{} inputs; at most {max_inputs} per request", items.len())).with_param("input"));
    }
    let token_id = |v: &Value, param: String| {
        v.as_i64()
            .filter(|&id| id >= 0)
            .ok_or_else(|| ApiError::unprocessable("invalid_token_id", format!("{param} must be a non-negative integer token id")).with_param(param))
    };
    match &items[0] {
        Value::String(_) => items
            .into_iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) if s.is_empty() => Err(empty(format!("input[{i}]"))),
                Value::String(s) => Ok(s),
                _ => Err(ApiError::unprocessable("invalid_type", INPUT_SHAPES).with_param(format!("input[{i}]"))),
            })
            .collect::<Result<_, _>>()
            .map(Inputs::Texts),
        Value::Number(_) => {
            let ids = items.iter().enumerate().map(|(i, v)| token_id(v, format!("input[{i}]"))).collect::<Result<_, _>>()?;
            Ok(Inputs::TokenIds(vec![ids]))
        }
        Value::Array(_) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::Array(ids) if ids.is_empty() => Err(empty(format!("input[{i}]"))),
                Value::Array(ids) => ids.iter().enumerate().map(|(j, id)| token_id(id, format!("input[{i}][{j}]"))).collect(),
                _ => Err(ApiError::unprocessable("invalid_type", INPUT_SHAPES).with_param(format!("input[{i}]"))),
            })
            .collect::<Result<_, _>>()
            .map(Inputs::TokenIds),
        _ => Err(ApiError::unprocessable("invalid_type", INPUT_SHAPES).with_param("input[0]")),
    }
}

/// Parses Ollama's `keep_alive`: a number of seconds, or a string such as "30s",
/// "5m", "-1"; 0 unloads as soon as idle, negative never unloads.
pub fn parse_keep_alive(value: Option<Value>) -> Result<Option<KeepAlive>, ApiError> {
    let invalid = || ApiError::unprocessable("invalid_keep_alive", "keep_alive must be seconds or a duration such as \"5m\"").with_param("keep_alive");
    let seconds = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_f64().ok_or_else(invalid)?,
        Some(Value::String(s)) => match s.trim().parse::<f64>() {
            Ok(seconds) => seconds,
            Err(_) => {
                let (negative, text) = s.trim().strip_prefix('-').map_or((false, s.trim()), |rest| (true, rest));
                let d = humantime::parse_duration(text).map_err(|_| invalid())?.as_secs_f64();
                if negative {
                    -d
                } else {
                    d
                }
            }
        },
        Some(_) => return Err(invalid()),
    };
    Ok(Some(match seconds {
        s if s < 0.0 => KeepAlive::Never,
        0.0 => KeepAlive::Immediately,
        // Longer than a Duration holds (1e300 s) is as good as never.
        s => Duration::try_from_secs_f64(s).map_or(KeepAlive::Never, KeepAlive::For),
    }))
}

/// An embeddings request checked as far as it can be without a model (the
/// fuzz target `request_bodies` drives this with arbitrary bytes).
pub struct ParsedEmbeddings {
    /// The request, its `input` and `keep_alive` taken into the fields below.
    pub request: EmbeddingsRequest,
    pub inputs: Inputs,
    pub keep_alive: Option<KeepAlive>,
    /// A flat list of ids is one input: its errors name input[j], not input[0][j].
    pub flat_ids: bool,
}

pub fn parse_embeddings(body: &[u8], max_inputs: usize) -> Result<ParsedEmbeddings, ApiError> {
    let mut request: EmbeddingsRequest = parse_json(body)?;
    let flat_ids = matches!(&request.input, Some(Value::Array(a)) if a.first().is_some_and(Value::is_number));
    let inputs = parse_input(request.input.take(), max_inputs)?;
    let keep_alive = parse_keep_alive(request.keep_alive.take())?;
    Ok(ParsedEmbeddings { request, inputs, keep_alive, flat_ids })
}

/// OpenAI embeddings.
#[utoipa::path(post, path = "/v1/embeddings", tag = "embeddings", request_body = EmbeddingsRequest,
    responses((status = 200, body = EmbeddingsResponse), (status = "4XX", body = super::error::ErrorResponse), (status = "5XX", body = super::error::ErrorResponse)))]
pub async fn embeddings(State(app): State<AppState>, pinned: PinnedModel, body: Result<Bytes, BytesRejection>) -> Result<impl IntoResponse, ApiError> {
    let max_inputs = app.service.live().config.server.max_inputs;
    let ParsedEmbeddings { request, inputs, keep_alive, flat_ids } = parse_embeddings(&read_body(body)?, max_inputs)?;
    let embedded = app
        .service
        .embed(EmbedRequest {
            model: pinned.choose(&app.service, request.model)?,
            inputs,
            prompt_name: request.prompt_name,
            dimensions: request.dimensions,
            keep_alive,
            long_inputs: Default::default(),
            unit_length: None,
        })
        .await
        .map_err(|e| {
            let mut error = ApiError::from(e);
            // A flat list of ids is one input: its errors name input[j], not input[0][j].
            if flat_ids {
                error.param = error.param.map(|p| p.replacen("input[0]", "input", 1));
            }
            error
        })?;
    let Embedded { model, vectors, tokens, .. } = embedded;
    let format = request.encoding_format.unwrap_or_default();
    let data: Vec<EmbeddingData> = vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = match format {
                EncodingFormat::Float => EmbeddingValue::Float(v),
                EncodingFormat::Base64 => {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    EmbeddingValue::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
                }
            };
            EmbeddingData { object: "embedding", index, embedding }
        })
        .collect();
    let summary = super::RequestSummary { model: model.clone(), inputs: data.len(), tokens };
    let response = EmbeddingsResponse { object: "list", data, model, usage: Usage { prompt_tokens: tokens, total_tokens: tokens } };
    Ok((axum::Extension(summary), Json(response)))
}

/// `GET /v1/models`: OpenAI's model list, with eeane's own fields.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ModelList {
    /// Always "list".
    pub object: &'static str,
    pub data: Vec<ModelObject>,
}

/// One configured model and its state.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ModelObject {
    pub id: String,
    /// Always "model".
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    /// "embedding" or "reranker".
    pub kind: String,
    pub engine: String,
    pub aliases: Vec<String>,
    pub max_tokens: usize,
    /// "on_demand", "resident" or "disabled".
    pub load_policy: String,
    /// The vector's length, once the model is loaded.
    pub dimensions: Option<usize>,
    /// "unloaded", "loading", "loaded" or "failed".
    pub state: &'static str,
    pub loaded: bool,
}

/// Every servable model, with its state; under `/models/{id}`, that one.
#[utoipa::path(get, path = "/v1/models", tag = "models", responses((status = 200, body = ModelList), (status = 404, body = super::error::ErrorResponse)))]
pub async fn models(State(app): State<AppState>, pinned: PinnedModel) -> Result<Json<ModelList>, ApiError> {
    pinned.known(&app.service)?;
    let data = app
        .service
        .model_states()
        .into_iter()
        .filter(|m| pinned.admits(&m.id, &m.aliases))
        .map(|m| ModelObject {
            id: m.id,
            object: "model",
            created: 0,
            owned_by: "eeane",
            kind: m.kind,
            engine: m.engine,
            aliases: m.aliases,
            max_tokens: m.max_tokens,
            load_policy: m.policy,
            dimensions: m.loaded_model.map(|l| l.dimensions),
            state: m.status.state,
            loaded: m.status.loaded,
        })
        .collect();
    Ok(Json(ModelList { object: "list", data }))
}
