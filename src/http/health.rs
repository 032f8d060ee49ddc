//! `GET /health`: liveness, and each model's state.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::AppState;
use crate::registry::SlotState;

pub async fn health(State(app): State<AppState>) -> Json<Value> {
    let models: Vec<Value> = app
        .registry
        .slots()
        .iter()
        .map(|slot| {
            let state = slot.state();
            let mut entry = json!({
                "id": slot.config.id,
                "kind": slot.config.kind,
                "engine": slot.config.engine,
                "device": slot.config.device,
                "state": state.name(),
            });
            match &state {
                SlotState::Loaded(model) => {
                    let info = model.engine_info();
                    entry["device"] = json!(info.device);
                    entry["precision"] = json!(info.precision);
                    entry["runtime_version"] = json!(info.runtime_version);
                    entry["dimensions"] = json!(model.dimensions);
                    entry["load_ms"] = json!(model.load_ms);
                }
                SlotState::Failed(reason) => entry["error"] = json!(reason),
                SlotState::Unloaded => {}
            }
            entry
        })
        .collect();
    Json(json!({"status": "ok", "version": env!("CARGO_PKG_VERSION"), "models": models}))
}
