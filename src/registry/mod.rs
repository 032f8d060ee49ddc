//! Model id → slot. A slot holds one `[[models]]` entry and its state; the
//! first request that needs a model loads it, and concurrent first requests
//! wait on one load.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::config::{Config, ModelConfig, ModelKind};
use crate::model::{LoadedModel, ModelError};

#[derive(Clone)]
pub enum SlotState {
    Unloaded,
    Loaded(Arc<LoadedModel>),
    Failed(String),
}

impl SlotState {
    pub fn name(&self) -> &'static str {
        match self {
            SlotState::Unloaded => "unloaded",
            SlotState::Loaded(_) => "loaded",
            SlotState::Failed(_) => "failed",
        }
    }
}

pub struct ModelSlot {
    pub config: ModelConfig,
    state: Mutex<SlotState>,
    /// Serializes loads, so N concurrent first requests cause one load.
    loading: tokio::sync::Mutex<()>,
}

impl ModelSlot {
    pub fn state(&self) -> SlotState {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_state(&self, state: SlotState) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = state;
    }

    /// The loaded model, loading it first if needed. A failed load is retried
    /// by the next request.
    pub async fn get_or_load(&self, config: &Config) -> Result<Arc<LoadedModel>, Arc<str>> {
        if let SlotState::Loaded(model) = self.state() {
            return Ok(model);
        }
        let _loading = self.loading.lock().await;
        if let SlotState::Loaded(model) = self.state() {
            return Ok(model);
        }
        match LoadedModel::load(&self.config, config).await {
            Ok(model) => {
                let model = Arc::new(model);
                let info = model.engine_info();
                tracing::info!(model = %self.config.id, engine = %info.engine, device = %info.device,
                    dimensions = model.dimensions, load_ms = model.load_ms, "model loaded");
                self.set_state(SlotState::Loaded(model.clone()));
                Ok(model)
            }
            Err(e) => {
                let reason: Arc<str> = describe(&e).into();
                tracing::error!(model = %self.config.id, "load failed: {reason}");
                self.set_state(SlotState::Failed(reason.to_string()));
                Err(reason)
            }
        }
    }
}

fn describe(e: &ModelError) -> String {
    format!("model could not be loaded: {e}")
}

pub struct Registry {
    slots: Vec<Arc<ModelSlot>>,
    by_name: HashMap<String, usize>,
}

impl Registry {
    pub fn new(config: &Config) -> Self {
        let mut by_name = HashMap::new();
        let slots = config
            .models
            .iter()
            .enumerate()
            .map(|(i, m)| {
                for name in m.names() {
                    by_name.insert(name.to_string(), i);
                }
                Arc::new(ModelSlot { config: m.clone(), state: Mutex::new(SlotState::Unloaded), loading: Default::default() })
            })
            .collect();
        Self { slots, by_name }
    }

    pub fn slots(&self) -> &[Arc<ModelSlot>] {
        &self.slots
    }

    /// A model by id or alias; `None` picks the default (the first embedding model).
    pub fn find(&self, name: Option<&str>) -> Option<&Arc<ModelSlot>> {
        match name {
            Some(name) => self.by_name.get(name).map(|&i| &self.slots[i]),
            None => self.slots.iter().find(|s| s.config.kind == ModelKind::Embedding),
        }
    }

    pub fn ids(&self) -> Vec<&str> {
        self.slots.iter().map(|s| s.config.id.as_str()).collect()
    }
}
