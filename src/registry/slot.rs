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
    /// Milliseconds spent loading, over every load.
    pub load_ms: AtomicU64,
    pub unloads: AtomicU64,
    /// Unloads to make room under max_loaded_models (counted in `unloads` too):
    /// what a balancer that spreads models over replicas causes.
    pub evictions: AtomicU64,
    /// Requests that ended in an error (a failed load, a timeout, a tokenizer
    /// or engine error).
    pub errors: AtomicU64,
}

struct Inner {
    state: SlotState,
    /// The `precision = "auto"` survey of this entry, when one ran or runs here.
    survey: Option<SurveyStatus>,
    /// The running survey's task, stopped when the slot is retired.
    survey_task: Option<tokio::task::AbortHandle>,
    busy: usize,
    /// A load is under way (its requests wait for it).
    loading: bool,
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

/// A `precision = "auto"` survey run by this server, for /health: while it
/// runs the fp32 reference serves, and the slot switches to the variant it
/// chooses between requests.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct SurveyStatus {
    /// running, done, failed, or stopped (the model was retired first: at
    /// shutdown, or a reload removed or changed its entry).
    pub state: &'static str,
    /// Variants it measures (the chosen one's engine layouts come after).
    pub variants: usize,
    /// Unix seconds when it started.
    pub started_at: u64,
    /// Its time so far, or in all once it ended, apart from the model's load time.
    pub seconds: f64,
    /// The variant it chose, once done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chosen: Option<String>,
    /// Whether the slot switched to it (not when the model was unloaded or
    /// replaced meanwhile: the verdict is kept for its next load).
    pub switched: bool,
    /// Why it failed; the fp32 reference keeps serving.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A snapshot for /health and /v1/models.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SlotStatus {
    /// unloaded, loading (until it serves), loaded or failed.
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
            inner: Mutex::new(Inner {
                state: SlotState::Unloaded,
                loading: false,
                survey: None,
                survey_task: None,
                busy: 0,
                idle_since: Instant::now(),
                idle_generation: 0,
                last_used: None,
            }),
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
            && self.config.auto_precision == config.auto_precision
            && self.policy == config.policy(server)
            && self.keep_alive == KeepAlive::from_seconds(config.keep_alive(server))
    }

    pub fn state(&self) -> SlotState {
        self.inner().state.clone()
    }

    pub fn status(&self) -> SlotStatus {
        let inner = self.inner();
        SlotStatus {
            state: if inner.loading && !matches!(inner.state, SlotState::Loaded(_)) { "loading" } else { inner.state.name() },
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

    /// The survey this slot ran or runs, for /health.
    pub fn survey(&self) -> Option<SurveyStatus> {
        let mut survey = self.inner().survey.clone()?;
        if survey.state == "running" {
            survey.seconds = unix_now().saturating_sub(survey.started_at) as f64;
        }
        Some(survey)
    }

    /// Loads the model and returns the first lease on it.
    pub(super) async fn load(self: &Arc<Self>, config: &Config) -> Result<ModelLease, Arc<str>> {
        tracing::info!(model = %self.config.id, engine = %self.config.engine, "loading");
        /// Clears `loading` however the load ends, a request that gave up included.
        struct Loading<'a>(&'a ModelSlot);
        impl Drop for Loading<'_> {
            fn drop(&mut self) {
                self.0.inner().loading = false;
            }
        }
        self.inner().loading = true;
        let _loading = Loading(self);
        match crate::variants::load(&self.config, config).await {
            Ok(crate::variants::Loaded { model, survey }) => {
                let model = Arc::new(model);
                if let Some(mut survey) = survey {
                    survey.lend_reference(&model);
                    self.start_survey(survey);
                }
                let info = model.engine_info();
                tracing::info!(model = %self.config.id, engine = %info.engine, device = %info.device,
                    dimensions = model.dimensions, load_ms = model.load_ms, "model loaded");
                self.counters.loads.fetch_add(1, Ordering::Relaxed);
                self.counters.load_ms.fetch_add(model.load_ms, Ordering::Relaxed);
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

    /// Runs `survey` beside the fp32 reference that serves meanwhile; once it
    /// chooses, the slot serves the chosen variant from the next request on
    /// (requests in flight finish on the reference), or keeps the reference
    /// when that was chosen as it served. One survey at a time: a reload of
    /// the reference while one runs waits for its verdict.
    fn start_survey(self: &Arc<Self>, survey: crate::variants::PendingSurvey) {
        let variants = survey.variants();
        {
            let mut inner = self.inner();
            if inner.survey.as_ref().is_some_and(|s| s.state == "running") {
                return;
            }
            let started_at = unix_now();
            inner.survey = Some(SurveyStatus { state: "running", variants, started_at, seconds: 0.0, chosen: None, switched: false, error: None });
        }
        tracing::info!(model = %self.config.id, variants, "precision = auto: the fp32 reference serves while the survey measures the variants");
        let slot = self.clone();
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let result = survey.run().await;
            let seconds = started.elapsed().as_secs_f64();
            let mut inner = slot.inner();
            let Some(status) = inner.survey.as_mut() else { return };
            status.seconds = seconds;
            match result {
                Ok(crate::variants::Surveyed::Served(note)) => {
                    status.state = "done";
                    status.chosen = Some(note.chosen.clone());
                    let chosen = note.chosen.clone();
                    // The reference that serves is the variant chosen: it says so from now on.
                    if let SlotState::Loaded(m) = &inner.state {
                        if m.variant().is_some_and(|v| v.awaiting_survey) {
                            m.set_variant(note);
                        }
                    }
                    drop(inner);
                    tracing::info!(model = %slot.config.id, chosen = %chosen, seconds, "precision = auto: survey done; the reference that serves was chosen");
                }
                Ok(crate::variants::Surveyed::Loaded(model)) => {
                    let chosen = model.variant().map(|v| v.chosen).unwrap_or_default();
                    status.state = "done";
                    status.chosen = Some(chosen.clone());
                    // Only a reference still waiting is replaced: an unload or a reload since leaves the slot as it is.
                    let waiting = matches!(&inner.state, SlotState::Loaded(m) if m.variant().is_some_and(|v| v.awaiting_survey));
                    if waiting {
                        let served = Arc::new(*model);
                        if let Some(status) = inner.survey.as_mut() {
                            status.switched = true;
                        }
                        let reference = std::mem::replace(&mut inner.state, SlotState::Loaded(served));
                        drop(inner);
                        tracing::info!(model = %slot.config.id, chosen = %chosen, seconds, "precision = auto: survey done; serving the chosen variant");
                        // Requests in flight hold the reference until they finish.
                        drop(reference);
                    } else {
                        drop(inner);
                        tracing::info!(model = %slot.config.id, chosen = %chosen, seconds, "precision = auto: survey done; kept for the next load");
                    }
                }
                Err(e) => {
                    status.state = "failed";
                    status.error = Some(e.to_string());
                    drop(inner);
                    tracing::warn!(model = %slot.config.id, seconds, "precision = auto: the survey failed ({e}); the fp32 reference keeps serving");
                }
            }
        });
        self.inner().survey_task = Some(task.abort_handle());
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
        super::room_freed();
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
        // Idle now: evictable by a load waiting for room.
        super::room_freed();
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
        let model = {
            let mut inner = self.inner();
            // A survey still running stops: its engines would hold the shutdown.
            if let Some(task) = inner.survey_task.take() {
                task.abort();
            }
            if let Some(survey) = inner.survey.as_mut().filter(|s| s.state == "running") {
                survey.state = "stopped";
                survey.seconds = unix_now().saturating_sub(survey.started_at) as f64;
            }
            std::mem::replace(&mut inner.state, SlotState::Unloaded)
        };
        if matches!(model, SlotState::Loaded(_)) {
            self.counters.unloads.fetch_add(1, Ordering::Relaxed);
            tracing::info!(model = %self.config.id, "unloading: retired");
            drop(model);
            super::room_freed();
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs())
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
