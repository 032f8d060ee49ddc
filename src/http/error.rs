//! Every error the API returns, and its one mapping to HTTP. OpenAI's routes
//! answer `{"error": {"message", "type", "param", "code"}}`; TEI's and
//! Ollama's answer in their own shapes and statuses (`Dialect`), mapped here
//! from the same error.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::serving::{Fault, RequestError};

/// An error as the API answers it: a status, OpenAI's type and code, the
/// message, the field at fault; rendered in the shape of the route's `Dialect`.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub code: &'static str,
    pub message: String,
    pub param: Option<String>,
    /// Seconds for the Retry-After header (429 and 503); u32 keeps the
    /// error small enough to return by value.
    pub retry_after: Option<u32>,
    /// The model the request was for, once known (per-model metrics and the log line).
    pub model: Option<String>,
    /// Whose error shape the response takes.
    pub dialect: Dialect,
}

/// The API whose error shape and statuses a route answers with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Dialect {
    /// `{"error": {"message", "type", "param", "code"}}` (and Infinity's rerank).
    #[default]
    OpenAi,
    /// Text Embeddings Inference: `{"error", "error_type"}`, 400 for an empty
    /// request, 422 for another it refuses or cannot tokenize, 424 for the
    /// model, 429 when overloaded.
    Tei,
    /// Ollama: `{"error"}`, 400 for a request it refuses, 404 for a model it
    /// does not have.
    Ollama,
}

impl Dialect {
    /// The dialect of a route that has no handler to choose it (a 401, 404 or
    /// 405 answered before one runs).
    pub fn of_path(path: &str) -> Self {
        match unpinned(path) {
            "/" | "/embed" | "/tokenize" | "/decode" | "/info" => Dialect::Tei,
            p if p.starts_with("/api/") => Dialect::Ollama,
            _ => Dialect::OpenAi,
        }
    }
}

/// The API path under a `/models/{id}` prefix (pinned.rs;
/// `/models/BAAI/bge-m3/embed` -> `/embed`), for the dialect of a 401, 404
/// or 405, which is chosen by path before a handler runs. A path without the
/// prefix is itself.
fn unpinned(path: &str) -> &str {
    let Some(rest) = path.strip_prefix("/models/") else { return path };
    let is_api = |tail: &str| {
        tail.is_empty()
            || tail == "/"
            || ["/v1/", "/api/"].iter().any(|p| tail.starts_with(p))
            || ["/embed", "/rerank", "/tokenize", "/decode", "/info", "/embeddings", "/models"].contains(&tail)
    };
    // What follows a path's first segment ("" when it has one).
    let tail_of = |p: &str| p.find('/').map_or(p.len(), |i| i);
    // One segment for the id, else two (an organization and a name).
    let first = &rest[tail_of(rest)..];
    if is_api(first) {
        return if first.is_empty() { "/" } else { first };
    }
    let second = &first[1..][tail_of(&first[1..])..];
    match second {
        "" => "/",
        tail if is_api(tail) => tail,
        _ => path,
    }
}

impl ApiError {
    pub fn with_model(mut self, id: &str) -> Self {
        self.model = Some(id.to_string());
        self
    }

