//! `GET /health`: open even with an API key, rate-limited per client IP.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, State};
use axum::Json;
use governor::clock::{Clock, DefaultClock};

use super::error::ApiError;
use super::AppState;
use crate::serving::Health;

/// Liveness and every model's state; open even with an API key, rate-limited per client.
#[utoipa::path(get, path = "/health", tag = "operations", responses((status = 200, body = Health), (status = 429, body = super::error::ErrorResponse)))]
pub async fn health(State(app): State<AppState>, ConnectInfo(peer): ConnectInfo<SocketAddr>) -> Result<Json<Health>, ApiError> {
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
    Ok(Json(app.service.health()))
}
