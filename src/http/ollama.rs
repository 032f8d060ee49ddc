//! Ollama's embedding API, so that the `ollama` clients and Open WebUI's
//! Ollama engine work unchanged: `POST /api/embed`, the older
//! `POST /api/embeddings`, `GET /api/tags`, `GET /api/ps` and
//! `GET /api/version`. Errors come as Ollama's `{"error": ...}`
//! (`Dialect::Ollama`). A model is named by its id or alias; Ollama's
//! `name:latest` is the same model as `name`.

use std::time::{Duration, Instant, SystemTime};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::{ApiError, Dialect};
use super::openai::{parse_input_field, parse_json, parse_keep_alive, read_body};
use super::pinned::PinnedModel;
use super::AppState;
use crate::serving::{EmbedRequest, Embedded, Inputs, LongInputs, ModelHealth};

/// The Ollama API version eeane answers to: `/api/embed` with `dimensions`
/// came in Ollama 0.12, and clients compare this to decide what to send.
const OLLAMA_API_VERSION: &str = "0.12.0";

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct OllamaEmbedRequest {
    /// A model id or alias; `name:latest` is `name`.
    #[schema(required = true)]
    pub model: Option<String>,
    /// A string or an array of strings.
    #[schema(value_type = Object, required = true)]
    pub input: Option<Value>,
    /// `false` refuses an input longer than the model takes; `true` (the
    /// default) embeds it as the model is configured to (`long_text`).
    pub truncate: Option<bool>,
    /// How long the model stays loaded after this request: seconds, or a
    /// duration such as "5m"; 0 unloads at once, negative never.
    #[schema(schema_with = super::openai::keep_alive_schema)]
    pub keep_alive: Option<Value>,
    /// Keep the first n dimensions, renormalized.
    #[schema(minimum = 1)]
    pub dimensions: Option<usize>,
    /// Ollama's runtime options; accepted and unused (eeane's are per model, in TOML).
    #[schema(value_type = Object)]
    pub options: Option<Value>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OllamaEmbedResponse {
    pub model: String,
    pub embeddings: Vec<Vec<f32>>,
    /// Nanoseconds for the whole request.
    pub total_duration: u64,
    /// Nanoseconds spent loading the model for this request (0 when it was loaded).
    pub load_duration: u64,
    /// Tokens the model processed.
    pub prompt_eval_count: usize,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct OllamaEmbeddingsRequest {
    #[schema(required = true)]
    pub model: Option<String>,
    /// One text; an empty one has an empty embedding, as in Ollama.
    pub prompt: Option<String>,
    #[schema(schema_with = super::openai::keep_alive_schema)]
    pub keep_alive: Option<Value>,
    /// Accepted and unused.
    #[schema(value_type = Object)]
    pub options: Option<Value>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OllamaEmbeddingsResponse {
    pub embedding: Vec<f32>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ModelDetails {
    pub parent_model: String,
    /// The model file's format: onnx, openvino, ncnn or mlpackage.
    pub format: String,
    /// embedding or reranker.
    pub family: String,
    pub families: Option<Vec<String>>,
    pub parameter_size: String,
    /// The precision it runs at once loaded (else as configured).
    pub quantization_level: String,
}

/// A model as `/api/tags` and `/api/ps` list it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OllamaModel {
    /// `id:latest`.
    pub name: String,
    pub model: String,
    /// The model file's modification time (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modified_at: Option<String>,
    /// The model file's size in bytes.
    pub size: u64,
    /// The model file's sha256 as its manifest records it (empty without one).
    pub digest: String,
    pub details: ModelDetails,
    /// When an idle model unloads (RFC 3339); /api/ps only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// Bytes on an accelerator: the file's size on a GPU, 0 on the CPU; /api/ps only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_vram: Option<u64>,
    /// Longest input in tokens; /api/ps only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_length: Option<usize>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OllamaModels {
    pub models: Vec<OllamaModel>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OllamaVersion {
    pub version: &'static str,
}

fn ollama(e: impl Into<ApiError>) -> ApiError {
    e.into().in_dialect(Dialect::Ollama)
}

/// The model a name means: an id or alias as it is, else without Ollama's
/// `:latest` tag. Ollama requires a model.
/// The model asked for: the body's (Ollama's `NAME:latest` read as `NAME`
/// when only that is a model here), or the URL's under `/models/{id}`.
fn model_name(app: &AppState, pinned: &PinnedModel, name: Option<String>) -> Result<String, ApiError> {
    let name = name.filter(|n| !n.is_empty()).map(|name| match name.strip_suffix(":latest") {
        Some(bare) if !app.service.has_model(&name) && app.service.has_model(bare) => bare.to_string(),
        _ => name,
    });
    pinned
        .choose(&app.service, name)
        .map_err(ollama)?
        .ok_or_else(|| ollama(ApiError::invalid_request("missing_model", "model is required").with_param("model")))
}

/// Embeds `inputs`; the load time, when this request loaded the model.
async fn embed_inputs(
    app: &AppState,
    model: String,
    inputs: Inputs,
    keep_alive: Option<Value>,
    dimensions: Option<usize>,
    long_inputs: LongInputs,
) -> Result<(Embedded, Duration), ApiError> {
    let keep_alive = parse_keep_alive(keep_alive).map_err(ollama)?;
    let was_loaded = app.service.loaded_model(&model).is_some();
    let request = EmbedRequest { model: Some(model.clone()), inputs, prompt_name: None, dimensions, keep_alive, long_inputs, unit_length: None };
    let embedded = app.service.embed(request).await.map_err(ollama)?;
    let loading = match (was_loaded, app.service.loaded_model(&model)) {
        (false, Some(loaded)) => Duration::from_millis(loaded.load_ms),
        _ => Duration::ZERO,
    };
    Ok((embedded, loading))
}

/// An /api/embed body checked as far as it can be without a model (the fuzz
/// target `request_bodies` drives this with arbitrary bytes): the request,
/// its texts (taken out of it) and what it asks of long ones.
pub fn parse_embed(body: &[u8], max_inputs: usize) -> Result<(OllamaEmbedRequest, Inputs, LongInputs), ApiError> {
    let mut request: OllamaEmbedRequest = parse_json(body).map_err(ollama)?;
    let inputs = match parse_input_field(request.input.take(), max_inputs, "input").map_err(ollama)? {
        Inputs::Texts(texts) => Inputs::Texts(texts),
        _ => return Err(ollama(ApiError::invalid_request("invalid_input", "input must be a string or an array of strings").with_param("input"))),
    };
    let long_inputs = if request.truncate == Some(false) { LongInputs::Refuse } else { LongInputs::AsConfigured };
    Ok((request, inputs, long_inputs))
}

/// Ollama's embed: one vector per input.
#[utoipa::path(post, path = "/api/embed", operation_id = "ollama_embed", tag = "ollama", request_body = OllamaEmbedRequest,
    responses((status = 200, body = OllamaEmbedResponse), (status = "4XX", body = super::error::OllamaErrorResponse), (status = "5XX", body = super::error::OllamaErrorResponse)))]
pub async fn embed(State(app): State<AppState>, pinned: PinnedModel, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let started = Instant::now();
    let max_inputs = app.service.live().config.server.max_inputs;
    let (mut request, inputs, long_inputs) = parse_embed(&read_body(body).map_err(ollama)?, max_inputs)?;
    let model = model_name(&app, &pinned, request.model.take())?;
    let (Embedded { model, vectors, tokens, .. }, loading) =
        embed_inputs(&app, model, inputs, request.keep_alive.take(), request.dimensions, long_inputs).await?;
    let summary = super::RequestSummary { model: model.clone(), inputs: vectors.len(), tokens };
    let response = OllamaEmbedResponse {
        model,
        embeddings: vectors,
        total_duration: started.elapsed().as_nanos() as u64,
        load_duration: loading.as_nanos() as u64,
        prompt_eval_count: tokens,
    };
    Ok((axum::Extension(summary), Json(response)).into_response())
}

/// Ollama's older embeddings route: one prompt, one vector.
#[utoipa::path(post, path = "/api/embeddings", operation_id = "ollama_embeddings", tag = "ollama", request_body = OllamaEmbeddingsRequest,
    responses((status = 200, body = OllamaEmbeddingsResponse), (status = "4XX", body = super::error::OllamaErrorResponse), (status = "5XX", body = super::error::OllamaErrorResponse)))]