    fn new(status: StatusCode, kind: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, kind, code, message: message.into(), param: None, retry_after: None, model: None, dialect: Dialect::OpenAi }
    }

    /// The same error, in another API's shape.
    pub fn in_dialect(mut self, dialect: Dialect) -> Self {
        self.dialect = dialect;
        self
    }

    /// TEI's status and `error_type`, as TEI's router (1.9.3) maps its own:
    /// an empty request is 400 `Empty`, any other it refuses 422
    /// `Validation`, a tokenizer failure 422 `Tokenizer`, a model failure 424
    /// `Backend`, overload 429 `Overloaded`, a model that cannot serve 503
    /// `Unhealthy`.
    fn tei_status(&self) -> (StatusCode, &'static str) {
        use StatusCode as S;
        match (self.status, self.code) {
            (_, "tokenization_failed" | "token_id_out_of_vocabulary" | "query_too_long") => (S::UNPROCESSABLE_ENTITY, "Tokenizer"),
            (_, "missing_input" | "empty_input" | "missing_documents" | "empty_documents" | "empty_document" | "missing_query" | "empty_query") => {
                (S::BAD_REQUEST, "Empty")
            }
            (S::BAD_REQUEST | S::PAYLOAD_TOO_LARGE | S::UNPROCESSABLE_ENTITY, _) => (S::UNPROCESSABLE_ENTITY, "Validation"),
            (S::TOO_MANY_REQUESTS, _) | (_, "queue_timeout" | "no_room") => (S::TOO_MANY_REQUESTS, "Overloaded"),
            (S::SERVICE_UNAVAILABLE, _) => (S::SERVICE_UNAVAILABLE, "Unhealthy"),
            (status, _) if status.is_server_error() => (S::FAILED_DEPENDENCY, "Backend"),
            (status, _) => (status, "Validation"),
        }
    }

    /// Ollama's status: 400 for anything it would refuse as a bad request.
    fn ollama_status(&self) -> StatusCode {
        match self.status {
            StatusCode::UNPROCESSABLE_ENTITY | StatusCode::PAYLOAD_TOO_LARGE => StatusCode::BAD_REQUEST,
            status => status,
        }
    }

    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(u32::try_from(seconds).unwrap_or(u32::MAX));
        self
    }

    /// 429: past max_pending_requests, or /health's rate limit.
    pub fn too_many_requests(code: &'static str, message: impl Into<String>, retry_after: u64) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", code, message).with_retry_after(retry_after)
    }

    /// 400: a config reload was refused; the running config stays.
    pub fn invalid_config(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", "invalid_config", message)
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// 400: the body is not JSON, or a value is empty or out of range.
    pub fn invalid_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", code, message)
    }

    /// 422: well-formed JSON whose values have the wrong type or meaning.
    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request_error", code, message)
    }

    /// 413: too many inputs, or a body over the size limit.
    pub fn too_large(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", code, message)
    }

    /// 408: the body stopped arriving for longer than server.body_read_timeout.
    pub fn body_timeout() -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            "body_timeout",
            "The request body stopped arriving for longer than the server waits (server.body_read_timeout)",
        )
    }

    pub fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "authentication_error", "invalid_api_key", "Missing or invalid API key: send Authorization: Bearer <key>")
    }

    pub fn route_not_found(path: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", "not_found", format!("No route {path}"))
    }

    /// 404: a path under `/models/{id}` that names a model and a route it does not have.
    pub fn route_not_found_under(message: String) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", "not_found", message)
    }

    pub fn method_not_allowed() -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", "method_not_allowed", "Method not allowed on this route")
    }
}

/// Whether `error` or any error in its source chain satisfies `is`: the
/// transport (hyper, axum) wraps the causes the API tells apart.
pub fn caused_by(error: &(dyn std::error::Error + 'static), is: impl Fn(&(dyn std::error::Error + 'static)) -> bool) -> bool {
    std::iter::successors(Some(error), |e| e.source()).any(is)
}

/// The error body every endpoint answers with.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct ErrorResponse {
    pub error: ErrorObject,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct ErrorObject {
    pub message: String,
    /// invalid_request_error, authentication_error, rate_limit_error or server_error.
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// A stable, machine-readable code, e.g. `model_not_found`.
    pub code: String,
}

/// TEI's error body.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct TeiErrorResponse {
    pub error: String,
    /// Validation, Empty, Tokenizer, Backend, Overloaded or Unhealthy.
    pub error_type: String,
}

/// Ollama's error body.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct OllamaErrorResponse {
    pub error: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = match self.dialect {
            Dialect::OpenAi => {
                let body = ErrorResponse { error: ErrorObject { message: self.message, kind: self.kind.into(), param: self.param, code: self.code.into() } };
                (self.status, Json(body)).into_response()
            }
            Dialect::Tei => {
                let (status, error_type) = self.tei_status();
                (status, Json(TeiErrorResponse { error: self.message, error_type: error_type.into() })).into_response()
            }
            Dialect::Ollama => (self.ollama_status(), Json(OllamaErrorResponse { error: self.message })).into_response(),
        };
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(seconds));
        }
        if let Some(model) = self.model {
            response.extensions_mut().insert(super::RequestSummary { model, ..Default::default() });
        }
        response
    }
}

/// Seconds a client should wait after a 503 that more capacity may cure.
const RETRY_AFTER_UNAVAILABLE: u64 = 5;

