//! One `[[models]]` entry and the state of its model.

use crate::sync::Recover;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use crate::config::{Config, LoadPolicy, ModelConfig, ServerConfig};
use crate::model::LoadedModel;

/// How long a model stays loaded once idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeepAlive {
    Never,
    Immediately,
    For(Duration),
}

impl KeepAlive {
    /// From config seconds: 0 unloads at once, negative never unloads.
    pub fn from_seconds(seconds: i64) -> Self {
        match seconds {
            s if s < 0 => KeepAlive::Never,
            0 => KeepAlive::Immediately,
            s => KeepAlive::For(Duration::from_secs(s as u64)),
        }
    }
}

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

/// Counters shown in /health; they survive unloads and config reloads of an unchanged entry.
#[derive(Debug, Default)]
pub struct SlotCounters {
    pub requests: AtomicU64,
    /// Requests that ran inference themselves (the rest were coalesced).
    pub inferences: AtomicU64,
    pub coalesced: AtomicU64,
    pub loads: AtomicU64,
    pub unloads: AtomicU64,
    /// Requests that ended in an error (a failed load, a timeout, a tokenizer
    /// or engine error).
    pub errors: AtomicU64,
}

struct Inner {
    state: SlotState,
    busy: usize,
    /// When `busy` last fell to 0 (or the model loaded).
    idle_since: Instant,
    /// Bumped whenever the model goes idle, so a stale keep-alive timer does nothing.
    idle_generation: u64,
    last_used: Option<SystemTime>,
}

pub struct ModelSlot {
    pub config: ModelConfig,
    pub policy: LoadPolicy,
    pub keep_alive: KeepAlive,
    pub counters: SlotCounters,
    inner: Mutex<Inner>,
    /// One load at a time per slot: concurrent first requests wait on one load.
    pub(super) loading: tokio::sync::Mutex<()>,
}

