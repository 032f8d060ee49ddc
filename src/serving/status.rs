//! What serving reports of itself and its models: one snapshot type that
//! /health, /v1/models and /metrics each render in their own shape.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use utoipa::ToSchema;

use super::Service;
use crate::config::Placement;
use crate::registry::{KeepAlive, ModelSlot, SlotState, SlotStatus, SurveyStatus};
use crate::sync::Recover;

impl Service {
    /// Liveness, the devices the runtimes saw, and every model's state.
    pub fn health(&self) -> Health {
        Health {
            status: "ok",
            version: env!("CARGO_PKG_VERSION"),
            pending_requests: self.pending(),
            devices: crate::engines::visible_devices()
                .into_iter()
                .map(|(api, devices)| (api.to_string(), devices.into_iter().map(Device::from).collect()))
                .collect(),
            models: self.model_states(),
        }
    }

    /// Every configured model's state, in config order.
    pub fn model_states(&self) -> Vec<ModelHealth> {
        self.live().registry.slots().iter().map(|slot| ModelHealth::of(slot)).collect()
    }
}

/// The answer of `GET /health`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// "ok" while the server answers.
    pub status: &'static str,
    pub version: &'static str,
    /// Inference requests admitted and not yet answered.
    pub pending_requests: usize,
    /// The accelerators each runtime opened so far saw, by API ("vulkan").
    pub devices: BTreeMap<String, Vec<Device>>,
    pub models: Vec<ModelHealth>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Device {
    pub name: String,
    /// discrete, integrated, virtual, cpu or other.
    pub kind: String,
    /// What pins this card among identical ones (`cuda:GPU-8a1f...`), where the runtime gives it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Its PCI bus id (`cuda:00000000:41:00.0` pins it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bus_id: Option<String>,
}

impl From<eeane_backend_core::Device> for Device {
    fn from(d: eeane_backend_core::Device) -> Self {
        Device { name: d.name, kind: d.kind, uuid: d.uuid, bus_id: d.bus_id }
    }
}

/// One model's state.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelHealth {
    pub id: String,
    /// embedding or reranker.
    pub kind: String,
    /// The engine serving it once loaded; before that, the one its entry names
    /// (for `precision = "auto"`, the fp32 reference's).
    pub engine: String,
    /// "auto" when the entry leaves the variant to measurement
    /// (`precision = "auto"`); absent when the entry names it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precision_rule: Option<&'static str>,
    pub aliases: Vec<String>,
    /// Longest input in tokens.
    pub max_tokens: usize,
    /// The device it runs on once loaded (which may differ from the one
    /// asked for); before that, the one its entry names.
    pub device: String,
    /// on_demand, resident or disabled.
    pub policy: String,
    /// Seconds it stays loaded after its last request; 0 unloads at once, -1 never.
    pub keep_alive: f64,
    #[serde(flatten)]
    pub status: SlotStatus,
    /// The `precision = "auto"` survey this server ran or runs for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub survey: Option<SurveyStatus>,
    pub counters: Counters,
    #[serde(flatten)]
    pub loaded_model: Option<LoadedHealth>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Counters {
    pub requests: u64,
    /// Requests that ran inference themselves (the rest were coalesced).
    pub inferences: u64,
    pub coalesced: u64,
    pub loads: u64,
    /// Seconds spent loading, over every load.
    pub load_seconds: f64,
    pub unloads: u64,
    /// Unloads that made room for another model under max_loaded_models:
    /// a count that climbs under steady traffic means the models thrash.
    pub evictions: u64,
    pub errors: u64,
}

