//! The HTTP surface: one file per API, errors mapped in `error`, and the
//! cross-cutting layers (auth, body limit, tracing) here.

mod admin;
pub mod connections;
mod documents;
pub mod error;
mod health;
mod metrics;
pub mod ollama;
pub mod openai;
pub mod openapi;
pub mod pinned;
pub mod rerank;
pub mod tei;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use subtle::ConstantTimeEq;
use tower_http::request_id::{MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

use crate::serving::Service;
use error::{ApiError, Dialect};

#[derive(Clone)]
pub struct AppState {
    pub service: Arc<Service>,
}

/// The whole API. Serve it with `into_make_service_with_connect_info::<SocketAddr>()`:
/// /health's rate limit is per client address.
pub fn router(state: AppState) -> Router {
    // The metrics recorder first: handles taken before it exists record nothing.
    metrics::handle();
    let models = model_routes();
    Router::new()
        .merge(models.clone())
        // The same routes under a prefix that names the model, for balancers
        // that route by URL (pinned.rs): one segment, or a Hub id's two.
        .nest(pinned::PREFIXES[0], models.clone())
        .nest(pinned::PREFIXES[1], models)
        .route("/health", get(health::health))
        .route("/v1/health", get(health::health))
        .route("/metrics", get(metrics::metrics))
        .route("/v1/metrics", get(metrics::metrics))
        .route("/openapi.json", get(openapi::openapi_json))
        .merge(openapi::explorer())
        .route("/admin/reload", post(admin::reload))
        .fallback(|uri: axum::http::Uri| async move { ApiError::route_not_found(uri.path()).in_dialect(Dialect::of_path(uri.path())) })
        .method_not_allowed_fallback(|uri: axum::http::Uri| async move { ApiError::method_not_allowed().in_dialect(Dialect::of_path(uri.path())) })
        // On matched routes only: an unknown path is a 404 and a wrong method a
        // 405 with or without the key (they reveal nothing the document does not).
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key))
        .route_layer(middleware::from_fn(metrics::record_http))
        .layer(DefaultBodyLimit::max(state.service.live().config.server.max_request_bytes))
        .layer(middleware::from_fn(log_request))
        .layer(TraceLayer::new_for_http())
        // Outermost: the id is set (from X-Request-Id, or made) before anything
        // runs, and returned on every response, errors included.
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetRequestIdLayer::x_request_id(RandomRequestId))
        .with_state(state)
}

/// Every route that serves a model, as each API names it.
fn model_routes() -> Router<AppState> {
    // OpenAI's and Infinity's routes answer with and without the /v1 prefix.
    let openai = Router::new().route("/embeddings", post(openai::embeddings)).route("/rerank", post(rerank::rerank)).route("/models", get(openai::models));
    Router::new()
        .merge(openai.clone())
        .nest("/v1", openai)
        // Text Embeddings Inference's routes (/rerank takes its body too).
        .route("/", post(tei::root))
        .route("/embed", post(tei::embed))
        .route("/tokenize", post(tei::tokenize))
        .route("/decode", post(tei::decode))
        .route("/info", get(tei::info))
        // Ollama's embedding routes.
        .route("/api/embed", post(ollama::embed))
        .route("/api/embeddings", post(ollama::embeddings))
        .route("/api/tags", get(ollama::tags))
        .route("/api/ps", get(ollama::ps))
        .route("/api/version", get(ollama::version))
}

/// Installs the metrics recorder (idempotent); `serve` calls it before models load.
pub fn install_metrics() {
    metrics::handle();
}

/// With `api_key` set, every request but `GET /health` (and `GET /metrics`
/// with `metrics_public`) must carry it as a bearer token.
async fn require_api_key(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let live = app.service.live();
    let Some(key) = live.config.server.api_key.as_deref().filter(|k| !k.is_empty()) else {
        return next.run(request).await;
    };
    // Any method: /health has only GET, so the others get their 405 after this.
    if matches!(request.uri().path(), "/health" | "/v1/health") {
        return next.run(request).await;
    }
    // The API's description and its explorer, which holds the key the user
    // types and sends it with each request it tries; neither shows a secret.
    // Any method, as for /health.
    let path = request.uri().path();
    if path == "/openapi.json" || path == "/docs" || path.starts_with("/docs/") {
        return next.run(request).await;
    }
    if request.method() == Method::GET && live.config.server.metrics_public && matches!(request.uri().path(), "/metrics" | "/v1/metrics") {
        return next.run(request).await;
    }
    let presented = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).unwrap_or("");
    if bool::from(presented.as_bytes().ct_eq(key.as_bytes())) {
        next.run(request).await
    } else {
        let refused = ApiError::unauthorized().in_dialect(Dialect::of_path(request.uri().path()));
        match requested_model(request).await {
            Some(model) => refused.with_model(&model).into_response(),
            None => refused.into_response(),
        }
    }
}

/// The model a refused request asked for, for the request log: read from a
/// small JSON body only (at most 64 KiB, as Content-Length declares it).
async fn requested_model(request: Request) -> Option<String> {
    const LIMIT: usize = 64 * 1024;
    let declared: usize = request.headers().get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()?;
    if declared > LIMIT {
        return None;
    }
    #[derive(serde::Deserialize)]
    struct Named {
        model: Option<String>,
    }
    let body = axum::body::to_bytes(request.into_body(), LIMIT).await.ok()?;
    serde_json::from_slice::<Named>(&body).ok()?.model
}

/// A request id for requests that bring no `X-Request-Id`: 16 random hex digits.
#[derive(Clone, Copy)]
struct RandomRequestId;

impl MakeRequestId for RandomRequestId {
    fn make_request_id<B>(&mut self, _request: &axum::http::Request<B>) -> Option<RequestId> {
        let id = format!("{:016x}", rand::random::<u64>());
        axum::http::HeaderValue::from_str(&id).ok().map(RequestId::new)
    }
}

/// What a handler tells the request log about the work it did.
#[derive(Clone, Debug, Default)]
pub struct RequestSummary {
    pub model: String,
    pub inputs: usize,
    pub tokens: usize,
}

/// One log line per request: id, method, path, model, inputs, tokens, status, latency.
async fn log_request(request: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let id = request.extensions().get::<RequestId>().and_then(|id| id.header_value().to_str().ok()).unwrap_or("-").to_string();
    let (method, path) = (request.method().clone(), request.uri().path().to_string());
    let response = next.run(request).await;
    let summary = response.extensions().get::<RequestSummary>().cloned().unwrap_or_default();
    tracing::info!(
        target: "eeane::request",
        id = %id,
        method = %method,
        path = %path,
        model = %summary.model,
        inputs = summary.inputs,
        tokens = summary.tokens,
        status = response.status().as_u16(),
        latency_ms = format!("{:.1}", started.elapsed().as_secs_f64() * 1e3),
        "request"
    );
    response
}
