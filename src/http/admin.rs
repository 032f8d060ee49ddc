//! `POST /admin/reload`: re-read the config without a restart (as SIGHUP does).

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::AppState;

/// Re-read the config file, as SIGHUP does; a broken file is refused and the running config stays.
#[utoipa::path(post, path = "/admin/reload", tag = "operations", responses((status = 200, body = Object), (status = 400, body = super::error::ErrorResponse)))]
pub async fn reload(State(app): State<AppState>) -> Result<Json<Value>, ApiError> {
    let summary = app.service.reload().await.map_err(|e| ApiError::invalid_config(format!("reload refused, the running config stays: {e}")))?;
    Ok(Json(json!({"status": "reloaded", "models": summary.models, "added": summary.added, "removed": summary.removed})))
}
