//! The serving core between HTTP and the registry: the live config and
//! registry (swapped whole on reload), admission control, coalescing, start-up
//! preflight and shutdown. Knows nothing of HTTP.

mod coalesce;
mod requests;
mod status;

pub use requests::{
    EmbedRequest, Embedded, Fault, Inputs, KeepAlive, LongInputs, Ranked, RequestError, RerankRequest, Token, TokenizeRequest, INFINITY_NO_MODEL,
};
pub use status::{AcceleratedLayers, Counters, Device, EngineCalls, Health, LoadedHealth, ModelHealth};

use crate::sync::RecoverRw;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::config::{find_file, CliOverrides, Config, ConfigError, LoadPolicy};
use crate::model::{check_files, Inference};
use crate::pooling::VectorOptions;
use crate::registry::{AcquireError, ModelSlot, Registry};
use coalesce::Coalescer;

/// One consistent view of config and models; a reload builds a new one.
pub struct Live {
    pub config: Arc<Config>,
    registry: Registry,
    pub health_limiter: Option<DefaultKeyedRateLimiter<IpAddr>>,
}

impl Live {
    fn new(config: Config, previous: Option<&Registry>) -> Self {
        let registry = Registry::new(&config, previous);
        let health_limiter = NonZeroU32::new(config.server.health_rate_limit).map(|per_minute| RateLimiter::keyed(Quota::per_minute(per_minute)));
        Self { config: Arc::new(config), registry, health_limiter }
    }

    /// Deadline for a request admitted now to start inference.
    pub fn deadline(&self) -> Option<Instant> {
        let seconds = self.config.server.queue_timeout;
        (seconds > 0).then(|| Instant::now() + Duration::from_secs(seconds))
    }
}

/// A request admitted past max_pending_requests; counts as pending until dropped.
pub struct Admitted<'a>(&'a AtomicUsize);

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[derive(Debug)]
pub struct Overloaded {
    pub limit: usize,
}

type CoalesceKey = (String, Arc<Inputs>, VectorOptions, Option<KeepAlive>);

pub struct Service {
    live: RwLock<Arc<Live>>,
    config_flag: Option<PathBuf>,
    overrides: CliOverrides,
    pending: AtomicUsize,
    // A failure is shared as the `RequestError` it becomes: coalesced requests get a clone.
    coalescer: Coalescer<CoalesceKey, Result<Arc<Inference>, RequestError>>,
    reload_lock: tokio::sync::Mutex<()>,
}

/// What a reload changed.
#[derive(Debug, serde::Serialize)]
pub struct ReloadSummary {
    pub models: Vec<String>,
    pub added: Vec<String>,
    pub removed: Vec<String>,
}

impl Service {
    pub fn new(config: Config, config_flag: Option<PathBuf>, overrides: CliOverrides) -> Self {
        Self {
            live: RwLock::new(Arc::new(Live::new(config, None))),
            config_flag,
            overrides,
            pending: AtomicUsize::new(0),
            coalescer: Coalescer::default(),
            reload_lock: Default::default(),
        }
    }