/// A snapshot for /health and /v1/models.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SlotStatus {
    /// unloaded, loaded or failed.
    pub state: &'static str,
    pub loaded: bool,
    /// Requests holding the model now.
    pub in_flight: usize,
    /// Unix seconds of the last finished request.
    pub last_used: Option<u64>,
    /// Why it failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ModelSlot {
    pub fn new(config: ModelConfig, server: &ServerConfig) -> Self {
        Self {
            policy: config.policy(server),
            keep_alive: KeepAlive::from_seconds(config.keep_alive(server)),
            config,
            counters: SlotCounters::default(),
            inner: Mutex::new(Inner { state: SlotState::Unloaded, busy: 0, idle_since: Instant::now(), idle_generation: 0, last_used: None }),
            loading: Default::default(),
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.locked()
    }

    /// Whether a reloaded config's entry is this one unchanged.
    pub fn same_entry(&self, config: &ModelConfig, server: &ServerConfig) -> bool {
        let as_toml = |c: &ModelConfig| toml::to_string(c).ok();
        as_toml(&self.config) == as_toml(config)
            && self.policy == config.policy(server)
            && self.keep_alive == KeepAlive::from_seconds(config.keep_alive(server))
    }

    pub fn state(&self) -> SlotState {
        self.inner().state.clone()
    }

    pub fn status(&self) -> SlotStatus {
        let inner = self.inner();
        SlotStatus {
            state: inner.state.name(),
            loaded: matches!(inner.state, SlotState::Loaded(_)),
            in_flight: inner.busy,
            last_used: inner.last_used.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok()).map(|d| d.as_secs()),
            error: match &inner.state {
                SlotState::Failed(reason) => Some(reason.clone()),
                _ => None,
            },
        }
    }

    pub fn is_loaded(&self) -> bool {
        matches!(self.inner().state, SlotState::Loaded(_))
    }

    /// When the model went idle, if it is loaded and idle.
    pub(super) fn idle_since(&self) -> Option<Instant> {
        let inner = self.inner();
        (matches!(inner.state, SlotState::Loaded(_)) && inner.busy == 0).then_some(inner.idle_since)
    }

    /// A lease on the loaded model, if it is loaded.
    pub(super) fn try_lease(self: &Arc<Self>) -> Option<ModelLease> {
        let mut inner = self.inner();
        let SlotState::Loaded(model) = &inner.state else { return None };
        let model = model.clone();
        inner.busy += 1;
        Some(ModelLease { slot: self.clone(), model, keep_alive: None })
    }

    /// Loads the model and returns the first lease on it.
    pub(super) async fn load(self: &Arc<Self>, config: &Config) -> Result<ModelLease, Arc<str>> {
        tracing::info!(model = %self.config.id, engine = %self.config.engine, "loading");
        match crate::variants::load(&self.config, config).await {
            Ok(model) => {
                let model = Arc::new(model);
                let info = model.engine_info();
                tracing::info!(model = %self.config.id, engine = %info.engine, device = %info.device,
                    dimensions = model.dimensions, load_ms = model.load_ms, "model loaded");
                self.counters.loads.fetch_add(1, Ordering::Relaxed);
                metrics::histogram!("eeane_model_load_seconds", "model" => self.config.id.clone()).record(model.load_ms as f64 / 1e3);
                let mut inner = self.inner();
                inner.state = SlotState::Loaded(model.clone());
                inner.busy += 1;
                Ok(ModelLease { slot: self.clone(), model, keep_alive: None })
            }
            Err(e) => {
                let reason = format!("model {:?} could not be loaded: {e}", self.config.id);
                tracing::error!("{reason}");
                self.inner().state = SlotState::Failed(reason.clone());
                Err(reason.into())
            }
        }
    }

    /// Marks the slot failed without loading (a start-up check found a problem);
    /// the next request still tries to load it.
    pub fn mark_failed(&self, reason: String) {
        self.inner().state = SlotState::Failed(reason);
    }

    /// Unloads the model if no request holds it. Returns whether it did.
    pub fn unload_if_idle(&self, why: &str) -> bool {
        let model = {
            let mut inner = self.inner();
            if inner.busy > 0 || !matches!(inner.state, SlotState::Loaded(_)) {
                return false;
            }
            std::mem::replace(&mut inner.state, SlotState::Unloaded)
        };
        self.counters.unloads.fetch_add(1, Ordering::Relaxed);
        tracing::info!(model = %self.config.id, "unloading: {why}");
        drop(model); // the engine thread ends and drops the engine
        true
    }

    /// A lease came back: start the idle clock, and unload now or arm a timer.
    fn release(self: &Arc<Self>, keep_alive: Option<KeepAlive>) {
        let generation = {
            let mut inner = self.inner();
            inner.busy -= 1;
            inner.last_used = Some(SystemTime::now());
            if inner.busy > 0 {
                return;
            }
            inner.idle_since = Instant::now();
            inner.idle_generation += 1;
            inner.idle_generation
        };
        if self.policy != LoadPolicy::OnDemand {
            return;
        }
        match keep_alive.unwrap_or(self.keep_alive) {
            KeepAlive::Never => {}
            KeepAlive::Immediately => {
                self.unload_if_idle("keep_alive elapsed");
            }
            KeepAlive::For(duration) => {
                let slot = self.clone();
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move {
                        tokio::time::sleep(duration).await;
                        if slot.inner().idle_generation == generation {
                            slot.unload_if_idle("keep_alive elapsed");
                        }
                    });
                }
            }
        }
    }

    /// Drops the model regardless of keep-alive, once idle (used at shutdown and
    /// for entries a reload removed). In-flight requests keep their lease and finish.
    pub fn retire(&self) {
        let model = std::mem::replace(&mut self.inner().state, SlotState::Unloaded);
        if matches!(model, SlotState::Loaded(_)) {
            self.counters.unloads.fetch_add(1, Ordering::Relaxed);
            tracing::info!(model = %self.config.id, "unloading: retired");
        }
    }
}

/// A request's hold on a loaded model. While any lease is out the model stays loaded.
pub struct ModelLease {
    slot: Arc<ModelSlot>,
    model: Arc<LoadedModel>,
    keep_alive: Option<KeepAlive>,
}

impl ModelLease {
    /// This request's keep_alive (Ollama-style): how long the model stays after it.
    pub fn set_keep_alive(&mut self, keep_alive: KeepAlive) {
        self.keep_alive = Some(keep_alive);
    }
}

impl Deref for ModelLease {
    type Target = LoadedModel;
    fn deref(&self) -> &LoadedModel {
        &self.model
    }
}

impl Drop for ModelLease {
    fn drop(&mut self) {
        self.slot.release(self.keep_alive);
    }
}