/// What a loaded model adds. Every field is absent while the model is not
/// loaded, so none is required in the schema of a model's state.
#[derive(Debug, Serialize, ToSchema)]
pub struct LoadedHealth {
    #[schema(required = false)]
    pub precision: String,
    pub runtime_version: Option<String>,
    /// Layers on the accelerator: a device attached too late leaves every
    /// layer on the CPU, silently, and this count shows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accelerated_layers: Option<AcceleratedLayers>,
    /// Width of its vectors.
    #[schema(required = false)]
    pub dimensions: usize,
    #[schema(required = false)]
    pub load_ms: u64,
    #[schema(required = false)]
    pub engine_calls: EngineCalls,
    /// process or thread.
    #[schema(required = false)]
    pub isolation: String,
    /// For `precision = "auto"`: the variant served, and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<crate::model::VariantNote>,
    /// The engine's own process per device, for `ps`/`top` and its memory (isolation = process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_pids: Option<Vec<Option<u32>>>,
    /// Engine processes started again after they died (isolation = process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_restarts: Option<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AcceleratedLayers {
    pub on_device: usize,
    pub total: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EngineCalls {
    pub batches: u64,
    pub rows: u64,
    /// Tokens the engine computed, padding included.
    pub padded_tokens: u64,
    /// Tokens of the sequences themselves.
    pub real_tokens: u64,
    /// Batches per device, in the order the devices loaded.
    pub per_device: Vec<u64>,
    /// Sequences per device, in the same order.
    pub rows_per_device: Vec<u64>,
    /// Sequences waiting for an engine now (the model's queue depth).
    pub queued_sequences: u64,
}

/// A config enum's name as the TOML writes it.
fn name_of(value: impl Serialize) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

impl ModelHealth {
    /// The kind of model file its engine reads (`Backend::file_format`).
    pub fn file_format(&self) -> &'static str {
        crate::engines::find(&self.engine).map_or("unknown", |e| e.file_format())
    }

    pub(super) fn of(slot: &ModelSlot) -> Self {
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        let c = &slot.counters;
        let loaded_model = match slot.state() {
            SlotState::Loaded(model) => Some(model),
            _ => None,
        };
        let device = loaded_model.as_ref().map_or_else(|| slot.config.device.to_string(), |m| m.engine_info().device.clone());
        ModelHealth {
            id: slot.config.id.clone(),
            kind: name_of(slot.config.kind),
            engine: loaded_model.as_ref().map_or_else(|| slot.config.engine.clone(), |m| m.engine_info().engine.clone()),
            precision_rule: slot.config.auto_precision.map(|_| "auto"),
            aliases: slot.config.aliases.clone(),
            max_tokens: slot.config.max_tokens,
            device,
            policy: name_of(slot.policy),
            keep_alive: match slot.keep_alive {
                KeepAlive::Never => -1.0,
                KeepAlive::Immediately => 0.0,
                KeepAlive::For(d) => d.as_secs_f64(),
            },
            status: slot.status(),
            survey: slot.survey(),
            counters: Counters {
                requests: load(&c.requests),
                inferences: load(&c.inferences),
                coalesced: load(&c.coalesced),
                loads: load(&c.loads),
                load_seconds: load(&c.load_ms) as f64 / 1e3,
                unloads: load(&c.unloads),
                evictions: load(&c.evictions),
                errors: load(&c.errors),
            },
            loaded_model: loaded_model.map(|model| {
                let info = model.engine_info();
                let stats = model.stats();
                let in_process = model.isolation == Placement::Process;
                LoadedHealth {
                    precision: info.precision.clone(),
                    runtime_version: info.runtime_version.clone(),
                    accelerated_layers: info.accelerated_layers.map(|(on_device, total)| AcceleratedLayers { on_device, total }),
                    dimensions: model.dimensions,
                    load_ms: model.load_ms,
                    engine_calls: EngineCalls {
                        batches: load(&stats.batches),
                        rows: load(&stats.rows),
                        padded_tokens: load(&stats.padded_tokens),
                        real_tokens: load(&stats.real_tokens),
                        per_device: stats.device_batches.locked().clone(),
                        rows_per_device: stats.device_rows.locked().clone(),
                        queued_sequences: load(&stats.waiting_sequences),
                    },
                    variant: model.variant(),
                    isolation: name_of(model.isolation),
                    engine_pids: in_process.then(|| stats.engine_pids.locked().clone()),
                    engine_restarts: in_process.then(|| load(&stats.engine_restarts)),
                }
            }),
        }
    }
}