pub async fn embeddings(State(app): State<AppState>, pinned: PinnedModel, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let mut request: OllamaEmbeddingsRequest = parse_json(&read_body(body).map_err(ollama)?).map_err(ollama)?;
    let model = model_name(&app, &pinned, request.model.take())?;
    let prompt = request.prompt.take().unwrap_or_default();
    if prompt.is_empty() {
        // Ollama answers an empty prompt with an empty embedding, for a model it has.
        if !app.service.has_model(&model) {
            let states = app.service.model_states();
            return Err(ollama(crate::serving::RequestError::unknown_model(&model, states.iter().map(|m| m.id.as_str()).collect())));
        }
        return Ok(Json(OllamaEmbeddingsResponse { embedding: Vec::new() }).into_response());
    }
    let (Embedded { model, mut vectors, tokens, .. }, _) =
        embed_inputs(&app, model, Inputs::Texts(vec![prompt]), request.keep_alive.take(), None, LongInputs::AsConfigured).await?;
    let summary = super::RequestSummary { model, inputs: 1, tokens };
    Ok((axum::Extension(summary), Json(OllamaEmbeddingsResponse { embedding: vectors.pop().unwrap_or_default() })).into_response())
}

fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

fn listed(app: &AppState, m: &ModelHealth, running: bool) -> OllamaModel {
    let live = app.service.live();
    let config = live.config.models.iter().find(|c| c.id == m.id);
    let path = config.map(|c| c.model.path());
    let file = path.as_deref().and_then(|p| std::fs::metadata(p).ok());
    // The graph and the weights kept beside it (ONNX external data, a .bin).
    let size = config.map_or(0, |c| c.stored_bytes());
    let format = m.file_format();
    let precision = m.loaded_model.as_ref().map(|l| l.precision.clone()).or_else(|| config.and_then(|c| c.configured_precision()));
    let expires_at = running.then(|| match m.keep_alive {
        k if k < 0.0 => rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_799)), // 9999-12-31T23:59:59Z: never
        k => {
            let last = m.status.last_used.map_or_else(SystemTime::now, |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s));
            rfc3339(last + Duration::from_secs_f64(k))
        }
    });
    OllamaModel {
        name: format!("{}:latest", m.id),
        model: format!("{}:latest", m.id),
        modified_at: file.and_then(|f| f.modified().ok()).map(rfc3339),
        size,
        digest: path.as_deref().and_then(crate::integrity::recorded_digest).unwrap_or_default(),
        details: ModelDetails {
            parent_model: String::new(),
            format: format.to_string(),
            family: m.kind.clone(),
            families: Some(vec![m.kind.clone()]),
            parameter_size: config.and_then(|c| c.weights()).map(|w| parameter_size(w.parameters)).unwrap_or_default(),
            quantization_level: match precision.as_deref() {
                None | Some("as-graph" | "fp32" | "f32") => "F32".into(),
                Some("fp16" | "f16") => "F16".into(),
                Some(other) => other.to_uppercase(),
            },
        },
        expires_at,
        size_vram: running.then(|| if config.is_none_or(|c| c.device.all_cpu()) { 0 } else { size }),
        context_length: running.then_some(m.max_tokens),
    }
}

