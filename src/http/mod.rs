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
use axum::http::{header, HeaderMap, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
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
        .fallback(|State(app): State<AppState>, uri: axum::http::Uri, headers: HeaderMap| async move {
            let path = uri.path();
            unknown_route(&app, path, &headers).unwrap_or_else(|| ApiError::route_not_found(path)).in_dialect(Dialect::of_path(path))
        })
        // GET /models/xlmr-m3/embed_sparse matches TEI's POST-only `/` under the two-segment prefix: a 404 too.
        .method_not_allowed_fallback(|State(app): State<AppState>, uri: axum::http::Uri, headers: HeaderMap| async move {
            let path = uri.path();
            unknown_route(&app, path, &headers).unwrap_or_else(ApiError::method_not_allowed).in_dialect(Dialect::of_path(path))
        })
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
    model_route_table().into_iter().fold(Router::new(), |router, (path, handler)| router.route(path, handler))
}

/// The paths of `model_routes`, as a 404 under `/models/{id}` lists them.
pub fn model_route_paths() -> Vec<&'static str> {
    model_route_table().into_iter().map(|(path, _)| path).collect()
}

/// Each model route's path and handler: the one list both the router and a
/// 404's list of routes are made from.
fn model_route_table() -> [(&'static str, MethodRouter<AppState>); 16] {
    [
        // OpenAI's and Infinity's routes answer with and without the /v1 prefix.
        ("/v1/embeddings", post(openai::embeddings)),
        ("/v1/rerank", post(rerank::rerank)),
        ("/v1/models", get(openai::models)),
        ("/embeddings", post(openai::embeddings)),
        // Infinity's /rerank takes TEI's body too.
        ("/rerank", post(rerank::rerank)),
        ("/models", get(openai::models)),
        // Text Embeddings Inference's routes.
        ("/", post(tei::root)),
        ("/embed", post(tei::embed)),
        ("/tokenize", post(tei::tokenize)),
        ("/decode", post(tei::decode)),
        ("/info", get(tei::info)),
        // Ollama's embedding routes.
        ("/api/embed", post(ollama::embed)),
        ("/api/embeddings", post(ollama::embeddings)),
        ("/api/tags", get(ollama::tags)),
        ("/api/ps", get(ollama::ps)),
        ("/api/version", get(ollama::version)),
    ]
}

/// Installs the metrics recorder (idempotent); `serve` calls it before models load.
pub fn install_metrics() {
    metrics::handle();
}

/// A 404 naming the model and the route a path under `/models/{id}` asks
/// for (pinned.rs). The fallbacks answer without the key, so with `api_key`
/// set only a request that carries it learns which models exist.
fn unknown_route(app: &AppState, path: &str, headers: &HeaderMap) -> Option<ApiError> {
    let live = app.service.live();
    let key = live.config.server.api_key.as_deref().filter(|k| !k.is_empty());
    let authorized = key.is_none_or(|key| bool::from(bearer_token(headers).as_bytes().ct_eq(key.as_bytes())));
    if authorized {
        pinned::unknown_route(&app.service, path)
    } else {
        None
    }
}

/// The bearer token of a request's Authorization header ("" without one).
fn bearer_token(headers: &HeaderMap) -> &str {
    headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).unwrap_or("")
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
    if bool::from(bearer_token(request.headers()).as_bytes().ct_eq(key.as_bytes())) {
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
