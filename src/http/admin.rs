//! `POST /admin/reload`: re-read the config without a restart (as SIGHUP does).

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::AppState;

pub async fn reload(State(app): State<AppState>) -> Result<Json<Value>, ApiError> {
    let summary = app.service.reload().await.map_err(|e| ApiError::invalid_config(format!("reload refused, the running config stays: {e}")))?;
    Ok(Json(json!({"status": "reloaded", "models": summary.models, "added": summary.added, "removed": summary.removed})))
}
