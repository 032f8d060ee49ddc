//! `/models/{id}/...`: every model route under a prefix that names the
//! model. A balancer reads the URL, not the JSON body, so this is what lets
//! nginx's `hash`, HAProxy's `balance uri` or an ingress's `upstream-hash-by`
//! send each model's requests to one replica (examples/deploy/). Clients
//! that take only a base URL (Open WebUI, the OpenAI SDKs, LangChain, the
//! ollama client) pin a model with `http://lb/models/bge-m3/v1`.
//!
//! A Hugging Face id ("BAAI/bge-m3") is two path segments, and is taken as
//! such (`/models/BAAI/bge-m3/v1`), or as one with its slash written `%2F`.

use std::convert::Infallible;

use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::request::Parts;

use super::error::ApiError;
use crate::serving::{RequestError, Service, INFINITY_NO_MODEL};

/// The route parameters of the prefix: `/models/{pinned_model}` and
/// `/models/{pinned_model}/{pinned_name}`.
pub const PREFIXES: [&str; 2] = ["/models/{pinned_model}", "/models/{pinned_model}/{pinned_name}"];

/// The model the URL names, if the route is under `/models/{id}`.
#[derive(Debug, Clone, Default)]
pub struct PinnedModel(Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for PinnedModel {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Infallible> {
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
        Ok(Self(match (model, name) {
            (Some(org), Some(name)) => Some(format!("{org}/{name}")),
            (model, _) => model,
        }))
    }
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
