//! Model id → slot, and each model's life:
//! `unloaded → loaded(idle | busy n) → unloaded`, with `failed(reason)` beside it.
//!
//! A request takes a [`ModelLease`]; the model cannot be unloaded while any
//! lease is out, so an unload never interrupts a forward pass. The keep-alive
//! clock starts when the last lease is returned. Loads go through one gate per
//! registry, where `max_loaded_models` evicts the longest-idle on-demand model.

mod slot;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

pub use slot::{KeepAlive, ModelLease, ModelSlot, SlotCounters, SlotState, SlotStatus, SurveyStatus};

use crate::config::{Config, LoadPolicy};

/// Why a request got no lease on its model: the load failed, no room under
/// max_loaded_models, or the wait ran past queue_timeout.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AcquireError {
    #[error("{0}")]
    LoadFailed(Arc<str>),
    #[error("max_loaded_models ({0}) are loaded and every one is resident")]
    NoRoom(usize),
    #[error("the request waited longer than queue_timeout for its model to load")]
    Timeout,
}

/// Signalled when a loaded model's last request finishes or a model unloads:
/// a load waiting for room under max_loaded_models looks again. One for the
/// process, as slots outlive the registry that made them (config reloads).
static ROOM_FREED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Wakes every load waiting for room.
fn room_freed() {
    ROOM_FREED.notify_waiters();
}

/// What a load under max_loaded_models finds.
enum Room {
    /// Below the cap, or the longest-idle on-demand model was unloaded.
    Made,
    /// Every on-demand model loaded is busy: one will go idle.
    Busy,
}

pub struct Registry {
    slots: Vec<Arc<ModelSlot>>,
    by_name: HashMap<String, usize>,
    max_loaded: Option<usize>,
    /// Serializes loads, so that counting, evicting and loading cannot interleave.
    load_gate: tokio::sync::Mutex<()>,
}

impl Registry {
    /// Builds the registry for `config`, taking over slots of `previous` whose
    /// entry did not change (they keep their loaded model and counters).
    pub fn new(config: &Config, previous: Option<&Registry>) -> Self {
        let mut by_name = HashMap::new();
        let mut slots = Vec::new();
        for model in config.models.iter().filter(|m| m.policy(&config.server) != LoadPolicy::Disabled) {
            let slot = previous
                .and_then(|p| p.by_id(&model.id))
                .filter(|old| old.same_entry(model, &config.server))
                .cloned()
                .unwrap_or_else(|| Arc::new(ModelSlot::new(model.clone(), &config.server)));
            for name in model.names() {
                by_name.insert(name.to_string(), slots.len());
            }
            slots.push(slot);
        }
        Self { slots, by_name, max_loaded: config.server.max_loaded_models, load_gate: Default::default() }
    }

    pub fn slots(&self) -> &[Arc<ModelSlot>] {
        &self.slots
    }

    fn by_id(&self, id: &str) -> Option<&Arc<ModelSlot>> {
        self.slots.iter().find(|s| s.config.id == id)
    }

    /// A model by id or alias; `None` picks the default (the first embedding model).
    pub fn find(&self, name: Option<&str>) -> Option<&Arc<ModelSlot>> {
        match name {
            Some(name) => self.by_name.get(name).map(|&i| &self.slots[i]),
            None => self.slots.iter().find(|s| s.config.kind == crate::config::ModelKind::Embedding),
        }
    }

    /// The model /rerank uses when the request names none: the first
    /// reranker, else the first embedding model with `rerank = true`.
    pub fn default_reranker(&self) -> Option<&Arc<ModelSlot>> {
        self.slots.iter().find(|s| s.config.kind == crate::config::ModelKind::Reranker).or_else(|| self.slots.iter().find(|s| s.config.rerank))
    }

    pub fn ids(&self) -> Vec<&str> {
        self.slots.iter().map(|s| s.config.id.as_str()).collect()
    }

    /// The models that answer embedding requests (a reranker does not).
    pub fn embedding_ids(&self) -> Vec<&str> {
        self.slots.iter().filter(|s| s.config.kind == crate::config::ModelKind::Embedding).map(|s| s.config.id.as_str()).collect()
    }

    /// The models that answer /rerank: rerankers, and embedding models with `rerank = true`.
    pub fn reranking_ids(&self) -> Vec<&str> {
        self.slots.iter().filter(|s| s.config.kind == crate::config::ModelKind::Reranker || s.config.rerank).map(|s| s.config.id.as_str()).collect()
    }

    /// Slots of `self` that `next` does not carry over: removed or changed entries.
    pub fn retired_by(&self, next: &Registry) -> Vec<Arc<ModelSlot>> {
        self.slots.iter().filter(|s| !next.slots.iter().any(|n| Arc::ptr_eq(s, n))).cloned().collect()
    }

    /// A lease on `slot`'s model, loading it (and evicting to make room) if needed.
    /// Waiting for the load gives up at `deadline`.
    pub async fn acquire(&self, slot: &Arc<ModelSlot>, config: &Config, deadline: Option<Instant>) -> Result<ModelLease, AcquireError> {
        if let Some(lease) = slot.try_lease() {
            return Ok(lease);
        }
        let load = async {
            let _one_load_per_slot = slot.loading.lock().await;
            loop {
                if let Some(lease) = slot.try_lease() {
                    return Ok(lease);
                }
                // Registered before the gate is taken, so that a model going
                // idle between the check and the wait is not missed.
                let freed = ROOM_FREED.notified();
                tokio::pin!(freed);
                freed.as_mut().enable();
                let _gate = self.load_gate.lock().await;
                match self.make_room(slot)? {
                    Room::Made => return slot.load(config).await.map_err(AcquireError::LoadFailed),
                    // Waits for an idle model, until the request's deadline
                    // (queue_timeout) ends the wait with a 503.
                    Room::Busy => {
                        drop(_gate);
                        freed.await;
                    }
                }
            }
        };
        match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline.into(), load).await.map_err(|_| AcquireError::Timeout)?,
            None => load.await,
        }
    }

    /// Under the load gate: unloads the longest-idle on-demand model if loading
    /// one more would pass max_loaded_models. Busy models are never evicted:
    /// with every on-demand model busy, the load waits for one to go idle; with
    /// none loaded (every loaded model resident) it never could, and is refused.
    fn make_room(&self, loading: &Arc<ModelSlot>) -> Result<Room, AcquireError> {
        let Some(cap) = self.max_loaded else { return Ok(Room::Made) };
        let loaded: Vec<&Arc<ModelSlot>> = self.slots.iter().filter(|s| s.is_loaded()).collect();
        if loaded.len() < cap {
            return Ok(Room::Made);
        }
        let evictable: Vec<&&Arc<ModelSlot>> = loaded.iter().filter(|s| !Arc::ptr_eq(s, loading) && s.policy == LoadPolicy::OnDemand).collect();
        if evictable.is_empty() {
            return Err(AcquireError::NoRoom(cap));
        }
        let victim = evictable.into_iter().filter_map(|s| s.idle_since().map(|t| (t, s))).min_by_key(|(t, _)| *t);
        match victim {
            Some((_, slot)) if slot.unload_if_idle("evicted for max_loaded_models") => {
                slot.counters.evictions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(Room::Made)
            }
            _ => Ok(Room::Busy),
        }
    }
}