    pub fn live(&self) -> Arc<Live> {
        self.live.read_recovered().clone()
    }

    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Counts a request in, unless max_pending_requests are already in.
    fn admit(&self, live: &Live) -> Result<Admitted<'_>, Overloaded> {
        let limit = live.config.server.max_pending_requests;
        let before = self.pending.fetch_add(1, Ordering::AcqRel);
        let admitted = Admitted(&self.pending);
        if limit > 0 && before >= limit {
            return Err(Overloaded { limit });
        }
        Ok(admitted)
    }

    /// Runs `inputs` through `slot`'s model, loading it if needed; an identical
    /// request in flight is joined rather than run again.
    async fn run(
        &self,
        live: &Live,
        slot: &Arc<ModelSlot>,
        inputs: Inputs,
        options: VectorOptions,
        keep_alive: Option<KeepAlive>,
        deadline: Option<Instant>,
    ) -> Result<Arc<Inference>, RequestError> {
        slot.counters.requests.fetch_add(1, Ordering::Relaxed);
        let inputs = Arc::new(inputs);
        let work = || async {
            let mut lease = live.registry.acquire(slot, &live.config, deadline).await.map_err(RequestError::from)?;
            // Counted once the model is there: a failed load runs no inference.
            slot.counters.inferences.fetch_add(1, Ordering::Relaxed);
            if let Some(keep_alive) = keep_alive {
                lease.set_keep_alive(keep_alive);
            }
            let result = lease.embed_with(inputs.clone(), deadline, options).await.map_err(|e| RequestError::from(&e))?;
            Ok(Arc::new(result))
        };
        let result = if !live.config.server.coalesce_requests {
            work().await
        } else {
            let (result, coalesced) = self.coalescer.run((slot.config.id.clone(), inputs.clone(), options, keep_alive), work).await;
            if coalesced {
                slot.counters.coalesced.fetch_add(1, Ordering::Relaxed);
            }
            result
        };
        if result.is_err() {
            slot.counters.errors.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// Start-up: resident models load (and answer a warm-up) before the port is
    /// bound; on-demand models get the cheap checks. Err is the reason to exit.
    pub async fn preflight(&self) -> Result<(), AcquireError> {
        let live = self.live();
        for slot in live.registry.slots() {
            match slot.policy {
                LoadPolicy::Resident => {
                    live.registry.acquire(slot, &live.config, None).await?;
                }
                _ if slot.config.source.is_some() && slot.config.unavailable.is_none() && !slot.config.model.path().exists() => {
                    tracing::info!(model = %slot.config.id, "fetched from its source at its first request");
                }
                _ => {
                    if let Some(reason) = &slot.config.unavailable {
                        tracing::warn!(model = %slot.config.id, "{reason}; its requests will fail until this is fixed");
                        slot.mark_failed(reason.clone());
                        continue;
                    }
                    if let Err(reason) = check_files(&slot.config, &live.config) {
                        tracing::warn!(model = %slot.config.id, "{reason}; its requests will fail until this is fixed");
                        slot.mark_failed(reason.to_string());
                    }
                }
            }
        }
        Ok(())
    }

    /// Re-reads the config. A file that does not parse or validate, or a new
    /// resident model that fails to load, leaves the running config untouched.
    pub async fn reload(&self) -> Result<ReloadSummary, ConfigError> {
        let _one_at_a_time = self.reload_lock.lock().await;
        let file = find_file(self.config_flag.as_deref())?;
        let config = Config::load(file.as_deref(), &self.overrides)?;
        let old = self.live();
        if (&config.server.host, config.server.port) != (&old.config.server.host, old.config.server.port) {
            tracing::warn!("server.host and server.port take effect at the next restart");
        }
        let next = Live::new(config, Some(&old.registry));
        for slot in next.registry.slots().iter().filter(|s| s.policy == LoadPolicy::Resident) {
            next.registry
                .acquire(slot, &next.config, None)
                .await
                .map_err(|e| ConfigError::Invalid { key: format!("models (id {:?})", slot.config.id), message: e.to_string() })?;
        }
        let retired = old.registry.retired_by(&next.registry);
        let summary = ReloadSummary {
            models: next.registry.ids().iter().map(|s| s.to_string()).collect(),
            added: next.registry.slots().iter().filter(|s| !old.registry.slots().iter().any(|o| Arc::ptr_eq(s, o))).map(|s| s.config.id.clone()).collect(),
            removed: retired.iter().map(|s| s.config.id.clone()).collect(),
        };
        *self.live.write_recovered() = Arc::new(next);
        // In-flight requests keep their lease on a retired model and finish; its
        // memory goes when the last of them does.
        for slot in retired {
            slot.retire();
        }
        tracing::info!(added = ?summary.added, removed = ?summary.removed, "config reloaded");
        Ok(summary)
    }

    /// Whether a model has this id or alias.
    pub fn has_model(&self, name: &str) -> bool {
        self.live().registry.find(Some(name)).is_some()
    }

    /// Whether two names (ids or aliases) are the same model's.
    pub fn same_model(&self, a: &str, b: &str) -> bool {
        let live = self.live();
        matches!((live.registry.find(Some(a)), live.registry.find(Some(b))), (Some(x), Some(y)) if Arc::ptr_eq(x, y))
    }

    /// The model named, if it is loaded (for `eeane bench`'s engine counters).
    pub fn loaded_model(&self, name: &str) -> Option<Arc<crate::model::LoadedModel>> {
        match self.live().registry.find(Some(name))?.state() {
            crate::registry::SlotState::Loaded(model) => Some(model),
            _ => None,
        }
    }

    /// Unloads every model (after the HTTP server has drained).
    pub fn shutdown(&self) {
        for slot in self.live().registry.slots() {
            slot.retire();
        }
    }
}