/// Serving's refusals and failures, in OpenAI's shape.
impl From<RequestError> for ApiError {
    fn from(e: RequestError) -> Self {
        use StatusCode as S;
        let (status, kind, code, retry_after) = match &e.fault {
            Fault::UnknownModel { .. } => (S::NOT_FOUND, "invalid_request_error", "model_not_found", None),
            Fault::NotAnEmbeddingModel => (S::BAD_REQUEST, "invalid_request_error", "not_an_embedding_model", None),
            Fault::NotAReranker => (S::BAD_REQUEST, "invalid_request_error", "not_a_reranker", None),
            Fault::NoRerankModel => (S::BAD_REQUEST, "invalid_request_error", "no_rerank_model", None),
            Fault::UnknownPrompt => (S::BAD_REQUEST, "invalid_request_error", "unknown_prompt", None),
            Fault::PromptWithTokenIds => (S::BAD_REQUEST, "invalid_request_error", "prompt_with_token_ids", None),
            Fault::TokenIdsNotAccepted => (S::BAD_REQUEST, "invalid_request_error", "token_ids_not_accepted", None),
            Fault::InvalidDimensions => (S::BAD_REQUEST, "invalid_request_error", "invalid_dimensions", None),
            Fault::InputTooLong => (S::PAYLOAD_TOO_LARGE, "invalid_request_error", "input_too_long", None),
            Fault::NormalizeUnavailable => (S::BAD_REQUEST, "invalid_request_error", "normalize_unavailable", None),
            Fault::Overloaded => (S::TOO_MANY_REQUESTS, "rate_limit_error", "too_many_pending_requests", Some(1)),
            Fault::OutOfVocabulary => (S::UNPROCESSABLE_ENTITY, "invalid_request_error", "token_id_out_of_vocabulary", None),
            Fault::Tokenization => (S::BAD_REQUEST, "invalid_request_error", "tokenization_failed", None),
            Fault::QueryTooLong => (S::BAD_REQUEST, "invalid_request_error", "query_too_long", None),
            Fault::QueueTimeout => (S::SERVICE_UNAVAILABLE, "server_error", "queue_timeout", Some(RETRY_AFTER_UNAVAILABLE)),
            Fault::NoRoom => (S::SERVICE_UNAVAILABLE, "server_error", "no_room", Some(1)),
            Fault::Unavailable => (S::SERVICE_UNAVAILABLE, "server_error", "model_unavailable", Some(RETRY_AFTER_UNAVAILABLE)),
            Fault::Integrity => (S::SERVICE_UNAVAILABLE, "server_error", "model_integrity", None),
            Fault::EngineFailed => (S::INTERNAL_SERVER_ERROR, "server_error", "engine_error", None),
            Fault::UnsupportedInput => (S::UNPROCESSABLE_ENTITY, "invalid_request_error", "unsupported_input", None),
            Fault::Internal => (S::INTERNAL_SERVER_ERROR, "server_error", "internal_error", None),
        };
        let mut error = ApiError::new(status, kind, code, e.message);
        error.param = e.param;
        error.model = e.model;
        match retry_after {
            Some(seconds) => error.with_retry_after(seconds),
            None => error,
        }
    }
}

#[cfg(test)]
mod unpinned_tests {
    use super::unpinned;

    #[test]
    fn the_api_path_is_found_under_one_or_two_segments() {
        assert_eq!(unpinned("/models/bge-m3/v1/embeddings"), "/v1/embeddings");
        assert_eq!(unpinned("/models/BAAI/bge-m3/embed"), "/embed");
        assert_eq!(unpinned("/models/BAAI/bge-m3/api/embed"), "/api/embed");
        assert_eq!(unpinned("/models/BAAI%2Fbge-m3/info"), "/info");
        assert_eq!(unpinned("/models/bge-m3/"), "/");
        assert_eq!(unpinned("/models/bge-m3"), "/");
        assert_eq!(unpinned("/models/BAAI/bge-m3"), "/");
        assert_eq!(unpinned("/v1/embeddings"), "/v1/embeddings");
        assert_eq!(unpinned("/models"), "/models");
        assert_eq!(unpinned("/models/a/b/c/d"), "/models/a/b/c/d");
    }
}