/// A parameter count as Ollama writes it: "22.7M", "7.6B".
fn parameter_size(count: u64) -> String {
    match count as f64 {
        n if n >= 1e9 => format!("{:.1}B", n / 1e9),
        n if n >= 1e6 => format!("{:.1}M", n / 1e6),
        n if n >= 1e3 => format!("{:.1}K", n / 1e3),
        _ => count.to_string(),
    }
}

/// Every configured model, as Ollama lists the models it has; under
/// `/models/{id}`, that one.
#[utoipa::path(get, path = "/api/tags", operation_id = "ollama_tags", tag = "ollama",
    responses((status = 200, body = OllamaModels), (status = 404, body = super::error::OllamaErrorResponse)))]
pub async fn tags(State(app): State<AppState>, pinned: PinnedModel) -> Result<Json<OllamaModels>, ApiError> {
    pinned.known(&app.service).map_err(ollama)?;
    let states = app.service.model_states();
    Ok(Json(OllamaModels { models: states.iter().filter(|m| pinned.admits(&m.id, &m.aliases)).map(|m| listed(&app, m, false)).collect() }))
}

/// The loaded models, with when each unloads; under `/models/{id}`, that one if loaded.
#[utoipa::path(get, path = "/api/ps", operation_id = "ollama_ps", tag = "ollama",
    responses((status = 200, body = OllamaModels), (status = 404, body = super::error::OllamaErrorResponse)))]
pub async fn ps(State(app): State<AppState>, pinned: PinnedModel) -> Result<Json<OllamaModels>, ApiError> {
    pinned.known(&app.service).map_err(ollama)?;
    let states = app.service.model_states();
    Ok(Json(OllamaModels { models: states.iter().filter(|m| m.status.loaded && pinned.admits(&m.id, &m.aliases)).map(|m| listed(&app, m, true)).collect() }))
}

/// The Ollama API version this server answers to.
#[utoipa::path(get, path = "/api/version", operation_id = "ollama_version", tag = "ollama", responses((status = 200, body = OllamaVersion)))]
pub async fn version() -> Json<OllamaVersion> {
    Json(OllamaVersion { version: OLLAMA_API_VERSION })
}
