//! `/models/{id}/...`: every model route under a prefix that names the
//! model. A balancer reads the URL, not the JSON body, so this is what lets
//! nginx's `hash`, HAProxy's `balance uri` or an ingress's `upstream-hash-by`
//! send each model's requests to one replica (examples/deploy/). Clients
//! that take only a base URL (Open WebUI, the OpenAI SDKs, LangChain, the
//! ollama client) pin a model with `http://lb/models/bge-m3/v1`.
//!
//! A Hugging Face id ("BAAI/bge-m3") is two path segments, and is taken as
//! such (`/models/BAAI/bge-m3/v1`), or as one with its slash written `%2F`.

use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::request::Parts;

use super::error::{ApiError, Dialect};
use super::AppState;
use crate::serving::{RequestError, Service, INFINITY_NO_MODEL};

/// The route parameters of the prefix: `/models/{pinned_model}` and
/// `/models/{pinned_model}/{pinned_name}`.
pub const PREFIXES: [&str; 2] = ["/models/{pinned_model}", "/models/{pinned_model}/{pinned_name}"];

/// The model the URL names, if the route is under `/models/{id}`.
#[derive(Debug, Clone, Default)]
pub struct PinnedModel(Option<String>);

impl FromRequestParts<AppState> for PinnedModel {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        // A route without parameters has none to read: it pins nothing.
        let Ok(params) = RawPathParams::from_request_parts(parts, state).await else {
            return Ok(Self(None));
        };
        let (mut model, mut name) = (None, None);
        for (key, value) in &params {
            match key {
                "pinned_model" => model = Some(value.to_string()),
                "pinned_name" => name = Some(value.to_string()),
                _ => {}
            }
        }
        match (model, name) {
            (Some(org), Some(name)) => {
                let pinned = format!("{org}/{name}");
                // `/models/xlmr-m3/embed_sparse` matches TEI's `/` under the
                // two-segment prefix: when "xlmr-m3/embed_sparse" is no model
                // and "xlmr-m3" is one, the URL names a route it does not have.
                // Under a nested prefix the URI is the route's own path.
                if !state.service.has_model(&pinned) {
                    let route = format!("{name}{}", parts.uri.path().trim_end_matches('/'));
                    if let Some(error) = no_route(&state.service, &org, &route) {
                        return Err(error.in_dialect(Dialect::of_path(parts.uri.path())));
                    }
                }
                Ok(Self(Some(pinned)))
            }
            (model, _) => Ok(Self(model)),
        }
    }
}

/// A 404 for a path under `/models/` that starts with a model's id (one
/// segment, or a Hub id's two) followed by a route no model has; `None` for
/// any other path.
pub fn unknown_route(service: &Service, path: &str) -> Option<ApiError> {
    let rest = path.strip_prefix("/models/")?;
    let (first, after_first) = rest.split_once('/')?;
    // A Hub id's slash may come as `%2F` in one segment.
    let first = first.replace("%2F", "/").replace("%2f", "/");
    let two_segments = after_first.split_once('/').and_then(|(second, route)| no_route(service, &format!("{first}/{second}"), route));
    two_segments.or_else(|| no_route(service, &first, after_first))
}

/// A 404 naming `route` and the model `id` when `id` is a model here and
/// `route` (the path after `/models/{id}/`) is none of its routes.
fn no_route(service: &Service, id: &str, route: &str) -> Option<ApiError> {
    let routes = super::model_route_paths();
    if route.is_empty() || routes.contains(&format!("/{route}").as_str()) || !service.has_model(id) {
        return None;
    }
    let message = format!("The model {id:?} has no route {route:?}; its routes, each under /models/{id}, are: {}", routes.join(", "));
    Some(ApiError::route_not_found_under(message).with_model(id))
}

impl PinnedModel {
    pub fn name(&self) -> Option<&str> {
        self.0.as_deref()
    }

    /// The model a request asks for: its body's `model` when the URL names
    /// none; the URL's when the body names none; either when both name the
    /// same entry (by id or alias). Two different models are refused, naming
    /// both, so a client pointed at one model never gets another's vectors.
    pub fn choose(&self, service: &Service, body: Option<String>) -> Result<Option<String>, ApiError> {
        let Some(pinned) = &self.0 else { return Ok(body) };
        match body.filter(|b| !b.is_empty() && b != INFINITY_NO_MODEL) {
            None => Ok(Some(pinned.clone())),
            Some(named) if named == *pinned || service.same_model(&named, pinned) => Ok(Some(named)),
            Some(named) => Err(ApiError::invalid_request(
                "model_mismatch",
                format!("the URL names model {pinned:?} and the body {named:?}: leave model out of the body, or post to /models/{named}/..."),
            )
            .with_param("model")),
        }
    }

    /// Under `/models/{id}`, a 404 naming the model when no entry is called
    /// so: a list route would otherwise answer a typo with an empty list.
    pub fn known(&self, service: &Service) -> Result<(), RequestError> {
        match &self.0 {
            Some(name) if !service.has_model(name) => {
                let states = service.model_states();
                Err(RequestError::unknown_model(name, states.iter().map(|m| m.id.as_str()).collect()))
            }
            _ => Ok(()),
        }
    }

    /// Whether a listed model (its id and aliases) is the one the URL names,
    /// or the URL names none.
    pub fn admits(&self, id: &str, aliases: &[String]) -> bool {
        self.0.as_deref().is_none_or(|pinned| pinned == id || aliases.iter().any(|a| a == pinned))
    }
}
