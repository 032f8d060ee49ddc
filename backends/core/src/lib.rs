//! The contract between eeane and its inference engines.
//!
//! An engine takes token ids and an attention mask and returns vectors. It knows
//! nothing of HTTP, TOML, tokenizers, pooling or other engines, and it is
//! synchronous: eeane runs each engine on a thread of its own (in a child
//! process of its own by default) and feeds it through a channel or a pipe, so
//! the types that cross are serializable. Unloading is dropping it.

pub mod compile_cache;
pub mod devices;
pub mod pick;

pub use devices::{DeviceName, Devices, InvalidDevice};
pub use pick::{every_device, lasting_pin, pick_device, refuse_index, ListedDevice, EVERY};

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A padded batch of token sequences, row-major `[batch, seq]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenBatch {
    pub input_ids: Vec<i64>,
    pub attention_mask: Vec<i64>,
    /// Segment ids, for models that take them (BERT); `None` means all zero.
    pub token_type_ids: Option<Vec<i64>>,
    pub batch: usize,
    pub seq: usize,
    /// The real (unpadded) length of each row: engines that run rows at their
    /// natural lengths use it to skip the padding.
    pub lengths: Vec<usize>,
}

impl TokenBatch {
    /// Pads `rows` (ids, type ids) on the right to `seq` tokens with `pad_id`.
    pub fn from_rows(rows: &[(&[i64], Option<&[i64]>)], seq: usize, pad_id: i64) -> Self {
        let batch = rows.len();
        let mut input_ids = vec![pad_id; batch * seq];
        let mut attention_mask = vec![0; batch * seq];
        let with_types = rows.iter().any(|(_, t)| t.is_some());
        let mut token_type_ids = with_types.then(|| vec![0; batch * seq]);
        let mut lengths = Vec::with_capacity(batch);
        for (r, (ids, types)) in rows.iter().enumerate() {
            assert!(ids.len() <= seq, "row {r} has {} tokens, more than seq {seq}", ids.len());
            let row = r * seq..r * seq + ids.len();
            input_ids[row.clone()].copy_from_slice(ids);
            attention_mask[row.clone()].fill(1);
            if let (Some(all), Some(types)) = (token_type_ids.as_mut(), types) {
                all[row].copy_from_slice(types);
            }
            lengths.push(ids.len());
        }
        Self { input_ids, attention_mask, token_type_ids, batch, seq, lengths }
    }
}

/// What an engine returns for a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineOutput {
    /// One vector per row, `[batch, dim]`: the graph pools (and maybe normalizes) itself.
    Pooled { data: Vec<f32>, batch: usize, dim: usize },
    /// Token states `[batch, seq, dim]`, to be pooled by eeane using the mask.
    Hidden { data: Vec<f32>, batch: usize, seq: usize, dim: usize },
}

/// The shapes an engine accepts, so the batcher can form batches it can run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum InputShapes {
    /// Any batch and sequence length (ONNX Runtime with dynamic axes).
    Dynamic,
    /// Only these `(batch, seq)` shapes, compiled ahead (Core ML's static shapes).
    Fixed(Vec<(usize, usize)>),
    /// Any batch; the engine runs each row at its natural length, never padded
    /// (ncnn, which packs rows side by side), so padding costs nothing.
    NaturalLengths,
}

/// What one engine call costs beyond its tokens on a CPU, in tokens: little,
/// so padding weighs more than batch size there.
pub const CPU_CALL_COST_TOKENS: usize = 128;

/// The rows a batch of `rows` runs with on an engine whose `row_counts`
/// (`EngineInfo::row_counts`) these are: the first at or above it, or
/// `rows` itself.
pub fn rows_run(row_counts: &[usize], rows: usize) -> usize {
    row_counts.iter().copied().find(|&r| r >= rows).unwrap_or(rows)
}

/// An engine's description of itself, reported in /health and logs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineInfo {
    /// The engine's name, e.g. "onnxruntime".
    pub engine: String,
    /// The device it actually runs on, which may differ from the one asked for.
    pub device: String,
    /// Numeric precision of the graph as loaded, e.g. "fp32" or "int8".
    pub precision: String,
    pub shapes: InputShapes,
    /// Whether the model takes token type ids.
    pub takes_token_type_ids: bool,
    /// Sequence lengths the engine runs best at are multiples of this (8 on
    /// GPUs, 1 where padding only costs); the batcher rounds up to it unless
    /// the model's config says otherwise.
    pub seq_multiple: usize,
    /// What one call costs beyond its tokens, in tokens: the batcher's
    /// planner weighs fewer, fuller batches against padding with it
    /// (`CPU_CALL_COST_TOKENS` where a call costs little more than its tokens).
    pub call_cost_tokens: usize,
    /// The row counts the engine runs, ascending: it pads a batch of other
    /// rows up to the next one, and the planner prices a batch at the rows it
    /// runs (empty: a batch runs its own rows).
    #[serde(default)]
    pub row_counts: Vec<usize>,
    /// Layers placed on the accelerator, when the engine can tell (`accelerated`, `total`).
    pub accelerated_layers: Option<(usize, usize)>,
    /// Runtime library version, when known.
    pub runtime_version: Option<String>,
}

/// What an engine needs to load one model. Paths are absolute.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct EngineSpec {
    pub model_path: PathBuf,
    /// The runtime library to open, for engines that open theirs at run time.
    pub runtime_library: Option<PathBuf>,
    /// The one device this engine loads on, one of the model entry's
    /// `Devices` ("cpu", "cuda:NAME", "GPU", ...): eeane starts an engine per
    /// listed device. Each engine reads its own forms.
    pub device: DeviceName,
    /// Compute threads; 0 lets the runtime choose.
    pub threads: usize,
    /// Name of the output to read; `None` takes the graph's first output.
    pub output: Option<String>,
    /// The engine's own options, as its `Backend::options` checked them.
    pub options: Options,
    /// GPU names (or substrings) no model may use (the server's `forbidden_devices`).
    pub forbidden_devices: Vec<String>,
    /// A directory where the engine may keep compiled models between loads.
    pub compile_cache: Option<PathBuf>,
    /// The most bytes that directory may hold; an engine that writes there
    /// removes its least recently used entries beyond it (`compile_cache::evict`).
    #[serde(default)]
    pub compile_cache_limit: Option<u64>,
    /// The model's length buckets as `(batch, seq)`, ascending: engines that
    /// compile per bucket compile these (OpenVINO one model each, its shapes
    /// bounded by the bucket's rows and tokens); dynamic engines ignore them.
    pub shapes: Vec<(usize, usize)>,
    /// The server keeps this engine's thread to its own share of the CPUs,
    /// inside a process that other engines share (`isolation = "thread"`).
    /// That thread's affinity mask keeps the engines apart; a runtime that
    /// places its threads by a CPU map of its own must leave that off, or
    /// several engines land on the same cores.
    #[serde(default)]
    pub own_cpus_in_shared_process: bool,
}

/// Why an engine could not load or run: what an engine returns, and what
/// crosses the engine process's pipe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EngineError {
    /// The runtime library is missing or unusable.
    Runtime(String),
    /// The model file is missing, unreadable, or not a graph this engine can serve.
    Model(String),
    /// The requested device does not exist or cannot be used.
    Device(String),
    /// The batch does not fit what the engine accepts.
    Input(String),
    /// The forward pass failed.
    Inference(String),
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::Runtime(m) => write!(f, "runtime: {m}"),
            EngineError::Model(m) => write!(f, "model: {m}"),
            EngineError::Device(m) => write!(f, "device: {m}"),
            EngineError::Input(m) => write!(f, "input: {m}"),
            EngineError::Inference(m) => write!(f, "inference: {m}"),
        }
    }
}

impl std::error::Error for EngineError {}

/// A loaded model, ready to run batches. Not `Sync`: one thread owns it.
pub trait Engine: Send {
    fn info(&self) -> &EngineInfo;
    fn run(&mut self, batch: &TokenBatch) -> Result<EngineOutput, EngineError>;

    /// Work the engine may do while no batch waits: on a GPU, the first run
    /// of a batch shape it has not run yet (the first run of each shape costs
    /// far more than the next). The engine's thread calls it only when idle,
    /// so a model serves as soon as it loads and warms while it serves.
    /// Returns whether more remains.
    fn warm_next(&mut self) -> Result<bool, EngineError> {
        Ok(false)
    }
}

/// An engine's options after its `Backend::options` checked them: the typed
/// struct as JSON. They travel inside `EngineSpec`, across the pipe to an
/// engine process as JSON text (the pipe's postcard frames are not
/// self-describing), and the engine reads its struct back with `typed`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Options(pub serde_json::Value);

impl Options {
    /// Checks `entry` (the model entry's keys that belong to the engine)
    /// against the engine's options type: unknown keys and bad values are
    /// refused, naming the key; then `check` runs on the typed value. Returns
    /// the options in their normal form (defaults filled in).
    pub fn check<T: Serialize + DeserializeOwned>(
        entry: &serde_json::Map<String, serde_json::Value>,
        check: impl FnOnce(&mut T) -> Result<(), InvalidOptions>,
    ) -> Result<Self, InvalidOptions> {
        let mut typed: T = serde_json::from_value(serde_json::Value::Object(entry.clone())).map_err(|e| InvalidOptions(e.to_string()))?;
        check(&mut typed)?;
        serde_json::to_value(&typed).map(Options).map_err(|e| InvalidOptions(e.to_string()))
    }

    /// The engine's typed options. `Null` (a spec built without a config, in
    /// tests) reads as the type's defaults.
    pub fn typed<T: DeserializeOwned + Default>(&self) -> Result<T, EngineError> {
        if self.0.is_null() {
            return Ok(T::default());
        }
        serde_json::from_value(self.0.clone()).map_err(|e| EngineError::Model(format!("engine options: {e}")))
    }
}

/// Engine keys of a model entry that the engine refuses: an unknown key, a
/// bad value, or values that do not fit together; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidOptions(pub String);

impl Serialize for Options {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.to_string().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Options {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        serde_json::from_str(&text).map(Options).map_err(serde::de::Error::custom)
    }
}

/// Where a model's engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// In a child process of its own (`eeane engine-host`), fed through a pipe:
    /// an unload ends the process, so everything the runtime allocated goes
    /// back to the OS, and a runtime crash fails only that model's batch in flight.
    Process,
    /// On a thread of the server process: no process start per load.
    Thread,
}

/// An accelerator a runtime sees, for /health.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    pub name: String,
    /// "discrete", "integrated", "virtual", "cpu" or "other".
    pub kind: String,
    /// The ids that tell identical cards apart, where the runtime gives them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus_id: Option<String>,
}

/// How a runtime finds its devices: the API's name (e.g. "vulkan") and the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisibleDevices {
    pub api: &'static str,
    pub devices: Vec<Device>,
}

/// Picks the one device whose name contains `wanted` (case-insensitive),
/// for runtimes that list names only (see `pick_device` for the rules and
/// the ids that tell identical cards apart).
pub fn pick_device_by_name(api: &str, wanted: &str, visible: &[String], forbidden: &[String]) -> Result<usize, EngineError> {
    let listed: Vec<ListedDevice> = visible.iter().map(ListedDevice::named).collect();
    pick_device(api, wanted, &listed, forbidden)
}

/// A build of an engine's runtime for some devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceRuntime {
    /// Its `[runtimes]` key.
    pub key: &'static str,
    /// Its default path, `{cache}` standing for eeane's cache.
    pub default: &'static str,
    /// The devices it serves: those whose name starts with this.
    pub device_prefix: &'static str,
}

/// What the CPU offers that decides which precisions are worth running on it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuFeatures {
    /// bf16 arithmetic in hardware (AVX512-BF16 or AMX-BF16). Without it a
    /// runtime emulates bf16, which is slower than f32 and loses precision.
    pub bf16: bool,
    /// int8 dot products in hardware (AVX512-VNNI, AVX-VNNI or AMX-INT8).
    pub int8_dot: bool,
}

/// What a graph file holds, for the precisions an engine can run it at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphKind {
    /// A float32 graph.
    Float32,
    /// A quantized graph (Q/DQ or integer ops) with its own scales.
    Int8,
    /// A float16 graph made for a GPU (`{stem}.fp16.onnx` beside the fp32
    /// one: fused attention, norms and pooling computed in fp32 inside).
    Float16,
}

/// One precision an engine can serve a graph at, for `precision = "auto"`:
/// the engine keys that select it, or why it cannot run here.
#[derive(Debug, Clone, PartialEq)]
pub struct PrecisionOffer {
    /// The name reported in /health and the survey ("fp32", "bf16", "int8").
    pub precision: &'static str,
    /// The engine's keys that select it, as a model entry would write them.
    pub keys: serde_json::Map<String, serde_json::Value>,
    /// Why it is not offered on this machine, when it is not.
    pub unavailable: Option<String>,
}

impl PrecisionOffer {
    pub fn new(precision: &'static str, keys: &[(&str, &str)]) -> Self {
        let keys = keys.iter().map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string()))).collect();
        Self { precision, keys, unavailable: None }
    }

    pub fn unavailable(precision: &'static str, why: impl Into<String>) -> Self {
        Self { precision, keys: Default::default(), unavailable: Some(why.into()) }
    }
}

/// How a Hugging Face repository (`source = "hf:..."`) is prepared for an
/// engine that serves such models: `eeane pull` and a Hub entry's first load
/// follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HubPreparation {
    /// The prepared model's file in its folder.
    pub model_file: &'static str,
    /// What tells engines' preparations apart in the prepared folder's name
    /// ("" for the ONNX graph that several engines read).
    pub folder_suffix: &'static str,
    /// The flag of models/prepare.py that converts the graph built from the
    /// safetensors for this engine; `None` serves the ONNX graph itself.
    pub converter_flag: Option<&'static str>,
    /// What models/setup.sh installs before that conversion (its
    /// EEANE_EXTRA_MODELS word); `None` when nothing more is needed.
    pub setup_extra: Option<&'static str>,
    /// Whether it reads the repository's own ONNX graph (`onnx/model.onnx`)
    /// and its variants (`onnx_file`), rather than converting from safetensors.
    pub reads_repository_onnx: bool,
    /// Whether it serves cross-encoders (one-label sequence classifiers).
    pub serves_rerankers: bool,
    /// Graphs made beside the model file for a kind of device, for an entry
    /// there whose `precision = "auto"` measures them.
    pub device_graphs: &'static [DeviceGraph],
}

/// A graph `eeane pull` makes for a kind of device, beside the model file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceGraph {
    /// The devices it is for: an entry's device name starts with this ("cuda:").
    pub device_prefix: &'static str,
    /// The flag of models/prepare.py that makes it.
    pub prepare_flag: &'static str,
    /// The key under the prepared manifest's checks that says it was made
    /// (its figures, or why there is none).
    pub manifest_check: &'static str,
}

impl HubPreparation {
    /// The ONNX graph: the repository's own, one of its variants, or built
    /// from its safetensors.
    pub const ONNX: HubPreparation = HubPreparation {
        model_file: "model.onnx",
        folder_suffix: "",
        converter_flag: None,
        setup_extra: None,
        reads_repository_onnx: true,
        serves_rerankers: true,
        device_graphs: &[],
    };
}

/// A device's name and its memory in use, as its driver reports them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceMemory {
    pub name: String,
    pub used_mib: u64,
    pub total_mib: u64,
}

/// Resolves a path written in a model entry: `{cache}/...`, `~/...`, absolute,
/// or relative to the config file.
pub type PathResolver<'a> = &'a dyn Fn(&Path) -> PathBuf;

/// One engine, everything eeane needs to know about it: each backend crate
/// exports one value of a type implementing this, and eeane's list of engines
/// is a list of those values.
pub trait Backend: Sync {
    /// The name a model entry's `engine` key gives.
    fn name(&self) -> &'static str;

    /// Whether this is the engine of entries that name none (a Hub source's
    /// entry), whose fp32 run of a graph is also `precision = "auto"`'s
    /// reference. One engine of a build says so (`engines::default_engine`).
    fn is_default(&self) -> bool {
        false
    }

    /// The kind of model file it reads, as Ollama's `/api/tags` reports a
    /// model's `format`.
    fn file_format(&self) -> &'static str {
        self.name()
    }

    /// How a Hub repository is prepared for it; `None` for an engine that
    /// does not serve Hub sources.
    fn hub_preparation(&self) -> Option<HubPreparation> {
        None
    }

    /// The precision the entry's checked options (`Backend::options`'
    /// normal form) select, before anything is loaded; `None` when the
    /// options name none.
    fn configured_precision(&self, options: &Options) -> Option<String> {
        let _ = options;
        None
    }

    /// Where its runtime library is by default (the `[runtimes]` key of the
    /// same name overrides it), `{cache}` standing for eeane's cache; `None`
    /// for an engine that opens no library by path.
    fn default_runtime(&self) -> Option<&'static str>;

    /// Other builds of the runtime that models on some devices open instead
    /// of `default_runtime` (ONNX Runtime's CUDA build for `cuda:` devices).
    fn device_runtimes(&self) -> &'static [DeviceRuntime] {
        &[]
    }

    /// The build a model on `devices` opens instead of `default_runtime`:
    /// the first whose prefix one of them starts with.
    fn device_runtime(&self, devices: &Devices) -> Option<&'static DeviceRuntime> {
        self.device_runtimes().iter().find(|r| devices.any_starts_with(r.device_prefix))
    }

    /// The devices a model on `devices` runs on, each a pin of one device: a
    /// pattern (`cuda:H200*`) becomes one pin per matching device, by a bus
    /// id that names it for good; every other device is kept as written.
    /// Engines that list no ids keep the list as it is. `library` is the
    /// runtime the model opens.
    fn expand_devices(&self, devices: &Devices, library: Option<&Path>, forbidden: &[String]) -> Result<Devices, EngineError> {
        let _ = (library, forbidden);
        Ok(devices.clone())
    }

    /// What this machine lacks for a model on `devices` (a driver, a device
    /// library, the device itself), found without loading anything heavy;
    /// `None` when nothing is known to be missing. `eeane check-config` fails
    /// on it, and the model's load fails with the same words.
    fn device_problem(&self, devices: &Devices, library: Option<&Path>, forbidden: &[String]) -> Option<String> {
        let _ = (devices, library, forbidden);
        None
    }

    /// The memory of the device a model on `devices` uses (the first of the
    /// list), read without loading anything: a GPU's VRAM from its driver.
    /// `None` for a device whose memory is the host's, or that cannot be read.
    fn device_memory(&self, devices: &Devices) -> Option<DeviceMemory> {
        let _ = devices;
        None
    }

    /// Opens the runtime library ahead of any model load; its version.
    fn open(&self, library: Option<&Path>) -> Result<String, EngineError>;

    /// Loads one model.
    fn load(&self, spec: &EngineSpec) -> Result<Box<dyn Engine>, EngineError>;

    /// Checks the model entry's keys that belong to this engine (its typed
    /// options, through `Options::check`), once, when the config is read.
    fn options(&self, entry: &serde_json::Map<String, serde_json::Value>, paths: PathResolver) -> Result<Options, InvalidOptions>;

    /// The precisions this engine can serve a graph of `kind` at on the CPU,
    /// for `precision = "auto"`, which measures each against the fp32
    /// reference and serves the fastest that keeps the vectors. Empty for an
    /// engine that takes no part (a GPU-only or platform-only engine).
    fn cpu_precisions(&self, kind: GraphKind, cpu: &CpuFeatures) -> Vec<PrecisionOffer> {
        let _ = (kind, cpu);
        Vec::new()
    }

    /// The precisions this engine can serve a graph of `kind` at on
    /// `devices` (not the CPU), for `precision = "auto"` there, as
    /// `cpu_precisions` does on the CPU. Empty where it takes no part.
    fn device_precisions(&self, kind: GraphKind, devices: &Devices) -> Vec<PrecisionOffer> {
        let _ = (kind, devices);
        Vec::new()
    }

    /// Whether it compiles the model once per length bucket, with shapes
    /// bounded by the bucket's rows and tokens (OpenVINO), so that a model
    /// without buckets is given a length ladder of them.
    fn compiles_per_bucket(&self) -> bool {
        false
    }

    /// Whether several engines of one model may load at the same time in one
    /// process (the runtime's loads are thread-safe). Engines in processes
    /// of their own always load at the same time.
    fn loads_in_parallel(&self) -> bool {
        false
    }

    /// Where a model on `devices` runs when its entry and the server leave it to the engine.
    fn default_isolation(&self, devices: &Devices) -> Isolation {
        let _ = devices;
        Isolation::Process
    }

    /// The devices the runtime saw, once it was opened in this process.
    fn visible_devices(&self) -> Option<VisibleDevices> {
        None
    }

    /// Why the engine cannot run on this platform at all, or `None`.
    fn unavailable(&self) -> Option<&'static str> {
        None
    }

    /// Hands back what the runtime keeps between models, before the process
    /// exits; called after the engine threads have ended.
    fn at_exit(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_picked_by_a_unique_name_only() {
        let visible = vec!["NVIDIA H200".to_string(), "NVIDIA RTX A2000".to_string()];
        assert_eq!(pick_device_by_name("CUDA", "h200", &visible, &[]), Ok(0));
        assert_eq!(pick_device_by_name("CUDA", "A2000", &visible, &[]), Ok(1));
        let message = |r: Result<usize, EngineError>| r.unwrap_err().to_string();
        assert!(message(pick_device_by_name("CUDA", "0", &visible, &[])).contains("not by an index"));
        assert!(message(pick_device_by_name("CUDA", "NVIDIA", &visible, &[])).contains("matches several"));
        assert!(message(pick_device_by_name("CUDA", "V100", &visible, &[])).contains("visible: \"NVIDIA H200\", \"NVIDIA RTX A2000\""));
        assert!(message(pick_device_by_name("CUDA", "H200", &visible, &["h200".into()])).contains("forbidden"));
        assert!(message(pick_device_by_name("CUDA", "H200", &[], &[])).contains("visible: none"));
    }

    #[test]
    fn from_rows_pads_right_and_records_lengths() {
        let a = [101, 7, 102];
        let b = [101, 102];
        let batch = TokenBatch::from_rows(&[(&a, None), (&b, None)], 4, 0);
        assert_eq!(batch.input_ids, vec![101, 7, 102, 0, 101, 102, 0, 0]);
        assert_eq!(batch.attention_mask, vec![1, 1, 1, 0, 1, 1, 0, 0]);
        assert_eq!(batch.lengths, vec![3, 2]);
        assert_eq!(batch.token_type_ids, None);
    }
}
