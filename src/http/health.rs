//! `GET /health`: open even with an API key, rate-limited per client IP.

use crate::sync::Recover;
use std::net::SocketAddr;

use axum::extract::{ConnectInfo, State};
use axum::Json;
use governor::clock::{Clock, DefaultClock};
use serde_json::{json, Value};

use super::error::ApiError;
use super::AppState;
use crate::registry::{KeepAlive, SlotState};

/// Liveness and every model's state; open even with an API key, rate-limited per client.
#[utoipa::path(get, path = "/health", tag = "operations", responses((status = 200, body = Object), (status = 429, body = super::error::ErrorResponse)))]
pub async fn health(State(app): State<AppState>, ConnectInfo(peer): ConnectInfo<SocketAddr>) -> Result<Json<Value>, ApiError> {
    let live = app.service.live();
    if let Some(limiter) = &live.health_limiter {
        // Keyed state grows with distinct addresses; drop those whose quota has refilled.
        if limiter.len() > 10_000 {
            limiter.retain_recent();
        }
        if let Err(not_until) = limiter.check_key(&peer.ip()) {
            let wait = not_until.wait_time_from(DefaultClock::default().now()).as_secs().max(1);
            return Err(ApiError::too_many_requests("rate_limited", "Too many /health requests from this address (health_rate_limit)", wait));
        }
    }
    let models: Vec<Value> = live
        .registry
        .slots()
        .iter()
        .map(|slot| {
            let status = slot.status();
            let c = &slot.counters;
            let load = |n: &std::sync::atomic::AtomicU64| n.load(std::sync::atomic::Ordering::Relaxed);
            let mut entry = json!({
                "id": slot.config.id,
                "kind": slot.config.kind,
                "engine": slot.config.engine,
                "device": slot.config.device,
                "policy": slot.policy,
                "keep_alive": match slot.keep_alive {
                    KeepAlive::Never => -1.0,
                    KeepAlive::Immediately => 0.0,
                    KeepAlive::For(d) => d.as_secs_f64(),
                },
                "status": status,
                "counters": {
                    "requests": load(&c.requests),
                    "inferences": load(&c.inferences),
                    "coalesced": load(&c.coalesced),
                    "loads": load(&c.loads),
                    "unloads": load(&c.unloads),
                    "errors": load(&c.errors),
                },
            });
            if let SlotState::Loaded(model) = slot.state() {
                let info = model.engine_info();
                entry["device"] = json!(info.device);
                entry["precision"] = json!(info.precision);
                entry["runtime_version"] = json!(info.runtime_version);
                if let Some((on, total)) = info.accelerated_layers {
                    // A device set after load_param silently runs every layer on the
                    // CPU; the count of layers on the device shows it.
                    entry["accelerated_layers"] = json!({"on_device": on, "total": total});
                }
                entry["dimensions"] = json!(model.dimensions);
                entry["load_ms"] = json!(model.load_ms);
                let stats = model.stats();
                let load = |n: &std::sync::atomic::AtomicU64| n.load(std::sync::atomic::Ordering::Relaxed);
                entry["engine_calls"] = json!({
                    "batches": load(&stats.batches),
                    "rows": load(&stats.rows),
                    "padded_tokens": load(&stats.padded_tokens),
                    "real_tokens": load(&stats.real_tokens),
                    "per_device": *stats.device_batches.locked(),
                });
                entry["isolation"] = json!(model.isolation);
                if model.isolation == crate::config::Isolation::Process {
                    // The engine's own process per device, for `ps`/`top` and for its memory.
                    entry["engine_pids"] = json!(*stats.engine_pids.locked());
                    entry["engine_restarts"] = json!(load(&stats.engine_restarts));
                }
            }
            // Flatten the status fields next to the others.
            if let Some(fields) = entry.as_object_mut() {
                if let Some(Value::Object(status)) = fields.remove("status") {
                    fields.extend(status);
                }
            }
            entry
        })
        .collect();
    Ok(Json(json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "pending_requests": app.service.pending(),
        "devices": crate::engines::visible_devices(),
        "models": models,
    })))
}
