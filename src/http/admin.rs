//! `POST /admin/reload`: re-read the config without a restart (as SIGHUP does).

use axum::extract::State;
use axum::Json;
use serde::Serialize;

use super::error::ApiError;
use super::AppState;

/// What a reload changed.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Reloaded {
    /// Always "reloaded".
    pub status: &'static str,
    /// The models of the new config.
    pub models: Vec<String>,
    /// Entries that are new or changed (a changed entry's model loads afresh).
    pub added: Vec<String>,
    /// Entries that are gone or changed (their models unload).
    pub removed: Vec<String>,
}

/// Re-read the config file, as SIGHUP does; a broken file is refused and the running config stays.
#[utoipa::path(post, path = "/admin/reload", tag = "operations", responses((status = 200, body = Reloaded), (status = 400, body = super::error::ErrorResponse)))]
pub async fn reload(State(app): State<AppState>) -> Result<Json<Reloaded>, ApiError> {
    let summary = app.service.reload().await.map_err(|e| ApiError::invalid_config(format!("reload refused, the running config stays: {e}")))?;
    Ok(Json(Reloaded { status: "reloaded", models: summary.models, added: summary.added, removed: summary.removed }))
}
